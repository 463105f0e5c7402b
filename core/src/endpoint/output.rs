//! Outputs and the bookkeeping that keeps them O(ready): which lists a
//! connection is on after it changed, packets to send, completions, events
//! and the next deadline.

use super::{ConnSlot, Endpoint, StatelessBody};
use crate::api::{Completion, Transmit};
use crate::conn::{ConnState, Event, PendingEvents};
use crate::storage::Backing;
use crate::time::Instant;
use crate::wire::encap::ecn;
use crate::wire::{Body, CloseRepr, Flags, Header, Repr, RetryRepr};

/// Fair-share packet intervals a sender may go without delivering and still
/// count as active (spec 4.10.4).
const ACTIVE_SENDER_INTERVALS: u64 = 4;

/// Starved connections woken each time pool space comes back.
const WAKE_PER_RELEASE: usize = 2;

impl<B: Backing, const P: usize> Endpoint<B, P> {
    /// Puts connection `i` on the lists its state calls for, files its
    /// next deadline, gives back its sender state when it no longer needs
    /// it, and frees the slot of a released connection with nothing left to
    /// send. Called after anything touched the connection: O(1).
    ///
    /// `in_timeout`: called while expiring timers at `now`, so a deadline
    /// at or before `now` is filed just after it (it was acted on; filing
    /// it at `now` would expire it again in the same call).
    pub(super) fn refresh(&mut self, i: u32, now: Instant, in_timeout: bool) {
        self.refresh_with(i, now, in_timeout, true);
    }

    /// [`Endpoint::refresh`]; `completions_may_change`: false when only a
    /// packet went out and the connection's state and events stayed as
    /// they were, so no completion became ready (they become ready when
    /// packets are acknowledged, or all at once when the connection fails
    /// or closes) and the completion list is as the last refresh left it.
    fn refresh_with(
        &mut self,
        i: u32,
        now: Instant,
        in_timeout: bool,
        completions_may_change: bool,
    ) {
        let s = &self.slots[i as usize];
        if !s.live {
            return;
        }
        if s.conn.send.read_depth == 0 {
            // A new connection: its READ depth before its CONNECT or
            // ACCEPT goes out (spec 4.14.3).
            self.reserve_read_depth(i);
        }
        let s = &self.slots[i as usize];
        if s.half_open && s.conn.state != ConnState::Accepting {
            #[cfg(feature = "tokens")]
            let established = s.conn.state == ConnState::Established;
            self.leave_half_open(i);
            // Its initiator receives at its address (spec 4.2.5).
            #[cfg(feature = "tokens")]
            if established {
                self.issue_token(i, now);
            }
        }
        // Borrowed, not copied: the configuration is a few hundred bytes.
        let config = &self.config;
        let s = &mut self.slots[i as usize];
        let conn = &mut s.conn;
        if conn.cookie.is_some()
            && conn.state != ConnState::Connecting
            && !(cfg!(feature = "tokens") && conn.pending.has(crate::conn::Pending::NEW_TOKEN))
        {
            // The handshake is over: its RETRY cookie goes back.
            conn.drop_cookie(&mut self.res.credentials);
        }
        let open = !(conn.state.is_terminal() || s.released);
        if !open {
            conn.release_sender(&mut self.res.send);
        } else if conn.state == ConnState::Closing {
            conn.maybe_send_close(now, &self.res.send, config);
        }
        let (wants, timer) = conn.outlook(now, &mut self.res.send, config, open);
        let urgent = conn.wants_control_or_ack();
        let starved = conn.send.starved;
        let has_completion =
            completions_may_change && conn.has_completion(&self.res.send, &self.res.recv);
        let has_event = conn.events.any();
        let released = s.released;
        if wants {
            self.ready
                .push_back(&mut self.slots, i, ConnSlot::ready_link);
        }
        if urgent {
            self.urgent
                .push_back(&mut self.slots, i, ConnSlot::urgent_link);
        }
        if starved {
            self.waiting
                .push_back(&mut self.slots, i, ConnSlot::waiting_link);
        }
        match timer {
            Some(t) if !released => {
                let t = if in_timeout && t <= now {
                    now.plus_nanos(1)
                } else {
                    t
                };
                self.wheel
                    .schedule(&mut self.slots, i, t.as_nanos(), ConnSlot::timer_entry);
            }
            _ => self.wheel.cancel(&mut self.slots, i, ConnSlot::timer_entry),
        }
        if has_completion {
            self.completions
                .push_back(&mut self.slots, i, ConnSlot::completions_link);
        }
        if has_event && !released {
            self.events
                .push_back(&mut self.slots, i, ConnSlot::events_link);
        }
        if released && !wants {
            self.free_slot(i);
        }
        // Wherever a sender state came back (idle linger, close, failure),
        // as many starved connections as it can serve try again.
        let returned = core::mem::take(&mut self.res.send.senders_returned);
        if returned > 0 {
            self.wake_waiters(returned as usize * WAKE_PER_RELEASE);
        }
    }

