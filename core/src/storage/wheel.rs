//! A hierarchical timing wheel over connection indices: one deadline per
//! connection, O(1) to set, move or cancel, O(1) amortised to expire, and
//! the next deadline found from six 64-bit occupancy words (the idea of
//! s2n-quic-dc's and tokio's wheels; the code is ours).
//!
//! Time is cut into ticks of `2^TICK_SHIFT` ns (1.024 us). Level `l` has 64
//! buckets of `64^l` ticks each; an entry sits at the level of the highest
//! 6-bit group in which its tick differs from the wheel's current tick, so
//! every entry of a lower level is due before any entry of a higher one.
//! Reaching a higher-level bucket re-files its entries one level down
//! (cascading). Each entry keeps its exact deadline in nanoseconds: the
//! level-0 bucket due next is scanned for its earliest entry, so
//! `next_deadline` is exact whenever it is within 64 ticks, and a lower
//! bound (the bucket's start) beyond that.

use super::list::{Links, List};

/// Nanoseconds per tick, as a power of two.
pub const TICK_SHIFT: u32 = 10;
const LEVEL_BITS: u32 = 6;
const SLOTS: usize = 1 << LEVEL_BITS;
/// Levels: 64^6 ticks of 1.024 us cover about 19.5 hours; later deadlines
/// wait in the last level and are re-filed when it comes round.
pub const LEVELS: usize = 6;
const NO_BUCKET: u16 = u16::MAX;

/// The per-element part of the wheel: where the element is filed and when
/// it is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerEntry {
    links: Links,
    deadline_ns: u64,
    bucket: u16,
}

impl TimerEntry {
    pub const IDLE: TimerEntry = TimerEntry {
        links: Links::UNLINKED,
        deadline_ns: u64::MAX,
        bucket: NO_BUCKET,
    };

    /// The deadline the element is filed under, if any.
    pub const fn deadline_ns(&self) -> Option<u64> {
        if self.bucket == NO_BUCKET {
            None
        } else {
            Some(self.deadline_ns)
        }
    }
}

impl Default for TimerEntry {
    fn default() -> Self {
        Self::IDLE
    }
}

/// The wheel. Its size is fixed (about 4.6 KiB) whatever the number of
/// elements: the entries live in the elements.
#[derive(Debug, Clone)]
pub struct TimerWheel {
    /// Current tick: every filed deadline is at or after it.
    elapsed: u64,
    buckets: [List; LEVELS * SLOTS],
    occupied: [u64; LEVELS],
    len: u32,
}

impl Default for TimerWheel {
    fn default() -> Self {
        Self::new()
    }
}

/// The bucket due next: its level, slot and first tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Due {
    level: usize,
    slot: usize,
    start_tick: u64,
}

impl TimerWheel {
    pub const fn new() -> TimerWheel {
        TimerWheel {
            elapsed: 0,
            buckets: [List::EMPTY; LEVELS * SLOTS],
            occupied: [0; LEVELS],
            len: 0,
        }
    }

    /// Elements filed.
    pub const fn len(&self) -> u32 {
        self.len
    }

    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn level_of(elapsed: u64, tick: u64) -> usize {
        let significant = 63 - ((elapsed ^ tick) | (SLOTS as u64 - 1)).leading_zeros();
        (significant / LEVEL_BITS) as usize
    }

