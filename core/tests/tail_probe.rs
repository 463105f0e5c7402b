//! Tail-loss probes (spec 4.6.5): a lost last packet has no
//! later delivery for RACK (4.6.2) to notice it by, so without a probe it
//! waits for the retransmission timer. Seeded, virtual-clock runs of one
//! short WRITE between two nodes with the data-centre configuration.

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, ConnHandle, Op, Status, WorkRequest};
use metaroce_core::wire::{self, Body, Flags, MemoryTarget};
use metaroce_core::Config;

/// 64 KiB: 16 packets of 4 KiB, the all-to-all's flow.
const LEN: u32 = 64 << 10;
const SRC: u64 = ARENA_BASE;
const DST: u64 = ARENA_BASE + (1 << 20);

struct Setup {
    c: Cluster,
    a: ConnHandle,
    src: u32,
    dst: u32,
}

/// Two nodes 2 us apart at 100 Gbit/s (0.08 ns per byte), connected.
fn setup(seed: u64) -> Setup {
    let imp = Impairments {
        delay: Duration::from_micros(2),
        link_ns_per_byte: 0.08,
        ..Impairments::default()
    };
    let mut c = Cluster::new(2, Config::default(), imp, seed);
    let src = c.register(0, SRC, u64::from(LEN), Access::LOCAL_WRITE);
    let dst = c.register(1, DST, u64::from(LEN), Access::REMOTE_WRITE);
    for (i, b) in c.nodes[0]
        .mem
        .slice_mut(SRC, LEN as usize)
        .iter_mut()
        .enumerate()
    {
        *b = pattern(seed, 1, i);
    }
    let (a, _) = c.connect(0, 1);
    Setup { c, a, src, dst }
}

/// Posts one 64 KiB WRITE and runs until it completes; returns how long
/// it took. Checks the bytes.
fn write_once(s: &mut Setup) -> Duration {
    let start = s.c.now;
    let wr = WorkRequest {
        id: 1,
        op: Op::Write {
            remote: MemoryTarget {
                key: s.dst,
                addr: DST,
            },
        },
        local: s.c.local(s.src, SRC, LEN),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).expect("post");
    let done = s.c.run_until(start + Duration::from_millis(50), |c| {
        !c.nodes[0].completions.is_empty()
    });
    assert!(done, "the WRITE completes");
    assert_eq!(s.c.nodes[0].completions[0].status, Status::Success);
    assert!(
        s.c.nodes[1].mem.slice(DST, LEN as usize) == s.c.nodes[0].mem.slice(SRC, LEN as usize),
        "every byte landed"
    );
    s.c.now - start
}

/// Whether `bytes` is node 0's first transmission of the message's last
/// data packet.
fn is_last_first_transmission(from: usize, bytes: &[u8]) -> bool {
    let Ok((repr, _)) = wire::packet::parse(bytes) else {
        return false;
    };
    let Body::Write(w) = repr.body else {
        return false;
    };
    from == 0
        && !repr.header.flags.contains(Flags::RETRANSMISSION)
        && w.msg.offset + u32::from(repr.payload_len) == w.msg.len
}

#[test]
fn a_lost_last_packet_is_recovered_by_the_probe_not_the_timeout() {
    for seed in 1..=4 {
        let mut s = setup(seed);
        let dropped = Rc::new(Cell::new(0u32));
        let seen = dropped.clone();
        s.c.tamper = Some(Box::new(move |from, bytes| {
            let drop = is_last_first_transmission(from, bytes);
            seen.set(seen.get() + u32::from(drop));
            drop
        }));
        let took = write_once(&mut s);
        assert_eq!(dropped.get(), 1, "the last packet was dropped once");
        let st = s.c.nodes[0].ep.stats(s.a).expect("stats");
        assert_eq!(st.timeouts, 0, "seed {seed}: no retransmission timeout");
        assert_eq!(st.probes, 1, "seed {seed}: one probe");
        assert_eq!(st.retransmissions, 1, "seed {seed}: only the probe resent");
        // Well within the 100 us minimum RTO.
        assert!(
            took < Duration::from_micros(60),
            "seed {seed}: took {took:?}"
        );
    }
}

