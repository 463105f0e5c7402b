//! Engine tests on a virtual clock: placement, reliability under loss,
//! reordering and duplication, multipath, congestion control, bad input.

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{
    Access, Completion, ConnHandle, Op, Opcode, RecvRequest, Status, WorkRequest,
};
use metaroce_core::wire::{self, MemoryTarget};
use metaroce_core::{Config, ConnState, Event, Instant};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, RngSeed};

const SRC: u64 = ARENA_BASE; // requester's source buffers
const SINK: u64 = ARENA_BASE + (1 << 20); // requester's READ sinks
const DST: u64 = ARENA_BASE; // responder's WRITE targets
const RECV: u64 = ARENA_BASE + (1 << 20); // responder's receive buffers
const RSRC: u64 = ARENA_BASE + (2 << 20); // responder's READ sources
const SPAN: u64 = 1 << 20;
/// Receive buffers: 32 of them fit in the 1 MiB receive region.
const RECV_STRIDE: u64 = 32 << 10;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Write,
    WriteImm,
    Send,
    SendImm,
    Read,
}

struct Setup {
    c: Cluster,
    a: ConnHandle,
    b: ConnHandle,
    a_src: u32,
    a_sink: u32,
    b_dst: u32,
    b_recv: u32,
    b_rsrc: u32,
}

fn setup(config: Config, imp: Impairments, seed: u64) -> Setup {
    let mut c = Cluster::new(2, config, imp, seed);
    let a_src = c.register(0, SRC, SPAN, Access::LOCAL_WRITE);
    let a_sink = c.register(0, SINK, SPAN, Access::LOCAL_WRITE);
    let b_dst = c.register(1, DST, SPAN, Access::REMOTE_WRITE);
    let b_recv = c.register(1, RECV, SPAN, Access::LOCAL_WRITE);
    let b_rsrc = c.register(1, RSRC, SPAN, Access::REMOTE_READ);
    for i in 0..SPAN as usize {
        c.nodes[0].mem.slice_mut(SRC, SPAN as usize)[i] = pattern(seed, 0, i);
        c.nodes[1].mem.slice_mut(RSRC, SPAN as usize)[i] = pattern(seed, 1, i);
    }
    let (a, b) = c.connect(0, 1);
    Setup {
        c,
        a,
        b,
        a_src,
        a_sink,
        b_dst,
        b_recv,
        b_rsrc,
    }
}

/// One message of a workload: kind, length, and where it lands.
#[derive(Clone, Copy, Debug)]
struct Msg {
    kind: Kind,
    len: u32,
    offset: u64,
}

/// Posts `msgs` (at most the queue depth outstanding), runs to completion,
/// and checks every byte and every completion. Returns the virtual time taken.
fn run_workload(s: &mut Setup, msgs: &[Msg], seed: u64, limit: Duration) -> Duration {
    let start = s.c.now;
    let mut next = 0usize;
    let mut recv_posted = 0u64;
    let expected_recvs = msgs
        .iter()
        .filter(|m| matches!(m.kind, Kind::Send | Kind::SendImm | Kind::WriteImm))
        .count() as u64;
    let deadline = s.c.now + limit;
    loop {
        // Keep the queues fed.
        while recv_posted < expected_recvs {
            let r = RecvRequest {
                id: 1000 + recv_posted,
                local: s.c.local(
                    s.b_recv,
                    RECV + recv_posted * RECV_STRIDE,
                    RECV_STRIDE as u32,
                ),
            };
            if s.c.nodes[1].ep.post_recv(s.b, r).is_err() {
                break;
            }
            recv_posted += 1;
        }
        while next < msgs.len() {
            let m = msgs[next];
            let local = match m.kind {
                Kind::Read => s.c.local(s.a_sink, SINK + m.offset, m.len),
                _ => s.c.local(s.a_src, SRC + m.offset, m.len),
            };
            let op = match m.kind {
                Kind::Write => Op::Write {
                    remote: MemoryTarget {
                        key: s.b_dst,
                        addr: DST + m.offset,
                    },
                },
                Kind::WriteImm => Op::WriteImm {
                    remote: MemoryTarget {
                        key: s.b_dst,
                        addr: DST + m.offset,
                    },
                    imm: next as u32,
                },
                Kind::Send => Op::Send,
                Kind::SendImm => Op::SendImm { imm: next as u32 },
                Kind::Read => Op::Read {
                    remote: MemoryTarget {
                        key: s.b_rsrc,
                        addr: RSRC + m.offset,
                    },
                },
            };
            let wr = WorkRequest {
                id: next as u64,
                op,
                local,
            };
            if s.c.nodes[0].ep.post_send(s.a, wr).is_err() {
                break;
            }
            next += 1;
        }
        let done = next == msgs.len()
            && s.c.nodes[0].completions.len() == msgs.len()
            && s.c.nodes[1].completions.len() as u64 == expected_recvs;
        if done {
            break;
        }
        assert!(
            s.c.now < deadline,
            "workload stuck at {:?}: posted {next}/{}, completions a={} b={}, stats a={:?} b={:?}",
            s.c.now,
            msgs.len(),
            s.c.nodes[0].completions.len(),
            s.c.nodes[1].completions.len(),
            s.c.nodes[0].ep.stats(s.a),
            s.c.nodes[1].ep.stats(s.b),
        );
        assert!(
            s.c.step(),
            "nothing left to do: states {:?} {:?}, events {:?} {:?}, completions {:?}, stats a={:?} b={:?}",
            s.c.nodes[0].ep.state(s.a),
            s.c.nodes[1].ep.state(s.b),
            s.c.nodes[0].events,
            s.c.nodes[1].events,
            s.c.nodes[0].completions.iter().filter(|c| c.status != Status::Success).collect::<Vec<_>>(),
            s.c.nodes[0].ep.stats(s.a),
            s.c.nodes[1].ep.stats(s.b),
        );
    }
    check_workload(s, msgs, seed);
    s.c.now - start
}

