//! A host's memory: one flat byte arena at a base address, which the
//! transport reads payload from and places payload into: through
//! [`metaroce_core::api::Memory`] (the RoCEv2 adapter calls its endpoint
//! directly) or as the DMA target of the platform's engine loop
//! ([`DmaCopy`], the MetaRoCE adapter).
//!
//! A workload's source data is a seeded pattern ([`fill_pattern`]) that
//! [`Arena::with_patterns`] writes in place. An arena remembers which of
//! its pattern ranges nobody has written since, and keeps that knowledge
//! with its buffer when dropped: the next run of an experiment (same
//! flows, same layout) finds its source data already there and writes
//! only the rest of the arena.
//!
//! A synthetic arena ([`Arena::synthetic`], [`synthetic`]) stores none of
//! that: its source ranges are computed when read and writes into its
//! sink ranges are checked against the pattern on arrival, so memory does
//! not grow with the payload a run carries.

use std::sync::Mutex;

mod synthetic;

use synthetic::Synthetic;
pub use synthetic::{pattern_at, pattern_mismatches, Placement};

use crate::rng::SimRng;

use metaroce_core::api::Memory;
use metaroce_platform::dma::{DmaCopy, DmaError};

/// Where every host's arena starts (any non-zero address works; zero is
/// avoided so that a null address is never valid).
pub const ARENA_BASE: u64 = 0x1000_0000;

/// Value memory is filled with before anything is written, so stray writes
/// and missing data both show in integrity checks.
pub const FILL: u8 = 0xEE;

/// Buffers of dropped arenas, for the next arenas to reuse: an experiment
/// runs one simulation after another with the same memory layout, and
/// writing into already-mapped pages is several times cheaper than having
/// the kernel fault in and zero fresh ones (a quarter of a permutation
/// run's time went there). Shared by every thread; bounded by
/// [`SPARE_LIMIT_BYTES`].
static SPARE: Mutex<Vec<Spare>> = Mutex::new(Vec::new());

/// A dropped arena's buffer and the pattern ranges in it that still hold
/// their pattern.
struct Spare {
    bytes: Vec<u8>,
    clean: Vec<Pattern>,
}

/// Fills `out` with the data pattern of `stream` under `seed`: the
/// 64-bit words of `SimRng::stream(seed, stream)` in order,
/// little-endian, the last one cut to fit.
pub fn fill_pattern(seed: u64, stream: u64, out: &mut [u8]) {
    let mut rng = SimRng::stream(seed, stream);
    let mut words = out.chunks_exact_mut(8);
    for word in &mut words {
        word.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let len = tail.len();
        tail.copy_from_slice(&rng.next_u64().to_le_bytes()[..len]);
    }
}

/// Appends `len` bytes of the data pattern of `stream` under `seed` to
/// `bytes`: what [`fill_pattern`] writes, through a small buffer.
fn extend_pattern(bytes: &mut Vec<u8>, seed: u64, stream: u64, len: usize) {
    // A multiple of 8: only the last piece ends in a cut word.
    const PIECE: usize = 4096;
    let mut rng = SimRng::stream(seed, stream);
    let mut piece = [0u8; PIECE];
    let mut left = len;
    while left > 0 {
        let n = left.min(PIECE);
        let mut words = piece[..n].chunks_exact_mut(8);
        for word in &mut words {
            word.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let k = tail.len();
            tail.copy_from_slice(&rng.next_u64().to_le_bytes()[..k]);
        }
        bytes.extend_from_slice(&piece[..n]);
        left -= n;
    }
}

/// A data pattern to place in an arena ([`Arena::with_patterns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternRange {
    /// Offset from the arena's base.
    pub offset: u64,
    pub len: u64,
    /// [`fill_pattern`]'s seed and stream.
    pub seed: u64,
    pub stream: u64,
}

/// A pattern range of an arena's buffer (offsets into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pattern {
    start: usize,
    end: usize,
    seed: u64,
    stream: u64,
}

