//! The serve role: the firmware side of `metaroce serve` (the protocol of
//! `metaroce_app`), so host clients and the compliance suite can reach the
//! node's memory through the harness's gateway. Like the workload it plays
//! a host application that reaches the engine only through the
//! host-interface rings and doorbells (`HostPort`) and its own memory
//! (`HostWindow`); connection arrivals and ends come from the node
//! ([`ServeNode`]), as they would from a host driver's event queue.
//!
//! For each connection it keeps [`RECV_SLOTS`] control receives posted,
//! answers `ANNOUNCE` with a region of [`SLOTS`] slots (pre-filled with the
//! pattern for reads) plus a small read-only region, verifies each
//! WRITE_IMM's slot against the pattern on its receive completion, and
//! answers `DONE` with `REPORT`. It runs until the harness stops QEMU.
//!
//! Memory: connection slot `h` of the endpoint owns a fixed part of the
//! emulated host memory (control buffers, a read-only page, a data pool).
//! The admin queue only registers regions, so regions are registered once
//! per (slot, message size) and reused by the next connection on that slot
//! (refilled on its announcement); a changed size registers a new region
//! and leaves the old registration behind, until the region table is full
//! and further sizes are refused (`REGION_BAD_SIZE`).

use core::time::Duration;

use metaroce_app::{
    self as app, check_pattern, fill_pattern, Encoded, Message, Operation, CONTROL_LEN,
    READ_ONLY_INDEX, READ_ONLY_LEN, SLOTS,
};
use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, PeerAddr, RecvRequest, Region, Status,
    WorkRequest,
};
use metaroce_core::{CommandError, Event, Instant};
use metaroce_platform::dma::HostWindow;

use crate::config::NodeConfig;
use crate::println;
use crate::workload::{Port, HOST_BASE, HOST_MEMORY_LEN};

/// Connection slots of the serve endpoint.
pub const SERVE_CONNECTIONS: usize = 8;
/// Control receives kept posted per connection.
const RECV_SLOTS: u32 = 32;
/// Control send buffers per connection (rotating).
const SEND_SLOTS: u32 = 4;
/// Bytes of control buffers per connection slot.
const CONTROL_STRIDE: u64 = 4096;
/// The control buffers of every slot: one local-write region.
const CONTROL_BASE: u64 = HOST_BASE;
const CONTROL_LEN_ALL: u64 = 64 * 1024;
/// The read-only pages, one per slot.
const READ_ONLY_BASE: u64 = CONTROL_BASE + CONTROL_LEN_ALL;
/// The data pools, one per slot.
const POOL_BASE: u64 = HOST_BASE + (1 << 20);
const POOL_LEN: u64 = 3 << 20;
/// Largest message size a connection may announce: [`SLOTS`] of them fill
/// its pool.
pub const MAX_SERVE_MESSAGE: u32 = (POOL_LEN / SLOTS as u64) as u32;

const _: () =
    assert!(POOL_BASE + POOL_LEN * SERVE_CONNECTIONS as u64 <= HOST_BASE + HOST_MEMORY_LEN as u64);
const _: () =
    assert!(READ_ONLY_BASE + READ_ONLY_LEN as u64 * SERVE_CONNECTIONS as u64 <= POOL_BASE);
const _: () = assert!(
    (RECV_SLOTS + SEND_SLOTS) as u64 * CONTROL_LEN as u64 <= CONTROL_STRIDE
        && CONTROL_STRIDE * SERVE_CONNECTIONS as u64 <= CONTROL_LEN_ALL
);

/// Admin tags: the boot registrations, and data regions (slot, size).
const TAG_CONTROL: u64 = 1;
const TAG_READ_ONLY: u64 = 0x100;
const TAG_DATA: u64 = 1 << 56;

/// Work-request ids of control sends (receives are their slot number).
const WR_SEND: u64 = 1 << 31;

/// What the serve role needs of the node around it.
pub trait ServeNode {
    /// The next connection event.
    fn poll_event(&mut self) -> Option<Event>;
    /// Gives an ended connection's slot back (once its completions were
    /// all taken: `NotDrained` until then).
    fn release(&mut self, h: ConnHandle) -> Result<(), CommandError>;
}

/// One connection slot's state.
#[derive(Debug, Clone, Copy, Default)]
struct Conn {
    active: bool,
    /// The connection's handle generation: completions of an earlier
    /// connection on the same slot are told apart by it.
    generation: u32,
    /// Ended, waiting to be released.
    ending: bool,
    /// Receive slots still to be posted (bit per slot).
    to_post: u32,
    next_send: u32,
    /// Messages waiting for room in the send ring (oldest first).
    outbox: [Option<Encoded>; 2],
    announced: bool,
    /// Announced, waiting for the data region's registration.
    awaiting: Option<(Operation, u64, u32)>,
    seed: u64,
    size: u32,
    verified: u64,
    corrupt: u64,
    bytes: u64,
}

