//! Synthetic host memory: an arena that stores no payload. Its source
//! ranges hold a data pattern that is a function of (seed, stream,
//! offset), computed when read; its sink ranges expect a pattern, and
//! every write into them is compared with it on arrival and recorded as
//! covered. So a workload still checks every flow end to end (each byte
//! placed once, at its address, with the value sent) while the arena's
//! memory is a few intervals per flow whatever the flow's size.
//!
//! Reads return what a stored arena would hold if every write so far was
//! correct: the pattern in source ranges and in the covered parts of sink
//! ranges, [`super::FILL`] elsewhere (a wrong write is counted, not kept).

use super::{Pattern, FILL};
use crate::rng::SimRng;

/// The pattern bytes of `(seed, stream)` from byte `offset` on, written
/// into `out`: the bytes [`super::fill_pattern`] writes into a range
/// at `offset..offset + out.len()` of it.
pub fn pattern_at(seed: u64, stream: u64, offset: u64, out: &mut [u8]) {
    // Drawn in sequence from the first word: an addition and a mix per
    // word (this is most of a synthetic run's memory cost).
    let mut rng = SimRng::stream(seed, stream);
    rng.skip(offset / 8);
    let skip = (offset % 8) as usize;
    let mut out = out;
    if skip != 0 {
        let n = (8 - skip).min(out.len());
        let bytes = rng.next_u64().to_le_bytes();
        out[..n].copy_from_slice(&bytes[skip..skip + n]);
        out = &mut out[n..];
    }
    let mut words = out.chunks_exact_mut(8);
    for chunk in &mut words {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&rng.next_u64().to_le_bytes()[..n]);
    }
}

/// Bytes of `data` that differ from the pattern of `(seed, stream)` at
/// `offset` (compared a block at a time; bytes counted only in blocks
/// that differ).
pub fn pattern_mismatches(seed: u64, stream: u64, offset: u64, data: &[u8]) -> u64 {
    const BLOCK: usize = 512;
    let mut want = [0u8; BLOCK];
    let mut wrong = 0;
    for (i, got) in data.chunks(BLOCK).enumerate() {
        let want = &mut want[..got.len()];
        pattern_at(seed, stream, offset + (i * BLOCK) as u64, want);
        if want != got {
            wrong += want.iter().zip(got).filter(|(a, b)| a != b).count() as u64;
        }
    }
    wrong
}

/// Byte ranges written so far: sorted, disjoint, touching runs merged.
/// Data placed in order keeps one run; each gap in the order adds one
/// while it lasts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Coverage {
    runs: Vec<(u64, u64)>,
}

impl Coverage {
    /// Adds `[start, end)`; returns how many of its bytes were already
    /// covered.
    fn insert(&mut self, start: u64, end: u64) -> u64 {
        // The first run that ends at or after `start` (touching counts).
        let first = self.runs.partition_point(|&(_, e)| e < start);
        // Runs from `first` that start at or before `end` merge with it.
        let last = first + self.runs[first..].partition_point(|&(s, _)| s <= end);
        if first == last {
            self.runs.insert(first, (start, end));
            return 0;
        }
        let mut repeated = 0;
        for &(s, e) in &self.runs[first..last] {
            repeated += e.min(end).saturating_sub(s.max(start));
        }
        let merged = (
            self.runs[first].0.min(start),
            self.runs[last - 1].1.max(end),
        );
        self.runs.drain(first + 1..last);
        self.runs[first] = merged;
        repeated
    }

    /// Whether exactly `[0, len)` is covered.
    fn is_exactly(&self, len: u64) -> bool {
        match self.runs.as_slice() {
            [] => len == 0,
            [(0, end)] => *end == len,
            _ => false,
        }
    }

    /// The covered parts of `[start, end)`.
    fn within(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.runs.partition_point(|&(_, e)| e <= start);
        self.runs[first..]
            .iter()
            .take_while(move |&&(s, _)| s < end)
            .map(move |&(s, e)| (s.max(start), e.min(end)))
    }
}

/// A range that expects a pattern, and what arrived in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sink {
    pattern: Pattern,
    /// Offsets into the range, not the arena.
    placed: Coverage,
    /// Bytes written with another value than the pattern's.
    wrong_bytes: u64,
    /// Bytes written more than once.
    repeated_bytes: u64,
}

/// What a sink range received: see [`super::Arena::placement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Every byte of the range was written.
    pub complete: bool,
    /// Bytes written with another value than the one sent.
    pub wrong_bytes: u64,
    /// Bytes written more than once.
    pub repeated_bytes: u64,
}

impl Placement {
    /// Every byte placed once, with the value sent.
    pub fn intact(&self) -> bool {
        self.complete && self.wrong_bytes == 0 && self.repeated_bytes == 0
    }
}

/// An arena's contents without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Synthetic {
    /// Source ranges, sorted and disjoint (offsets into the arena).
    sources: Vec<Pattern>,
    /// Sink ranges, sorted and disjoint.
    sinks: Vec<Sink>,
    /// Bytes written outside every sink range (into a source range or
    /// memory no flow uses): no stored arena would notice them unless
    /// they hit a range a check compares, so they are all counted.
    pub(super) stray_bytes: u64,
}

