//! Posting work and sending data (spec 4.4, 4.8, 4.9, 4.10): which packet
//! goes next, on which path, when (pacing), and the pooled sender state it
//! needs.

use super::sender::{SenderState, Slot};
use super::{ConnState, Connection, Job, RecvPools, Regions, SendPools, WorkEntry};
use crate::api::{Access, Op, PayloadRef, Status, Transmit, WorkRequest};
use crate::cc::{serialization_nanos, CongestionControl};
use crate::config::Config;
use crate::psn::Psn;
use crate::storage::list::OptIndex;
use crate::storage::Backing;
use crate::time::{Instant, MaybeInstant};
use crate::wire::encap::ecn;
use crate::wire::packet::{ReadResponseRepr, WriteImm};
use crate::wire::{
    Body, Flags, MemoryTarget, MessageSpan, ReadRequestRepr, Repr, SendRepr, WriteRepr,
};

/// Why a post was refused for now (both are retryable back-pressure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostRefusal {
    /// The connection's own queue limit is reached.
    QueueFull,
    /// The endpoint's pool is empty.
    PoolEmpty,
}

/// Records the first window fills up to before it grows (16 PSNs: the
/// smallest extent).
const FIRST_EXTENT: u32 = 16;

impl<const P: usize> Connection<P> {
    pub(crate) fn can_post(&self) -> bool {
        matches!(
            self.state,
            ConnState::Connecting | ConnState::Accepting | ConnState::Established
        )
    }

    /// Queues a work request (spec 4.8).
    pub(crate) fn post_send<B: Backing>(
        &mut self,
        wr: WorkRequest,
        send: &mut SendPools<B, P>,
        config: &Config,
    ) -> Result<(), PostRefusal> {
        if self.send.user_jobs >= config.send_queue_limit {
            return Err(PostRefusal::QueueFull);
        }
        let mtu = u32::from(self.params.mtu);
        let (packets, recv_index) = match wr.op {
            Op::Read { .. } => (1, 0),
            Op::Send | Op::SendImm { .. } | Op::WriteImm { .. } => {
                (wr.local.len.div_ceil(mtu).max(1), self.send.next_recv_index)
            }
            Op::Write { .. } => (wr.local.len.div_ceil(mtu).max(1), 0),
        };
        let entry = WorkEntry {
            job: Job::User(wr),
            msg_id: self.send.next_msg_id,
            len: wr.local.len,
            packets,
            recv_index,
            ..WorkEntry::VACANT
        };
        let Ok(i) = send.work.push_back(&mut self.send.queue, entry) else {
            send.refusals.work_entries += 1;
            return Err(PostRefusal::PoolEmpty);
        };
        self.send.user_jobs += 1;
        if self.send.cursor.is_none() {
            self.send.cursor = OptIndex::some(i);
        }
        self.send.next_msg_id = self.send.next_msg_id.wrapping_add(1);
        if matches!(wr.op, Op::Send | Op::SendImm { .. } | Op::WriteImm { .. }) {
            self.send.next_recv_index = self.send.next_recv_index.wrapping_add(1);
        }
        Ok(())
    }

    /// Queues the answer to a peer's READ_REQUEST; `false` when the READ
    /// depth this end stated is used up (only a peer that exceeds it meets
    /// that) or the work pool is empty: the request is then refused with
    /// RECEIVER_NOT_READY and retried by the peer. A READ counts against
    /// the depth until its responses have all been sent once (spec 4.8.6).
    pub(crate) fn queue_read_response<B: Backing>(
        &mut self,
        msg_id: u32,
        len: u32,
        source: MemoryTarget,
        sink: MemoryTarget,
        send: &mut SendPools<B, P>,
    ) -> bool {
        let serving = self.reads_in_progress(send, true);
        // Always reserved before the ACCEPT or CONNECT (at least 1).
        let depth = self.send.read_depth.max(1);
        if serving >= u16::from(depth) {
            send.refusals.read_jobs += 1;
            return false;
        }
        let mtu = u32::from(self.params.mtu);
        let entry = WorkEntry {
            job: Job::ReadResponse { source, sink },
            msg_id,
            len,
            packets: len.div_ceil(mtu).max(1),
            ..WorkEntry::VACANT
        };
        let Ok(i) = send.work.push_back(&mut self.send.queue, entry) else {
            send.refusals.read_jobs += 1;
            return false;
        };
        self.send.read_jobs += 1;
        send.read_jobs += 1;
        if self.send.cursor.is_none() {
            self.send.cursor = OptIndex::some(i);
        }
        true
    }

