//! One RC queue pair: the requester (send queue, go-back-N, retry and RNR
//! timers, READ re-issue), the responder (in-order execution, duplicates,
//! ACK coalescing, READ responses, NAKs), the DCQCN notification point and
//! the pacer.
//!
//! Behaviour follows IBA Vol. 1 chapter 9.7 ("Reliable service"), with the
//! choices Linux rxe and RoCE NICs make where the spec leaves room; each is
//! noted where it is made.

use heapless::Deque;
use metaroce_core::api::{
    Access, Completion, ConnHandle, Memory, Op, Opcode as CqOpcode, PayloadRef, RecvRequest,
    Status, WorkRequest,
};
use metaroce_core::Instant;

use crate::cc::{Cc, CongestionControl};
use crate::config::{Config, QpSetup, RNR_RETRY_INFINITE};
use crate::psn;
use crate::regions::{AccessError, Regions};
use crate::stats::QpCounters;
use crate::wire::aeth::{rnr_timer_nanos, UNLIMITED_CREDITS};
use crate::wire::bth::Position;
use crate::wire::{AethRepr, BthRepr, NakCode, Opcode, Repr, RethRepr, Syndrome};

/// Send-queue depth of each QP.
pub const SQ_DEPTH: usize = 64;
/// Receive-queue depth of each QP.
pub const RQ_DEPTH: usize = 64;
/// Completion-queue depth of each QP: one entry per posted work request,
/// so it can never overflow (posting is refused when it could).
pub const CQ_DEPTH: usize = SQ_DEPTH + RQ_DEPTH;
/// Largest `max_dest_rd_atomic` honoured (READ responses held at once).
pub const MAX_DEST_RD_ATOMIC: usize = 16;
/// Responder output queue: READ jobs, plus an ACK or NAK between each.
const RESP_DEPTH: usize = 2 * MAX_DEST_RD_ATOMIC + 4;
/// Largest message (IBA: 2^31 bytes).
pub const MAX_MESSAGE_LEN: u32 = 1 << 31;

/// Queue-pair state (the subset of the IBA QP states a wired QP goes through).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum QpState {
    /// Ready to send (RTS): both directions work.
    ReadyToSend,
    /// A fatal error happened; outstanding work was flushed.
    Error,
}

/// Why a post was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PostError {
    /// The queue, or the completions it could produce, would not fit.
    QueueFull,
    /// The local buffer's key, domain, rights or bounds are wrong.
    LocalProtection,
    /// Longer than 2^31 bytes.
    TooLong,
    /// Its packets would put more than 2^23 PSNs in flight.
    PsnWindow,
}

#[derive(Debug, Clone, Copy)]
struct SendWqe {
    wr: WorkRequest,
    first_psn: u32,
    /// PSNs the message occupies (a READ: its response packets).
    npkts: u32,
}

impl SendWqe {
    fn is_read(&self) -> bool {
        matches!(self.wr.op, Op::Read { .. })
    }

    fn end_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts)
    }
}

/// A multi-packet message the responder is in the middle of.
#[derive(Debug, Clone, Copy)]
enum Inbound {
    Send { recv: RecvRequest, offset: u32 },
    Write { va: u64, remaining: u32, total: u32 },
}

#[derive(Debug, Clone, Copy)]
struct ReadJob {
    first_psn: u32,
    npkts: u32,
    next: u32,
    va: u64,
    len: u32,
    msn: u32,
}

#[derive(Debug, Clone, Copy)]
enum RespItem {
    /// An ACKNOWLEDGE packet: ACK, RNR NAK or NAK.
    Ack {
        psn: u32,
        aeth: AethRepr,
    },
    Read(ReadJob),
}

/// Why the responder refuses a request.
enum Reject {
    /// No receive posted: RNR NAK, the requester retries later.
    NotReady,
    /// A fatal NAK; the QP goes to the error state.
    Fatal(NakCode),
    ReceiveTooSmall(RecvRequest),
}

/// What a QP reads from its endpoint while handling a packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Env<'a> {
    pub cfg: &'a Config,
    pub regions: &'a Regions,
}

/// A packet the QP hands out: headers to emit and payload to gather.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing {
    pub repr: Repr,
    pub payload: Option<PayloadRef>,
}

fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

