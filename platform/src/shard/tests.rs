//! The dispatcher and ownership rules of `shard`, on frames built by the
//! core's wire formats.

use super::*;
use crate::device::MemLink;
use metaroce_core::wire::{
    self, Body, ConnectRepr, EncapRepr, Flags, Header, IpPair, Repr, DEFAULT_UDP_PORT,
};
use smoltcp::wire::{EthernetAddress, Ipv4Address};
use std::vec::Vec;

/// Ownership learned from the handshakes the cores send (for endpoints
/// whose ids do not name their core): the dispatcher's learning path.
/// Holds up to `N` ids (a power of two); an id announced again by another
/// core moves to it (a reused id) and is counted as a conflict.
#[derive(Debug, Default)]
struct LearnedOwners<const N: usize> {
    owners: heapless::index_map::FnvIndexMap<u32, u8, N>,
    /// Ids not learned because the table was full.
    full: u64,
    /// Ids announced by a second core.
    conflicts: u64,
}

impl<const N: usize> LearnedOwners<N> {
    fn new() -> Self {
        LearnedOwners {
            owners: heapless::index_map::FnvIndexMap::new(),
            full: 0,
            conflicts: 0,
        }
    }

    /// Every learned `(id, core)`.
    fn iter(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.owners
            .iter()
            .map(|(&id, &core)| (id, usize::from(core)))
    }
}

impl<const N: usize> ConnOwner for LearnedOwners<N> {
    const LEARNS: bool = true;

    fn owner_of(&self, dst_conn: u32) -> Option<usize> {
        self.owners.get(&dst_conn).map(|&c| usize::from(c))
    }

    fn learn(&mut self, src_conn: u32, core: usize) {
        let Ok(core) = u8::try_from(core) else { return };
        match self.owners.get_mut(&src_conn) {
            Some(known) if *known == core => {}
            Some(known) => {
                *known = core;
                self.conflicts += 1;
            }
            None => {
                if self.owners.insert(src_conn, core).is_err() {
                    self.full += 1;
                }
            }
        }
    }
}

const PORT: u16 = DEFAULT_UDP_PORT;

fn header(dst_conn: u32) -> Header {
    Header {
        flags: Flags::NONE,
        dst_conn,
        token: if dst_conn == 0 { 0 } else { 7 },
        psn: 1,
        path: 0,
        timestamp: 0,
    }
}

fn connect_repr(src_conn: u32) -> ConnectRepr {
    ConnectRepr {
        src_conn,
        src_token: 9,
        mtu: 1024,
        max_paths: 8,
        window: 256,
        reply_port: 0,
        initial_psn: 0,
        timer_profile: Default::default(),
        suite: Default::default(),
        key_id: 0,
        cookie: [0; metaroce_core::wire::COOKIE_LEN],
    }
}

/// A whole frame from `src` carrying `repr`, to `dst_port`.
fn frame(src: [u8; 4], src_port: u16, dst_port: u16, repr: &Repr) -> Vec<u8> {
    let mut packet = std::vec![0u8; repr.buffer_len()];
    repr.emit(&mut packet, &[]);
    let encap = EncapRepr {
        src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
        dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
        ip: IpPair::V4 {
            src: Ipv4Address::from(src),
            dst: Ipv4Address::new(198, 18, 0, 2),
        },
        src_port,
        dst_port,
        dscp: 0,
        ecn: 0,
        hop_limit: 64,
    };
    let mut out = std::vec![0u8; encap.frame_len(packet.len())];
    encap
        .emit(&mut out, packet.len(), |t| t.copy_from_slice(&packet))
        .unwrap();
    out
}

fn ack_frame(dst_conn: u32) -> Vec<u8> {
    let repr = Repr {
        header: header(dst_conn),
        body: Body::Keepalive,
        payload_len: 0,
    };
    frame([198, 18, 0, 1], 50000, PORT, &repr)
}

