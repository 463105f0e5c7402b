//! The cases. Each plays the peer of the target over UDP and checks one
//! rule of the specification; `section` cites where the rule is.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use metaroce_core::wire::{
    Body, ConnectRepr, Flags, MemoryTarget, NakReason, NakRepr, Repr, SackBits,
};
use metaroce_host::app::{fill_pattern, READ_ONLY_INDEX, READ_ONLY_LEN};

use crate::peer::{Fail, Peer, RemoteRegion, Rx};

mod admission;
mod closing;
mod conformance;
mod early;
mod read_depth;
mod tokens;
mod window;

/// One compliance case, run with a context `C` (the wire cases' [`Ctx`],
/// the host-interface cases' `DeviceCtx`).
#[derive(Debug)]
pub struct Case<C = Ctx> {
    pub name: &'static str,
    /// Spec sections it checks (docs/spec/).
    pub section: &'static str,
    pub run: fn(&mut C) -> Result<(), Fail>,
    /// Tries before the case fails: timing-dependent cases (timers, the
    /// active-sender window) get 3, since the suite may share a loaded
    /// machine with the target; every other case gets exactly 1.
    pub attempts: u8,
}

/// Shared by the cases of one run.
#[derive(Debug)]
pub struct Ctx {
    pub target: SocketAddr,
    next_seed: u32,
    /// The target's pre-shared key and its Key ID (spec 5.3), for the
    /// protection cases.
    pub psk: Option<(u32, [u8; 32])>,
    /// The target sees every peer at one address (the QEMU harness's
    /// gateway): cases that need a second source address are skipped.
    pub single_source: bool,
    /// The most half-open connections the target lets one /32 hold
    /// (spec 4.2.3, 1), when declared: the per-prefix limit case runs.
    pub half_open_limit: Option<u32>,
    /// Why the case that just ran did not apply to the target; taken by
    /// the report.
    pub skipped: Option<String>,
}

/// Slot size asked of the serve profile: the region is 64 slots of it,
/// slot `j` pre-filled with `pattern(seed, j)`.
const SLOT: u32 = 4096;
/// How long silence must last to count as "no answer".
const SILENCE: Duration = Duration::from_millis(300);
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(2);

impl Ctx {
    pub fn new(target: SocketAddr) -> Ctx {
        Ctx {
            target,
            next_seed: 1,
            psk: None,
            single_source: false,
            half_open_limit: None,
            skipped: None,
        }
    }

    /// Marks the running case as not applicable to this target, saying why.
    pub(crate) fn skip(&mut self, why: &str) {
        self.skipped = Some(why.to_string());
    }

    /// Whether the target sees the suite's other loopback addresses
    /// (127.0.0.0/8) as they are: on 127.0.0.1, behind no gateway. If not,
    /// the running case is marked skipped, saying why.
    pub(crate) fn sees_other_sources(&mut self) -> bool {
        if self.single_source {
            self.skip("the target sees every peer at its gateway's one address");
            false
        } else if self.target.ip() != std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST) {
            self.skip("the target is not on 127.0.0.1, so other loopback sources may not reach it");
            false
        } else {
            true
        }
    }

    /// A peer that offers protection with the target's key.
    pub(crate) fn protected_peer(&mut self) -> Result<Peer, Fail> {
        let (key_id, psk) = self.psk.ok_or("no pre-shared key (--psk-file)")?;
        let mut p = self.peer()?;
        p.keys = Some(crate::protect::PeerKeys::new(key_id, psk));
        Ok(p)
    }

    pub(crate) fn peer(&mut self) -> Result<Peer, Fail> {
        self.next_seed += 1;
        Peer::new(self.target, self.next_seed)
    }

    /// A connection with a fresh pattern-filled region, and its mirror.
    fn victim(&mut self) -> Result<(Peer, RemoteRegion, Mirror), Fail> {
        self.victim_window(256)
    }

    /// [`Ctx::victim`] on a connection offering a window of `window` PSNs.
    fn victim_window(&mut self, window: u32) -> Result<(Peer, RemoteRegion, Mirror), Fail> {
        let mut v = self.peer()?;
        let seed = u64::from(self.next_seed) * 0x1234_5678_9abc;
        let region = v.open_with_region_window(seed, SLOT, window)?;
        Ok((v, region, Mirror::new(seed, region.len as usize)))
    }
}

/// What the target's region must hold: the pattern, plus what we wrote.
#[derive(Debug)]
struct Mirror {
    bytes: Vec<u8>,
}

impl Mirror {
    fn new(seed: u64, len: usize) -> Mirror {
        let mut bytes = vec![0u8; len];
        for (j, slot) in bytes.chunks_mut(SLOT as usize).enumerate() {
            fill_pattern(seed, j as u64, slot);
        }
        Mirror { bytes }
    }
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len];
    fill_pattern(seed ^ 0xdada, 0, &mut d);
    d
}

pub(crate) fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), Fail> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// Reads `[off, off + len)` of the region and compares it with the mirror.
fn check_region(
    v: &mut Peer,
    r: &RemoteRegion,
    m: &Mirror,
    off: usize,
    len: usize,
) -> Result<(), Fail> {
    let got = v.read(
        MemoryTarget {
            key: r.key,
            addr: r.addr + off as u64,
        },
        len as u32,
    )?;
    let want = &m.bytes[off..off + len];
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "region byte {} is {:#04x}, expected {:#04x}",
            off + i,
            got[i],
            want[i]
        )),
    }
}

fn send_all(p: &Peer, pkts: &[(Repr, Vec<u8>)]) -> Result<(), Fail> {
    for (r, d) in pkts {
        p.send(r, d)?;
    }
    Ok(())
}

fn last_psn(pkts: &[(Repr, Vec<u8>)]) -> u32 {
    pkts.last().map_or(0, |(r, _)| r.header.psn)
}

fn acks(rx: &[Rx]) -> Vec<(metaroce_core::wire::Header, metaroce_core::wire::AckRepr)> {
    rx.iter()
        .filter_map(|r| match r.repr.body {
            Body::Ack(a) => Some((r.repr.header, a)),
            _ => None,
        })
        .collect()
}

/// Writes `d` at region offset `off` and waits for it to be acknowledged.
fn write_ok(
    v: &mut Peer,
    r: &RemoteRegion,
    m: &mut Mirror,
    off: usize,
    d: &[u8],
) -> Result<(), Fail> {
    let pk = v.write_packets(
        MemoryTarget {
            key: r.key,
            addr: r.addr + off as u64,
        },
        d,
        None,
    );
    send_all(v, &pk)?;
    v.wait_acked(last_psn(&pk), ACK_WAIT)?;
    m.bytes[off..off + d.len()].copy_from_slice(d);
    v.take();
    Ok(())
}

/// Sends `bytes` and expects no answer at all.
fn expect_silence(p: &mut Peer, bytes: &[u8]) -> Result<(), Fail> {
    expect_silence_raw(p, bytes)
}

