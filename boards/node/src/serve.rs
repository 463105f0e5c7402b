//! The serve role: the firmware side of `metaroce serve` (the protocol of
//! `metaroce_app`), so host clients and the compliance suite can reach the
//! node's memory through the harness's gateway. Like the workload it plays
//! a host application that reaches the engine only through the
//! host-interface rings and doorbells (`HostPort`) and its own memory
//! (`HostWindow`); connection arrivals and ends come from the node
//! ([`ServeNode`]), as they would from a host driver's event queue.
//!
//! It holds [`SERVE_CONNECTIONS`] connections, each in a protection domain
//! of its own (a key works only on the connection it was given to; a
//! second connection reaches a region by `JOIN`ing with the region's
//! random ticket), and budgets what each peer address may hold
//! (connections, `peer_connections=` in the configuration; bytes of
//! regions) and what all hold together; a request
//! over budget is refused on the wire (`CLOSE` with `REJECTED`, or `REGION`
//! with `REGION_OVER_BUDGET`) and counted, and everyone else is served on.
//!
//! Memory of the emulated host: slot `s` owns control buffers at a fixed
//! place (registered at boot in the slot's domain, so a new connection's
//! receives are posted before its first SEND can arrive) and a read-only
//! page; data regions come from one arena in power-of-two blocks
//! (`metaroce_core`'s buddy allocator) and are registered on `ANNOUNCE`,
//! deregistered when the connection ends, before its slot is released.

use core::ops::{Deref, DerefMut};
use core::time::Duration;

use heapless::index_map::{Entry, FnvIndexMap};
use heapless::Deque;
use metaroce_app::{
    self as app, check_pattern, fill_pattern, Encoded, Message, Operation, CONTROL_LEN,
    READ_ONLY_INDEX, READ_ONLY_LEN, SLOTS,
};
use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, PeerAddr, RecvRequest, Region, Status,
    WorkRequest,
};
use metaroce_core::rng::Rng;
use metaroce_core::storage::buddy::{order_for, Buddy, BuddyNode, Extent};
use metaroce_core::wire::CloseReason;
use metaroce_core::{CommandError, Event, Instant};
use metaroce_platform::dma::HostWindow;
use smoltcp::wire::IpAddress;

use crate::config::NodeConfig;
use crate::engine::NodeHostPort as Port;
use crate::println;
use crate::workload::{HOST_BASE, HOST_MEMORY_LEN};

/// Connections the serve (and host-interface) role holds at once: the
/// board's endpoint capacity.
pub const SERVE_CONNECTIONS: usize =
    <crate::hw::ThisBoard as metaroce_board::Board>::ENDPOINT.connections as usize;
/// Control receives kept posted per connection (WRITE_IMM completions
/// consume them too).
const RECV_SLOTS: u32 = 16;
/// Control send buffers per connection (rotating).
const SEND_SLOTS: u32 = 4;
/// Bytes of control buffers per connection slot.
const CONTROL_STRIDE: u64 = 2048;
const CONTROL_BASE: u64 = HOST_BASE;
/// The read-only pages, one per slot.
const READ_ONLY_BASE: u64 = CONTROL_BASE + CONTROL_STRIDE * SERVE_CONNECTIONS as u64;
/// The data arena: the rest of the emulated host memory, in blocks.
const ARENA_BASE: u64 = READ_ONLY_BASE + READ_ONLY_LEN as u64 * SERVE_CONNECTIONS as u64;
const ARENA_UNIT: u64 = 4096;
const ARENA_UNITS: u64 = (HOST_BASE + HOST_MEMORY_LEN as u64 - ARENA_BASE) / ARENA_UNIT;
const ARENA_NODES: usize = (ARENA_UNITS >> 4) as usize;
/// Largest message size a connection may announce ([`SLOTS`] of them).
pub const MAX_SERVE_MESSAGE: u32 = 128 * 1024;
/// Bytes of regions one peer address may hold.
const BYTES_PER_PEER: u64 = 16 << 20;
/// Peer addresses tracked at once (more are refused).
const PEERS: usize = 256;
/// How long a failed connection keeps answering with its fatal NAK
/// before its slot is released (at once when the table is 90 % full).
const FAILED_LINGER: Duration = Duration::from_secs(2);
/// Protection domains of the slots: `DOMAIN_BASE | slot`.
const DOMAIN_BASE: u32 = 0x4000_0000;

