//! The state a connection holds only while it sends (spec 4.4 - 4.6, 4.9,
//! 4.10): per-path telemetry, the congestion controller, recovery timers,
//! and the in-flight records of its window. It comes from endpoint-wide
//! pools when the connection has data to send and goes back once it has
//! been idle for a while, so an idle connection costs only its fixed part.
//!
//! The in-flight records of a window are a ring indexed by PSN, and two
//! lists run through them so that no per-ACK step scans the window, which
//! may hold tens of thousands of PSNs (spec 4.4): the **outstanding** list
//! holds the packets in flight (sent, neither acknowledged nor declared
//! lost) in the order they were sent, oldest first, so RACK (spec 4.6.2)
//! looks only at packets old enough to be judged, as Linux's RACK walks
//! its send-time ordered queue; the **lost** list holds the packets
//! declared lost and not yet resent, in the order they were declared.

use super::paths::PathIndex;
use crate::cc::Controller;
use crate::config::Config;
use crate::psn::Psn;
use crate::rtt::RttEstimator;
use crate::storage::buddy::{order_for, Buddy, BuddyNode, Extent};
use crate::time::{Instant, MaybeInstant};
use core::ops::DerefMut;

/// Fixed-point one (Q16) for fractions.
pub(crate) const ONE: u32 = 1 << 16;
/// Full weight of a healthy path.
const FULL_WEIGHT: u32 = 1024;

/// Sender-side telemetry of one logical path (spec 4.9.1).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathSender {
    pub(crate) rtt: RttEstimator,
    /// Send timestamp of the latest-sent packet delivered on this path (RACK).
    pub(crate) rack_xmit_ts: u32,
    pub(crate) rack_valid: bool,
    /// Packets of this path were seen to arrive out of the order they were
    /// sent (a first transmission delivered after a later one of the path,
    /// or a spurious retransmission): its reordering allowance is then
    /// RACK's quarter round trip, and nothing before (spec 4.6.2).
    pub(crate) reordering_seen: bool,
    /// The echoed receiver counters were seen at least once since this
    /// state was set up (the first echo is the baseline, not a delta).
    pub(crate) echo_valid: bool,
    pub(crate) strikes: u8,
    pub(crate) in_flight: u32,
    /// Echoed marked fraction and loss estimate, Q16.
    pub(crate) ecn_frac: u32,
    pub(crate) loss_frac: u32,
    pub(crate) echo_rx_seen: u16,
    pub(crate) echo_ce_seen: u16,
    pub(crate) epoch_sent: u16,
    pub(crate) epoch_lost: u16,
    pub(crate) sent: u32,
    pub(crate) retransmitted: u32,
    pub(crate) spurious: u32,
    pub(crate) acked: u32,
    pub(crate) lost: u32,
    pub(crate) ce_echoed: u32,
    pub(crate) rerolls: u32,
}

impl PathSender {
    pub(crate) const IDLE: PathSender = PathSender {
        rtt: RttEstimator::seeded(0, 0),
        rack_xmit_ts: 0,
        rack_valid: false,
        reordering_seen: false,
        echo_valid: false,
        strikes: 0,
        in_flight: 0,
        ecn_frac: 0,
        loss_frac: 0,
        echo_rx_seen: 0,
        echo_ce_seen: 0,
        epoch_sent: 0,
        epoch_lost: 0,
        sent: 0,
        retransmitted: 0,
        spurious: 0,
        acked: 0,
        lost: 0,
        ce_echoed: 0,
        rerolls: 0,
    };

    /// The reordering allowance on evidence from this path itself (spec
    /// 4.6.2), for its round-trip estimate `rtt` and variation `var`: as
    /// RFC 8985 for a connection, none while the path has shown no
    /// reordering (one path follows one route, in order), a quarter
    /// round trip plus the variation once it has.
    pub(crate) fn same_path_allowance(&self, rtt: u32, var: u32) -> u32 {
        if self.reordering_seen {
            rtt / 4 + var
        } else {
            0
        }
    }

    /// Weight for the path choice: marks and losses shift traffic away.
    #[inline]
    pub(crate) fn weight(&self) -> u32 {
        let penalty = (self.ecn_frac / 2 + self.loss_frac * 4).min(ONE * 7 / 8);
        FULL_WEIGHT * (ONE - penalty) / ONE
    }

