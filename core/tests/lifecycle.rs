//! The connection table under churn (spec 4.14): connections that come
//! and go, fail, and are released by the application; stale handles; slots
//! and pool entries that must all come back.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::*;
use metaroce_core::api::{Access, ConnHandle, LocalBuf, Op, PeerAddr, RxMeta, Status, WorkRequest};
use metaroce_core::wire::{self, MemoryTarget};
use metaroce_core::{CommandError, Config, ConnState, Endpoint, Event, Instant};
use smoltcp::wire::{IpAddress, Ipv4Address};

const SRC: u64 = ARENA_BASE;
const DST: u64 = ARENA_BASE;
const SPAN: u64 = 1 << 20;

/// What the test knows of one connection of the initiating node.
#[derive(Debug, Default)]
struct Tracked {
    established: bool,
    ending: bool,
    /// Work requests posted and not yet completed.
    outstanding: BTreeSet<u64>,
    /// A bad-key WRITE was posted: the connection is meant to fail.
    poisoned: bool,
}

/// Hundreds of connections with random lifetimes (connect, transfer under
/// loss, close, fail, release, reuse): no handle ever names two
/// connections, every work request completes exactly once, and when all is
/// done every slot and every pool entry is back.
#[test]
fn random_lifetimes_never_alias_lose_or_leak() {
    for seed in 1..=4u64 {
        random_lifetimes(seed);
    }
}

