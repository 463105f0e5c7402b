//! The server of `metaroce serve`: accepts connections, gives each a
//! region in its own protection domain, verifies what arrives, reports.
//!
//! Hostile clients are expected. Every connection is isolated (its own
//! domain: a key works only on the connection it was given to; a second
//! connection reaches a region only by `JOIN`ing with the region's random
//! ticket). Every resource is budgeted per peer address and in total
//! (connections, regions, bytes of memory); a request over budget is
//! refused on the wire (`CLOSE` with `REJECTED` for a connection, `REGION`
//! with `REGION_OVER_BUDGET` for an announcement) and counted by reason,
//! and the server goes on serving everyone else.
//!
//! The budgets and tickets are kept in a [`Ledger`] the engine threads of
//! a sharded server share (`serve --threads N`, [`crate::shard`]): each
//! thread runs a `Server` over its own shard of the connection table, and
//! the limits hold for the node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant as WallInstant};

use metaroce_core::api::{Access, Completion, ConnHandle, Opcode, Region, Status};
use metaroce_core::wire::CloseReason;
use metaroce_core::{CommandError, Event};
use serde::Serialize;

use super::ledger::{Ledger, Memory, Refusal, RegionShare};
use super::{Control, IDLE_TURN};
use crate::app::{self, Message, Operation, SLOTS};
use crate::node::Node;
use crate::HostError;

/// How long a failed connection stays (answering later packets with its
/// fatal NAK, spec 4.7.2) before its slot is released; released at once
/// when the table is nearly full.
const FAILED_LINGER: Duration = Duration::from_secs(2);

/// Bytes of data pattern the server writes or checks per loop turn (a
/// READ region's slots to fill, WRITE_IMM messages to verify): one
/// largest message. Beyond it the work waits for the next turn, so the
/// engine keeps taking datagrams: done all at once, a few clients
/// announcing 4 MiB READs (256 MiB of pattern each) held the loop for over
/// a second, and CONNECTs queued at the socket meanwhile.
const PATTERN_BYTES_PER_TURN: u64 = app::MAX_MESSAGE as u64;

/// A READ region being filled with its pattern, a few slots per turn,
/// before its REGION answer goes out.
#[derive(Debug)]
struct Filling {
    conn: ConnHandle,
    peer: std::net::IpAddr,
    seed: u64,
    size: u32,
    base: u64,
    ro_base: u64,
    /// Slots filled so far.
    next: u32,
}

/// What each peer address may hold at once, and the server in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PeerBudget {
    /// Connections from one address.
    pub connections_per_peer: u32,
    /// Bytes of announced regions of one address.
    pub bytes_per_peer: u64,
    /// Bytes of announced regions of every peer.
    pub bytes_total: u64,
    /// Regions (announced or joined) of one address.
    pub regions_per_peer: u32,
}

impl Default for PeerBudget {
    fn default() -> Self {
        PeerBudget {
            connections_per_peer: 256,
            bytes_per_peer: 256 << 20,
            bytes_total: 2 << 30,
            regions_per_peer: 512,
        }
    }
}

/// What the server refused and why, and what it saw: the `serve`
/// summary's counters (the endpoint's drops by reason come with them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ServerCounters {
    pub connections: u64,
    /// Connections closed at once: their address has its budget of
    /// connections.
    pub refused_peer_connections: u64,
    /// Connections closed at once: no room for their control buffers.
    pub refused_no_buffers: u64,
    /// Announcements refused: size out of range.
    pub refused_bad_size: u64,
    /// Announcements or joins refused with `REGION_OVER_BUDGET`: the sum
    /// of the four reasons below.
    pub refused_over_budget: u64,
    /// ... because the peer address's bytes would pass its budget.
    pub refused_peer_bytes: u64,
    /// ... because every peer's bytes together would pass the server's.
    pub refused_total_bytes: u64,
    /// ... because the peer address's regions would pass its budget (or
    /// the connection already reaches a region).
    pub refused_peer_regions: u64,
    /// ... because the endpoint's region table is full.
    pub refused_no_keys: u64,
    /// Joins whose ticket named no region.
    pub refused_bad_ticket: u64,
    /// Announcements on a connection that already has a region.
    pub refused_second_announce: u64,
    pub joins: u64,
    /// Connections that ended closed (by either side, for any reason).
    pub closed: u64,
    /// ... of which closed because the peer went silent for the idle
    /// timeout (a client that stopped answering).
    pub idle_timeouts: u64,
    /// Connections that failed: idle timeout (a peer that went silent),
    /// retries exhausted, or an error.
    pub failed: u64,
}

