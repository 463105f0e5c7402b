//! Endpoint storage in `static`s, for firmware: the core never allocates,
//! so a board declares its tables and pools as statics sized by its
//! configuration and hands them to the endpoint once.
//!
//! The statics are uninitialised memory (in `.bss`, so they cost nothing
//! in the image); [`static_endpoint_storage!`] fills each element with its
//! vacant value before making a slice of it, and a flag makes sure the
//! slices are made once.

/// Writes `value` into every element of `slot` and returns it as a slice.
///
/// # Safety
/// `slot` must not be reachable through any other reference for `'a`
/// (the macro guarantees it with a take-once flag).
pub unsafe fn init_slice<'a, T: Clone, const N: usize>(
    slot: *mut core::mem::MaybeUninit<[T; N]>,
    value: T,
) -> &'a mut [T] {
    let first = slot.cast::<T>();
    for i in 0..N {
        // SAFETY: `i < N` stays inside the array behind `slot`, which the
        // caller guarantees no one else reaches; `write` needs no
        // initialised value to overwrite.
        unsafe { first.add(i).write(value.clone()) };
    }
    // SAFETY: every element was just initialised, the memory is valid for
    // `'a` (a static) and unaliased (the caller's guarantee).
    unsafe { core::slice::from_raw_parts_mut(first, N) }
}

