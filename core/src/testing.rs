//! Stateful fuzzing of the endpoint (feature `testing`, host only): one
//! function, [`endpoints`], turns arbitrary bytes into a sequence of
//! operations on two endpoints and a hostile third party: connections
//! opened, closed and released; regions registered and deregistered; work
//! posted with good and bad keys, bounds and handles; packets delivered,
//! dropped, duplicated, reordered and corrupted; arbitrary datagrams from
//! strangers; time passing. With protection on (the input's first bit) the
//! endpoints share a pre-shared key and require packet protection, so
//! corrupted and stranger packets reach the AEAD open path.
//!
//! It checks what must hold whatever the input: nothing panics, the
//! endpoint reads and writes memory only inside regions registered at that
//! moment, and drop counters never go backwards. `cargo fuzz` runs it for
//! as long as one likes (`fuzz/fuzz_targets/endpoint.rs`); `cargo test`
//! runs it on a bounded, seeded set of inputs
//! (`core/tests/stateful_fuzz.rs`). It allocates (`alloc`): it is a test
//! harness, never part of firmware.

use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use smoltcp::wire::{IpAddress, Ipv4Address};

use crate::api::{
    Access, ConnHandle, LocalBuf, Memory, Op, PeerAddr, RecvRequest, Region, RxMeta, WorkRequest,
};
use crate::config::Config;
use crate::crypto::{Policy, ProtectionConfig};
use crate::storage::{Heap, Layout};
use crate::wire::MemoryTarget;
use crate::{Endpoint, Instant};

/// Paths of the fuzzed endpoints.
const PATHS: usize = 4;
/// Where each endpoint's memory starts, and its size.
const ARENA_BASE: u64 = 0x10_0000;
const ARENA_LEN: usize = 64 * 1024;
/// Packets held in flight per direction at most.
const MAX_IN_FLIGHT: usize = 256;
/// The pre-shared key of protected runs.
const PSK: [u8; 32] = [0x42; 32];

/// What a run did (for the bounded tests to see that inputs reach deep).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub operations: u32,
    pub packets_delivered: u32,
    pub strangers: u32,
    pub completions: u32,
    pub connected: u32,
    pub memory_writes: u32,
    pub memory_reads: u32,
}

/// Reads the input as a stream of small numbers (zero when it runs out).
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from(self.byte()) << 8 | u16::from(self.byte())
    }

    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let start = self.at.min(self.bytes.len());
        let end = (start + n).min(self.bytes.len());
        self.at = end;
        &self.bytes[start..end]
    }
}

/// An endpoint's memory: a flat arena; every access must fall inside a
/// region registered now (the endpoint checks keys first, this checks the
/// endpoint).
struct Arena {
    bytes: Vec<u8>,
    regions: Vec<(u32, Region)>,
    writes: u32,
    reads: u32,
}

impl Arena {
    fn covered(&self, addr: u64, len: usize) -> bool {
        self.regions
            .iter()
            .any(|(_, r)| r.contains(addr, len as u64))
    }
}

impl Memory for Arena {
    fn write(&mut self, addr: u64, data: &[u8]) {
        assert!(
            self.covered(addr, data.len()),
            "the endpoint wrote {} bytes at {addr:#x}, outside every registered region",
            data.len()
        );
        let off = (addr - ARENA_BASE) as usize;
        self.bytes[off..off + data.len()].copy_from_slice(data);
        self.writes += 1;
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        assert!(
            self.covered(addr, out.len()),
            "the endpoint read {} bytes at {addr:#x}, outside every registered region",
            out.len()
        );
        self.reads += 1;
        let off = (addr - ARENA_BASE) as usize;
        out.copy_from_slice(&self.bytes[off..off + out.len()]);
    }
}

struct Side {
    ep: Endpoint<Heap, PATHS>,
    mem: Arena,
    addr: PeerAddr,
    /// Handles this side was given (valid or not any more).
    handles: Vec<ConnHandle>,
    /// Packets towards this side: (source, bytes).
    inbox: Vec<(PeerAddr, Vec<u8>)>,
    drops_seen: u64,
}

fn peer(last: u8) -> PeerAddr {
    PeerAddr {
        ip: IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, last)),
        port: crate::wire::DEFAULT_UDP_PORT,
    }
}

