//! A virtual-clock cluster for engine tests: endpoints joined by a channel
//! that drops, delays (with per-path skew), reorders, duplicates and
//! CE-marks packets. The clock jumps straight to the next deadline, so a
//! run takes no wall-clock time beyond the work done. Everything is seeded.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Memory, PeerAddr, Region, RxMeta, Transmit,
};
use metaroce_core::storage::buddy::BuddyNode;
use metaroce_core::storage::pool::PoolEntry;
use metaroce_core::wire::packet::crc32;
use metaroce_core::wire::{CrcVerdict, CRC_LEN};
use metaroce_core::{Backing, Config, Endpoint, Event, Instant, Layout, Storage};
use smoltcp::wire::{IpAddress, Ipv4Address};

pub const PATHS: usize = 16;
pub type Ep = Endpoint<TestHeap, PATHS>;

/// Heap storage for tests (the core itself never allocates).
#[derive(Debug)]
pub struct TestHeap;

impl Backing for TestHeap {
    type Slice<T: 'static> = Vec<T>;
}

/// Storage of `layout` on the heap.
pub fn storage<const P: usize>(layout: &Layout) -> Storage<TestHeap, P> {
    use metaroce_core::conn::{InflightRecord, RecvEntry, SenderState, WorkEntry};
    use metaroce_core::memory::RegionSlot;
    Storage {
        connections: vec![metaroce_core::ConnSlot::VACANT; layout.connections as usize],
        connection_index: vec![0; layout.index_slots()],
        work_entries: vec![PoolEntry::vacant(WorkEntry::VACANT); layout.work_entries as usize],
        recv_entries: vec![PoolEntry::vacant(RecvEntry::VACANT); layout.recv_entries as usize],
        senders: vec![PoolEntry::vacant(SenderState::VACANT); layout.senders as usize],
        inflight_records: vec![InflightRecord::EMPTY; layout.inflight_records_used()],
        inflight_nodes: vec![BuddyNode::INIT; layout.inflight_nodes()],
        reorder_words: vec![0; layout.reorder_words_used()],
        reorder_nodes: vec![BuddyNode::INIT; layout.reorder_nodes()],
        regions: vec![RegionSlot::VACANT; layout.regions as usize],
        sources: vec![metaroce_core::SourceBucket::EMPTY; layout.sources as usize],
        cookies: vec![PoolEntry::vacant([0; 32]); layout.cookies as usize],
        key_slots: vec![metaroce_core::crypto::KeySlot::VACANT; layout.key_slots as usize],
    }
}

/// A test endpoint with room for `connections`.
pub fn endpoint<const P: usize>(
    config: Config,
    connections: u32,
    seed: u64,
) -> Endpoint<TestHeap, P> {
    let layout = Layout::for_connections(connections);
    Endpoint::new(
        config,
        storage(&layout),
        metaroce_core::rng::seed_from_u64(seed),
    )
}

/// Fill value of memory nobody may write.
pub const SENTINEL: u8 = 0xEE;

/// SplitMix64 for the channel's decisions.
#[derive(Clone)]
pub struct TestRng(u64);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        TestRng(seed ^ 0x5151_5151)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A node's memory: one flat arena at `base`, sentinel-filled; writes
/// outside registered regions would be caught by the sentinel check.
pub struct Arena {
    pub base: u64,
    pub bytes: Vec<u8>,
    pub writes: u64,
}

impl Arena {
    pub fn new(base: u64, len: usize) -> Self {
        Arena {
            base,
            bytes: vec![SENTINEL; len],
            writes: 0,
        }
    }
    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        let off = (addr - self.base) as usize;
        &self.bytes[off..off + len]
    }
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let off = (addr - self.base) as usize;
        &mut self.bytes[off..off + len]
    }
}

impl Memory for Arena {
    fn write(&mut self, addr: u64, data: &[u8]) {
        self.writes += 1;
        let off = addr
            .checked_sub(self.base)
            .expect("engine wrote below the arena") as usize;
        self.bytes[off..off + data.len()].copy_from_slice(data);
    }
    fn read(&mut self, addr: u64, out: &mut [u8]) {
        let off = (addr - self.base) as usize;
        out.copy_from_slice(&self.bytes[off..off + out.len()]);
    }
}

