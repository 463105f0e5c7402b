//! The provider's transport: one MetaRoCE host endpoint (the `metaroce-host`
//! engine over UDP sockets) per libfabric domain, and the message layer
//! libfabric's reliable-datagram semantics need on top of MetaRoCE's
//! connections.
//!
//! * **Connections.** A peer's connection is opened on the first operation
//!   towards it; incoming connections are accepted by the endpoint. Each
//!   side sends its messages and RMA on the connection it opened itself,
//!   so messages from one sender to one receiver travel in order on one
//!   connection (`FI_ORDER_SAS`); the accepting side uses the connection
//!   only to answer rendezvous (READ, FIN).
//! * **Messages.** Every SEND lands in a provider buffer (each connection
//!   keeps `rx_slots` posted), so a message never waits for the application
//!   to post a receive: up to [`EAGER_LIMIT`] bytes travel inside the SEND
//!   (eager) and are copied out when a receive matches; longer ones send a
//!   request (RTS) and the receiver READs them straight into the matched
//!   buffer, then answers FIN.
//! * **RMA** maps onto WRITE, WRITE_IMM (remote CQ data) and READ.
//!
//! Memory keys are the MetaRoCE endpoint's; remote addresses are virtual
//! addresses (`FI_MR_VIRT_ADDR`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, RecvRequest, Region, Status, WorkRequest,
};
use metaroce_core::config::AcceptDomain;
use metaroce_core::wire::MemoryTarget;
use metaroce_core::{CommandError, Event};
use metaroce_host::node::{socket_of, Node, NodeConfig};

use crate::flags::{self, errno, ADDR_NOTAVAIL};
use crate::matching::{Arrival, Body, PostedRecv, Queue};
use crate::memory::{AppMemory, RangeId};
use crate::queues::{AddressVector, CompletionQueue, CqEntry, CqError, CqItem};
use crate::wire::{Header, Kind, HEADER_LEN};

/// Largest message sent inside its SEND; longer ones use a rendezvous.
pub const EAGER_LIMIT: usize = 16 * 1024;
/// Largest message `fi_inject` takes.
pub const INJECT_LIMIT: usize = 4096;
/// Largest message (a MetaRoCE message's length is 32 bits).
pub const MAX_MSG: usize = 1 << 30;
/// Transmit buffers of the provider (eager messages, RTS, FIN, injected
/// RMA): `fi_info`'s `tx_attr->size`.
pub const TX_SLOTS: usize = 256;
/// Buffers each connection keeps posted for FINs (opening side).
const FIN_SLOTS: usize = 16;
/// Bytes of one transmit buffer.
const TX_SLOT_LEN: usize = HEADER_LEN + EAGER_LIMIT;
/// Connections one domain holds.
const CONNECTIONS: u32 = 1024;
/// How long a closing endpoint keeps acknowledging (several of the
/// longest ACK delay, the emulation profile's 200 us).
const LINGER: Duration = Duration::from_millis(2);
/// Internal operations whose wr_id has this bit are receives.
const RECV_BIT: u64 = 1 << 63;

/// How a domain's transport is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to bind (port 0: any free port in `port_range`).
    pub bind: SocketAddr,
    /// Ports the sockets may use (inclusive); `None`: any.
    pub port_range: Option<(u16, u16)>,
    pub paths: u16,
    pub mtu: u16,
    pub rate_mbps: u32,
    /// Receive buffers each accepted connection keeps posted.
    pub rx_slots: usize,
    /// How long a connection may go without progress before it fails.
    pub timeout: Duration,
}

impl Settings {
    /// Defaults for `bind`, overridden by `FI_METAROCE_*` variables (see
    /// the guide): `PORT_RANGE=lo-hi`, `PATHS`, `MTU`, `RATE_MBPS`,
    /// `RX_SLOTS`, `TIMEOUT_MS`.
    pub fn from_env(bind: SocketAddr) -> Result<Settings, String> {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{name}={v}: not a number")),
                Err(_) => Ok(default),
            }
        }
        let port_range = match std::env::var("FI_METAROCE_PORT_RANGE") {
            Ok(v) => {
                let parsed = v.split_once('-').and_then(|(lo, hi)| {
                    Some((lo.trim().parse::<u16>().ok()?, hi.trim().parse::<u16>().ok()?))
                });
                match parsed {
                    Some((lo, hi)) if lo > 0 && lo <= hi => Some((lo, hi)),
                    _ => return Err(format!("FI_METAROCE_PORT_RANGE={v}: expected LOW-HIGH")),
                }
            }
            Err(_) => None,
        };
        // Loopback carries 64 KiB datagrams; an Ethernet link 1,500 bytes.
        let default_mtu = if bind.ip().is_loopback() { 8192 } else { 1024 };
        // Loopback has one path: spraying over several sockets only
        // reorders datagrams there (each socket's batch leaves in turn).
        let default_paths = if bind.ip().is_loopback() { 1 } else { 4 };
        let settings = Settings {
            bind,
            port_range,
            paths: var("FI_METAROCE_PATHS", default_paths)?,
            mtu: var("FI_METAROCE_MTU", default_mtu)?,
            rate_mbps: var("FI_METAROCE_RATE_MBPS", 40_000)?,
            rx_slots: var("FI_METAROCE_RX_SLOTS", 32)?,
            timeout: Duration::from_millis(var("FI_METAROCE_TIMEOUT_MS", 5_000)?),
        };
        if !(1..=16).contains(&settings.paths) {
            return Err(format!("FI_METAROCE_PATHS={}: 1..=16", settings.paths));
        }
        if !(256..=9_000).contains(&settings.mtu) {
            return Err(format!("FI_METAROCE_MTU={}: 256..=9000", settings.mtu));
        }
        if !(2..=64).contains(&settings.rx_slots) {
            return Err(format!("FI_METAROCE_RX_SLOTS={}: 2..=64", settings.rx_slots));
        }
        Ok(settings)
    }
}