/// What the server reports about one finished connection.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ServerReport {
    pub peer: String,
    /// The engine thread that served it (0 unless sharded) and its index
    /// in the connection table (which names that thread's shard).
    pub thread: usize,
    pub slot: u32,
    pub operation: String,
    pub message_size: u32,
    /// WRITE_IMM messages received and checked against the pattern.
    pub verified: u64,
    /// Messages whose bytes differed from the pattern.
    pub corrupt: u64,
    pub bytes: u64,
    pub packets_received: u64,
    pub duplicates_received: u64,
    pub ce_received: u64,
    pub naks_sent: u64,
    /// Every packet the endpoint dropped, by any reason, so far.
    pub endpoint_drops: u64,
    pub closed: String,
    pub integrity_ok: bool,
    /// The connection's packet protection (spec 5.3): `none` or
    /// `AES_256_GCM key N`.
    pub suite: String,
}

/// A region of server memory a connection has keys for.
#[derive(Debug, Clone, Copy)]
struct Keys {
    key: u32,
    ro_key: u32,
}

#[derive(Debug)]
struct ServerConn {
    control: Control,
    peer: SocketAddr,
    /// Keys of this connection (its own domain) for `memory`.
    keys: Option<Keys>,
    /// The memory it reaches: its own, or the one it joined.
    memory: Option<Memory>,
    /// It allocated `memory` (not joined): freed when it ends.
    owns_memory: bool,
    /// The ticket of its own region (0: none).
    ticket: u64,
    /// The ticket it joined (0: none), and whether the region's arenas
    /// were attached here from another thread.
    joined: u64,
    attached: bool,
    op: Option<Operation>,
    seed: u64,
    size: u32,
    verified: u64,
    corrupt: u64,
    bytes: u64,
}

/// The `serve` side: accepts connections, gives each a region, verifies.
#[derive(Debug)]
pub struct Server {
    pub node: Node,
    pub budget: PeerBudget,
    conns: HashMap<ConnHandle, ServerConn>,
    /// Budgets and tickets, node-wide.
    ledger: Arc<Ledger>,
    /// This server's engine thread (0 unless sharded).
    thread: usize,
    /// Connections that closed or failed, with how and when to release
    /// them (their last completions must be taken first).
    ending: Vec<(ConnHandle, String, WallInstant)>,
    /// Reports of connections that ended, oldest first.
    pub finished: Vec<ServerReport>,
    /// READ regions still being filled, oldest first.
    filling: std::collections::VecDeque<Filling>,
    pub counters: ServerCounters,
    /// The packet protection policy the node runs, for summaries.
    pub protection: String,
}

impl Server {
    /// A server on a bound node (which must accept incoming connections).
    pub fn new(node: Node) -> Server {
        Server::with_budget(node, PeerBudget::default())
    }

    /// A server with `budget`.
    pub fn with_budget(node: Node, budget: PeerBudget) -> Server {
        Server::sharded(node, Ledger::new(budget, 1, None), 0)
    }

    /// Engine thread `thread` of a sharded server, whose budgets and
    /// tickets `ledger` keeps for all its threads.
    pub fn sharded(node: Node, ledger: Arc<Ledger>, thread: usize) -> Server {
        Server {
            node,
            budget: ledger.budget(),
            conns: HashMap::new(),
            ledger,
            thread,
            ending: Vec::new(),
            finished: Vec::new(),
            filling: Default::default(),
            counters: ServerCounters::default(),
            protection: "off".into(),
        }
    }

    /// Connections being served now.
    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    /// Runs until `stop` returns true (checked every turn).
    pub fn run(&mut self, mut stop: impl FnMut(&Server) -> bool) -> Result<(), HostError> {
        while !stop(self) {
            self.turn(IDLE_TURN)?;
        }
        Ok(())
    }