/// Channel impairments.
#[derive(Clone, Debug)]
pub struct Impairments {
    pub loss: f64,
    pub duplicate: f64,
    /// Probability that a packet gets extra random delay (reordering).
    pub reorder: f64,
    pub reorder_extra: Duration,
    /// One-way base delay.
    pub delay: Duration,
    /// Extra one-way delay per path, spread linearly by entropy: path with
    /// the largest hash gets `skew` more than the smallest.
    pub skew: Duration,
    /// CE-mark probability (of ECN-capable packets).
    pub ce: f64,
    /// Per-entropy extra loss: (udp source port, loss probability).
    pub bad_entropy: Vec<(u16, f64)>,
    /// Serialization: one packet per this many ns per destination (0 = none).
    pub link_ns_per_byte: f64,
    /// Mark CE when a destination's queue holds more than this many packets.
    pub mark_queue_threshold: usize,
}

impl Default for Impairments {
    fn default() -> Self {
        Impairments {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_extra: Duration::from_micros(5),
            delay: Duration::from_micros(4),
            skew: Duration::ZERO,
            ce: 0.0,
            bad_entropy: Vec::new(),
            link_ns_per_byte: 0.0,
            mark_queue_threshold: usize::MAX,
        }
    }
}

pub struct Node<const P: usize = PATHS> {
    pub ep: Endpoint<TestHeap, P>,
    pub mem: Arena,
    pub ip: Ipv4Address,
    pub completions: Vec<Completion>,
    pub events: Vec<Event>,
}

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    meta: RxMeta,
    bytes: Vec<u8>,
}

/// Counts of what the channel did.
#[derive(Default, Debug, Clone)]
pub struct ChannelStats {
    pub sent: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub marked: u64,
    pub delivered: u64,
    pub data_sent_by_entropy: BTreeMap<u16, u64>,
}

/// Sees every packet (sender index, bytes); may edit it; returns true to drop it.
pub type Tamper = Box<dyn FnMut(usize, &mut Vec<u8>) -> bool>;

pub struct Cluster<const P: usize = PATHS> {
    pub now: Instant,
    pub nodes: Vec<Node<P>>,
    pub imp: Impairments,
    pub rng: TestRng,
    queue: BTreeMap<(Instant, u64), InFlight>,
    seq: u64,
    /// Per destination: when its link is free again (serialization model).
    link_free: Vec<Instant>,
    pub stats: ChannelStats,
    pub trace: bool,
    /// Optional filter: drop packets for which it returns true.
    pub tamper: Option<Tamper>,
    /// When `Some`, every packet sent: (node, UDP source port, bytes),
    /// before the channel's loss, for replaying them.
    pub log: Option<Vec<(usize, u16, Vec<u8>)>>,
    /// The CRC trailer is the "device's" (a NIC's CRC offload): senders
    /// leave it zero (`seal_transmit`), the channel writes it, and
    /// receivers take the channel's verdict on it
    /// (`handle_packet_with_verdict`).
    pub crc_offload: bool,
}

pub const ARENA_BASE: u64 = 0x1000_0000;
pub const ARENA_LEN: usize = 4 << 20;

impl<const P: usize> Cluster<P> {
    pub fn new(n: usize, config: Config, imp: Impairments, seed: u64) -> Self {
        Self::with_capacity(n, 8, config, imp, seed)
    }

    /// `n` nodes whose endpoints hold `capacity` connections each.
    pub fn with_capacity(
        n: usize,
        capacity: u32,
        config: Config,
        imp: Impairments,
        seed: u64,
    ) -> Self {
        let layout = Layout::for_connections(capacity);
        Self::with_nodes(&vec![config; n], layout, ARENA_LEN, imp, seed)
    }

    /// One node per configuration, each with storage of `layout` and an
    /// arena of `arena_len` bytes.
    pub fn with_nodes(
        configs: &[Config],
        layout: Layout,
        arena_len: usize,
        imp: Impairments,
        seed: u64,
    ) -> Self {
        let n = configs.len();
        let nodes = configs
            .iter()
            .enumerate()
            .map(|(i, config)| Node {
                ep: Endpoint::new(
                    *config,
                    storage(&layout),
                    metaroce_core::rng::seed_from_u64(
                        seed.wrapping_mul(31).wrapping_add(i as u64 + 1),
                    ),
                ),
                mem: Arena::new(ARENA_BASE, arena_len),
                ip: Ipv4Address::new(10, 0, 0, i as u8 + 1),
                completions: Vec::new(),
                events: Vec::new(),
            })
            .collect();
        Cluster {
            now: Instant::from_micros(1),
            nodes,
            imp,
            rng: TestRng::new(seed),
            queue: BTreeMap::new(),
            seq: 0,
            link_free: vec![Instant::ZERO; n],
            stats: ChannelStats::default(),
            trace: false,
            tamper: None,
            log: None,
            crc_offload: false,
        }
    }

