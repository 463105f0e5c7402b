//! The receiver (spec 4.3, 4.5, 4.7, 4.8): checks in order, placement of
//! each packet where it says, receive buffers, and the ACKs and NAKs that
//! answer.

use super::{Blame, ConnState, Connection, RecvEntry, RecvPool, RecvPools, Regions, SendPools};
use crate::api::{Access, LocalBuf, Memory, RecvRequest, Status, Transmit};
use crate::config::Config;
use crate::psn::Psn;
use crate::storage::list::OptIndex;
use crate::storage::Backing;
use crate::time::{Instant, MaybeInstant};
use crate::wire::encap::ecn;
use crate::wire::{AckRepr, Body, Flags, Header, MessageSpan, NakReason, NakRepr, Repr};

use super::send::PostRefusal;

/// The completion status a NAK reason stands for, on either side.
pub(crate) fn status_of(reason: NakReason) -> Status {
    match reason {
        NakReason::InvalidKey => Status::RemoteInvalidKey,
        NakReason::AccessDenied => Status::RemoteAccess,
        NakReason::OutOfBounds => Status::RemoteBounds,
        NakReason::ReceiveTooSmall => Status::ReceiveTooSmall,
        NakReason::ProtocolError | NakReason::ReceiverNotReady => Status::RemoteProtocol,
    }
}

impl<const P: usize> Connection<P> {
    /// Posts a receive buffer (spec 4.8).
    pub(crate) fn post_recv<B: Backing>(
        &mut self,
        req: RecvRequest,
        recv: &mut RecvPools<B>,
        config: &Config,
    ) -> Result<(), PostRefusal> {
        if self.recv.queue.len() >= u32::from(config.recv_queue_limit) {
            return Err(PostRefusal::QueueFull);
        }
        let entry = RecvEntry {
            req,
            number: self.recv.base.wrapping_add(self.recv.queue.len()),
            ..RecvEntry::VACANT
        };
        if recv.recvs.push_back(&mut self.recv.queue, entry).is_err() {
            recv.refusals.recv_entries += 1;
            return Err(PostRefusal::PoolEmpty);
        }
        Ok(())
    }

    /// Gives the out-of-order bitmap back (the connection takes no more
    /// reliable packets).
    pub(crate) fn release_receiver<B: Backing>(&mut self, recv: &mut RecvPools<B>) {
        self.recv.win.discard(&mut recv.reorder);
    }

