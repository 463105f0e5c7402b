//! Spec conformance: rules an implementation built from the
//! specification alone found the reference implementation breaking. Each
//! case fails against the behaviour the issue reported.
//!
//! * every refused packet gets its own NAK (3.7, 4.7.3);
//! * Path RX / CE Count include duplicates and refused packets (3.5, 4.10);
//! * a KEEPALIVE is never acknowledged (3.8.3, 4.5, 4.12);
//! * a packet from another source address than the handshake's is dropped
//!   silently (4.7.1);
//! * the PSN field of packets without a sequence number (3.2.4).

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use metaroce_core::wire::{Body, Flags, NakReason, Repr};
use metaroce_host::app::{Message, Operation};

use super::{
    acks, check_region, data, ensure, last_psn, one_packet_writes, stray_write, Ctx, Fail, Peer,
    Rx, ACK_WAIT, SLOT, STRAY_OFF,
};

/// Refused packets sent back to back: more than one, fewer than a
/// receiver's batch, so an implementation that keeps one NAK per
/// connection answers only the last.
const BURST: usize = 8;

/// CE-marked duplicates sent back to back.
const DUPLICATES: usize = 6;

/// SENDs naming a receive far beyond those posted: each is refused with
/// RECEIVER_NOT_READY (3.7), not recorded, and the connection stays up.
fn rnr_sends(p: &mut Peer, n: usize) -> Vec<(Repr, Vec<u8>)> {
    (0..n)
        .map(|_| {
            let (mut r, d) = p.send_packet(b"no receive is posted for this one");
            if let Body::Send(s) = &mut r.body {
                s.recv_index = s.recv_index.wrapping_add(1 << 20);
            }
            (r, d)
        })
        .collect()
}

/// Spec 3.7, 4.7.3: each refused reliable packet is answered by a NAK of
/// its own, carrying its PSN.
pub(super) fn nak_per_refused_packet(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    p.connect()?;
    let burst = rnr_sends(&mut p, BURST);
    let want: BTreeSet<u32> = burst.iter().map(|(r, _)| r.header.psn).collect();
    p.take();
    for (r, d) in &burst {
        p.send(r, d)?;
    }
    let naks = |rx: &[Rx]| -> Vec<(u32, NakReason)> {
        rx.iter()
            .filter_map(|x| match x.repr.body {
                Body::Nak(n) => Some((n.nak_psn, n.reason)),
                _ => None,
            })
            .collect()
    };
    p.pump(ACK_WAIT, |rx| naks(rx).len() >= BURST);
    // Anything more would show as a second NAK for a PSN.
    p.pump(Duration::from_millis(100), |_| false);
    let got = naks(&p.take());
    p.close();
    let psns: BTreeSet<u32> = got.iter().map(|&(psn, _)| psn).collect();
    ensure(got.len() == BURST && psns == want, || {
        format!(
            "{BURST} refused SENDs (PSNs {:?}) drew {} NAKs for PSNs {:?}",
            want,
            got.len(),
            got.iter().map(|&(psn, _)| psn).collect::<Vec<_>>()
        )
    })?;
    ensure(
        got.iter().all(|&(_, r)| r == NakReason::ReceiverNotReady),
        || format!("NAK reasons {got:?}, expected RECEIVER_NOT_READY"),
    )
}

/// Spec 3.5, 4.10: Path RX Count and Path CE Count count every packet that
/// passed the window check on the path, duplicates and refused packets
/// included, so CE marks on them reach the sender.
pub(super) fn ce_on_duplicates_and_refused(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, _m) = ctx.victim()?;
    let paths = v.accept.map_or(1, |a| a.max_paths);
    let path = paths.saturating_sub(1);
    let mut pk = one_packet_writes(&mut v, &r, 2, 12 * SLOT as usize);
    for (rep, _) in pk.iter_mut() {
        rep.header.path = path;
        rep.header.flags = Flags::ACK_REQUEST;
    }
    // The first WRITE, not marked: its ACK gives the counts before.
    let first = pk[0].0.header.psn;
    v.send(&pk[0].0, &pk[0].1)?;
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == first)
    });
    let before = acks(&v.take())
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.echo_psn == first && a.echo_path == path)
        .ok_or("no ACK for the first WRITE")?;
    // CE-marked, back to back: the first WRITE again (duplicates), SENDs
    // refused RECEIVER_NOT_READY, and the second WRITE (new), whose ACK
    // reports the path's counts.
    for _ in 0..DUPLICATES {
        v.send_raw(&Peer::encode(&pk[0].0, &pk[0].1), true)?;
    }
    for (mut rep, pl) in rnr_sends(&mut v, BURST) {
        rep.header.path = path;
        v.send_raw(&Peer::encode(&rep, &pl), true)?;
    }
    let last = last_psn(&pk);
    v.send_raw(&Peer::encode(&pk[1].0, &pk[1].1), true)?;
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == last)
    });
    let rx = v.take();
    v.close();
    let after = acks(&rx)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.echo_psn == last)
        .ok_or("no ACK for the last WRITE")?;
    let rx_delta = after.path_rx_count.wrapping_sub(before.path_rx_count);
    let ce_delta = after.path_ce_count.wrapping_sub(before.path_ce_count);
    let sent = (DUPLICATES + BURST + 1) as u16;
    ensure(
        after.echo_path == path && rx_delta == sent && ce_delta == sent,
        || {
            format!(
                "{sent} CE-marked packets on path {path} ({DUPLICATES} duplicates, \
                 {BURST} refused, 1 new): ACK on path {} counts {rx_delta} more \
                 received, {ce_delta} more CE",
                after.echo_path
            )
        },
    )
}

