//! The endpoint: connections, memory regions, completions (spec 4).
//!
//! # Using it
//!
//! An [`Endpoint`] is a state machine. It never reads a clock, never does
//! I/O and never allocates; the caller moves bytes and time in and out.
//!
//! * **Getters**: [`Endpoint::state`], [`Endpoint::stats`],
//!   [`Endpoint::path_stats`], [`Endpoint::drops`], [`Endpoint::footprint`].
//! * **Inputs**: [`Endpoint::handle_packet`] for every MetaRoCE packet that
//!   arrives (the UDP payload, with the source address, UDP source port and
//!   ECN CE bit in [`RxMeta`]); [`Endpoint::handle_timeout`] whenever the
//!   deadline from [`Endpoint::poll_timeout`] has passed.
//! * **Commands**: [`Endpoint::register_region`], [`Endpoint::connect`],
//!   [`Endpoint::close`], [`Endpoint::post_send`], [`Endpoint::post_recv`].
//!   Incoming connections are accepted on their own when
//!   [`Config::accept_incoming`] is set and reported as events.
//! * **Outputs**, polled after any input or command, in this order:
//!   [`Endpoint::poll_transmit`] until it returns `None` (each call writes
//!   one packet's headers; its payload is gathered from memory and the CRC
//!   trailer appended, see [`finish_packet`]); [`Endpoint::poll_completion`]
//!   and [`Endpoint::poll_event`] until `None`; then
//!   [`Endpoint::poll_timeout`] for when to call again.
//!
//! Time never goes backwards between calls. Payload is placed during
//! `handle_packet` through the caller's [`Memory`], only after every check
//! passed, and only inside registered regions.

use heapless::Deque;

use crate::api::{Access, Completion, ConnHandle, Memory, PeerAddr, RecvRequest, Region};
use crate::api::{Op, RxMeta, Transmit, WorkRequest};
use crate::config::{Config, EVENT_QUEUE_DEPTH, MAX_WINDOW};
use crate::conn::{CompletionQueue, ConnState, Connection, Event, Outcome};
use crate::memory::{RegionError, RegionTable};
use crate::path::PathStats;
use crate::rng::Rng;
use crate::stats::{ConnStats, DropStats};
use crate::time::Instant;
use crate::wire::encap::ecn;
use crate::wire::{self, Body, CloseReason, CloseRepr, Flags, Header, NakReason, Repr};

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CommandError {
    /// Every connection slot is in use.
    NoFreeConnection,
    /// No connection has this handle.
    UnknownConnection,
    /// The connection is closing, closed or failed.
    NotOpen,
    /// The send or receive queue is full; retry after completions drain.
    QueueFull,
    /// The local buffer is not registered, not in the connection's domain,
    /// lacks the right, or is out of bounds.
    LocalProtection(NakReason),
    /// Registering or deregistering a region failed.
    Region(RegionError),
    /// A READ's local length differs from what the remote side can describe.
    BadLength,
}

/// Bytes of state per connection, split as the engine lays them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Footprint {
    /// `size_of::<Connection<P>>()`.
    pub connection: usize,
    /// Per-PSN sender window (256 PSNs).
    pub window: usize,
    /// All `P` paths.
    pub paths: usize,
    /// One path.
    pub per_path: usize,
    /// Send and receive work queues.
    pub queues: usize,
    /// Everything else: ids, tokens, sequence state, timers, counters.
    pub fixed: usize,
}

/// A MetaRoCE endpoint with up to `C` connections of up to `P` paths each.
#[derive(Debug)]
pub struct Endpoint<const C: usize, const P: usize> {
    config: Config,
    rng: Rng,
    regions: RegionTable,
    conns: [Option<Connection<P>>; C],
    cq: CompletionQueue,
    events: Deque<Event, EVENT_QUEUE_DEPTH>,
    events_lost: u64,
    rejects: Deque<(PeerAddr, u32, u64), 4>,
    next_conn: usize,
    drops: DropStats,
    /// The fair-share hint computed for one instant (reused by every poll
    /// at that instant).
    hint_cache: (Instant, u32),
}

impl<const C: usize, const P: usize> Endpoint<C, P> {
    const _CHECK: () = assert!(C >= 1 && C <= 256 && P >= 1 && P <= 256);

