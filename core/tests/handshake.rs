//! The handshake that gives an unverified peer nothing (spec 4.2, 5.1.4)
//! and connections that ride through outages (spec 4.6.4, 4.11): RETRY and
//! cookies, per-source limits, anti-amplification, connect retries and
//! the ride-through by time, timer profiles.

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, ConnHandle, Memory, Op, PeerAddr, RxMeta, Status, WorkRequest};
use metaroce_core::config::{AddressValidation, SourceLimits};
use metaroce_core::wire::{self, Body, MemoryTarget, TimerProfile, COOKIE_LEN};
use metaroce_core::{Config, ConnState, Event, Instant};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngAlgorithm, RngSeed};
use smoltcp::wire::{IpAddress, Ipv4Address};

struct NoMemory;

impl Memory for NoMemory {
    fn write(&mut self, _: u64, _: &[u8]) {}
    fn read(&mut self, _: u64, _: &mut [u8]) {}
}

const CONNECT_LEN: usize = 96;
const RETRY_LEN: usize = 64;
const CLOSE_LEN: usize = 36;

/// A CONNECT from a made-up initiator.
fn connect_repr(id: u32, token: u64, cookie: [u8; COOKIE_LEN]) -> wire::Repr {
    wire::Repr {
        header: wire::Header {
            flags: wire::Flags::NONE,
            dst_conn: 0,
            token: 0,
            psn: 0,
            path: 0,
            timestamp: 0,
        },
        body: Body::Connect(wire::ConnectRepr {
            src_conn: id,
            src_token: token,
            mtu: 4096,
            max_paths: 4,
            window: 256,
            initial_psn: 7,
            reply_port: 4795,
            timer_profile: TimerProfile::DataCenter,
            suite: wire::CipherSuite::None,
            key_id: 0,
            cookie,
        }),
        payload_len: 0,
    }
}

fn encode(repr: &wire::Repr) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &[]);
    buf
}

