//! One MetaRoCE endpoint on host sockets, driven by the platform's engine
//! loop (`metaroce_platform::Engine::poll_datagrams`): the program posts
//! work into the host queues (send, receive, completion rings), the loop
//! moves it into the core, places and gathers payload through
//! [`DmaCopy`](metaroce_platform::DmaCopy) on the process's buffers, runs the
//! timers and sends through [`SocketLink`], the UDP sockets as a
//! [`DatagramLink`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, RecvRequest, RxMeta, WorkRequest};
use metaroce_core::config::{AcceptDomain, SourceLimits};
use metaroce_core::crypto::ProtectionConfig;
use metaroce_core::wire::encap::ecn;
use metaroce_core::{CommandError, Config, Endpoint, Event, Heap, Instant, Layout, Shard};
use metaroce_platform::dma::DmaCopy;
use metaroce_platform::entropy::{seed_from, EntropyError, Seed};
use metaroce_platform::{DatagramLink, DatagramTarget, Engine, EngineStats, HostQueues};
use smoltcp::wire::IpAddress;

use crate::io::Sockets;
use crate::memory::Arenas;
use crate::pcap::PcapRecorder;
use crate::shard::steer::Steering;
use crate::HostError;

/// Connections a serving endpoint holds by default (`--connections`).
pub const DEFAULT_SERVE_CONNECTIONS: u32 = 4096;
/// Paths per connection at most.
pub const MAX_PATHS: usize = 16;
/// The endpoint type the host runs: heap storage sized at start.
pub type HostEndpoint = Endpoint<Heap, MAX_PATHS>;

/// Host queue depths: send, receive, completion, admin. The send queue is
/// deeper than the core's per-connection queue, so a program can keep a
/// full window posted; what the core cannot take yet waits on the ring.
pub type Queues = HostQueues<256, 256, 512, 4>;
/// Engine polls per loop turn at most while there is still work, so one
/// turn stays bounded however fast datagrams arrive.
const POLLS_PER_TURN: usize = 8;
/// Largest datagram sent (a GSO send's limit).
const MAX_DATAGRAM: usize = 65_507;

/// How to set up a host endpoint.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Address and port to receive on (port 0: any free port).
    pub bind: SocketAddr,
    /// Paths per connection (1..=16).
    pub paths: u16,
    /// First entropy port; `None`: the first free run above the bind port.
    pub entropy_base: Option<u16>,
    /// Largest payload per packet.
    pub mtu: u16,
    /// Window offered, in PSNs (1 to 65,536, spec 4.4); `None`: the
    /// emulation profile's 4,096.
    pub window: Option<u32>,
    /// Sending rate cap and starting rate, Mbit/s.
    pub rate_mbps: u32,
    /// Accept incoming connections (each in a protection domain of its own).
    pub accept: bool,
    /// Connections the endpoint holds at once.
    pub connections: u32,
    /// Receives each connection keeps posted (the receive pool holds this
    /// many per connection; 0: the core's default layout).
    pub receives_per_connection: u32,
    /// Seed of the endpoint's generator (tokens, ids, PSNs, keys): `None`
    /// takes 32 bytes from the operating system and reseeds from it (spec
    /// 5.1.6), as every real run must; a number makes a test repeatable
    /// and its secrets guessable (and is never reseeded).
    pub seed: Option<u64>,
    /// How long a connection rides through an outage (retransmitting
    /// without progress) and a handshake keeps repeating CONNECT; `None`:
    /// the emulation profile's 10 s (spec 4.6.4, 4.11).
    pub ride_through: Option<Duration>,
    /// Limits per source address on incoming connections (spec 5.1.4);
    /// `None`: the core's defaults.
    pub source_limits: Option<SourceLimits>,
    /// Packet protection (spec 5.3): policy and pre-shared key; `None`
    /// protects nothing.
    pub protection: Option<crate::protection::Protection>,
}

/// RNR retries of a host endpoint's messages: 100 x the emulation
/// profile's 2 ms `rnr_delay`, 200 ms of a peer not ready.
pub const HOST_RNR_RETRIES: u8 = 100;