fn check_workload(s: &Setup, msgs: &[Msg], seed: u64) {
    // Sender completions: exactly once each, in order, successful.
    let a = &s.c.nodes[0].completions;
    assert!(
        a.iter().all(|c| c.status == Status::Success),
        "failed: events {:?} {:?}, stats a={:?} b={:?}",
        s.c.nodes[0].events,
        s.c.nodes[1].events,
        s.c.nodes[0].ep.stats(s.a),
        s.c.nodes[1].ep.stats(s.b)
    );
    assert_eq!(a.len(), msgs.len());
    for (i, c) in a.iter().enumerate() {
        assert_eq!(c.wr_id, i as u64, "send completions in post order");
        assert_eq!(c.status, Status::Success, "{c:?}");
        assert_eq!(c.byte_len, msgs[i].len);
    }
    // Receive completions: in posting order, matching the messages.
    let recv_msgs: Vec<(usize, &Msg)> = msgs
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m.kind, Kind::Send | Kind::SendImm | Kind::WriteImm))
        .collect();
    let b = &s.c.nodes[1].completions;
    assert_eq!(b.len(), recv_msgs.len());
    for (k, (c, (i, m))) in b.iter().zip(recv_msgs.iter()).enumerate() {
        assert_eq!(c.wr_id, 1000 + k as u64);
        assert_eq!(c.status, Status::Success);
        match m.kind {
            Kind::WriteImm => {
                assert_eq!(c.opcode, Opcode::RecvWriteImm);
                assert_eq!(c.imm, Some(*i as u32));
            }
            Kind::SendImm => {
                assert_eq!(c.opcode, Opcode::Recv);
                assert_eq!(c.imm, Some(*i as u32));
                assert_eq!(c.byte_len, m.len);
            }
            _ => {
                assert_eq!(c.opcode, Opcode::Recv);
                assert_eq!(c.byte_len, m.len);
            }
        }
    }
    // Bytes: each destination holds exactly the source pattern.
    let mut recv_k = 0u64;
    for m in msgs {
        let len = m.len as usize;
        match m.kind {
            Kind::Write | Kind::WriteImm => {
                let got = s.c.nodes[1].mem.slice(DST + m.offset, len);
                let want = s.c.nodes[0].mem.slice(SRC + m.offset, len);
                assert_eq!(fnv(got), fnv(want), "WRITE at {:#x}", m.offset);
            }
            Kind::Send | Kind::SendImm => {}
            Kind::Read => {
                let got = s.c.nodes[0].mem.slice(SINK + m.offset, len);
                let want = s.c.nodes[1].mem.slice(RSRC + m.offset, len);
                assert_eq!(fnv(got), fnv(want), "READ at {:#x}", m.offset);
            }
        }
        if matches!(m.kind, Kind::Send | Kind::SendImm | Kind::WriteImm) {
            if !matches!(m.kind, Kind::WriteImm) {
                let got = s.c.nodes[1].mem.slice(RECV + recv_k * RECV_STRIDE, len);
                let want = s.c.nodes[0].mem.slice(SRC + m.offset, len);
                assert_eq!(fnv(got), fnv(want), "SEND {recv_k}");
            }
            recv_k += 1;
        }
    }
    let _ = seed;
}

/// Every byte of the responder's WRITE area outside the messages' targets
/// still holds the sentinel.
fn check_sentinels(s: &Setup, msgs: &[Msg]) {
    let mut covered = vec![false; SPAN as usize];
    for m in msgs {
        if matches!(m.kind, Kind::Write | Kind::WriteImm) {
            for b in &mut covered[m.offset as usize..m.offset as usize + m.len as usize] {
                *b = true;
            }
        }
    }
    let area = s.c.nodes[1].mem.slice(DST, SPAN as usize);
    for (i, (&byte, &cov)) in area.iter().zip(covered.iter()).enumerate() {
        if !cov {
            assert_eq!(
                byte, SENTINEL,
                "byte {i:#x} outside every target was written"
            );
        }
    }
    // Nothing beyond the regions either.
    let tail = &s.c.nodes[1].mem.bytes[(3 * SPAN) as usize..];
    assert!(tail.iter().all(|&b| b == SENTINEL));
}