    /// Feeds the echoed per-path counters; returns (delivered, marked) since
    /// the last echo seen for this path.
    pub(crate) fn on_echo(&mut self, rx: u16, ce: u16) -> (u32, u32) {
        if !self.echo_valid {
            self.echo_valid = true;
            self.echo_rx_seen = rx;
            self.echo_ce_seen = ce;
            return (0, 0);
        }
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
        }
        self.ce_echoed += u32::from(d_ce);
        (u32::from(d_rx), u32::from(d_ce))
    }

    pub(crate) fn on_delivered(&mut self) {
        self.loss_frac -= self.loss_frac / 64;
        self.acked += 1;
    }

    pub(crate) fn on_lost(&mut self) {
        self.loss_frac += (ONE - self.loss_frac) / 64;
        self.epoch_lost = self.epoch_lost.saturating_add(1);
        self.lost += 1;
    }

    /// New entropy: a fresh start, keeping the RTT estimate as a prior and
    /// the echo baseline (the receiver's counters for this path id go on).
    pub(crate) fn reroll(&mut self) {
        *self = PathSender {
            rtt: RttEstimator::seeded(self.rtt.srtt_ns(), self.rtt.rttvar_ns()),
            in_flight: self.in_flight,
            echo_valid: self.echo_valid,
            echo_rx_seen: self.echo_rx_seen,
            echo_ce_seen: self.echo_ce_seen,
            sent: self.sent,
            retransmitted: self.retransmitted,
            spurious: self.spurious,
            acked: self.acked,
            lost: self.lost,
            ce_echoed: self.ce_echoed,
            rerolls: self.rerolls + 1,
            ..PathSender::IDLE
        };
    }
}

/// Everything a sending connection needs beyond its fixed part.
#[derive(Debug, Clone, Copy)]
pub struct SenderState<const P: usize> {
    /// Every path's telemetry; changed through [`SenderState::path_mut`]
    /// (and the other `SenderState` methods), which keep `index` current.
    pub(crate) paths: [PathSender; P],
    /// What the per-packet path reads of the paths, kept current.
    pub(crate) index: PathIndex<P>,
    pub(crate) cc: Controller,
    /// The in-flight records of the window, if any are allocated.
    pub(crate) extent: Option<Extent>,
    /// Packets in flight, oldest transmission first.
    pub(crate) outstanding: RecordList,
    /// Packets declared lost and not yet retransmitted.
    pub(crate) lost: RecordList,
    /// Start-up window, bytes (spec 4.10.6).
    pub(crate) startup_window: u32,
    pub(crate) next_send_at: Instant,
    pub(crate) rnr_until: Instant,
    pub(crate) rto_deadline: MaybeInstant,
    pub(crate) rack_deadline: MaybeInstant,
    /// When a tail-loss probe goes out if nothing is heard (spec 4.6.5).
    pub(crate) probe_deadline: MaybeInstant,
    pub(crate) rto_backoff: u8,
    /// Probes sent since the last progress.
    pub(crate) probes: u8,
    /// The last progress: when new data was last acknowledged, or when
    /// something was sent with nothing outstanding. The connection fails
    /// once retransmissions have gone its ride-through without any (spec
    /// 4.6.4).
    pub(crate) progress_at: Instant,
    pub(crate) rate_hint_mbps: u32,
    pub(crate) next_path: u16,
    pub(crate) epoch_total: u32,
    /// When the connection last had nothing in flight and nothing to send.
    pub(crate) idle_since: MaybeInstant,
}

/// The first flight a Rate Grant of `grant_mbps` allows: one data-centre
/// round trip (`initial_window_rtt`) of it (spec 4.10.6), in bytes. In
/// nanoseconds, 64-bit: `Duration` arithmetic is firmware code.
#[inline]
pub(crate) fn granted_window(grant_mbps: u32, config: &Config) -> u32 {
    (u64::from(grant_mbps) * config.initial_window_rtt.as_nanos() as u64 / 8_000)
        .min(u64::from(u32::MAX)) as u32
}

impl<const P: usize> SenderState<P> {
    /// A placeholder for free pool slots.
    pub const VACANT: SenderState<P> = SenderState {
        paths: [PathSender::IDLE; P],
        index: PathIndex::EMPTY,
        cc: Controller::Fixed(crate::cc::FixedRate::new(0)),
        extent: None,
        outstanding: RecordList::EMPTY,
        lost: RecordList::EMPTY,
        startup_window: 0,
        next_send_at: Instant::ZERO,
        rnr_until: Instant::ZERO,
        rto_deadline: MaybeInstant::NONE,
        rack_deadline: MaybeInstant::NONE,
        probe_deadline: MaybeInstant::NONE,
        rto_backoff: 0,
        probes: 0,
        progress_at: Instant::ZERO,
        rate_hint_mbps: 0,
        next_path: 0,
        epoch_total: 0,
        idle_since: MaybeInstant::NONE,
    };

