//! Entropy for the secrets of an endpoint (spec 5.1.6): each platform's
//! source behind one function type, the health check every output
//! passes, and the seeding every role does at start.
//!
//! Sources: the operating system on a host (`getrandom`), the virtio-rng
//! device under QEMU ([`crate::virtio::VirtioEntropy`]), the board's
//! hardware TRNG on a DPU (named in its `board.toml`). A platform that has
//! none must not start an endpoint: there is no fallback to a clock or a
//! counter, whose seeds an attacker can guess.
//!
//! The engine loop ([`crate::Engine::set_entropy_source`]) reseeds the
//! transport from the same source whenever the core's policy says so.

use metaroce_core::Instant;

use crate::engine::EngineStats;
use crate::transport::Transport;

/// 32 bytes of entropy: a generator's seed.
pub type Seed = [u8; 32];

/// Least time between two tries of a failing entropy source.
pub const RETRY_NANOS: u64 = 1_000_000_000;

/// Why a source gave no entropy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EntropyError {
    /// There is no source (the device or firmware interface is absent).
    Missing,
    /// The source answered with an error, or too few bytes, after retries.
    Failed,
    /// The bytes failed the health check: a stuck source.
    Stuck,
}

/// A platform's entropy source: fills `out` with 32 bytes from real
/// entropy, or says why it cannot. A plain function, so the engine can
/// hold it without a type parameter; a source with state (a device
/// driver) keeps it in a static of its platform.
pub type EntropySource = fn(&mut Seed) -> Result<(), EntropyError>;

/// Whether 32 bytes from a source may be used: not all equal (a source
/// stuck at a value, or a device that wrote nothing into a zeroed buffer).
/// A working source fails this with probability 2^-248.
pub fn healthy(bytes: &Seed) -> bool {
    // One comparison of the whole seed (the byte loop unrolls to half a
    // kilobyte at the platform's opt-level).
    *bytes != [bytes[0]; 32]
}

/// A seed from `source`, health-checked. Every role seeds its endpoint
/// (and anything else that keeps secrets) with its own call.
pub fn seed_from(source: EntropySource) -> Result<Seed, EntropyError> {
    let mut seed = [0u8; 32];
    source(&mut seed)?;
    if healthy(&seed) {
        Ok(seed)
    } else {
        Err(EntropyError::Stuck)
    }
}

/// The engine loop's entropy step (step 3 of [`crate::engine`]): fresh
/// entropy to the transport when its policy says so.
#[derive(Debug, Clone, Copy)]
pub struct EntropyStep {
    source: Option<EntropySource>,
    /// No entropy is asked for before this (after a failure).
    retry_at: Instant,
}

impl EntropyStep {
    /// No source: never reseeds.
    pub const NONE: EntropyStep = EntropyStep {
        source: None,
        retry_at: Instant::ZERO,
    };

    /// Reseeds from `source`.
    pub fn new(source: EntropySource) -> Self {
        EntropyStep {
            source: Some(source),
            ..Self::NONE
        }
    }

    /// Reseeds `transport` if it is due. A failing source is counted and
    /// tried again [`RETRY_NANOS`] later; the generator keeps its (still
    /// secret) key meanwhile.
    pub fn refresh<T: Transport>(
        &mut self,
        now: Instant,
        transport: &mut T,
        stats: &mut EngineStats,
    ) {
        let Some(source) = self.source else {
            return;
        };
        if now < self.retry_at || !transport.reseed_due(now) {
            return;
        }
        match seed_from(source) {
            Ok(fresh) => {
                transport.reseed(now, fresh);
                stats.reseeds += 1;
            }
            Err(_) => {
                stats.entropy_failures += 1;
                self.retry_at = now + core::time::Duration::from_nanos(RETRY_NANOS);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counting(out: &mut Seed) -> Result<(), EntropyError> {
        for (i, b) in out.iter_mut().enumerate() {
            *b = i as u8;
        }
        Ok(())
    }

    fn stuck(out: &mut Seed) -> Result<(), EntropyError> {
        out.fill(0xff);
        Ok(())
    }

    fn silent(_: &mut Seed) -> Result<(), EntropyError> {
        Ok(())
    }

    fn absent(_: &mut Seed) -> Result<(), EntropyError> {
        Err(EntropyError::Missing)
    }

    #[test]
    fn seeds_pass_the_health_check_or_are_refused() {
        assert_eq!(seed_from(counting).unwrap()[31], 31);
        assert_eq!(seed_from(stuck), Err(EntropyError::Stuck));
        assert_eq!(seed_from(silent), Err(EntropyError::Stuck));
        assert_eq!(seed_from(absent), Err(EntropyError::Missing));
    }
}