    pub fn addr(&self, i: usize) -> PeerAddr {
        PeerAddr {
            ip: IpAddress::Ipv4(self.nodes[i].ip),
            port: metaroce_core::wire::DEFAULT_UDP_PORT,
        }
    }

    fn node_of(&self, ip: IpAddress) -> Option<usize> {
        self.nodes.iter().position(|n| IpAddress::Ipv4(n.ip) == ip)
    }

    /// Registers `[addr, addr+len)` on node `i` with `access`; returns the key.
    pub fn register(&mut self, i: usize, addr: u64, len: u64, access: Access) -> u32 {
        self.nodes[i]
            .ep
            .register_region(Region {
                base: addr,
                len,
                access,
                pd: 0,
            })
            .expect("register")
    }

    pub fn local(&self, key: u32, addr: u64, len: u32) -> LocalBuf {
        LocalBuf { key, addr, len }
    }

    /// Connects node a to node b and runs until both are established.
    pub fn connect(&mut self, a: usize, b: usize) -> (ConnHandle, ConnHandle) {
        let peer = self.addr(b);
        let h = self.nodes[a]
            .ep
            .connect(self.now, peer, 0)
            .expect("connect");
        let deadline = self.now + Duration::from_millis(200);
        self.run_until(deadline, |c| {
            c.nodes[a]
                .events
                .iter()
                .any(|e| matches!(e, Event::Connected(x) if *x == h))
        });
        let hb = self.nodes[b].events.iter().find_map(|e| match e {
            Event::Connected(x) => Some(*x),
            _ => None,
        });
        let hb = match hb {
            Some(h) => h,
            None => {
                // The acceptor establishes on the initiator's first packet.
                self.run_until(self.now + Duration::from_millis(200), |c| {
                    c.nodes[b]
                        .events
                        .iter()
                        .any(|e| matches!(e, Event::Connected(_)))
                });
                self.nodes[b]
                    .events
                    .iter()
                    .find_map(|e| match e {
                        Event::Connected(x) => Some(*x),
                        _ => None,
                    })
                    .expect("acceptor never established")
            }
        };
        (h, hb)
    }