impl NodeConfig {
    /// The core configuration: emulation timers (round trips of
    /// milliseconds on loopback and veth), this node's ports and limits.
    pub fn core_config(&self, udp_port: u16, entropy_base: u16, entropy_span: u16) -> Config {
        let base = Config::for_emulation();
        let ride_through = self.ride_through.unwrap_or(base.ride_through);
        Config {
            udp_port,
            accept_incoming: self.accept,
            accept_domain: AcceptDomain::PerConnection,
            mtu: self.mtu,
            paths: self.paths,
            window: self.window.unwrap_or(base.window),
            link_rate_mbps: self.rate_mbps,
            entropy_base,
            entropy_span,
            ride_through,
            connect_timeout: ride_through,
            // Silence the connection survives: at least the outage it
            // rides through.
            idle_timeout: base.idle_timeout.max(ride_through),
            // A cookie outlives the handshakes of clients that retry as
            // long as this node does (spec 4.2.2).
            cookie_lifetime: base.cookie_lifetime.max(ride_through * 2),
            source_limits: self.source_limits.unwrap_or(base.source_limits),
            // A host endpoint's peer may be a loaded host or an emulated DPU
            // that posts its receives tens of milliseconds late: the
            // profile's 7 retries 2 ms apart gave up after 14 ms (6 to 95
            // of 1,024 connections opened at once to one QEMU node failed
            // RECEIVER_NOT_READY_EXCEEDED). A local choice, as an
            // InfiniBand QP's rnr_retry (spec 4.7.3).
            rnr_retry_limit: HOST_RNR_RETRIES,
            // Every connection can state the full READ depth (spec 4.8.6,
            // 4.14.3): the budget is reserved per connection, and a host
            // has the memory for it (the work pool grows to match).
            read_jobs_endpoint_limit: base.read_jobs_endpoint_limit.max(
                self.connections
                    .saturating_mul(u32::from(base.read_jobs_limit)),
            ),
            protection: self
                .protection
                .as_ref()
                .map(|p| ProtectionConfig {
                    policy: p.policy,
                    key_id: p.key_id,
                })
                .unwrap_or_default(),
            // 0-RTT (spec 4.2.4): early proofs bind this node's address,
            // known only when it is bound to a specific one.
            local_ip: (!self.bind.ip().is_unspecified()).then(|| IpAddress::from(self.bind.ip())),
            ..base
        }
    }
}

/// Counters of the socket side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
    /// Sends the kernel refused (buffer full, unreachable): the core sees
    /// them as losses and recovers.
    pub tx_errors: u64,
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    /// Datagrams that arrived with CE in the IP header.
    pub rx_ce: u64,
    /// Datagrams that arrived ECN-capable (ECT(0), ECT(1) or CE).
    pub rx_ecn_capable: u64,
    /// ICMP errors reported by the receive socket (peer port unreachable).
    pub rx_errors: u64,
    /// System calls that sent datagrams (one GSO `sendmsg` carries many).
    pub tx_calls: u64,
    /// System calls that received datagrams (one `recvmmsg` carries many).
    pub rx_calls: u64,
}

/// The node's UDP sockets as the engine loop's [`DatagramLink`], with the
/// socket-side counters and the optional capture.
#[derive(Debug)]
pub struct SocketLink {
    sockets: Sockets,
    pub pcap: Option<PcapRecorder>,
    pub io: IoStats,
    /// Set while [`Node::flush`] polls: sends only, nothing is received.
    receive_held: bool,
    /// On an engine thread of a sharded node: what brings each datagram
    /// to the thread owning its connection ([`crate::shard`]).
    pub steer: Option<Steering>,
}

impl DatagramLink for SocketLink {
    fn max_packet_len(&self) -> usize {
        MAX_DATAGRAM
    }

    fn receive<R>(&mut self, f: impl FnOnce(&RxMeta, &[u8]) -> R) -> Option<R> {
        if self.receive_held {
            return None;
        }
        // A sharded node's thread takes what the other threads forwarded
        // in turn with its socket.
        if let Some(steer) = self.steer.as_mut() {
            if steer.rings_first() {
                if let Some((from, ecn, bytes)) = steer.take_forwarded() {
                    return Some(f(&rx_meta(from, ecn), bytes));
                }
            }
        }
        let local = self.sockets.local_addr();
        let mut steered = 0;
        loop {
            let Some((r, bytes)) = self.sockets.next_received() else {
                // The socket is empty: the rings may not be.
                let (from, ecn, bytes) = self.steer.as_mut()?.take_forwarded()?;
                return Some(f(&rx_meta(from, ecn), bytes));
            };
            self.io.rx_datagrams += 1;
            self.io.rx_bytes += r.len as u64;
            if r.ecn != ecn::NOT_ECT {
                self.io.rx_ecn_capable += 1;
            }
            self.io.rx_ce += u64::from(r.ecn == ecn::CE);
            if let Some(p) = self.pcap.as_mut() {
                p.record(r.from, local, r.ecn, bytes, false);
            }
            if let Some(steer) = self.steer.as_mut() {
                if steer.steer_away(r.from, r.ecn, bytes) {
                    steered += 1;
                    if steered >= steer.steered_per_receive() {
                        return None;
                    }
                    continue;
                }
            }
            return Some(f(&rx_meta(r.from, r.ecn), bytes));
        }
    }

