//! What the transport runs on: the MetaRoCE host engine over UDP sockets in
//! this process ([`UdpBackend`]), or a DPU driven through its host
//! interface (spec chapter 6) with the host library ([`DpuBackend`]).
//!
//! Both take MetaRoCE work requests, report completions and connection
//! events, and register memory. They differ in what memory the engine
//! reaches: the host engine reaches the whole process (application buffers
//! are registered as they are), the DPU only its queue set's shared data
//! window, so the transport stages application data through buffers it
//! takes from the window ([`Backend::direct`]).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, Op, Opcode, RecvRequest, Region, Status, WorkRequest,
};
use metaroce_core::config::AcceptDomain;
use metaroce_core::stats::ConnStats;
use metaroce_core::{CommandError, Event};
use metaroce_host::node::{Node, NodeConfig};
use metaroce_verbs as verbs;

use super::Settings;
use crate::flags::errno;
use crate::memory::{AppMemory, RangeId};

/// Connections one domain holds.
const CONNECTIONS: u32 = 1024;

/// The engine a domain runs on.
#[derive(Debug)]
pub enum Backend {
    Udp(Box<UdpBackend>),
    Dpu(Box<DpuBackend>),
}

/// The host engine over UDP sockets, placing straight into the process's
/// registered memory.
#[derive(Debug)]
pub struct UdpBackend {
    node: Node<AppMemory>,
    /// Registered ranges by key (for deregistration).
    regions: std::collections::HashMap<u32, (u64, RangeId)>,
    /// Buffers the provider allocated, by address.
    buffers: BTreeMap<u64, Box<[u8]>>,
}

impl Backend {
    /// Opens the backend `settings` choose: the DPU whose shared memory
    /// `FI_METAROCE_DEVICE` names, else UDP sockets.
    pub fn open(settings: &Settings) -> Result<Backend, String> {
        match &settings.device {
            Some(path) => DpuBackend::open(path, settings).map(|b| Backend::Dpu(Box::new(b))),
            None => UdpBackend::bind(settings).map(|b| Backend::Udp(Box::new(b))),
        }
    }

    /// Whether application memory is registered as it is (`true`) or
    /// staged through provider buffers (`false`).
    pub fn direct(&self) -> bool {
        matches!(self, Backend::Udp(_))
    }

    /// The address peers reach this domain at.
    pub fn local_addr(&self) -> SocketAddr {
        match self {
            Backend::Udp(b) => b.node.local_addr(),
            Backend::Dpu(b) => b.local,
        }
    }

    /// A buffer of `len` bytes the engine reaches; its address.
    pub fn alloc(&mut self, len: usize) -> Result<u64, i32> {
        match self {
            Backend::Udp(b) => {
                let buf = vec![0u8; len.max(1)].into_boxed_slice();
                let addr = buf.as_ptr() as u64;
                b.buffers.insert(addr, buf);
                Ok(addr)
            }
            Backend::Dpu(b) => b.window.alloc(len as u64).ok_or(errno::ENOMEM),
        }
    }

    /// Gives a buffer from [`Backend::alloc`] back.
    pub fn free(&mut self, addr: u64) {
        match self {
            Backend::Udp(b) => {
                b.buffers.remove(&addr);
            }
            Backend::Dpu(b) => b.window.free(addr),
        }
    }