fn layout(kinds_lens: &[(Kind, u32)]) -> Vec<Msg> {
    let mut off = 0u64;
    kinds_lens
        .iter()
        .map(|&(kind, len)| {
            let m = Msg {
                kind,
                len,
                offset: off,
            };
            off += u64::from(len).div_ceil(64) * 64 + 64;
            m
        })
        .collect()
}

fn small_mtu() -> Config {
    Config {
        mtu: 1024,
        ..Config::default()
    }
}

fn close_both(s: &mut Setup) {
    s.c.nodes[0].ep.close(s.c.now, s.a).unwrap();
    let s_a = s.a;
    let deadline = s.c.now + Duration::from_millis(500);
    let ok = s.c.run_until(deadline, |c| {
        c.nodes[0].ep.state(s_a) == Some(ConnState::Closed)
            && c.nodes[1]
                .ep
                .handles()
                .all(|h| c.nodes[1].ep.state(h) == Some(ConnState::Closed))
    });
    assert!(
        ok,
        "connections did not close: {:?} {:?}",
        s.c.nodes[0].ep.state(s.a),
        s.c.nodes[1].ep.state(s.b)
    );
}

#[test]
fn write_lands_and_completes() {
    let mut s = setup(small_mtu(), Impairments::default(), 1);
    let msgs = layout(&[(Kind::Write, 10_000), (Kind::Write, 0), (Kind::Write, 1)]);
    run_workload(&mut s, &msgs, 1, Duration::from_millis(50));
    check_sentinels(&s, &msgs);
    close_both(&mut s);
}

#[test]
fn every_operation_without_loss() {
    let mut s = setup(small_mtu(), Impairments::default(), 2);
    let msgs = layout(&[
        (Kind::Write, 5000),
        (Kind::WriteImm, 3000),
        (Kind::Send, 4096),
        (Kind::SendImm, 7),
        (Kind::Read, 9000),
        (Kind::WriteImm, 0),
        (Kind::Read, 1),
    ]);
    run_workload(&mut s, &msgs, 2, Duration::from_millis(50));
    check_sentinels(&s, &msgs);
    close_both(&mut s);
}

#[test]
fn read_and_send_recv_across_20_percent_loss() {
    let imp = Impairments {
        loss: 0.2,
        reorder: 0.2,
        duplicate: 0.02,
        ..Impairments::default()
    };
    let mut s = setup(small_mtu(), imp, 3);
    let msgs = layout(&[
        (Kind::Read, 60_000),
        (Kind::Send, 30_000),
        (Kind::SendImm, 20_000),
        (Kind::Read, 3),
    ]);
    run_workload(&mut s, &msgs, 3, Duration::from_secs(2));
    let st = s.c.nodes[0].ep.stats(s.a).unwrap();
    assert!(st.retransmissions > 0 || s.c.nodes[1].ep.stats(s.b).unwrap().retransmissions > 0);
    close_both(&mut s);
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Write),
        Just(Kind::WriteImm),
        Just(Kind::Send),
        Just(Kind::SendImm),
        Just(Kind::Read),
    ]
}

fn pt_config(cases: u32) -> PtConfig {
    PtConfig {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x6d65_7461),
        failure_persistence: None,
        ..PtConfig::default()
    }
}

/// Cases run by `random_loss_reorder_duplication_deliver_exactly_once`.
const PROPERTY_CASES: u32 = 256;

proptest! {
    #![proptest_config(pt_config(PROPERTY_CASES))]

    /// The core property: whatever the loss (0-20 %), reordering,
    /// duplication and op mix, every message's bytes land exactly at their
    /// addresses, each completion arrives exactly once with the right
    /// status, nothing outside the targets is written, and the connection
    /// closes clean.
    #[test]
    fn random_loss_reorder_duplication_deliver_exactly_once(
        seed in any::<u64>(),
        loss in 0.0f64..0.2,
        reorder in 0.0f64..0.5,
        duplicate in 0.0f64..0.1,
        ce in 0.0f64..0.2,
        ops in proptest::collection::vec((arb_kind(), 0u32..20_000), 1..24),
    ) {
        let imp = Impairments {
            loss,
            reorder,
            duplicate,
            ce,
            reorder_extra: Duration::from_micros(20),
            skew: Duration::from_micros(3),
            ..Impairments::default()
        };
        let mut s = setup(small_mtu(), imp, seed);
        let msgs = layout(&ops);
        run_workload(&mut s, &msgs, seed, Duration::from_secs(5));
        check_sentinels(&s, &msgs);
        close_both(&mut s);
        let a = s.c.nodes[0].ep.stats(s.a).unwrap();
        prop_assert_eq!(a.completions as usize, msgs.len());
    }
}