/// Spec 3.8.3, 4.12: a KEEPALIVE is not acknowledged, neither the one that
/// confirms the handshake nor a later one; and no ACK ever echoes nothing.
pub(super) fn keepalive_not_acknowledged(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    p.connect_only(1024, 4, 256)?;
    p.keepalive()?;
    p.pump(Duration::from_millis(400), |_| false);
    p.keepalive()?;
    p.pump(Duration::from_millis(400), |_| false);
    let rx = p.take();
    p.close();
    let got = acks(&rx);
    ensure(got.is_empty(), || {
        format!(
            "{} ACK(s) answered KEEPALIVEs before any data: {:?}",
            got.len(),
            got.iter().map(|(_, a)| a).collect::<Vec<_>>()
        )
    })
}

/// Spec 4.7.1 (source check): a packet with a valid id, token and PSN sent
/// from another address than the handshake's is dropped silently and not
/// placed. Needs a target on IPv4 loopback that sees the peer's address.
pub(super) fn other_source_address(ctx: &mut Ctx) -> Result<(), Fail> {
    if !ctx.sees_other_sources() {
        return Ok(());
    }
    let other = match UdpSocket::bind(SocketAddr::from(([127, 0, 0, 2], 0))) {
        Ok(s) => s,
        Err(e) => {
            ctx.skip(&format!("cannot bind 127.0.0.2: {e}"));
            return Ok(());
        }
    };
    let (mut v, r, mut m) = ctx.victim()?;
    let (rep, pl) = stray_write(&mut v, r.key, r.addr + STRAY_OFF as u64);
    v.take();
    other
        .send_to(&Peer::encode(&rep, &pl), ctx.target)
        .map_err(|e| e.to_string())?;
    v.pump(Duration::from_millis(300), |_| false);
    let answered: Vec<_> = v
        .take()
        .into_iter()
        .filter(|x| !matches!(x.repr.body, Body::Keepalive))
        .map(|x| x.repr.body.packet_type())
        .collect();
    let _ = other.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 256];
    let other_got = other.recv_from(&mut buf).is_ok();
    // The PSN was not taken: the same PSN from the right address is.
    v.next_psn = rep.header.psn;
    let alive = super::write_ok(&mut v, &r, &mut m, STRAY_OFF + 128, &data(5, 32));
    let mem = check_region(&mut v, &r, &m, STRAY_OFF, 256);
    v.close();
    ensure(answered.is_empty() && !other_got, || {
        format!("a packet from 127.0.0.2 was answered: {answered:?} (to 127.0.0.2: {other_got})")
    })?;
    alive.and(mem)
}

/// Spec 3.2.4: ACCEPT carries its sender's Initial PSN in the PSN field,
/// a repeated ACCEPT too; an ACK carries the next PSN its sender will send.
pub(super) fn psn_field_of_control_packets(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    let connect = p.connect_repr(1024, 4, 256);
    let a = p.connect_only(1024, 4, 256)?;
    let h = p.accept_header.ok_or("no ACCEPT header")?;
    p.keepalive()?;
    let initial = a.initial_psn;
    ensure(h.psn == initial, || {
        format!(
            "ACCEPT's PSN field {:#x}, its Initial PSN {initial:#x}",
            h.psn
        )
    })?;
    // The target sends a SEND (REGION) and acknowledges ours.
    let announce = Message::Announce {
        op: Operation::Read,
        seed: 15,
        size: SLOT,
    }
    .encode();
    let (r, d) = p.send_packet(&announce);
    p.send(&r, &d)?;
    let psn = r.header.psn;
    p.pump(ACK_WAIT, |rx| {
        rx.iter().any(|x| matches!(x.repr.body, Body::Send(_)))
            && acks(rx)
                .iter()
                .any(|(_, a)| a.cumulative == psn.wrapping_add(1))
    });
    let rx = p.take();
    // Every ACK carries 1 + the highest PSN the target sent before it.
    let mut next = initial;
    let mut checked = 0;
    for x in &rx {
        match x.repr.body {
            Body::Ack(_) => {
                ensure(x.repr.header.psn == next, || {
                    format!(
                        "an ACK's PSN field {:#x}, the target's next PSN {next:#x}",
                        x.repr.header.psn
                    )
                })?;
                checked += 1;
            }
            b if b.packet_type().is_reliable() => {
                let after = x.repr.header.psn.wrapping_add(1);
                if after.wrapping_sub(next) as i32 > 0 {
                    next = after;
                }
            }
            _ => {}
        }
    }
    ensure(checked > 0, || "no ACK from the target".into())?;
    // The CONNECT once more, after data: the same ACCEPT, PSN field and
    // Initial PSN still the initial one.
    p.send(&connect, &[])?;
    p.pump(ACK_WAIT, |rx| {
        rx.iter().any(|x| matches!(x.repr.body, Body::Accept(_)))
    });
    let rx = p.take();
    p.close();
    let (h2, a2) = rx
        .iter()
        .find_map(|x| match x.repr.body {
            Body::Accept(a) => Some((x.repr.header, a)),
            _ => None,
        })
        .ok_or("no ACCEPT for the repeated CONNECT")?;
    ensure(h2.psn == initial && a2.initial_psn == initial, || {
        format!(
            "repeated ACCEPT after data: PSN field {:#x}, Initial PSN {:#x}, expected {initial:#x}",
            h2.psn, a2.initial_psn
        )
    })
}
