//! Congestion control (spec 4.10).
//!
//! The sender's rate is `min(controller rate, receiver fair-share hint)`.
//! Controllers sit behind [`CongestionControl`] and are dispatched by the
//! [`Controller`] enum, so adding one needs no `Box<dyn>` and no allocation.

use core::time::Duration;

use crate::config::{CcAlgorithm, Config};
use crate::time::Instant;

/// Fixed-point one for the marked-fraction average.
const ONE: u32 = 1 << 16;

/// What a controller learns and decides.
pub trait CongestionControl {
    /// Data packets newly delivered, of which `marked` carried CE, as echoed
    /// by the receiver; `rtt` is the current smoothed round trip.
    fn on_delivery(&mut self, now: Instant, delivered: u32, marked: u32, rtt: Duration);
    /// A retransmission timeout fired: the path to the peer may be badly
    /// congested or broken.
    fn on_timeout(&mut self, now: Instant);
    /// Current sending rate in Mbit/s.
    fn rate_mbps(&self) -> u32;
}

/// ECN-driven AIMD with DCTCP's estimate: once per round trip, if any
/// delivered packet was marked, `rate *= 1 - alpha/2`, where alpha is a moving
/// average of the marked fraction with gain `g = 2^-shift`; otherwise the rate
/// grows by a fixed step. Random loss does not cut the rate (spec 4.10.2):
/// losses on a lossy fabric are not a congestion signal, marks are.
#[derive(Debug, Clone)]
pub struct EcnAimd {
    rate_mbps: u32,
    max_mbps: u32,
    min_mbps: u32,
    increase_mbps: u32,
    alpha: u32,
    alpha_shift: u8,
    epoch_start: Instant,
    epoch_delivered: u32,
    epoch_marked: u32,
}

impl EcnAimd {
    /// Starts at line rate with alpha = 1 (the first marked round trip halves the rate).
    pub fn new(config: &Config) -> EcnAimd {
        EcnAimd {
            rate_mbps: config.link_rate_mbps,
            max_mbps: config.link_rate_mbps,
            min_mbps: config.cc_min_rate_mbps.min(config.link_rate_mbps),
            increase_mbps: config.cc_additive_increase_mbps,
            alpha: ONE,
            alpha_shift: config.cc_alpha_shift.min(15),
            epoch_start: Instant::ZERO,
            epoch_delivered: 0,
            epoch_marked: 0,
        }
    }

    /// The marked-fraction estimate, in 1/65536.
    pub fn alpha(&self) -> u32 {
        self.alpha
    }
}

impl CongestionControl for EcnAimd {
    fn on_delivery(&mut self, now: Instant, delivered: u32, marked: u32, rtt: Duration) {
        self.epoch_delivered = self.epoch_delivered.saturating_add(delivered);
        self.epoch_marked = self.epoch_marked.saturating_add(marked.min(delivered));
        // One decision per round trip: at most one decrease per RTT.
        if now < self.epoch_start + rtt || self.epoch_delivered == 0 {
            return;
        }
        let fraction = (u64::from(self.epoch_marked) * u64::from(ONE)
            / u64::from(self.epoch_delivered)) as u32;
        // alpha += g * (F - alpha), in fixed point.
        if fraction >= self.alpha {
            self.alpha += (fraction - self.alpha) >> self.alpha_shift;
        } else {
            self.alpha -= (self.alpha - fraction) >> self.alpha_shift;
        }
        if self.epoch_marked > 0 {
            let cut = u64::from(self.rate_mbps) * u64::from(self.alpha) / u64::from(2 * ONE);
            self.rate_mbps = (self.rate_mbps - cut as u32).max(self.min_mbps);
        } else {
            self.rate_mbps = self
                .rate_mbps
                .saturating_add(self.increase_mbps)
                .min(self.max_mbps);
        }
        self.epoch_start = now;
        self.epoch_delivered = 0;
        self.epoch_marked = 0;
    }

