//! The simulator's random numbers: SplitMix64, seeded, one independent
//! stream per consumer (each link direction, each host), so that adding a
//! flow on one link does not shift the draws on another.

/// SplitMix64's increment (2^64 divided by the golden ratio, odd).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// A small seeded generator (SplitMix64). Not for cryptography.
#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng {
            state: seed ^ 0x6a09_e667_f3bc_c908,
        }
    }

    /// An independent stream derived from `seed` and a stream number.
    pub fn stream(seed: u64, stream: u64) -> Self {
        SimRng::new(mix(seed ^ mix(stream.wrapping_add(0x9e37_79b9_7f4a_7c15))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// What the `i`-th call of [`SimRng::next_u64`] (counted from 0) will
    /// return, without drawing: SplitMix64's state is a counter, so any
    /// draw of a stream can be computed directly (the data patterns are
    /// read and checked at any offset this way).
    pub fn nth_u64(&self, i: u64) -> u64 {
        mix(self
            .state
            .wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
    }

    /// Skips `n` draws: the next [`SimRng::next_u64`] returns what the
    /// `n`-th one from here would have (one addition, whatever `n`).
    pub fn skip(&mut self, n: u64) {
        self.state = self.state.wrapping_add(n.wrapping_mul(GOLDEN_GAMMA));
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (no draw when `p` is 0 or 1, so a loss-free
    /// link consumes no randomness).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.unit() < p
        }
    }
}

/// The SplitMix64 finaliser: a strong 64-bit mixing function.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| SimRng::stream(7, 1).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            SimRng::stream(7, 1).next_u64(),
            SimRng::stream(7, 2).next_u64()
        );
        let mut skipped = SimRng::stream(7, 1);
        skipped.skip(2);
        let mut drawn = SimRng::stream(7, 1);
        let third = [drawn.next_u64(), drawn.next_u64(), drawn.next_u64()][2];
        assert_eq!(skipped.next_u64(), third);
        assert_eq!(SimRng::stream(7, 1).nth_u64(2), third);
        let mut r = SimRng::new(3);
        let hits = (0..10_000).filter(|_| r.chance(0.25)).count();
        assert!((2_300..2_700).contains(&hits), "{hits}");
    }
}
