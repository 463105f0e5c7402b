//! The baseline's RC behaviour end to end: two QPs on a virtual clock, a
//! lossy, reordering, marking channel, and data integrity by hash.

mod common;

use metaroce_core::wire::MemoryTarget;

use common::{Pair, A, B, FIRST_PSN};
use metaroce_core::api::{
    Completion, LocalBuf, Op, Opcode as CqOpcode, RecvRequest, Status, WorkRequest,
};
use metaroce_core::Instant;
use roce_baseline::cc::CcConfig;
use roce_baseline::config::local_ack_timeout;
use roce_baseline::psn;
use roce_baseline::wire::Opcode;
use roce_baseline::{Config, QpState};

const SRC: u64 = 0x10_0000_0000;
const DST: u64 = 0x20_0000_0000;
const LIMIT: Instant = Instant::from_micros(60_000_000);

fn config() -> Config {
    Config {
        cc: CcConfig::None,
        ..Config::default()
    }
}

fn done(side: usize, n: usize) -> impl FnMut(&Pair) -> bool {
    move |p: &Pair| p.hosts[side].completions.len() >= n
}

/// A WRITE of `len` bytes from A to B; returns B's source and destination hashes.
fn write_transfer(pair: &mut Pair, len: usize) -> (u32, u32) {
    let local = pair.hosts[A].region(SRC, len);
    pair.hosts[A].mem.fill(SRC, len, 7);
    let remote = pair.hosts[B].region(DST, len);
    let qp = pair.hosts[A].qp;
    pair.hosts[A]
        .ep
        .post_send(
            qp,
            WorkRequest {
                id: 1,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: remote.key,
                        addr: DST,
                    },
                },
                local,
            },
        )
        .unwrap();
    assert!(pair.run_until(LIMIT, done(A, 1)), "transfer did not finish");
    let c = pair.completions(A)[0];
    assert_eq!(c.status, Status::Success, "{c:?}");
    assert_eq!(c.byte_len, len as u32);
    (
        pair.hosts[A].mem.hash(SRC, len),
        pair.hosts[B].mem.hash(DST, len),
    )
}

#[test]
fn write_without_loss_uses_no_retransmission() {
    let mut pair = Pair::new(1, config(), 4096);
    let (src, dst) = write_transfer(&mut pair, 1 << 20);
    assert_eq!(src, dst);
    let a = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
    assert_eq!(a.data_packets_sent, 256);
    assert_eq!(a.retransmitted_packets, 0);
    assert_eq!(a.timeouts, 0);
    // Close to line rate: 1 MiB at 100 Gb/s is about 86 us plus a round trip.
    let (t, _) = pair.hosts[A].completions[0];
    assert!(t < Instant::from_micros(100), "took {t:?}");
}

#[test]
fn go_back_n_recovers_every_byte_at_1_and_5_percent_loss() {
    for (loss, seed) in [(0.01, 11), (0.05, 12)] {
        let mut pair = Pair::new(seed, config(), 4096);
        pair.loss = loss;
        let (src, dst) = write_transfer(&mut pair, 4 << 20);
        assert_eq!(src, dst, "loss {loss}");
        let a = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
        assert!(a.retransmitted_packets > 0, "loss {loss}: {a:?}");
        assert!(a.seq_naks_received > 0);
        assert_eq!(
            pair.hosts[A].ep.qp_state(pair.hosts[A].qp),
            Some(QpState::ReadyToSend)
        );
    }
}

