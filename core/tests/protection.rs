//! Packet protection (spec 5.3) on a virtual clock: protected transfers
//! through a lossy, reordering, duplicating channel; the on-path attacks
//! of the threat model (spec 5.1.1: a forged CLOSE, a sweep of forged NAKs, forged SACK bits,
//! tampering, replays) failing with protection on, and succeeding without
//! it, so each test shows it can fail; and the negotiation (policies,
//! Key IDs, downgrades, a tampered handshake).

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, ConnHandle, Op, Status, WorkRequest};
use metaroce_core::crypto::{Policy, ProtectionConfig, Refusal};
use metaroce_core::wire::protect::{SecurityRepr, SECURITY_LEN, TAG_LEN};
use metaroce_core::wire::{
    self, AckRepr, Body, CipherSuite, CloseReason, CloseRepr, Flags, Header, MemoryTarget,
    NakReason, NakRepr, Repr, SackBits,
};
use metaroce_core::{CommandError, Config, ConnState, Event, Instant};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, RngSeed};

const KEY_ID: u32 = 7;
const PSK: [u8; 32] = [0x5a; 32];
const SRC: u64 = ARENA_BASE;
const DST: u64 = ARENA_BASE;
const SPAN: u64 = 1 << 20;

fn config(policy: Policy, key_id: u32) -> Config {
    Config {
        mtu: 1024,
        protection: ProtectionConfig { policy, key_id },
        ..Config::default()
    }
}

/// Two nodes with their own configurations, both holding `PSK` as
/// `KEY_ID` (and node 1 also as 8 when `extra_key`).
fn cluster(a: Config, b: Config, imp: Impairments, seed: u64) -> Cluster {
    let mut c = Cluster::new(2, a, imp, seed);
    c.nodes[1].ep = endpoint(b, 8, seed ^ 0xb);
    for n in &mut c.nodes {
        n.ep.add_psk(KEY_ID, &PSK).unwrap();
    }
    c
}

struct Transfer {
    c: Cluster,
    a: ConnHandle,
    src: u32,
    dst: u32,
}

fn transfer_setup(protect: bool, imp: Impairments, seed: u64) -> Transfer {
    let policy = if protect {
        Policy::Require
    } else {
        Policy::Off
    };
    let mut c = cluster(config(policy, KEY_ID), config(policy, KEY_ID), imp, seed);
    let src = c.register(0, SRC, SPAN, Access::LOCAL_WRITE);
    let dst = c.register(1, DST, SPAN, Access::REMOTE_WRITE);
    let bytes = c.nodes[0].mem.slice_mut(SRC, SPAN as usize);
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern(seed, 0, i);
    }
    let (a, b) = c.connect(0, 1);
    let want = if protect {
        CipherSuite::Aes256Gcm
    } else {
        CipherSuite::None
    };
    assert_eq!(c.nodes[0].ep.protection(a).map(|p| p.0), Some(want));
    assert_eq!(c.nodes[1].ep.protection(b).map(|p| p.0), Some(want));
    Transfer { c, a, src, dst }
}

/// Posts `count` WRITEs of `len` bytes (consecutive targets), calls
/// `attack` every step, runs until every completion is in or `limit`
/// passes. Returns whether all completed successfully with every byte in
/// place and nothing else written.
fn run_writes(
    t: &mut Transfer,
    count: u64,
    len: u32,
    limit: Duration,
    mut attack: impl FnMut(&mut Cluster, u64),
) -> bool {
    let deadline = t.c.now + limit;
    let mut posted = 0u64;
    let mut step = 0u64;
    let first = t.c.nodes[0].completions.len();
    loop {
        while posted < count {
            let off = posted * u64::from(len);
            let wr = WorkRequest {
                id: posted,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: t.dst,
                        addr: DST + off,
                    },
                },
                local: t.c.local(t.src, SRC + off, len),
            };
            if t.c.nodes[0].ep.post_send(t.a, wr).is_err() {
                break;
            }
            posted += 1;
        }
        let done = t.c.nodes[0].completions.len() - first;
        if done as u64 == count || t.c.now > deadline {
            break;
        }
        attack(&mut t.c, step);
        step += 1;
        if !t.c.step() {
            break;
        }
    }
    let comps = &t.c.nodes[0].completions[first..];
    let all_ok = comps.len() as u64 == count && comps.iter().all(|c| c.status == Status::Success);
    if all_ok {
        let n = (count * u64::from(len)) as usize;
        assert_eq!(
            fnv(t.c.nodes[1].mem.slice(DST, n)),
            fnv(t.c.nodes[0].mem.slice(SRC, n)),
            "bytes differ"
        );
        assert!(
            t.c.nodes[1].mem.bytes[n..].iter().all(|&b| b == SENTINEL),
            "written outside the targets"
        );
    }
    all_ok
}