    /// A fresh sender: line rate, the start-up window, every path seeded
    /// with the connection's RTT estimate. `first`: `Some` when the
    /// connection never had a sender state, so the receiver's per-path echo
    /// counters start from zero (otherwise the first echo of each path is
    /// only a baseline), with the ACCEPT's Rate Grant (0: none). A grant is the share of the
    /// receiver's link this sender starts at, and its first flight one
    /// data-centre bandwidth-delay product of that share (spec 4.10.6).
    /// `active`: the connection's paths.
    pub(crate) fn new(
        config: &Config,
        now: Instant,
        prior: RttEstimator,
        first: Option<u32>,
        active: u16,
    ) -> Self {
        let path = PathSender {
            rtt: RttEstimator::seeded(prior.srtt_ns(), prior.rttvar_ns()),
            echo_valid: first.is_some(),
            ..PathSender::IDLE
        };
        let grant = first.unwrap_or(0);
        let paths = [path; P];
        let mut index = PathIndex::EMPTY;
        index.rebuild_recovery(&paths, usize::from(active));
        SenderState {
            paths,
            index,
            cc: Controller::new(config),
            startup_window: if config.initial_window_bytes == 0 {
                u32::MAX
            } else if crate::config::GRANTS && grant > 0 {
                granted_window(grant, config)
            } else {
                config.initial_window_bytes
            },
            rate_hint_mbps: grant,
            next_send_at: now,
            ..Self::VACANT
        }
    }

    /// Packets in flight (on every path): the outstanding list's length.
    pub(crate) fn in_flight_total(&self) -> u32 {
        self.outstanding.len
    }

    /// Packets declared lost and not yet resent.
    pub(crate) fn lost_pending(&self) -> u32 {
        self.lost.len
    }

    /// The path for the next packet (spec 4.9.1): least in-flight times
    /// delay per unit of weight, round-robin among equals so a loss-free
    /// fabric sees an even spray. `min_rtt_ns`: the connection's minimum
    /// round trip, the unqueued delay.
    ///
    /// Each path's cost is `(in_flight + 1) x delay / weight` with `delay`
    /// the unqueued round trip plus three times the path's queueing
    /// (smoothed RTT above the minimum). In-flight alone gives a path a
    /// rate inverse to its RTT, too weak a pull off a shared queue:
    /// entropies that hash onto the same spine overload it while others
    /// idle (loss-free permutation: p99 1.26x -> 1.22x of the floor). The
    /// queueing counts up to two minimum RTTs, so a path steered off still
    /// gets packets and its estimate stays current (uncapped, starved
    /// paths kept stale estimates: at 10 % loss p99 reached 2.7x p50; a
    /// cap of one let a hot spine keep more than its share: keyed loss-free
    /// permutation p99 1.151x -> 1.131x of the floor with two).
    /// Only on a path losing under 1/16 of its packets: under heavy loss,
    /// steering by noisy RTTs starves paths of the later packets their
    /// losses are detected by and ends more flows on probes (10 % loss, 16
    /// seeds: mean p99 1.84x of the floor ungated, 1.70x gated, 1.77x
    /// before). The costs and the choice among them are kept by
    /// [`PathIndex`]: a few comparisons per packet, not a scan.
    pub(crate) fn choose_path(&mut self, active: u16, min_rtt_ns: u32) -> u8 {
        let n = usize::from(active.max(1));
        // `next_path` is below `n` unless the path count shrank: no
        // division on the per-packet path.
        let next = usize::from(self.next_path);
        let start = if next < n { next } else { next % n };
        // The unqueued round trip; at least 1 ns (| 1), so that before any
        // sample the delays are 1 to 4 ns and in-flight decides.
        let base = u64::from(min_rtt_ns | 1);
        let best = self.index.choose(&self.paths, n, base, start);
        self.next_path = if best + 1 == n { 0 } else { best + 1 } as u16;
        best as u8
    }

    /// Path `i`'s telemetry, to change what its cost is made of
    /// (in-flight count, loss and marking estimates).
    #[inline]
    pub(crate) fn path_mut(&mut self, i: usize) -> &mut PathSender {
        self.index.touch(i);
        &mut self.paths[i % P]
    }

    /// Path `i` took the RTT sample `rtt` (nanoseconds).
    #[inline]
    pub(crate) fn on_rtt_sample(&mut self, i: usize, rtt: u32) {
        let i = i % P;
        self.paths[i].rtt.on_sample(rtt);
        self.index.on_rtt(&self.paths, i);
    }