fn connect_frame(src: [u8; 4], src_port: u16, src_conn: u32) -> Vec<u8> {
    let repr = Repr {
        header: header(0),
        body: Body::Connect(connect_repr(src_conn)),
        payload_len: 0,
    };
    frame(src, src_port, PORT, &repr)
}

fn accept_frame(dst_conn: u32, src_conn: u32) -> Vec<u8> {
    let repr = Repr {
        header: header(dst_conn),
        body: Body::Accept(connect_repr(src_conn)),
        payload_len: 0,
    };
    frame([198, 18, 0, 2], 50001, PORT, &repr)
}

#[test]
fn shard_map_owner_is_index_over_shard_size() {
    // 16 index bits, 65,536 slots over 4 cores: 16,384 each.
    let map = ShardMap::for_table(16, 65_536, 4).unwrap();
    assert_eq!(map.owner(0xabcd_0000), Some(0));
    assert_eq!(map.owner(0xabcd_3fff), Some(0));
    assert_eq!(map.owner(0x1234_4000), Some(1));
    assert_eq!(map.owner(0x0000_bfff), Some(2));
    assert_eq!(map.owner(0xffff_ffff), Some(3));
    // 100 slots over 3 cores: shards of 33, slot 99 is nobody's.
    let odd = ShardMap::for_table(8, 100, 3).unwrap();
    assert_eq!(odd.owner(32), Some(0));
    assert_eq!(odd.owner(33), Some(1));
    assert_eq!(odd.owner(98), Some(2));
    assert_eq!(odd.owner(99), None);
    assert_eq!(odd.owner(0x100 | 33), Some(1), "high bits ignored");
    let full = ShardMap::new(32, 1 << 28, 16).unwrap();
    assert_eq!(full.owner(u32::MAX), Some(15));
    assert!(
        ShardMap::new(8, 128, 4).is_none(),
        "shards overflow the index"
    );
    assert!(ShardMap::new(8, 16, 0).is_none());
    assert!(ShardMap::new(8, 0, 2).is_none());
    assert!(ShardMap::new(33, 1, 2).is_none());
    assert!(ShardMap::new(16, 1, MAX_CORES + 1).is_none());
}

#[test]
fn connect_hash_spreads_and_is_stable() {
    let mut per_core = [0u32; 4];
    for id in 0..4000u32 {
        let core = connect_core(&[198, 18, 0, 1], id.wrapping_mul(0x9e37_79b9), 4);
        per_core[core] += 1;
        assert_eq!(
            core,
            connect_core(&[198, 18, 0, 1], id.wrapping_mul(0x9e37_79b9), 4)
        );
    }
    for n in per_core {
        assert!((800..1200).contains(&n), "{per_core:?}");
    }
    assert_eq!(connect_core(&[1, 2, 3, 4], 5, 1), 0);
    assert!(connect_core(&[0xff; 16], u32::MAX, MAX_CORES) < MAX_CORES);
}

