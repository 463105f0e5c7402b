//! Stateful fuzzing of the host interface's device side (feature
//! `testing`, host only): [`host_interface`] turns arbitrary bytes into
//! what two tenants' host processes do to a DPU's shared memory (claiming
//! their queue sets, admin commands with any fields, send and receive
//! entries with any fields, doorbells rung at any index, raw bytes written
//! anywhere in their sets) and runs the device between their moves.
//!
//! What must hold whatever the input: nothing panics; every region the
//! device registers lies inside the window of the set that asked, in that
//! set's protection domain; every work request that reaches the engine
//! uses a connection of the set that posted it and memory of that set's
//! window; no set's refusal counters go backwards; and no set's use of a
//! quota resource grows past its limit (spec 6.10; a limit lowered below
//! the use takes nothing back, so only growth is checked). `cargo fuzz`
//! (`fuzz/fuzz_targets/host_interface.rs`) runs it as long as one likes,
//! `platform/tests/hostif_fuzz.rs` on a bounded, seeded set of inputs.

extern crate std;

use std::vec;
use std::vec::Vec;

use metaroce_abi as abi;
use metaroce_core::api::{ConnHandle, PeerAddr, Region};
use metaroce_core::config::Config;
use metaroce_core::storage::{Heap, Layout};
use metaroce_core::{Endpoint, Instant};
use zerocopy::IntoBytes;

use crate::control::{ConnCounters, ControlError, ControlEvent, HostControl};
use crate::engine::EngineStats;
use crate::host::HostSide;
use crate::hostif::{DeviceInfo, HostInterface};
use crate::shmem::SharedMemory;

/// Queue sets (tenants) and the shared memory: the header and queue sets,
/// then two data windows of 64 KiB.
const SETS: u32 = 2;
const WINDOW: u64 = 64 * 1024;
const SHM_LEN: usize = (abi::DEFAULT_DATA_OFFSET + SETS as u64 * WINDOW) as usize;

/// What a run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub operations: u32,
    pub regions_registered: u32,
    pub connections: u32,
    pub work_reaching_the_engine: u32,
    pub refusals: u64,
    pub quota_refusals: u64,
}

/// The endpoint behind the device, watched: every control call is checked
/// against the tenant rules.
struct Watched {
    ep: Endpoint<Heap, 4>,
    /// Connection -> protection domain (= set index) it was opened in.
    owner: Vec<(ConnHandle, u32)>,
    regions: u32,
}

fn window_of(pd: u32) -> (u64, u64) {
    (abi::DEFAULT_DATA_OFFSET + u64::from(pd) * WINDOW, WINDOW)
}

impl HostControl for Watched {
    fn register_region(&mut self, region: Region) -> Result<u32, ControlError> {
        let (base, len) = window_of(region.pd);
        assert!(
            region.pd < SETS
                && region.base >= base
                && region.len <= len
                && region.base - base <= len - region.len,
            "the device registered {region:?} outside the window of set {}",
            region.pd
        );
        self.regions += 1;
        HostControl::register_region(&mut self.ep, region)
    }
    fn deregister_region(&mut self, key: u32) -> Result<(), ControlError> {
        HostControl::deregister_region(&mut self.ep, key)
    }
    fn connect(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        pd: u32,
    ) -> Result<ConnHandle, ControlError> {
        assert!(pd < SETS, "a connection in domain {pd}, which no set has");
        let h = HostControl::connect(&mut self.ep, now, peer, pd)?;
        self.owner.push((h, pd));
        Ok(h)
    }
    fn accept(&mut self, now: Instant, conn: ConnHandle, pd: u32) -> Result<(), ControlError> {
        HostControl::accept(&mut self.ep, now, conn, pd)?;
        self.owner.push((conn, pd));
        Ok(())
    }
    fn close(&mut self, now: Instant, conn: ConnHandle) -> Result<(), ControlError> {
        HostControl::close(&mut self.ep, now, conn)
    }
    fn release(&mut self, conn: ConnHandle) -> Result<(), ControlError> {
        HostControl::release(&mut self.ep, conn)
    }
    fn poll_event(&mut self) -> Option<ControlEvent> {
        HostControl::poll_event(&mut self.ep)
    }
    fn peer(&self, conn: ConnHandle) -> Option<PeerAddr> {
        HostControl::peer(&self.ep, conn)
    }
    fn has_ended(&self, conn: ConnHandle) -> bool {
        HostControl::has_ended(&self.ep, conn)
    }
    fn slot(&self, conn: ConnHandle) -> usize {
        HostControl::slot(&self.ep, conn)
    }
    fn counters(&self, conn: ConnHandle) -> Option<ConnCounters> {
        HostControl::counters(&self.ep, conn)
    }
    fn rate_hint(&self, now: Instant) -> u32 {
        HostControl::rate_hint(&self.ep, now)
    }
    fn incoming_domain(&self) -> Option<u32> {
        HostControl::incoming_domain(&self.ep)
    }
    fn max_connections(&self) -> usize {
        HostControl::max_connections(&self.ep)
    }
    fn max_regions(&self) -> usize {
        HostControl::max_regions(&self.ep)
    }
}