    /// A new endpoint. `seed` must come from a good entropy source outside
    /// tests: tokens, ids and initial PSNs are drawn from it.
    pub fn new(config: Config, seed: u64) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::_CHECK;
        Endpoint {
            config,
            rng: Rng::new(seed),
            regions: RegionTable::default(),
            conns: core::array::from_fn(|_| None),
            cq: Deque::new(),
            events: Deque::new(),
            events_lost: 0,
            rejects: Deque::new(),
            next_conn: 0,
            drops: DropStats::default(),
            hint_cache: (Instant::FAR_FUTURE, 0),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    // ----- Memory regions -------------------------------------------------

    /// Registers a region; returns its key.
    pub fn register_region(&mut self, region: Region) -> Result<u32, CommandError> {
        let random = self.rng.next_u32();
        self.regions
            .register(region, random)
            .map_err(CommandError::Region)
    }

    /// Deregisters a region. Packets naming its key are NAKed from now on.
    pub fn deregister_region(&mut self, key: u32) -> Result<Region, CommandError> {
        self.regions.deregister(key).map_err(CommandError::Region)
    }

    /// The registered regions.
    pub fn regions(&self) -> &RegionTable {
        &self.regions
    }

    // ----- Connections ----------------------------------------------------

    fn free_slot(&mut self) -> Option<usize> {
        if let Some(i) = self.conns.iter().position(Option::is_none) {
            return Some(i);
        }
        // Reuse a closed or failed connection whose work was all completed
        // (a failed one flushed it): a peer that vanished must not hold a
        // slot for good. The new incarnation gets a fresh random id, so the
        // old peer's late packets find no connection.
        self.conns.iter().position(|c| {
            c.as_ref().is_some_and(|c| {
                matches!(c.state(), ConnState::Closed | ConnState::Error) && c.is_idle()
            })
        })
    }

    fn new_local_id(&mut self, slot: usize) -> u32 {
        loop {
            let high = self.rng.next_u32() & !0xff;
            if high != 0 {
                return high | slot as u32;
            }
        }
    }

    /// Opens a connection to `peer` in protection domain `pd`. Work may be
    /// posted at once; it goes out when the handshake completes.
    pub fn connect(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        pd: u32,
    ) -> Result<ConnHandle, CommandError> {
        let slot = self.free_slot().ok_or(CommandError::NoFreeConnection)?;
        let id = self.new_local_id(slot);
        let handle = ConnHandle(slot as u16);
        let mut conn = Connection::new(
            handle,
            id,
            peer,
            pd,
            &self.config,
            &mut self.rng,
            now,
            ConnState::Connecting,
        );
        conn.start_connect(now, &self.config);
        self.conns[slot] = Some(conn);
        Ok(handle)
    }

    /// Closes a connection gracefully: once its sends are acknowledged a
    /// CLOSE goes out; the peer's reply (or a timeout) ends it.
    pub fn close(&mut self, now: Instant, h: ConnHandle) -> Result<(), CommandError> {
        let config = self.config;
        let conn = self
            .conns
            .get_mut(usize::from(h.0))
            .and_then(Option::as_mut)
            .ok_or(CommandError::UnknownConnection)?;
        conn.close(now, &config);
        conn.drain_completions(&mut self.cq);
        Ok(())
    }

    fn conn_mut(&mut self, h: ConnHandle) -> Result<&mut Connection<P>, CommandError> {
        self.conns
            .get_mut(usize::from(h.0))
            .and_then(Option::as_mut)
            .ok_or(CommandError::UnknownConnection)
    }

    /// A connection, for inspection.
    pub fn connection(&self, h: ConnHandle) -> Option<&Connection<P>> {
        self.conns.get(usize::from(h.0)).and_then(Option::as_ref)
    }

    /// Handles of every connection slot in use.
    pub fn handles(&self) -> impl Iterator<Item = ConnHandle> + '_ {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_some())
            .map(|(i, _)| ConnHandle(i as u16))
    }

    /// A connection's state.
    pub fn state(&self, h: ConnHandle) -> Option<ConnState> {
        self.connection(h).map(Connection::state)
    }

    /// A connection's counters.
    pub fn stats(&self, h: ConnHandle) -> Option<ConnStats> {
        self.connection(h).map(Connection::stats)
    }

    /// One path's telemetry.
    pub fn path_stats(&self, h: ConnHandle, path: u8) -> Option<PathStats> {
        let c = self.connection(h)?;
        (u16::from(path) < c.paths.active()).then(|| c.paths.get(path).stats())
    }

    /// Endpoint-wide drops by reason.
    pub fn drops(&self) -> DropStats {
        self.drops
    }

    /// Events dropped because the event queue was full (the state stays
    /// queryable through [`Endpoint::state`]).
    pub fn events_lost(&self) -> u64 {
        self.events_lost
    }