    /// One loop turn plus the server's bookkeeping.
    pub fn turn(&mut self, max_wait: Duration) -> Result<(), HostError> {
        // A region still being filled: no sleeping between its slots.
        let wait = if self.filling.is_empty() {
            max_wait
        } else {
            Duration::ZERO
        };
        self.node.turn(wait);
        let now = WallInstant::now();
        while let Some(e) = self.node.events.pop_front() {
            match e {
                Event::Incoming { conn, peer } => self.adopt(conn, crate::node::socket_of(peer)),
                Event::Closed { conn, reason } => {
                    self.counters.closed += 1;
                    self.counters.idle_timeouts += u64::from(reason == CloseReason::IdleTimeout);
                    self.ending.push((conn, format!("{reason:?}"), now));
                }
                Event::Failed { conn, status } => {
                    self.counters.failed += 1;
                    // Stays a while to answer the peer's later packets with
                    // its fatal NAK, unless room is short.
                    let ep = &self.node.ep;
                    let crowded = u64::from(ep.live_connections()) * 10 >= ep.capacity() as u64 * 9;
                    let at = if crowded { now } else { now + FAILED_LINGER };
                    self.ending.push((conn, format!("failed: {status:?}"), at));
                }
                Event::Connected(_) => {}
            }
        }
        // Pattern work is bounded per turn; what is left waits in the
        // queues, and the node takes datagrams before it comes back here.
        let mut budget = PATTERN_BYTES_PER_TURN;
        while budget > 0 {
            let Some(c) = self.node.completions.pop_front() else {
                break;
            };
            budget = budget.saturating_sub(self.on_completion(&c));
        }
        self.fill_regions(budget);
        for h in self.ledger.take_revoked(self.thread) {
            self.revoke(h);
        }
        let ending = std::mem::take(&mut self.ending);
        for (h, how, at) in ending {
            if at > now {
                self.ending.push((h, how, at));
                continue;
            }
            self.finish(h, &how);
            match self.node.ep.release(h) {
                Ok(()) | Err(CommandError::UnknownConnection) => {}
                // Its last completions are still coming: next turn.
                Err(_) => self.ending.push((h, how, at)),
            }
        }
        Ok(())
    }

    /// The ledger this server books into.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Counts an announcement or join refused with `REGION_OVER_BUDGET`
    /// for `reason` and answers it.
    fn refuse_over_budget(&mut self, h: ConnHandle, reason: fn(&mut ServerCounters) -> &mut u64) {
        self.counters.refused_over_budget += 1;
        *reason(&mut self.counters) += 1;
        self.answer(h, &Message::region_refused(app::REGION_OVER_BUDGET));
    }

    /// Closes a connection the server will not serve, with `REJECTED`.
    fn refuse(&mut self, h: ConnHandle) {
        let now = self.node.now();
        let _ = self.node.ep.close_with(now, h, CloseReason::Rejected);
    }

    /// A new connection: within its address's budget, its buffers and
    /// receives; otherwise refused.
    fn adopt(&mut self, h: ConnHandle, peer: SocketAddr) {
        self.counters.connections += 1;
        if self.ledger.adopt(peer.ip()).is_err() {
            self.counters.refused_peer_connections += 1;
            self.refuse(h);
            return;
        }
        let control = match Control::new(&mut self.node, h) {
            Ok(c) => c,
            Err(_) => {
                self.ledger.release_connection(peer.ip());
                self.counters.refused_no_buffers += 1;
                self.refuse(h);
                return;
            }
        };
        let _ = control.post_recvs(&mut self.node, h);
        self.conns.insert(
            h,
            ServerConn {
                control,
                peer,
                keys: None,
                memory: None,
                owns_memory: false,
                ticket: 0,
                joined: 0,
                attached: false,
                op: None,
                seed: 0,
                size: 0,
                verified: 0,
                corrupt: 0,
                bytes: 0,
            },
        );
    }