const _: () = assert!((RECV_SLOTS + SEND_SLOTS) as u64 * CONTROL_LEN as u64 <= CONTROL_STRIDE);
const _: () = assert!(ARENA_NODES > 0 && MAX_SERVE_MESSAGE as u64 * SLOTS as u64 <= 16 << 20);

/// Admin tags: kind in the top byte, generation and slot below.
const TAG_CONTROL: u64 = 1 << 56;
const TAG_DATA: u64 = 2 << 56;
const TAG_READ_ONLY: u64 = 3 << 56;
const TAG_DEREGISTER: u64 = 4 << 56;

/// Work-request ids of control sends (receives are their slot number).
const WR_SEND: u64 = 1 << 31;

/// What the serve role needs of the node around it.
pub trait ServeNode {
    /// The next connection event.
    fn poll_event(&mut self) -> Option<Event>;
    /// Gives an ended connection's slot back (once its completions were
    /// all taken: `NotDrained` until then).
    fn release(&mut self, h: ConnHandle) -> Result<(), CommandError>;
    /// Puts a new connection in protection domain `pd`.
    fn set_pd(&mut self, h: ConnHandle, pd: u32) -> Result<(), CommandError>;
    /// Closes a connection with `reason` (a refusal: `Rejected`).
    fn close_with(&mut self, h: ConnHandle, reason: CloseReason) -> Result<(), CommandError>;
}

/// The arena's allocator nodes, as the buddy allocator takes them.
struct ArenaNodes([BuddyNode; ARENA_NODES]);

impl Deref for ArenaNodes {
    type Target = [BuddyNode];
    fn deref(&self) -> &[BuddyNode] {
        &self.0
    }
}

impl DerefMut for ArenaNodes {
    fn deref_mut(&mut self) -> &mut [BuddyNode] {
        &mut self.0
    }
}

/// A region a connection has keys for.
#[derive(Debug, Clone, Copy, Default)]
struct Keys {
    data: Option<u32>,
    read_only: Option<u32>,
}

/// One connection slot's state.
#[derive(Debug, Clone, Copy, Default)]
struct Conn {
    active: bool,
    /// The connection's handle generation: completions and admin results
    /// of an earlier connection on the same slot are told apart by it.
    generation: u32,
    /// Ended, waiting for its deregistrations and its release (not
    /// before `release_at`).
    ending: bool,
    release_at: Instant,
    peer: Option<IpAddress>,
    /// Receive slots still to be posted (bit per slot).
    to_post: u32,
    next_send: u32,
    /// Messages waiting for room in the send ring (oldest first).
    outbox: [Option<Encoded>; 2],
    /// In the work list of [`Serve::step`].
    queued: bool,
    /// Its own region (from the arena) or, joined, the owner's slot.
    extent: Option<Extent>,
    joined: Option<usize>,
    /// The connections that joined this one's region (a list through
    /// `next_joiner`), whose keys go when the region does.
    first_joiner: Option<u16>,
    next_joiner: Option<u16>,
    keys: Keys,
    /// Registrations asked for and not answered yet.
    pending: u8,
    ticket: u64,
    op: Option<Operation>,
    seed: u64,
    size: u32,
    verified: u64,
    corrupt: u64,
    bytes: u64,
}

/// What one peer address holds.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    connections: u32,
    bytes: u64,
}

/// Refusals by reason (printed in the progress line).
#[derive(Debug, Clone, Copy, Default)]
struct Refusals {
    peer_connections: u64,
    over_budget: u64,
    bad_size: u64,
    bad_ticket: u64,
}

