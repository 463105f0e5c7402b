//! Path telemetry as exported (spec 4.9.1).
//!
//! A connection spreads its packets over logical paths, each a distinct
//! UDP source port (entropy) that ECMP hashes onto its own route. The
//! measurements live in the connection's pooled sender state while it
//! sends ([`crate::conn::PathSender`]); this module is the snapshot the
//! application reads.

use crate::conn::sender::ONE;
use crate::conn::PathSender;

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
    pub in_flight: u32,
    /// Echoed marked fraction, per mille.
    pub ecn_permille: u16,
    /// Loss estimate, per mille.
    pub loss_permille: u16,
}

impl PathStats {
    pub(crate) fn from_parts(entropy: u16, p: &PathSender) -> PathStats {
        PathStats {
            entropy,
            sent: p.sent,
            retransmitted: p.retransmitted,
            spurious: p.spurious,
            acked: p.acked,
            lost: p.lost,
            ce_echoed: p.ce_echoed,
            rerolls: p.rerolls,
            srtt_ns: p.rtt.srtt_ns(),
            min_rtt_ns: p.rtt.min_ns(),
            in_flight: p.in_flight,
            ecn_permille: (u64::from(p.ecn_frac) * 1000 / u64::from(ONE)) as u16,
            loss_permille: (u64::from(p.loss_frac) * 1000 / u64::from(ONE)) as u16,
        }
    }
}