/// Where an endpoint reports and resolves (`fi_ep_bind`).
#[derive(Debug, Default, Clone)]
pub struct Bindings {
    pub tx_cq: Option<Arc<CompletionQueue>>,
    pub rx_cq: Option<Arc<CompletionQueue>>,
    pub av: Option<Arc<AddressVector>>,
    /// `FI_SELECTIVE_COMPLETION` on the transmit side: only operations
    /// flagged `FI_COMPLETION` report success.
    pub tx_selective: bool,
    pub rx_selective: bool,
}

/// Buffers of the provider registered once: transmit slots.
#[derive(Debug)]
struct SlotPool {
    buf: Box<[u8]>,
    key: u32,
    slot_len: usize,
    free: Vec<u32>,
}

impl SlotPool {
    fn addr(&self, slot: u32) -> u64 {
        self.buf.as_ptr() as u64 + u64::from(slot) * self.slot_len as u64
    }

    fn bytes(&mut self, slot: u32) -> &mut [u8] {
        let start = slot as usize * self.slot_len;
        &mut self.buf[start..start + self.slot_len]
    }
}

/// A connection and the receive buffers it keeps posted.
#[derive(Debug)]
struct Conn {
    peer: SocketAddr,
    ring: Box<[u8]>,
    ring_key: u32,
    ring_range: RangeId,
    slot_len: usize,
    /// Closed or failed: released once its completions are handled.
    dead: bool,
}

impl Conn {
    fn slot_addr(&self, slot: u32) -> u64 {
        self.ring.as_ptr() as u64 + u64::from(slot) * self.slot_len as u64
    }

    fn slot(&self, slot: u32) -> &[u8] {
        let start = slot as usize * self.slot_len;
        &self.ring[start..start + self.slot_len]
    }
}

/// A region the provider registered for one operation (a buffer without
/// a descriptor), deregistered when the operation ends.
#[derive(Debug, Clone, Copy)]
struct TempRegion {
    key: u32,
    base: u64,
    range: RangeId,
}

/// What to do when a MetaRoCE work request completes.
#[derive(Debug)]
enum Pending {
    /// An eager message or an injected one: free the slot, report.
    Eager {
        slot: u32,
        report: Option<CqEntry>,
    },
    /// A rendezvous request: the application's completion waits for FIN.
    Rts { slot: u32, rndv: u32 },
    /// A FIN: free the slot.
    Fin { slot: u32 },
    /// An RMA operation.
    Rma {
        report: Option<CqEntry>,
        temp: Option<TempRegion>,
        slot: Option<u32>,
    },
    /// A rendezvous READ into the matched receive.
    RndvRead {
        recv: PostedRecv,
        arrival: Arrival,
        temp: Option<TempRegion>,
        /// Bytes READ (the receive's capacity if the message is longer).
        len: usize,
        src: u64,
        flags: u64,
    },
}

/// A rendezvous send waiting for its FIN.
#[derive(Debug)]
struct RndvSend {
    temp: Option<TempRegion>,
    report: Option<CqEntry>,
    /// A gathered copy of a multi-buffer message (its memory is READ).
    _staging: Option<Vec<u8>>,
}

/// Work the provider itself must post but could not yet (ring full).
#[derive(Debug, Clone, Copy)]
enum Deferred {
    Fin { conn: ConnHandle, rndv: u32, status: u16 },
    Recv { conn: ConnHandle, slot: u32 },
}

/// Counters of the provider's own decisions (`fi_metaroce_stats`-style,
/// printed by tests on failure).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub eager_sent: u64,
    pub rndv_sent: u64,
    pub unexpected: u64,
    pub malformed: u64,
    pub connections_opened: u64,
    pub connections_accepted: u64,
    pub connections_failed: u64,
    /// Of the MetaRoCE connections (closed and open): reliable packets
    /// sent, retransmitted, declared lost, timeouts, receiver-not-ready
    /// NAKs received, duplicates received.
    pub packets_sent: u64,
    pub retransmissions: u64,
    pub packets_lost: u64,
    pub timeouts: u64,
    pub rnr_naks: u64,
    pub duplicates: u64,
}

impl Stats {
    fn add_connection(&mut self, c: &metaroce_core::stats::ConnStats) {
        self.packets_sent += c.packets_sent;
        self.retransmissions += c.retransmissions;
        self.packets_lost += c.packets_lost;
        self.timeouts += c.timeouts;
        self.rnr_naks += c.rnr_naks_received;
        self.duplicates += c.duplicates_received;
    }
}

/// One domain's transport. Every method runs under the domain's lock.
#[derive(Debug)]
pub struct Transport {
    node: Node<AppMemory>,
    pub bindings: Bindings,
    settings: Settings,
    /// The connection this side opened to each peer.
    out: HashMap<SocketAddr, ConnHandle>,
    conns: HashMap<u64, Conn>,
    tx: SlotPool,
    msgs: Queue,
    tagged: Queue,
    pending: HashMap<u64, Pending>,
    next_wr: u64,
    rndv_sends: HashMap<u32, RndvSend>,
    next_rndv: u32,
    deferred: VecDeque<Deferred>,
    /// Messages an `FI_PEEK | FI_CLAIM` set aside, by the claiming context.
    claimed: HashMap<usize, (bool, Arrival)>,
    /// Registered regions by key: `(base, range)`.
    regions: HashMap<u32, (u64, RangeId)>,
    pub stats: Stats,
}

/// What the application asks a message send to do.
#[derive(Debug, Clone)]
pub struct SendArgs<'a> {
    pub dest: u64,
    pub iov: &'a [(usize, usize)],
    pub tag: Option<u64>,
    pub data: Option<u32>,
    pub context: usize,
    /// Report a completion.
    pub completion: bool,
    /// `fi_inject`: copy now, never report.
    pub inject: bool,
}

/// An RMA operation.
#[derive(Debug, Clone, Copy)]
pub enum RmaOp {
    Write,
    WriteData(u32),
    Read,
}

