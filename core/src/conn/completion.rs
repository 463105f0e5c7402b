//! Completions and the error state (spec 4.7, 4.8.3 - 4.8.5): finished
//! work leaves the queues in post order, one completion at a time, when
//! the application asks; a failed connection completes everything left
//! with an error.

use super::sender::Slot;
use super::{ConnState, Connection, Job, Pending, PendingEvents, RecvPools, SendPools, WorkEntry};
use crate::api::{Completion, Opcode, Status};
use crate::psn::Psn;
use crate::storage::list::OptIndex;
use crate::storage::Backing;
use crate::time::MaybeInstant;

/// Which send-queue entry a failure is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The entry whose packets include this PSN.
    Psn(Psn),
    /// The oldest entry (the failure is the connection's, e.g. a handshake).
    Front,
    /// None: every entry completes as flushed (the peer broke our rules).
    Nobody,
}

impl<const P: usize> Connection<P> {
    /// Marks outstanding work: the blamed entry gets `status`, the rest
    /// will complete as flushed.
    pub(crate) fn flush_work<B: Backing>(
        &mut self,
        status: Status,
        blame: Blame,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) {
        // No reliable packet is taken from now on (spec 4.7.2 answers
        // them from the sticky NAK alone): the receive bitmap goes back.
        self.release_receiver(recv);
        let mut marked = false;
        let mut first = true;
        let mut cursor = self.send.queue.head();
        while let Some(i) = cursor {
            let e = send.work.get_mut(i);
            let hit = match blame {
                Blame::Psn(psn) => e.holds(psn),
                Blame::Front => first,
                Blame::Nobody => false,
            };
            if hit && !marked {
                e.error = Some(status);
                marked = true;
            } else if e.error.is_none() {
                e.error = Some(Status::Flushed);
            }
            first = false;
            cursor = send.work.next_of(i);
        }
    }

    /// Enters the error state (spec 4.7): work is flushed, timers and
    /// pending control packets cleared, and a `Failed` event raised.
    pub(crate) fn fail<B: Backing>(
        &mut self,
        status: Status,
        blame: Blame,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) {
        if self.state.is_terminal() {
            return;
        }
        self.state = ConnState::Error;
        self.flush_work(status, blame, send, recv);
        self.recv.ack_due = MaybeInstant::NONE;
        self.ctrl.deadline = MaybeInstant::NONE;
        self.pending = Pending::default();
        self.fail_status = status;
        self.events.raise(PendingEvents::FAILED);
    }

    /// Whether an entry is finished: every packet sent and acknowledged
    /// (and a READ's response placed). O(1) for the entry completions are
    /// taken from, the queue's first: every PSN before it is acknowledged,
    /// so the cumulative ACK is at or past its first PSN and the walk
    /// below stops at once (the PSN at the cumulative ACK is not
    /// acknowledged); only an entry behind an unfinished one is walked.
    fn entry_done<B: Backing>(&self, e: &WorkEntry, send: &SendPools<B, P>) -> bool {
        if e.started < e.packets {
            return false;
        }
        if e.is_read() && e.read_bytes < e.len {
            return false;
        }
        let end = e.first_psn + e.packets;
        if end.offset_from(self.send.una) <= 0 {
            return true;
        }
        let Some(extent) = self
            .send
            .state
            .get()
            .and_then(|s| send.senders.get(s).extent)
        else {
            return false;
        };
        let mut psn = e.first_psn.max(self.send.una);
        while psn != end {
            if send.inflight.get(extent, psn).slot() != Slot::Acked {
                return false;
            }
            psn = psn.next();
        }
        true
    }

    /// Whether every send-queue entry is finished (CLOSE may go).
    pub(crate) fn all_entries_done<B: Backing>(&self, send: &SendPools<B, P>) -> bool {
        send.work
            .iter(&self.send.queue)
            .all(|i| self.entry_done(send.work.get(i), send))
    }

    fn flushing(&self) -> bool {
        matches!(self.state, ConnState::Error | ConnState::Closed)
    }

