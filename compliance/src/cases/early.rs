//! 0-RTT with a job key (spec 4.2.4): the suite, holding the target's
//! pre-shared key, is an early initiator. It makes the proof itself (the
//! target's address and port as it sends to them, its own as the target
//! sees them, its wall clock) and sends its first flight with the
//! CONNECT: the serve profile's announcement SEND, the one message a
//! serve target places before it has handed out a memory key, and whose
//! answer (the region) shows that it was placed and delivered.
//!
//! The target's wall clock must be within the early window of the suite's
//! (both read the system clock; on one host they agree). A target without
//! packet protection (the firmware: no AES-GCM) has no key to check a
//! proof with: the cases are skipped there.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metaroce_core::crypto::early::{make_proof, ProofAddresses};
use metaroce_core::wire::{Body, ConnectRepr, Flags, NakReason, Repr, COOKIE_LEN};
use metaroce_host::app::{Message, Operation};
use smoltcp::wire::IpAddress;

use super::{ensure, Ctx, Fail, Peer, Rx, ACK_WAIT, SILENCE};

/// Why the 0-RTT cases do not apply without the target's key.
const NO_KEY: &str = "the target holds no pre-shared key: no packet protection (e.g. firmware \
                      without AES-GCM), so no 0-RTT (spec 4.2.4: only keyed offers are early)";

/// How far the first flight follows the CONNECT.
const FLIGHT_GAP: Duration = Duration::from_millis(2);

/// How long the suite leaves the target unconfirmed after its first
/// flight was acknowledged.
const UNCONFIRMED: Duration = Duration::from_millis(100);

/// How long the target may take to answer a CONNECT.
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// The wall clock, ns since the Unix epoch (spec 4.2.4: the proof's Time).
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Our address as the target sees it: the one the system sends from
/// towards it.
fn own_ip(target: SocketAddr) -> Result<IpAddress, Fail> {
    let any = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(any).map_err(|e| e.to_string())?;
    s.connect(target).map_err(|e| e.to_string())?;
    let ip = s.local_addr().map_err(|e| e.to_string())?.ip();
    Ok(IpAddress::from(ip))
}

/// One early handshake's packets, as sent (sealed), for replaying.
struct Early {
    p: Peer,
    offer: ConnectRepr,
    connect: Vec<u8>,
    first_flight: Vec<u8>,
    /// The early SEND before sealing.
    plain: (Repr, Vec<u8>),
    /// The early SEND's PSN.
    psn: u32,
}

/// An early initiator: an early CONNECT (its proof made at `time`, its
/// tag with `tamper` xored into byte 16) and its first flight, the
/// announcement SEND, sealed with the early key, EARLY, addressed with our
/// own id and token. Nothing is received yet.
fn send_early(ctx: &mut Ctx, time: u64, tamper: u8, seed: u64) -> Result<Early, Fail> {
    let own = own_ip(ctx.target)?;
    let mut p = ctx.protected_peer()?;
    let repr = p.connect_repr(1024, 4, 256);
    let Body::Connect(mut offer) = repr.body else {
        return Err("no CONNECT".into());
    };
    let at = ProofAddresses {
        initiator: own,
        initiator_port: p.local_port(),
        acceptor: IpAddress::from(ctx.target.ip()),
        acceptor_port: ctx.target.port(),
    };
    let keys = p.keys.as_mut().ok_or("no keys")?;
    let mut proof = make_proof(keys.psk(), time, &at, &offer);
    proof[16] ^= tamper;
    offer.cookie = proof;
    keys.start_early(&offer);
    let connect = Repr {
        header: metaroce_core::wire::Header {
            flags: Flags::EARLY,
            ..repr.header
        },
        body: Body::Connect(offer),
        payload_len: 0,
    };
    let connect = Peer::encode(&connect, &[]);
    // The first flight: the announcement, as an early packet.
    let announce = Message::Announce {
        op: Operation::Read,
        seed,
        size: 4096,
    }
    .encode();
    let (mut send, payload) = p.send_packet(&announce);
    send.header.flags = send.header.flags.with(Flags::EARLY);
    send.header.dst_conn = p.my_id;
    send.header.token = p.my_token;
    let first_flight = p
        .keys
        .as_ref()
        .ok_or("no keys")?
        .seal(&Peer::encode(&send, &payload));
    // Two back-to-back copies of the CONNECT (spec 4.2 step 2), then the
    // first flight, paced a little behind them: a serve target posts its
    // receives when its application hears of the connection, and a SEND
    // in the CONNECT's receive batch would find none (RECEIVER_NOT_READY,
    // answered by a retransmission, which is not an early packet).
    p.send_sealed(&connect)?;
    p.send_sealed(&connect)?;
    std::thread::sleep(FLIGHT_GAP);
    p.send_sealed(&first_flight)?;
    Ok(Early {
        p,
        offer,
        connect,
        first_flight,
        plain: (send, payload),
        psn: send.header.psn,
    })
}

