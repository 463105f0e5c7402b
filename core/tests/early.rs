//! 0-RTT with a job key (spec 4.2.4) on a virtual clock: the first flight
//! leaves with the CONNECT and is placed as soon as the acceptor accepts;
//! a replayed first flight places nothing; a proof the acceptor cannot
//! take (no 0-RTT there, a clock outside the window, another key) falls
//! back to the cookie round trip with every byte placed once; and
//! through a lossy, reordering, duplicating channel every byte arrives
//! once.

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, ConnHandle, Op, RxMeta, Status, WorkRequest};
use metaroce_core::crypto::{Policy, ProtectionConfig};
use metaroce_core::wire::{self, Body, Flags, MemoryTarget};
use metaroce_core::{Config, Instant};
use smoltcp::wire::{IpAddress, Ipv4Address};

const KEY_ID: u32 = 1;
const JOB_KEY: [u8; 32] = [0x4a; 32];
const SRC: u64 = ARENA_BASE;
const DST: u64 = ARENA_BASE;
const LEN: u32 = 64 * 1024;
/// 2026-12-02 in ns since the Unix epoch: both nodes' wall clock.
const WALL: u64 = 1_796_169_600_000_000_000;

fn config(node: u8) -> Config {
    Config {
        protection: ProtectionConfig {
            policy: Policy::Require,
            key_id: KEY_ID,
        },
        local_ip: Some(IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, node + 1))),
        ..Config::default()
    }
}

/// Two nodes holding the job key, their wall clocks `skew` apart, with
/// `acceptor` as node 1's configuration.
fn pair(acceptor: Config, imp: Impairments, seed: u64, skew: u64) -> Cluster {
    let layout = metaroce_core::Layout::for_connections(8);
    let mut c = Cluster::with_nodes(&[config(0), acceptor], layout, ARENA_LEN, imp, seed);
    let now = c.now;
    c.nodes[0].ep.set_wall_clock(now, WALL);
    c.nodes[1].ep.set_wall_clock(now, WALL + skew);
    for n in &mut c.nodes {
        n.ep.add_psk(KEY_ID, &JOB_KEY).unwrap();
    }
    c
}

struct Job {
    a: ConnHandle,
    dst_key: u32,
    src_key: u32,
}

/// Node 0 connects and posts a WRITE of `LEN` bytes at once, before any
/// answer.
fn connect_and_write(c: &mut Cluster, seed: u64) -> Job {
    let src_key = c.register(0, SRC, u64::from(LEN), Access::LOCAL_WRITE);
    let dst_key = c.register(1, DST, u64::from(LEN), Access::REMOTE_WRITE);
    for (i, b) in c.nodes[0]
        .mem
        .slice_mut(SRC, LEN as usize)
        .iter_mut()
        .enumerate()
    {
        *b = pattern(seed, 0, i);
    }
    let peer = c.addr(1);
    let a = c.nodes[0].ep.connect(c.now, peer, 0).expect("connect");
    let wr = WorkRequest {
        id: 1,
        op: Op::Write {
            remote: MemoryTarget {
                key: dst_key,
                addr: DST,
            },
        },
        local: c.local(src_key, SRC, LEN),
    };
    c.nodes[0].ep.post_send(a, wr).expect("post");
    Job {
        a,
        dst_key,
        src_key,
    }
}

/// Runs until the WRITE completes; asserts it succeeded with every byte
/// in place and nothing written elsewhere.
fn finish(c: &mut Cluster, seed: u64) {
    let done = c.run_until(c.now + Duration::from_millis(500), |c| {
        !c.nodes[0].completions.is_empty()
    });
    assert!(done, "the WRITE never completed");
    assert_eq!(c.nodes[0].completions[0].status, Status::Success);
    let got = c.nodes[1].mem.slice(DST, LEN as usize);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(seed, 0, i)),
        "bytes differ"
    );
    assert!(c.nodes[1].mem.bytes[LEN as usize..]
        .iter()
        .all(|&b| b == SENTINEL));
}

fn flags(bytes: &[u8]) -> (Flags, Body) {
    let (repr, _) = wire::parse(bytes).expect("parses");
    (repr.header.flags, repr.body)
}

#[test]
fn the_first_flight_leaves_with_the_connect_and_is_placed_at_once() {
    let imp = Impairments {
        delay: Duration::from_micros(20),
        ..Impairments::default()
    };
    let mut c = pair(config(1), imp, 1, 0);
    c.log = Some(Vec::new());
    let job = connect_and_write(&mut c, 1);
    // Before anything comes back, node 0 sends its CONNECT (EARLY, twice)
    // and its whole first flight, protected, with EARLY.
    while c.log.as_ref().unwrap().iter().all(|(n, _, _)| *n == 0) {
        assert!(c.step());
    }
    let log = c.log.clone().unwrap();
    let sent: Vec<_> = log.iter().filter(|(n, _, _)| *n == 0).collect();
    let (f, b) = flags(&sent[0].2);
    assert!(matches!(b, Body::Connect(_)) && f.contains(Flags::EARLY));
    let early_data = sent
        .iter()
        .filter(|(_, _, p)| {
            let (f, b) = flags(p);
            matches!(b, Body::Write(_)) && f.contains(Flags::EARLY.with(Flags::PROTECTED))
        })
        .count();
    // The start-up window (16 KiB: four packets) before any grant, so
    // that 63 senders starting together fit one switch port's buffer
    // (spec 4.2.4, 4.10.6).
    assert_eq!(early_data, 4, "the start-up window in the first flight");
    finish(&mut c, 1);
    let d = c.nodes[1].ep.drops();
    assert_eq!(d.early_taken, 1);
    assert_eq!(d.retries_sent, 0, "no cookie round trip");
    assert_eq!(c.nodes[1].ep.protection_stats().auth_failed, 0);
    let _ = job.src_key;
}