    /// Copies `data` into a provider buffer at `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) {
        match self {
            Backend::Udp(b) => {
                if let Some((&base, buf)) = b.buffers.range_mut(..=addr).next_back() {
                    let at = (addr - base) as usize;
                    if let Some(dst) = buf.get_mut(at..at + data.len()) {
                        dst.copy_from_slice(data);
                    }
                }
            }
            Backend::Dpu(b) => {
                let _ = b.device.write(addr, data);
            }
        }
    }

    /// Copies a provider buffer's bytes at `addr` into `out`.
    pub fn read(&self, addr: u64, out: &mut [u8]) {
        match self {
            Backend::Udp(b) => {
                if let Some((&base, buf)) = b.buffers.range(..=addr).next_back() {
                    let at = (addr - base) as usize;
                    if let Some(src) = buf.get(at..at + out.len()) {
                        out.copy_from_slice(src);
                    }
                }
            }
            Backend::Dpu(b) => {
                let _ = b.device.read(addr, out);
            }
        }
    }

    /// Registers `[base, base + len)`; returns the key.
    pub fn register(&mut self, base: u64, len: u64, access: Access) -> Result<u32, i32> {
        match self {
            Backend::Udp(b) => {
                let key = b
                    .node
                    .ep
                    .register_region(Region {
                        base,
                        len,
                        access,
                        pd: 0,
                    })
                    .map_err(|_| errno::ENOMEM)?;
                let range = b.node.mem.add(base, len);
                b.regions.insert(key, (base, range));
                Ok(key)
            }
            Backend::Dpu(b) => b
                .device
                .register(base, len, verbs::Access::from_bits(u32::from(access.0)))
                .map(|r| r.key)
                .map_err(|e| match e {
                    verbs::Error::OutOfWindow { .. } => errno::EINVAL,
                    _ => errno::ENOMEM,
                }),
        }
    }

    /// Deregisters the region of `key`.
    pub fn deregister(&mut self, key: u32) {
        match self {
            Backend::Udp(b) => {
                if let Some((base, range)) = b.regions.remove(&key) {
                    let _ = b.node.ep.deregister_region(key);
                    b.node.mem.remove(base, range);
                }
            }
            Backend::Dpu(b) => {
                let _ = b.device.deregister_key(key);
            }
        }
    }

    /// Whether `[addr, addr + len)` lies in the region of `key`.
    pub fn region_covers(&self, key: u32, addr: u64, len: u64) -> bool {
        match self {
            Backend::Udp(b) => b
                .node
                .ep
                .regions()
                .get(key)
                .is_some_and(|r| r.contains(addr, len)),
            // The device checks at post; a wrong one fails the request.
            Backend::Dpu(_) => true,
        }
    }

    /// Opens a connection to `peer` (work may be posted at once).
    pub fn connect(&mut self, peer: SocketAddr) -> Result<ConnHandle, i32> {
        match self {
            Backend::Udp(b) => b.node.connect(peer).map_err(|e| match e {
                CommandError::QueueFull => errno::EAGAIN,
                _ => errno::ENOMEM,
            }),
            Backend::Dpu(b) => b
                .device
                .connect_start(peer)
                .map(|c| ConnHandle {
                    index: c.index,
                    generation: c.generation,
                })
                .map_err(|_| errno::ENOMEM),
        }
    }

    /// Accepts an incoming connection (the DPU asks; the host engine
    /// accepted it already).
    pub fn accept(&mut self, h: ConnHandle) -> Result<(), i32> {
        match self {
            Backend::Udp(_) => Ok(()),
            Backend::Dpu(b) => b.device.accept_conn(conn_of(h)).map_err(|_| errno::EIO),
        }
    }

    /// Closes a connection.
    pub fn close(&mut self, h: ConnHandle) {
        match self {
            Backend::Udp(b) => {
                let now = b.node.now();
                let _ = b.node.ep.close(now, h);
            }
            Backend::Dpu(b) => {
                let _ = b.device.close(conn_of(h));
            }
        }
    }

    /// Gives a closed connection's handle back.
    pub fn release(&mut self, h: ConnHandle) {
        match self {
            Backend::Udp(b) => {
                let _ = b.node.ep.release(h);
            }
            Backend::Dpu(b) => {
                let _ = b.device.release(conn_of(h));
            }
        }
    }

    /// Posts a send-queue work request.
    pub fn post_send(&mut self, h: ConnHandle, wr: WorkRequest) -> Result<(), CommandError> {
        match self {
            Backend::Udp(b) => b.node.post_send(h, wr),
            Backend::Dpu(b) => b
                .device
                .queue_pair(conn_of(h))
                .post_send(&[send_wr(&wr)])
                .map_err(|e| command_error(e.error)),
        }
    }

    /// Posts a receive.
    pub fn post_recv(&mut self, h: ConnHandle, rr: RecvRequest) -> Result<(), CommandError> {
        match self {
            Backend::Udp(b) => b.node.post_recv(h, rr),
            Backend::Dpu(b) => {
                let wr = verbs::RecvWr {
                    wr_id: rr.id,
                    local: verbs::Sge {
                        addr: rr.local.addr,
                        len: rr.local.len,
                        key: rr.local.key,
                    },
                };
                b.device
                    .queue_pair(conn_of(h))
                    .post_recv(&[wr])
                    .map_err(|e| command_error(e.error))
            }
        }
    }

    /// Runs the engine (or reads the device's queues); returns whether
    /// completions or events are waiting.
    pub fn progress(&mut self) -> bool {
        match self {
            Backend::Udp(b) => b.node.progress(),
            Backend::Dpu(b) => b.poll(),
        }
    }

    /// The next connection event.
    pub fn next_event(&mut self) -> Option<Event> {
        match self {
            Backend::Udp(b) => b.node.events.pop_front(),
            Backend::Dpu(b) => b.events.pop_front(),
        }
    }

    /// The next work completion.
    pub fn next_completion(&mut self) -> Option<Completion> {
        match self {
            Backend::Udp(b) => b.node.completions.pop_front(),
            Backend::Dpu(b) => b.completions.pop_front(),
        }
    }

    /// How long the backend may sleep (at most `max`).
    pub fn idle_wait(&self, max: Duration) -> Duration {
        match self {
            Backend::Udp(b) => b.node.idle_wait(max),
            // Nothing to wait on: the device's queues are polled.
            Backend::Dpu(_) => max.min(DPU_POLL),
        }
    }

    /// A descriptor that becomes readable when there is work (the UDP
    /// socket); `None` when the backend must be polled.
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Backend::Udp(b) => Some(b.node.receive_fd()),
            Backend::Dpu(_) => None,
        }
    }

    /// A connection's counters (host engine only).
    pub fn conn_stats(&self, h: ConnHandle) -> Option<ConnStats> {
        match self {
            Backend::Udp(b) => b.node.ep.stats(h),
            Backend::Dpu(_) => None,
        }
    }

    /// Sends what is staged before the process goes away.
    pub fn flush(&mut self) {
        if let Backend::Udp(b) = self {
            b.node.flush();
        }
    }
}

