//! Sharding the engine over cores: one engine loop per core, each owning a
//! disjoint set of connections, and the steering that brings every
//! received frame to the core that owns its connection.
//!
//! Where the NIC cannot steer (QEMU's virtio-net over virtio-mmio offers no
//! multiqueue: the `dgram` netdev has one queue pair, QEMU's `mq` property
//! is off by default and needs a multi-queue backend and a control queue,
//! and `virtio-drivers` 0.13 drives queues 0 and 1 only), one core owns
//! the device and plays the NIC's steering engine: [`Dispatcher`] reads
//! just enough of each received frame to find its MetaRoCE destination
//! connection id, or the CONNECT's source, and pushes the frame into the
//! owning core's receive ring; every core pushes its transmit frames into
//! its own ring, which the dispatching core drains into the device. The
//! per-core rings are a [`MemLink`] each: single producer, single
//! consumer, nothing else shared on the data path. A core's end of its
//! link is an ordinary [`crate::FrameDevice`], so its engine loop
//! ([`crate::Engine::poll`]) runs unchanged. Where the NIC steers (per-core
//! hardware rings, as declared for Pensando Elba in its `board.toml`) the
//! dispatcher is not needed; the ownership rules below are the same.
//!
//! **Ownership** ([`ConnOwner`]): with the sharded connection table, a
//! wire connection id carries its table slot in its low `index_bits` bits
//! and the table is split into `cores` contiguous shards of `shard_size`
//! slots, so the owner is `index / shard_size` ([`ShardMap`]): no lookup,
//! no shared state. An owner that learns instead ([`ConnOwner::LEARNS`])
//! is told each id from the CONNECT or ACCEPT that announces it (the
//! dispatcher sees every frame a core sends, before it reaches the wire,
//! so it knows the owner before any reply can arrive).
//!
//! **CONNECT** (destination id 0) goes to the core chosen by a hash of the
//! source IP address and the CONNECT's source connection id
//! ([`connect_core`]). That is safe because the connection is created on
//! the core that handles the CONNECT, and the id it answers with (in its
//! ACCEPT) names that core from then on; a retransmitted CONNECT hashes to
//! the same core, which answers it with the same ACCEPT. The source
//! connection id is hashed rather than the UDP source port because the
//! port is the initiator's path entropy, which it may re-draw, while the
//! id is fixed for the connection's life.
//!
//! **Everything else**: ARP requests, ICMP echo requests and frames that are
//! not MetaRoCE (or are malformed) go to core 0, whose engine answers or
//! counts them; ARP and ICMP echo *replies* go to every core, so each
//! core's neighbour cache and ping state see them. Broadcasts are rare
//! control frames; data frames are copied exactly once, into the owner's
//! ring.

use metaroce_core::wire::packet::field;
use metaroce_core::wire::{PacketType, HEADER_LEN};

use crate::device::{FrameDevice, MemFrameDevice};

/// Most cores a dispatcher steers to (Elba and Salina have 16).
pub const MAX_CORES: usize = 16;

/// Which core owns a connection.
pub trait ConnOwner {
    /// The core owning the connection whose wire id is `dst_conn` (the
    /// destination id of a received packet), or `None` if no core does.
    fn owner_of(&self, dst_conn: u32) -> Option<usize>;
    /// Whether it learns from the ids cores announce: only then does the
    /// dispatcher parse the frames the cores send ([`ShardMap`] needs
    /// nothing of them, so a node steering by it parses no transmitted
    /// frame).
    const LEARNS: bool = false;
    /// Told of every connection id a core announces (the source id of a
    /// CONNECT or ACCEPT it sends), before the frame reaches the wire.
    fn learn(&mut self, src_conn: u32, core: usize) {
        let _ = (src_conn, core);
    }
}

/// Ownership in the sharded connection table: the slot index is in the
/// id's low `index_bits` bits, and core `c` owns slots
/// `[c * shard_size, (c + 1) * shard_size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    index_mask: u32,
    shard_size: u32,
    cores: u32,
}