/// `n` WRITEs of `len` bytes; targets wrap around the 1 MiB area (the same
/// source bytes land on the same target again, so integrity still holds).
fn bulk_writes(n: u64, len: u32) -> Vec<Msg> {
    (0..n)
        .map(|i| Msg {
            kind: Kind::Write,
            len,
            offset: (i * u64::from(len)) % (SPAN - u64::from(len) + 1),
        })
        .collect()
}

#[test]
fn loss_free_spray_over_16_paths_with_skew_has_few_spurious_retransmissions() {
    let imp = Impairments {
        skew: Duration::from_micros(8), // base 4 us one way: up to 3x RTT spread
        link_ns_per_byte: 0.08,         // 100 Gbit/s
        ..Impairments::default()
    };
    let mut s = setup(Config::default(), imp, 4);
    let msgs = bulk_writes(1000, 16384);
    run_workload(&mut s, &msgs, 4, Duration::from_secs(1));
    let st = s.c.nodes[0].ep.stats(s.a).unwrap();
    let rate = st.retransmissions as f64 / st.packets_sent as f64;
    println!(
        "spray: {} packets over 16 paths, {} retransmissions ({:.4} %), {} spurious",
        st.packets_sent,
        st.retransmissions,
        rate * 100.0,
        st.spurious_retransmissions
    );
    assert!(rate < 0.001, "spurious retransmission rate {rate}");
    // Every path carried traffic.
    for p in 0..16u8 {
        assert!(s.c.nodes[0].ep.path_stats(s.a, p).unwrap().sent > 0);
    }
}

#[test]
fn uniform_random_loss_causes_no_path_churn() {
    const BOUND: u64 = 2;
    let imp = Impairments {
        loss: 0.01,
        link_ns_per_byte: 0.08,
        ..Impairments::default()
    };
    let mut s = setup(Config::default(), imp, 5);
    let msgs = bulk_writes(1000, 16384);
    run_workload(&mut s, &msgs, 5, Duration::from_secs(2));
    let st = s.c.nodes[0].ep.stats(s.a).unwrap();
    println!(
        "uniform 1% loss: {} packets, {} lost, {} re-rolls (bound {BOUND})",
        st.packets_sent, st.packets_lost, st.path_rerolls
    );
    assert!(st.path_rerolls <= BOUND);
}

#[test]
fn a_path_with_30_percent_loss_is_rerolled_and_traffic_leaves_it() {
    let mut s = setup(
        Config::default(),
        Impairments {
            link_ns_per_byte: 0.08,
            ..Impairments::default()
        },
        6,
    );
    let bad = s.c.nodes[0].ep.path_stats(s.a, 3).unwrap().entropy;
    s.c.imp.bad_entropy = vec![(bad, 0.3)];
    let msgs = bulk_writes(1000, 16384);
    run_workload(&mut s, &msgs, 6, Duration::from_secs(2));
    let p3 = s.c.nodes[0].ep.path_stats(s.a, 3).unwrap();
    let st = s.c.nodes[0].ep.stats(s.a).unwrap();
    let on_bad =
        s.c.stats
            .data_sent_by_entropy
            .get(&bad)
            .copied()
            .unwrap_or(0);
    let total: u64 = s.c.stats.data_sent_by_entropy.values().sum();
    println!("bad path: re-rolled {} times, {} of {} data packets used its old entropy; {} re-rolls total", p3.rerolls, on_bad, total, st.path_rerolls);
    assert!(p3.rerolls >= 1, "the lossy path was never re-rolled");
    assert_ne!(p3.entropy, bad, "still on the lossy entropy");
    assert!(
        on_bad * 100 < total * 3,
        "traffic stayed on the lossy path: {on_bad}/{total}"
    );
}

#[test]
fn ecn_marks_cut_the_rate() {
    let imp = Impairments {
        ce: 0.3,
        ..Impairments::default()
    };
    let mut s = setup(
        Config {
            rate_hints: false,
            ..Config::default()
        },
        imp,
        7,
    );
    // Long enough for alpha (starting at 1/16, gain 1/16) to approach the
    // marked fraction: the whole 1 MiB region.
    let msgs: Vec<Msg> = (0..16)
        .map(|i| Msg {
            kind: Kind::Write,
            len: 65536,
            offset: i * 65536,
        })
        .collect();
    run_workload(&mut s, &msgs, 7, Duration::from_secs(1));
    let st = s.c.nodes[0].ep.stats(s.a).unwrap();
    println!("rate after marks: {} Mbit/s", st.rate_mbps);
    assert!(
        st.rate_mbps < Config::default().link_rate_mbps / 2,
        "{st:?}"
    );
}

#[test]
fn fair_share_hints_converge_to_one_nth() {
    fair_share_hints_converge(4, 100_000, 8);
}

