//! [`SimTransport`] for the MetaRoCE engine (`metaroce_core::Endpoint`),
//! unmodified, driven the way a NIC driver drives it: through the platform
//! layer's engine loop ([`Engine::poll_datagrams`], the loop the firmware
//! runs, over a datagram link because the simulator owns Ethernet/IP/UDP).
//!
//! Data path, all through the loop:
//! * work requests go into the send-queue ring of the adapter's
//!   [`HostQueues`] ([`HostPort::post_send`]); a full ring is
//!   [`TransportError::Retry`], a request the endpoint refuses for good
//!   comes back as an error completion from the completion ring;
//! * completions are read from the completion ring;
//! * a received packet is lent to the loop through the adapter's
//!   `SimLink` and placed by DMA (`DmaCopy` for [`Arena`]);
//! * timers fire in the loop's timer step;
//! * `poll_transmit` opens the link for exactly one packet (the sim's NIC
//!   takes one whenever its line is idle) and polls.
//!
//! Control plane, direct on the endpoint as the firmware's owner does it:
//! `connect`, connection events, statistics, and memory registration
//! (`SimTransport::register_region` has no memory at hand for a loop poll,
//! and registration happens once before any traffic).
//!
//! [`HostPort::post_send`]: metaroce_platform::HostPort::post_send

/// The Key ID of the job key of keyed runs.
pub const JOB_KEY_ID: u32 = 1;
/// The job key every host of a keyed run holds (spec 5.3).
pub const JOB_KEY: [u8; metaroce_core::crypto::PSK_LEN] = [0x4a; metaroce_core::crypto::PSK_LEN];

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, Region, RxMeta, WorkRequest};
use metaroce_core::{CommandError, Config, Endpoint, Event, Heap, Instant, Layout};
use metaroce_platform::engine::Budget;
use metaroce_platform::net::NetConfig;
use metaroce_platform::{DatagramLink, DatagramTarget, Engine, EngineStats, HostQueues};
use smoltcp::wire::{EthernetAddress, Ipv4Address};

use crate::memory::Arena;
use crate::transport::TxMeta;
use crate::transport::{SendProgress, SimTransport, TransportCounters, TransportError};

/// Paths per connection (the engine's default offer is 16).
pub const PATHS: usize = 16;

/// Send-queue and completion-ring slots of the default adapter. The
/// workloads keep at most a few work requests per flow outstanding (8 by
/// default: 504 for a 64-host all-to-all), so the send ring never fills
/// before the endpoint's own per-connection queues would; a post it
/// refuses is [`TransportError::Retry`]. The completion ring is as large,
/// so one poll always empties the endpoint's completions into it (the
/// simulator drains the ring after every poll).
pub const SEND_RING: usize = 1024;

/// The host interface of one simulated host with `R` slots in its send and
/// completion rings. Receive and admin queues are unused (workloads post
/// no receives; regions are registered directly).
type Queues<const R: usize> = HostQueues<R, 2, R, 2>;

/// Largest header `poll_transmit` writes plus room: the payload and
/// trailer follow it.
const HEADER_ROOM: usize = 128;

/// Connection events the adapter saw (the simulator has no application
/// that waits for them: work is posted at once and queued by the engine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub connected: u64,
    pub closed: u64,
    pub failed: u64,
}