fn random_lifetimes(seed: u64) {
    let config = Config {
        mtu: 1024,
        // A poisoned connection whose peer released its end hears nothing
        // more: it fails after the ride-through, within the wind-down.
        ride_through: Duration::from_millis(20),
        ..Config::default()
    };
    let imp = Impairments {
        loss: 0.03,
        reorder: 0.1,
        duplicate: 0.01,
        ..Impairments::default()
    };
    // 48 slots: connections outnumber them over the run, so slots are reused.
    let mut c: Cluster = Cluster::with_capacity(2, 48, config, imp, seed);
    let src = c.register(0, SRC, SPAN, Access::LOCAL_WRITE);
    let dst = c.register(1, DST, SPAN, Access::REMOTE_WRITE);
    let mut rng = TestRng::new(seed ^ 0xc0ffee);
    let mut conns: BTreeMap<ConnHandle, Tracked> = BTreeMap::new();
    let mut issued = [BTreeSet::new(), BTreeSet::new()];
    let mut accepted: BTreeSet<ConnHandle> = BTreeSet::new();
    let mut ending_b: Vec<ConnHandle> = Vec::new();
    let mut completed: HashMap<(ConnHandle, u64), Status> = HashMap::new();
    let mut next_wr = 1u64;
    let mut opened = 0u32;
    let tick = Duration::from_micros(50);
    let peer = c.addr(1);
    for round in 0..4_000u32 {
        let winding_down = round >= 3_000;
        // Commands on node 0.
        if !winding_down && rng.unit() < 0.3 {
            if let Ok(h) = c.nodes[0].ep.connect(c.now, peer, 0) {
                assert!(issued[0].insert(h), "handle {h} issued twice");
                conns.insert(h, Tracked::default());
                opened += 1;
            }
        }
        let handles: Vec<ConnHandle> = conns.keys().copied().collect();
        for h in handles {
            let t = conns.get_mut(&h).unwrap();
            if !t.established || t.ending {
                continue;
            }
            let r = rng.unit();
            if winding_down || r < 0.01 {
                let _ = c.nodes[0].ep.close(c.now, h);
                t.ending = true;
                continue;
            }
            if r < 0.015 && !t.poisoned {
                // A WRITE with a key the peer never issued: fatal for both.
                let wr = WorkRequest {
                    id: next_wr,
                    op: Op::Write {
                        remote: MemoryTarget {
                            key: dst ^ 0x5a00,
                            addr: DST,
                        },
                    },
                    local: LocalBuf {
                        key: src,
                        addr: SRC,
                        len: 64,
                    },
                };
                if c.nodes[0].ep.post_send(h, wr).is_ok() {
                    t.outstanding.insert(next_wr);
                    t.poisoned = true;
                    next_wr += 1;
                }
                continue;
            }
            if t.outstanding.len() < 6 && rng.unit() < 0.5 {
                let len = 1 + rng.below(6000) as u32;
                let off = rng.below(SPAN - u64::from(len));
                let wr = WorkRequest {
                    id: next_wr,
                    op: Op::Write {
                        remote: MemoryTarget {
                            key: dst,
                            addr: DST + off,
                        },
                    },
                    local: LocalBuf {
                        key: src,
                        addr: SRC + off,
                        len,
                    },
                };
                match c.nodes[0].ep.post_send(h, wr) {
                    Ok(()) => {
                        t.outstanding.insert(next_wr);
                        next_wr += 1;
                    }
                    Err(CommandError::QueueFull | CommandError::NotOpen) => {}
                    Err(e) => panic!("post on {h}: {e:?}"),
                }
            }
        }
        let until = c.now + tick;
        c.run_until(until, |_| false);
        // Completions: each exactly once, for a request still outstanding.
        for comp in std::mem::take(&mut c.nodes[0].completions) {
            let t = conns
                .get_mut(&comp.conn)
                .unwrap_or_else(|| panic!("completion for unknown {}: {comp:?}", comp.conn));
            assert!(
                t.outstanding.remove(&comp.wr_id),
                "completion {comp:?} twice or never posted"
            );
            assert!(completed
                .insert((comp.conn, comp.wr_id), comp.status)
                .is_none());
            if comp.status != Status::Success {
                assert!(
                    t.poisoned
                        || t.ending
                        || matches!(comp.status, Status::Flushed | Status::RetryExceeded),
                    "{comp:?} on a healthy connection"
                );
            }
        }
        c.nodes[1].completions.clear();
        // Events: lifecycle of both ends.
        for e in std::mem::take(&mut c.nodes[0].events) {
            match e {
                Event::Connected(h) => conns.get_mut(&h).expect("known").established = true,
                Event::Closed { conn, .. } | Event::Failed { conn, .. } => {
                    conns.get_mut(&conn).expect("known").ending = true;
                }
                Event::Incoming { .. } => panic!("node 0 accepts nothing"),
            }
        }
        for e in std::mem::take(&mut c.nodes[1].events) {
            match e {
                Event::Incoming { conn, .. } => {
                    assert!(
                        issued[1].insert(conn),
                        "acceptor handle {conn} issued twice"
                    );
                    accepted.insert(conn);
                }
                Event::Connected(_) => {}
                Event::Closed { conn, .. } | Event::Failed { conn, .. } => ending_b.push(conn),
            }
        }
        // Releases, once each connection's completions are all in.
        let ending: Vec<ConnHandle> = conns
            .iter()
            .filter(|(_, t)| t.ending && t.outstanding.is_empty())
            .map(|(h, _)| *h)
            .collect();
        for h in ending {
            match c.nodes[0].ep.release(h) {
                Ok(()) => {
                    conns.remove(&h);
                    assert_eq!(c.nodes[0].ep.state(h), None, "a released handle is stale");
                }
                Err(CommandError::NotClosed | CommandError::NotDrained) => {}
                Err(e) => panic!("release {h}: {e:?}"),
            }
        }
        ending_b.retain(|&h| match c.nodes[1].ep.release(h) {
            Ok(()) => {
                accepted.remove(&h);
                false
            }
            Err(CommandError::NotDrained) => true,
            Err(e) => panic!("acceptor release {h}: {e:?}"),
        });
        if winding_down && conns.is_empty() && accepted.is_empty() {
            break;
        }
    }
    assert!(
        opened > 150,
        "seed {seed}: only {opened} connections opened"
    );
    assert!(conns.is_empty(), "seed {seed}: never ended: {conns:?}");
    // Acceptor connections whose peer vanished end by the idle timeout.
    let until = c.now + config.idle_timeout * 2;
    c.run_until(until, |c| {
        c.nodes[1].events.is_empty() && c.nodes[1].ep.live_connections() == 0
    });
    for e in std::mem::take(&mut c.nodes[1].events) {
        if let Event::Closed { conn, .. } | Event::Failed { conn, .. } = e {
            ending_b.push(conn);
        }
    }
    for h in ending_b {
        let _ = c.nodes[1].ep.release(h);
    }
    for (n, node) in c.nodes.iter().enumerate() {
        let u = node.ep.pool_usage();
        assert_eq!(u.connections.0, 0, "seed {seed} node {n}: {u:?}");
        assert_eq!(u.work_entries.0, 0, "seed {seed} node {n}: {u:?}");
        assert_eq!(u.recv_entries.0, 0, "seed {seed} node {n}: {u:?}");
        assert_eq!(u.senders.0, 0, "seed {seed} node {n}: {u:?}");
        assert_eq!(u.inflight_records.0, 0, "seed {seed} node {n}: {u:?}");
    }
    println!(
        "seed {seed}: {opened} connections, {} work requests completed, {} acceptor handles",
        completed.len(),
        issued[1].len()
    );
}

