//! The device side of the host interface in shared memory (spec chapter 6):
//! what lets host processes outside the firmware drive the engine.
//!
//! [`HostInterface::format`] lays out the shared memory (device header,
//! queue sets, data windows) and marks it ready. Then, in the firmware's
//! loop:
//!
//! - [`HostInterface::poll_control`], before each [`crate::Engine::poll`]:
//!   for each claimed queue set in turn (bounded per set, so a flooding
//!   host cannot starve the others), execute admin commands through
//!   [`HostControl`] and route connection events to the owning set;
//! - [`crate::Engine::poll`] with the interface as its
//!   [`HostSide`](crate::host::HostSide): the
//!   engine reads the sets' send and receive queues where the hosts wrote
//!   them and writes completions into the owning set's completion queue,
//!   one conversion each, with no ring in between. Invalid entries
//!   (unknown opcode, bad length, a connection that is stale or another
//!   set's, an address outside the set's window) become error completions
//!   at once and are counted.
//!
//! Each set has its own protection domain (its index) and data window;
//! regions may only lie in the set's window and only the set that
//! registered a key may deregister it, so one tenant cannot reach another's
//! memory. Each set also has a quota (spec 6.10) of connections, regions,
//! registered bytes, outstanding work entries and outstanding commands, so
//! one tenant cannot take the tables the others need: by default a share
//! of each table, set otherwise by the management set (the last one).
//! Every refusal is counted per set ([`abi::SetCounters`],
//! [`abi::SetQuota`]).
//!
//! Code size: the firmware's code budget is nearly spent, so this module
//! is written for size. Non-generic helpers marked `#[inline]` are
//! compiled in the crate that uses them (the firmware's node crate, built
//! for size) rather than in this one (built for speed); methods marked
//! `#[inline(never)]` stay one copy where inlining them grew the firmware
//! (`cargo xtask image --board qemu-virt` measures it).

mod admin;
pub mod convert;
mod rings;
mod work;

use heapless::Vec;
use metaroce_abi as abi;
use metaroce_core::api::ConnHandle;
use metaroce_core::Instant;

use crate::control::HostControl;
use crate::engine::EngineStats;
use crate::shmem::SharedMemory;
use rings::{Bell, Consumed, Produced, RingGeometry};
use work::WorkQueue;
use zerocopy::IntoBytes;

/// Most queue sets a device serves.
pub const MAX_SETS: usize = 8;
/// Regions the host interface tracks the owner of.
pub const MAX_OWNED_REGIONS: usize = 64;
/// Completions (and events) a set may have waiting for room in its queue
/// before further ones are dropped and counted.
const PENDING: usize = 32;
/// Entries taken per set and poll: admin commands, receives, sends.
const ADMIN_BUDGET: u32 = 4;
const WORK_BUDGET: u32 = 32;
/// The quota resources, in the order of [`abi::QuotaValues`] (whose
/// eight words a [`Quota`] is).
const QUOTAS: usize = 5;
const Q_CONNS: usize = 0;
const Q_REGIONS: usize = 1;
const Q_BYTES: usize = 2;
const Q_WORK: usize = 3;
const Q_COMMANDS: usize = 4;
/// A quota vector: one value per resource, then reserved words.
type Quota = [u64; 8];

/// What the device tells hosts about itself when formatting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The node's number in its harness.
    pub node: u16,
    pub ipv4: [u8; 4],
    pub udp_port: u16,
    /// Queue sets to lay out (at most [`MAX_SETS`]).
    pub queue_sets: u32,
}

/// Why the shared memory could not be formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FormatError {
    /// Too small for the header, the queue sets and a page of data each.
    TooSmall,
    /// Zero or more than [`MAX_SETS`] queue sets.
    BadSetCount,
}

/// Device-wide counters of the host interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct HostIfStats {
    /// Sets claimed by a host process.
    pub sets_claimed: u32,
    pub admin_commands: u64,
    pub posted_sends: u64,
    pub posted_recvs: u64,
    pub completions: u64,
    /// Refused work entries and commands, all sets.
    pub refused: u64,
    /// Completions whose connection no set owns any more.
    pub orphan_completions: u64,
    /// Incoming connections no set listened for (closed).
    pub unclaimed_incoming: u64,
    /// Shared-memory accesses that failed (a bug or a too-small BAR).
    pub shm_faults: u64,
}