    fn transmit_ready(&mut self) -> bool {
        // The kernel queues; a full buffer shows up as a send error, which
        // the core treats as a loss.
        true
    }

    fn transmit<R>(
        &mut self,
        to: DatagramTarget,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let dest = socket_of(to.peer);
        let source = self.sockets.source_of(to.src_port);
        let packet = self.sockets.stage(to.src_port, dest, to.ecn, len)?;
        let r = f(packet);
        if let Some(p) = self.pcap.as_mut() {
            p.record(source, dest, to.ecn, packet, true);
        }
        self.io.tx_bytes += len as u64;
        Some(r)
    }
}

impl SocketLink {
    /// Sends what the last poll staged (the sockets batch it) and updates
    /// the counters.
    pub fn flush(&mut self) {
        self.sockets.flush();
        if let Some(steer) = self.steer.as_mut() {
            steer.wake_receivers();
        }
        let batch = self.sockets.stats();
        self.io.tx_datagrams = batch.sent;
        self.io.tx_errors = batch.refused;
        self.io.tx_calls = batch.send_calls;
        self.io.rx_calls = batch.recv_calls;
        self.io.rx_errors = batch.recv_errors;
    }

    /// What the kernel granted for the receive socket's buffers.
    pub fn buffer_sizes(&self) -> crate::io::BufferSizes {
        self.sockets.buffer_sizes()
    }

    /// Waits until a datagram is queued (on the socket, or forwarded by
    /// another engine thread) or `timeout` passed.
    fn wait(&mut self, timeout: Duration) {
        match &self.steer {
            None => self.sockets.wait(timeout, None),
            Some(steer) => {
                if steer.has_forwarded() {
                    return;
                }
                let waker = steer.waker(steer.thread());
                self.sockets.wait(timeout, waker.map(|w| w.fd()));
                if let Some(w) = waker {
                    w.clear();
                }
            }
        }
    }
}

/// The core's view of a received datagram.
fn rx_meta(from: SocketAddr, ecn_bits: u8) -> RxMeta {
    RxMeta {
        source: peer_of(from),
        ce: ecn_bits == ecn::CE,
    }
}

/// A host endpoint: the core endpoint, the engine loop with its host
/// queues, the process memory it places into, and its sockets.
///
/// The data path (posts, completions, packets, timers) runs through the
/// engine loop exactly as on the DPU; the control path (connect, close,
/// region registration, statistics, connection events) calls the endpoint
/// directly, as the firmware's control task does.
#[derive(Debug)]
pub struct Node<M: DmaCopy = Arenas> {
    pub ep: Box<HostEndpoint>,
    /// The memory the engine places into and gathers from: the tool's
    /// arenas, or (the libfabric provider) the application's own buffers.
    pub mem: M,
    pub link: SocketLink,
    engine: Engine,
    queues: Box<Queues>,
    origin: std::time::Instant,
    pub completions: VecDeque<Completion>,
    pub events: VecDeque<Event>,
}

/// Converts a socket address to the core's peer address.
pub fn peer_of(addr: SocketAddr) -> PeerAddr {
    PeerAddr {
        ip: IpAddress::from(addr.ip()),
        port: addr.port(),
    }
}

/// Converts the core's peer address to a socket address.
pub fn socket_of(peer: PeerAddr) -> SocketAddr {
    SocketAddr::new(peer.ip.into(), peer.port)
}

impl Node {
    /// Binds the sockets and creates the endpoint.
    pub fn bind(config: &NodeConfig) -> Result<Node, HostError> {
        Node::bind_shard(config, None)
    }

    /// Binds the sockets and creates an endpoint that is `shard` of a
    /// connection table split between several (one per engine thread):
    /// its `config.connections` slots start at `shard.first_slot`, and the
    /// ids it hands out name it ([`Shard::owner`]).
    pub fn bind_shard(config: &NodeConfig, shard: Option<Shard>) -> Result<Node, HostError> {
        Node::bind_with(config, shard, Arenas::new(), |_| {})
    }
}

