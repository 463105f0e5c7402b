//! The receiver's replay window over IVs (spec 5.3.5), an IPsec-style
//! sliding bitmap (RFC 4303 3.4.3) kept as a ring of words as RFC 6479
//! describes: advancing the window clears whole words instead of
//! shifting the map, so a packet costs O(1) however far the window moves.

/// Words of the bitmap.
const WORDS: usize = 16;
/// Bits of the bitmap.
const BITS: u64 = (WORDS * 64) as u64;
/// IVs the window accepts below the highest one seen: one word less than
/// the map, the word the highest IV sits in being partly ahead of it.
pub const WINDOW: u64 = BITS - 64;

/// Why an IV is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Replay {
    /// Seen before.
    Duplicate,
    /// Older than the window: it may or may not have been seen.
    TooOld,
}

/// Which IVs of a direction were received, up to [`WINDOW`] below the
/// highest. IV 0 is never sent, so it doubles as "nothing yet".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayWindow {
    top: u64,
    map: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::NEW
    }
}

impl ReplayWindow {
    /// Nothing received.
    pub const NEW: ReplayWindow = ReplayWindow {
        top: 0,
        map: [0; WORDS],
    };

    fn slot(iv: u64) -> (usize, u64) {
        let bit = iv % BITS;
        ((bit / 64) as usize, 1u64 << (bit % 64))
    }

    /// Whether `iv` may be new. Checked before authentication; only
    /// [`ReplayWindow::accept`], after it, changes the window, so a forged
    /// packet never moves it.
    pub fn check(&self, iv: u64) -> Result<(), Replay> {
        if iv == 0 || iv.saturating_add(WINDOW) <= self.top {
            return Err(Replay::TooOld);
        }
        if iv > self.top {
            return Ok(());
        }
        let (word, mask) = Self::slot(iv);
        if self.map[word] & mask != 0 {
            Err(Replay::Duplicate)
        } else {
            Ok(())
        }
    }

    /// Records `iv`, which passed [`ReplayWindow::check`] and authenticated.
    pub fn accept(&mut self, iv: u64) {
        if iv > self.top {
            // Clear the words the window slides over, at most all of them.
            let from = self.top / 64;
            let to = iv / 64;
            let steps = (to - from).min(WORDS as u64);
            for k in 1..=steps {
                self.map[((from + k) % WORDS as u64) as usize] = 0;
            }
            self.top = iv;
        }
        let (word, mask) = Self::slot(iv);
        self.map[word] |= mask;
    }

    /// The highest IV accepted (0: none).
    pub fn highest(&self) -> u64 {
        self.top
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn duplicates_and_old_ivs_are_refused_new_ones_taken() {
        let mut w = ReplayWindow::NEW;
        assert_eq!(w.check(0), Err(Replay::TooOld), "IV 0 is never sent");
        for iv in [5u64, 3, 9, 4] {
            assert_eq!(w.check(iv), Ok(()));
            w.accept(iv);
        }
        assert_eq!(w.check(3), Err(Replay::Duplicate));
        assert_eq!(w.check(9), Err(Replay::Duplicate));
        assert_eq!(w.check(6), Ok(()), "a gap is still open");
        w.accept(10_000);
        assert_eq!(w.check(6), Err(Replay::TooOld));
        assert_eq!(w.check(10_000 - WINDOW), Err(Replay::TooOld));
        assert_eq!(w.check(10_000 - WINDOW + 1), Ok(()));
        assert_eq!(w.check(10_000), Err(Replay::Duplicate));
    }

    #[test]
    fn matches_a_set_oracle_under_random_reordering() {
        // Differential test against a set of every IV accepted.
        let mut w = ReplayWindow::NEW;
        let mut seen = BTreeSet::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = 1u64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly fresh IVs, some reordered, some replays, a few jumps.
            let iv = match x % 10 {
                0..=4 => {
                    next += 1 + (x >> 40) % 3;
                    next
                }
                5..=7 => next.saturating_sub((x >> 20) % 1200).max(1),
                8 => next.saturating_sub((x >> 20) % 40).max(1),
                _ => {
                    next += (x >> 30) % 3000;
                    next
                }
            };
            let top = w.highest();
            let expected = if iv + WINDOW <= top {
                Err(Replay::TooOld)
            } else if seen.contains(&iv) {
                Err(Replay::Duplicate)
            } else {
                Ok(())
            };
            assert_eq!(w.check(iv), expected, "iv {iv} top {top}");
            if expected.is_ok() {
                w.accept(iv);
                seen.insert(iv);
            }
        }
    }
}