/// [`expect_silence`], for the protection cases.
pub(crate) fn expect_silence_raw(p: &mut Peer, bytes: &[u8]) -> Result<(), Fail> {
    p.take();
    p.send_raw(bytes, false)?;
    p.pump(SILENCE, |_| false);
    // A KEEPALIVE, or a retransmission of something the target sent
    // earlier (RETRANSMISSION set: its own retransmission timer on a slow
    // target, such as an emulated one), is not an answer.
    let rx: Vec<Rx> = p
        .take()
        .into_iter()
        .filter(|r| {
            !matches!(r.repr.body, Body::Keepalive)
                && !r.repr.header.flags.contains(Flags::RETRANSMISSION)
        })
        .collect();
    ensure(rx.is_empty(), || {
        format!(
            "expected a silent drop, got {:?}",
            rx.iter()
                .map(|r| (
                    r.repr.body.packet_type(),
                    r.repr.header.psn,
                    r.repr.header.flags.0
                ))
                .collect::<Vec<_>>()
        )
    })
}

/// Sends `pkt` and expects a NAK with `reason` for its PSN.
fn expect_nak(p: &mut Peer, pkt: &(Repr, Vec<u8>), reason: NakReason) -> Result<(), Fail> {
    p.take();
    p.send(&pkt.0, &pkt.1)?;
    p.pump(ACK_WAIT, |rx| Peer::first_nak(rx).is_some());
    let rx = p.take();
    let nak = Peer::first_nak(&rx).ok_or_else(|| format!("no NAK {reason:?}"))?;
    ensure(nak.reason == reason, || {
        format!("NAK reason {:?}, expected {reason:?}", nak.reason)
    })?;
    ensure(nak.nak_psn == pkt.0.header.psn, || {
        format!("NAK PSN {}, expected {}", nak.nak_psn, pkt.0.header.psn)
    })
}

// ----- Handshake ---------------------------------------------------------

fn negotiate_min(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut big = ctx.peer()?;
    let own = big.connect_only(9000, 256, 256)?;
    big.keepalive()?;
    big.close();
    ensure(
        (256..=9000).contains(&own.mtu)
            && (1..=256).contains(&own.max_paths)
            && (1..=256).contains(&own.window),
        || format!("ACCEPT values out of range: {own:?}"),
    )?;
    let mut small = ctx.peer()?;
    let (mtu, paths, window) = (own.mtu.clamp(256, 512), 1, own.window.min(16));
    let a = small.connect_only(mtu, paths, window)?;
    small.keepalive()?;
    small.close();
    ensure(
        a.mtu == mtu.min(own.mtu) && a.max_paths == paths && a.window == window,
        || {
            format!(
                "offered mtu {mtu} paths {paths} window {window}, ACCEPT has {} {} {}",
                a.mtu, a.max_paths, a.window
            )
        },
    )
}

fn duplicate_connect(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    let first = p.connect_only(1024, 4, 256)?;
    let again = p.connect_repr(1024, 4, 256);
    p.send(&again, &[])?;
    p.pump(ACK_WAIT, |rx| {
        rx.iter().any(|r| matches!(r.repr.body, Body::Accept(_)))
    });
    let rx = p.take();
    let second = rx
        .iter()
        .find_map(|r| match r.repr.body {
            Body::Accept(a) => Some(a),
            _ => None,
        })
        .ok_or("no ACCEPT for the repeated CONNECT")?;
    p.keepalive()?;
    p.close();
    // The Rate Grant is the acceptor's share at the time it sends (spec
    // 4.10.6): a repeated ACCEPT may grant another.
    let ungranted = |mut a: ConnectRepr| {
        a.set_rate_grant_mbps(0);
        a
    };
    ensure(ungranted(first) == ungranted(second), || {
        format!("second ACCEPT differs: {first:?} vs {second:?}")
    })
}

/// Spec 3.8.1, 4.10.4, 4.10.6: an ACCEPT's Rate Grant is 0 (no grant) or
/// the acceptor's share, which counts half-open connections: a second
/// connection accepted while the first is still half open is granted no
/// more than the first.
fn accept_grant(ctx: &mut Ctx) -> Result<(), Fail> {
    // Let earlier senders age out of the active-sender window.
    std::thread::sleep(Duration::from_millis(300));
    let mut first = ctx.peer()?;
    let a = first.connect_only(1024, 4, 256)?;
    let mut second = ctx.peer()?;
    let b = second.connect_only(1024, 4, 256)?;
    for p in [&mut first, &mut second] {
        p.keepalive()?;
        p.close();
    }
    let (ga, gb) = (a.rate_grant_mbps(), b.rate_grant_mbps());
    if ga == 0 && gb == 0 {
        // Grants are optional (the reference firmware gives none).
        return Ok(());
    }
    ensure(ga > 0 && gb > 0 && gb <= ga, || {
        format!("grants {ga} then {gb} Mbit/s for a second half-open connection")
    })
}

fn confirm_then_data(ctx: &mut Ctx) -> Result<(), Fail> {
    // The acceptor enters Established on the first valid packet after
    // ACCEPT: a SEND right away (no KEEPALIVE) is accepted and answered.
    let mut p = ctx.peer()?;
    p.connect_only(1024, 4, 256)?;
    let (r, d) = p.send_packet(b"not an announcement");
    p.send(&r, &d)?;
    let acked = p.wait_acked(r.header.psn, ACK_WAIT);
    p.close();
    acked
}

/// The RETRY of the target and everything else it sent within `wait`.
fn first_answer(p: &mut Peer, repr: &Repr, wait: Duration) -> Result<Vec<Rx>, Fail> {
    p.take();
    p.send(repr, &[])?;
    p.pump(wait, |_| false);
    Ok(p.take())
}

fn no_accept(rx: &[Rx]) -> Result<(), Fail> {
    ensure(
        !rx.iter().any(|r| matches!(r.repr.body, Body::Accept(_))),
        || "an ACCEPT to an address that has not proved itself".into(),
    )
}

fn retry_first(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    let connect = p.connect_repr(1024, 4, 256);
    let connect_len = connect.buffer_len();
    let rx = first_answer(&mut p, &connect, SILENCE)?;
    no_accept(&rx)?;
    let retries: Vec<&Rx> = rx
        .iter()
        .filter(|r| matches!(r.repr.body, Body::Retry(_)))
        .collect();
    ensure(retries.len() == 1, || {
        format!(
            "{} RETRYs to one CONNECT, expected 1 (got {:?})",
            retries.len(),
            rx.iter()
                .map(|r| r.repr.body.packet_type())
                .collect::<Vec<_>>()
        )
    })?;
    let r = retries[0];
    ensure(r.repr.buffer_len() < connect_len, || {
        format!(
            "RETRY of {} B answers a CONNECT of {connect_len} B",
            r.repr.buffer_len()
        )
    })?;
    ensure(
        r.repr.header.dst_conn == p.my_id && r.repr.header.token == p.my_token,
        || {
            format!(
                "RETRY addressed to id {:#x} token {:#x}, expected the CONNECT's {:#x} {:#x}",
                r.repr.header.dst_conn, r.repr.header.token, p.my_id, p.my_token
            )
        },
    )?;
    ensure(p.retry_in(&rx) != Some([0; 32]), || {
        "a RETRY with an all-zero cookie".into()
    })?;
    // No state was kept: the same CONNECT again gets a RETRY again.
    let again = first_answer(&mut p, &connect, SILENCE)?;
    no_accept(&again)?;
    ensure(p.retry_in(&again).is_some(), || {
        "the repeated cookie-less CONNECT got no RETRY".into()
    })?;
    // And the handshake completes with the cookie.
    p.connect()?;
    p.close();
    Ok(())
}