impl ShardMap {
    /// `None` unless `1 <= cores <= MAX_CORES`, `index_bits <= 32`,
    /// `shard_size >= 1` and the `cores` shards fit the index space.
    pub const fn new(index_bits: u32, shard_size: u32, cores: usize) -> Option<ShardMap> {
        if cores == 0 || cores > MAX_CORES || index_bits > 32 || shard_size == 0 {
            return None;
        }
        let index_mask = if index_bits == 32 {
            u32::MAX
        } else {
            (1u32 << index_bits) - 1
        };
        let slots = shard_size as u64 * cores as u64;
        if slots > index_mask as u64 + 1 {
            return None;
        }
        Some(ShardMap {
            index_mask,
            shard_size,
            cores: cores as u32,
        })
    }

    /// The table's split for `capacity` slots over `cores` cores:
    /// `shard_size = capacity / cores` (the remainder is never used).
    pub const fn for_table(index_bits: u32, capacity: u32, cores: usize) -> Option<ShardMap> {
        if cores == 0 {
            return None;
        }
        Self::new(index_bits, capacity / cores as u32, cores)
    }

    /// The core owning `dst_conn`, if its index falls in a shard.
    pub const fn owner(&self, dst_conn: u32) -> Option<usize> {
        let core = (dst_conn & self.index_mask) / self.shard_size;
        if core < self.cores {
            Some(core as usize)
        } else {
            None
        }
    }
}

impl ConnOwner for ShardMap {
    fn owner_of(&self, dst_conn: u32) -> Option<usize> {
        self.owner(dst_conn)
    }
}

/// The core that handles a CONNECT from `src_ip` (4 or 16 bytes) whose
/// source connection id is `src_conn`: FNV-1a over both, reduced to
/// `0..cores` by multiply-and-shift (no division, no modulo bias worth
/// the name at 16 cores).
pub fn connect_core(src_ip: &[u8], src_conn: u32, cores: usize) -> usize {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in src_ip.iter().chain(&src_conn.to_be_bytes()) {
        hash = (hash ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    ((u64::from(hash) * cores as u64) >> 32) as usize
}

/// What a received frame is, as far as steering cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameClass {
    /// A MetaRoCE packet for connection `dst_conn`.
    Connection { dst_conn: u32 },
    /// A MetaRoCE CONNECT; `core` from [`connect_core`].
    Connect { core: usize },
    /// An ARP or ICMP echo reply: every core may be waiting for it.
    Reply,
    /// Everything core 0's engine handles: ARP and ICMP echo requests,
    /// other protocols and ports, malformed frames.
    Control,
}

const ETH_LEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_ARP: u16 = 0x0806;
const ARP_REPLY: u16 = 2;
const IP_PROTO_ICMP: u8 = 1;
const IP_PROTO_UDP: u8 = 17;
const ICMP_ECHO_REPLY: u8 = 0;
const UDP_LEN: usize = 8;
const IPV6_LEN: usize = 40;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Classifies a received Ethernet frame for MetaRoCE on UDP port
/// `udp_port`. Reads only the headers it needs (no checksums: the owning
/// core's engine checks everything) and never panics.
pub fn classify(frame: &[u8], udp_port: u16, cores: usize) -> FrameClass {
    classify_inner(frame, udp_port, cores).unwrap_or(FrameClass::Control)
}

fn classify_inner(frame: &[u8], udp_port: u16, cores: usize) -> Option<FrameClass> {
    let (src_ip, l4, proto) = match be16(frame, 12)? {
        ETHERTYPE_ARP => {
            return Some(if be16(frame, ETH_LEN + 6)? == ARP_REPLY {
                FrameClass::Reply
            } else {
                FrameClass::Control
            })
        }
        ETHERTYPE_IPV4 => {
            let ihl = usize::from(frame.get(ETH_LEN)? & 0x0f) * 4;
            // A fragment (MF set or an offset) has no whole UDP header.
            if ihl < 20 || be16(frame, ETH_LEN + 6)? & 0x3fff != 0 {
                return None;
            }
            let src = frame.get(ETH_LEN + 12..ETH_LEN + 16)?;
            (src, ETH_LEN + ihl, *frame.get(ETH_LEN + 9)?)
        }
        ETHERTYPE_IPV6 => {
            let src = frame.get(ETH_LEN + 8..ETH_LEN + 24)?;
            (src, ETH_LEN + IPV6_LEN, *frame.get(ETH_LEN + 6)?)
        }
        _ => return None,
    };
    match proto {
        IP_PROTO_ICMP if *frame.get(l4)? == ICMP_ECHO_REPLY => Some(FrameClass::Reply),
        IP_PROTO_UDP if be16(frame, l4 + 2)? == udp_port => {
            classify_packet(frame.get(l4 + UDP_LEN..)?, src_ip, cores)
        }
        _ => None,
    }
}

/// Classifies a MetaRoCE packet (a UDP payload, as a host's sockets
/// deliver it) from `src_ip` (4 or 16 bytes): a CONNECT by the hash of its
/// source ([`connect_core`]), anything else by its destination id. `None`
/// if it is too short to tell; it never panics and checks nothing else
/// (the owning core's endpoint does).
pub fn classify_packet(packet: &[u8], src_ip: &[u8], cores: usize) -> Option<FrameClass> {
    if packet.len() < HEADER_LEN {
        return None;
    }
    if PacketType::from(packet[field::TYPE]) == PacketType::Connect {
        let src_conn = be32(packet, HEADER_LEN + field::connect::SRC_CONN.start)?;
        return Some(FrameClass::Connect {
            core: connect_core(src_ip, src_conn, cores),
        });
    }
    Some(FrameClass::Connection {
        dst_conn: be32(packet, field::DST_CONN.start)?,
    })
}

/// The connection id a sent frame announces: the source id of a MetaRoCE
/// CONNECT or ACCEPT on `udp_port` (the peer's MetaRoCE port), if it is one.
pub fn announced_conn(frame: &[u8], udp_port: u16) -> Option<u32> {
    let l4 = match be16(frame, 12)? {
        ETHERTYPE_IPV4 => ETH_LEN + usize::from(frame.get(ETH_LEN)? & 0x0f) * 4,
        ETHERTYPE_IPV6 => ETH_LEN + IPV6_LEN,
        _ => return None,
    };
    if be16(frame, l4 + 2)? != udp_port {
        return None;
    }
    let packet = frame.get(l4 + UDP_LEN..)?;
    match PacketType::from(*packet.get(field::TYPE)?) {
        PacketType::Connect | PacketType::Accept => {
            be32(packet, HEADER_LEN + field::connect::SRC_CONN.start)
        }
        _ => None,
    }
}

/// Where [`Dispatcher::steer`] sends a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    Core(usize),
    /// A copy to every core.
    AllCores,
    /// No core owns its connection: dropped (counted).
    Drop,
}

