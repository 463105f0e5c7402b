//! Acknowledgements and loss recovery (spec 4.6): cumulative and selective
//! ACKs, per-path RACK loss detection that never takes multipath skew for
//! loss, retransmission timeouts with backoff, NAKs, and the path
//! telemetry and re-draws fed by the echoes (spec 4.9).

use core::time::Duration;

use super::recv::status_of;
use super::sender::{SenderState, Slot, ONE};
use super::{Blame, Connection, Inflight, RecvPools, SendPools};
use crate::cc::CongestionControl;
use crate::config::Config;
use crate::psn::Psn;
use crate::rng::Rng;
use crate::storage::buddy::Extent;
use crate::storage::Backing;
use crate::time::{duration_nanos, Instant, MaybeInstant};
use crate::wire::{AckRepr, NakReason, NakRepr};

impl<const P: usize> Connection<P> {
    pub(crate) fn on_ack<B: Backing>(
        &mut self,
        now: Instant,
        ack: &AckRepr,
        send: &mut SendPools<B, P>,
        rng: &mut Rng,
        config: &Config,
    ) {
        self.counters.acks_received += 1;
        let span = self.send.nxt.distance_from(self.send.una);
        let cum = Psn(ack.cumulative);
        let cum_ahead = cum.offset_from(self.send.una);
        if cum_ahead > span as i32 {
            self.counters.invalid_acks += 1;
            return;
        }
        // RTT sample from the echoed timestamp (spec 3.2.3): the
        // connection's estimate exists even while no sender state does.
        // Only an echo of a PSN we sent gives one (spec 4.5).
        let sent = self.send.nxt.distance_from(self.send.initial);
        let rtt_sample = {
            let rtt = now.wire_timestamp().wrapping_sub(ack.echo_timestamp);
            let ours = Psn(ack.echo_psn).is_within(self.send.initial, sent);
            (rtt < 1_000_000_000 && ack.echo_path < self.params.paths && ours).then_some(rtt)
        };
        if let Some(rtt) = rtt_sample {
            self.send.rtt.on_sample(rtt);
        }
        let Some(s) = self.send.state.get() else {
            return;
        };
        // The sender state is changed where it lies, beside the in-flight
        // records: borrowed apart, not copied out and back (it holds every
        // path's telemetry).
        let SendPools {
            senders, inflight, ..
        } = send;
        let st = senders.get_mut(s);
        let Some(extent) = st.extent else {
            if let Some(rtt) = rtt_sample {
                st.on_rtt_sample(usize::from(ack.echo_path), rtt);
            }
            return;
        };
        // Spurious retransmission: the echoed transmission is an earlier one
        // than the latest we sent for that PSN (spec 4.6.2).
        let echo = Psn(ack.echo_psn);
        if echo.is_within(self.send.una, span) {
            let r = inflight.get(extent, echo);
            if r.transmissions() > 1 && r.sent_ts != ack.echo_timestamp {
                self.counters.spurious_retransmissions += 1;
                st.paths[usize::from(r.path) % P].spurious += 1;
                // The loss was misjudged: the path that delivered the
                // original late (the echoed one) reorders.
                st.note_reordering(usize::from(ack.echo_path));
            }
        }
        let una = self.send.una;
        let mut newly = 0u32;
        if cum_ahead > 0 {
            let mut psn = una;
            while psn != cum {
                newly += self.deliver::<B>(st, inflight, extent, una, psn);
                inflight.get_mut(extent, psn).set_slot(Slot::Free);
                psn = psn.next();
            }
        }
        // The SACK block (spec 3.6): PSNs from `sack_base`; bits for PSNs
        // not sent are ignored, and those before C_s are free already.
        let base = Psn(ack.sack_base());
        for i in ack.sack.iter_set() {
            let psn = base + i as u32;
            if psn.is_within(una, span) {
                newly += self.deliver::<B>(st, inflight, extent, una, psn);
            }
        }
        if cum_ahead > 0 {
            self.send.una = cum;
        }
        if let Some(rtt) = rtt_sample {
            let i = usize::from(ack.echo_path);
            st.on_rtt_sample(i, rtt);
            let (delivered, marked) = st.path_mut(i).on_echo(ack.path_rx_count, ack.path_ce_count);
            let sent_at = now.minus_nanos(u64::from(rtt));
            let ceiling = if st.rate_hint_mbps == 0 {
                u32::MAX
            } else {
                st.rate_hint_mbps
            };
            st.cc.on_delivery(now, delivered, marked, sent_at, ceiling);
        }
        // The latest hint wins (ACKs are rarely reordered, and a stale
        // hint is corrected by the next ACK).
        st.rate_hint_mbps = ack.rate_hint_mbps;
        // The hint names this sender's share: from then on the start-up
        // window is at least the share's bandwidth-delay product (spec
        // 4.10.6), so a sender alone at its receiver sends at line rate
        // from its second round trip instead of doubling from 16 KiB for
        // four more (loss-free permutation: p50 410 -> 396 us).
        if ack.rate_hint_mbps > 0 {
            let share_bdp =
                u64::from(ack.rate_hint_mbps) * u64::from(self.send.rtt.min_ns()) / 8_000;
            st.startup_window = st
                .startup_window
                .max(share_bdp.min(u64::from(u32::MAX)) as u32);
        }
        if newly > 0 {
            let growth = startup_growth(self.send.rtt.min_ns(), config);
            st.startup_window = st.startup_window.saturating_add(
                newly
                    .saturating_mul(u32::from(self.params.mtu))
                    .saturating_mul(growth),
            );
            st.rto_backoff = 0;
            st.progress_at = now;
            st.rto_deadline = if self.send.una == self.send.nxt {
                MaybeInstant::NONE
            } else {
                MaybeInstant::some(self.rto_deadline(now, st, config))
            };
            st.probes = 0;
            self.arm_probe(now, st, config);
        }
        self.detect_losses::<B>(now, st, inflight, extent);
        if config.path_reroll
            && st.epoch_total >= u32::from(config.path_epoch_packets) * u32::from(self.params.paths)
        {
            let n = self.evaluate_paths(st, config, rng);
            self.counters.path_rerolls += n;
        }
    }