/// Reads the input as small numbers (zero when it runs out).
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
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

/// Where a set's header, rings and doorbells are.
fn set_base(set: u32) -> u64 {
    abi::DEFAULT_SET_OFFSET + u64::from(set) * abi::DEFAULT_SET_STRIDE
}

fn bell(set: u32, line: u64) -> u64 {
    set_base(set) + u64::from(abi::SET_DOORBELLS) + 64 * line
}

/// An address a tenant names: mostly inside its own window, sometimes
/// the other's, sometimes anywhere.
fn address(input: &mut Input<'_>, set: u32) -> u64 {
    match input.byte() % 4 {
        0 | 1 => window_of(set).0 + u64::from(input.u16()),
        2 => window_of(1 - set).0 + u64::from(input.u16()),
        _ => u64::from(input.u32()),
    }
}

/// Runs the moves `data` describes; panics if a rule breaks.
pub fn host_interface(data: &[u8]) -> Outcome {
    let mut input = Input { bytes: data, at: 0 };
    // u64 words: the shared memory's atomics need 8-byte alignment.
    let mut memory = vec![0u64; SHM_LEN / 8];
    // SAFETY: `memory` lives until the end of this function, after every
    // user of the two views below; it is touched only through them (the
    // device's and the hosts', as a real shared memory is by both sides).
    let device_view = unsafe { SharedMemory::new(memory.as_mut_ptr().cast(), SHM_LEN) }
        .expect("a non-null, aligned buffer");
    // SAFETY: as above.
    let host_view = unsafe { SharedMemory::new(memory.as_mut_ptr().cast(), SHM_LEN) }
        .expect("a non-null, aligned buffer");
    let info = DeviceInfo {
        node: 0,
        ipv4: [10, 0, 0, 1],
        udp_port: metaroce_core::wire::DEFAULT_UDP_PORT,
        queue_sets: SETS,
    };
    let mut hostif: HostInterface<'_, 8> =
        HostInterface::format(device_view, info, 16).expect("room for two sets");
    let layout = Layout::for_connections(8);
    let mut control = Watched {
        ep: Endpoint::new(
            Config {
                accept_domain: metaroce_core::config::AcceptDomain::PerConnection,
                ..Config::default()
            },
            layout.heap_storage(),
            metaroce_core::rng::seed_from_u64(7),
        ),
        owner: Vec::new(),
        regions: 0,
    };
    let engine = EngineStats::default();
    let mut now = Instant::from_micros(1);
    let mut producers = [[0u32; 3]; SETS as usize];
    let mut refusals_seen = [0u64; SETS as usize];
    let mut used_seen = [abi::QuotaValues::default(); SETS as usize];
    let mut out = Outcome::default();
    while !input.done() && out.operations < 1_000 {
        out.operations += 1;
        let set = u32::from(input.byte() & 1);
        let base = set_base(set);
        match input.byte() % 8 {
            0 => {
                // Claim the set (a process id), or scribble on the owner.
                let pid = if input.byte() & 1 == 0 {
                    100 + set
                } else {
                    input.u32()
                };
                let _ = host_view.store_u32(base, pid);
            }
            1 => {
                let cmd = abi::AdminCmd {
                    tag: u64::from(input.u16()),
                    opcode: input.byte() % 11,
                    flags: if input.byte() == 0xff { 1 } else { 0 },
                    access: u32::from(input.byte() & 0x0f),
                    conn_index: u32::from(input.byte() % 10),
                    conn_generation: u32::from(input.byte() % 4),
                    addr: address(&mut input, set),
                    len: u64::from(input.u16()),
                    key: input.u32(),
                    port: metaroce_core::wire::DEFAULT_UDP_PORT,
                    ip: abi::ipv4_mapped([10, 0, 0, 2 + input.byte() % 2]),
                    ..abi::AdminCmd::default()
                };
                let p = &mut producers[set as usize][2];
                let slot =
                    base + u64::from(abi::SET_AQ) + u64::from(*p % abi::DEFAULT_AQ_DEPTH) * 64;
                let _ = host_view.write_words(slot, cmd.as_bytes());
                *p = p.wrapping_add(1);
                let _ = host_view.store_u32(bell(set, 3), *p);
            }
            2 => {
                let wqe = abi::SendWqe {
                    wr_id: u64::from(input.u16()),
                    conn_index: u32::from(input.byte() % 10),
                    conn_generation: u32::from(input.byte() % 4),
                    opcode: input.byte() % 8,
                    imm: u32::from(input.byte()),
                    lkey: input.u32(),
                    length: u32::from(input.u16()),
                    laddr: address(&mut input, set),
                    raddr: address(&mut input, set),
                    rkey: input.u32(),
                    ..abi::SendWqe::default()
                };
                let p = &mut producers[set as usize][0];
                let slot =
                    base + u64::from(abi::SET_SQ) + u64::from(*p % abi::DEFAULT_SQ_DEPTH) * 64;
                let _ = host_view.write_words(slot, wqe.as_bytes());
                *p = p.wrapping_add(1);
                let _ = host_view.store_u32(bell(set, 0), *p);
            }
            3 => {
                let wqe = abi::RecvWqe {
                    wr_id: u64::from(input.u16()),
                    conn_index: u32::from(input.byte() % 10),
                    conn_generation: u32::from(input.byte() % 4),
                    lkey: input.u32(),
                    length: u32::from(input.u16()),
                    laddr: address(&mut input, set),
                };
                let p = &mut producers[set as usize][1];
                let slot =
                    base + u64::from(abi::SET_RQ) + u64::from(*p % abi::DEFAULT_RQ_DEPTH) * 32;
                let _ = host_view.write_words(slot, wqe.as_bytes());
                *p = p.wrapping_add(1);
                let _ = host_view.store_u32(bell(set, 1), *p);
            }
            4 => {
                // A doorbell rung at any index.
                let line = u64::from(input.byte() % 5);
                let _ = host_view.store_u32(bell(set, line), input.u32());
            }
            5 => {
                // Raw bytes anywhere in the set's own area.
                let at = base + u64::from(input.u16()) % abi::DEFAULT_SET_STRIDE;
                let n = usize::from(input.byte() % 16) + 1;
                let bytes: Vec<u8> = (0..n).map(|_| input.byte()).collect();
                for (i, b) in bytes.iter().enumerate() {
                    let word = (at + i as u64) & !3;
                    if let Ok(old) = host_view.load_u32(word) {
                        let shift = ((at + i as u64) & 3) * 8;
                        let new = (old & !(0xff << shift)) | (u32::from(*b) << shift);
                        let _ = host_view.store_u32(word, new);
                    }
                }
            }
            _ => {
                now = now.plus_nanos(u64::from(input.u16()) * 100);
            }
        }
        // The device's turn, then the engine's: every entry it is handed
        // is checked.
        hostif.poll_control(now, &mut control, &engine);
        hostif.begin_poll();
        while let Some(e) = hostif.peek_send() {
            out.work_reaching_the_engine += 1;
            check_work(&control, e.conn, e.wr.local.addr, u64::from(e.wr.local.len));
            hostif.pop_send();
        }
        while let Some(e) = hostif.peek_recv() {
            out.work_reaching_the_engine += 1;
            check_work(&control, e.conn, e.rr.local.addr, u64::from(e.rr.local.len));
            hostif.pop_recv();
        }
        for (i, seen) in refusals_seen.iter_mut().enumerate() {
            let c = hostif.set_counters(i).expect("a set the device formatted");
            let total = refusals(&c);
            assert!(total >= *seen, "set {i}'s refusal counters went backwards");
            *seen = total;
            let q = hostif.set_quota(i).expect("a set the device formatted");
            let old = quota_values(&used_seen[i]);
            let limit = quota_values(&q.limit);
            for (r, used) in quota_values(&q.used).into_iter().enumerate() {
                assert!(
                    used <= old[r] || used <= limit[r],
                    "set {i} holds {used} of quota resource {r}, past its limit {}",
                    limit[r]
                );
            }
            assert_eq!(
                c.refused_quota,
                quota_values(&q.refused).iter().sum::<u64>(),
                "set {i}'s quota refusals by resource"
            );
            used_seen[i] = q.used;
        }
    }
    out.regions_registered = control.regions;
    out.connections = control.owner.len() as u32;
    out.refusals = refusals_seen.iter().sum();
    out.quota_refusals = (0..SETS as usize)
        .filter_map(|i| hostif.set_counters(i))
        .map(|c| c.refused_quota)
        .sum();
    drop(hostif);
    drop(memory);
    out
}

