//! The endpoint's pools and tables that connections draw on, grouped by
//! concern. A connection method borrows only the groups (or the single
//! pools) it touches, so its signature says what it changes and the
//! borrow checker lets the endpoint lend disjoint groups at once.

use super::reorder::ReorderPool;
use super::sender::{InflightPool, InflightRecord, SenderState};
use super::{RecvEntry, WorkEntry};
use crate::memory::{RegionSlot, RegionTable};
use crate::rng::Rng;
use crate::storage::buddy::BuddyNode;
use crate::storage::pool::{Pool, PoolEntry};
use crate::storage::{Backing, Slice};
use crate::wire::COOKIE_LEN;

/// The pools and tables connections draw on, owned by the endpoint. Each
/// group serves one concern:
///
/// * [`send`](SendPools): the sender's work entries, its pooled sender
///   states and their in-flight records (posting, sending, ACKs, loss
///   recovery, completions of sends);
/// * [`recv`](RecvPools): posted receives, the out-of-order bitmaps and
///   the NAKs waiting to go out (placement, ACK and NAK generation);
/// * `regions`: registered memory, checked by the sender before it reads
///   and by the receiver before it writes;
/// * `rng`: the generator for ids, tokens, initial PSNs and path entropy
///   (ACK processing re-draws a bad path's);
/// * [`credentials`](Credentials): RETRY cookies, early proofs and
///   address tokens, and the packet-protection keys (the handshake, and
///   sealing and opening protected packets);
/// * `read_reserved`: the READ budget the live connections reserved
///   (spec 4.14.3), the endpoint's alone.
pub struct Resources<B: Backing, const P: usize> {
    pub(crate) send: SendPools<B, P>,
    pub(crate) recv: RecvPools<B>,
    pub(crate) regions: Regions<B>,
    pub(crate) rng: Rng,
    pub(crate) credentials: Credentials<B>,
    /// The READ depths the live connections stated (spec 4.14.3), each
    /// reserved from `Config::read_jobs_endpoint_limit`.
    pub(crate) read_reserved: u32,
}

impl<B: Backing, const P: usize> Resources<B, P> {
    /// Refusals for want of pool space, gathered from every group.
    pub(crate) fn pool_refusals(&self) -> PoolRefusals {
        let (send, recv) = (&self.send.refusals, &self.recv.refusals);
        PoolRefusals {
            work_entries: send.work_entries,
            recv_entries: recv.recv_entries,
            read_jobs: send.read_jobs,
            senders: send.senders,
            inflight_records: send.inflight_records,
            reorder_words: recv.reorder_words,
            cookies: self.credentials.cookie_refusals,
            naks: recv.naks,
        }
    }
}

impl<B: Backing, const P: usize> core::fmt::Debug for Resources<B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Resources")
            .field("work_free", &self.send.work.available())
            .field("recv_free", &self.recv.recvs.available())
            .field("senders_free", &self.send.senders.available())
            .field("inflight_free", &self.send.inflight.free_records())
            .field("reorder_free", &self.recv.reorder.free_words())
            .field("read_jobs", &self.send.read_jobs)
            .field("refusals", &self.pool_refusals())
            .finish()
    }
}

/// The send side's pools: work entries (user requests and the answers to
/// a peer's READs), sender states and their in-flight records.
pub struct SendPools<B: Backing, const P: usize> {
    pub(crate) work: Pool<Slice<B, PoolEntry<WorkEntry>>>,
    pub(crate) senders: Pool<Slice<B, PoolEntry<SenderState<P>>>>,
    pub(crate) inflight: Inflight<B>,
    /// READ-response jobs in `work`, endpoint-wide.
    pub(crate) read_jobs: u32,
    /// Sender states given back since the endpoint last woke connections
    /// starved of one (each wakes a few).
    pub(crate) senders_returned: u32,
    pub(crate) refusals: SendRefusals,
}

impl<B: Backing, const P: usize> core::fmt::Debug for SendPools<B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendPools")
            .field("work_free", &self.work.available())
            .field("senders_free", &self.senders.available())
            .field("inflight_free", &self.inflight.free_records())
            .field("read_jobs", &self.read_jobs)
            .field("refusals", &self.refusals)
            .finish()
    }
}

/// The send side's share of [`PoolRefusals`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SendRefusals {
    pub work_entries: u64,
    pub read_jobs: u64,
    pub senders: u64,
    pub inflight_records: u64,
}