/// A MetaRoCE endpoint on a simulated host, sized to the flows it takes
/// part in (connections of up to `P` paths), its engine loop and its host
/// queues (`R` slots in the send and completion rings: at least the work
/// requests the host keeps posted at once, or posts wait for a
/// completion).
#[derive(Debug)]
pub struct MetaRoce<const P: usize = PATHS, const R: usize = SEND_RING> {
    endpoint: Box<Endpoint<Heap, P>>,
    engine: Box<Engine>,
    queues: Box<Queues<R>>,
    /// Longest transport packet the link takes.
    max_packet_len: usize,
    /// The endpoint's next deadline as of the last poll or command. Only a
    /// poll or a direct command changes the endpoint, so this is exact, and
    /// it spares the simulator's `poll_timeout` calls a scan of every
    /// connection (the loop has just made one).
    next_timeout: Option<Instant>,
    /// Whether the engine's own deadline (its last poll's) is
    /// `next_timeout`: false after a direct command until the next poll.
    deadline_synced: bool,
    /// Work requests put on the send ring: when the engine has taken or
    /// refused them all, none waits on the ring or parked in the engine.
    posted: u64,
    /// The instant of the last poll if it handed a received packet to the
    /// loop and ran the loop's timer step (its deadline was due), which
    /// left no timer due at that instant; `None` after any other poll.
    timers_ran_at: Option<Instant>,
    /// What the adapter saw of connection events.
    pub events: EventCounts,
    /// Whether `max_in_flight` is followed ([`SimTransport::track_send_progress`]):
    /// each transmission then scans the endpoint's connections.
    track_in_flight: bool,
    /// Most packets one connection had in flight after any transmission
    /// (summed over its paths' telemetry).
    max_in_flight: u64,
}

/// The storage of a simulated host's endpoint with `connections` of
/// `window` PSNs: every connection may hold a full window in flight and a
/// full out-of-order bitmap at once, so the pools never shape the
/// protocol's behaviour in an experiment.
pub fn layout(connections: u32, window: u32) -> Layout {
    let connections = connections.max(1);
    let (records, words) = Layout::per_connection_window(window);
    Layout {
        senders: connections,
        inflight_records: connections.saturating_mul(records).max(4096),
        reorder_words: connections.saturating_mul(words),
        ..Layout::for_connections(connections)
    }
}

/// The storage of a simulated host's endpoint with `connections` of
/// `window` PSNs and at most `work_requests` posted at once, each pool
/// sized to what such a host can use and no more (a host of a
/// permutation holds two connections: about 20 KB against 680 KB for
/// [`layout`]): every connection may still hold a full window in flight
/// (plus one window's worth for an extent that grows by copying) and a
/// full out-of-order bitmap, so the pools never shape the protocol's
/// behaviour; no receives are posted, one region is registered, and a
/// key slot per connection only in a keyed run (`job_key`, as for
/// [`MetaRoce::host_config`]).
pub fn compact_layout(connections: u32, window: u32, work_requests: u32, job_key: bool) -> Layout {
    let connections = connections.max(1);
    let (records, words) = Layout::per_connection_window(window);
    Layout {
        connections,
        work_entries: work_requests.max(16),
        recv_entries: 16,
        senders: connections,
        inflight_records: connections.saturating_add(1).saturating_mul(records),
        reorder_words: connections.saturating_mul(words),
        regions: 4,
        sources: Layout::sources_for(connections),
        cookies: Layout::cookies_for(connections),
        key_slots: if job_key { connections } else { 0 },
    }
}

/// The adapter's datagram link for one poll of the loop: the packet the
/// simulator delivered (lent, not copied), and, only inside
/// `poll_transmit`, room for one packet to send.
struct SimLink<'a> {
    rx: Option<(&'a RxMeta, &'a [u8])>,
    /// Where a packet to send is written; `None` outside `poll_transmit`.
    tx: Option<&'a mut Vec<u8>>,
    /// Where the packet written into `tx` goes; `Some` once one was.
    sent: Option<DatagramTarget>,
    max_packet_len: usize,
}

impl SimLink<'_> {
    fn idle(max_packet_len: usize) -> Self {
        SimLink {
            rx: None,
            tx: None,
            sent: None,
            max_packet_len,
        }
    }
}