/// How often a DPU backend's queues are looked at when nothing happens.
const DPU_POLL: Duration = Duration::from_micros(200);

impl UdpBackend {
    fn bind(settings: &Settings) -> Result<UdpBackend, String> {
        let span = settings.paths * 2;
        let config = |port: u16, entropy_base: Option<u16>| NodeConfig {
            bind: SocketAddr::new(settings.bind.ip(), port),
            paths: settings.paths,
            entropy_base,
            mtu: settings.mtu,
            window: None,
            rate_mbps: settings.rate_mbps,
            accept: true,
            connections: CONNECTIONS,
            receives_per_connection: settings.rx_slots as u32 + 1,
            seed: None,
            ride_through: Some(settings.timeout),
            source_limits: None,
            protection: None,
        };
        let loopback = settings.bind.ip().is_loopback();
        let adjust = |c: &mut metaroce_core::Config| {
            // Every peer of the domain may reach every region it
            // registered: one protection domain, as libfabric's domain.
            c.accept_domain = AcceptDomain::Shared(0);
            c.connect_timeout = settings.timeout;
            // The provider's receives are its own, reposted as soon as
            // they are read: a peer not ready is a peer slow to progress.
            c.rnr_retry_limit = u8::MAX;
            c.recv_queue_limit = c.recv_queue_limit.max(settings.rx_slots as u16 + 1);
            if loopback {
                // Round trips of tens of microseconds between processes of
                // one machine: acknowledge as soon as the emulation
                // profile's batching allows, and start at the paced rate
                // rather than a start-up window sized for a fabric's
                // incast (there is none on loopback).
                c.ack_delay = Duration::from_micros(20);
                c.initial_window_bytes = 0;
                // Loss is repaired on the scale of loopback's round trips
                // (a tail-loss probe after rto_min / 8), not the emulation
                // profile's milliseconds meant for QEMU's slow CPUs.
                c.rto_min = Duration::from_millis(1);
                c.rto_initial = Duration::from_millis(5);
            }
        };
        let wrap = |node| UdpBackend {
            node,
            regions: std::collections::HashMap::new(),
            buffers: BTreeMap::new(),
        };
        match settings.port_range {
            None => Node::bind_with(
                &config(settings.bind.port(), None),
                None,
                AppMemory::default(),
                adjust,
            )
            .map(wrap)
            .map_err(|e| e.to_string()),
            Some((lo, hi)) => {
                // Runs of 1 + span ports inside the range: the first free.
                let mut base = u32::from(lo);
                let mut last = String::from("no free ports");
                while base + u32::from(span) <= u32::from(hi) {
                    let port = base as u16;
                    match Node::bind_with(
                        &config(port, Some(port + 1)),
                        None,
                        AppMemory::default(),
                        adjust,
                    ) {
                        Ok(node) => return Ok(wrap(node)),
                        Err(e) => last = e.to_string(),
                    }
                    base += u32::from(span) + 1;
                }
                Err(format!(
                    "no free run of {} UDP ports in FI_METAROCE_PORT_RANGE {lo}-{hi} ({last})",
                    span + 1
                ))
            }
        }
    }
}