/// Counters of a dispatcher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DispatchStats {
    /// Frames taken from the device.
    pub rx_frames: u64,
    /// Frames steered by connection id.
    pub by_conn: u64,
    /// CONNECTs steered by hash.
    pub connects: u64,
    /// Replies copied to every core.
    pub replies: u64,
    /// Frames for core 0's engine (control, not ours, malformed).
    pub control: u64,
    /// Frames whose connection no core owns.
    pub unroutable: u64,
    /// Frames dropped because the owner's ring was full.
    pub ring_full: u64,
    /// Frames moved from the cores' rings to the device.
    pub tx_frames: u64,
    /// Connection ids learned from sent CONNECTs and ACCEPTs.
    pub announced: u64,
}

/// The steering engine of a core that owns the network device.
#[derive(Debug)]
pub struct Dispatcher<O: ConnOwner> {
    owner: O,
    cores: usize,
    udp_port: u16,
    stats: DispatchStats,
    /// Frames delivered to each core's ring.
    delivered: [u64; MAX_CORES],
}

/// What one [`Dispatcher::receive`] or [`Dispatcher::transmit`] round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Frames taken from the device (receive) or from the rings (transmit).
    pub frames: u32,
    /// Bit `c` set: core `c`'s receive ring got frames (wake it).
    pub cores_fed: u32,
}

impl<O: ConnOwner> Dispatcher<O> {
    /// A dispatcher for `cores` cores (clamped to `1..=MAX_CORES`) of
    /// MetaRoCE on UDP port `udp_port`.
    pub fn new(owner: O, cores: usize, udp_port: u16) -> Self {
        Dispatcher {
            owner,
            cores: cores.clamp(1, MAX_CORES),
            udp_port,
            stats: DispatchStats::default(),
            delivered: [0; MAX_CORES],
        }
    }

    pub fn cores(&self) -> usize {
        self.cores
    }

    pub fn stats(&self) -> DispatchStats {
        self.stats
    }

