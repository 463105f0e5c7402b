//! Random numbers for the engine (tokens, path entropy, jitter). Platforms
//! seed from whatever entropy they have; tests seed with constants.

/// A source of random 64-bit words.
pub trait RandomSource {
    fn next_u64(&mut self) -> u64;

    /// Fills `out` with random bytes.
    fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// xorshift64* seeded through splitmix64: small, fast, not cryptographic.
/// Good for entropy and jitter; connection tokens on real hardware should
/// come from a hardware RNG (`RNDR`) where there is one.
#[derive(Debug, Clone)]
pub struct XorShiftRng {
    state: u64,
}

impl XorShiftRng {
    /// A generator whose sequence depends only on `seed`.
    pub const fn new(seed: u64) -> Self {
        // splitmix64 finaliser, so nearby seeds give unrelated sequences and
        // the state is never zero.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShiftRng {
            state: if z == 0 { 0x2545_F491_4F6C_DD1D } else { z },
        }
    }
}

impl RandomSource for XorShiftRng {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sequences_repeat_and_differ() {
        let mut a = XorShiftRng::new(1);
        let mut b = XorShiftRng::new(1);
        let mut c = XorShiftRng::new(2);
        let xa: [u64; 4] = core::array::from_fn(|_| a.next_u64());
        let xb: [u64; 4] = core::array::from_fn(|_| b.next_u64());
        let xc: [u64; 4] = core::array::from_fn(|_| c.next_u64());
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
        let mut bytes = [0u8; 11];
        XorShiftRng::new(0).fill_bytes(&mut bytes);
        assert!(bytes.iter().any(|&b| b != 0));
    }
}