/// The serve task.
pub struct Serve<'a> {
    port: Port<'a>,
    node: u8,
    ip: core::net::Ipv4Addr,
    /// Connections one peer address may hold (`peer_connections=`).
    peer_connections: u32,
    udp_port: u16,
    /// Control-buffer keys per slot, registered at boot.
    control: [Option<u32>; SERVE_CONNECTIONS],
    boot_posted: usize,
    controls_registered: usize,
    ready: bool,
    conns: [Conn; SERVE_CONNECTIONS],
    /// Slots with something to do (receives or sends to post, a release
    /// to retry): the step visits these, never every slot.
    work: Deque<u16, SERVE_CONNECTIONS>,
    open: usize,
    arena: Buddy<ArenaNodes>,
    peers: FnvIndexMap<IpAddress, Usage, PEERS>,
    /// Admin commands waiting for room in the admin ring.
    admin: Deque<(u64, AdminOp), 256>,
    rng: Rng,
    connections: u64,
    refusals: Refusals,
    next_status: Instant,
}

#[derive(Debug, Clone, Copy)]
enum AdminOp {
    Register(Region),
    Deregister(u32),
}

fn control_addr(h: usize, slot: u32) -> u64 {
    CONTROL_BASE + h as u64 * CONTROL_STRIDE + u64::from(slot * CONTROL_LEN)
}

fn read_only_addr(h: usize) -> u64 {
    READ_ONLY_BASE + h as u64 * u64::from(READ_ONLY_LEN)
}

fn domain(h: usize) -> u32 {
    DOMAIN_BASE | h as u32
}

fn extent_addr(e: Extent) -> u64 {
    ARENA_BASE + e.first_unit() as u64 * ARENA_UNIT
}

fn tag(kind: u64, generation: u32, h: usize) -> u64 {
    kind | u64::from(generation) << 16 | h as u64
}

impl<'a> Serve<'a> {
    pub fn new(cfg: &NodeConfig, port: Port<'a>, now: Instant, seed: [u8; 32]) -> Self {
        Serve {
            port,
            node: cfg.node,
            ip: cfg.ip,
            peer_connections: cfg.peer_connections,
            udp_port: cfg.port,
            control: [None; SERVE_CONNECTIONS],
            boot_posted: 0,
            controls_registered: 0,
            ready: false,
            conns: [Conn::default(); SERVE_CONNECTIONS],
            work: Deque::new(),
            open: 0,
            arena: Buddy::new(ArenaNodes([BuddyNode::INIT; ARENA_NODES])),
            peers: FnvIndexMap::new(),
            admin: Deque::new(),
            rng: Rng::new(seed),
            connections: 0,
            refusals: Refusals::default(),
            next_status: now,
        }
    }

    /// When the task next needs to run even without completions.
    pub fn next_wake(&self) -> Instant {
        self.next_status
    }

    /// One step: registrations, connection arrivals and ends, completions,
    /// queued posts.
    pub fn step(&mut self, now: Instant, mem: &mut HostWindow<'_>, node: &mut impl ServeNode) {
        self.admin(mem);
        if !self.ready {
            return;
        }
        while let Some(e) = node.poll_event() {
            match e {
                Event::Incoming { conn, peer } => self.adopt(conn, peer, node),
                Event::Closed { conn, .. } => self.finish(conn, "closed", now),
                Event::Failed { conn, .. } => {
                    // A failed connection stays a while to answer the
                    // peer's later packets with its fatal NAK (spec 4.7.2),
                    // unless room is short.
                    let crowded = self.open * 10 >= SERVE_CONNECTIONS * 9;
                    let at = if crowded { now } else { now + FAILED_LINGER };
                    self.finish(conn, "failed", at);
                }
                Event::Connected(_) => {}
            }
        }
        let _ = self.port.take_completion_doorbell();
        while let Some(c) = self.port.poll_completion() {
            self.on_completion(mem, &c);
        }
        for _ in 0..self.work.len() {
            let Some(h) = self.work.pop_front().map(usize::from) else {
                break;
            };
            self.conns[h].queued = false;
            if self.conns[h].active {
                self.flush(mem, h);
            } else if self.conns[h].ending {
                let handle = ConnHandle {
                    index: h as u32,
                    generation: self.conns[h].generation,
                };
                // Released once its registrations were answered and its
                // last completions taken.
                if self.conns[h].pending == 0
                    && now >= self.conns[h].release_at
                    && !matches!(node.release(handle), Err(CommandError::NotDrained))
                {
                    self.conns[h].ending = false;
                } else {
                    self.mark(h);
                }
            }
        }
        if now >= self.next_status {
            self.next_status = now + Duration::from_secs(5);
            let open = self.open;
            let r = self.refusals;
            println!(
                "METAROCE-PROGRESS node={} phase=serve connections={} open={} refused_peer_connections={} refused_over_budget={} refused_bad_size={} refused_bad_ticket={}",
                self.node, self.connections, open, r.peer_connections, r.over_budget, r.bad_size, r.bad_ticket
            );
        }
    }

