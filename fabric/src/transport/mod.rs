//! The provider's transport: one MetaRoCE engine per libfabric domain (the
//! host engine over UDP sockets, or a DPU through its host interface:
//! [`backend`]) and the message layer libfabric's reliable-datagram
//! semantics need on top of MetaRoCE's connections.
//!
//! * **Connections.** A peer's connection is opened on the first operation
//!   towards it; incoming connections are accepted. Each side sends its
//!   messages and RMA on the connection it opened itself, so messages from
//!   one sender to one receiver travel in order on one connection
//!   (`FI_ORDER_SAS`); the accepting side uses the connection only to
//!   answer rendezvous (READ, FIN).
//! * **Messages** ([`send`], [`recv`]). Every SEND lands in a provider
//!   buffer (each accepted connection keeps `rx_slots` posted), so a
//!   message never waits for the application to post a receive: up to
//!   [`EAGER_LIMIT`] bytes travel inside the SEND (eager) and are copied
//!   out when a receive matches; longer ones send a request (RTS) and the
//!   receiver READs them into the matched buffer, then answers FIN.
//! * **RMA** maps onto WRITE, WRITE_IMM (remote CQ data) and READ.
//!
//! Memory keys are the engine's; remote addresses are virtual addresses
//! (`FI_MR_VIRT_ADDR`). Where the engine cannot reach application memory
//! (a DPU reaches only its shared window) the transport stages data
//! through window buffers ([`Staged`]).

pub mod backend;
mod recv;
mod send;
mod settings;
mod status;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, RecvRequest, Status, WorkRequest,
};
use metaroce_core::{CommandError, Event};
use metaroce_host::node::socket_of;

pub use send::{RmaArgs, RmaOp, SendArgs};
pub use settings::{device_path, Settings};
use status::{command_errno, status_of_wire};
pub use status::{fi_errno_of, prov_errno_of, Stats};

use crate::flags::{errno, ADDR_NOTAVAIL};
use crate::matching::{Arrival, PostedRecv, Queue};
use crate::queues::{AddressVector, CompletionQueue, CqEntry, CqError, CqItem};
use crate::wire::{Header, Kind, HEADER_LEN};
use backend::Backend;

/// Largest message sent inside its SEND; longer ones use a rendezvous.
pub const EAGER_LIMIT: usize = 16 * 1024;
/// Largest message `fi_inject` takes.
pub const INJECT_LIMIT: usize = 4096;
/// Largest message (a MetaRoCE message's length is 32 bits).
pub const MAX_MSG: usize = 1 << 30;
/// Transmit buffers of the provider (eager messages, RTS, FIN, injected
/// RMA): `fi_info`'s `tx_attr->size`.
pub const TX_SLOTS: usize = 256;
/// Transmit buffers over a DPU, whose window is small.
const TX_SLOTS_DPU: usize = 32;
/// Buffers each connection keeps posted for FINs (opening side).
const FIN_SLOTS: usize = 16;
/// Bytes of one transmit buffer.
const TX_SLOT_LEN: usize = HEADER_LEN + EAGER_LIMIT;
/// How long a closing endpoint keeps acknowledging, as TCP's TIME_WAIT
/// does: a peer whose last message's ACK was lost retransmits it after
/// its retransmission timeout (spec 4.6.4; at least 5 ms in the emulation
/// profile, doubled after each loss), and only an endpoint still running
/// acknowledges the copy. Lingering for the ACK delay alone (2 ms),
/// `fi_pingpong` at 1 % loss sometimes failed at its end: its last send
/// was flushed by this side's CLOSE (spec 4.1.2) although it had arrived.
const LINGER: Duration = Duration::from_millis(25);
/// Internal operations whose wr_id has this bit are receives.
const RECV_BIT: u64 = 1 << 63;

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

/// The provider's transmit buffers, registered once.
#[derive(Debug)]
struct SlotPool {
    base: u64,
    key: u32,
    free: Vec<u32>,
}

impl SlotPool {
    fn addr(&self, slot: u32) -> u64 {
        self.base + u64::from(slot) * TX_SLOT_LEN as u64
    }
}

