//! The host-queue pump: everything between the host's rings and the
//! transport that is not a packet. It takes registrations, receive
//! buffers and work requests from the host's admin, receive and send
//! rings into the transport ([`HostPump::take`]), holding aside (bounded,
//! in order per connection) a request whose connection's queue is full,
//! and it is the one place that drains the transport's completions into
//! the host's completion ring ([`HostPump::complete`]): each completion is
//! moved once, as the transport made it, and its doorbell rung.

use heapless::Deque;
use metaroce_core::api::{Completion, ConnHandle, Opcode, Status};

use super::EngineStats;
use crate::host::{AdminCommand, AdminResult, HostSide, RecvQueueEntry, SendQueueEntry};
use crate::probe;
use crate::transport::{opcode_of, PostError, Transport};

/// Requests refused for now, held aside until their connection's queue
/// has room (see [`drain_work`]).
#[derive(Debug)]
pub(super) struct HostPump {
    parked_sends: Deque<SendQueueEntry, PARKED>,
    parked_recvs: Deque<RecvQueueEntry, PARKED>,
}

impl HostPump {
    pub(super) const fn new() -> Self {
        HostPump {
            parked_sends: Deque::new(),
            parked_recvs: Deque::new(),
        }
    }

    /// Drains the admin, receive and send queues into the transport.
    pub(super) fn take<T: Transport>(
        &mut self,
        transport: &mut T,
        host: &mut dyn HostSide,
        work_requests: u32,
        stats: &mut EngineStats,
    ) -> bool {
        host.begin_poll();
        let mut answered = false;
        while let Some(command) = host.admin() {
            stats.admin_commands += 1;
            let (tag, result) = match command {
                AdminCommand::RegisterRegion { tag, region } => (
                    tag,
                    transport.register_region(region).map_err(|e| e.status()),
                ),
                AdminCommand::DeregisterRegion { tag, key } => (
                    tag,
                    transport
                        .deregister_region(key)
                        .map(|()| key)
                        .map_err(|e| e.status()),
                ),
            };
            host.answer(AdminResult { tag, result });
            answered = true;
        }
        let budget = work_requests;
        let recvs = drain_work(
            host,
            &mut self.parked_recvs,
            budget,
            |e: &RecvQueueEntry| {
                let refused = |status| Completion {
                    conn: e.conn,
                    wr_id: e.rr.id,
                    opcode: Opcode::Recv,
                    status,
                    byte_len: 0,
                    imm: None,
                };
                verdict(transport.post_recv(e.conn, e.rr), refused)
            },
        );
        let sends = drain_work(
            host,
            &mut self.parked_sends,
            budget,
            |e: &SendQueueEntry| {
                let refused = |status| Completion {
                    conn: e.conn,
                    wr_id: e.wr.id,
                    opcode: opcode_of(&e.wr.op),
                    status,
                    byte_len: 0,
                    imm: None,
                };
                verdict(transport.post_send(e.conn, e.wr), refused)
            },
        );
        stats.posted_recvs += u64::from(recvs.taken);
        stats.posted_sends += u64::from(sends.taken);
        stats.post_retries += u64::from(recvs.later + sends.later);
        stats.post_errors += u64::from(recvs.refused + sends.refused);
        answered |= recvs.refused + sends.refused > 0;
        if answered {
            host.ring_completions();
        }
        recvs.moved || sends.moved || answered
    }

    /// Moves up to `budget` completions from the transport to the host's
    /// completion queue, then rings its doorbell: the only path from the
    /// transport's completions to the host, one move each.
    pub(super) fn complete<T: Transport>(
        &self,
        transport: &mut T,
        host: &mut dyn HostSide,
        budget: u32,
        stats: &mut EngineStats,
    ) -> bool {
        let mut written = 0;
        while written < budget {
            if !host.completion_room() {
                stats.cq_full += 1;
                break;
            }
            let Some(completion) = transport.poll_completion() else {
                break;
            };
            host.complete(completion);
            probe::count(|p| {
                p.completions += 1;
                p.completion_hops += 1;
            });
            written += 1;
        }
        stats.completions += u64::from(written);
        if written > 0 {
            host.ring_completions();
        }
        written > 0
    }
}