/// Records every packet node `from` sends (the on-path attacker's view).
fn sniff(c: &mut Cluster, from: usize) -> Rc<RefCell<Vec<Vec<u8>>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    c.tamper = Some(Box::new(move |f, bytes| {
        if f == from {
            s.borrow_mut().push(bytes.clone());
        }
        false
    }));
    seen
}

/// Hands `bytes` to node `to` as if node `from` had sent it.
fn inject(c: &mut Cluster, from: usize, to: usize, bytes: &[u8]) {
    let meta = metaroce_core::api::RxMeta {
        source: c.addr(from),
        ce: false,
    };
    let now = c.now;
    let node = &mut c.nodes[to];
    node.ep.handle_packet(now, &meta, bytes, &mut node.mem);
}

fn fix_crc(bytes: &mut [u8]) {
    let n = bytes.len();
    let crc = wire::packet::crc32(&[&bytes[..n - 4]]);
    bytes[n - 4..].copy_from_slice(&crc.to_be_bytes());
}

/// A packet of `body` to the receiver a sniffed packet was sent to (its
/// connection id and token), as an on-path attacker forges it: in clear,
/// or made to look protected with the sniffed Key ID, an IV of its
/// choosing and a tag it cannot compute.
fn forge(sniffed: &[u8], body: Body, protected: Option<u64>) -> Vec<u8> {
    let dst_conn = u32::from_be_bytes(sniffed[4..8].try_into().unwrap());
    let token = u64::from_be_bytes(sniffed[8..16].try_into().unwrap());
    let repr = Repr {
        header: Header {
            flags: if protected.is_some() {
                Flags::PROTECTED
            } else {
                Flags::NONE
            },
            dst_conn,
            token,
            psn: 0,
            path: 0,
            timestamp: 0,
        },
        body,
        payload_len: 0,
    };
    let hl = repr.header_len();
    let Some(iv) = protected else {
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, &[]);
        return buf;
    };
    let sec = wire::packet::Packet::new_checked(sniffed)
        .ok()
        .and_then(|p| p.security().map(|s| SecurityRepr::parse(s).unwrap()))
        .expect("sniffed packet is protected");
    let mut buf = vec![0u8; hl + SECURITY_LEN + TAG_LEN + 4];
    repr.emit_header(&mut buf);
    SecurityRepr {
        key_id: sec.key_id,
        iv,
    }
    .emit(&mut buf[hl..]);
    for (i, b) in buf[hl + SECURITY_LEN..hl + SECURITY_LEN + TAG_LEN]
        .iter_mut()
        .enumerate()
    {
        *b = (iv as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    fix_crc(&mut buf);
    buf
}

/// The highest IV in a set of sniffed protected packets.
fn highest_iv(sniffed: &[Vec<u8>]) -> u64 {
    sniffed
        .iter()
        .filter_map(|p| wire::protect::Sealed::split(p).map(|s| s.security.iv))
        .max()
        .unwrap_or(0)
}

fn lossy() -> Impairments {
    Impairments {
        loss: 0.05,
        reorder: 0.2,
        duplicate: 0.05,
        reorder_extra: Duration::from_micros(20),
        skew: Duration::from_micros(3),
        ..Impairments::default()
    }
}

// ----- Transfers -------------------------------------------------------------

fn pt_config(cases: u32) -> PtConfig {
    PtConfig {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x7073_7000),
        failure_persistence: None,
        ..PtConfig::default()
    }
}