    /// Refreshes the connections received packets touched since the last
    /// call, each once. Every call that reads what refresh files (the
    /// `poll_*` calls, `handle_timeout`) makes it first; a platform calls
    /// it at the end of a receive batch only to have the lists current
    /// early.
    pub fn refresh_touched(&mut self) {
        let now = self.now;
        for k in 0..self.touched.len() {
            let i = self.touched[k];
            let s = &mut self.slots[i as usize];
            s.set(super::table::TOUCHED, false);
            if s.live {
                self.refresh(i, now, false);
            }
        }
        self.touched.clear();
    }

    /// Pool space came back: let `count` starved connections try again.
    pub(super) fn wake_waiters(&mut self, count: usize) {
        let now = self.now;
        for _ in 0..count {
            let Some(i) = self
                .waiting
                .pop_front(&mut self.slots, ConnSlot::waiting_link)
            else {
                return;
            };
            let s = &mut self.slots[i as usize];
            if s.live {
                s.conn.send.starved = false;
                self.refresh(i, now, false);
            }
        }
    }

    /// The fair-share hint this receiver gives each sender (spec 4.10.4):
    /// its link rate divided by the connections that delivered data within
    /// the active-sender window. Kept incrementally: senders are listed by
    /// their last data, and those past the window drop off the front.
    pub fn rate_hint(&mut self, now: Instant) -> u32 {
        if !self.config.rate_hints {
            return 0;
        }
        let local = self.active_senders(now);
        // Half-open connections are senders about to start: each ACCEPT
        // grants this hint (spec 4.10.6), so the k-th of senders starting
        // together is granted at most 1/k of the link.
        // Only an endpoint with the cipher takes early flights.
        let starting = if crate::crypto::SUPPORTED {
            self.half_open - self.half_open_sending
        } else {
            self.half_open
        };
        self.config.link_rate_mbps / (local + self.other_senders + starting).max(1)
    }

    /// Connections of this endpoint that delivered data within the
    /// active-sender window: `active_sender_window`, or four fair-share
    /// packet intervals of the senders counted now when that is longer
    /// (spec 4.10.4). A sender at its share of N delivers one MTU every N
    /// MTU times, so a fixed window either undercounts a large incast or
    /// holds a finished sender's share from the others for long: with 100
    /// us the 64-host all-to-all's last flows waited out the window at
    /// 1/63 of the link (p99/p50 1.26-1.28x; 1.22-1.24x adaptive).
    pub fn active_senders(&mut self, now: Instant) -> u32 {
        // In nanoseconds, 64-bit: `Duration` arithmetic is firmware code.
        let mtu_ns =
            u64::from(self.config.mtu) * 8_000 / u64::from(self.config.link_rate_mbps.max(1));
        let shares = u64::from(self.active.len()) * mtu_ns * ACTIVE_SENDER_INTERVALS;
        let floor = self.config.active_sender_window.as_nanos() as u64;
        while let Some(i) = self.active.front() {
            let s = &self.slots[i as usize];
            // A sender whose latest packet ended a burst counts for the
            // floor only; it waits its turn at the front, which active
            // senders leave with every packet.
            let window = if s.has(super::table::IDLE) {
                floor
            } else {
                floor.max(shares)
            };
            let last = s.conn.recv.last_data_rx.get();
            if last.is_some_and(|t| now.as_nanos() < t.as_nanos().saturating_add(window)) {
                break;
            }
            self.active
                .remove(&mut self.slots, i, ConnSlot::active_link);
        }
        self.active.len()
    }