/// Sorted by start; panics when two overlap (a caller's layout bug, as in
/// [`super::Arena::with_patterns`]).
fn sorted(mut ranges: Vec<Pattern>) -> Vec<Pattern> {
    ranges.sort_by_key(|p| p.start);
    assert!(
        ranges.windows(2).all(|w| w[0].end <= w[1].start),
        "pattern ranges overlap"
    );
    ranges
}

/// The items of `ranges` (sorted, disjoint) that overlap `[start, end)`.
fn overlapping<T>(
    ranges: &[T],
    start: usize,
    end: usize,
    pattern: impl Fn(&T) -> &Pattern,
) -> core::ops::Range<usize> {
    let first = ranges.partition_point(|r| pattern(r).end <= start);
    first..first + ranges[first..].partition_point(|r| pattern(r).start < end)
}

impl Synthetic {
    pub(super) fn new(sources: Vec<Pattern>, sinks: Vec<Pattern>) -> Synthetic {
        Synthetic {
            sources: sorted(sources),
            sinks: sorted(sinks)
                .into_iter()
                .map(|pattern| Sink {
                    pattern,
                    placed: Coverage::default(),
                    wrong_bytes: 0,
                    repeated_bytes: 0,
                })
                .collect(),
            stray_bytes: 0,
        }
    }

    /// The sink range that holds all of `[start, end)`, if one does.
    fn sink_index(&self, start: usize, end: usize) -> Option<usize> {
        let i = self.sinks.partition_point(|s| s.pattern.start <= start);
        let i = i.checked_sub(1)?;
        (end <= self.sinks[i].pattern.end).then_some(i)
    }

    /// A write of `data` at arena offset `start` (inside the arena).
    pub(super) fn write(&mut self, start: usize, data: &[u8]) {
        // An empty write places nothing (and must not leave an empty run
        // in the coverage, which would read as a gap).
        if data.is_empty() {
            return;
        }
        let end = start + data.len();
        let Some(i) = self.sink_index(start, end) else {
            self.stray_bytes += data.len() as u64;
            return;
        };
        let sink = &mut self.sinks[i];
        let p = sink.pattern;
        let offset = (start - p.start) as u64;
        sink.wrong_bytes += pattern_mismatches(p.seed, p.stream, offset, data);
        sink.repeated_bytes += sink.placed.insert(offset, offset + data.len() as u64);
    }

    /// A read of `out.len()` bytes at arena offset `start` (inside the
    /// arena).
    pub(super) fn read(&self, start: usize, out: &mut [u8]) {
        out.fill(FILL);
        let end = start + out.len();
        for p in &self.sources[overlapping(&self.sources, start, end, |p| p)] {
            let (s, e) = (p.start.max(start), p.end.min(end));
            pattern_at(
                p.seed,
                p.stream,
                (s - p.start) as u64,
                &mut out[s - start..e - start],
            );
        }
        for sink in &self.sinks[overlapping(&self.sinks, start, end, |s| &s.pattern)] {
            let p = sink.pattern;
            let lo = (start.max(p.start) - p.start) as u64;
            let hi = (end.min(p.end) - p.start) as u64;
            for (s, e) in sink.placed.within(lo, hi) {
                let at = p.start + s as usize - start;
                pattern_at(p.seed, p.stream, s, &mut out[at..at + (e - s) as usize]);
            }
        }
    }

    /// What the sink range starting at arena offset `start` of `len` bytes
    /// received; `None` if no sink range is exactly that.
    pub(super) fn placement(&self, start: usize, len: usize) -> Option<Placement> {
        let i = self.sink_index(start, start + len)?;
        let sink = &self.sinks[i];
        (sink.pattern.start == start && sink.pattern.end == start + len).then(|| Placement {
            complete: sink.placed.is_exactly(len as u64),
            wrong_bytes: sink.wrong_bytes,
            repeated_bytes: sink.repeated_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::fill_pattern;

    #[test]
    fn the_pattern_at_any_offset_is_the_filled_pattern() {
        let mut whole = vec![0u8; 1_000];
        fill_pattern(9, 4, &mut whole);
        for (offset, len) in [
            (0, 1_000),
            (3, 5),
            (7, 1),
            (8, 16),
            (13, 987),
            (999, 1),
            (5, 0),
        ] {
            let mut part = vec![0u8; len];
            pattern_at(9, 4, offset as u64, &mut part);
            assert_eq!(part[..], whole[offset..offset + len], "{offset}+{len}");
        }
        assert_eq!(pattern_mismatches(9, 4, 13, &whole[13..700]), 0);
        let mut bad = whole[100..900].to_vec();
        bad[0] ^= 1;
        bad[600] ^= 0xff;
        assert_eq!(pattern_mismatches(9, 4, 100, &bad), 2);
    }

    #[test]
    fn coverage_merges_and_counts_repeats() {
        let mut c = Coverage::default();
        assert_eq!(c.insert(10, 20), 0);
        assert_eq!(c.insert(30, 40), 0);
        assert_eq!(c.insert(20, 30), 0);
        assert_eq!(c.runs, [(10, 40)]);
        assert_eq!(c.insert(5, 15), 5);
        assert_eq!(c.insert(50, 60), 0);
        assert_eq!(c.insert(0, 100), 45);
        assert!(c.is_exactly(100) && !c.is_exactly(99));
        let mut d = Coverage::default();
        d.insert(0, 4);
        d.insert(8, 12);
        assert_eq!(d.within(2, 10).collect::<Vec<_>>(), [(2, 4), (8, 10)]);
        assert!(!d.is_exactly(12));
    }
}
