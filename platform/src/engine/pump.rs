//! The host-queue pump: everything between the host's rings and the
//! transport that is not a packet. It takes registrations, receive
//! buffers and work requests from the host's admin, receive and send
//! rings into the transport ([`HostPump::take`]), holding aside (bounded,
//! in order per connection) a request whose connection's queue is full,
//! and it is the one place that drains the transport's completions into
//! the host's completion ring ([`HostPump::complete`]): each completion is
//! moved once, as the transport made it, and its doorbell rung.

use heapless::Deque;
use metaroce_core::api::{Completion, ConnHandle, Opcode};

use super::EngineStats;
use crate::doorbell::Doorbell;
use crate::host::{AdminCommand, AdminResult, EnginePort, RecvQueueEntry, SendQueueEntry};
use crate::probe;
use crate::ring::{RingConsumer, RingProducer};
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
    pub(super) fn take<
        T: Transport,
        const SQ: usize,
        const RQ: usize,
        const CQ: usize,
        const AQ: usize,
    >(
        &mut self,
        transport: &mut T,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
        work_requests: u32,
        stats: &mut EngineStats,
    ) -> bool {
        // The rings are the truth; doorbells only wake a sleeping engine.
        let _ = port.take_doorbells();
        let mut any = false;
        let mut answered = false;
        while !port.admin_result.is_full() {
            let Some(command) = port.admin.pop() else {
                break;
            };
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
            let _ = port.admin_result.push(AdminResult { tag, result });
            answered = true;
        }
        let budget = work_requests;
        let recvs = drain_work(
            &mut port.recv,
            &mut self.parked_recvs,
            &mut port.completion,
            budget,
            |e: &RecvQueueEntry| e.conn,
            |e| match transport.post_recv(e.conn, e.rr) {
                Ok(()) => Post::Taken,
                Err(err) if err.is_retryable() => Post::Later,
                Err(err) => Post::Refused(Completion {
                    conn: e.conn,
                    wr_id: e.rr.id,
                    opcode: Opcode::Recv,
                    status: err.status(),
                    byte_len: 0,
                    imm: None,
                }),
            },
        );
        let sends = drain_work(
            &mut port.send,
            &mut self.parked_sends,
            &mut port.completion,
            budget,
            |e: &SendQueueEntry| e.conn,
            |e| match transport.post_send(e.conn, e.wr) {
                Ok(()) => Post::Taken,
                Err(err) if err.is_retryable() => Post::Later,
                Err(err) => Post::Refused(Completion {
                    conn: e.conn,
                    wr_id: e.wr.id,
                    opcode: opcode_of(&e.wr.op),
                    status: err.status(),
                    byte_len: 0,
                    imm: None,
                }),
            },
        );
        stats.posted_recvs += u64::from(recvs.taken);
        stats.posted_sends += u64::from(sends.taken);
        stats.post_retries += u64::from(recvs.later + sends.later);
        stats.post_errors += u64::from(recvs.refused + sends.refused);
        answered |= recvs.refused + sends.refused > 0;
        any |= recvs.moved || sends.moved;
        if answered {
            port.bells.completion.ring();
        }
        any || answered
    }

    /// Moves up to `budget` completions from the transport to the
    /// completion ring, then rings its doorbell: the only path from the
    /// transport's completions to the host.
    pub(super) fn complete<
        T: Transport,
        const SQ: usize,
        const RQ: usize,
        const CQ: usize,
        const AQ: usize,
    >(
        &self,
        transport: &mut T,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
        budget: u32,
        stats: &mut EngineStats,
    ) -> bool {
        let mut written = 0;
        while written < budget {
            if port.completion.is_full() {
                stats.cq_full += 1;
                break;
            }
            let Some(completion) = transport.poll_completion() else {
                break;
            };
            // Cannot fail: the ring had a free slot and we are its only producer.
            let _ = port.completion.push(completion);
            probe::count(|p| {
                p.completions += 1;
                p.completion_hops += 1;
            });
            written += 1;
        }
        stats.completions += u64::from(written);
        if written > 0 {
            port.bells.completion.ring();
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

/// Moves requests from a shared host ring into the transport. The host
/// has one send and one receive ring for every connection, so a request
/// the transport refuses for now (its connection's queue is full) must
/// not hold up the other connections behind it: it is parked (bounded),
/// with its connection's later requests behind it in order, and retried
/// first on the next poll. Only when the parked list is full does the
/// ring wait. Each request refused for good becomes an error completion.
fn drain_work<E: Copy, R: RingConsumer<E>, C: RingProducer<Completion>, const N: usize>(
    ring: &mut R,
    parked: &mut Deque<E, N>,
    completions: &mut C,
    budget: u32,
    conn_of: impl Fn(&E) -> ConnHandle,
    mut post: impl FnMut(&E) -> Post,
) -> Drained {
    let mut out = Drained::default();
    let mut blocked = Blocked(heapless::Vec::new());
    let mut attempt = |entry: &E, blocked: &mut Blocked, out: &mut Drained, completions: &mut C| {
        if blocked.contains(conn_of(entry)) {
            return false;
        }
        match post(entry) {
            Post::Taken => out.taken += 1,
            Post::Later => {
                out.later += 1;
                blocked.insert(conn_of(entry));
                return false;
            }
            Post::Refused(c) => {
                out.refused += 1;
                // `completions` had room: checked before every attempt.
                let _ = completions.push(c);
                probe::count(|p| {
                    p.completions += 1;
                    p.completion_hops += 1;
                });
            }
        }
        true
    };
    // Parked requests first: they are older than anything on the ring.
    for _ in 0..parked.len() {
        if completions.is_full() {
            return out;
        }
        let Some(entry) = parked.pop_front() else {
            break;
        };
        if attempt(&entry, &mut blocked, &mut out, completions) {
            out.moved = true;
        } else {
            // Same capacity it was just taken from.
            let _ = parked.push_back(entry);
        }
    }
    let mut budget = budget;
    while budget > 0 && !completions.is_full() {
        let Some(entry) = ring.peek() else { break };
        budget -= 1;
        // Parked list full: the ring waits (back-pressure).
        if !attempt(&entry, &mut blocked, &mut out, completions) && parked.push_back(entry).is_err()
        {
            break;
        }
        let _ = ring.pop();
        out.moved = true;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::SpscRing;
    use core::cell::Cell;
    use std::vec::Vec;

    type Item = (ConnHandle, u32);

    fn conn(index: u32) -> ConnHandle {
        ConnHandle {
            index,
            generation: 1,
        }
    }

    fn error(conn: ConnHandle, id: u32) -> Completion {
        Completion {
            conn,
            wr_id: u64::from(id),
            opcode: Opcode::Send,
            status: metaroce_core::api::Status::LocalProtection,
            byte_len: 0,
            imm: None,
        }
    }

    #[test]
    fn a_full_connection_does_not_hold_up_the_others_and_keeps_its_order() {
        let ring: SpscRing<Item, 16> = SpscRing::new();
        let done: SpscRing<Completion, 16> = SpscRing::new();
        let (mut host, mut work) = ring.split().unwrap();
        let (mut cq, mut cq_host) = done.split().unwrap();
        let (a, b) = (conn(0), conn(1));
        for item in [(a, 1), (a, 2), (b, 3), (a, 4), (b, 5), (b, 6)] {
            host.push(item).unwrap();
        }
        let mut parked: Deque<Item, 4> = Deque::new();
        let a_full = Cell::new(true);
        let taken = core::cell::RefCell::new(Vec::new());
        let post = |e: &Item| {
            if e.0 == a && a_full.get() {
                Post::Later
            } else if e.1 == 6 {
                Post::Refused(error(e.0, e.1))
            } else {
                taken.borrow_mut().push(e.1);
                Post::Taken
            }
        };
        let d = drain_work(&mut work, &mut parked, &mut cq, 32, |e| e.0, post);
        assert_eq!(*taken.borrow(), [3, 5], "b's requests went past a's");
        assert_eq!((d.taken, d.refused), (2, 1));
        assert_eq!(cq_host.pop().map(|c| c.wr_id), Some(6));
        assert_eq!(parked.iter().map(|e| e.1).collect::<Vec<_>>(), [1, 2, 4]);
        // a's queue drains: its parked requests go first, in order.
        a_full.set(false);
        host.push((a, 7)).unwrap();
        let post = |e: &Item| {
            taken.borrow_mut().push(e.1);
            Post::Taken
        };
        drain_work(&mut work, &mut parked, &mut cq, 32, |e| e.0, post);
        assert_eq!(*taken.borrow(), [3, 5, 1, 2, 4, 7]);
        assert!(parked.is_empty() && work.is_empty());
    }

    #[test]
    fn the_ring_waits_when_the_parked_list_is_full() {
        let ring: SpscRing<Item, 16> = SpscRing::new();
        let done: SpscRing<Completion, 16> = SpscRing::new();
        let (mut host, mut work) = ring.split().unwrap();
        let (mut cq, _) = done.split().unwrap();
        for id in 0..6 {
            host.push((conn(0), id)).unwrap();
        }
        let mut parked: Deque<Item, 4> = Deque::new();
        let d = drain_work(
            &mut work,
            &mut parked,
            &mut cq,
            32,
            |e| e.0,
            |_| Post::Later,
        );
        assert_eq!(parked.len(), 4);
        assert_eq!(work.len(), 2, "nothing dropped: the rest stays on the ring");
        assert_eq!(
            d.later, 1,
            "only the first was tried; the rest queued behind it"
        );
    }
}
