//! The endpoint: the connection table, memory regions, completions and
//! events (spec 4, 4.14).
//!
//! # Using it
//!
//! An [`Endpoint`] is a state machine. It never reads a clock, never does
//! I/O and never allocates; the caller moves bytes and time in and out,
//! and supplies its storage ([`Storage`], sized by a [`Layout`]).
//!
//! * **Getters**: [`Endpoint::state`], [`Endpoint::stats`],
//!   [`Endpoint::path_stats`], [`Endpoint::drops`], [`Endpoint::footprint`],
//!   [`Endpoint::live_connections`], [`Endpoint::pool_usage`].
//! * **Inputs**: [`Endpoint::handle_packet`] for every MetaRoCE packet that
//!   arrives (the UDP payload, with the source address, UDP source port and
//!   ECN CE bit in [`RxMeta`]); [`Endpoint::handle_timeout`] whenever the
//!   deadline from [`Endpoint::poll_timeout`] has passed. Behind a device
//!   that checks the CRC trailer in hardware,
//!   [`Endpoint::handle_packet_with_verdict`] takes its verdict in place of
//!   the software check.
//! * **Commands**: [`Endpoint::register_region`],
//!   [`Endpoint::deregister_region`], [`Endpoint::connect`],
//!   [`Endpoint::close`], [`Endpoint::release`], [`Endpoint::post_send`],
//!   [`Endpoint::post_recv`]. Incoming connections are accepted on their
//!   own when [`Config::accept_incoming`] is set and reported as
//!   [`Event::Incoming`]: a CONNECT creates one only once its source has
//!   proved its address (a RETRY's cookie, spec 4.2) and is within its
//!   per-source limits; until then the endpoint keeps nothing for it.
//! * **Outputs**, polled after any input or command, in this order:
//!   [`Endpoint::poll_transmit`] until it returns `None` (each call writes
//!   one packet's headers; its payload is gathered from memory and the CRC
//!   trailer appended, see [`finish_packet`], or left zero for a device
//!   that writes it, see [`Endpoint::seal_transmit`]); [`Endpoint::poll_completion`]
//!   and [`Endpoint::poll_event`] until `None`; then
//!   [`Endpoint::poll_timeout`] for when to call again.
//!
//! # The lifecycle belongs to the application
//!
//! A connection's handle is valid from `connect` (or its `Incoming` event)
//! until the application calls [`Endpoint::release`] after the connection
//! closed or failed (its `Closed` or `Failed` event) and its completions
//! were drained. Only then is the slot reused, under a new generation, so a
//! stale handle is refused and never names another connection. Events are
//! kept per connection until polled: none is lost to a full queue.
//!
//! # Work proportional to what is ready
//!
//! Nothing here visits every connection: connections with a packet to
//! send, completions, events or a starved sender wait on intrusive lists;
//! deadlines sit in a timing wheel; a keyed hash index finds duplicate
//! CONNECTs; the receiver's active senders are a list ordered by their
//! last data. Per packet the cost does not grow with the table.
//!
//! Time never goes backwards between calls. Payload is placed during
//! `handle_packet` through the caller's [`Memory`], only after every check
//! passed, and only inside registered regions.

mod admission;
mod commands;
#[cfg(feature = "aead")]
mod early;
mod input;
mod output;
mod prefixes;
mod protection;
mod queries;
mod table;
#[cfg(feature = "tokens")]
mod tokens;

pub use prefixes::SourceBucket;
pub use table::ConnSlot;

use core::hash::Hasher;

use heapless::Deque;
use siphasher::sip::SipHasher13;