    /// Files element `i` (removing it from wherever it was) due at
    /// `deadline_ns`.
    pub fn schedule<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        deadline_ns: u64,
        entry: impl Fn(&mut T) -> &mut TimerEntry + Copy,
    ) {
        let e = entry(&mut items[i as usize]);
        if e.bucket != NO_BUCKET && e.deadline_ns == deadline_ns {
            return;
        }
        let bucket = self.bucket_of(deadline_ns);
        if e.bucket != NO_BUCKET {
            // A deadline that moves within its bucket, where the element
            // is already last (a paced sender's, one packet time later),
            // changes only the deadline: removing and appending it again
            // would leave it in the same place.
            if usize::from(e.bucket) == bucket && self.buckets[bucket].back() == Some(i) {
                e.deadline_ns = deadline_ns;
                return;
            }
            self.cancel(items, i, entry);
        }
        self.file_in(items, i, deadline_ns, bucket, entry);
    }

    /// The bucket a deadline is filed in now.
    #[inline]
    fn bucket_of(&self, deadline_ns: u64) -> usize {
        let last = self.elapsed + (1u64 << (LEVEL_BITS * LEVELS as u32)) - 1;
        // `max` then `min`, as `clamp` (`last` is never below `elapsed`)
        // without its panic path, whose message links `core::fmt` into
        // the firmware.
        let tick = (deadline_ns >> TICK_SHIFT).max(self.elapsed).min(last);
        let level = Self::level_of(self.elapsed, tick).min(LEVELS - 1);
        let slot = ((tick >> (level as u32 * LEVEL_BITS)) as usize) & (SLOTS - 1);
        level * SLOTS + slot
    }

    fn file<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        deadline_ns: u64,
        entry: impl Fn(&mut T) -> &mut TimerEntry + Copy,
    ) {
        let bucket = self.bucket_of(deadline_ns);
        self.file_in(items, i, deadline_ns, bucket, entry);
    }

    /// [`Self::file`] into `bucket`, [`Self::bucket_of`] the deadline.
    fn file_in<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        deadline_ns: u64,
        bucket: usize,
        entry: impl Fn(&mut T) -> &mut TimerEntry + Copy,
    ) {
        let level = bucket / SLOTS;
        let slot = bucket % SLOTS;
        self.buckets[bucket].push_back(items, i, |t| &mut entry(t).links);
        let e = entry(&mut items[i as usize]);
        e.deadline_ns = deadline_ns;
        e.bucket = bucket as u16;
        self.occupied[level] |= 1 << slot;
        self.len += 1;
    }

    /// Removes element `i` from the wheel (no-op if it is not filed).
    pub fn cancel<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        entry: impl Fn(&mut T) -> &mut TimerEntry + Copy,
    ) {
        let bucket = entry(&mut items[i as usize]).bucket;
        if bucket == NO_BUCKET {
            return;
        }
        let b = usize::from(bucket);
        self.buckets[b].remove(items, i, |t| &mut entry(t).links);
        if self.buckets[b].is_empty() {
            self.occupied[b / SLOTS] &= !(1 << (b % SLOTS));
        }
        let e = entry(&mut items[i as usize]);
        e.bucket = NO_BUCKET;
        e.deadline_ns = u64::MAX;
        self.len -= 1;
    }

    fn next_due(&self) -> Option<Due> {
        for level in 0..LEVELS {
            let occupied = self.occupied[level];
            if occupied == 0 {
                continue;
            }
            let shift = level as u32 * LEVEL_BITS;
            let now_slot = ((self.elapsed >> shift) as usize) & (SLOTS - 1);
            let distance = occupied.rotate_right(now_slot as u32).trailing_zeros() as usize;
            let slot = (now_slot + distance) & (SLOTS - 1);
            let level_span = 1u64 << (shift + LEVEL_BITS);
            let window = self.elapsed & !(level_span - 1);
            let mut start_tick = window + ((slot as u64) << shift);
            if slot < now_slot {
                start_tick += level_span;
            }
            return Some(Due {
                level,
                slot,
                start_tick: start_tick.max(self.elapsed),
            });
        }
        None
    }

    /// The earliest deadline, exact when it is within 64 ticks of the
    /// wheel's current tick, otherwise a lower bound; `None` when empty.
    pub fn next_deadline<T>(
        &self,
        items: &[T],
        entry: impl Fn(&T) -> &TimerEntry + Copy,
    ) -> Option<u64> {
        let due = self.next_due()?;
        if due.level > 0 {
            return Some(due.start_tick << TICK_SHIFT);
        }
        let list = &self.buckets[due.slot];
        let mut cursor = list.front();
        let mut earliest = u64::MAX;
        while let Some(i) = cursor {
            earliest = earliest.min(entry(&items[i as usize]).deadline_ns);
            cursor = list.next_of(items, i, |t| &entry(t).links);
        }
        Some(earliest)
    }

    /// Removes and returns one element whose deadline is at or before
    /// `now_ns`, or `None` when none is left. Call until `None`.
    pub fn pop_expired<T>(
        &mut self,
        items: &mut [T],
        now_ns: u64,
        entry: impl Fn(&mut T) -> &mut TimerEntry + Copy,
    ) -> Option<u32> {
        let now_tick = now_ns >> TICK_SHIFT;
        loop {
            let Some(due) = self.next_due() else {
                self.elapsed = self.elapsed.max(now_tick);
                return None;
            };
            if due.start_tick > now_tick {
                // Nothing is due before `now`: move the wheel up to it, so
                // later deadlines are filed relative to the present.
                self.elapsed = self.elapsed.max(now_tick);
                return None;
            }
            self.elapsed = self.elapsed.max(due.start_tick);
            let b = due.level * SLOTS + due.slot;
            if due.level == 0 {
                // Every entry of a bucket before the current tick is due;
                // in the current tick's bucket, only those at or before now.
                let mut cursor = self.buckets[b].front();
                while let Some(i) = cursor {
                    let e = entry(&mut items[i as usize]);
                    if e.deadline_ns <= now_ns {
                        self.cancel(items, i, entry);
                        return Some(i);
                    }
                    cursor = Some(e.links.next).filter(|&n| n < super::list::END);
                }
                // Only later entries of the current tick remain.
                debug_assert_eq!(due.start_tick, now_tick);
                return None;
            }
            // Cascade: re-file the bucket's entries relative to its start.
            while let Some(i) = self.buckets[b].front() {
                let deadline = entry(&mut items[i as usize]).deadline_ns;
                self.cancel(items, i, entry);
                self.file(items, i, deadline, entry);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::vec::Vec;

    fn entry(t: &mut TimerEntry) -> &mut TimerEntry {
        t
    }

    fn entry_ref(t: &TimerEntry) -> &TimerEntry {
        t
    }

    /// A deterministic generator for the test.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 16
        }
    }

    #[test]
    fn matches_an_ordered_set_under_random_operations() {
        let n = 300u32;
        let mut items = std::vec![TimerEntry::IDLE; n as usize];
        let mut wheel = TimerWheel::new();
        let mut oracle: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut rng = Lcg(7);
        let mut now = 5_000u64;
        for round in 0..20_000 {
            let i = (rng.next() % u64::from(n)) as u32;
            match rng.next() % 10 {
                0..=5 => {
                    // Deadlines from "now" up to about 40 s ahead, most near.
                    let span = match rng.next() % 4 {
                        0 => 2_000,
                        1 => 200_000,
                        2 => 50_000_000,
                        _ => 40_000_000_000,
                    };
                    let d = now + rng.next() % span;
                    if let Some(old) = items[i as usize].deadline_ns() {
                        oracle.remove(&(old, i));
                    }
                    wheel.schedule(&mut items, i, d, entry);
                    oracle.insert((d, i));
                }
                6 => {
                    if let Some(old) = items[i as usize].deadline_ns() {
                        oracle.remove(&(old, i));
                    }
                    wheel.cancel(&mut items, i, entry);
                }
                _ => {
                    // The deadline reported is never later than the truth,
                    // and exact when near.
                    let truth = oracle.iter().next().map(|&(d, _)| d);
                    let got = wheel.next_deadline(&items, entry_ref);
                    match (truth, got) {
                        (None, None) => {}
                        (Some(t), Some(g)) => {
                            assert!(g <= t, "round {round}: reported {g} after the truth {t}");
                            if (t >> TICK_SHIFT) >> LEVEL_BITS == wheel.elapsed >> LEVEL_BITS {
                                assert_eq!(g, t, "round {round}: not exact within level 0");
                            }
                        }
                        other => panic!("round {round}: {other:?}"),
                    }
                    now += rng.next() % 3_000_000;
                    let mut fired = Vec::new();
                    while let Some(i) = wheel.pop_expired(&mut items, now, entry) {
                        fired.push(i);
                    }
                    let mut expected = Vec::new();
                    while let Some(&(d, i)) = oracle.iter().next() {
                        if d > now {
                            break;
                        }
                        oracle.remove(&(d, i));
                        expected.push(i);
                    }
                    fired.sort_unstable();
                    expected.sort_unstable();
                    assert_eq!(fired, expected, "round {round} at {now}");
                }
            }
            assert_eq!(wheel.len() as usize, oracle.len());
        }
    }

    #[test]
    fn near_deadlines_are_exact() {
        let mut items = std::vec![TimerEntry::IDLE; 3];
        let mut wheel = TimerWheel::new();
        wheel.schedule(&mut items, 0, 10_500, entry);
        wheel.schedule(&mut items, 1, 10_100, entry);
        wheel.schedule(&mut items, 2, 900_000, entry);
        assert_eq!(wheel.next_deadline(&items, entry_ref), Some(10_100));
        assert_eq!(wheel.pop_expired(&mut items, 10_099, entry), None);
        assert_eq!(wheel.pop_expired(&mut items, 10_100, entry), Some(1));
        assert_eq!(wheel.pop_expired(&mut items, 10_100, entry), None);
        assert_eq!(wheel.next_deadline(&items, entry_ref), Some(10_500));
        wheel.schedule(&mut items, 0, 20_000, entry);
        assert_eq!(wheel.pop_expired(&mut items, 19_999, entry), None);
        assert_eq!(wheel.next_deadline(&items, entry_ref), Some(20_000));
        assert_eq!(wheel.pop_expired(&mut items, 1_000_000, entry), Some(0));
        assert_eq!(wheel.pop_expired(&mut items, 1_000_000, entry), Some(2));
        assert!(wheel.is_empty());
    }
}