    /// Handles one completion; returns the bytes of pattern it checked.
    fn on_completion(&mut self, c: &Completion) -> u64 {
        let Some(conn) = self.conns.get_mut(&c.conn) else {
            return 0;
        };
        match (c.opcode, c.status) {
            (Opcode::Recv, Status::Success) => {
                let msg = conn.control.received(&self.node, c);
                let _ = conn
                    .control
                    .post_recv(&mut self.node, c.conn, c.wr_id as u32);
                match msg {
                    Some(Message::Announce { op, seed, size }) => {
                        self.on_announce(c.conn, op, seed, size);
                    }
                    Some(Message::Join { ticket }) => self.on_join(c.conn, ticket),
                    Some(Message::Done { .. }) => {
                        let report = Message::Report {
                            verified: conn.verified,
                            corrupt: conn.corrupt,
                            bytes: conn.bytes,
                        };
                        let _ = conn.control.send(&mut self.node, c.conn, &report);
                    }
                    _ => {}
                }
            }
            (Opcode::RecvWriteImm, Status::Success) => {
                let _ = conn
                    .control
                    .post_recv(&mut self.node, c.conn, c.wr_id as u32);
                let (Some(m), Some(index)) = (conn.memory, c.imm) else {
                    return 0;
                };
                let size = conn.size as usize;
                let slot = u64::from(index % SLOTS) * u64::from(conn.size);
                if size == 0 || slot + size as u64 > m.len {
                    return 0;
                }
                conn.bytes += size as u64;
                let seed = conn.seed;
                let check = |data: &[u8]| app::check_pattern(seed, u64::from(index), data);
                match self.node.mem.with(m.base + slot, size, check) {
                    Some(true) => conn.verified += 1,
                    _ => conn.corrupt += 1,
                }
                return size as u64;
            }
            _ => {}
        }
        0
    }

    /// Fills READ regions' slots with their pattern, `budget` bytes' worth
    /// at most (at least one slot), and answers each REGION once full.
    fn fill_regions(&mut self, mut budget: u64) {
        while let Some(f) = self.filling.front_mut() {
            if !self.conns.contains_key(&f.conn) {
                // It ended before its region was ready.
                let f = self.filling.pop_front().expect("front");
                self.node.mem.free(f.base);
                self.node.mem.free(f.ro_base);
                let footprint =
                    u64::from(f.size) * u64::from(SLOTS) + u64::from(app::READ_ONLY_LEN);
                self.ledger.release_region(f.peer, footprint);
                continue;
            }
            while f.next < SLOTS {
                if budget == 0 {
                    return;
                }
                let off = u64::from(f.next) * u64::from(f.size);
                if let Some(dst) = self.node.mem.slice_mut(f.base + off, f.size as usize) {
                    app::fill_pattern(f.seed, u64::from(f.next), dst);
                }
                f.next += 1;
                budget = budget.saturating_sub(u64::from(f.size));
            }
            let f = self.filling.pop_front().expect("front");
            self.publish_region(f.conn, Operation::Read, f.seed, f.size, f.base, f.ro_base);
        }
    }

    fn answer(&mut self, h: ConnHandle, m: &Message) {
        if let Some(conn) = self.conns.get_mut(&h) {
            let _ = conn.control.send(&mut self.node, h, m);
        }
    }

    /// Registers `memory` for connection `h` (its domain): the data region
    /// with every right, the read-only page with remote read.
    fn register_keys(&mut self, h: ConnHandle, memory: Memory) -> Option<Keys> {
        let pd = self.node.ep.pd(h)?;
        let key = self
            .node
            .ep
            .register_region(Region {
                base: memory.base,
                len: memory.len,
                access: Access::ALL,
                pd,
            })
            .ok()?;
        let ro = self.node.ep.register_region(Region {
            base: memory.ro_base,
            len: u64::from(app::READ_ONLY_LEN),
            access: Access::REMOTE_READ,
            pd,
        });
        match ro {
            Ok(ro_key) => Some(Keys { key, ro_key }),
            Err(_) => {
                let _ = self.node.ep.deregister_region(key);
                None
            }
        }
    }

    fn drop_keys(&mut self, keys: Keys) {
        let _ = self.node.ep.deregister_region(keys.key);
        let _ = self.node.ep.deregister_region(keys.ro_key);
    }