/// Where a connection stands, as the host interface sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Opened by CONNECT, handshake under way.
    Opening,
    /// Offered to the listening set (EVENT_INCOMING), not yet accepted.
    Offered,
    Open,
    /// Closed or failed; waiting for RELEASE.
    Ended,
}

/// A connection some set holds.
#[derive(Debug, Clone, Copy)]
struct ConnEntry {
    handle: ConnHandle,
    set: u8,
    generation: u32,
    phase: Phase,
    /// Work entries posted on it whose completion has not come back.
    outstanding: u32,
}

/// A region some set registered.
#[derive(Debug, Clone, Copy)]
struct OwnedRegion {
    key: u32,
    set: u8,
    len: u64,
}

/// Entries waiting for room in a device-produced ring, as words (a
/// completion's 32 bytes or an admin completion's 64), oldest first: a
/// ring of [`PENDING`] entries, smaller in code than a general queue.
#[derive(Debug)]
struct Waiting {
    entries: [[u64; 8]; PENDING],
    head: usize,
    len: usize,
}

impl Waiting {
    const EMPTY: Waiting = Waiting {
        entries: [[0; 8]; PENDING],
        head: 0,
        len: 0,
    };

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `words`; `false` when full.
    fn push(&mut self, words: [u64; 8]) -> bool {
        if self.len == PENDING {
            return false;
        }
        self.entries[(self.head + self.len) % PENDING] = words;
        self.len += 1;
        true
    }

    fn pop(&mut self) -> Option<[u64; 8]> {
        if self.len == 0 {
            return None;
        }
        let words = self.entries[self.head % PENDING];
        self.head = (self.head + 1) % PENDING;
        self.len -= 1;
        Some(words)
    }
}

/// The last word of the entries of `ring` (by their size).
fn last_word(ring: &RingGeometry) -> usize {
    if ring.entry == 32 {
        abi::CQE_LAST_WORD
    } else {
        abi::ADMIN_CQE_LAST_WORD
    }
}

/// Puts an entry (the first `ring.entry` bytes of `words`) into a
/// device-produced ring if it has room and nothing waits, else behind the
/// waiting ones; `false`: dropped, the waiting ones are as many as allowed.
/// One copy of the code for both rings.
#[inline]
fn post(
    shm: &SharedMemory<'_>,
    produced: &mut Produced,
    pending: &mut Waiting,
    ring: &RingGeometry,
    bell: u64,
    words: [u64; 8],
) -> bool {
    if pending.is_empty() && produced.free(shm, bell, ring.depth) > 0 {
        let bytes = &words.as_bytes()[..ring.entry as usize];
        let _ = produced.push(shm, ring, bytes, last_word(ring));
        true
    } else {
        pending.push(words)
    }
}

/// Moves waiting entries into their ring while it has room; whether any
/// moved.
#[inline]
fn drain(
    shm: &SharedMemory<'_>,
    produced: &mut Produced,
    pending: &mut Waiting,
    ring: &RingGeometry,
    bell: u64,
) -> bool {
    let mut any = false;
    while produced.free(shm, bell, ring.depth) > 0 {
        let Some(words) = pending.pop() else {
            break;
        };
        let bytes = &words.as_bytes()[..ring.entry as usize];
        let _ = produced.push(shm, ring, bytes, last_word(ring));
        any = true;
    }
    any
}

/// What every queue set's header says but its number and window (the
/// default layout, spec 6.2).
const SET_HEADER: abi::QueueSetHeader = abi::QueueSetHeader {
    owner: abi::OWNER_FREE,
    state: 0,
    index: 0,
    pd: 0,
    window_offset: 0,
    window_len: 0,
    sq_offset: abi::SET_SQ,
    sq_depth: abi::DEFAULT_SQ_DEPTH,
    rq_offset: abi::SET_RQ,
    rq_depth: abi::DEFAULT_RQ_DEPTH,
    cq_offset: abi::SET_CQ,
    cq_depth: abi::DEFAULT_CQ_DEPTH,
    aq_offset: abi::SET_AQ,
    aq_depth: abi::DEFAULT_AQ_DEPTH,
    acq_offset: abi::SET_ACQ,
    acq_depth: abi::DEFAULT_ACQ_DEPTH,
    doorbell_offset: abi::SET_DOORBELLS,
    indices_offset: abi::SET_INDICES,
    counters_offset: abi::SET_COUNTERS,
    quota_offset: abi::SET_QUOTA,
    reserved: [0; 21],
};

