//! Address tokens (spec 4.2.5) on a virtual clock: an acceptor hands a
//! validated initiator a NEW_TOKEN; that initiator's next connection from
//! the same address skips the RETRY; the token from another address, or
//! past its lifetime, draws a RETRY and the handshake completes as
//! without one.

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{PeerAddr, RxMeta};
use metaroce_core::wire::{self, Body};
use metaroce_core::Config;
use smoltcp::wire::{IpAddress, Ipv4Address};

fn cluster(config: Config) -> Cluster {
    let layout = metaroce_core::Layout::for_connections(8);
    Cluster::with_nodes(
        &[config, config, config],
        layout,
        ARENA_LEN,
        Impairments::default(),
        7,
    )
}

/// Connects node 0 to node 1, then closes and releases both ends.
fn connect_and_close(c: &mut Cluster) {
    let (a, _) = c.connect(0, 1);
    c.nodes[0].ep.close(c.now, a).unwrap();
    c.run_until(c.now + Duration::from_millis(20), |_| false);
    for n in &mut c.nodes {
        let handles: Vec<_> = n.ep.handles().collect();
        for h in handles {
            n.ep.release(h).expect("closed");
        }
    }
}

#[test]
fn the_next_connection_from_the_same_address_skips_the_retry() {
    let mut c = cluster(Config::default());
    c.log = Some(Vec::new());
    connect_and_close(&mut c);
    let d = c.nodes[1].ep.drops();
    // Two RETRYs: one for each copy of the CONNECT (spec 4.2 step 2).
    assert_eq!(d.retries_sent, 2, "the first contact pays the cookie");
    assert_eq!(d.tokens_issued, 1);
    let tokens = c
        .log
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(n, _, p)| *n == 1 && matches!(wire::parse(p).unwrap().0.body, Body::NewToken(_)))
        .count();
    assert_eq!(tokens, 1, "one NEW_TOKEN per connection");
    connect_and_close(&mut c);
    let d = c.nodes[1].ep.drops();
    assert_eq!(d.retries_sent, 2, "no RETRY the second time: {d:?}");
    // The second copy is a duplicate of the connection the first made.
    assert_eq!(d.token_taken, 1);
    assert_eq!(d.token_invalid, 0);
}

#[test]
fn a_token_from_another_address_draws_a_retry() {
    let mut c = cluster(Config::default());
    connect_and_close(&mut c);
    c.log = Some(Vec::new());
    connect_and_close(&mut c);
    // Node 0's second CONNECT carries its token; node 2 sends it as its
    // own (the offer is node 0's, but the cookie field is what counts).
    let connect = c
        .log
        .take()
        .unwrap()
        .into_iter()
        .find(|(n, _, p)| *n == 0 && matches!(wire::parse(p).unwrap().0.body, Body::Connect(_)))
        .expect("a CONNECT");
    let before = c.nodes[1].ep.drops();
    let meta = RxMeta {
        source: PeerAddr {
            ip: IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 3)),
            port: connect.1,
        },
        ce: false,
    };
    let now = c.now;
    let node = &mut c.nodes[1];
    node.ep.handle_packet(now, &meta, &connect.2, &mut node.mem);
    let d = c.nodes[1].ep.drops();
    assert_eq!(d.token_invalid, before.token_invalid + 1);
    assert_eq!(
        d.retries_sent,
        before.retries_sent + 1,
        "answered with a RETRY"
    );
    assert_eq!(d.token_taken, before.token_taken, "nothing taken");
}

#[test]
fn an_expired_token_draws_a_retry_and_the_handshake_completes() {
    let config = Config {
        token_lifetime: Duration::from_secs(2),
        ..Config::default()
    };
    let mut c = cluster(config);
    connect_and_close(&mut c);
    // Three lifetimes later: the token's secret is two periods gone.
    c.now += Duration::from_secs(6);
    connect_and_close(&mut c);
    let d = c.nodes[1].ep.drops();
    assert!(d.token_invalid >= 1, "{d:?}");
    assert_eq!(d.retries_sent, 4, "the cookie round trip again");
}

#[test]
fn an_acceptor_without_tokens_hands_out_none() {
    let config = Config {
        token_lifetime: Duration::ZERO,
        ..Config::default()
    };
    let mut c = cluster(config);
    connect_and_close(&mut c);
    connect_and_close(&mut c);
    let d = c.nodes[1].ep.drops();
    assert_eq!(d.tokens_issued, 0);
    assert_eq!(d.retries_sent, 4);
}