/// What the application asks an RMA operation to do.
#[derive(Debug, Clone, Copy)]
pub struct RmaArgs {
    pub op: RmaOp,
    pub dest: u64,
    pub buf: usize,
    pub len: usize,
    /// Key of the local buffer's region (from its descriptor), if any.
    pub local_key: Option<u32>,
    pub remote_addr: u64,
    pub remote_key: u64,
    pub context: usize,
    pub completion: bool,
    pub inject: bool,
}

/// The completion flags of a message.
fn msg_flags(tagged: bool, direction: u64) -> u64 {
    direction | if tagged { flags::TAGGED } else { flags::MSG }
}

/// The libfabric error of a MetaRoCE completion status.
pub fn fi_errno_of(status: Status) -> i32 {
    match status {
        Status::Success => 0,
        Status::LocalProtection => errno::EINVAL,
        Status::RemoteInvalidKey => errno::EKEYREJECTED,
        Status::RemoteAccess => errno::EACCES,
        Status::RemoteBounds => errno::EINVAL,
        Status::RemoteProtocol => errno::EREMOTEIO,
        Status::ReceiveTooSmall => errno::ETRUNC,
        Status::RetryExceeded => errno::ETIMEDOUT,
        Status::ReceiverNotReadyExceeded => errno::ENORX,
        Status::Flushed => errno::ECANCELED,
    }
}

/// `prov_errno` of a status: its number in spec chapter 6's completion
/// status table.
pub fn prov_errno_of(status: Status) -> i32 {
    match status {
        Status::Success => 0,
        Status::LocalProtection => 1,
        Status::RemoteInvalidKey => 2,
        Status::RemoteAccess => 3,
        Status::RemoteBounds => 4,
        Status::RemoteProtocol => 5,
        Status::ReceiveTooSmall => 6,
        Status::RetryExceeded => 7,
        Status::ReceiverNotReadyExceeded => 8,
        Status::Flushed => 9,
    }
}

fn status_of_wire(code: u16) -> Status {
    match code {
        0 => Status::Success,
        1 => Status::LocalProtection,
        2 => Status::RemoteInvalidKey,
        3 => Status::RemoteAccess,
        4 => Status::RemoteBounds,
        5 => Status::RemoteProtocol,
        6 => Status::ReceiveTooSmall,
        7 => Status::RetryExceeded,
        8 => Status::ReceiverNotReadyExceeded,
        _ => Status::Flushed,
    }
}

fn command_errno(e: CommandError) -> i32 {
    match e {
        CommandError::QueueFull => errno::EAGAIN,
        CommandError::NotOpen => errno::EIO,
        _ => errno::EINVAL,
    }
}

impl Transport {
    /// Binds the sockets and creates the endpoint.
    pub fn new(settings: Settings) -> Result<Transport, String> {
        let node = Self::bind(&settings)?;
        let mut t = Transport {
            node,
            bindings: Bindings::default(),
            tx: SlotPool {
                buf: vec![0u8; TX_SLOTS * TX_SLOT_LEN].into_boxed_slice(),
                key: 0,
                slot_len: TX_SLOT_LEN,
                free: (0..TX_SLOTS as u32).rev().collect(),
            },
            settings,
            out: HashMap::new(),
            conns: HashMap::new(),
            msgs: Queue::default(),
            tagged: Queue::default(),
            pending: HashMap::new(),
            next_wr: 1,
            rndv_sends: HashMap::new(),
            next_rndv: 1,
            deferred: VecDeque::new(),
            claimed: HashMap::new(),
            regions: HashMap::new(),
            stats: Stats::default(),
        };
        let base = t.tx.buf.as_ptr() as u64;
        let len = t.tx.buf.len() as u64;
        t.tx.key = t
            .register(base, len, Access::ALL)
            .map_err(|e| format!("cannot register the transmit buffers ({e})"))?;
        Ok(t)
    }

    fn bind(settings: &Settings) -> Result<Node<AppMemory>, String> {
        let span = settings.paths * 2;
        let config = |port: u16, entropy_base: Option<u16>| NodeConfig {
            bind: SocketAddr::new(settings.bind.ip(), port),
            paths: settings.paths,
            entropy_base,
            mtu: settings.mtu,
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
            }
        };
        match settings.port_range {
            None => Node::bind_with(
                &config(settings.bind.port(), None),
                None,
                AppMemory::default(),
                adjust,
            )
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
                        Ok(node) => return Ok(node),
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

    /// The address peers reach this domain at.
    pub fn local_addr(&self) -> SocketAddr {
        self.node.local_addr()
    }

    /// The settings the transport runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The receive socket, for a thread that waits on it.
    pub fn receive_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.node.receive_fd()
    }

    /// How long the transport may sleep (at most `max`).
    pub fn idle_wait(&self, max: Duration) -> Duration {
        if self.deferred.is_empty() {
            self.node.idle_wait(max)
        } else {
            Duration::ZERO
        }
    }

    // ----- Memory -------------------------------------------------------

    /// Registers `[base, base + len)` with `access`; returns its key.
    pub fn register(&mut self, base: u64, len: u64, access: Access) -> Result<u32, i32> {
        if base.checked_add(len).is_none() {
            return Err(errno::EINVAL);
        }
        let key = self
            .node
            .ep
            .register_region(Region {
                base,
                len,
                access,
                pd: 0,
            })
            .map_err(|_| errno::ENOMEM)?;
        let range = self.node.mem.add(base, len);
        self.regions.insert(key, (base, range));
        Ok(key)
    }