fn meta(ip: [u8; 4], port: u16) -> RxMeta {
    RxMeta {
        source: PeerAddr {
            ip: IpAddress::Ipv4(Ipv4Address::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        },
        ce: false,
    }
}

/// An acceptor driven by hand: hands it packets, collects what it sends.
struct Acceptor {
    ep: Ep,
    now: Instant,
    buf: Vec<u8>,
}

/// One packet the acceptor sent.
#[derive(Debug, Clone)]
struct Sent {
    to: PeerAddr,
    len: usize,
    repr: wire::Repr,
}

impl Acceptor {
    fn new(config: Config, capacity: u32) -> Acceptor {
        Acceptor {
            ep: endpoint(config, capacity, 77),
            now: Instant::from_micros(1),
            buf: vec![0; 9300],
        }
    }

    fn deliver(&mut self, m: &RxMeta, bytes: &[u8]) -> Vec<Sent> {
        self.ep.handle_packet(self.now, m, bytes, &mut NoMemory);
        self.drain()
    }

    fn drain(&mut self) -> Vec<Sent> {
        let mut out = Vec::new();
        while let Some(t) = self.ep.poll_transmit(self.now, &mut self.buf) {
            let len = metaroce_core::finish_packet(&t, &mut self.buf, &mut NoMemory);
            let (repr, _) =
                wire::parse(&self.buf[..len]).expect("the acceptor sends valid packets");
            out.push(Sent {
                to: t.peer,
                len,
                repr,
            });
        }
        out
    }

    /// The cookie of the one RETRY in `sent`.
    fn cookie(sent: &[Sent]) -> [u8; COOKIE_LEN] {
        assert_eq!(sent.len(), 1, "{sent:?}");
        match sent[0].repr.body {
            Body::Retry(r) => r.cookie,
            _ => panic!("expected a RETRY, got {:?}", sent[0].repr),
        }
    }
}

fn is_accept(sent: &[Sent]) -> bool {
    sent.len() == 1 && matches!(sent[0].repr.body, Body::Accept(_))
}

fn is_reject(sent: &[Sent]) -> bool {
    sent.len() == 1
        && matches!(
            sent[0].repr.body,
            Body::Close(wire::CloseRepr {
                reason: wire::CloseReason::Rejected
            })
        )
}

#[test]
fn a_first_connect_gets_a_smaller_retry_and_creates_nothing() {
    let mut a = Acceptor::new(Config::default(), 8);
    let m = meta([10, 1, 0, 1], 51_000);
    let connect = encode(&connect_repr(0x4242, 0x1234_5678_9abc, [0; COOKIE_LEN]));
    assert_eq!(connect.len(), CONNECT_LEN);
    let sent = a.deliver(&m, &connect);
    let cookie = Acceptor::cookie(&sent);
    let retry = &sent[0];
    assert_eq!(retry.len, RETRY_LEN);
    assert!(retry.len < connect.len());
    assert_eq!(retry.repr.header.dst_conn, 0x4242, "the CONNECT's id");
    assert_eq!(retry.repr.header.token, 0x1234_5678_9abc, "and its token");
    assert_eq!(retry.repr.header.psn, 0);
    assert_eq!(retry.to.port, 4795, "to the Reply Port");
    assert_eq!(a.ep.live_connections(), 0);
    assert_eq!(a.ep.half_open(), 0);
    assert!(a.ep.poll_event().is_none(), "no Incoming");
    assert_eq!(a.ep.drops().connect_unverified, 1);
    assert_eq!(a.ep.drops().retries_sent, 1);
    // The CONNECT repeated with the cookie creates the connection and is
    // answered with an ACCEPT; repeats of it get the same ACCEPT.
    let with_cookie = encode(&connect_repr(0x4242, 0x1234_5678_9abc, cookie));
    let first = a.deliver(&m, &with_cookie);
    assert!(is_accept(&first), "{first:?}");
    assert_eq!(
        first[0].len, CONNECT_LEN,
        "ACCEPT is no larger than CONNECT"
    );
    assert_eq!(a.ep.live_connections(), 1);
    assert_eq!(a.ep.half_open(), 1);
    for _ in 0..3 {
        let again = a.deliver(&m, &with_cookie);
        assert!(is_accept(&again));
        assert_eq!(again[0].repr.body, first[0].repr.body, "the same ACCEPT");
    }
    // Even a repeat of the first, cookie-less CONNECT (late) finds the
    // connection: ACCEPT, to the verified address.
    let late = a.deliver(&m, &connect);
    assert!(is_accept(&late));
    assert_eq!(a.ep.live_connections(), 1);
    // Nothing is ever sent unprompted: time passes, no ACCEPT repeats.
    a.now += Duration::from_millis(500);
    a.ep.handle_timeout(a.now);
    assert!(a.drain().is_empty());
    // The confirmation establishes it and ends the half-open count.
    let ka = wire::Repr {
        header: wire::Header {
            flags: wire::Flags::NONE,
            dst_conn: match first[0].repr.body {
                Body::Accept(x) => x.src_conn,
                _ => unreachable!(),
            },
            token: match first[0].repr.body {
                Body::Accept(x) => x.src_token,
                _ => unreachable!(),
            },
            psn: 0,
            path: 0,
            timestamp: 0,
        },
        body: Body::Keepalive,
        payload_len: 0,
    };
    a.deliver(&m, &encode(&ka));
    assert_eq!(a.ep.half_open(), 0);
    assert_eq!(a.ep.half_open_from(&m.source.ip), 0);
}

#[test]
fn a_cookie_from_another_address_or_port_or_offer_or_expired_is_refused() {
    let config = Config::default();
    let mut a = Acceptor::new(config, 8);
    let m = meta([10, 1, 0, 1], 51_000);
    let first = encode(&connect_repr(0x77, 0x99, [0; COOKIE_LEN]));
    let cookie = Acceptor::cookie(&a.deliver(&m, &first));
    let with_cookie = encode(&connect_repr(0x77, 0x99, cookie));
    // Another source port, another address, another offer: each gets a
    // new RETRY and creates nothing.
    for (from, bytes) in [
        (meta([10, 1, 0, 1], 51_001), with_cookie.clone()),
        (meta([10, 1, 0, 2], 51_000), with_cookie.clone()),
        (m, encode(&connect_repr(0x78, 0x99, cookie))),
        (m, encode(&connect_repr(0x77, 0x98, cookie))),
    ] {
        let sent = a.deliver(&from, &bytes);
        Acceptor::cookie(&sent);
        assert_eq!(a.ep.live_connections(), 0);
    }
    assert_eq!(a.ep.drops().cookie_invalid, 4);
    // A broken tag.
    let mut bad = cookie;
    bad[31] ^= 1;
    Acceptor::cookie(&a.deliver(&m, &encode(&connect_repr(0x77, 0x99, bad))));
    assert_eq!(a.ep.drops().cookie_invalid, 5);
    // Past the lifetime it is refused as expired.
    a.now += config.cookie_lifetime + Duration::from_secs(2);
    let sent = a.deliver(&m, &with_cookie);
    let fresh = Acceptor::cookie(&sent);
    assert_eq!(a.ep.drops().cookie_expired, 1);
    assert_eq!(a.ep.live_connections(), 0);
    // The fresh one works.
    let sent = a.deliver(&m, &encode(&connect_repr(0x77, 0x99, fresh)));
    assert!(is_accept(&sent), "{sent:?}");
    assert_eq!(a.ep.live_connections(), 1);
}

#[test]
fn a_connect_flood_from_many_addresses_creates_no_state() {
    let mut a = Acceptor::new(Config::default(), 64);
    let mut replies = 0u64;
    let mut reply_bytes = 0u64;
    let mut flood_bytes = 0u64;
    // 100,000 CONNECTs from 1,000 addresses, polled in batches of 64: the
    // stateless queue (16) answers what it holds, the rest is counted.
    for i in 0..100_000u32 {
        let m = meta([172, 16, (i % 1000 / 250) as u8, (i % 250) as u8], 40_000);
        let bytes = encode(&connect_repr(
            0x10_0000 + i,
            0xdead_0000_0000 + u64::from(i),
            [0; COOKIE_LEN],
        ));
        flood_bytes += bytes.len() as u64;
        a.ep.handle_packet(a.now, &m, &bytes, &mut NoMemory);
        if i % 64 == 63 {
            for s in a.drain() {
                assert!(matches!(s.repr.body, Body::Retry(_)), "{s:?}");
                assert!(s.len < CONNECT_LEN);
                replies += 1;
                reply_bytes += s.len as u64;
            }
            a.now += Duration::from_micros(10);
        }
        // A legitimate peer connects in the middle of it (between two
        // polls: with the queue full it would get its RETRY a little later
        // on a repeated CONNECT).
        if i == 50_000 {
            for s in a.drain() {
                replies += 1;
                reply_bytes += s.len as u64;
            }
            let me = meta([10, 9, 9, 9], 50_000);
            let c = encode(&connect_repr(0x5555, 0x6666, [0; COOKIE_LEN]));
            let cookie = Acceptor::cookie(&a.deliver(&me, &c));
            let sent = a.deliver(&me, &encode(&connect_repr(0x5555, 0x6666, cookie)));
            assert!(is_accept(&sent), "{sent:?}");
        }
    }
    for s in a.drain() {
        assert!(matches!(s.repr.body, Body::Retry(_)));
        replies += 1;
        reply_bytes += s.len as u64;
    }
    let d = a.ep.drops();
    assert_eq!(d.connect_unverified, 100_001);
    assert_eq!(d.retries_sent + d.replies_dropped, 100_001);
    assert_eq!(replies + 1, d.retries_sent);
    assert!(reply_bytes < flood_bytes, "no amplification");
    assert_eq!(a.ep.live_connections(), 1, "only the legitimate peer");
    assert_eq!(a.ep.half_open(), 1);
    println!(
        "flood: 100,000 CONNECTs ({flood_bytes} B) -> {replies} RETRYs ({reply_bytes} B), \
         {} not answered (queue full), {} live connections",
        d.replies_dropped,
        a.ep.live_connections()
    );
}

#[test]
fn per_source_limits_refuse_with_close_rejected_and_spare_other_sources() {
    let config = Config {
        source_limits: SourceLimits {
            connects_per_second: 10,
            half_open: 4,
        },
        ..Config::default()
    };
    let mut a = Acceptor::new(config, 64);
    let open = |a: &mut Acceptor, ip: [u8; 4], id: u32| -> Vec<Sent> {
        let m = meta(ip, 40_000);
        let c = encode(&connect_repr(id, u64::from(id) << 8, [0; COOKIE_LEN]));
        let cookie = Acceptor::cookie(&a.deliver(&m, &c));
        a.deliver(&m, &encode(&connect_repr(id, u64::from(id) << 8, cookie)))
    };
    for id in 1..=4 {
        assert!(is_accept(&open(&mut a, [10, 0, 0, 1], id)));
    }
    let refused = open(&mut a, [10, 0, 0, 1], 5);
    assert!(is_reject(&refused), "{refused:?}");
    assert_eq!(refused[0].len, CLOSE_LEN);
    assert_eq!(refused[0].repr.header.dst_conn, 5);
    assert_eq!(a.ep.drops().refused_source_half_open, 1);
    assert_eq!(a.ep.half_open_from(&IpAddress::v4(10, 0, 0, 1)), 4);
    // Another source is not affected.
    assert!(is_accept(&open(&mut a, [10, 0, 0, 2], 100)));
    // Half-open connections that end give their place back.
    a.now += config.idle_timeout + Duration::from_millis(1);
    a.ep.handle_timeout(a.now);
    a.drain();
    while let Some(e) = a.ep.poll_event() {
        if let Event::Failed { conn, .. } = e {
            a.ep.release(conn).unwrap();
        }
    }
    assert_eq!(a.ep.half_open(), 0);
    assert!(is_accept(&open(&mut a, [10, 0, 0, 1], 6)), "room again");
    // Established connections leave the half-open count, so only the rate
    // limits a source that confirms: 10 at once, then 10 a second.
    let b = Config {
        source_limits: SourceLimits {
            connects_per_second: 10,
            half_open: 0,
        },
        ..Config::default()
    };
    let mut a = Acceptor::new(b, 64);
    let mut ok = 0;
    for id in 1..=15 {
        if is_accept(&open(&mut a, [10, 0, 0, 5], id)) {
            ok += 1;
        }
    }
    assert_eq!(ok, 10);
    assert_eq!(a.ep.drops().refused_source_rate, 5);
    a.now += Duration::from_millis(100);
    assert!(
        is_accept(&open(&mut a, [10, 0, 0, 5], 50)),
        "one more after 100 ms"
    );
    assert!(is_reject(&open(&mut a, [10, 0, 0, 5], 51)));
}

#[test]
fn when_loaded_validation_starts_at_the_threshold() {
    let config = Config {
        address_validation: AddressValidation::WhenLoaded { half_open: 2 },
        ..Config::default()
    };
    let mut a = Acceptor::new(config, 8);
    for id in 1..=2 {
        let s = a.deliver(
            &meta([10, 0, 0, id as u8], 1),
            &encode(&connect_repr(id, 9, [0; COOKIE_LEN])),
        );
        assert!(is_accept(&s), "below the threshold: ACCEPT at once");
    }
    let s = a.deliver(
        &meta([10, 0, 0, 3], 1),
        &encode(&connect_repr(3, 9, [0; COOKIE_LEN])),
    );
    Acceptor::cookie(&s);
    assert_eq!(a.ep.live_connections(), 2);
}

#[test]
fn refusals_when_not_accepting_or_full_are_one_small_close_per_connect() {
    let mut a = Acceptor::new(
        Config {
            accept_incoming: false,
            ..Config::default()
        },
        8,
    );
    let s = a.deliver(
        &meta([10, 0, 0, 1], 1),
        &encode(&connect_repr(1, 2, [0; COOKIE_LEN])),
    );
    assert!(is_reject(&s));
    assert!(s[0].len < CONNECT_LEN);
    assert_eq!(a.ep.drops().refused, 1);
    assert_eq!(a.ep.drops().rejects_sent, 1);
}

/// Two endpoints on the virtual-clock channel, a transfer of `msgs`
/// WRITEs of `len` bytes from node 0 to node 1; `during` runs after every
/// step and may change the channel (blackouts). Returns the handles.
fn transfer(
    c: &mut Cluster,
    a: ConnHandle,
    msgs: u64,
    len: u32,
    limit: Duration,
    mut during: impl FnMut(&mut Cluster),
) -> Result<(), Status> {
    let src = c.register(0, ARENA_BASE, 1 << 20, Access::LOCAL_WRITE);
    let dst = c.register(1, ARENA_BASE, 1 << 20, Access::REMOTE_WRITE);
    for i in 0..(1usize << 20) {
        c.nodes[0].mem.bytes[i] = pattern(9, 0, i);
    }
    let slots = (1u64 << 20) / u64::from(len);
    let mut posted = 0u64;
    let mut done = 0u64;
    let deadline = c.now + limit;
    while done < msgs {
        while posted < msgs && posted - done < 8 {
            let off = (posted % slots) * u64::from(len);
            let wr = WorkRequest {
                id: posted,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: dst,
                        addr: ARENA_BASE + off,
                    },
                },
                local: c.local(src, ARENA_BASE + off, len),
            };
            if c.nodes[0].ep.post_send(a, wr).is_err() {
                break;
            }
            posted += 1;
        }
        if !c.step() || c.now > deadline {
            panic!("transfer stalled at {done} of {msgs}");
        }
        during(c);
        for comp in std::mem::take(&mut c.nodes[0].completions) {
            if comp.status != Status::Success {
                return Err(comp.status);
            }
            done += 1;
        }
    }
    let n = (msgs.min(slots) * u64::from(len)) as usize;
    assert_eq!(
        fnv(&c.nodes[0].mem.bytes[..n]),
        fnv(&c.nodes[1].mem.bytes[..n]),
        "integrity"
    );
    Ok(())
}

