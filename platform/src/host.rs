//! The host interface: what a host driver (or the firmware's workload
//! task, playing one) sees of the engine.
//!
//! Five single-producer rings in shared memory, as an RDMA NIC exposes:
//! the send queue (work requests), the receive queue (receive buffers), the
//! completion queue, and an admin queue pair for memory registration. Each
//! queue the host fills has a doorbell the host rings after producing; the
//! engine rings the completion doorbell after producing completions or admin
//! results. [`HostQueues::split`] hands the host half ([`HostPort`]) and the
//! engine half ([`EnginePort`]) out once.
//!
//! The engine loop reaches the host through [`HostSide`]: these rings, or
//! the shared-memory host interface read and written directly
//! ([`crate::hostif::HostInterface`]), so a work entry and a completion
//! each pass one queue between the host and the transport.

use metaroce_core::api::{Completion, ConnHandle, RecvRequest, Region, Status, WorkRequest};

use crate::doorbell::{AtomicDoorbell, Doorbell};
use crate::ring::{Consumer, Producer, RingConsumer, RingProducer, SpscRing};

/// A send-queue descriptor: a work request on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendQueueEntry {
    pub conn: ConnHandle,
    pub wr: WorkRequest,
}

/// A receive-queue descriptor: a receive buffer on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvQueueEntry {
    pub conn: ConnHandle,
    pub rr: RecvRequest,
}

/// An admin-queue command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminCommand {
    /// Register a memory region; `tag` comes back in the result.
    RegisterRegion { tag: u64, region: Region },
    /// Deregister the region with `key`; the result carries the key.
    DeregisterRegion { tag: u64, key: u32 },
}

/// The answer to an [`AdminCommand`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminResult {
    pub tag: u64,
    /// The region key, or why registration failed.
    pub result: Result<u32, Status>,
}

/// The doorbells of one host interface.
#[derive(Debug, Default)]
pub struct Doorbells {
    /// Rung by the host after producing send-queue entries.
    pub send: AtomicDoorbell,
    /// Rung by the host after producing receive-queue entries.
    pub recv: AtomicDoorbell,
    /// Rung by the host after producing admin commands.
    pub admin: AtomicDoorbell,
    /// Rung by the engine after producing completions or admin results.
    pub completion: AtomicDoorbell,
}

/// The queues of one host interface, with `SQ`, `RQ`, `CQ` and `AQ` slots
/// (powers of two). Lives in a local, a `static` or shared memory.
#[derive(Debug)]
pub struct HostQueues<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize> {
    send: SpscRing<SendQueueEntry, SQ>,
    recv: SpscRing<RecvQueueEntry, RQ>,
    completion: SpscRing<Completion, CQ>,
    admin: SpscRing<AdminCommand, AQ>,
    admin_result: SpscRing<AdminResult, AQ>,
    bells: Doorbells,
}