/// A connection and the receive buffers it keeps posted.
#[derive(Debug)]
struct Conn {
    peer: SocketAddr,
    ring: u64,
    ring_key: u32,
    slot_len: usize,
    /// Closed or failed: released once its completions are handled.
    dead: bool,
}

impl Conn {
    fn slot_addr(&self, slot: u32) -> u64 {
        self.ring + u64::from(slot) * self.slot_len as u64
    }
}

/// Memory registered for one operation, deregistered when it ends: the
/// application's buffer itself, or a provider buffer staging it.
#[derive(Debug, Clone, Copy)]
struct Staged {
    key: u32,
    /// The address the engine uses.
    addr: u64,
    /// A provider buffer to free (staging), `None` for the application's.
    owned: bool,
}

/// What to do when a MetaRoCE work request completes.
#[derive(Debug)]
enum Pending {
    /// An eager message or an injected one: free the slot, report.
    Eager { slot: u32, report: Option<CqEntry> },
    /// A rendezvous request: the application's completion waits for FIN.
    Rts { slot: u32, rndv: u32 },
    /// A FIN: free the slot.
    Fin { slot: u32 },
    /// An RMA operation; a staged READ copies out into `read_into`.
    Rma {
        report: Option<CqEntry>,
        staged: Option<Staged>,
        slot: Option<u32>,
        read_into: Option<(usize, usize)>,
    },
    /// A rendezvous READ into the matched receive.
    RndvRead {
        recv: PostedRecv,
        arrival: Arrival,
        staged: Staged,
        /// Bytes READ (the receive's capacity if the message is longer).
        len: usize,
        src: u64,
        flags: u64,
    },
}

/// A rendezvous send waiting for its FIN.
#[derive(Debug)]
struct RndvSend {
    staged: Staged,
    report: Option<CqEntry>,
    /// A gathered copy of a multi-buffer message (its memory is READ).
    _gather: Option<Vec<u8>>,
}

/// Work the provider itself must post but could not yet (queue full).
#[derive(Debug, Clone, Copy)]
enum Deferred {
    Fin {
        conn: ConnHandle,
        rndv: u32,
        status: u16,
    },
    Recv {
        conn: ConnHandle,
        slot: u32,
    },
}

/// One domain's transport. Every method runs under the domain's lock.
#[derive(Debug)]
pub struct Transport {
    backend: Backend,
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
    /// Bytes being assembled for a provider buffer.
    scratch: Vec<u8>,
    pub stats: Stats,
}

impl Transport {
    /// Opens the backend and registers the transmit buffers.
    pub fn new(settings: Settings) -> Result<Transport, String> {
        let mut backend = Backend::open(&settings)?;
        let slots = if backend.direct() {
            TX_SLOTS
        } else {
            TX_SLOTS_DPU
        };
        let len = slots * TX_SLOT_LEN;
        let base = backend
            .alloc(len)
            .map_err(|_| format!("no room for {len} bytes of transmit buffers"))?;
        let key = backend
            .register(base, len as u64, Access::ALL)
            .map_err(|e| format!("cannot register the transmit buffers ({e})"))?;
        Ok(Transport {
            backend,
            bindings: Bindings::default(),
            tx: SlotPool {
                base,
                key,
                free: (0..slots as u32).rev().collect(),
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
            scratch: Vec::new(),
            stats: Stats::default(),
        })
    }

    /// The address peers reach this domain at.
    pub fn local_addr(&self) -> SocketAddr {
        self.backend.local_addr()
    }

    /// The settings the transport runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Whether application memory is registered as it is (host engine)
    /// rather than staged (DPU).
    pub fn direct(&self) -> bool {
        self.backend.direct()
    }

    /// A descriptor to wait on for arriving work, if the backend has one.
    pub fn wait_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.backend.wait_fd()
    }

    /// How long the transport may sleep (at most `max`).
    pub fn idle_wait(&self, max: Duration) -> Duration {
        if self.deferred.is_empty() {
            self.backend.idle_wait(max)
        } else {
            Duration::ZERO
        }
    }

    // ----- Memory -------------------------------------------------------

    /// Registers the application's `[base, base + len)` with `access`
    /// (`fi_mr_reg`); returns its key. Only where the engine reaches the
    /// application's memory.
    pub fn register(&mut self, base: u64, len: u64, access: Access) -> Result<u32, i32> {
        if !self.backend.direct() {
            return Err(errno::EOPNOTSUPP);
        }
        if base.checked_add(len).is_none() {
            return Err(errno::EINVAL);
        }
        self.backend.register(base, len, access)
    }

