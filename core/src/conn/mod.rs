//! One connection (spec 4), split by concern as quinn-proto splits its
//! `connection/`:
//!
//! * [`dispatch`]: each received packet to its handler, each transmit
//!   opportunity to control, ACK or data;
//! * [`handshake`]: CONNECT/ACCEPT, keep-alive, CLOSE, the control packets;
//! * [`send`]: posting, choosing what to send next, building data packets,
//!   pacing, the pooled sender state;
//! * [`recv`]: receive checks, placement, receive buffers, ACK and NAK
//!   generation;
//! * [`paths`]: what the per-packet path asks of the sender's paths (the
//!   next path, the slowest timeout), kept current as telemetry changes;
//! * [`recovery`]: acknowledgements, loss detection, retransmission
//!   timeouts, NAK handling;
//! * [`timers`]: deadlines and what happens when they pass;
//! * [`completion`]: completions in order and the error state;
//! * [`resources`]: the endpoint's pools connections draw on, grouped by
//!   concern.
//!
//! A connection owns only its fixed part (ids, sequence state, queue
//! heads, per-path entropy and receive counters, counters). Work entries,
//! receive buffers, the sender's telemetry and in-flight records come from
//! the endpoint's pools while they are in use, grouped by concern in
//! [`Resources`]; each method borrows only the groups it touches (the
//! sender's [`SendPools`], the receiver's [`RecvPools`], the memory
//! regions, ...). A connection never sees another connection's state.

mod completion;
mod dispatch;
mod handshake;
mod paths;
mod recovery;
mod recv;
pub mod reorder;
mod resources;
mod send;
pub mod sender;
mod timers;

use crate::api::{ConnHandle, PeerAddr, RecvRequest, Status};
use crate::config::Config;
use crate::psn::Psn;
use crate::rng::Rng;
use crate::rtt::RttEstimator;
use crate::stats::ConnStats;
use crate::storage::list::OptIndex;
use crate::storage::pool::Queue;
use crate::storage::Backing;
use crate::time::{Instant, MaybeInstant};
use crate::wire::{CloseReason, MemoryTarget};

pub(crate) use completion::Blame;
pub(crate) use handshake::RetryOutcome;
pub(crate) use recv::ReliableOutcome;
use reorder::ReceiveWindow;
pub use reorder::ReorderPool;
pub use resources::{Credentials, PoolRefusals, RecvPools, Resources, SendPools, NAK_QUEUE};
pub(crate) use resources::{Inflight, QueuedNak, RecvRefusals, SendRefusals};
pub(crate) use resources::{RecvPool, Regions};
pub use sender::{InflightPool, InflightRecord, PathSender, SenderState};

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
    /// Closed cleanly (or refused). Terminal.
    Closed,
    /// Failed: outstanding work is flushed with error completions. Terminal
    /// until the application closes or releases it.
    Error,
}

impl ConnState {
    /// Closed or failed: nothing more will happen until the application
    /// releases the handle.
    pub const fn is_terminal(self) -> bool {
        matches!(self, ConnState::Closed | ConnState::Error)
    }

    /// Reliable packets flow in both directions.
    pub(crate) const fn is_open(self) -> bool {
        matches!(self, ConnState::Established | ConnState::Closing)
    }
}

/// What a connection's CONNECT carries in its Cookie field besides a
/// RETRY's cookie, and what that allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    Plain,
    /// 0-RTT (spec 4.2.4). Initiator: its CONNECT carries an early proof
    /// (held where a RETRY's cookie would be) and it sends data before the
    /// ACCEPT, until the ACCEPT or a RETRY. Acceptor: it took an early
    /// CONNECT, and takes the initiator's early packets.
    Early,
    /// Initiator: its CONNECT carries an address token an earlier
    /// connection got (spec 4.2.5), held where a RETRY's cookie would be.
    Token,
}

/// Negotiated parameters (spec 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Negotiated {
    pub mtu: u16,
    pub paths: u16,
    /// PSNs outstanding at most (spec 4.4), 1 to 65,536.
    pub window: u32,
}

