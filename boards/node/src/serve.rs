//! The serve role: the firmware side of `metaroce serve`, so host clients
//! and the compliance suite can reach the node's memory through the
//! harness's gateway. The application is `metaroce_app::serve`'s
//! [`Server`]; this module is its platform ([`ServeHost`]): like the
//! workload it plays a host application that reaches the engine only
//! through the host-interface rings and doorbells (`HostPort`) and its own
//! memory (`HostWindow`); connection arrivals and ends come from the node
//! ([`ServeNode`]), as they would from a host driver's event queue.
//!
//! It holds [`SERVE_CONNECTIONS`] connections, each in a protection domain
//! of its own, and keeps its books ([`LocalBooks`]) in fixed arrays:
//! connections per peer address (`peer_connections=` in the
//! configuration), bytes of regions per peer, and the `JOIN` tickets.
//!
//! Memory of the emulated host: slot `s` owns control buffers at a fixed
//! place (registered at boot in the slot's domain, so a new connection's
//! receives are posted before its first SEND can arrive) and a read-only
//! page; data regions come from one arena in power-of-two blocks
//! (`metaroce_core`'s buddy allocator). Registrations go through the admin
//! ring and are answered later ([`Registration::Pending`]).

use core::ops::{Deref, DerefMut};
use core::time::Duration;

use heapless::Deque;
use metaroce_app::serve::{
    Config, End, Finished, KeyKind, LocalBooks, Memory, Registration, ServeHost, Server, Slot,
};
use metaroce_app::{check_pattern, fill_pattern, Message, CONTROL_LEN, READ_ONLY_LEN, SLOTS};
use metaroce_core::api::{
    Access, ConnHandle, LocalBuf, Op, RecvRequest, Region, Status, WorkRequest,
};
use metaroce_core::storage::buddy::{order_for, Buddy, BuddyNode, Extent, MIN_SHIFT};
use metaroce_core::wire::CloseReason;
use metaroce_core::{CommandError, Event, Instant};
use metaroce_platform::dma::HostWindow;

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
/// Bytes of regions one peer address may hold: two of the largest.
const BYTES_PER_PEER: u64 = 2 * (MAX_SERVE_MESSAGE as u64 * SLOTS as u64 + READ_ONLY_LEN as u64);
/// Peer addresses tracked at once (more are refused).
const PEERS: usize = 256;
/// Protection domains of the slots: `DOMAIN_BASE | slot`.
const DOMAIN_BASE: u32 = 0x4000_0000;

const _: () = assert!((RECV_SLOTS + SEND_SLOTS) as u64 * CONTROL_LEN as u64 <= CONTROL_STRIDE);
const _: () = assert!(ARENA_NODES > 0 && SERVE_CONNECTIONS <= 1 << 16);

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

#[derive(Debug, Clone, Copy)]
enum AdminOp {
    Register(Region),
    Deregister(u32),
}

/// What the serve role keeps besides the application: rings, control
/// buffers' keys, the arena and the admin commands waiting for room.
struct Platform<'a> {
    port: Port<'a>,
    node: u8,
    /// Control-buffer keys per slot, registered at boot.
    control: [Option<u32>; SERVE_CONNECTIONS],
    arena: Buddy<ArenaNodes>,
    /// Admin commands waiting for room in the admin ring.
    admin: Deque<(u64, AdminOp), 256>,
}

/// The serve task.
pub struct Serve<'a> {
    platform: Platform<'a>,
    server: Server<[Slot; SERVE_CONNECTIONS], LocalBooks<SERVE_CONNECTIONS, PEERS>>,
    ip: core::net::Ipv4Addr,
    udp_port: u16,
    boot_posted: usize,
    controls_registered: usize,
    ready: bool,
    next_status: Instant,
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

fn tag(kind: u64, generation: u32, h: usize) -> u64 {
    kind | u64::from(generation) << 16 | h as u64
}

/// The application's view of the platform for one step.
struct Host<'p, 'a, 'w, N> {
    platform: &'p mut Platform<'a>,
    mem: &'p mut HostWindow<'w>,
    node: &'p mut N,
}

impl<N: ServeNode> Host<'_, '_, '_, N> {
    fn control_key(&self, conn: ConnHandle) -> Option<u32> {
        *self.platform.control.get(conn.index as usize)?
    }
}