impl<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize> Default
    for HostQueues<SQ, RQ, CQ, AQ>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize>
    HostQueues<SQ, RQ, CQ, AQ>
{
    pub const fn new() -> Self {
        HostQueues {
            send: SpscRing::new(),
            recv: SpscRing::new(),
            completion: SpscRing::new(),
            admin: SpscRing::new(),
            admin_result: SpscRing::new(),
            bells: Doorbells {
                send: AtomicDoorbell::new(),
                recv: AtomicDoorbell::new(),
                admin: AtomicDoorbell::new(),
                completion: AtomicDoorbell::new(),
            },
        }
    }

    /// The host half and the engine half; `None` after the first call.
    /// Both halves for an owner that holds the queues exclusively (a
    /// single-threaded host program or simulator that polls the engine
    /// itself): callable any number of times, because the `&mut` borrow
    /// proves no earlier half is still alive. Queued entries are kept.
    #[allow(clippy::type_complexity)]
    pub fn ports(&mut self) -> (HostPort<'_, SQ, RQ, CQ, AQ>, EnginePort<'_, SQ, RQ, CQ, AQ>) {
        let (send_p, send_c) = self.send.split_mut();
        let (recv_p, recv_c) = self.recv.split_mut();
        let (cq_p, cq_c) = self.completion.split_mut();
        let (admin_p, admin_c) = self.admin.split_mut();
        let (result_p, result_c) = self.admin_result.split_mut();
        let bells: &Doorbells = &self.bells;
        (
            HostPort {
                send: send_p,
                recv: recv_p,
                completion: cq_c,
                admin: admin_p,
                admin_result: result_c,
                bells,
            },
            EnginePort {
                send: send_c,
                recv: recv_c,
                completion: cq_p,
                admin: admin_c,
                admin_result: result_p,
                bells,
            },
        )
    }

    #[allow(clippy::type_complexity)]
    pub fn split(&self) -> Option<(HostPort<'_, SQ, RQ, CQ, AQ>, EnginePort<'_, SQ, RQ, CQ, AQ>)> {
        let (send_p, send_c) = self.send.split()?;
        let (recv_p, recv_c) = self.recv.split()?;
        let (cq_p, cq_c) = self.completion.split()?;
        let (admin_p, admin_c) = self.admin.split()?;
        let (result_p, result_c) = self.admin_result.split()?;
        Some((
            HostPort {
                send: send_p,
                recv: recv_p,
                completion: cq_c,
                admin: admin_p,
                admin_result: result_c,
                bells: &self.bells,
            },
            EnginePort {
                send: send_c,
                recv: recv_c,
                completion: cq_p,
                admin: admin_c,
                admin_result: result_p,
                bells: &self.bells,
            },
        ))
    }
}

/// Why the host could not enqueue: the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct QueueFull;

/// The host's half: produce work, consume completions.
#[derive(Debug)]
pub struct HostPort<'a, const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize> {
    send: Producer<'a, SendQueueEntry, SQ>,
    recv: Producer<'a, RecvQueueEntry, RQ>,
    completion: Consumer<'a, Completion, CQ>,
    admin: Producer<'a, AdminCommand, AQ>,
    admin_result: Consumer<'a, AdminResult, AQ>,
    bells: &'a Doorbells,
}

impl<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize>
    HostPort<'_, SQ, RQ, CQ, AQ>
{
    /// Enqueues a work request without ringing (batch, then [`Self::ring_send`]).
    pub fn enqueue_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), QueueFull> {
        self.send
            .push(SendQueueEntry { conn, wr })
            .map_err(|_| QueueFull)
    }

    /// Rings the send-queue doorbell.
    pub fn ring_send(&self) {
        self.bells.send.ring();
    }

    /// Enqueues a work request and rings the doorbell.
    pub fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), QueueFull> {
        self.enqueue_send(conn, wr)?;
        self.ring_send();
        Ok(())
    }

    /// Enqueues a receive buffer and rings the doorbell.
    pub fn post_recv(&mut self, conn: ConnHandle, rr: RecvRequest) -> Result<(), QueueFull> {
        self.recv
            .push(RecvQueueEntry { conn, rr })
            .map_err(|_| QueueFull)?;
        self.bells.recv.ring();
        Ok(())
    }

    /// Asks for a region to be registered; the key comes back through
    /// [`Self::poll_admin`] with `tag`.
    pub fn register_region(&mut self, tag: u64, region: Region) -> Result<(), QueueFull> {
        self.admin
            .push(AdminCommand::RegisterRegion { tag, region })
            .map_err(|_| QueueFull)?;
        self.bells.admin.ring();
        Ok(())
    }

    /// Asks for the region with `key` to be deregistered; the result comes
    /// back through [`Self::poll_admin`] with `tag`.
    pub fn deregister_region(&mut self, tag: u64, key: u32) -> Result<(), QueueFull> {
        self.admin
            .push(AdminCommand::DeregisterRegion { tag, key })
            .map_err(|_| QueueFull)?;
        self.bells.admin.ring();
        Ok(())
    }

    /// Free admin-queue slots.
    pub fn admin_free(&self) -> usize {
        self.admin.free()
    }

    /// Free send-queue slots.
    pub fn send_free(&self) -> usize {
        self.send.free()
    }

    /// Free receive-queue slots.
    pub fn recv_free(&self) -> usize {
        self.recv.free()
    }

    /// The next completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completion.pop()
    }

    /// The next admin result.
    pub fn poll_admin(&mut self) -> Option<AdminResult> {
        self.admin_result.pop()
    }

    /// Whether the engine rang the completion doorbell since the last call.
    pub fn take_completion_doorbell(&self) -> bool {
        self.bells.completion.take()
    }
}

