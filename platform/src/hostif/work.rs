//! The engine's side of the sets' work and completion queues
//! ([`HostSide`]): each work entry read once from shared memory where the
//! host wrote it, checked (opcode, length, connection of this set,
//! addresses in its window, its quota) and either handed to the engine or
//! answered at once with an error completion; each completion converted
//! once and written into its set's completion queue.

use metaroce_abi as abi;
use metaroce_core::api::{Completion, ConnHandle, RecvRequest, WorkRequest};

use super::rings::Bell;
use super::{convert, count_refusal, HostInterface, Phase, Q_WORK, WORK_BUDGET};
use crate::host::{AdminCommand, AdminResult, HostSide, RecvQueueEntry, SendQueueEntry};
use crate::shmem::{SharedMemory, ShmError};

impl<const CONNS: usize> HostInterface<'_, CONNS> {
    /// The core handle of the ABI connection `(index, generation)` if set
    /// `set` holds it and may post on it.
    fn postable(&self, set: usize, index: u32, generation: u32) -> Option<ConnHandle> {
        let e = self.conns.get(index as usize).copied().flatten()?;
        (usize::from(e.set) == set && e.generation == generation && e.phase != Phase::Offered)
            .then_some(e.handle)
    }

    /// The oldest valid entry of one work queue, the sets taken in turn
    /// (each up to its share per poll, so a flooding host cannot starve
    /// the others). Invalid entries met on the way are answered at once
    /// with an error completion and consumed; a set whose completion
    /// queue has no room for such an answer is passed over. The entry
    /// stays in its ring until [`HostInterface::pop_work`].
    #[inline(never)]
    fn peek_work(&mut self, queue: WorkQueue) -> Option<(ConnHandle, WorkItem)> {
        let q = queue as usize;
        let n = self.sets.len();
        for _ in 0..n {
            let i = self.cursor[q];
            if let Some(found) = self.peek_in_set(i, queue) {
                return Some(found);
            }
            self.cursor[q] = (i + 1) % n;
        }
        None
    }

    /// [`HostInterface::peek_work`] in set `i` alone.
    fn peek_in_set(&mut self, i: usize, queue: WorkQueue) -> Option<(ConnHandle, WorkItem)> {
        let shm = self.shm;
        let q = queue as usize;
        loop {
            let set = self.sets.get_mut(i)?;
            if !set.claimed || set.share[q] >= WORK_BUDGET {
                return None;
            }
            let (bell, depth, ring) = match queue {
                WorkQueue::Recv => (Bell::Rq, abi::DEFAULT_RQ_DEPTH, set.rq_ring()),
                WorkQueue::Send => (Bell::Sq, abi::DEFAULT_SQ_DEPTH, set.sq_ring()),
            };
            let at = set.bell(bell);
            let reading = set.consumed(queue).read(&shm, at, depth);
            set.counters.bad_producer_index += u64::from(reading.bad_index);
            set.counters.spurious_doorbells += u64::from(reading.spurious);
            if reading.ready == 0 || !set.can_refuse(&shm) {
                return None;
            }
            let slot = ring.slot(set.consumed(queue).consumer);
            let Ok(e) = WorkEntry::read(&shm, queue, slot) else {
                self.stats.shm_faults += 1;
                return None;
            };
            let handle = self.postable(i, e.conn_index, e.conn_generation);
            let verdict = match (e.request, handle) {
                (Err(status), _) => Err(status),
                (Ok(_), None) => Err(abi::STATUS_BAD_CONNECTION),
                (Ok(request), Some(_))
                    if !self.sets[i].in_window(request.local().0, request.local().1) =>
                {
                    Err(abi::STATUS_BAD_ADDRESS)
                }
                (Ok(request), Some(h)) => self.take(i, 1 << Q_WORK, 0).map(|()| (h, request)),
            };
            match verdict {
                Ok((h, request)) => {
                    self.peeked[q] = Some((i, e.conn_index));
                    return Some((h, request));
                }
                Err(status) => {
                    let set = &mut self.sets[i];
                    count_refusal(&mut set.counters, status);
                    self.stats.refused += 1;
                    let cqe = refusal(e.wr_id, e.conn_index, e.conn_generation, e.opcode, status);
                    set.complete(&shm, cqe);
                    self.advance(i, queue);
                }
            }
        }
    }

    /// Takes the entry the last [`HostInterface::peek_work`] of `queue`
    /// returned: the engine holds it now (posted, or parked until its
    /// connection has room), so it counts as outstanding work of its set
    /// until its completion comes back.
    #[inline(never)]
    fn pop_work(&mut self, queue: WorkQueue) {
        let Some((i, conn_index)) = self.peeked[queue as usize].take() else {
            return;
        };
        if let Some(Some(c)) = self.conns.get_mut(conn_index as usize) {
            c.outstanding += 1;
        }
        let Some(set) = self.sets.get_mut(i) else {
            return;
        };
        set.outstanding += 1;
        match queue {
            WorkQueue::Recv => {
                set.counters.posted_recvs += 1;
                self.stats.posted_recvs += 1;
            }
            WorkQueue::Send => {
                set.counters.posted_sends += 1;
                self.stats.posted_sends += 1;
            }
        }
        self.advance(i, queue);
    }

    /// Consumes set `i`'s oldest entry of `queue` and publishes the new
    /// consumer index, so the host sees the room at once.
    fn advance(&mut self, i: usize, queue: WorkQueue) {
        let shm = self.shm;
        let set = &mut self.sets[i];
        set.share[queue as usize] += 1;
        let consumed = set.consumed(queue);
        consumed.consumer = consumed.consumer.wrapping_add(1);
        let consumer = consumed.consumer;
        let at = set.base + u64::from(abi::SET_INDICES) + 4 * queue as u64;
        if shm.store_u32(at, consumer).is_err() {
            self.stats.shm_faults += 1;
        }
    }

    /// A completion from the engine into the completion queue of the set
    /// that owns its connection, converted to the ABI's entry on the way:
    /// the only move it makes.
    #[inline(never)]
    fn deliver(&mut self, c: &Completion) {
        let slot = c.conn.index as usize;
        match self.conns.get_mut(slot) {
            Some(Some(e)) if e.handle == c.conn => {
                let cqe = convert::cqe(c, slot as u32, e.generation);
                self.stats.completions += 1;
                let done = e.outstanding > 0;
                e.outstanding -= u32::from(done);
                if let Some(set) = self.sets.get_mut(usize::from(e.set)) {
                    set.outstanding -= u64::from(done);
                    set.complete(&self.shm, cqe);
                }
            }
            _ => self.stats.orphan_completions += 1,
        }
    }
}