/// The serve task.
pub struct Serve<'a> {
    port: Port<'a>,
    node: u8,
    ip: core::net::Ipv4Addr,
    udp_port: u16,
    control_key: Option<u32>,
    read_only_keys: [Option<u32>; SERVE_CONNECTIONS],
    /// Registered data region per slot: (message size, key).
    data: [Option<(u32, u32)>; SERVE_CONNECTIONS],
    /// Data registrations in flight, per slot: the size.
    data_pending: [Option<u32>; SERVE_CONNECTIONS],
    /// Boot registrations posted so far (control, then the read-only pages).
    boot_posted: usize,
    ready: bool,
    conns: [Conn; SERVE_CONNECTIONS],
    connections: u64,
    next_status: Instant,
}

fn control_addr(h: usize, slot: u32) -> u64 {
    CONTROL_BASE + h as u64 * CONTROL_STRIDE + u64::from(slot * CONTROL_LEN)
}

fn read_only_addr(h: usize) -> u64 {
    READ_ONLY_BASE + h as u64 * u64::from(READ_ONLY_LEN)
}

fn pool_addr(h: usize) -> u64 {
    POOL_BASE + h as u64 * POOL_LEN
}

impl<'a> Serve<'a> {
    pub fn new(cfg: &NodeConfig, port: Port<'a>, now: Instant) -> Self {
        Serve {
            port,
            node: cfg.node,
            ip: cfg.ip,
            udp_port: cfg.port,
            control_key: None,
            read_only_keys: [None; SERVE_CONNECTIONS],
            data: [None; SERVE_CONNECTIONS],
            data_pending: [None; SERVE_CONNECTIONS],
            boot_posted: 0,
            ready: false,
            conns: [Conn::default(); SERVE_CONNECTIONS],
            connections: 0,
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
                Event::Incoming { conn, peer } => self.adopt(conn, peer),
                Event::Closed { conn, .. } => self.finish(conn, "closed"),
                Event::Failed { conn, .. } => self.finish(conn, "failed"),
                Event::Connected(_) => {}
            }
        }
        let _ = self.port.take_completion_doorbell();
        while let Some(c) = self.port.poll_completion() {
            self.on_completion(mem, &c);
        }
        for h in 0..SERVE_CONNECTIONS {
            self.flush(mem, h);
            if self.conns[h].ending {
                let handle = ConnHandle {
                    index: h as u32,
                    generation: self.conns[h].generation,
                };
                // Released once its last completions were taken.
                if !matches!(node.release(handle), Err(CommandError::NotDrained)) {
                    self.conns[h].ending = false;
                }
            }
        }
        if now >= self.next_status {
            self.next_status = now + Duration::from_secs(5);
            let open = self.conns.iter().filter(|c| c.active).count();
            println!(
                "METAROCE-PROGRESS node={} phase=serve connections={} open={}",
                self.node, self.connections, open
            );
        }
    }

    /// Boot registrations and data-region registrations.
    fn admin(&mut self, mem: &mut HostWindow<'_>) {
        while self.boot_posted <= SERVE_CONNECTIONS {
            let (tag, region) = if self.boot_posted == 0 {
                (
                    TAG_CONTROL,
                    Region {
                        base: CONTROL_BASE,
                        len: CONTROL_LEN_ALL,
                        access: Access::LOCAL_WRITE,
                        pd: 0,
                    },
                )
            } else {
                let h = self.boot_posted - 1;
                (
                    TAG_READ_ONLY + h as u64,
                    Region {
                        base: read_only_addr(h),
                        len: u64::from(READ_ONLY_LEN),
                        access: Access::REMOTE_READ,
                        pd: 0,
                    },
                )
            };
            if self.port.register_region(tag, region).is_err() {
                break;
            }
            self.boot_posted += 1;
        }
        while let Some(r) = self.port.poll_admin() {
            let key = r.result.ok();
            if r.tag == TAG_CONTROL {
                self.control_key = key;
            } else if (TAG_READ_ONLY..TAG_READ_ONLY + SERVE_CONNECTIONS as u64).contains(&r.tag) {
                self.read_only_keys[(r.tag - TAG_READ_ONLY) as usize] = key;
            } else if r.tag & TAG_DATA != 0 {
                let h = ((r.tag >> 32) & 0xff) as usize;
                let size = r.tag as u32;
                if h < SERVE_CONNECTIONS {
                    self.data_pending[h] = None;
                    if let Some(key) = key {
                        self.data[h] = Some((size, key));
                    }
                    self.resume_announce(mem, h);
                }
            }
            if r.result.is_err() {
                println!(
                    "METAROCE-WARN node={} registration {:#x} refused",
                    self.node, r.tag
                );
            }
        }
        if !self.ready
            && self.control_key.is_some()
            && self.read_only_keys.iter().all(Option::is_some)
        {
            self.ready = true;
            println!(
                "METAROCE-READY node={} role=serve ip={} port={} connections={} max_message={}",
                self.node, self.ip, self.udp_port, SERVE_CONNECTIONS, MAX_SERVE_MESSAGE
            );
        }
    }

    /// A new connection (its `Incoming` event comes before its first data,
    /// so its receives are posted in time).
    fn adopt(&mut self, h: ConnHandle, peer: PeerAddr) {
        let i = h.index as usize;
        let Some(conn) = self.conns.get_mut(i) else {
            return;
        };
        *conn = Conn {
            active: true,
            generation: h.generation,
            to_post: if RECV_SLOTS >= 32 {
                u32::MAX
            } else {
                (1 << RECV_SLOTS) - 1
            },
            ..Conn::default()
        };
        self.connections += 1;
        defmt::info!("serve: connection {=u32} from {} adopted", h.index, peer);
    }

    fn finish(&mut self, h: ConnHandle, how: &str) {
        let i = h.index as usize;
        let Some(conn) = self
            .conns
            .get_mut(i)
            .filter(|c| c.active && c.generation == h.generation)
        else {
            return;
        };
        conn.active = false;
        conn.ending = true;
        conn.awaiting = None;
        let (verified, corrupt, bytes, size) = (conn.verified, conn.corrupt, conn.bytes, conn.size);
        println!(
            "METAROCE-SERVE node={} conn={} end={} size={} verified={} corrupt={} bytes={}",
            self.node, i, how, size, verified, corrupt, bytes
        );
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
                match msg {
                    Some(Message::Announce { op, seed, size }) => {
                        self.on_announce(mem, h, op, seed, size);
                    }
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
                let (Some((rsize, _)), Some(index)) = (self.data[h], c.imm) else {
                    return;
                };
                let conn = &mut self.conns[h];
                if !conn.announced || rsize != conn.size {
                    return;
                }
                let size = conn.size as usize;
                let at = pool_addr(h) + u64::from(index % SLOTS) * u64::from(conn.size);
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

    fn region_refused(&mut self, mem: &mut HostWindow<'_>, h: usize) {
        let refusal = Message::region_refused(app::REGION_BAD_SIZE);
        self.queue_send(mem, h, refusal.encode());
    }

    fn on_announce(
        &mut self,
        mem: &mut HostWindow<'_>,
        h: usize,
        op: Operation,
        seed: u64,
        size: u32,
    ) {
        if size == 0 || size > MAX_SERVE_MESSAGE || self.conns[h].announced {
            self.region_refused(mem, h);
            return;
        }
        self.conns[h].announced = true;
        self.conns[h].awaiting = Some((op, seed, size));
        if self.data[h].is_some_and(|(s, _)| s == size) {
            self.resume_announce(mem, h);
            return;
        }
        if self.data_pending[h].is_some() {
            // The answer to that registration resumes this announcement.
            return;
        }
        let region = Region {
            base: pool_addr(h),
            len: u64::from(size) * u64::from(SLOTS),
            access: Access::ALL,
            pd: 0,
        };
        let tag = TAG_DATA | (h as u64) << 32 | u64::from(size);
        if self.port.register_region(tag, region).is_ok() {
            self.data_pending[h] = Some(size);
        } else {
            self.conns[h].awaiting = None;
            self.region_refused(mem, h);
        }
    }

    /// Answers the announcement of slot `h` once its data region is there.
    fn resume_announce(&mut self, mem: &mut HostWindow<'_>, h: usize) {
        let conn = self.conns[h];
        let Some((op, seed, size)) = conn.awaiting.filter(|_| conn.active) else {
            return;
        };
        if self.data_pending[h].is_some_and(|s| s != size) {
            return;
        }
        self.conns[h].awaiting = None;
        let (Some((rsize, key)), Some(ro_key)) = (self.data[h], self.read_only_keys[h]) else {
            self.region_refused(mem, h);
            return;
        };
        if rsize != size {
            // Registration refused (region table full): the size cannot be served.
            self.region_refused(mem, h);
            return;
        }
        let base = pool_addr(h);
        let len = u64::from(size) * u64::from(SLOTS);
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
        let conn = &mut self.conns[h];
        conn.seed = seed;
        conn.size = size;
        let answer = Message::Region {
            status: app::REGION_OK,
            key,
            addr: base,
            len,
            slots: SLOTS,
            ro_key,
            ro_addr: read_only_addr(h),
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
        let Some(key) = self.control_key else { return };
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
    }
}
