//! Logical paths and their telemetry (spec 4.9).
//!
//! A connection spreads its packets over `P` logical paths, each a distinct
//! UDP source port (entropy) that ECMP hashes onto its own route. Per path
//! the sender keeps smoothed and minimum RTT, the echoed ECN-marked fraction,
//! losses and packets in flight. Packets go to the path with the least
//! weighted load; a path that is *persistently worse than its peers* (a loss
//! rate or mark rate significantly above the others', two evaluations in a
//! row) gets new entropy. Loss spread evenly over all paths (random loss)
//! makes no path stand out, so it causes no churn.

use crate::rng::Rng;

/// Fixed-point one (Q16) for fractions.
const ONE: u32 = 1 << 16;
/// Full weight of a healthy path.
const FULL_WEIGHT: u32 = 1024;

/// Telemetry of one path, copyable for export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PathStats {
    /// Current entropy (UDP source port).
    pub entropy: u16,
    pub sent: u32,
    pub retransmitted: u32,
    /// Retransmissions the receiver turned out to have had already.
    pub spurious: u32,
    pub acked: u32,
    pub lost: u32,
    /// CE marks the receiver echoed for this path.
    pub ce_echoed: u32,
    /// Times this path's entropy was re-drawn.
    pub rerolls: u32,
    pub srtt_ns: u32,
    pub min_rtt_ns: u32,
    pub in_flight: u16,
    /// Echoed marked fraction, per mille.
    pub ecn_permille: u16,
    /// Loss estimate, per mille.
    pub loss_permille: u16,
}

/// Sender and receiver state of one logical path.
#[derive(Debug, Clone, Copy, Default)]
pub struct Path {
    pub(crate) entropy: u16,
    pub(crate) srtt_ns: u32,
    pub(crate) rttvar_ns: u32,
    pub(crate) min_rtt_ns: u32,
    /// Send timestamp of the latest-sent packet delivered on this path (RACK).
    pub(crate) rack_xmit_ts: u32,
    pub(crate) rack_valid: bool,
    pub(crate) in_flight: u16,
    pub(crate) ecn_frac: u32,
    pub(crate) loss_frac: u32,
    /// Receiver side: data packets and CE marks received, echoed in ACKs.
    pub(crate) rx_count: u16,
    pub(crate) ce_count: u16,
    /// Sender side: the last echoed counters seen for this path.
    pub(crate) echo_rx_seen: u16,
    pub(crate) echo_ce_seen: u16,
    pub(crate) epoch_sent: u16,
    pub(crate) epoch_lost: u16,
    pub(crate) strikes: u8,
    pub(crate) stats: PathStats,
}

impl Path {
    /// Weight for the path choice: marks and losses shift traffic away.
    fn weight(&self) -> u32 {
        let penalty = (self.ecn_frac / 2 + self.loss_frac * 4).min(ONE * 7 / 8);
        FULL_WEIGHT * (ONE - penalty) / ONE
    }

    /// Takes an RTT sample (RFC 6298 smoothing).
    pub(crate) fn on_rtt_sample(&mut self, rtt_ns: u32) {
        let rtt_ns = rtt_ns.max(1);
        if self.srtt_ns == 0 {
            self.srtt_ns = rtt_ns;
            self.rttvar_ns = rtt_ns / 2;
            self.min_rtt_ns = rtt_ns;
        } else {
            let diff = self.srtt_ns.abs_diff(rtt_ns);
            self.rttvar_ns = self.rttvar_ns - self.rttvar_ns / 4 + diff / 4;
            self.srtt_ns = self.srtt_ns - self.srtt_ns / 8 + rtt_ns / 8;
            self.min_rtt_ns = self.min_rtt_ns.min(rtt_ns);
        }
        self.stats.srtt_ns = self.srtt_ns;
        self.stats.min_rtt_ns = self.min_rtt_ns;
    }