#[test]
fn the_write_completes_within_a_round_trip_of_the_wire_time() {
    // 1 us each way, 10 Gbit/s: a 64 KiB WRITE from a cold start costs
    // its serialisation and about one round trip, not three.
    let imp = Impairments {
        delay: Duration::from_micros(1),
        link_ns_per_byte: 0.8,
        ..Impairments::default()
    };
    let mut early = pair(config(1), imp.clone(), 2, 0);
    let start = early.now;
    connect_and_write(&mut early, 2);
    finish(&mut early, 2);
    let with = early.now - start;
    let mut plain = pair(
        Config {
            early_data: false,
            ..config(1)
        },
        imp,
        2,
        0,
    );
    let start = plain.now;
    connect_and_write(&mut plain, 2);
    finish(&mut plain, 2);
    let without = plain.now - start;
    assert!(
        with + Duration::from_micros(3) < without,
        "0-RTT {with:?} against {without:?}"
    );
}

#[test]
fn a_replayed_first_flight_places_nothing() {
    let mut c = pair(config(1), Impairments::default(), 3, 0);
    c.log = Some(Vec::new());
    let job = connect_and_write(&mut c, 3);
    finish(&mut c, 3);
    let flight: Vec<_> = c
        .log
        .take()
        .unwrap()
        .into_iter()
        .filter(|(n, _, p)| *n == 0 && flags(p).0.contains(Flags::EARLY))
        .collect();
    assert!(flight.len() > 2);
    // Close and release both ends; the memory is wiped; an attacker
    // replays the whole first flight within the early window.
    c.nodes[0].ep.close(c.now, job.a).unwrap();
    c.run_until(c.now + Duration::from_millis(50), |_| false);
    for n in &mut c.nodes {
        let handles: Vec<_> = n.ep.handles().collect();
        for h in handles {
            n.ep.release(h).expect("closed");
        }
    }
    c.run_until(c.now + Duration::from_millis(1), |_| false);
    c.nodes[1].mem.slice_mut(DST, LEN as usize).fill(SENTINEL);
    let before = c.nodes[1].ep.drops();
    let now = c.now;
    for (_, port, bytes) in &flight {
        let meta = RxMeta {
            source: metaroce_core::api::PeerAddr {
                ip: IpAddress::Ipv4(c.nodes[0].ip),
                port: *port,
            },
            ce: false,
        };
        let node = &mut c.nodes[1];
        node.ep.handle_packet(now, &meta, bytes, &mut node.mem);
    }
    c.run_until(c.now + Duration::from_millis(5), |_| false);
    let d = c.nodes[1].ep.drops();
    assert!(d.early_replayed > before.early_replayed, "{d:?}");
    assert_eq!(d.early_taken, before.early_taken, "no second connection");
    assert!(d.early_unmatched > before.early_unmatched);
    assert!(
        c.nodes[1]
            .mem
            .slice(DST, LEN as usize)
            .iter()
            .all(|&b| b == SENTINEL),
        "a replayed first flight placed data"
    );
    let _ = job.dst_key;
}

#[test]
fn a_proof_the_acceptor_cannot_take_falls_back_to_the_cookie() {
    // No 0-RTT at the acceptor; its clock 2 s off; another job key under
    // the same id at the acceptor is refused altogether (no keys agree).
    for (name, acceptor, skew) in [
        (
            "no 0-RTT",
            Config {
                early_data: false,
                ..config(1)
            },
            0,
        ),
        ("stale", config(1), 2_000_000_000),
        // Within the window, but made before the acceptor's wall clock
        // was set (a restart: its filter remembers nothing older).
        ("before the filter", config(1), 500_000_000),
        (
            "no own address",
            Config {
                local_ip: None,
                ..config(1)
            },
            0,
        ),
    ] {
        let mut c = pair(acceptor, Impairments::default(), 4, skew);
        connect_and_write(&mut c, 4);
        finish(&mut c, 4);
        let d = c.nodes[1].ep.drops();
        assert_eq!(d.early_taken, 0, "{name}");
        assert!(d.retries_sent >= 1, "{name}: {d:?}");
        assert!(d.early_invalid + d.early_stale >= 1, "{name}: {d:?}");
        assert_eq!(
            c.nodes[1].ep.protection_stats().auth_failed,
            0,
            "{name}: the plain handshake's keys"
        );
    }
}

#[test]
fn a_proof_under_another_key_is_refused() {
    let mut c = pair(config(1), Impairments::default(), 5, 0);
    c.nodes[1].ep.add_psk(KEY_ID, &[0x11; 32]).unwrap();
    connect_and_write(&mut c, 5);
    c.run_until(c.now + Duration::from_millis(5), |_| false);
    let d = c.nodes[1].ep.drops();
    assert_eq!(d.early_taken, 0);
    assert!(d.early_invalid >= 1);
    assert!(c.nodes[1]
        .mem
        .slice(DST, LEN as usize)
        .iter()
        .all(|&b| b == SENTINEL));
}

#[test]
fn every_byte_arrives_once_through_a_lossy_reordering_duplicating_channel() {
    for seed in 10..40 {
        let imp = Impairments {
            loss: 0.1,
            duplicate: 0.05,
            reorder: 0.2,
            reorder_extra: Duration::from_micros(20),
            delay: Duration::from_micros(2),
            ..Impairments::default()
        };
        let mut c = pair(config(1), imp, seed, 0);
        connect_and_write(&mut c, seed);
        finish(&mut c, seed);
        assert_eq!(c.nodes[0].completions.len(), 1, "seed {seed}");
    }
    let _ = Instant::ZERO;
}