#[test]
fn single_drop_causes_one_nak_and_resend_from_that_psn() {
    let mut pair = Pair::new(3, config(), 4096);
    let dropped_psn = psn::add(FIRST_PSN[A], 40);
    let mut once = true;
    pair.drop_filter = Some(Box::new(move |side, repr, _, _| {
        let d = once && side == A && repr.bth.opcode.is_write() && repr.bth.psn == dropped_psn;
        once &= !d;
        d
    }));
    let (src, dst) = write_transfer(&mut pair, 1 << 20);
    assert_eq!(src, dst);
    let a = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
    let b = pair.hosts[B].ep.counters(pair.hosts[B].qp).unwrap();
    assert_eq!(b.seq_naks_sent, 1, "{b:?}");
    assert_eq!(a.seq_naks_received, 1);
    assert_eq!(a.timeouts, 0);
    // The PSNs A sent: ascending to some point past the drop, then again
    // from exactly the dropped PSN, ascending to the end.
    let psns: Vec<u32> = pair.hosts[A].sent_data().map(|s| s.psn).collect();
    let restart = psns
        .windows(2)
        .position(|w| w[1] != psn::add(w[0], 1))
        .expect("a restart")
        + 1;
    assert_eq!(psns[restart], dropped_psn);
    assert!(psns[restart..]
        .windows(2)
        .all(|w| w[1] == psn::add(w[0], 1)));
    assert_eq!(a.retransmitted_packets as usize, restart - 40);
    assert_eq!(psns.len(), 256 + a.retransmitted_packets as usize);
}

#[test]
fn retry_timer_fires_when_the_last_packet_is_lost() {
    let mut pair = Pair::new(4, config(), 4096);
    let last = psn::add(FIRST_PSN[A], 255);
    let mut once = true;
    pair.drop_filter = Some(Box::new(move |side, repr, _, _| {
        let d = once && side == A && repr.bth.opcode == Opcode::WriteLast && repr.bth.psn == last;
        if d {
            once = false;
        }
        d
    }));
    let (src, dst) = write_transfer(&mut pair, 1 << 20);
    assert_eq!(src, dst);
    let a = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
    assert_eq!(a.timeouts, 1, "{a:?}");
    assert_eq!(a.seq_naks_received, 0);
    let (t, _) = pair.hosts[A].completions[0];
    assert!(
        t >= Instant::ZERO + local_ack_timeout(14),
        "completed at {t:?}"
    );
}

#[test]
fn retry_exceeded_when_the_peer_goes_silent() {
    let mut pair = Pair::new(5, config(), 4096);
    pair.drop_filter = Some(Box::new(|side, _, _, _| side == A));
    let local = pair.hosts[A].region(SRC, 4096);
    let remote = pair.hosts[B].region(DST, 4096);
    let qp = pair.hosts[A].qp;
    pair.hosts[A]
        .ep
        .post_send(
            qp,
            WorkRequest {
                id: 9,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: remote.key,
                        addr: DST,
                    },
                },
                local,
            },
        )
        .unwrap();
    assert!(pair.run_until(LIMIT, done(A, 1)));
    let c = pair.completions(A)[0];
    assert_eq!(c.status, Status::RetryExceeded);
    let a = pair.hosts[A].ep.counters(qp).unwrap();
    assert_eq!(a.timeouts, 7);
    assert_eq!(a.data_packets_sent, 8);
    assert_eq!(pair.hosts[A].ep.qp_state(qp), Some(QpState::Error));
}

fn post(pair: &mut Pair, id: u64, op: Op, key: u32, addr: u64, len: usize) {
    let qp = pair.hosts[A].qp;
    pair.hosts[A]
        .ep
        .post_send(
            qp,
            WorkRequest {
                id,
                op,
                local: LocalBuf {
                    key,
                    addr,
                    len: len as u32,
                },
            },
        )
        .unwrap();
}

