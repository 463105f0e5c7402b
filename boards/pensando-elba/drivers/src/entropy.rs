//! The board's entropy source for the endpoints' secrets (spec 5.1.6),
//! named in `board.toml` (`[entropy] source`).
//!
//! Elba's Cortex-A72 cores have no `RNDR` (FEAT_RNG is Armv8.5) and the
//! public device trees describe no TRNG block, so the assumed source is
//! the SoC's hardware TRNG as the secure firmware (EL3) exposes it through
//! the **Arm TRNG Firmware Interface** (DEN0098), an SMCCC service:
//! `TRNG_VERSION` says it is there, `TRNG_FEATURES` that `TRNG_RND64` is,
//! and each `TRNG_RND64` call returns up to 192 bits of conditioned
//! entropy in x1..x3 (or `NO_ENTROPY` while the pool refills). Linux uses
//! the same interface (`arm_smccc_trng`) on parts without `RNDR`.
//!
//! The calls go through a [`Conduit`] (the firmware's is `smc`), so the
//! seeding path runs on the host against a fake secure firmware.

use metaroce_platform::entropy::{healthy, EntropyError, Seed};

/// The entropy sources `board.toml` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The Arm TRNG Firmware Interface (DEN0098) over SMC.
    SmcccTrng,
    /// A virtio-rng device: the twin's substitution under QEMU (whose
    /// PSCI has no TRNG service), never the card's.
    VirtioRng,
}

/// `TRNG_VERSION` (SMC32).
pub const TRNG_VERSION: u32 = 0x8400_0050;
/// `TRNG_FEATURES` (SMC32): x1 is the function asked about.
pub const TRNG_FEATURES: u32 = 0x8400_0051;
/// `TRNG_RND64` (SMC64): x1 is the number of bits wanted (1 to 192).
pub const TRNG_RND64: u32 = 0xC400_0053;
/// Status `SUCCESS`.
const SUCCESS: i64 = 0;
/// Status `NO_ENTROPY`: the pool is refilling, ask again.
const NO_ENTROPY: i64 = -3;
/// Bits asked per `TRNG_RND64` call: two calls fill a seed.
const BITS_PER_CALL: u64 = 128;
/// `NO_ENTROPY` answers tolerated per call before giving up (the secure
/// firmware must not stall a core for ever).
const RETRIES: usize = 32;

/// A way to make SMCCC fast calls into the secure firmware.
pub trait Conduit {
    /// Calls `function` with x1..x3 = `args`; returns x0..x3.
    fn call(&mut self, function: u32, args: [u64; 3]) -> [u64; 4];
}

/// Checks that the secure firmware implements the TRNG interface (version
/// 1.x) with `TRNG_RND64`; returns the version as (major, minor).
pub fn probe(conduit: &mut impl Conduit) -> Result<(u16, u16), EntropyError> {
    let version = conduit.call(TRNG_VERSION, [0; 3])[0] as i32;
    // Negative: NOT_SUPPORTED (or an unknown function, the same answer
    // under SMCCC). Major version 1 is the only one defined.
    if version < 0 || version >> 16 != 1 {
        return Err(EntropyError::Missing);
    }
    if conduit.call(TRNG_FEATURES, [u64::from(TRNG_RND64), 0, 0])[0] as i32 as i64 != SUCCESS {
        return Err(EntropyError::Missing);
    }
    Ok(((version >> 16) as u16, version as u16))
}

/// Fills `out` with 256 bits: two `TRNG_RND64` calls of 128 bits, each
/// retried while the secure firmware answers `NO_ENTROPY`.
pub fn fill(conduit: &mut impl Conduit, out: &mut Seed) -> Result<(), EntropyError> {
    for half in out.chunks_mut(16) {
        let mut tries = 0;
        let bits = loop {
            let r = conduit.call(TRNG_RND64, [BITS_PER_CALL, 0, 0]);
            match r[0] as i64 {
                SUCCESS => break [r[3], r[2]],
                NO_ENTROPY if tries < RETRIES => tries += 1,
                _ => return Err(EntropyError::Failed),
            }
        };
        // The low 128 bits: x3 holds bits 63..0, x2 bits 127..64.
        half[..8].copy_from_slice(&bits[0].to_le_bytes());
        half[8..].copy_from_slice(&bits[1].to_le_bytes());
    }
    Ok(())
}