/// A blackout of `length` starting `after` into a transfer.
fn blackout_transfer(config: Config, after: Duration, length: Duration) -> Result<(), Status> {
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 5);
    let (a, _) = c.connect(0, 1);
    let start = c.now + after;
    let end = start + length;
    transfer(
        &mut c,
        a,
        400,
        4096,
        length * 3 + Duration::from_secs(1),
        |c| {
            c.imp.loss = if c.now >= start && c.now < end {
                1.0
            } else {
                0.0
            };
        },
    )
}

#[test]
fn a_blackout_shorter_than_the_ride_through_is_survived() {
    // Data centre timers: RTO at most 50 ms, ride-through 1 s: 800 ms of
    // blackout are 16 and more timeouts in a row, which the count-based
    // limit (12) used to fail.
    let config = Config::default();
    blackout_transfer(
        config,
        Duration::from_micros(300),
        Duration::from_millis(800),
    )
    .expect("rides through 800 ms");
    let emulation = Config::for_emulation();
    blackout_transfer(emulation, Duration::from_millis(30), Duration::from_secs(9))
        .expect("rides through 9 s with the emulation profile");
}

#[test]
fn a_blackout_longer_than_the_ride_through_fails_by_time() {
    let config = Config {
        ride_through: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 6);
    let (a, _) = c.connect(0, 1);
    let start = c.now + Duration::from_micros(200);
    let mut failed_at = None;
    let r = transfer(&mut c, a, 400, 4096, Duration::from_secs(2), |c| {
        if c.now >= start {
            c.imp.loss = 1.0;
        }
        if failed_at.is_none() && c.nodes[0].ep.state(a) == Some(ConnState::Error) {
            failed_at = Some(c.now);
        }
    });
    assert_eq!(r, Err(Status::RetryExceeded));
    let took = failed_at.expect("failed") - start;
    assert!(
        took >= Duration::from_millis(290) && took <= Duration::from_millis(300) + config.rto_max,
        "failed after {took:?}"
    );
}