proptest! {
    #![proptest_config(pt_config(64))]

    /// Protected transfers through loss, reordering and duplication:
    /// every byte lands once, every completion succeeds, no packet fails
    /// authentication, and the channel's duplicates are caught as replays.
    #[test]
    fn protected_transfers_survive_loss_reordering_and_duplication(
        seed in any::<u64>(),
        loss in 0.0f64..0.15,
        reorder in 0.0f64..0.5,
        duplicate in 0.0f64..0.1,
        count in 1u64..24,
        len in 1u32..20_000,
    ) {
        let imp = Impairments {
            loss,
            reorder,
            duplicate,
            reorder_extra: Duration::from_micros(20),
            skew: Duration::from_micros(3),
            ..Impairments::default()
        };
        let mut t = transfer_setup(true, imp, seed);
        let ok = run_writes(&mut t, count, len, Duration::from_secs(5), |_, _| {});
        prop_assert!(ok, "transfer failed");
        let (pa, pb) = (t.c.nodes[0].ep.protection_stats(), t.c.nodes[1].ep.protection_stats());
        prop_assert!(pa.opened > 0 && pb.opened > 0);
        prop_assert_eq!(pa.auth_failed + pb.auth_failed, 0);
        prop_assert_eq!(pa.unprotected + pb.unprotected, 0);
        if t.c.stats.duplicated == 0 {
            prop_assert_eq!(pa.replayed + pb.replayed, 0);
        }
        t.c.nodes[0].ep.close(t.c.now, t.a).unwrap();
        let a = t.a;
        let closed = t.c.run_until(t.c.now + Duration::from_millis(500), |c| {
            c.nodes[0].ep.state(a) == Some(ConnState::Closed)
        });
        prop_assert!(closed, "protected CLOSE handshake");
    }
}

// ----- On-path attacks -------------------------------------------------------

/// A CLOSE forged from a sniffed packet's id and token, in clear and
/// dressed as protected: ends an unprotected transfer, not a protected one.
#[test]
fn a_forged_close_ends_only_an_unprotected_transfer() {
    for protect in [false, true] {
        let mut t = transfer_setup(protect, lossy(), 21);
        let seen = sniff(&mut t.c, 1);
        let ok = run_writes(&mut t, 64, 8192, Duration::from_secs(2), |c, step| {
            if step % 50 != 25 {
                return;
            }
            let Some(p) = seen.borrow().last().cloned() else {
                return;
            };
            let close = Body::Close(CloseRepr {
                reason: CloseReason::Normal,
            });
            inject(c, 1, 0, &forge(&p, close, None));
            if protect {
                let iv = highest_iv(&seen.borrow());
                // The sniffed IV again, and one ahead of the sender's.
                inject(c, 1, 0, &forge(&p, close, Some(iv)));
                inject(c, 1, 0, &forge(&p, close, Some(iv + 10)));
            }
        });
        if protect {
            assert!(ok, "the protected transfer completes");
            let s = t.c.nodes[0].ep.protection_stats();
            assert!(s.unprotected > 0, "{s:?}");
            assert!(s.auth_failed + s.replayed > 0, "{s:?}");
            assert_eq!(t.c.nodes[0].ep.state(t.a), Some(ConnState::Established));
        } else {
            assert!(!ok, "the forged CLOSE ends the unprotected transfer");
            assert_eq!(t.c.nodes[0].ep.state(t.a), Some(ConnState::Closed));
        }
    }
}