    /// Pushes queued admin commands, takes their results.
    fn admin(&mut self, mem: &mut HostWindow<'_>) {
        // Boot: every slot's control buffers, in the slot's own domain.
        while self.boot_posted < SERVE_CONNECTIONS && self.admin.len() < self.admin.capacity() {
            let h = self.boot_posted;
            let region = Region {
                base: control_addr(h, 0),
                len: CONTROL_STRIDE,
                access: Access::LOCAL_WRITE,
                pd: domain(h),
            };
            let _ = self
                .admin
                .push_back((tag(TAG_CONTROL, 0, h), AdminOp::Register(region)));
            self.boot_posted += 1;
        }
        while let Some(&(t, op)) = self.admin.front() {
            let posted = match op {
                AdminOp::Register(region) => self.port.register_region(t, region),
                AdminOp::Deregister(key) => self.port.deregister_region(t, key),
            };
            if posted.is_err() {
                break;
            }
            self.admin.pop_front();
        }
        while let Some(r) = self.port.poll_admin() {
            self.on_admin_result(mem, r.tag, r.result.ok());
        }
        if !self.ready && self.controls_registered == SERVE_CONNECTIONS {
            self.ready = true;
            let [a, b, c, d] = self.ip.octets();
            println!(
                "METAROCE-READY node={} role=serve ip={}.{}.{}.{} port={} connections={} max_message={}",
                self.node,
                a,
                b,
                c,
                d,
                // As a u32: the console then formats no 16-bit integers.
                u32::from(self.udp_port),
                SERVE_CONNECTIONS,
                MAX_SERVE_MESSAGE
            );
        }
    }

    fn deregister(&mut self, key: u32) {
        if self
            .admin
            .push_back((TAG_DEREGISTER, AdminOp::Deregister(key)))
            .is_err()
        {
            println!("METAROCE-WARN node={} deregistration dropped", self.node);
        }
    }

    fn on_admin_result(&mut self, mem: &mut HostWindow<'_>, t: u64, key: Option<u32>) {
        let kind = t & (0xff << 56);
        let h = (t & 0xffff) as usize;
        let generation = ((t >> 16) & 0xffff_ffff) as u32;
        if kind == TAG_DEREGISTER || h >= SERVE_CONNECTIONS {
            return;
        }
        if kind == TAG_CONTROL {
            match key {
                Some(k) if self.control[h].is_none() => {
                    self.control[h] = Some(k);
                    self.controls_registered += 1;
                }
                _ => {
                    println!(
                        "METAROCE-ERROR node={} control buffers of slot {} not registered",
                        self.node, h
                    );
                    crate::hw::exit(1)
                }
            }
            return;
        }
        let conn = &mut self.conns[h];
        let current = conn.active && conn.generation == generation;
        if !current {
            // The connection ended meanwhile: the key goes at once.
            if conn.generation == generation {
                conn.pending = conn.pending.saturating_sub(1);
            }
            if let Some(k) = key {
                self.deregister(k);
            }
            self.mark(h);
            return;
        }
        conn.pending = conn.pending.saturating_sub(1);
        match kind {
            TAG_DATA => conn.keys.data = key,
            TAG_READ_ONLY => conn.keys.read_only = key,
            _ => {}
        }
        if conn.pending == 0 {
            self.answer_region(mem, h);
        }
    }