/// The ranges of `patterns` that lie inside an arena of `len` bytes, as
/// offsets.
fn inside(len: usize, patterns: &[PatternRange]) -> Vec<Pattern> {
    patterns
        .iter()
        .filter_map(|p| {
            let start = usize::try_from(p.offset).ok()?;
            let end = start.checked_add(usize::try_from(p.len).ok()?)?;
            (end <= len && start < end).then_some(Pattern {
                start,
                end,
                seed: p.seed,
                stream: p.stream,
            })
        })
        .collect()
}

/// Most bytes [`SPARE`] keeps.
const SPARE_LIMIT_BYTES: usize = 2 << 30;

/// Buffers smaller than this are left to the allocator.
const SPARE_MIN_BYTES: usize = 1 << 20;

/// A spare buffer that holds `len` bytes, if any: one whose pattern
/// ranges start with `first` (an arena of the same host in an earlier run
/// of the experiment), else the smallest.
fn take_spare(len: usize, first: Option<&Pattern>) -> Option<Spare> {
    if len < SPARE_MIN_BYTES {
        return None;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let fits = |b: &Spare| b.bytes.capacity() >= len;
    let best = first
        .and_then(|p| {
            spare
                .iter()
                .position(|b| fits(b) && b.clean.first() == Some(p))
        })
        .or_else(|| {
            spare
                .iter()
                .enumerate()
                .filter(|(_, b)| fits(b))
                .min_by_key(|(_, b)| b.bytes.capacity())
                .map(|(i, _)| i)
        })?;
    Some(spare.swap_remove(best))
}

/// Keeps `bytes` for a later arena unless the spares are full.
fn give_spare(bytes: Vec<u8>, clean: Vec<Pattern>) {
    if bytes.capacity() < SPARE_MIN_BYTES {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = spare.iter().map(|b| b.bytes.capacity()).sum();
    if held + bytes.capacity() <= SPARE_LIMIT_BYTES {
        spare.push(Spare { bytes, clean });
    }
}

/// A host's memory.
#[derive(Debug, Clone)]
pub struct Arena {
    base: u64,
    /// The bytes (empty in a synthetic arena).
    bytes: Vec<u8>,
    /// A synthetic arena's ranges and what arrived in them; `None` when
    /// the arena stores its bytes.
    synthetic: Option<Box<Synthetic>>,
    /// Bytes in the arena (`bytes.len()` unless synthetic).
    len: usize,
    /// Pattern ranges that hold their pattern (nothing wrote into them
    /// since it was placed): sorted, disjoint.
    clean: Vec<Pattern>,
    /// Accesses outside the arena (the transport validated them against
    /// its regions, so these mean a region was registered beyond the
    /// arena): ignored and counted rather than panicking.
    pub out_of_bounds: u64,
}

impl Arena {
    /// `len` bytes at [`ARENA_BASE`], filled with [`FILL`] (in a dropped
    /// arena's buffer when one is large enough).
    pub fn new(len: usize) -> Arena {
        let bytes = match take_spare(len, None) {
            Some(Spare { mut bytes, .. }) => {
                // Every byte refilled: nothing of an earlier run shows.
                bytes.clear();
                bytes.resize(len, FILL);
                bytes
            }
            None => vec![FILL; len],
        };
        Arena {
            base: ARENA_BASE,
            len: bytes.len(),
            bytes,
            synthetic: None,
            clean: Vec::new(),
            out_of_bounds: 0,
        }
    }

    /// `len` bytes at [`ARENA_BASE`] holding the data pattern of each of
    /// `patterns` in its range and [`FILL`] everywhere else: the same
    /// bytes as [`Arena::new`] and then [`fill_pattern`] on each range.
    /// Ranges must not overlap; those not inside the arena are left out.
    ///
    /// Cheaper: a fresh buffer has each byte written once, and a
    /// pattern range that a reused buffer still holds unwritten from an
    /// earlier run is not written again.
    pub fn with_patterns(len: usize, patterns: &[PatternRange]) -> Arena {
        let mut clean = inside(len, patterns);
        clean.sort_by_key(|p| p.start);
        assert!(
            clean.windows(2).all(|w| w[0].end <= w[1].start),
            "pattern ranges overlap"
        );
        let bytes = match take_spare(len, clean.first()) {
            // What an earlier run left is overwritten, except in the
            // pattern ranges it left clean.
            Some(Spare {
                mut bytes,
                clean: held,
            }) => {
                if bytes.len() > len {
                    bytes.truncate(len);
                } else {
                    bytes.resize(len, FILL);
                }
                let mut at = 0;
                for p in &clean {
                    bytes[at..p.start].fill(FILL);
                    if !held.contains(p) {
                        fill_pattern(p.seed, p.stream, &mut bytes[p.start..p.end]);
                    }
                    at = p.end;
                }
                bytes[at..].fill(FILL);
                bytes
            }
            // A fresh buffer is built front to back, each byte written
            // once (the first write to a page is the costly one).
            None => {
                let mut bytes = Vec::with_capacity(len);
                for p in &clean {
                    bytes.resize(p.start, FILL);
                    extend_pattern(&mut bytes, p.seed, p.stream, p.end - p.start);
                }
                bytes.resize(len, FILL);
                bytes
            }
        };
        Arena {
            base: ARENA_BASE,
            len: bytes.len(),
            bytes,
            synthetic: None,
            clean,
            out_of_bounds: 0,
        }
    }

    /// `len` bytes at [`ARENA_BASE`] that are not stored: `sources` hold
    /// their data pattern (computed when read), `sinks` expect theirs,
    /// and every write is checked against it and recorded on arrival
    /// ([`Arena::placement`]); everything else reads as [`FILL`]. Memory
    /// grows with the number of ranges and the gaps in what arrived, not
    /// with `len`. Ranges of either kind must not overlap; those not
    /// inside the arena are left out.
    pub fn synthetic(len: usize, sources: &[PatternRange], sinks: &[PatternRange]) -> Arena {
        Arena {
            base: ARENA_BASE,
            bytes: Vec::new(),
            synthetic: Some(Box::new(Synthetic::new(
                inside(len, sources),
                inside(len, sinks),
            ))),
            len,
            clean: Vec::new(),
            out_of_bounds: 0,
        }
    }

    /// Whether the arena is synthetic ([`Arena::synthetic`]).
    pub fn is_synthetic(&self) -> bool {
        self.synthetic.is_some()
    }

    /// What the sink range at `[addr, addr + len)` of a synthetic arena
    /// received; `None` for a stored arena or if no sink range is exactly
    /// that.
    pub fn placement(&self, addr: u64, len: usize) -> Option<Placement> {
        let start = self.range(addr, len)?.start;
        self.synthetic.as_ref()?.placement(start, len)
    }

    /// Bytes written into a synthetic arena outside its sink ranges (0 for
    /// a stored arena).
    pub fn stray_bytes(&self) -> u64 {
        self.synthetic.as_ref().map_or(0, |s| s.stray_bytes)
    }

    /// First address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes in the arena.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, addr: u64, len: usize) -> Option<core::ops::Range<usize>> {
        let start = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.len).then_some(start..end)
    }

    /// The bytes at `[addr, addr + len)`, if inside the arena and stored
    /// (never in a synthetic arena: read those with [`Memory::read`]).
    pub fn get(&self, addr: u64, len: usize) -> Option<&[u8]> {
        if self.synthetic.is_some() {
            return None;
        }
        self.range(addr, len).map(|r| &self.bytes[r])
    }

    /// Mutable bytes at `[addr, addr + len)`, if inside the arena and
    /// stored (never in a synthetic arena). The pattern ranges among them
    /// are no longer known to be clean.
    pub fn get_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        if self.synthetic.is_some() {
            return None;
        }
        let r = self.range(addr, len)?;
        let first = self.clean.partition_point(|p| p.end <= r.start);
        let last = first + self.clean[first..].partition_point(|p| p.start < r.end);
        self.clean.drain(first..last);
        Some(&mut self.bytes[r])
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        give_spare(
            core::mem::take(&mut self.bytes),
            core::mem::take(&mut self.clean),
        );
    }
}