    // ----- Work requests --------------------------------------------------

    /// Posts a send-queue work request (WRITE, WRITE_IMM, SEND, SEND_IMM, READ).
    pub fn post_send(&mut self, h: ConnHandle, wr: WorkRequest) -> Result<(), CommandError> {
        let rights = match wr.op {
            Op::Read { .. } => Access::LOCAL_WRITE,
            _ => Access(0),
        };
        let pd = self
            .connection(h)
            .ok_or(CommandError::UnknownConnection)?
            .pd;
        self.regions
            .check(
                wr.local.key,
                pd,
                wr.local.addr,
                u64::from(wr.local.len),
                rights,
            )
            .map_err(CommandError::LocalProtection)?;
        let conn = self.conn_mut(h)?;
        if !conn.can_post() {
            return Err(CommandError::NotOpen);
        }
        if conn.send_queue_free() == 0 {
            return Err(CommandError::QueueFull);
        }
        conn.post_send(wr).map_err(|_| CommandError::QueueFull)
    }

    /// Posts a receive buffer.
    pub fn post_recv(&mut self, h: ConnHandle, req: RecvRequest) -> Result<(), CommandError> {
        let pd = self
            .connection(h)
            .ok_or(CommandError::UnknownConnection)?
            .pd;
        self.regions
            .check(
                req.local.key,
                pd,
                req.local.addr,
                u64::from(req.local.len),
                Access::LOCAL_WRITE,
            )
            .map_err(CommandError::LocalProtection)?;
        let conn = self.conn_mut(h)?;
        if !conn.can_post() {
            return Err(CommandError::NotOpen);
        }
        if conn.recv_queue_free() == 0 {
            return Err(CommandError::QueueFull);
        }
        conn.post_recv(req).map_err(|_| CommandError::QueueFull)
    }

    // ----- Inputs ---------------------------------------------------------

    fn push_event(&mut self, e: Event) {
        if self.events.push_back(e).is_err() {
            self.events_lost += 1;
        }
    }