    /// Frames delivered to core `core`'s receive ring so far.
    pub fn delivered(&self, core: usize) -> u64 {
        self.delivered.get(core).copied().unwrap_or(0)
    }

    pub fn owner(&self) -> &O {
        &self.owner
    }

    /// Where a received frame goes (counted).
    pub fn steer(&mut self, frame: &[u8]) -> Steer {
        match classify(frame, self.udp_port, self.cores) {
            FrameClass::Connection { dst_conn } => match self.owner.owner_of(dst_conn) {
                Some(core) if core < self.cores => {
                    self.stats.by_conn += 1;
                    Steer::Core(core)
                }
                _ => {
                    self.stats.unroutable += 1;
                    Steer::Drop
                }
            },
            FrameClass::Connect { core } => {
                self.stats.connects += 1;
                Steer::Core(core)
            }
            FrameClass::Reply => {
                self.stats.replies += 1;
                Steer::AllCores
            }
            FrameClass::Control => {
                self.stats.control += 1;
                Steer::Core(0)
            }
        }
    }

    /// Notes a frame core `core` is about to send (learns the connection
    /// id of a CONNECT or ACCEPT).
    pub fn note_sent(&mut self, core: usize, frame: &[u8]) {
        // The frame goes to the peer's MetaRoCE port, which is ours too.
        if let Some(id) = announced_conn(frame, self.udp_port) {
            self.stats.announced += 1;
            self.owner.learn(id, core);
        }
    }

    /// Moves up to `budget` received frames from `device` into the cores'
    /// receive rings (`rings[c]` is the dispatcher's end of core `c`'s
    /// link). A frame whose ring is full is dropped and counted, as a NIC
    /// drops on a full queue: the transport recovers it.
    pub fn receive<D: FrameDevice, const N: usize>(
        &mut self,
        device: &mut D,
        rings: &mut [MemFrameDevice<'_, N>],
        budget: u32,
    ) -> Round {
        let mut round = Round::default();
        let cores = self.cores.min(rings.len());
        for _ in 0..budget {
            let Some(()) = device.receive(|frame| {
                self.stats.rx_frames += 1;
                let (first, last) = match self.steer(frame) {
                    Steer::Core(c) => (c, c + 1),
                    Steer::AllCores => (0, cores),
                    Steer::Drop => (0, 0),
                };
                let targets = rings.iter_mut().enumerate().take(last.min(cores));
                for (c, ring) in targets.skip(first) {
                    if ring.send_frame(frame) {
                        self.delivered[c] += 1;
                        round.cores_fed |= 1 << c;
                    } else {
                        self.stats.ring_full += 1;
                    }
                }
            }) else {
                break;
            };
            round.frames += 1;
        }
        round
    }

    /// Moves up to `budget` frames from the cores' transmit rings to
    /// `device`, taking turns between cores so none starves the others.
    pub fn transmit<D: FrameDevice, const N: usize>(
        &mut self,
        device: &mut D,
        rings: &mut [MemFrameDevice<'_, N>],
        budget: u32,
    ) -> Round {
        let mut round = Round::default();
        let cores = self.cores.min(rings.len());
        let mut idle_cores = 0;
        let mut core = 0;
        while round.frames < budget && idle_cores < cores {
            if !device.transmit_ready() {
                break;
            }
            let ring = &mut rings[core];
            let moved = ring.receive_frame(|frame| {
                if let Some(id) = O::LEARNS
                    .then(|| announced_conn(frame, self.udp_port))
                    .flatten()
                {
                    self.stats.announced += 1;
                    self.owner.learn(id, core);
                }
                // The device had a slot (checked above); `f` copies it all.
                device
                    .transmit(frame.len(), |slot| slot.copy_from_slice(frame))
                    .is_some()
            });
            match moved {
                Some(sent) => {
                    idle_cores = 0;
                    round.frames += 1;
                    round.cores_fed |= 1 << core;
                    self.stats.tx_frames += u64::from(sent);
                }
                None => idle_cores += 1,
            }
            core = (core + 1) % cores;
        }
        round
    }
}

#[cfg(test)]
mod tests {
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
        assert!(
            core_ends[hashed].send_frame(&accept_frame(0x1234_0000, 0x4321_0000 | hashed as u32))
        );
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
        let (core_ends, mut rings): (Vec<_>, Vec<_>) =
            links.iter().map(|l| l.ends().unwrap()).unzip();
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
}