    /// Marks PSN `psn`'s record delivered, taking it off its list; returns
    /// 1 if it was not already. `una`: the window's start before this ACK.
    fn deliver<B: Backing>(
        &mut self,
        st: &mut SenderState<P>,
        inflight: &mut Inflight<B>,
        extent: Extent,
        una: Psn,
        psn: Psn,
    ) -> u32 {
        let r = inflight.get(extent, psn);
        let state = r.slot();
        if matches!(state, Slot::Acked | Slot::Free) {
            return 0;
        }
        let i = usize::from(r.path) % P;
        if state == Slot::InFlight {
            inflight.unlink(&mut st.outstanding, extent, una, psn);
        } else {
            // Declared lost but it arrived: not retransmitted yet, so cancel.
            inflight.unlink(&mut st.lost, extent, una, psn);
        }
        let path = st.path_mut(i);
        if state == Slot::InFlight {
            path.in_flight = path.in_flight.saturating_sub(1);
        }
        path.on_delivered();
        // A first transmission delivered after a later one of its own path
        // (or after it was declared lost): the path reorders.
        let reorders = (r.transmissions() == 1
            && path.rack_valid
            && Psn(r.sent_ts).offset_from(Psn(path.rack_xmit_ts)) < 0)
            || (state == Slot::Lost && r.transmissions() == 1);
        let newest = !path.rack_valid || Psn(r.sent_ts).offset_from(Psn(path.rack_xmit_ts)) > 0;
        if newest {
            path.rack_xmit_ts = r.sent_ts;
            path.rack_valid = true;
            st.index.on_rack(i, r.sent_ts);
        }
        if reorders {
            st.note_reordering(i);
        }
        inflight.get_mut(extent, psn).set_slot(Slot::Acked);
        self.counters.packets_acked += 1;
        1
    }