    /// What `peer`, if known, holds now.
    fn usage_of(&mut self, peer: Option<IpAddress>) -> Option<&mut Usage> {
        self.peers.get_mut(&peer?)
    }

    fn usage(&mut self, ip: IpAddress) -> Option<&mut Usage> {
        // One probe of the map: the entry, made if missing (`None` when
        // the map is full).
        match self.peers.entry(ip) {
            Entry::Occupied(o) => Some(o.into_mut()),
            Entry::Vacant(v) => v.insert(Usage::default()).ok(),
        }
    }

    /// A new connection (its `Incoming` event comes before its first data,
    /// so its receives are posted in time): within its address's budget,
    /// it gets its slot's domain and receives; otherwise it is refused.
    fn adopt(&mut self, h: ConnHandle, peer: PeerAddr, node: &mut impl ServeNode) {
        let i = h.index as usize;
        let limit = self.peer_connections;
        let within = self
            .usage(peer.ip)
            .filter(|u| u.connections < limit)
            .map(|u| u.connections += 1)
            .is_some();
        if i >= SERVE_CONNECTIONS || !within || node.set_pd(h, domain(i)).is_err() {
            self.refusals.peer_connections += 1;
            let _ = node.close_with(h, CloseReason::Rejected);
            return;
        }
        self.conns[i] = Conn {
            active: true,
            generation: h.generation,
            peer: Some(peer.ip),
            to_post: (1 << RECV_SLOTS) - 1,
            ..Conn::default()
        };
        self.connections += 1;
        self.open += 1;
        self.mark(i);
        defmt::debug!(
            "serve: connection {=u32} from port {=u16} adopted",
            h.index,
            peer.port
        );
    }

    fn finish(&mut self, h: ConnHandle, how: &str, release_at: Instant) {
        let i = h.index as usize;
        let Some(conn) = self
            .conns
            .get(i)
            .copied()
            .filter(|c| c.active && c.generation == h.generation)
        else {
            return;
        };
        println!(
            "METAROCE-SERVE node={} conn={} end={} size={} verified={} corrupt={} bytes={}",
            self.node, i, how, conn.size, conn.verified, conn.corrupt, conn.bytes
        );
        self.drop_region(i);
        // One probe of the map: the peer's usage shrinks, and goes once
        // nothing is left.
        if let Some(Entry::Occupied(mut entry)) = conn.peer.map(|ip| self.peers.entry(ip)) {
            let u = entry.get_mut();
            u.connections = u.connections.saturating_sub(1);
            if let Some(e) = conn.extent {
                u.bytes = u.bytes.saturating_sub(u64::from(e.units()) * ARENA_UNIT);
            }
            if u.connections == 0 && u.bytes == 0 {
                entry.swap_remove();
            }
        }
        let c = &mut self.conns[i];
        c.active = false;
        c.ending = true;
        c.release_at = release_at;
        self.open -= 1;
        self.mark(i);
    }

    /// Puts slot `h` on the work list (once).
    fn mark(&mut self, h: usize) {
        if !self.conns[h].queued {
            self.conns[h].queued = true;
            // Room for every slot: a slot is on the list at most once.
            let _ = self.work.push_back(h as u16);
        }
    }