/// 64 senders into one 25 Gbit/s host: each delivers a 4 KiB packet every
/// 84 us at its share, four times the 20 us floor of the active-sender
/// window, which therefore has to grow with the senders counted (spec
/// 4.10.4): a fixed 20 us window counts about a quarter of them and hints
/// four times the share.
#[test]
fn fair_share_hints_count_senders_slower_than_the_window_floor() {
    fair_share_hints_converge(64, 25_000, 9);
}

/// A sender whose last packet (a first transmission asking for an ACK)
/// has arrived counts for the active-sender window's floor only (spec
/// 4.10.4, 20 us here), not for four fair-share packet intervals (262 us
/// for two senders at 1 Gbit/s): the sender still streaming is hinted the
/// whole link soon after the other one is done.
#[test]
fn a_sender_that_goes_idle_counts_for_the_window_floor_only() {
    let link_rate_mbps = 1_000;
    let config = Config {
        link_rate_mbps,
        ..Config::default()
    };
    let imp = Impairments {
        delay: Duration::from_micros(1),
        link_ns_per_byte: 8.0,
        ..Impairments::default()
    };
    let mut c: Cluster = Cluster::with_capacity(3, 4, config, imp, 3);
    let dst = c.register(2, DST, SPAN, Access::REMOTE_WRITE);
    let mut senders = Vec::new();
    for i in 0..2 {
        let src = c.register(i, SRC, SPAN, Access::LOCAL_WRITE);
        let (h, _) = c.connect(i, 2);
        senders.push((h, src));
    }
    let write = |id, len, src, addr| WorkRequest {
        id,
        op: Op::Write {
            remote: MemoryTarget { key: dst, addr },
        },
        local: metaroce_core::api::LocalBuf {
            key: src,
            addr: SRC,
            len,
        },
    };
    // Node 1 streams 1 MiB (8 ms at the link rate); node 0 writes 64 KiB
    // beside it.
    let (h1, src1) = senders[1];
    c.nodes[1]
        .ep
        .post_send(h1, write(1, SPAN as u32, src1, DST))
        .unwrap();
    let start = c.now;
    c.run_until(start + Duration::from_micros(200), |_| false);
    let (h0, src0) = senders[0];
    c.nodes[0]
        .ep
        .post_send(h0, write(2, 65536, src0, DST))
        .unwrap();
    let deadline = c.now + Duration::from_millis(5);
    assert!(c.run_until(deadline, |c| !c.nodes[0].completions.is_empty()));
    let done = c.now;
    assert_eq!(
        c.nodes[2].ep.active_senders(done),
        2,
        "node 0 just finished"
    );
    c.run_until(done + Duration::from_micros(40), |_| false);
    assert!(c.nodes[1].completions.is_empty(), "node 1 still streams");
    let now = c.now;
    assert_eq!(c.nodes[2].ep.active_senders(now), 1);
    c.run_until(now + Duration::from_micros(60), |_| false);
    let hint = c.nodes[1].ep.stats(h1).unwrap().rate_hint_mbps;
    assert_eq!(hint, link_rate_mbps);
}

fn fair_share_hints_converge(n: usize, link_rate_mbps: u32, seed: u64) {
    let config = Config {
        link_rate_mbps,
        ..Config::default()
    };
    let imp = Impairments {
        link_ns_per_byte: 8_000.0 / f64::from(link_rate_mbps),
        ..Impairments::default()
    };
    let mut c: Cluster = Cluster::with_capacity(n + 1, n as u32, config, imp, seed);
    let dst = c.register(n, DST, SPAN, Access::REMOTE_WRITE);
    let mut senders = Vec::new();
    for i in 0..n {
        let src = c.register(i, SRC, SPAN, Access::LOCAL_WRITE);
        let (h, _) = c.connect(i, n);
        senders.push((i, h, src));
    }
    // Everybody streams; refill the queues until the hints settle.
    let end = c.now + Duration::from_millis(3) * (100_000 / link_rate_mbps);
    let mut id = 0;
    while c.now < end {
        for &(i, h, src) in &senders {
            let wr = WorkRequest {
                id,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: dst,
                        // Senders may share target bytes: only hints count.
                        addr: DST + (i as u64 % 16) * 65536,
                    },
                },
                local: c.local(src, SRC, 65536),
            };
            if c.nodes[i].ep.post_send(h, wr).is_ok() {
                id += 1;
            }
        }
        c.step();
    }
    let share = link_rate_mbps / n as u32;
    for &(i, h, _) in &senders {
        let hint = c.nodes[i].ep.stats(h).unwrap().rate_hint_mbps;
        assert!(
            (hint as f64 - share as f64).abs() <= share as f64 * 0.1,
            "sender {i}: hint {hint} Mbit/s against a fair share of {share}"
        );
    }
}

// ----- Bad input -------------------------------------------------------------