/// The engine reads the sets' work queues and writes their completion
/// queues directly: no ring in between. Admin commands of the sets go
/// through [`HostInterface::poll_control`] instead (they need the
/// endpoint's control operations), so the engine's own admin queue is
/// always empty here.
impl<const CONNS: usize> HostSide for HostInterface<'_, CONNS> {
    fn begin_poll(&mut self) {
        let n = self.sets.len().max(1);
        for set in self.sets.iter_mut() {
            set.share = [0; 2];
        }
        self.cursor = [self.next_set % n; 2];
        self.peeked = [None; 2];
        self.next_set = (self.next_set + 1) % n;
    }

    fn admin(&mut self) -> Option<AdminCommand> {
        None
    }

    fn answer(&mut self, _: AdminResult) {}

    fn peek_recv(&mut self) -> Option<RecvQueueEntry> {
        match self.peek_work(WorkQueue::Recv)? {
            (conn, WorkItem::Recv(rr)) => Some(RecvQueueEntry { conn, rr }),
            (_, WorkItem::Send(_)) => None,
        }
    }

    fn pop_recv(&mut self) {
        self.pop_work(WorkQueue::Recv);
    }

    fn peek_send(&mut self) -> Option<SendQueueEntry> {
        match self.peek_work(WorkQueue::Send)? {
            (conn, WorkItem::Send(wr)) => Some(SendQueueEntry { conn, wr }),
            (_, WorkItem::Recv(_)) => None,
        }
    }

    fn pop_send(&mut self) {
        self.pop_work(WorkQueue::Send);
    }

    /// Always: a set's completion queue that is full holds further
    /// completions in its waiting list (and counts any beyond it), so one
    /// host that does not poll cannot stop the others' completions.
    fn completion_room(&self) -> bool {
        true
    }

    fn complete(&mut self, completion: Completion) {
        self.deliver(&completion);
    }

    /// Hosts poll their completion queues' phase bits; nothing to ring.
    fn ring_completions(&mut self) {}
}

/// One of a set's two work queues (the value is its consumer index's
/// place in `DeviceIndices`, after the send queue's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkQueue {
    /// The send queue (`abi::SendWqe`).
    Send = 0,
    /// The receive queue (`abi::RecvWqe`).
    Recv = 1,
}

/// What a valid work entry asks of the engine.
#[derive(Debug, Clone, Copy)]
pub(super) enum WorkItem {
    Recv(RecvRequest),
    Send(WorkRequest),
}

impl WorkItem {
    /// The local buffer's address and length.
    fn local(&self) -> (u64, u64) {
        let local = match self {
            WorkItem::Recv(rr) => &rr.local,
            WorkItem::Send(wr) => &wr.local,
        };
        (local.addr, u64::from(local.len))
    }
}

/// A work entry as read from its queue: what a refusal answers with, and
/// the request or the status refusing it.
struct WorkEntry {
    wr_id: u64,
    conn_index: u32,
    conn_generation: u32,
    /// The ABI opcode its completion carries.
    opcode: u8,
    request: Result<WorkItem, u8>,
}

impl WorkEntry {
    fn read(shm: &SharedMemory<'_>, queue: WorkQueue, slot: u64) -> Result<Self, ShmError> {
        Ok(match queue {
            WorkQueue::Recv => {
                let e = shm.read::<abi::RecvWqe>(slot)?;
                WorkEntry {
                    wr_id: e.wr_id,
                    conn_index: e.conn_index,
                    conn_generation: e.conn_generation,
                    opcode: abi::OP_RECV,
                    request: convert::recv_request(&e).map(WorkItem::Recv),
                }
            }
            WorkQueue::Send => {
                let e = shm.read::<abi::SendWqe>(slot)?;
                WorkEntry {
                    wr_id: e.wr_id,
                    conn_index: e.conn_index,
                    conn_generation: e.conn_generation,
                    opcode: convert::wqe_opcode(e.opcode),
                    request: convert::work_request(&e).map(WorkItem::Send),
                }
            }
        })
    }
}

/// An error completion for a refused entry.
fn refusal(wr_id: u64, index: u32, generation: u32, opcode: u8, status: u8) -> abi::Cqe {
    abi::Cqe {
        wr_id,
        conn_index: index,
        conn_generation: generation,
        opcode,
        status,
        ..abi::Cqe::default()
    }
}