    /// Gives up slot `i`'s keys and, if it owns one, its arena block, and
    /// the keys of every connection that joined it (nothing may reach the
    /// memory once it is free); a joiner leaves its owner's list.
    fn drop_region(&mut self, i: usize) {
        let keys = core::mem::take(&mut self.conns[i].keys);
        for k in [keys.data, keys.read_only].into_iter().flatten() {
            self.deregister(k);
        }
        if let Some(o) = self.conns[i].joined.take() {
            self.unlink_joiner(o, i);
        }
        if let Some(e) = self.conns[i].extent.take() {
            self.arena.release(e);
            let mut next = self.conns[i].first_joiner.take();
            while let Some(j) = next.map(usize::from) {
                next = self.conns[j].next_joiner.take();
                self.conns[j].joined = None;
                let keys = core::mem::take(&mut self.conns[j].keys);
                for k in [keys.data, keys.read_only].into_iter().flatten() {
                    self.deregister(k);
                }
            }
        }
    }

    /// Takes joiner `j` out of owner `o`'s list (a walk over `o`'s joiners
    /// only).
    fn unlink_joiner(&mut self, o: usize, j: usize) {
        let after = self.conns[j].next_joiner.take();
        if self.conns[o].first_joiner == Some(j as u16) {
            self.conns[o].first_joiner = after;
            return;
        }
        let mut at = self.conns[o].first_joiner;
        while let Some(k) = at.map(usize::from) {
            if self.conns[k].next_joiner == Some(j as u16) {
                self.conns[k].next_joiner = after;
                return;
            }
            at = self.conns[k].next_joiner;
        }
    }

    fn on_completion(&mut self, mem: &mut HostWindow<'_>, c: &Completion) {
        let h = c.conn.index as usize;
        let Some(conn) = self.conns.get(h) else {
            return;
        };
        if !conn.active || c.conn.generation != conn.generation {
            return;
        }
        let slot = (c.wr_id & 0xffff) as u32;
        let is_send = c.wr_id & WR_SEND != 0;
        if c.status != Status::Success {
            defmt::warn!(
                "serve: connection {=usize} wr {=u64:#x} {}: {}",
                h,
                c.wr_id,
                c.opcode,
                c.status
            );
        }
        if is_send || c.status != Status::Success {
            return;
        }
        match c.opcode {
            Opcode::Recv => {
                let msg = mem
                    .slice(control_addr(h, slot), c.byte_len.min(CONTROL_LEN) as usize)
                    .ok()
                    .and_then(Message::decode);
                self.conns[h].to_post |= 1 << slot;
                self.mark(h);
                match msg {
                    Some(Message::Announce { op, seed, size }) => {
                        self.on_announce(mem, h, op, seed, size);
                    }
                    Some(Message::Join { ticket }) => self.on_join(mem, h, ticket),
                    Some(Message::Done { .. }) => {
                        let conn = &self.conns[h];
                        let report = Message::Report {
                            verified: conn.verified,
                            corrupt: conn.corrupt,
                            bytes: conn.bytes,
                        };
                        self.queue_send(mem, h, report.encode());
                    }
                    _ => {}
                }
            }
            Opcode::RecvWriteImm => {
                self.conns[h].to_post |= 1 << slot;
                self.mark(h);
                let (Some(base), Some(index)) = (self.data_addr(h), c.imm) else {
                    return;
                };
                let conn = &mut self.conns[h];
                if conn.size == 0 {
                    return;
                }
                let size = conn.size as usize;
                let at = base + u64::from(index % SLOTS) * u64::from(conn.size);
                conn.bytes += size as u64;
                match mem.slice(at, size) {
                    Ok(data) if check_pattern(conn.seed, u64::from(index), data) => {
                        conn.verified += 1;
                    }
                    _ => conn.corrupt += 1,
                }
            }
            _ => {}
        }
    }

    /// Where slot `h`'s data region starts: its own block or its owner's.
    fn data_addr(&self, h: usize) -> Option<u64> {
        let owner = self.conns[h].joined.unwrap_or(h);
        self.conns[owner].extent.map(extent_addr)
    }

    fn refuse(&mut self, mem: &mut HostWindow<'_>, h: usize, status: u32) {
        self.queue_send(mem, h, Message::region_refused(status).encode());
    }