/// A sweep of forged fatal NAKs over the sender's window.
#[test]
fn a_sweep_of_forged_naks_fails_only_without_protection() {
    for protect in [false, true] {
        let mut t = transfer_setup(protect, lossy(), 22);
        let seen = sniff(&mut t.c, 1);
        let ok = run_writes(&mut t, 64, 8192, Duration::from_secs(2), |c, step| {
            if step % 40 != 20 {
                return;
            }
            // The cumulative PSN of the last ACK seen from the receiver.
            let Some(ack) = seen.borrow().iter().rev().find(|p| p[1] == 0x10).cloned() else {
                return;
            };
            let cum = u32::from_be_bytes(ack[28..32].try_into().unwrap());
            let iv = if protect {
                highest_iv(&seen.borrow())
            } else {
                0
            };
            for k in 0..256u32 {
                let nak = Body::Nak(NakRepr {
                    cumulative: cum,
                    nak_psn: cum.wrapping_add(k),
                    reason: NakReason::ProtocolError,
                });
                inject(c, 1, 0, &forge(&ack, nak, None));
                if protect {
                    inject(c, 1, 0, &forge(&ack, nak, Some(iv + 1 + u64::from(k))));
                }
            }
        });
        if protect {
            assert!(ok, "the protected transfer completes");
            let s = t.c.nodes[0].ep.protection_stats();
            assert!(s.unprotected >= 256 && s.auth_failed >= 256, "{s:?}");
        } else {
            assert!(!ok, "forged NAKs fail the unprotected transfer");
            let failed = t.c.nodes[0]
                .completions
                .iter()
                .any(|c| c.status == Status::RemoteProtocol);
            assert!(failed);
        }
    }
}

/// Forged ACKs that SACK every PSN: without protection the sender takes
/// lost packets for delivered and the transfer stalls; with it they are
/// dropped and the transfer completes through 5 % loss.
#[test]
fn forged_sack_bits_stall_only_an_unprotected_transfer() {
    for protect in [false, true] {
        let mut t = transfer_setup(protect, lossy(), 23);
        let seen = sniff(&mut t.c, 1);
        let ok = run_writes(&mut t, 64, 8192, Duration::from_secs(1), |c, _| {
            let Some(ack) = seen.borrow().iter().rev().find(|p| p[1] == 0x10).cloned() else {
                return;
            };
            let cum = u32::from_be_bytes(ack[28..32].try_into().unwrap());
            let mut sack = SackBits::EMPTY;
            for i in 0..255 {
                sack.set(i);
            }
            let forged = Body::Ack(AckRepr {
                cumulative: cum,
                echo_psn: cum,
                echo_timestamp: 0,
                echo_path: 0,
                path_rx_count: 0,
                path_ce_count: 0,
                sack_offset: 0,
                rate_hint_mbps: 0,
                sack,
            });
            inject(c, 1, 0, &forge(&ack, forged, None));
            if protect {
                let iv = highest_iv(&seen.borrow());
                inject(c, 1, 0, &forge(&ack, forged, Some(iv + 1)));
            }
        });
        if protect {
            assert!(ok, "the protected transfer completes");
        } else {
            assert!(!ok, "forged SACK bits stall the unprotected transfer");
        }
    }
}

/// Data packets changed on the way (payload, then the target address),
/// their CRC fixed: the receiver drops them as unauthenticated, the
/// sender's retransmissions (new IVs) complete the transfer, and nothing
/// lands at the changed address.
#[test]
fn tampered_packets_are_dropped_and_counted() {
    let mut t = transfer_setup(true, Impairments::default(), 24);
    let n = Rc::new(RefCell::new(0u32));
    let count = n.clone();
    t.c.tamper = Some(Box::new(move |from, bytes| {
        if from == 0 && bytes[1] == 0x01 {
            let mut k = count.borrow_mut();
            *k += 1;
            match *k % 3 {
                // A payload byte (after 28 + 24 + 16 header bytes).
                1 => bytes[80] ^= 0x40,
                // The Address field: would land 64 KiB off.
                2 => bytes[28 + 21] ^= 0x01,
                _ => {}
            }
            let l = bytes.len();
            let crc = wire::packet::crc32(&[&bytes[..l - 4]]);
            bytes[l - 4..].copy_from_slice(&crc.to_be_bytes());
        }
        false
    }));
    assert!(run_writes(
        &mut t,
        8,
        4096,
        Duration::from_secs(2),
        |_, _| {}
    ));
    let s = t.c.nodes[1].ep.protection_stats();
    assert!(s.auth_failed >= 10, "{s:?}");
    assert_eq!(t.c.nodes[1].ep.drops().bad_crc, 0, "the CRC was fixed");
}