fn capture_first_data_packet(s: &mut Setup, key: u32, addr: u64, len: u32) -> Vec<u8> {
    let captured = std::rc::Rc::new(std::cell::RefCell::new(None::<Vec<u8>>));
    let cap = captured.clone();
    s.c.tamper = Some(Box::new(move |from, bytes| {
        if from == 0 && bytes.get(1) == Some(&0x01) && cap.borrow().is_none() {
            *cap.borrow_mut() = Some(bytes.clone());
            return true; // swallow it: the test replays forged copies
        }
        false
    }));
    let wr = WorkRequest {
        id: 77,
        op: Op::Write {
            remote: MemoryTarget { key, addr },
        },
        local: s.c.local(s.a_src, SRC, len),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).unwrap();
    let deadline = s.c.now + Duration::from_millis(1);
    s.c.run_until(deadline, |_| captured.borrow().is_some());
    s.c.tamper = None;
    let v = captured.borrow().clone().expect("no data packet captured");
    v
}

fn deliver_raw(s: &mut Setup, bytes: &[u8]) {
    let meta = metaroce_core::api::RxMeta {
        source: s.c.addr(0),
        ce: false,
    };
    let now = s.c.now;
    let node = &mut s.c.nodes[1];
    node.ep.handle_packet(now, &meta, bytes, &mut node.mem);
}

fn reseal(bytes: &mut [u8]) {
    let n = bytes.len();
    let crc = wire::packet::crc32(&[&bytes[..n - 4]]);
    bytes[n - 4..].copy_from_slice(&crc.to_be_bytes());
}

#[test]
fn bad_input_is_dropped_or_nakked_and_never_written() {
    let mut s = setup(small_mtu(), Impairments::default(), 9);
    let key = s.b_dst;
    let pkt = capture_first_data_packet(&mut s, key, DST + 128, 100);
    let writes_before = s.c.nodes[1].mem.writes;
    let drops_before = s.c.nodes[1].ep.drops();

    // Wrong token.
    let mut p = pkt.clone();
    p[8] ^= 0xff;
    reseal(&mut p);
    deliver_raw(&mut s, &p);
    // Unknown connection.
    let mut p = pkt.clone();
    p[4] ^= 0x40;
    reseal(&mut p);
    deliver_raw(&mut s, &p);
    // Corrupted (bad CRC) and truncated at every length.
    let mut p = pkt.clone();
    p[40] ^= 1;
    deliver_raw(&mut s, &p);
    for cut in 0..pkt.len() {
        deliver_raw(&mut s, &pkt[..cut]);
    }
    // PSN far outside the window.
    let mut p = pkt.clone();
    let psn = u32::from_be_bytes(p[16..20].try_into().unwrap()).wrapping_add(100_000);
    p[16..20].copy_from_slice(&psn.to_be_bytes());
    reseal(&mut p);
    deliver_raw(&mut s, &p);

    let d = s.c.nodes[1].ep.drops();
    assert_eq!(d.bad_token, drops_before.bad_token + 1);
    assert_eq!(d.unknown_connection, drops_before.unknown_connection + 1);
    assert!(d.bad_crc > drops_before.bad_crc);
    assert!(d.truncated >= drops_before.truncated + pkt.len() as u64 - 1);
    assert_eq!(s.c.nodes[1].ep.stats(s.b).unwrap().out_of_window, 1);
    assert_eq!(
        s.c.nodes[1].mem.writes, writes_before,
        "a dropped packet wrote memory"
    );
    let area = s.c.nodes[1].mem.slice(DST, SPAN as usize);
    assert!(area.iter().all(|&b| b == SENTINEL));
}

fn nak_case(edit: impl FnOnce(&mut Setup) -> (u32, u64), expect: Status) {
    let mut s = setup(small_mtu(), Impairments::default(), 10);
    let (key, addr) = edit(&mut s);
    let wr = WorkRequest {
        id: 5,
        op: Op::Write {
            remote: MemoryTarget { key, addr },
        },
        local: s.c.local(s.a_src, SRC, 3000),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).unwrap();
    let wr2 = WorkRequest {
        id: 6,
        op: Op::Write {
            remote: MemoryTarget {
                key: s.b_dst,
                addr: DST,
            },
        },
        local: s.c.local(s.a_src, SRC, 100),
    };
    s.c.nodes[0].ep.post_send(s.a, wr2).unwrap();
    let deadline = s.c.now + Duration::from_millis(50);
    let ok =
        s.c.run_until(deadline, |c| c.nodes[0].completions.len() == 2);
    assert!(ok, "no error completion");
    let cs: &Vec<Completion> = &s.c.nodes[0].completions;
    assert_eq!(cs[0].status, expect);
    assert_eq!(cs[1].status, Status::Flushed);
    assert_eq!(s.c.nodes[0].ep.state(s.a), Some(ConnState::Error));
    assert!(s.c.nodes[1].ep.stats(s.b).unwrap().naks_sent >= 1);
    // Neither the WRITE area nor the receive buffers saw a byte.
    let mem = &s.c.nodes[1].mem;
    assert!(
        mem.slice(DST, 2 * SPAN as usize)
            .iter()
            .all(|&b| b == SENTINEL),
        "a NAKed packet wrote memory"
    );
}