    /// Path `i` was seen to deliver out of the order it was sent.
    #[inline]
    pub(crate) fn note_reordering(&mut self, i: usize) {
        let i = i % P;
        if !self.paths[i].reordering_seen {
            self.paths[i].reordering_seen = true;
            self.index.on_reordering(&self.paths, i);
        }
    }

    /// Records a transmission on path `i` (inlined: its one caller is the
    /// send path, and out of line it costs firmware code).
    #[inline(always)]
    pub(crate) fn on_sent(&mut self, i: u8, retransmission: bool) {
        let p = self.path_mut(usize::from(i));
        p.in_flight += 1;
        p.epoch_sent = p.epoch_sent.saturating_add(1);
        p.sent += 1;
        if retransmission {
            p.retransmitted += 1;
        }
        self.epoch_total += 1;
    }
}

/// State of one PSN of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Acknowledged cumulatively (or never used).
    Free = 0,
    InFlight = 1,
    /// Selectively acknowledged.
    Acked = 2,
    /// Declared lost, waiting for its retransmission.
    Lost = 3,
}

/// One PSN's sender record: 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InflightRecord {
    pub(crate) sent_ts: u32,
    pub(crate) path: u8,
    /// Low 2 bits: [`Slot`]; high 6 bits: transmissions (saturating).
    pub(crate) meta: u8,
    /// Neighbours in the list the record is on (the outstanding list while
    /// in flight, the lost list while lost), as the low 16 bits of their
    /// PSNs: every PSN on a list lies within 65,536 of the cumulative ACK
    /// (the window's bound), which restores the rest, and a list survives
    /// the extent growing because it names PSNs, not places.
    pub(crate) prev: u16,
    pub(crate) next: u16,
}

impl InflightRecord {
    pub const EMPTY: InflightRecord = InflightRecord {
        sent_ts: 0,
        path: 0,
        meta: 0,
        prev: 0,
        next: 0,
    };

    pub(crate) fn slot(self) -> Slot {
        match self.meta & 3 {
            1 => Slot::InFlight,
            2 => Slot::Acked,
            3 => Slot::Lost,
            _ => Slot::Free,
        }
    }

    pub(crate) fn transmissions(self) -> u8 {
        self.meta >> 2
    }

    pub(crate) fn set_slot(&mut self, s: Slot) {
        self.meta = (self.meta & !3) | s as u8;
    }
}

/// A doubly linked list of in-flight records (by PSN) of one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordList {
    pub head: Psn,
    pub tail: Psn,
    pub len: u32,
}

impl RecordList {
    pub const EMPTY: RecordList = RecordList {
        head: Psn(0),
        tail: Psn(0),
        len: 0,
    };

    /// The first record's PSN.
    pub fn front(&self) -> Option<Psn> {
        (self.len > 0).then_some(self.head)
    }
}

/// The PSN a 16-bit link names: the one within 65,536 at or after `una`.
#[inline]
fn linked(una: Psn, link: u16) -> Psn {
    una + u32::from(link.wrapping_sub(una.get() as u16))
}

/// The endpoint-wide in-flight records and their allocator.
#[derive(Debug)]
pub struct InflightPool<R, N> {
    records: R,
    buddy: Buddy<N>,
}