fn wrong_cookie(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    p.cookie = [0x5a; 32];
    let connect = p.connect_repr(1024, 4, 256);
    let rx = first_answer(&mut p, &connect, SILENCE)?;
    no_accept(&rx)?;
    let fresh = p
        .retry_in(&rx)
        .ok_or("no RETRY for a CONNECT with a wrong cookie")?;
    // A cookie of the target with one bit changed: the same.
    let mut broken = fresh;
    broken[31] ^= 1;
    p.cookie = broken;
    let connect = p.connect_repr(1024, 4, 256);
    let rx = first_answer(&mut p, &connect, SILENCE)?;
    no_accept(&rx)?;
    ensure(p.retry_in(&rx).is_some(), || {
        "no RETRY for a CONNECT with a damaged cookie".into()
    })?;
    p.cookie = fresh;
    p.connect()?;
    p.close();
    Ok(())
}

fn cookie_from_another_port(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    let connect = p.connect_repr(1024, 4, 256);
    let rx = first_answer(&mut p, &connect, SILENCE)?;
    p.cookie = p.retry_in(&rx).ok_or("no RETRY")?;
    // The same CONNECT, cookie included, from another UDP port of ours.
    let other = std::net::UdpSocket::bind(if ctx.target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .map_err(|e| e.to_string())?;
    let replay = Peer::encode(&p.connect_repr(1024, 4, 256), &[]);
    other
        .send_to(&replay, ctx.target)
        .map_err(|e| e.to_string())?;
    p.pump(SILENCE, |_| false);
    let rx = p.take();
    let _ = other.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 256];
    let other_got = other.recv_from(&mut buf).is_ok();
    ensure(!other_got, || "the replaying port was answered".into())?;
    no_accept(&rx)?;
    ensure(p.retry_in(&rx).is_some(), || {
        "the replayed cookie was not answered with a RETRY".into()
    })?;
    // From its own port the cookie is good.
    p.connect()?;
    p.close();
    Ok(())
}

// ----- Placement ---------------------------------------------------------

fn write_in_order(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim()?;
    let len = v.mtu() * 3 + 100;
    let off = SLOT as usize + 10;
    write_ok(&mut v, &r, &mut m, off, &data(1, len))?;
    let res = check_region(&mut v, &r, &m, off - 16, len + 32);
    v.close();
    res
}

fn write_reordered_duplicated(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim()?;
    let len = v.mtu() * 5 + 7;
    let off = 2 * SLOT as usize + 3;
    let d = data(2, len);
    let pk = v.write_packets(
        MemoryTarget {
            key: r.key,
            addr: r.addr + off as u64,
        },
        &d,
        None,
    );
    for (rep, pl) in pk.iter().rev() {
        v.send(rep, pl)?;
        v.send(rep, pl)?;
    }
    v.wait_acked(last_psn(&pk), ACK_WAIT)?;
    m.bytes[off..off + len].copy_from_slice(&d);
    v.take();
    let res = check_region(&mut v, &r, &m, off - 8, len + 16);
    v.close();
    res
}

fn write_partial_loss(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim()?;
    let len = v.mtu() * 6;
    let off = 3 * SLOT as usize;
    let d = data(3, len);
    let pk = v.write_packets(
        MemoryTarget {
            key: r.key,
            addr: r.addr + off as u64,
        },
        &d,
        None,
    );
    let first = pk[0].0.header.psn;
    for (i, (rep, pl)) in pk.iter().enumerate() {
        if i != 1 && i != 3 {
            v.send(rep, pl)?;
        }
    }
    let last = last_psn(&pk);
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == last)
    });
    let rx = v.take();
    let a = acks(&rx)
        .into_iter()
        .find(|(_, a)| a.echo_psn == last)
        .map(|(_, a)| a)
        .ok_or("no ACK for the last packet")?;
    let want_cum = first.wrapping_add(1);
    ensure(a.cumulative == want_cum, || {
        format!("cumulative {} with PSN {} missing", a.cumulative, want_cum)
    })?;
    // Received above the hole: first+2, first+4, first+5 -> bits 0, 2, 3.
    let bits: Vec<usize> = a.sack.iter_set().collect();
    ensure(bits == [0, 2, 3], || {
        format!("SACK bits {bits:?}, expected [0, 2, 3]")
    })?;
    for i in [1, 3] {
        let (mut rep, pl) = pk[i].clone();
        rep.header.flags = Flags::RETRANSMISSION.with(Flags::ACK_REQUEST);
        v.send(&rep, &pl)?;
    }
    v.wait_acked(last, ACK_WAIT)?;
    m.bytes[off..off + len].copy_from_slice(&d);
    v.take();
    let res = check_region(&mut v, &r, &m, off, len);
    v.close();
    res
}

fn send_duplicated_completes_once(ctx: &mut Ctx) -> Result<(), Fail> {
    // The serve profile answers each announcement SEND with one SEND; a
    // duplicated SEND must complete (and be answered) once.
    let mut p = ctx.peer()?;
    p.connect()?;
    let msg = metaroce_host::app::Message::Announce {
        op: metaroce_host::app::Operation::Read,
        seed: 9,
        size: SLOT,
    }
    .encode();
    let (r, d) = p.send_packet(&msg);
    p.send(&r, &d)?;
    p.send(&r, &d)?;
    p.pump(Duration::from_millis(600), |_| false);
    let rx = p.take();
    let mut psns: Vec<u32> = rx
        .iter()
        .filter(|x| matches!(x.repr.body, Body::Send(_)))
        .map(|x| x.repr.header.psn)
        .collect();
    psns.dedup();
    p.close();
    ensure(psns.len() == 1, || {
        format!("{} answers to one (duplicated) SEND", psns.len())
    })
}