/// Two endpoints joined directly: every packet one sends is handed to the
/// other at once; the clock moves 1 us per exchange.
struct Direct {
    now: Instant,
    a: Ep,
    b: Ep,
    buf: Vec<u8>,
}

const A_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const B_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

fn addr(ip: Ipv4Address) -> PeerAddr {
    PeerAddr {
        ip: IpAddress::Ipv4(ip),
        port: wire::DEFAULT_UDP_PORT,
    }
}

struct NoMemory;

impl metaroce_core::api::Memory for NoMemory {
    fn write(&mut self, _: u64, _: &[u8]) {}
    fn read(&mut self, _: u64, _: &mut [u8]) {}
}

impl Direct {
    fn new(capacity_a: u32, capacity_b: u32) -> Direct {
        // One source opens connections as fast as the table allows.
        let config = Config {
            source_limits: metaroce_core::config::SourceLimits::NONE,
            ..Config::default()
        };
        Direct {
            now: Instant::from_micros(1),
            a: endpoint(config, capacity_a, 1),
            b: endpoint(config, capacity_b, 2),
            buf: vec![0; 9300],
        }
    }

    /// Exchanges packets until neither side has any; returns the events.
    fn settle(&mut self) -> (Vec<Event>, Vec<Event>) {
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                let (src, dst, ip) = if from_a {
                    (&mut self.a, &mut self.b, A_IP)
                } else {
                    (&mut self.b, &mut self.a, B_IP)
                };
                while let Some(t) = src.poll_transmit(self.now, &mut self.buf) {
                    let len = metaroce_core::finish_packet(&t, &mut self.buf, &mut NoMemory);
                    let meta = RxMeta {
                        source: PeerAddr {
                            ip: IpAddress::Ipv4(ip),
                            port: t.src_port,
                        },
                        ce: false,
                    };
                    dst.handle_packet(self.now, &meta, &self.buf[..len], &mut NoMemory);
                    moved = true;
                }
            }
            while self.a.poll_completion().is_some() {}
            while self.b.poll_completion().is_some() {}
            ea.extend(core::iter::from_fn(|| self.a.poll_event()));
            eb.extend(core::iter::from_fn(|| self.b.poll_event()));
            self.now += Duration::from_micros(1);
            for ep in [&mut self.a, &mut self.b] {
                if ep.poll_timeout().is_some_and(|t| t <= self.now) {
                    ep.handle_timeout(self.now);
                    moved = true;
                }
            }
            if !moved {
                return (ea, eb);
            }
        }
    }
}

/// A million connect/close cycles through a four-slot table: every cycle
/// gets a fresh handle and id, the old handle is refused, and nothing
/// leaks.
#[test]
fn a_million_connect_close_cycles_on_a_small_table() {
    let mut d = Direct::new(4, 4);
    let mut previous: Option<ConnHandle> = None;
    const CYCLES: u32 = 1_000_000;
    for cycle in 0..CYCLES {
        let h = d.a.connect(d.now, addr(B_IP), 0).expect("a slot is free");
        let (ea, eb) = d.settle();
        assert!(ea.contains(&Event::Connected(h)), "cycle {cycle}: {ea:?}");
        let hb = eb
            .iter()
            .find_map(|e| match e {
                Event::Incoming { conn, .. } => Some(*conn),
                _ => None,
            })
            .expect("acceptor saw the connection");
        d.a.close(d.now, h).unwrap();
        let (ea, eb) = d.settle();
        assert!(
            ea.iter()
                .any(|e| matches!(e, Event::Closed { conn, .. } if *conn == h)),
            "cycle {cycle}: {ea:?}"
        );
        assert!(
            eb.iter()
                .any(|e| matches!(e, Event::Closed { conn, .. } if *conn == hb)),
            "cycle {cycle}: {eb:?}"
        );
        d.a.release(h).unwrap();
        d.b.release(hb).unwrap();
        if let Some(old) = previous {
            assert_ne!(old, h);
            assert_eq!(d.a.state(old), None, "a stale handle is refused");
            assert_eq!(d.a.close(d.now, old), Err(CommandError::UnknownConnection));
        }
        previous = Some(h);
    }
    assert_eq!(d.a.live_connections(), 0);
    assert_eq!(d.b.live_connections(), 0);
    // Four slots, a million connections: each slot's generation went round
    // about 250,000 times.
    let last = previous.unwrap();
    assert!(last.generation >= CYCLES / 4 - 1, "{last:?}");
}