impl<M: DmaCopy> Node<M> {
    /// Binds the sockets and creates the endpoint (`shard` as in
    /// [`Node::bind_shard`]), placing into and gathering from `mem`;
    /// `adjust` may change the core configuration [`NodeConfig`] made
    /// (a program with policies of its own: the libfabric provider).
    pub fn bind_with(
        config: &NodeConfig,
        shard: Option<Shard>,
        mem: M,
        adjust: impl FnOnce(&mut Config),
    ) -> Result<Self, HostError> {
        if !(1..=MAX_PATHS as u16).contains(&config.paths) {
            return Err(HostError::Usage(format!(
                "--paths must be 1..={MAX_PATHS}, got {}",
                config.paths
            )));
        }
        // The wire ranges of the handshake (spec 3.8.1).
        if !(256..=9000).contains(&config.mtu) {
            return Err(HostError::Usage(format!(
                "--mtu must be 256..=9000, got {}",
                config.mtu
            )));
        }
        let window = config.window.unwrap_or(1);
        if !(1..=metaroce_core::config::MAX_WINDOW).contains(&window) {
            return Err(HostError::Usage(format!(
                "--window must be 1..={}, got {window}",
                metaroce_core::config::MAX_WINDOW
            )));
        }
        // Twice the paths: a path whose entropy is re-drawn finds a fresh
        // port without colliding with the others.
        let span = config.paths * 2;
        let sockets = Sockets::bind(config.bind, config.entropy_base, span)?;
        let mut core = config.core_config(
            sockets.local_addr().port(),
            sockets.entropy_base(),
            sockets.entropy_span(),
        );
        adjust(&mut core);
        if config.connections == 0 || config.connections > 1 << 24 {
            return Err(HostError::Usage(format!(
                "--connections must be 1..={}, got {}",
                1 << 24,
                config.connections
            )));
        }
        let mut engine = Engine::for_datagrams();
        let seed = match config.seed {
            Some(n) => metaroce_core::rng::seed_from_u64(n),
            None => {
                // Reseeded from the same source as the core's policy says.
                engine.set_entropy_source(os_entropy);
                seed_from(os_entropy).map_err(|e| {
                    HostError::Bind(format!("no entropy from the operating system: {e:?}"))
                })?
            }
        };
        let mut layout = Layout::for_connections(config.connections);
        // READs within their stated depths find a work entry (spec 4.14.3).
        layout.work_entries = layout
            .work_entries
            .saturating_add(core.read_jobs_endpoint_limit);
        layout.recv_entries = layout.recv_entries.max(
            config
                .connections
                .saturating_mul(config.receives_per_connection),
        );
        let mut ep = Box::new(match shard {
            Some(shard) => HostEndpoint::new_shard(core, layout.heap_storage(), seed, shard),
            None => HostEndpoint::new(core, layout.heap_storage(), seed),
        });
        if let Some(p) = &config.protection {
            ep.add_psk(p.key_id, &p.psk)
                .map_err(|e| HostError::Usage(format!("--key-id {}: {e:?}", p.key_id)))?;
        }
        // The core's clock starts at the node's origin; early proofs
        // carry and are judged by the wall clock (spec 4.2.4).
        let origin = std::time::Instant::now();
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        ep.set_wall_clock(Instant::ZERO, unix_ns);
        Ok(Node {
            ep,
            mem,
            link: SocketLink {
                sockets,
                pcap: None,
                io: IoStats::default(),
                receive_held: false,
                steer: None,
            },
            engine,
            queues: Box::new(Queues::new()),
            origin,
            completions: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// The address this node receives on.
    pub fn local_addr(&self) -> SocketAddr {
        self.link.sockets.local_addr()
    }

    /// The socket-side counters.
    pub fn io(&self) -> IoStats {
        self.link.io
    }

    /// The engine loop's counters.
    pub fn engine_stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// The core's clock: nanoseconds since the node was created.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    /// Opens a connection to `peer` in protection domain 0.
    pub fn connect(&mut self, peer: SocketAddr) -> Result<ConnHandle, CommandError> {
        let now = self.now();
        self.ep.connect(now, peer_of(peer), 0)
    }

    /// Puts a work request on the send queue. `QueueFull` when the ring
    /// is full (retry after completions); a request the core refuses for
    /// good comes back as a completion with an error status.
    pub fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), CommandError> {
        let (mut host, _) = self.queues.ports();
        host.post_send(conn, wr)
            .map_err(|_| CommandError::QueueFull)
    }

    /// Puts a receive buffer on the receive queue; as [`Node::post_send`].
    pub fn post_recv(&mut self, conn: ConnHandle, rr: RecvRequest) -> Result<(), CommandError> {
        let (mut host, _) = self.queues.ports();
        host.post_recv(conn, rr)
            .map_err(|_| CommandError::QueueFull)
    }

    /// One engine poll; returns whether anything moved.
    fn poll(&mut self) -> bool {
        let now = self.now();
        let (_, mut port) = self.queues.ports();
        let outcome = self.engine.poll_datagrams(
            now,
            &mut *self.ep,
            &mut self.link,
            &mut port,
            &mut self.mem,
        );
        outcome.busy
    }

    /// Polls until the loop is idle (bounded) or has something for the
    /// program: completions, events, or a connection it just accepted.
    /// Returns whether it has. Returning then lets the program react
    /// before more packets are handled: a server posts its receives for a
    /// fresh connection before the peer's first SEND, which follows the
    /// ACCEPT within microseconds, is taken from the socket.
    fn run_engine(&mut self) -> bool {
        let more = self.run_polls();
        // What the polls staged leaves in batches, before any waiting.
        self.link.flush();
        more
    }

    /// Runs the engine without waiting: takes what arrived, runs due
    /// timers, sends what that allows. Returns whether completions or
    /// events are queued for the program. For programs that wait
    /// elsewhere (on [`Node::receive_fd`], without holding the node).
    pub fn progress(&mut self) -> bool {
        self.run_engine();
        !self.completions.is_empty() || !self.events.is_empty()
    }

    /// How long the node may sleep before its next deadline (at most
    /// `max_wait`); zero while datagrams are already taken from the
    /// socket but not yet handled.
    pub fn idle_wait(&self, max_wait: Duration) -> Duration {
        if self.link.sockets.has_buffered() {
            return Duration::ZERO;
        }
        let now = self.now();
        match self.ep.poll_timeout() {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => t.saturating_duration_since(now).min(max_wait),
            None => max_wait,
        }
    }

    /// The socket datagrams arrive on, for a program that polls it
    /// itself (readable: [`Node::progress`] has work).
    pub fn receive_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.link.sockets.receive_fd()
    }

    /// [`Node::run_engine`]'s polls.
    fn run_polls(&mut self) -> bool {
        for _ in 0..POLLS_PER_TURN {
            let busy = self.poll();
            // Completions or events (a connection accepted in this poll
            // arrives as `Event::Incoming`): the program looks first.
            if self.collect() {
                return true;
            }
            if !busy {
                break;
            }
        }
        false
    }

    /// One turn of the loop: runs the engine on what was posted; unless
    /// that gave the program something to look at, waits up to `max_wait`
    /// (less if the core has a deadline sooner) for datagrams and runs the
    /// engine on what arrived and the due timers. Completions and events
    /// are queued. Returns whether any datagram arrived.
    pub fn turn(&mut self, max_wait: Duration) -> bool {
        // Work posted since the last turn goes out before any waiting.
        let received = self.link.io.rx_datagrams;
        if self.run_engine() || !self.completions.is_empty() || !self.events.is_empty() {
            return self.link.io.rx_datagrams > received;
        }
        let now = self.now();
        let wait = match self.ep.poll_timeout() {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => t.saturating_duration_since(now).min(max_wait),
            None => max_wait,
        };
        if !wait.is_zero() {
            self.link.wait(wait);
        }
        self.run_engine();
        self.link.io.rx_datagrams > received
    }

    /// Queues completions and events; returns whether there were any.
    fn collect(&mut self) -> bool {
        let before = self.completions.len() + self.events.len();
        let (mut host, _) = self.queues.ports();
        while let Some(c) = host.poll_completion() {
            self.completions.push_back(c);
        }
        while let Some(e) = self.ep.poll_event() {
            self.events.push_back(e);
        }
        self.completions.len() + self.events.len() > before
    }

    /// Hands what the program just posted to the core and sends what that
    /// allows, without taking any datagram from the sockets: a program in
    /// the middle of handling completions must not have new connections
    /// accepted (and their first packets answered) behind its back; those
    /// wait for the next [`Node::turn`].
    pub fn flush(&mut self) {
        self.link.receive_held = true;
        for _ in 0..POLLS_PER_TURN {
            if !self.poll() {
                break;
            }
        }
        self.link.flush();
        self.link.receive_held = false;
        self.collect();
    }
}

/// The host's entropy source: the operating system's (`getrandom`).
fn os_entropy(out: &mut Seed) -> Result<(), EntropyError> {
    getrandom::fill(out).map_err(|_| EntropyError::Failed)
}
