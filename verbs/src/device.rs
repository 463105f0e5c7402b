//! [`Device`]: one queue set of a DPU's host interface, claimed by this
//! process, as libibverbs' `ibv_context`: the admin queue (memory
//! registration, connections, counters, quotas) and connection events,
//! the set's memory window, and the handles of the work path
//! ([`CompletionQueue`], [`QueuePair`], [`Memory`]) it hands out.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metaroce_abi as abi;
use metaroce_abi::shmem::SharedMemory;

use crate::mapping::SharedFile;
use crate::queues::{CompletionQueue, QueuePair, Ring, Shared};
use crate::types::{Access, Conn, Error, Event, MemoryRegion, Status};

/// How [`Device::open_with`] finds and claims a queue set.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// How long to wait for the device to format the memory.
    pub ready_timeout: Duration,
    /// Claim this queue set (`None`: the first free one).
    pub queue_set: Option<u32>,
    /// How long admin commands (register, connect, ...) may take.
    pub command_timeout: Duration,
    /// Map only this window of the file, `(offset, length)` in bytes
    /// (offset page-aligned), as the host interface: a BAR that is a
    /// region of a larger memory, such as the Elba twin's RAM file
    /// (`[host_interface]`). `None`: the whole file.
    pub window: Option<(u64, u64)>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            ready_timeout: Duration::from_secs(30),
            queue_set: None,
            command_timeout: Duration::from_secs(10),
            window: None,
        }
    }
}

/// What the device says about itself and this process's queue set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    pub abi_major: u16,
    pub abi_minor: u16,
    pub features: u64,
    pub node: u16,
    pub ipv4: Ipv4Addr,
    pub udp_port: u16,
    pub queue_sets: u32,
    /// This process's queue set and its protection domain.
    pub queue_set: u32,
    pub pd: u32,
    /// This queue set's data window (I/O addresses).
    pub window_addr: u64,
    pub window_len: u64,
    pub max_message: u32,
}

/// Which host-written doorbell [`Device::ring_doorbell_raw`] writes.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Send,
    Recv,
    Admin,
}

/// One claimed queue set (see the module documentation).
///
/// **Threads.** A `Device` is `Send`: its admin calls take `&mut self`
/// and run on one thread at a time (the admin queue has one producer).
/// The work path is handed out as separate objects that other threads
/// may own: one [`CompletionQueue`] ([`Device::completion_queue`]), any
/// number of [`QueuePair`]s ([`Device::queue_pair`], one per connection,
/// cloneable) and [`Memory`] handles ([`Device::memory`]). They share the
/// mapping (an `Arc`), so the last one dropped unmaps it; the set stays
/// claimed until the device formats the memory again.
#[derive(Debug)]
pub struct Device {
    shared: Arc<Shared>,
    /// The queue set's first byte (read by the test hooks only).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    set_base: u64,
    aq: Ring,
    acq: Ring,
    counters_at: u64,
    /// The quota block, if the device has quotas (ABI 1.1).
    quota_at: Option<u64>,
    next_tag: u64,
    events: VecDeque<Event>,
    /// Next free byte of the window for [`Device::alloc`].
    alloc_next: u64,
    command_timeout: Duration,
}

fn power_of_two(n: u32) -> Result<u32, Error> {
    if n.is_power_of_two() {
        Ok(n)
    } else {
        Err(Error::BadLayout("a ring depth is not a power of two"))
    }
}

/// Waits with back-off: spins briefly, then sleeps 20 us doubling to 1 ms.
#[derive(Debug, Default)]
struct Backoff(u32);

impl Backoff {
    fn wait(&mut self) {
        self.0 += 1;
        if self.0 < 64 {
            std::hint::spin_loop();
        } else {
            let exp = (self.0 - 64).min(6);
            std::thread::sleep(Duration::from_micros(20 << exp));
        }
    }
}

impl Device {
    /// Opens the host interface in the file at `path` and claims the first
    /// free queue set.
    pub fn open(path: impl AsRef<Path>) -> Result<Device, Error> {
        Self::open_with(path, OpenOptions::default())
    }

