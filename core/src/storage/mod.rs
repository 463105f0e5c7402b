//! Storage the caller supplies, and the fixed-capacity structures built on
//! it (spec 4.14).
//!
//! An endpoint never allocates: every table and pool is a slice handed in
//! when it is built, sized by the target (a `static` in firmware from the
//! board's configuration, the heap in a host program, per host in the
//! simulator). [`Backing`] says what kind of slice: borrowed (`&mut [T]`,
//! firmware and tests) or owned by the caller's allocator ([`Heap`], with
//! the `alloc` feature, for host programs).
//!
//! * [`list`]: intrusive FIFOs and lists of indices (ready connections,
//!   completions, events, active senders);
//! * [`wheel`]: the timing wheel of connection deadlines;
//! * [`index`]: a keyed hash index (CONNECT duplicates);
//! * [`pool`]: shared pools of work entries, receives and sender states,
//!   with per-connection queues;
//! * [`buddy`]: power-of-two extents of in-flight records and of the
//!   receivers' out-of-order bitmaps.

pub mod buddy;
pub mod index;
pub mod list;
pub mod pool;
pub mod wheel;

use core::ops::DerefMut;

use crate::conn::{InflightRecord, RecvEntry, SenderState, WorkEntry};
use crate::crypto::KeySlot;
use crate::endpoint::{ConnSlot, SourceBucket};
use crate::memory::RegionSlot;
use crate::wire::COOKIE_LEN;
use buddy::{BuddyNode, MIN_SHIFT};
use pool::PoolEntry;

/// What kind of slices an endpoint's storage is made of.
pub trait Backing {
    /// A slice of `T` the endpoint may read and write for its lifetime.
    type Slice<T: 'static>: DerefMut<Target = [T]>;
}

/// A slice of `T` of backing `B`.
pub type Slice<B, T> = <B as Backing>::Slice<T>;

/// Storage borrowed for `'a`: `&'a mut [T]` (a `static` in firmware).
#[derive(Debug)]
pub struct Borrowed<'a>(core::marker::PhantomData<&'a mut ()>);

impl<'a> Backing for Borrowed<'a> {
    type Slice<T: 'static> = &'a mut [T];
}

/// Storage owned through the caller's allocator (`Vec<T>`), for host
/// programs. The core itself never allocates: the caller builds the
/// vectors ([`Layout::heap_storage`]).
#[cfg(feature = "alloc")]
#[derive(Debug)]
pub struct Heap;

#[cfg(feature = "alloc")]
impl Backing for Heap {
    type Slice<T: 'static> = alloc::vec::Vec<T>;
}

/// Bits that index `n` slots (at least 1, at most 24: ids keep 8 bits of
/// random tag).
pub const fn index_bits(n: usize) -> u32 {
    let bits = if n <= 1 {
        1
    } else {
        usize::BITS - (n - 1).leading_zeros()
    };
    if bits > 24 {
        24
    } else {
        bits
    }
}

/// How much of everything an endpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Layout {
    /// Connections (at most 2^24).
    pub connections: u32,
    /// Send-queue entries shared by all connections (user work requests
    /// and READ-response jobs).
    pub work_entries: u32,
    /// Posted receives shared by all connections.
    pub recv_entries: u32,
    /// Connections that may be sending at once (each holds a sender state).
    pub senders: u32,
    /// In-flight packet records shared by the senders: sized by the
    /// bandwidth-delay product (packets in flight across the endpoint),
    /// rounded up to a multiple of 16.
    pub inflight_records: u32,
    /// 64-bit words of out-of-order bitmaps shared by the receivers (spec
    /// 4.3): a connection holds one only while packets arrived beyond a
    /// gap, at least 16 words (1,024 PSNs) and at most its window's worth
    /// (65,536 PSNs: 1,024 words); rounded up to a multiple of 16.
    pub reorder_words: u32,
    /// Memory regions.
    pub regions: u32,
    /// Buckets of the per-source CONNECT limits (spec 5.1.4); the largest
    /// power of two up to it is used. 0: no per-source limits.
    pub sources: u32,
    /// Initiators' RETRY cookies held at once (spec 4.2): a connection
    /// holds one from its RETRY until the ACCEPT; when none is free a
    /// RETRY waits for the next CONNECT.
    pub cookies: u32,
    /// Protected connections at once (spec 5.3): each holds a slot of the
    /// key pool (its key schedules) while it lives. 0 without the `aead`
    /// feature.
    pub key_slots: u32,
}