#[test]
fn connect_rides_through_a_burst_of_losses_and_gives_up_at_the_connect_timeout() {
    let config = Config::for_emulation();
    // Everything lost for 6 s, then the handshake completes.
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 7);
    c.imp.loss = 1.0;
    let (now, peer) = (c.now, c.addr(1));
    let h = c.nodes[0].ep.connect(now, peer, 0).unwrap();
    let until = c.now + Duration::from_secs(6);
    c.run_until(until, |_| false);
    assert_eq!(c.nodes[0].ep.state(h), Some(ConnState::Connecting));
    c.imp.loss = 0.0;
    let until = c.now + config.handshake_timeout_max * 2;
    assert!(c.run_until(until, |c| c.nodes[0].ep.state(h)
        == Some(ConnState::Established)));
    // With nobody answering it fails at the connect timeout.
    c.imp.loss = 1.0;
    let start = c.now;
    let (now, peer) = (c.now, c.addr(1));
    let h = c.nodes[0].ep.connect(now, peer, 0).unwrap();
    let until = start + config.connect_timeout + Duration::from_secs(1);
    c.run_until(until, |c| c.nodes[0].ep.state(h) == Some(ConnState::Error));
    let took = c.now - start;
    assert!(
        took >= config.connect_timeout && took <= config.connect_timeout + Duration::from_millis(1),
        "failed after {took:?}"
    );
    assert!(c.nodes[0].events.iter().any(|e| matches!(
        e,
        Event::Failed { conn, status: Status::RetryExceeded } if *conn == h
    )));
}

