//! A small deterministic generator for tokens, connection ids, initial PSNs
//! and path entropy. The core reads no entropy source: the caller seeds it
//! (from a hardware RNG on a NIC, from the OS on a host, from the test's
//! seed in simulations).

/// SplitMix64: tiny state, full period, good enough spread for ids and
/// entropy. Tokens are only as unpredictable as the caller's seed.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded by the caller.
    pub const fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// Mixes more caller-provided entropy into the state.
    pub fn reseed(&mut self, entropy: u64) {
        self.state ^= entropy.rotate_left(17);
        let _ = self.next_u64();
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[0, n)` (n > 0), by multiply-shift.
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