    /// READs in progress (spec 4.8.6): with `serving`, the peer's whose
    /// responses are not all sent yet; else ours sent and not complete
    /// (entries not started yet come last in the queue).
    #[inline(never)]
    fn reads_in_progress<B: Backing>(&self, send: &SendPools<B, P>, serving: bool) -> u16 {
        let mut n = 0;
        for i in send.work.iter(&self.send.queue) {
            let e = send.work.get(i);
            let counts = if serving {
                matches!(e.job, Job::ReadResponse { .. }) && e.started < e.packets
            } else {
                e.is_read() && e.started > 0 && e.error.is_none() && e.read_bytes < e.len
            };
            n += u16::from(counts);
        }
        n
    }

    /// The first entry with packets not yet sent, advancing the cursor past
    /// entries that are fully started or failed (amortised O(1)).
    pub(crate) fn first_unsent<B: Backing>(&mut self, send: &SendPools<B, P>) -> Option<u32> {
        let mut at = self.send.cursor.get();
        while let Some(i) = at {
            let e = send.work.get(i);
            if e.started < e.packets && e.error.is_none() {
                break;
            }
            at = send.work.next_of(i);
        }
        self.send.cursor = at.into();
        // Spec 4.8.6: a READ waits, and the entries after it, while the
        // peer's stated READ depth is taken by READs outstanding (sent,
        // responses not all placed).
        let i = at?;
        let e = send.work.get(i);
        if e.is_read() && e.started == 0 {
            let depth = match self.send.peer_read_depth {
                0 => crate::wire::packet::DEFAULT_READ_DEPTH,
                d => u16::from(d),
            };
            let outstanding = self.reads_in_progress(send, false);
            if outstanding >= depth {
                return None;
            }
        }
        at
    }

    /// Whether new or lost data waits to be sent (pacing aside), with
    /// whether an entry has unsent packets (`first_unsent`) already known
    /// if `unsent` says.
    pub(crate) fn data_waiting<B: Backing>(
        &mut self,
        send: &SendPools<B, P>,
        unsent: Option<bool>,
    ) -> bool {
        if !self.may_send_data() {
            return false;
        }
        if let Some(s) = self.send.state.get() {
            let st = send.senders.get(s);
            if st.lost_pending() > 0 {
                return true;
            }
            if !self.may_send_new(st) {
                return false;
            }
        }
        match unsent {
            Some(u) => u,
            None => self.first_unsent(send).is_some(),
        }
    }

    /// Whether one more new packet fits the PSN window and the start-up
    /// window (new packets in flight, spec 4.10.6).
    pub(crate) fn may_send_new(&self, st: &SenderState<P>) -> bool {
        let span = self.send.nxt.distance_from(self.send.una);
        if span >= self.params.window {
            return false;
        }
        // `n < max(startup_window / mtu, 2)` without the division (this
        // runs several times per packet): `n < 2 || (n + 1) * mtu <= sw`.
        let mtu = u64::from(self.params.mtu.max(1));
        let sw = u64::from(st.startup_window);
        let below = |n: u32| n < 2 || (u64::from(n) + 1) * mtu <= sw;
        below(span) || below(st.in_flight_total())
    }

    /// Whether data may go out: once open, and before the ACCEPT when the
    /// CONNECT carried an early proof (spec 4.2.4).
    pub(crate) fn may_send_data(&self) -> bool {
        self.state.is_open()
            || (crate::crypto::SUPPORTED && self.early() && self.state == ConnState::Connecting)
    }

    /// An early initiator's first flight was not taken (its CONNECT drew a
    /// RETRY; the acceptor kept nothing, so placed nothing) or was sized
    /// for values the ACCEPT did not give: every packet is unsent again,
    /// from the Initial PSN, and goes out once the connection is
    /// established (spec 4.2.4). Nothing was acknowledged, so nothing is
    /// lost or repeated.
    #[cold]
    pub(crate) fn rewind_early<B: Backing>(&mut self, send: &mut SendPools<B, P>) {
        self.release_sender(send);
        let mut cursor = self.send.queue.head();
        while let Some(i) = cursor {
            let e = send.work.get_mut(i);
            e.started = 0;
            e.read_bytes = 0;
            cursor = send.work.next_of(i);
        }
        self.send.nxt = self.send.initial;
        self.send.una = self.send.initial;
        self.send.cursor = OptIndex::from(self.send.queue.head());
        self.send.first_sender = super::FirstSender::grant(0);
    }