/// The CRC left to the device (the offload seam): protected
/// packets are sealed by `seal_transmit` with the trailer left zero, the
/// channel writes and checks the trailer, and they open as usual through
/// loss, reordering and duplication. A payload altered on the way with the
/// CRC fixed, which the device then calls good, is still caught by the tag.
#[test]
fn protected_transfers_work_with_the_crc_offloaded() {
    let mut t = transfer_setup(true, lossy(), 31);
    t.c.crc_offload = true;
    assert!(run_writes(
        &mut t,
        16,
        4096,
        Duration::from_secs(2),
        |_, _| {}
    ));
    let s = t.c.nodes[1].ep.protection_stats();
    assert!(s.opened > 0 && s.auth_failed == 0, "{s:?}");
    assert_eq!(t.c.nodes[1].ep.drops().bad_crc, 0);

    let mut t = transfer_setup(true, Impairments::default(), 32);
    t.c.crc_offload = true;
    let altered = Rc::new(RefCell::new(0u32));
    let count = altered.clone();
    t.c.tamper = Some(Box::new(move |from, bytes| {
        if from == 0 && bytes[1] == 0x01 {
            *count.borrow_mut() += 1;
            if *count.borrow() % 2 == 1 {
                bytes[80] ^= 0x40;
                fix_crc(bytes);
            }
        }
        false
    }));
    assert!(run_writes(
        &mut t,
        4,
        4096,
        Duration::from_secs(2),
        |_, _| {}
    ));
    let s = t.c.nodes[1].ep.protection_stats();
    assert!(s.auth_failed >= 2, "{s:?}");
    assert_eq!(t.c.nodes[1].ep.drops().bad_crc, 0);
}

/// Every packet of a first transfer replayed during a second one (other
/// bytes to the same addresses): all dropped as replays, the second
/// transfer's bytes stay.
#[test]
fn replayed_packets_are_dropped() {
    let mut t = transfer_setup(true, Impairments::default(), 25);
    let seen_a = sniff(&mut t.c, 0);
    assert!(run_writes(
        &mut t,
        8,
        4096,
        Duration::from_secs(1),
        |_, _| {}
    ));
    t.c.tamper = None;
    let recorded: Vec<Vec<u8>> = seen_a.borrow().clone();
    assert!(recorded.len() >= 32, "{}", recorded.len());
    // New source bytes for the second transfer.
    let bytes = t.c.nodes[0].mem.slice_mut(SRC, 8 * 4096);
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern(99, 0, i);
    }
    let before = t.c.nodes[1].ep.protection_stats();
    let mut next = 0usize;
    assert!(run_writes(
        &mut t,
        8,
        4096,
        Duration::from_secs(1),
        |c, _| {
            for _ in 0..4 {
                if next < recorded.len() {
                    inject(c, 0, 1, &recorded[next]);
                    next += 1;
                }
            }
        }
    ));
    while next < recorded.len() {
        inject(&mut t.c, 0, 1, &recorded[next]);
        next += 1;
    }
    let after = t.c.nodes[1].ep.protection_stats();
    let refused = (after.replayed + after.too_old) - (before.replayed + before.too_old);
    assert_eq!(refused, recorded.len() as u64, "{after:?}");
    assert_eq!(
        fnv(t.c.nodes[1].mem.slice(DST, 8 * 4096)),
        fnv(t.c.nodes[0].mem.slice(SRC, 8 * 4096)),
        "a replayed WRITE of the first transfer changed the bytes"
    );
}

// ----- Negotiation (spec 5.3.6) ----------------------------------------------

/// What happened to a connection attempt from node 0 to node 1.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Protected,
    Unprotected,
    Refused,
}

