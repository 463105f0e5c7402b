//! Congestion control of the baseline: DCQCN (Zhu et al., "Congestion
//! Control for Large-Scale RDMA Deployments", SIGCOMM 2015), as RoCE NICs
//! implement it, or none.
//!
//! DCQCN has three parts:
//! * the switch (congestion point) marks packets CE with RED-like
//!   probability between Kmin and Kmax; the simulator does this, with the
//!   defaults in [`switch_marking`];
//! * the receiver (notification point) answers CE-marked packets of a QP
//!   with a CNP, at most one per QP every [`DEFAULT_CNP_INTERVAL`]; that is
//!   in the endpoint;
//! * the sender (reaction point) keeps a current rate `Rc`, a target rate
//!   `Rt` and a congestion estimate `alpha`; on a CNP it cuts `Rc` by
//!   `alpha / 2` (at most once per rate-reduce period), and without CNPs it
//!   recovers: fast recovery towards `Rt`, then additive, then hyper
//!   increase of `Rt`, driven by a timer and a byte counter. That is
//!   [`Dcqcn`].
//!
//! Controllers sit behind [`CongestionControl`], dispatched by the [`Cc`]
//! enum (no `dyn`). Rates are integers in bits per second and `alpha` is a
//! fixed-point fraction of 2^20, so runs are exactly reproducible.

use core::time::Duration;

use metaroce_core::Instant;

/// Fixed-point one for `alpha` and gains.
const ONE: u64 = 1 << 20;

/// The notification point sends at most one CNP per QP in this interval:
/// 50 us, the `N` of the DCQCN paper (section 4, "NP algorithm").
pub const DEFAULT_CNP_INTERVAL: Duration = Duration::from_micros(50);

/// What the simulator's switches should do for DCQCN at 100 Gb/s: mark CE
/// with a probability rising linearly from 0 at `KMIN_BYTES` of queue to
/// `PMAX` at `KMAX_BYTES`, and always above. Numbers from the HPCC ns-3
/// configuration (`alibaba-edu/High-Precision-Congestion-Control`,
/// `mix/config.txt`: `KMIN_MAP`/`KMAX_MAP` 400/1600 (KB) and `PMAX_MAP` 0.2
/// at 100 Gb/s). The baseline itself does not use them.
pub mod switch_marking {
    /// Queue length where marking starts.
    pub const KMIN_BYTES: u64 = 400 * 1000;
    /// Queue length where the marking probability reaches [`PMAX`].
    pub const KMAX_BYTES: u64 = 1600 * 1000;
    /// Marking probability at `KMAX_BYTES`.
    pub const PMAX: f64 = 0.2;
}

/// A sender-side congestion controller of one queue pair.
pub trait CongestionControl {
    /// The rate the QP may send at now, in bits per second.
    fn rate_bps(&self) -> u64;
    /// A CNP for this QP arrived.
    fn on_cnp(&mut self, now: Instant);
    /// The QP sent `bytes` on the wire (drives byte counters).
    fn on_sent(&mut self, now: Instant, bytes: u64);
    /// The next instant [`CongestionControl::handle_timeout`] has work.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Runs the timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);
}

/// Which controller a QP runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CcConfig {
    /// Always the line rate (a lossless fabric with PFC, or a test).
    None,
    Dcqcn(DcqcnConfig),
}

impl Default for CcConfig {
    fn default() -> CcConfig {
        CcConfig::Dcqcn(DcqcnConfig::default())
    }
}

/// A QP's controller. Held inline in each QP (no allocation), so the
/// variants' sizes differ by design.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Cc {
    None(NoCc),
    Dcqcn(Dcqcn),
}

impl Cc {
    pub fn new(config: &CcConfig, line_rate_bps: u64) -> Cc {
        match config {
            CcConfig::None => Cc::None(NoCc { line_rate_bps }),
            CcConfig::Dcqcn(c) => Cc::Dcqcn(Dcqcn::new(*c, line_rate_bps)),
        }
    }

    /// The DCQCN state, if this is DCQCN.
    pub fn dcqcn(&self) -> Option<&Dcqcn> {
        match self {
            Cc::Dcqcn(d) => Some(d),
            Cc::None(_) => None,
        }
    }
}