    fn entropy_skew(&self, src_port: u16) -> Duration {
        if self.imp.skew.is_zero() {
            return Duration::ZERO;
        }
        // A fixed pseudo-random position per entropy in [0, 1].
        let h = (u64::from(src_port).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f64
            / (1u64 << 24) as f64;
        self.imp.skew.mul_f64(h)
    }

    fn enqueue(&mut self, from: usize, t: &Transmit, bytes: Vec<u8>) {
        self.stats.sent += 1;
        let Some(to) = self.node_of(t.peer.ip) else {
            return;
        };
        let is_data = t.payload.is_some() || t.ecn != 0;
        if is_data {
            *self
                .stats
                .data_sent_by_entropy
                .entry(t.src_port)
                .or_default() += 1;
        }
        if let Some(log) = self.log.as_mut() {
            log.push((from, t.src_port, bytes.clone()));
        }
        let mut loss = self.imp.loss;
        if let Some((_, l)) = self.imp.bad_entropy.iter().find(|(e, _)| *e == t.src_port) {
            loss = 1.0 - (1.0 - loss) * (1.0 - l);
        }
        if self.rng.unit() < loss {
            self.stats.dropped += 1;
            return;
        }
        let mut bytes = bytes;
        if let Some(f) = self.tamper.as_mut() {
            if f(from, &mut bytes) {
                self.stats.dropped += 1;
                return;
            }
        }
        let copies = if self.rng.unit() < self.imp.duplicate {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at = self.now + self.imp.delay + self.entropy_skew(t.src_port);
            if self.imp.link_ns_per_byte > 0.0 {
                let ser =
                    Duration::from_nanos((bytes.len() as f64 * self.imp.link_ns_per_byte) as u64);
                let start = self.link_free[to].max(self.now);
                self.link_free[to] = start + ser;
                at = at.max(start + ser + self.imp.delay);
            }
            if self.rng.unit() < self.imp.reorder {
                at += Duration::from_nanos(
                    self.rng.below(self.imp.reorder_extra.as_nanos() as u64 + 1),
                );
            }
            let over_threshold = self.imp.mark_queue_threshold != usize::MAX
                && self.queue.values().filter(|f| f.to == to).count()
                    > self.imp.mark_queue_threshold;
            let mut ce = false;
            if t.ecn != 0 && (self.rng.unit() < self.imp.ce || over_threshold) {
                ce = true;
                self.stats.marked += 1;
            }
            let meta = RxMeta {
                source: PeerAddr {
                    ip: IpAddress::Ipv4(self.nodes[from].ip),
                    port: t.src_port,
                },
                ce,
            };
            self.seq += 1;
            self.queue.insert(
                (at, self.seq),
                InFlight {
                    at,
                    seq: self.seq,
                    to,
                    meta,
                    bytes: bytes.clone(),
                },
            );
        }
    }

    /// Lets every node transmit what it wants to now.
    fn flush_transmits(&mut self) {
        let mut buf = vec![0u8; 9200];
        for i in 0..self.nodes.len() {
            loop {
                let now = self.now;
                let node = &mut self.nodes[i];
                let Some(t) = node.ep.poll_transmit(now, &mut buf) else {
                    break;
                };
                let len = if self.crc_offload {
                    let (hl, len) = (t.header_len, t.packet_len());
                    if let Some(p) = t.payload {
                        node.mem.read(p.addr, &mut buf[hl..hl + p.len as usize]);
                    }
                    node.ep.seal_transmit(&t, &mut buf[..len]);
                    let (body, trailer) = buf[..len].split_at_mut(len - CRC_LEN);
                    assert_eq!(trailer, [0; CRC_LEN], "the trailer is the device's");
                    trailer.copy_from_slice(&crc32(&[body]).to_be_bytes());
                    len
                } else {
                    node.ep.finish_packet(&t, &mut buf, &mut node.mem)
                };
                let bytes = buf[..len].to_vec();
                self.enqueue(i, &t, bytes);
            }
            let node = &mut self.nodes[i];
            while let Some(c) = node.ep.poll_completion() {
                node.completions.push(c);
            }
            while let Some(e) = node.ep.poll_event() {
                node.events.push(e);
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut t = self.queue.keys().next().map(|k| k.0);
        for n in &self.nodes {
            if let Some(x) = n.ep.poll_timeout() {
                t = Some(t.map_or(x, |t: Instant| t.min(x)));
            }
        }
        t
    }

    /// One step: deliver what is due, run timers, transmit. Returns false
    /// when nothing will ever happen again.
    pub fn step(&mut self) -> bool {
        self.flush_transmits();
        let Some(t) = self.next_deadline() else {
            return false;
        };
        if t > self.now {
            self.now = t;
        }
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let f = entry.remove();
            self.stats.delivered += 1;
            let node = &mut self.nodes[f.to];
            if self.crc_offload {
                let (body, trailer) = f.bytes.split_at(f.bytes.len().saturating_sub(CRC_LEN));
                let verdict = if trailer.len() == CRC_LEN && crc32(&[body]).to_be_bytes() == trailer
                {
                    CrcVerdict::Good
                } else {
                    CrcVerdict::Bad
                };
                node.ep.handle_packet_with_verdict(
                    self.now,
                    &f.meta,
                    &f.bytes,
                    verdict,
                    &mut node.mem,
                );
            } else {
                node.ep
                    .handle_packet(self.now, &f.meta, &f.bytes, &mut node.mem);
            }
        }
        for n in &mut self.nodes {
            if n.ep.poll_timeout().is_some_and(|d| d <= self.now) {
                n.ep.handle_timeout(self.now);
            }
        }
        self.flush_transmits();
        true
    }

    /// Runs until `done` holds or `deadline` passes; returns whether `done` held.
    pub fn run_until(&mut self, deadline: Instant, mut done: impl FnMut(&Self) -> bool) -> bool {
        let mut guard = 0u64;
        loop {
            if done(self) {
                return true;
            }
            if self.now > deadline || !self.step() {
                return done(self);
            }
            guard += 1;
            assert!(guard < 50_000_000, "simulation did not progress");
        }
    }
}

/// Deterministic pattern for message `m` byte `i`.
pub fn pattern(seed: u64, m: u64, i: usize) -> u8 {
    let x = seed
        .wrapping_mul(0x100_0000_01b3)
        .wrapping_add(m.wrapping_mul(0x9e37_79b9))
        .wrapping_add(i as u64 * 0x85eb_ca6b);
    (x ^ (x >> 29) ^ (x >> 13)) as u8
}

/// FNV-1a, for comparing regions.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
