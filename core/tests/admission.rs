//! Fair admission under exhaustion (spec 4.2.3): while sources that proved
//! their addresses fill the connection table (unconfirmed connections, or
//! established idle ones kept alive), a client from a prefix that holds
//! nothing still connects, within 100 ms, and every refusal and reclaim is
//! counted.

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{PeerAddr, RxMeta};
use metaroce_core::wire::{self, Body, CipherSuite, ConnectRepr, Flags, Header};
use metaroce_core::{Config, Event, Instant};
use smoltcp::wire::{IpAddress, Ipv4Address, Ipv6Address};

/// The acceptor's table.
const SLOTS: u32 = 256;
const ACCEPTOR_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);
/// The legitimate clients: 10.9.k.1, each in a /24 nobody else uses.
const CLIENT_IP: Ipv4Address = Ipv4Address::new(10, 9, 0, 1);

struct NoMemory;

impl metaroce_core::api::Memory for NoMemory {
    fn write(&mut self, _: u64, _: &[u8]) {}
    fn read(&mut self, _: u64, _: &mut [u8]) {}
}

fn packet(header: Header, body: Body) -> Vec<u8> {
    let repr = wire::Repr {
        header,
        body,
        payload_len: 0,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &[]);
    buf
}

fn connect(i: u32, suite: CipherSuite, cookie: [u8; wire::COOKIE_LEN]) -> Vec<u8> {
    let header = Header {
        flags: Flags::NONE,
        dst_conn: 0,
        token: 0,
        psn: 0,
        path: 0,
        timestamp: 0,
    };
    packet(
        header,
        Body::Connect(ConnectRepr {
            src_conn: 0x1000 + i,
            src_token: 0xfeed_0000 + u64::from(i),
            mtu: 4096,
            max_paths: 4,
            window: 256,
            initial_psn: i,
            reply_port: 0,
            timer_profile: wire::TimerProfile::DataCenter,
            suite,
            key_id: u32::from(suite != CipherSuite::None),
            cookie,
        }),
    )
}

fn meta(ip: IpAddress) -> RxMeta {
    RxMeta {
        source: PeerAddr {
            ip,
            port: wire::DEFAULT_UDP_PORT,
        },
        ce: false,
    }
}

/// An attacker that proves its addresses and then holds what it gets.
struct Attacker {
    addresses: Vec<IpAddress>,
    next: u32,
    /// ACCEPTs taken: (address, the acceptor's id and token).
    held: Vec<(IpAddress, u32, u64)>,
    confirm: bool,
}

impl Attacker {
    /// One CONNECT (and its cookie echo) from the next address; confirms
    /// the ACCEPT if this attacker confirms.
    fn strike(&mut self, ep: &mut Ep, now: Instant, buf: &mut [u8]) {
        let i = self.next;
        self.next += 1;
        let ip = self.addresses[i as usize % self.addresses.len()];
        let mut cookie = None;
        ep.handle_packet(
            now,
            &meta(ip),
            &connect(i, CipherSuite::None, [0; 32]),
            &mut NoMemory,
        );
        for r in drain(ep, now, buf) {
            if let Body::Retry(x) = r.1.body {
                cookie = Some(x.cookie);
            }
        }
        let Some(cookie) = cookie else { return };
        ep.handle_packet(
            now,
            &meta(ip),
            &connect(i, CipherSuite::None, cookie),
            &mut NoMemory,
        );
        for (to, r) in drain(ep, now, buf) {
            if let Body::Accept(a) = r.body {
                if to == ip && r.header.dst_conn == 0x1000 + i {
                    self.held.push((ip, a.src_conn, a.src_token));
                    if self.confirm {
                        keepalive(ep, now, ip, a.src_conn, a.src_token);
                    }
                }
            }
        }
    }

    /// KEEPALIVEs on everything held (if it confirms): idle, but never
    /// silent.
    fn hold(&mut self, ep: &mut Ep, now: Instant, buf: &mut [u8]) {
        if !self.confirm {
            return;
        }
        for &(ip, id, token) in &self.held {
            keepalive(ep, now, ip, id, token);
        }
        drain(ep, now, buf);
    }
}

fn keepalive(ep: &mut Ep, now: Instant, ip: IpAddress, id: u32, token: u64) {
    let header = Header {
        flags: Flags::NONE,
        dst_conn: id,
        token,
        psn: 0,
        path: 0,
        timestamp: 0,
    };
    ep.handle_packet(
        now,
        &meta(ip),
        &packet(header, Body::Keepalive),
        &mut NoMemory,
    );
}

/// Everything the endpoint sends now, parsed, with where it goes.
fn drain(ep: &mut Ep, now: Instant, buf: &mut [u8]) -> Vec<(IpAddress, wire::Repr)> {
    let mut out = Vec::new();
    while let Some(t) = ep.poll_transmit(now, buf) {
        let len = metaroce_core::finish_packet(&t, buf, &mut NoMemory);
        if let Ok((r, _)) = wire::parse(&buf[..len]) {
            out.push((t.peer.ip, r));
        }
    }
    out
}

