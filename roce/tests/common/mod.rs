//! A two-host harness with a virtual clock: each host's NIC serializes at
//! line rate, a channel adds propagation delay and can drop, reorder and
//! CE-mark packets. Packets cross as real bytes: the sender gathers the
//! payload, appends pad and ICRC (`finish`), the receiver checks the ICRC
//! and hands the bytes to `handle_packet`. Everything is seeded.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use metaroce_core::api::{Access, Completion, ConnHandle, LocalBuf, PeerAddr, Region, RxMeta};
use metaroce_core::wire::encap::IpPair;
use metaroce_core::Instant;
use roce_baseline::wire::{icrc, Opcode, Repr};
use roce_baseline::{
    finish, ip_udp_header, transport_len, Config, QpSetup, RoceEndpoint, UDP_PORT,
};
use smoltcp::wire::{IpAddress, Ipv4Address};

/// SplitMix64: a small seeded generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Memory made of registered byte ranges. A write outside them panics: the
/// endpoint promises never to do that.
#[derive(Debug, Default)]
pub struct Mem {
    regions: BTreeMap<u64, Vec<u8>>,
}

impl Mem {
    pub fn add(&mut self, base: u64, len: usize) {
        self.regions.insert(base, vec![0; len]);
    }

    fn locate(&self, addr: u64, len: usize) -> (u64, usize) {
        let (&base, bytes) = self
            .regions
            .range(..=addr)
            .next_back()
            .unwrap_or_else(|| panic!("access at {addr:#x} outside memory"));
        let off = (addr - base) as usize;
        assert!(
            off + len <= bytes.len(),
            "access {addr:#x}+{len} outside memory"
        );
        (base, off)
    }

    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        let (base, off) = self.locate(addr, len);
        &self.regions[&base][off..off + len]
    }

    pub fn fill(&mut self, addr: u64, len: usize, seed: u64) {
        let mut rng = Rng::new(seed);
        let (base, off) = self.locate(addr, len);
        for b in &mut self.regions.get_mut(&base).unwrap()[off..off + len] {
            *b = rng.next_u64() as u8;
        }
    }

    pub fn hash(&self, addr: u64, len: usize) -> u32 {
        crc32fast::hash(self.slice(addr, len))
    }
}

impl metaroce_core::api::Memory for Mem {
    fn write(&mut self, addr: u64, data: &[u8]) {
        let (base, off) = self.locate(addr, data.len());
        self.regions.get_mut(&base).unwrap()[off..off + data.len()].copy_from_slice(data);
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        out.copy_from_slice(self.slice(addr, out.len()));
    }
}

/// What a host put on the wire.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub at: Instant,
    pub opcode: Opcode,
    pub psn: u32,
    pub dropped: bool,
}

pub struct Host {
    pub ep: RoceEndpoint<4>,
    pub mem: Mem,
    pub ip: Ipv4Address,
    pub qp: ConnHandle,
    pub nic_free: Instant,
    pub maybe_more: bool,
    pub completions: Vec<(Instant, Completion)>,
    pub sent: Vec<Sent>,
}

impl Host {
    /// Registers `[base, base + len)` with every right and returns a buffer.
    pub fn region(&mut self, base: u64, len: usize) -> LocalBuf {
        self.mem.add(base, len);
        let key = self
            .ep
            .register_region(Region {
                base,
                len: len as u64,
                access: Access::ALL,
                pd: 0,
            })
            .unwrap();
        LocalBuf {
            key,
            addr: base,
            len: len as u32,
        }
    }

    pub fn sent_data(&self) -> impl Iterator<Item = &Sent> {
        self.sent
            .iter()
            .filter(|s| s.opcode.is_request() || s.opcode.is_read_response())
    }
}

struct InFlight {
    arrive: Instant,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
    ce: bool,
    src_port: u16,
}

/// Decides the fate of packet `index` (per sending side) sent by `side`.
pub type Filter = Box<dyn FnMut(usize, &Repr, usize, Instant) -> bool>;

pub struct Pair {
    pub hosts: [Host; 2],
    pub now: Instant,
    pub rng: Rng,
    pub loss: f64,
    /// Probability that a packet is delayed by `reorder_delay` extra.
    pub reorder: f64,
    pub reorder_delay: Duration,
    pub delay: Duration,
    pub line_rate_bps: u64,
    /// Extra drops: `(side, repr, index, now)` -> drop.
    pub drop_filter: Option<Filter>,
    /// CE marks: `(side, repr, index, now)` -> mark.
    pub ce_filter: Option<Filter>,
    inflight: Vec<InFlight>,
    seq: u64,
    counts: [usize; 2],
    pub dropped: usize,
}

pub const A: usize = 0;
pub const B: usize = 1;
pub const QPN: [u32; 2] = [0x11, 0x22];
pub const FIRST_PSN: [u32; 2] = [0xff_fff0, 5000];

impl Pair {
    /// Two hosts with one QP each, wired together. A's first PSN is near the
    /// wrap so every test crosses 2^24.
    pub fn new(seed: u64, config: Config, mtu: u16) -> Pair {
        let ips = [Ipv4Address::new(10, 0, 0, 1), Ipv4Address::new(10, 0, 0, 2)];
        let make = |me: usize| {
            let other = 1 - me;
            let mut ep = RoceEndpoint::new(config);
            let mut setup = QpSetup::new(
                QPN[me],
                PeerAddr {
                    ip: IpAddress::Ipv4(ips[other]),
                    port: UDP_PORT,
                },
                QPN[other],
                FIRST_PSN[me],
                FIRST_PSN[other],
            );
            setup.mtu = mtu;
            let qp = ep.create_qp(setup).unwrap();
            Host {
                ep,
                mem: Mem::default(),
                ip: ips[me],
                qp,
                nic_free: Instant::ZERO,
                maybe_more: false,
                completions: Vec::new(),
                sent: Vec::new(),
            }
        };
        Pair {
            hosts: [make(A), make(B)],
            now: Instant::ZERO,
            rng: Rng::new(seed),
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(3),
            delay: Duration::from_micros(2),
            line_rate_bps: config.line_rate_bps,
            drop_filter: None,
            ce_filter: None,
            inflight: Vec::new(),
            seq: 0,
            counts: [0, 0],
            dropped: 0,
        }
    }

