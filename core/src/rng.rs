//! The endpoint's random numbers: tokens, connection ids, initial PSNs,
//! memory keys, cookie secrets and path entropy (spec 5.1.2, 5.1.6).
//!
//! A ChaCha20 stream (RustCrypto's `chacha20`), seeded by the caller with
//! 32 bytes from a real entropy source: the operating system on a host,
//! virtio-rng under QEMU, the card's hardware generator on a DPU. Knowing
//! any number of outputs gives no way to the key or to later outputs
//! (unlike the SplitMix64 this replaced, whose every output revealed its
//! state). [`Rng::reseed`] folds fresh entropy in; [`ReseedPolicy`] says
//! when it is due (spec 5.1.6): every [`ReseedPolicy::interval`] or after
//! [`ReseedPolicy::max_draws`] draws, whichever comes first. The platform's
//! engine loop asks ([`Rng::reseed_due`], through the endpoint) and
//! answers with 32 bytes from its source, so a compromise of the
//! generator's state exposes at most what it draws until the next reseed.
//!
//! The core reads no entropy source itself: it is sans-IO.

use core::time::Duration;

use chacha20::ChaCha20Rng;
use rand_core::{Rng as _, SeedableRng};

use crate::time::Instant;

/// 32 bytes of seed.
pub type Seed = [u8; 32];

/// When fresh entropy is due (spec 5.1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ReseedPolicy {
    /// Longest time between two (re)seeds.
    pub interval: Duration,
    /// Most draws (tokens, PSNs, keys, ...: one per call) between two
    /// (re)seeds, so a busy endpoint reseeds sooner.
    pub max_draws: u64,
}

impl ReseedPolicy {
    /// Every 60 s or 2^16 draws (about 5,000 connections set up).
    pub const DEFAULT: ReseedPolicy = ReseedPolicy {
        interval: Duration::from_secs(60),
        max_draws: 1 << 16,
    };
}

impl Default for ReseedPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A cryptographically secure generator.
#[derive(Debug)]
pub struct Rng {
    inner: ChaCha20Rng,
    policy: ReseedPolicy,
    /// Draws since the last (re)seed.
    draws: u64,
    /// When it was last (re)seeded (the clock's origin for the seed it was
    /// built with: the core has no time before its first input).
    seeded_at: Instant,
    /// Reseeds so far.
    reseeds: u64,
}

impl Clone for Rng {
    fn clone(&self) -> Self {
        // Only tests clone endpoints' generators; cloning a CSPRNG makes
        // two streams equal, which is what such a test wants.
        let mut copy = ChaCha20Rng::from_seed(self.inner.get_seed());
        copy.set_stream(self.inner.get_stream());
        copy.set_word_pos(self.inner.get_word_pos());
        Rng {
            inner: copy,
            ..*self
        }
    }
}