/// A CONNECT from a made-up initiator `i`, with `cookie`.
fn forged_connect(i: u32, cookie: [u8; wire::COOKIE_LEN]) -> Vec<u8> {
    let repr = wire::Repr {
        header: wire::Header {
            flags: wire::Flags::NONE,
            dst_conn: 0,
            token: 0,
            psn: 0,
            path: 0,
            timestamp: 0,
        },
        body: wire::Body::Connect(wire::ConnectRepr {
            src_conn: 0x1000 + i,
            src_token: 0xfeed_0000 + u64::from(i),
            mtu: 4096,
            max_paths: 4,
            window: 256,
            initial_psn: i,
            reply_port: 0,
            timer_profile: wire::TimerProfile::DataCenter,
            suite: wire::CipherSuite::None,
            key_id: 0,
            cookie,
        }),
        payload_len: 0,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &[]);
    buf
}

/// Source address `i` of 1,000.
fn flood_source(i: u32) -> RxMeta {
    RxMeta {
        source: PeerAddr {
            ip: IpAddress::Ipv4(Ipv4Address::new(
                172,
                16,
                (i % 1000 / 250) as u8,
                (i % 250) as u8,
            )),
            port: 50_000 + (i % 7) as u16,
        },
        ce: false,
    }
}

/// An acceptor endpoint whose table thousands of bad connections filled:
/// 1,000 addresses that each prove they receive there (they echo the
/// RETRY's cookie) and then never confirm the ACCEPT. Once the
/// application has released them, a legitimate peer gets in.
#[test]
fn half_open_and_failed_connections_never_keep_a_new_one_out_once_released() {
    let config = Config::default();
    let mut b: Ep = endpoint(config, 64, 9);
    let mut buf = vec![0u8; 2048];
    let mut now = Instant::from_micros(1);
    // 5,000 CONNECTs from 1,000 addresses, each repeated with its cookie,
    // that never answer the ACCEPT.
    let mut accepts = 0;
    for i in 0..5_000u32 {
        let meta = flood_source(i);
        b.handle_packet(
            now,
            &meta,
            &forged_connect(i, [0; wire::COOKIE_LEN]),
            &mut NoMemory,
        );
        let mut cookie = None;
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            let len = metaroce_core::finish_packet(&t, &mut buf, &mut NoMemory);
            if let Ok((r, _)) = wire::parse(&buf[..len]) {
                if let wire::Body::Retry(x) = r.body {
                    cookie = Some(x.cookie);
                }
            }
        }
        let cookie = cookie.expect("a RETRY");
        b.handle_packet(now, &meta, &forged_connect(i, cookie), &mut NoMemory);
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            let len = metaroce_core::finish_packet(&t, &mut buf, &mut NoMemory);
            if let Ok((r, _)) = wire::parse(&buf[..len]) {
                accepts += usize::from(matches!(r.body, wire::Body::Accept(_)));
            }
        }
        now += Duration::from_micros(1);
    }
    assert_eq!(accepts, 64);
    assert_eq!(b.live_connections(), 64, "the table is full");
    // Four /24s share the table: a prefix two behind the heaviest has one
    // of its unconfirmed connections reclaimed (spec 4.2.3), which the
    // application has not released yet.
    let drops = b.drops();
    assert_eq!(
        u64::from(b.half_open()) + drops.reclaimed_unconfirmed,
        64,
        "{drops:?}"
    );
    assert_eq!(drops.connect_unverified, 5_000);
    assert!(drops.refused + drops.refused_prefix_share + drops.connect_deferred >= 5_000 - 64);
    // The half-open connections end by the idle timeout; the application
    // releases them as their events come.
    let mut released = 0;
    let end = now + config.idle_timeout * 2;
    while now < end {
        now += Duration::from_millis(10);
        if b.poll_timeout().is_some_and(|t| t <= now) {
            b.handle_timeout(now);
        }
        while b.poll_transmit(now, &mut buf).is_some() {}
        while let Some(e) = b.poll_event() {
            if let Event::Failed { conn, .. } | Event::Closed { conn, .. } = e {
                b.release(conn).expect("release");
                released += 1;
            }
        }
    }
    assert_eq!(released, 64);
    assert_eq!(b.live_connections(), 0);
    assert_eq!(b.half_open(), 0, "every half-open count given back");
    // A legitimate peer now connects.
    let mut d = Direct {
        now,
        a: endpoint(config, 4, 10),
        b,
        buf,
    };
    let h = d.a.connect(d.now, addr(B_IP), 0).unwrap();
    let (ea, _) = d.settle();
    assert!(ea.contains(&Event::Connected(h)), "{ea:?}");

    // A thousand connections that each send a bad-key WRITE fail; once
    // released, they leave room for the next legitimate one.
    let src =
        d.a.register_region(metaroce_core::api::Region {
            base: SRC,
            len: 4096,
            access: Access::ALL,
            pd: 0,
        })
        .unwrap();
    d.a.close(d.now, h).unwrap();
    let (_, eb) = d.settle();
    for e in eb {
        if let Event::Closed { conn, .. } = e {
            d.b.release(conn).unwrap();
        }
    }
    d.a.release(h).unwrap();
    let mut pending_b = Vec::new();
    for _ in 0..1_000 {
        let h = d.a.connect(d.now, addr(B_IP), 0).expect("slot");
        let (_, eb) = d.settle();
        pending_b.extend(eb.iter().filter_map(|e| match e {
            Event::Incoming { conn, .. } => Some(*conn),
            _ => None,
        }));
        let wr = WorkRequest {
            id: 1,
            op: Op::Write {
                remote: MemoryTarget {
                    key: 0xdead_0000,
                    addr: 0,
                },
            },
            local: LocalBuf {
                key: src,
                addr: SRC,
                len: 64,
            },
        };
        d.a.post_send(h, wr).unwrap();
        let (ea, eb) = d.settle();
        assert!(
            ea.iter().any(|e| matches!(
                e,
                Event::Failed {
                    status: Status::RemoteInvalidKey,
                    ..
                }
            )),
            "{ea:?}"
        );
        for e in eb {
            if let Event::Failed { conn, .. } = e {
                d.b.release(conn)
                    .expect("the acceptor releases the failed connection");
            }
        }
        d.a.release(h).unwrap();
    }
    assert_eq!(d.b.live_connections(), 0, "{:?}", d.b.pool_usage());
    let h = d.a.connect(d.now, addr(B_IP), 0).unwrap();
    let (ea, _) = d.settle();
    assert!(ea.contains(&Event::Connected(h)));
    assert_eq!(d.a.state(h), Some(ConnState::Established));
    let _: Option<&Endpoint<TestHeap, PATHS>> = None;
}

