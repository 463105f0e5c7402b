//! One connection: handshake, sender, receiver, timers (spec 4).
//!
//! The endpoint owns an array of these and routes packets to them; a
//! connection never sees another connection's state.

use core::time::Duration;

use heapless::Deque;

use crate::api::{Access, Completion, ConnHandle, LocalBuf, Memory, Op, Opcode, PayloadRef};
use crate::api::{PeerAddr, RecvRequest, Status, Transmit, WorkRequest};
use crate::cc::{serialization_nanos, CongestionControl, Controller};
use crate::config::SEND_QUEUE_DEPTH;
use crate::config::{Config, COMPLETION_QUEUE_DEPTH, MAX_WINDOW, RECV_QUEUE_DEPTH};
use crate::memory::RegionTable;
use crate::path::PathSet;
use crate::rng::Rng;
use crate::stats::ConnStats;
use crate::time::Instant;
use crate::wire::encap::ecn;
use crate::wire::packet::{ReadResponseRepr, WriteImm};
use crate::wire::{
    AckRepr, Body, CloseReason, CloseRepr, ConnectRepr, Flags, Header, MemoryTarget, MessageSpan,
    NakReason, NakRepr, ReadRequestRepr, Repr, SackBits, SendRepr, WriteRepr,
};

/// The completion queue the endpoint hands to connections.
pub(crate) type CompletionQueue = Deque<Completion, COMPLETION_QUEUE_DEPTH>;

/// Connection states (spec 4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ConnState {
    /// CONNECT sent, waiting for ACCEPT.
    Connecting,
    /// ACCEPT sent, waiting for the first packet from the initiator.
    Accepting,
    Established,
    /// The application asked to close; CLOSE goes out once the send queue drains.
    Closing,
    /// Closed cleanly (or refused); the slot can be reused once drained.
    Closed,
    /// Failed: outstanding work is flushed with error completions.
    Error,
}

