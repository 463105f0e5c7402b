//! The server of `metaroce serve` (spec appendix B), once for the host tool
//! and the firmware: a sans-IO state machine over a table of connection
//! slots the caller supplies.
//!
//! Inputs, in this order each turn of the caller's loop:
//! [`Server::on_event`] for each connection event, [`Server::on_completion`]
//! for each completion, [`Server::registered`] for each registration that
//! finished later (a platform that registers memory asynchronously), then
//! [`Server::poll`], which posts what is waiting (receives, answers), fills
//! `READ` regions a bounded amount per call and releases ended connections.
//! Everything it does to the world goes through the [`ServeHost`] the
//! caller passes in; what each peer may hold, and the `JOIN` tickets, are
//! kept in its [`Books`].
//!
//! Hostile clients are expected. Every connection is isolated (its own
//! protection domain: the host puts it there in [`ServeHost::open`]); every
//! resource is budgeted per peer address and in total; a request over
//! budget is refused on the wire (`CLOSE` with `REJECTED` for a
//! connection, `REGION` with a refusing status for an `ANNOUNCE` or a
//! `JOIN`) and counted by reason ([`Counters`]), and everyone else is
//! served on.

mod books;
mod counters;
mod host;
#[cfg(test)]
mod tests;

pub use books::{Books, LocalBooks, Refusal, RegionShare, REGIONS_PER_GRANT};
pub use counters::Counters;
pub use host::{Config, End, Finished, KeyKind, Memory, Registration, ServeHost};

use metaroce_core::api::{Access, Completion, ConnHandle, Opcode, PeerAddr, Status};
use metaroce_core::wire::CloseReason;
use metaroce_core::{Event, Instant};

use crate::{
    Message, Operation, READ_ONLY_INDEX, READ_ONLY_LEN, REGION_BAD_SIZE, REGION_NO_TICKET,
    REGION_OK, REGION_OVER_BUDGET, SLOTS,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Open,
    /// Ended: released once its registrations were answered, its last
    /// completions taken and `release_at` passed.
    Ending,
}

/// The end of the work list.
const NO_SLOT: u32 = u32::MAX;

/// An answer waiting for room in the send queue, built from the slot's
/// state when it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    None,
    /// `REGION` with the slot's keys (refused `NO_TICKET` if the region
    /// went meanwhile).
    Region,
    /// `REPORT` of what the slot verified.
    Report,
    /// A refusing `REGION` with this status.
    Refused(u8),
}

/// One connection's state; a table of them is the server's storage.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    state: State,
    /// The handle's generation: completions and registrations of an
    /// earlier connection on the same slot are told apart by it.
    generation: u32,
    /// Its peer (while it is not free).
    peer: PeerAddr,
    release_at: Instant,
    /// Receive slots still to be posted (bit per slot).
    to_post: u32,
    next_send: u32,
    /// Answers waiting for room in the send queue (oldest first).
    answers: [Answer; 2],
    /// On the work list, and the next slot on it.
    queued: bool,
    next_work: u32,
    /// The memory it reaches: its own (`owns`) or the one it joined.
    memory: Option<Memory>,
    owns: bool,
    /// The ticket of its own region, once published (0: none).
    ticket: u64,
    /// The ticket it joined (0: none).
    joined: u64,
    keys: [Option<u32>; 2],
    /// Registrations asked for and not answered yet.
    pending: u8,
    /// A `READ` region being filled: slots filled so far.
    filling: bool,
    filled: u32,
    /// What its region is for (when `size` is not 0).
    op: Operation,
    seed: u64,
    size: u32,
    verified: u64,
    corrupt: u64,
    bytes: u64,
}

impl Slot {
    /// A slot no connection uses: a table of them is `[Slot::free(); N]`.
    pub fn free() -> Slot {
        Slot {
            state: State::Free,
            generation: 0,
            peer: PeerAddr {
                ip: core::net::Ipv4Addr::UNSPECIFIED.into(),
                port: 0,
            },
            release_at: Instant::ZERO,
            to_post: 0,
            next_send: 0,
            answers: [Answer::None; 2],
            queued: false,
            next_work: NO_SLOT,
            memory: None,
            owns: false,
            ticket: 0,
            joined: 0,
            keys: [None; 2],
            pending: 0,
            filling: false,
            filled: 0,
            op: Operation::Write,
            seed: 0,
            size: 0,
            verified: 0,
            corrupt: 0,
            bytes: 0,
        }
    }
}