/// What the device header says whatever the device (spec 6.9); `state`
/// is published separately.
const DEVICE_HEADER: abi::DeviceHeader = abi::DeviceHeader {
    magic: abi::MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    features: abi::FEATURES_V1,
    state: abi::DEVICE_STATE_RESET,
    queue_sets: 0,
    shm_len: 0,
    set_offset: abi::DEFAULT_SET_OFFSET,
    set_stride: abi::DEFAULT_SET_STRIDE,
    data_offset: abi::DEFAULT_DATA_OFFSET,
    data_len: 0,
    heartbeat: 0,
    ipv4: [0; 4],
    udp_port: 0,
    node: 0,
    max_message: abi::MAX_MESSAGE,
    max_regions: 0,
    max_connections: 0,
    reserved0: 0,
    reserved: [0; 20],
};

/// The device's state of one queue set.
#[derive(Debug)]
struct SetState {
    /// Absolute offset of the set.
    base: u64,
    pd: u32,
    window: (u64, u64),
    claimed: bool,
    sq: Consumed,
    rq: Consumed,
    aq: Consumed,
    cq: Produced,
    acq: Produced,
    /// Completions and admin answers waiting for room.
    pending_cqes: Waiting,
    pending_acqes: Waiting,
    counters: abi::SetCounters,
    /// Limits set by SET_QUOTA (`abi::QUOTA_DEFAULT`: the default share).
    limit: Quota,
    /// Quota refusals by resource.
    refused: Quota,
    /// Work entries in the engine (the sum of its connections').
    outstanding: u64,
    /// Work entries taken from each work queue this poll (send, receive).
    share: [u32; 2],
}

impl SetState {
    fn bell(&self, b: Bell) -> u64 {
        self.base + u64::from(abi::SET_DOORBELLS) + 64 * b as u64
    }

    fn ring(&self, offset: u32, depth: u32, entry: u32) -> RingGeometry {
        RingGeometry {
            base: self.base + u64::from(offset),
            depth,
            entry,
        }
    }

    fn sq_ring(&self) -> RingGeometry {
        self.ring(abi::SET_SQ, abi::DEFAULT_SQ_DEPTH, 64)
    }
    fn rq_ring(&self) -> RingGeometry {
        self.ring(abi::SET_RQ, abi::DEFAULT_RQ_DEPTH, 32)
    }
    fn cq_ring(&self) -> RingGeometry {
        self.ring(abi::SET_CQ, abi::DEFAULT_CQ_DEPTH, 32)
    }
    fn aq_ring(&self) -> RingGeometry {
        self.ring(abi::SET_AQ, abi::DEFAULT_AQ_DEPTH, 64)
    }
    fn acq_ring(&self) -> RingGeometry {
        self.ring(abi::SET_ACQ, abi::DEFAULT_ACQ_DEPTH, 64)
    }

    fn in_window(&self, addr: u64, len: u64) -> bool {
        let (start, size) = self.window;
        addr >= start && len <= size && addr - start <= size - len
    }

    /// Queues a completion: into the ring if it has room and nothing is
    /// waiting, else behind the waiting ones, else dropped and counted.
    #[inline]
    fn complete(&mut self, shm: &SharedMemory<'_>, cqe: abi::Cqe) {
        self.counters.completions += 1;
        let mut words = [0u64; 8];
        words.as_mut_bytes()[..32].copy_from_slice(cqe.as_bytes());
        let ring = self.cq_ring();
        let bell = self.bell(Bell::Cq);
        if !post(
            shm,
            &mut self.cq,
            &mut self.pending_cqes,
            &ring,
            bell,
            words,
        ) {
            self.counters.cq_overflow += 1;
        }
    }

    /// Queues an admin completion or event, like [`SetState::complete`].
    #[inline]
    fn answer(&mut self, shm: &SharedMemory<'_>, acqe: abi::AdminCqe) {
        if acqe.kind != abi::EVENT_COMMAND_DONE {
            self.counters.events += 1;
        }
        let ring = self.acq_ring();
        let bell = self.bell(Bell::Acq);
        let words = zerocopy::transmute!(acqe);
        if !post(
            shm,
            &mut self.acq,
            &mut self.pending_acqes,
            &ring,
            bell,
            words,
        ) {
            self.counters.events_lost += 1;
        }
    }