impl Arena {
    /// Writes `data` at `addr`; false (and counted) when outside the arena.
    fn store(&mut self, addr: u64, data: &[u8]) -> bool {
        if self.synthetic.is_some() {
            return match self.range(addr, data.len()) {
                Some(r) => {
                    if let Some(synthetic) = self.synthetic.as_deref_mut() {
                        synthetic.write(r.start, data);
                    }
                    true
                }
                None => {
                    self.out_of_bounds += 1;
                    false
                }
            };
        }
        match self.get_mut(addr, data.len()) {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => {
                self.out_of_bounds += 1;
                false
            }
        }
    }

    /// Reads into `out` from `addr`; false (and counted) when outside the
    /// arena.
    fn load(&mut self, addr: u64, out: &mut [u8]) -> bool {
        match self.range(addr, out.len()) {
            Some(r) => {
                match self.synthetic.as_deref() {
                    Some(synthetic) => synthetic.read(r.start, out),
                    None => out.copy_from_slice(&self.bytes[r]),
                }
                true
            }
            None => {
                self.out_of_bounds += 1;
                false
            }
        }
    }
}

impl Memory for Arena {
    fn write(&mut self, addr: u64, data: &[u8]) {
        self.store(addr, data);
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        if !self.load(addr, out) {
            out.fill(0);
        }
    }
}