fn attempt(c: &mut Cluster) -> Outcome {
    let peer = c.addr(1);
    let h = match c.nodes[0].ep.connect(c.now, peer, 0) {
        Ok(h) => h,
        Err(CommandError::Protection(_)) => return Outcome::Refused,
        Err(e) => panic!("connect: {e:?}"),
    };
    let end = |c: &Cluster| {
        c.nodes[0].events.iter().any(
            |e| matches!(e, Event::Closed { conn, .. } | Event::Failed { conn, .. } if *conn == h),
        ) || (c.nodes[1]
            .events
            .iter()
            .any(|e| matches!(e, Event::Connected(_)))
            && c.nodes[0]
                .events
                .iter()
                .any(|e| matches!(e, Event::Connected(x) if *x == h)))
    };
    c.run_until(c.now + Duration::from_millis(100), end);
    match c.nodes[0].ep.state(h) {
        Some(ConnState::Established) => match c.nodes[0].ep.protection(h) {
            Some((CipherSuite::Aes256Gcm, KEY_ID)) => Outcome::Protected,
            Some((CipherSuite::None, 0)) => Outcome::Unprotected,
            p => panic!("established with {p:?}"),
        },
        Some(ConnState::Closed) => {
            let rejected = c.nodes[0].events.iter().any(|e| {
                matches!(e, Event::Closed { conn, reason: CloseReason::Rejected } if *conn == h)
            });
            assert!(rejected, "closed as REJECTED: {:?}", c.nodes[0].events);
            Outcome::Refused
        }
        s => panic!("state {s:?}, events {:?}", c.nodes[0].events),
    }
}

/// An acceptor refuses each copy of a CONNECT it refuses (every CONNECT
/// goes out twice, spec 4.2 step 2).
const CONNECT_COPIES: u64 = 2;

#[test]
fn policies_negotiate_as_specified() {
    use Outcome::*;
    use Policy::*;
    let cases = [
        (Off, Off, Unprotected),
        (Off, Allow, Unprotected),
        (Off, Require, Refused),
        (Allow, Off, Unprotected),
        (Allow, Allow, Protected),
        (Allow, Require, Protected),
        (Require, Off, Refused),
        (Require, Allow, Protected),
        (Require, Require, Protected),
    ];
    for (i, (pa, pb, want)) in cases.into_iter().enumerate() {
        let mut c = cluster(
            config(pa, KEY_ID),
            config(pb, KEY_ID),
            Impairments::default(),
            40 + i as u64,
        );
        assert_eq!(attempt(&mut c), want, "initiator {pa:?}, acceptor {pb:?}");
        let (sa, sb) = (
            c.nodes[0].ep.protection_stats(),
            c.nodes[1].ep.protection_stats(),
        );
        match (pa, pb) {
            (Require, Off) => assert_eq!(sa.refused_required, 1, "downgrade refused"),
            // Once per copy of the CONNECT (spec 4.2 step 2).
            (Off, Require) => assert_eq!(sb.refused_required, CONNECT_COPIES),
            _ => assert_eq!(sa.refused() + sb.refused(), 0),
        }
        if want == Protected {
            // The acceptor authenticated the initiator's confirmation.
            assert!(sa.sealed > 0 && sb.opened > 0, "{sa:?} {sb:?}");
        }
    }
}

#[test]
fn a_key_id_the_acceptor_lacks_is_refused() {
    for policy in [Policy::Allow, Policy::Require] {
        let mut c = cluster(
            config(policy, 8),
            config(Policy::Allow, KEY_ID),
            Impairments::default(),
            50,
        );
        c.nodes[0].ep.add_psk(8, &PSK).unwrap();
        assert_eq!(attempt(&mut c), Outcome::Refused);
        assert_eq!(
            c.nodes[1].ep.protection_stats().refused_unknown_key,
            CONNECT_COPIES
        );
        assert_eq!(c.nodes[1].ep.live_connections(), 0, "no state kept");
    }
}

#[test]
fn an_initiator_without_its_key_refuses_or_offers_none() {
    let mut c = cluster(
        config(Policy::Require, 9),
        config(Policy::Allow, KEY_ID),
        Impairments::default(),
        51,
    );
    let peer = c.addr(1);
    assert_eq!(
        c.nodes[0].ep.connect(c.now, peer, 0),
        Err(CommandError::Protection(Refusal::UnknownKeyId))
    );
    let mut c = cluster(
        config(Policy::Allow, 9),
        config(Policy::Allow, KEY_ID),
        Impairments::default(),
        52,
    );
    assert_eq!(attempt(&mut c), Outcome::Unprotected);
}