/// Events an endpoint reports to the application about its connections.
/// None is ever lost: each connection keeps its own until it is polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Event {
    /// A peer opened a connection to this endpoint and it was accepted:
    /// the application may post work on it (receives before the peer's
    /// first SEND) and owns its handle until it releases it.
    Incoming { conn: ConnHandle, peer: PeerAddr },
    /// The handshake completed.
    Connected(ConnHandle),
    /// The connection closed (by either side, or idle). `release` frees it
    /// once its completions are drained.
    Closed {
        conn: ConnHandle,
        reason: CloseReason,
    },
    /// The connection failed; its work was flushed with error completions.
    /// `status` says why (the culprit's completion status).
    Failed { conn: ConnHandle, status: Status },
}

impl Event {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnHandle {
        match *self {
            Event::Incoming { conn, .. }
            | Event::Connected(conn)
            | Event::Closed { conn, .. }
            | Event::Failed { conn, .. } => conn,
        }
    }
}

/// Event bits a connection holds until the endpoint hands them out, in the
/// order they are reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PendingEvents(u8);

impl PendingEvents {
    pub const INCOMING: u8 = 1;
    pub const CONNECTED: u8 = 2;
    pub const CLOSED: u8 = 4;
    pub const FAILED: u8 = 8;

    pub fn raise(&mut self, bit: u8) {
        self.0 |= bit;
    }

    pub fn any(self) -> bool {
        self.0 != 0
    }

    /// Takes the first pending bit.
    pub fn take(&mut self) -> Option<u8> {
        if self.0 == 0 {
            return None;
        }
        let bit = 1 << self.0.trailing_zeros();
        self.0 &= !bit;
        Some(bit)
    }
}

/// A send-queue entry's job.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Job {
    User(crate::api::WorkRequest),
    /// Answering a peer's READ_REQUEST: stream `len` bytes from `source`
    /// (its key kept: each response packet checks the region again).
    ReadResponse {
        source: MemoryTarget,
        sink: MemoryTarget,
    },
}

/// A send-queue entry (user work request or READ-response job), pooled.
#[derive(Debug, Clone, Copy)]
pub struct WorkEntry {
    pub(crate) job: Job,
    pub(crate) msg_id: u32,
    pub(crate) len: u32,
    /// Reliable packets this entry needs (a READ needs one: its request).
    pub(crate) packets: u32,
    pub(crate) first_psn: Psn,
    /// Packets that have a PSN (sent at least once).
    pub(crate) started: u32,
    /// READ: response bytes placed.
    pub(crate) read_bytes: u32,
    /// SEND / WRITE_IMM: the receive it consumes at the peer.
    pub(crate) recv_index: u32,
    pub(crate) error: Option<Status>,
    pub(crate) rnr_retries: u8,
}

impl WorkEntry {
    pub const VACANT: WorkEntry = WorkEntry {
        job: Job::ReadResponse {
            source: MemoryTarget { key: 0, addr: 0 },
            sink: MemoryTarget { key: 0, addr: 0 },
        },
        msg_id: 0,
        len: 0,
        packets: 0,
        first_psn: Psn(0),
        started: 0,
        read_bytes: 0,
        recv_index: 0,
        error: None,
        rnr_retries: 0,
    };

    pub(crate) fn is_read(&self) -> bool {
        matches!(
            self.job,
            Job::User(crate::api::WorkRequest {
                op: crate::api::Op::Read { .. },
                ..
            })
        )
    }

    /// Whether PSN `psn` belongs to this entry's sent packets.
    pub(crate) fn holds(&self, psn: Psn) -> bool {
        self.started > 0 && psn.is_within(self.first_psn, self.started)
    }
}

/// A posted receive, pooled.
#[derive(Debug, Clone, Copy)]
pub struct RecvEntry {
    pub(crate) req: RecvRequest,
    /// Message id of the SEND / WRITE_IMM that claimed it.
    pub(crate) claimed_by: Option<u32>,
    pub(crate) msg_len: u32,
    pub(crate) bytes: u32,
    pub(crate) imm: Option<u32>,
    pub(crate) write_imm: bool,
    /// Its receive index (spec 3.5): where the receive finger is.
    pub(crate) number: u32,
}

