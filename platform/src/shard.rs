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
/// core's engine verifies them, unless the device did, see
/// [`Dispatcher::receive`]) and never panics.
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
/// source ([`connect_core`]), an early packet (flag EARLY, spec 4.2.4: it
/// carries the initiator's own id where a CONNECT carries it as Source
/// Connection ID) by the same hash, so it reaches its CONNECT's core,
/// anything else by its destination id. `None` if it is too short to
/// tell; it never panics and checks nothing else (the owning core's
/// endpoint does).
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
    // Only an endpoint with the cipher takes early packets (spec 4.2.4).
    if metaroce_core::crypto::SUPPORTED
        && be16(packet, field::FLAGS.start)? & metaroce_core::wire::Flags::EARLY.0 != 0
    {
        let own_conn = be32(packet, field::DST_CONN.start)?;
        return Some(FrameClass::Connect {
            core: connect_core(src_ip, own_conn, cores),
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
    ///
    /// Each frame goes with the device's verdicts on it
    /// ([`crate::device::RxVerdict`]): what the device verified, the core's
    /// engine does not verify again; what it did not (QEMU's virtio-net:
    /// nothing), that engine verifies. So every frame's checksums are
    /// verified once on the node (spec 3.1.5), and the work stays on the
    /// cores rather than on this one.
    pub fn receive<D: FrameDevice, const N: usize>(
        &mut self,
        device: &mut D,
        rings: &mut [MemFrameDevice<'_, N>],
        budget: u32,
    ) -> Round {
        let mut round = Round::default();
        let cores = self.cores.min(rings.len());
        for _ in 0..budget {
            let Some(()) = device.receive_with_verdict(|frame, verdict| {
                self.stats.rx_frames += 1;
                let (first, last) = match self.steer(frame) {
                    Steer::Core(c) => (c, c + 1),
                    Steer::AllCores => (0, cores),
                    Steer::Drop => (0, 0),
                };
                let targets = rings.iter_mut().enumerate().take(last.min(cores));
                for (c, ring) in targets.skip(first) {
                    if ring.send_frame_with_verdict(frame, verdict) {
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
mod tests;