#[test]
fn rnr_nak_then_retry_succeeds_once_a_receive_is_posted() {
    let mut pair = Pair::new(6, config(), 4096);
    let local = pair.hosts[A].region(SRC, 10_000);
    pair.hosts[A].mem.fill(SRC, 10_000, 3);
    let recv_buf = pair.hosts[B].region(DST, 16_384);
    post(
        &mut pair,
        1,
        Op::SendImm { imm: 0xabcd },
        local.key,
        SRC,
        10_000,
    );
    // No receive posted: the responder answers with RNR NAKs.
    assert!(!pair.run_until(Instant::from_micros(1_500), done(A, 1)));
    let a = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
    assert!(a.rnr_naks_received >= 2, "{a:?}");
    let qp_b = pair.hosts[B].qp;
    pair.hosts[B]
        .ep
        .post_recv(
            qp_b,
            RecvRequest {
                id: 77,
                local: recv_buf,
            },
        )
        .unwrap();
    assert!(pair.run_until(LIMIT, |p| !p.hosts[A].completions.is_empty()
        && !p.hosts[B].completions.is_empty()));
    assert_eq!(pair.completions(A)[0].status, Status::Success);
    let rc = pair.completions(B)[0];
    assert_eq!(
        rc,
        Completion {
            conn: qp_b,
            wr_id: 77,
            opcode: CqOpcode::Recv,
            status: Status::Success,
            byte_len: 10_000,
            imm: Some(0xabcd),
        }
    );
    assert_eq!(
        pair.hosts[A].mem.hash(SRC, 10_000),
        pair.hosts[B].mem.hash(DST, 10_000)
    );
    let b = pair.hosts[B].ep.counters(qp_b).unwrap();
    assert!(b.rnr_naks_sent >= a.rnr_naks_received);
}

#[test]
fn rnr_retry_count_runs_out() {
    let mut pair = Pair::new(
        7,
        Config {
            rnr_retry: 2,
            ..config()
        },
        4096,
    );
    let local = pair.hosts[A].region(SRC, 100);
    post(&mut pair, 1, Op::Send, local.key, SRC, 100);
    assert!(pair.run_until(LIMIT, done(A, 1)));
    assert_eq!(
        pair.completions(A)[0].status,
        Status::ReceiverNotReadyExceeded
    );
    assert_eq!(
        pair.hosts[A]
            .ep
            .counters(pair.hosts[A].qp)
            .unwrap()
            .rnr_naks_received,
        3
    );
}

#[test]
fn bad_key_and_bounds_get_a_nak_and_an_error_completion() {
    for case in 0..3 {
        let mut pair = Pair::new(8, config(), 1024);
        let local = pair.hosts[A].region(SRC, 8192);
        pair.hosts[A].mem.fill(SRC, 8192, 1);
        let remote = pair.hosts[B].region(DST, 4096);
        let target = match case {
            0 => MemoryTarget {
                key: remote.key ^ 0x55,
                addr: DST,
            },
            // Starts inside, ends 4 KiB past the region.
            1 => MemoryTarget {
                key: remote.key,
                addr: DST,
            },
            _ => MemoryTarget {
                key: remote.key,
                addr: DST - 1,
            },
        };
        let qp = pair.hosts[A].qp;
        pair.hosts[A]
            .ep
            .post_send(
                qp,
                WorkRequest {
                    id: 5,
                    op: Op::Write { remote: target },
                    local,
                },
            )
            .unwrap();
        assert!(pair.run_until(LIMIT, done(A, 1)));
        let c = pair.completions(A)[0];
        assert_eq!(c.status, Status::RemoteAccess, "case {case}");
        assert!(pair.hosts[B].mem.slice(DST, 4096).iter().all(|&b| b == 0));
        let b = pair.hosts[B].ep.counters(pair.hosts[B].qp).unwrap();
        assert_eq!(b.fatal_naks_sent, 1);
        assert_eq!(
            pair.hosts[B].ep.qp_state(pair.hosts[B].qp),
            Some(QpState::Error)
        );
        assert_eq!(pair.hosts[A].ep.qp_state(qp), Some(QpState::Error));
    }
}

