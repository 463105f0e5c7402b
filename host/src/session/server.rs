//! The server of `metaroce serve`: the application of
//! [`crate::app::serve`] over a [`Node`]. This module is its platform
//! ([`ServeHost`]): control buffers from the node's arenas, registrations
//! straight into the endpoint, reports of finished connections.
//!
//! The budgets and tickets are kept in a [`Ledger`] the engine threads of
//! a sharded server share (`serve --threads N`, [`crate::shard`]): each
//! thread runs a `Server` over its own shard of the connection table, and
//! the limits hold for the node.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metaroce_core::api::{Access, ConnHandle, Region};
use metaroce_core::wire::CloseReason;
use metaroce_core::CommandError;
use serde::Serialize;

use super::ledger::{Ledger, ThreadBooks};
use super::{Control, IDLE_TURN, RECV_SLOTS};
use crate::app::serve::{self, End, Finished, KeyKind, Memory, Registration, Slot};
use crate::app::{self, Message, Operation, CONTROL_LEN};
use crate::node::Node;
use crate::HostError;

/// Bytes of data pattern the server writes or checks per loop turn (a
/// READ region's slots to fill, WRITE_IMM messages to verify): one
/// largest message. Beyond it the work waits for the next turn, so the
/// engine keeps taking datagrams: done all at once, a few clients
/// announcing 4 MiB READs (256 MiB of pattern each) held the loop for over
/// a second, and CONNECTs queued at the socket meanwhile.
const PATTERN_BYTES_PER_TURN: u64 = app::MAX_MESSAGE as u64;

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
/// summary's counters (docs/counters.md).
pub type ServerCounters = serve::Counters;

/// The counters as the `server` object of `serve --json`'s summary.
pub fn counters_json(c: &ServerCounters) -> serde_json::Value {
    let fields = c.fields().into_iter();
    serde_json::Value::Object(fields.map(|(k, v)| (k.into(), v.into())).collect())
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

/// The `serve` side: accepts connections, gives each a region, verifies.
#[derive(Debug)]
pub struct Server {
    pub node: Node,
    pub budget: PeerBudget,
    app: serve::Server<Vec<Slot>, ThreadBooks>,
    /// Each connection's control buffers.
    controls: HashMap<ConnHandle, Control>,
    /// Budgets and tickets, node-wide.
    ledger: Arc<Ledger>,
    /// This server's engine thread (0 unless sharded).
    thread: usize,
    /// Reports of connections that ended, oldest first.
    pub finished: Vec<ServerReport>,
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
        let budget = ledger.budget();
        // The shards are equal: thread `t`'s first slot is `t` shards in.
        let slots = node.ep.capacity();
        let books = ThreadBooks {
            ledger: ledger.clone(),
            thread,
        };
        let config = serve::Config {
            max_message: app::MAX_MESSAGE,
            recv_slots: RECV_SLOTS,
            failed_linger: Duration::from_secs(2),
        };
        let first = (thread * slots) as u32;
        Server {
            node,
            budget,
            app: serve::Server::new(vec![Slot::free(); slots], first, books, config),
            controls: HashMap::new(),
            ledger,
            thread,
            finished: Vec::new(),
            protection: "off".into(),
        }
    }

    /// Connections being served now.
    pub fn open_connections(&self) -> usize {
        self.app.open_connections()
    }

    /// Whether READ regions still wait for their pattern: the server is
    /// busy even with no datagram to take, so a caller's loop should not
    /// sleep before the next turn.
    pub fn filling(&self) -> bool {
        self.app.filling()
    }

    /// What the server refused and saw so far.
    pub fn counters(&self) -> ServerCounters {
        *self.app.counters()
    }

    /// The ledger this server books into.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Runs until `stop` returns true (checked every turn).
    pub fn run(&mut self, mut stop: impl FnMut(&Server) -> bool) -> Result<(), HostError> {
        while !stop(self) {
            self.turn(IDLE_TURN)?;
        }
        Ok(())
    }

    /// One loop turn plus the server's work.
    pub fn turn(&mut self, max_wait: Duration) -> Result<(), HostError> {
        // A region still being filled: no sleeping between its slots.
        let wait = if self.filling() {
            Duration::ZERO
        } else {
            max_wait
        };
        self.node.turn(wait);
        let now = self.node.now();
        let mut host = HostSide {
            node: &mut self.node,
            controls: &mut self.controls,
            ledger: &self.ledger,
            thread: self.thread,
            finished: &mut self.finished,
        };
        while let Some(e) = host.node.events.pop_front() {
            self.app.on_event(&mut host, now, e);
        }
        // Pattern work is bounded per turn; what is left waits in the
        // queues, and the node takes datagrams before it comes back here.
        let mut budget = PATTERN_BYTES_PER_TURN;
        while budget > 0 {
            let Some(c) = host.node.completions.pop_front() else {
                break;
            };
            budget = budget.saturating_sub(self.app.on_completion(&mut host, &c));
        }
        self.app.poll(&mut host, now, budget);
        Ok(())
    }
}

/// The application's view of one engine thread's node.
struct HostSide<'a> {
    node: &'a mut Node,
    controls: &'a mut HashMap<ConnHandle, Control>,
    ledger: &'a Ledger,
    thread: usize,
    finished: &'a mut Vec<ServerReport>,
}