    /// The device's reading position in a work queue.
    fn consumed(&mut self, queue: WorkQueue) -> &mut Consumed {
        match queue {
            WorkQueue::Recv => &mut self.rq,
            WorkQueue::Send => &mut self.sq,
        }
    }

    fn cq_free(&self, shm: &SharedMemory<'_>) -> u32 {
        self.cq
            .free(shm, self.bell(Bell::Cq), abi::DEFAULT_CQ_DEPTH)
    }

    fn acq_free(&self, shm: &SharedMemory<'_>) -> u32 {
        self.acq
            .free(shm, self.bell(Bell::Acq), abi::DEFAULT_ACQ_DEPTH)
    }

    /// Moves waiting completions and answers into their rings.
    #[inline]
    fn flush(&mut self, shm: &SharedMemory<'_>) -> bool {
        let (cq, acq) = (self.cq_ring(), self.acq_ring());
        let (cq_bell, acq_bell) = (self.bell(Bell::Cq), self.bell(Bell::Acq));
        drain(shm, &mut self.cq, &mut self.pending_cqes, &cq, cq_bell)
            | drain(shm, &mut self.acq, &mut self.pending_acqes, &acq, acq_bell)
    }

    /// Whether an error completion can be queued now (so refusing an entry
    /// never loses its answer).
    fn can_refuse(&self, shm: &SharedMemory<'_>) -> bool {
        self.pending_cqes.is_empty() && self.cq_free(shm) > 0
    }

    /// Publishes the device's consumer indices.
    fn publish_consumers(&self, shm: &SharedMemory<'_>) {
        let at = self.base + u64::from(abi::SET_INDICES);
        let _ = shm.store_u32(at, self.sq.consumer);
        let _ = shm.store_u32(at + 4, self.rq.consumer);
        let _ = shm.store_u32(at + 8, self.aq.consumer);
    }
}

/// The device side of the host interface over `shm`, for up to `CONNS`
/// connection slots of the endpoint (see the module documentation).
#[derive(Debug)]
pub struct HostInterface<'m, const CONNS: usize> {
    shm: SharedMemory<'m>,
    sets: Vec<SetState, MAX_SETS>,
    conns: [Option<ConnEntry>; CONNS],
    generations: [u32; CONNS],
    regions: Vec<OwnedRegion, MAX_OWNED_REGIONS>,
    /// Regions the device holds in all (at most [`MAX_OWNED_REGIONS`]).
    region_cap: u64,
    listener: Option<u8>,
    /// The set served first in the next poll (round robin).
    next_set: usize,
    /// The set each work queue (send, receive) is read from now.
    cursor: [usize; 2],
    /// Where the entry the engine last peeked at in each work queue lies:
    /// its set and connection slot.
    peeked: [Option<(usize, u32)>; 2],
    heartbeat: u64,
    stats: HostIfStats,
}