#[test]
fn send_write_imm_and_read_all_complete_under_loss_and_reordering() {
    let mut pair = Pair::new(9, config(), 1024);
    pair.loss = 0.02;
    pair.reorder = 0.02;
    let len = 50_000usize;
    let l = len as u64;
    let local = pair.hosts[A].region(SRC, 3 * len);
    pair.hosts[A].mem.fill(SRC, 2 * len, 21);
    let remote = pair.hosts[B].region(DST, 4 * len);
    pair.hosts[B].mem.fill(DST + 3 * l, len, 22);
    let qp_b = pair.hosts[B].qp;
    // Receives: the first SEND, the WRITE_IMM (no bytes), the second SEND.
    for (id, addr) in [(100, DST), (101, DST + 2 * l), (102, DST + 2 * l)] {
        let rr = RecvRequest {
            id,
            local: LocalBuf {
                key: remote.key,
                addr,
                len: len as u32,
            },
        };
        pair.hosts[B].ep.post_recv(qp_b, rr).unwrap();
    }
    let target = |addr| MemoryTarget {
        key: remote.key,
        addr,
    };
    post(&mut pair, 1, Op::SendImm { imm: 1 }, local.key, SRC, len);
    let write = Op::WriteImm {
        remote: target(DST + l),
        imm: 2,
    };
    post(&mut pair, 2, write, local.key, SRC + l, len);
    let read = Op::Read {
        remote: target(DST + 3 * l),
    };
    post(&mut pair, 3, read, local.key, SRC + 2 * l, len);
    post(&mut pair, 4, Op::Send, local.key, SRC + l, len);
    assert!(pair.run_until(LIMIT, |p| p.hosts[A].completions.len() == 4
        && p.hosts[B].completions.len() == 3));
    let a: Vec<_> = pair
        .completions(A)
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status))
        .collect();
    if std::env::var("ROCE_DEBUG").is_ok() {
        eprintln!("A {:?}", pair.hosts[A].ep.counters(pair.hosts[A].qp));
        eprintln!("B {:?}", pair.hosts[B].ep.counters(pair.hosts[B].qp));
        for side in [A, B] {
            for s in &pair.hosts[side].sent {
                eprintln!(
                    "{side} {:?} {:?} {:#x} {}",
                    s.at, s.opcode, s.psn, s.dropped
                );
            }
        }
    }
    assert_eq!(
        a,
        vec![
            (1, CqOpcode::Send, Status::Success),
            (2, CqOpcode::WriteImm, Status::Success),
            (3, CqOpcode::Read, Status::Success),
            (4, CqOpcode::Send, Status::Success),
        ]
    );
    let b: Vec<_> = pair
        .completions(B)
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status, c.imm, c.byte_len))
        .collect();
    let n = len as u32;
    assert_eq!(
        b,
        vec![
            (100, CqOpcode::Recv, Status::Success, Some(1), n),
            (101, CqOpcode::RecvWriteImm, Status::Success, Some(2), n),
            (102, CqOpcode::Recv, Status::Success, None, n),
        ]
    );
    let (ma, mb) = (&pair.hosts[A].mem, &pair.hosts[B].mem);
    assert_eq!(ma.hash(SRC, len), mb.hash(DST, len), "SEND");
    assert_eq!(ma.hash(SRC + l, len), mb.hash(DST + l, len), "WRITE_IMM");
    assert_eq!(
        ma.hash(SRC + l, len),
        mb.hash(DST + 2 * l, len),
        "second SEND"
    );
    assert_eq!(ma.hash(SRC + 2 * l, len), mb.hash(DST + 3 * l, len), "READ");
    let ca = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
    assert!(ca.retransmitted_packets > 0, "{ca:?}");
}

#[test]
fn a_lost_read_response_reissues_the_read_for_the_rest() {
    let mut pair = Pair::new(10, config(), 1024);
    let len = 20 * 1024;
    let local = pair.hosts[A].region(SRC, len);
    let remote = pair.hosts[B].region(DST, len);
    pair.hosts[B].mem.fill(DST, len, 5);
    // Drop the response carrying the 8th KiB, once.
    let mut once = true;
    pair.drop_filter = Some(Box::new(move |side, repr, _, _| {
        let d = once
            && side == B
            && repr.bth.opcode.is_read_response()
            && repr.bth.psn == psn::add(FIRST_PSN[A], 7);
        once &= !d;
        d
    }));
    let read = Op::Read {
        remote: MemoryTarget {
            key: remote.key,
            addr: DST,
        },
    };
    post(&mut pair, 1, read, local.key, SRC, len);
    assert!(pair.run_until(LIMIT, done(A, 1)));
    assert_eq!(pair.completions(A)[0].status, Status::Success);
    assert_eq!(
        pair.hosts[A].mem.hash(SRC, len),
        pair.hosts[B].mem.hash(DST, len)
    );
    let a = pair.hosts[A].ep.counters(pair.hosts[A].qp).unwrap();
    let b = pair.hosts[B].ep.counters(pair.hosts[B].qp).unwrap();
    assert_eq!(a.read_requests_reissued, 1, "{a:?}");
    assert_eq!(a.read_gaps, 1);
    assert_eq!(
        b.duplicates_received, 1,
        "the re-issued READ is a duplicate PSN, re-executed"
    );
    // 20 responses, then 13 again from the lost one.
    assert_eq!(b.data_packets_sent, 20 + 13);
}