/// Refused copies count in [`Arena::out_of_bounds`] too, so workload
/// reports see them whichever way the transport reached memory.
impl DmaCopy for Arena {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        if self.store(addr, data) {
            Ok(())
        } else {
            Err(DmaError::OutOfRange {
                addr,
                len: data.len(),
            })
        }
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        if self.load(addr, out) {
            Ok(())
        } else {
            Err(DmaError::OutOfRange {
                addr,
                len: out.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_not_panicked() {
        let mut a = Arena::new(16);
        a.write(ARENA_BASE + 4, &[1, 2, 3]);
        assert_eq!(a.get(ARENA_BASE + 3, 5), Some(&[FILL, 1, 2, 3, FILL][..]));
        a.write(ARENA_BASE + 15, &[9, 9]);
        a.write(ARENA_BASE - 1, &[9]);
        let mut out = [7u8; 2];
        a.read(u64::MAX, &mut out);
        assert_eq!((a.out_of_bounds, out), (3, [0, 0]));
    }

    #[test]
    fn a_reused_buffer_is_refilled() {
        let len = SPARE_MIN_BYTES + 8;
        let mut a = Arena::new(len);
        a.write(ARENA_BASE, &[1; 8]);
        a.write(ARENA_BASE + len as u64 - 8, &[2; 8]);
        drop(a);
        // Whichever buffer comes back (other tests share the spares),
        // every byte holds FILL.
        let b = Arena::new(len - 8);
        assert_eq!(b.len(), len - 8);
        assert!(b
            .get(ARENA_BASE, len - 8)
            .unwrap()
            .iter()
            .all(|&x| x == FILL));
    }

    /// What `with_patterns` must equal: a filled arena, then each pattern
    /// written.
    fn filled(len: usize, patterns: &[PatternRange]) -> Vec<u8> {
        let mut a = vec![FILL; len];
        for p in patterns {
            let (start, end) = (p.offset as usize, (p.offset + p.len) as usize);
            if end <= len {
                fill_pattern(p.seed, p.stream, &mut a[start..end]);
            }
        }
        a
    }

    #[test]
    fn patterns_are_placed_as_if_written_and_rewritten_once_dirty() {
        let len = SPARE_MIN_BYTES + 4_099;
        let pattern = |offset: u64, len: u64, stream: u64| PatternRange {
            offset,
            len,
            seed: 7,
            stream,
        };
        // Out of order, odd lengths, one past the end (left out).
        let patterns = [
            pattern(70_001, 65_537, 3),
            pattern(5, 4_096, 1),
            pattern(len as u64 - 3, 8, 9),
            pattern(SPARE_MIN_BYTES as u64, 4_099, 2),
        ];
        let want = filled(len, &patterns);
        for round in 0..3 {
            let mut a = Arena::with_patterns(len, &patterns);
            assert!(a.get(ARENA_BASE, len) == Some(&want[..]), "round {round}");
            // Dirty one pattern range and one byte outside the patterns:
            // whichever buffer the next round reuses, it must not show.
            a.copy_to_host(ARENA_BASE + 70_001 + 100, &[0; 3]).unwrap();
            a.write(ARENA_BASE + 1, &[0]);
            assert_eq!(a.clean.len(), 2);
        }
        let mut out = [0u8; 6];
        let a = Arena::with_patterns(len, &patterns);
        assert!(a.clean.windows(2).all(|w| w[0].end <= w[1].start));
        let mut b = a.clone();
        b.read(ARENA_BASE + 2, &mut out);
        assert_eq!(out[..], want[2..8]);
    }

    #[test]
    fn dma_copies_are_bounds_checked_and_counted() {
        let mut a = Arena::new(16);
        a.copy_to_host(ARENA_BASE + 14, &[1, 2]).unwrap();
        let mut out = [0u8; 3];
        a.copy_from_host(ARENA_BASE + 13, &mut out).unwrap();
        assert_eq!(out, [FILL, 1, 2]);
        assert!(a.copy_to_host(ARENA_BASE + 15, &[1, 2]).is_err());
        assert!(a.copy_from_host(ARENA_BASE - 1, &mut out).is_err());
        assert_eq!(a.out_of_bounds, 2);
    }

    /// A synthetic arena reads as the stored one does after the same
    /// correct writes, and records wrong, repeated, missing and stray bytes.
    #[test]
    fn a_synthetic_arena_reads_like_a_stored_one_and_checks_writes() {
        let len = 20_000;
        let range = |offset: u64, len: u64, stream: u64| PatternRange {
            offset,
            len,
            seed: 3,
            stream,
        };
        let sources = [range(100, 5_000, 1), range(9_000, 3_000, 2)];
        let sinks = [range(6_000, 2_500, 1)];
        let mut stored = Arena::with_patterns(len, &sources);
        let mut synthetic = Arena::synthetic(len, &sources, &sinks);
        assert!(synthetic.is_synthetic() && synthetic.get(ARENA_BASE, 1).is_none());
        // Flow 1's bytes copied from its source into the sink, out of
        // order, the last piece missing at first.
        let mut piece = vec![0u8; 1_000];
        for at in [1_000u64, 0, 2_000] {
            let n = if at == 2_000 { 500 } else { 1_000 };
            stored.read(ARENA_BASE + 100 + at, &mut piece[..n]);
            let dst = ARENA_BASE + 6_000 + at;
            stored.write(dst, &piece[..n]);
            synthetic.copy_to_host(dst, &piece[..n]).unwrap();
            if at == 0 {
                let partial = synthetic.placement(ARENA_BASE + 6_000, 2_500).unwrap();
                assert!(!partial.complete && !partial.intact());
            }
        }
        let mut want = vec![0u8; len];
        let mut got = vec![0u8; len];
        stored.read(ARENA_BASE, &mut want);
        synthetic.read(ARENA_BASE, &mut got);
        assert!(want == got);
        synthetic.write(ARENA_BASE + 7_000, &[]);
        let done = synthetic.placement(ARENA_BASE + 6_000, 2_500).unwrap();
        assert!(done.intact(), "{done:?}");
        assert_eq!(synthetic.placement(ARENA_BASE + 6_000, 2_499), None);
        // A repeat, a wrong byte, a write into a source, one outside.
        synthetic.write(ARENA_BASE + 6_010, &want[6_010..6_020]);
        synthetic.write(ARENA_BASE + 6_030, &[want[6_030] ^ 1]);
        synthetic.write(ARENA_BASE + 200, &[1, 2, 3]);
        synthetic.write(ARENA_BASE + len as u64, &[1]);
        let after = synthetic.placement(ARENA_BASE + 6_000, 2_500).unwrap();
        assert_eq!((after.repeated_bytes, after.wrong_bytes), (11, 1));
        assert_eq!((synthetic.stray_bytes(), synthetic.out_of_bounds), (3, 1));
    }
}