impl<'m, const CONNS: usize> HostInterface<'m, CONNS> {
    /// Formats `shm` (spec 6.2): zeroes the header page and the queue sets,
    /// writes each set's header and the device header, and publishes
    /// [`abi::DEVICE_STATE_READY`] last. The data windows are left as
    /// they are.
    #[inline(never)]
    pub fn format(
        shm: SharedMemory<'m>,
        info: DeviceInfo,
        max_regions: u32,
    ) -> Result<Self, FormatError> {
        let n = info.queue_sets;
        if n == 0 || n as usize > MAX_SETS {
            return Err(FormatError::BadSetCount);
        }
        let shm_len = shm.len() as u64;
        let data_len = shm_len
            .checked_sub(abi::DEFAULT_DATA_OFFSET)
            .ok_or(FormatError::TooSmall)?;
        let window_len = (data_len / u64::from(n)) & !0xfff;
        if window_len == 0 {
            return Err(FormatError::TooSmall);
        }
        shm.store_u32(16, abi::DEVICE_STATE_RESET)
            .map_err(|_| FormatError::TooSmall)?;
        shm.fill(0, abi::DEFAULT_DATA_OFFSET as usize, 0)
            .map_err(|_| FormatError::TooSmall)?;
        let mut sets = Vec::new();
        for i in 0..n {
            let base = abi::DEFAULT_SET_OFFSET + u64::from(i) * abi::DEFAULT_SET_STRIDE;
            let window = (
                abi::DEFAULT_DATA_OFFSET + u64::from(i) * window_len,
                window_len,
            );
            let header = abi::QueueSetHeader {
                index: i,
                pd: i,
                window_offset: window.0,
                window_len: window.1,
                ..SET_HEADER
            };
            shm.write(base, &header)
                .map_err(|_| FormatError::TooSmall)?;
            let _ = sets.push(SetState {
                base,
                pd: i,
                window,
                claimed: false,
                sq: Consumed::default(),
                rq: Consumed::default(),
                aq: Consumed::default(),
                cq: Produced::default(),
                acq: Produced::default(),
                pending_cqes: Waiting::EMPTY,
                pending_acqes: Waiting::EMPTY,
                counters: abi::SetCounters::default(),
                limit: [abi::QUOTA_DEFAULT; 8],
                refused: [0; 8],
                outstanding: 0,
                share: [0; 2],
            });
        }
        let header = abi::DeviceHeader {
            queue_sets: n,
            shm_len,
            data_len,
            ipv4: info.ipv4,
            udp_port: info.udp_port,
            node: info.node,
            max_regions,
            max_connections: CONNS as u32,
            ..DEVICE_HEADER
        };
        shm.write(0, &header).map_err(|_| FormatError::TooSmall)?;
        shm.store_u32(16, abi::DEVICE_STATE_READY)
            .map_err(|_| FormatError::TooSmall)?;
        Ok(HostInterface {
            shm,
            sets,
            conns: [None; CONNS],
            generations: [0; CONNS],
            regions: Vec::new(),
            region_cap: u64::from(max_regions).min(MAX_OWNED_REGIONS as u64),
            listener: None,
            next_set: 0,
            cursor: [0; 2],
            peeked: [None; 2],
            heartbeat: 0,
            stats: HostIfStats::default(),
        })
    }

    /// The device-wide counters.
    pub fn stats(&self) -> HostIfStats {
        self.stats
    }

    /// A set's counters (as QUERY_COUNTERS would report its own part).
    pub fn set_counters(&self, set: usize) -> Option<abi::SetCounters> {
        self.sets.get(set).map(|s| s.counters)
    }

    /// A set's quota: limits in force, use and refusals (as QUERY_COUNTERS
    /// reports them).
    pub fn set_quota(&self, set: usize) -> Option<abi::SetQuota> {
        let s = self.sets.get(set)?;
        let q: [Quota; 4] = [self.limits(set), self.usage(set), s.refused, [0; 8]];
        Some(zerocopy::transmute!(q))
    }

    /// What set `i` holds of each quota resource.
    #[inline(never)]
    fn usage(&self, i: usize) -> Quota {
        let mut u = [0; 8];
        for e in self
            .conns
            .iter()
            .flatten()
            .filter(|e| usize::from(e.set) == i)
        {
            u[Q_CONNS] += 1;
            u[Q_COMMANDS] += u64::from(e.phase == Phase::Opening);
        }
        for r in self.regions.iter().filter(|r| usize::from(r.set) == i) {
            u[Q_REGIONS] += 1;
            u[Q_BYTES] += r.len;
        }
        u[Q_WORK] = self.sets[i].outstanding;
        u
    }

    /// Set `i`'s limits in force (spec 6.10): those set, else the default
    /// share: of the connection and region tables, the table divided by
    /// the claimed sets (at least two, so no set ever takes a whole
    /// table); of bytes, the set's window; of work entries, its completion
    /// queue's depth; of outstanding commands, its admin queue's depth.
    #[inline(never)]
    fn limits(&self, i: usize) -> Quota {
        let share = u64::from(self.stats.sets_claimed.max(2));
        let set = &self.sets[i];
        let default = [
            (CONNS as u64 / share).max(1),
            (self.region_cap / share).max(1),
            set.window.1,
            u64::from(abi::DEFAULT_CQ_DEPTH),
            u64::from(abi::DEFAULT_AQ_DEPTH),
            0,
            0,
            0,
        ];
        let mut limit = set.limit;
        for (l, d) in limit.iter_mut().zip(default) {
            if *l == abi::QUOTA_DEFAULT {
                *l = d;
            }
        }
        limit
    }