#[test]
fn a_lost_ack_of_the_last_packet_is_repaired_by_the_probe() {
    let mut s = setup(7);
    // Once the last packet left, drop every ACK node 1 sends until a
    // retransmission (the probe) comes: the sender hears nothing more.
    // 0: passing, 1: dropping, 2: passing again.
    let phase = Rc::new(Cell::new(0u8));
    let p = phase.clone();
    s.c.tamper = Some(Box::new(move |from, bytes| {
        let Ok((repr, _)) = wire::packet::parse(bytes) else {
            return false;
        };
        match repr.body {
            Body::Write(_) if from == 0 => {
                if repr.header.flags.contains(Flags::RETRANSMISSION) {
                    p.set(2);
                } else if p.get() == 0 && is_last_first_transmission(from, bytes) {
                    p.set(1);
                }
                false
            }
            Body::Ack(_) if from == 1 => p.get() == 1,
            _ => false,
        }
    }));
    let took = write_once(&mut s);
    let st = s.c.nodes[0].ep.stats(s.a).expect("stats");
    assert_eq!(phase.get(), 2, "the probe went out");
    assert_eq!(st.timeouts, 0);
    assert_eq!(st.probes, 1, "{st:?}");
    assert!(took < Duration::from_micros(100), "took {took:?}");
}

#[test]
fn no_probe_while_acks_flow() {
    for seed in 1..=4 {
        let mut s = setup(seed);
        for _ in 0..4 {
            s.c.nodes[0].completions.clear();
            write_once(&mut s);
            // Idle in between: nothing outstanding, nothing to probe.
            let idle = s.c.now + Duration::from_micros(200);
            s.c.run_until(idle, |_| false);
        }
        let st = s.c.nodes[0].ep.stats(s.a).expect("stats");
        assert_eq!(st.probes, 0, "seed {seed}: {st:?}");
        assert_eq!(st.retransmissions, 0);
        assert_eq!(st.timeouts, 0);
    }
}

#[test]
fn probes_back_off_like_the_timer_they_replace() {
    let mut s = setup(3);
    // After one loss-free WRITE (so data was acknowledged), node 1 falls
    // silent: every resend of the next WRITE goes unanswered.
    write_once(&mut s);
    s.c.nodes[0].completions.clear();
    let resends = Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = resends.clone();
    s.c.tamper = Some(Box::new(move |from, bytes| {
        if from == 1 {
            return true;
        }
        if let Ok((repr, _)) = wire::packet::parse(bytes) {
            if repr.header.flags.contains(Flags::RETRANSMISSION) {
                seen.borrow_mut().push(repr.header.timestamp);
            }
        }
        false
    }));
    let wr = WorkRequest {
        id: 2,
        op: Op::Write {
            remote: MemoryTarget {
                key: s.dst,
                addr: DST,
            },
        },
        local: s.c.local(s.src, SRC, 4096),
    };
    s.c.nodes[0].ep.post_send(s.a, wr).expect("post");
    let until = s.c.now + Duration::from_millis(20);
    s.c.run_until(until, |_| false);
    let st = s.c.nodes[0].ep.stats(s.a).expect("stats");
    assert_eq!(st.probes, 4, "{st:?}");
    assert!(st.timeouts >= 3, "the timer takes over: {st:?}");
    let t = resends.borrow();
    let gaps: Vec<u32> = t.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(gaps.len() >= 6, "{gaps:?}");
    for w in gaps.windows(2) {
        assert!(w[1] >= w[0], "gaps never shrink: {gaps:?}");
    }
    assert!(gaps[3] >= 2 * gaps[1], "they double: {gaps:?}");
}