#[test]
fn a_forged_or_second_retry_is_ignored() {
    let config = Config::default();
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 8);
    // Hold node 1's answers back to look at the CONNECT.
    c.imp.loss = 1.0;
    let (now, peer) = (c.now, c.addr(1));
    let h = c.nodes[0].ep.connect(now, peer, 0).unwrap();
    let mut buf = vec![0u8; 256];
    let t = c.nodes[0].ep.poll_transmit(c.now, &mut buf).unwrap();
    let len = metaroce_core::finish_packet(&t, &mut buf, &mut NoMemory);
    let (connect, _) = wire::parse(&buf[..len]).unwrap();
    let Body::Connect(offer) = connect.body else {
        panic!("not a CONNECT")
    };
    let retry = |dst_conn: u32, token: u64, cookie: [u8; COOKIE_LEN]| {
        encode(&wire::Repr {
            header: wire::Header {
                flags: wire::Flags::NONE,
                dst_conn,
                token,
                psn: 0,
                path: 0,
                timestamp: 0,
            },
            body: Body::Retry(wire::RetryRepr { cookie }),
            payload_len: 0,
        })
    };
    let from_b = RxMeta {
        source: c.addr(1),
        ce: false,
    };
    let elsewhere = meta([10, 0, 0, 99], 4795);
    let now = c.now;
    let n0 = &mut c.nodes[0];
    // Wrong token, wrong id, wrong source: dropped and counted.
    n0.ep.handle_packet(
        now,
        &from_b,
        &retry(offer.src_conn, offer.src_token ^ 1, [1; 32]),
        &mut NoMemory,
    );
    n0.ep.handle_packet(
        now,
        &from_b,
        &retry(offer.src_conn ^ 0x100, offer.src_token, [1; 32]),
        &mut NoMemory,
    );
    n0.ep.handle_packet(
        now,
        &elsewhere,
        &retry(offer.src_conn, offer.src_token, [1; 32]),
        &mut NoMemory,
    );
    let d = n0.ep.drops();
    assert_eq!((d.bad_token, d.unknown_connection, d.bad_source), (1, 1, 1));
    // The right one is taken: the CONNECT goes out again at once with it.
    n0.ep.handle_packet(
        now,
        &from_b,
        &retry(offer.src_conn, offer.src_token, [5; 32]),
        &mut NoMemory,
    );
    let t = n0
        .ep
        .poll_transmit(now, &mut buf)
        .expect("CONNECT again at once");
    let len = metaroce_core::finish_packet(&t, &mut buf, &mut NoMemory);
    let (again, _) = wire::parse(&buf[..len]).unwrap();
    let Body::Connect(again) = again.body else {
        panic!()
    };
    assert_eq!(again.cookie, [5; 32]);
    assert_eq!(
        wire::ConnectRepr {
            cookie: [0; 32],
            ..again
        },
        offer,
        "otherwise the same CONNECT"
    );
    // Its copy follows (spec 4.2 step 2).
    let t = n0.ep.poll_transmit(now, &mut buf).expect("the copy");
    let copy_len = metaroce_core::finish_packet(&t, &mut buf, &mut NoMemory);
    assert_eq!(copy_len, len);
    // A second RETRY in the same handshake (normally the answer to the
    // first CONNECT's copy) is not taken, and counted apart from drops.
    n0.ep.handle_packet(
        now,
        &from_b,
        &retry(offer.src_conn, offer.src_token, [6; 32]),
        &mut NoMemory,
    );
    assert_eq!(n0.ep.drops().retry_duplicate, 1);
    assert_eq!(n0.ep.drops().retry_ignored, 0);
    assert!(n0.ep.poll_transmit(now, &mut buf).is_none());
    // An all-zero cookie is never taken: ignored, counted as a drop.
    n0.ep.handle_packet(
        now,
        &from_b,
        &retry(offer.src_conn, offer.src_token, [0; 32]),
        &mut NoMemory,
    );
    assert_eq!(n0.ep.drops().retry_ignored, 1);
    assert_eq!(n0.ep.state(h), Some(ConnState::Connecting));
}