#[test]
fn wrong_key_is_nakked() {
    nak_case(|s| (s.b_dst ^ 0x0100, DST), Status::RemoteInvalidKey);
}

#[test]
fn access_without_permission_is_nakked() {
    // The receive region grants LOCAL_WRITE only.
    nak_case(|s| (s.b_recv, RECV), Status::RemoteAccess);
}

#[test]
fn address_outside_the_region_is_nakked() {
    nak_case(|_| (0, 0), Status::RemoteInvalidKey);
    nak_case(|s| (s.b_dst, DST + SPAN - 100), Status::RemoteBounds);
}

#[test]
fn send_without_posted_receive_is_retried_then_completes() {
    let mut s = setup(small_mtu(), Impairments::default(), 11);
    let wr = WorkRequest {
        id: 1,
        op: Op::Send,
        local: s.c.local(s.a_src, SRC, 2000),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).unwrap();
    let t = s.c.now + Duration::from_micros(120);
    s.c.run_until(t, |_| false);
    assert!(s.c.nodes[0].ep.stats(s.a).unwrap().rnr_naks_received >= 1);
    let r = RecvRequest {
        id: 9,
        local: s.c.local(s.b_recv, RECV, 4096),
    };
    s.c.nodes[1].ep.post_recv(s.b, r).unwrap();
    let ok = s.c.run_until(s.c.now + Duration::from_millis(10), |c| {
        c.nodes[0].completions.len() == 1 && c.nodes[1].completions.len() == 1
    });
    assert!(ok);
    assert_eq!(s.c.nodes[0].completions[0].status, Status::Success);
    assert_eq!(s.c.nodes[1].completions[0].byte_len, 2000);
}

/// Every packet of a refused SEND draws its own NAK (spec 4.7.1); the
/// NAKs of one burst are one RNR retry (4.7.3), so a message of more
/// packets than `rnr_retry_limit` still gets its retries.
#[test]
fn a_refused_burst_of_many_packets_is_one_rnr_retry() {
    let mut s = setup(small_mtu(), Impairments::default(), 12);
    let len = 12 * 1000;
    let wr = WorkRequest {
        id: 1,
        op: Op::Send,
        local: s.c.local(s.a_src, SRC, len),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).unwrap();
    // About three rounds of RNR (rnr_delay 50 us) before a receive exists.
    let t = s.c.now + Duration::from_micros(160);
    s.c.run_until(t, |_| false);
    let naks = s.c.nodes[0].ep.stats(s.a).unwrap().rnr_naks_received;
    assert!(
        naks > 8,
        "{naks} RNR NAKs: a burst should draw one per packet"
    );
    let r = RecvRequest {
        id: 9,
        local: s.c.local(s.b_recv, RECV, 16 << 10),
    };
    s.c.nodes[1].ep.post_recv(s.b, r).unwrap();
    let ok = s.c.run_until(s.c.now + Duration::from_millis(10), |c| {
        c.nodes[0].completions.len() == 1 && c.nodes[1].completions.len() == 1
    });
    assert!(ok, "{:?}", s.c.nodes[0].completions);
    assert_eq!(s.c.nodes[0].completions[0].status, Status::Success);
    assert_eq!(s.c.nodes[1].completions[0].byte_len, len);
}

#[test]
fn an_idle_16_path_connection_costs_at_most_512_bytes() {
    let f = Ep::footprint();
    println!("{f:#?}");
    assert!(
        f.idle_connection <= 512,
        "{} B per idle connection",
        f.idle_connection
    );
    assert_eq!(f.idle_connection, f.slot + f.index_share);
    let _ = Instant::ZERO;
}

#[test]
fn works_with_256_paths() {
    let config = Config {
        paths: 256,
        mtu: 1024,
        ..Config::default()
    };
    let mut c: Cluster<256> = Cluster::new(
        2,
        config,
        Impairments {
            loss: 0.02,
            reorder: 0.2,
            skew: Duration::from_micros(4),
            ..Impairments::default()
        },
        12,
    );
    let src = c.register(0, SRC, SPAN, Access::LOCAL_WRITE);
    let dst = c.register(1, DST, SPAN, Access::REMOTE_WRITE);
    let (a, _) = c.connect(0, 1);
    assert_eq!(c.nodes[0].ep.connection(a).unwrap().params().paths, 256);
    for i in 0..64u64 {
        let wr = WorkRequest {
            id: i,
            op: Op::Write {
                remote: MemoryTarget {
                    key: dst,
                    addr: DST + i * 16384,
                },
            },
            local: c.local(src, SRC + i * 16384, 16384),
        };
        while c.nodes[0].ep.post_send(a, wr).is_err() {
            c.step();
        }
    }
    let ok = c.run_until(c.now + Duration::from_millis(100), |c| {
        c.nodes[0].completions.len() == 64
    });
    assert!(ok);
    assert!(c.nodes[0]
        .completions
        .iter()
        .all(|x| x.status == Status::Success));
    let used = (0..=255u8)
        .filter(|&p| c.nodes[0].ep.path_stats(a, p).unwrap().sent > 0)
        .count();
    println!("256 paths: {used} carried traffic");
    assert!(used > 200, "only {used} of 256 paths used");
    assert_eq!(
        fnv(c.nodes[1].mem.slice(DST, 1 << 20)),
        fnv(c.nodes[0].mem.slice(SRC, 1 << 20))
    );
}

