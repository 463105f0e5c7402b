//! The server driven by a fake host: memory in a vector, registrations
//! answered at once or later, every post recorded.

use core::time::Duration;
use std::collections::HashMap;

use metaroce_core::api::{Access, Completion, ConnHandle, Opcode, PeerAddr, Status};
use metaroce_core::rng::seed_from_u64;
use metaroce_core::wire::CloseReason;
use metaroce_core::{Event, Instant};

use super::*;
use crate::{check_pattern, fill_pattern, Message, Operation, CONTROL_LEN, SLOTS};

const CONNS: usize = 8;
const RECV: u32 = 4;

#[derive(Default)]
struct FakeHost {
    /// Registrations answer `Pending`; `answer` reports them.
    asynchronous: bool,
    pending: Vec<(ConnHandle, KeyKind, u64)>,
    /// Registrations left before the region table is full.
    key_room: Option<usize>,
    /// Live keys: base, len, access, connection.
    keys: HashMap<u32, (u64, u64, Access, ConnHandle)>,
    next_key: u32,
    memory: Vec<u8>,
    /// Allocated regions: base -> len.
    allocated: HashMap<u64, u64>,
    attached: Vec<u64>,
    /// Room left in the host's memory.
    memory_room: u64,
    inbox: HashMap<(ConnHandle, u32), Vec<u8>>,
    posted_recvs: Vec<(ConnHandle, u32)>,
    sent: Vec<(ConnHandle, Message)>,
    rejected: Vec<ConnHandle>,
    finished: Vec<Finished>,
    released: Vec<ConnHandle>,
    no_buffers: bool,
}

impl FakeHost {
    fn new() -> FakeHost {
        FakeHost {
            memory_room: 64 << 20,
            next_key: 100,
            ..FakeHost::default()
        }
    }

    fn last_sent(&self, conn: ConnHandle) -> Option<Message> {
        self.sent
            .iter()
            .rev()
            .find(|(c, _)| *c == conn)
            .map(|(_, m)| *m)
    }
}

impl ServeHost for FakeHost {
    fn open(&mut self, _conn: ConnHandle) -> bool {
        !self.no_buffers
    }
    fn reject(&mut self, conn: ConnHandle) {
        self.rejected.push(conn);
    }
    fn post_recv(&mut self, conn: ConnHandle, slot: u32) -> bool {
        self.posted_recvs.push((conn, slot));
        true
    }
    fn received(&mut self, conn: ConnHandle, slot: u32, len: u32) -> Option<Message> {
        let bytes = self.inbox.remove(&(conn, slot))?;
        Message::decode(&bytes[..(len as usize).min(bytes.len())])
    }
    fn post_send(&mut self, conn: ConnHandle, _seq: u32, message: &[u8]) -> bool {
        self.sent
            .push((conn, Message::decode(message).expect("valid")));
        true
    }
    fn allocate(&mut self, _conn: ConnHandle, len: u64) -> Option<Memory> {
        let need = len + u64::from(READ_ONLY_LEN);
        if need > self.memory_room {
            return None;
        }
        self.memory_room -= need;
        let base = self.memory.len() as u64;
        self.memory.resize(self.memory.len() + need as usize, 0);
        self.allocated.insert(base, len);
        Some(Memory {
            base,
            len,
            ro_base: base + len,
        })
    }
    fn free(&mut self, memory: &Memory) {
        assert!(
            !self.keys.values().any(|k| k.0 == memory.base),
            "memory freed while a key reaches it"
        );
        let len = self.allocated.remove(&memory.base).expect("allocated");
        self.memory_room += len + u64::from(READ_ONLY_LEN);
    }
    fn attach(&mut self, memory: &Memory) {
        self.attached.push(memory.base);
    }
    fn detach(&mut self, memory: &Memory) {
        let at = self.attached.iter().position(|b| *b == memory.base);
        self.attached.remove(at.expect("attached"));
    }
    fn register(
        &mut self,
        conn: ConnHandle,
        kind: KeyKind,
        base: u64,
        len: u64,
        access: Access,
    ) -> Registration {
        if let Some(room) = self.key_room.as_mut() {
            if *room == 0 {
                return Registration::Refused;
            }
            *room -= 1;
        }
        self.next_key += 1;
        self.keys.insert(self.next_key, (base, len, access, conn));
        if self.asynchronous {
            self.pending.push((conn, kind, u64::from(self.next_key)));
            Registration::Pending
        } else {
            Registration::Key(self.next_key)
        }
    }
    fn deregister(&mut self, key: u32) {
        self.keys.remove(&key).expect("a live key");
    }
    fn check_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) -> Option<bool> {
        let at = addr as usize;
        let bytes = self.memory.get(at..at + len)?;
        Some(check_pattern(seed, index, bytes))
    }
    fn fill_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) {
        let at = addr as usize;
        if let Some(b) = self.memory.get_mut(at..at + len) {
            fill_pattern(seed, index, b)
        }
    }
    fn finished(&mut self, report: &Finished) {
        self.finished.push(*report);
    }
    fn release(&mut self, conn: ConnHandle) -> bool {
        self.released.push(conn);
        true
    }
}