/// A DPU driven through its host interface: one queue set of the shared
/// memory the device path names (the ivshmem file under QEMU).
#[derive(Debug)]
pub struct DpuBackend {
    device: verbs::Device,
    /// The queue set's completion queue (polled on the domain's progress
    /// thread, like the device).
    cq: verbs::CompletionQueue,
    local: SocketAddr,
    window: WindowAllocator,
    completions: VecDeque<Completion>,
    events: VecDeque<Event>,
}

impl DpuBackend {
    fn open(path: &std::path::Path, settings: &Settings) -> Result<DpuBackend, String> {
        let mut device = verbs::Device::open(path)
            .map_err(|e| format!("cannot open the DPU at {}: {e}", path.display()))?;
        let info = device.info();
        // The rest of the window is the provider's to carve and reuse.
        let used = device
            .alloc(0, 64)
            .map_err(|e| format!("the DPU's window: {e}"))?;
        let end = info.window_addr + info.window_len;
        let window = WindowAllocator::new(used, end.saturating_sub(used));
        device
            .listen()
            .map_err(|e| format!("the DPU refused to listen: {e}"))?;
        let cq = device
            .completion_queue()
            .map_err(|e| format!("the DPU's completion queue: {e}"))?;
        let _ = settings;
        Ok(DpuBackend {
            local: SocketAddr::new(info.ipv4.into(), info.udp_port),
            device,
            cq,
            window,
            completions: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    fn poll(&mut self) -> bool {
        while let Some(e) = self.device.poll_event() {
            self.events.push_back(match e {
                verbs::Event::Incoming { conn, peer } => Event::Incoming {
                    conn: handle_of(conn),
                    peer: metaroce_host::node::peer_of(peer),
                },
                verbs::Event::Connected(c) => Event::Connected(handle_of(c)),
                verbs::Event::Closed { conn, .. } => Event::Closed {
                    conn: handle_of(conn),
                    reason: metaroce_core::wire::CloseReason::Normal,
                },
                verbs::Event::Failed { conn, status } => Event::Failed {
                    conn: handle_of(conn),
                    status: status_of(status),
                },
            });
        }
        let mut polled = [verbs::WorkCompletion::default(); 64];
        let n = self.cq.poll(&mut polled);
        for wc in &polled[..n] {
            self.completions.push_back(Completion {
                conn: handle_of(wc.conn),
                wr_id: wc.wr_id,
                opcode: match wc.opcode {
                    verbs::Opcode::Write => Opcode::Write,
                    verbs::Opcode::WriteImm => Opcode::WriteImm,
                    verbs::Opcode::Send => Opcode::Send,
                    verbs::Opcode::Read => Opcode::Read,
                    verbs::Opcode::RecvWriteImm => Opcode::RecvWriteImm,
                    _ => Opcode::Recv,
                },
                status: status_of(wc.status),
                byte_len: wc.byte_len,
                imm: wc.imm,
            });
        }
        !self.completions.is_empty() || !self.events.is_empty()
    }
}

fn conn_of(h: ConnHandle) -> verbs::Conn {
    verbs::Conn {
        index: h.index,
        generation: h.generation,
    }
}

fn handle_of(c: verbs::Conn) -> ConnHandle {
    ConnHandle {
        index: c.index,
        generation: c.generation,
    }
}

fn status_of(s: verbs::Status) -> Status {
    match s {
        verbs::Status::Success => Status::Success,
        verbs::Status::RemoteInvalidKey => Status::RemoteInvalidKey,
        verbs::Status::RemoteAccess => Status::RemoteAccess,
        verbs::Status::RemoteBounds => Status::RemoteBounds,
        verbs::Status::RemoteProtocol => Status::RemoteProtocol,
        verbs::Status::ReceiveTooSmall => Status::ReceiveTooSmall,
        verbs::Status::RetryExceeded => Status::RetryExceeded,
        verbs::Status::RnrExceeded => Status::ReceiverNotReadyExceeded,
        verbs::Status::Flushed => Status::Flushed,
        // Everything the device refused at post: the request was wrong.
        _ => Status::LocalProtection,
    }
}

fn send_wr(wr: &WorkRequest) -> verbs::SendWr {
    let remote = |t: metaroce_core::wire::MemoryTarget| verbs::Remote {
        addr: t.addr,
        key: t.key,
    };
    verbs::SendWr {
        wr_id: wr.id,
        op: match wr.op {
            Op::Write { remote: r } => verbs::SendOp::Write(remote(r)),
            Op::WriteImm { remote: r, imm } => verbs::SendOp::WriteImm(remote(r), imm),
            Op::Send => verbs::SendOp::Send,
            Op::SendImm { imm } => verbs::SendOp::SendImm(imm),
            Op::Read { remote: r } => verbs::SendOp::Read(remote(r)),
        },
        local: verbs::Sge {
            addr: wr.local.addr,
            len: wr.local.len,
            key: wr.local.key,
        },
    }
}

fn command_error(e: verbs::Error) -> CommandError {
    match e {
        verbs::Error::QueueFull => CommandError::QueueFull,
        _ => CommandError::NotOpen,
    }
}

/// First-fit allocation of the DPU window's free part, in 64-byte units,
/// so staging buffers are reused (the host library's own allocator only
/// carves).
#[derive(Debug)]
pub struct WindowAllocator {
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
    /// Allocated ranges: start -> length.
    used: BTreeMap<u64, u64>,
}

impl WindowAllocator {
    /// Manages `[start, start + len)`.
    pub fn new(start: u64, len: u64) -> WindowAllocator {
        let end = start.saturating_add(len);
        let start = start.next_multiple_of(64);
        let usable = end.saturating_sub(start) & !63;
        let mut free = BTreeMap::new();
        if usable > 0 {
            free.insert(start, usable);
        }
        WindowAllocator {
            free,
            used: BTreeMap::new(),
        }
    }

    /// A range of at least `len` bytes.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(1).next_multiple_of(64);
        let (&start, &size) = self.free.iter().find(|(_, &size)| size >= len)?;
        self.free.remove(&start);
        if size > len {
            self.free.insert(start + len, size - len);
        }
        self.used.insert(start, len);
        Some(start)
    }

    /// Returns a range (merging it with free neighbours).
    pub fn free(&mut self, start: u64) {
        let Some(mut len) = self.used.remove(&start) else {
            return;
        };
        let mut start = start;
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back() {
            if prev + prev_len == start {
                self.free.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += next_len;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_ranges_are_reused_and_merged() {
        // 1000 rounds up to 1024: 640 usable bytes up to 1704.
        let mut w = WindowAllocator::new(1000, 704);
        let a = w.alloc(100).expect("room");
        let b = w.alloc(64).expect("room");
        let c = w.alloc(64 * 7).expect("room");
        assert_eq!((a, b, c), (1024, 1152, 1216));
        assert!(w.alloc(1).is_none(), "full");
        w.free(b);
        assert_eq!(w.alloc(10), Some(b));
        w.free(a);
        w.free(b);
        w.free(c);
        assert_eq!(w.alloc(64 * 10), Some(a), "everything merged back");
    }
}
