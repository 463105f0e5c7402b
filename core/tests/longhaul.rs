//! Windows beyond one SACK bitvector (spec 4.3 - 4.5, 4.10.6):
//! thousands of packets in flight over a 10 ms round trip, under loss,
//! reordering and duplication; every loss learnt within about a round
//! trip; the start-up ramp at a long round trip; a peer offering 256
//! negotiated down; an empty out-of-order pool refusing and recovering.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, ConnHandle, Op, Status, WorkRequest};
use metaroce_core::config::CcAlgorithm;
use metaroce_core::wire::{self, Body, Flags, MemoryTarget};
use metaroce_core::{Config, Layout};

const SRC: u64 = ARENA_BASE;
const DST: u64 = ARENA_BASE;
/// Bytes moved by the transfers here.
const TRANSFER: u64 = 8 << 20;
const ARENA: usize = 9 << 20;
const MTU: u16 = 1024;
/// One-way delay: a 10 ms round trip.
const ONE_WAY: Duration = Duration::from_millis(5);

/// A long-haul configuration: 1 Gbit/s, 1 KiB packets, the given window,
/// timers scaled to a 10 ms round trip (as `sim`'s `Tuning::metaroce`).
fn long_haul_config(window: u32) -> Config {
    let rtt = 2 * ONE_WAY;
    Config {
        mtu: MTU,
        window,
        link_rate_mbps: 1_000,
        cc_additive_increase_mbps: 20,
        cc_min_rate_mbps: 10,
        rto_initial: 3 * rtt,
        rto_min: rtt * 5 / 4,
        rto_max: 10 * rtt,
        handshake_timeout: 2 * rtt,
        keepalive_interval: 5 * rtt,
        idle_timeout: 50 * rtt,
        active_sender_window: 2 * rtt,
        sender_linger: 2 * rtt,
        ..Config::default()
    }
}

/// A 1 Gbit/s bottleneck towards each node (8 ns per byte) behind the
/// 5 ms one-way delay.
fn long_haul_link() -> Impairments {
    Impairments {
        delay: ONE_WAY,
        link_ns_per_byte: 8.0,
        ..Impairments::default()
    }
}

struct Transfer {
    c: Cluster,
    a: ConnHandle,
    b: ConnHandle,
    src: u32,
    dst: u32,
}

fn transfer_setup(configs: [Config; 2], layout: Layout, imp: Impairments, seed: u64) -> Transfer {
    let mut c = Cluster::with_nodes(&configs, layout, ARENA, imp, seed);
    let src = c.register(0, SRC, TRANSFER, Access::LOCAL_WRITE);
    let dst = c.register(1, DST, TRANSFER, Access::REMOTE_WRITE);
    for (i, b) in c.nodes[0]
        .mem
        .slice_mut(SRC, TRANSFER as usize)
        .iter_mut()
        .enumerate()
    {
        *b = pattern(seed, 7, i);
    }
    let (a, b) = c.connect(0, 1);
    Transfer { c, a, b, src, dst }
}

/// Posts the whole transfer as WRITEs of `msg` bytes, keeping the send
/// queue full, and runs until every one completed; checks every byte.
fn run_transfer(t: &mut Transfer, msg: u64, limit: Duration) -> Duration {
    let start = t.c.now;
    let deadline = start + limit;
    let count = TRANSFER / msg;
    let mut posted = 0u64;
    loop {
        while posted < count {
            let off = posted * msg;
            let wr = WorkRequest {
                id: posted,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: t.dst,
                        addr: DST + off,
                    },
                },
                local: t.c.local(t.src, SRC + off, msg as u32),
            };
            if t.c.nodes[0].ep.post_send(t.a, wr).is_err() {
                break;
            }
            posted += 1;
        }
        let done = t.c.nodes[0].completions.len() as u64 == count;
        if done || t.c.now > deadline || !t.c.step() {
            break;
        }
    }
    let took = t.c.now - start;
    assert_eq!(
        t.c.nodes[0].completions.len() as u64,
        count,
        "all WRITEs complete within {limit:?}"
    );
    assert!(t.c.nodes[0]
        .completions
        .iter()
        .all(|c| c.status == Status::Success));
    assert!(
        t.c.nodes[1].mem.slice(DST, TRANSFER as usize)
            == t.c.nodes[0].mem.slice(SRC, TRANSFER as usize),
        "every byte landed where it belongs"
    );
    took
}

/// Runs on until both ends went idle and gave their pooled state back.
fn settle(t: &mut Transfer) {
    let until = t.c.now + Duration::from_millis(200);
    t.c.run_until(until, |_| false);
    for n in &t.c.nodes {
        let u = n.ep.pool_usage();
        assert_eq!(u.inflight_records.0, 0, "in-flight records back");
        assert_eq!(u.reorder_words.0, 0, "out-of-order bitmaps back");
    }
}