/// An on-path attacker rewrites the ACCEPT to NONE: an initiator that
/// requires protection refuses it (no downgrade); one that merely allows
/// it is downgraded, as spec 5.3.6 warns.
#[test]
fn a_downgraded_accept_is_refused_when_protection_is_required() {
    for (policy, want) in [
        (Policy::Require, Outcome::Refused),
        (Policy::Allow, Outcome::Unprotected),
    ] {
        let mut c = cluster(
            config(policy, KEY_ID),
            config(Policy::Allow, KEY_ID),
            Impairments::default(),
            53,
        );
        c.tamper = Some(Box::new(|from, bytes| {
            if from == 1 && bytes[1] == 0x21 {
                // Suite and Key ID of the ACCEPT.
                bytes[28 + 23] = 0;
                bytes[28 + 28..28 + 32].fill(0);
                fix_crc(bytes);
            }
            false
        }));
        let got = attempt(&mut c);
        if policy == Policy::Allow {
            // The acceptor keyed the connection and drops the initiator's
            // unprotected packets: the downgrade does not get data through
            // either; the initiator thinks it is connected unprotected.
            assert_eq!(got, want);
            assert!(c.nodes[1].ep.protection_stats().unprotected > 0);
        } else {
            assert_eq!(got, want);
            assert_eq!(c.nodes[0].ep.protection_stats().refused_required, 1);
        }
    }
}

/// A CONNECT changed on the way (a smaller window): both ends derive keys
/// from what they saw, which differ, so the initiator's first protected
/// packet fails authentication and the acceptor never establishes.
#[test]
fn a_tampered_connect_yields_keys_that_do_not_authenticate() {
    let mut c = cluster(
        config(Policy::Require, KEY_ID),
        config(Policy::Require, KEY_ID),
        Impairments::default(),
        54,
    );
    c.tamper = Some(Box::new(|from, bytes| {
        if from == 0 && bytes[1] == 0x20 {
            bytes[28 + 19] = 16;
            fix_crc(bytes);
        }
        false
    }));
    let peer = c.addr(1);
    c.nodes[0].ep.connect(c.now, peer, 0).unwrap();
    c.run_until(c.now + Duration::from_millis(20), |_| false);
    assert!(c.nodes[1].ep.protection_stats().auth_failed > 0);
    assert!(!c.nodes[1]
        .events
        .iter()
        .any(|e| matches!(e, Event::Connected(_))));
    assert_eq!(c.nodes[1].ep.protection_stats().opened, 0);
}

/// With every key slot taken the acceptor refuses further protected
/// connections (REJECTED, counted), and takes them again once one is free.
#[test]
fn a_full_key_pool_refuses_and_recovers() {
    let cfg = config(Policy::Require, KEY_ID);
    let mut c = cluster(cfg, cfg, Impairments::default(), 55);
    let layout = metaroce_core::Layout {
        key_slots: 1,
        ..metaroce_core::Layout::for_connections(8)
    };
    c.nodes[1].ep =
        metaroce_core::Endpoint::new(cfg, storage(&layout), metaroce_core::rng::seed_from_u64(55));
    c.nodes[1].ep.add_psk(KEY_ID, &PSK).unwrap();
    assert_eq!(attempt(&mut c), Outcome::Protected);
    assert_eq!(c.nodes[1].ep.key_slots(), (1, 1));
    assert_eq!(attempt(&mut c), Outcome::Refused);
    assert_eq!(
        c.nodes[1].ep.protection_stats().refused_no_key_slot,
        CONNECT_COPIES
    );
    // The first connection closes and the acceptor releases it.
    let h0 = c.nodes[0].ep.handles().next().unwrap();
    c.nodes[0].ep.close(c.now, h0).unwrap();
    c.run_until(c.now + Duration::from_millis(20), |_| false);
    let hb = c.nodes[1].ep.handles().next().unwrap();
    assert_eq!(c.nodes[1].ep.state(hb), Some(ConnState::Closed));
    c.nodes[1].ep.release(hb).unwrap();
    assert_eq!(c.nodes[1].ep.key_slots(), (0, 1));
    c.nodes[0].events.clear();
    c.nodes[1].events.clear();
    assert_eq!(attempt(&mut c), Outcome::Protected);
    let _ = Instant::ZERO;
}