/// The acceptor's application: releases every connection that ended.
fn serve(ep: &mut Ep) {
    while let Some(e) = ep.poll_event() {
        if let Event::Failed { conn, .. } | Event::Closed { conn, .. } = e {
            let _ = ep.release(conn);
        }
    }
    while ep.poll_completion().is_some() {}
}

/// Fills `acceptor` with what `attacker` gets, then connects a client from
/// another prefix while the attack goes on: returns how long the client
/// took and the acceptor's counters.
fn client_connects_during(
    mut attacker: Attacker,
    config: Config,
) -> (Duration, metaroce_core::stats::DropStats) {
    let mut acceptor: Ep = endpoint(config, SLOTS, 7);
    let mut buf = vec![0u8; 9300];
    let mut now = Instant::from_micros(1);
    for _ in 0..SLOTS * 4 {
        attacker.strike(&mut acceptor, now, &mut buf);
        serve(&mut acceptor);
        now += Duration::from_micros(10);
    }
    assert_eq!(
        acceptor.live_connections(),
        SLOTS,
        "the attack fills the table"
    );
    let mut longest = Duration::ZERO;
    // More clients than the reserve holds: the later ones get slots
    // reclaimed from the attack's heaviest prefix.
    for k in 0..CLIENTS {
        let took = one_client(k, &mut attacker, &mut acceptor, &mut now, config, &mut buf);
        longest = longest.max(took);
    }
    (longest, acceptor.drops())
}

/// Clients, each from its own /24.
const CLIENTS: u8 = 8;

/// Client `k` connects while the attack goes on: how long it took.
fn one_client(
    k: u8,
    attacker: &mut Attacker,
    acceptor: &mut Ep,
    now: &mut Instant,
    config: Config,
    buf: &mut [u8],
) -> Duration {
    let mut client: Ep = endpoint(config, 4, 8 + u64::from(k));
    let [a, b, _, d] = CLIENT_IP.octets();
    let client_ip = IpAddress::Ipv4(Ipv4Address::new(a, b, k, d));
    let server = PeerAddr {
        ip: IpAddress::Ipv4(ACCEPTOR_IP),
        port: wire::DEFAULT_UDP_PORT,
    };
    let h = client.connect(*now, server, 0).unwrap();
    let start = *now;
    let mut connected = false;
    while *now < start + Duration::from_millis(100) && !connected {
        let t_now = *now;
        // The attack goes on: new CONNECTs, and KEEPALIVEs on what it holds.
        for _ in 0..4 {
            attacker.strike(acceptor, t_now, buf);
        }
        attacker.hold(acceptor, t_now, buf);
        serve(acceptor);
        for _ in 0..8 {
            while let Some(t) = client.poll_transmit(t_now, buf) {
                let len = metaroce_core::finish_packet(&t, buf, &mut NoMemory);
                let bytes = buf[..len].to_vec();
                acceptor.handle_packet(t_now, &meta(client_ip), &bytes, &mut NoMemory);
            }
            serve(acceptor);
            while let Some(t) = acceptor.poll_transmit(t_now, buf) {
                let len = metaroce_core::finish_packet(&t, buf, &mut NoMemory);
                if t.peer.ip == client_ip {
                    let bytes = buf[..len].to_vec();
                    client.handle_packet(t_now, &meta(server.ip), &bytes, &mut NoMemory);
                }
            }
        }
        while let Some(e) = client.poll_event() {
            match e {
                Event::Connected(c) if c == h => connected = true,
                Event::Failed { .. } | Event::Closed { .. } => panic!("client refused: {e:?}"),
                _ => {}
            }
        }
        *now += Duration::from_micros(50);
        for ep in [&mut client, &mut *acceptor] {
            if ep.poll_timeout().is_some_and(|t| t <= *now) {
                ep.handle_timeout(*now);
            }
        }
    }
    assert!(
        connected,
        "client {k}: no connection in 100 ms: {:?}",
        acceptor.drops()
    );
    *now - start
}

fn addresses(n: u8, of: impl Fn(u8) -> IpAddress) -> Vec<IpAddress> {
    (0..n).map(of).collect()
}

/// 20 addresses in 20 /24s open connections that never confirm.
#[test]
fn unconfirmed_connections_give_way_to_a_new_prefix() {
    let attacker = Attacker {
        addresses: addresses(20, |k| IpAddress::Ipv4(Ipv4Address::new(172, 16, k, 1))),
        next: 0,
        held: Vec::new(),
        confirm: false,
    };
    let (took, drops) = client_connects_during(attacker, Config::default());
    // Each client's first CONNECT found the table full: an unconfirmed
    // connection was reclaimed for it and its next copy took the slot.
    assert!(
        drops.reclaimed_unconfirmed >= u64::from(CLIENTS),
        "{drops:?}"
    );
    assert!(drops.connect_deferred >= u64::from(CLIENTS), "{drops:?}");
    println!("connected after {took:?}");
}