    /// The retransmission timeout in nanoseconds (spec 4.6.4): the slowest
    /// path decides, since a packet on it is not late until its own round
    /// trip passed. 64-bit nanoseconds, not `Duration`: this runs per
    /// packet and is firmware code.
    pub(crate) fn rto_ns(&self, st: &mut SenderState<P>, config: &Config) -> u64 {
        let base = if self.send.rtt.has_estimate() {
            st.index.sync(&st.paths, usize::from(self.params.paths));
            let slowest = st
                .index
                .slowest_timeout(&st.paths, usize::from(self.params.paths))
                .max(self.send.rtt.timeout_ns());
            u64::from(slowest).max(duration_nanos(config.rto_min))
        } else {
            duration_nanos(config.rto_initial)
        };
        (base << st.rto_backoff.min(16)).min(duration_nanos(config.rto_max))
    }

    /// When the retransmission timer armed `now` expires.
    pub(crate) fn rto_deadline(
        &self,
        now: Instant,
        st: &mut SenderState<P>,
        config: &Config,
    ) -> Instant {
        now.plus_nanos(self.rto_ns(st, config))
    }

    /// Arms the tail-loss probe (spec 4.6.5) while packets are
    /// outstanding: `2 x srtt + ack_delay` from now, at least `rto_min /
    /// 8` (`rto_min / 2` before any data was acknowledged), doubled per
    /// probe already sent without progress, and never after the
    /// retransmission timer, whose expiry a probe then replaces (up to
    /// [`MAX_PROBES`] times).
    pub(crate) fn arm_probe(&self, now: Instant, st: &mut SenderState<P>, config: &Config) {
        st.probe_deadline = MaybeInstant::NONE;
        if self.send.una == self.send.nxt || st.probes >= MAX_PROBES {
            return;
        }
        // Until an ACK of data was heard the round-trip estimate knows
        // nothing of the queues data meets (an incast's first ACKs come
        // many handshake round trips late): half the minimum RTO then.
        // In nanoseconds, 64-bit: Duration arithmetic costs firmware code.
        let shift = if self.counters.packets_acked == 0 {
            1
        } else {
            3
        };
        let floor = config.rto_min.as_nanos() as u64 >> shift;
        let srtt = u64::from(self.send.rtt.srtt_ns());
        let pto = (2 * srtt + config.ack_delay.as_nanos() as u64).max(floor) << st.probes;
        let at = now.plus_nanos(pto);
        st.probe_deadline = MaybeInstant::some(at).min(st.rto_deadline);
    }

