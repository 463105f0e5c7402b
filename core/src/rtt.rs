//! Round-trip time estimation (RFC 6298 smoothing), the one estimator used
//! for the connection and for each path.

/// Smoothed RTT, its variation and the minimum seen, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RttEstimator {
    srtt_ns: u32,
    rttvar_ns: u32,
    min_ns: u32,
}

impl RttEstimator {
    /// An estimator that starts from another's state (a new path inherits
    /// the connection's estimate as a prior).
    pub const fn seeded(srtt_ns: u32, rttvar_ns: u32) -> RttEstimator {
        RttEstimator {
            srtt_ns,
            rttvar_ns,
            min_ns: 0,
        }
    }

    /// Takes one sample.
    pub fn on_sample(&mut self, rtt_ns: u32) {
        let rtt_ns = rtt_ns.max(1);
        if self.srtt_ns == 0 {
            self.srtt_ns = rtt_ns;
            self.rttvar_ns = rtt_ns / 2;
        } else {
            let diff = self.srtt_ns.abs_diff(rtt_ns);
            self.rttvar_ns = self.rttvar_ns - self.rttvar_ns / 4 + diff / 4;
            self.srtt_ns = self.srtt_ns - self.srtt_ns / 8 + rtt_ns / 8;
        }
        self.min_ns = if self.min_ns == 0 {
            rtt_ns
        } else {
            self.min_ns.min(rtt_ns)
        };
    }

    /// Whether any sample was taken (or a prior given).
    pub const fn has_estimate(&self) -> bool {
        self.srtt_ns != 0
    }

    /// Smoothed RTT; 0 before the first sample.
    pub const fn srtt_ns(&self) -> u32 {
        self.srtt_ns
    }

    /// RTT variation; 0 before the first sample.
    pub const fn rttvar_ns(&self) -> u32 {
        self.rttvar_ns
    }

    /// Smallest sample; 0 before the first.
    pub const fn min_ns(&self) -> u32 {
        self.min_ns
    }

    /// `srtt + 4 * rttvar`, the RFC 6298 timeout before bounds and backoff.
    pub const fn timeout_ns(&self) -> u32 {
        self.srtt_ns
            .saturating_add(self.rttvar_ns.saturating_mul(4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_then_smoothing() {
        let mut r = RttEstimator::default();
        assert!(!r.has_estimate());
        r.on_sample(8_000);
        assert_eq!(
            (r.srtt_ns(), r.rttvar_ns(), r.min_ns()),
            (8_000, 4_000, 8_000)
        );
        r.on_sample(16_000);
        assert_eq!(r.srtt_ns(), 9_000);
        assert_eq!(r.rttvar_ns(), 5_000);
        assert_eq!(r.min_ns(), 8_000);
        assert_eq!(r.timeout_ns(), 29_000);
    }
}