    fn on_timeout(&mut self, _now: Instant) {
        self.rate_mbps = (self.rate_mbps / 2).max(self.min_mbps);
    }

    fn rate_mbps(&self) -> u32 {
        self.rate_mbps
    }
}

/// Constant line rate: only the receiver's hint and the window limit the sender.
#[derive(Debug, Clone)]
pub struct FixedRate {
    rate_mbps: u32,
}

impl CongestionControl for FixedRate {
    fn on_delivery(&mut self, _: Instant, _: u32, _: u32, _: Duration) {}
    fn on_timeout(&mut self, _: Instant) {}
    fn rate_mbps(&self) -> u32 {
        self.rate_mbps
    }
}

/// The controllers, dispatched statically.
#[derive(Debug, Clone)]
pub enum Controller {
    EcnAimd(EcnAimd),
    Fixed(FixedRate),
}

impl Controller {
    /// The controller `config` selects.
    pub fn new(config: &Config) -> Controller {
        match config.cc {
            CcAlgorithm::EcnAimd => Controller::EcnAimd(EcnAimd::new(config)),
            CcAlgorithm::Fixed => Controller::Fixed(FixedRate {
                rate_mbps: config.link_rate_mbps,
            }),
        }
    }
}

impl CongestionControl for Controller {
    fn on_delivery(&mut self, now: Instant, delivered: u32, marked: u32, rtt: Duration) {
        match self {
            Controller::EcnAimd(c) => c.on_delivery(now, delivered, marked, rtt),
            Controller::Fixed(c) => c.on_delivery(now, delivered, marked, rtt),
        }
    }

    fn on_timeout(&mut self, now: Instant) {
        match self {
            Controller::EcnAimd(c) => c.on_timeout(now),
            Controller::Fixed(c) => c.on_timeout(now),
        }
    }

    fn rate_mbps(&self) -> u32 {
        match self {
            Controller::EcnAimd(c) => c.rate_mbps(),
            Controller::Fixed(c) => c.rate_mbps(),
        }
    }
}

/// Nanoseconds to send `bytes` at `rate_mbps` (pacing interval).
pub fn serialization_nanos(bytes: usize, rate_mbps: u32) -> u64 {
    (bytes as u64 * 8_000) / u64::from(rate_mbps.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Instant {
        Instant::from_micros(n)
    }

    #[test]
    fn marks_cut_once_per_rtt_and_clean_rtts_grow() {
        let cfg = Config::default();
        let mut cc = EcnAimd::new(&cfg);
        let rtt = Duration::from_micros(10);
        assert_eq!(cc.rate_mbps(), 100_000);
        // Marks within one RTT: one decision at the RTT boundary only.
        cc.on_delivery(us(10), 10, 10, rtt);
        let after_first = cc.rate_mbps();
        assert!((50_000..100_000).contains(&after_first), "{after_first}");
        cc.on_delivery(us(12), 10, 10, rtt);
        cc.on_delivery(us(15), 10, 10, rtt);
        assert_eq!(cc.rate_mbps(), after_first, "no second cut within the RTT");
        cc.on_delivery(us(21), 10, 10, rtt);
        assert!(cc.rate_mbps() < after_first);
        let low = cc.rate_mbps();
        for i in 0..10 {
            cc.on_delivery(us(40 + i * 11), 10, 0, rtt);
        }
        assert_eq!(cc.rate_mbps(), low + 10 * cfg.cc_additive_increase_mbps);
    }

    #[test]
    fn timeout_halves_within_bounds() {
        let cfg = Config::default();
        let mut cc = Controller::new(&cfg);
        for _ in 0..40 {
            cc.on_timeout(Instant::ZERO);
        }
        assert_eq!(cc.rate_mbps(), cfg.cc_min_rate_mbps);
        assert_eq!(serialization_nanos(4096, 100_000), 327);
    }
}