/// Defines `fn $name() -> Option<Storage<Borrowed<'static>, $paths>>` over
/// statics of the given sizes; it returns `Some` the first time only.
/// `reorder_words` (the receivers' out-of-order bitmaps) may be left out:
/// it then defaults to `metaroce_core::storage::DEFAULT_REORDER_WORDS`;
/// `key_slots` (protected connections, spec 5.3) may be left out: 0.
///
/// ```ignore
/// metaroce_platform::static_endpoint_storage!(take_storage, 8,
///     connections: 1024, work_entries: 4096, recv_entries: 4096,
///     senders: 256, inflight_records: 8192, reorder_words: 4096, regions: 2048);
/// ```
#[macro_export]
macro_rules! static_endpoint_storage {
    ($name:ident, $paths:expr,
     connections: $c:expr, work_entries: $w:expr, recv_entries: $r:expr,
     senders: $s:expr, inflight_records: $i:expr, regions: $g:expr) => {
        $crate::static_endpoint_storage!($name, $paths,
            connections: $c, work_entries: $w, recv_entries: $r, senders: $s,
            inflight_records: $i,
            reorder_words: $crate::__core::storage::DEFAULT_REORDER_WORDS,
            regions: $g, key_slots: 0);
    };
    ($name:ident, $paths:expr,
     connections: $c:expr, work_entries: $w:expr, recv_entries: $r:expr,
     senders: $s:expr, inflight_records: $i:expr, reorder_words: $b:expr,
     regions: $g:expr) => {
        $crate::static_endpoint_storage!($name, $paths,
            connections: $c, work_entries: $w, recv_entries: $r, senders: $s,
            inflight_records: $i, reorder_words: $b, regions: $g, key_slots: 0);
    };
    ($name:ident, $paths:expr,
     connections: $c:expr, work_entries: $w:expr, recv_entries: $r:expr,
     senders: $s:expr, inflight_records: $i:expr, regions: $g:expr,
     key_slots: $k:expr) => {
        $crate::static_endpoint_storage!($name, $paths,
            connections: $c, work_entries: $w, recv_entries: $r, senders: $s,
            inflight_records: $i,
            reorder_words: $crate::__core::storage::DEFAULT_REORDER_WORDS,
            regions: $g, key_slots: $k);
    };
    ($name:ident, $paths:expr,
     connections: $c:expr, work_entries: $w:expr, recv_entries: $r:expr,
     senders: $s:expr, inflight_records: $i:expr, reorder_words: $b:expr,
     regions: $g:expr, key_slots: $k:expr) => {
        fn $name() -> ::core::option::Option<
            $crate::__core::Storage<$crate::__core::Borrowed<'static>, { $paths }>,
        > {
            use ::core::mem::MaybeUninit;
            use ::core::ptr::addr_of_mut;
            use ::core::sync::atomic::{AtomicBool, Ordering};
            use $crate::__core::conn::{InflightRecord, RecvEntry, SenderState, WorkEntry};
            use $crate::__core::crypto::KeySlot;
            use $crate::__core::memory::RegionSlot;
            use $crate::__core::storage::buddy::BuddyNode;
            use $crate::__core::storage::pool::PoolEntry;
            use $crate::__core::{ConnSlot, Layout, SourceBucket};
            const LAYOUT: Layout = Layout {
                connections: $c,
                work_entries: $w,
                recv_entries: $r,
                senders: $s,
                inflight_records: $i,
                reorder_words: $b,
                regions: $g,
                sources: Layout::sources_for($c),
                cookies: Layout::cookies_for($c),
                key_slots: $k,
            };
            const C: usize = LAYOUT.connections as usize;
            const X: usize = LAYOUT.index_slots();
            const W: usize = LAYOUT.work_entries as usize;
            const R: usize = LAYOUT.recv_entries as usize;
            const S: usize = LAYOUT.senders as usize;
            const I: usize = LAYOUT.inflight_records_used();
            const N: usize = LAYOUT.inflight_nodes();
            const BW: usize = LAYOUT.reorder_words_used();
            const BN: usize = LAYOUT.reorder_nodes();
            const G: usize = LAYOUT.regions as usize;
            const Q: usize = LAYOUT.sources as usize;
            const J: usize = LAYOUT.cookies as usize;
            const K: usize = LAYOUT.key_slots as usize;
            static TAKEN: AtomicBool = AtomicBool::new(false);
            static mut CONNECTIONS: MaybeUninit<[ConnSlot<{ $paths }>; C]> = MaybeUninit::uninit();
            static mut INDEX: MaybeUninit<[u32; X]> = MaybeUninit::uninit();
            static mut WORK: MaybeUninit<[PoolEntry<WorkEntry>; W]> = MaybeUninit::uninit();
            static mut RECV: MaybeUninit<[PoolEntry<RecvEntry>; R]> = MaybeUninit::uninit();
            static mut SENDERS: MaybeUninit<[PoolEntry<SenderState<{ $paths }>>; S]> =
                MaybeUninit::uninit();
            static mut RECORDS: MaybeUninit<[InflightRecord; I]> = MaybeUninit::uninit();
            static mut NODES: MaybeUninit<[BuddyNode; N]> = MaybeUninit::uninit();
            static mut REORDER_WORDS: MaybeUninit<[u64; BW]> = MaybeUninit::uninit();
            static mut REORDER_NODES: MaybeUninit<[BuddyNode; BN]> = MaybeUninit::uninit();
            static mut REGIONS: MaybeUninit<[RegionSlot; G]> = MaybeUninit::uninit();
            static mut SOURCES: MaybeUninit<[SourceBucket; Q]> = MaybeUninit::uninit();
            static mut COOKIES: MaybeUninit<[PoolEntry<[u8; 32]>; J]> = MaybeUninit::uninit();
            static mut KEYS: MaybeUninit<[KeySlot; K]> = MaybeUninit::uninit();
            if TAKEN.swap(true, Ordering::AcqRel) {
                return None;
            }
            // SAFETY: `TAKEN` makes this the only time references to these
            // statics are made, so each slice is the only way to them for
            // the rest of the run.
            unsafe {
                Some($crate::__core::Storage {
                    connections: $crate::storage::init_slice(
                        addr_of_mut!(CONNECTIONS),
                        ConnSlot::VACANT,
                    ),
                    connection_index: $crate::storage::init_slice(addr_of_mut!(INDEX), 0),
                    work_entries: $crate::storage::init_slice(
                        addr_of_mut!(WORK),
                        PoolEntry::vacant(WorkEntry::VACANT),
                    ),
                    recv_entries: $crate::storage::init_slice(
                        addr_of_mut!(RECV),
                        PoolEntry::vacant(RecvEntry::VACANT),
                    ),
                    senders: $crate::storage::init_slice(
                        addr_of_mut!(SENDERS),
                        PoolEntry::vacant(SenderState::VACANT),
                    ),
                    inflight_records: $crate::storage::init_slice(
                        addr_of_mut!(RECORDS),
                        InflightRecord::EMPTY,
                    ),
                    inflight_nodes: $crate::storage::init_slice(
                        addr_of_mut!(NODES),
                        BuddyNode::INIT,
                    ),
                    reorder_words: $crate::storage::init_slice(addr_of_mut!(REORDER_WORDS), 0),
                    reorder_nodes: $crate::storage::init_slice(
                        addr_of_mut!(REORDER_NODES),
                        BuddyNode::INIT,
                    ),
                    regions: $crate::storage::init_slice(addr_of_mut!(REGIONS), RegionSlot::VACANT),
                    sources: $crate::storage::init_slice(
                        addr_of_mut!(SOURCES),
                        SourceBucket::EMPTY,
                    ),
                    cookies: $crate::storage::init_slice(
                        addr_of_mut!(COOKIES),
                        PoolEntry::vacant([0; 32]),
                    ),
                    key_slots: $crate::storage::init_slice(addr_of_mut!(KEYS), KeySlot::VACANT),
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::static_endpoint_storage!(take, 4,
        connections: 100, work_entries: 64, recv_entries: 64,
        senders: 8, inflight_records: 1000, regions: 16);

    #[test]
    fn storage_is_handed_out_once_and_sized_by_the_layout() {
        let s = take().expect("first time");
        assert_eq!(s.connections.len(), 100);
        assert_eq!(s.connection_index.len(), 256);
        assert_eq!(s.inflight_records.len(), 1008, "a multiple of 16");
        assert_eq!(s.inflight_nodes.len(), 63);
        assert_eq!(
            s.sources.len(),
            512,
            "four source-prefix entries per connection, a power of two"
        );
        assert_eq!(s.reorder_words.len(), 16_384, "the default");
        assert_eq!(s.reorder_nodes.len(), 1024);
        assert!(take().is_none(), "never twice");
        let ep = metaroce_core::Endpoint::new(
            metaroce_core::Config::default(),
            s,
            metaroce_core::rng::seed_from_u64(1),
        );
        assert_eq!(ep.capacity(), 100);
    }
}