fn read_placement(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let off = 4 * SLOT as usize + 5;
    let len = 3000u32;
    let req = v.read_request(
        MemoryTarget {
            key: r.key,
            addr: r.addr + off as u64,
        },
        len,
    );
    let (msg_id, sink) = match req.body {
        Body::ReadRequest(q) => (q.msg_id, q.sink),
        _ => return Err("internal".into()),
    };
    v.send(&req, &[])?;
    let mut got = vec![0u8; len as usize];
    let mut covered = 0usize;
    let deadline = Instant::now() + ACK_WAIT;
    while covered < len as usize && Instant::now() < deadline {
        v.pump(Duration::from_millis(100), |rx| !rx.is_empty());
        for x in v.take() {
            if let Body::ReadResponse(rr) = x.repr.body {
                ensure(rr.msg.id == msg_id && rr.msg.len == len, || {
                    format!("READ_RESPONSE message {:?}", rr.msg)
                })?;
                ensure(
                    rr.target.key == sink.key
                        && rr.target.addr == sink.addr + u64::from(rr.msg.offset),
                    || {
                        format!(
                            "READ_RESPONSE target {:?} at offset {}",
                            rr.target, rr.msg.offset
                        )
                    },
                )?;
                let o = rr.msg.offset as usize;
                got[o..o + x.payload.len()].copy_from_slice(&x.payload);
                covered += x.payload.len();
            }
        }
    }
    v.close();
    ensure(covered == len as usize, || {
        format!("{covered} of {len} B arrived")
    })?;
    ensure(got == m.bytes[off..off + len as usize], || {
        "READ data differs from the region".into()
    })
}

// ----- Acknowledgment ----------------------------------------------------

fn one_packet_writes(v: &mut Peer, r: &RemoteRegion, n: usize, off: usize) -> Vec<(Repr, Vec<u8>)> {
    (0..n)
        .flat_map(|i| {
            v.write_packets(
                MemoryTarget {
                    key: r.key,
                    addr: r.addr + (off + i * 100) as u64,
                },
                &data(10 + i as u64, 100),
                None,
            )
        })
        .collect()
}

fn sack_exact(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim()?;
    let off = 5 * SLOT as usize;
    let pk = one_packet_writes(&mut v, &r, 8, off);
    let p0 = pk[0].0.header.psn;
    for i in [0, 1, 3, 5, 6] {
        v.send(&pk[i].0, &pk[i].1)?;
    }
    let last = pk[6].0.header.psn;
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == last)
    });
    let rx = v.take();
    let a = acks(&rx)
        .into_iter()
        .find(|(_, a)| a.echo_psn == last)
        .map(|(_, a)| a)
        .ok_or("no ACK for PSN +6")?;
    ensure(a.cumulative == p0.wrapping_add(2), || {
        format!(
            "cumulative {} expected {}",
            a.cumulative,
            p0.wrapping_add(2)
        )
    })?;
    let mut want = SackBits::default();
    for i in [0, 2, 3] {
        want.set(i);
    }
    ensure(a.sack == want, || {
        format!("SACK {:?} expected {want:?}", a.sack)
    })?;
    for i in [2, 4, 7] {
        v.send(&pk[i].0, &pk[i].1)?;
    }
    let end = pk[7].0.header.psn;
    v.wait_acked(end, ACK_WAIT)?;
    let rx = v.take();
    let fin = acks(&rx)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.cumulative == end.wrapping_add(1))
        .ok_or("no final ACK")?;
    ensure(fin.sack.is_empty(), || {
        format!("SACK not empty at the end: {:?}", fin.sack)
    })?;
    for (i, (_, d)) in pk.iter().enumerate() {
        m.bytes[off + i * 100..off + i * 100 + 100].copy_from_slice(d);
    }
    let res = check_region(&mut v, &r, &m, off, 800);
    v.close();
    res
}

fn ack_echo(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, _m) = ctx.victim()?;
    let mut pk = one_packet_writes(&mut v, &r, 1, 6 * SLOT as usize);
    let paths = v.accept.map_or(1, |a| a.max_paths);
    let path = if paths > 1 { 1 } else { 0 };
    pk[0].0.header.path = path;
    pk[0].0.header.timestamp = 0x1234_5678;
    v.send(&pk[0].0, &pk[0].1)?;
    let psn = pk[0].0.header.psn;
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == psn)
    });
    let rx = v.take();
    v.close();
    let a = acks(&rx)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.echo_psn == psn)
        .ok_or("no immediate ACK for ACK_REQUEST")?;
    ensure(
        a.echo_timestamp == 0x1234_5678 && a.echo_path == path && a.path_rx_count >= 1,
        || format!("echo fields {a:?}"),
    )
}

fn duplicate_acknowledged(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim()?;
    let off = 7 * SLOT as usize;
    let d = data(7, 200);
    write_ok(&mut v, &r, &mut m, off, &d)?;
    // The same packet again, now carrying different bytes: a duplicate is
    // acknowledged and never placed.
    let pk = v.write_packets(
        MemoryTarget {
            key: r.key,
            addr: r.addr + off as u64,
        },
        &d,
        None,
    );
    let (mut dup, _) = pk[0].clone();
    dup.header.psn = dup.header.psn.wrapping_sub(1);
    v.next_psn = dup.header.psn.wrapping_add(1);
    let other = data(8, 200);
    v.send(&dup, &other)?;
    v.pump(ACK_WAIT, |rx| !acks(rx).is_empty());
    let got = !acks(&v.take()).is_empty();
    let res = check_region(&mut v, &r, &m, off, 200);
    v.close();
    ensure(got, || "no ACK for a duplicate".into())?;
    res
}

// ----- Congestion --------------------------------------------------------

fn ce_echo(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, _m) = ctx.victim()?;
    let paths = v.accept.map_or(1, |a| a.max_paths);
    let path = paths.saturating_sub(1);
    let mut pk = one_packet_writes(&mut v, &r, 3, 8 * SLOT as usize);
    for (rep, pl) in pk.iter_mut() {
        rep.header.path = path;
        v.send_raw(&Peer::encode(rep, pl), true)?;
    }
    let last = last_psn(&pk);
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == last)
    });
    let rx = v.take();
    v.close();
    let a = acks(&rx)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.echo_psn == last)
        .ok_or("no ACK")?;
    ensure(
        a.echo_path == path && a.path_ce_count == 3 && a.path_rx_count == 3,
        || {
            format!(
                "3 CE packets on path {path}: ACK path {} rx {} ce {}",
                a.echo_path, a.path_rx_count, a.path_ce_count
            )
        },
    )
}

fn rate_hint(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut a, ra, _) = ctx.victim()?;
    let (mut b, rb, _) = ctx.victim()?;
    // Let earlier senders age out of the active-sender window.
    std::thread::sleep(Duration::from_millis(300));
    let hint_in = |p: &mut Peer, psn: u32| -> Result<u32, Fail> {
        p.pump(ACK_WAIT, |rx| {
            acks(rx).iter().any(|(_, a)| a.echo_psn == psn)
        });
        acks(&p.take())
            .into_iter()
            .map(|(_, a)| a)
            .find(|a| a.echo_psn == psn)
            .map(|a| a.rate_hint_mbps)
            .ok_or_else(|| "no ACK".to_string())
    };
    // A alone.
    let pa = one_packet_writes(&mut a, &ra, 1, 9 * SLOT as usize);
    send_all(&a, &pa)?;
    let alone = hint_in(&mut a, last_psn(&pa))?;
    // A and B back to back, a few rounds: an ACK to B while A is within
    // the active-sender window sees two active senders. Several rounds,
    // the lowest hint: the window is short (from 20 us in the data-centre
    // profile), and a loaded machine or a target whose engine threads
    // share their counts once a turn may let one round's A age out first.
    let mut shared = u32::MAX;
    for round in 0..8 {
        let pa = one_packet_writes(&mut a, &ra, 1, 9 * SLOT as usize + 100 * (round + 1));
        let pb = one_packet_writes(&mut b, &rb, 1, 9 * SLOT as usize + 100 * round);
        send_all(&a, &pa)?;
        send_all(&b, &pb)?;
        shared = shared.min(hint_in(&mut b, last_psn(&pb))?);
        a.take();
        if shared < alone {
            break;
        }
    }
    a.close();
    b.close();
    ensure(alone > 0, || "rate hint is 0 (absent)".into())?;
    ensure(shared < alone, || {
        format!("hint with 2 active senders {shared} not below the hint with one {alone}")
    })
}