#[test]
fn keepalives_hold_an_idle_connection_and_silence_ends_it() {
    let config = small_mtu();
    let mut s = setup(config, Impairments::default(), 13);
    // Idle for three keep-alive intervals: still established.
    let t = s.c.now + config.keepalive_interval * 3;
    s.c.run_until(t, |_| false);
    assert_eq!(s.c.nodes[0].ep.state(s.a), Some(ConnState::Established));
    assert_eq!(s.c.nodes[1].ep.state(s.b), Some(ConnState::Established));
    // The peer goes silent with work outstanding: the idle timeout fails the
    // connection and flushes the work with an error completion.
    s.c.imp.loss = 1.0;
    let wr = WorkRequest {
        id: 1,
        op: Op::Write {
            remote: MemoryTarget {
                key: s.b_dst,
                addr: DST,
            },
        },
        local: s.c.local(s.a_src, SRC, 100),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).unwrap();
    let t = s.c.now + config.idle_timeout * 2;
    s.c.run_until(t, |c| !c.nodes[0].completions.is_empty());
    let c0 = s.c.nodes[0].completions[0];
    assert_ne!(c0.status, Status::Success);
    assert!(matches!(
        s.c.nodes[0].ep.state(s.a),
        Some(ConnState::Error | ConnState::Closed)
    ));
}

#[test]
fn failed_connections_are_reported_and_their_released_slots_reused() {
    let config = small_mtu();
    let mut s = setup(config, Impairments::default(), 17);
    // The peer vanishes: every new connection to it fails its handshake.
    s.c.imp.loss = 1.0;
    let peer = s.c.addr(1);
    let mut failed = 0;
    let mut seen = Vec::new();
    // More attempts than the endpoint has slots (8, one already in use).
    for _ in 0..12 {
        let now = s.c.now;
        let h = s.c.nodes[0]
            .ep
            .connect(now, peer, 0)
            .expect("a released connection's slot is free again");
        assert!(!seen.contains(&h), "a handle is never reused");
        seen.push(h);
        // CONNECT is repeated for the connect timeout, then it fails.
        let t = now + config.connect_timeout + config.handshake_timeout_max;
        s.c.run_until(t, |c| {
            c.nodes[0].events.iter().any(|e| {
                matches!(e, Event::Failed { conn, status: Status::RetryExceeded } if *conn == h)
            })
        });
        assert_eq!(s.c.nodes[0].ep.state(h), Some(ConnState::Error));
        s.c.nodes[0]
            .ep
            .release(h)
            .expect("release after the failure");
        assert_eq!(s.c.nodes[0].ep.state(h), None, "a released handle is stale");
        assert_eq!(
            s.c.nodes[0].ep.release(h),
            Err(metaroce_core::CommandError::UnknownConnection)
        );
        failed += 1;
    }
    assert_eq!(failed, 12);
}

/// Spec 4.8.6: the requester keeps to the READ depth the responder stated
/// (here 4): 64 READs posted at once are held beyond it and sent as others
/// complete, so the responder never refuses one with RECEIVER_NOT_READY,
/// with and without loss.
#[test]
fn reads_beyond_the_stated_depth_are_held_not_refused() {
    for (seed, loss) in [(31, 0.0), (32, 0.1)] {
        let config = Config {
            read_jobs_limit: 4,
            ..small_mtu()
        };
        let imp = Impairments {
            loss,
            ..Impairments::default()
        };
        let mut s = setup(config, imp, seed);
        // Each end stated 4 and heard the other's 4 (spec 3.8.1).
        for (n, h) in [(0, s.a), (1, s.b)] {
            let c = s.c.nodes[n].ep.connection(h).unwrap();
            assert_eq!(c.read_depths(), (4, 4), "node {n}");
        }
        let msgs = layout(&[(Kind::Read, 3000); 64]);
        run_workload(&mut s, &msgs, seed, Duration::from_millis(500));
        let a = s.c.nodes[0].ep.stats(s.a).unwrap();
        assert_eq!(a.rnr_naks_received, 0, "loss {loss}: {a:?}");
        assert_eq!(s.c.nodes[1].ep.pool_refusals().read_jobs, 0);
        close_both(&mut s);
    }
}