impl CongestionControl for Cc {
    fn rate_bps(&self) -> u64 {
        match self {
            Cc::None(c) => c.rate_bps(),
            Cc::Dcqcn(c) => c.rate_bps(),
        }
    }
    fn on_cnp(&mut self, now: Instant) {
        match self {
            Cc::None(c) => c.on_cnp(now),
            Cc::Dcqcn(c) => c.on_cnp(now),
        }
    }
    fn on_sent(&mut self, now: Instant, bytes: u64) {
        match self {
            Cc::None(c) => c.on_sent(now, bytes),
            Cc::Dcqcn(c) => c.on_sent(now, bytes),
        }
    }
    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Cc::None(c) => c.poll_timeout(),
            Cc::Dcqcn(c) => c.poll_timeout(),
        }
    }
    fn handle_timeout(&mut self, now: Instant) {
        match self {
            Cc::None(c) => c.handle_timeout(now),
            Cc::Dcqcn(c) => c.handle_timeout(now),
        }
    }
}

/// No congestion control: always the line rate.
#[derive(Debug, Clone)]
pub struct NoCc {
    line_rate_bps: u64,
}

impl CongestionControl for NoCc {
    fn rate_bps(&self) -> u64 {
        self.line_rate_bps
    }
    fn on_cnp(&mut self, _now: Instant) {}
    fn on_sent(&mut self, _now: Instant, _bytes: u64) {}
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {}
}

/// DCQCN reaction-point parameters. See [`DcqcnConfig::hpcc_ns3`] (the
/// default) and [`DcqcnConfig::nvidia`] for where each number comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnConfig {
    /// EWMA gain `g` of alpha, as `g_num / g_den`: each alpha period,
    /// `alpha = (1 - g) * alpha + g * [a CNP arrived in the period]`.
    pub g_num: u32,
    pub g_den: u32,
    /// Alpha on the first CNP, as a fraction of 1024.
    pub initial_alpha_1024: u32,
    /// Alpha update period (`K` in the paper).
    pub alpha_period: Duration,
    /// At most one rate decrease per this period.
    pub rate_reduce_period: Duration,
    /// Largest single decrease, percent of the current rate.
    pub max_decrease_percent: u32,
    /// Floor of the current rate.
    pub min_rate_bps: u64,
    /// Rate-increase timer (`T` in the paper).
    pub increase_period: Duration,
    /// Rate-increase byte counter (`B` in the paper); `None` disables it.
    pub increase_bytes: Option<u64>,
    /// Increase events spent in fast recovery before additive increase
    /// (`F` in the paper).
    pub fast_recovery_steps: u32,
    /// Additive increase of the target rate.
    pub additive_increase_bps: u64,
    /// Hyper increase of the target rate.
    pub hyper_increase_bps: u64,
    /// Whether every decrease sets the target rate to the current rate; if
    /// not, only the first decrease after an increase does (ns-3's
    /// `ClampTargetRate`).
    pub clamp_target_rate: bool,
}

impl Default for DcqcnConfig {
    fn default() -> DcqcnConfig {
        DcqcnConfig::hpcc_ns3()
    }
}

impl DcqcnConfig {
    /// The DCQCN configuration of the HPCC ns-3 simulator
    /// (`alibaba-edu/High-Precision-Congestion-Control`, `mix/config.txt`
    /// with `CC_MODE 1`), the setup most published DCQCN comparisons run:
    /// `EWMA_GAIN 0.00390625` (g = 1/256), `ALPHA_RESUME_INTERVAL 1` (us),
    /// `RATE_DECREASE_INTERVAL 4` (us), `RP_TIMER 900` (us),
    /// `FAST_RECOVERY_TIMES 1`, `RATE_AI 50Mb/s`, `RATE_HAI 100Mb/s`,
    /// `MIN_RATE 100Mb/s`, `CLAMP_TARGET_RATE 0`. Its model has no byte
    /// counter and sets alpha to 1 on the first CNP (`rdma-hw.cc`,
    /// "Mellanox's version of DCQCN"). The 50 % cap is implied by
    /// alpha <= 1.
    pub const fn hpcc_ns3() -> DcqcnConfig {
        DcqcnConfig {
            g_num: 1,
            g_den: 256,
            initial_alpha_1024: 1024,
            alpha_period: Duration::from_micros(1),
            rate_reduce_period: Duration::from_micros(4),
            max_decrease_percent: 50,
            min_rate_bps: 100_000_000,
            increase_period: Duration::from_micros(900),
            increase_bytes: None,
            fast_recovery_steps: 1,
            additive_increase_bps: 50_000_000,
            hyper_increase_bps: 100_000_000,
            clamp_target_rate: false,
        }
    }