/// The serve application over a table of connection slots `S` (slot `i`
/// holds the connection whose handle index is `first_index + i`) and its
/// books `B`.
#[derive(Debug)]
pub struct Server<S, B> {
    slots: S,
    first_index: u32,
    books: B,
    config: Config,
    counters: Counters,
    /// Slots with something to do (receives or sends to post, a region to
    /// fill, a release to retry), in a list through the slots: a poll
    /// visits these, never every slot.
    work_head: u32,
    work_tail: u32,
    work_len: usize,
    open: usize,
    filling: usize,
}

impl<S: AsRef<[Slot]> + AsMut<[Slot]>, B: Books> Server<S, B> {
    /// A server over `slots` (every one [`Slot::free`]) whose first holds
    /// handle index `first_index`.
    pub fn new(slots: S, first_index: u32, books: B, config: Config) -> Self {
        Server {
            slots,
            first_index,
            books,
            config,
            counters: Counters::default(),
            work_head: NO_SLOT,
            work_tail: NO_SLOT,
            work_len: 0,
            open: 0,
            filling: 0,
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn books(&self) -> &B {
        &self.books
    }

    /// Connections being served now.
    pub fn open_connections(&self) -> usize {
        self.open
    }

    /// Whether `READ` regions are waiting to be filled (the caller should
    /// not sleep before its next poll).
    pub fn filling(&self) -> bool {
        self.filling > 0
    }

    /// A connection event.
    pub fn on_event<H: ServeHost>(&mut self, host: &mut H, now: Instant, event: Event) {
        match event {
            Event::Incoming { conn, peer } => self.adopt(host, conn, peer),
            Event::Closed { conn, reason } => {
                self.counters.closed += 1;
                self.counters.idle_timeouts += u64::from(reason == CloseReason::IdleTimeout);
                self.finish(host, conn, End::Closed(reason), now);
            }
            Event::Failed { conn, status } => {
                self.counters.failed += 1;
                // It stays a while to answer the peer's later packets with
                // its fatal NAK, unless room is short.
                let crowded = self.open * 10 >= self.slots.as_ref().len() * 9;
                let at = if crowded {
                    now
                } else {
                    now + self.config.failed_linger
                };
                self.finish(host, conn, End::Failed(status), at);
            }
            Event::Connected(_) => {}
        }
    }

    /// A completion; returns the bytes of pattern it checked (a caller
    /// bounds its pattern work per turn by them).
    pub fn on_completion<H: ServeHost>(&mut self, host: &mut H, c: &Completion) -> u64 {
        let Some(i) = self.current(c.conn) else {
            return 0;
        };
        let slot = c.wr_id as u32;
        let is_recv = matches!(c.opcode, Opcode::Recv | Opcode::RecvWriteImm);
        if c.status != Status::Success || !is_recv || slot >= self.config.recv_slots {
            return 0;
        }
        self.slots.as_mut()[i].to_post |= 1 << slot;
        self.mark(i);
        if c.opcode == Opcode::RecvWriteImm {
            return c.imm.map_or(0, |index| self.verify(host, i, index));
        }
        match host.received(c.conn, slot, c.byte_len) {
            Some(Message::Announce { op, seed, size }) => self.announce(host, i, op, seed, size),
            Some(Message::Join { ticket }) => self.join(host, i, ticket),
            Some(Message::Done { .. }) => self.answer(host, i, Answer::Report),
            _ => {}
        }
        0
    }

    /// A registration answered [`Registration::Pending`] finished: its key,
    /// or `None` if it was refused.
    pub fn registered<H: ServeHost>(
        &mut self,
        host: &mut H,
        conn: ConnHandle,
        kind: KeyKind,
        key: Option<u32>,
    ) {
        let current = self.index(conn).filter(|&i| {
            let s = &self.slots.as_ref()[i];
            s.generation == conn.generation && s.pending > 0
        });
        let Some(i) = current else {
            if let Some(k) = key {
                host.deregister(k);
            }
            return;
        };
        let s = &mut self.slots.as_mut()[i];
        s.pending -= 1;
        if s.state != State::Open {
            // The connection ended meanwhile: the key goes at once.
            if let Some(k) = key {
                host.deregister(k);
            }
            if s.pending == 0 {
                self.drop_region(host, i);
            }
            self.mark(i);
            return;
        }
        s.keys[kind as usize] = key;
        if s.pending == 0 {
            self.answer_keys(host, i);
        }
    }

    /// Posts what is waiting, fills `READ` regions with up to
    /// `pattern_budget` bytes of pattern (at least one slot), releases
    /// ended connections.
    pub fn poll<H: ServeHost>(&mut self, host: &mut H, now: Instant, pattern_budget: u64) {
        let Server {
            slots,
            books,
            first_index,
            ..
        } = self;
        books.take_revoked(&mut |j| revoke(slots.as_mut(), *first_index, host, j));
        let mut budget = pattern_budget;
        for _ in 0..self.work_len {
            let Some(i) = self.pop_work() else {
                break;
            };
            let handle = self.handle(i);
            let s = &mut self.slots.as_mut()[i];
            match s.state {
                State::Open => {
                    let mut to_post = s.to_post;
                    while to_post != 0 && host.post_recv(handle, to_post.trailing_zeros()) {
                        to_post &= to_post - 1;
                    }
                    s.to_post = to_post;
                    if s.filling {
                        budget = self.fill(host, i, budget);
                    }
                    self.flush_sends(host, i);
                    let s = &self.slots.as_ref()[i];
                    if s.to_post != 0 || s.answers[0] != Answer::None || s.filling {
                        self.mark(i);
                    }
                }
                State::Ending => {
                    if s.pending == 0 && now >= s.release_at && host.release(handle) {
                        self.occupy(i, State::Free, 0, Slot::free().peer, Instant::ZERO);
                    } else {
                        self.mark(i);
                    }
                }
                State::Free => {}
            }
        }
    }

    // In place: a few instructions, smaller than a call at each of its
    // callers (the firmware's code budget).
    #[inline(always)]
    fn handle(&self, i: usize) -> ConnHandle {
        ConnHandle {
            index: self.first_index + i as u32,
            generation: self.slots.as_ref()[i].generation,
        }
    }

    /// The slot of handle index `conn.index`, whoever holds it.
    fn index(&self, conn: ConnHandle) -> Option<usize> {
        let i = conn.index.checked_sub(self.first_index)? as usize;
        (i < self.slots.as_ref().len()).then_some(i)
    }

    /// The slot of `conn` if it is being served.
    fn current(&self, conn: ConnHandle) -> Option<usize> {
        self.index(conn).filter(|&i| {
            let s = &self.slots.as_ref()[i];
            s.state == State::Open && s.generation == conn.generation
        })
    }

    /// Puts slot `i` on the work list (once).
    fn mark(&mut self, i: usize) {
        let slots = self.slots.as_mut();
        if slots[i].queued {
            return;
        }
        slots[i].queued = true;
        slots[i].next_work = NO_SLOT;
        match slots.get_mut(self.work_tail as usize) {
            Some(tail) => tail.next_work = i as u32,
            None => self.work_head = i as u32,
        }
        self.work_tail = i as u32;
        self.work_len += 1;
    }

    fn pop_work(&mut self) -> Option<usize> {
        let i = self.work_head as usize;
        let s = self.slots.as_mut().get_mut(i)?;
        s.queued = false;
        self.work_head = s.next_work;
        if self.work_head == NO_SLOT {
            self.work_tail = NO_SLOT;
        }
        self.work_len -= 1;
        Some(i)
    }

    /// A new connection (its `Incoming` event comes before its first data,
    /// so its receives are posted in time): within its address's budget,
    /// it gets its domain, buffers and receives; otherwise it is refused.
    fn adopt<H: ServeHost>(&mut self, host: &mut H, conn: ConnHandle, peer: PeerAddr) {
        self.counters.connections += 1;
        let Some(i) = self
            .index(conn)
            .filter(|&i| self.slots.as_ref()[i].state == State::Free)
        else {
            self.counters.refused_no_buffers += 1;
            return host.reject(conn);
        };
        if self.books.adopt(peer).is_err() {
            self.counters.refused_peer_connections += 1;
            return host.reject(conn);
        }
        if !host.open(conn) {
            self.books.release_connection(peer);
            self.counters.refused_no_buffers += 1;
            return host.reject(conn);
        }
        self.occupy(i, State::Open, conn.generation, peer, Instant::ZERO);
        self.slots.as_mut()[i].to_post = u32::MAX >> (32 - self.config.recv_slots.clamp(1, 32));
        self.open += 1;
        self.mark(i);
    }

    /// A connection ended: reported, its region and keys given up, its
    /// books closed; its handle is released by a later poll. One the
    /// server refused is only released.
    fn finish<H: ServeHost>(&mut self, host: &mut H, conn: ConnHandle, end: End, at: Instant) {
        let Some(i) = self.index(conn) else {
            return;
        };
        let s = self.slots.as_ref()[i];
        match s.state {
            State::Open if s.generation == conn.generation => {}
            State::Free => {
                self.occupy(i, State::Ending, conn.generation, s.peer, at);
                return self.mark(i);
            }
            _ => return,
        }
        host.finished(&Finished {
            conn,
            peer: s.peer,
            op: (s.size != 0).then_some(s.op),
            size: s.size,
            verified: s.verified,
            corrupt: s.corrupt,
            bytes: s.bytes,
            end,
        });
        self.books.release_connection(s.peer);
        self.drop_region(host, i);
        let s = &mut self.slots.as_mut()[i];
        s.state = State::Ending;
        s.release_at = at;
        s.answers = [Answer::None; 2];
        self.open -= 1;
        self.mark(i);
    }

    /// Gives up slot `i`'s keys and what it reaches: a joiner leaves the
    /// region; an owner's joiners lose their keys before its memory goes
    /// (nothing may reach memory once it is free).
    fn drop_region<H: ServeHost>(&mut self, host: &mut H, i: usize) {
        let conn = self.handle(i);
        let s = &mut self.slots.as_mut()[i];
        drop_keys(host, &mut s.keys);
        if core::mem::take(&mut s.filling) {
            self.filling -= 1;
        }
        if s.pending > 0 {
            // Registrations of the memory are still out: it goes when the
            // last is answered (and its key dropped).
            return;
        }
        let memory = s.memory.take();
        let joined = core::mem::take(&mut s.joined);
        let owns = core::mem::take(&mut s.owns);
        let ticket = core::mem::take(&mut s.ticket);
        let peer = s.peer;
        let Some(m) = memory else {
            return;
        };
        if joined != 0 {
            self.books.leave(joined, conn, peer);
            host.detach(&m);
        } else if owns {
            if ticket != 0 {
                let Server {
                    slots,
                    books,
                    first_index,
                    ..
                } = self;
                books.withdraw(ticket, &mut |j| {
                    revoke(slots.as_mut(), *first_index, host, j)
                });
            }
            host.free(&m);
            self.books.release_region(peer, m.footprint());
        }
    }

    // Out of line: a call per refusal is smaller than the answer's code at
    // each (the firmware's code budget).
    #[inline(never)]
    fn refuse<H: ServeHost>(&mut self, host: &mut H, i: usize, status: u32) {
        self.answer(host, i, Answer::Refused(status as u8));
    }

    /// Counts an `ANNOUNCE` or `JOIN` over budget for `reason` and answers
    /// it.
    #[inline(never)] // as `refuse`
    fn refuse_over_budget<H: ServeHost>(&mut self, host: &mut H, i: usize, reason: Refusal) {
        let c = &mut self.counters;
        c.refused_over_budget += 1;
        *match reason {
            Refusal::PeerBytes => &mut c.refused_peer_bytes,
            Refusal::TotalBytes => &mut c.refused_total_bytes,
            _ => &mut c.refused_peer_regions,
        } += 1;
        self.refuse(host, i, REGION_OVER_BUDGET);
    }

    /// Whether slot `i` already has, or is getting, a region: a second
    /// `ANNOUNCE` or `JOIN` is refused (spec B.1: `BAD_SIZE`).
    fn refuse_second<H: ServeHost>(&mut self, host: &mut H, i: usize) -> bool {
        let s = &self.slots.as_ref()[i];
        let second = s.memory.is_some() || s.pending > 0;
        if second {
            self.counters.refused_second_announce += 1;
            self.refuse(host, i, REGION_BAD_SIZE);
        }
        second
    }

    fn announce<H: ServeHost>(
        &mut self,
        host: &mut H,
        i: usize,
        op: Operation,
        seed: u64,
        size: u32,
    ) {
        if self.refuse_second(host, i) {
            return;
        }
        if size == 0 || size > self.config.max_message {
            self.counters.refused_bad_size += 1;
            return self.refuse(host, i, REGION_BAD_SIZE);
        }
        let len = u64::from(size) * u64::from(SLOTS);
        let footprint = len + u64::from(READ_ONLY_LEN);
        let peer = self.slots.as_ref()[i].peer;
        if let Err(r) = self.books.reserve_region(peer, footprint) {
            return self.refuse_over_budget(host, i, r);
        }
        let Some(memory) = host.allocate(self.handle(i), len) else {
            // The host's memory is what all peers share: its end is the
            // server's budget.
            self.books.release_region(peer, footprint);
            return self.refuse_over_budget(host, i, Refusal::TotalBytes);
        };
        host.fill_pattern(
            memory.ro_base,
            READ_ONLY_LEN as usize,
            seed,
            READ_ONLY_INDEX,
        );
        let s = &mut self.slots.as_mut()[i];
        s.memory = Some(memory);
        s.owns = true;
        s.op = op;
        s.seed = seed;
        s.size = size;
        if op == Operation::Read {
            // Filled a bounded amount per poll, then answered.
            s.filling = true;
            s.filled = 0;
            self.filling += 1;
            self.mark(i);
        } else {
            self.request_keys(host, i);
        }
    }

    /// `JOIN`: keys on slot `i` for the region the ticket names.
    fn join<H: ServeHost>(&mut self, host: &mut H, i: usize, ticket: u64) {
        if self.refuse_second(host, i) {
            return;
        }
        let peer = self.slots.as_ref()[i].peer;
        let share = match self.books.join(ticket, self.handle(i), peer) {
            Ok(share) => share,
            Err(Refusal::BadTicket) => {
                self.counters.refused_bad_ticket += 1;
                return self.refuse(host, i, REGION_NO_TICKET);
            }
            Err(r) => return self.refuse_over_budget(host, i, r),
        };
        host.attach(&share.memory);
        let s = &mut self.slots.as_mut()[i];
        s.memory = Some(share.memory);
        s.joined = ticket;
        s.op = share.op;
        s.seed = share.seed;
        s.size = share.size;
        self.request_keys(host, i);
    }

    /// Fills slot `i`'s `READ` region, `budget` bytes' worth at most (at
    /// least one slot); asks for its keys once full. Returns what is left
    /// of the budget.
    fn fill<H: ServeHost>(&mut self, host: &mut H, i: usize, mut budget: u64) -> u64 {
        let s = &mut self.slots.as_mut()[i];
        let Some(m) = s.memory else {
            return budget;
        };
        while s.filled < SLOTS {
            if budget == 0 {
                return 0;
            }
            let at = m.base + u64::from(s.filled) * u64::from(s.size);
            let (seed, index) = (s.seed, u64::from(s.filled));
            host.fill_pattern(at, s.size as usize, seed, index);
            s.filled += 1;
            budget = budget.saturating_sub(u64::from(s.size));
        }
        s.filling = false;
        self.filling -= 1;
        self.request_keys(host, i);
        budget
    }

    /// Registers slot `i`'s memory in its domain: the data region with
    /// every right, the read-only page with remote read. The `REGION`
    /// answer follows when both keys are back.
    fn request_keys<H: ServeHost>(&mut self, host: &mut H, i: usize) {
        let conn = self.handle(i);
        let s = &mut self.slots.as_mut()[i];
        let Some(m) = s.memory else {
            return;
        };
        let ro_len = u64::from(READ_ONLY_LEN);
        ask(host, conn, s, KeyKind::Data, m.base, m.len, Access::ALL);
        ask(
            host,
            conn,
            s,
            KeyKind::ReadOnly,
            m.ro_base,
            ro_len,
            Access::REMOTE_READ,
        );
        if s.pending == 0 {
            self.answer_keys(host, i);
        }
    }

    /// Every registration of slot `i` was answered: publishes an announced
    /// region's ticket and answers `REGION`, or refuses.
    fn answer_keys<H: ServeHost>(&mut self, host: &mut H, i: usize) {
        let conn = self.handle(i);
        let s = self.slots.as_ref()[i];
        let (Some(m), [Some(_), Some(_)]) = (s.memory, s.keys) else {
            self.drop_region(host, i);
            if s.memory.is_none() {
                // A joiner whose region's owner ended meanwhile.
                self.counters.refused_bad_ticket += 1;
                return self.refuse(host, i, REGION_NO_TICKET);
            }
            self.counters.refused_over_budget += 1;
            self.counters.refused_no_keys += 1;
            return self.refuse(host, i, REGION_OVER_BUDGET);
        };
        if s.owns {
            let share = RegionShare {
                memory: m,
                op: s.op,
                seed: s.seed,
                size: s.size,
            };
            self.slots.as_mut()[i].ticket = self.books.publish(conn, share);
        } else {
            self.counters.joins += 1;
        }
        self.answer(host, i, Answer::Region);
    }

    /// A WRITE_IMM of message `index` arrived: checks its slot against the
    /// pattern; returns the bytes checked.
    fn verify<H: ServeHost>(&mut self, host: &mut H, i: usize, index: u32) -> u64 {
        let s = &mut self.slots.as_mut()[i];
        let Some(m) = s.memory else {
            return 0;
        };
        if s.filling {
            return 0;
        }
        let size = u64::from(s.size);
        let at = u64::from(index % SLOTS) * size;
        if size == 0 || at + size > m.len {
            return 0;
        }
        s.bytes += size;
        let seed = s.seed;
        match host.check_pattern(m.base + at, size as usize, seed, u64::from(index)) {
            Some(true) => s.verified += 1,
            _ => s.corrupt += 1,
        }
        size
    }

    /// Queues an answer on slot `i` and posts what the send queue takes.
    /// One message answers one message, so two waiting are plenty; a third
    /// is dropped.
    fn answer<H: ServeHost>(&mut self, host: &mut H, i: usize, answer: Answer) {
        let s = &mut self.slots.as_mut()[i];
        if let Some(free) = s.answers.iter_mut().find(|a| **a == Answer::None) {
            *free = answer;
        }
        self.flush_sends(host, i);
        if self.slots.as_ref()[i].answers[0] != Answer::None {
            self.mark(i);
        }
    }

    fn flush_sends<H: ServeHost>(&mut self, host: &mut H, i: usize) {
        let conn = self.handle(i);
        let s = &mut self.slots.as_mut()[i];
        while s.answers[0] != Answer::None {
            let message = match (s.answers[0], s.memory, s.keys) {
                (Answer::Report, ..) => Message::Report {
                    verified: s.verified,
                    corrupt: s.corrupt,
                    bytes: s.bytes,
                },
                (Answer::Region, Some(m), [Some(key), Some(ro_key)]) => Message::Region {
                    status: REGION_OK,
                    key,
                    addr: m.base,
                    len: m.len,
                    slots: SLOTS,
                    ro_key,
                    ro_addr: m.ro_base,
                    ticket: s.ticket,
                },
                (Answer::Refused(status), ..) => Message::region_refused(u32::from(status)),
                // A joiner whose region's owner ended before its answer.
                _ => Message::region_refused(REGION_NO_TICKET),
            };
            if !host.post_send(conn, s.next_send, &message.encode()) {
                break;
            }
            s.next_send = s.next_send.wrapping_add(1);
            s.answers = [s.answers[1], Answer::None];
        }
    }

    /// Slot `i` starts over in `state`, for the connection of `generation`.
    fn occupy(
        &mut self,
        i: usize,
        state: State,
        generation: u32,
        peer: PeerAddr,
        release_at: Instant,
    ) {
        self.slots.as_mut()[i] = Slot {
            state,
            generation,
            peer,
            release_at,
            ..Slot::free()
        };
    }
}

/// A joiner loses what it joined (the region's owner ended; the books
/// already gave its regions back): its keys first, then its hold on the
/// memory.
fn revoke<H: ServeHost>(slots: &mut [Slot], first_index: u32, host: &mut H, j: ConnHandle) {
    let Some(s) = j
        .index
        .checked_sub(first_index)
        .and_then(|i| slots.get_mut(i as usize))
    else {
        return;
    };
    if s.state != State::Open || s.generation != j.generation || s.joined == 0 {
        return;
    }
    s.joined = 0;
    drop_keys(host, &mut s.keys);
    if let Some(m) = s.memory.take() {
        host.detach(&m);
    }
}

fn drop_keys<H: ServeHost>(host: &mut H, keys: &mut [Option<u32>; 2]) {
    for key in keys {
        if let Some(k) = key.take() {
            host.deregister(k);
        }
    }
}

/// Asks for one of a slot's keys.
fn ask<H: ServeHost>(
    host: &mut H,
    conn: ConnHandle,
    s: &mut Slot,
    kind: KeyKind,
    base: u64,
    len: u64,
    access: Access,
) {
    match host.register(conn, kind, base, len, access) {
        Registration::Key(k) => s.keys[kind as usize] = Some(k),
        Registration::Pending => s.pending += 1,
        Registration::Refused => {}
    }
}