use crate::api::{ConnHandle, Memory, PeerAddr, Region};
use crate::config::Config;
use crate::conn::sender::InflightPool;
use crate::conn::{
    Connection, Credentials, RecvPools, RecvRefusals, Resources, SendPools, SendRefusals,
};
use crate::memory::{RegionError, RegionTable};
use crate::rng::{ReseedPolicy, Rng, Seed};
use crate::stats::DropStats;
use crate::storage::index::HashIndex;
use crate::storage::list::{Fifo, List};
use crate::storage::pool::Pool;
use crate::storage::wheel::TimerWheel;
use crate::storage::{index_bits, Backing, Slice, Storage};
use crate::time::Instant;
use crate::wire::{self, CloseReason};
use table::IdLayout;

/// Where an endpoint's slots lie in a connection table split between
/// several endpoints (spec 4.14.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Shard {
    /// Index of the endpoint's first slot in the whole table.
    pub first_slot: u32,
    /// Slots of the whole table.
    pub table_slots: u32,
}

impl Shard {
    /// The `n`-th of `count` equal shards of a table of `table_slots`.
    pub const fn nth(n: u32, count: u32, table_slots: u32) -> Shard {
        Shard {
            first_slot: table_slots / count * n,
            table_slots,
        }
    }

    /// Bits of a connection id that hold the table index.
    pub const fn index_bits(table_slots: u32) -> u32 {
        index_bits(table_slots as usize)
    }

    /// Which of `count` equal shards of a table of `table_slots` owns
    /// connection id `id`: what a dispatcher steering packets to cores
    /// computes from a packet's Destination Connection ID.
    pub const fn owner(id: u32, count: u32, table_slots: u32) -> u32 {
        let mask = ((1u64 << index_bits(table_slots as usize)) - 1) as u32;
        let per = table_slots / count;
        let owner = (id & mask) / if per == 0 { 1 } else { per };
        if owner >= count {
            count - 1
        } else {
            owner
        }
    }
}

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CommandError {
    /// Every connection slot is in use.
    NoFreeConnection,
    /// No connection has this handle (never had, or released: handles are
    /// generational and a stale one is refused).
    UnknownConnection,
    /// The connection is closing, closed or failed.
    NotOpen,
    /// The connection's queue or the endpoint's pool is full: retry after
    /// completions drain (back-pressure, counted in
    /// [`Endpoint::pool_refusals`]).
    QueueFull,
    /// The local buffer is not registered, not in the connection's domain,
    /// lacks the right, or is out of bounds.
    LocalProtection(wire::NakReason),
    /// Registering or deregistering a region failed.
    Region(RegionError),
    /// A READ's local length differs from what the remote side can describe.
    BadLength,
    /// `release` on a connection that is neither closed nor failed.
    NotClosed,
    /// `release` on a connection whose completions were not all polled.
    NotDrained,
    /// The policy requires packet protection (spec 5.3) and it cannot be
    /// offered: no pre-shared key with the configured Key ID, no free key
    /// slot, or the cipher not compiled in.
    Protection(crate::crypto::Refusal),
}

/// Bytes of state, derived from `size_of` of every part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Footprint {
    /// One slot of the connection table (connection, generation, links,
    /// timer entry): what every connection costs, idle or not.
    pub slot: usize,
    /// The connection's own state within the slot.
    pub connection: usize,
    /// Its share of the connection index (two `u32` slots).
    pub index_share: usize,
    /// An idle established connection in all: slot plus index share.
    pub idle_connection: usize,
    /// Per path in the fixed part: entropy and the receiver's echo counters.
    pub per_path_fixed: usize,
    /// A sender state (pooled, held while sending), all paths included.
    pub sender_state: usize,
    /// One path's sender telemetry within it.
    pub path_telemetry: usize,
    /// A send-queue entry (pooled).
    pub work_entry: usize,
    /// A posted receive (pooled).
    pub recv_entry: usize,
    /// One in-flight packet record (pooled), allocator share included.
    pub inflight_record: usize,
    /// One 64-bit word of out-of-order bitmap (pooled, 64 PSNs of a
    /// receive window), allocator share included.
    pub reorder_word: usize,
}

