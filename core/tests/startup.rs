//! The start-up window (spec 4.10.6): the ACCEPT's Rate Grant names a new
//! sender's share, and its first flight is one data-centre
//! bandwidth-delay product of it, paced at the share, so a sender alone at
//! its receiver fills the path from its first round trip. Without a grant
//! a sender keeps four 4 KiB packets in flight before its first ACK; once
//! an ACK names its share (the receiver's rate hint, 4.10.4), the window
//! is at least the share's bandwidth-delay product. Seeded, virtual-clock
//! runs.

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

/// Packets in flight before the first ACK and most in flight in the
/// 8 us after it, for one 1 MiB WRITE between two nodes 4 us apart at
/// 100 Gbit/s (a round trip of about 8.5 us holds 100 KB, 25 packets of
/// 4 KiB).
fn first_two_round_trips(config: Config) -> (u32, u32) {
    let imp = Impairments {
        delay: Duration::from_micros(4),
        link_ns_per_byte: 0.08,
        ..Impairments::default()
    };
    let mut c = Cluster::new(2, config, imp, 5);
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
    let mut first = 0;
    while c.nodes[0].ep.stats(a).expect("stats").packets_acked == 0 {
        first = first.max(in_flight(&c, a));
        assert!(c.step(), "stalled before the first ACK");
    }
    let second_ends = c.now + Duration::from_micros(8);
    let mut second = 0;
    while c.now < second_ends {
        second = second.max(in_flight(&c, a));
        assert!(c.step(), "stalled in the second round trip");
    }
    c.run_until(c.now + Duration::from_millis(5), |c| {
        !c.nodes[0].completions.is_empty()
    });
    assert_eq!(c.nodes[0].completions.len(), 1);
    (first, second)
}

#[test]
fn a_sender_alone_at_its_receiver_fills_the_path_from_its_first_round_trip() {
    // The ACCEPT grants the whole link: the first flight (up to 61
    // packets, 20 us of it) is paced at line rate, so the path is full
    // before the first ACK returns.
    let (first, second) = first_two_round_trips(Config::default());
    assert!(
        first >= 20,
        "{first} packets in flight before the first ACK, 25 fill the path"
    );
    assert!(second >= 20, "{second} packets in the second round trip");
}

#[test]
fn without_a_grant_a_sender_fills_the_path_from_its_second_round_trip() {
    // A receiver that gives no hints grants nothing: the start-up window
    // of 16 KiB, then (with hints) the share's bandwidth-delay product.
    let config = Config {
        rate_hints: false,
        ..Config::default()
    };
    let (first, _) = first_two_round_trips(config);
    assert_eq!(first, 4, "four packets before the first ACK");
}

/// The Rate Grant of every ACCEPT node 0 sends, in the order sent.
fn grants_of_accepts(c: &mut Cluster) -> std::rc::Rc<std::cell::RefCell<Vec<u32>>> {
    let grants = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = grants.clone();
    c.tamper = Some(Box::new(move |from, bytes| {
        if from == 0 {
            if let Ok((r, _)) = metaroce_core::wire::parse(bytes) {
                if let metaroce_core::wire::Body::Accept(a) = r.body {
                    seen.borrow_mut().push(a.rate_grant_mbps());
                }
            }
        }
        false
    }));
    grants
}

#[test]
fn accepts_grant_the_kth_of_senders_starting_together_at_most_a_kth_of_the_link() {
    // Spec 4.10.6: half-open connections count as active senders, so
    // among senders that connect at once the k-th accepted is granted at
    // most link / k.
    let config = Config::default();
    let mut c = Cluster::new(5, config, Impairments::default(), 3);
    let grants = grants_of_accepts(&mut c);
    let peer = c.addr(0);
    const PART: u32 = 64 << 10;
    let dst = c.register(0, DST, u64::from(4 * PART), Access::REMOTE_WRITE);
    // A microsecond apart, each with a WRITE to send: each is accepted
    // while the earlier ones are half open or sending.
    for i in 1..5 {
        let src = c.register(i, SRC, u64::from(PART), Access::LOCAL_WRITE);
        let now = c.now;
        let a = c.nodes[i].ep.connect(now, peer, 0).expect("connect");
        let wr = WorkRequest {
            id: 1,
            op: Op::Write {
                remote: MemoryTarget {
                    key: dst,
                    addr: DST + u64::from(PART) * (i as u64 - 1),
                },
            },
            local: c.local(src, SRC, PART),
        };
        c.nodes[i].ep.post_send(a, wr).expect("post");
        c.run_until(now + Duration::from_micros(1), |_| false);
    }
    c.run_until(c.now + Duration::from_millis(1), |c| {
        c.nodes[0]
            .events
            .iter()
            .filter(|e| matches!(e, metaroce_core::Event::Incoming { .. }))
            .count()
            == 4
    });
    let grants = grants.borrow().clone();
    println!("grants: {grants:?}");
    assert!(grants.len() >= 4, "{grants:?}");
    for (k, g) in grants.iter().take(4).enumerate() {
        assert!(
            *g > 0 && *g <= config.link_rate_mbps / (k as u32 + 1),
            "ACCEPT {k}: grant {g} of {grants:?}"
        );
    }
}

#[test]
fn a_receiver_without_hints_grants_nothing() {
    let config = Config {
        rate_hints: false,
        ..Config::default()
    };
    let mut c = Cluster::new(2, config, Impairments::default(), 3);
    let grants = grants_of_accepts(&mut c);
    c.connect(1, 0);
    assert_eq!(*grants.borrow(), vec![0]);
}