impl DatagramLink for SimLink<'_> {
    fn max_packet_len(&self) -> usize {
        self.max_packet_len
    }

    fn receive<R>(&mut self, f: impl FnOnce(&RxMeta, &[u8]) -> R) -> Option<R> {
        let (meta, packet) = self.rx.take()?;
        Some(f(meta, packet))
    }

    fn transmit_ready(&mut self) -> bool {
        self.tx.is_some() && self.sent.is_none()
    }

    fn transmit<R>(
        &mut self,
        to: DatagramTarget,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        if self.sent.is_some() || len > self.max_packet_len {
            return None;
        }
        let out = self.tx.as_deref_mut()?;
        // `f` writes every byte of the packet (the engine's transmit step:
        // headers, payload gathered by DMA or zeroed where that fails, the
        // tag of a protected packet, the CRC trailer), so the buffer, a
        // recycled packet's, is only cut or grown to `len`: zeroing the
        // bytes `f` then overwrites cost as much as a second copy of the
        // payload.
        out.resize(len, 0);
        let r = f(out);
        self.sent = Some(to);
        Some(r)
    }
}

impl<const P: usize, const R: usize> MetaRoce<P, R> {
    /// An endpoint with `config` and room for `connections`, its
    /// randomness drawn from `seed`.
    pub fn new(config: Config, connections: u32, seed: u64) -> Self {
        Self::with_layout(config, layout(connections, config.window), seed)
    }

    /// An endpoint with `config` and the storage `layout` describes
    /// ([`layout`], [`compact_layout`]), its randomness drawn from `seed`.
    pub fn with_layout(config: Config, layout: Layout, seed: u64) -> Self {
        // The datagram loop uses no addresses of its own: the simulator's
        // fabric owns IP and never asks the engine for ARP or ICMP.
        let mut engine = Box::new(Engine::new(NetConfig {
            mac: EthernetAddress([0x02, 0, 0, 0, 0, 0]),
            ip: Ipv4Address::UNSPECIFIED,
        }));
        // A poll costs no virtual time here, so bounding the work of one
        // poll would only defer it: let one poll take every queued work
        // request and write every completion, as the old direct calls did.
        engine.set_budget(Budget {
            work_requests: R as u32,
            completions: R as u32,
            ..Budget::default()
        });
        MetaRoce {
            max_packet_len: usize::from(config.mtu) + HEADER_ROOM,
            next_timeout: None,
            deadline_synced: true,
            posted: 0,
            timers_ran_at: None,
            endpoint: Box::new(Endpoint::new(
                config,
                layout.heap_storage(),
                metaroce_core::rng::seed_from_u64(seed),
            )),
            engine,
            queues: Box::new(Queues::new()),
            events: EventCounts::default(),
            track_in_flight: false,
            max_in_flight: 0,
        }
        .with_job_key(&config)
    }

    /// Installs [`JOB_KEY`] when `config` names it.
    fn with_job_key(self, config: &Config) -> Self {
        if config.protection.key_id == JOB_KEY_ID {
            self.with_psk(JOB_KEY_ID, &JOB_KEY)
        } else {
            self
        }
    }

    /// A host of a keyed run (`job_key`, `--job-key`: how an AI job's
    /// hosts are set up when they share a job key): `config` requiring
    /// protection under [`JOB_KEY`], knowing its own address `ip` so its
    /// CONNECTs carry early proofs (0-RTT, spec 4.2.4); unchanged in an
    /// unkeyed run. Every host's wall clock is the simulator's.
    pub fn host_config(
        config: metaroce_core::Config,
        ip: smoltcp::wire::IpAddress,
        job_key: bool,
    ) -> metaroce_core::Config {
        if !job_key {
            return config;
        }
        metaroce_core::Config {
            protection: metaroce_core::crypto::ProtectionConfig {
                policy: metaroce_core::crypto::Policy::Require,
                key_id: JOB_KEY_ID,
            },
            local_ip: Some(ip),
            ..config
        }
    }

    /// Installs a pre-shared key (a job key, spec 5.3): with
    /// `config.protection` naming it, connections are protected.
    pub fn with_psk(mut self, key_id: u32, key: &[u8; metaroce_core::crypto::PSK_LEN]) -> Self {
        self.endpoint
            .add_psk(key_id, key)
            .expect("keyring has room");
        self
    }

    /// The engine, for inspection.
    pub fn endpoint(&self) -> &Endpoint<Heap, P> {
        &self.endpoint
    }

