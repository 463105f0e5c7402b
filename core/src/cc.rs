//! Congestion control (spec 4.10).
//!
//! The sender's rate is `min(controller rate, receiver fair-share hint)`.
//! Controllers sit behind [`CongestionControl`] and are dispatched by the
//! [`Controller`] enum, so adding one needs no `Box<dyn>` and no allocation.

use crate::config::{CcAlgorithm, Config};
use crate::time::Instant;

/// Fixed-point one for the marked-fraction average.
const ONE: u32 = 1 << 16;

/// What a controller learns and decides.
pub trait CongestionControl {
    /// Data packets newly delivered, of which `marked` carried CE, as echoed
    /// by the receiver in an ACK drawn by a packet sent at `sent_at`;
    /// `ceiling` is the receiver's fair-share hint in Mbit/s (`u32::MAX`:
    /// none), which caps what the sender actually sends.
    fn on_delivery(
        &mut self,
        now: Instant,
        delivered: u32,
        marked: u32,
        sent_at: Instant,
        ceiling: u32,
    );
    /// A retransmission timeout fired: the path to the peer may be badly
    /// congested or broken.
    fn on_timeout(&mut self, now: Instant);
    /// Current sending rate in Mbit/s.
    fn rate_mbps(&self) -> u32;
}

/// ECN-driven AIMD with DCTCP's estimate: once per window of data (an
/// epoch ends when a packet sent after its start is echoed), if any
/// delivered packet was marked, `rate *= 1 - alpha/2` (not below 7/8 of a
/// receiver's hint below the link rate), where alpha is a moving
/// average of the marked fraction with gain `g = 2^-shift`; otherwise the rate
/// grows by a fixed step. Random loss does not cut the rate (spec 4.10.2):
/// losses on a lossy fabric are not a congestion signal, marks are.
#[derive(Debug, Clone, Copy)]
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
    /// Starts at line rate with alpha = 1/16: the receiver's hint already
    /// sets each sender's share, so the first marked round trip (usually
    /// the queue left by the start-up burst) trims the rate instead of
    /// halving it for every sender at once, which would leave the
    /// bottleneck idle (incast: 1.11x -> 1.06x of the ideal). Alpha then
    /// follows the marked fraction as in DCTCP.
    pub fn new(config: &Config) -> EcnAimd {
        EcnAimd {
            rate_mbps: config.link_rate_mbps,
            max_mbps: config.link_rate_mbps,
            min_mbps: config.cc_min_rate_mbps.min(config.link_rate_mbps),
            increase_mbps: config.cc_additive_increase_mbps,
            alpha: ONE / 16,
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
    fn on_delivery(
        &mut self,
        now: Instant,
        delivered: u32,
        marked: u32,
        sent_at: Instant,
        ceiling: u32,
    ) {
        self.epoch_delivered = self.epoch_delivered.saturating_add(delivered);
        self.epoch_marked = self.epoch_marked.saturating_add(marked.min(delivered));
        // One decision per window of data (RFC 3168's once per window, as
        // DCTCP's observation window): only marks on a packet sent after
        // the last decision show what that decision did. A smoothed RTT
        // lags a queue that is building, and an epoch of one cut the rate
        // again for marks the previous cut could not yet have removed: in
        // the 63-to-1 incast every sender cut its share three times while
        // the start-up burst's queue drained, which left the receiver's
        // link half idle for some 150 us.
        if sent_at < self.epoch_start || self.epoch_delivered == 0 {
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
        // A sender its receiver's hint names the whole link's (no other
        // sender there) is marked by the fabric, on some of its paths: the
        // path choice steers off them (spec 4.9.1), and only a window with
        // half its packets marked, a fabric congested on most paths, cuts
        // the rate. Cut on any mark, such senders lost tens of us to
        // compounding cuts for one hot spine (loss-free permutation, keyed,
        // seeds 1-8: p99 1.176x -> 1.151x of the floor; slowest 2 % of
        // flows paced 42 us below line rate).
        let alone = ceiling != u32::MAX && ceiling >= self.max_mbps;
        let half = self.epoch_marked >= self.epoch_delivered - self.epoch_marked;
        if self.epoch_marked > 0 && (!alone || half) {
            // Cut from what is actually sent: a sender held to the hint
            // whose own rate is far above it would otherwise need many
            // marked round trips to slow down at all, then fall far below
            // its share. Increases stay uncapped, so when the hint rises
            // (senders left) the sender follows it at once.
            let base = self.rate_mbps.min(ceiling);
            let cut = u64::from(base) * u64::from(self.alpha) / u64::from(2 * ONE);
            // Under a hint below the link rate (a shared receiver), marks
            // trim the share to 7/8 at most: the shares already sum to the
            // receiver's link, so the queue only has to drain, and each
            // window saw marks set before the last cut took effect.
            // Compounding cuts took the 63-to-1 incast's senders to 40 %
            // of their share and left the link half idle once the queue
            // had gone (last completion 1.0216x the wire floor; 1.0145x
            // with this floor, 1.0090x with 4.10.4's shorter window for
            // senders gone idle too; a floor of 3/4 drains the queue twice
            // as fast but left it oscillating in some runs, 127 senders:
            // 1.02x).
            let floor = if ceiling >= self.max_mbps {
                0
            } else {
                ceiling - ceiling / 8
            };
            self.rate_mbps = (base - cut as u32).max(floor.min(base)).max(self.min_mbps);
        } else {
            // An unmarked round trip below the receiver's fair share: the
            // share is free, take it at once (all senders at their share
            // fill the receiver's link exactly); above it, probe additively.
            let share = if ceiling == u32::MAX { 0 } else { ceiling };
            self.rate_mbps = self
                .rate_mbps
                .saturating_add(self.increase_mbps)
                .max(share)
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
#[derive(Debug, Clone, Copy)]
pub struct FixedRate {
    rate_mbps: u32,
}

impl FixedRate {
    pub const fn new(rate_mbps: u32) -> FixedRate {
        FixedRate { rate_mbps }
    }
}

impl CongestionControl for FixedRate {
    fn on_delivery(&mut self, _: Instant, _: u32, _: u32, _: Instant, _: u32) {}
    fn on_timeout(&mut self, _: Instant) {}
    fn rate_mbps(&self) -> u32 {
        self.rate_mbps
    }
}

/// The controllers, dispatched statically.
#[derive(Debug, Clone, Copy)]
pub enum Controller {
    EcnAimd(EcnAimd),
    Fixed(FixedRate),
}

impl Controller {
    /// The controller `config` selects.
    pub fn new(config: &Config) -> Controller {
        match config.cc {
            CcAlgorithm::EcnAimd => Controller::EcnAimd(EcnAimd::new(config)),
            CcAlgorithm::Fixed => Controller::Fixed(FixedRate::new(config.link_rate_mbps)),
        }
    }
}

impl CongestionControl for Controller {
    fn on_delivery(
        &mut self,
        now: Instant,
        delivered: u32,
        marked: u32,
        sent_at: Instant,
        ceiling: u32,
    ) {
        match self {
            Controller::EcnAimd(c) => c.on_delivery(now, delivered, marked, sent_at, ceiling),
            Controller::Fixed(c) => c.on_delivery(now, delivered, marked, sent_at, ceiling),
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
    fn marks_cut_once_per_window_and_clean_windows_grow() {
        let cfg = Config::default();
        let mut cc = EcnAimd::new(&cfg);
        assert_eq!(cc.rate_mbps(), 100_000);
        // The first marked echo decides (nothing was decided before).
        cc.on_delivery(us(10), 10, 10, us(0), u32::MAX);
        let after_first = cc.rate_mbps();
        assert!((50_000..100_000).contains(&after_first), "{after_first}");
        // Echoes of packets sent before that decision do not cut again,
        // however late they come back: the queue they met was built before
        // the cut (a time-based epoch of one RTT cut here twice more).
        cc.on_delivery(us(30), 10, 10, us(9), u32::MAX);
        cc.on_delivery(us(80), 10, 10, us(9), u32::MAX);
        assert_eq!(cc.rate_mbps(), after_first, "no second cut in the window");
        // A packet sent after the decision comes back marked: the next cut.
        cc.on_delivery(us(90), 10, 10, us(10), u32::MAX);
        assert!(cc.rate_mbps() < after_first);
        let low = cc.rate_mbps();
        // Unmarked windows: one additive step each.
        let mut t = 90;
        for _ in 0..10 {
            cc.on_delivery(us(t + 11), 10, 0, us(t), u32::MAX);
            t += 11;
        }
        assert_eq!(
            cc.rate_mbps(),
            (low + 10 * cfg.cc_additive_increase_mbps).min(cfg.link_rate_mbps)
        );
    }

    #[test]
    fn a_sender_held_to_the_hint_cuts_from_the_hint_and_returns_to_it() {
        let cfg = Config::default();
        let mut cc = EcnAimd::new(&cfg);
        let hint = 1_600;
        // Own rate 100 Gbit/s, sending at the 1.6 Gbit/s hint: a marked
        // window cuts below what is actually sent.
        cc.on_delivery(us(10), 10, 10, us(0), hint);
        let cut = cc.rate_mbps();
        assert!(cut < hint && cut > hint / 2, "{cut}");
        // An unmarked window: at least the share again at once.
        cc.on_delivery(us(21), 10, 0, us(11), hint);
        assert_eq!(
            cc.rate_mbps(),
            (cut + cfg.cc_additive_increase_mbps).max(hint)
        );
        // A share far above the own rate (senders left) is taken at once.
        cc.on_delivery(us(32), 10, 0, us(22), 50_000);
        assert_eq!(cc.rate_mbps(), 50_000);
        // Without a hint: additive only.
        let mut plain = EcnAimd::new(&cfg);
        plain.on_delivery(us(10), 10, 10, us(0), u32::MAX);
        let low = plain.rate_mbps();
        plain.on_delivery(us(21), 10, 0, us(11), u32::MAX);
        assert_eq!(plain.rate_mbps(), low + cfg.cc_additive_increase_mbps);
    }

    #[test]
    fn marks_under_a_shared_receivers_hint_trim_the_share_to_seven_eighths_at_most() {
        let cfg = Config::default();
        let hint = 1_600;
        let marked_windows = |cc: &mut EcnAimd, hint: u32| {
            let mut t = 0;
            for _ in 0..30 {
                cc.on_delivery(us(t + 11), 10, 10, us(t), hint);
                t += 11;
            }
        };
        // A standing queue: every window marked, as for the 63-to-1
        // incast's start-up queue while it drains. The cuts stop at 7/8 of
        // the share instead of compounding (they reached 40 % of it).
        let mut cc = EcnAimd::new(&cfg);
        marked_windows(&mut cc, hint);
        assert_eq!(cc.rate_mbps(), hint - hint / 8);
        // Without a hint, or with one of the whole link (a receiver with
        // one sender: marks more likely come from the fabric), the same
        // marks compound as in DCTCP.
        for ceiling in [u32::MAX, cfg.link_rate_mbps] {
            let mut plain = EcnAimd::new(&cfg);
            marked_windows(&mut plain, ceiling);
            assert!(plain.rate_mbps() < cfg.link_rate_mbps / 4, "{ceiling}");
        }
        // A mark never raises a rate already below the floor (after
        // timeouts): the floor bounds cuts, it grants nothing.
        let mut low = EcnAimd::new(&cfg);
        for _ in 0..10 {
            low.on_timeout(us(0));
        }
        let before = low.rate_mbps();
        assert!(before < hint / 2);
        low.on_delivery(us(10), 10, 10, us(0), hint);
        assert!(low.rate_mbps() <= before);
    }

    #[test]
    fn a_sender_alone_at_its_receiver_cuts_only_for_a_mostly_marked_window() {
        let cfg = Config::default();
        let link = cfg.link_rate_mbps;
        let mut cc = EcnAimd::new(&cfg);
        // One packet in ten marked on a hot path: no cut.
        cc.on_delivery(us(10), 10, 1, us(0), link);
        assert_eq!(cc.rate_mbps(), link);
        // Half the window marked: the fabric is congested, cut.
        cc.on_delivery(us(21), 10, 5, us(11), link);
        assert!(cc.rate_mbps() < link);
        // Without a hint, any mark cuts (DCTCP).
        let mut plain = EcnAimd::new(&cfg);
        plain.on_delivery(us(10), 10, 1, us(0), u32::MAX);
        assert!(plain.rate_mbps() < link);
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