    fn on_announce(&mut self, h: ConnHandle, op: Operation, seed: u64, size: u32) {
        let Some(conn) = self.conns.get(&h) else {
            return;
        };
        if conn.memory.is_some() {
            self.counters.refused_second_announce += 1;
            self.answer(h, &Message::region_refused(app::REGION_BAD_SIZE));
            return;
        }
        if size == 0 || size > app::MAX_MESSAGE {
            self.counters.refused_bad_size += 1;
            self.answer(h, &Message::region_refused(app::REGION_BAD_SIZE));
            return;
        }
        let len = u64::from(size) * u64::from(SLOTS);
        let footprint = len + u64::from(app::READ_ONLY_LEN);
        let peer = conn.peer;
        match self.ledger.reserve_region(peer.ip(), footprint) {
            Ok(()) => {}
            Err(Refusal::PeerBytes) => {
                return self.refuse_over_budget(h, |c| &mut c.refused_peer_bytes)
            }
            Err(Refusal::TotalBytes) => {
                return self.refuse_over_budget(h, |c| &mut c.refused_total_bytes)
            }
            Err(_) => return self.refuse_over_budget(h, |c| &mut c.refused_peer_regions),
        }
        let base = self.node.mem.alloc(len as usize, 0);
        let ro_base = self.node.mem.alloc(app::READ_ONLY_LEN as usize, 0);
        if op == Operation::Read {
            // Filled a few slots per turn (`fill_regions`), then answered.
            self.filling.push_back(Filling {
                conn: h,
                peer: peer.ip(),
                seed,
                size,
                base,
                ro_base,
                next: 0,
            });
            return;
        }
        self.publish_region(h, op, seed, size, base, ro_base);
    }

    /// Fills the read-only page, registers the region's keys, publishes
    /// its ticket and answers REGION.
    fn publish_region(
        &mut self,
        h: ConnHandle,
        op: Operation,
        seed: u64,
        size: u32,
        base: u64,
        ro_base: u64,
    ) {
        let Some(peer) = self.conns.get(&h).map(|c| c.peer) else {
            return;
        };
        let len = u64::from(size) * u64::from(SLOTS);
        let footprint = len + u64::from(app::READ_ONLY_LEN);
        if let Some(dst) = self
            .node
            .mem
            .slice_mut(ro_base, app::READ_ONLY_LEN as usize)
        {
            app::fill_pattern(seed, app::READ_ONLY_INDEX, dst);
        }
        let memory = Memory { base, len, ro_base };
        let Some(keys) = self.register_keys(h, memory) else {
            self.node.mem.free(base);
            self.node.mem.free(ro_base);
            self.ledger.release_region(peer.ip(), footprint);
            return self.refuse_over_budget(h, |c| &mut c.refused_no_keys);
        };
        // With several engine threads, shareable, so that a connection on
        // another thread can join it (only the threads using it lock it).
        let arenas = if self.ledger.threads() > 1 {
            self.node.mem.share(base).zip(self.node.mem.share(ro_base))
        } else {
            None
        };
        let ticket = self.ledger.publish(RegionShare {
            memory,
            op: Some(op),
            seed,
            size,
            thread: self.thread,
            arenas,
        });
        let conn = self.conns.get_mut(&h).expect("present above");
        conn.keys = Some(keys);
        conn.memory = Some(memory);
        conn.owns_memory = true;
        conn.ticket = ticket;
        conn.op = Some(op);
        conn.seed = seed;
        conn.size = size;
        self.answer(
            h,
            &Message::Region {
                status: app::REGION_OK,
                key: keys.key,
                addr: base,
                len,
                slots: SLOTS,
                ro_key: keys.ro_key,
                ro_addr: ro_base,
                ticket,
            },
        );
    }

