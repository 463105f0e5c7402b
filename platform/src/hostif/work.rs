//! Work entries from a queue set's receive and send queues into the
//! engine's host queues: each entry read once from shared memory, checked
//! (opcode, length, connection of this set, addresses in its window, its
//! quota) and either posted or answered at once with an error completion.

use metaroce_abi as abi;
use metaroce_core::api::{ConnHandle, RecvRequest, WorkRequest};

use super::rings::Bell;
use super::{convert, count_refusal, HostInterface, Phase, Q_WORK, WORK_BUDGET};
use crate::host::HostPort;
use crate::shmem::{SharedMemory, ShmError};

impl<const CONNS: usize> HostInterface<'_, CONNS> {
    /// The core handle of the ABI connection `(index, generation)` if set
    /// `set` holds it and may post on it.
    fn postable(&self, set: usize, index: u32, generation: u32) -> Option<ConnHandle> {
        let e = self.conns.get(index as usize).copied().flatten()?;
        (usize::from(e.set) == set && e.generation == generation && e.phase != Phase::Offered)
            .then_some(e.handle)
    }

    /// Moves set `i`'s ready entries of one work queue into the engine's
    /// host queue while it has room (and the set's completion queue has
    /// room for a refusal): one loop for the receive and the send queue.
    /// Returns whether any entry was taken.
    pub(super) fn serve_work(
        &mut self,
        i: usize,
        queue: WorkQueue,
        port: &mut dyn WorkSink,
    ) -> bool {
        let shm = self.shm;
        let Some(set) = self.sets.get_mut(i) else {
            return false;
        };
        let (bell, depth, ring) = match queue {
            WorkQueue::Recv => (Bell::Rq, abi::DEFAULT_RQ_DEPTH, set.rq_ring()),
            WorkQueue::Send => (Bell::Sq, abi::DEFAULT_SQ_DEPTH, set.sq_ring()),
        };
        let at = set.bell(bell);
        let reading = set.consumed(queue).read(&shm, at, depth);
        set.counters.bad_producer_index += u64::from(reading.bad_index);
        set.counters.spurious_doorbells += u64::from(reading.spurious);
        let mut moved = false;
        for _ in 0..reading.ready.min(WORK_BUDGET) {
            if !port.has_room(queue) || !self.sets[i].can_refuse(&shm) {
                break;
            }
            let slot = ring.slot(self.sets[i].consumed(queue).consumer);
            let Ok(e) = WorkEntry::read(&shm, queue, slot) else {
                self.stats.shm_faults += 1;
                break;
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
            let set = &mut self.sets[i];
            match verdict {
                Ok((h, request)) => {
                    // Cannot fail: `has_room` said there is room.
                    port.post(h, request);
                    set.outstanding += 1;
                    if let Some(Some(c)) = self.conns.get_mut(e.conn_index as usize) {
                        c.outstanding += 1;
                    }
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
                }
                Err(status) => {
                    count_refusal(&mut set.counters, status);
                    self.stats.refused += 1;
                    let cqe = refusal(e.wr_id, e.conn_index, e.conn_generation, e.opcode, status);
                    set.complete(&shm, cqe);
                }
            }
            let consumed = set.consumed(queue);
            consumed.consumer = consumed.consumer.wrapping_add(1);
            moved = true;
        }
        moved
    }
}

/// One of a set's two work queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkQueue {
    /// The receive queue (`abi::RecvWqe`).
    Recv,
    /// The send queue (`abi::SendWqe`).
    Send,
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

/// The engine's host queues as [`HostInterface::serve_work`] fills them:
/// one instance of that loop whatever the queues' depths.
pub(super) trait WorkSink {
    /// Whether `queue`'s host queue has room for one more entry.
    fn has_room(&self, queue: WorkQueue) -> bool;
    /// Posts `item` on `conn` (after [`WorkSink::has_room`] said yes).
    fn post(&mut self, conn: ConnHandle, item: WorkItem);
}

impl<const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize> WorkSink
    for HostPort<'_, SQ, RQ, CQ, AQ>
{
    fn has_room(&self, queue: WorkQueue) -> bool {
        match queue {
            WorkQueue::Recv => self.recv_free() != 0,
            WorkQueue::Send => self.send_free() != 0,
        }
    }

    fn post(&mut self, conn: ConnHandle, item: WorkItem) {
        let _ = match item {
            WorkItem::Recv(rr) => self.post_recv(conn, rr),
            WorkItem::Send(wr) => self.enqueue_send(conn, wr),
        };
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