/// Pool use now: (in use, capacity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PoolUsage {
    pub connections: (u32, u32),
    pub work_entries: (u32, u32),
    pub recv_entries: (u32, u32),
    pub senders: (u32, u32),
    pub inflight_records: (u64, u64),
    /// Out-of-order bitmap words.
    pub reorder_words: (u64, u64),
    pub regions: (u32, u32),
}

/// What a stateless reply says.
#[derive(Debug, Clone, Copy)]
enum StatelessBody {
    /// CLOSE (REJECTED): a refused CONNECT.
    Close(CloseReason),
    /// RETRY with a cookie: prove the address first (spec 4.2).
    Retry([u8; wire::COOKIE_LEN]),
    /// CLOSE with CLOSE_REPLY from a released connection (spec 4.1.2).
    CloseReply(CloseReason),
}

/// A reply sent without connection state (to a CONNECT), addressed by the
/// CONNECT's Source Connection ID and Source Token.
#[derive(Debug, Clone, Copy)]
struct StatelessReply {
    peer: PeerAddr,
    dst_conn: u32,
    token: u64,
    body: StatelessBody,
}

/// Stateless replies (RETRY, CLOSE REJECTED) held for sending; more are
/// dropped and counted. As many as a platform's poll takes in datagrams
/// (the engine loop's receive budget, 32), so a burst of CONNECTs that one
/// poll receives is answered in full; a flood beyond that rate gets no
/// more answers than the queue holds per poll.
const STATELESS_QUEUE: usize = 32;

/// Connections a receive batch may touch before they are refreshed: the
/// engine loop's receive budget.
const TOUCHED_BATCH: usize = 32;

/// A MetaRoCE endpoint with connections of up to `P` paths, over storage
/// of backing `B`.
pub struct Endpoint<B: Backing, const P: usize> {
    config: Config,
    ids: IdLayout,
    slots: Slice<B, ConnSlot<P>>,
    index: HashIndex<Slice<B, u32>>,
    res: Resources<B, P>,
    wheel: TimerWheel,
    free: Fifo,
    ready: Fifo,
    /// Connections with a control packet or an ACK to send: served before
    /// `ready`, so neither waits behind other connections' data.
    urgent: Fifo,
    completions: Fifo,
    events: Fifo,
    waiting: Fifo,
    /// Connections a received packet touched, refreshed before the lists
    /// above or the wheel are next read ([`Endpoint::refresh_touched`]);
    /// as many as a receive batch touches (more are refreshed at once).
    touched: heapless::Vec<u32, TOUCHED_BATCH>,
    active: List,
    stateless: Deque<StatelessReply, STATELESS_QUEUE>,
    hash_key: (u64, u64),
    /// Secrets of the RETRY cookies (spec 4.2).
    cookies: admission::CookieKeys,
    /// What each source prefix holds, and its connect rate (spec 4.2.3).
    prefixes: prefixes::PrefixTable<Slice<B, SourceBucket>>,
    /// Connections counted as half open (Accepting).
    half_open: u32,
    /// Of those, the ones already delivering an early first flight.
    half_open_sending: u32,
    /// Where the next search for a connection to reclaim starts.
    reclaim_cursor: u32,
    live: u32,
    /// Active senders on the node's other shards (for the fair share).
    other_senders: u32,
    /// Next domain of [`crate::config::AcceptDomain::PerConnection`].
    next_domain: u32,
    drops: DropStats,
    /// The latest time seen (for outputs that take none).
    now: Instant,
    /// The fair-share hint computed for one instant.
    hint_cache: (Instant, u32),
    /// The READ Depth of the CONNECT being handled (its Path ID field,
    /// spec 3.8.1), for the connection it creates.
    rx_read_depth: u8,
    /// Where a protected payload is decrypted before it is placed.
    rx_plain: crate::crypto::Scratch,
    /// The wall clock (ns since the Unix epoch) minus `now`, for early
    /// proofs (spec 4.2.4).
    wall_offset_ns: u64,
    /// The wall clock when it was first set: the filter of taken proofs
    /// remembers nothing from before, so no older proof is taken (spec
    /// 4.2.4).
    early_since_ns: u64,
    /// The early proofs taken, so none is taken twice (spec 4.2.4).
    #[cfg(feature = "aead")]
    early_filter: early::ProofFilter,
    /// Secrets of the address tokens this endpoint issues (spec 4.2.5).
    #[cfg(feature = "tokens")]
    token_keys: admission::CookieKeys,
    /// The newest token of each acceptor this endpoint connected to.
    #[cfg(feature = "tokens")]
    token_cache: tokens::TokenCache,
}