    /// The engine loop's counters (posts, completions, DMA faults, ...).
    pub fn loop_stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// One round of the engine loop over `link`, with `mem` as host memory.
    fn poll(&mut self, now: Instant, link: &mut SimLink<'_>, mem: &mut Arena) {
        let (_, mut port) = self.queues.ports();
        let outcome = self
            .engine
            .poll_datagrams(now, &mut *self.endpoint, link, &mut port, mem);
        self.next_timeout = outcome.next_timeout;
        self.deadline_synced = true;
        self.timers_ran_at = None;
        self.drain_events();
    }

    /// Whether one transmit poll does exactly what a timer poll followed
    /// by a transmit poll at the same instant does. The loop runs its
    /// timer step (the endpoint's due timers) when its own deadline is
    /// due, after taking host work and before transmitting, in every
    /// poll. So the transmit poll alone runs the timers (the deadline it
    /// holds is `next_timeout`, due) after the same host work; what the
    /// pair does beyond that is a second timer step at the same instant,
    /// which finds no timer due (the first ran them all), and a second
    /// look at the host queues, which finds nothing unless a request is
    /// parked there (refused for now: the second look would retry it
    /// after the timers) or still on the ring.
    fn one_poll_does_both(&self) -> bool {
        self.host_work_settled()
    }

    /// No direct command since the last poll (the engine's deadline is
    /// `next_timeout`), and every work request put on the ring was taken
    /// or refused by the engine: none on the ring, none parked.
    fn host_work_settled(&self) -> bool {
        let s = self.engine.stats();
        self.deadline_synced && s.posted_sends + s.post_errors == self.posted
    }

    /// Updates `max_in_flight` from the paths' telemetry of the
    /// connections to `peer` (the one that just sent; comparing addresses
    /// first keeps this cheap on endpoints with many connections).
    fn note_in_flight(&mut self, peer: PeerAddr) {
        let endpoint = &self.endpoint;
        for h in endpoint.handles() {
            if endpoint.connection(h).is_none_or(|c| c.peer() != peer) {
                continue;
            }
            let in_flight: u64 = (0..=u8::MAX)
                .map_while(|path| endpoint.path_stats(h, path))
                .map(|s| u64::from(s.in_flight))
                .sum();
            self.max_in_flight = self.max_in_flight.max(in_flight);
        }
    }

    fn drain_events(&mut self) {
        while let Some(e) = self.endpoint.poll_event() {
            match e {
                Event::Incoming { .. } => {}
                Event::Connected(_) => self.events.connected += 1,
                Event::Closed { .. } => self.events.closed += 1,
                Event::Failed { .. } => self.events.failed += 1,
            }
        }
    }
}

fn command_error(e: CommandError) -> TransportError {
    match e {
        CommandError::QueueFull => TransportError::Retry,
        CommandError::NoFreeConnection => TransportError::Refused("no free connection"),
        CommandError::UnknownConnection => TransportError::Refused("unknown connection"),
        CommandError::NotOpen => TransportError::Refused("connection not open"),
        CommandError::LocalProtection(_) => TransportError::Refused("local protection"),
        CommandError::Region(_) => TransportError::Refused("region"),
        CommandError::BadLength => TransportError::Refused("bad length"),
        CommandError::Protection(_) => TransportError::Refused("packet protection"),
        CommandError::NotClosed | CommandError::NotDrained => TransportError::Refused("busy"),
    }
}