    /// Entries posted before the ACCEPT were cut at this end's own MTU:
    /// those not started yet are cut again at the negotiated one.
    pub(crate) fn resegment_unstarted<B: Backing>(&mut self, send: &mut SendPools<B, P>) {
        let mtu = u32::from(self.params.mtu.max(1));
        let mut cursor = self.send.queue.head();
        while let Some(i) = cursor {
            let e = send.work.get_mut(i);
            if e.started == 0 && !e.is_read() {
                e.packets = e.len.div_ceil(mtu).max(1);
            }
            cursor = send.work.next_of(i);
        }
    }

    /// The ACCEPT's Rate Grant reaches a sender that started before it
    /// (an early one): its share and its first flight are the grant's
    /// from now on (spec 4.10.6), not the line rate it started at.
    pub(crate) fn apply_grant<B: Backing>(
        &mut self,
        grant_mbps: u32,
        send: &mut SendPools<B, P>,
        config: &Config,
    ) {
        let (Some(s), true) = (self.send.state.get(), grant_mbps > 0) else {
            return;
        };
        let st = send.senders.get_mut(s);
        st.rate_hint_mbps = grant_mbps;
        st.startup_window = super::sender::granted_window(grant_mbps, config);
        self.send.first_sender = super::FirstSender::NONE;
    }