impl<B: Backing, const P: usize> core::fmt::Debug for Endpoint<B, P> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Endpoint")
            .field("capacity", &self.slots.len())
            .field("live", &self.live)
            .field("ready", &self.ready.len())
            .field("timers", &self.wheel.len())
            .field("resources", &self.res)
            .field("drops", &self.drops)
            .finish()
    }
}

impl<B: Backing, const P: usize> Endpoint<B, P> {
    const _PATHS: () = assert!(P >= 1 && P <= 256);

    /// A new endpoint over `storage`. `seed` must come from a real entropy
    /// source outside simulations: tokens, ids, initial PSNs and keys are
    /// drawn from the generator it keys (see [`crate::rng`]).
    pub fn new(config: Config, storage: Storage<B, P>, seed: Seed) -> Self {
        let slots = storage.connections.len().min(1 << 24) as u32;
        Self::new_shard(
            config,
            storage,
            seed,
            Shard {
                first_slot: 0,
                table_slots: slots,
            },
        )
    }

    /// One shard of a connection table split between several endpoints
    /// (one per core): its slots are `shard.first_slot ..` of a table of
    /// `shard.table_slots`, so the connection ids and handles it hands out
    /// carry their index in the whole table and name this shard
    /// ([`Shard::owner`]). Every shard needs its own seed.
    pub fn new_shard(config: Config, storage: Storage<B, P>, seed: Seed, shard: Shard) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::_PATHS;
        let mut rng = Rng::new(seed);
        let hash_key = (rng.next_u64(), rng.next_u64());
        let source_key = (rng.next_u64(), rng.next_u64());
        let cookie_keys = admission::CookieKeys::new(&mut rng);
        #[cfg(feature = "tokens")]
        let token_keys = admission::CookieKeys::new(&mut rng);
        let Storage {
            mut connections,
            connection_index,
            work_entries,
            recv_entries,
            senders,
            inflight_records,
            inflight_nodes,
            reorder_words,
            reorder_nodes,
            regions,
            sources,
            cookies,
            key_slots,
        } = storage;
        let capacity = connections.len().min(1 << 24);
        let mut free = Fifo::EMPTY;
        connections.fill(ConnSlot::VACANT);
        for i in 0..capacity as u32 {
            free.push_back(&mut connections, i, ConnSlot::free_link);
        }
        Endpoint {
            config,
            ids: IdLayout {
                index_bits: index_bits(
                    shard.table_slots.max(shard.first_slot + capacity as u32) as usize
                ),
                first: shard.first_slot,
                slots: capacity as u32,
            },
            slots: connections,
            index: HashIndex::new(connection_index),
            res: Resources {
                send: SendPools {
                    work: Pool::new(work_entries),
                    senders: Pool::new(senders),
                    inflight: InflightPool::new(inflight_records, inflight_nodes),
                    read_jobs: 0,
                    senders_returned: 0,
                    refusals: SendRefusals::default(),
                },
                recv: RecvPools {
                    recvs: Pool::new(recv_entries),
                    reorder: crate::conn::ReorderPool::new(reorder_words, reorder_nodes),
                    naks: Deque::new(),
                    rx_refusals: crate::stats::RefusalStats::default(),
                    refusals: RecvRefusals::default(),
                },
                regions: RegionTable::new(regions),
                rng,
                credentials: Credentials {
                    cookies: Pool::new(cookies),
                    cookie_refusals: 0,
                    keys: crate::crypto::KeyPool::new(key_slots),
                },
                read_reserved: 0,
            },
            wheel: TimerWheel::new(),
            free,
            ready: Fifo::EMPTY,
            urgent: Fifo::EMPTY,
            completions: Fifo::EMPTY,
            events: Fifo::EMPTY,
            waiting: Fifo::EMPTY,
            touched: heapless::Vec::new(),
            active: List::EMPTY,
            stateless: Deque::new(),
            hash_key,
            cookies: cookie_keys,
            prefixes: prefixes::PrefixTable::new(sources, source_key),
            half_open: 0,
            half_open_sending: 0,
            reclaim_cursor: 0,
            live: 0,
            other_senders: 0,
            next_domain: crate::config::PER_CONNECTION_DOMAINS,
            drops: DropStats::default(),
            now: Instant::ZERO,
            hint_cache: (Instant::FAR_FUTURE, 0),
            rx_read_depth: 0,
            rx_plain: crate::crypto::Scratch::NEW,
            wall_offset_ns: 0,
            early_since_ns: 0,
            #[cfg(feature = "aead")]
            early_filter: early::ProofFilter::NEW,
            #[cfg(feature = "tokens")]
            token_keys,
            #[cfg(feature = "tokens")]
            token_cache: tokens::TokenCache::NEW,
        }
    }

    /// Sets the wall clock: `unix_ns` is the time since the Unix epoch at
    /// `now`. Early proofs carry it and are judged by it (spec 4.2.4);
    /// hosts of one job keep their clocks within `Config::early_window`.
    pub fn set_wall_clock(&mut self, now: Instant, unix_ns: u64) {
        self.wall_offset_ns = unix_ns.wrapping_sub(now.as_nanos());
        if self.early_since_ns == 0 {
            self.early_since_ns = unix_ns;
        }
    }

    #[cfg(feature = "aead")]
    fn wall_ns(&self, now: Instant) -> u64 {
        now.as_nanos().wrapping_add(self.wall_offset_ns)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether the generator wants fresh entropy at `now` (spec 5.1.6):
    /// the platform's engine loop asks after every poll and answers with
    /// [`Endpoint::reseed`].
    pub fn reseed_due(&self, now: Instant) -> bool {
        self.res.rng.reseed_due(now)
    }

    /// Folds 32 bytes of fresh entropy into the generator (spec 5.1.6).
    pub fn reseed(&mut self, now: Instant, entropy: Seed) {
        self.res.rng.reseed(now, entropy);
    }

    /// When fresh entropy is due (default [`ReseedPolicy::DEFAULT`]).
    pub fn set_reseed_policy(&mut self, policy: ReseedPolicy) {
        self.res.rng.set_policy(policy);
    }

    /// Reseeds so far.
    pub fn reseeds(&self) -> u64 {
        self.res.rng.reseeds()
    }

    // ----- Memory regions -------------------------------------------------

    /// Registers a region; returns its key.
    pub fn register_region(&mut self, region: Region) -> Result<u32, CommandError> {
        let random = self.res.rng.next_u32();
        self.res
            .regions
            .register(region, random)
            .map_err(CommandError::Region)
    }

    /// Deregisters a region. Packets naming its key are NAKed from now on.
    pub fn deregister_region(&mut self, key: u32) -> Result<Region, CommandError> {
        self.res
            .regions
            .deregister(key)
            .map_err(CommandError::Region)
    }

    /// The registered regions.
    pub fn regions(&self) -> &RegionTable<Slice<B, crate::memory::RegionSlot>> {
        &self.res.regions
    }

    // ----- Connections ----------------------------------------------------

    /// Slot `i` leaves the half-open count (it left Accepting, or is freed).
    /// Once per accepted connection: kept out of line.
    #[cold]
    #[inline(never)]
    fn leave_half_open(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        if !s.half_open {
            return;
        }
        s.half_open = false;
        self.half_open -= 1;
        if crate::crypto::SUPPORTED && s.has(table::SENDING_HALF_OPEN) {
            s.set(table::SENDING_HALF_OPEN, false);
            self.half_open_sending -= 1;
        }
        if let Some(p) = self.counted_prefixes(i) {
            self.prefixes.confirm(p);
        }
    }

    /// The prefixes slot `i`'s connection is counted in, if it is.
    fn counted_prefixes(&self, i: u32) -> Option<prefixes::Prefixes> {
        let n = self.slots[i as usize].prefix;
        (n != table::NOT_COUNTED).then(|| self.prefixes.of_narrow(n))
    }

    fn hash_peer(&self, ip: &smoltcp::wire::IpAddress, id: u32, token: u64) -> u64 {
        hash_with(self.hash_key, ip, id, token)
    }

    /// Spec 4.1.2: a CLOSE (no flags) to a released connection, whose slot
    /// is not reused yet, from its peer's address with its id and token, is
    /// answered with a CLOSE_REPLY of the same reason. `false`: not such a
    /// CLOSE.
    #[cold]
    #[inline(never)]
    pub(super) fn answer_late_close(
        &mut self,
        i: usize,
        h: &wire::Header,
        body: &wire::Body,
        ip: &smoltcp::wire::IpAddress,
    ) -> bool {
        let (Some(s), wire::Body::Close(c)) = (self.slots.get(i), body) else {
            return false;
        };
        let conn = &s.conn;
        if h.flags != wire::Flags::NONE
            || conn.remote_id == 0
            || conn.local_id != h.dst_conn
            || conn.local_token != h.token
            || conn.peer.ip != *ip
            || conn.protection.key_id != 0
        {
            return false;
        }
        let (peer, id, token) = (conn.peer, conn.remote_id, conn.remote_token);
        self.queue_stateless(peer, id, token, StatelessBody::CloseReply(c.reason));
        true
    }

    /// Spec 4.14.3: the READ depth connection `i` states, reserved from
    /// the endpoint's READ budget (at least one per slot), so that it can
    /// always be honoured: `Config::read_jobs_limit`, or less when the
    /// budget is short, never less than 1, as every free slot keeps one.
    #[cold]
    #[inline(never)]
    pub(super) fn reserve_read_depth(&mut self, i: u32) {
        let cap = self.capacity() as u32;
        let budget = self.config.read_jobs_endpoint_limit.max(cap);
        let spare = budget
            .saturating_sub(self.res.read_reserved)
            .saturating_sub(cap.saturating_sub(self.live));
        let limit = self.config.read_jobs_limit.clamp(1, 255);
        let d = spare.clamp(1, u32::from(limit)) as u8;
        self.res.read_reserved += u32::from(d);
        let send = &mut self.slots[i as usize].conn.send;
        send.read_depth = d;
        // An acceptor's connection: what its CONNECT stated (an
        // initiator's takes its ACCEPT's later).
        send.peer_read_depth = self.rx_read_depth;
    }

    /// Takes a free slot for a new connection and gives it its handle and id.
    fn allocate_slot(&mut self) -> Option<(u32, ConnHandle, u32)> {
        let i = self.free.pop_front(&mut self.slots, ConnSlot::free_link)?;
        let random = self.res.rng.next_u32();
        let s = &mut self.slots[i as usize];
        s.generation = s.generation.wrapping_add(1);
        s.live = true;
        s.released = false;
        let id = self.ids.make(i, random, s.conn.local_id);
        self.live += 1;
        Some((i, s.handle(self.ids.global(i)), id))
    }

    /// Frees slot `i` (released and quiet).
    fn free_slot(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        if !s.live {
            return;
        }
        self.leave_half_open(i);
        if let Some(p) = self.counted_prefixes(i) {
            self.prefixes.release(p);
            self.slots[i as usize].prefix = table::NOT_COUNTED;
        }
        let s = &mut self.slots[i as usize];
        let conn = &mut s.conn;
        let res = &mut self.res;
        conn.drop_cookie(&mut res.credentials);
        conn.discard_work(&mut res.send, &mut res.recv);
        conn.release_sender(&mut res.send);
        let keyed = conn.protection.key_id;
        self.res.read_reserved = self
            .res
            .read_reserved
            .saturating_sub(u32::from(conn.send.read_depth));
        self.res.credentials.keys.release(&mut conn.protection);
        conn.release_receiver(&mut self.res.recv);
        if s.has(table::INDEXED) {
            let (ip, id, token) = (s.conn.peer.ip, s.conn.remote_id, s.conn.remote_token);
            let h = self.hash_peer(&ip, id, token);
            let (slots, key) = (&self.slots, self.hash_key);
            let removed = self.index.remove(h, i, |v| {
                let c = &slots[v as usize].conn;
                hash_with(key, &c.peer.ip, c.remote_id, c.remote_token)
            });
            debug_assert!(removed);
            self.slots[i as usize].set(table::INDEXED, false);
        }
        self.wheel.cancel(&mut self.slots, i, ConnSlot::timer_entry);
        let s = &mut self.slots[i as usize];
        if s.active.is_linked() {
            self.active
                .remove(&mut self.slots, i, ConnSlot::active_link);
        }
        let s = &mut self.slots[i as usize];
        let c = &s.conn;
        // Kept so the next incarnation's id differs from this one, and,
        // unless keyed, what answers a late CLOSE until the slot is reused
        // (spec 4.1.2; a keyed one could not seal the answer).
        let kept = (
            c.local_id,
            c.local_token,
            c.remote_id,
            c.remote_token,
            c.peer,
        );
        s.live = false;
        s.released = false;
        s.conn = Connection::VACANT;
        (s.conn.local_id, s.conn.local_token) = (kept.0, kept.1);
        if keyed == 0 {
            (s.conn.remote_id, s.conn.remote_token, s.conn.peer) = (kept.2, kept.3, kept.4);
        }
        self.live -= 1;
        self.free.push_back(&mut self.slots, i, ConnSlot::free_link);
    }

    // ----- Work requests --------------------------------------------------
}