    /// `JOIN`: keys on `h` for the region the ticket names, which may
    /// belong to a connection of another engine thread.
    fn on_join(&mut self, h: ConnHandle, ticket: u64) {
        let Some(conn) = self.conns.get(&h) else {
            return;
        };
        let peer = conn.peer;
        if conn.memory.is_some() {
            return self.refuse_over_budget(h, |c| &mut c.refused_peer_regions);
        }
        let share = match self.ledger.join(ticket, self.thread, h, peer.ip()) {
            Ok(share) => share,
            Err(Refusal::BadTicket) => {
                self.counters.refused_bad_ticket += 1;
                self.answer(h, &Message::region_refused(app::REGION_NO_TICKET));
                return;
            }
            Err(_) => return self.refuse_over_budget(h, |c| &mut c.refused_peer_regions),
        };
        let memory = share.memory;
        // Another thread's region: its bytes become reachable here too
        // (a region published by another thread is always shared).
        let attached = share.thread != self.thread;
        if let (true, Some((data, read_only))) = (attached, &share.arenas) {
            self.node.mem.attach(memory.base, data);
            self.node.mem.attach(memory.ro_base, read_only);
        }
        let Some(keys) = self.register_keys(h, memory) else {
            if attached {
                self.node.mem.detach(memory.base);
                self.node.mem.detach(memory.ro_base);
            }
            self.ledger.leave(ticket, self.thread, h, peer.ip());
            return self.refuse_over_budget(h, |c| &mut c.refused_no_keys);
        };
        self.counters.joins += 1;
        let conn = self.conns.get_mut(&h).expect("present above");
        conn.keys = Some(keys);
        conn.memory = Some(memory);
        conn.joined = ticket;
        conn.attached = attached;
        conn.op = share.op;
        conn.seed = share.seed;
        conn.size = share.size;
        self.answer(
            h,
            &Message::Region {
                status: app::REGION_OK,
                key: keys.key,
                addr: memory.base,
                len: memory.len,
                slots: SLOTS,
                ro_key: keys.ro_key,
                ro_addr: memory.ro_base,
                ticket: 0,
            },
        );
    }

    /// A joiner of this thread loses what it joined (the region's owner
    /// ended): its keys first, then its hold on the bytes. The ledger has
    /// already given its regions back.
    fn revoke(&mut self, h: ConnHandle) {
        let Some(conn) = self.conns.get_mut(&h) else {
            return;
        };
        let keys = conn.keys.take();
        let memory = conn.memory.take();
        let attached = std::mem::take(&mut conn.attached);
        conn.joined = 0;
        if let Some(keys) = keys {
            self.drop_keys(keys);
        }
        if let (true, Some(m)) = (attached, memory) {
            self.node.mem.detach(m.base);
            self.node.mem.detach(m.ro_base);
        }
    }

    fn finish(&mut self, h: ConnHandle, how: &str) {
        let Some(conn) = self.conns.remove(&h) else {
            return;
        };
        let stats = self.node.ep.stats(h).unwrap_or_default();
        let suite = self.node.ep.protection(h).map_or_else(
            || "none".into(),
            |(s, k)| crate::protection::suite_name(s, k),
        );
        if let Some(keys) = conn.keys {
            self.drop_keys(keys);
        }
        let peer = conn.peer.ip();
        self.ledger.release_connection(peer);
        if conn.joined != 0 {
            self.ledger.leave(conn.joined, self.thread, h, peer);
        }
        if let (true, Some(m)) = (conn.attached, conn.memory) {
            self.node.mem.detach(m.base);
            self.node.mem.detach(m.ro_base);
        }
        if let (true, Some(m)) = (conn.owns_memory, conn.memory) {
            // Whoever joined loses its keys first: nothing may reach the
            // memory once it is freed (joiners on other threads lose theirs
            // on their thread's next turn; the bytes live until then).
            for j in self.ledger.withdraw(conn.ticket, self.thread) {
                self.revoke(j);
            }
            self.node.mem.free(m.base);
            self.node.mem.free(m.ro_base);
            let footprint = m.len + u64::from(app::READ_ONLY_LEN);
            self.ledger.release_region(peer, footprint);
        }
        let _ = self.node.ep.deregister_region(conn.control.key());
        self.node.mem.free(conn.control.base());
        let operation = match conn.op {
            Some(Operation::Write) => "write",
            Some(Operation::Read) => "read",
            None => "none",
        };
        self.finished.push(ServerReport {
            peer: conn.peer.to_string(),
            thread: self.thread,
            slot: h.index,
            operation: operation.into(),
            message_size: conn.size,
            verified: conn.verified,
            corrupt: conn.corrupt,
            bytes: conn.bytes,
            packets_received: stats.packets_received,
            duplicates_received: stats.duplicates_received,
            ce_received: stats.ce_received,
            naks_sent: stats.naks_sent,
            endpoint_drops: self.node.ep.drops().total(),
            closed: how.into(),
            integrity_ok: conn.corrupt == 0,
            suite,
        });
    }
}