    /// Deregisters the region of `key`.
    pub fn deregister(&mut self, key: u32) -> Result<(), i32> {
        let (base, range) = self.regions.remove(&key).ok_or(errno::ENOENT)?;
        let _ = self.node.ep.deregister_region(key);
        self.node.mem.remove(base, range);
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies in the region of `key`.
    pub fn region_covers(&self, key: u32, addr: u64, len: u64) -> bool {
        self.node
            .ep
            .regions()
            .get(key)
            .is_some_and(|r| r.contains(addr, len))
    }

    fn temp_region(&mut self, base: u64, len: u64, access: Access) -> Result<TempRegion, i32> {
        let key = self.register(base, len.max(1), access)?;
        let range = self.regions[&key].1;
        Ok(TempRegion { key, base, range })
    }

    fn drop_temp(&mut self, temp: Option<TempRegion>) {
        if let Some(t) = temp {
            let _ = t.range;
            let _ = self.deregister(t.key);
            let _ = t.base;
        }
    }

    // ----- Connections --------------------------------------------------

    fn peer_of(&self, fi_addr: u64) -> Result<SocketAddr, i32> {
        let av = self.bindings.av.as_ref().ok_or(errno::ENOAV)?;
        av.lookup(fi_addr).ok_or(errno::EINVAL)
    }

    fn src_of(&self, conn: u64) -> u64 {
        match (self.conns.get(&conn), &self.bindings.av) {
            (Some(c), Some(av)) => av.reverse(c.peer),
            _ => ADDR_NOTAVAIL,
        }
    }

    /// The connection this side sends to `peer` on, opened if needed.
    fn conn_to(&mut self, peer: SocketAddr) -> Result<ConnHandle, i32> {
        if let Some(&h) = self.out.get(&peer) {
            if self.conns.get(&h.to_bits()).is_some_and(|c| !c.dead) {
                return Ok(h);
            }
        }
        let h = self.node.connect(peer).map_err(|e| match e {
            CommandError::QueueFull => errno::EAGAIN,
            _ => errno::ENOMEM,
        })?;
        self.stats.connections_opened += 1;
        self.add_conn(h, peer, true)?;
        self.out.insert(peer, h);
        Ok(h)
    }

    /// Registers a connection's receive buffers and posts them.
    fn add_conn(&mut self, h: ConnHandle, peer: SocketAddr, outgoing: bool) -> Result<(), i32> {
        let (slots, slot_len) = if outgoing {
            (FIN_SLOTS, HEADER_LEN)
        } else {
            (self.settings.rx_slots, HEADER_LEN + EAGER_LIMIT)
        };
        let ring = vec![0u8; slots * slot_len].into_boxed_slice();
        let base = ring.as_ptr() as u64;
        let key = self.register(base, ring.len() as u64, Access::LOCAL_WRITE)?;
        let ring_range = self.regions[&key].1;
        self.conns.insert(
            h.to_bits(),
            Conn {
                peer,
                ring,
                ring_key: key,
                ring_range,
                slot_len,
                dead: false,
            },
        );
        for slot in 0..slots as u32 {
            self.post_ring_recv(h, slot);
        }
        Ok(())
    }

    fn post_ring_recv(&mut self, h: ConnHandle, slot: u32) {
        let Some(c) = self.conns.get(&h.to_bits()) else {
            return;
        };
        if c.dead {
            return;
        }
        let rr = RecvRequest {
            id: RECV_BIT | (u64::from(h.index) << 32) | u64::from(slot),
            local: LocalBuf {
                key: c.ring_key,
                addr: c.slot_addr(slot),
                len: c.slot_len as u32,
            },
        };
        match self.node.post_recv(h, rr) {
            Ok(()) => {}
            Err(CommandError::QueueFull) => self.deferred.push_back(Deferred::Recv { conn: h, slot }),
            Err(_) => {}
        }
    }

    fn release_conn(&mut self, h: ConnHandle) {
        if let Some(stats) = self.node.ep.stats(h) {
            self.stats.add_connection(&stats);
        }
        if let Some(c) = self.conns.remove(&h.to_bits()) {
            let _ = self.deregister(c.ring_key);
            let _ = c.ring_range;
            if self.out.get(&c.peer) == Some(&h) {
                self.out.remove(&c.peer);
            }
        }
        let _ = self.node.ep.release(h);
    }

    // ----- Posting ------------------------------------------------------

    fn wr_id(&mut self, p: Pending) -> u64 {
        let id = self.next_wr;
        self.next_wr = (self.next_wr + 1) & !RECV_BIT;
        self.pending.insert(id, p);
        id
    }

    /// Posts `op` with `local` on `h`; on refusal takes back the pending
    /// record and returns it with the error.
    fn post(
        &mut self,
        h: ConnHandle,
        op: Op,
        local: LocalBuf,
        p: Pending,
    ) -> Result<(), (i32, Pending)> {
        let id = self.wr_id(p);
        match self.node.post_send(h, WorkRequest { id, op, local }) {
            Ok(()) => Ok(()),
            Err(e) => {
                let p = self.pending.remove(&id).expect("just inserted");
                Err((command_errno(e), p))
            }
        }
    }

    fn take_slot(&mut self) -> Result<u32, i32> {
        self.tx.free.pop().ok_or(errno::EAGAIN)
    }

    /// `fi_send`, `fi_tsend` and their variants.
    pub fn send(&mut self, args: &SendArgs<'_>) -> Result<(), i32> {
        let mut total = 0usize;
        for &(ptr, len) in args.iov {
            if ptr == 0 && len != 0 {
                return Err(errno::EINVAL);
            }
            total = total.checked_add(len).ok_or(errno::EMSGSIZE)?;
        }
        if total > MAX_MSG || (args.inject && total > INJECT_LIMIT) {
            return Err(errno::EMSGSIZE);
        }
        let peer = self.peer_of(args.dest)?;
        let h = self.conn_to(peer)?;
        let tagged = args.tag.is_some();
        let report = (args.completion && !args.inject).then(|| CqEntry {
            len: total,
            ..CqEntry::new(args.context, msg_flags(tagged, flags::SEND))
        });
        let mut header = Header::new(Kind::Eager);
        header.tagged = tagged;
        header.tag = args.tag.unwrap_or(0);
        header.data = args.data;
        header.len = total as u64;
        let slot = self.take_slot()?;
        if total <= EAGER_LIMIT {
            let bytes = self.tx.bytes(slot);
            header.emit(bytes);
            let mut at = HEADER_LEN;
            for &(ptr, len) in args.iov {
                if len > 0 {
                    // SAFETY: the application passes `len` readable bytes
                    // at `ptr` (checked non-null above), valid for the call.
                    let src = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
                    bytes[at..at + len].copy_from_slice(src);
                    at += len;
                }
            }
            let local = LocalBuf {
                key: self.tx.key,
                addr: self.tx.addr(slot),
                len: (HEADER_LEN + total) as u32,
            };
            return match self.post(h, Op::Send, local, Pending::Eager { slot, report }) {
                Ok(()) => {
                    self.stats.eager_sent += 1;
                    self.kick();
                    Ok(())
                }
                Err((e, _)) => {
                    self.tx.free.push(slot);
                    Err(e)
                }
            };
        }
        // Rendezvous: the receiver READs the message from its buffer (a
        // gathered copy when it is in several pieces).
        let (staging, base) = if args.iov.len() == 1 {
            (None, args.iov[0].0 as u64)
        } else {
            let mut copy = Vec::with_capacity(total);
            for &(ptr, len) in args.iov {
                if len > 0 {
                    // SAFETY: as for the eager copy above.
                    copy.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(ptr as *const u8, len)
                    });
                }
            }
            let base = copy.as_ptr() as u64;
            (Some(copy), base)
        };
        let temp = match self.temp_region(base, total as u64, Access::REMOTE_READ) {
            Ok(t) => t,
            Err(e) => {
                self.tx.free.push(slot);
                return Err(e);
            }
        };
        let rndv = self.next_rndv;
        self.next_rndv = self.next_rndv.wrapping_add(1).max(1);
        header.kind = Kind::Rts;
        header.rndv_id = rndv;
        header.key = temp.key;
        header.addr = base;
        header.emit(self.tx.bytes(slot));
        let local = LocalBuf {
            key: self.tx.key,
            addr: self.tx.addr(slot),
            len: HEADER_LEN as u32,
        };
        match self.post(h, Op::Send, local, Pending::Rts { slot, rndv }) {
            Ok(()) => {
                self.rndv_sends.insert(
                    rndv,
                    RndvSend {
                        temp: Some(temp),
                        report,
                        _staging: staging,
                    },
                );
                self.stats.rndv_sent += 1;
                self.kick();
                Ok(())
            }
            Err((e, _)) => {
                self.tx.free.push(slot);
                self.drop_temp(Some(temp));
                Err(e)
            }
        }
    }

    /// `fi_recv`, `fi_trecv` and their variants.
    pub fn recv(&mut self, recv: PostedRecv, tagged: bool) -> Result<(), i32> {
        for &(ptr, len) in &recv.iov {
            if ptr == 0 && len != 0 {
                return Err(errno::EINVAL);
            }
        }
        let src_of = |conn: u64| self.src_of(conn);
        let srcs: HashMap<u64, u64> = self.conns.keys().map(|&c| (c, src_of(c))).collect();
        let lookup = |c: u64| srcs.get(&c).copied().unwrap_or(ADDR_NOTAVAIL);
        let matched = if tagged {
            self.tagged.post(recv, lookup)
        } else {
            self.msgs.post(recv, lookup)
        };
        if let Some((recv, arrival)) = matched {
            self.deliver(recv, arrival, tagged);
            self.kick();
        }
        Ok(())
    }

    /// `fi_trecvmsg` with `FI_PEEK` (and `FI_CLAIM` / `FI_DISCARD`):
    /// `Ok(true)` when a message matched (its completion is queued).
    pub fn peek(&mut self, recv: &PostedRecv, claim: bool, discard: bool) -> bool {
        self.progress();
        let srcs: HashMap<u64, u64> = self.conns.keys().map(|&c| (c, self.src_of(c))).collect();
        let lookup = |c: u64| srcs.get(&c).copied().unwrap_or(ADDR_NOTAVAIL);
        let Some(i) = self
            .tagged
            .find_unexpected(recv.src, recv.tag, recv.ignore, &lookup)
        else {
            self.report_rx_error(
                CqEntry::new(recv.context, msg_flags(true, flags::RECV)),
                errno::ENOMSG,
                0,
                0,
            );
            return false;
        };
        let a = self.tagged.unexpected(i).expect("found").clone();
        let entry = CqEntry {
            len: a.body.len() as usize,
            tag: a.tag,
            data: u64::from(a.data.unwrap_or(0)),
            src: lookup(a.conn),
            ..CqEntry::new(
                recv.context,
                msg_flags(true, flags::RECV)
                    | if a.data.is_some() {
                        flags::REMOTE_CQ_DATA
                    } else {
                        0
                    },
            )
        };
        if claim || discard {
            let a = self.tagged.take_unexpected(i).expect("found");
            if discard {
                self.discard(a);
            } else {
                self.claimed.insert(recv.context, (true, a));
            }
        }
        self.report_rx(entry);
        true
    }

    /// `fi_trecvmsg` with `FI_CLAIM`: receives the message a peek claimed
    /// under `recv.context` (or discards it).
    pub fn claim(&mut self, recv: PostedRecv, discard: bool) -> Result<(), i32> {
        let (tagged, arrival) = self.claimed.remove(&recv.context).ok_or(errno::ENOMSG)?;
        if discard {
            let entry = CqEntry::new(recv.context, msg_flags(tagged, flags::RECV));
            self.discard(arrival);
            self.report_rx(entry);
        } else {
            self.deliver(recv, arrival, tagged);
        }
        self.kick();
        Ok(())
    }

    /// Drops a message nobody will receive; a rendezvous is told.
    fn discard(&mut self, a: Arrival) {
        if let Body::Rts { rndv_id, .. } = a.body {
            self.send_fin(ConnHandle::from_bits(a.conn), rndv_id, 0);
        }
    }

    /// `fi_cancel`: a posted receive of `context` ends with `FI_ECANCELED`.
    pub fn cancel(&mut self, context: usize) -> bool {
        for tagged in [false, true] {
            let q = if tagged {
                &mut self.tagged
            } else {
                &mut self.msgs
            };
            if let Some(r) = q.cancel(context) {
                self.report_rx_error(
                    CqEntry::new(r.context, msg_flags(tagged, flags::RECV)),
                    errno::ECANCELED,
                    0,
                    0,
                );
                return true;
            }
        }
        false
    }

    /// `fi_write`, `fi_writedata`, `fi_read` and their variants.
    pub fn rma(&mut self, args: RmaArgs) -> Result<(), i32> {
        if args.buf == 0 && args.len != 0 {
            return Err(errno::EINVAL);
        }
        if args.len > MAX_MSG || (args.inject && args.len > INJECT_LIMIT) {
            return Err(errno::EMSGSIZE);
        }
        let remote_key = u32::try_from(args.remote_key).map_err(|_| errno::EINVAL)?;
        let peer = self.peer_of(args.dest)?;
        let h = self.conn_to(peer)?;
        let (op, direction) = match args.op {
            RmaOp::Write => (
                Op::Write {
                    remote: MemoryTarget {
                        key: remote_key,
                        addr: args.remote_addr,
                    },
                },
                flags::WRITE,
            ),
            RmaOp::WriteData(imm) => (
                Op::WriteImm {
                    remote: MemoryTarget {
                        key: remote_key,
                        addr: args.remote_addr,
                    },
                    imm,
                },
                flags::WRITE,
            ),
            RmaOp::Read => (
                Op::Read {
                    remote: MemoryTarget {
                        key: remote_key,
                        addr: args.remote_addr,
                    },
                },
                flags::READ,
            ),
        };
        let report = (args.completion && !args.inject).then(|| CqEntry {
            len: args.len,
            ..CqEntry::new(args.context, flags::RMA | direction)
        });
        let access = if matches!(args.op, RmaOp::Read) {
            Access::LOCAL_WRITE
        } else {
            Access(0)
        };
        let (local, temp, slot) = if args.inject {
            let slot = self.take_slot()?;
            // SAFETY: the application passes `len` readable bytes at `buf`
            // (non-null checked above), valid for the call.
            let src = unsafe { std::slice::from_raw_parts(args.buf as *const u8, args.len) };
            self.tx.bytes(slot)[..args.len].copy_from_slice(src);
            let local = LocalBuf {
                key: self.tx.key,
                addr: self.tx.addr(slot),
                len: args.len as u32,
            };
            (local, None, Some(slot))
        } else {
            match args.local_key {
                Some(key) => {
                    if !self.region_covers(key, args.buf as u64, args.len as u64) {
                        return Err(errno::EINVAL);
                    }
                    let local = LocalBuf {
                        key,
                        addr: args.buf as u64,
                        len: args.len as u32,
                    };
                    (local, None, None)
                }
                None => {
                    let temp = self.temp_region(args.buf as u64, args.len as u64, access)?;
                    let local = LocalBuf {
                        key: temp.key,
                        addr: args.buf as u64,
                        len: args.len as u32,
                    };
                    (local, Some(temp), None)
                }
            }
        };
        match self.post(h, op, local, Pending::Rma { report, temp, slot }) {
            Ok(()) => {
                self.kick();
                Ok(())
            }
            Err((e, _)) => {
                if let Some(slot) = slot {
                    self.tx.free.push(slot);
                }
                self.drop_temp(temp);
                Err(e)
            }
        }
    }

    // ----- Progress -----------------------------------------------------

    /// Sends what was just posted (and takes what arrived meanwhile).
    fn kick(&mut self) {
        self.progress();
    }

    /// Runs the engine and handles what it reports. Returns whether
    /// anything happened.
    pub fn progress(&mut self) -> bool {
        let mut any = false;
        for _ in 0..4 {
            self.retry_deferred();
            if !self.node.progress() {
                break;
            }
            any = true;
            while let Some(e) = self.node.events.pop_front() {
                self.on_event(e);
            }
            while let Some(c) = self.node.completions.pop_front() {
                self.on_completion(c);
            }
            let dead: Vec<ConnHandle> = self
                .conns
                .iter()
                .filter(|(_, c)| c.dead)
                .map(|(&bits, _)| ConnHandle::from_bits(bits))
                .collect();
            for h in dead {
                self.release_conn(h);
            }
        }
        any
    }

    fn retry_deferred(&mut self) {
        for _ in 0..self.deferred.len() {
            let Some(d) = self.deferred.pop_front() else {
                break;
            };
            match d {
                Deferred::Recv { conn, slot } => self.post_ring_recv(conn, slot),
                Deferred::Fin { conn, rndv, status } => self.send_fin(conn, rndv, status),
            }
        }
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Incoming { conn, peer } => {
                self.stats.connections_accepted += 1;
                if self.add_conn(conn, socket_of(peer), false).is_err() {
                    let now = self.node.now();
                    let _ = self.node.ep.close(now, conn);
                }
            }
            Event::Connected(_) => {}
            Event::Closed { conn, .. } | Event::Failed { conn, .. } => {
                if matches!(e, Event::Failed { .. }) {
                    self.stats.connections_failed += 1;
                }
                if let Some(c) = self.conns.get_mut(&conn.to_bits()) {
                    c.dead = true;
                    if self.out.get(&c.peer) == Some(&conn) {
                        self.out.remove(&c.peer);
                    }
                }
            }
        }
    }

    fn on_completion(&mut self, c: Completion) {
        if c.wr_id & RECV_BIT != 0 {
            return self.on_receive(c);
        }
        let Some(p) = self.pending.remove(&c.wr_id) else {
            return;
        };
        let ok = c.status == Status::Success;
        match p {
            Pending::Eager { slot, report } => {
                self.tx.free.push(slot);
                self.report_tx(report, c.status);
            }
            Pending::Fin { slot } => self.tx.free.push(slot),
            Pending::Rts { slot, rndv } => {
                self.tx.free.push(slot);
                if !ok {
                    self.finish_rndv_send(rndv, c.status);
                }
            }
            Pending::Rma { report, temp, slot } => {
                if let Some(slot) = slot {
                    self.tx.free.push(slot);
                }
                self.drop_temp(temp);
                self.report_tx(report, c.status);
            }
            Pending::RndvRead {
                recv,
                arrival,
                temp,
                len,
                src,
                flags,
            } => {
                self.drop_temp(temp);
                let Body::Rts { len: total, rndv_id, .. } = arrival.body else {
                    return;
                };
                let status = if ok { 0 } else { prov_errno_of(c.status) as u16 };
                self.send_fin(ConnHandle::from_bits(arrival.conn), rndv_id, status);
                if ok {
                    self.complete_recv(&recv, &arrival, len, total as usize, src, flags);
                } else {
                    self.report_rx_error(
                        CqEntry {
                            tag: arrival.tag,
                            src,
                            ..CqEntry::new(recv.context, flags)
                        },
                        fi_errno_of(c.status),
                        prov_errno_of(c.status),
                        0,
                    );
                }
            }
        }
    }

    /// A receive buffer of the provider's completed.
    fn on_receive(&mut self, c: Completion) {
        let h = c.conn;
        let slot = c.wr_id as u32;
        if c.status != Status::Success {
            return;
        }
        let src = self.src_of(h.to_bits());
        if c.opcode == Opcode::RecvWriteImm {
            // The peer's fi_writedata: its data is reported here; the
            // receive is the provider's, so it is posted again at once.
            let entry = CqEntry {
                len: c.byte_len as usize,
                data: u64::from(c.imm.unwrap_or(0)),
                src,
                ..CqEntry::new(0, flags::RMA | flags::REMOTE_WRITE | flags::REMOTE_CQ_DATA)
            };
            self.post_ring_recv(h, slot);
            self.report_rx(entry);
            return;
        }
        let Some(conn) = self.conns.get(&h.to_bits()) else {
            return;
        };
        let bytes = &conn.slot(slot)[..(c.byte_len as usize).min(conn.slot_len)];
        let header = match Header::parse(bytes) {
            Ok(h) => h,
            Err(_) => {
                self.stats.malformed += 1;
                self.post_ring_recv(h, slot);
                return;
            }
        };
        let arrival = match header.kind {
            Kind::Fin => {
                self.post_ring_recv(h, slot);
                self.finish_rndv_send(header.rndv_id, status_of_wire(header.status));
                return;
            }
            Kind::Eager => Arrival {
                conn: h.to_bits(),
                tag: header.tag,
                data: header.data,
                body: Body::Eager(bytes[HEADER_LEN..].to_vec()),
            },
            Kind::Rts => Arrival {
                conn: h.to_bits(),
                tag: header.tag,
                data: header.data,
                body: Body::Rts {
                    len: header.len,
                    key: header.key,
                    addr: header.addr,
                    rndv_id: header.rndv_id,
                },
            },
        };
        // The bytes are copied out: the buffer goes back at once.
        self.post_ring_recv(h, slot);
        let queue = if header.tagged {
            &mut self.tagged
        } else {
            &mut self.msgs
        };
        match queue.arrive(arrival, src) {
            Some((recv, arrival)) => self.deliver(recv, arrival, header.tagged),
            None => self.stats.unexpected += 1,
        }
    }

    /// A message met its receive: copy it (eager) or READ it (rendezvous).
    fn deliver(&mut self, recv: PostedRecv, arrival: Arrival, tagged: bool) {
        let src = self.src_of(arrival.conn);
        let flags = msg_flags(tagged, flags::RECV)
            | if arrival.data.is_some() {
                flags::REMOTE_CQ_DATA
            } else {
                0
            };
        match &arrival.body {
            Body::Eager(bytes) => {
                let mut at = 0;
                for &(ptr, len) in &recv.iov {
                    let n = len.min(bytes.len() - at);
                    if n > 0 {
                        // SAFETY: the application posted `len` writable
                        // bytes at `ptr` (non-null, checked at post) and
                        // keeps them until the receive completes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), ptr as *mut u8, n)
                        };
                    }
                    at += n;
                }
                let total = bytes.len();
                self.complete_recv(&recv, &arrival, at, total, src, flags);
            }
            &Body::Rts {
                len: total,
                key,
                addr,
                rndv_id,
            } => {
                let h = ConnHandle::from_bits(arrival.conn);
                let want = (total as usize).min(recv.capacity());
                let alive = self.conns.get(&arrival.conn).is_some_and(|c| !c.dead);
                // A single buffer is READ into directly; several through
                // one registered staging copy would need scattering, so
                // the first buffer takes what it holds.
                let (base, len) = match recv.iov.first() {
                    Some(&(ptr, cap)) => (ptr as u64, want.min(cap)),
                    None => (0, 0),
                };
                if !alive {
                    self.report_rx_error(
                        CqEntry {
                            tag: arrival.tag,
                            src,
                            ..CqEntry::new(recv.context, flags)
                        },
                        errno::ECANCELED,
                        prov_errno_of(Status::Flushed),
                        0,
                    );
                    return;
                }
                if len == 0 {
                    self.send_fin(h, rndv_id, 0);
                    self.complete_recv(&recv, &arrival, 0, total as usize, src, flags);
                    return;
                }
                let temp = match self.temp_region(base, len as u64, Access::LOCAL_WRITE) {
                    Ok(t) => t,
                    Err(e) => {
                        self.send_fin(h, rndv_id, prov_errno_of(Status::Flushed) as u16);
                        self.report_rx_error(
                            CqEntry::new(recv.context, flags),
                            e,
                            0,
                            0,
                        );
                        return;
                    }
                };
                let local = LocalBuf {
                    key: temp.key,
                    addr: base,
                    len: len as u32,
                };
                let op = Op::Read {
                    remote: MemoryTarget { key, addr },
                };
                let pending = Pending::RndvRead {
                    recv,
                    arrival,
                    temp: Some(temp),
                    len,
                    src,
                    flags,
                };
                if let Err((_, p)) = self.post(h, op, local, pending) {
                    // The connection's queue is full or closed: fail the
                    // receive and release the sender.
                    if let Pending::RndvRead { recv, temp, .. } = p {
                        self.drop_temp(temp);
                        self.send_fin(h, rndv_id, prov_errno_of(Status::Flushed) as u16);
                        self.report_rx_error(
                            CqEntry::new(recv.context, flags),
                            errno::EIO,
                            0,
                            0,
                        );
                    }
                }
            }
        }
    }

    /// Reports a receive that got `len` of the message's `total` bytes.
    fn complete_recv(
        &mut self,
        recv: &PostedRecv,
        arrival: &Arrival,
        len: usize,
        total: usize,
        src: u64,
        flags: u64,
    ) {
        let entry = CqEntry {
            context: recv.context,
            flags,
            len,
            buf: recv.iov.first().map_or(0, |&(p, _)| p),
            data: u64::from(arrival.data.unwrap_or(0)),
            tag: arrival.tag,
            src,
        };
        if total > len {
            self.report_rx_error(entry, errno::ETRUNC, 0, total - len);
        } else if recv.completion || !self.bindings.rx_selective {
            self.report_rx(entry);
        }
    }

    fn send_fin(&mut self, h: ConnHandle, rndv: u32, status: u16) {
        let Ok(slot) = self.take_slot() else {
            self.deferred.push_back(Deferred::Fin {
                conn: h,
                rndv,
                status,
            });
            return;
        };
        let mut header = Header::new(Kind::Fin);
        header.rndv_id = rndv;
        header.status = status;
        header.emit(self.tx.bytes(slot));
        let local = LocalBuf {
            key: self.tx.key,
            addr: self.tx.addr(slot),
            len: HEADER_LEN as u32,
        };
        match self.post(h, Op::Send, local, Pending::Fin { slot }) {
            Ok(()) => {}
            Err((errno::EAGAIN, _)) => {
                self.tx.free.push(slot);
                self.deferred.push_back(Deferred::Fin {
                    conn: h,
                    rndv,
                    status,
                });
            }
            Err(_) => self.tx.free.push(slot),
        }
    }

    fn finish_rndv_send(&mut self, rndv: u32, status: Status) {
        if let Some(s) = self.rndv_sends.remove(&rndv) {
            self.drop_temp(s.temp);
            self.report_tx(s.report, status);
        }
    }

    fn report_tx(&mut self, report: Option<CqEntry>, status: Status) {
        let Some(entry) = report else {
            return;
        };
        let Some(cq) = &self.bindings.tx_cq else {
            return;
        };
        if status == Status::Success {
            cq.push(CqItem::Done(entry));
        } else {
            cq.push(CqItem::Failed(CqError {
                entry,
                err: fi_errno_of(status),
                prov_errno: prov_errno_of(status),
                olen: 0,
            }));
        }
    }

    fn report_rx(&mut self, entry: CqEntry) {
        if let Some(cq) = &self.bindings.rx_cq {
            cq.push(CqItem::Done(entry));
        }
    }

    fn report_rx_error(&mut self, entry: CqEntry, err: i32, prov_errno: i32, olen: usize) {
        if let Some(cq) = &self.bindings.rx_cq {
            cq.push(CqItem::Failed(CqError {
                entry,
                err,
                prov_errno,
                olen,
            }));
        }
    }

    /// The endpoint closes: its posted receives are dropped silently and
    /// its connections closed.
    pub fn close_endpoint(&mut self) {
        self.msgs.drain_posted();
        self.tagged.drain_posted();
        self.linger();
        let now = self.node.now();
        let handles: Vec<u64> = self.conns.keys().copied().collect();
        for bits in handles {
            let _ = self.node.ep.close(now, ConnHandle::from_bits(bits));
        }
        self.progress();
        self.bindings = Bindings::default();
    }

    /// Runs the engine a little longer before connections close, so the
    /// acknowledgements of what this side received leave: a peer whose
    /// last message arrived must not see it fail because its ACK was
    /// still delayed (spec 4.5) when this side closed.
    fn linger(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let until = std::time::Instant::now() + LINGER;
        while std::time::Instant::now() < until {
            self.progress();
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Messages held unexpected now (tests).
    pub fn unexpected_len(&self) -> usize {
        self.msgs.unexpected_len() + self.tagged.unexpected_len()
    }
}

impl Transport {
    /// The counters, with the open connections' counted in.
    pub fn totals(&self) -> Stats {
        let mut s = self.stats;
        for &bits in self.conns.keys() {
            if let Some(c) = self.node.ep.stats(ConnHandle::from_bits(bits)) {
                s.add_connection(&c);
            }
        }
        s
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        if std::env::var_os("FI_METAROCE_STATS").is_some() {
            let s = self.totals();
            eprintln!(
                "metaroce {}: connections opened {} accepted {} failed {}; messages eager {} rendezvous {} unexpected {} malformed {}; packets sent {} retransmitted {} lost {} timeouts {} rnr_naks {} duplicates {}",
                self.local_addr(),
                s.connections_opened,
                s.connections_accepted,
                s.connections_failed,
                s.eager_sent,
                s.rndv_sent,
                s.unexpected,
                s.malformed,
                s.packets_sent,
                s.retransmissions,
                s.packets_lost,
                s.timeouts,
                s.rnr_naks,
                s.duplicates,
            );
        }
        // Tell peers: a CLOSE is cheaper for them than a timeout.
        self.linger();
        let now = self.node.now();
        let handles: Vec<u64> = self.conns.keys().copied().collect();
        for bits in handles {
            let _ = self.node.ep.close(now, ConnHandle::from_bits(bits));
        }
        self.node.flush();
    }
}