impl<N: ServeNode> ServeHost for Host<'_, '_, '_, N> {
    fn open(&mut self, conn: ConnHandle) -> bool {
        let i = conn.index as usize;
        self.control_key(conn).is_some() && self.node.set_pd(conn, domain(i)).is_ok()
    }

    fn reject(&mut self, conn: ConnHandle) {
        let _ = self.node.close_with(conn, CloseReason::Rejected);
    }

    fn post_recv(&mut self, conn: ConnHandle, slot: u32) -> bool {
        let Some(key) = self.control_key(conn) else {
            return false;
        };
        let rr = RecvRequest {
            id: u64::from(slot),
            local: LocalBuf {
                key,
                addr: control_addr(conn.index as usize, slot),
                len: CONTROL_LEN,
            },
        };
        let port = &mut self.platform.port;
        port.recv_free() > 0 && port.post_recv(conn, rr).is_ok()
    }

    fn received(&mut self, conn: ConnHandle, slot: u32, len: u32) -> Option<Message> {
        let addr = control_addr(conn.index as usize, slot);
        let bytes = self.mem.slice(addr, len.min(CONTROL_LEN) as usize).ok()?;
        Message::decode(bytes)
    }

    fn post_send(&mut self, conn: ConnHandle, seq: u32, message: &[u8]) -> bool {
        let Some(key) = self.control_key(conn) else {
            return false;
        };
        if self.platform.port.send_free() == 0 {
            return false;
        }
        // The send slot is reused SEND_SLOTS messages later, long after
        // this one completed: the serve profile answers one message with
        // one message.
        let addr = control_addr(conn.index as usize, RECV_SLOTS + seq % SEND_SLOTS);
        match self.mem.slice_mut(addr, message.len()) {
            Ok(dst) => dst.copy_from_slice(message),
            Err(_) => return false,
        }
        let wr = WorkRequest {
            id: WR_SEND | u64::from(seq & 0xffff),
            op: Op::Send,
            local: LocalBuf {
                key,
                addr,
                len: message.len() as u32,
            },
        };
        self.platform.port.post_send(conn, wr).is_ok()
    }

    fn allocate(&mut self, conn: ConnHandle, len: u64) -> Option<Memory> {
        let units = len.div_ceil(ARENA_UNIT) as u32;
        let extent = self.platform.arena.allocate(order_for(units))?;
        let base = ARENA_BASE + extent.first_unit() as u64 * ARENA_UNIT;
        if let Ok(bytes) = self.mem.slice_mut(base, len as usize) {
            bytes.fill(0);
        }
        Some(Memory {
            base,
            len,
            ro_base: read_only_addr(conn.index as usize),
        })
    }

    fn free(&mut self, memory: &Memory) {
        // The block `allocate` took: where the region is, and its order.
        let first_unit = ((memory.base - ARENA_BASE) / ARENA_UNIT) as u32;
        let units = memory.len.div_ceil(ARENA_UNIT) as u32;
        let extent = Extent::from_parts(first_unit >> MIN_SHIFT, order_for(units));
        self.platform.arena.release(extent);
    }

    fn register(
        &mut self,
        conn: ConnHandle,
        kind: KeyKind,
        base: u64,
        len: u64,
        access: Access,
    ) -> Registration {
        let i = conn.index as usize;
        let kind = match kind {
            KeyKind::Data => TAG_DATA,
            KeyKind::ReadOnly => TAG_READ_ONLY,
        };
        let region = Region {
            base,
            len,
            access,
            pd: domain(i),
        };
        let t = tag(kind, conn.generation, i);
        match self
            .platform
            .admin
            .push_back((t, AdminOp::Register(region)))
        {
            Ok(()) => Registration::Pending,
            Err(_) => Registration::Refused,
        }
    }

    fn deregister(&mut self, key: u32) {
        self.platform.deregister(key);
    }

    fn check_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) -> Option<bool> {
        let bytes = self.mem.slice(addr, len).ok()?;
        Some(check_pattern(seed, index, bytes))
    }

    fn fill_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) {
        if let Ok(bytes) = self.mem.slice_mut(addr, len) {
            fill_pattern(seed, index, bytes);
        }
    }

    fn finished(&mut self, r: &Finished) {
        let how = match r.end {
            End::Closed(_) => "closed",
            End::Failed(_) => "failed",
        };
        println!(
            "METAROCE-SERVE node={} conn={} end={} size={} verified={} corrupt={} bytes={}",
            self.platform.node, r.conn.index, how, r.size, r.verified, r.corrupt, r.bytes
        );
    }

    fn release(&mut self, conn: ConnHandle) -> bool {
        !matches!(self.node.release(conn), Err(CommandError::NotDrained))
    }
}

impl Platform<'_> {
    fn deregister(&mut self, key: u32) {
        if self
            .admin
            .push_back((TAG_DEREGISTER, AdminOp::Deregister(key)))
            .is_err()
        {
            println!("METAROCE-WARN node={} deregistration dropped", self.node);
        }
    }
}