    /// [`Device::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, options: OpenOptions) -> Result<Device, Error> {
        let map = match options.window {
            Some((offset, len)) => SharedFile::open_window(path.as_ref(), offset, len)?,
            None => SharedFile::open(path.as_ref())?,
        };
        let shm = map.view();
        let started = Instant::now();
        let mut backoff = Backoff::default();
        let header: abi::DeviceHeader = loop {
            let state = shm.load_u32(16).map_err(|_| Error::NotADevice)?;
            if state == abi::DEVICE_STATE_READY {
                break shm.read(0).map_err(|_| Error::NotADevice)?;
            }
            if state == abi::DEVICE_STATE_FAILED {
                return Err(Error::DeviceFailed);
            }
            if started.elapsed() > options.ready_timeout {
                return Err(Error::NotReady);
            }
            backoff.wait();
        };
        if header.magic != abi::MAGIC || header.shm_len > map.len() as u64 {
            return Err(Error::NotADevice);
        }
        if header.abi_major != abi::ABI_MAJOR {
            return Err(Error::Version {
                major: header.abi_major,
                minor: header.abi_minor,
            });
        }
        let candidates: Vec<u32> = match options.queue_set {
            Some(i) if i < header.queue_sets => vec![i],
            Some(_) => return Err(Error::NoFreeQueueSet),
            None => (0..header.queue_sets).collect(),
        };
        let pid = std::process::id().max(1);
        let set_base = candidates
            .into_iter()
            .map(|i| header.set_offset + u64::from(i) * header.set_stride)
            .find(|&base| {
                shm.compare_exchange_u32(base, abi::OWNER_FREE, pid)
                    .is_ok_and(|r| r.is_ok())
            })
            .ok_or(Error::NoFreeQueueSet)?;
        let set: abi::QueueSetHeader = shm.read(set_base).map_err(|_| Error::NotADevice)?;
        let bells = set_base + u64::from(set.doorbell_offset);
        let ring = |offset: u32, depth: u32, entry: u32, line: u64| -> Result<Ring, Error> {
            Ok(Ring {
                base: set_base + u64::from(offset),
                depth: power_of_two(depth)?,
                entry,
                bell: bells + 64 * line,
                index: 0,
                rings: 0,
            })
        };
        let info = DeviceInfo {
            abi_major: header.abi_major,
            abi_minor: header.abi_minor,
            features: header.features,
            node: header.node,
            ipv4: Ipv4Addr::from(header.ipv4),
            udp_port: header.udp_port,
            queue_sets: header.queue_sets,
            queue_set: set.index,
            pd: set.pd,
            window_addr: set.window_offset,
            window_len: set.window_len,
            max_message: header.max_message,
        };
        let (sq, rq, cq) = (
            ring(set.sq_offset, set.sq_depth, 64, 0)?,
            ring(set.rq_offset, set.rq_depth, 32, 1)?,
            ring(set.cq_offset, set.cq_depth, 32, 2)?,
        );
        let (aq, acq) = (
            ring(set.aq_offset, set.aq_depth, 64, 3)?,
            ring(set.acq_offset, set.acq_depth, 64, 4)?,
        );
        let len = map.len() as u64;
        let rings_end = [sq, rq, cq, aq, acq]
            .iter()
            .map(|r| r.slot(r.depth - 1) + u64::from(r.entry))
            .max()
            .unwrap_or(0);
        if rings_end > len || set.window_offset.saturating_add(set.window_len) > len {
            return Err(Error::BadLayout("queue set or window beyond the memory"));
        }
        Ok(Device {
            shared: Arc::new(Shared {
                map,
                info,
                indices: set_base + u64::from(set.indices_offset),
                sq: Mutex::new(sq),
                rq: Mutex::new(rq),
                cq: Mutex::new(Some(cq)),
                cq_depth: cq.depth,
                outstanding: AtomicU32::new(0),
            }),
            set_base,
            aq,
            acq,
            counters_at: set_base + u64::from(set.counters_offset),
            quota_at: (header.features & abi::FEATURE_QUOTAS != 0 && set.quota_offset != 0)
                .then(|| set_base + u64::from(set.quota_offset)),
            next_tag: 1,
            events: VecDeque::new(),
            alloc_next: set.window_offset,
            command_timeout: options.command_timeout,
        })
    }

    fn shm(&self) -> SharedMemory<'_> {
        self.shared.shm()
    }

    /// The device and this queue set.
    pub fn info(&self) -> DeviceInfo {
        self.shared.info
    }

    // ----- the work path's handles -----------------------------------------

    /// The queue set's completion queue. There is one: a second call while
    /// the first handle lives is `Err(Error::InUse)`; dropping the handle
    /// gives it back (with its position).
    pub fn completion_queue(&mut self) -> Result<CompletionQueue, Error> {
        CompletionQueue::take(&self.shared)
    }

    /// A handle to post work on `conn` (from [`Device::connect`],
    /// [`Device::accept`] or an accepted [`Event::Incoming`]); any number
    /// may exist. The device checks the connection when it takes the
    /// entries (a stale or foreign one completes with `BadConnection`).
    pub fn queue_pair(&self, conn: Conn) -> QueuePair {
        QueuePair {
            shared: self.shared.clone(),
            conn,
        }
    }

    /// A handle to copy data in and out of this queue set's window from
    /// any thread ([`Device::write`] and [`Device::read`] without the
    /// device).
    pub fn memory(&self) -> Memory {
        Memory {
            shared: self.shared.clone(),
        }
    }

    /// The device's heartbeat: it advances while the firmware serves.
    pub fn heartbeat(&self) -> u64 {
        self.shm().load_u64(64).unwrap_or(0)
    }

    // ----- memory ----------------------------------------------------------

    fn check_window(&self, addr: u64, len: u64) -> Result<u64, Error> {
        check_window(&self.shared.info, addr, len)
    }

    /// Carves `len` bytes (aligned to `align`, a power of two) out of this
    /// queue set's window; returns their I/O address. Never freed: a
    /// process sets up its buffers once.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64, Error> {
        let align = align.max(1);
        if !align.is_power_of_two() {
            return Err(Error::Refused(Status::InvalidRequest));
        }
        let addr = self.alloc_next.next_multiple_of(align);
        self.check_window(addr, len)?;
        self.alloc_next = addr + len;
        Ok(addr)
    }

    /// Copies `data` into this queue set's memory at I/O address `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), Error> {
        copy_in(&self.shared, addr, data)
    }

    /// Copies this queue set's memory at I/O address `addr` into `out`.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), Error> {
        copy_out(&self.shared, addr, out)
    }

    /// Registers `[addr, addr + len)` with `access`.
    pub fn register(&mut self, addr: u64, len: u64, access: Access) -> Result<MemoryRegion, Error> {
        let answer = self.command(abi::AdminCmd {
            opcode: abi::ADMIN_REGISTER_REGION,
            access: access.bits(),
            addr,
            len,
            ..abi::AdminCmd::default()
        })?;
        Ok(MemoryRegion {
            key: answer.value as u32,
            addr,
            len,
        })
    }

    /// Deregisters a region.
    pub fn deregister(&mut self, region: MemoryRegion) -> Result<(), Error> {
        self.deregister_key(region.key)
    }

    /// Deregisters the region with `key`.
    pub fn deregister_key(&mut self, key: u32) -> Result<(), Error> {
        self.command(abi::AdminCmd {
            opcode: abi::ADMIN_DEREGISTER_REGION,
            key,
            ..abi::AdminCmd::default()
        })
        .map(|_| ())
    }

    // ----- connections -----------------------------------------------------

    /// Opens a connection to `peer` and waits until it is up.
    pub fn connect(&mut self, peer: SocketAddr) -> Result<Conn, Error> {
        let conn = self.connect_start(peer)?;
        let deadline = Instant::now() + self.command_timeout;
        loop {
            self.pump_admin();
            let found = self.events.iter().position(|e| match e {
                Event::Connected(c)
                | Event::Failed { conn: c, .. }
                | Event::Closed { conn: c, .. } => *c == conn,
                Event::Incoming { .. } => false,
            });
            if let Some(at) = found {
                return match self.events.remove(at) {
                    Some(Event::Connected(c)) => Ok(c),
                    Some(Event::Failed { status, .. }) => Err(Error::ConnectionFailed(status)),
                    _ => Err(Error::ConnectionFailed(Status::Flushed)),
                };
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Opens a connection to `peer` without waiting: work may be posted at
    /// once; `Event::Connected` (or `Failed`) follows.
    pub fn connect_start(&mut self, peer: SocketAddr) -> Result<Conn, Error> {
        let ip = match peer.ip() {
            IpAddr::V4(v4) => abi::ipv4_mapped(v4.octets()),
            IpAddr::V6(v6) => v6.octets(),
        };
        let answer = self.command(abi::AdminCmd {
            opcode: abi::ADMIN_CONNECT,
            ip,
            port: peer.port(),
            ..abi::AdminCmd::default()
        })?;
        Ok(Conn {
            index: answer.conn_index,
            generation: answer.conn_generation,
        })
    }

    /// Asks for the device's incoming connections.
    pub fn listen(&mut self) -> Result<(), Error> {
        self.command(abi::AdminCmd {
            opcode: abi::ADMIN_LISTEN,
            ..abi::AdminCmd::default()
        })
        .map(|_| ())
    }

    /// Waits up to `timeout` for an incoming connection and accepts it.
    pub fn accept(&mut self, timeout: Duration) -> Result<(Conn, SocketAddr), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            self.pump_admin();
            if let Some(at) = self
                .events
                .iter()
                .position(|e| matches!(e, Event::Incoming { .. }))
            {
                if let Some(Event::Incoming { conn, peer }) = self.events.remove(at) {
                    self.conn_command(abi::ADMIN_ACCEPT, conn)?;
                    return Ok((conn, peer));
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Accepts an incoming connection taken from [`Device::poll_event`]
    /// (what [`Device::accept`] does for the one it waited for).
    pub fn accept_conn(&mut self, conn: Conn) -> Result<(), Error> {
        self.conn_command(abi::ADMIN_ACCEPT, conn)
    }

    /// Closes a connection gracefully (its sends complete first).
    pub fn close(&mut self, conn: Conn) -> Result<(), Error> {
        self.conn_command(abi::ADMIN_CLOSE, conn)
    }

    /// Gives a closed or failed connection's handle back.
    pub fn release(&mut self, conn: Conn) -> Result<(), Error> {
        self.conn_command(abi::ADMIN_RELEASE, conn)
    }

    fn conn_command(&mut self, opcode: u8, conn: Conn) -> Result<(), Error> {
        self.command(abi::AdminCmd {
            opcode,
            conn_index: conn.index,
            conn_generation: conn.generation,
            ..abi::AdminCmd::default()
        })
        .map(|_| ())
    }

    /// The next connection event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.pump_admin();
        self.events.pop_front()
    }

    /// This queue set's counters (and its connections' and the device's).
    pub fn counters(&mut self) -> Result<abi::SetCounters, Error> {
        self.command(abi::AdminCmd {
            opcode: abi::ADMIN_QUERY_COUNTERS,
            ..abi::AdminCmd::default()
        })?;
        self.shm()
            .read(self.counters_at)
            .map_err(|_| Error::BadLayout("counters beyond the memory"))
    }

    /// This queue set's quota (spec 6.10): the limits in force, what it
    /// holds and its refusals by resource, fresh from the device.
    pub fn quota(&mut self) -> Result<abi::SetQuota, Error> {
        let at = self
            .quota_at
            .ok_or(Error::BadLayout("the device has no quotas"))?;
        self.counters()?;
        self.shm()
            .read(at)
            .map_err(|_| Error::BadLayout("quota beyond the memory"))
    }

    /// Sets queue set `set`'s limits (a field at [`abi::QUOTA_DEFAULT`]:
    /// the device's default share). Only the management set (the
    /// device's last queue set) may: others get
    /// `Refused(Status::NotPermitted)`.
    pub fn set_quota(&mut self, set: u32, limits: &abi::QuotaValues) -> Result<(), Error> {
        let cmd = abi::QuotaCmd {
            opcode: abi::ADMIN_SET_QUOTA,
            set,
            connections: limits.connections,
            regions: limits.regions,
            region_bytes: limits.region_bytes,
            work_entries: limits.work_entries,
            commands: limits.commands,
            ..abi::QuotaCmd::default()
        };
        self.command(zerocopy::transmute!(cmd)).map(|_| ())
    }

    // ----- admin -----------------------------------------------------------

    /// Sends an admin command and waits for its answer (events seen
    /// meanwhile are kept for [`Device::poll_event`]). A refused command is
    /// `Err(Error::Refused(status))`.
    fn command(&mut self, mut cmd: abi::AdminCmd) -> Result<abi::AdminCqe, Error> {
        cmd.tag = self.next_tag;
        self.next_tag += 1;
        let shared = self.shared.clone();
        let shm = shared.shm();
        let consumer = shm.load_u32(shared.indices + 8).unwrap_or(0);
        let deadline = Instant::now() + self.command_timeout;
        let mut backoff = Backoff::default();
        while self.aq.index.wrapping_sub(consumer) >= self.aq.depth {
            if Instant::now() > deadline {
                return Err(Error::Timeout);
            }
            backoff.wait();
        }
        shm.write(self.aq.slot(self.aq.index), &cmd)
            .map_err(|_| Error::BadLayout("admin queue beyond the memory"))?;
        self.aq.index = self.aq.index.wrapping_add(1);
        self.aq.ring_doorbell(&shm);
        let mut backoff = Backoff::default();
        loop {
            if let Some(answer) = self.next_admin_entry() {
                if answer.kind == abi::EVENT_COMMAND_DONE && answer.tag == cmd.tag {
                    return match Status::from_code(answer.status) {
                        Status::Success => Ok(answer),
                        status => Err(Error::Refused(status)),
                    };
                }
                self.keep_event(&answer);
                continue;
            }
            if self.shm().load_u32(16).ok() == Some(abi::DEVICE_STATE_FAILED) {
                return Err(Error::DeviceFailed);
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout);
            }
            backoff.wait();
        }
    }

    /// Takes every waiting admin completion; events are kept.
    fn pump_admin(&mut self) {
        while let Some(entry) = self.next_admin_entry() {
            self.keep_event(&entry);
        }
    }

    fn keep_event(&mut self, e: &abi::AdminCqe) {
        let conn = Conn {
            index: e.conn_index,
            generation: e.conn_generation,
        };
        let event = match e.kind {
            abi::EVENT_INCOMING => Event::Incoming {
                conn,
                peer: SocketAddr::new(
                    match abi::ipv4_of_mapped(&e.ip) {
                        Some(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
                        None => IpAddr::V6(Ipv6Addr::from(e.ip)),
                    },
                    e.port,
                ),
            },
            abi::EVENT_CONNECTED => Event::Connected(conn),
            abi::EVENT_CLOSED => Event::Closed {
                conn,
                reason: e.detail,
            },
            abi::EVENT_FAILED => Event::Failed {
                conn,
                status: Status::from_code(e.status),
            },
            // A late answer to a command that timed out, or a kind this
            // version does not know: nothing to keep.
            _ => return,
        };
        self.events.push_back(event);
    }

    /// The next admin completion or event, if its phase says it is ours.
    fn next_admin_entry(&mut self) -> Option<abi::AdminCqe> {
        let shared = self.shared.clone();
        let shm = shared.shm();
        let slot = self.acq.slot(self.acq.index);
        let last = shm.load_u32(slot + abi::ADMIN_CQE_LAST_WORD as u64).ok()?;
        if (last >> 24) as u8 != abi::phase_of(self.acq.index, self.acq.depth) {
            return None;
        }
        let entry = shm.read::<abi::AdminCqe>(slot).ok()?;
        self.acq.index = self.acq.index.wrapping_add(1);
        let _ = shm.store_u32(self.acq.bell, self.acq.index);
        Some(entry)
    }
}

/// Test hooks: a host that breaks the rules of spec 6.8 on purpose (raw
/// entries, doorbells and commands the typed calls never produce), so
/// the tests can check that the device refuses and counts it. Only with
/// the `testing` feature.
#[cfg(feature = "testing")]
impl Device {
    /// Posts a raw send-queue entry (the device validates every field).
    pub fn post_send_raw(&self, entry: &abi::SendWqe) -> Result<(), Error> {
        Ok(self.shared.post_send_with(1, |_| *entry)?)
    }

    /// Posts a raw receive-queue entry.
    pub fn post_recv_raw(&self, entry: &abi::RecvWqe) -> Result<(), Error> {
        Ok(self.shared.post_recv_with(1, |_| *entry)?)
    }

    /// Sends a raw admin command and waits for its answer.
    pub fn command_raw(&mut self, cmd: abi::AdminCmd) -> Result<abi::AdminCqe, Error> {
        self.command(cmd)
    }

    /// Writes a doorbell record as given, without an entry: a doorbell
    /// storm, or a producer index past the ring.
    pub fn ring_doorbell_raw(&mut self, queue: Queue, index: u32) {
        let shared = self.shared.clone();
        let shm = shared.shm();
        let ring = |r: &mut Ring| {
            r.rings = r.rings.wrapping_add(1);
            let _ = shm.store_u32(r.bell, index);
            let _ = shm.store_u32(r.bell + 4, r.rings);
        };
        match queue {
            Queue::Send => ring(&mut crate::queues::lock(&shared.sq)),
            Queue::Recv => ring(&mut crate::queues::lock(&shared.rq)),
            Queue::Admin => ring(&mut self.aq),
        }
    }

    /// The producer index this process last published on `queue`.
    pub fn producer_index(&self, queue: Queue) -> u32 {
        match queue {
            Queue::Send => crate::queues::lock(&self.shared.sq).index,
            Queue::Recv => crate::queues::lock(&self.shared.rq).index,
            Queue::Admin => self.aq.index,
        }
    }

    /// The queue set's first byte (to inspect the layout).
    pub fn queue_set_offset(&self) -> u64 {
        self.set_base
    }
}

fn check_window(info: &DeviceInfo, addr: u64, len: u64) -> Result<u64, Error> {
    let (start, size) = (info.window_addr, info.window_len);
    if addr >= start && len <= size && addr - start <= size - len {
        Ok(addr)
    } else {
        Err(Error::OutOfWindow { addr, len })
    }
}

fn copy_in(shared: &Shared, addr: u64, data: &[u8]) -> Result<(), Error> {
    check_window(&shared.info, addr, data.len() as u64)?;
    shared
        .shm()
        .copy_in(addr, data)
        .map_err(|_| Error::OutOfWindow {
            addr,
            len: data.len() as u64,
        })
}

fn copy_out(shared: &Shared, addr: u64, out: &mut [u8]) -> Result<(), Error> {
    check_window(&shared.info, addr, out.len() as u64)?;
    shared
        .shm()
        .copy_out(addr, out)
        .map_err(|_| Error::OutOfWindow {
            addr,
            len: out.len() as u64,
        })
}

/// Copies in and out of a queue set's window, from any thread: cheap to
/// clone, `Send` and `Sync` (copies are plain byte copies of shared
/// memory; spec 6.8 says which buffers the host may touch when).
#[derive(Debug, Clone)]
pub struct Memory {
    shared: Arc<Shared>,
}

impl Memory {
    /// Copies `data` into the window at I/O address `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), Error> {
        copy_in(&self.shared, addr, data)
    }

    /// Copies the window at I/O address `addr` into `out`.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), Error> {
        copy_out(&self.shared, addr, out)
    }
}