    /// Whether set `i` may take one more of each resource in `mask`
    /// (bit `1 << r`; of bytes, `bytes` more): else the first resource it
    /// would pass the limit of counts the refusal.
    #[inline(never)]
    fn take(&mut self, i: usize, mask: u8, bytes: u64) -> Result<(), u8> {
        let used = if mask == 1 << Q_WORK {
            let mut u = [0; 8];
            u[Q_WORK] = self.sets[i].outstanding;
            u
        } else {
            self.usage(i)
        };
        let limit = self.limits(i);
        for r in 0..QUOTAS {
            let want = if r == Q_BYTES { bytes } else { 1 };
            if mask & 1 << r != 0 && used[r].saturating_add(want) > limit[r] {
                self.sets[i].refused[r] += 1;
                return Err(abi::STATUS_QUOTA_EXCEEDED);
            }
        }
        Ok(())
    }

    /// Forgets the connection in `slot` (with its outstanding work).
    fn forget(&mut self, slot: usize) {
        if let Some(Some(e)) = self.conns.get_mut(slot).map(Option::take) {
            if let Some(set) = self.sets.get_mut(usize::from(e.set)) {
                set.outstanding = set.outstanding.saturating_sub(u64::from(e.outstanding));
            }
        }
    }

    /// Whether a host has work waiting or answers are pending: poll again
    /// soon instead of sleeping long.
    #[inline(never)]
    pub fn has_work(&self) -> bool {
        self.sets.iter().any(|s| {
            if !s.pending_cqes.is_empty() || !s.pending_acqes.is_empty() {
                return true;
            }
            if !s.claimed {
                return self
                    .shm
                    .load_u32(s.base)
                    .is_ok_and(|owner| owner != abi::OWNER_FREE);
            }
            [
                (Bell::Sq, s.sq.consumer),
                (Bell::Rq, s.rq.consumer),
                (Bell::Aq, s.aq.consumer),
            ]
            .into_iter()
            .any(|(b, consumer)| self.shm.load_u32(s.bell(b)).is_ok_and(|p| p != consumer))
        })
    }

    /// Step before the engine poll: claims, events and admin commands of
    /// every set (see the module documentation). Returns whether anything
    /// moved.
    pub fn poll_control<C: HostControl>(
        &mut self,
        now: Instant,
        control: &mut C,
        engine: &EngineStats,
    ) -> bool {
        self.heartbeat = self.heartbeat.wrapping_add(1);
        if self.shm.store_u64(64, self.heartbeat).is_err() {
            self.stats.shm_faults += 1;
        }
        let mut busy = self.route_events(now, control);
        let n = self.sets.len();
        for k in 0..n {
            let i = (self.next_set + k) % n;
            busy |= self.serve_set(i, now, control, engine);
        }
        busy
    }

    /// One set's turn: claim check, waiting answers, admin commands.
    #[inline(never)]
    fn serve_set<C: HostControl>(
        &mut self,
        i: usize,
        now: Instant,
        control: &mut C,
        engine: &EngineStats,
    ) -> bool {
        let shm = self.shm;
        let Some(set) = self.sets.get_mut(i) else {
            return false;
        };
        if !set.claimed {
            if shm
                .load_u32(set.base)
                .is_ok_and(|owner| owner != abi::OWNER_FREE)
            {
                set.claimed = true;
                self.stats.sets_claimed += 1;
            } else {
                return false;
            }
        }
        let mut busy = set.flush(&shm);
        busy |= self.serve_admin(i, now, control, engine);
        if let Some(set) = self.sets.get(i) {
            set.publish_consumers(&shm);
        }
        busy
    }
}

/// Counts a refusal under its reason.
#[inline(never)]
fn count_refusal(c: &mut abi::SetCounters, status: u8) {
    match status {
        abi::STATUS_BAD_OPCODE => c.refused_bad_opcode += 1,
        abi::STATUS_BAD_LENGTH => c.refused_bad_length += 1,
        abi::STATUS_BAD_CONNECTION => c.refused_bad_connection += 1,
        abi::STATUS_BAD_ADDRESS => c.refused_bad_address += 1,
        abi::STATUS_NOT_PERMITTED => c.refused_not_permitted += 1,
        abi::STATUS_NO_RESOURCES => c.refused_no_resources += 1,
        abi::STATUS_BAD_KEY => c.refused_bad_key += 1,
        abi::STATUS_QUOTA_EXCEEDED => c.refused_quota += 1,
        _ => c.refused_invalid += 1,
    }
}