impl RecvEntry {
    pub const VACANT: RecvEntry = RecvEntry {
        req: RecvRequest {
            id: 0,
            local: crate::api::LocalBuf {
                key: 0,
                addr: 0,
                len: 0,
            },
        },
        claimed_by: None,
        msg_len: 0,
        bytes: 0,
        imm: None,
        write_imm: false,
        number: 0,
    };
}

/// Control packets waiting to go out (bit set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pending(u8);

impl Pending {
    pub const CONNECT: u8 = 1;
    pub const ACCEPT: u8 = 2;
    pub const KEEPALIVE: u8 = 4;
    pub const CLOSE: u8 = 8;
    pub const CLOSE_REPLY: u8 = 16;
    /// With CONNECT: send it once more right after (`Config::connect_twice`).
    pub const CONNECT_COPY: u8 = 32;
    /// Acceptor: an address token for the initiator (spec 4.2.5), held in
    /// the cookie pool until sent.
    pub const NEW_TOKEN: u8 = 64;

    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    pub fn set(&mut self, bit: u8) {
        self.0 |= bit;
    }

    pub fn clear(&mut self, bit: u8) {
        self.0 &= !bit;
    }

    pub fn any(self) -> bool {
        self.0 != 0
    }
}

/// The sender's fixed part: sequence state, the work queue, the
/// connection-wide RTT estimate. The rest is in the pooled [`SenderState`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendSide {
    /// The Initial PSN of this direction (CONNECT / ACCEPT, spec 3.2.4,
    /// 3.8.1): every ACCEPT, a repeated one too, carries it.
    pub initial: Psn,
    pub una: Psn,
    pub nxt: Psn,
    pub queue: Queue,
    /// First entry with unsent packets (a pool index); none when every
    /// queued entry has been started.
    pub cursor: OptIndex,
    pub next_msg_id: u32,
    pub next_recv_index: u32,
    /// Pool index of the [`SenderState`], if one is held.
    pub state: OptIndex,
    pub rtt: RttEstimator,
    /// READ-response jobs queued (a peer's requests), for their budget.
    pub read_jobs: u16,
    /// User work requests queued, for their budget.
    pub user_jobs: u16,
    /// A pool (sender states or in-flight records) refused it: the endpoint
    /// wakes it when something is given back.
    pub starved: bool,
    /// The queue's first entry is known finished (a finished entry stays
    /// so until it leaves the queue): the completion that found it so
    /// spares the next one the check.
    pub head_done: bool,
    /// The peer's READ_REQUESTs this end serves at once, as its CONNECT or
    /// ACCEPT states (spec 3.8.1, 4.8.6); reserved from the endpoint's
    /// budget, 0 until then. At most 255 (a byte of connection state).
    pub read_depth: u8,
    /// The READ depth the peer stated, at most 255 taken; 0: none stated
    /// ([`crate::wire::packet::DEFAULT_READ_DEPTH`]).
    pub peer_read_depth: u8,
    /// `Some` until it held a sender state (the receiver's echo counters of
    /// earlier bursts are unknown to a later one), with the ACCEPT's Rate
    /// Grant in Mbit/s (0: none), the first sender state's share and first
    /// flight (spec 4.10.6).
    pub first_sender: FirstSender,
}

/// An `Option<u32>` Rate Grant in four bytes (a connection's footprint
/// counts): `u32::MAX` is none, a grant that large reads as one less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FirstSender(u32);

impl FirstSender {
    pub const NONE: FirstSender = FirstSender(u32::MAX);

    pub const fn grant(mbps: u32) -> FirstSender {
        FirstSender(if mbps == u32::MAX { mbps - 1 } else { mbps })
    }

    pub const fn get(self) -> Option<u32> {
        if self.0 == u32::MAX {
            None
        } else {
            Some(self.0)
        }
    }
}

/// The receiver's state (spec 4.5, 4.8).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvSide<const P: usize> {
    /// The cumulative PSN and what arrived beyond it.
    pub win: ReceiveWindow,
    pub queue: Queue,
    pub base: u32,
    pub ack_pending: u8,
    pub ack_now: bool,
    pub echo_path: u16,
    pub echo_psn: u32,
    pub echo_ts: u32,
    pub ack_due: MaybeInstant,
    /// After a fatal NAK every later reliable packet hears it again: the
    /// refused PSN and the reason.
    pub sticky_nak: Option<(u32, crate::wire::NakReason)>,
    pub last_data_rx: MaybeInstant,
    /// Per path: data packets and CE marks received, echoed in ACKs.
    pub rx_count: [u16; P],
    pub ce_count: [u16; P],
}