    /// NVIDIA ConnectX firmware defaults where NVIDIA documents them (DOCA
    /// "DCQCN CC Parameters"): `dce_tcp_g` 1019 (alpha keeps 1019/1024 of
    /// itself per period, so g = 5/1024), `dce_tcp_rtt` 1 us (alpha
    /// period), `initial_alpha_value` 1023, `rpg_min_dec_fac` 50 (%),
    /// `rpg_min_rate` 1 Mb/s; rate-reduce monitor period 4 us (see
    /// `ANCHORS.md`). The increase parameters are the defaults of ns-3's
    /// model of the Mellanox implementation (`rdma-hw.cc` attributes
    /// `RPTimer` 1500 us, `FastRecoveryTimes` 5, `RateAI` 5 Mb/s,
    /// `RateHAI` 50 Mb/s), not checked against firmware here.
    pub const fn nvidia() -> DcqcnConfig {
        DcqcnConfig {
            g_num: 5,
            g_den: 1024,
            initial_alpha_1024: 1023,
            alpha_period: Duration::from_micros(1),
            rate_reduce_period: Duration::from_micros(4),
            max_decrease_percent: 50,
            min_rate_bps: 1_000_000,
            increase_period: Duration::from_micros(1500),
            increase_bytes: None,
            fast_recovery_steps: 5,
            additive_increase_bps: 5_000_000,
            hyper_increase_bps: 50_000_000,
            clamp_target_rate: false,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `base^exp` in 2^20 fixed point, by squaring.
fn pow_fixed(base: u64, mut exp: u64) -> u64 {
    let mut result = ONE;
    let mut b = base;
    while exp > 0 {
        if exp & 1 == 1 {
            result = (result * b) >> 20;
        }
        b = (b * b) >> 20;
        exp >>= 1;
    }
    result
}

/// The DCQCN reaction point of one QP.
#[derive(Debug, Clone)]
pub struct Dcqcn {
    cfg: DcqcnConfig,
    line_rate_bps: u64,
    g: u64,
    current_bps: u64,
    target_bps: u64,
    /// Congestion estimate in 2^20 fixed point.
    alpha: u64,
    /// Start of the alpha period under way.
    alpha_period_start: Instant,
    cnp_in_period: bool,
    seen_cnp: bool,
    last_decrease: Option<Instant>,
    pending_decrease: Option<Instant>,
    timer_stage: u32,
    byte_stage: u32,
    bytes_since_increase: u64,
    next_increase: Option<Instant>,
    decreases: u64,
    increases: u64,
}

impl Dcqcn {
    pub fn new(cfg: DcqcnConfig, line_rate_bps: u64) -> Dcqcn {
        let g = if cfg.g_den == 0 {
            0
        } else {
            (u64::from(cfg.g_num) * ONE / u64::from(cfg.g_den)).min(ONE)
        };
        Dcqcn {
            cfg,
            line_rate_bps,
            g,
            current_bps: line_rate_bps,
            target_bps: line_rate_bps,
            alpha: ONE,
            alpha_period_start: Instant::ZERO,
            cnp_in_period: false,
            seen_cnp: false,
            last_decrease: None,
            pending_decrease: None,
            timer_stage: 0,
            byte_stage: 0,
            bytes_since_increase: 0,
            next_increase: None,
            decreases: 0,
            increases: 0,
        }
    }

    /// Target rate `Rt`, bits per second.
    pub fn target_bps(&self) -> u64 {
        self.target_bps
    }

    /// Alpha as a fraction of 2^20.
    pub fn alpha_fixed(&self) -> u64 {
        self.alpha
    }

    /// Rate decreases so far.
    pub fn decreases(&self) -> u64 {
        self.decreases
    }

    /// Rate increase events so far.
    pub fn increases(&self) -> u64 {
        self.increases
    }

    /// Brings alpha up to date: one update per whole alpha period since the
    /// last one, the first with the period's CNP flag, the rest decays.
    fn catch_up_alpha(&mut self, now: Instant) {
        let period = nanos(self.cfg.alpha_period).max(1);
        let elapsed = now.saturating_duration_since(self.alpha_period_start);
        let periods = nanos(elapsed) / period;
        if periods == 0 {
            return;
        }
        let keep = ONE - self.g;
        self.alpha = (self.alpha * keep) >> 20;
        if self.cnp_in_period {
            self.alpha += self.g;
        }
        self.alpha = ((self.alpha * pow_fixed(keep, periods - 1)) >> 20).min(ONE);
        self.cnp_in_period = false;
        self.alpha_period_start += Duration::from_nanos(periods.saturating_mul(period));
    }

    fn decrease(&mut self, now: Instant) {
        self.catch_up_alpha(now);
        if self.cfg.clamp_target_rate || self.timer_stage != 0 || self.byte_stage != 0 {
            self.target_bps = self.current_bps;
        }
        let cap = u64::from(self.cfg.max_decrease_percent.min(100)) * ONE / 100;
        let cut = (self.alpha / 2).min(cap);
        let reduced = (u128::from(self.current_bps) * u128::from(ONE - cut)) >> 20;
        self.current_bps = (reduced as u64).max(self.cfg.min_rate_bps.min(self.line_rate_bps));
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.bytes_since_increase = 0;
        self.next_increase = Some(now + self.cfg.increase_period);
        self.last_decrease = Some(now);
        self.pending_decrease = None;
        self.decreases += 1;
    }

    fn at_line_rate(&self) -> bool {
        self.current_bps >= self.line_rate_bps && self.target_bps >= self.line_rate_bps
    }

    /// One increase event; `stage_*` are the counts before this event.
    fn increase(&mut self) {
        let (low, high) = if self.cfg.increase_bytes.is_some() {
            (
                self.timer_stage.min(self.byte_stage),
                self.timer_stage.max(self.byte_stage),
            )
        } else {
            (self.timer_stage, self.timer_stage)
        };
        let f = self.cfg.fast_recovery_steps;
        if high < f {
            // Fast recovery: move halfway to the target.
        } else if low > f {
            self.target_bps = self.target_bps.saturating_add(self.cfg.hyper_increase_bps);
        } else {
            self.target_bps = self
                .target_bps
                .saturating_add(self.cfg.additive_increase_bps);
        }
        self.target_bps = self.target_bps.min(self.line_rate_bps);
        // Halfway to the target, rounding up so the rate reaches it.
        let gap = self.target_bps.saturating_sub(self.current_bps);
        self.current_bps = (self.current_bps + gap.div_ceil(2)).min(self.target_bps);
        self.increases += 1;
    }
}

impl CongestionControl for Dcqcn {
    fn rate_bps(&self) -> u64 {
        self.current_bps
    }

    fn on_cnp(&mut self, now: Instant) {
        if self.seen_cnp {
            self.catch_up_alpha(now);
            self.cnp_in_period = true;
        } else {
            self.seen_cnp = true;
            self.alpha = u64::from(self.cfg.initial_alpha_1024.min(1024)) * ONE / 1024;
            self.alpha_period_start = now;
            self.cnp_in_period = false;
        }
        let allowed = self
            .last_decrease
            .map_or(now, |t| t + self.cfg.rate_reduce_period);
        if now >= allowed {
            self.decrease(now);
        } else if self.pending_decrease.is_none() {
            self.pending_decrease = Some(allowed);
        }
    }

    fn on_sent(&mut self, _now: Instant, bytes: u64) {
        let Some(threshold) = self.cfg.increase_bytes else {
            return;
        };
        if self.at_line_rate() || threshold == 0 {
            return;
        }
        self.bytes_since_increase += bytes;
        while self.bytes_since_increase >= threshold && !self.at_line_rate() {
            self.bytes_since_increase -= threshold;
            self.increase();
            self.byte_stage = self.byte_stage.saturating_add(1);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match (self.pending_decrease, self.next_increase) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if let Some(t) = self.pending_decrease {
            if t <= now {
                self.decrease(t);
            }
        }
        while let Some(t) = self.next_increase {
            if t > now {
                break;
            }
            self.increase();
            self.timer_stage = self.timer_stage.saturating_add(1);
            self.next_increase = if self.at_line_rate() {
                None
            } else {
                Some(t + self.cfg.increase_period)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: u64 = 100_000_000_000;

    #[test]
    fn pow_fixed_matches_repeated_multiplication() {
        let keep = ONE - ONE / 256;
        let mut slow = ONE;
        for _ in 0..100 {
            slow = (slow * keep) >> 20;
        }
        let fast = pow_fixed(keep, 100);
        assert!(slow.abs_diff(fast) <= 100, "{slow} vs {fast}");
        assert_eq!(pow_fixed(keep, 0), ONE);
    }

    #[test]
    fn first_cnp_halves_and_period_limits_decreases() {
        let mut d = Dcqcn::new(DcqcnConfig::hpcc_ns3(), LINE);
        let t0 = Instant::from_micros(100);
        d.on_cnp(t0);
        assert_eq!(d.rate_bps(), LINE / 2);
        assert_eq!(d.decreases(), 1);
        // A second CNP within the 4 us period is deferred to its end.
        d.on_cnp(t0 + Duration::from_micros(1));
        assert_eq!(d.decreases(), 1);
        assert_eq!(d.poll_timeout(), Some(t0 + Duration::from_micros(4)));
        d.handle_timeout(t0 + Duration::from_micros(4));
        assert_eq!(d.decreases(), 2);
        assert!(d.rate_bps() < LINE / 2);
        assert!(d.rate_bps() >= LINE / 4);
    }

    #[test]
    fn recovers_to_line_rate_without_cnps() {
        let mut d = Dcqcn::new(DcqcnConfig::hpcc_ns3(), LINE);
        d.on_cnp(Instant::from_micros(10));
        let low = d.rate_bps();
        let mut now = Instant::from_micros(10);
        let mut steps = 0;
        while let Some(t) = d.poll_timeout() {
            now = t;
            d.handle_timeout(now);
            steps += 1;
            assert!(steps < 100_000, "never recovered");
        }
        assert!(low < LINE);
        assert_eq!(d.rate_bps(), LINE);
        assert!(now > Instant::from_micros(10));
    }

    #[test]
    fn alpha_decays_between_cnps() {
        let mut d = Dcqcn::new(DcqcnConfig::hpcc_ns3(), LINE);
        d.on_cnp(Instant::ZERO);
        assert_eq!(d.alpha_fixed(), ONE);
        d.on_cnp(Instant::from_micros(1000));
        // About 1000 periods of decay: (255/256)^1000 is about 0.02.
        let a = d.alpha_fixed() as f64 / ONE as f64;
        assert!(a > 0.015 && a < 0.03, "alpha {a}");
    }

    #[test]
    fn byte_counter_drives_increases() {
        let cfg = DcqcnConfig {
            increase_bytes: Some(10_000),
            ..DcqcnConfig::hpcc_ns3()
        };
        let mut d = Dcqcn::new(cfg, LINE);
        d.on_cnp(Instant::ZERO);
        let low = d.rate_bps();
        d.on_sent(Instant::ZERO, 25_000);
        assert_eq!(d.increases(), 2);
        assert!(d.rate_bps() > low);
    }

    #[test]
    fn no_cc_is_line_rate() {
        let mut c = Cc::new(&CcConfig::None, LINE);
        c.on_cnp(Instant::ZERO);
        assert_eq!(c.rate_bps(), LINE);
        assert_eq!(c.poll_timeout(), None);
    }
}
