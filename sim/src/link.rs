//! Links: rate, propagation delay, loss (independent or bursty) and
//! failure. A link is full duplex; each direction keeps its own loss state
//! and random stream.

use std::time::Duration;

use metaroce_core::Instant;

use crate::rng::SimRng;

/// Picoseconds to put `bytes` on a line of `rate_bps` bits per second.
/// Time inside a port is kept in picoseconds so that back-to-back packets
/// do not accumulate rounding: 4096 bytes at 100 Gbit/s is 327.68 ns.
pub fn serialization_ps(bytes: u64, rate_bps: u64) -> u64 {
    // In 64 bits while the product fits (up to 2.3 MB): the same value
    // without a 128-bit division, once per packet and hop.
    if let Some(bits) = bytes.checked_mul(8 * 1_000_000_000_000) {
        return bits.div_ceil(rate_bps.max(1));
    }
    let bits = u128::from(bytes) * 8 * 1_000_000_000_000;
    let rate = u128::from(rate_bps.max(1));
    u64::try_from(bits.div_ceil(rate)).unwrap_or(u64::MAX)
}

/// The first whole nanosecond at or after `ps` picoseconds.
pub fn ps_to_instant(ps: u64) -> Instant {
    Instant::from_nanos(ps.div_ceil(1_000))
}

/// How a link direction loses packets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossModel {
    /// Never.
    None,
    /// Each packet independently with this probability.
    Random(f64),
    /// Gilbert-Elliott: a two-state Markov chain evaluated per packet. In
    /// the good state packets are lost with `loss_good`, in the bad state
    /// with `loss_bad`; before each packet the state flips good to bad with
    /// `p_good_to_bad` and bad to good with `p_bad_to_good`.
    GilbertElliott {
        p_good_to_bad: f64,
        p_bad_to_good: f64,
        loss_good: f64,
        loss_bad: f64,
    },
}

impl LossModel {
    /// A Gilbert-Elliott channel with the given long-run loss rate and mean
    /// burst length (packets per stay in the bad state), losing every packet
    /// in the bad state and none in the good one.
    pub fn bursty(mean_loss: f64, mean_burst: f64) -> LossModel {
        let p_bad_to_good = 1.0 / mean_burst.max(1.0);
        // Stationary P(bad) = p_gb / (p_gb + p_bg) = mean_loss.
        let loss = mean_loss.clamp(0.0, 0.999);
        let p_good_to_bad = p_bad_to_good * loss / (1.0 - loss);
        LossModel::GilbertElliott {
            p_good_to_bad,
            p_bad_to_good,
            loss_good: 0.0,
            loss_bad: 1.0,
        }
    }

    /// Long-run fraction of packets lost.
    pub fn mean_loss(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Random(p) => p,
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_good,
                loss_bad,
            } => {
                let total = p_good_to_bad + p_bad_to_good;
                if total <= 0.0 {
                    return loss_good;
                }
                let bad = p_good_to_bad / total;
                bad * loss_bad + (1.0 - bad) * loss_good
            }
        }
    }
}

/// One link's parameters (both directions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    pub rate_bps: u64,
    /// Propagation delay (plus switch latency, folded in).
    pub delay: Duration,
    /// Loss from `a` to `b` (and from `b` to `a` unless `reverse_loss`).
    pub loss: LossModel,
    /// Loss from `b` to `a`, when it differs (e.g. only data or only
    /// acknowledgments lost on a two-host link).
    pub reverse_loss: Option<LossModel>,
    /// The link goes down (both directions) at this instant: packets on it
    /// and packets sent later are lost.
    pub fail_at: Option<Instant>,
}

impl Default for LinkConfig {
    /// 100 Gbit/s, 1 us, lossless, never fails.
    fn default() -> Self {
        LinkConfig {
            rate_bps: 100_000_000_000,
            delay: Duration::from_micros(1),
            loss: LossModel::None,
            reverse_loss: None,
            fail_at: None,
        }
    }
}

/// The per-direction loss state.
#[derive(Debug, Clone)]
pub struct LossState {
    model: LossModel,
    bad: bool,
    rng: SimRng,
}

impl LossState {
    /// Starts in the good state.
    pub fn new(model: LossModel, rng: SimRng) -> Self {
        LossState {
            model,
            bad: false,
            rng,
        }
    }

    /// Whether the next packet is lost.
    pub fn lose(&mut self) -> bool {
        match self.model {
            LossModel::None => false,
            LossModel::Random(p) => self.rng.chance(p),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_good,
                loss_bad,
            } => {
                let flip = if self.bad {
                    p_bad_to_good
                } else {
                    p_good_to_bad
                };
                if self.rng.chance(flip) {
                    self.bad = !self.bad;
                }
                self.rng.chance(if self.bad { loss_bad } else { loss_good })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_at_line_rate() {
        // 4 KiB at 100 Gbit/s: 4096 * 8 / 1e11 s = 327.68 ns.
        assert_eq!(serialization_ps(4096, 100_000_000_000), 327_680);
        // One full MetaRoCE-size frame on the line, IPv4 overhead included.
        let line = crate::packet::FrameOverhead::IPV4.line_len(4096);
        assert_eq!(line, 4096 + 46 + 20);
        assert_eq!(serialization_ps(line, 100_000_000_000), 332_960);
        assert_eq!(serialization_ps(1, 3), 2_666_666_666_667);
        // Both sides of the 64-bit path agree with 128-bit arithmetic.
        for (bytes, rate) in [
            (2_305_843, 7),
            (2_305_844, 7),
            (u64::MAX / 8_000_000_000_000, 400_000_000_000),
            (u64::MAX / 8_000_000_000_000 + 1, 400_000_000_000),
            (u64::MAX, 1),
        ] {
            let bits = u128::from(bytes) * 8_000_000_000_000;
            let want = u64::try_from(bits.div_ceil(u128::from(rate))).unwrap_or(u64::MAX);
            assert_eq!(serialization_ps(bytes, rate), want, "{bytes} at {rate}");
        }
        assert_eq!(ps_to_instant(327_680), Instant::from_nanos(328));
        assert_eq!(ps_to_instant(328_000), Instant::from_nanos(328));
    }

    #[test]
    fn random_loss_rate() {
        let mut s = LossState::new(LossModel::Random(0.01), SimRng::new(5));
        let lost = (0..100_000).filter(|_| s.lose()).count();
        assert!((850..1_150).contains(&lost), "{lost}");
    }

    #[test]
    fn gilbert_elliott_mean_and_bursts() {
        let model = LossModel::bursty(0.02, 8.0);
        assert!((model.mean_loss() - 0.02).abs() < 1e-12);
        let mut s = LossState::new(model, SimRng::new(11));
        let outcomes: Vec<bool> = (0..400_000).map(|_| s.lose()).collect();
        let lost = outcomes.iter().filter(|&&l| l).count();
        let rate = lost as f64 / outcomes.len() as f64;
        assert!((0.016..0.024).contains(&rate), "{rate}");
        let bursts = outcomes.windows(2).filter(|w| w[1] && !w[0]).count();
        let mean_burst = lost as f64 / bursts as f64;
        assert!((6.5..9.5).contains(&mean_burst), "{mean_burst}");
    }
}