// ----- Retransmission ----------------------------------------------------

/// READ of `n` full packets with acknowledgments off; returns the
/// responses' first PSN.
fn unacked_read(v: &mut Peer, r: &RemoteRegion, n: usize) -> Result<u32, Fail> {
    v.auto_ack = false;
    let mtu = v.mtu();
    let req = v.read_request(
        MemoryTarget {
            key: r.key,
            addr: r.addr,
        },
        (mtu * n) as u32,
    );
    v.send(&req, &[])?;
    let count = |rx: &[Rx]| {
        rx.iter()
            .filter(|x| matches!(x.repr.body, Body::ReadResponse(_)))
            .count()
    };
    v.pump(ACK_WAIT, |rx| count(rx) >= n);
    let rx = v.take();
    let psns: Vec<u32> = rx
        .iter()
        .filter(|x| matches!(x.repr.body, Body::ReadResponse(_)))
        .map(|x| x.repr.header.psn)
        .collect();
    let seen = *psns.first().ok_or("no READ_RESPONSE")?;
    // The lowest in serial order (they may arrive reordered).
    let first = psns
        .iter()
        .copied()
        .min_by_key(|p| p.wrapping_sub(seen) as i32)
        .unwrap_or(seen);
    Ok(first)
}

fn only_missing_resent(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, _) = ctx.victim()?;
    // The READ's four responses take the next four PSNs of the target;
    // the third one is "lost": everything else is acknowledged at once.
    let q = v.expected_psn();
    let lost = q.wrapping_add(2);
    v.withhold = Some(lost);
    let mtu = v.mtu();
    let req = v.read_request(
        MemoryTarget {
            key: r.key,
            addr: r.addr,
        },
        (mtu * 4) as u32,
    );
    v.send(&req, &[])?;
    let done = v.pump(ACK_WAIT, |rx| {
        rx.iter().any(|x| {
            x.repr.header.psn == lost && x.repr.header.flags.contains(Flags::RETRANSMISSION)
        })
    });
    v.pump(Duration::from_millis(100), |_| false);
    let rx = v.take();
    v.withhold = None;
    v.close();
    ensure(done, || format!("PSN {lost} was not resent"))?;
    let resent: BTreeSet<u32> = rx
        .iter()
        .filter(|x| {
            matches!(x.repr.body, Body::ReadResponse(_))
                && x.repr.header.flags.contains(Flags::RETRANSMISSION)
        })
        .map(|x| x.repr.header.psn)
        .collect();
    ensure(resent.len() == 1, || {
        format!("resent {resent:?}; expected only PSN {lost}")
    })
}

fn timeout_backoff(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, _) = ctx.victim()?;
    let start = Instant::now();
    let q = unacked_read(&mut v, &r, 1)?;
    let mut times = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while times.len() < 4 && Instant::now() < deadline {
        v.pump(Duration::from_millis(50), |rx| !rx.is_empty());
        for x in v.take() {
            if matches!(x.repr.body, Body::ReadResponse(_)) && x.repr.header.psn == q {
                ensure(x.repr.header.flags.contains(Flags::RETRANSMISSION), || {
                    "retransmission without the RETRANSMISSION flag".into()
                })?;
                times.push(start.elapsed());
            }
        }
    }
    let echo = v.header(q, Flags::NONE);
    v.send_ack_with(&echo, q.wrapping_add(1), SackBits::default())?;
    v.auto_ack = true;
    v.close();
    ensure(times.len() >= 4, || {
        format!("{} retransmissions in 3 s", times.len())
    })?;
    // Doubling gives gaps g, 2g, 4g; allow for scheduling noise.
    let g1 = times[1] - times[0];
    let g3 = times[3] - times[2];
    ensure(g3 >= g1 * 2, || {
        format!("no backoff: gaps {g1:?} ... {g3:?}")
    })
}

// ----- Bad input ---------------------------------------------------------

/// A WRITE of 64 bytes into slot 10 of `r`, from `p`.
fn stray_write(p: &mut Peer, key: u32, addr: u64) -> (Repr, Vec<u8>) {
    p.write_packets(MemoryTarget { key, addr }, &data(99, 64), None)
        .remove(0)
}

const STRAY_OFF: usize = 10 * SLOT as usize;

fn bad_token(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let (mut rep, pl) = stray_write(&mut v, r.key, r.addr + STRAY_OFF as u64);
    rep.header.token ^= 0xdead_beef;
    let res = expect_silence(&mut v, &Peer::encode(&rep, &pl));
    v.next_psn = rep.header.psn;
    let mem = check_region(&mut v, &r, &m, STRAY_OFF, 64);
    v.close();
    res.and(mem)
}

fn bad_connection(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let (mut rep, pl) = stray_write(&mut v, r.key, r.addr + STRAY_OFF as u64);
    rep.header.dst_conn ^= 0x5a5a_5a00;
    let res = expect_silence(&mut v, &Peer::encode(&rep, &pl));
    v.next_psn = rep.header.psn;
    let mem = check_region(&mut v, &r, &m, STRAY_OFF, 64);
    v.close();
    res.and(mem)
}

/// A second connection sends `make`'s packet; expects `reason`; the
/// victim's region stays as it was.
fn fatal(
    ctx: &mut Ctx,
    reason: NakReason,
    read_only: bool,
    make: impl FnOnce(&mut Peer, &RemoteRegion) -> (Repr, Vec<u8>),
) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    // Another connection with keys of its own for the victim's region
    // (each connection has its own protection domain).
    let mut x = ctx.peer()?;
    let rx = x.join(r.ticket)?;
    let pkt = make(&mut x, &rx);
    let res = expect_nak(&mut x, &pkt, reason);
    x.close();
    let mem = if read_only {
        let got = v.read(
            MemoryTarget {
                key: r.ro_key,
                addr: r.ro_addr,
            },
            READ_ONLY_LEN,
        )?;
        let mut want = vec![0u8; READ_ONLY_LEN as usize];
        let seed = u64::from(ctx.next_seed - 1) * 0x1234_5678_9abc;
        fill_pattern(seed, READ_ONLY_INDEX, &mut want);
        ensure(got == want, || "read-only region changed".into())
    } else {
        check_region(&mut v, &r, &m, STRAY_OFF, 64)
            .and_then(|()| check_region(&mut v, &r, &m, m.bytes.len() - 256, 256))
    };
    v.close();
    res.and(mem)
}