    fn register(&mut self, kind: u64, h: usize, region: Region) -> bool {
        let t = tag(kind, self.conns[h].generation, h);
        if self
            .admin
            .push_back((t, AdminOp::Register(region)))
            .is_err()
        {
            return false;
        }
        self.conns[h].pending += 1;
        true
    }

    fn on_announce(
        &mut self,
        mem: &mut HostWindow<'_>,
        h: usize,
        op: Operation,
        seed: u64,
        size: u32,
    ) {
        let conn = self.conns[h];
        if size == 0 || size > MAX_SERVE_MESSAGE || conn.extent.is_some() || conn.joined.is_some() {
            self.refusals.bad_size += 1;
            self.refuse(mem, h, app::REGION_BAD_SIZE);
            return;
        }
        let len = u64::from(size) * u64::from(SLOTS);
        let units = len.div_ceil(ARENA_UNIT) as u32;
        let bytes = u64::from(units.next_power_of_two().max(16)) * ARENA_UNIT;
        let within = self
            .usage_of(conn.peer)
            .is_some_and(|u| u.bytes + bytes <= BYTES_PER_PEER);
        let extent = within
            .then(|| self.arena.allocate(order_for(units)))
            .flatten();
        let Some(extent) = extent else {
            self.refusals.over_budget += 1;
            self.refuse(mem, h, app::REGION_OVER_BUDGET);
            return;
        };
        if let Some(u) = self.usage_of(conn.peer) {
            u.bytes += u64::from(extent.units()) * ARENA_UNIT;
        }
        let base = extent_addr(extent);
        if let Ok(bytes) = mem.slice_mut(base, len as usize) {
            if op == Operation::Read {
                for (j, slot) in bytes.chunks_mut(size as usize).enumerate() {
                    fill_pattern(seed, j as u64, slot);
                }
            } else {
                bytes.fill(0);
            }
        }
        if let Ok(ro) = mem.slice_mut(read_only_addr(h), READ_ONLY_LEN as usize) {
            fill_pattern(seed, READ_ONLY_INDEX, ro);
        }
        // The ticket names its slot in the low 16 bits (a JOIN finds the
        // region without a search); the 48 bits above are random.
        let ticket = loop {
            let t = (self.rng.next_u64() & !0xffff) | h as u64;
            if t >> 16 != 0 {
                break t;
            }
        };
        let c = &mut self.conns[h];
        c.extent = Some(extent);
        c.op = Some(op);
        c.seed = seed;
        c.size = size;
        c.ticket = ticket;
        self.register_region_of(mem, h, h);
    }

    /// Registers owner `o`'s data region and read-only page in `h`'s
    /// domain; the `REGION` answer follows when both keys are back.
    fn register_region_of(&mut self, mem: &mut HostWindow<'_>, h: usize, o: usize) {
        let Some(e) = self.conns[o].extent else {
            self.refuse(mem, h, app::REGION_NO_TICKET);
            return;
        };
        let len = u64::from(self.conns[o].size) * u64::from(SLOTS);
        let data = Region {
            base: extent_addr(e),
            len,
            access: Access::ALL,
            pd: domain(h),
        };
        let read_only = Region {
            base: read_only_addr(o),
            len: u64::from(READ_ONLY_LEN),
            access: Access::REMOTE_READ,
            pd: domain(h),
        };
        if !(self.register(TAG_DATA, h, data) && self.register(TAG_READ_ONLY, h, read_only)) {
            self.refusals.over_budget += 1;
            self.refuse(mem, h, app::REGION_OVER_BUDGET);
        }
    }

