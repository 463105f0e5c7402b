//! The work path: [`QueuePair`] (post sends and receives on one
//! connection) and [`CompletionQueue`] (poll the queue set's
//! completions), the host's side of the ring protocol of spec 6.4:
//! produce entries and publish them through the doorbell record
//! (Release), consume completions by their phase bit (Acquire), publish
//! the consumer index.
//!
//! Who owns what. A queue set has one send queue (SQ), one receive queue
//! (RQ) and one completion queue (CQ), shared by all its connections. The
//! producer state of the SQ and of the RQ (next index, doorbell count)
//! each sit behind a lock in the state every handle shares ([`Shared`]),
//! so posts from several threads (on one connection or several) take
//! turns per ring and two threads never produce into the same ring at
//! once. The CQ's consumer state belongs to the one [`CompletionQueue`]
//! (moved out of the shared state while it lives, put back when it is
//! dropped), so polling needs no lock. What ties them together is the
//! CQ's room: a post reserves one completion per entry in an atomic
//! count of outstanding entries, and polling gives it back, so the device
//! never has more completions to write than the CQ holds (spec 6.5).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use metaroce_abi as abi;
use metaroce_abi::shmem::SharedMemory;
use zerocopy::{Immutable, IntoBytes};

use crate::mapping::SharedFile;
use crate::types::{Conn, Error, PostError, RecvWr, SendWr, WorkCompletion};
use crate::DeviceInfo;

/// A ring: where its slots and doorbell record are, and this process's
/// side of its free-running index.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    /// Absolute offset of slot 0.
    pub(crate) base: u64,
    pub(crate) depth: u32,
    pub(crate) entry: u32,
    /// Absolute offset of the doorbell record.
    pub(crate) bell: u64,
    /// Free-running producer (or, for completion rings, consumer) index.
    pub(crate) index: u32,
    pub(crate) rings: u32,
}

impl Ring {
    pub(crate) fn slot(&self, index: u32) -> u64 {
        self.base + u64::from(index & (self.depth - 1)) * u64::from(self.entry)
    }

    /// Publishes the producer index (Release) and counts one ring.
    pub(crate) fn ring_doorbell(&mut self, shm: &SharedMemory<'_>) {
        self.rings = self.rings.wrapping_add(1);
        let _ = shm.store_u32(self.bell, self.index);
        let _ = shm.store_u32(self.bell + 4, self.rings);
    }
}

/// What the device, its completion queue and its queue pairs share: the
/// mapping (kept alive by whichever handle is dropped last) and the work
/// rings' producer and consumer state.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) map: SharedFile,
    pub(crate) info: DeviceInfo,
    /// The device's consumer indices (`mr_device_indices`).
    pub(crate) indices: u64,
    pub(crate) sq: Mutex<Ring>,
    pub(crate) rq: Mutex<Ring>,
    /// The completion queue's consumer state while no [`CompletionQueue`]
    /// holds it.
    pub(crate) cq: Mutex<Option<Ring>>,
    pub(crate) cq_depth: u32,
    /// Work entries posted whose completion has not been polled: kept
    /// at or below the completion queue's depth.
    pub(crate) outstanding: AtomicU32,
}

/// Locks `m`; a poisoned lock (a thread panicked while posting) still
/// holds a consistent ring: the index moves only after the entries are
/// written.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    pub(crate) fn shm(&self) -> SharedMemory<'_> {
        self.map.view()
    }

    /// Reserves room for up to `want` completions; returns how many.
    fn reserve(&self, want: u32) -> u32 {
        let mut granted = 0;
        let _ = self
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                granted = want.min(self.cq_depth.saturating_sub(held));
                Some(held + granted)
            });
        granted
    }

    /// Writes up to `count` entries (`entry(i)` for the `i`-th) into the
    /// ring behind `ring`, whose device consumer index is at `consumer_at`,
    /// then rings its doorbell once for all of them: entries, then the
    /// producer index (Release), then the ring count.
    pub(crate) fn produce<T: IntoBytes + Immutable>(
        &self,
        ring: &Mutex<Ring>,
        consumer_at: u64,
        count: usize,
        entry: impl Fn(usize) -> T,
    ) -> Result<(), PostError> {
        if count == 0 {
            return Ok(());
        }
        let shm = self.shm();
        let mut ring = lock(ring);
        let consumer = shm.load_u32(consumer_at).unwrap_or(0);
        let free = ring.depth - ring.index.wrapping_sub(consumer).min(ring.depth);
        let want = u32::try_from(count).unwrap_or(u32::MAX).min(free);
        let granted = self.reserve(want);
        let mut written = 0;
        let mut error = Error::QueueFull;
        while written < granted {
            let slot = ring.slot(ring.index.wrapping_add(written));
            if shm.write(slot, &entry(written as usize)).is_err() {
                error = Error::BadLayout("ring beyond the memory");
                break;
            }
            written += 1;
        }
        if written < granted {
            self.outstanding
                .fetch_sub(granted - written, Ordering::AcqRel);
        }
        if written > 0 {
            ring.index = ring.index.wrapping_add(written);
            ring.ring_doorbell(&shm);
        }
        if written as usize == count {
            Ok(())
        } else {
            Err(PostError {
                posted: written as usize,
                error,
            })
        }
    }

    pub(crate) fn post_send_with(
        &self,
        count: usize,
        entry: impl Fn(usize) -> abi::SendWqe,
    ) -> Result<(), PostError> {
        self.produce(&self.sq, self.indices, count, entry)
    }

    pub(crate) fn post_recv_with(
        &self,
        count: usize,
        entry: impl Fn(usize) -> abi::RecvWqe,
    ) -> Result<(), PostError> {
        self.produce(&self.rq, self.indices + 4, count, entry)
    }
}