    /// Active senders the other shards of the same node see (their
    /// `active_senders`, summed by the platform): the fair-share hint
    /// divides the node's link among all of them.
    pub fn set_other_shards_senders(&mut self, senders: u32) {
        self.other_senders = senders;
    }

    /// The fair-share hint as last computed (at the latest `poll_transmit`
    /// that had a packet to send), for telemetry that may not change state.
    pub fn last_rate_hint(&self) -> u32 {
        self.hint_cache.1
    }

    /// Writes the headers of the next packet to send into `buf` and says
    /// where it goes and where its payload comes from. `buf` must hold at
    /// least 100 bytes, the largest header: a protected ACK (28 + 56 and a
    /// 16-byte security extension, spec 5.3.2), longer than CONNECT's 92.
    /// A protected packet is sealed by [`Endpoint::finish_transmit`].
    /// Connections take turns, one packet each.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.now = self.now.max(now);
        self.refresh_touched();
        if let Some(r) = self.stateless.pop_front() {
            let repr = Repr {
                header: Header {
                    flags: match r.body {
                        StatelessBody::CloseReply(_) => Flags::CLOSE_REPLY,
                        _ => Flags::NONE,
                    },
                    dst_conn: r.dst_conn,
                    token: r.token,
                    psn: 0,
                    path: 0,
                    timestamp: now.wire_timestamp(),
                },
                body: match r.body {
                    StatelessBody::Close(reason) | StatelessBody::CloseReply(reason) => {
                        Body::Close(CloseRepr { reason })
                    }
                    StatelessBody::Retry(cookie) => Body::Retry(RetryRepr { cookie }),
                },
                payload_len: 0,
            };
            if buf.len() >= repr.header_len() {
                repr.emit_header(buf);
                return Some(Transmit {
                    peer: r.peer,
                    src_port: self.config.entropy_base,
                    ecn: ecn::NOT_ECT,
                    header_len: repr.header_len(),
                    payload: None,
                    seal: None,
                });
            }
        }
        // Spec 4.7: every refused packet's NAK, in the order refused.
        while let Some(q) = self.res.recv.naks.pop_front() {
            let i = self.ids.index_of(q.conn).unwrap_or(usize::MAX);
            let Some(s) = self.slots.get_mut(i) else {
                continue;
            };
            if !s.live || s.conn.local_id != q.conn {
                continue;
            }
            let t = s.conn.emit_nak(now, buf, &q);
            let keys = &mut self.res.credentials.keys;
            let t = t.and_then(|t| keys.protect(&s.conn.protection, buf, t));
            if t.is_some() {
                return t;
            }
        }
        if self.ready.is_empty() {
            return None;
        }
        if self.hint_cache.0 != now {
            self.hint_cache = (now, self.rate_hint(now));
        }
        let hint = self.hint_cache.1;
        // Control packets and ACKs first (a handshake or an ACK behind
        // every other connection's data packet lengthens round trips by
        // the number of busy connections: in the 64-host all-to-all an
        // ACCEPT waited up to 50 us), then each connection on the ready
        // list gets one try; one that turns out to have nothing (paced,
        // starved) leaves the list. An urgent connection is on the ready
        // list too (`wants_transmit` covers control and ACKs).
        let urgent = self.urgent.len();
        for turn in 0..urgent + self.ready.len() {
            let (list, link): (_, fn(&mut ConnSlot<P>) -> &mut u32) = if turn < urgent {
                (&mut self.urgent, ConnSlot::urgent_link)
            } else {
                (&mut self.ready, ConnSlot::ready_link)
            };
            let i = list.pop_front(&mut self.slots, link)?;
            if turn < urgent && !self.slots[i as usize].conn.wants_control_or_ack() {
                continue;
            }
            let s = &mut self.slots[i as usize];
            if !s.live {
                continue;
            }
            let before = (s.conn.state, s.conn.events);
            let res = &mut self.res;
            let t = s.conn.poll_transmit(
                now,
                buf,
                hint,
                &mut res.send,
                &mut res.recv,
                &res.regions,
                &res.credentials,
                &self.config,
            );
            // Spec 5.3: a keyed connection's packets get the security
            // extension and are sealed when finished.
            let keys = &mut res.credentials.keys;
            let t = t.and_then(|t| keys.protect(&s.conn.protection, buf, t));
            let changed = (s.conn.state, s.conn.events) != before;
            self.refresh_with(i, now, false, changed);
            if t.is_some() {
                return t;
            }
        }
        None
    }

    /// The next completion: connections with completions take turns, each
    /// in its own post order.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.refresh_touched();
        let now = self.now;
        for _ in 0..=self.completions.len() {
            let i = self
                .completions
                .pop_front(&mut self.slots, ConnSlot::completions_link)?;
            let s = &mut self.slots[i as usize];
            if !s.live {
                continue;
            }
            let handle = s.handle(self.ids.global(i));
            let c = s
                .conn
                .next_completion(handle, &mut self.res.send, &mut self.res.recv);
            if s.conn.state == ConnState::Established && !s.released {
                // Taking a completion of an open connection changes only
                // what is left to take: what it may send, its timers and
                // its events stay as the last refresh filed them.
                if s.conn.has_completion(&self.res.send, &self.res.recv) {
                    self.completions
                        .push_back(&mut self.slots, i, ConnSlot::completions_link);
                }
            } else {
                self.refresh(i, now, false);
            }
            if c.is_some() {
                return c;
            }
        }
        None
    }

    /// The next connection event. Each connection keeps its own pending
    /// events, so none is ever lost.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.refresh_touched();
        loop {
            let i = self
                .events
                .pop_front(&mut self.slots, ConnSlot::events_link)?;
            let s = &mut self.slots[i as usize];
            if !s.live || s.released {
                continue;
            }
            let conn = &mut s.conn;
            let Some(bit) = conn.events.take() else {
                continue;
            };
            let handle = s.handle(self.ids.global(i));
            let conn = &mut s.conn;
            let event = match bit {
                PendingEvents::INCOMING => Event::Incoming {
                    conn: handle,
                    peer: conn.peer,
                },
                PendingEvents::CONNECTED => Event::Connected(handle),
                PendingEvents::FAILED => Event::Failed {
                    conn: handle,
                    status: conn.fail_status,
                },
                _ => Event::Closed {
                    conn: handle,
                    reason: conn.close_reason,
                },
            };
            if conn.events.any() {
                self.events
                    .push_back(&mut self.slots, i, ConnSlot::events_link);
            }
            return Some(event);
        }
    }

    /// When to call [`Endpoint::handle_timeout`] (or poll again) next:
    /// `Instant::ZERO` when a packet is ready now, or connections touched
    /// by received packets wait for their refresh. Exact when the next
    /// deadline is within 64 us, otherwise possibly early (a wake-up that
    /// finds nothing due costs one empty `handle_timeout`).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if !self.ready.is_empty()
            || !self.touched.is_empty()
            || !self.stateless.is_empty()
            || !self.res.recv.naks.is_empty()
        {
            return Some(Instant::ZERO);
        }
        self.wheel
            .next_deadline(&self.slots, ConnSlot::timer_entry_ref)
            .map(Instant::from_nanos)
    }
}