    /// The tail-loss probe (spec 4.6.5, after RFC 8985's TLP): nothing was
    /// heard for a probe timeout while packets are outstanding, so the
    /// last of them may have been lost with no later delivery to reveal
    /// it. One packet goes out to draw an ACK whose SACK lets RACK (4.6.2)
    /// find the losses: a new one if the windows allow (the start-up window
    /// grows by one packet), else the most recently sent packet again.
    /// A sender whose next new packet waits only for pacing sends no
    /// extra one: that packet is the probe.
    pub(crate) fn on_probe<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        config: &Config,
    ) {
        let Some(s) = self.send.state.get() else {
            return;
        };
        // Retransmissions already waiting draw ACKs of their own, and so
        // do new packets waiting only for their pacing slot (their send
        // re-arms the probe) unless the retransmission timer is due: then
        // the next of them is the probe, in its place.
        let unsent = self.first_unsent(send).is_some();
        let SendPools {
            senders, inflight, ..
        } = send;
        let st = senders.get_mut(s);
        st.probe_deadline = MaybeInstant::NONE;
        let paced = unsent && self.may_send_new(st);
        let rto_due = st.rto_deadline.get().is_some_and(|d| now >= d);
        if let (Some(extent), Some(_), 0, false) = (
            st.extent,
            st.outstanding.front(),
            st.lost_pending(),
            paced && !rto_due,
        ) {
            self.counters.probes += 1;
            st.probes += 1;
            if rto_due {
                // In the timeout's place: its backoff too (spec 4.6.4).
                st.rto_backoff = st.rto_backoff.saturating_add(1);
            }
            let span = self.send.nxt.distance_from(self.send.una);
            if !paced && span < self.params.window && unsent {
                // Only the start-up window holds new packets back.
                st.startup_window = st.startup_window.saturating_add(u32::from(self.params.mtu));
            } else if !paced {
                // Resent, not declared lost: no loss is counted or blamed.
                let psn = st.outstanding.tail;
                let r = inflight.get_mut(extent, psn);
                r.set_slot(Slot::Lost);
                let path = st.path_mut(usize::from(r.path));
                path.in_flight = path.in_flight.saturating_sub(1);
                inflight.unlink(&mut st.outstanding, extent, self.send.una, psn);
                inflight.push_back(&mut st.lost, extent, psn);
            }
            st.rto_deadline = MaybeInstant::some(self.rto_deadline(now, st, config));
            self.arm_probe(now, st, config);
        }
    }

    /// RACK per path (spec 4.6.2): a packet is lost once a packet sent after
    /// it *on the same path* was delivered and a reordering window has passed
    /// since it was sent. Comparing within a path only is what keeps
    /// multipath skew from looking like loss.
    ///
    /// Only the outstanding list is walked, oldest transmission first, and
    /// only while its packets are old enough to be judged: the walk stops at
    /// the first packet sent at or after the newest delivered one (no
    /// evidence yet for it or anything later) or too recently for any
    /// path's deadline to have passed. A window of tens of thousands of
    /// PSNs costs no more per ACK than one of a few.
    pub(crate) fn detect_losses<B: Backing>(
        &mut self,
        now: Instant,
        st: &mut SenderState<P>,
        inflight: &mut Inflight<B>,
        extent: Extent,
    ) {
        st.rack_deadline = MaybeInstant::NONE;
        let now_ts = now.wire_timestamp();
        let active = usize::from(self.params.paths);
        st.index.sync(&st.paths, active);
        let Some(newest_delivered) = st.index.newest_delivered(&st.paths, active) else {
            return;
        };
        // For paths without an RTT sample yet: the slowest path's estimate
        // (found only while there are such paths).
        let (slowest_srtt, slowest_var) = if st.index.all_estimated() {
            (0, 0)
        } else {
            let paths = &st.paths[..active];
            let srtt = paths.iter().map(|p| p.rtt.srtt_ns()).max();
            let var = paths.iter().map(|p| p.rtt.rttvar_ns()).max();
            (
                srtt.unwrap_or(0).max(self.send.rtt.srtt_ns()),
                var.unwrap_or(0).max(self.send.rtt.rttvar_ns()),
            )
        };
        let estimate = |p: &super::sender::PathSender| {
            if p.rtt.has_estimate() {
                (p.rtt.srtt_ns(), p.rtt.rttvar_ns())
            } else {
                (slowest_srtt, slowest_var)
            }
        };
        // The shortest time after its send at which any packet can be
        // declared lost: no later-sent packet can be due before it.
        let soonest = st
            .index
            .soonest(&st.paths, active, (slowest_srtt, slowest_var));
        let una = self.send.una;
        let mut at = st.outstanding.front();
        while let Some(psn) = at {
            let r = inflight.get(extent, psn);
            let next = inflight.next_on(&st.outstanding, extent, una, psn);
            if Psn(r.sent_ts).offset_from(newest_delivered) >= 0 {
                break;
            }
            if Psn(now_ts).offset_from(Psn(r.sent_ts.wrapping_add(soonest))) < 0 {
                // Too recent for any path: wake when the first could be due.
                let due = now.plus_nanos(u64::from(
                    r.sent_ts.wrapping_add(soonest).wrapping_sub(now_ts),
                ));
                st.rack_deadline = st.rack_deadline.min(MaybeInstant::some(due));
                break;
            }
            let path = &st.paths[usize::from(r.path) % P];
            // Evidence on the packet's own path allows a short
            // reordering window; evidence only from other paths (the
            // chooser may have stopped using this one) waits for this
            // path's own round trip plus a wider allowance. Either way
            // the packet's own path RTT sets the clock, so skew between
            // paths is never taken for loss (spec 4.6.2).
            let same_path =
                path.rack_valid && Psn(path.rack_xmit_ts).offset_from(Psn(r.sent_ts)) > 0;
            let (rtt, var) = estimate(path);
            let reo = if same_path {
                path.same_path_allowance(rtt, var)
            } else {
                rtt / 2 + 2 * var
            };
            let deadline = r.sent_ts.wrapping_add(rtt).wrapping_add(reo.max(1_000));
            if Psn(now_ts).offset_from(Psn(deadline)) >= 0 {
                self.mark_lost::<B>(st, inflight, extent, psn);
            } else {
                let due = now.plus_nanos(u64::from(deadline.wrapping_sub(now_ts)));
                st.rack_deadline = st.rack_deadline.min(MaybeInstant::some(due));
            }
            at = next;
        }
    }

    /// Declares PSN `psn` (in flight) lost: off the outstanding list, onto
    /// the lost list for its retransmission.
    pub(crate) fn mark_lost<B: Backing>(
        &mut self,
        st: &mut SenderState<P>,
        inflight: &mut Inflight<B>,
        extent: Extent,
        psn: Psn,
    ) {
        let una = self.send.una;
        let r = inflight.get_mut(extent, psn);
        r.set_slot(Slot::Lost);
        let path = st.path_mut(usize::from(r.path));
        path.in_flight = path.in_flight.saturating_sub(1);
        path.on_lost();
        inflight.unlink(&mut st.outstanding, extent, una, psn);
        inflight.push_back(&mut st.lost, extent, psn);
        self.counters.packets_lost += 1;
    }

    pub(crate) fn on_nak<B: Backing>(
        &mut self,
        now: Instant,
        nak: &NakRepr,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        config: &Config,
    ) {
        self.counters.naks_received += 1;
        let psn = Psn(nak.nak_psn);
        let span = self.send.nxt.distance_from(self.send.una);
        if !psn.is_within(self.send.una, span) {
            self.counters.invalid_acks += 1;
            return;
        }
        if nak.reason == NakReason::ReceiverNotReady {
            self.counters.rnr_naks_received += 1;
            // Every refused packet has its NAK (spec 4.7.1): a message of
            // several packets refused in one burst draws several, which
            // are one retry. A NAK counts only once the last one's wait is
            // over, when it answers packets resent after it.
            let new_retry = self
                .send
                .state
                .get()
                .is_none_or(|s| now >= send.senders.get(s).rnr_until);
            let entry = send
                .work
                .iter(&self.send.queue)
                .find(|&i| send.work.get(i).holds(psn))
                .filter(|_| new_retry);
            if let Some(i) = entry {
                let e = send.work.get_mut(i);
                e.rnr_retries = e.rnr_retries.saturating_add(1);
                if e.rnr_retries > config.rnr_retry_limit {
                    self.fail(
                        crate::api::Status::ReceiverNotReadyExceeded,
                        Blame::Psn(psn),
                        send,
                        recv,
                    );
                    return;
                }
            }
            if let Some(s) = self.send.state.get() {
                let st = send.senders.get_mut(s);
                if let Some(extent) = st.extent {
                    if send.inflight.get(extent, psn).slot() == Slot::InFlight {
                        self.mark_lost::<B>(st, &mut send.inflight, extent, psn);
                    }
                }
                st.rnr_until = now + config.rnr_delay;
            }
            return;
        }
        self.fail(status_of(nak.reason), Blame::Psn(psn), send, recv);
    }

    pub(crate) fn on_rto<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        config: &Config,
    ) {
        let Some(s) = self.send.state.get() else {
            return;
        };
        let st = send.senders.get_mut(s);
        self.counters.timeouts += 1;
        st.rto_backoff = st.rto_backoff.saturating_add(1);
        // Ride-through (spec 4.6.4): give up by the time gone without
        // progress, not by a count of timeouts, so an outage shorter than
        // the ride-through is survived whatever the RTO was.
        if now.saturating_duration_since(st.progress_at) >= self.ride_through(config) {
            let culprit = self.send.una;
            self.fail(
                crate::api::Status::RetryExceeded,
                Blame::Psn(culprit),
                send,
                recv,
            );
            self.pending.set(super::Pending::CLOSE);
            self.close_reason = crate::wire::CloseReason::Error;
            return;
        }
        let SendPools {
            senders, inflight, ..
        } = send;
        let st = senders.get_mut(s);
        st.cc.on_timeout(now);
        if let Some(extent) = st.extent {
            // Everything sent more than one (un-backed-off) timeout ago is
            // lost: the outstanding list's front, which is in send order.
            let age = Duration::from_nanos(self.rto_ns(st, config) >> st.rto_backoff.min(16));
            let cutoff = Psn((now - age).wire_timestamp());
            let mut any = false;
            while let Some(psn) = st.outstanding.front() {
                if cutoff.offset_from(Psn(inflight.get(extent, psn).sent_ts)) < 0 {
                    break;
                }
                self.mark_lost::<B>(st, inflight, extent, psn);
                any = true;
            }
            if !any {
                if let Some(psn) = st.outstanding.front() {
                    self.mark_lost::<B>(st, inflight, extent, psn);
                }
            }
        }
        st.rto_deadline = if self.send.una == self.send.nxt {
            MaybeInstant::NONE
        } else {
            MaybeInstant::some(self.rto_deadline(now, st, config))
        };
    }

    /// Evaluates every path against its peers and re-draws the entropy of
    /// those persistently worse (spec 4.9.3). Returns how many were re-drawn.
    pub(crate) fn evaluate_paths(
        &mut self,
        st: &mut SenderState<P>,
        config: &Config,
        rng: &mut Rng,
    ) -> u32 {
        let n = usize::from(self.params.paths);
        st.epoch_total = 0;
        if n < 2 {
            for p in &mut st.paths[..n] {
                p.epoch_sent = 0;
                p.epoch_lost = 0;
            }
            return 0;
        }
        let total_sent: u64 = st.paths[..n].iter().map(|p| u64::from(p.epoch_sent)).sum();
        let total_lost: u64 = st.paths[..n].iter().map(|p| u64::from(p.epoch_lost)).sum();
        let mut ecn_sorted = [0u32; 16];
        let sample = n.min(16);
        for (slot, p) in ecn_sorted.iter_mut().zip(st.paths[..sample].iter()) {
            *slot = p.ecn_frac;
        }
        ecn_sorted[..sample].sort_unstable();
        let ecn_median = ecn_sorted[sample / 2];
        let mut rerolled = 0;
        for i in 0..n {
            let (sent, lost) = (
                u64::from(st.paths[i].epoch_sent),
                u64::from(st.paths[i].epoch_lost),
            );
            let others_sent = total_sent - sent;
            let others_lost = total_lost - lost;
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
            let ecn_bad = st.paths[i].ecn_frac > ecn_median.saturating_mul(2) + ONE / 10;
            let p = &mut st.paths[i];
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
                p.reroll();
                st.index.touch(i);
                let e = Self::draw_entropy(&self.entropy[..n], config, rng);
                self.entropy[i] = e;
                rerolled += 1;
            }
        }
        if rerolled > 0 {
            // Re-drawn paths start afresh: their estimates stay, their
            // delivery and reordering evidence goes.
            st.index.rebuild_recovery(&st.paths, n);
        }
        rerolled
    }
}

/// How much faster than doubling per round trip the start-up window
/// grows (spec 4.10.6): the path's minimum round trip over the one the
/// initial window was sized for, at least 1. A path k times longer than
/// the data centre's has a k times larger bandwidth-delay product, and
/// with its window growing by k bytes per byte acknowledged it reaches it
/// in as few round trips as a data-centre path does.
pub(crate) fn startup_growth(min_rtt_ns: u32, config: &Config) -> u32 {
    // 64-bit arithmetic: a 128-bit division is 780 bytes of firmware code.
    let reference = u64::try_from(config.initial_window_rtt.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    (u64::from(min_rtt_ns) / reference).clamp(1, u64::from(MAX_STARTUP_GROWTH)) as u32
}

/// Tail-loss probes per episode without progress (spec 4.6.5); the
/// retransmission timer takes over after them.
const MAX_PROBES: u8 = 4;

/// Bound of [`startup_growth`] (a 20 ms round trip over a 10 us reference).
const MAX_STARTUP_GROWTH: u32 = 4096;