/// The seed of a core's endpoint: the interface probed, 256 bits read,
/// and the health check passed. There is no fallback: without entropy a
/// core does not start an endpoint.
pub fn seed(source: Source, conduit: &mut impl Conduit) -> Result<Seed, EntropyError> {
    match source {
        Source::SmcccTrng => {
            probe(conduit)?;
            let mut seed = [0u8; 32];
            fill(conduit, &mut seed)?;
            if healthy(&seed) {
                Ok(seed)
            } else {
                Err(EntropyError::Stuck)
            }
        }
        // Read by the firmware's twin driver, not through a conduit.
        Source::VirtioRng => Err(EntropyError::Missing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// A fake secure firmware: answers the TRNG calls as scripted and
    /// records them.
    #[derive(Default)]
    struct FakeFirmware {
        version: i64,
        rnd64_supported: bool,
        /// `NO_ENTROPY` answers before each success.
        busy_answers: usize,
        /// Answer every `TRNG_RND64` with this status instead.
        fail_with: Option<i64>,
        /// Bits returned: x1..x3 of the next success, counting up.
        next: u64,
        /// Constant output (a stuck source).
        stuck: bool,
        calls: Vec<(u32, u64)>,
        busy_left: usize,
    }

    impl FakeFirmware {
        fn working() -> Self {
            FakeFirmware {
                version: 1 << 16,
                rnd64_supported: true,
                next: 0x0101_0101_0101_0101,
                ..Self::default()
            }
        }
    }

    impl Conduit for FakeFirmware {
        fn call(&mut self, function: u32, args: [u64; 3]) -> [u64; 4] {
            self.calls.push((function, args[0]));
            let status = |s: i64| s as u64;
            match function {
                TRNG_VERSION => [self.version as u64, 0, 0, 0],
                TRNG_FEATURES if args[0] == u64::from(TRNG_RND64) && self.rnd64_supported => {
                    [0, 0, 0, 0]
                }
                TRNG_FEATURES => [status(-1), 0, 0, 0],
                TRNG_RND64 => {
                    if let Some(s) = self.fail_with {
                        return [status(s), 0, 0, 0];
                    }
                    if self.busy_left > 0 {
                        self.busy_left -= 1;
                        return [status(NO_ENTROPY), 0, 0, 0];
                    }
                    self.busy_left = self.busy_answers;
                    assert_eq!(args[0], BITS_PER_CALL);
                    let (lo, hi) = (self.next, self.next.wrapping_add(1));
                    if !self.stuck {
                        self.next = self.next.wrapping_add(2);
                    }
                    // Asked for 128 bits: x1 is zero, x2 and x3 carry them.
                    [0, 0, if self.stuck { lo } else { hi }, lo]
                }
                _ => [status(-1), 0, 0, 0],
            }
        }
    }

    #[test]
    fn a_working_trng_seeds_from_two_rnd64_calls() {
        let mut fw = FakeFirmware::working();
        let seed = seed(Source::SmcccTrng, &mut fw).unwrap();
        let word = |i: usize| u64::from_le_bytes(seed[i * 8..i * 8 + 8].try_into().unwrap());
        let first = 0x0101_0101_0101_0101u64;
        assert_eq!(
            [word(0), word(1), word(2), word(3)],
            [first, first + 1, first + 2, first + 3]
        );
        assert_eq!(
            fw.calls,
            [
                (TRNG_VERSION, 0),
                (TRNG_FEATURES, u64::from(TRNG_RND64)),
                (TRNG_RND64, 128),
                (TRNG_RND64, 128)
            ]
        );
    }

    #[test]
    fn no_trng_interface_means_no_seed() {
        // SMCCC's answer to an unknown function: NOT_SUPPORTED (-1).
        let mut fw = FakeFirmware {
            version: -1,
            ..FakeFirmware::working()
        };
        assert_eq!(seed(Source::SmcccTrng, &mut fw), Err(EntropyError::Missing));
        // A version 2 interface is not the one this code speaks.
        let mut fw = FakeFirmware {
            version: 2 << 16,
            ..FakeFirmware::working()
        };
        assert_eq!(probe(&mut fw), Err(EntropyError::Missing));
        // Version 1.0 without TRNG_RND64.
        let mut fw = FakeFirmware {
            rnd64_supported: false,
            ..FakeFirmware::working()
        };
        assert_eq!(seed(Source::SmcccTrng, &mut fw), Err(EntropyError::Missing));
        assert_eq!(probe(&mut FakeFirmware::working()), Ok((1, 0)));
    }

    #[test]
    fn a_refilling_pool_is_waited_for_a_bounded_number_of_times() {
        let mut fw = FakeFirmware {
            busy_answers: RETRIES,
            busy_left: RETRIES,
            ..FakeFirmware::working()
        };
        assert!(seed(Source::SmcccTrng, &mut fw).is_ok());
        let rnd_calls = fw.calls.iter().filter(|c| c.0 == TRNG_RND64).count();
        assert_eq!(rnd_calls, 2 * (RETRIES + 1));
        let mut fw = FakeFirmware {
            busy_answers: RETRIES + 1,
            busy_left: RETRIES + 1,
            ..FakeFirmware::working()
        };
        assert_eq!(seed(Source::SmcccTrng, &mut fw), Err(EntropyError::Failed));
    }

    #[test]
    fn errors_and_stuck_output_are_refused() {
        for status in [-1, -2] {
            let mut fw = FakeFirmware {
                fail_with: Some(status),
                ..FakeFirmware::working()
            };
            assert_eq!(seed(Source::SmcccTrng, &mut fw), Err(EntropyError::Failed));
        }
        let mut fw = FakeFirmware {
            stuck: true,
            next: 0,
            ..FakeFirmware::working()
        };
        assert_eq!(seed(Source::SmcccTrng, &mut fw), Err(EntropyError::Stuck));
    }

    #[test]
    fn the_reseed_path_reads_without_probing_again() {
        let mut fw = FakeFirmware::working();
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        fill(&mut fw, &mut a).unwrap();
        fill(&mut fw, &mut b).unwrap();
        assert_ne!(a, b);
        assert!(fw.calls.iter().all(|c| c.0 == TRNG_RND64));
    }

    #[test]
    fn the_board_file_names_this_source() {
        assert_eq!(crate::board::ENTROPY_SOURCE, Source::SmcccTrng);
    }
}