/// The target sent no reliable packet in `rx`: it has not been confirmed,
/// and MUST NOT before it is Established (spec 4.2 step 6, 4.2.4).
fn no_reliable(rx: &[Rx], when: &str) -> Result<(), Fail> {
    ensure(
        !rx.iter().any(|r| r.repr.body.packet_type().is_reliable()),
        || {
            format!(
                "a reliable packet before the handshake was confirmed ({when}): {:?}",
                kinds(rx)
            )
        },
    )
}

fn kinds(rx: &[Rx]) -> Vec<(metaroce_core::wire::PacketType, u32)> {
    rx.iter()
        .map(|r| (r.repr.body.packet_type(), r.repr.header.psn))
        .collect()
}

/// The answers to a CONNECT the target must not take early: RETRYs only
/// (one per copy at most), addressed with the CONNECT's id and token, and
/// nothing for the first flight (no ACK, no NAK, no SEND: nothing placed).
fn expect_retry_only(p: &mut Peer, what: &str) -> Result<[u8; COOKIE_LEN], Fail> {
    p.pump(SILENCE, |_| false);
    let rx = p.take();
    let retries = rx
        .iter()
        .filter(|r| matches!(r.repr.body, Body::Retry(_)))
        .count();
    let other: Vec<&Rx> = rx
        .iter()
        .filter(|r| !matches!(r.repr.body, Body::Retry(_)))
        .collect();
    ensure(other.is_empty(), || {
        format!(
            "{what}: the target answered more than a RETRY: {:?}",
            kinds(&rx)
        )
    })?;
    ensure((1..=2).contains(&retries), || {
        format!("{what}: {retries} RETRYs to an early CONNECT sent twice, expected 1 or 2")
    })?;
    p.retry_in(&rx).ok_or_else(|| {
        format!("{what}: the RETRY is not addressed with the CONNECT's id and token")
    })
}

/// The target's REGION answer to our announcement, once confirmed.
fn region_answer(p: &mut Peer) -> Result<(), Fail> {
    let got = p.pump(Duration::from_secs(2), |rx| {
        rx.iter().any(|r| matches!(r.repr.body, Body::Send(_)))
    });
    ensure(got, || {
        "the early announcement SEND was never answered: not placed".into()
    })?;
    let rx = p.take();
    let answer = rx
        .iter()
        .find(|r| matches!(r.repr.body, Body::Send(_)))
        .ok_or("no SEND")?;
    match Message::decode(&answer.payload) {
        Some(Message::Region { status: 0, .. }) => Ok(()),
        other => Err(format!(
            "the answer to the early announcement is {other:?}, expected a region"
        )),
    }
}