    /// Deregisters the region of `key`.
    pub fn deregister(&mut self, key: u32) -> Result<(), i32> {
        self.backend.deregister(key);
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies in the region of `key`.
    pub fn region_covers(&self, key: u32, addr: u64, len: u64) -> bool {
        self.backend.region_covers(key, addr, len)
    }

    /// Registers `len` bytes at the application's `addr` for one
    /// operation, or (DPU) a provider buffer standing in for them, filled
    /// from `fill` when given.
    fn stage(
        &mut self,
        addr: u64,
        len: usize,
        access: Access,
        fill: Option<&[u8]>,
    ) -> Result<Staged, i32> {
        if self.backend.direct() {
            let key = self.backend.register(addr, len.max(1) as u64, access)?;
            return Ok(Staged {
                key,
                addr,
                owned: false,
            });
        }
        self.stage_owned(len, access, fill)
    }

    /// A provider buffer of `len` bytes registered with `access`, filled
    /// from `fill` when given.
    fn stage_owned(
        &mut self,
        len: usize,
        access: Access,
        fill: Option<&[u8]>,
    ) -> Result<Staged, i32> {
        let buf = self.backend.alloc(len.max(1))?;
        if let Some(bytes) = fill {
            self.backend.write(buf, bytes);
        }
        match self.backend.register(buf, len.max(1) as u64, access) {
            Ok(key) => Ok(Staged {
                key,
                addr: buf,
                owned: true,
            }),
            Err(e) => {
                self.backend.free(buf);
                Err(e)
            }
        }
    }

    fn unstage(&mut self, s: Option<Staged>) {
        if let Some(s) = s {
            self.backend.deregister(s.key);
            if s.owned {
                self.backend.free(s.addr);
            }
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

    /// The source address of every connection, for matching.
    fn sources(&self) -> HashMap<u64, u64> {
        self.conns.keys().map(|&c| (c, self.src_of(c))).collect()
    }

    /// The connection this side sends to `peer` on, opened if needed.
    fn conn_to(&mut self, peer: SocketAddr) -> Result<ConnHandle, i32> {
        if let Some(&h) = self.out.get(&peer) {
            if self.conns.get(&h.to_bits()).is_some_and(|c| !c.dead) {
                return Ok(h);
            }
        }
        let h = self.backend.connect(peer)?;
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
        let len = slots * slot_len;
        let ring = self.backend.alloc(len)?;
        let ring_key = match self.backend.register(ring, len as u64, Access::LOCAL_WRITE) {
            Ok(k) => k,
            Err(e) => {
                self.backend.free(ring);
                return Err(e);
            }
        };
        self.conns.insert(
            h.to_bits(),
            Conn {
                peer,
                ring,
                ring_key,
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
        match self.backend.post_recv(h, rr) {
            Ok(()) => {}
            Err(CommandError::QueueFull) => {
                self.deferred.push_back(Deferred::Recv { conn: h, slot })
            }
            Err(_) => {}
        }
    }

    fn release_conn(&mut self, h: ConnHandle) {
        if let Some(stats) = self.backend.conn_stats(h) {
            self.stats.add_connection(&stats);
        }
        if let Some(c) = self.conns.remove(&h.to_bits()) {
            self.backend.deregister(c.ring_key);
            self.backend.free(c.ring);
            if self.out.get(&c.peer) == Some(&h) {
                self.out.remove(&c.peer);
            }
        }
        self.backend.release(h);
    }

    // ----- Posting ------------------------------------------------------

    fn wr_id(&mut self, p: Pending) -> u64 {
        let id = self.next_wr;
        self.next_wr = (self.next_wr + 1) & !RECV_BIT;
        self.pending.insert(id, p);
        id
    }

    /// Posts `op` with `local` on `h`; on refusal takes back the pending
    /// record and returns it with the error (its caller undoes what the
    /// record holds: slots, registrations).
    #[allow(clippy::result_large_err)]
    fn post(
        &mut self,
        h: ConnHandle,
        op: Op,
        local: LocalBuf,
        p: Pending,
    ) -> Result<(), (i32, Pending)> {
        let id = self.wr_id(p);
        match self.backend.post_send(h, WorkRequest { id, op, local }) {
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

    /// Writes `header` and `payload` (pieces) into transmit slot `slot`;
    /// returns the bytes written.
    fn fill_slot(&mut self, slot: u32, header: &Header, payload: &[(usize, usize)]) -> usize {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.resize(HEADER_LEN, 0);
        header.emit(&mut scratch);
        for &(ptr, len) in payload {
            if len > 0 {
                // SAFETY: the application passes `len` readable bytes at
                // `ptr` (non-null, checked by the caller), valid for the
                // call.
                scratch.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(ptr as *const u8, len)
                });
            }
        }
        self.backend.write(self.tx.addr(slot), &scratch);
        let n = scratch.len();
        self.scratch = scratch;
        n
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
        let len = self.fill_slot(slot, &header, &[]);
        let local = LocalBuf {
            key: self.tx.key,
            addr: self.tx.addr(slot),
            len: len as u32,
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
            if !self.backend.progress() {
                break;
            }
            any = true;
            while let Some(e) = self.backend.next_event() {
                self.on_event(e);
            }
            while let Some(c) = self.backend.next_completion() {
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
                let accepted = self.backend.accept(conn).is_ok()
                    && self.add_conn(conn, socket_of(peer), false).is_ok();
                if !accepted {
                    self.backend.close(conn);
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
        match p {
            Pending::Eager { slot, report } => {
                self.tx.free.push(slot);
                self.report_tx(report, c.status);
            }
            Pending::Fin { slot } => self.tx.free.push(slot),
            Pending::Rts { slot, rndv } => {
                self.tx.free.push(slot);
                if c.status != Status::Success {
                    self.finish_rndv_send(rndv, c.status);
                }
            }
            Pending::Rma {
                report,
                staged,
                slot,
                read_into,
            } => {
                if let Some(slot) = slot {
                    self.tx.free.push(slot);
                }
                if let (Some(s), Some((ptr, len)), Status::Success) = (staged, read_into, c.status)
                {
                    self.copy_out(s.addr, &[(ptr, len)], len);
                }
                self.unstage(staged);
                self.report_tx(report, c.status);
            }
            Pending::RndvRead {
                recv,
                arrival,
                staged,
                len,
                src,
                flags,
            } => self.rndv_read_done(c.status, recv, arrival, staged, len, src, flags),
        }
    }

    /// Copies `len` bytes of a provider buffer at `addr` into the
    /// application's buffers `iov`.
    fn copy_out(&mut self, addr: u64, iov: &[(usize, usize)], len: usize) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.resize(len, 0);
        self.backend.read(addr, &mut scratch);
        scatter(&scratch, iov);
        self.scratch = scratch;
    }

    fn finish_rndv_send(&mut self, rndv: u32, status: Status) {
        if let Some(s) = self.rndv_sends.remove(&rndv) {
            self.unstage(Some(s.staged));
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
        let handles: Vec<u64> = self.conns.keys().copied().collect();
        for bits in handles {
            self.backend.close(ConnHandle::from_bits(bits));
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

    /// The counters, with the open connections' counted in.
    pub fn totals(&self) -> Stats {
        let mut s = self.stats;
        for &bits in self.conns.keys() {
            if let Some(c) = self.backend.conn_stats(ConnHandle::from_bits(bits)) {
                s.add_connection(&c);
            }
        }
        s
    }
}

/// Copies `bytes` into the buffers `iov` in order (as much as fits);
/// returns the bytes copied.
fn scatter(bytes: &[u8], iov: &[(usize, usize)]) -> usize {
    let mut at = 0;
    for &(ptr, len) in iov {
        let n = len.min(bytes.len() - at);
        if n > 0 {
            // SAFETY: the application posted `len` writable bytes at `ptr`
            // (non-null, checked at post) and keeps them until the
            // operation completes.
            unsafe { std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), ptr as *mut u8, n) };
        }
        at += n;
    }
    at
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
        let handles: Vec<u64> = self.conns.keys().copied().collect();
        for bits in handles {
            self.backend.close(ConnHandle::from_bits(bits));
        }
        self.backend.flush();
    }
}