    /// `JOIN`: keys on slot `h` for the region the ticket names.
    fn on_join(&mut self, mem: &mut HostWindow<'_>, h: usize, ticket: u64) {
        let o = (ticket & 0xffff) as usize;
        let owner = self.conns.get(o).and_then(|c| {
            (ticket >> 16 != 0 && c.active && c.ticket == ticket && c.extent.is_some()).then_some(o)
        });
        let conn = self.conns[h];
        let Some(o) = owner.filter(|_| conn.extent.is_none() && conn.joined.is_none()) else {
            self.refusals.bad_ticket += 1;
            self.refuse(mem, h, app::REGION_NO_TICKET);
            return;
        };
        let (op, seed, size) = (self.conns[o].op, self.conns[o].seed, self.conns[o].size);
        let first = self.conns[o].first_joiner.replace(h as u16);
        let c = &mut self.conns[h];
        c.next_joiner = first;
        c.joined = Some(o);
        c.op = op;
        c.seed = seed;
        c.size = size;
        self.register_region_of(mem, h, o);
    }

    /// Answers slot `h`'s announcement or join once its keys are back.
    fn answer_region(&mut self, mem: &mut HostWindow<'_>, h: usize) {
        let c = self.conns[h];
        let owner = c.joined.unwrap_or(h);
        let (Some(key), Some(ro_key), Some(e)) =
            (c.keys.data, c.keys.read_only, self.conns[owner].extent)
        else {
            self.refusals.over_budget += 1;
            self.refuse(mem, h, app::REGION_OVER_BUDGET);
            return;
        };
        let answer = Message::Region {
            status: app::REGION_OK,
            key,
            addr: extent_addr(e),
            len: u64::from(c.size) * u64::from(SLOTS),
            slots: SLOTS,
            ro_key,
            ro_addr: read_only_addr(owner),
            ticket: if c.joined.is_some() { 0 } else { c.ticket },
        };
        self.queue_send(mem, h, answer.encode());
    }

    fn queue_send(&mut self, mem: &mut HostWindow<'_>, h: usize, msg: Encoded) {
        let conn = &mut self.conns[h];
        if let Some(free) = conn.outbox.iter_mut().find(|m| m.is_none()) {
            *free = Some(msg);
        } else {
            println!(
                "METAROCE-WARN node={} conn={} control message dropped",
                self.node, h
            );
        }
        self.flush(mem, h);
    }

    /// Posts what slot `h` has waiting: receives, then control sends.
    fn flush(&mut self, mem: &mut HostWindow<'_>, h: usize) {
        let Some(key) = self.control[h] else { return };
        let conn = self.conns[h];
        if !conn.active {
            return;
        }
        let handle = ConnHandle {
            index: h as u32,
            generation: conn.generation,
        };
        let mut to_post = conn.to_post;
        while to_post != 0 && self.port.recv_free() > 0 {
            let slot = to_post.trailing_zeros();
            let rr = RecvRequest {
                id: u64::from(slot),
                local: LocalBuf {
                    key,
                    addr: control_addr(h, slot),
                    len: CONTROL_LEN,
                },
            };
            if self.port.post_recv(handle, rr).is_err() {
                break;
            }
            to_post &= !(1 << slot);
        }
        self.conns[h].to_post = to_post;
        while let Some(msg) = self.conns[h].outbox[0] {
            if self.port.send_free() == 0 {
                break;
            }
            let n = self.conns[h].next_send;
            let slot = RECV_SLOTS + n % SEND_SLOTS;
            let addr = control_addr(h, slot);
            // The send slot is reused SEND_SLOTS messages later, long after
            // this one completed: the serve profile answers one message
            // with one message.
            match mem.slice_mut(addr, msg.len()) {
                Ok(dst) => dst.copy_from_slice(&msg),
                Err(_) => break,
            }
            let wr = WorkRequest {
                id: WR_SEND | u64::from(n & 0xffff),
                op: Op::Send,
                local: LocalBuf {
                    key,
                    addr,
                    len: msg.len() as u32,
                },
            };
            if self.port.post_send(handle, wr).is_err() {
                break;
            }
            let conn = &mut self.conns[h];
            conn.next_send = n.wrapping_add(1);
            conn.outbox[0] = conn.outbox[1].take();
        }
        // What did not fit the rings is tried again next step.
        if self.conns[h].to_post != 0 || self.conns[h].outbox[0].is_some() {
            self.mark(h);
        }
    }
}