/// Handshake, keep-alive and close state (spec 4.2, 4.12).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Control {
    pub deadline: MaybeInstant,
    pub last_heard: Instant,
    pub last_sent: Instant,
}

/// Per-connection counters, compact (32-bit counts wrap; bytes are 64-bit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub packets_sent: u32,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub retransmissions: u32,
    pub spurious_retransmissions: u32,
    pub packets_acked: u32,
    pub packets_lost: u32,
    pub timeouts: u32,
    pub probes: u32,
    pub acks_sent: u32,
    pub acks_received: u32,
    pub naks_sent: u32,
    pub naks_received: u32,
    pub rnr_naks_received: u32,
    pub packets_received: u32,
    pub duplicates_received: u32,
    /// Out-of-order packets dropped for want of a receive bitmap.
    pub reorder_refused: u32,
    /// The most PSNs outstanding at once (sent, not cumulatively
    /// acknowledged): what the window bounds.
    pub max_in_flight: u32,
    pub ce_received: u32,
    pub out_of_window: u32,
    pub invalid_dropped: u32,
    pub invalid_acks: u32,
    pub path_rerolls: u32,
    pub completions: u32,
}

/// One MetaRoCE connection with up to `P` logical paths.
#[derive(Debug, Clone, Copy)]
pub struct Connection<const P: usize> {
    pub(crate) state: ConnState,
    pub(crate) local_id: u32,
    pub(crate) local_token: u64,
    pub(crate) remote_id: u32,
    pub(crate) remote_token: u64,
    pub(crate) peer: PeerAddr,
    pub(crate) pd: u32,
    pub(crate) params: Negotiated,
    /// Per path: the UDP source port (entropy) it is sent with (spec 4.9).
    pub(crate) entropy: [u16; P],
    pub(crate) send: SendSide,
    pub(crate) recv: RecvSide<P>,
    /// The receive the last SEND or WRITE_IMM packet claimed (an index
    /// into the receive pool; `OptIndex::NONE` once it is taken or
    /// discarded): the next packet's is found from it, not by a walk from
    /// the queue's front. Beside `recv`, not in it, where it would cost a
    /// connection eight bytes of alignment.
    pub(crate) recv_finger: OptIndex,
    pub(crate) ctrl: Control,
    /// Control packets waiting to go out.
    pub(crate) pending: Pending,
    /// The reason our CLOSE carries (or the peer's, once closed).
    pub(crate) close_reason: CloseReason,
    /// Transmissions of the current CONNECT or CLOSE.
    pub(crate) ctrl_tries: u8,
    /// How the handshake opens, beyond the plain one (spec 4.2.4, 4.2.5).
    pub(crate) opening: Opening,
    pub(crate) events: PendingEvents,
    /// Why the connection failed, for its `Failed` event.
    pub(crate) fail_status: Status,
    /// The timer profile the peer announced (spec 4.11); our own until
    /// its CONNECT or ACCEPT is heard.
    pub(crate) peer_profile: crate::wire::TimerProfile,
    /// Initiator: the RETRY's cookie in the endpoint's cookie pool, while
    /// Connecting after a RETRY (spec 4.2).
    pub(crate) cookie: OptIndex,
    pub(crate) counters: Counters,
    /// Packet protection: suite, Key ID and key slot (spec 5.3).
    pub(crate) protection: crate::crypto::ConnProtection,
}

