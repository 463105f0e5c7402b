//! The start-up window (spec 4.10.6, issue 15): before its first ACK a
//! sender keeps four 4 KiB packets in flight; once an ACK names its share
//! (the receiver's rate hint, 4.10.4), the window is at least the share's
//! bandwidth-delay product, so a sender alone at its receiver sends at line
//! rate from its second round trip. Seeded, virtual-clock runs.

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, Op, WorkRequest};
use metaroce_core::wire::MemoryTarget;
use metaroce_core::Config;

const LEN: u32 = 1 << 20;
const SRC: u64 = ARENA_BASE;
const DST: u64 = ARENA_BASE + (1 << 21);

/// Packets in flight on every path of node 0's connection.
fn in_flight(c: &Cluster, a: metaroce_core::api::ConnHandle) -> u32 {
    (0..=u8::MAX)
        .map_while(|p| c.nodes[0].ep.path_stats(a, p))
        .map(|s| s.in_flight)
        .sum()
}

#[test]
fn a_sender_alone_at_its_receiver_fills_the_path_from_its_second_round_trip() {
    // Two nodes 4 us apart at 100 Gbit/s: a round trip of about 8.5 us
    // holds 100 KB, 25 packets of 4 KiB.
    let imp = Impairments {
        delay: Duration::from_micros(4),
        link_ns_per_byte: 0.08,
        ..Impairments::default()
    };
    let mut c = Cluster::new(2, Config::default(), imp, 5);
    let src = c.register(0, SRC, u64::from(LEN), Access::LOCAL_WRITE);
    let dst = c.register(1, DST, u64::from(LEN), Access::REMOTE_WRITE);
    let (a, _) = c.connect(0, 1);
    let wr = WorkRequest {
        id: 1,
        op: Op::Write {
            remote: MemoryTarget {
                key: dst,
                addr: DST,
            },
        },
        local: c.local(src, SRC, LEN),
    };
    c.nodes[0].ep.post_send(a, wr).expect("post");
    // The first round trip: the start-up window of 16 KiB.
    let mut first = 0;
    while c.nodes[0].ep.stats(a).expect("stats").packets_acked == 0 {
        first = first.max(in_flight(&c, a));
        assert!(c.step(), "stalled before the first ACK");
    }
    assert_eq!(first, 4, "four packets before the first ACK");
    // The second round trip: the share's bandwidth-delay product. Doubling
    // per round trip allows 8 here (16 KiB plus the 16 acknowledged).
    let second_ends = c.now + Duration::from_micros(8);
    let mut second = 0;
    while c.now < second_ends {
        second = second.max(in_flight(&c, a));
        assert!(c.step(), "stalled in the second round trip");
    }
    assert!(
        second >= 20,
        "{second} packets in flight in the second round trip, 25 fill the path"
    );
    c.run_until(c.now + Duration::from_millis(5), |c| {
        !c.nodes[0].completions.is_empty()
    });
    assert_eq!(c.nodes[0].completions.len(), 1);
}