type TestServer = Server<[Slot; CONNS], LocalBooks<CONNS, 4>>;

fn server() -> TestServer {
    Server::new(
        [Slot::free(); CONNS],
        0,
        // 4 connections and 1 MiB of regions per peer.
        LocalBooks::new(4, 1 << 20, seed_from_u64(7)),
        Config {
            max_message: 8192,
            recv_slots: RECV,
            failed_linger: Duration::from_secs(2),
        },
    )
}

fn peer(host: u8) -> PeerAddr {
    PeerAddr {
        ip: core::net::Ipv4Addr::new(10, 0, 0, host).into(),
        port: 4000,
    }
}

fn h(index: u32) -> ConnHandle {
    ConnHandle {
        index,
        generation: 1,
    }
}

const T0: Instant = Instant::ZERO;

fn connect(s: &mut TestServer, host: &mut FakeHost, conn: ConnHandle, from: u8) {
    let incoming = Event::Incoming {
        conn,
        peer: peer(from),
    };
    s.on_event(host, T0, incoming);
    s.poll(host, T0, u64::MAX);
}

/// Delivers `m` to `conn` in receive slot 0 and polls; returns the answer.
fn deliver(s: &mut TestServer, host: &mut FakeHost, conn: ConnHandle, m: Message) -> Message {
    let bytes = m.encode();
    host.inbox.insert((conn, 0), bytes.to_vec());
    let c = Completion {
        conn,
        wr_id: 0,
        opcode: Opcode::Recv,
        status: Status::Success,
        byte_len: bytes.len() as u32,
        imm: None,
    };
    let sent = host.sent.len();
    assert_eq!(s.on_completion(host, &c), 0);
    s.poll(host, T0, u64::MAX);
    assert!(host.sent.len() > sent, "an answer to {m:?}");
    host.last_sent(conn).expect("an answer")
}

fn announce(op: Operation, size: u32) -> Message {
    Message::Announce { op, seed: 9, size }
}

/// The REGION's key, address and ticket, asserting it was accepted.
fn accepted(m: Message) -> (u32, u64, u64) {
    match m {
        Message::Region {
            status: 0,
            key,
            addr,
            ticket,
            slots,
            ..
        } => {
            assert_eq!(slots, SLOTS);
            (key, addr, ticket)
        }
        other => panic!("not an accepted REGION: {other:?}"),
    }
}

fn status(m: Message) -> u32 {
    match m {
        Message::Region { status, .. } => status,
        other => panic!("not a REGION: {other:?}"),
    }
}

fn write_imm(s: &mut TestServer, host: &mut FakeHost, conn: ConnHandle, index: u32) -> u64 {
    s.on_completion(
        host,
        &Completion {
            conn,
            wr_id: 1,
            opcode: Opcode::RecvWriteImm,
            status: Status::Success,
            byte_len: 0,
            imm: Some(index),
        },
    )
}