/// Requests per queue that the loop holds aside while their connection's
/// own queue is full.
const PARKED: usize = 16;

/// What the transport did with one request.
enum Post {
    Taken,
    /// Refused for now (the connection's queue is full): retry later.
    Later,
    /// Refused for good: this error completion goes to the host.
    Refused(Completion),
}

/// A post's result as a [`Post`], `refused` making the error completion
/// from its status.
fn verdict<E: PostError>(
    result: Result<(), E>,
    refused: impl FnOnce(Status) -> Completion,
) -> Post {
    match result {
        Ok(()) => Post::Taken,
        Err(err) if err.is_retryable() => Post::Later,
        Err(err) => Post::Refused(refused(err.status())),
    }
}

/// Counts of one [`drain_work`] call.
#[derive(Default)]
struct Drained {
    taken: u32,
    later: u32,
    refused: u32,
    /// Anything left the ring or the parked list.
    moved: bool,
}

/// Connections refused "for now" in this pass, so their later requests
/// queue behind the refused one instead of overtaking it.
struct Blocked(heapless::Vec<ConnHandle, PARKED>);

impl Blocked {
    fn contains(&self, conn: ConnHandle) -> bool {
        self.0.contains(&conn)
    }

    fn insert(&mut self, conn: ConnHandle) {
        if !self.contains(conn) {
            // At most one entry per parked request, and those are bounded
            // by the same capacity.
            let _ = self.0.push(conn);
        }
    }
}

/// One of the host's two work queues, as [`drain_work`] reads it.
trait WorkEntry: Copy {
    fn conn(&self) -> ConnHandle;
    fn peek(host: &mut dyn HostSide) -> Option<Self>;
    fn pop(host: &mut dyn HostSide);
}

impl WorkEntry for RecvQueueEntry {
    fn conn(&self) -> ConnHandle {
        self.conn
    }
    fn peek(host: &mut dyn HostSide) -> Option<Self> {
        host.peek_recv()
    }
    fn pop(host: &mut dyn HostSide) {
        host.pop_recv();
    }
}

impl WorkEntry for SendQueueEntry {
    fn conn(&self) -> ConnHandle {
        self.conn
    }
    fn peek(host: &mut dyn HostSide) -> Option<Self> {
        host.peek_send()
    }
    fn pop(host: &mut dyn HostSide) {
        host.pop_send();
    }
}