fn pt(cases: u32) -> PtConfig {
    PtConfig {
        cases,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x4a5d),
        ..PtConfig::default()
    }
}

proptest! {
    #![proptest_config(pt(24))]

    /// The handshake with its RETRY through a channel that loses,
    /// reorders and duplicates: both ends establish, the acceptor makes
    /// one connection only, and data flows.
    #[test]
    fn handshake_with_retry_through_a_lossy_reordering_duplicating_channel(
        seed in any::<u64>(),
        loss in 0.0f64..0.4,
        duplicate in 0.0f64..0.3,
        reorder in 0.0f64..0.5,
    ) {
        let imp = Impairments {
            loss,
            duplicate,
            reorder,
            reorder_extra: Duration::from_micros(400),
            ..Impairments::default()
        };
        let mut c: Cluster = Cluster::new(2, Config::default(), imp, seed);
        let (now, peer) = (c.now, c.addr(1));
    let h = c.nodes[0].ep.connect(now, peer, 0).unwrap();
        let until = c.now + Duration::from_millis(900);
        let ok = c.run_until(until, |c| {
            c.nodes[0].ep.state(h) == Some(ConnState::Established)
                && c.nodes[1].ep.handles().any(|x| c.nodes[1].ep.state(x) == Some(ConnState::Established))
        });
        prop_assert!(ok, "not established: {:?} {:?}", c.nodes[0].ep.state(h), c.nodes[1].ep.drops());
        prop_assert_eq!(c.nodes[1].ep.live_connections(), 1);
        prop_assert_eq!(c.nodes[1].ep.half_open(), 0);
        prop_assert!(c.nodes[1].ep.drops().retries_sent >= 1);
        prop_assert_eq!(c.nodes[1].ep.drops().cookie_invalid, 0);
        let incoming = c.nodes[1].events.iter().filter(|e| matches!(e, Event::Incoming { .. })).count();
        prop_assert_eq!(incoming, 1);
        c.imp.loss = loss.min(0.1);
        let r = transfer(&mut c, h, 20, 3000, Duration::from_secs(5), |_| {});
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}

#[test]
fn peers_of_another_timer_profile_wait_as_long_as_the_peer_expects() {
    // A data-centre endpoint connects to an emulation one: both keep the
    // connection through 5 s of silence (the emulation idle timeout, 10
    // s, not the data centre's 1 s), on both sides.
    let mut c: Cluster = Cluster::new(2, Config::default(), Impairments::default(), 11);
    let emu = Config {
        udp_port: wire::DEFAULT_UDP_PORT,
        ..Config::for_emulation()
    };
    c.nodes[1].ep = endpoint(emu, 8, 12);
    let (a, b) = c.connect(0, 1);
    let dc = Config::default();
    let ca = *c.nodes[0].ep.connection(a).unwrap();
    let cb = *c.nodes[1].ep.connection(b).unwrap();
    assert_eq!(ca.peer_profile(), TimerProfile::Emulation);
    assert_eq!(cb.peer_profile(), TimerProfile::DataCenter);
    assert_eq!(ca.idle_timeout(&dc), Duration::from_secs(10));
    assert_eq!(ca.ride_through(&dc), Duration::from_secs(10));
    assert_eq!(cb.idle_timeout(&emu), Duration::from_secs(10));
    c.imp.loss = 1.0;
    let until = c.now + Duration::from_secs(5);
    c.run_until(until, |_| false);
    c.imp.loss = 0.0;
    let until = c.now + Duration::from_secs(1);
    c.run_until(until, |_| false);
    assert_eq!(c.nodes[0].ep.state(a), Some(ConnState::Established));
    assert_eq!(c.nodes[1].ep.state(b), Some(ConnState::Established));
    // Same profile: the configuration stands (a shorter idle timeout).
    let short = Config {
        idle_timeout: Duration::from_millis(300),
        ..Config::default()
    };
    let mut c: Cluster = Cluster::new(2, short, Impairments::default(), 13);
    let (a, _) = c.connect(0, 1);
    assert_eq!(
        c.nodes[0].ep.connection(a).unwrap().idle_timeout(&short),
        Duration::from_millis(300)
    );
}

#[test]
fn an_initiator_short_of_cookie_slots_takes_a_later_retry() {
    // One cookie slot for four handshakes at once: the RETRYs that find it
    // taken are not taken (counted), the CONNECTs are repeated, and every
    // connection comes up.
    let config = Config::default();
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 21);
    let layout = metaroce_core::Layout {
        cookies: 1,
        ..metaroce_core::Layout::for_connections(8)
    };
    c.nodes[0].ep = metaroce_core::Endpoint::new(
        config,
        storage(&layout),
        metaroce_core::rng::seed_from_u64(22),
    );
    let (now, peer) = (c.now, c.addr(1));
    let handles: Vec<ConnHandle> = (0..4)
        .map(|_| c.nodes[0].ep.connect(now, peer, 0).unwrap())
        .collect();
    let until = c.now + Duration::from_millis(200);
    let ok = c.run_until(until, |c| {
        handles
            .iter()
            .all(|h| c.nodes[0].ep.state(*h) == Some(ConnState::Established))
    });
    assert!(ok, "{:?}", c.nodes[0].ep.pool_refusals());
    assert!(c.nodes[0].ep.pool_refusals().cookies >= 3);
    assert_eq!(c.nodes[1].ep.live_connections(), 4);
}