/// The receive side's pools: posted receives, the receivers' out-of-order
/// bitmaps, the NAKs waiting to go out, and what the receivers refused.
pub struct RecvPools<B: Backing> {
    pub(crate) recvs: RecvPool<B>,
    /// The receivers' out-of-order bitmaps.
    pub(crate) reorder: ReorderPool<Slice<B, u64>, Slice<B, BuddyNode>>,
    /// NAKs waiting to go out, one per refused packet (spec 4.7), sent
    /// before anything else.
    pub(crate) naks: heapless::Deque<QueuedNak, NAK_QUEUE>,
    /// Reliable packets refused by any connection, by reason.
    pub(crate) rx_refusals: crate::stats::RefusalStats,
    pub(crate) refusals: RecvRefusals,
}

impl<B: Backing> core::fmt::Debug for RecvPools<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RecvPools")
            .field("recv_free", &self.recvs.available())
            .field("reorder_free", &self.reorder.free_words())
            .field("naks", &self.naks.len())
            .field("refusals", &self.refusals)
            .finish()
    }
}

/// The receive side's share of [`PoolRefusals`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecvRefusals {
    pub recv_entries: u64,
    pub reorder_words: u64,
    pub naks: u64,
}

/// What proves an initiator or protects a connection's packets.
pub struct Credentials<B: Backing> {
    /// Initiators' RETRY cookies, early proofs and address tokens while
    /// they are Connecting (spec 4.2, 4.2.4, 4.2.5); an acceptor's
    /// NEW_TOKEN until it is sent.
    pub(crate) cookies: Pool<Slice<B, PoolEntry<[u8; COOKIE_LEN]>>>,
    /// RETRYs not taken: `cookies` was empty.
    pub(crate) cookie_refusals: u64,
    /// Key slots of protected connections, the pre-shared keys, the
    /// protection counters (spec 5.3).
    pub(crate) keys: crate::crypto::KeyPool<B>,
}

impl<B: Backing> core::fmt::Debug for Credentials<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Credentials")
            .field("cookies_free", &self.cookies.available())
            .field("cookie_refusals", &self.cookie_refusals)
            .finish()
    }
}

/// The endpoint's memory regions, as [`Resources`] holds them.
pub(crate) type Regions<B> = RegionTable<Slice<B, RegionSlot>>;

/// The endpoint's posted receives, as [`RecvPools`] holds them.
pub(crate) type RecvPool<B> = Pool<Slice<B, PoolEntry<RecvEntry>>>;

/// The endpoint's in-flight records, as [`SendPools`] holds them.
pub(crate) type Inflight<B> = InflightPool<Slice<B, InflightRecord>, Slice<B, BuddyNode>>;

/// Endpoint-wide counts of refusals for want of pool space (back-pressure).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PoolRefusals {
    /// Posts refused: the work-entry pool was empty (the poster retries).
    pub work_entries: u64,
    /// Receives refused: the receive-entry pool was empty.
    pub recv_entries: u64,
    /// READ_REQUESTs answered RECEIVER_NOT_READY: no job slot.
    pub read_jobs: u64,
    /// Times a connection waited for a sender state.
    pub senders: u64,
    /// Times a connection waited for in-flight records.
    pub inflight_records: u64,
    /// Out-of-order packets dropped: no receive bitmap could be taken or
    /// grown to record them (spec 4.14.3); the sender resends them.
    pub reorder_words: u64,
    /// RETRYs an initiator could not take: the cookie pool was empty (it
    /// repeats its CONNECT and takes a later one, spec 4.2).
    pub cookies: u64,
    /// NAKs not sent: the endpoint's NAK queue was full (spec 4.7: the
    /// sender's retransmission brings the packet, and its NAK, again).
    pub naks: u64,
}

impl PoolRefusals {
    /// Every pool with its refusals, for summaries and telemetry export.
    pub fn by_pool(&self) -> [(&'static str, u64); 8] {
        [
            ("work_entries", self.work_entries),
            ("recv_entries", self.recv_entries),
            ("read_jobs", self.read_jobs),
            ("senders", self.senders),
            ("inflight_records", self.inflight_records),
            ("reorder_words", self.reorder_words),
            ("cookies", self.cookies),
            ("naks", self.naks),
        ]
    }
}

/// NAKs the endpoint holds between a receive batch and its transmissions:
/// as many as a batch of the platform's engine loop can refuse (32 frames).
pub const NAK_QUEUE: usize = 32;

/// A NAK waiting to go out: the refusing connection's id, the refused
/// PSN, the reason and the path to answer on. Its Cumulative PSN is the
/// connection's when it is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueuedNak {
    pub conn: u32,
    pub psn: u32,
    pub path: u16,
    pub reason: crate::wire::NakReason,
}