/// 16 addresses hold confirmed idle connections with KEEPALIVEs.
#[test]
fn idle_connections_kept_alive_give_way_to_a_new_prefix() {
    let attacker = Attacker {
        addresses: addresses(16, |k| IpAddress::Ipv4(Ipv4Address::new(172, 16, k, 1))),
        next: 0,
        held: Vec::new(),
        confirm: true,
    };
    let (took, drops) = client_connects_during(attacker, Config::default());
    assert!(drops.reclaimed_idle >= u64::from(CLIENTS), "{drops:?}");
    assert!(drops.connect_deferred >= u64::from(CLIENTS), "{drops:?}");
    println!("connected after {took:?}");
}

/// 17 addresses of one IPv6 /64 count as one narrow prefix: together they
/// hold at most the share configured for one (half the table here).
#[test]
fn addresses_of_one_slash_64_share_its_limit() {
    let mut attacker = Attacker {
        addresses: addresses(17, |k| {
            IpAddress::Ipv6(Ipv6Address::new(
                0x2001,
                0xdb8,
                0,
                1,
                0,
                0,
                0,
                u16::from(k) + 1,
            ))
        }),
        next: 0,
        held: Vec::new(),
        confirm: true,
    };
    let mut config = Config::default();
    config.admission.narrow.all = 128;
    let mut acceptor: Ep = endpoint(config, SLOTS, 7);
    let mut buf = vec![0u8; 9300];
    let mut now = Instant::from_micros(1);
    for _ in 0..SLOTS * 2 {
        attacker.strike(&mut acceptor, now, &mut buf);
        now += Duration::from_micros(10);
    }
    assert_eq!(acceptor.live_connections(), SLOTS / 2);
    assert!(acceptor.drops().refused_prefix_share >= u64::from(SLOTS));
}

/// A CONNECT offering protection proves its address before a key slot is
/// committed, even where unprotected ones may skip the RETRY.
#[test]
fn a_protected_offer_proves_its_address_first() {
    let config = Config {
        address_validation: metaroce_core::config::AddressValidation::WhenLoaded {
            half_open: 1000,
        },
        ..Config::default()
    };
    let mut acceptor: Ep = endpoint(config, SLOTS, 7);
    let mut buf = vec![0u8; 9300];
    let now = Instant::from_micros(1);
    let ip = IpAddress::Ipv4(Ipv4Address::new(172, 16, 0, 1));
    acceptor.handle_packet(
        now,
        &meta(ip),
        &connect(1, CipherSuite::None, [0; 32]),
        &mut NoMemory,
    );
    let plain = drain(&mut acceptor, now, &mut buf);
    assert!(plain.iter().any(|(_, r)| matches!(r.body, Body::Accept(_))));
    acceptor.handle_packet(
        now,
        &meta(ip),
        &connect(2, CipherSuite::Aes256Gcm, [0; 32]),
        &mut NoMemory,
    );
    let protected = drain(&mut acceptor, now, &mut buf);
    assert!(
        protected
            .iter()
            .all(|(_, r)| matches!(r.body, Body::Retry(_))),
        "{protected:?}"
    );
    assert_eq!(acceptor.live_connections(), 1);
}

/// Clients from eight new /24s arrive together, before the application
/// has released anything: none finds a free slot, each has a connection
/// reclaimed for it and its CONNECT dropped, and once the application
/// released them each client's next copy takes a slot.
#[test]
fn clients_arriving_together_wait_for_reclaimed_slots() {
    let mut attacker = Attacker {
        addresses: addresses(16, |k| IpAddress::Ipv4(Ipv4Address::new(172, 16, k, 1))),
        next: 0,
        held: Vec::new(),
        confirm: true,
    };
    let mut acceptor: Ep = endpoint(Config::default(), SLOTS, 7);
    let mut buf = vec![0u8; 9300];
    let mut now = Instant::from_micros(1);
    for _ in 0..SLOTS * 2 {
        attacker.strike(&mut acceptor, now, &mut buf);
        serve(&mut acceptor);
        now += Duration::from_micros(10);
    }
    let mut clients = Attacker {
        addresses: addresses(8, |k| IpAddress::Ipv4(Ipv4Address::new(10, 9, k, 1))),
        next: 10_000,
        held: Vec::new(),
        confirm: true,
    };
    for _ in 0..8 {
        clients.strike(&mut acceptor, now, &mut buf);
    }
    let drops = acceptor.drops();
    assert_eq!(drops.connect_deferred, 8, "{drops:?}");
    assert_eq!(drops.reclaimed_idle, 8, "one per client: {drops:?}");
    // Released, the reclaimed slots take the waiting clients' next copies
    // (those already accepted answer their copies with the same ACCEPT).
    serve(&mut acceptor);
    let waiting = 8 - clients.held.len();
    assert_eq!(waiting as u64, drops.connect_deferred);
    clients.next = 10_000;
    clients.held.clear();
    for _ in 0..8 {
        clients.strike(&mut acceptor, now, &mut buf);
    }
    assert_eq!(clients.held.len(), waiting, "{:?}", acceptor.drops());
}