/// A work request that reached the engine: its connection belongs to the
/// set whose window its memory lies in.
fn check_work(control: &Watched, conn: ConnHandle, addr: u64, len: u64) {
    let Some(&(_, pd)) = control.owner.iter().rev().find(|(h, _)| *h == conn) else {
        panic!("work on {conn:?}, a connection no set opened or accepted");
    };
    let (base, size) = window_of(pd);
    assert!(
        len == 0 || (addr >= base && len <= size && addr - base <= size - len),
        "set {pd} posted {len} bytes at {addr:#x}, outside its window"
    );
}

/// The sum of a set's refusal counters.
fn refusals(c: &abi::SetCounters) -> u64 {
    c.refused_bad_opcode
        + c.refused_bad_length
        + c.refused_bad_connection
        + c.refused_bad_address
        + c.refused_not_permitted
        + c.refused_invalid
        + c.refused_no_resources
        + c.refused_bad_key
        + c.refused_quota
        + c.bad_producer_index
        + c.spurious_doorbells
        + c.cq_overflow
        + c.events_lost
}

/// The five quota values in their order.
fn quota_values(v: &abi::QuotaValues) -> [u64; 5] {
    [
        v.connections,
        v.regions,
        v.region_bytes,
        v.work_entries,
        v.commands,
    ]
}