/// A seed derived from a number, for simulations and tests only: the same
/// number gives the same run. Never use it for an endpoint that meets a
/// network (its secrets would be as guessable as the number).
pub fn seed_from_u64(n: u64) -> Seed {
    let mut seed = [0u8; 32];
    for (i, chunk) in seed.chunks_mut(8).enumerate() {
        // SplitMix64 spreads the number over the four words.
        let mut z = n.wrapping_add((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    seed
}

impl Rng {
    /// A generator keyed by `seed` (32 bytes from a real entropy source).
    pub fn new(seed: Seed) -> Rng {
        Rng {
            inner: ChaCha20Rng::from_seed(seed),
            policy: ReseedPolicy::DEFAULT,
            draws: 0,
            seeded_at: Instant::ZERO,
            reseeds: 0,
        }
    }

    /// Sets when fresh entropy is due.
    pub fn set_policy(&mut self, policy: ReseedPolicy) {
        self.policy = policy;
    }

    /// When fresh entropy is due.
    pub fn policy(&self) -> ReseedPolicy {
        self.policy
    }

    /// Whether fresh entropy is due at `now` under the policy.
    pub fn reseed_due(&self, now: Instant) -> bool {
        self.draws >= self.policy.max_draws
            || now.saturating_duration_since(self.seeded_at) >= self.policy.interval
    }

    /// Folds fresh entropy in at `now`: the new key is the XOR of 32 bytes
    /// of the current stream and `entropy`, so the result is unpredictable
    /// if either was; the old key is gone, so a later compromise of the
    /// state does not reveal what was drawn before.
    pub fn reseed(&mut self, now: Instant, entropy: Seed) {
        let mut key = [0u8; 32];
        self.inner.fill_bytes(&mut key);
        for (k, e) in key.iter_mut().zip(entropy) {
            *k ^= e;
        }
        self.inner = ChaCha20Rng::from_seed(key);
        self.draws = 0;
        self.seeded_at = now;
        self.reseeds += 1;
    }

    /// Reseeds so far.
    pub fn reseeds(&self) -> u64 {
        self.reseeds
    }

    /// Draws since the last (re)seed.
    pub fn draws(&self) -> u64 {
        self.draws
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.draws += 1;
        self.inner.next_u64()
    }

    /// Next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        self.draws += 1;
        self.inner.next_u32()
    }

    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        self.draws += 1;
        self.inner.fill_bytes(out);
    }

    /// Uniform in `[0, n)` (n > 0), by multiply-shift (the bias is below
    /// 2^-32 per draw, immaterial for entropy and ids).
    pub fn below(&mut self, n: u32) -> u32 {
        ((u64::from(self.next_u32()) * u64::from(n)) >> 32) as u32
    }

    /// A value that is never zero.
    pub fn nonzero_u64(&mut self) -> u64 {
        loop {
            let v = self.next_u64();
            if v != 0 {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_reseed_changes_it() {
        let mut a = Rng::new(seed_from_u64(1));
        let mut b = Rng::new(seed_from_u64(1));
        assert_eq!(a.next_u64(), b.next_u64());
        let mut c = a.clone();
        assert_eq!(a.next_u32(), c.next_u32());
        b.reseed(Instant::ZERO, [7; 32]);
        assert_ne!(a.next_u64(), b.next_u64());
        assert_ne!(seed_from_u64(1), seed_from_u64(2));
    }

    #[test]
    fn reseed_is_due_after_the_interval_or_the_draws() {
        let mut r = Rng::new(seed_from_u64(3));
        r.set_policy(ReseedPolicy {
            interval: Duration::from_secs(10),
            max_draws: 4,
        });
        let t = |s: u64| Instant::from_nanos(s * 1_000_000_000);
        assert!(!r.reseed_due(t(9)));
        assert!(r.reseed_due(t(10)), "the interval passed");
        r.reseed(t(10), [1; 32]);
        assert_eq!((r.draws(), r.reseeds()), (0, 1));
        assert!(!r.reseed_due(t(19)));
        for _ in 0..3 {
            r.next_u32();
        }
        assert!(!r.reseed_due(t(11)));
        let _ = r.below(5);
        assert!(r.reseed_due(t(11)), "four draws");
        r.reseed(t(11), [2; 32]);
        assert!(!r.reseed_due(t(20)));
        assert!(r.reseed_due(t(21)));
        // A clone keeps the schedule.
        assert!(r.clone().reseed_due(t(21)));
    }

    #[test]
    fn reseeding_with_the_same_entropy_twice_gives_different_streams() {
        // The new key depends on the old state too: an attacker who
        // controlled (or knew) the entropy alone learns nothing.
        let mut a = Rng::new(seed_from_u64(5));
        let mut b = Rng::new(seed_from_u64(6));
        a.reseed(Instant::ZERO, [9; 32]);
        b.reseed(Instant::ZERO, [9; 32]);
        assert_ne!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn chacha20_matches_the_reference_stream() {
        // RFC 8439 section 2.3.2 key with a zero nonce and counter: the
        // first keystream words of ChaCha20 (checked against Python's
        // `cryptography` ChaCha20 with the same key and a zero nonce).
        let key: Seed = core::array::from_fn(|i| i as u8);
        let mut r = Rng::new(key);
        let mut first = [0u8; 16];
        r.fill(&mut first);
        assert_eq!(
            first,
            [
                0x39, 0xfd, 0x2b, 0x7d, 0xd9, 0xc5, 0x19, 0x6a, 0x8d, 0xbd, 0x03, 0x77, 0xb8, 0xdc,
                0x4a, 0x49
            ]
        );
    }
}