impl<const P: usize> Connection<P> {
    /// A free slot's content.
    pub const VACANT: Connection<P> = Connection {
        state: ConnState::Closed,
        local_id: 0,
        local_token: 0,
        remote_id: 0,
        remote_token: 0,
        peer: PeerAddr {
            ip: smoltcp::wire::IpAddress::Ipv4(smoltcp::wire::Ipv4Address::UNSPECIFIED),
            port: 0,
        },
        pd: 0,
        params: Negotiated {
            mtu: 0,
            paths: 0,
            window: 0,
        },
        entropy: [0; P],
        send: SendSide {
            initial: Psn(0),
            una: Psn(0),
            nxt: Psn(0),
            queue: Queue::EMPTY,
            cursor: OptIndex::NONE,
            next_msg_id: 0,
            next_recv_index: 0,
            state: OptIndex::NONE,
            rtt: RttEstimator::seeded(0, 0),
            read_jobs: 0,
            read_depth: 0,
            peer_read_depth: 0,
            user_jobs: 0,
            starved: false,
            head_done: false,
            first_sender: FirstSender::grant(0),
        },
        recv: RecvSide {
            win: ReceiveWindow::EMPTY,
            queue: Queue::EMPTY,
            base: 0,
            ack_pending: 0,
            ack_now: false,
            echo_path: 0,
            echo_psn: 0,
            echo_ts: 0,
            ack_due: MaybeInstant::NONE,
            sticky_nak: None,
            last_data_rx: MaybeInstant::NONE,
            rx_count: [0; P],
            ce_count: [0; P],
        },
        recv_finger: OptIndex::NONE,
        pending: Pending(0),
        close_reason: CloseReason::Normal,
        ctrl_tries: 0,
        opening: Opening::Plain,
        ctrl: Control {
            deadline: MaybeInstant::NONE,
            last_heard: Instant::ZERO,
            last_sent: Instant::ZERO,
        },
        events: PendingEvents(0),
        fail_status: Status::Flushed,
        peer_profile: crate::wire::TimerProfile::DataCenter,
        cookie: OptIndex::NONE,
        counters: Counters {
            packets_sent: 0,
            bytes_sent: 0,
            bytes_received: 0,
            retransmissions: 0,
            spurious_retransmissions: 0,
            packets_acked: 0,
            packets_lost: 0,
            timeouts: 0,
            probes: 0,
            acks_sent: 0,
            acks_received: 0,
            naks_sent: 0,
            naks_received: 0,
            rnr_naks_received: 0,
            packets_received: 0,
            duplicates_received: 0,
            reorder_refused: 0,
            max_in_flight: 0,
            ce_received: 0,
            out_of_window: 0,
            invalid_dropped: 0,
            invalid_acks: 0,
            path_rerolls: 0,
            completions: 0,
        },
        protection: crate::crypto::ConnProtection::NONE,
    };