impl<R, N> InflightPool<R, N>
where
    R: DerefMut<Target = [InflightRecord]>,
    N: DerefMut<Target = [BuddyNode]>,
{
    /// `records` must hold `nodes.len() << MIN_SHIFT` records.
    pub fn new(records: R, nodes: N) -> Self {
        debug_assert!(records.len() >= nodes.len() << crate::storage::buddy::MIN_SHIFT);
        InflightPool {
            records,
            buddy: Buddy::new(nodes),
        }
    }

    /// Records not in use.
    pub fn free_records(&self) -> u64 {
        self.buddy.free_units()
    }

    /// Records managed.
    pub fn total_records(&self) -> u64 {
        self.buddy.total_units()
    }

    /// An extent of at least `records` records, cleared.
    pub(crate) fn allocate(&mut self, records: u32) -> Option<Extent> {
        let e = self.buddy.allocate(order_for(records))?;
        self.records[e.first_unit()..e.first_unit() + e.units() as usize]
            .fill(InflightRecord::EMPTY);
        Some(e)
    }

    pub(crate) fn release(&mut self, e: Extent) {
        self.buddy.release(e);
    }

    #[inline]
    fn index(e: Extent, psn: Psn) -> usize {
        e.first_unit() + (psn.get() & (e.units() - 1)) as usize
    }

    #[inline]
    pub(crate) fn get(&self, e: Extent, psn: Psn) -> InflightRecord {
        self.records[Self::index(e, psn)]
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, e: Extent, psn: Psn) -> &mut InflightRecord {
        &mut self.records[Self::index(e, psn)]
    }

    /// Appends PSN `psn`'s record to `list`.
    pub(crate) fn push_back(&mut self, list: &mut RecordList, e: Extent, psn: Psn) {
        if list.len == 0 {
            list.head = psn;
        } else {
            let tail = list.tail;
            self.get_mut(e, tail).next = psn.get() as u16;
            self.get_mut(e, psn).prev = tail.get() as u16;
        }
        list.tail = psn;
        list.len += 1;
    }

    /// Takes PSN `psn`'s record off `list` (it must be on it).
    pub(crate) fn unlink(&mut self, list: &mut RecordList, e: Extent, una: Psn, psn: Psn) {
        let r = self.get(e, psn);
        match (list.head == psn, list.tail == psn) {
            (true, true) => {}
            (true, false) => list.head = linked(una, r.next),
            (false, true) => list.tail = linked(una, r.prev),
            (false, false) => {
                self.get_mut(e, linked(una, r.prev)).next = r.next;
                self.get_mut(e, linked(una, r.next)).prev = r.prev;
            }
        }
        list.len -= 1;
    }

    /// The PSN after `psn` on `list`, if `psn` is not its last.
    pub(crate) fn next_on(&self, list: &RecordList, e: Extent, una: Psn, psn: Psn) -> Option<Psn> {
        (list.len > 0 && list.tail != psn).then(|| linked(una, self.get(e, psn).next))
    }

    /// Moves the records of `[una, nxt)` from `old` into a new extent of at
    /// least `records` records; releases `old`. `None` (and `old` kept) when
    /// no extent is free.
    pub(crate) fn grow(&mut self, old: Extent, una: Psn, nxt: Psn, records: u32) -> Option<Extent> {
        let new = self.allocate(records)?;
        let mut psn = una;
        while psn != nxt {
            let r = self.get(old, psn);
            *self.get_mut(new, psn) = r;
            psn = psn.next();
        }
        self.release(old);
        Some(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender whose path 0 has smoothed RTT `rtt0_ns`, the others
    /// `rtt_ns`, every path losing `loss_frac`.
    fn sender_with_rtts(rtt0_ns: u32, rtt_ns: u32, loss_frac: u32) -> SenderState<4> {
        let config = Config::default();
        let mut st =
            SenderState::<4>::new(&config, Instant::ZERO, RttEstimator::default(), Some(0), 4);
        for i in 0..4 {
            st.on_rtt_sample(i, if i == 0 { rtt0_ns } else { rtt_ns });
            st.path_mut(i).loss_frac = loss_frac;
        }
        st
    }

    /// Packets per path of 64 sent with minimum RTT `min_rtt_ns`.
    fn spray(st: &mut SenderState<4>, min_rtt_ns: u32) -> [u32; 4] {
        let mut sent = [0u32; 4];
        for _ in 0..64 {
            let i = st.choose_path(4, min_rtt_ns);
            st.on_sent(i, false);
            sent[usize::from(i)] += 1;
        }
        sent
    }

    /// A path whose round trip carries a queue gets less of the spray than
    /// in-flight balancing alone gives it (spec 4.9.1).
    #[test]
    fn queued_path_gets_less_of_the_spray() {
        // Unqueued round trip 6 us; path 0's smoothed RTT is 9 us (3 us of
        // queue), as when two entropies share a congested spine.
        let sent = spray(&mut sender_with_rtts(9_000, 6_000, 0), 6_000);
        // In-flight alone: 16 each. With the queue counted three times
        // the queued path's delay is 15 us against 6 us.
        assert!(sent[0] <= 10, "{sent:?}");
        assert!(sent[1..].iter().all(|&c| c >= 17), "{sent:?}");
        // A path that looked badly queued (60 us) counts its queue as two
        // minimum RTTs at most: it still gets packets, so a stale estimate
        // is renewed (uncapped, its delay would be 168 us, not 42 us).
        let sent = spray(&mut sender_with_rtts(60_000, 6_000, 0), 6_000);
        assert!(sent[0] >= 3, "{sent:?}");
        // On paths losing 1/16 or more, RTTs do not steer: all lose 10 %
        // here and path 0's queue is ignored, so the spray stays even.
        let sent = spray(&mut sender_with_rtts(9_000, 6_000, ONE / 10), 6_000);
        assert_eq!(sent, [16; 4]);
        // Equal round trips still spray evenly.
        let config = Config::default();
        let mut st =
            SenderState::<4>::new(&config, Instant::ZERO, RttEstimator::default(), Some(0), 4);
        assert_eq!(spray(&mut st, 0), [16; 4]);
    }
}