fn cq_opcode(op: &Op) -> CqOpcode {
    match op {
        Op::Write { .. } => CqOpcode::Write,
        Op::WriteImm { .. } => CqOpcode::WriteImm,
        Op::Send | Op::SendImm { .. } => CqOpcode::Send,
        Op::Read { .. } => CqOpcode::Read,
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Qp {
    handle: ConnHandle,
    setup: QpSetup,
    src_port: u16,
    state: QpState,
    mtu: u32,

    // Requester.
    sq: Deque<SendWqe, SQ_DEPTH>,
    /// PSN of the next posted message.
    next_psn: u32,
    /// Oldest PSN not yet acknowledged (or, inside a READ, not yet received).
    una: u32,
    /// Next PSN to transmit; go-back-N moves it back to `una`.
    tx_psn: u32,
    /// One past the highest PSN ever transmitted.
    max_sent: u32,
    /// One past the highest PSN any ACK covered (may pass an unfinished READ).
    acked_to: u32,
    retry_left: u8,
    rnr_left: u8,
    retry_deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// The PSN a retry started from since the last progress, so duplicate
    /// NAKs for the same loss do not restart it again.
    last_rewind: Option<u32>,

    // Responder.
    rq: Deque<RecvRequest, RQ_DEPTH>,
    epsn: u32,
    msn: u32,
    inbound: Option<Inbound>,
    /// A sequence-error NAK was sent for the current gap.
    nak_sent: bool,
    unacked: u16,
    resp: Deque<RespItem, RESP_DEPTH>,

    // Congestion control and pacing.
    cnp_pending: bool,
    last_cnp: Option<Instant>,
    cc: Cc,
    next_send: Instant,
    prefer_responses: bool,

    cq: Deque<Completion, CQ_DEPTH>,
    counters: QpCounters,
}

impl Qp {
    pub(crate) fn new(handle: ConnHandle, setup: QpSetup, cfg: &Config) -> Qp {
        let send_psn = setup.send_psn & psn::MASK;
        Qp {
            handle,
            setup,
            src_port: setup.src_port(),
            state: QpState::ReadyToSend,
            mtu: u32::from(setup.mtu),
            sq: Deque::new(),
            next_psn: send_psn,
            una: send_psn,
            tx_psn: send_psn,
            max_sent: send_psn,
            acked_to: send_psn,
            retry_left: cfg.retry_count,
            rnr_left: cfg.rnr_retry,
            retry_deadline: None,
            rnr_until: None,
            last_rewind: None,
            rq: Deque::new(),
            epsn: setup.recv_psn & psn::MASK,
            msn: 0,
            inbound: None,
            nak_sent: false,
            unacked: 0,
            resp: Deque::new(),
            cnp_pending: false,
            last_cnp: None,
            cc: Cc::new(&cfg.cc, cfg.line_rate_bps),
            next_send: Instant::ZERO,
            prefer_responses: false,
            cq: Deque::new(),
            counters: QpCounters::default(),
        }
    }

    pub(crate) fn setup(&self) -> &QpSetup {
        &self.setup
    }

    pub(crate) fn src_port(&self) -> u16 {
        self.src_port
    }

    pub(crate) fn state(&self) -> QpState {
        self.state
    }

    pub(crate) fn counters(&self) -> &QpCounters {
        &self.counters
    }

    pub(crate) fn cc(&self) -> &Cc {
        &self.cc
    }

    /// Work requests and completions this QP holds, so the CQ never overflows.
    fn pending_entries(&self) -> usize {
        let inbound_recv = usize::from(matches!(self.inbound, Some(Inbound::Send { .. })));
        self.sq.len() + self.rq.len() + inbound_recv + self.cq.len()
    }

    fn push_completion(&mut self, c: Completion) {
        // Cannot fail: posting keeps pending_entries() <= CQ_DEPTH.
        let _ = self.cq.push_back(c);
    }

    pub(crate) fn pop_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }

    pub(crate) fn has_completions(&self) -> bool {
        !self.cq.is_empty()
    }

    /// Whether `poll_transmit` could return a packet at some instant: a
    /// CNP or acknowledgment waiting, a READ response or a request to
    /// send. When false it returns `None` whenever asked until the QP
    /// changes.
    pub(crate) fn may_transmit(&self) -> bool {
        self.cnp_pending
            || matches!(self.resp.front(), Some(RespItem::Ack { .. }))
            || self.has_read_response()
            || self.has_request_to_send()
    }

    fn complete_send(&mut self, w: &SendWqe, status: Status) {
        self.push_completion(Completion {
            conn: self.handle,
            wr_id: w.wr.id,
            opcode: cq_opcode(&w.wr.op),
            status,
            byte_len: if status == Status::Success {
                w.wr.local.len
            } else {
                0
            },
            imm: None,
        });
    }

    fn complete_recv(
        &mut self,
        recv: &RecvRequest,
        opcode: CqOpcode,
        status: Status,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        self.push_completion(Completion {
            conn: self.handle,
            wr_id: recv.id,
            opcode,
            status,
            byte_len,
            imm,
        });
    }

    // ---- Posting ----------------------------------------------------------

    pub(crate) fn post_send(
        &mut self,
        wr: WorkRequest,
        regions: &Regions,
    ) -> Result<(), PostError> {
        if self.sq.is_full() || self.pending_entries() >= CQ_DEPTH {
            return Err(PostError::QueueFull);
        }
        if wr.local.len > MAX_MESSAGE_LEN {
            return Err(PostError::TooLong);
        }
        if self.state == QpState::Error {
            let w = SendWqe {
                wr,
                first_psn: 0,
                npkts: 0,
            };
            self.complete_send(&w, Status::Flushed);
            return Ok(());
        }
        // READ places into the local buffer; other operations only read it,
        // which IBA always allows for registered memory.
        let need = match wr.op {
            Op::Read { .. } => Access::LOCAL_WRITE,
            _ => Access(0),
        };
        if wr.local.len > 0 {
            regions
                .check(
                    wr.local.key,
                    wr.local.addr,
                    u64::from(wr.local.len),
                    need,
                    self.setup.pd,
                )
                .map_err(|_| PostError::LocalProtection)?;
        }
        let npkts = packets_for(wr.local.len, self.mtu);
        let in_flight = psn::diff(self.next_psn, self.una).max(0) as u64;
        if in_flight + u64::from(npkts) >= u64::from(psn::HALF) {
            return Err(PostError::PsnWindow);
        }
        let w = SendWqe {
            wr,
            first_psn: self.next_psn,
            npkts,
        };
        self.next_psn = w.end_psn();
        // Cannot fail: checked is_full above.
        let _ = self.sq.push_back(w);
        Ok(())
    }

    pub(crate) fn post_recv(
        &mut self,
        rr: RecvRequest,
        regions: &Regions,
    ) -> Result<(), PostError> {
        if self.rq.is_full() || self.pending_entries() >= CQ_DEPTH {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Error {
            self.complete_recv(&rr, CqOpcode::Recv, Status::Flushed, 0, None);
            return Ok(());
        }
        if rr.local.len > 0 {
            regions
                .check(
                    rr.local.key,
                    rr.local.addr,
                    u64::from(rr.local.len),
                    Access::LOCAL_WRITE,
                    self.setup.pd,
                )
                .map_err(|_| PostError::LocalProtection)?;
        }
        let _ = self.rq.push_back(rr);
        Ok(())
    }

    // ---- Errors -----------------------------------------------------------

    /// Moves to the error state: the oldest send WR completes with `status`,
    /// everything else is flushed. `keep_responses` keeps the queued NAK
    /// that reports a responder-side error.
    fn enter_error(&mut self, status: Status, keep_responses: bool) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        let mut first = true;
        while let Some(w) = self.sq.pop_front() {
            self.complete_send(&w, if first { status } else { Status::Flushed });
            first = false;
        }
        if let Some(Inbound::Send { recv, .. }) = self.inbound.take() {
            self.complete_recv(&recv, CqOpcode::Recv, Status::Flushed, 0, None);
        }
        while let Some(r) = self.rq.pop_front() {
            self.complete_recv(&r, CqOpcode::Recv, Status::Flushed, 0, None);
        }
        if !keep_responses {
            self.resp.clear();
        } else {
            // Only ACKNOWLEDGE packets (the NAK) go out in the error state.
            let mut kept: Deque<RespItem, RESP_DEPTH> = Deque::new();
            while let Some(item) = self.resp.pop_front() {
                if let RespItem::Ack { .. } = item {
                    let _ = kept.push_back(item);
                }
            }
            self.resp = kept;
        }
        self.cnp_pending = false;
        self.retry_deadline = None;
        self.rnr_until = None;
        self.tx_psn = self.next_psn;
    }

    // ---- Requester: acknowledgments --------------------------------------

    /// Forward progress: the retry counters and timer restart.
    fn on_progress(&mut self, now: Instant, cfg: &Config) {
        self.retry_left = cfg.retry_count;
        self.rnr_left = cfg.rnr_retry;
        self.last_rewind = None;
        self.retry_deadline = if self.una == self.max_sent {
            None
        } else {
            Some(now + cfg.local_ack_timeout)
        };
    }

    /// Completes the messages acknowledged below `end` (exclusive). READs
    /// complete only through their responses, so an unfinished READ stops
    /// the walk.
    fn acknowledge(&mut self, now: Instant, end: u32, cfg: &Config) {
        if psn::lt(self.acked_to, end) {
            self.acked_to = end;
        }
        let start = self.una;
        while let Some(w) = self.sq.front().copied() {
            if w.is_read() || !psn::lt(self.una, end) {
                break;
            }
            if psn::le(w.end_psn(), end) {
                self.una = w.end_psn();
                self.sq.pop_front();
                self.complete_send(&w, Status::Success);
            } else {
                self.una = end;
                break;
            }
        }
        if self.una != start {
            self.on_progress(now, cfg);
        }
    }

    /// Go back to `una` after a NAK or a gap, once per loss: a second signal
    /// for the same PSN before any progress is the same loss.
    fn rewind(&mut self) -> bool {
        if self.last_rewind == Some(self.una) {
            return false;
        }
        if self.retry_left == 0 {
            self.enter_error(Status::RetryExceeded, false);
            return false;
        }
        self.retry_left -= 1;
        self.tx_psn = self.una;
        self.last_rewind = Some(self.una);
        true
    }

    /// An ACK past an unfinished READ means its responses were lost (the
    /// IBA's "implied NAK"): re-issue the READ for what is missing.
    fn check_read_gap(&mut self) {
        let blocked = matches!(self.sq.front(), Some(w) if w.is_read());
        if blocked && psn::lt(self.una, self.acked_to) && self.rewind() {
            self.counters.read_gaps += 1;
        }
    }

    fn on_acknowledge(&mut self, now: Instant, bth: &BthRepr, aeth: AethRepr, cfg: &Config) {
        let p = bth.psn;
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                self.counters.acks_received += 1;
                let end = psn::add(p, 1);
                if psn::lt(self.max_sent, end) {
                    self.counters.stale_responses += 1;
                    return;
                }
                self.acknowledge(now, end, cfg);
                self.check_read_gap();
            }
            Syndrome::RnrNak { timer } => {
                self.counters.rnr_naks_received += 1;
                if !psn::lt(p, self.max_sent) {
                    self.counters.stale_responses += 1;
                    return;
                }
                self.acknowledge(now, p, cfg);
                if self.rnr_left == 0 {
                    self.enter_error(Status::ReceiverNotReadyExceeded, false);
                    return;
                }
                if self.rnr_left != RNR_RETRY_INFINITE {
                    self.rnr_left -= 1;
                }
                self.rnr_until =
                    Some(now + core::time::Duration::from_nanos(rnr_timer_nanos(timer)));
                self.tx_psn = self.una;
                self.last_rewind = Some(self.una);
                self.retry_deadline = None;
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.counters.seq_naks_received += 1;
                if !psn::lt(p, self.max_sent) {
                    self.counters.stale_responses += 1;
                    return;
                }
                self.acknowledge(now, p, cfg);
                if !self.rewind() {
                    self.counters.seq_naks_ignored += 1;
                }
            }
            Syndrome::Nak(code) => {
                self.counters.fatal_naks_received += 1;
                if psn::lt(self.max_sent, p) {
                    self.counters.stale_responses += 1;
                    return;
                }
                self.acknowledge(now, p, cfg);
                let status = match code {
                    NakCode::RemoteAccessError => Status::RemoteAccess,
                    _ => Status::RemoteProtocol,
                };
                self.enter_error(status, false);
            }
        }
    }

    fn on_read_response(
        &mut self,
        now: Instant,
        bth: &BthRepr,
        payload: &[u8],
        cfg: &Config,
        mem: &mut impl Memory,
    ) {
        let p = bth.psn;
        let max_sent = self.max_sent;
        let Some(read) = self
            .sq
            .iter()
            .find(|w| {
                w.is_read()
                    && psn::lt(w.first_psn, max_sent)
                    && psn::in_range(p, w.first_psn, w.npkts)
            })
            .copied()
        else {
            self.counters.stale_responses += 1;
            return;
        };
        // A response implies the responder executed everything before the READ.
        self.acknowledge(now, read.first_psn, cfg);
        let front_is_this = matches!(self.sq.front(), Some(w) if w.first_psn == read.first_psn);
        if !front_is_this {
            // An earlier READ is missing responses that came before these.
            if self.rewind() {
                self.counters.read_gaps += 1;
            }
            return;
        }
        let d = psn::diff(p, self.una);
        if d < 0 {
            self.counters.stale_responses += 1;
            return;
        }
        if d > 0 {
            if self.rewind() {
                self.counters.read_gaps += 1;
            }
            return;
        }
        let index = psn::diff(p, read.first_psn) as u32;
        let offset = u64::from(index) * u64::from(self.mtu);
        let expected = (u64::from(read.wr.local.len) - offset.min(u64::from(read.wr.local.len)))
            .min(u64::from(self.mtu)) as usize;
        let last = index + 1 == read.npkts;
        // A re-issued READ is answered from its restart PSN as a new
        // response sequence (First or Only there), so First may come at any
        // index that is not the last.
        let position_ok = match bth.opcode.position() {
            Some(Position::Only) => last,
            Some(Position::First) => !last,
            Some(Position::Middle) => index != 0 && !last,
            Some(Position::Last) => index != 0 && last,
            None => false,
        };
        if !position_ok || payload.len() != expected {
            // Malformed for this READ: drop it; a retry will fetch it again.
            self.counters.stale_responses += 1;
            return;
        }
        if !payload.is_empty() {
            mem.write(read.wr.local.addr + offset, payload);
        }
        self.una = psn::add(self.una, 1);
        self.on_progress(now, cfg);
        if last {
            self.sq.pop_front();
            self.complete_send(&read, Status::Success);
            // ACKs that arrived while the READ was unfinished.
            let acked_to = self.acked_to;
            self.acknowledge(now, acked_to, cfg);
        }
    }

    // ---- Requester: transmission -----------------------------------------

    fn has_request_to_send(&self) -> bool {
        self.state == QpState::ReadyToSend
            && self.rnr_until.is_none()
            && self.tx_psn != self.next_psn
    }

    fn next_request(&mut self, now: Instant, cfg: &Config) -> Option<Outgoing> {
        if !self.has_request_to_send() {
            return None;
        }
        let mut reads_in_flight = 0u32;
        let mut found = None;
        for w in self.sq.iter() {
            if psn::in_range(self.tx_psn, w.first_psn, w.npkts) {
                found = Some(*w);
                break;
            }
            if w.is_read() {
                reads_in_flight += 1;
            }
        }
        let w = found?;
        let index = psn::diff(self.tx_psn, w.first_psn) as u32;
        let offset = u64::from(index) * u64::from(self.mtu);
        let total = w.wr.local.len;
        let psn_now = self.tx_psn;
        let mut bth = BthRepr {
            opcode: Opcode::ReadRequest,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: cfg.pkey,
            fecn: false,
            becn: false,
            dest_qp: self.setup.remote_qpn,
            ack_req: false,
            psn: psn_now,
        };
        let out = match w.wr.op {
            Op::Read { remote } => {
                if reads_in_flight >= u32::from(cfg.max_rd_atomic.max(1)) {
                    return None;
                }
                // A READ restarted mid-way asks only for what is missing.
                let out = Outgoing {
                    repr: Repr {
                        bth,
                        reth: Some(RethRepr {
                            va: remote.addr.wrapping_add(offset),
                            rkey: remote.key,
                            dma_len: total - offset.min(u64::from(total)) as u32,
                        }),
                        aeth: None,
                        imm: None,
                        payload_len: 0,
                    },
                    payload: None,
                };
                if index != 0 {
                    self.counters.read_requests_reissued += 1;
                }
                self.tx_psn = w.end_psn();
                out
            }
            op => {
                let len = (u64::from(total) - offset.min(u64::from(total))).min(u64::from(self.mtu))
                    as u32;
                let position = match (index == 0, index + 1 == w.npkts) {
                    (true, true) => Position::Only,
                    (true, false) => Position::First,
                    (false, true) => Position::Last,
                    (false, false) => Position::Middle,
                };
                let (remote, imm, is_write) = match op {
                    Op::Write { remote } => (Some(remote), None, true),
                    Op::WriteImm { remote, imm } => (Some(remote), Some(imm), true),
                    Op::Send => (None, None, false),
                    Op::SendImm { imm } => (None, Some(imm), false),
                    Op::Read { .. } => return None,
                };
                let ends = matches!(position, Position::Last | Position::Only);
                let with_imm = ends && imm.is_some();
                bth.opcode = match (is_write, position, with_imm) {
                    (true, Position::First, _) => Opcode::WriteFirst,
                    (true, Position::Middle, _) => Opcode::WriteMiddle,
                    (true, Position::Last, false) => Opcode::WriteLast,
                    (true, Position::Last, true) => Opcode::WriteLastImm,
                    (true, Position::Only, false) => Opcode::WriteOnly,
                    (true, Position::Only, true) => Opcode::WriteOnlyImm,
                    (false, Position::First, _) => Opcode::SendFirst,
                    (false, Position::Middle, _) => Opcode::SendMiddle,
                    (false, Position::Last, false) => Opcode::SendLast,
                    (false, Position::Last, true) => Opcode::SendLastImm,
                    (false, Position::Only, false) => Opcode::SendOnly,
                    (false, Position::Only, true) => Opcode::SendOnlyImm,
                };
                bth.ack_req = ends;
                bth.solicited = ends && !is_write;
                let reth = match (remote, position) {
                    (Some(r), Position::First | Position::Only) => Some(RethRepr {
                        va: r.addr,
                        rkey: r.key,
                        dma_len: total,
                    }),
                    _ => None,
                };
                self.tx_psn = psn::add(self.tx_psn, 1);
                Outgoing {
                    repr: Repr {
                        bth,
                        reth,
                        aeth: None,
                        imm: if with_imm { imm } else { None },
                        payload_len: len as usize,
                    },
                    payload: (len > 0).then(|| PayloadRef {
                        addr: w.wr.local.addr + offset,
                        len,
                    }),
                }
            }
        };
        if psn::lt(psn_now, self.max_sent) {
            self.counters.retransmitted_packets += 1;
        }
        if psn::lt(self.max_sent, self.tx_psn) {
            self.max_sent = self.tx_psn;
        }
        if self.retry_deadline.is_none() {
            self.retry_deadline = Some(now + cfg.local_ack_timeout);
        }
        Some(out)
    }

    // ---- Responder --------------------------------------------------------

    fn ack_aeth(&self, syndrome: Syndrome) -> AethRepr {
        AethRepr {
            syndrome,
            msn: self.msn & psn::MASK,
        }
    }

    /// Queues an ACK for everything up to `psn`, replacing a queued ACK not
    /// yet sent (coalescing).
    fn push_ack(&mut self, psn: u32) {
        let aeth = self.ack_aeth(Syndrome::Ack {
            credits: UNLIMITED_CREDITS,
        });
        if let Some(RespItem::Ack {
            aeth:
                AethRepr {
                    syndrome: Syndrome::Ack { .. },
                    ..
                },
            ..
        }) = self.resp.back()
        {
            self.resp.pop_back();
        }
        if self.resp.push_back(RespItem::Ack { psn, aeth }).is_err() {
            self.counters.responses_dropped += 1;
        }
        self.unacked = 0;
    }

    fn push_nak(&mut self, psn: u32, syndrome: Syndrome) {
        let aeth = self.ack_aeth(syndrome);
        if self.resp.is_full() {
            if let Some(RespItem::Ack { .. }) = self.resp.back() {
                self.resp.pop_back();
            }
        }
        if self.resp.push_back(RespItem::Ack { psn, aeth }).is_err() {
            self.counters.responses_dropped += 1;
            return;
        }
        match syndrome {
            Syndrome::Nak(NakCode::PsnSequenceError) => self.counters.seq_naks_sent += 1,
            Syndrome::RnrNak { .. } => self.counters.rnr_naks_sent += 1,
            _ => self.counters.fatal_naks_sent += 1,
        }
    }

    /// The responder's R_Key check. A zero-length RDMA operation names no
    /// memory, so its key and address are not checked (IBA compliance
    /// statement C9-88, as Linux rxe's `check_rkey` applies it).
    fn check_remote(
        &self,
        regions: &Regions,
        reth: &RethRepr,
        need: Access,
    ) -> Result<(), AccessError> {
        if reth.dma_len == 0 {
            return Ok(());
        }
        regions.check(
            reth.rkey,
            reth.va,
            u64::from(reth.dma_len),
            need,
            self.setup.pd,
        )
    }

    fn read_jobs(&self) -> usize {
        self.resp
            .iter()
            .filter(|i| matches!(i, RespItem::Read(_)))
            .count()
    }

    fn on_request(
        &mut self,
        repr: &Repr,
        payload: &[u8],
        cfg: &Config,
        regions: &Regions,
        mem: &mut impl Memory,
    ) {
        let p = repr.bth.psn;
        let d = psn::diff(p, self.epsn);
        if d > 0 {
            // Out of sequence: one NAK per gap, then silence until the
            // expected PSN arrives (the IBA responder rule; rxe does the same).
            self.counters.out_of_sequence_dropped += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                self.push_nak(self.epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        if d < 0 {
            self.counters.duplicates_received += 1;
            if repr.bth.opcode == Opcode::ReadRequest {
                self.repeat_read(repr, regions);
            } else {
                // Duplicates are not executed again; re-ACK the latest PSN.
                self.push_ack(psn::sub(self.epsn, 1));
            }
            return;
        }
        self.nak_sent = false;
        let op = repr.bth.opcode;
        let result = if op.is_send() {
            self.execute_send(repr, payload, mem)
        } else if op.is_write() {
            self.execute_write(repr, payload, regions, mem)
        } else {
            self.execute_read(repr, cfg, regions)
        };
        match result {
            Ok(advance) => {
                self.epsn = psn::add(self.epsn, advance);
                if op == Opcode::ReadRequest {
                    // Its responses acknowledge it and everything before.
                    self.unacked = 0;
                } else {
                    self.unacked = self.unacked.saturating_add(1);
                    if repr.bth.ack_req || self.unacked >= cfg.ack_coalesce.max(1) {
                        self.push_ack(p);
                    }
                }
            }
            Err(Reject::NotReady) => {
                self.push_nak(
                    p,
                    Syndrome::RnrNak {
                        timer: cfg.min_rnr_timer,
                    },
                );
            }
            Err(Reject::Fatal(code)) => {
                self.push_nak(p, Syndrome::Nak(code));
                self.enter_error(Status::Flushed, true);
            }
            Err(Reject::ReceiveTooSmall(recv)) => {
                self.complete_recv(&recv, CqOpcode::Recv, Status::ReceiveTooSmall, 0, None);
                self.push_nak(p, Syndrome::Nak(NakCode::InvalidRequest));
                self.enter_error(Status::Flushed, true);
            }
        }
    }

    fn execute_send(
        &mut self,
        repr: &Repr,
        payload: &[u8],
        mem: &mut impl Memory,
    ) -> Result<u32, Reject> {
        let op = repr.bth.opcode;
        let mtu = self.mtu as usize;
        let invalid = Reject::Fatal(NakCode::InvalidRequest);
        let with_imm = op.has_immdt();
        match op.position() {
            Some(Position::First) | Some(Position::Only) => {
                let first = op == Opcode::SendFirst;
                if self.inbound.is_some() || (first && payload.len() != mtu) || payload.len() > mtu
                {
                    return Err(invalid);
                }
                let Some(recv) = self.rq.front().copied() else {
                    return Err(Reject::NotReady);
                };
                self.rq.pop_front();
                if payload.len() as u64 > u64::from(recv.local.len) {
                    return Err(Reject::ReceiveTooSmall(recv));
                }
                if !payload.is_empty() {
                    mem.write(recv.local.addr, payload);
                }
                if first {
                    self.inbound = Some(Inbound::Send {
                        recv,
                        offset: payload.len() as u32,
                    });
                } else {
                    self.msn = psn::add(self.msn, 1);
                    let imm = if with_imm { repr.imm } else { None };
                    self.complete_recv(
                        &recv,
                        CqOpcode::Recv,
                        Status::Success,
                        payload.len() as u32,
                        imm,
                    );
                }
                Ok(1)
            }
            Some(Position::Middle) | Some(Position::Last) => {
                let Some(Inbound::Send { recv, offset }) = self.inbound else {
                    return Err(invalid);
                };
                let last = op != Opcode::SendMiddle;
                if (!last && payload.len() != mtu)
                    || (last && (payload.is_empty() || payload.len() > mtu))
                {
                    return Err(invalid);
                }
                let end = u64::from(offset) + payload.len() as u64;
                if end > u64::from(recv.local.len) {
                    self.inbound = None;
                    return Err(Reject::ReceiveTooSmall(recv));
                }
                mem.write(recv.local.addr + u64::from(offset), payload);
                if last {
                    self.inbound = None;
                    self.msn = psn::add(self.msn, 1);
                    let imm = if with_imm { repr.imm } else { None };
                    self.complete_recv(&recv, CqOpcode::Recv, Status::Success, end as u32, imm);
                } else {
                    self.inbound = Some(Inbound::Send {
                        recv,
                        offset: end as u32,
                    });
                }
                Ok(1)
            }
            None => Err(invalid),
        }
    }

    fn execute_write(
        &mut self,
        repr: &Repr,
        payload: &[u8],
        regions: &Regions,
        mem: &mut impl Memory,
    ) -> Result<u32, Reject> {
        let op = repr.bth.opcode;
        let mtu = self.mtu as usize;
        let invalid = Reject::Fatal(NakCode::InvalidRequest);
        let with_imm = op.has_immdt();
        // The receive a WRITE with immediate consumes must exist before any
        // byte of its last packet is placed: otherwise RNR NAK and retry.
        let ends = matches!(op.position(), Some(Position::Last | Position::Only));
        match op.position() {
            Some(Position::First) | Some(Position::Only) => {
                if self.inbound.is_some() {
                    return Err(invalid);
                }
                let reth = repr.reth.ok_or(Reject::Fatal(NakCode::InvalidRequest))?;
                self.check_remote(regions, &reth, Access::REMOTE_WRITE)
                    .map_err(|_| Reject::Fatal(NakCode::RemoteAccessError))?;
                let len = payload.len();
                let ok = if ends {
                    len == reth.dma_len as usize && len <= mtu
                } else {
                    len == mtu && (reth.dma_len as usize) > mtu
                };
                if !ok {
                    return Err(invalid);
                }
                if ends && with_imm && self.rq.is_empty() {
                    return Err(Reject::NotReady);
                }
                if len > 0 {
                    mem.write(reth.va, payload);
                }
                if ends {
                    self.finish_write(with_imm, reth.dma_len, repr.imm);
                } else {
                    self.inbound = Some(Inbound::Write {
                        va: reth.va + len as u64,
                        remaining: reth.dma_len - len as u32,
                        total: reth.dma_len,
                    });
                }
                Ok(1)
            }
            Some(Position::Middle) | Some(Position::Last) => {
                let Some(Inbound::Write {
                    va,
                    remaining,
                    total,
                }) = self.inbound
                else {
                    return Err(invalid);
                };
                let len = payload.len();
                let ok = if ends {
                    len == remaining as usize && len <= mtu && len > 0
                } else {
                    len == mtu && (remaining as usize) > mtu
                };
                if !ok {
                    return Err(invalid);
                }
                if ends && with_imm && self.rq.is_empty() {
                    return Err(Reject::NotReady);
                }
                mem.write(va, payload);
                if ends {
                    self.inbound = None;
                    self.finish_write(with_imm, total, repr.imm);
                } else {
                    self.inbound = Some(Inbound::Write {
                        va: va + len as u64,
                        remaining: remaining - len as u32,
                        total,
                    });
                }
                Ok(1)
            }
            None => Err(invalid),
        }
    }

    fn finish_write(&mut self, with_imm: bool, byte_len: u32, imm: Option<u32>) {
        self.msn = psn::add(self.msn, 1);
        if with_imm {
            if let Some(recv) = self.rq.pop_front() {
                self.complete_recv(
                    &recv,
                    CqOpcode::RecvWriteImm,
                    Status::Success,
                    byte_len,
                    imm,
                );
            }
        }
    }

    fn execute_read(
        &mut self,
        repr: &Repr,
        cfg: &Config,
        regions: &Regions,
    ) -> Result<u32, Reject> {
        if self.inbound.is_some() {
            return Err(Reject::Fatal(NakCode::InvalidRequest));
        }
        let reth = repr.reth.ok_or(Reject::Fatal(NakCode::InvalidRequest))?;
        self.check_remote(regions, &reth, Access::REMOTE_READ)
            .map_err(|_| Reject::Fatal(NakCode::RemoteAccessError))?;
        let limit = usize::from(cfg.max_dest_rd_atomic).clamp(1, MAX_DEST_RD_ATOMIC);
        if self.read_jobs() >= limit || reth.dma_len > MAX_MESSAGE_LEN {
            return Err(Reject::Fatal(NakCode::InvalidRequest));
        }
        let npkts = packets_for(reth.dma_len, self.mtu);
        self.msn = psn::add(self.msn, 1);
        let job = ReadJob {
            first_psn: repr.bth.psn,
            npkts,
            next: 0,
            va: reth.va,
            len: reth.dma_len,
            msn: self.msn,
        };
        if self.resp.push_back(RespItem::Read(job)).is_err() {
            return Err(Reject::Fatal(NakCode::RemoteOperationalError));
        }
        Ok(npkts)
    }

    /// A duplicate READ request: execute it again from its PSN, as the IBA
    /// requires, after dropping queued responses from that PSN on.
    fn repeat_read(&mut self, repr: &Repr, regions: &Regions) {
        let Some(reth) = repr.reth else {
            return;
        };
        if self
            .check_remote(regions, &reth, Access::REMOTE_READ)
            .is_err()
        {
            return;
        }
        let r = repr.bth.psn;
        let cut = self.resp.iter().position(|item| match item {
            RespItem::Read(j) => psn::lt(r, psn::add(j.first_psn, j.npkts)),
            RespItem::Ack { .. } => false,
        });
        if let Some(cut) = cut {
            while self.resp.len() > cut {
                self.resp.pop_back();
            }
        }
        let job = ReadJob {
            first_psn: r,
            npkts: packets_for(reth.dma_len, self.mtu),
            next: 0,
            va: reth.va,
            len: reth.dma_len,
            msn: self.msn,
        };
        if self.resp.push_back(RespItem::Read(job)).is_err() {
            self.counters.responses_dropped += 1;
        }
    }

    fn next_control(&mut self, cfg: &Config) -> Option<Outgoing> {
        if self.cnp_pending {
            self.cnp_pending = false;
            self.counters.cnps_sent += 1;
            return Some(Outgoing {
                repr: Repr {
                    bth: BthRepr {
                        opcode: Opcode::Cnp,
                        solicited: false,
                        mig_req: false,
                        pad_count: 0,
                        pkey: cfg.pkey,
                        fecn: false,
                        becn: true,
                        dest_qp: self.setup.remote_qpn,
                        ack_req: false,
                        psn: 0,
                    },
                    reth: None,
                    aeth: None,
                    imm: None,
                    payload_len: 0,
                },
                payload: None,
            });
        }
        let Some(RespItem::Ack { psn, aeth }) = self.resp.front().copied() else {
            return None;
        };
        self.resp.pop_front();
        if matches!(aeth.syndrome, Syndrome::Ack { .. }) {
            self.counters.acks_sent += 1;
        }
        Some(Outgoing {
            repr: Repr {
                bth: BthRepr {
                    opcode: Opcode::Acknowledge,
                    solicited: false,
                    mig_req: false,
                    pad_count: 0,
                    pkey: cfg.pkey,
                    fecn: false,
                    becn: false,
                    dest_qp: self.setup.remote_qpn,
                    ack_req: false,
                    psn,
                },
                reth: None,
                aeth: Some(aeth),
                imm: None,
                payload_len: 0,
            },
            payload: None,
        })
    }

    fn has_read_response(&self) -> bool {
        self.state == QpState::ReadyToSend && matches!(self.resp.front(), Some(RespItem::Read(_)))
    }

    fn next_read_response(&mut self, cfg: &Config) -> Option<Outgoing> {
        if !self.has_read_response() {
            return None;
        }
        let Some(RespItem::Read(job)) = self.resp.front_mut() else {
            return None;
        };
        let index = job.next;
        job.next += 1;
        let job = *job;
        let offset = u64::from(index) * u64::from(self.mtu);
        let len =
            (u64::from(job.len) - offset.min(u64::from(job.len))).min(u64::from(self.mtu)) as u32;
        let last = index + 1 >= job.npkts;
        if last {
            self.resp.pop_front();
        }
        let opcode = match (index == 0, last) {
            (true, true) => Opcode::ReadResponseOnly,
            (true, false) => Opcode::ReadResponseFirst,
            (false, true) => Opcode::ReadResponseLast,
            (false, false) => Opcode::ReadResponseMiddle,
        };
        let aeth = opcode.has_aeth().then_some(AethRepr {
            syndrome: Syndrome::Ack {
                credits: UNLIMITED_CREDITS,
            },
            msn: job.msn & psn::MASK,
        });
        Some(Outgoing {
            repr: Repr {
                bth: BthRepr {
                    opcode,
                    solicited: false,
                    mig_req: false,
                    pad_count: 0,
                    pkey: cfg.pkey,
                    fecn: false,
                    becn: false,
                    dest_qp: self.setup.remote_qpn,
                    ack_req: false,
                    psn: psn::add(job.first_psn, index),
                },
                reth: None,
                aeth,
                imm: None,
                payload_len: len as usize,
            },
            payload: (len > 0).then(|| PayloadRef {
                addr: job.va + offset,
                len,
            }),
        })
    }

    // ---- Inputs and outputs the endpoint calls -----------------------------

    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        repr: &Repr,
        payload: &[u8],
        ce: bool,
        env: Env<'_>,
        mem: &mut impl Memory,
    ) {
        let Env { cfg, regions } = env;
        self.counters.packets_received += 1;
        let op = repr.bth.opcode;
        if ce && (op.is_request() || op.is_read_response()) {
            // Notification point: at most one CNP per QP per interval.
            self.counters.ecn_marked_received += 1;
            let due = self.last_cnp.is_none_or(|t| now >= t + cfg.cnp_interval);
            if due && self.state == QpState::ReadyToSend {
                self.cnp_pending = true;
                self.last_cnp = Some(now);
            }
        }
        if self.state == QpState::Error {
            return;
        }
        if op == Opcode::Cnp {
            self.counters.cnps_received += 1;
            self.cc.on_cnp(now);
        } else if op == Opcode::Acknowledge {
            if let Some(aeth) = repr.aeth {
                self.on_acknowledge(now, &repr.bth, aeth, cfg);
            }
        } else if op.is_read_response() {
            self.on_read_response(now, &repr.bth, payload, cfg, mem);
        } else if op.is_request() {
            self.on_request(repr, payload, cfg, regions, mem);
        }
    }

    /// The next packet to send: a CNP, then ACK/NAKs, then data (READ
    /// responses and requests alternately) if the pacer allows.
    /// The next packet, if any. Returning `None` changes nothing (the
    /// endpoint relies on it to skip re-reading this QP's deadline).
    pub(crate) fn poll_transmit(&mut self, now: Instant, cfg: &Config) -> Option<Outgoing> {
        let out = match self.next_control(cfg) {
            Some(o) => o,
            None => {
                if self.state != QpState::ReadyToSend || now < self.next_send {
                    return None;
                }
                let out = if self.prefer_responses {
                    self.next_read_response(cfg)
                        .or_else(|| self.next_request(now, cfg))
                } else {
                    self.next_request(now, cfg)
                        .or_else(|| self.next_read_response(cfg))
                }?;
                self.prefer_responses = !self.prefer_responses;
                self.counters.data_packets_sent += 1;
                self.counters.payload_bytes_sent += out.repr.payload_len as u64;
                let wire = out.repr.buffer_len() as u64 + u64::from(cfg.wire_overhead_bytes);
                self.cc.on_sent(now, wire);
                let rate = self.cc.rate_bps();
                if rate < cfg.line_rate_bps && rate > 0 {
                    let nanos = u128::from(wire) * 8 * 1_000_000_000 / u128::from(rate);
                    let start = self.next_send.max(now);
                    self.next_send = start
                        + core::time::Duration::from_nanos(
                            u64::try_from(nanos).unwrap_or(u64::MAX),
                        );
                }
                out
            }
        };
        self.counters.packets_sent += 1;
        Some(out)
    }

    fn has_data(&self) -> bool {
        self.has_read_response() || self.has_request_to_send()
    }

    /// The next instant this QP needs `handle_timeout` or (for the pacer)
    /// `poll_transmit`; pacing deadlines count only if later than `now`.
    pub(crate) fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        let pacing = (self.has_data() && self.next_send > now).then_some(self.next_send);
        [
            self.retry_deadline,
            self.rnr_until,
            self.cc.poll_timeout(),
            pacing,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.retry_deadline.is_some_and(|t| t <= now) {
            self.retry_deadline = None;
            if self.state == QpState::ReadyToSend && self.una != self.max_sent {
                if self.retry_left == 0 {
                    self.enter_error(Status::RetryExceeded, false);
                } else {
                    self.retry_left -= 1;
                    self.counters.timeouts += 1;
                    self.tx_psn = self.una;
                    self.last_rewind = Some(self.una);
                }
            }
        }
        self.cc.handle_timeout(now);
    }
}
