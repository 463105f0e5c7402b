//! Deadlines and timeouts (spec 4.11, 4.12). A connection reports one
//! next deadline; the endpoint files it in its timing wheel and calls
//! [`Connection::handle_timeout`] when it passes. Every deadline reported
//! is acted on when handled, so it moves into the future (or goes away):
//! a handled connection is never due again at the same instant.

use super::{ConnState, Connection, Pending, RecvPools, SendPools};
use crate::config::Config;
use crate::storage::Backing;
use crate::time::{Instant, MaybeInstant};
use crate::wire::CloseReason;

impl<const P: usize> Connection<P> {
    /// Where the endpoint files the connection after a change: whether a
    /// packet is ready to go right now and the next deadline, the sender's
    /// idle spell noted first (with `idle_check`). The send queue is asked
    /// for its first unsent entry once, not by each question.
    pub(crate) fn outlook<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        config: &Config,
        idle_check: bool,
    ) -> (bool, Option<Instant>) {
        let unsent = if idle_check {
            self.note_idle(now, send)
        } else {
            None
        };
        let has_data = self.data_waiting(send, unsent);
        let wants = self.wants_transmit(now, send, has_data);
        (wants, self.next_timer(now, send, config, has_data))
    }

    /// Whether a packet is ready to go right now; `has_data`: whether
    /// data waits ([`Connection::data_waiting`]).
    fn wants_transmit<B: Backing>(
        &self,
        now: Instant,
        send: &SendPools<B, P>,
        has_data: bool,
    ) -> bool {
        if self.control_ready() || self.ack_ready() {
            return true;
        }
        if !has_data {
            return false;
        }
        match self.send.state.get() {
            // A sender state is taken on the first poll, unless the pool
            // already refused (then the endpoint wakes it).
            None => !self.send.starved,
            Some(s) => {
                let st = send.senders.get(s);
                now >= st.next_send_at && now >= st.rnr_until && !self.send.starved
            }
        }
    }

    /// Notes whether the sender just went idle (for the sender state's
    /// linger), or is busy again. Whether an entry has unsent packets, if
    /// it asked.
    fn note_idle<B: Backing>(&mut self, now: Instant, send: &mut SendPools<B, P>) -> Option<bool> {
        let s = self.send.state.get()?;
        let mut unsent = None;
        let busy = self.send.una != self.send.nxt
            || send.senders.get(s).lost_pending() > 0
            || *unsent.insert(self.first_unsent(send).is_some());
        let st = send.senders.get_mut(s);
        if busy {
            st.idle_since = MaybeInstant::NONE;
        } else if st.idle_since.is_none() {
            st.idle_since = MaybeInstant::some(now);
        }
        unsent
    }

    /// The next instant something must happen that is not ready now;
    /// `has_data`: whether data waits ([`Connection::data_waiting`]).
    fn next_timer<B: Backing>(
        &self,
        now: Instant,
        send: &SendPools<B, P>,
        config: &Config,
        has_data: bool,
    ) -> Option<Instant> {
        let some = MaybeInstant::some;
        let mut t = self.ctrl.deadline;
        let idle_timeout = self.idle_timeout(config);
        match self.state {
            ConnState::Accepting => {
                t = t.min(some(self.ctrl.last_heard + idle_timeout));
                if self.acks_allowed() && !self.recv.ack_now {
                    t = t.min(self.recv.ack_due);
                }
            }
            // An early initiator's first flight is paced (spec 4.2.4).
            ConnState::Connecting if self.may_send_data() => {
                if let Some(s) = self.send.state.get() {
                    let st = send.senders.get(s);
                    if st.next_send_at > now && !self.send.starved && has_data {
                        t = t.min(some(st.next_send_at));
                    }
                }
            }
            ConnState::Established | ConnState::Closing => {
                if !self.recv.ack_now {
                    t = t.min(self.recv.ack_due);
                }
                if let Some(s) = self.send.state.get() {
                    let st = send.senders.get(s);
                    t = t.min(st.rto_deadline).min(st.rack_deadline);
                    t = t.min(st.probe_deadline);
                    if let Some(idle) = st.idle_since.get() {
                        t = t.min(some(idle + config.sender_linger));
                    }
                    let paced = st.next_send_at.max(st.rnr_until);
                    if paced > now && !self.send.starved && has_data {
                        t = t.min(some(paced));
                    }
                }
                if !self.pending.has(Pending::KEEPALIVE) {
                    t = t.min(some(self.ctrl.last_sent + config.keepalive_interval));
                }
                t = t.min(some(self.ctrl.last_heard + idle_timeout));
            }
            _ => {}
        }
        t.get()
    }

    /// Ends the connection at once, its work flushed, with one CLOSE
    /// saying why (an idle timeout, or its slot reclaimed, spec 4.2.3).
    pub(crate) fn end<B: Backing>(
        &mut self,
        reason: CloseReason,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) {
        self.flush_work(
            crate::api::Status::Flushed,
            super::Blame::Nobody,
            send,
            recv,
        );
        self.state = ConnState::Closed;
        self.close_reason = reason;
        self.pending = Pending::default();
        self.pending.set(Pending::CLOSE);
        self.ctrl.deadline = MaybeInstant::NONE;
        self.recv.ack_due = MaybeInstant::NONE;
        self.events.raise(super::PendingEvents::CLOSED);
    }

    /// Whether the connection may give its slot to another source prefix
    /// (spec 4.2.3): unconfirmed, or established with no work queued, no
    /// sender state held and no data received for `idle_after`.
    pub(crate) fn reclaimable(&self, now: Instant, idle_after: core::time::Duration) -> bool {
        match self.state {
            ConnState::Accepting => true,
            ConnState::Established => {
                self.send.queue.is_empty()
                    && self.send.state.is_none()
                    && self
                        .recv
                        .last_data_rx
                        .get()
                        .is_none_or(|t| now >= t + idle_after)
            }
            _ => false,
        }
    }

    /// Runs every timer whose deadline has passed.
    pub(crate) fn handle_timeout<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        config: &Config,
    ) {
        if self.ctrl.deadline.get().is_some_and(|d| now >= d) {
            self.on_ctrl_timeout(now, send, recv, config);
        }
        let idle_timeout = self.idle_timeout(config);
        if self.state == ConnState::Accepting && now >= self.ctrl.last_heard + idle_timeout {
            // The initiator never confirmed the handshake (spec 4.1.1).
            self.fail(
                crate::api::Status::RetryExceeded,
                super::Blame::Nobody,
                send,
                recv,
            );
            return;
        }
        if self.acks_allowed() && self.recv.ack_due.get().is_some_and(|d| now >= d) {
            self.recv.ack_now = true;
        }
        if !self.state.is_open() {
            return;
        }
        if now >= self.ctrl.last_heard + idle_timeout {
            self.end(CloseReason::IdleTimeout, send, recv);
            return;
        }
        if let Some(s) = self.send.state.get() {
            let st = send.senders.get_mut(s);
            if let (Some(d), Some(extent)) = (st.rack_deadline.get(), st.extent) {
                if now >= d {
                    self.detect_losses::<B>(now, st, &mut send.inflight, extent);
                }
            }
            if send
                .senders
                .get(s)
                .probe_deadline
                .get()
                .is_some_and(|d| now >= d)
            {
                self.on_probe(now, send, config);
            }
            if send
                .senders
                .get(s)
                .rto_deadline
                .get()
                .is_some_and(|d| now >= d)
            {
                self.on_rto(now, send, recv, config);
            }
            if self.state.is_open() {
                let linger_over = send
                    .senders
                    .get(s)
                    .idle_since
                    .get()
                    .is_some_and(|i| now >= i + config.sender_linger);
                if linger_over {
                    self.release_sender(send);
                }
            }
        }
        if self.state.is_open() && now >= self.ctrl.last_sent + config.keepalive_interval {
            self.pending.set(Pending::KEEPALIVE);
        }
    }
}