/// Moves requests from a shared host queue into the transport. The host
/// has one send and one receive queue for every connection, so a request
/// the transport refuses for now (its connection's queue is full) must
/// not hold up the other connections behind it: it is parked (bounded),
/// with its connection's later requests behind it in order, and retried
/// first on the next poll. Only when the parked list is full does the
/// queue wait. Each request refused for good becomes an error completion.
fn drain_work<E: WorkEntry, const N: usize>(
    host: &mut dyn HostSide,
    parked: &mut Deque<E, N>,
    budget: u32,
    mut post: impl FnMut(&E) -> Post,
) -> Drained {
    let mut out = Drained::default();
    let mut blocked = Blocked(heapless::Vec::new());
    let mut attempt =
        |entry: &E, blocked: &mut Blocked, out: &mut Drained, host: &mut dyn HostSide| {
            if blocked.contains(entry.conn()) {
                return false;
            }
            match post(entry) {
                Post::Taken => out.taken += 1,
                Post::Later => {
                    out.later += 1;
                    blocked.insert(entry.conn());
                    return false;
                }
                Post::Refused(c) => {
                    out.refused += 1;
                    // The host had room: checked before every attempt.
                    host.complete(c);
                    probe::count(|p| {
                        p.completions += 1;
                        p.completion_hops += 1;
                    });
                }
            }
            true
        };
    // Parked requests first: they are older than anything on the queue.
    for _ in 0..parked.len() {
        if !host.completion_room() {
            return out;
        }
        let Some(entry) = parked.pop_front() else {
            break;
        };
        if attempt(&entry, &mut blocked, &mut out, host) {
            out.moved = true;
        } else {
            // Same capacity it was just taken from.
            let _ = parked.push_back(entry);
        }
    }
    let mut budget = budget;
    while budget > 0 && host.completion_room() {
        let Some(entry) = E::peek(host) else { break };
        budget -= 1;
        // Parked list full: the queue waits (back-pressure).
        if !attempt(&entry, &mut blocked, &mut out, host) && parked.push_back(entry).is_err() {
            break;
        }
        E::pop(host);
        out.moved = true;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostQueues;
    use core::cell::Cell;
    use metaroce_core::api::{LocalBuf, RecvRequest};
    use std::vec::Vec;

    fn conn(index: u32) -> ConnHandle {
        ConnHandle {
            index,
            generation: 1,
        }
    }

    fn entry(conn: ConnHandle, id: u64) -> RecvQueueEntry {
        RecvQueueEntry {
            conn,
            rr: RecvRequest {
                id,
                local: LocalBuf {
                    key: 1,
                    addr: 0,
                    len: 64,
                },
            },
        }
    }

    fn error(e: &RecvQueueEntry) -> Completion {
        Completion {
            conn: e.conn,
            wr_id: e.rr.id,
            opcode: Opcode::Recv,
            status: metaroce_core::api::Status::LocalProtection,
            byte_len: 0,
            imm: None,
        }
    }

    #[test]
    fn a_full_connection_does_not_hold_up_the_others_and_keeps_its_order() {
        let mut queues: HostQueues<16, 16, 16, 4> = HostQueues::default();
        let (mut host, mut engine) = queues.ports();
        let (a, b) = (conn(0), conn(1));
        for (c, id) in [(a, 1), (a, 2), (b, 3), (a, 4), (b, 5), (b, 6)] {
            host.post_recv(c, entry(c, id).rr).unwrap();
        }
        let mut parked: Deque<RecvQueueEntry, 4> = Deque::new();
        let a_full = Cell::new(true);
        let taken = core::cell::RefCell::new(Vec::new());
        let post = |e: &RecvQueueEntry| {
            if e.conn == a && a_full.get() {
                Post::Later
            } else if e.rr.id == 6 {
                Post::Refused(error(e))
            } else {
                taken.borrow_mut().push(e.rr.id);
                Post::Taken
            }
        };
        let d = drain_work(&mut engine, &mut parked, 32, post);
        assert_eq!(*taken.borrow(), [3, 5], "b's requests went past a's");
        assert_eq!((d.taken, d.refused), (2, 1));
        assert_eq!(host.poll_completion().map(|c| c.wr_id), Some(6));
        assert_eq!(
            parked.iter().map(|e| e.rr.id).collect::<Vec<_>>(),
            [1, 2, 4]
        );
        // a's queue drains: its parked requests go first, in order.
        a_full.set(false);
        host.post_recv(a, entry(a, 7).rr).unwrap();
        let post = |e: &RecvQueueEntry| {
            taken.borrow_mut().push(e.rr.id);
            Post::Taken
        };
        drain_work(&mut engine, &mut parked, 32, post);
        assert_eq!(*taken.borrow(), [3, 5, 1, 2, 4, 7]);
        assert!(parked.is_empty() && !engine.has_work());
    }

    #[test]
    fn the_queue_waits_when_the_parked_list_is_full() {
        let mut queues: HostQueues<16, 16, 16, 4> = HostQueues::default();
        let (mut host, mut engine) = queues.ports();
        for id in 0..6 {
            host.post_recv(conn(0), entry(conn(0), id).rr).unwrap();
        }
        let mut parked: Deque<RecvQueueEntry, 4> = Deque::new();
        let d = drain_work(&mut engine, &mut parked, 32, |_| Post::Later);
        assert_eq!(parked.len(), 4);
        assert_eq!(
            host.recv_free(),
            16 - 2,
            "nothing dropped: the rest stays on the queue"
        );
        assert_eq!(
            d.later, 1,
            "only the first was tried; the rest queued behind it"
        );
    }
}