impl<'a> Serve<'a> {
    pub fn new(cfg: &NodeConfig, port: Port<'a>, now: Instant, seed: [u8; 32]) -> Self {
        let config = Config {
            max_message: MAX_SERVE_MESSAGE,
            recv_slots: RECV_SLOTS,
            failed_linger: Duration::from_secs(2),
        };
        Serve {
            platform: Platform {
                port,
                node: cfg.node,
                control: [None; SERVE_CONNECTIONS],
                arena: Buddy::new(ArenaNodes([BuddyNode::INIT; ARENA_NODES])),
                admin: Deque::new(),
            },
            server: Server::new(
                [Slot::free(); SERVE_CONNECTIONS],
                0,
                LocalBooks::new(cfg.peer_connections, BYTES_PER_PEER, seed),
                config,
            ),
            ip: cfg.ip,
            udp_port: cfg.port,
            boot_posted: 0,
            controls_registered: 0,
            ready: false,
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
        self.admin(mem, node);
        if !self.ready {
            return;
        }
        let mut host = Host {
            platform: &mut self.platform,
            mem,
            node,
        };
        while let Some(e) = host.node.poll_event() {
            self.server.on_event(&mut host, now, e);
        }
        let _ = host.platform.port.take_completion_doorbell();
        while let Some(c) = host.platform.port.poll_completion() {
            if c.status != Status::Success {
                defmt::warn!(
                    "serve: connection {=u32} wr {=u64:#x} {}: {}",
                    c.conn.index,
                    c.wr_id,
                    c.opcode,
                    c.status
                );
            }
            self.server.on_completion(&mut host, &c);
        }
        self.server
            .poll(&mut host, now, u64::from(metaroce_app::MAX_MESSAGE));
        if now >= self.next_status {
            self.next_status = now + Duration::from_secs(5);
            let open = self.server.open_connections();
            let c = self.server.counters();
            println!(
                "METAROCE-PROGRESS node={} phase=serve connections={} open={} refused_peer_connections={} refused_over_budget={} refused_bad_size={} refused_bad_ticket={}",
                self.platform.node, c.connections, open, c.refused_peer_connections, c.refused_over_budget,
                c.refused_bad_size + c.refused_second_announce, c.refused_bad_ticket
            );
        }
    }

    /// Pushes queued admin commands, takes their results.
    fn admin(&mut self, mem: &mut HostWindow<'_>, node: &mut impl ServeNode) {
        let p = &mut self.platform;
        // Boot: every slot's control buffers, in the slot's own domain.
        while self.boot_posted < SERVE_CONNECTIONS && p.admin.len() < p.admin.capacity() {
            let h = self.boot_posted;
            let region = Region {
                base: control_addr(h, 0),
                len: CONTROL_STRIDE,
                access: Access::LOCAL_WRITE,
                pd: domain(h),
            };
            let _ = p
                .admin
                .push_back((tag(TAG_CONTROL, 0, h), AdminOp::Register(region)));
            self.boot_posted += 1;
        }
        while let Some(&(t, op)) = p.admin.front() {
            let posted = match op {
                AdminOp::Register(region) => p.port.register_region(t, region),
                AdminOp::Deregister(key) => p.port.deregister_region(t, key),
            };
            if posted.is_err() {
                break;
            }
            p.admin.pop_front();
        }
        while let Some(r) = self.platform.port.poll_admin() {
            self.on_admin_result(mem, node, r.tag, r.result.ok());
        }
        if !self.ready && self.controls_registered == SERVE_CONNECTIONS {
            self.ready = true;
            let [a, b, c, d] = self.ip.octets();
            println!(
                "METAROCE-READY node={} role=serve ip={}.{}.{}.{} port={} connections={} max_message={}",
                self.platform.node,
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

    fn on_admin_result(
        &mut self,
        mem: &mut HostWindow<'_>,
        node: &mut impl ServeNode,
        t: u64,
        key: Option<u32>,
    ) {
        let h = (t & 0xffff) as usize;
        let generation = ((t >> 16) & 0xffff_ffff) as u32;
        let kind = match t & (0xff << 56) {
            TAG_DATA => KeyKind::Data,
            TAG_READ_ONLY => KeyKind::ReadOnly,
            TAG_CONTROL => {
                match key {
                    Some(k) if self.platform.control.get(h) == Some(&None) => {
                        self.platform.control[h] = Some(k);
                        self.controls_registered += 1;
                    }
                    _ => {
                        println!(
                            "METAROCE-ERROR node={} control buffers of slot {} not registered",
                            self.platform.node, h
                        );
                        crate::hw::exit(1)
                    }
                }
                return;
            }
            _ => return,
        };
        let mut host = Host {
            platform: &mut self.platform,
            mem,
            node,
        };
        let conn = ConnHandle {
            index: h as u32,
            generation,
        };
        self.server.registered(&mut host, conn, kind, key);
    }
}