    /// Whether [`Connection::next_completion`] has something. The
    /// receive side's check is inline at the caller: out of line, the
    /// extra borrow cost every refresh a few instructions.
    #[inline(always)]
    pub(crate) fn has_completion<B: Backing>(
        &mut self,
        send: &SendPools<B, P>,
        recv: &RecvPools<B>,
    ) -> bool {
        self.send_completion_ready(send) || self.recv_completion_ready(recv)
    }

    /// Whether the oldest send-queue entry completes (or is flushed); a
    /// finished one is remembered for [`Connection::next_completion`].
    fn send_completion_ready<B: Backing>(&mut self, send: &SendPools<B, P>) -> bool {
        let Some(i) = self.send.queue.head() else {
            return false;
        };
        let e = send.work.get(i);
        if self.send.head_done || self.flushing() || e.error.is_some() {
            return true;
        }
        self.send.head_done = self.entry_done(e, send);
        self.send.head_done
    }

    /// Whether the oldest receive completes (or is flushed).
    #[inline(always)]
    fn recv_completion_ready<B: Backing>(&self, recv: &RecvPools<B>) -> bool {
        let Some(i) = self.recv.queue.head() else {
            return false;
        };
        let r = recv.recvs.get(i);
        self.flushing() || (r.claimed_by.is_some() && r.bytes == r.msg_len)
    }

    /// The next completion in post order (sends first, then receives), its
    /// entry given back to the pool. READ-response jobs leave silently.
    pub(crate) fn next_completion<B: Backing>(
        &mut self,
        handle: crate::api::ConnHandle,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) -> Option<Completion> {
        let flushing = self.flushing();
        while let Some(i) = self.send.queue.head() {
            // Borrowed, and only what the completion reports read out:
            // the entry is the size of a work request and more.
            let e = send.work.get(i);
            if !(self.send.head_done || flushing || e.error.is_some() || self.entry_done(e, send)) {
                break;
            }
            let (error, len) = (e.error, e.len);
            let user = match &e.job {
                Job::User(wr) => Some((wr.id, wr.op.opcode())),
                Job::ReadResponse { .. } => None,
            };
            if self.send.cursor == OptIndex::some(i) {
                self.send.cursor = send.work.next_of(i).into();
            }
            send.work.pop_front(&mut self.send.queue);
            self.send.head_done = false;
            match user {
                None => {
                    self.send.read_jobs -= 1;
                    send.read_jobs -= 1;
                }
                Some((wr_id, opcode)) => {
                    self.send.user_jobs -= 1;
                    let status = error.unwrap_or(if flushing {
                        Status::Flushed
                    } else {
                        Status::Success
                    });
                    self.counters.completions += 1;
                    return Some(Completion {
                        conn: handle,
                        wr_id,
                        opcode,
                        status,
                        byte_len: if status == Status::Success { len } else { 0 },
                        imm: None,
                    });
                }
            }
        }
        let i = self.recv.queue.head()?;
        let r = *recv.recvs.get(i);
        let done = r.claimed_by.is_some() && r.bytes == r.msg_len;
        if !done && !flushing {
            return None;
        }
        recv.recvs.pop_front(&mut self.recv.queue);
        self.recv.base = self.recv.base.wrapping_add(1);
        if self.recv_finger.get() == Some(i) {
            self.recv_finger = OptIndex::NONE;
        }
        self.counters.completions += 1;
        Some(Completion {
            conn: handle,
            wr_id: r.req.id,
            opcode: if r.write_imm {
                Opcode::RecvWriteImm
            } else {
                Opcode::Recv
            },
            status: if done {
                Status::Success
            } else {
                Status::Flushed
            },
            byte_len: if done && !r.write_imm { r.bytes } else { 0 },
            imm: r.imm,
        })
    }

    /// Gives every pooled entry back without completions (the application
    /// released the connection after draining what it wanted).
    pub(crate) fn discard_work<B: Backing>(
        &mut self,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) {
        while let Some(i) = self.send.queue.head() {
            if let Job::ReadResponse { .. } = send.work.get(i).job {
                send.read_jobs -= 1;
            }
            send.work.pop_front(&mut self.send.queue);
        }
        self.send.head_done = false;
        recv.recvs.clear(&mut self.recv.queue);
        self.recv_finger = OptIndex::NONE;
        self.send.cursor = OptIndex::NONE;
        self.send.read_jobs = 0;
        self.send.user_jobs = 0;
    }
}