    /// Handles one received MetaRoCE packet (the UDP payload). Invalid
    /// packets are dropped and counted, or NAKed (spec 4.7); payload is
    /// placed through `mem` only after every check passed.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        bytes: &[u8],
        mem: &mut impl Memory,
    ) {
        let (repr, payload) = match wire::parse(bytes) {
            Ok(r) => r,
            Err(e) => {
                self.drops.count_wire_error(e);
                return;
            }
        };
        if let Body::Connect(c) = repr.body {
            self.on_connect(now, meta, &c);
            return;
        }
        let slot = (repr.header.dst_conn & 0xff) as usize;
        let config = self.config;
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            self.drops.unknown_connection += 1;
            return;
        };
        if conn.local_id != repr.header.dst_conn {
            self.drops.unknown_connection += 1;
            return;
        }
        if conn.local_token != repr.header.token {
            self.drops.bad_token += 1;
            return;
        }
        if conn.peer.ip != meta.source.ip {
            self.drops.bad_source += 1;
            return;
        }
        let outcome = conn.on_packet(
            now,
            &repr,
            payload,
            meta.ce,
            &self.regions,
            mem,
            &config,
            &mut self.rng,
        );
        conn.drain_completions(&mut self.cq);
        if let Outcome::Event(e) = outcome {
            self.push_event(e);
        }
    }

    fn on_connect(&mut self, now: Instant, meta: &RxMeta, c: &wire::ConnectRepr) {
        let config = self.config;
        // A repeated CONNECT: answer with the same ACCEPT.
        let existing = self.conns.iter_mut().flatten().find(|k| {
            k.remote_id == c.src_conn
                && k.remote_token == c.src_token
                && k.peer.ip == meta.source.ip
        });
        if let Some(conn) = existing {
            conn.on_connect(now, c, &config, &mut self.rng);
            return;
        }
        let port = if c.reply_port != 0 {
            c.reply_port
        } else {
            config.udp_port
        };
        let peer = PeerAddr {
            ip: meta.source.ip,
            port,
        };
        let slot = if config.accept_incoming {
            self.free_slot()
        } else {
            None
        };
        let Some(slot) = slot else {
            self.drops.refused += 1;
            let _ = self.rejects.push_back((peer, c.src_conn, c.src_token));
            return;
        };
        let id = self.new_local_id(slot);
        let mut conn = Connection::new(
            ConnHandle(slot as u16),
            id,
            peer,
            config.accept_pd,
            &config,
            &mut self.rng,
            now,
            ConnState::Accepting,
        );
        conn.on_connect(now, c, &config, &mut self.rng);
        self.conns[slot] = Some(conn);
    }

    /// Runs timers whose deadline has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        let config = self.config;
        for i in 0..C {
            let Some(conn) = self.conns[i].as_mut() else {
                continue;
            };
            let outcome = conn.handle_timeout(now, &config);
            conn.drain_completions(&mut self.cq);
            if let Outcome::Event(e) = outcome {
                self.push_event(e);
            }
        }
    }

    // ----- Outputs --------------------------------------------------------

    /// The fair-share hint this receiver gives each sender (spec 4.10.3):
    /// its link rate divided by the connections that delivered data within
    /// the active-sender window.
    pub fn rate_hint(&self, now: Instant) -> u32 {
        if !self.config.rate_hints {
            return 0;
        }
        let active = self
            .conns
            .iter()
            .flatten()
            .filter(|c| {
                c.last_data_rx
                    .is_some_and(|t| now < t + self.config.active_sender_window)
            })
            .count() as u32;
        self.config.link_rate_mbps / active.max(1)
    }

    /// Writes the headers of the next packet to send into `buf` and says
    /// where it goes and where its payload comes from. `buf` must hold at
    /// least [`wire::HEADER_LEN`] + 56 bytes (the largest header).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if let Some((peer, remote_id, remote_token)) = self.rejects.pop_front() {
            let repr = Repr {
                header: Header {
                    flags: Flags::NONE,
                    dst_conn: remote_id,
                    token: remote_token,
                    psn: 0,
                    path: 0,
                    timestamp: now.wire_timestamp(),
                },
                body: Body::Close(CloseRepr {
                    reason: CloseReason::Rejected,
                }),
                payload_len: 0,
            };
            if buf.len() >= repr.header_len() {
                repr.emit_header(buf);
                return Some(Transmit {
                    peer,
                    src_port: self.config.entropy_base,
                    ecn: ecn::NOT_ECT,
                    header_len: repr.header_len(),
                    payload: None,
                });
            }
        }
        if self.hint_cache.0 != now {
            self.hint_cache = (now, self.rate_hint(now));
        }
        let hint = self.hint_cache.1;
        let config = self.config;
        for k in 0..C {
            let i = (self.next_conn + k) % C;
            let Some(conn) = self.conns[i].as_mut() else {
                continue;
            };
            if let Some(t) = conn.poll_transmit(now, buf, hint, &self.regions, &config) {
                // Round-robin between connections, one packet each.
                self.next_conn = (i + 1) % C;
                return Some(t);
            }
        }
        None
    }

    /// The next completion, in order per connection and queue.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        if self.cq.is_empty() {
            for conn in self.conns.iter_mut().flatten() {
                conn.drain_completions(&mut self.cq);
            }
        }
        self.cq.pop_front()
    }

    /// The next connection event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When to call [`Endpoint::handle_timeout`] (or poll again) next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = (!self.rejects.is_empty()).then_some(Instant::ZERO);
        for conn in self.conns.iter().flatten() {
            if let Some(x) = conn.poll_timeout(&self.config) {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        }
        t
    }

    /// Memory per connection, split by part (the README reports it).
    pub fn footprint() -> Footprint {
        let connection = core::mem::size_of::<Connection<P>>();
        let per_path = core::mem::size_of::<crate::path::Path>();
        let paths = core::mem::size_of::<crate::path::PathSet<P>>();
        let window = MAX_WINDOW * (4 + 1 + 1);
        let queues = Connection::<P>::queue_bytes();
        Footprint {
            connection,
            window,
            paths,
            per_path,
            queues,
            fixed: connection - window - paths - queues,
        }
    }
}

/// Appends payload and CRC trailer after the headers `poll_transmit` wrote,
/// for callers that send one contiguous buffer: `packet[..header_len]` holds
/// the headers; the payload is read from `mem`. Returns the packet length.
///
/// # Panics
/// If `packet` is shorter than [`Transmit::packet_len`].
pub fn finish_packet(t: &Transmit, packet: &mut [u8], mem: &mut impl Memory) -> usize {
    let hl = t.header_len;
    let pl = t.payload.map_or(0, |p| p.len as usize);
    if let Some(p) = t.payload {
        mem.read(p.addr, &mut packet[hl..hl + pl]);
    }
    let crc = wire::packet::crc32(&[&packet[..hl + pl]]);
    packet[hl + pl..hl + pl + wire::CRC_LEN].copy_from_slice(&crc.to_be_bytes());
    hl + pl + wire::CRC_LEN
}