    /// Takes a sender state from the pool if the connection has none.
    /// `false` (and the connection marked as waiting) when the pool is empty.
    pub(crate) fn ensure_sender<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        config: &Config,
    ) -> Option<u32> {
        if let Some(s) = self.send.state.get() {
            return Some(s);
        }
        // An early sender starts before any grant, with the start-up
        // window: what 63 senders starting together into one host can
        // all send without overflowing its switch port (spec 4.2.4,
        // 4.10.6); the ACCEPT's grant takes over a round trip later.
        match send.senders.alloc(SenderState::new(
            config,
            now,
            self.send.rtt,
            self.send.first_sender.get(),
            self.params.paths,
        )) {
            Some(s) => {
                self.send.state = OptIndex::some(s);
                // A later sender state (after an idle spell) starts from
                // the start-up window: the grant is as old as the handshake.
                self.send.first_sender = super::FirstSender::NONE;
                Some(s)
            }
            None => {
                send.refusals.senders += 1;
                self.send.starved = true;
                None
            }
        }
    }

    /// Gives the sender state and its in-flight records back (idle, closed
    /// or failed). The connection's RTT estimate stays.
    pub(crate) fn release_sender<B: Backing>(&mut self, send: &mut SendPools<B, P>) -> bool {
        let Some(s) = self.send.state.take() else {
            return false;
        };
        if let Some(e) = send.senders.get(s).extent {
            send.inflight.release(e);
        }
        send.senders.free(s);
        send.senders_returned += 1;
        true
    }

    /// Makes room for PSN `psn` in the in-flight records, growing the
    /// extent by doubling. `false` when the records pool has no room.
    fn ensure_record<B: Backing>(&mut self, s: u32, psn: Psn, send: &mut SendPools<B, P>) -> bool {
        let span = psn.distance_from(self.send.una) + 1;
        let st = send.senders.get_mut(s);
        match st.extent {
            Some(e) if span <= e.units() => true,
            Some(e) => {
                let want = (e.units() * 2).max(span.next_power_of_two());
                match send.inflight.grow(e, self.send.una, self.send.nxt, want) {
                    Some(new) => {
                        send.senders.get_mut(s).extent = Some(new);
                        true
                    }
                    None => {
                        send.refusals.inflight_records += 1;
                        self.send.starved = true;
                        false
                    }
                }
            }
            None => {
                let want = FIRST_EXTENT.max(span.next_power_of_two());
                match send.inflight.allocate(want) {
                    Some(new) => {
                        send.senders.get_mut(s).extent = Some(new);
                        true
                    }
                    None => {
                        send.refusals.inflight_records += 1;
                        self.send.starved = true;
                        false
                    }
                }
            }
        }
    }

    fn sending_rate(st: &SenderState<P>) -> u32 {
        let own = st.cc.rate_mbps();
        if st.rate_hint_mbps == 0 {
            own
        } else {
            own.min(st.rate_hint_mbps)
        }
    }

    /// The next data packet, if one is due: a retransmission before new
    /// data (spec 4.6.3), within the windows and the pacing schedule. The
    /// receive side only for a failure (its bitmap goes back).
    pub(crate) fn poll_data<B: Backing>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        regions: &Regions<B>,
        config: &Config,
    ) -> Option<Transmit> {
        if !self.may_send_data() {
            return None;
        }
        // Retransmissions before new data, in the order they were declared
        // lost (spec 4.6.3); new data from the first entry with unsent
        // packets, found once.
        let lost = self
            .send
            .state
            .get()
            .and_then(|s| send.senders.get(s).lost.front());
        let unsent = match lost {
            Some(_) => None,
            None => Some(self.first_unsent(send)?),
        };
        let s = self.ensure_sender(now, send, config)?;
        // A reference, not a copy: the state holds every path's telemetry.
        let st = send.senders.get(s);
        if now < st.rnr_until || now < st.next_send_at {
            return None;
        }
        let (psn, retransmission) = if let Some(psn) = lost {
            (psn, true)
        } else {
            if !self.may_send_new(st) {
                return None;
            }
            let psn = self.send.nxt;
            if !self.ensure_record(s, psn, send) {
                return None;
            }
            (psn, false)
        };
        // Find the message and packet index for this PSN.
        let mtu = u32::from(self.params.mtu);
        let (entry_index, packet_index) = if retransmission {
            let found = send
                .work
                .iter(&self.send.queue)
                .find(|&i| send.work.get(i).holds(psn));
            match found {
                Some(i) => (i, psn.distance_from(send.work.get(i).first_psn)),
                None => {
                    // Its message already failed and left the queue.
                    let st = send.senders.get_mut(s);
                    let e = st.extent?;
                    let mut lost = st.lost;
                    send.inflight.unlink(&mut lost, e, self.send.una, psn);
                    send.inflight.get_mut(e, psn).set_slot(Slot::Acked);
                    send.senders.get_mut(s).lost = lost;
                    return None;
                }
            }
        } else {
            let i = unsent?;
            let e = send.work.get_mut(i);
            if e.started == 0 {
                e.first_psn = psn;
            }
            (i, e.started)
        };
        let entry = *send.work.get(entry_index);
        let offset = packet_index * mtu;
        let chunk = entry.len.saturating_sub(offset).min(mtu);
        let last = packet_index + 1 == entry.packets;
        let mut flags = Flags::NONE;
        if retransmission {
            flags = flags.with(Flags::RETRANSMISSION).with(Flags::ACK_REQUEST);
        }
        let window_nearly_full =
            self.send.nxt.distance_from(self.send.una) + 1 >= self.params.window;
        // Ask for an immediate ACK when this packet ends a message and
        // nothing else is queued behind it (the sender is about to go idle
        // and waits for completions), or when the window is about to fill.
        // Otherwise the receiver's coalescing (spec 4.5) bounds the delay.
        let goes_idle = last
            && send
                .work
                .iter_from(send.work.next_of(entry_index))
                .all(|k| {
                    let e = send.work.get(k);
                    e.started >= e.packets
                });
        if goes_idle || window_nearly_full {
            flags = flags.with(Flags::ACK_REQUEST);
        }
        let msg = MessageSpan {
            id: entry.msg_id,
            offset,
            len: entry.len,
        };
        let (body, payload) = match entry.job {
            Job::User(wr) => {
                let src = PayloadRef {
                    addr: wr.local.addr + u64::from(offset),
                    len: chunk,
                };
                // The local buffer must still be registered (spec 5.1).
                if regions
                    .check(wr.local.key, self.pd, src.addr, u64::from(chunk), Access(0))
                    .is_err()
                {
                    self.fail(Status::LocalProtection, super::Blame::Psn(psn), send, recv);
                    return None;
                }
                user_body(
                    wr,
                    msg,
                    offset,
                    entry.recv_index,
                    entry.msg_id,
                    entry.len,
                    src,
                )
            }
            Job::ReadResponse { source, sink } => {
                let src = PayloadRef {
                    addr: source.addr + u64::from(offset),
                    len: chunk,
                };
                // The source must still be registered for remote reads
                // (spec 4.8.6): the application may have deregistered it
                // while the responses stream.
                if regions
                    .check(
                        source.key,
                        self.pd,
                        src.addr,
                        u64::from(chunk),
                        Access::REMOTE_READ,
                    )
                    .is_err()
                {
                    self.fail(Status::LocalProtection, super::Blame::Psn(psn), send, recv);
                    return None;
                }
                (
                    Body::ReadResponse(ReadResponseRepr {
                        msg,
                        target: MemoryTarget {
                            key: sink.key,
                            addr: sink.addr.wrapping_add(u64::from(offset)),
                        },
                    }),
                    Some(src),
                )
            }
        };
        let payload = payload.filter(|p| p.len > 0);
        let payload_len = payload.map_or(0, |p| p.len as u16);
        let min_rtt = self.send.rtt.min_ns();
        let path = send
            .senders
            .get_mut(s)
            .choose_path(self.params.paths, min_rtt);
        let repr = Repr {
            header: self.header(now, psn.get(), path, flags),
            body,
            payload_len,
        };
        let t = self.transmit(now, &repr, buf, path, ecn::ECT0, payload)?;
        // Commit the send: the record goes to the outstanding list's end
        // (the newest transmission), from the lost list if resent.
        let una = self.send.una;
        let SendPools {
            senders,
            inflight,
            work,
            ..
        } = send;
        let st = senders.get_mut(s);
        let e = st.extent?;
        if retransmission {
            inflight.unlink(&mut st.lost, e, una, psn);
        }
        let record = inflight.get_mut(e, psn);
        // A new PSN reuses a ring slot whose last PSN is gone: it starts
        // counting afresh.
        let transmissions = if retransmission {
            (record.transmissions() + 1).min(63)
        } else {
            1
        };
        record.sent_ts = now.wire_timestamp();
        record.path = path;
        record.meta = (transmissions << 2) | Slot::InFlight as u8;
        inflight.push_back(&mut st.outstanding, e, psn);
        st.on_sent(path, retransmission);
        st.idle_since = MaybeInstant::NONE;
        if retransmission {
            self.counters.retransmissions += 1;
        } else {
            self.send.nxt = self.send.nxt.next();
            work.get_mut(entry_index).started += 1;
            self.counters.packets_sent += 1;
            self.counters.bytes_sent += u64::from(chunk);
            let span = self.send.nxt.distance_from(self.send.una);
            self.counters.max_in_flight = self.counters.max_in_flight.max(span);
        }
        if st.rto_deadline.is_none() {
            // Nothing was outstanding: the ride-through clock starts now.
            st.progress_at = now;
            st.rto_deadline = MaybeInstant::some(self.rto_deadline(now, st, config));
        }
        self.arm_probe(now, st, config);
        // Pacing: the next packet may leave once this one has been
        // serialized at the current rate.
        let rate = Self::sending_rate(st);
        let gap = serialization_nanos(t.packet_len() + 50, rate);
        let base = st.next_send_at.max(now.minus_nanos(gap));
        st.next_send_at = base.plus_nanos(gap);
        Some(t)
    }
}