/// The posting side of one connection, as libibverbs' `ibv_qp`: post
/// lists of send and receive work requests, each list under one doorbell.
///
/// Cheap to clone, `Send` and `Sync`: any thread may post on it, and
/// handles of different connections may post from different threads; the
/// queue set's send queue (and its receive queue) take one post at a time
/// (a lock each). Completions arrive on the set's [`CompletionQueue`].
/// The handle keeps the mapping alive; the connection itself ends with
/// [`crate::Device::close`] and [`crate::Device::release`].
#[derive(Debug, Clone)]
pub struct QueuePair {
    pub(crate) shared: Arc<Shared>,
    pub(crate) conn: Conn,
}

impl QueuePair {
    /// The connection this queue pair posts on.
    pub fn conn(&self) -> Conn {
        self.conn
    }

    /// Posts `wrs` in order, under one doorbell. If not all fit (the send
    /// queue, or the completion queue's room, ran out), the first
    /// [`PostError::posted`] are posted and the error says why the next
    /// was not, as `ibv_post_send`'s `bad_wr`.
    pub fn post_send(&self, wrs: &[SendWr]) -> Result<(), PostError> {
        self.shared
            .post_send_with(wrs.len(), |i| wrs[i].entry(self.conn))
    }

    /// Posts receive buffers `wrs` in order, under one doorbell; as
    /// [`QueuePair::post_send`] when not all fit.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.shared
            .post_recv_with(wrs.len(), |i| wrs[i].entry(self.conn))
    }

    /// Send requests that would be posted right now: free send-queue slots,
    /// at most the completion queue's room.
    pub fn send_free(&self) -> u32 {
        let shm = self.shared.shm();
        let consumer = shm.load_u32(self.shared.indices).unwrap_or(0);
        let sq = *lock(&self.shared.sq);
        let ring_free = sq.depth - sq.index.wrapping_sub(consumer).min(sq.depth);
        let held = self.shared.outstanding.load(Ordering::Acquire);
        ring_free.min(self.shared.cq_depth.saturating_sub(held))
    }
}

/// The queue set's completion queue, as libibverbs' `ibv_cq`: every send
/// and receive posted on any of the set's connections completes here
/// once.
///
/// One at a time ([`crate::Device::completion_queue`] hands it out;
/// dropping it gives it back): polling takes `&mut self`, without a lock.
/// `Send`, so it may live on another thread than the posting ones.
#[derive(Debug)]
pub struct CompletionQueue {
    shared: Arc<Shared>,
    ring: Ring,
}

impl CompletionQueue {
    pub(crate) fn take(shared: &Arc<Shared>) -> Result<CompletionQueue, Error> {
        let ring = lock(&shared.cq).take().ok_or(Error::InUse)?;
        Ok(CompletionQueue {
            shared: shared.clone(),
            ring,
        })
    }

    /// Polls up to `wc.len()` completions into `wc` (oldest first) and
    /// returns how many, as `ibv_poll_cq(cq, num_entries, wc)`; one
    /// consumer-index store for all of them.
    pub fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let shm = self.shared.shm();
        let mut n = 0;
        while n < wc.len() {
            let slot = self.ring.slot(self.ring.index);
            let Ok(last) = shm.load_u32(slot + abi::CQE_LAST_WORD as u64) else {
                break;
            };
            if (last >> 24) as u8 != abi::phase_of(self.ring.index, self.ring.depth) {
                break;
            }
            let Ok(entry) = shm.read::<abi::Cqe>(slot) else {
                break;
            };
            wc[n] = WorkCompletion::from_entry(&entry);
            self.ring.index = self.ring.index.wrapping_add(1);
            n += 1;
        }
        if n > 0 {
            let _ = shm.store_u32(self.ring.bell, self.ring.index);
            let _ =
                self.shared
                    .outstanding
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                        Some(held.saturating_sub(n as u32))
                    });
        }
        n
    }

    /// The next completion, if any.
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        let mut wc = [WorkCompletion::default()];
        (self.poll(&mut wc) == 1).then_some(wc[0])
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        *lock(&self.shared.cq) = Some(self.ring);
    }
}