fn big_layout() -> Layout {
    Layout {
        inflight_records: 1 << 16,
        reorder_words: 4096,
        ..Layout::for_connections(4)
    }
}

#[test]
fn thousands_in_flight_over_a_long_round_trip_with_loss_reordering_and_duplication() {
    let imp = Impairments {
        loss: 0.005,
        duplicate: 0.005,
        reorder: 0.05,
        reorder_extra: Duration::from_micros(300),
        ..long_haul_link()
    };
    let cfg = long_haul_config(8192);
    let mut t = transfer_setup([cfg, cfg], big_layout(), imp, 3);
    assert_eq!(
        t.c.nodes[0].ep.connection(t.a).map(|c| c.params().window),
        Some(8192),
        "both offered 8192"
    );
    let took = run_transfer(&mut t, 256 << 10, Duration::from_secs(5));
    let s = t.c.nodes[0].ep.stats(t.a).expect("stats");
    eprintln!(
        "8 MiB in {took:?}: max in flight {}, lost {}, retransmitted {}, spurious {}, rerolls {}, dup rx {}",
        s.max_in_flight, s.packets_lost, s.retransmissions, s.spurious_retransmissions,
        s.path_rerolls, t.c.nodes[1].ep.stats(t.b).unwrap().duplicates_received
    );
    // 8 MiB at 1 Gbit/s is 67 ms of line time; 10 ms round trips.
    assert!(took < Duration::from_millis(250), "took {took:?}: {s:?}");
    assert!(
        s.max_in_flight > 1000,
        "a 10 ms x 1 Gbit/s path holds 1,220 KiB packets: {}",
        s.max_in_flight
    );
    assert!(s.packets_lost > 0 && s.retransmissions > 0);
    // Selective repeat: only what was lost is resent (RACK may misjudge a
    // few reordered packets, never a window's worth).
    assert!(
        s.retransmissions < 2 * s.packets_lost + 16,
        "retransmitted {} for {} lost",
        s.retransmissions,
        s.packets_lost
    );
    assert_eq!(s.timeouts, 0, "RACK, not the timer, found the losses");
    settle(&mut t);
}

/// Per dropped PSN: the send timestamp of the dropped transmission and,
/// once it left, of the resend.
type Resends = BTreeMap<u32, (u32, Option<u32>)>;

#[test]
fn every_loss_is_learnt_within_about_a_round_trip() {
    // Drop 1 in 200 first transmissions of node 0's data, by PSN; note the
    // send timestamps of the dropped transmission and of its resend.
    let dropped: Rc<RefCell<Resends>> = Rc::default();
    let cfg = long_haul_config(8192);
    let mut t = transfer_setup([cfg, cfg], big_layout(), long_haul_link(), 5);
    let seen = dropped.clone();
    t.c.tamper = Some(Box::new(move |from, bytes| {
        let Ok((repr, _)) = wire::packet::parse(bytes) else {
            return false;
        };
        if from != 0 || !matches!(repr.body, Body::Write(_)) {
            return false;
        }
        let h = repr.header;
        let mut d = seen.borrow_mut();
        if h.flags.contains(Flags::RETRANSMISSION) {
            if let Some((_, resent)) = d.get_mut(&h.psn) {
                resent.get_or_insert(h.timestamp);
            }
            return false;
        }
        if h.psn % 200 == 17 && !d.contains_key(&h.psn) {
            d.insert(h.psn, (h.timestamp, None));
            return true;
        }
        false
    }));
    run_transfer(&mut t, 256 << 10, Duration::from_secs(5));
    let s = t.c.nodes[0].ep.stats(t.a).expect("stats");
    assert_eq!(s.timeouts, 0, "no loss waited for the timer");
    let d = dropped.borrow();
    assert!(d.len() >= 30, "{} drops", d.len());
    let rtt = (2 * ONE_WAY).as_nanos() as u32;
    let mut worst = 0;
    for (psn, &(sent, resent)) in d.iter() {
        let resent = resent.unwrap_or_else(|| panic!("PSN {psn} never resent"));
        worst = worst.max(resent.wrapping_sub(sent));
    }
    eprintln!(
        "{} drops, slowest resent after {} ms",
        d.len(),
        f64::from(worst) / 1e6
    );
    // RACK: a round trip for the later packets' SACKs, a quarter of one
    // (plus the variation) of reordering allowance, queueing at 1 Gbit/s.
    assert!(
        worst < 2 * rtt,
        "a loss took {} ms to be resent",
        f64::from(worst) / 1e6
    );
}