/// The budget of an idle established 16-path connection (its table
/// slot and its share of the index) takes at most 512 bytes.
#[test]
fn an_idle_16_path_connection_fits_512_bytes() {
    let f = metaroce_core::Endpoint::<metaroce_core::Borrowed<'static>, 16>::footprint();
    assert!(
        f.idle_connection <= 512,
        "an idle 16-path connection takes {} B (slot {} + index {})",
        f.idle_connection,
        f.slot,
        f.index_share
    );
}

/// Spec 4.1.2: a closed connection answers every later CLOSE of its peer
/// with a CLOSE_REPLY of that CLOSE's reason, also once the application
/// released it (as `metaroce serve` does at once after a normal close),
/// until its slot is reused; a CLOSE_REPLY, a wrong token or another
/// source draws nothing.
#[test]
fn a_released_connection_answers_a_late_close_until_its_slot_is_reused() {
    /// Hands `bytes` to B and returns what B sends back at once, parsed.
    fn to_b(d: &mut Direct, bytes: &[u8], source: Ipv4Address) -> Vec<wire::Repr> {
        to_b_raw(d, bytes, source)
            .iter()
            .map(|b| wire::parse(b).unwrap().0)
            .collect()
    }
    fn to_b_raw(d: &mut Direct, bytes: &[u8], source: Ipv4Address) -> Vec<Vec<u8>> {
        let m = RxMeta {
            source: addr(source),
            ce: false,
        };
        d.b.handle_packet(d.now, &m, bytes, &mut NoMemory);
        let mut out = Vec::new();
        while let Some(t) = d.b.poll_transmit(d.now, &mut d.buf) {
            let len = metaroce_core::finish_packet(&t, &mut d.buf, &mut NoMemory);
            out.push(d.buf[..len].to_vec());
        }
        out
    }
    let mut d = Direct::new(4, 1);
    let h = d.a.connect(d.now, addr(B_IP), 0).unwrap();
    let (_, eb) = d.settle();
    let hb = eb
        .iter()
        .find_map(|e| match e {
            Event::Incoming { conn, .. } => Some(*conn),
            _ => None,
        })
        .unwrap();
    d.a.close(d.now, h).unwrap();
    let t = d.a.poll_transmit(d.now, &mut d.buf).expect("A's CLOSE");
    let len = metaroce_core::finish_packet(&t, &mut d.buf, &mut NoMemory);
    let close = d.buf[..len].to_vec();
    let reply = to_b_raw(&mut d, &close, A_IP);
    assert_eq!(reply.len(), 1, "{reply:?}");
    let first = wire::parse(&reply[0]).unwrap().0;
    let m = RxMeta {
        source: addr(B_IP),
        ce: false,
    };
    d.a.handle_packet(d.now, &m, &reply[0], &mut NoMemory);
    assert!(first.header.flags.contains(wire::Flags::CLOSE_REPLY));
    let (_, eb) = d.settle();
    assert!(eb
        .iter()
        .any(|e| matches!(e, Event::Closed { conn, .. } if *conn == hb)));
    d.b.release(hb).unwrap();
    d.settle();
    assert_eq!(d.b.live_connections(), 0);

    // Repeated after the release: answered, same id, token and reason.
    let dropped = d.b.drops().unknown_connection;
    for _ in 0..2 {
        let again = to_b(&mut d, &close, A_IP);
        assert_eq!(again.len(), 1, "{again:?}");
        let r = again[0];
        assert_eq!(r.header.flags, wire::Flags::CLOSE_REPLY);
        assert_eq!(
            (r.header.dst_conn, r.header.token),
            (first.header.dst_conn, first.header.token)
        );
        assert_eq!(r.body, first.body);
    }
    // Another reason is repeated as it came.
    let (mut other, _) = wire::parse(&close).unwrap();
    other.body = wire::Body::Close(wire::CloseRepr {
        reason: wire::CloseReason::IdleTimeout,
    });
    let mut bytes = vec![0; other.buffer_len()];
    other.emit(&mut bytes, &[]);
    let r = to_b(&mut d, &bytes, A_IP);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].body, other.body);
    // A CLOSE_REPLY, a wrong token, another source: nothing, counted.
    let (mut x, _) = wire::parse(&close).unwrap();
    x.header.flags = wire::Flags::CLOSE_REPLY;
    let mut bytes = vec![0; x.buffer_len()];
    x.emit(&mut bytes, &[]);
    assert!(to_b(&mut d, &bytes, A_IP).is_empty());
    let (mut x, _) = wire::parse(&close).unwrap();
    x.header.token ^= 1;
    x.emit(&mut bytes, &[]);
    assert!(to_b(&mut d, &bytes, A_IP).is_empty());
    assert!(to_b(&mut d, &close, Ipv4Address::new(10, 0, 0, 9)).is_empty());
    assert_eq!(d.b.drops().unknown_connection, dropped + 3);

    // The slot taken by a new connection: the old id names nothing.
    d.a.release(h).unwrap();
    let h2 = d.a.connect(d.now, addr(B_IP), 0).unwrap();
    let (ea, _) = d.settle();
    assert!(ea.contains(&Event::Connected(h2)), "{ea:?}");
    assert!(to_b(&mut d, &close, A_IP).is_empty());
    assert_eq!(d.b.drops().unknown_connection, dropped + 4);
}