/// Steps the initiator `ep` alone in 1 us ticks from `from` to `until`: the
/// times since `start` at which it sent a CONNECT; `offer` keeps the last.
fn connects_sent(
    ep: &mut Ep,
    start: Instant,
    from: Instant,
    until: Instant,
    offer: &mut Option<wire::ConnectRepr>,
) -> Vec<Duration> {
    let mut buf = vec![0u8; 256];
    let mut sent = Vec::new();
    let mut now = from;
    while now <= until {
        ep.handle_timeout(now);
        let mut copies: Vec<Vec<u8>> = Vec::new();
        while let Some(t) = ep.poll_transmit(now, &mut buf) {
            let len = metaroce_core::finish_packet(&t, &mut buf, &mut NoMemory);
            if let Body::Connect(o) = wire::parse(&buf[..len]).unwrap().0.body {
                *offer = Some(o);
                copies.push(buf[..len].to_vec());
            }
        }
        if !copies.is_empty() {
            // Spec 4.2 step 2: every CONNECT goes out twice, back to back.
            assert_eq!(copies.len(), 2, "CONNECTs at {now:?}");
            assert_eq!(copies[0], copies[1], "the copy is the same packet");
            sent.push(now.saturating_duration_since(start));
        }
        now += Duration::from_micros(1);
    }
    sent
}