#[test]
fn a_peer_offering_256_is_negotiated_down_and_never_sees_a_sack_offset() {
    let offsets = Rc::new(RefCell::new((0u64, 0u64)));
    let seen = offsets.clone();
    let imp = Impairments {
        loss: 0.01,
        reorder: 0.1,
        reorder_extra: Duration::from_micros(500),
        ..long_haul_link()
    };
    // The initiator offers 65,536, the acceptor 256 (an older peer).
    let mut t = transfer_setup(
        [long_haul_config(65_536), long_haul_config(256)],
        big_layout(),
        imp,
        7,
    );
    t.c.tamper = Some(Box::new(move |_, bytes| {
        if let Ok((repr, _)) = wire::packet::parse(bytes) {
            if let Body::Ack(a) = repr.body {
                let mut s = seen.borrow_mut();
                s.0 += 1;
                s.1 += u64::from(a.sack_offset != 0);
            }
        }
        false
    }));
    assert_eq!(
        t.c.nodes[0].ep.connection(t.a).map(|c| c.params().window),
        Some(256)
    );
    run_transfer(&mut t, 256 << 10, Duration::from_secs(20));
    let s = t.c.nodes[0].ep.stats(t.a).expect("stats");
    assert_eq!(s.max_in_flight, 256, "window-bound at 256 PSNs");
    let (acks, with_offset) = *offsets.borrow();
    eprintln!("{acks} ACKs, {with_offset} with an offset");
    assert!(acks > 1000);
    assert_eq!(with_offset, 0, "a 256-PSN window never needs a SACK Offset");
    settle(&mut t);
}

#[test]
fn an_empty_out_of_order_pool_drops_counts_and_recovers() {
    // One 1,024-PSN bitmap for the whole endpoint: packets arriving
    // further than that beyond a gap cannot be recorded.
    let layout = Layout {
        reorder_words: 16,
        ..big_layout()
    };
    let imp = Impairments {
        loss: 0.003,
        ..long_haul_link()
    };
    let cfg = long_haul_config(8192);
    let mut t = transfer_setup([cfg, cfg], layout, imp, 11);
    run_transfer(&mut t, 256 << 10, Duration::from_secs(20));
    let refused = t.c.nodes[1].ep.pool_refusals().reorder_words;
    let rx = t.c.nodes[1].ep.stats(t.b).expect("stats").reorder_refused;
    eprintln!("refused {refused}");
    assert!(
        refused > 0,
        "some packets beyond 1,024 of a gap were refused"
    );
    assert_eq!(rx, refused, "counted on the connection too");
    settle(&mut t);
}

#[test]
fn the_start_up_reaches_line_rate_within_a_few_round_trips_at_10_ms() {
    let cfg = Config {
        cc: CcAlgorithm::EcnAimd,
        ..long_haul_config(8192)
    };
    let mut t = transfer_setup([cfg, cfg], big_layout(), long_haul_link(), 13);
    // Acknowledged bytes sampled every round trip.
    let rtt = 2 * ONE_WAY;
    let start = t.c.now;
    let count = TRANSFER / (256 << 10);
    let mut posted = 0;
    let mut samples = Vec::new();
    let mut next_sample = start;
    loop {
        while posted < count {
            let off = posted * (256 << 10);
            let wr = WorkRequest {
                id: posted,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: t.dst,
                        addr: DST + off,
                    },
                },
                local: t.c.local(t.src, SRC + off, 256 << 10),
            };
            if t.c.nodes[0].ep.post_send(t.a, wr).is_err() {
                break;
            }
            posted += 1;
        }
        if t.c.now >= next_sample {
            let s = t.c.nodes[0].ep.stats(t.a).expect("stats");
            samples.push(s.packets_acked);
            next_sample += rtt;
        }
        if t.c.nodes[0].completions.len() as u64 == count
            || t.c.now > start + Duration::from_secs(5)
            || !t.c.step()
        {
            break;
        }
    }
    // 1 Gbit/s x 10 ms = 1,220 packets of 1 KiB (1,114 B of line each:
    // 1,122 at most per round trip through the 8 ns/B bottleneck).
    let per_rtt: Vec<u64> = samples.windows(2).map(|w| w[1] - w[0]).collect();
    let line = rtt.as_nanos() as u64 / (8 * (u64::from(MTU) + 90));
    let fourth = per_rtt.get(3).copied().unwrap_or(0);
    eprintln!("packets per round trip {per_rtt:?}, line {line}");
    assert!(
        fourth * 10 >= line * 9,
        "round trip 4 delivered {fourth} of {line} packets: {per_rtt:?}"
    );
}