impl Layout {
    /// A layout for `connections`, with pools sized for a 400 Gbit/s link
    /// of about 10 us round trips (bandwidth-delay product: 500 KB, 122
    /// packets of 4 KiB): 16,384 in-flight records (enough for 64 senders
    /// with full 256-PSN windows at once), up to 1,024 concurrent senders,
    /// 16,384 out-of-order bitmap words (128 KiB: 1,024 connections with a
    /// gap open at once, or 16 with full 65,536-PSN windows),
    /// one work entry and one receive per connection on average (at least
    /// 4,096 of each: the sum of what connections may post exceeds the
    /// pools, as on a NIC), two regions per connection, and with the
    /// `aead` feature key slots for up to 1,024 protected connections.
    pub const fn for_connections(connections: u32) -> Layout {
        let c = if connections == 0 { 1 } else { connections };
        Layout {
            connections: c,
            work_entries: max(4096, c),
            recv_entries: max(4096, c),
            senders: min(c, 1024),
            inflight_records: 16_384,
            reorder_words: DEFAULT_REORDER_WORDS,
            regions: max(64, c.saturating_mul(2)),
            sources: Layout::sources_for(c),
            cookies: Layout::cookies_for(c),
            key_slots: if crate::crypto::SUPPORTED {
                min(c, 1024)
            } else {
                0
            },
        }
    }

    /// Source-prefix entries for `connections` (spec 4.2.3): four per
    /// connection, so the table stays at most half full with every
    /// connection from its own narrow and wide prefix (a power of two, at
    /// least 64, at most 2^18; 40 bytes each).
    pub const fn sources_for(connections: u32) -> u32 {
        max(64, min(connections.saturating_mul(4), 1 << 18)).next_power_of_two()
    }

    /// Cookie slots for `connections`: one per connection up to 4,096 (36
    /// bytes each), as many handshakes as a client opens at once.
    pub const fn cookies_for(connections: u32) -> u32 {
        min(connections, 4096)
    }

    /// Allocator nodes for the out-of-order bitmap words.
    pub const fn reorder_nodes(&self) -> usize {
        (self.reorder_words as usize).div_ceil(1 << MIN_SHIFT)
    }

    /// Out-of-order bitmap words actually managed (a multiple of 16).
    pub const fn reorder_words_used(&self) -> usize {
        self.reorder_nodes() << MIN_SHIFT
    }

    /// In-flight records and bitmap words one connection needs in the
    /// worst case for a window of `window` PSNs, as (records, words): the
    /// sender's extent and the receiver's bitmap, each the window rounded
    /// up to a power of two (at least one block).
    pub const fn per_connection_window(window: u32) -> (u32, u32) {
        let w = if window < 16 { 16 } else { window };
        let records = w.next_power_of_two();
        let bits = if records < 1024 { 1024 } else { records };
        (records, bits / 64)
    }

    /// Slots of the connection index (a power of two, at least twice the
    /// connections: probes stay short).
    pub const fn index_slots(&self) -> usize {
        (self.connections as usize * 2).next_power_of_two()
    }

    /// Allocator nodes for the in-flight records.
    pub const fn inflight_nodes(&self) -> usize {
        (self.inflight_records as usize).div_ceil(1 << MIN_SHIFT)
    }

    /// In-flight records actually managed (a multiple of 16).
    pub const fn inflight_records_used(&self) -> usize {
        self.inflight_nodes() << MIN_SHIFT
    }

    /// Bytes of the whole storage for `P` paths per connection, from
    /// `size_of` of every element.
    pub const fn bytes<const P: usize>(&self) -> usize {
        use core::mem::size_of;
        self.connections as usize * size_of::<ConnSlot<P>>()
            + self.index_slots() * size_of::<u32>()
            + self.work_entries as usize * size_of::<PoolEntry<WorkEntry>>()
            + self.recv_entries as usize * size_of::<PoolEntry<RecvEntry>>()
            + self.senders as usize * size_of::<PoolEntry<SenderState<P>>>()
            + self.inflight_records_used() * size_of::<InflightRecord>()
            + self.inflight_nodes() * size_of::<BuddyNode>()
            + self.reorder_words_used() * size_of::<u64>()
            + self.reorder_nodes() * size_of::<BuddyNode>()
            + self.regions as usize * size_of::<RegionSlot>()
            + self.sources as usize * size_of::<SourceBucket>()
            + self.cookies as usize * size_of::<PoolEntry<[u8; COOKIE_LEN]>>()
            + self.key_slots as usize * size_of::<KeySlot>()
    }

    /// Heap storage of this layout.
    #[cfg(feature = "alloc")]
    pub fn heap_storage<const P: usize>(&self) -> Storage<Heap, P> {
        use alloc::vec;
        Storage {
            connections: vec![ConnSlot::VACANT; self.connections as usize],
            connection_index: vec![0; self.index_slots()],
            work_entries: vec![PoolEntry::vacant(WorkEntry::VACANT); self.work_entries as usize],
            recv_entries: vec![PoolEntry::vacant(RecvEntry::VACANT); self.recv_entries as usize],
            senders: vec![PoolEntry::vacant(SenderState::VACANT); self.senders as usize],
            inflight_records: vec![InflightRecord::EMPTY; self.inflight_records_used()],
            inflight_nodes: vec![BuddyNode::INIT; self.inflight_nodes()],
            reorder_words: vec![0; self.reorder_words_used()],
            reorder_nodes: vec![BuddyNode::INIT; self.reorder_nodes()],
            regions: vec![RegionSlot::VACANT; self.regions as usize],
            sources: vec![SourceBucket::EMPTY; self.sources as usize],
            cookies: vec![PoolEntry::vacant([0; COOKIE_LEN]); self.cookies as usize],
            key_slots: vec![KeySlot::VACANT; self.key_slots as usize],
        }
    }
}