/// A RETRY with `cookie` answering the CONNECT that made `offer`.
fn retry_for(offer: &wire::ConnectRepr, cookie: [u8; COOKIE_LEN]) -> Vec<u8> {
    encode(&wire::Repr {
        header: wire::Header {
            flags: wire::Flags::NONE,
            dst_conn: offer.src_conn,
            token: offer.src_token,
            psn: 0,
            path: 0,
            timestamp: 0,
        },
        body: Body::Retry(wire::RetryRepr { cookie }),
        payload_len: 0,
    })
}

#[test]
fn a_retry_restarts_the_handshake_timer_at_its_first_interval() {
    let config = Config::default();
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 8);
    let (start, peer) = (c.now, c.addr(1));
    let n0 = &mut c.nodes[0];
    n0.ep.connect(start, peer, 0).unwrap();
    let mut offer = None;
    // Unanswered, the interval doubles: the third CONNECT comes at least
    // three first intervals after the first.
    let retry_at = start + Duration::from_micros(400);
    let before = connects_sent(&mut n0.ep, start, start, retry_at, &mut offer);
    assert!(before.len() >= 3, "{before:?}");
    assert!(before[2] - before[1] > before[1] - before[0], "{before:?}");
    let offer = offer.unwrap();
    let retry = retry_for(&offer, [5; 32]);
    let from_b = RxMeta {
        source: peer,
        ce: false,
    };
    let now = retry_at + Duration::from_micros(1);
    n0.ep.handle_packet(now, &from_b, &retry, &mut NoMemory);
    // The CONNECT with the cookie goes out at once; lost, the next one
    // follows after the first interval again, not a doubled one (spec 4.2
    // step 4).
    let after = connects_sent(
        &mut n0.ep,
        start,
        now,
        now + Duration::from_micros(200),
        &mut None,
    );
    let since = now.saturating_duration_since(start);
    assert_eq!(after.first(), Some(&since), "{after:?}");
    let gap = after[1] - after[0];
    assert!(
        gap <= config.handshake_timeout + Duration::from_micros(2),
        "after the RETRY the next CONNECT came {gap:?} later: {after:?} (before it: {before:?})"
    );
}

/// The RETRY of a CONNECT sent once measures the round trip: the CONNECT
/// with the cookie, lost, is repeated after three of those round trips
/// (not the 25 us sized for a path nothing was known of) (spec 4.2 step
/// 4).
#[test]
fn a_retry_sets_the_next_interval_from_the_round_trip_it_measured() {
    let config = Config::default();
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 9);
    let (start, peer) = (c.now, c.addr(1));
    let n0 = &mut c.nodes[0];
    n0.ep.connect(start, peer, 0).unwrap();
    let mut offer = None;
    // The RETRY comes 4 us after the one CONNECT.
    let retry_at = start + Duration::from_micros(4);
    let before = connects_sent(
        &mut n0.ep,
        start,
        start,
        retry_at - Duration::from_micros(1),
        &mut offer,
    );
    assert_eq!(before, [Duration::ZERO]);
    let offer = offer.unwrap();
    let retry = retry_for(&offer, [6; 32]);
    let from_b = RxMeta {
        source: peer,
        ce: false,
    };
    n0.ep
        .handle_packet(retry_at, &from_b, &retry, &mut NoMemory);
    let after = connects_sent(
        &mut n0.ep,
        start,
        retry_at,
        retry_at + Duration::from_micros(60),
        &mut None,
    );
    let us = |d: &Duration| d.as_micros() as u64;
    let at: Vec<u64> = after.iter().map(us).collect();
    // At once, then 12 us (3 x 4) later; after that the handshake timer
    // doubles as in step 2 (the next one is 100 us away).
    assert_eq!(at, [4, 16], "CONNECTs at {at:?} us");
    assert!(config.handshake_timeout > Duration::from_micros(12));
}

/// Unanswered, the CONNECT is repeated after the first interval, then
/// after twice it, four times it, ... (spec 4.2 step 2: the timer doubles
/// per repeat). Before, the second repeat waited four first intervals
/// (25, 100, 200 us): at 10 % loss per path a 64-flow permutation's
/// slowest flow spent 741 us in its handshake.
#[test]
fn unanswered_connects_double_from_the_first_interval() {
    let config = Config::default();
    let mut c: Cluster = Cluster::new(2, config, Impairments::default(), 10);
    let (start, peer) = (c.now, c.addr(1));
    let ep = &mut c.nodes[0].ep;
    ep.connect(start, peer, 0).unwrap();
    let until = start + Duration::from_micros(400);
    let sent: Vec<u64> = connects_sent(ep, start, start, until, &mut None)
        .iter()
        .map(|d| d.as_micros() as u64)
        .collect();
    let first = config.handshake_timeout.as_micros() as u64;
    assert_eq!(
        sent,
        [0, first, 3 * first, 7 * first, 15 * first],
        "CONNECTs at {sent:?} us"
    );
}