    /// A new connection in `state`, with random initial PSN, token and
    /// path entropy drawn from `rng`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        local_id: u32,
        peer: PeerAddr,
        pd: u32,
        config: &Config,
        rng: &mut Rng,
        now: Instant,
        state: ConnState,
    ) -> Self {
        let initial_psn = Psn(rng.next_u32());
        let paths = config.paths.clamp(1, P as u16);
        let mut conn = Connection {
            state,
            local_id,
            local_token: rng.nonzero_u64(),
            peer,
            pd,
            params: Negotiated {
                mtu: config.mtu,
                paths,
                window: config.window.clamp(1, crate::config::MAX_WINDOW),
            },
            peer_profile: config.timer_profile,
            ..Self::VACANT
        };
        conn.send.initial = initial_psn;
        conn.send.una = initial_psn;
        conn.send.nxt = initial_psn;
        conn.send.next_msg_id = 1;
        conn.ctrl.last_heard = now;
        conn.ctrl.last_sent = now;
        conn.draw_all_entropy(config, rng);
        conn
    }

    /// Draws distinct entropy for every active path.
    pub(crate) fn draw_all_entropy(&mut self, config: &Config, rng: &mut Rng) {
        let n = usize::from(self.params.paths);
        for i in 0..n {
            self.entropy[i] = Self::draw_entropy(&self.entropy[..i], config, rng);
        }
    }

    /// A value from the configured range, distinct from `taken` where the
    /// range allows, so two paths never share a route by construction.
    pub(crate) fn draw_entropy(taken: &[u16], config: &Config, rng: &mut Rng) -> u16 {
        let span = u32::from(config.entropy_span.max(1));
        for _ in 0..16 {
            let e = config.entropy_base.wrapping_add(rng.below(span) as u16);
            if !taken.contains(&e) {
                return e;
            }
        }
        config.entropy_base.wrapping_add(rng.below(span) as u16)
    }

    /// Snapshot of the counters.
    pub fn stats<B: Backing>(&self, send: &SendPools<B, P>) -> ConnStats {
        let c = &self.counters;
        let (rate_mbps, rate_hint_mbps) = self.send.state.get().map_or((0, 0), |s| {
            let s = send.senders.get(s);
            (
                crate::cc::CongestionControl::rate_mbps(&s.cc),
                s.rate_hint_mbps,
            )
        });
        ConnStats {
            packets_sent: u64::from(c.packets_sent),
            bytes_sent: c.bytes_sent,
            retransmissions: u64::from(c.retransmissions),
            spurious_retransmissions: u64::from(c.spurious_retransmissions),
            packets_acked: u64::from(c.packets_acked),
            packets_lost: u64::from(c.packets_lost),
            timeouts: u64::from(c.timeouts),
            probes: u64::from(c.probes),
            acks_sent: u64::from(c.acks_sent),
            acks_received: u64::from(c.acks_received),
            naks_sent: u64::from(c.naks_sent),
            naks_received: u64::from(c.naks_received),
            rnr_naks_received: u64::from(c.rnr_naks_received),
            packets_received: u64::from(c.packets_received),
            bytes_received: c.bytes_received,
            duplicates_received: u64::from(c.duplicates_received),
            reorder_refused: u64::from(c.reorder_refused),
            max_in_flight: u64::from(c.max_in_flight),
            ce_received: u64::from(c.ce_received),
            out_of_window: u64::from(c.out_of_window),
            invalid_dropped: u64::from(c.invalid_dropped),
            invalid_acks: u64::from(c.invalid_acks),
            path_rerolls: u64::from(c.path_rerolls),
            completions: u64::from(c.completions),
            rate_mbps,
            rate_hint_mbps,
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

    /// The protection domain.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// The timer profile the peer announced (spec 4.11).
    pub fn peer_profile(&self) -> crate::wire::TimerProfile {
        self.peer_profile
    }

    /// The peer's profile's timers when it announced another profile than
    /// ours (spec 4.11): then this connection waits at least as long as
    /// the peer expects, so neither side gives up first. With the same
    /// profile, our configuration stands as it is.
    fn other_profile(&self, config: &Config) -> Option<crate::config::ProfileTimers> {
        (self.peer_profile != config.timer_profile)
            .then(|| crate::config::profile_timers(self.peer_profile))
    }

    /// The idle timeout this connection runs: ours, or the peer's
    /// profile's if that is another profile and longer (spec 4.11).
    pub fn idle_timeout(&self, config: &Config) -> core::time::Duration {
        self.other_profile(config).map_or(config.idle_timeout, |p| {
            p.idle_timeout.max(config.idle_timeout)
        })
    }

    /// The longest outage this connection rides through: ours, or the
    /// peer's profile's if that is another profile and longer (spec
    /// 4.6.4, 4.11).
    pub fn ride_through(&self, config: &Config) -> core::time::Duration {
        self.other_profile(config).map_or(config.ride_through, |p| {
            p.ride_through.max(config.ride_through)
        })
    }

    /// The connection's smoothed round-trip time in nanoseconds (0 before
    /// the first sample, spec 4.5).
    pub fn srtt_ns(&self) -> u32 {
        self.send.rtt.srtt_ns()
    }

    /// Whether the sender has nothing unacknowledged.
    pub fn all_acked(&self) -> bool {
        self.send.una == self.send.nxt
    }

    /// Whether the connection opened with 0-RTT (spec 4.2.4): see
    /// [`Opening::Early`].
    pub(crate) fn early(&self) -> bool {
        self.opening == Opening::Early
    }

    /// Whether it holds pooled sender state now.
    pub fn is_sending(&self) -> bool {
        self.send.state.is_some()
    }

    /// The READ depths of the handshake (spec 3.8.1, 4.8.6): the one this
    /// end stated and the one its peer stated (0: none).
    pub fn read_depths(&self) -> (u8, u8) {
        (self.send.read_depth, self.send.peer_read_depth)
    }

    /// Work entries and receives it holds in the pools.
    pub fn queued(&self) -> (u32, u32) {
        (self.send.queue.len(), self.recv.queue.len())
    }
}