    /// A reliable packet whose connection id and token matched (spec 4.7.1
    /// from the state check on). The send side for a READ's request or
    /// response, and for a failure.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_reliable<B: Backing>(
        &mut self,
        now: Instant,
        repr: &Repr,
        payload: &[u8],
        ce: bool,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        regions: &Regions<B>,
        mem: &mut impl Memory,
        config: &Config,
    ) -> ReliableOutcome {
        let h = &repr.header;
        if let Some((nak_psn, reason)) = self.recv.sticky_nak {
            // Sticky error: every later packet hears the same NAK (spec 4.7.2).
            self.queue_nak(h.path, nak_psn, reason, recv);
            return ReliableOutcome::Refused;
        }
        // An acceptor that took an early CONNECT places its first flight
        // before the initiator confirms (spec 4.2.4).
        let open = self.state.is_open()
            || (crate::crypto::SUPPORTED && self.early() && self.state == ConnState::Accepting);
        if !open || h.path >= self.params.paths {
            self.counters.invalid_dropped += 1;
            recv.rx_refusals.invalid += 1;
            return ReliableOutcome::Dropped;
        }
        let psn = Psn(h.psn);
        let d = psn.offset_from(self.recv.win.cum);
        if d < 0 || (d > 0 && self.recv.win.received(&recv.reorder, psn)) {
            self.counters.duplicates_received += 1;
            self.count_on_path(h.path, ce);
            self.note_echo(h);
            self.recv.ack_now = true;
            return ReliableOutcome::Duplicate;
        }
        // Spec 4.3: only PSNs inside the negotiated window are accepted.
        if d as u32 >= self.params.window {
            self.counters.out_of_window += 1;
            recv.rx_refusals.out_of_window += 1;
            return ReliableOutcome::Dropped;
        }
        // Room to record it comes before placement: a packet that cannot
        // be recorded must not be placed either (spec 4.14.3), or its
        // retransmission would be placed a second time unseen.
        // Spec 3.5: from here on the packet counts on its path, whatever
        // becomes of it (new, refused, or not recordable).
        self.count_on_path(h.path, ce);
        if d > 0 && self.recv.win.reserve(&mut recv.reorder, d as u32).is_err() {
            self.counters.reorder_refused += 1;
            recv.refusals.reorder_words += 1;
            return ReliableOutcome::Dropped;
        }
        if let Err(reason) = self.place(repr, payload, send, recv, regions, mem) {
            self.queue_nak(h.path, h.psn, reason, recv);
            recv.rx_refusals.count_nak(reason);
            if reason.is_fatal() {
                self.recv.sticky_nak = Some((h.psn, reason));
                self.fail(status_of(reason), Blame::Nobody, send, recv);
            }
            return ReliableOutcome::Refused;
        }
        // Whether it fills a gap (something sent after it came first).
        let late = self.recv.win.fills_gap(d, psn);
        // Accepted: record it (spec 4.3); room was reserved above.
        let _ = self.recv.win.record(&mut recv.reorder, psn, d as u32);
        self.counters.packets_received += 1;
        self.counters.bytes_received += payload.len() as u64;
        self.recv.last_data_rx = MaybeInstant::some(now);
        self.note_echo(h);
        self.recv.ack_pending = self.recv.ack_pending.saturating_add(1);
        // Out of order, a packet that fills a gap is acknowledged at once
        // (it came by a slower path, whose round-trip estimate the sender
        // needs before it judges that path's packets lost), one that opens
        // or widens a gap every second packet. Sprayed over 16 paths nearly
        // every packet arrives out of order: an ACK for each took 3-4 % of
        // the receiving host's own sending line (loss-free permutation:
        // p50 1.116x -> 1.101x, p99 1.185x -> 1.176x of the floor, keyed;
        // every fourth instead drew spurious retransmissions from stale
        // path estimates, and at 10 % loss a longer p99).
        if ce
            || late
            || (d != 0 && self.recv.ack_pending >= 2)
            || h.flags.contains(Flags::ACK_REQUEST)
            || self.recv.ack_pending >= config.ack_every
            // Quick ACKs (spec 4.5): each of a connection's first
            // `ack_every` packets, so that one lost ACK cannot stall a
            // start-up window that draws only one (10 % loss: 50-150 us).
            || self.counters.packets_received <= u32::from(config.ack_every)
        {
            self.recv.ack_now = true;
        } else if self.recv.ack_due.is_none() {
            self.recv.ack_due = MaybeInstant::some(now + config.ack_delay);
        }
        ReliableOutcome::Placed
    }

    /// Each refused packet gets a NAK of its own (spec 3.7, 4.7), queued
    /// at the endpoint; when the queue is full it is counted instead, and
    /// the sender's retransmission draws it again.
    fn queue_nak<B: Backing>(
        &mut self,
        path: u16,
        psn: u32,
        reason: NakReason,
        recv: &mut RecvPools<B>,
    ) {
        let q = super::QueuedNak {
            conn: self.local_id,
            psn,
            path: if path < self.params.paths { path } else { 0 },
            reason,
        };
        if recv.naks.push_back(q).is_err() {
            recv.refusals.naks += 1;
        }
    }

    /// Counts a reliable packet on its path, for the echo (spec 3.5): every
    /// packet that passed the window check, duplicates and refused ones
    /// included, so CE marks on them reach the sender too.
    fn count_on_path(&mut self, path: u16, ce: bool) {
        let p = usize::from(path) % P;
        self.recv.rx_count[p] = self.recv.rx_count[p].wrapping_add(1);
        if ce {
            self.recv.ce_count[p] = self.recv.ce_count[p].wrapping_add(1);
            self.counters.ce_received += 1;
        }
    }

    fn note_echo(&mut self, h: &Header) {
        self.recv.echo_psn = h.psn;
        self.recv.echo_ts = h.timestamp;
        self.recv.echo_path = h.path;
    }

    /// Validates and places one reliable packet. Nothing is written unless
    /// every check passes (spec 5.1). The send side holds the READs: the
    /// answers to the peer's and ours its responses complete.
    fn place<B: Backing>(
        &mut self,
        repr: &Repr,
        payload: &[u8],
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        regions: &Regions<B>,
        mem: &mut impl Memory,
    ) -> Result<(), NakReason> {
        // Spec 3.7: a payload above the negotiated MTU is a protocol error.
        if payload.len() > usize::from(self.params.mtu) {
            return Err(NakReason::ProtocolError);
        }
        let len = payload.len() as u64;
        match repr.body {
            Body::Write(w) => {
                let receive = match w.imm {
                    Some(wi) => Some(
                        self.claim_receive(wi.recv_index, w.msg, Some(wi.imm), true, None, recv)?
                            .1,
                    ),
                    None => None,
                };
                regions.check(
                    w.target.key,
                    self.pd,
                    w.target.addr,
                    len,
                    Access::REMOTE_WRITE,
                )?;
                mem.write(w.target.addr, payload);
                if let Some(i) = receive {
                    recv.recvs.get_mut(i).bytes += payload.len() as u32;
                }
            }
            Body::Send(s) => {
                let (buf, receive) =
                    self.claim_receive(s.recv_index, s.msg, s.imm, false, Some(payload), recv)?;
                let addr = buf.addr + u64::from(s.msg.offset);
                regions.check(buf.key, self.pd, addr, len, Access::LOCAL_WRITE)?;
                mem.write(addr, payload);
                recv.recvs.get_mut(receive).bytes += payload.len() as u32;
            }
            Body::ReadRequest(r) => {
                regions.check(
                    r.source.key,
                    self.pd,
                    r.source.addr,
                    u64::from(r.len),
                    Access::REMOTE_READ,
                )?;
                if !self.queue_read_response(r.msg_id, r.len, r.source, r.sink, send) {
                    return Err(NakReason::ReceiverNotReady);
                }
            }
            Body::ReadResponse(r) => {
                let entry = send
                    .work
                    .iter(&self.send.queue)
                    .find(|&i| {
                        let e = send.work.get(i);
                        e.is_read() && e.msg_id == r.msg.id && e.started > 0
                    })
                    .ok_or(NakReason::ProtocolError)?;
                let e = *send.work.get(entry);
                let super::Job::User(wr) = e.job else {
                    return Err(NakReason::ProtocolError);
                };
                let expected_addr = wr.local.addr.checked_add(u64::from(r.msg.offset));
                let fits = u64::from(r.msg.offset) + len <= u64::from(wr.local.len);
                if r.msg.len != wr.local.len
                    || expected_addr != Some(r.target.addr)
                    || r.target.key != wr.local.key
                    || !fits
                {
                    return Err(NakReason::ProtocolError);
                }
                regions.check(
                    wr.local.key,
                    self.pd,
                    r.target.addr,
                    len,
                    Access::LOCAL_WRITE,
                )?;
                mem.write(r.target.addr, payload);
                send.work.get_mut(entry).read_bytes += payload.len() as u32;
            }
            _ => return Err(NakReason::ProtocolError),
        }
        Ok(())
    }

    /// Finds the receive a SEND or WRITE_IMM packet belongs to, claiming it
    /// for the message on first contact. Returns its buffer and its place
    /// in the pool (where the packet's bytes are credited once placed).
    fn claim_receive<B: Backing>(
        &mut self,
        recv_index: u32,
        msg: MessageSpan,
        imm: Option<u32>,
        write_imm: bool,
        send_payload: Option<&[u8]>,
        recv: &mut RecvPools<B>,
    ) -> Result<(LocalBuf, u32), NakReason> {
        let slot = recv_index.wrapping_sub(self.recv.base) as i32;
        if slot < 0 {
            return Err(NakReason::ProtocolError);
        }
        let i = self
            .find_receive::<B>(slot as u32, &recv.recvs)
            .ok_or(NakReason::ReceiverNotReady)?;
        let entry = recv.recvs.get_mut(i);
        if send_payload.is_some() && msg.len > entry.req.local.len {
            return Err(NakReason::ReceiveTooSmall);
        }
        match entry.claimed_by {
            None => {
                entry.claimed_by = Some(msg.id);
                entry.msg_len = msg.len;
                entry.imm = imm;
                entry.write_imm = write_imm;
            }
            Some(id) if id == msg.id && entry.msg_len == msg.len => {}
            Some(_) => return Err(NakReason::ProtocolError),
        }
        Ok((entry.req.local, i))
    }

    /// The receive `n` places from the queue's front, found from the
    /// finger when it is at or before it (the packets of one message claim
    /// the same receive, the next message the one after), else from the
    /// front; the finger moves to it.
    fn find_receive<B: Backing>(&mut self, n: u32, recvs: &RecvPool<B>) -> Option<u32> {
        if n >= self.recv.queue.len() {
            return None;
        }
        let mut at = 0;
        let mut i = self.recv.queue.head()?;
        if let Some(f) = self.recv_finger.get() {
            let place = recvs.get(f).number.wrapping_sub(self.recv.base);
            if place <= n {
                (at, i) = (place, f);
            }
        }
        while at < n {
            i = recvs.next_of(i)?;
            at += 1;
        }
        self.recv_finger = OptIndex::some(i);
        Some(i)
    }

    /// An ACK now (spec 4.5), carrying `rate_hint_mbps`.
    pub(crate) fn emit_ack<B: Backing>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        rate_hint_mbps: u32,
        recv: &RecvPools<B>,
    ) -> Option<Transmit> {
        let path = (self.recv.echo_path as usize % P) as u8;
        let (sack_offset, sack) = self
            .recv
            .win
            .sack_block(&recv.reorder, Psn(self.recv.echo_psn));
        let repr = Repr {
            // The PSN field of an ACK is informational: the next PSN this
            // end will send (spec 3.2.4).
            header: self.header(now, self.send.nxt.get(), path, Flags::NONE),
            body: Body::Ack(AckRepr {
                cumulative: self.recv.win.cum.get(),
                echo_psn: self.recv.echo_psn,
                echo_timestamp: self.recv.echo_ts,
                echo_path: u16::from(path),
                path_rx_count: self.recv.rx_count[usize::from(path)],
                path_ce_count: self.recv.ce_count[usize::from(path)],
                rate_hint_mbps,
                sack_offset,
                sack,
            }),
            payload_len: 0,
        };
        let t = self.transmit(now, &repr, buf, path, ecn::NOT_ECT, None)?;
        self.recv.ack_now = false;
        self.recv.ack_due = MaybeInstant::NONE;
        self.recv.ack_pending = 0;
        self.counters.acks_sent += 1;
        Some(t)
    }

    /// A queued NAK now (spec 4.7), with the cumulative PSN of now, on the
    /// refused packet's path; counted when it goes out.
    pub(crate) fn emit_nak(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        q: &super::QueuedNak,
    ) -> Option<Transmit> {
        let path = (usize::from(q.path) % P) as u8;
        let repr = Repr {
            header: self.header(now, self.send.nxt.get(), path, Flags::NONE),
            body: Body::Nak(NakRepr {
                cumulative: self.recv.win.cum.get(),
                nak_psn: q.psn,
                reason: q.reason,
            }),
            payload_len: 0,
        };
        let t = self.transmit(now, &repr, buf, path, ecn::NOT_ECT, None)?;
        self.counters.naks_sent += 1;
        Some(t)
    }

    /// Whether an ACK may go out now (only while open: a flag left over
    /// from a packet that arrived as the connection ended must not keep
    /// the caller spinning).
    pub(crate) fn ack_ready(&self) -> bool {
        self.recv.ack_now && self.acks_allowed()
    }

    /// Whether this end acknowledges: while open, and as an acceptor that
    /// took an early CONNECT, from its first flight on (the job key proved
    /// the address, spec 4.2.4).
    pub(crate) fn acks_allowed(&self) -> bool {
        matches!(self.state, ConnState::Established | ConnState::Closing)
            || (crate::crypto::SUPPORTED && self.early() && self.state == ConnState::Accepting)
    }
}

/// What happened to a reliable packet at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReliableOutcome {
    /// Placed and recorded: the connection is an active sender to us.
    Placed,
    /// Already had it: acknowledged again.
    Duplicate,
    /// Refused with a NAK.
    Refused,
    /// Dropped silently and counted.
    Dropped,
}