fn close(s: &mut TestServer, host: &mut FakeHost, conn: ConnHandle) {
    let closed = Event::Closed {
        conn,
        reason: CloseReason::Normal,
    };
    s.on_event(host, T0, closed);
    s.poll(host, T0, u64::MAX);
}

#[test]
fn a_new_connection_gets_its_receives_posted() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(3), 1);
    assert_eq!(
        host.posted_recvs,
        (0..RECV).map(|r| (h(3), r)).collect::<Vec<_>>()
    );
    assert_eq!(s.open_connections(), 1);
}

#[test]
fn write_announce_verify_done_report() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(0), 1);
    let (key, addr, ticket) = accepted(deliver(
        &mut s,
        &mut host,
        h(0),
        announce(Operation::Write, 100),
    ));
    assert_ne!(ticket, 0);
    let k = host.keys[&key];
    assert_eq!((k.0, k.1, k.2, k.3), (addr, 100 * 64, Access::ALL, h(0)));
    // Message 65 lands in slot 1; a wrong message 2 in slot 2.
    let at = (addr + 100) as usize;
    fill_pattern(9, 65, &mut host.memory[at..at + 100]);
    assert_eq!(write_imm(&mut s, &mut host, h(0), 65), 100);
    assert_eq!(write_imm(&mut s, &mut host, h(0), 2), 100);
    let done = Message::Done {
        messages: 2,
        bytes: 200,
    };
    let report = deliver(&mut s, &mut host, h(0), done);
    assert_eq!(
        report,
        Message::Report {
            verified: 1,
            corrupt: 1,
            bytes: 200
        }
    );
    // The receives consumed are posted again.
    let reposted = &host.posted_recvs[RECV as usize..];
    assert!(reposted.contains(&(h(0), 0)) && reposted.contains(&(h(0), 1)));
    close(&mut s, &mut host, h(0));
    assert!(host.keys.is_empty() && host.allocated.is_empty());
    assert_eq!(host.finished[0].verified, 1);
    assert_eq!(host.released, [h(0)]);
    assert_eq!(s.books().holdings(), (0, 0), "nothing left booked");
}

#[test]
fn read_regions_are_filled_before_the_answer_a_budget_at_a_time() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(1), 1);
    host.inbox
        .insert((h(1), 0), announce(Operation::Read, 1000).encode().to_vec());
    let recv = Completion {
        conn: h(1),
        wr_id: 0,
        opcode: Opcode::Recv,
        status: Status::Success,
        byte_len: CONTROL_LEN,
        imm: None,
    };
    s.on_completion(&mut host, &recv);
    let mut polls = 0;
    while host.sent.is_empty() {
        assert!(s.filling());
        s.poll(&mut host, T0, 10_000);
        polls += 1;
    }
    assert_eq!(polls, 7, "64 slots of 1000 bytes, 10 slots a poll");
    let (_, addr, _) = accepted(host.sent[0].1);
    for j in 0..u64::from(SLOTS) {
        let at = (addr + j * 1000) as usize;
        assert!(check_pattern(9, j, &host.memory[at..at + 1000]));
    }
    let Message::Region {
        ro_addr, ro_key, ..
    } = host.sent[0].1
    else {
        unreachable!()
    };
    let ro = ro_addr as usize;
    assert!(check_pattern(
        9,
        READ_ONLY_INDEX,
        &host.memory[ro..ro + 4096]
    ));
    assert_eq!(host.keys[&ro_key].2, Access::REMOTE_READ);
}