fn bad_key(ctx: &mut Ctx) -> Result<(), Fail> {
    fatal(ctx, NakReason::InvalidKey, false, |x, r| {
        stray_write(x, r.key ^ 0x00a5_5a00, r.addr + STRAY_OFF as u64)
    })
}

/// Isolation (appendix B, 5.1.3): a key one connection was given is refused
/// on another connection of the same peer (each connection has its own
/// protection domain), and nothing is written.
fn key_of_another_connection(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let mut x = ctx.peer()?;
    x.connect()?;
    let pkt = stray_write(&mut x, r.key, r.addr + STRAY_OFF as u64);
    let res = expect_nak(&mut x, &pkt, NakReason::InvalidKey);
    x.close();
    let mem = check_region(&mut v, &r, &m, STRAY_OFF, 64);
    v.close();
    res.and(mem)
}

fn bad_permission(ctx: &mut Ctx) -> Result<(), Fail> {
    fatal(ctx, NakReason::AccessDenied, true, |x, r| {
        stray_write(x, r.ro_key, r.ro_addr)
    })
}

fn bad_bounds(ctx: &mut Ctx) -> Result<(), Fail> {
    fatal(ctx, NakReason::OutOfBounds, false, |x, r| {
        stray_write(x, r.key, r.addr + r.len - 32)
    })
}

fn fatal_nak_sticky(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let mut x = ctx.peer()?;
    let rx = x.join(r.ticket)?;
    let first = stray_write(&mut x, rx.key ^ 0x00a5_5a00, rx.addr + STRAY_OFF as u64);
    expect_nak(&mut x, &first, NakReason::InvalidKey)?;
    // A valid WRITE afterwards: answered with the same NAK, not placed.
    let good = stray_write(&mut x, rx.key, rx.addr + STRAY_OFF as u64);
    x.send(&good.0, &good.1)?;
    x.pump(ACK_WAIT, |rx| Peer::first_nak(rx).is_some());
    let rx = x.take();
    x.close();
    let nak = Peer::first_nak(&rx).ok_or("no NAK for a packet after a fatal NAK")?;
    ensure(
        nak.reason == NakReason::InvalidKey && nak.nak_psn == first.0.header.psn,
        || format!("later NAK {nak:?} differs from the first"),
    )?;
    ensure(acks(&rx).is_empty(), || {
        "a packet after a fatal NAK was acknowledged".into()
    })?;
    let mem = check_region(&mut v, &r, &m, STRAY_OFF, 64);
    v.close();
    mem
}

/// A silent-drop case on the victim's own connection: the broken packet
/// gets no answer, memory is unchanged, and the connection still works.
fn silent(ctx: &mut Ctx, breaker: impl FnOnce(&mut Peer, Vec<u8>) -> Vec<u8>) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim()?;
    let (rep, pl) = stray_write(&mut v, r.key, r.addr + STRAY_OFF as u64);
    let bytes = breaker(&mut v, Peer::encode(&rep, &pl));
    let res = expect_silence(&mut v, &bytes);
    // Reuse the PSN for a valid write: it must be accepted.
    v.next_psn = rep.header.psn;
    let alive = write_ok(&mut v, &r, &mut m, STRAY_OFF + 128, &data(5, 32));
    let mem = check_region(&mut v, &r, &m, STRAY_OFF, 256);
    v.close();
    res.and(alive).and(mem)
}

fn bad_crc(ctx: &mut Ctx) -> Result<(), Fail> {
    silent(ctx, |_, mut b| {
        let n = b.len();
        b[n - 10] ^= 0x40;
        b
    })
}

fn truncated(ctx: &mut Ctx) -> Result<(), Fail> {
    silent(ctx, |_, b| b[..40].to_vec())
}

fn unknown_type(ctx: &mut Ctx) -> Result<(), Fail> {
    silent(ctx, |_, mut b| {
        b[1] = 0x07;
        let n = b.len();
        let crc = metaroce_core::wire::packet::crc32(&[&b[..n - 4]]);
        b[n - 4..].copy_from_slice(&crc.to_be_bytes());
        b
    })
}

fn psn_outside_window(ctx: &mut Ctx) -> Result<(), Fail> {
    silent(ctx, |v, b| {
        let window = v.accept.map_or(256, |a| a.window);
        let Ok((mut rep, payload)) = metaroce_core::wire::parse(&b) else {
            return b;
        };
        rep.header.psn = rep.header.psn.wrapping_add(window + 5);
        Peer::encode(&rep, payload)
    })
}

/// The negotiated MTU, not the largest one, bounds a
/// packet's payload: more is a PROTOCOL_ERROR, placed nowhere.
fn negotiated_mtu_enforced(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let mut x = ctx.peer()?;
    let rx = x.join_with(r.ticket, 512, 256)?;
    let mtu = x.mtu();
    ensure(mtu == 512, || format!("negotiated MTU {mtu}, offered 512"))?;
    let off = 12 * SLOT as usize;
    let big = data(13, 1000);
    let mut pk = x.write_packets(
        MemoryTarget {
            key: rx.key,
            addr: rx.addr + off as u64,
        },
        &big[..mtu],
        None,
    );
    // One packet carrying 1000 B, over the 512 agreed (under the 1024
    // the target offered).
    pk[0].1 = big.clone();
    pk[0].0.payload_len = 1000;
    if let Body::Write(w) = &mut pk[0].0.body {
        w.msg.len = 1000;
    }
    let res = expect_nak(&mut x, &pk[0], NakReason::ProtocolError);
    x.close();
    let mem = check_region(&mut v, &r, &m, off, 1000);
    v.close();
    res.and(mem)
}

/// The negotiated window, not the largest one, bounds
/// the PSNs a receiver takes: beyond it a packet is dropped silently,
/// placed nowhere and not acknowledged.
fn negotiated_window_enforced(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let mut x = ctx.peer()?;
    let rx = x.join_with(r.ticket, 1024, 16)?;
    let window = x.accept.map_or(0, |a| a.window);
    ensure(window == 16, || {
        format!("negotiated window {window}, offered 16")
    })?;
    let off = 13 * SLOT as usize;
    let mut pk = x.write_packets(
        MemoryTarget {
            key: rx.key,
            addr: rx.addr + off as u64,
        },
        &data(14, 64),
        None,
    );
    let base = pk[0].0.header.psn;
    // 20 PSNs ahead: inside the largest window (256), outside the agreed 16.
    pk[0].0.header.psn = base.wrapping_add(20);
    let res = expect_silence(&mut x, &Peer::encode(&pk[0].0, &pk[0].1));
    // The connection still works; the far PSN was not taken (no SACK bit).
    x.next_psn = base;
    let ok = x.write_packets(
        MemoryTarget {
            key: rx.key,
            addr: rx.addr + off as u64 + 1024,
        },
        &data(15, 16),
        None,
    );
    x.send(&ok[0].0, &ok[0].1)?;
    x.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == base)
    });
    let got = x.take();
    x.close();
    let a = acks(&got)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.echo_psn == base)
        .ok_or("no ACK for the in-window packet")?;
    let alive = ensure(
        a.cumulative == base.wrapping_add(1) && a.sack.is_empty(),
        || {
            format!(
                "ACK cumulative {} SACK {:?}: the PSN beyond the window was taken",
                a.cumulative, a.sack
            )
        },
    );
    let mem = check_region(&mut v, &r, &m, off, 64);
    v.close();
    res.and(alive).and(mem)
}