#[test]
fn frames_are_classified_from_their_headers() {
    assert_eq!(
        classify(&ack_frame(0x1234_5602), PORT, 4),
        FrameClass::Connection {
            dst_conn: 0x1234_5602
        }
    );
    let connect = connect_frame([198, 18, 0, 1], 40000, 0xaaaa_0001);
    let FrameClass::Connect { core } = classify(&connect, PORT, 4) else {
        panic!("not a CONNECT");
    };
    assert_eq!(core, connect_core(&[198, 18, 0, 1], 0xaaaa_0001, 4));
    // The source port is path entropy: a CONNECT resent on another
    // path reaches the same core.
    let resent = connect_frame([198, 18, 0, 1], 40999, 0xaaaa_0001);
    assert_eq!(classify(&resent, PORT, 4), FrameClass::Connect { core });
    // An early packet (spec 4.2.4) names its sender's own id: it goes
    // where that sender's CONNECT went, from any port (steering reads the
    // flags and id only; the body does not matter).
    let early = Repr {
        header: Header {
            flags: Flags::EARLY,
            dst_conn: 0xaaaa_0001,
            ..header(0xaaaa_0001)
        },
        body: Body::Keepalive,
        payload_len: 0,
    };
    let early = frame([198, 18, 0, 1], 41234, PORT, &early);
    assert_eq!(classify(&early, PORT, 4), FrameClass::Connect { core });
    assert_eq!(
        classify(&ack_frame(1), PORT + 1, 4),
        FrameClass::Control,
        "another port"
    );
    // Every truncation of a valid frame is classified without a panic.
    let f = ack_frame(77);
    for len in 0..f.len() {
        let c = classify(&f[..len], PORT, 4);
        assert!(
            matches!(c, FrameClass::Control | FrameClass::Connection { .. }),
            "{len}"
        );
    }
    let mut arp_reply = std::vec![0u8; 42];
    arp_reply[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    arp_reply[20..22].copy_from_slice(&2u16.to_be_bytes());
    assert_eq!(classify(&arp_reply, PORT, 4), FrameClass::Reply);
    arp_reply[21] = 1;
    assert_eq!(classify(&arp_reply, PORT, 4), FrameClass::Control);
    let mut icmp = std::vec![0u8; 60];
    icmp[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    icmp[14] = 0x45;
    icmp[23] = IP_PROTO_ICMP;
    icmp[34] = 0; // echo reply
    assert_eq!(classify(&icmp, PORT, 4), FrameClass::Reply);
    icmp[34] = 8; // echo request
    assert_eq!(classify(&icmp, PORT, 4), FrameClass::Control);
    let mut fragment = ack_frame(5);
    fragment[20] |= 0x20; // more fragments
    assert_eq!(classify(&fragment, PORT, 4), FrameClass::Control);
}

#[test]
fn handshakes_announce_their_ids() {
    assert_eq!(
        announced_conn(&connect_frame([1, 1, 1, 1], 1, 0xbeef_0003), PORT),
        Some(0xbeef_0003)
    );
    assert_eq!(
        announced_conn(&accept_frame(0xbeef_0003, 0xcafe_0001), PORT),
        Some(0xcafe_0001)
    );
    assert_eq!(announced_conn(&ack_frame(3), PORT), None);
    assert_eq!(
        announced_conn(&accept_frame(1, 2), PORT + 1),
        None,
        "not to a MetaRoCE port"
    );
    // The parse of the core agrees on what the frame is.
    let f = accept_frame(1, 2);
    let (_, packet) = wire::encap::parse_frame(&f, PORT).unwrap();
    assert!(matches!(
        wire::parse(packet).unwrap().0.body,
        Body::Accept(_)
    ));
}

#[test]
fn learned_owners_follow_the_announcing_core() {
    let mut owners: LearnedOwners<4> = LearnedOwners::new();
    owners.learn(10, 1);
    owners.learn(11, 2);
    owners.learn(10, 1);
    assert_eq!(owners.owner_of(10), Some(1));
    assert_eq!(owners.owner_of(12), None);
    owners.learn(10, 3);
    assert_eq!((owners.owner_of(10), owners.conflicts), (Some(3), 1));
    owners.learn(12, 0);
    owners.learn(13, 0);
    owners.learn(14, 0);
    assert_eq!(owners.full, 1);
    assert_eq!(owners.iter().count(), 4);
}

/// Core `c` of a node: its end of the link, as its engine sees it.
type CoreEnd<'a> = MemFrameDevice<'a, 64>;

#[test]
fn received_frames_reach_the_owner_and_sent_frames_the_wire() {
    let wire: MemLink<64> = MemLink::new();
    let (mut nic, mut peer) = wire.ends().unwrap();
    let links: [MemLink<64>; 3] = [MemLink::new(), MemLink::new(), MemLink::new()];
    let (mut core_ends, mut rings): (Vec<CoreEnd<'_>>, Vec<CoreEnd<'_>>) =
        links.iter().map(|l| l.ends().unwrap()).unzip();
    let mut d = Dispatcher::new(LearnedOwners::<64>::new(), 3, PORT);
    // Core 2 opens a connection: its CONNECT goes out, the id is learned.
    assert!(core_ends[2].send_frame(&connect_frame([198, 18, 0, 2], 1, 0x5555_0000)));
    let round = d.transmit(&mut nic, &mut rings, 32);
    assert_eq!((round.frames, round.cores_fed), (1, 0b100));
    assert_eq!(
        peer.receive(|f| announced_conn(f, PORT)),
        Some(Some(0x5555_0000))
    );
    // The peer's ACCEPT and data reach core 2; an unknown id is dropped.
    assert!(peer.send_frame(&accept_frame(0x5555_0000, 0x7777_0001)));
    assert!(peer.send_frame(&ack_frame(0x5555_0000)));
    assert!(peer.send_frame(&ack_frame(0x6666_0000)));
    let round = d.receive(&mut nic, &mut rings, 32);
    assert_eq!((round.frames, round.cores_fed), (3, 0b100));
    assert_eq!(core_ends[2].rx_pending(), 2);
    assert_eq!(d.stats().unroutable, 1);
    assert_eq!(d.delivered(2), 2);
    // An incoming CONNECT lands on its hash core, which answers; the
    // answer's id routes the peer's next packet to the same core.
    let connect = connect_frame([198, 18, 0, 1], 9, 0x1234_0000);
    let hashed = connect_core(&[198, 18, 0, 1], 0x1234_0000, 3);
    assert!(peer.send_frame(&connect));
    d.receive(&mut nic, &mut rings, 32);
    assert_eq!(core_ends[hashed].receive(|f| f.len()), Some(connect.len()));
    assert!(core_ends[hashed].send_frame(&accept_frame(0x1234_0000, 0x4321_0000 | hashed as u32)));
    d.transmit(&mut nic, &mut rings, 32);
    assert!(peer.receive(|_| ()).is_some());
    assert!(peer.send_frame(&ack_frame(0x4321_0000 | hashed as u32)));
    let round = d.receive(&mut nic, &mut rings, 32);
    assert_eq!(round.cores_fed, 1 << hashed);
    // A reply goes to every core.
    let mut arp_reply = std::vec![0u8; 60];
    arp_reply[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    arp_reply[20..22].copy_from_slice(&2u16.to_be_bytes());
    assert!(peer.send_frame(&arp_reply));
    assert_eq!(d.receive(&mut nic, &mut rings, 32).cores_fed, 0b111);
}

#[test]
fn a_full_ring_drops_and_counts() {
    let wire: MemLink<64> = MemLink::new();
    let (mut nic, mut peer) = wire.ends().unwrap();
    let link: MemLink<4> = MemLink::new();
    let (_core, ring) = link.ends().unwrap();
    let mut rings = [ring];
    let mut d = Dispatcher::new(ShardMap::new(8, 4, 1).unwrap(), 1, PORT);
    for _ in 0..6 {
        assert!(peer.send_frame(&ack_frame(1)));
    }
    let round = d.receive(&mut nic, &mut rings, 32);
    assert_eq!(round.frames, 6);
    assert_eq!(d.stats().ring_full, 2);
    assert_eq!(d.delivered(0), 4);
}

/// A frame reaches its core with the device's verdicts on it: unverified
/// off the wire (the core's engine verifies its checksums, once), or
/// vouched for by a device that verified it (not verified again).
#[test]
fn frames_keep_the_devices_verdicts_through_the_dispatcher() {
    use crate::device::{ChecksumVerdict, CrcVerdict, RxVerdict};
    let wire: MemLink<64> = MemLink::new();
    let (mut nic, mut peer) = wire.ends().unwrap();
    let link: MemLink<8> = MemLink::new();
    let (mut core, ring) = link.ends().unwrap();
    let mut rings = [ring];
    let mut d = Dispatcher::new(ShardMap::new(8, 4, 1).unwrap(), 1, PORT);
    let offloaded = RxVerdict {
        checksums: ChecksumVerdict::Verified,
        crc: CrcVerdict::Good,
    };
    assert!(peer.send_frame(&ack_frame(1)));
    assert!(peer.send_frame_with_verdict(&ack_frame(2), offloaded));
    assert_eq!(d.receive(&mut nic, &mut rings, 32).frames, 2);
    let mut got = Vec::new();
    while let Some(verdict) = core.receive_with_verdict(|_, verdict| verdict) {
        got.push(verdict);
    }
    assert_eq!(got, [RxVerdict::NOT_CHECKED, offloaded]);
}

/// Four core threads and a dispatcher thread: every frame a peer sends
/// to a connection reaches exactly its owner, and every frame a core
/// sends reaches the wire exactly once.
#[test]
fn threads_get_exactly_their_connections_frames() {
    const CORES: usize = 4;
    const PER_CONN: u32 = 300;
    // Ids as the sharded table will make them: 8 index bits, 16 slots
    // per core; connection `k` of core `c` is slot `16 c + k`.
    let map = ShardMap::new(8, 16, CORES).unwrap();
    let ids: Vec<u32> = (0..CORES as u32)
        .flat_map(|c| (0..3).map(move |k| 0xab00_0000 | (16 * c + k)))
        .collect();
    let wire_in: MemLink<64> = MemLink::new();
    let wire_out: MemLink<64> = MemLink::new();
    let (mut nic_rx, mut peer_tx) = wire_in.ends().unwrap();
    let (mut nic_tx, mut peer_rx) = wire_out.ends().unwrap();
    let links: Vec<MemLink<16>> = (0..CORES).map(|_| MemLink::new()).collect();
    let (core_ends, mut rings): (Vec<_>, Vec<_>) = links.iter().map(|l| l.ends().unwrap()).unzip();
    let total = PER_CONN * ids.len() as u32;
    let done = core::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        let done = &done;
        for (core, mut end) in core_ends.into_iter().enumerate() {
            let ids = &ids;
            s.spawn(move || {
                // Echo each frame back (as a reply would go out) and
                // check it is one of this core's connections.
                let mut got = 0;
                while got < PER_CONN * 3 {
                    let Some(dst) = end.receive(|f| match classify(f, PORT, CORES) {
                        FrameClass::Connection { dst_conn } => dst_conn,
                        other => panic!("core {core}: {other:?}"),
                    }) else {
                        std::thread::yield_now();
                        continue;
                    };
                    assert_eq!(map.owner(dst), Some(core), "{dst:#x} on core {core}");
                    assert!(ids.contains(&dst));
                    got += 1;
                    while !end.send_frame(&ack_frame(dst)) {
                        std::thread::yield_now();
                    }
                }
                done.fetch_add(1, core::sync::atomic::Ordering::Release);
            });
        }
        s.spawn(move || {
            let mut d = Dispatcher::new(map, CORES, PORT);
            while done.load(core::sync::atomic::Ordering::Acquire) < CORES as u32
                || rings.iter().any(|r| r.rx_pending() > 0)
            {
                let rx = d.receive(&mut nic_rx, &mut rings, 32);
                let tx = d.transmit(&mut nic_tx, &mut rings, 32);
                if rx.frames + tx.frames == 0 {
                    std::thread::yield_now();
                }
            }
            assert_eq!(d.stats().unroutable + d.stats().ring_full, 0);
        });
        // The peer: sends PER_CONN frames to each connection, round
        // robin, and counts what comes back.
        // At most WINDOW frames in flight, fewer than a core ring holds,
        // so nothing is dropped on a full ring.
        const WINDOW: u32 = 8;
        let mut sent = 0u32;
        let mut back = 0u32;
        while back < total {
            if sent < total && sent - back < WINDOW {
                let id = ids[(sent as usize) % ids.len()];
                if peer_tx.send_frame(&ack_frame(id)) {
                    sent += 1;
                }
            }
            if peer_rx.receive(|_| ()).is_some() {
                back += 1;
            } else if sent == total {
                std::thread::yield_now();
            }
        }
    });
}