#[test]
fn join_with_the_ticket_and_revocation_when_the_owner_ends() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(0), 1);
    connect(&mut s, &mut host, h(1), 2);
    let owner = deliver(&mut s, &mut host, h(0), announce(Operation::Write, 64));
    let (_, addr, ticket) = accepted(owner);
    let (key, joined_addr, joined_ticket) =
        accepted(deliver(&mut s, &mut host, h(1), Message::Join { ticket }));
    assert_eq!((joined_addr, joined_ticket), (addr, 0));
    assert_eq!(host.keys[&key].3, h(1), "keys in the joiner's domain");
    assert_eq!(s.counters().joins, 1);
    // A second JOIN on the connection is refused (spec B.1: BAD_SIZE).
    let again = deliver(&mut s, &mut host, h(1), Message::Join { ticket });
    assert_eq!(status(again), REGION_BAD_SIZE);
    // The owner ends: the joiner's keys go before the memory.
    close(&mut s, &mut host, h(0));
    assert!(host.keys.is_empty() && host.allocated.is_empty());
    assert!(host.attached.is_empty());
    // The ticket is gone with it.
    connect(&mut s, &mut host, h(2), 2);
    let late = deliver(&mut s, &mut host, h(2), Message::Join { ticket });
    assert_eq!(status(late), REGION_NO_TICKET);
    close(&mut s, &mut host, h(1));
    close(&mut s, &mut host, h(2));
    assert_eq!(s.books().holdings(), (0, 0));
}

#[test]
fn join_of_a_wrong_ticket_is_refused() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(0), 1);
    connect(&mut s, &mut host, h(1), 1);
    let (_, _, ticket) = accepted(deliver(
        &mut s,
        &mut host,
        h(0),
        announce(Operation::Write, 64),
    ));
    for wrong in [ticket ^ 1 << 40, ticket & 0xffff, 0] {
        let m = deliver(&mut s, &mut host, h(1), Message::Join { ticket: wrong });
        assert_eq!(status(m), REGION_NO_TICKET);
    }
    assert_eq!(s.counters().refused_bad_ticket, 3);
    assert_eq!(host.keys.len(), 2, "only the owner's keys");
}

#[test]
fn budgets_are_refused_by_reason_and_the_connection_stays_usable() {
    let (mut s, mut host) = (server(), FakeHost::new());
    // The host's memory, 1.5 MiB, is the total.
    host.memory_room = 3 << 19;
    for i in 0..5 {
        connect(&mut s, &mut host, h(i), 1);
    }
    assert_eq!(host.rejected, [h(4)], "over the peer's connections");
    assert_eq!(s.counters().refused_peer_connections, 1);
    // 8 KiB x 64 = 512 KiB + 4 KiB each: one per peer within 1 MiB.
    let big = announce(Operation::Write, 8192);
    accepted(deliver(&mut s, &mut host, h(0), big));
    let m = deliver(&mut s, &mut host, h(1), big);
    assert_eq!(status(m), REGION_OVER_BUDGET);
    assert_eq!(s.counters().refused_peer_bytes, 1);
    // Another peer: the total (1.5 MiB) refuses its second.
    connect(&mut s, &mut host, h(5), 2);
    connect(&mut s, &mut host, h(6), 3);
    accepted(deliver(&mut s, &mut host, h(5), big));
    let m = deliver(&mut s, &mut host, h(6), big);
    assert_eq!(status(m), REGION_OVER_BUDGET);
    assert_eq!(s.counters().refused_total_bytes, 1);
    // Sizes out of range, and a second announcement.
    for size in [0, 8193] {
        let m = deliver(&mut s, &mut host, h(1), announce(Operation::Write, size));
        assert_eq!(status(m), REGION_BAD_SIZE);
    }
    let m = deliver(&mut s, &mut host, h(0), announce(Operation::Write, 8));
    assert_eq!(status(m), REGION_BAD_SIZE);
    let c = *s.counters();
    assert_eq!((c.refused_bad_size, c.refused_second_announce), (2, 1));
    assert_eq!(c.refused_over_budget, 2);
    // The refused connection is still served.
    accepted(deliver(
        &mut s,
        &mut host,
        h(1),
        announce(Operation::Write, 8),
    ));
}