fn rnr_retried(ctx: &mut Ctx) -> Result<(), Fail> {
    // The target's answer to the announcement is a SEND; refusing it with
    // RECEIVER_NOT_READY must get it resent later, not end the connection.
    let mut p = ctx.peer()?;
    p.connect()?;
    let q = p.expected_psn();
    p.withhold = Some(q);
    let msg = metaroce_host::app::Message::Announce {
        op: metaroce_host::app::Operation::Read,
        seed: 11,
        size: SLOT,
    }
    .encode();
    let (r, d) = p.send_packet(&msg);
    p.send(&r, &d)?;
    let first = p.pump(ACK_WAIT, |rx| {
        rx.iter()
            .any(|x| matches!(x.repr.body, Body::Send(_)) && x.repr.header.psn == q)
    });
    ensure(first, || "no SEND from the target".into())?;
    p.take();
    let nak = Repr {
        header: p.header(p.next_psn, Flags::NONE),
        body: Body::Nak(NakRepr {
            cumulative: q,
            nak_psn: q,
            reason: NakReason::ReceiverNotReady,
        }),
        payload_len: 0,
    };
    p.send(&nak, &[])?;
    let resent = p.pump(ACK_WAIT, |rx| {
        rx.iter().any(|x| {
            matches!(x.repr.body, Body::Send(_))
                && x.repr.header.psn == q
                && x.repr.header.flags.contains(Flags::RETRANSMISSION)
        })
    });
    let rx = p.take();
    p.withhold = None;
    p.close();
    ensure(resent, || {
        format!("PSN {q} not resent after RECEIVER_NOT_READY")
    })?;
    ensure(
        !rx.iter().any(|x| matches!(x.repr.body, Body::Close(_))),
        || "the target closed the connection after RECEIVER_NOT_READY".into(),
    )
}

fn inconsistent_message(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let mut x = ctx.peer()?;
    let rx = x.join(r.ticket)?;
    let mtu = x.mtu();
    let off = 11 * SLOT as usize;
    let mut pk = x.write_packets(
        MemoryTarget {
            key: rx.key,
            addr: rx.addr + off as u64,
        },
        &data(12, 2 * mtu),
        Some(0x0102_0304),
    );
    // A WRITE_IMM (its receive tracks the message); the second packet
    // claims another message length (3.4.5).
    if let Body::Write(w) = &mut pk[1].0.body {
        w.msg.len += 8;
    }
    x.send(&pk[0].0, &pk[0].1)?;
    let res = expect_nak(&mut x, &pk[1], NakReason::ProtocolError);
    x.close();
    // The refused packet's bytes were not placed.
    let mem = check_region(&mut v, &r, &m, off + mtu, mtu);
    v.close();
    res.and(mem)
}