/// The body and payload of a user request's packet at `offset`.
fn user_body(
    wr: WorkRequest,
    msg: MessageSpan,
    offset: u32,
    recv_index: u32,
    msg_id: u32,
    len: u32,
    src: PayloadRef,
) -> (Body, Option<PayloadRef>) {
    match wr.op {
        Op::Write { remote } => (
            Body::Write(WriteRepr {
                msg,
                target: MemoryTarget {
                    key: remote.key,
                    addr: remote.addr.wrapping_add(u64::from(offset)),
                },
                imm: None,
            }),
            Some(src),
        ),
        Op::WriteImm { remote, imm } => (
            Body::Write(WriteRepr {
                msg,
                target: MemoryTarget {
                    key: remote.key,
                    addr: remote.addr.wrapping_add(u64::from(offset)),
                },
                imm: Some(WriteImm { imm, recv_index }),
            }),
            Some(src),
        ),
        Op::Send => (
            Body::Send(SendRepr {
                msg,
                recv_index,
                imm: None,
            }),
            Some(src),
        ),
        Op::SendImm { imm } => (
            Body::Send(SendRepr {
                msg,
                recv_index,
                imm: Some(imm),
            }),
            Some(src),
        ),
        Op::Read { remote } => (
            Body::ReadRequest(ReadRequestRepr {
                msg_id,
                len,
                source: remote,
                sink: MemoryTarget {
                    key: wr.local.key,
                    addr: wr.local.addr,
                },
            }),
            None,
        ),
    }
}