/// The index's keyed hash, for callers that hold the key apart from `self`.
#[inline]
pub(crate) fn hash_with(
    key: (u64, u64),
    ip: &smoltcp::wire::IpAddress,
    id: u32,
    token: u64,
) -> u64 {
    let mut h = SipHasher13::new_with_keys(key.0, key.1);
    match ip {
        smoltcp::wire::IpAddress::Ipv4(a) => h.write(&a.octets()),
        smoltcp::wire::IpAddress::Ipv6(a) => h.write(&a.octets()),
    }
    h.write_u32(id);
    h.write_u64(token);
    h.finish()
}

/// Appends payload and CRC trailer after the headers `poll_transmit` wrote,
/// for callers that send one contiguous buffer: `packet[..header_len]` holds
/// the headers; the payload is read from `mem`. Returns the packet length.
///
/// # Panics
/// If `packet` is shorter than [`crate::api::Transmit::packet_len`].
pub fn finish_packet(t: &crate::api::Transmit, packet: &mut [u8], mem: &mut impl Memory) -> usize {
    let hl = t.header_len;
    let pl = t.payload.map_or(0, |p| p.len as usize);
    if let Some(p) = t.payload {
        mem.read(p.addr, &mut packet[hl..hl + pl]);
    }
    let crc = wire::packet::crc32(&[&packet[..hl + pl]]);
    packet[hl + pl..hl + pl + wire::CRC_LEN].copy_from_slice(&crc.to_be_bytes());
    hl + pl + wire::CRC_LEN
}