/// Signed distance from `b` to `a` in 32-bit serial arithmetic.
#[inline]
pub(crate) fn psn_diff(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

/// What occupies a send-queue entry.
#[derive(Debug, Clone, Copy)]
enum Job {
    User(WorkRequest),
    /// Answering a peer's READ_REQUEST: stream `len` bytes from `source`.
    ReadResponse {
        msg_id: u32,
        source: u64,
        sink: MemoryTarget,
    },
}

#[derive(Debug, Clone, Copy)]
struct SendEntry {
    job: Job,
    msg_id: u32,
    len: u32,
    /// Reliable packets this entry needs (a READ needs one: its request).
    packets: u32,
    first_psn: u32,
    /// Packets that have a PSN (sent at least once).
    started: u32,
    /// READ: response bytes placed.
    read_bytes: u32,
    /// SEND / WRITE_IMM: the receive it consumes at the peer.
    recv_index: u32,
    error: Option<Status>,
    rnr_retries: u8,
}

impl SendEntry {
    fn is_read(&self) -> bool {
        matches!(
            self.job,
            Job::User(WorkRequest {
                op: Op::Read { .. },
                ..
            })
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct RecvEntry {
    req: RecvRequest,
    /// Message id of the SEND / WRITE_IMM that claimed it.
    claimed_by: Option<u32>,
    msg_len: u32,
    bytes: u32,
    imm: Option<u32>,
    write_imm: bool,
}

/// Per-PSN sender state, struct-of-arrays to keep the window small:
/// 4 + 1 + 1 bytes per PSN.
#[derive(Debug, Clone)]
struct Window {
    sent_ts: [u32; MAX_WINDOW],
    path: [u8; MAX_WINDOW],
    /// Low 2 bits: slot state; high 6 bits: transmissions.
    meta: [u8; MAX_WINDOW],
}

const SLOT_FREE: u8 = 0;
const SLOT_IN_FLIGHT: u8 = 1;
const SLOT_ACKED: u8 = 2;
const SLOT_LOST: u8 = 3;

impl Window {
    fn new() -> Window {
        Window {
            sent_ts: [0; MAX_WINDOW],
            path: [0; MAX_WINDOW],
            meta: [0; MAX_WINDOW],
        }
    }
    #[inline]
    fn idx(psn: u32) -> usize {
        psn as usize % MAX_WINDOW
    }
    #[inline]
    fn state(&self, psn: u32) -> u8 {
        self.meta[Self::idx(psn)] & 3
    }
    #[inline]
    fn set_state(&mut self, psn: u32, s: u8) {
        let i = Self::idx(psn);
        self.meta[i] = (self.meta[i] & !3) | s;
    }
    #[inline]
    fn transmissions(&self, psn: u32) -> u8 {
        self.meta[Self::idx(psn)] >> 2
    }
    fn record_send(&mut self, psn: u32, ts: u32, path: u8) {
        let i = Self::idx(psn);
        let tx = ((self.meta[i] >> 2) + 1).min(63);
        self.sent_ts[i] = ts;
        self.path[i] = path;
        self.meta[i] = (tx << 2) | SLOT_IN_FLIGHT;
    }
}

/// Control packets waiting to go out (bit set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pending(u8);

impl Pending {
    const CONNECT: u8 = 1;
    const ACCEPT: u8 = 2;
    const KEEPALIVE: u8 = 4;
    const CLOSE: u8 = 8;
    const CLOSE_REPLY: u8 = 16;
    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// Negotiated parameters (spec 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Negotiated {
    pub mtu: u16,
    pub paths: u16,
    pub window: u16,
}

/// Events a connection reports to the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event {
    /// The handshake completed.
    Connected(ConnHandle),
    /// The connection closed (by either side) or was refused.
    Closed(ConnHandle, CloseReason),
    /// The connection failed; its work was flushed with error completions.
    Failed(ConnHandle, Status),
}

/// One MetaRoCE connection with up to `P` logical paths.
#[derive(Debug)]
pub struct Connection<const P: usize> {
    pub(crate) handle: ConnHandle,
    pub(crate) state: ConnState,
    pub(crate) local_id: u32,
    pub(crate) local_token: u64,
    pub(crate) remote_id: u32,
    pub(crate) remote_token: u64,
    pub(crate) peer: PeerAddr,
    pub(crate) pd: u32,
    pub(crate) params: Negotiated,
    pub(crate) paths: PathSet<P>,
    cc: Controller,
    // Sender (spec 4.4 - 4.6).
    snd_una: u32,
    snd_nxt: u32,
    initial_psn: u32,
    window: Window,
    lost_pending: u16,
    /// Start-up window, bytes: new data in flight is kept below it until it
    /// has grown past the PSN window (`Config::initial_window_bytes`).
    startup_window: u32,
    sendq: Deque<SendEntry, SEND_QUEUE_DEPTH>,
    send_cursor: usize,
    next_msg_id: u32,
    next_recv_index: u32,
    rate_hint_mbps: u32,
    last_ack_seq: u32,
    next_send_at: Instant,
    rto_deadline: Option<Instant>,
    rto_backoff: u8,
    rack_deadline: Option<Instant>,
    rnr_until: Instant,
    srtt_ns: u32,
    rttvar_ns: u32,
    // Receiver (spec 4.5, 4.8).
    rcv_cum: u32,
    rcv_sack: SackBits,
    recvq: Deque<RecvEntry, RECV_QUEUE_DEPTH>,
    recv_base: u32,
    ack_pending: u8,
    ack_now: bool,
    ack_due: Option<Instant>,
    echo_psn: u32,
    echo_ts: u32,
    echo_path: u8,
    ack_seq: u32,
    nak_pending: Option<NakRepr>,
    sticky_nak: Option<NakRepr>,
    pub(crate) last_data_rx: Option<Instant>,
    // Control (spec 4.2, 4.12).
    pending: Pending,
    close_reason: CloseReason,
    ctrl_deadline: Option<Instant>,
    ctrl_tries: u8,
    last_heard: Instant,
    last_sent: Instant,
    pub(crate) stats: ConnStats,
}

/// What a handled packet asks of the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Event(Event),
}

impl<const P: usize> Connection<P> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        handle: ConnHandle,
        local_id: u32,
        peer: PeerAddr,
        pd: u32,
        config: &Config,
        rng: &mut Rng,
        now: Instant,
        state: ConnState,
    ) -> Self {
        let initial_psn = rng.next_u32();
        Connection {
            handle,
            state,
            local_id,
            local_token: rng.nonzero_u64(),
            remote_id: 0,
            remote_token: 0,
            peer,
            pd,
            params: Negotiated {
                mtu: config.mtu,
                paths: config.paths.clamp(1, P as u16),
                window: config.window.clamp(1, MAX_WINDOW as u16),
            },
            paths: PathSet::new(
                config.paths.clamp(1, P as u16),
                config.entropy_base,
                config.entropy_span,
                rng,
            ),
            cc: Controller::new(config),
            snd_una: initial_psn,
            snd_nxt: initial_psn,
            initial_psn,
            window: Window::new(),
            lost_pending: 0,
            startup_window: if config.initial_window_bytes == 0 {
                u32::MAX
            } else {
                config.initial_window_bytes
            },
            sendq: Deque::new(),
            send_cursor: 0,
            next_msg_id: 1,
            next_recv_index: 0,
            rate_hint_mbps: 0,
            last_ack_seq: 0,
            next_send_at: now,
            rto_deadline: None,
            rto_backoff: 0,
            rack_deadline: None,
            rnr_until: Instant::ZERO,
            srtt_ns: 0,
            rttvar_ns: 0,
            rcv_cum: 0,
            rcv_sack: SackBits::EMPTY,
            recvq: Deque::new(),
            recv_base: 0,
            ack_pending: 0,
            ack_now: false,
            ack_due: None,
            echo_psn: 0,
            echo_ts: 0,
            echo_path: 0,
            ack_seq: 0,
            nak_pending: None,
            sticky_nak: None,
            last_data_rx: None,
            pending: Pending::default(),
            close_reason: CloseReason::Normal,
            ctrl_deadline: None,
            ctrl_tries: 0,
            last_heard: now,
            last_sent: now,
            stats: ConnStats::default(),
        }
    }

    // ----- Handshake (spec 4.2) -------------------------------------------

    pub(crate) fn start_connect(&mut self, now: Instant, config: &Config) {
        self.pending.0 |= Pending::CONNECT;
        self.ctrl_deadline = Some(now + config.handshake_timeout);
        self.ctrl_tries = 1;
    }

    fn connect_repr(&self, config: &Config) -> ConnectRepr {
        ConnectRepr {
            src_conn: self.local_id,
            src_token: self.local_token,
            mtu: self.params.mtu,
            max_paths: self.params.paths,
            window: self.params.window,
            initial_psn: self.initial_psn,
            reply_port: config.udp_port,
        }
    }

    /// Takes the initiator's CONNECT (acceptor side, new or repeated).
    pub(crate) fn on_connect(
        &mut self,
        now: Instant,
        c: &ConnectRepr,
        config: &Config,
        rng: &mut Rng,
    ) {
        if self.remote_id == 0 {
            self.adopt_peer(c, config, rng);
        }
        self.pending.0 |= Pending::ACCEPT;
        if self.state == ConnState::Accepting {
            // ACCEPT is repeated until the initiator is heard from (its
            // confirmation may be lost as well as the ACCEPT), spec 4.2.
            self.ctrl_deadline = Some(now + config.handshake_timeout);
            self.ctrl_tries = self.ctrl_tries.max(1);
        }
    }

    /// Takes the peer's id, token and first PSN from its CONNECT or ACCEPT
    /// and settles the parameters on the smaller of both offers (spec 4.2).
    fn adopt_peer(&mut self, c: &ConnectRepr, config: &Config, rng: &mut Rng) {
        self.remote_id = c.src_conn;
        self.remote_token = c.src_token;
        self.params = Negotiated {
            mtu: self.params.mtu.min(c.mtu),
            paths: self.params.paths.min(c.max_paths),
            window: self.params.window.min(c.window),
        };
        if self.paths.active() != self.params.paths {
            self.paths = PathSet::new(
                self.params.paths,
                config.entropy_base,
                config.entropy_span,
                rng,
            );
        }
        self.rcv_cum = c.initial_psn;
    }

    fn establish(&mut self) -> Outcome {
        self.state = ConnState::Established;
        self.ctrl_deadline = None;
        Outcome::Event(Event::Connected(self.handle))
    }

    // ----- Posting (spec 4.8) ---------------------------------------------

    pub(crate) fn can_post(&self) -> bool {
        matches!(
            self.state,
            ConnState::Connecting | ConnState::Accepting | ConnState::Established
        )
    }

    pub(crate) fn post_send(&mut self, wr: WorkRequest) -> Result<(), WorkRequest> {
        let mtu = u32::from(self.params.mtu);
        let (packets, recv_index) = match wr.op {
            Op::Read { .. } => (1, 0),
            Op::Send | Op::SendImm { .. } | Op::WriteImm { .. } => {
                let idx = self.next_recv_index;
                (wr.local.len.div_ceil(mtu).max(1), idx)
            }
            Op::Write { .. } => (wr.local.len.div_ceil(mtu).max(1), 0),
        };
        let entry = SendEntry {
            job: Job::User(wr),
            msg_id: self.next_msg_id,
            len: wr.local.len,
            packets,
            first_psn: 0,
            started: 0,
            read_bytes: 0,
            recv_index,
            error: None,
            rnr_retries: 0,
        };
        self.sendq.push_back(entry).map_err(|_| wr)?;
        self.next_msg_id = self.next_msg_id.wrapping_add(1);
        if matches!(wr.op, Op::Send | Op::SendImm { .. } | Op::WriteImm { .. }) {
            self.next_recv_index = self.next_recv_index.wrapping_add(1);
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, req: RecvRequest) -> Result<(), RecvRequest> {
        self.recvq
            .push_back(RecvEntry {
                req,
                claimed_by: None,
                msg_len: 0,
                bytes: 0,
                imm: None,
                write_imm: false,
            })
            .map_err(|e| e.req)
    }

    pub(crate) fn send_queue_free(&self) -> usize {
        SEND_QUEUE_DEPTH - self.sendq.len()
    }

    pub(crate) fn recv_queue_free(&self) -> usize {
        RECV_QUEUE_DEPTH - self.recvq.len()
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.sendq.is_empty() && self.recvq.is_empty()
    }

    pub(crate) fn close(&mut self, now: Instant, config: &Config) {
        match self.state {
            ConnState::Established | ConnState::Accepting => {
                self.state = ConnState::Closing;
                self.close_reason = CloseReason::Normal;
                self.maybe_send_close(now, config);
            }
            ConnState::Connecting => {
                self.fail(Status::Flushed, None);
                self.state = ConnState::Closed;
            }
            _ => {}
        }
    }

    fn maybe_send_close(&mut self, now: Instant, config: &Config) {
        if self.state == ConnState::Closing
            && self.sendq.is_empty()
            && !self.pending.has(Pending::CLOSE)
            && self.ctrl_deadline.is_none()
        {
            self.pending.0 |= Pending::CLOSE;
            self.ctrl_deadline = Some(now + config.handshake_timeout);
            self.ctrl_tries = 1;
        }
    }

    // ----- Errors (spec 4.7) ----------------------------------------------

    /// Enters the error state: the culprit message (if any, by PSN) gets
    /// `status`, everything else is flushed as completions drain.
    pub(crate) fn fail(&mut self, status: Status, culprit_psn: Option<u32>) {
        if matches!(self.state, ConnState::Error | ConnState::Closed) {
            return;
        }
        self.state = ConnState::Error;
        let mut marked = false;
        for e in self.sendq.iter_mut() {
            let hit = match culprit_psn {
                Some(psn) if e.started > 0 => {
                    let d = psn_diff(psn, e.first_psn);
                    d >= 0 && (d as u32) < e.started
                }
                _ => false,
            };
            if hit && !marked {
                e.error = Some(status);
                marked = true;
            } else if e.error.is_none() {
                e.error = Some(Status::Flushed);
            }
        }
        if !marked && culprit_psn.is_none() {
            if let Some(front) = self.sendq.front_mut() {
                front.error = Some(status);
            }
        }
        self.lost_pending = 0;
        self.rto_deadline = None;
        self.rack_deadline = None;
        self.ack_due = None;
        self.ctrl_deadline = None;
        self.pending = Pending::default();
    }

    /// Moves finished work to the completion queue, in order, as space allows.
    pub(crate) fn drain_completions(&mut self, cq: &mut CompletionQueue) {
        let flushing = matches!(self.state, ConnState::Error | ConnState::Closed);
        while let Some(head) = self.sendq.front() {
            let done = flushing || head.error.is_some() || self.entry_done(head);
            if !done {
                break;
            }
            let head = *head;
            if let Job::User(wr) = head.job {
                let status = head.error.unwrap_or(if flushing {
                    Status::Flushed
                } else {
                    Status::Success
                });
                let c = Completion {
                    conn: self.handle,
                    wr_id: wr.id,
                    opcode: match wr.op {
                        Op::Write { .. } => Opcode::Write,
                        Op::WriteImm { .. } => Opcode::WriteImm,
                        Op::Send | Op::SendImm { .. } => Opcode::Send,
                        Op::Read { .. } => Opcode::Read,
                    },
                    status,
                    byte_len: if status == Status::Success {
                        head.len
                    } else {
                        0
                    },
                    imm: None,
                };
                if cq.push_back(c).is_err() {
                    break;
                }
                self.stats.completions += 1;
            }
            self.sendq.pop_front();
            self.send_cursor = self.send_cursor.saturating_sub(1);
        }
        while let Some(head) = self.recvq.front() {
            let done = head.claimed_by.is_some() && head.bytes == head.msg_len;
            if !done && !flushing {
                break;
            }
            let c = Completion {
                conn: self.handle,
                wr_id: head.req.id,
                opcode: if head.write_imm {
                    Opcode::RecvWriteImm
                } else {
                    Opcode::Recv
                },
                status: if done {
                    Status::Success
                } else {
                    Status::Flushed
                },
                byte_len: if done && !head.write_imm {
                    head.bytes
                } else {
                    0
                },
                imm: head.imm,
            };
            if cq.push_back(c).is_err() {
                break;
            }
            self.stats.completions += 1;
            self.recvq.pop_front();
            self.recv_base = self.recv_base.wrapping_add(1);
        }
    }

    fn entry_done(&self, e: &SendEntry) -> bool {
        if e.started < e.packets {
            return false;
        }
        if e.is_read() && e.read_bytes < e.len {
            return false;
        }
        let end = e.first_psn.wrapping_add(e.packets);
        if psn_diff(end, self.snd_una) <= 0 {
            return true;
        }
        let mut psn = if psn_diff(e.first_psn, self.snd_una) > 0 {
            e.first_psn
        } else {
            self.snd_una
        };
        while psn != end {
            if self.window.state(psn) != SLOT_ACKED {
                return false;
            }
            psn = psn.wrapping_add(1);
        }
        true
    }

    // ----- Receiving (spec 4.5 - 4.8) -------------------------------------

    /// Handles a packet whose connection id and token matched.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        repr: &Repr,
        payload: &[u8],
        ce: bool,
        regions: &RegionTable,
        mem: &mut impl Memory,
        config: &Config,
        rng: &mut Rng,
    ) -> Outcome {
        self.last_heard = now;
        let mut outcome = Outcome::Ok;
        if self.state == ConnState::Accepting && !matches!(repr.body, Body::Connect(_)) {
            outcome = self.establish();
        }
        match &repr.body {
            Body::Accept(a) => {
                if self.state == ConnState::Connecting {
                    if a.reply_port != 0 {
                        self.peer.port = a.reply_port;
                    }
                    self.adopt_peer(a, config, rng);
                    // Confirm at once so the acceptor is established even if
                    // we have no data to send (spec 4.2).
                    self.pending.0 |= Pending::KEEPALIVE;
                    self.pending.0 &= !Pending::CONNECT;
                    return self.establish();
                }
                // A repeated ACCEPT: our confirmation was lost; confirm again.
                self.pending.0 |= Pending::KEEPALIVE;
            }
            Body::Connect(_) => {}
            Body::Keepalive => self.ack_now = true,
            Body::Close(c) => return self.on_close(repr.header.flags, c.reason),
            Body::Ack(a) => self.on_ack(now, &repr.header, a, config, rng),
            Body::Nak(n) => return self.on_nak(now, n, config),
            Body::Write(_) | Body::Send(_) | Body::ReadRequest(_) | Body::ReadResponse(_) => {
                self.on_reliable(now, repr, payload, ce, regions, mem, config);
            }
        }
        outcome
    }

    fn on_close(&mut self, flags: Flags, reason: CloseReason) -> Outcome {
        if !flags.contains(Flags::CLOSE_REPLY) {
            self.pending.0 |= Pending::CLOSE_REPLY;
        }
        if self.state == ConnState::Closed {
            return Outcome::Ok;
        }
        let was_error = self.state == ConnState::Error;
        if !was_error {
            self.fail(Status::Flushed, None);
        }
        self.state = ConnState::Closed;
        self.ctrl_deadline = None;
        self.pending.0 &= !Pending::CLOSE;
        if !flags.contains(Flags::CLOSE_REPLY) {
            self.close_reason = reason;
            self.pending.0 |= Pending::CLOSE_REPLY;
        }
        Outcome::Event(Event::Closed(self.handle, reason))
    }

    #[allow(clippy::too_many_arguments)]
    fn on_reliable(
        &mut self,
        now: Instant,
        repr: &Repr,
        payload: &[u8],
        ce: bool,
        regions: &RegionTable,
        mem: &mut impl Memory,
        config: &Config,
    ) {
        let h = &repr.header;
        if let Some(nak) = self.sticky_nak {
            // Sticky error: every later packet hears the same NAK (spec 4.7).
            self.nak_pending = Some(nak);
            return;
        }
        if !matches!(self.state, ConnState::Established | ConnState::Closing) {
            self.stats.invalid_dropped += 1;
            return;
        }
        if h.path >= self.paths.active() {
            self.stats.invalid_dropped += 1;
            return;
        }
        let d = psn_diff(h.psn, self.rcv_cum);
        if d < 0 || (d > 0 && self.rcv_sack.get(d as usize - 1)) {
            self.stats.duplicates_received += 1;
            self.note_echo(h);
            self.ack_now = true;
            return;
        }
        if d as usize > MAX_WINDOW {
            self.stats.out_of_window += 1;
            return;
        }
        match self.place(repr, payload, regions, mem) {
            Ok(()) => {}
            Err(reason) => {
                self.stats.naks_sent += 1;
                let nak = NakRepr {
                    cumulative: self.rcv_cum,
                    nak_psn: h.psn,
                    reason,
                };
                self.nak_pending = Some(nak);
                if reason.is_fatal() {
                    self.sticky_nak = Some(nak);
                    self.fail(Status::Flushed, None);
                }
                return;
            }
        }
        // Accepted: record it (spec 4.5).
        if d == 0 {
            let run = self.rcv_sack.leading_run();
            self.rcv_cum = self.rcv_cum.wrapping_add(1 + run as u32);
            self.rcv_sack.shift_down(1 + run);
        } else {
            self.rcv_sack.set(d as usize - 1);
        }
        self.stats.packets_received += 1;
        self.stats.bytes_received += payload.len() as u64;
        self.last_data_rx = Some(now);
        let path = self.paths.get_mut(h.path as u8);
        path.rx_count = path.rx_count.wrapping_add(1);
        if ce {
            path.ce_count = path.ce_count.wrapping_add(1);
            self.stats.ce_received += 1;
        }
        self.note_echo(h);
        self.ack_pending = self.ack_pending.saturating_add(1);
        if d != 0
            || !self.rcv_sack.is_empty()
            || ce
            || h.flags.contains(Flags::ACK_REQUEST)
            || self.ack_pending >= config.ack_every
        {
            self.ack_now = true;
        } else if self.ack_due.is_none() {
            self.ack_due = Some(now + config.ack_delay);
        }
    }

    fn note_echo(&mut self, h: &Header) {
        self.echo_psn = h.psn;
        self.echo_ts = h.timestamp;
        self.echo_path = h.path as u8;
    }

    /// Validates and places one reliable packet. Nothing is written unless
    /// every check passes (spec 5.1).
    fn place(
        &mut self,
        repr: &Repr,
        payload: &[u8],
        regions: &RegionTable,
        mem: &mut impl Memory,
    ) -> Result<(), NakReason> {
        let len = payload.len() as u64;
        match repr.body {
            Body::Write(w) => {
                if let Some(wi) = w.imm {
                    self.claim_receive(wi.recv_index, w.msg, Some(wi.imm), true, None)?;
                }
                regions.check(
                    w.target.key,
                    self.pd,
                    w.target.addr,
                    len,
                    Access::REMOTE_WRITE,
                )?;
                mem.write(w.target.addr, payload);
                if let Some(wi) = w.imm {
                    self.credit_receive(wi.recv_index, payload.len() as u32);
                }
            }
            Body::Send(s) => {
                let buf = self.claim_receive(s.recv_index, s.msg, s.imm, false, Some(payload))?;
                let addr = buf.addr + u64::from(s.msg.offset);
                regions.check(buf.key, self.pd, addr, len, Access::LOCAL_WRITE)?;
                mem.write(addr, payload);
                self.credit_receive(s.recv_index, payload.len() as u32);
            }
            Body::ReadRequest(r) => {
                regions.check(
                    r.source.key,
                    self.pd,
                    r.source.addr,
                    u64::from(r.len),
                    Access::REMOTE_READ,
                )?;
                let mtu = u32::from(self.params.mtu);
                let job = SendEntry {
                    job: Job::ReadResponse {
                        msg_id: r.msg_id,
                        source: r.source.addr,
                        sink: r.sink,
                    },
                    msg_id: r.msg_id,
                    len: r.len,
                    packets: r.len.div_ceil(mtu).max(1),
                    first_psn: 0,
                    started: 0,
                    read_bytes: 0,
                    recv_index: 0,
                    error: None,
                    rnr_retries: 0,
                };
                self.sendq
                    .push_back(job)
                    .map_err(|_| NakReason::ReceiverNotReady)?;
            }
            Body::ReadResponse(r) => {
                let entry = self
                    .sendq
                    .iter_mut()
                    .find(|e| e.is_read() && e.msg_id == r.msg.id && e.started > 0)
                    .ok_or(NakReason::ProtocolError)?;
                let Job::User(wr) = entry.job else {
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
                entry.read_bytes += payload.len() as u32;
            }
            _ => return Err(NakReason::ProtocolError),
        }
        Ok(())
    }

    /// Finds the receive a SEND or WRITE_IMM packet belongs to, claiming it
    /// for the message on first contact. Returns its buffer.
    fn claim_receive(
        &mut self,
        recv_index: u32,
        msg: MessageSpan,
        imm: Option<u32>,
        write_imm: bool,
        send_payload: Option<&[u8]>,
    ) -> Result<LocalBuf, NakReason> {
        let slot = psn_diff(recv_index, self.recv_base);
        if slot < 0 {
            return Err(NakReason::ProtocolError);
        }
        let entry = self
            .recvq
            .iter_mut()
            .nth(slot as usize)
            .ok_or(NakReason::ReceiverNotReady)?;
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
        Ok(entry.req.local)
    }

    fn credit_receive(&mut self, recv_index: u32, bytes: u32) {
        let slot = psn_diff(recv_index, self.recv_base) as usize;
        if let Some(e) = self.recvq.get_mut(slot) {
            e.bytes += bytes;
        }
    }

    // ----- ACK processing (spec 4.6) --------------------------------------

    fn on_ack(&mut self, now: Instant, h: &Header, ack: &AckRepr, config: &Config, rng: &mut Rng) {
        self.stats.acks_received += 1;
        let in_flight_span = self.snd_nxt.wrapping_sub(self.snd_una);
        let cum_ahead = psn_diff(ack.cumulative, self.snd_una);
        if cum_ahead > in_flight_span as i32 {
            self.stats.invalid_acks += 1;
            return;
        }
        // Spurious retransmission: the echoed transmission is an earlier one
        // than the latest we sent for that PSN (spec 4.6.2).
        let echo_off = psn_diff(ack.echo_psn, self.snd_una);
        if echo_off >= 0 && (echo_off as u32) < in_flight_span {
            let tx = self.window.transmissions(ack.echo_psn);
            let i = Window::idx(ack.echo_psn);
            if tx > 1 && self.window.sent_ts[i] != ack.echo_timestamp {
                self.stats.spurious_retransmissions += 1;
                let p = self.window.path[i];
                self.paths.get_mut(p).stats.spurious += 1;
            }
        }
        let mut newly = 0u32;
        if cum_ahead > 0 {
            let mut psn = self.snd_una;
            while psn != ack.cumulative {
                newly += self.deliver(psn);
                psn = psn.wrapping_add(1);
            }
        }
        for i in ack.sack.iter_set() {
            let psn = ack.cumulative.wrapping_add(1 + i as u32);
            let off = psn_diff(psn, self.snd_una);
            if off < 0 || off as u32 >= in_flight_span {
                continue;
            }
            if matches!(self.window.state(psn), SLOT_IN_FLIGHT | SLOT_LOST) {
                newly += self.deliver(psn);
            }
        }
        if cum_ahead > 0 {
            let mut psn = self.snd_una;
            while psn != ack.cumulative {
                self.window.meta[Window::idx(psn)] = SLOT_FREE;
                psn = psn.wrapping_add(1);
            }
            self.snd_una = ack.cumulative;
        }
        // RTT sample from the echoed timestamp, for the echoed path.
        let echo_path = ack.echo_path as u8;
        if ack.echo_path < self.paths.active() {
            let rtt = now.wire_timestamp().wrapping_sub(ack.echo_timestamp);
            if rtt < 1_000_000_000 {
                self.paths.get_mut(echo_path).on_rtt_sample(rtt);
                self.on_rtt_sample(rtt);
            }
            let (delivered, marked) = self
                .paths
                .get_mut(echo_path)
                .on_echo(ack.path_rx_count, ack.path_ce_count);
            let rtt = Duration::from_nanos(u64::from(self.srtt_ns.max(1)));
            let ceiling = if self.rate_hint_mbps == 0 {
                u32::MAX
            } else {
                self.rate_hint_mbps
            };
            self.cc.on_delivery(now, delivered, marked, rtt, ceiling);
        }
        if psn_diff(h.psn, self.last_ack_seq) >= 0 || self.stats.acks_received == 1 {
            self.last_ack_seq = h.psn;
            self.rate_hint_mbps = ack.rate_hint_mbps;
        }
        if newly > 0 {
            self.startup_window = self
                .startup_window
                .saturating_add(newly.saturating_mul(u32::from(self.params.mtu)));
            self.rto_backoff = 0;
            self.rto_deadline = if self.snd_una == self.snd_nxt {
                None
            } else {
                Some(now + self.rto(config))
            };
        }
        self.detect_losses(now);
        if config.path_reroll && self.paths.epoch_due(config.path_epoch_packets) {
            let n = self
                .paths
                .evaluate(config.entropy_base, config.entropy_span, rng);
            self.stats.path_rerolls += u64::from(n);
        }
        if self.state == ConnState::Closing {
            self.maybe_send_close_after_ack(now, config);
        }
    }

    fn maybe_send_close_after_ack(&mut self, now: Instant, config: &Config) {
        // The queue drains in drain_completions; CLOSE waits for that.
        if self.sendq.iter().all(|e| self.entry_done(e)) {
            self.maybe_send_close(now, config);
        }
    }

    /// Marks `psn` delivered; returns 1 if it was not already.
    fn deliver(&mut self, psn: u32) -> u32 {
        let i = Window::idx(psn);
        let state = self.window.meta[i] & 3;
        if state == SLOT_ACKED || state == SLOT_FREE {
            return 0;
        }
        let path_id = self.window.path[i];
        let ts = self.window.sent_ts[i];
        let path = self.paths.get_mut(path_id);
        if state == SLOT_IN_FLIGHT {
            path.in_flight = path.in_flight.saturating_sub(1);
        } else {
            // Declared lost but it arrived: not retransmitted yet, so cancel.
            self.lost_pending = self.lost_pending.saturating_sub(1);
        }
        path.stats.acked += 1;
        path.on_delivered();
        if !path.rack_valid || psn_diff(ts, path.rack_xmit_ts) > 0 {
            path.rack_xmit_ts = ts;
            path.rack_valid = true;
        }
        self.window.set_state(psn, SLOT_ACKED);
        self.stats.packets_acked += 1;
        1
    }

    fn on_rtt_sample(&mut self, rtt: u32) {
        if self.srtt_ns == 0 {
            self.srtt_ns = rtt.max(1);
            self.rttvar_ns = rtt / 2;
        } else {
            let diff = self.srtt_ns.abs_diff(rtt);
            self.rttvar_ns = self.rttvar_ns - self.rttvar_ns / 4 + diff / 4;
            self.srtt_ns = self.srtt_ns - self.srtt_ns / 8 + rtt / 8;
        }
    }

    fn rto(&self, config: &Config) -> Duration {
        let base = if self.srtt_ns == 0 {
            config.rto_initial
        } else {
            // The slowest path decides: a packet on it is not late until
            // its own round trip has passed (spec 4.6.3).
            let slowest = self
                .paths
                .iter()
                .map(|p| p.srtt_ns.saturating_add(4 * p.rttvar_ns))
                .max()
                .unwrap_or(0)
                .max(self.srtt_ns + 4 * self.rttvar_ns);
            Duration::from_nanos(u64::from(slowest)).max(config.rto_min)
        };
        (base * (1u32 << self.rto_backoff.min(16))).min(config.rto_max)
    }

    /// RACK per path (spec 4.6.2): a packet is lost once a packet sent after
    /// it *on the same path* was delivered and a reordering window has passed
    /// since it was sent. Comparing within a path only is what keeps
    /// multipath skew from looking like loss.
    fn detect_losses(&mut self, now: Instant) {
        self.rack_deadline = None;
        let now_ts = now.wire_timestamp();
        // The latest send time delivered on any path: a packet sent at or
        // after it cannot be declared lost yet, and PSNs are handed out in
        // send order, so the scan stops at the first such first transmission.
        let Some(newest_delivered) = self
            .paths
            .iter()
            .filter(|p| p.rack_valid)
            .map(|p| p.rack_xmit_ts)
            .reduce(|a, b| if psn_diff(a, b) >= 0 { a } else { b })
        else {
            return;
        };
        // For paths without an RTT sample yet: the slowest path's estimate.
        let slowest_srtt = self
            .paths
            .iter()
            .map(|p| p.srtt_ns)
            .max()
            .unwrap_or(0)
            .max(self.srtt_ns);
        let slowest_var = self
            .paths
            .iter()
            .map(|p| p.rttvar_ns)
            .max()
            .unwrap_or(0)
            .max(self.rttvar_ns);
        let mut psn = self.snd_una;
        while psn != self.snd_nxt {
            let i = Window::idx(psn);
            if self.window.meta[i] == (1 << 2) | SLOT_IN_FLIGHT
                && psn_diff(self.window.sent_ts[i], newest_delivered) >= 0
            {
                break;
            }
            if self.window.meta[i] & 3 == SLOT_IN_FLIGHT {
                let path = self.paths.get(self.window.path[i]);
                let sent = self.window.sent_ts[i];
                // Evidence on the packet's own path allows a short
                // reordering window; evidence only from other paths (the
                // chooser may have stopped using this one) waits for this
                // path's own round trip plus a wider allowance. Either way
                // the packet's own path RTT sets the clock, so skew between
                // paths is never taken for loss (spec 4.6.2).
                let same_path = path.rack_valid && psn_diff(path.rack_xmit_ts, sent) > 0;
                let (rtt, var) = if path.srtt_ns != 0 {
                    (path.srtt_ns, path.rttvar_ns)
                } else {
                    (slowest_srtt, slowest_var)
                };
                let reo = if same_path {
                    rtt / 4 + var
                } else {
                    rtt / 2 + 2 * var
                };
                let deadline = sent.wrapping_add(rtt).wrapping_add(reo.max(1_000));
                if psn_diff(now_ts, deadline) >= 0 {
                    self.mark_lost(psn);
                } else {
                    let at = now + Duration::from_nanos(u64::from(deadline.wrapping_sub(now_ts)));
                    self.rack_deadline = Some(self.rack_deadline.map_or(at, |d| d.min(at)));
                }
            }
            psn = psn.wrapping_add(1);
        }
    }

    fn mark_lost(&mut self, psn: u32) {
        let i = Window::idx(psn);
        let path = self.paths.get_mut(self.window.path[i]);
        path.in_flight = path.in_flight.saturating_sub(1);
        path.on_lost();
        self.window.set_state(psn, SLOT_LOST);
        self.lost_pending += 1;
        self.stats.packets_lost += 1;
    }

    fn on_nak(&mut self, now: Instant, nak: &NakRepr, config: &Config) -> Outcome {
        self.stats.naks_received += 1;
        let off = psn_diff(nak.nak_psn, self.snd_una);
        let span = self.snd_nxt.wrapping_sub(self.snd_una);
        if off < 0 || off as u32 >= span {
            self.stats.invalid_acks += 1;
            return Outcome::Ok;
        }
        if nak.reason == NakReason::ReceiverNotReady {
            self.stats.rnr_naks_received += 1;
            let entry = self.sendq.iter_mut().find(|e| {
                let d = psn_diff(nak.nak_psn, e.first_psn);
                e.started > 0 && d >= 0 && (d as u32) < e.started
            });
            if let Some(e) = entry {
                e.rnr_retries = e.rnr_retries.saturating_add(1);
                if e.rnr_retries > config.rnr_retry_limit {
                    self.fail(Status::ReceiverNotReadyExceeded, Some(nak.nak_psn));
                    return Outcome::Event(Event::Failed(
                        self.handle,
                        Status::ReceiverNotReadyExceeded,
                    ));
                }
            }
            if self.window.state(nak.nak_psn) == SLOT_IN_FLIGHT {
                self.mark_lost(nak.nak_psn);
            }
            self.rnr_until = now + config.rnr_delay;
            return Outcome::Ok;
        }
        let status = match nak.reason {
            NakReason::InvalidKey => Status::RemoteInvalidKey,
            NakReason::AccessDenied => Status::RemoteAccess,
            NakReason::OutOfBounds => Status::RemoteBounds,
            NakReason::ReceiveTooSmall => Status::ReceiveTooSmall,
            NakReason::ProtocolError | NakReason::ReceiverNotReady => Status::RemoteProtocol,
        };
        self.fail(status, Some(nak.nak_psn));
        Outcome::Event(Event::Failed(self.handle, status))
    }

    // ----- Timers (spec 4.11) ---------------------------------------------

    pub(crate) fn poll_timeout(&self, config: &Config) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        consider(self.ctrl_deadline);
        match self.state {
            ConnState::Established | ConnState::Closing => {
                consider(self.ack_due);
                consider(self.rto_deadline);
                consider(self.rack_deadline);
                if self.has_data_to_send() {
                    consider(Some(self.next_send_at.max(self.rnr_until)));
                }
                consider(Some(self.last_sent + config.keepalive_interval));
                consider(Some(self.last_heard + config.idle_timeout));
            }
            _ => {}
        }
        // Output is ready now. (An ACK is only sent while open; a flag left
        // over from a packet that arrived as the connection ended must not
        // keep the caller spinning.)
        let open = matches!(self.state, ConnState::Established | ConnState::Closing);
        if (self.ack_now && open) || self.nak_pending.is_some() || self.pending.0 != 0 {
            consider(Some(Instant::ZERO));
        }
        t
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant, config: &Config) -> Outcome {
        if let Some(d) = self.ctrl_deadline {
            if now >= d {
                return self.on_ctrl_timeout(now, config);
            }
        }
        if !matches!(self.state, ConnState::Established | ConnState::Closing) {
            return Outcome::Ok;
        }
        if now >= self.last_heard + config.idle_timeout {
            self.fail(Status::Flushed, None);
            self.close_reason = CloseReason::IdleTimeout;
            self.pending.0 |= Pending::CLOSE;
            return Outcome::Event(Event::Closed(self.handle, CloseReason::IdleTimeout));
        }
        if self.ack_due.is_some_and(|d| now >= d) {
            self.ack_now = true;
        }
        if self.rack_deadline.is_some_and(|d| now >= d) {
            self.detect_losses(now);
        }
        if let Some(d) = self.rto_deadline {
            if now >= d {
                return self.on_rto(now, config);
            }
        }
        if now >= self.last_sent + config.keepalive_interval {
            self.pending.0 |= Pending::KEEPALIVE;
        }
        Outcome::Ok
    }

    fn on_ctrl_timeout(&mut self, now: Instant, config: &Config) -> Outcome {
        if self.ctrl_tries >= config.handshake_retries {
            self.ctrl_deadline = None;
            return match self.state {
                ConnState::Closing => {
                    self.fail(Status::Flushed, None);
                    self.state = ConnState::Closed;
                    Outcome::Event(Event::Closed(self.handle, CloseReason::Normal))
                }
                _ => {
                    self.fail(Status::RetryExceeded, None);
                    Outcome::Event(Event::Failed(self.handle, Status::RetryExceeded))
                }
            };
        }
        self.ctrl_tries += 1;
        let backoff = config.handshake_timeout * (1u32 << self.ctrl_tries.min(8));
        self.ctrl_deadline = Some(now + backoff);
        match self.state {
            ConnState::Connecting => self.pending.0 |= Pending::CONNECT,
            ConnState::Accepting => self.pending.0 |= Pending::ACCEPT,
            ConnState::Closing => self.pending.0 |= Pending::CLOSE,
            _ => self.ctrl_deadline = None,
        }
        Outcome::Ok
    }

    fn on_rto(&mut self, now: Instant, config: &Config) -> Outcome {
        self.stats.timeouts += 1;
        self.rto_backoff = self.rto_backoff.saturating_add(1);
        if self.rto_backoff > config.retry_limit {
            let culprit = self.snd_una;
            self.fail(Status::RetryExceeded, Some(culprit));
            self.pending.0 |= Pending::CLOSE;
            self.close_reason = CloseReason::Error;
            return Outcome::Event(Event::Failed(self.handle, Status::RetryExceeded));
        }
        self.cc.on_timeout(now);
        // Everything sent more than one (un-backed-off) timeout ago is lost.
        let age =
            Duration::from_nanos((self.rto(config).as_nanos() >> self.rto_backoff.min(16)) as u64);
        let cutoff = (now - age).wire_timestamp();
        let mut psn = self.snd_una;
        let mut any = false;
        while psn != self.snd_nxt {
            let i = Window::idx(psn);
            if self.window.meta[i] & 3 == SLOT_IN_FLIGHT
                && psn_diff(cutoff, self.window.sent_ts[i]) >= 0
            {
                self.mark_lost(psn);
                any = true;
            }
            psn = psn.wrapping_add(1);
        }
        if !any && self.snd_una != self.snd_nxt && self.window.state(self.snd_una) == SLOT_IN_FLIGHT
        {
            self.mark_lost(self.snd_una);
        }
        self.rto_deadline = if self.snd_una == self.snd_nxt {
            None
        } else {
            Some(now + self.rto(config))
        };
        Outcome::Ok
    }

    // ----- Transmitting (spec 4.4, 4.9, 4.10) -----------------------------

    fn has_data_to_send(&self) -> bool {
        if self.lost_pending > 0 {
            return true;
        }
        self.may_send_new()
            && self
                .sendq
                .iter()
                .skip(self.send_cursor)
                .any(|e| e.started < e.packets && e.error.is_none())
    }

    /// Whether one more new packet fits the PSN window and the start-up
    /// window. The in-flight count is summed over the paths only while the
    /// span of outstanding PSNs could exceed the start-up window (the first
    /// round trips), so a grown connection pays nothing for it.
    fn may_send_new(&self) -> bool {
        let span = self.snd_nxt.wrapping_sub(self.snd_una);
        if span >= u32::from(self.params.window) {
            return false;
        }
        let mtu = u32::from(self.params.mtu).max(1);
        let allowed = (self.startup_window / mtu).max(2);
        span < allowed || self.paths.in_flight_total() < allowed
    }

    fn header(&self, now: Instant, psn: u32, path: u8, flags: Flags) -> Header {
        Header {
            flags,
            dst_conn: self.remote_id,
            token: self.remote_token,
            psn,
            path: u16::from(path),
            timestamp: now.wire_timestamp(),
        }
    }

    fn transmit(
        &mut self,
        now: Instant,
        repr: &Repr,
        buf: &mut [u8],
        path: u8,
        ecn_codepoint: u8,
        payload: Option<PayloadRef>,
    ) -> Option<Transmit> {
        if buf.len() < repr.header_len() {
            return None;
        }
        repr.emit_header(buf);
        self.last_sent = now;
        Some(Transmit {
            peer: self.peer,
            src_port: self.paths.get(path).entropy,
            ecn: ecn_codepoint,
            header_len: repr.header_len(),
            payload,
        })
    }

    /// The next packet of this connection, if any is due.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        rate_hint_mbps: u32,
        regions: &RegionTable,
        config: &Config,
    ) -> Option<Transmit> {
        // Control first: they unblock everything else.
        if self.pending.0 != 0 {
            if let Some(t) = self.poll_control(now, buf, config) {
                return Some(t);
            }
        }
        if let Some(nak) = self.nak_pending.take() {
            let repr = Repr {
                header: self.header(now, self.ack_seq, self.echo_path, Flags::NONE),
                body: Body::Nak(nak),
                payload_len: 0,
            };
            let path = self.echo_path;
            return self.transmit(now, &repr, buf, path, ecn::NOT_ECT, None);
        }
        if !matches!(self.state, ConnState::Established | ConnState::Closing) {
            return None;
        }
        if self.ack_now {
            return self.emit_ack(now, buf, rate_hint_mbps);
        }
        self.poll_data(now, buf, regions, config)
    }

    fn emit_ack(&mut self, now: Instant, buf: &mut [u8], rate_hint_mbps: u32) -> Option<Transmit> {
        let path = self.echo_path;
        let p = self.paths.get(path);
        self.ack_seq = self.ack_seq.wrapping_add(1);
        let repr = Repr {
            header: self.header(now, self.ack_seq, path, Flags::NONE),
            body: Body::Ack(AckRepr {
                cumulative: self.rcv_cum,
                echo_psn: self.echo_psn,
                echo_timestamp: self.echo_ts,
                echo_path: u16::from(path),
                path_rx_count: p.rx_count,
                path_ce_count: p.ce_count,
                rate_hint_mbps,
                sack: self.rcv_sack,
            }),
            payload_len: 0,
        };
        let t = self.transmit(now, &repr, buf, path, ecn::NOT_ECT, None)?;
        self.ack_now = false;
        self.ack_due = None;
        self.ack_pending = 0;
        self.stats.acks_sent += 1;
        Some(t)
    }

    fn poll_control(&mut self, now: Instant, buf: &mut [u8], config: &Config) -> Option<Transmit> {
        let bits = self.pending.0;
        let (bit, header, body) = if bits & Pending::CONNECT != 0 {
            let mut h = self.header(now, 0, 0, Flags::NONE);
            h.dst_conn = 0;
            h.token = 0;
            (
                Pending::CONNECT,
                h,
                Body::Connect(self.connect_repr(config)),
            )
        } else if bits & Pending::ACCEPT != 0 {
            let h = self.header(now, 0, 0, Flags::NONE);
            (Pending::ACCEPT, h, Body::Accept(self.connect_repr(config)))
        } else if bits & Pending::CLOSE_REPLY != 0 {
            let h = self.header(now, 0, 0, Flags::CLOSE_REPLY);
            let reason = self.close_reason;
            (Pending::CLOSE_REPLY, h, Body::Close(CloseRepr { reason }))
        } else if bits & Pending::CLOSE != 0 {
            let h = self.header(now, 0, 0, Flags::NONE);
            let reason = self.close_reason;
            (Pending::CLOSE, h, Body::Close(CloseRepr { reason }))
        } else if bits & Pending::KEEPALIVE != 0 {
            let h = self.header(now, 0, 0, Flags::NONE);
            (Pending::KEEPALIVE, h, Body::Keepalive)
        } else {
            return None;
        };
        self.pending.0 &= !bit;
        if self.remote_id == 0 && bit != Pending::CONNECT {
            // Nobody to address yet.
            return None;
        }
        let repr = Repr {
            header,
            body,
            payload_len: 0,
        };
        self.transmit(now, &repr, buf, 0, ecn::NOT_ECT, None)
    }

    fn sending_rate(&self) -> u32 {
        let own = self.cc.rate_mbps();
        if self.rate_hint_mbps == 0 {
            own
        } else {
            own.min(self.rate_hint_mbps)
        }
    }

    fn poll_data(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        regions: &RegionTable,
        config: &Config,
    ) -> Option<Transmit> {
        if now < self.rnr_until || now < self.next_send_at {
            return None;
        }
        // Retransmissions before new data.
        let (psn, retransmission) = if self.lost_pending > 0 {
            let mut psn = self.snd_una;
            while psn != self.snd_nxt && self.window.state(psn) != SLOT_LOST {
                psn = psn.wrapping_add(1);
            }
            if psn == self.snd_nxt {
                self.lost_pending = 0;
                return None;
            }
            (psn, true)
        } else {
            if !self.may_send_new() {
                return None;
            }
            (self.snd_nxt, false)
        };
        // Find the message and packet index for this PSN.
        let mtu = u32::from(self.params.mtu);
        let (entry_index, packet_index) = if retransmission {
            let found = self.sendq.iter().enumerate().find_map(|(k, e)| {
                let d = psn_diff(psn, e.first_psn);
                (e.started > 0 && d >= 0 && (d as u32) < e.started).then_some((k, d as u32))
            });
            match found {
                Some(f) => f,
                None => {
                    // Its message already failed and left the queue.
                    self.window.set_state(psn, SLOT_ACKED);
                    self.lost_pending = self.lost_pending.saturating_sub(1);
                    return None;
                }
            }
        } else {
            let mut k = self.send_cursor;
            loop {
                let e = self.sendq.get(k)?;
                if e.started < e.packets && e.error.is_none() {
                    break;
                }
                k += 1;
                self.send_cursor = k;
            }
            let e = self.sendq.get_mut(k)?;
            if e.started == 0 {
                e.first_psn = psn;
            }
            (k, e.started)
        };
        let entry = *self.sendq.get(entry_index)?;
        let offset = packet_index * mtu;
        let chunk = entry.len.saturating_sub(offset).min(mtu);
        let last = packet_index + 1 == entry.packets;
        let mut flags = Flags::NONE;
        if retransmission {
            flags = flags.with(Flags::RETRANSMISSION).with(Flags::ACK_REQUEST);
        }
        let window_nearly_full =
            self.snd_nxt.wrapping_sub(self.snd_una) + 1 >= u32::from(self.params.window);
        // Ask for an immediate ACK when this packet ends a message and
        // nothing else is queued behind it (the sender is about to go idle
        // and waits for completions), or when the window is about to fill.
        // Otherwise the receiver's coalescing (spec 4.5) bounds the delay.
        let goes_idle = last
            && !self
                .sendq
                .iter()
                .skip(entry_index + 1)
                .any(|e| e.started < e.packets);
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
                    self.fail(Status::LocalProtection, Some(psn));
                    return None;
                }
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
                            imm: Some(WriteImm {
                                imm,
                                recv_index: entry.recv_index,
                            }),
                        }),
                        Some(src),
                    ),
                    Op::Send => (
                        Body::Send(SendRepr {
                            msg,
                            recv_index: entry.recv_index,
                            imm: None,
                        }),
                        Some(src),
                    ),
                    Op::SendImm { imm } => (
                        Body::Send(SendRepr {
                            msg,
                            recv_index: entry.recv_index,
                            imm: Some(imm),
                        }),
                        Some(src),
                    ),
                    Op::Read { remote } => (
                        Body::ReadRequest(ReadRequestRepr {
                            msg_id: entry.msg_id,
                            len: entry.len,
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
            Job::ReadResponse {
                msg_id,
                source,
                sink,
            } => (
                Body::ReadResponse(ReadResponseRepr {
                    msg: MessageSpan { id: msg_id, ..msg },
                    target: MemoryTarget {
                        key: sink.key,
                        addr: sink.addr.wrapping_add(u64::from(offset)),
                    },
                }),
                Some(PayloadRef {
                    addr: source + u64::from(offset),
                    len: chunk,
                }),
            ),
        };
        let payload = payload.filter(|p| p.len > 0);
        let payload_len = payload.map_or(0, |p| p.len as u16);
        let path = self.paths.choose();
        let repr = Repr {
            header: self.header(now, psn, path, flags),
            body,
            payload_len,
        };
        let t = self.transmit(now, &repr, buf, path, ecn::ECT0, payload)?;
        // Commit the send.
        self.window.record_send(psn, now.wire_timestamp(), path);
        self.paths.on_sent(path, retransmission);
        if retransmission {
            self.lost_pending -= 1;
            self.stats.retransmissions += 1;
        } else {
            self.snd_nxt = self.snd_nxt.wrapping_add(1);
            if let Some(e) = self.sendq.get_mut(entry_index) {
                e.started += 1;
            }
            self.stats.packets_sent += 1;
            self.stats.bytes_sent += u64::from(chunk);
        }
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rto(config));
        }
        // Pacing: the next packet may leave once this one has been
        // serialized at the current rate.
        let rate = self.sending_rate();
        let gap = serialization_nanos(t.packet_len() + 50, rate);
        let base = self.next_send_at.max(now - Duration::from_nanos(gap));
        self.next_send_at = base + Duration::from_nanos(gap);
        self.stats.rate_mbps = self.cc.rate_mbps();
        self.stats.rate_hint_mbps = self.rate_hint_mbps;
        Some(t)
    }

    /// Snapshot of the counters.
    pub fn stats(&self) -> ConnStats {
        ConnStats {
            rate_mbps: self.cc.rate_mbps(),
            rate_hint_mbps: self.rate_hint_mbps,
            ..self.stats
        }
    }

    /// Connection state.
    pub fn state(&self) -> ConnState {
        self.state
    }

    /// The peer's address (its IP and MetaRoCE UDP port).
    pub fn peer(&self) -> PeerAddr {
        self.peer
    }

    /// Negotiated parameters.
    pub fn params(&self) -> Negotiated {
        self.params
    }

    /// Whether the sender has nothing unacknowledged.
    pub fn all_acked(&self) -> bool {
        self.snd_una == self.snd_nxt
    }
}

impl<const P: usize> Connection<P> {
    /// Bytes taken by the send and receive work queues.
    pub(crate) const fn queue_bytes() -> usize {
        core::mem::size_of::<Deque<SendEntry, SEND_QUEUE_DEPTH>>()
            + core::mem::size_of::<Deque<RecvEntry, RECV_QUEUE_DEPTH>>()
    }
}