impl<const P: usize, const R: usize> SimTransport for MetaRoce<P, R> {
    fn name(&self) -> &'static str {
        "MetaRoCE"
    }

    fn register_region(&mut self, region: Region) -> Result<u32, TransportError> {
        let key = self.endpoint.register_region(region).map_err(command_error);
        self.next_timeout = self.endpoint.poll_timeout();
        self.deadline_synced = false;
        key
    }

    fn connect_pair(
        now: Instant,
        a: &mut Self,
        _a_addr: PeerAddr,
        _b: &mut Self,
        b_addr: PeerAddr,
    ) -> Result<ConnHandle, TransportError> {
        // The peer accepts on its own (`Config::accept_incoming`).
        let conn = a.endpoint.connect(now, b_addr, 0).map_err(command_error);
        a.next_timeout = a.endpoint.poll_timeout();
        a.deadline_synced = false;
        conn
    }

    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), TransportError> {
        let (mut host, _) = self.queues.ports();
        host.post_send(conn, wr)
            .map_err(|_| TransportError::Retry)?;
        self.posted += 1;
        Ok(())
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        _dst_port: u16,
        packet: &[u8],
        mem: &mut Arena,
    ) {
        let mut link = SimLink {
            rx: Some((meta, packet)),
            ..SimLink::idle(self.max_packet_len)
        };
        let timers_run = self.deadline_synced && self.next_timeout.is_some_and(|d| d <= now);
        self.poll(now, &mut link, mem);
        if timers_run {
            self.timers_ran_at = Some(now);
        }
    }

    fn handle_timeout(&mut self, now: Instant, mem: &mut Arena) {
        // The loop's timer step runs the endpoint's timers that are due.
        // Right after a receive poll at this instant that ran it, a timer
        // poll would do nothing: no timer is due any more (the receive
        // came before the timer step, and the steps after it, writing
        // completions and transmitting on a link that takes nothing, arm
        // none), no host work waits, the completions are all written and
        // the deadline it would compute is the one held.
        if self.timers_ran_at == Some(now) && self.host_work_settled() {
            return;
        }
        let mut link = SimLink::idle(self.max_packet_len);
        self.poll(now, &mut link, mem);
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut Arena,
        out: &mut Vec<u8>,
    ) -> Option<TxMeta> {
        // Not cleared first: `SimLink::transmit` sizes it to the packet.
        let mut link = SimLink {
            tx: Some(&mut *out),
            ..SimLink::idle(self.max_packet_len)
        };
        self.poll(now, &mut link, mem);
        let Some(to) = link.sent else {
            out.clear();
            return None;
        };
        // Only a transmission raises the packets in flight.
        if self.track_in_flight {
            self.note_in_flight(to.peer);
        }
        Some(TxMeta {
            peer: to.peer,
            src_port: to.src_port,
            ecn: to.ecn,
        })
    }

    fn timeout_and_transmit(
        &mut self,
        now: Instant,
        mem: &mut Arena,
        out: &mut Vec<u8>,
    ) -> Option<TxMeta> {
        if !self.one_poll_does_both() {
            self.handle_timeout(now, mem);
        }
        self.poll_transmit(now, mem, out)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next_timeout
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        let (mut host, _) = self.queues.ports();
        host.poll_completion()
    }

    fn counters(&self) -> TransportCounters {
        let mut c = TransportCounters::default();
        for h in self.endpoint.handles() {
            let Some(s) = self.endpoint.stats(h) else {
                continue;
            };
            c += TransportCounters {
                packets_sent: s.packets_sent + s.retransmissions + s.acks_sent + s.naks_sent,
                first_transmissions: s.packets_sent,
                retransmissions: s.retransmissions,
                spurious_retransmissions: s.spurious_retransmissions,
                timeouts: s.timeouts,
                probes: s.probes,
                naks_sent: s.naks_sent,
                discarded: s.duplicates_received + s.out_of_window + s.invalid_dropped,
                ce_received: s.ce_received,
            };
        }
        c.discarded += self.endpoint.drops().total();
        c
    }

    fn track_send_progress(&mut self) {
        self.track_in_flight = true;
    }

    fn send_progress(&self) -> Option<SendProgress> {
        if !self.track_in_flight {
            return None;
        }
        let packets_acked = self
            .endpoint
            .handles()
            .filter_map(|h| self.endpoint.stats(h))
            .map(|s| s.packets_acked)
            .sum();
        Some(SendProgress {
            packets_acked,
            max_in_flight: self.max_in_flight,
        })
    }
}