    fn transmit(&mut self, side: usize) -> bool {
        let now = self.now;
        let host = &mut self.hosts[side];
        if host.nic_free > now {
            return false;
        }
        let mut header = [0u8; 64];
        let Some(t) = host.ep.poll_transmit(now, &mut header) else {
            host.maybe_more = false;
            return false;
        };
        let mut payload = vec![0u8; t.payload.map_or(0, |p| p.len as usize)];
        if let Some(p) = t.payload {
            metaroce_core::api::Memory::read(&mut host.mem, p.addr, &mut payload);
        }
        let header = &header[..t.header_len];
        let len = transport_len(header, payload.len());
        let IpAddress::Ipv4(dst) = t.peer.ip else {
            panic!("IPv4 only")
        };
        let ip = IpPair::V4 { src: host.ip, dst };
        let ip_udp = ip_udp_header(&ip, t.src_port, UDP_PORT, len).unwrap();
        let mut bytes = vec![0u8; len];
        assert_eq!(
            finish(&mut bytes, header, &payload, ip_udp.as_bytes()).unwrap(),
            len
        );
        let (repr, _) = Repr::parse(&bytes).unwrap();
        let index = self.counts[side];
        self.counts[side] += 1;
        let wire_bits = (len as u64 + 66) * 8;
        let ser = Duration::from_nanos(wire_bits * 1_000_000_000 / self.line_rate_bps);
        host.nic_free = now + ser;
        host.maybe_more = true;
        let mut drop = self.rng.chance(self.loss);
        if let Some(f) = self.drop_filter.as_mut() {
            drop |= f(side, &repr, index, now);
        }
        let ce = self
            .ce_filter
            .as_mut()
            .is_some_and(|f| f(side, &repr, index, now));
        host.sent.push(Sent {
            at: now,
            opcode: repr.bth.opcode,
            psn: repr.bth.psn,
            dropped: drop,
        });
        if drop {
            self.dropped += 1;
            return true;
        }
        let mut arrive = host.nic_free + self.delay;
        if self.rng.chance(self.reorder) {
            arrive += self.reorder_delay;
        }
        self.seq += 1;
        self.inflight.push(InFlight {
            arrive,
            seq: self.seq,
            to: 1 - side,
            bytes,
            ce,
            src_port: t.src_port,
        });
        true
    }

    fn deliver_due(&mut self) -> bool {
        let now = self.now;
        let mut due: Vec<InFlight> = Vec::new();
        let mut i = 0;
        while i < self.inflight.len() {
            if self.inflight[i].arrive <= now {
                due.push(self.inflight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| (p.arrive, p.seq));
        let any = !due.is_empty();
        for p in due {
            let from = 1 - p.to;
            let ip = IpPair::V4 {
                src: self.hosts[from].ip,
                dst: self.hosts[p.to].ip,
            };
            let ip_udp = ip_udp_header(&ip, p.src_port, UDP_PORT, p.bytes.len()).unwrap();
            icrc::verify(ip_udp.as_bytes(), &p.bytes).expect("ICRC");
            let meta = RxMeta {
                source: PeerAddr {
                    ip: IpAddress::Ipv4(self.hosts[from].ip),
                    port: p.src_port,
                },
                ce: p.ce,
            };
            let host = &mut self.hosts[p.to];
            host.ep
                .try_handle_packet(now, &meta, &p.bytes, &mut host.mem)
                .expect("packet accepted");
        }
        any
    }

    fn settle(&mut self) {
        loop {
            let mut progress = self.deliver_due();
            for side in [A, B] {
                let host = &mut self.hosts[side];
                if host.ep.poll_timeout().is_some_and(|t| t <= self.now) {
                    host.ep.handle_timeout(self.now);
                    progress = true;
                }
            }
            for side in [A, B] {
                progress |= self.transmit(side);
            }
            for host in &mut self.hosts {
                while let Some(c) = host.ep.poll_completion() {
                    host.completions.push((self.now, c));
                }
            }
            if !progress {
                break;
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        let arrivals = self.inflight.iter().map(|p| p.arrive);
        let nics = self
            .hosts
            .iter()
            .filter(|h| h.maybe_more)
            .map(|h| h.nic_free);
        let timers = self.hosts.iter().filter_map(|h| h.ep.poll_timeout());
        arrivals.chain(nics).chain(timers).min()
    }

    /// Runs until `done` holds (true), nothing is left to do, or the clock
    /// passes `limit` (false).
    pub fn run_until(&mut self, limit: Instant, mut done: impl FnMut(&Pair) -> bool) -> bool {
        loop {
            self.settle();
            if done(self) {
                return true;
            }
            let Some(next) = self.next_event() else {
                return false;
            };
            if next > limit {
                return false;
            }
            self.now = self.now.max(next);
        }
    }

    /// Completions of `side` so far.
    pub fn completions(&self, side: usize) -> Vec<Completion> {
        self.hosts[side]
            .completions
            .iter()
            .map(|(_, c)| *c)
            .collect()
    }
}