fn side(last: u8, seed: u64, protected: bool) -> Side {
    let mut config = Config {
        paths: PATHS as u16,
        mtu: 1024,
        ..Config::default()
    };
    if protected {
        config.protection = ProtectionConfig {
            policy: Policy::Require,
            key_id: 1,
        };
    }
    let layout = Layout::for_connections(8);
    let mut ep = Endpoint::new(
        config,
        layout.heap_storage(),
        crate::rng::seed_from_u64(seed),
    );
    if protected {
        // A fresh keyring takes its first key.
        ep.add_psk(1, &PSK)
            .expect("the first key of an empty keyring");
    }
    Side {
        ep,
        mem: Arena {
            bytes: vec![0u8; ARENA_LEN],
            regions: Vec::new(),
            writes: 0,
            reads: 0,
        },
        addr: peer(last),
        handles: Vec::new(),
        inbox: Vec::new(),
        drops_seen: 0,
    }
}

/// Total of an endpoint's drop counters.
fn drops(s: &Side) -> u64 {
    let d = s.ep.drops();
    d.total()
}

/// Runs the operations `data` describes; panics if an invariant breaks.
pub fn endpoints(data: &[u8]) -> Outcome {
    let mut input = Input { bytes: data, at: 0 };
    let protected = input.byte() & 1 == 1;
    let mut sides = [side(1, 1, protected), side(2, 2, protected)];
    let mut now = Instant::from_micros(1);
    let mut out = Outcome::default();
    let mut buf = vec![0u8; 9200];
    let mut last_packet: Vec<u8> = Vec::new();
    while !input.done() && out.operations < 2_000 {
        out.operations += 1;
        let op = input.byte() % 12;
        let who = usize::from(input.byte() & 1);
        match op {
            0 => {
                now += Duration::from_nanos(u64::from(input.u16()) * 1000);
                for s in &mut sides {
                    if s.ep.poll_timeout().is_some_and(|d| d <= now) {
                        s.ep.handle_timeout(now);
                    }
                }
            }
            1 => {
                let target = sides[1 - who].addr;
                if let Ok(h) = sides[who].ep.connect(now, target, 0) {
                    sides[who].handles.push(h);
                }
            }
            2 => {
                let s = &mut sides[who];
                let base = ARENA_BASE + u64::from(input.byte()) * 256;
                let len = u64::from(input.u16() % 8192) + 1;
                let room = ARENA_BASE + ARENA_LEN as u64;
                let region = Region {
                    base,
                    len: len.min(room - base),
                    access: Access(input.byte() & 7),
                    pd: 0,
                };
                if let Ok(key) = s.ep.register_region(region) {
                    s.mem.regions.push((key, region));
                }
            }
            3 => {
                let s = &mut sides[who];
                if !s.mem.regions.is_empty() {
                    let i = usize::from(input.byte()) % s.mem.regions.len();
                    let (key, _) = s.mem.regions[i];
                    if s.ep.deregister_region(key).is_ok() {
                        s.mem.regions.swap_remove(i);
                    }
                }
            }
            4 | 5 => {
                let (h, local) = pick_work(&mut input, &sides[who]);
                let Some(h) = h else { continue };
                if op == 5 {
                    let _ = sides[who].ep.post_recv(
                        h,
                        RecvRequest {
                            id: u64::from(input.byte()),
                            local,
                        },
                    );
                    continue;
                }
                let remote = {
                    let other = &sides[1 - who];
                    let key = match other.mem.regions.first() {
                        Some(&(k, _)) if input.byte() & 3 != 0 => k,
                        _ => u32::from(input.u16()),
                    };
                    MemoryTarget {
                        key,
                        addr: ARENA_BASE + u64::from(input.u16()),
                    }
                };
                let op = match input.byte() % 5 {
                    0 => Op::Write { remote },
                    1 => Op::WriteImm {
                        remote,
                        imm: u32::from(input.byte()),
                    },
                    2 => Op::Send,
                    3 => Op::SendImm { imm: 7 },
                    _ => Op::Read { remote },
                };
                let id = u64::from(input.byte());
                let _ = sides[who].ep.post_send(h, WorkRequest { id, op, local });
            }
            6 => {
                // Deliver, drop, duplicate or corrupt what is in flight.
                let n = usize::from(input.byte() % 32) + 1;
                for _ in 0..n {
                    let s = &mut sides[who];
                    if s.inbox.is_empty() {
                        break;
                    }
                    let pick = usize::from(input.byte()) % s.inbox.len();
                    let fate = input.byte();
                    let (from, mut bytes) = if fate & 0x30 == 0x30 {
                        s.inbox[pick].clone()
                    } else {
                        s.inbox.remove(pick)
                    };
                    if fate & 0x0f == 0x0f {
                        continue;
                    }
                    if fate & 0xc0 == 0xc0 && !bytes.is_empty() {
                        let at = usize::from(input.u16()) % bytes.len();
                        bytes[at] ^= input.byte() | 1;
                    }
                    last_packet.clone_from(&bytes);
                    let meta = RxMeta {
                        source: from,
                        ce: fate & 0x08 != 0,
                    };
                    s.ep.handle_packet(now, &meta, &bytes, &mut s.mem);
                    out.packets_delivered += 1;
                }
            }
            7 | 8 => {
                // A stranger's datagram: arbitrary bytes, or the last packet
                // seen with one byte changed, from another address or the
                // peer's address (a spoofer).
                let len = usize::from(input.byte());
                let mut bytes = if op == 7 {
                    input.take(len).to_vec()
                } else {
                    last_packet.clone()
                };
                if op == 8 && !bytes.is_empty() {
                    let at = usize::from(input.u16()) % bytes.len();
                    bytes[at] = input.byte();
                }
                let source = if input.byte() & 1 == 0 {
                    peer(3 + input.byte() % 8)
                } else {
                    sides[1 - who].addr
                };
                let s = &mut sides[who];
                s.ep.handle_packet(now, &RxMeta { source, ce: false }, &bytes, &mut s.mem);
                out.strangers += 1;
            }
            9 | 10 => {
                let s = &mut sides[who];
                if s.handles.is_empty() {
                    continue;
                }
                let h = s.handles[usize::from(input.byte()) % s.handles.len()];
                if op == 9 {
                    let _ = s.ep.close(now, h);
                } else {
                    let _ = s.ep.release(h);
                }
            }
            _ => {
                // A calm moment: both sides take what is in flight, in
                // order, and time moves a little.
                now += Duration::from_micros(5);
                for s in &mut sides {
                    for (from, bytes) in core::mem::take(&mut s.inbox) {
                        let meta = RxMeta {
                            source: from,
                            ce: false,
                        };
                        s.ep.handle_packet(now, &meta, &bytes, &mut s.mem);
                        out.packets_delivered += 1;
                    }
                    if s.ep.poll_timeout().is_some_and(|d| d <= now) {
                        s.ep.handle_timeout(now);
                    }
                }
            }
        }
        // Everything each side wants to send goes in flight; completions
        // and events are taken.
        for i in 0..2 {
            let (a, b) = sides.split_at_mut(1);
            let (me, other) = if i == 0 {
                (&mut a[0], &mut b[0])
            } else {
                (&mut b[0], &mut a[0])
            };
            while let Some(t) = me.ep.poll_transmit(now, &mut buf) {
                let len = me.ep.finish_packet(&t, &mut buf, &mut me.mem);
                if other.inbox.len() < MAX_IN_FLIGHT && t.peer == other.addr {
                    other.inbox.push((me.addr, buf[..len].to_vec()));
                }
            }
            while me.ep.poll_completion().is_some() {
                out.completions += 1;
            }
            while let Some(e) = me.ep.poll_event() {
                match e {
                    crate::Event::Incoming { conn, .. } => me.handles.push(conn),
                    crate::Event::Connected(_) => out.connected += 1,
                    _ => {}
                }
            }
            let d = drops(me);
            assert!(d >= me.drops_seen, "a drop counter went backwards");
            me.drops_seen = d;
        }
    }
    out.memory_writes = sides[0].mem.writes + sides[1].mem.writes;
    out.memory_reads = sides[0].mem.reads + sides[1].mem.reads;
    out
}

/// A handle and a local buffer for a work request: mostly good ones
/// (known handle, registered region, in bounds), sometimes not.
fn pick_work(input: &mut Input<'_>, s: &Side) -> (Option<ConnHandle>, LocalBuf) {
    let choice = input.byte();
    let h = if s.handles.is_empty() {
        None
    } else if choice & 0x80 != 0 {
        Some(ConnHandle {
            index: u32::from(input.byte() % 8),
            generation: u32::from(input.byte() % 4),
        })
    } else {
        Some(s.handles[usize::from(input.byte()) % s.handles.len()])
    };
    let local = match s.mem.regions.first() {
        Some(&(key, r)) if choice & 0x40 == 0 => {
            let off = u64::from(input.u16()) % r.len;
            let len = (u64::from(input.u16()) % (r.len - off)).max(1) as u32;
            LocalBuf {
                key,
                addr: r.base + off,
                len,
            }
        }
        _ => LocalBuf {
            key: u32::from(input.u16()),
            addr: ARENA_BASE + u64::from(input.u16()),
            len: u32::from(input.u16()),
        },
    };
    (h, local)
}