    /// Feeds the echoed per-path counters; returns (delivered, marked) since
    /// the last echo seen for this path.
    pub(crate) fn on_echo(&mut self, rx: u16, ce: u16) -> (u32, u32) {
        let d_rx = rx.wrapping_sub(self.echo_rx_seen);
        let d_ce = ce.wrapping_sub(self.echo_ce_seen);
        // A stale (reordered) ACK shows counters behind ours: ignore it.
        if d_rx > u16::MAX / 2 || d_ce > d_rx {
            return (0, 0);
        }
        self.echo_rx_seen = rx;
        self.echo_ce_seen = ce;
        if d_rx > 0 {
            let f = u32::from(d_ce) * ONE / u32::from(d_rx);
            // EWMA with gain 1/8 per echo.
            self.ecn_frac = self.ecn_frac - self.ecn_frac / 8 + f / 8;
            self.stats.ecn_permille = (self.ecn_frac * 1000 / ONE) as u16;
        }
        self.stats.ce_echoed += u32::from(d_ce);
        (u32::from(d_rx), u32::from(d_ce))
    }

    pub(crate) fn on_delivered(&mut self) {
        self.loss_frac -= self.loss_frac / 64;
        self.stats.loss_permille = (self.loss_frac * 1000 / ONE) as u16;
    }

    pub(crate) fn on_lost(&mut self) {
        self.loss_frac += (ONE - self.loss_frac) / 64;
        self.epoch_lost = self.epoch_lost.saturating_add(1);
        self.stats.lost += 1;
        self.stats.loss_permille = (self.loss_frac * 1000 / ONE) as u16;
    }

    /// Telemetry snapshot.
    pub fn stats(&self) -> PathStats {
        PathStats {
            in_flight: self.in_flight,
            entropy: self.entropy,
            ..self.stats
        }
    }

    fn reroll(&mut self, entropy: u16) {
        let rerolls = self.stats.rerolls + 1;
        let kept = self.stats;
        *self = Path {
            entropy,
            in_flight: self.in_flight,
            rx_count: self.rx_count,
            ce_count: self.ce_count,
            echo_rx_seen: self.echo_rx_seen,
            echo_ce_seen: self.echo_ce_seen,
            // Keep the RTT estimate as a prior: the new route is likely similar.
            srtt_ns: self.srtt_ns,
            rttvar_ns: self.rttvar_ns,
            min_rtt_ns: self.min_rtt_ns,
            ..Path::default()
        };
        self.stats = PathStats {
            rerolls,
            entropy,
            ecn_permille: 0,
            loss_permille: 0,
            ..kept
        };
    }
}

/// The paths of one connection.
#[derive(Debug, Clone)]
pub struct PathSet<const P: usize> {
    paths: [Path; P],
    /// Paths in use (negotiated), at most `P`.
    active: u16,
    next: u16,
    epoch_total: u32,
}

impl<const P: usize> PathSet<P> {
    /// `active` paths with entropy drawn from `[base, base + span)`.
    pub fn new(active: u16, base: u16, span: u16, rng: &mut Rng) -> Self {
        let mut set = PathSet {
            paths: [Path::default(); P],
            active: active.clamp(1, P as u16),
            next: 0,
            epoch_total: 0,
        };
        for i in 0..usize::from(set.active) {
            set.paths[i].entropy = set.draw_entropy(base, span, rng);
            set.paths[i].stats.entropy = set.paths[i].entropy;
        }
        set
    }

    fn draw_entropy(&self, base: u16, span: u16, rng: &mut Rng) -> u16 {
        // Distinct from the other paths' entropy so two paths never share a route by construction.
        for _ in 0..16 {
            let e = base.wrapping_add(rng.below(u32::from(span.max(1))) as u16);
            if !self.paths[..usize::from(self.active)]
                .iter()
                .any(|p| p.entropy == e)
            {
                return e;
            }
        }
        base.wrapping_add(rng.below(u32::from(span.max(1))) as u16)
    }

    /// Number of paths in use.
    pub fn active(&self) -> u16 {
        self.active
    }

    /// Path `i` (callers pass ids below `active`).
    pub fn get(&self, i: u8) -> &Path {
        &self.paths[usize::from(i) % P]
    }

    pub(crate) fn get_mut(&mut self, i: u8) -> &mut Path {
        &mut self.paths[usize::from(i) % P]
    }