/// Waits for the ACK of the early SEND; a RECEIVER_NOT_READY (the target's
/// application had not posted its receives yet) draws a retransmission,
/// as any initiator's would, now addressed to the connection. Fails if
/// the target sends a reliable packet before that: it is not Established
/// (spec 4.2.4: an early packet does not confirm the handshake). Returns
/// whether it retransmitted: the retransmission carries the target's
/// token and so confirms the handshake (spec 4.2 step 6), and what the
/// target sends after it (the answer to the announcement) stays in the
/// inbox.
fn wait_first_flight_acked(e: &mut Early) -> Result<bool, Fail> {
    let deadline = std::time::Instant::now() + ACK_WAIT;
    let target = e.psn.wrapping_add(1);
    let acked = move |r: &Rx| match r.repr.body {
        Body::Ack(a) => target.wrapping_sub(a.cumulative) as i32 <= 0,
        _ => false,
    };
    let mut retransmitted = false;
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        e.p.pump(Duration::from_millis(20), |rx| {
            rx.iter()
                .any(|r| acked(r) || (!retransmitted && matches!(r.repr.body, Body::Nak(_))))
        });
        if retransmitted {
            // Confirmed: reliable packets may come now, and stay.
            if e.p.inbox.iter().any(acked) {
                return Ok(true);
            }
            continue;
        }
        let rx = e.p.take();
        seen.extend(kinds(&rx));
        no_reliable(&rx, "while the first flight was acknowledged")?;
        if rx.iter().any(acked) {
            return Ok(false);
        }
        if let Some(n) = Peer::first_nak(&rx) {
            ensure(n.reason == NakReason::ReceiverNotReady, || {
                format!("the early SEND drew NAK {:?}", n.reason)
            })?;
            std::thread::sleep(Duration::from_millis(5));
            let (mut repr, payload) = resend_of(e)?;
            repr.header.flags = repr.header.flags.with(Flags::RETRANSMISSION);
            e.p.send(&repr, &payload)?;
            retransmitted = true;
        }
    }
    let rejected = e.p.keys.as_ref().map_or(0, |k| k.rejected);
    seen.extend(kinds(&e.p.inbox));
    Err(format!(
        "the early SEND (PSN {}) was not acknowledged within {ACK_WAIT:?} (received meanwhile: {seen:?}; {rejected} packets that did not authenticate; retransmitted: {retransmitted})",
        e.psn
    ))
}

/// The early SEND again, addressed to the connection (after the ACCEPT,
/// spec 4.2.4 step 4), sealed with the next IV.
fn resend_of(e: &Early) -> Result<(Repr, Vec<u8>), Fail> {
    let (mut repr, payload) = e.plain.clone();
    repr.header = e.p.header(e.psn, Flags::ACK_REQUEST);
    Ok((repr, payload))
}

/// Waits for the ACCEPT of our early CONNECT (no RETRY before it) and
/// keys the connection from it.
fn expect_accept(e: &mut Early) -> Result<(), Fail> {
    e.p.pump(ANSWER_WAIT, |rx| {
        rx.iter()
            .any(|r| matches!(r.repr.body, Body::Accept(_) | Body::Retry(_)))
    });
    let rx = e.p.take();
    ensure(
        !rx.iter().any(|r| matches!(r.repr.body, Body::Retry(_))),
        || "a valid early proof was answered with a RETRY, not taken".into(),
    )?;
    let (h, a) = rx
        .iter()
        .find_map(|r| match r.repr.body {
            Body::Accept(a) => Some((r.repr.header, a)),
            _ => None,
        })
        .ok_or("no ACCEPT in answer to a valid early CONNECT")?;
    ensure(h.dst_conn == e.p.my_id && h.token == e.p.my_token, || {
        "the ACCEPT is not addressed with the CONNECT's id and token".into()
    })?;
    ensure(
        a.mtu == e.offer.mtu && a.max_paths == e.offer.max_paths && a.window == e.offer.window,
        || {
            format!(
                "an early CONNECT taken with other values than offered: mtu {} paths {} window {}",
                a.mtu, a.max_paths, a.window
            )
        },
    )?;
    e.p.their_id = a.src_conn;
    e.p.their_token = a.src_token;
    e.p.accept = Some(a);
    e.p.accept_header = Some(h);
    let offer = e.offer;
    e.p.key_from_accept(&offer, &a);
    Ok(())
}

