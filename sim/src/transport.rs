//! What a host runs: a transport endpoint behind [`SimTransport`], the
//! sans-IO shape both MetaRoCE and the RoCEv2 baseline share (quinn-proto
//! style: `handle_*` inputs, commands, `poll_*` outputs). The simulator
//! calls, after every input: `handle_timeout` if `poll_timeout` has passed,
//! `poll_transmit` (one packet whenever the NIC is idle), `poll_completion`
//! until `None`, then `poll_timeout`.
//!
//! Adapters:
//! * [`crate::metaroce::MetaRoce`]: `metaroce_core::Endpoint` behind the
//!   platform layer's engine loop (`Engine::poll_datagrams`), as the
//!   firmware runs it: work requests and completions go through host-queue
//!   rings, packets through a datagram link, payload through DMA into the
//!   host's [`Arena`]; every input and `poll_transmit` is one poll.
//! * [`crate::roce::Roce`]: the RoCEv2 baseline (`RoceEndpoint`), called
//!   directly: `connect_pair` creates a QP on both ends with each other's
//!   QP number and PSN (as RDMA-CM would), `poll_transmit` finishes the
//!   packet with its ICRC over the IP/UDP headers the simulator would have
//!   built, and the destination UDP port is 4791.

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, Region, RxMeta, WorkRequest};
use metaroce_core::Instant;

use crate::memory::Arena;

/// Where a packet from `poll_transmit` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxMeta {
    /// Destination IP address and UDP port.
    pub peer: PeerAddr,
    /// UDP source port: the path entropy the fabric hashes.
    pub src_port: u16,
    /// ECN codepoint for the IP header.
    pub ecn: u8,
}

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportError {
    /// A queue is full: retry after completions.
    Retry,
    /// Refused for good; the text says why.
    Refused(&'static str),
}

impl core::fmt::Display for TransportError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TransportError::Retry => f.write_str("queue full, retry later"),
            TransportError::Refused(why) => write!(f, "refused: {why}"),
        }
    }
}

impl std::error::Error for TransportError {}

/// Protocol counters summed over an endpoint's connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounters {
    /// Every packet sent: data, retransmissions, acknowledgments, control.
    pub packets_sent: u64,
    /// Data packets sent for the first time.
    pub first_transmissions: u64,
    pub retransmissions: u64,
    /// Retransmissions whose original had arrived (where the protocol knows).
    pub spurious_retransmissions: u64,
    pub timeouts: u64,
    /// Tail-loss probes sent (MetaRoCE, spec 4.6.5).
    pub probes: u64,
    pub naks_sent: u64,
    /// Packets the endpoint received but discarded (bad, duplicate,
    /// out of sequence or out of window).
    pub discarded: u64,
    pub ce_received: u64,
}

impl core::ops::AddAssign for TransportCounters {
    fn add_assign(&mut self, o: TransportCounters) {
        self.packets_sent += o.packets_sent;
        self.first_transmissions += o.first_transmissions;
        self.retransmissions += o.retransmissions;
        self.spurious_retransmissions += o.spurious_retransmissions;
        self.timeouts += o.timeouts;
        self.probes += o.probes;
        self.naks_sent += o.naks_sent;
        self.discarded += o.discarded;
        self.ce_received += o.ce_received;
    }
}

/// How far an endpoint's sending side has got, for experiments that
/// measure goodput between two instants (long transfers whose messages
/// complete too rarely to time them) and what a window let out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendProgress {
    /// Data packets the peers acknowledged, each counted once, summed over
    /// the endpoint's connections.
    pub packets_acked: u64,
    /// Most data packets one connection had sent and not yet seen
    /// acknowledged (or, where the protocol knows, declared lost) at once.
    pub max_in_flight: u64,
}

/// A transport endpoint on a simulated host.
pub trait SimTransport {
    /// Short protocol name for tables.
    fn name(&self) -> &'static str;

    /// Registers a memory region; returns its key.
    fn register_region(&mut self, region: Region) -> Result<u32, TransportError>;

    /// Opens a connection from `a` to `b` (both endpoints are at hand, so
    /// protocols that connect out of band can set up both ends). Returns
    /// `a`'s handle; work may be posted on it at once.
    fn connect_pair(
        now: Instant,
        a: &mut Self,
        a_addr: PeerAddr,
        b: &mut Self,
        b_addr: PeerAddr,
    ) -> Result<ConnHandle, TransportError>
    where
        Self: Sized;

    /// Posts a send-queue work request.
    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), TransportError>;

    /// Handles one received transport packet (the UDP payload).
    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        dst_port: u16,
        packet: &[u8],
        mem: &mut Arena,
    );

    /// Runs timers due at `now` (`mem`: the host's memory, for adapters
    /// that run a whole engine poll here).
    fn handle_timeout(&mut self, now: Instant, mem: &mut Arena);

    /// Writes the next packet to send into `out` (cleared first; the whole
    /// UDP payload, trailer included) and says where it goes.
    fn poll_transmit(&mut self, now: Instant, mem: &mut Arena, out: &mut Vec<u8>)
        -> Option<TxMeta>;

    /// `handle_timeout` then `poll_transmit`, as the simulator calls them
    /// when timers are due and the NIC is idle. Adapters whose transmit
    /// poll runs the due timers itself may do both in one poll where that
    /// is exactly the same.
    fn timeout_and_transmit(
        &mut self,
        now: Instant,
        mem: &mut Arena,
        out: &mut Vec<u8>,
    ) -> Option<TxMeta> {
        self.handle_timeout(now, mem);
        self.poll_transmit(now, mem, out)
    }
    /// When `handle_timeout` (or another poll) is next due.
    fn poll_timeout(&self) -> Option<Instant>;

    /// The next work completion.
    fn poll_completion(&mut self) -> Option<Completion>;

    /// Counters summed over connections.
    fn counters(&self) -> TransportCounters;

    /// Starts following sending progress for
    /// [`SimTransport::send_progress`]. Off until asked: adapters follow it
    /// by looking at the sender's connections on every packet, which
    /// experiments that never read it should not pay for.
    fn track_send_progress(&mut self) {}

    /// Sending progress; `None` where the adapter does not track it (or
    /// was not asked to: [`SimTransport::track_send_progress`]).
    fn send_progress(&self) -> Option<SendProgress> {
        None
    }
}