    /// Paths in use.
    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.paths[..usize::from(self.active)].iter()
    }

    /// Packets in flight over every path (sent, neither delivered nor
    /// declared lost).
    pub(crate) fn in_flight_total(&self) -> u32 {
        self.iter().map(|p| u32::from(p.in_flight)).sum()
    }

    /// The path for the next packet: least in-flight per unit of weight,
    /// round-robin among equals so a loss-free fabric sees an even spray.
    pub fn choose(&mut self) -> u8 {
        let n = usize::from(self.active);
        let start = usize::from(self.next) % n;
        // Least (in_flight + 1) / weight, compared by cross-multiplication
        // (no division on the per-packet path).
        let mut best = start;
        let mut best_num = u64::MAX;
        let mut best_den = 1u64;
        let mut i = start;
        for _ in 0..n {
            let p = &self.paths[i];
            let num = u64::from(p.in_flight) + 1;
            let den = u64::from(p.weight().max(1));
            if num * best_den < best_num.saturating_mul(den) {
                best_num = num;
                best_den = den;
                best = i;
            }
            // Wrap without a division per path.
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.next = ((best + 1) % n) as u16;
        best as u8
    }

    /// Records a transmission on path `i`.
    pub(crate) fn on_sent(&mut self, i: u8, retransmission: bool) {
        let p = self.get_mut(i);
        p.in_flight = p.in_flight.saturating_add(1);
        p.epoch_sent = p.epoch_sent.saturating_add(1);
        p.stats.sent += 1;
        if retransmission {
            p.stats.retransmitted += 1;
        }
        self.epoch_total += 1;
    }

    /// Whether enough was sent since the last evaluation.
    pub(crate) fn epoch_due(&self, epoch_packets: u16) -> bool {
        self.epoch_total >= u32::from(epoch_packets) * u32::from(self.active)
    }

    /// Evaluates every path against its peers and re-draws the entropy of
    /// those persistently worse (spec 4.9.3). Returns how many were re-drawn.
    pub(crate) fn evaluate(&mut self, base: u16, span: u16, rng: &mut Rng) -> u32 {
        let n = usize::from(self.active);
        self.epoch_total = 0;
        if n < 2 {
            for p in &mut self.paths[..n] {
                p.epoch_sent = 0;
                p.epoch_lost = 0;
            }
            return 0;
        }
        let total_sent: u64 = self.paths[..n]
            .iter()
            .map(|p| u64::from(p.epoch_sent))
            .sum();
        let total_lost: u64 = self.paths[..n]
            .iter()
            .map(|p| u64::from(p.epoch_lost))
            .sum();
        let mut ecn_sorted = [0u32; 16];
        let sample = n.min(16);
        for (slot, p) in ecn_sorted.iter_mut().zip(self.paths[..sample].iter()) {
            *slot = p.ecn_frac;
        }
        ecn_sorted[..sample].sort_unstable();
        let ecn_median = ecn_sorted[sample / 2];
        let mut rerolled = 0;
        for i in 0..n {
            let (sent, lost) = (
                u64::from(self.paths[i].epoch_sent),
                u64::from(self.paths[i].epoch_lost),
            );
            let others_sent = total_sent - sent;
            let others_lost = total_lost - lost;
            // Loss excess: more losses than the other paths' rate predicts,
            // by more than 2 + 3 standard deviations (expected in 1/1024).
            // Loss excess: more losses than the other paths' rate predicts,
            // by more than 2 + 3 standard deviations (expected in 1/1024);
            // by more than 2 + 6 (and at least 6 losses) counts twice.
            let (loss_bad, loss_gross) = if sent >= 8 && others_sent > 0 && lost >= 4 {
                let expected_k = sent * others_lost * 1024 / others_sent;
                let excess_k = (lost * 1024).saturating_sub(expected_k);
                let e = excess_k.saturating_sub(2048);
                // e^2 > k^2 * expected (both sides scaled by 1024^2)
                let sigmas_sq = |k: u64| excess_k > 2048 && e * e > k * k * expected_k * 1024;
                (sigmas_sq(3), lost >= 6 && sigmas_sq(6))
            } else {
                (false, false)
            };
            let ecn_bad = self.paths[i].ecn_frac > ecn_median.saturating_mul(2) + ONE / 10;
            let p = &mut self.paths[i];
            // A path judged on too few packets keeps counting into the next
            // epoch (the weighting may have steered traffic off it).
            let judged = sent >= 16 || loss_bad;
            if loss_gross {
                p.strikes += 2;
            } else if loss_bad || ecn_bad {
                p.strikes += 1;
            } else if judged {
                p.strikes = 0;
            }
            if judged {
                p.epoch_sent = 0;
                p.epoch_lost = 0;
            }
            if p.strikes >= 2 {
                let e = self.draw_entropy(base, span, rng);
                self.paths[i].reroll(e);
                rerolled += 1;
            }
        }
        rerolled
    }
}