/// A valid proof: ACCEPT without a RETRY, the early SEND acknowledged
/// while the target is still Accepting (before any confirmation), and,
/// once confirmed, the announcement it carried answered: it was placed
/// and delivered. The connection then carries protected data both ways.
pub(super) fn early_accepted(ctx: &mut Ctx) -> Result<(), Fail> {
    if ctx.psk.is_none() {
        ctx.skip(NO_KEY);
        return Ok(());
    }
    let mut e = send_early(ctx, wall_ns(), 0, 0x0e4a_1001)?;
    expect_accept(&mut e)?;
    // A RECEIVER_NOT_READY answer (the target's application had not
    // posted its receives yet) is what an established connection would
    // answer too; the retransmission is then what is placed, and, being
    // addressed to the connection, it confirms the handshake.
    let confirmed = wait_first_flight_acked(&mut e)?;
    if !confirmed {
        // The early SEND was delivered, and the target's application
        // answers it at once; but an early packet does not confirm the
        // handshake, so the answer waits for our confirmation.
        e.p.pump(UNCONFIRMED, |_| false);
        let rx = e.p.take();
        no_reliable(&rx, "after the early SEND, before the confirmation")?;
        // Confirm: a KEEPALIVE to the connection.
        e.p.keepalive()?;
    }
    region_answer(&mut e.p)?;
    let rejected = e.p.keys.as_ref().map_or(0, |k| k.rejected);
    e.p.close();
    ensure(rejected == 0, || {
        format!("{rejected} of the target's packets did not authenticate")
    })
}

/// A proof whose tag is wrong: one RETRY (per copy), no ACCEPT, and the
/// first flight draws nothing and is placed nowhere; the handshake then
/// completes as a plain one with the cookie (no EARLY, transcript keys).
pub(super) fn early_wrong_mac(ctx: &mut Ctx) -> Result<(), Fail> {
    if ctx.psk.is_none() {
        ctx.skip(NO_KEY);
        return Ok(());
    }
    let mut e = send_early(ctx, wall_ns(), 0x01, 0x0e4a_1002)?;
    let cookie = expect_retry_only(&mut e.p, "wrong tag")?;
    // Fall back (spec 4.2.4 step 5): the cookie, no EARLY, new keys.
    if let Some(k) = e.p.keys.as_mut() {
        k.drop_early();
    }
    e.p.cookie = cookie;
    // The first flight is sent again from the Initial PSN, once
    // established; the CONNECT is the same offer.
    e.p.rewind(e.offer.initial_psn);
    e.p.connect()?;
    e.p.request_region(&Message::Announce {
        op: Operation::Read,
        seed: 0x0e4a_1003,
        size: 4096,
    })?;
    e.p.close();
    Ok(())
}

/// An early CONNECT and its first flight replayed, byte for byte from the
/// same address and port, after their connection was closed and released:
/// no ACCEPT, and the replayed first flight draws nothing and places
/// nothing (the proof is in the target's filter, or too old).
pub(super) fn early_replayed(ctx: &mut Ctx) -> Result<(), Fail> {
    if ctx.psk.is_none() {
        ctx.skip(NO_KEY);
        return Ok(());
    }
    let mut e = send_early(ctx, wall_ns(), 0, 0x0e4a_1004)?;
    expect_accept(&mut e)?;
    wait_first_flight_acked(&mut e)?;
    e.p.keepalive()?;
    region_answer(&mut e.p)?;
    e.p.close();
    // Time for the target's application to release the connection.
    std::thread::sleep(Duration::from_millis(100));
    e.p.take();
    e.p.send_sealed(&e.connect)?;
    e.p.send_sealed(&e.first_flight)?;
    e.p.pump(SILENCE, |_| false);
    let rx: Vec<Rx> =
        e.p.take()
            .into_iter()
            .filter(|r| !matches!(r.repr.body, Body::Keepalive | Body::Close(_)))
            .collect();
    ensure(
        rx.iter().all(|r| matches!(r.repr.body, Body::Retry(_))),
        || {
            format!(
                "a replayed early CONNECT and first flight drew {:?}, expected a RETRY or nothing",
                kinds(&rx)
            )
        },
    )
}

/// A proof made an hour ago (far outside any early window): one RETRY,
/// no ACCEPT, and the first flight draws nothing.
pub(super) fn early_stale(ctx: &mut Ctx) -> Result<(), Fail> {
    if ctx.psk.is_none() {
        ctx.skip(NO_KEY);
        return Ok(());
    }
    let hour = 3_600_000_000_000;
    let mut e = send_early(ctx, wall_ns() - hour, 0, 0x0e4a_1005)?;
    expect_retry_only(&mut e.p, "stale proof")?;
    Ok(())
}