/// Out-of-order bitmap words of [`Layout::for_connections`] (and of
/// storage declared without the figure).
pub const DEFAULT_REORDER_WORDS: u32 = 16_384;

const fn max(a: u32, b: u32) -> u32 {
    if a > b {
        a
    } else {
        b
    }
}

const fn min(a: u32, b: u32) -> u32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Every slice an endpoint needs. Lengths: see [`Layout`] (the endpoint
/// works with whatever it is given: fewer index slots than twice the
/// connections only lengthen probes; `inflight_nodes` must be
/// `inflight_records / 16`, `reorder_nodes` `reorder_words / 16`).
pub struct Storage<B: Backing, const P: usize> {
    pub connections: Slice<B, ConnSlot<P>>,
    pub connection_index: Slice<B, u32>,
    pub work_entries: Slice<B, PoolEntry<WorkEntry>>,
    pub recv_entries: Slice<B, PoolEntry<RecvEntry>>,
    pub senders: Slice<B, PoolEntry<SenderState<P>>>,
    pub inflight_records: Slice<B, InflightRecord>,
    pub inflight_nodes: Slice<B, BuddyNode>,
    pub reorder_words: Slice<B, u64>,
    pub reorder_nodes: Slice<B, BuddyNode>,
    pub regions: Slice<B, RegionSlot>,
    pub sources: Slice<B, SourceBucket>,
    /// Initiators' RETRY cookies (spec 4.2).
    pub cookies: Slice<B, PoolEntry<[u8; COOKIE_LEN]>>,
    /// The key pool of protected connections (spec 5.3).
    pub key_slots: Slice<B, KeySlot>,
}

impl<'a, const P: usize> Storage<Borrowed<'a>, P> {
    /// Cuts the storage into `count` equal, disjoint shares, one per shard
    /// of a connection table split between endpoints (spec 4.14.1); what
    /// does not divide evenly is left unused. `N` bounds `count`.
    pub fn into_shares<const N: usize>(
        mut self,
        count: usize,
    ) -> heapless::Vec<Storage<Borrowed<'a>, P>, N> {
        fn take<'a, T>(slice: &mut &'a mut [T], n: usize) -> &'a mut [T] {
            let all = core::mem::take(slice);
            let (head, tail) = all.split_at_mut(n.min(all.len()));
            *slice = tail;
            head
        }
        let count = count.clamp(1, N);
        let conns = self.connections.len() / count;
        let index = self.connection_index.len() / count;
        let work = self.work_entries.len() / count;
        let recvs = self.recv_entries.len() / count;
        let senders = self.senders.len() / count;
        let nodes = self.inflight_nodes.len() / count;
        let reorder = self.reorder_nodes.len() / count;
        let regions = self.regions.len() / count;
        let sources = self.sources.len() / count;
        let cookies = self.cookies.len() / count;
        let keys = self.key_slots.len() / count;
        let mut out = heapless::Vec::new();
        for _ in 0..count {
            let share = Storage {
                connections: take(&mut self.connections, conns),
                connection_index: take(&mut self.connection_index, index),
                work_entries: take(&mut self.work_entries, work),
                recv_entries: take(&mut self.recv_entries, recvs),
                senders: take(&mut self.senders, senders),
                inflight_records: take(&mut self.inflight_records, nodes << MIN_SHIFT),
                inflight_nodes: take(&mut self.inflight_nodes, nodes),
                reorder_words: take(&mut self.reorder_words, reorder << MIN_SHIFT),
                reorder_nodes: take(&mut self.reorder_nodes, reorder),
                regions: take(&mut self.regions, regions),
                sources: take(&mut self.sources, sources),
                cookies: take(&mut self.cookies, cookies),
                key_slots: take(&mut self.key_slots, keys),
            };
            // `count <= N`: the pushes fit.
            let _ = out.push(share);
        }
        out
    }
}

impl<B: Backing, const P: usize> core::fmt::Debug for Storage<B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Storage")
            .field("connections", &self.connections.len())
            .field("work_entries", &self.work_entries.len())
            .field("recv_entries", &self.recv_entries.len())
            .field("senders", &self.senders.len())
            .field("inflight_records", &self.inflight_records.len())
            .field("reorder_words", &self.reorder_words.len())
            .field("regions", &self.regions.len())
            .field("sources", &self.sources.len())
            .field("cookies", &self.cookies.len())
            .field("key_slots", &self.key_slots.len())
            .finish()
    }
}