#[test]
fn runs_are_deterministic() {
    let run = || {
        let mut pair = Pair::new(42, Config::default(), 4096);
        pair.loss = 0.02;
        pair.reorder = 0.01;
        let _ = write_transfer(&mut pair, 2 << 20);
        let log: Vec<(u64, u32, bool)> = pair.hosts[A]
            .sent
            .iter()
            .map(|s| (s.at.as_nanos(), s.psn, s.dropped))
            .collect();
        (log, pair.hosts[A].completions[0].0)
    };
    assert_eq!(run(), run());
}

#[test]
fn mixed_work_survives_many_seeds_of_loss_and_reordering() {
    for seed in 100..116 {
        let mut pair = Pair::new(seed, config(), 1024);
        pair.loss = 0.05;
        pair.reorder = 0.03;
        let len = 9_000usize;
        let l = len as u64;
        let local = pair.hosts[A].region(SRC, 4 * len);
        pair.hosts[A].mem.fill(SRC, 4 * len, seed);
        let remote = pair.hosts[B].region(DST, 8 * len);
        pair.hosts[B].mem.fill(DST + 7 * l, len, seed + 1);
        let qp_b = pair.hosts[B].qp;
        for i in 0..3 {
            let rr = RecvRequest {
                id: i,
                local: LocalBuf {
                    key: remote.key,
                    addr: DST + i * l,
                    len: len as u32,
                },
            };
            pair.hosts[B].ep.post_recv(qp_b, rr).unwrap();
        }
        let t = |addr| MemoryTarget {
            key: remote.key,
            addr,
        };
        let ops = [
            Op::Send,
            Op::Write {
                remote: t(DST + 3 * l),
            },
            Op::Read {
                remote: t(DST + 7 * l),
            },
            Op::SendImm { imm: 7 },
            Op::WriteImm {
                remote: t(DST + 4 * l),
                imm: 8,
            },
            Op::Read {
                remote: t(DST + 7 * l),
            },
            Op::Write {
                remote: t(DST + 5 * l),
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            let addr = match op {
                Op::Read { .. } => SRC + 3 * l,
                _ => SRC + (i as u64 % 3) * l,
            };
            post(&mut pair, i as u64, op, local.key, addr, len);
        }
        assert!(
            pair.run_until(LIMIT, |p| p.hosts[A].completions.len() == 7
                && p.hosts[B].completions.len() == 3),
            "seed {seed}: {:?}",
            pair.hosts[A].ep.counters(pair.hosts[A].qp)
        );
        for (i, c) in pair.completions(A).iter().enumerate() {
            assert_eq!(
                (c.wr_id, c.status),
                (i as u64, Status::Success),
                "seed {seed}"
            );
        }
        let (ma, mb) = (&pair.hosts[A].mem, &pair.hosts[B].mem);
        assert_eq!(ma.hash(SRC, len), mb.hash(DST, len), "seed {seed}");
        assert_eq!(
            ma.hash(SRC + l, len),
            mb.hash(DST + 3 * l, len),
            "seed {seed}"
        );
        assert_eq!(ma.hash(SRC, len), mb.hash(DST + l, len), "seed {seed}");
        assert_eq!(
            ma.hash(SRC + l, len),
            mb.hash(DST + 4 * l, len),
            "seed {seed}"
        );
        assert_eq!(ma.hash(SRC, len), mb.hash(DST + 5 * l, len), "seed {seed}");
        assert_eq!(
            ma.hash(SRC + 3 * l, len),
            mb.hash(DST + 7 * l, len),
            "seed {seed}"
        );
    }
}

#[test]
fn dcqcn_cuts_the_rate_on_cnps_and_recovers() {
    let mut pair = Pair::new(13, Config::default(), 4096);
    // The fabric marks A's data for the first 200 us.
    let mark_until = Instant::from_micros(200);
    pair.ce_filter = Some(Box::new(move |side, repr, _, now| {
        side == A && repr.bth.opcode.is_write() && now < mark_until
    }));
    let len = 8 << 20;
    let local = pair.hosts[A].region(SRC, len);
    pair.hosts[A].mem.fill(SRC, len, 1);
    let remote = pair.hosts[B].region(DST, len);
    let qp = pair.hosts[A].qp;
    let line = Config::default().line_rate_bps;
    assert_eq!(pair.hosts[A].ep.send_rate_bps(qp), Some(line));
    let write = Op::Write {
        remote: MemoryTarget {
            key: remote.key,
            addr: DST,
        },
    };
    post(&mut pair, 1, write, local.key, SRC, len);
    pair.run_until(mark_until, |_| false);
    let cut = pair.hosts[A].ep.send_rate_bps(qp).unwrap();
    let b = pair.hosts[B].ep.counters(pair.hosts[B].qp).unwrap();
    let a = pair.hosts[A].ep.counters(qp).unwrap();
    // At most one CNP per 50 us; the first is sent at once.
    assert!(b.cnps_sent >= 3 && b.cnps_sent <= 5, "{b:?}");
    assert!(b.ecn_marked_received > b.cnps_sent);
    assert_eq!(a.cnps_received, b.cnps_sent);
    assert!(cut < line / 4, "rate after CNPs: {cut}");
    let dcqcn = pair.hosts[A].ep.dcqcn(qp).unwrap();
    assert_eq!(dcqcn.decreases(), a.cnps_received);
    // Paced at the cut rate, then recovering: the transfer still completes.
    assert!(pair.run_until(LIMIT, done(A, 1)));
    assert_eq!(
        pair.hosts[A].mem.hash(SRC, len),
        pair.hosts[B].mem.hash(DST, len)
    );
    let (finished, _) = pair.hosts[A].completions[0];
    // 8 MiB at 100 Gb/s takes about 0.7 ms; the cut makes it longer.
    assert!(
        finished > Instant::from_micros(1_000),
        "finished at {finished:?}"
    );
    // Left alone, the timer-driven increases bring the rate back to the line.
    let mut last = pair.hosts[A].ep.send_rate_bps(qp).unwrap();
    assert!(last < line);
    pair.run_until(LIMIT, |p| {
        let r = p.hosts[A].ep.send_rate_bps(qp).unwrap();
        assert!(r >= last, "rate went down without CNPs");
        last = r;
        r == line
    });
    assert_eq!(pair.hosts[A].ep.send_rate_bps(qp), Some(line));
    assert_eq!(
        pair.hosts[A].ep.poll_timeout(),
        None,
        "no timers once at line rate"
    );
}

#[test]
fn zero_length_operations_name_no_memory() {
    let mut pair = Pair::new(14, config(), 4096);
    let local = pair.hosts[A].region(SRC, 16);
    let nowhere = MemoryTarget {
        key: 0xdead,
        addr: 0,
    };
    post(
        &mut pair,
        1,
        Op::Write { remote: nowhere },
        local.key,
        SRC,
        0,
    );
    post(
        &mut pair,
        2,
        Op::Read { remote: nowhere },
        local.key,
        SRC,
        0,
    );
    assert!(pair.run_until(LIMIT, done(A, 2)));
    for c in pair.completions(A) {
        assert_eq!((c.status, c.byte_len), (Status::Success, 0), "{c:?}");
    }
}