/// What the engine loop needs of the host: work to take and a place for
/// completions. A trait object in the loop, so a firmware that serves both
/// its own tasks ([`EnginePort`]) and host processes
/// ([`crate::hostif::HostInterface`]) holds one copy of the loop.
///
/// Peeking and popping are separate because the loop may have to leave an
/// entry where it is (its connection's queue is full and the parked list
/// too): `pop_*` takes the entry the last `peek_*` of that queue returned.
pub trait HostSide {
    /// Starts a poll: consumes the doorbells (the rings are the truth; a
    /// doorbell only wakes a sleeping engine) and resets per-poll shares.
    fn begin_poll(&mut self);
    /// The next admin command, if there is one and room for its answer.
    fn admin(&mut self) -> Option<AdminCommand>;
    /// The answer to the command [`HostSide::admin`] returned.
    fn answer(&mut self, result: AdminResult);
    /// The oldest receive buffer not yet taken.
    fn peek_recv(&mut self) -> Option<RecvQueueEntry>;
    /// Takes the entry the last [`HostSide::peek_recv`] returned.
    fn pop_recv(&mut self);
    /// The oldest work request not yet taken.
    fn peek_send(&mut self) -> Option<SendQueueEntry>;
    /// Takes the entry the last [`HostSide::peek_send`] returned.
    fn pop_send(&mut self);
    /// Whether one more completion can be written now.
    fn completion_room(&self) -> bool;
    /// Writes a completion (after [`HostSide::completion_room`] said yes).
    fn complete(&mut self, completion: Completion);
    /// Tells the host that completions or answers were written.
    fn ring_completions(&mut self);
}

impl<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize> HostSide
    for EnginePort<'_, SQ, RQ, CQ, AQ>
{
    fn begin_poll(&mut self) {
        let _ = self.take_doorbells();
    }

    fn admin(&mut self) -> Option<AdminCommand> {
        if self.admin_result.is_full() {
            return None;
        }
        self.admin.pop()
    }

    fn answer(&mut self, result: AdminResult) {
        // Room was checked when the command was taken.
        let _ = self.admin_result.push(result);
    }

    fn peek_recv(&mut self) -> Option<RecvQueueEntry> {
        self.recv.peek()
    }

    fn pop_recv(&mut self) {
        let _ = self.recv.pop();
    }

    fn peek_send(&mut self) -> Option<SendQueueEntry> {
        self.send.peek()
    }

    fn pop_send(&mut self) {
        let _ = self.send.pop();
    }

    fn completion_room(&self) -> bool {
        !self.completion.is_full()
    }

    fn complete(&mut self, completion: Completion) {
        // Room was checked by the caller; the engine is the only producer.
        let _ = self.completion.push(completion);
    }

    fn ring_completions(&mut self) {
        self.bells.completion.ring();
    }
}

/// The engine's half: consume work, produce completions.
#[derive(Debug)]
pub struct EnginePort<'a, const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize> {
    pub(crate) send: Consumer<'a, SendQueueEntry, SQ>,
    pub(crate) recv: Consumer<'a, RecvQueueEntry, RQ>,
    pub(crate) completion: Producer<'a, Completion, CQ>,
    pub(crate) admin: Consumer<'a, AdminCommand, AQ>,
    pub(crate) admin_result: Producer<'a, AdminResult, AQ>,
    pub(crate) bells: &'a Doorbells,
}

impl<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize>
    EnginePort<'_, SQ, RQ, CQ, AQ>
{
    /// Whether any host doorbell rang since the last call (consumes them).
    pub fn take_doorbells(&self) -> bool {
        // Non-short-circuit: every pending signal is consumed.
        self.bells.send.take() | self.bells.recv.take() | self.bells.admin.take()
    }

    /// Whether the host has work waiting in any queue.
    pub fn has_work(&self) -> bool {
        !self.send.is_empty() || !self.recv.is_empty() || !self.admin.is_empty()
    }
}