impl HostSide<'_> {
    /// Whether `memory` belongs to another thread's arenas (a join across
    /// threads attaches it here).
    fn foreign(&self, memory: &Memory) -> bool {
        crate::memory::thread_of(memory.base) != self.thread
    }
}

impl serve::ServeHost for HostSide<'_> {
    fn open(&mut self, conn: ConnHandle) -> bool {
        match Control::new(self.node, conn) {
            Ok(control) => {
                self.controls.insert(conn, control);
                true
            }
            Err(_) => false,
        }
    }

    fn reject(&mut self, conn: ConnHandle) {
        let now = self.node.now();
        let _ = self.node.ep.close_with(now, conn, CloseReason::Rejected);
    }

    fn post_recv(&mut self, conn: ConnHandle, slot: u32) -> bool {
        let Some(control) = self.controls.get(&conn) else {
            return false;
        };
        control.post_recv(self.node, conn, slot).is_ok()
    }

    fn received(&mut self, conn: ConnHandle, slot: u32, len: u32) -> Option<Message> {
        let buf = self.controls.get(&conn)?.recv_buf(slot);
        let bytes = self
            .node
            .mem
            .slice(buf.addr, len.min(CONTROL_LEN) as usize)?;
        Message::decode(bytes)
    }

    fn post_send(&mut self, conn: ConnHandle, seq: u32, message: &[u8]) -> bool {
        let Some(control) = self.controls.get(&conn) else {
            return false;
        };
        control.send_numbered(self.node, conn, seq, message).is_ok()
    }

    fn allocate(&mut self, _conn: ConnHandle, len: u64) -> Option<Memory> {
        let mem = &mut self.node.mem;
        let base = mem.alloc(usize::try_from(len).ok()?, 0);
        let ro_base = mem.alloc(app::READ_ONLY_LEN as usize, 0);
        // With several engine threads, shareable, so that a connection on
        // another thread can join it (only the threads using it lock it).
        if self.ledger.threads() > 1 {
            if let Some((data, read_only)) = mem.share(base).zip(mem.share(ro_base)) {
                self.ledger
                    .share_arenas(base, (self.thread, data, read_only));
            }
        }
        Some(Memory { base, len, ro_base })
    }

    fn free(&mut self, memory: &Memory) {
        self.ledger.forget_arenas(memory.base);
        self.node.mem.free(memory.base);
        self.node.mem.free(memory.ro_base);
    }

    fn attach(&mut self, memory: &Memory) {
        if !self.foreign(memory) {
            return;
        }
        if let Some((_, data, read_only)) = self.ledger.arenas(memory.base) {
            self.node.mem.attach(memory.base, &data);
            self.node.mem.attach(memory.ro_base, &read_only);
        }
    }

    fn detach(&mut self, memory: &Memory) {
        if self.foreign(memory) {
            self.node.mem.detach(memory.base);
            self.node.mem.detach(memory.ro_base);
        }
    }

    fn register(
        &mut self,
        conn: ConnHandle,
        _kind: KeyKind,
        base: u64,
        len: u64,
        access: Access,
    ) -> Registration {
        let Some(pd) = self.node.ep.pd(conn) else {
            return Registration::Refused;
        };
        let region = Region {
            base,
            len,
            access,
            pd,
        };
        match self.node.ep.register_region(region) {
            Ok(key) => Registration::Key(key),
            Err(_) => Registration::Refused,
        }
    }

    fn deregister(&mut self, key: u32) {
        let _ = self.node.ep.deregister_region(key);
    }

    fn check_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) -> Option<bool> {
        let check = |bytes: &[u8]| app::check_pattern(seed, index, bytes);
        self.node.mem.with(addr, len, check)
    }

    fn fill_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) {
        let fill = |bytes: &mut [u8]| app::fill_pattern(seed, index, bytes);
        self.node.mem.with_mut(addr, len, fill);
    }

    fn finished(&mut self, r: &Finished) {
        let node = &mut *self.node;
        let h = r.conn;
        let stats = node.ep.stats(h).unwrap_or_default();
        let suite = node.ep.protection(h).map_or_else(
            || "none".into(),
            |(s, k)| crate::protection::suite_name(s, k),
        );
        if let Some(control) = self.controls.remove(&h) {
            let _ = node.ep.deregister_region(control.key());
            node.mem.free(control.base());
        }
        let operation = match r.op {
            Some(Operation::Write) => "write",
            Some(Operation::Read) => "read",
            None => "none",
        };
        let closed = match r.end {
            End::Closed(reason) => format!("{reason:?}"),
            End::Failed(status) => format!("failed: {status:?}"),
        };
        self.finished.push(ServerReport {
            peer: crate::node::socket_of(r.peer).to_string(),
            thread: self.thread,
            slot: h.index,
            operation: operation.into(),
            message_size: r.size,
            verified: r.verified,
            corrupt: r.corrupt,
            bytes: r.bytes,
            packets_received: stats.packets_received,
            duplicates_received: stats.duplicates_received,
            ce_received: stats.ce_received,
            naks_sent: stats.naks_sent,
            endpoint_drops: node.ep.drops().total(),
            closed,
            integrity_ok: r.corrupt == 0,
            suite,
        });
    }

    fn release(&mut self, conn: ConnHandle) -> bool {
        matches!(
            self.node.ep.release(conn),
            Ok(()) | Err(CommandError::UnknownConnection)
        )
    }
}