/// Every case, in the order they run.
pub const CASES: &[Case] = &[
    Case {
        name:
            "handshake: first CONNECT gets one smaller RETRY (its id, token), no ACCEPT, no state",
        section: "3.8.4, 4.2, 5.1.4",
        run: retry_first,
        attempts: 1,
    },
    Case {
        name: "handshake: wrong cookie gets another RETRY, no state",
        section: "4.2, 5.1.4",
        run: wrong_cookie,
        attempts: 1,
    },
    Case {
        name: "handshake: cookie replayed from another source port is refused",
        section: "4.2, 5.1.4",
        run: cookie_from_another_port,
        attempts: 1,
    },
    Case {
        name: "handshake: negotiation to the minimum",
        section: "3.8.1, 4.2",
        run: negotiate_min,
        attempts: 1,
    },
    Case {
        name: "handshake: ACCEPT grants no share or a share that counts half-open connections",
        section: "3.8.1, 4.10.4, 4.10.6",
        run: accept_grant,
        attempts: 2,
    },
    Case {
        name: "handshake: duplicate CONNECT gets the same ACCEPT",
        section: "4.2 (3)",
        run: duplicate_connect,
        attempts: 1,
    },
    Case {
        name: "window: above 256 negotiated to the minimum, C + W - 1 taken, C + W not",
        section: "3.8.1, 4.2, 4.3, 4.4",
        run: window::window_above_256,
        attempts: 1,
    },
    Case {
        name: "handshake: first packet confirms, data accepted",
        section: "4.2 (5)",
        run: confirm_then_data,
        attempts: 1,
    },
    Case {
        name: "placement: WRITE in order, exact bytes",
        section: "3.4.1, 4.8.1",
        run: write_in_order,
        attempts: 1,
    },
    Case {
        name: "placement: WRITE reversed and duplicated",
        section: "3.4.5, 4.3, 4.8.1",
        run: write_reordered_duplicated,
        attempts: 1,
    },
    Case {
        name: "placement: WRITE partly lost, then retransmitted",
        section: "3.6, 4.3, 4.8.1",
        run: write_partial_loss,
        attempts: 1,
    },
    Case {
        name: "placement: duplicated SEND completes once",
        section: "3.4.2, 4.8.3",
        run: send_duplicated_completes_once,
        attempts: 1,
    },
    Case {
        name: "placement: READ responses (id, offsets, sink, data)",
        section: "3.4.3, 3.4.4, 4.8.6",
        run: read_placement,
        attempts: 1,
    },
    Case {
        name: "ack: exact cumulative PSN and SACK bits",
        section: "3.5, 3.6, 4.5",
        run: sack_exact,
        attempts: 1,
    },
    Case {
        name: "ack: immediate, echoes PSN, timestamp and path",
        section: "3.5, 4.5",
        run: ack_echo,
        attempts: 1,
    },
    Case {
        name: "ack: duplicate acknowledged, not placed",
        section: "4.3",
        run: duplicate_acknowledged,
        attempts: 1,
    },
    Case {
        name: "ack: SACK Offset at the newest arrivals beyond 256",
        section: "3.5, 3.6, 4.5",
        run: window::sack_offset_newest,
        attempts: 3,
    },
    Case {
        name: "congestion: CE counted in Path CE Count",
        section: "3.5, 4.10.1",
        run: ce_echo,
        attempts: 1,
    },
    Case {
        name: "congestion: rate hint present, falls with 2 senders",
        section: "3.5, 4.10.4",
        run: rate_hint,
        attempts: 3,
    },
    Case {
        name: "retransmission: only the missing PSN, flagged",
        section: "3.4.5, 4.6.3",
        run: only_missing_resent,
        attempts: 3,
    },
    Case {
        name: "retransmission: timeout with backoff",
        section: "4.6.4",
        run: timeout_backoff,
        attempts: 3,
    },
    Case {
        name: "bad input: wrong token, silent, memory untouched",
        section: "4.7.1 (3), 5.1.2",
        run: bad_token,
        attempts: 1,
    },
    Case {
        name: "bad input: unknown connection, silent",
        section: "4.7.1 (2), 4.7.4",
        run: bad_connection,
        attempts: 1,
    },
    Case {
        name: "bad input: bad key -> NAK INVALID_KEY",
        section: "3.7, 4.7.2, 5.1.3",
        run: bad_key,
        attempts: 1,
    },
    Case {
        name: "isolation: another connection's key -> NAK INVALID_KEY",
        section: "5.1.3, B",
        run: key_of_another_connection,
        attempts: 1,
    },
    Case {
        name: "bad input: no permission -> NAK ACCESS_DENIED",
        section: "3.7, 4.7.2, 5.1.3",
        run: bad_permission,
        attempts: 1,
    },
    Case {
        name: "bad input: out of bounds -> NAK OUT_OF_BOUNDS",
        section: "3.7, 4.7.2, 5.1.3",
        run: bad_bounds,
        attempts: 1,
    },
    Case {
        name: "bad input: PSN outside the window, silent",
        section: "4.3, 4.7.4",
        run: psn_outside_window,
        attempts: 1,
    },
    Case {
        name: "bad input: payload over the negotiated MTU -> NAK PROTOCOL_ERROR",
        section: "3.1.7, 3.7, 4.7.2",
        run: negotiated_mtu_enforced,
        attempts: 1,
    },
    Case {
        name: "bad input: PSN beyond the negotiated window, silent, not taken",
        section: "4.3, 4.7.4",
        run: negotiated_window_enforced,
        attempts: 1,
    },
    Case {
        name: "bad input: bad CRC, silent",
        section: "3.9, 3.11, 4.7.4",
        run: bad_crc,
        attempts: 1,
    },
    Case {
        name: "bad input: truncated, silent",
        section: "3.11, 4.7.4",
        run: truncated,
        attempts: 1,
    },
    Case {
        name: "bad input: unknown type, silent",
        section: "3.3, 3.11, 4.7.4",
        run: unknown_type,
        attempts: 1,
    },
    Case {
        name: "errors: fatal NAK is sticky",
        section: "4.7.2",
        run: fatal_nak_sticky,
        attempts: 1,
    },
    Case {
        name: "errors: RECEIVER_NOT_READY is retried",
        section: "3.7, 4.7.3",
        run: rnr_retried,
        attempts: 1,
    },
    Case {
        name: "bad input: inconsistent WRITE_IMM -> PROTOCOL_ERROR",
        section: "3.4.5, 3.7, 4.7.2",
        run: inconsistent_message,
        attempts: 1,
    },
    Case {
        name: "errors: each refused packet gets its own NAK",
        section: "3.7, 4.7.1, 4.7.3",
        run: conformance::nak_per_refused_packet,
        attempts: 1,
    },
    Case {
        name: "congestion: CE on duplicates and refused packets counted",
        section: "3.5, 4.10",
        run: conformance::ce_on_duplicates_and_refused,
        attempts: 1,
    },
    Case {
        name: "keepalive: not acknowledged",
        section: "3.8.3, 4.5, 4.12",
        run: conformance::keepalive_not_acknowledged,
        attempts: 1,
    },
    Case {
        name: "bad input: valid packet from another address, silent",
        section: "4.7.1, 4.7.4",
        run: conformance::other_source_address,
        attempts: 1,
    },
    Case {
        name: "header: PSN field of ACCEPT (repeated too) and ACK",
        section: "3.2.4, 3.8.1",
        run: conformance::psn_field_of_control_packets,
        attempts: 1,
    },
    Case {
        name: "READ depth: stated in the ACCEPT, that many READs at once all served, no RNR",
        section: "3.8.1, 4.8.6, 4.14.3",
        run: read_depth::read_depth_stated_and_served,
        attempts: 1,
    },
    Case {
        name: "close: every CLOSE answered with one CLOSE_REPLY of its reason, after release too",
        section: "3.8.2, 4.1.1, 4.1.2",
        run: closing::close_answered_after_close,
        attempts: 1,
    },
    Case {
        name: "0-RTT: valid proof taken, first flight placed at once",
        section: "4.2.4, 5.3.3",
        run: early::early_accepted,
        attempts: 1,
    },
    Case {
        name: "0-RTT: wrong tag gets a RETRY, nothing placed",
        section: "4.2.4, 5.1.4",
        run: early::early_wrong_mac,
        attempts: 1,
    },
    Case {
        name: "0-RTT: replayed CONNECT and first flight place nothing",
        section: "4.2.4, 5.1.4",
        run: early::early_replayed,
        attempts: 1,
    },
    Case {
        name: "0-RTT: stale proof gets a RETRY, nothing placed",
        section: "4.2.4",
        run: early::early_stale,
        attempts: 1,
    },
    Case {
        name: "address tokens: NEW_TOKEN, if any, only once Established, once, well formed",
        section: "3.8.5, 3.2.4, 4.2.5",
        run: tokens::new_token_after_established,
        attempts: 1,
    },
    Case {
        name: "address tokens: a CONNECT with the token skips the RETRY",
        section: "4.2 step 3.3, 4.2.5",
        run: tokens::token_skips_the_retry,
        attempts: 1,
    },
    Case {
        name: "address tokens: the token from another address gets a RETRY, no state",
        section: "4.2.5, 5.1.4",
        run: tokens::token_from_another_address,
        attempts: 1,
    },
    Case {
        name: "address tokens: a token in an early CONNECT is no proof",
        section: "4.2.4, 4.2.5",
        run: tokens::token_in_early_connect,
        attempts: 1,
    },
    Case {
        name: "secrets: tokens unpredictable (no SplitMix64 state recovery)",
        section: "5.1.2, 5.1.6",
        run: crate::secrets::tokens_unpredictable,
        attempts: 1,
    },
    Case {
        name: "admission: unconfirmed ones give a new /24 a slot (RECLAIMED)",
        section: "4.2.3, 3.8.2",
        run: admission::unconfirmed_give_way,
        attempts: 1,
    },
    Case {
        name: "admission: idle ones kept alive give a new /24 a slot",
        section: "4.2.3, 3.8.2",
        run: admission::idle_give_way,
        attempts: 1,
    },
    Case {
        name: "admission: key slots held unconfirmed give a new /24 one",
        section: "4.2.3, 5.3.6",
        run: admission::key_slots_give_way,
        attempts: 1,
    },
    Case {
        name: "admission: a /32 at its half-open limit is REJECTED",
        section: "4.2.3, 4.2",
        run: admission::half_open_limit_per_prefix,
        attempts: 1,
    },
];