#[test]
fn a_full_region_table_and_no_memory_are_refused() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(0), 1);
    connect(&mut s, &mut host, h(1), 1);
    host.key_room = Some(1);
    let m = deliver(&mut s, &mut host, h(0), announce(Operation::Write, 8));
    assert_eq!(status(m), REGION_OVER_BUDGET);
    assert_eq!(s.counters().refused_no_keys, 1);
    assert!(host.keys.is_empty() && host.allocated.is_empty());
    host.key_room = None;
    host.memory_room = 0;
    let m = deliver(&mut s, &mut host, h(1), announce(Operation::Write, 8));
    assert_eq!(status(m), REGION_OVER_BUDGET);
    assert_eq!(s.counters().refused_total_bytes, 1);
    assert_eq!(
        s.books().holdings(),
        (1, 0),
        "the peer holds connections only"
    );
    host.no_buffers = true;
    connect(&mut s, &mut host, h(2), 3);
    assert_eq!(s.counters().refused_no_buffers, 1);
    assert_eq!(host.rejected, [h(2)]);
}

#[test]
fn asynchronous_registrations_answer_when_both_keys_are_back() {
    let (mut s, mut host) = (server(), FakeHost::new());
    host.asynchronous = true;
    connect(&mut s, &mut host, h(0), 1);
    host.inbox
        .insert((h(0), 0), announce(Operation::Write, 8).encode().to_vec());
    let recv = Completion {
        conn: h(0),
        wr_id: 0,
        opcode: Opcode::Recv,
        status: Status::Success,
        byte_len: 20,
        imm: None,
    };
    s.on_completion(&mut host, &recv);
    assert!(host.sent.is_empty());
    let asked = core::mem::take(&mut host.pending);
    assert_eq!(asked.len(), 2);
    s.registered(&mut host, asked[0].0, asked[0].1, Some(asked[0].2 as u32));
    assert!(host.sent.is_empty(), "one key back of two");
    s.registered(&mut host, asked[1].0, asked[1].1, Some(asked[1].2 as u32));
    accepted(host.last_sent(h(0)).expect("REGION"));
    // A connection that ends with registrations out: its keys go as they
    // come back, and its slot is released only then.
    connect(&mut s, &mut host, h(1), 1);
    host.inbox
        .insert((h(1), 0), announce(Operation::Write, 8).encode().to_vec());
    s.on_completion(&mut host, &Completion { conn: h(1), ..recv });
    close(&mut s, &mut host, h(1));
    assert!(!host.released.contains(&h(1)));
    for (conn, kind, key) in core::mem::take(&mut host.pending) {
        s.registered(&mut host, conn, kind, Some(key as u32));
    }
    s.poll(&mut host, T0, u64::MAX);
    assert!(host.released.contains(&h(1)));
    assert_eq!(host.keys.len(), 2, "only the first connection's keys");
}

#[test]
fn a_failed_connection_frees_its_memory_and_lingers_before_release() {
    let (mut s, mut host) = (server(), FakeHost::new());
    connect(&mut s, &mut host, h(0), 1);
    accepted(deliver(
        &mut s,
        &mut host,
        h(0),
        announce(Operation::Read, 64),
    ));
    let failed = Event::Failed {
        conn: h(0),
        status: Status::RemoteInvalidKey,
    };
    s.on_event(&mut host, T0, failed);
    assert!(host.keys.is_empty() && host.allocated.is_empty());
    assert_eq!(host.finished[0].end, End::Failed(Status::RemoteInvalidKey));
    s.poll(&mut host, T0 + Duration::from_secs(1), u64::MAX);
    assert!(host.released.is_empty(), "lingers for its NAK");
    s.poll(&mut host, T0 + Duration::from_secs(2), u64::MAX);
    assert_eq!(host.released, [h(0)]);
    assert_eq!((s.counters().failed, s.open_connections()), (1, 0));
    assert_eq!(s.books().holdings(), (0, 0));
}

#[test]
fn a_refused_connection_is_released_when_it_closes() {
    let (mut s, mut host) = (server(), FakeHost::new());
    host.no_buffers = true;
    connect(&mut s, &mut host, h(0), 1);
    close(&mut s, &mut host, h(0));
    assert_eq!(host.released, [h(0)]);
    assert!(host.finished.is_empty());
    host.no_buffers = false;
    connect(
        &mut s,
        &mut host,
        ConnHandle {
            index: 0,
            generation: 2,
        },
        1,
    );
    assert_eq!(s.open_connections(), 1);
}
