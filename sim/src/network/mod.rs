//! The simulator proper: the event loop over a [`Topology`] with one
//! [`SimTransport`] per host.
//!
//! Model:
//! * A port serialises one packet at a time at its link's rate (time kept
//!   in picoseconds), then the packet travels the link's delay. Loss and
//!   failure are decided per link direction: a lost packet still takes its
//!   line time.
//! * A host's NIC pulls one packet from its transport whenever it is idle,
//!   so the transport's own pacing and the line rate both hold; the host
//!   has no queue of its own.
//! * A switch routes by destination host over shortest paths, picks among
//!   equal-cost ports by ECMP on the 5-tuple, and queues in the output
//!   port ([`OutputQueue`]: drop-tail, ECN marking).
//! * A failed link loses everything on it and everything sent later; the
//!   switches route around it after `SimConfig::reroute_delay`.
//! * With PFC ([`crate::topology::PfcConfig`]) a switch pauses an ingress
//!   link's transmitter while that port's queued bytes exceed XOFF; a
//!   paused host NIC pulls nothing from its transport.
//! * Events at the same instant run in the order they were scheduled, and
//!   every random draw comes from a stream seeded from `SimConfig::seed`:
//!   the same seed and inputs give the same run, bit for bit.

use std::collections::VecDeque;
use std::time::Duration;

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, RxMeta, WorkRequest};
use metaroce_core::wire::DEFAULT_UDP_PORT;
use metaroce_core::Instant;
use smoltcp::wire::{IpAddress, Ipv4Address};

use crate::ecmp::{self, FiveTuple};
use crate::event::EventQueue;
use crate::link::{ps_to_instant, serialization_ps, LinkConfig, LossState};
use crate::memory::Arena;
use crate::packet::{FrameOverhead, HostId, Packet};
use crate::queue::{Enqueued, OutputQueue, QueueStats};
use crate::rng::{mix, SimRng};
use crate::topology::{LinkId, NodeId, NodeKind, PfcConfig, Topology};
use crate::transport::{SimTransport, TransportError};

mod routes;

/// Simulator settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Seed of every random stream (links, RED marking, ECMP salts).
    pub seed: u64,
    /// Wire bytes beyond the UDP payload.
    pub overhead: FrameOverhead,
    /// How long after a link fails the switches route around it; `None`
    /// keeps the stale routes (traffic hashed onto the link is lost).
    pub reroute_delay: Option<Duration>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            overhead: FrameOverhead::IPV4,
            reroute_delay: Some(Duration::from_micros(100)),
        }
    }
}

/// Counters of one port (one direction of a link).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    pub tx_packets: u64,
    /// Frame bytes sent (without preamble and gap).
    pub tx_bytes: u64,
    /// Lost on the link by the loss model.
    pub lost: u64,
    /// Lost because the link was down.
    pub failed: u64,
    /// PAUSE frames this port's switch sent to the peer (PFC).
    pub pauses_sent: u64,
    /// Output queue (switch ports only).
    pub queue: QueueStats,
}

/// Fabric-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FabricStats {
    pub events: u64,
    pub packets_sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub failed: u64,
    pub queue_drops: u64,
    pub marked: u64,
    /// Packets a switch had no route for.
    pub unroutable: u64,
    /// Packets for an address that is no host.
    pub misaddressed: u64,
    /// PFC PAUSE frames sent.
    pub pauses: u64,
}

#[derive(Debug)]
struct Port {
    peer: NodeId,
    peer_port: usize,
    rate_bps: u64,
    delay: Duration,
    loss: LossState,
    queue: OutputQueue,
    /// When the line is free again, picoseconds.
    free_ps: u64,
    busy: bool,
    down: bool,
    /// The peer sent PAUSE: this port's transmitter waits.
    paused: bool,
    /// PFC: bytes that came in through this port and sit in this switch's
    /// output queues, and whether this switch has paused the peer.
    ingress_bytes: u64,
    pausing_peer: bool,
    /// Ingress port of each packet in `queue`, in the same order (kept
    /// with PFC only, the one reader).
    queued_from: VecDeque<usize>,
    stats: PortStats,
}

#[derive(Debug)]
struct Node {
    kind: NodeKind,
    ports: Vec<Port>,
    salt: u64,
    /// Per destination host: its group of equal-cost output ports, an
    /// index into [`Simulator::route_groups`] (switches only). Four bytes
    /// per host and switch: groups repeat (every host behind one leaf is
    /// reached through the same ports from anywhere but that leaf), so
    /// each distinct group is stored once.
    routes: Vec<u32>,
    /// Random stream for RED marking.
    rng: SimRng,
}

/// A host: its transport, memory and NIC state.
#[derive(Debug)]
pub struct Host<T> {
    pub transport: T,
    pub mem: Arena,
    node: NodeId,
    /// Earliest wake-up scheduled and not yet run.
    timer: Option<Instant>,
}

/// A completion with where and when it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCompletion {
    pub host: HostId,
    pub at: Instant,
    pub completion: Completion,
}

#[derive(Debug)]
enum Event {
    /// A packet reaches `node` through `port`.
    Arrive {
        node: NodeId,
        port: usize,
        packet: Packet,
    },
    /// `port` of `node` finished serialising.
    PortFree { node: NodeId, port: usize },
    /// A host's transport timer.
    HostWake { host: HostId },
    /// A link goes down.
    LinkDown { link: LinkId },
    /// Switches recompute routes.
    Reroute,
    /// A PFC PAUSE (or RESUME) reaches the transmitter of `port`.
    Pause {
        node: NodeId,
        port: usize,
        pause: bool,
    },
    /// Handed back to the caller of [`Simulator::step`].
    App { token: u64 },
}

/// A packet a link lost, for tracing (see [`Simulator::record_losses`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostPacket {
    /// When it was put on the line.
    pub at: Instant,
    pub link_down: bool,
    pub packet: Packet,
}

/// What one [`Simulator::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Fabric or transport work.
    Internal,
    /// An application wake-up scheduled with [`Simulator::schedule_app`].
    App(u64),
}

/// The simulator: fabric, hosts and the event queue.
#[derive(Debug)]
pub struct Simulator<T> {
    now: Instant,
    config: SimConfig,
    events: EventQueue<Event>,
    nodes: Vec<Node>,
    hosts: Vec<Host<T>>,
    links: Vec<((NodeId, usize), (NodeId, usize))>,
    /// Every distinct ECMP group of the current routes; group 0 is empty
    /// (no route).
    route_groups: Vec<Box<[u16]>>,
    completions: Vec<HostCompletion>,
    stats: FabricStats,
    tx_buf: Vec<u8>,
    /// Buffers of packets that reached their end (delivered, lost, dropped
    /// at a dead link), handed to the next transmission: a packet's bytes
    /// are written once, by the transport, and never copied or allocated
    /// in steady state.
    spare_buffers: Vec<Vec<u8>>,
    losses: Option<Vec<LostPacket>>,
    pfc: Option<PfcConfig>,
}

/// The IPv4 address of host `h`: 10.0.0.0/8 numbered from 10.0.0.1.
pub fn host_ip(h: HostId) -> Ipv4Address {
    let n = (h as u32 + 1) & 0x00ff_ffff;
    let [_, a, b, c] = n.to_be_bytes();
    Ipv4Address::new(10, a, b, c)
}

/// The host with address `ip`, if it is one of the `hosts`.
pub fn host_of_ip(ip: IpAddress, hosts: usize) -> Option<HostId> {
    let IpAddress::Ipv4(v4) = ip else {
        return None;
    };
    let [ten, a, b, c] = v4.octets();
    let n = u32::from_be_bytes([0, a, b, c]);
    let h = usize::try_from(n.checked_sub(1)?).ok()?;
    (ten == 10 && h < hosts).then_some(h)
}

impl<T: SimTransport> Simulator<T> {
    /// Builds the fabric; `make` creates host `h`'s transport from its
    /// address and a seed for its own randomness. Hosts start with an
    /// empty arena; size it with [`Simulator::host_mut`] before use.
    pub fn new(
        topology: &Topology,
        config: SimConfig,
        mut make: impl FnMut(HostId, PeerAddr, u64) -> T,
    ) -> Simulator<T> {
        let host_count = topology.hosts.len();
        let mut nodes: Vec<Node> = topology
            .nodes
            .iter()
            .enumerate()
            .map(|(i, &kind)| Node {
                kind,
                ports: Vec::new(),
                salt: mix(config.seed ^ mix(i as u64 + 0x5a17)),
                routes: Vec::new(),
                rng: SimRng::stream(config.seed, 0x1_0000_0000 + i as u64),
            })
            .collect();
        let mut links = Vec::with_capacity(topology.links.len());
        for (id, l) in topology.links.iter().enumerate() {
            let pa = nodes[l.a].ports.len();
            let pb = nodes[l.b].ports.len();
            // `dir` 0: `a`'s port towards `b`; 1: `b`'s towards `a`.
            let port = |peer, peer_port, dir: u64, c: &LinkConfig, queue| Port {
                peer,
                peer_port,
                rate_bps: c.rate_bps,
                delay: c.delay,
                loss: LossState::new(
                    if dir == 0 {
                        c.loss
                    } else {
                        c.reverse_loss.unwrap_or(c.loss)
                    },
                    SimRng::stream(config.seed, 2 * id as u64 + dir),
                ),
                queue: OutputQueue::new(queue),
                free_ps: 0,
                busy: false,
                down: false,
                paused: false,
                ingress_bytes: 0,
                pausing_peer: false,
                queued_from: VecDeque::new(),
                stats: PortStats::default(),
            };
            let forward = port(l.b, pb, 0, &l.config, topology.queue_of(l.a));
            let backward = port(l.a, pa, 1, &l.config, topology.queue_of(l.b));
            nodes[l.a].ports.push(forward);
            nodes[l.b].ports.push(backward);
            links.push(((l.a, pa), (l.b, pb)));
        }
        let hosts = topology
            .hosts
            .iter()
            .enumerate()
            .map(|(h, &node)| {
                let addr = PeerAddr {
                    ip: IpAddress::Ipv4(host_ip(h)),
                    port: DEFAULT_UDP_PORT,
                };
                Host {
                    transport: make(h, addr, mix(config.seed ^ mix(h as u64 + 0x4057))),
                    mem: Arena::new(0),
                    node,
                    timer: None,
                }
            })
            .collect();
        let mut events = EventQueue::default();
        for (id, l) in topology.links.iter().enumerate() {
            if let Some(at) = l.config.fail_at {
                events.push(at, Event::LinkDown { link: id });
            }
        }
        let mut sim = Simulator {
            now: Instant::ZERO,
            config,
            events,
            nodes,
            hosts,
            links,
            route_groups: Vec::new(),
            completions: Vec::new(),
            stats: FabricStats::default(),
            tx_buf: Vec::new(),
            spare_buffers: Vec::new(),
            losses: None,
            pfc: topology.pfc,
        };
        debug_assert_eq!(sim.hosts.len(), host_count);
        sim.compute_routes();
        sim
    }

    // ----- Getters --------------------------------------------------------

    /// Virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// A host.
    pub fn host(&self, h: HostId) -> &Host<T> {
        &self.hosts[h]
    }

    /// A host, to register memory or inspect its transport.
    pub fn host_mut(&mut self, h: HostId) -> &mut Host<T> {
        &mut self.hosts[h]
    }

    /// Host `h`'s transport address.
    pub fn addr(&self, h: HostId) -> PeerAddr {
        PeerAddr {
            ip: IpAddress::Ipv4(host_ip(h)),
            port: DEFAULT_UDP_PORT,
        }
    }

    /// Fabric-wide counters (queue and port counters summed).
    pub fn stats(&self) -> FabricStats {
        let mut s = self.stats;
        s.events = self.events.scheduled() - self.events.len() as u64;
        for port in self.nodes.iter().flat_map(|n| &n.ports) {
            s.packets_sent += port.stats.tx_packets;
            s.lost += port.stats.lost;
            s.failed += port.stats.failed;
            s.queue_drops += port.queue.stats().dropped;
            s.marked += port.queue.stats().marked;
            s.pauses += port.stats.pauses_sent;
        }
        s
    }

    /// Counters of each direction of `link`: (a to b, b to a).
    pub fn link_stats(&self, link: LinkId) -> (PortStats, PortStats) {
        let ((na, pa), (nb, pb)) = self.links[link];
        let get = |n: NodeId, p: usize| {
            let port = &self.nodes[n].ports[p];
            PortStats {
                queue: port.queue.stats(),
                ..port.stats
            }
        };
        (get(na, pa), get(nb, pb))
    }

    /// Events processed so far.
    pub fn events_processed(&self) -> u64 {
        self.events.scheduled() - self.events.len() as u64
    }

    /// Completions recorded since the last [`Simulator::drain_completions`].
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Moves the recorded completions into `out`.
    pub fn drain_completions(&mut self, out: &mut Vec<HostCompletion>) {
        out.append(&mut self.completions);
    }

    /// Starts keeping every packet a link loses (by the loss model or
    /// because it was down when sending), for tracing.
    pub fn record_losses(&mut self) {
        self.losses.get_or_insert_with(Vec::new);
    }

    /// The packets lost since [`Simulator::record_losses`].
    pub fn losses(&self) -> &[LostPacket] {
        self.losses.as_deref().unwrap_or(&[])
    }

    /// The equal-cost ports `node` uses towards host `dst` (for tests).
    pub fn route(&self, node: NodeId, dst: HostId) -> &[u16] {
        self.nodes[node]
            .routes
            .get(dst)
            .map_or(&[][..], |&g| &self.route_groups[g as usize][..])
    }

    /// The switch port ECMP picks for a packet at `node` (for tests).
    pub fn ecmp_port(&self, node: NodeId, packet: &Packet) -> Option<u16> {
        let group = self.route(node, packet.dst);
        let i = ecmp::select(&self.tuple(packet), self.nodes[node].salt, group.len());
        group.get(i).copied()
    }

    // ----- Commands -------------------------------------------------------

    /// Opens a connection from host `a` to host `b`; returns `a`'s handle.
    pub fn connect(&mut self, a: HostId, b: HostId) -> Result<ConnHandle, TransportError> {
        if a == b || a >= self.hosts.len() || b >= self.hosts.len() {
            return Err(TransportError::Refused("bad host pair"));
        }
        let (a_addr, b_addr) = (self.addr(a), self.addr(b));
        let (ha, hb) = if a < b {
            let (lo, hi) = self.hosts.split_at_mut(b);
            (&mut lo[a], &mut hi[0])
        } else {
            let (lo, hi) = self.hosts.split_at_mut(a);
            (&mut hi[0], &mut lo[b])
        };
        let h = T::connect_pair(
            self.now,
            &mut ha.transport,
            a_addr,
            &mut hb.transport,
            b_addr,
        )?;
        self.service_host(a);
        self.service_host(b);
        Ok(h)
    }

    /// Posts a work request on host `h` and lets it transmit.
    pub fn post_send(
        &mut self,
        h: HostId,
        conn: ConnHandle,
        wr: WorkRequest,
    ) -> Result<(), TransportError> {
        self.hosts[h].transport.post_send(conn, wr)?;
        self.service_host(h);
        Ok(())
    }

    /// Lets host `h` act now: after its transport was changed directly
    /// (through [`Simulator::host_mut`]), so it transmits and arms its timer.
    pub fn poll_host(&mut self, h: HostId) {
        if h < self.hosts.len() {
            self.service_host(h);
        }
    }

    /// Schedules an application wake-up: [`Simulator::step`] returns
    /// [`Step::App`] with `token` at `at` (or now, if `at` has passed).
    pub fn schedule_app(&mut self, at: Instant, token: u64) {
        self.events.push(at.max(self.now), Event::App { token });
    }

    /// Takes link `link` down at `at` (both directions).
    pub fn fail_link_at(&mut self, link: LinkId, at: Instant) {
        self.events.push(at.max(self.now), Event::LinkDown { link });
    }

    // ----- The loop -------------------------------------------------------

    /// When the next event is due.
    pub fn next_event_at(&self) -> Option<Instant> {
        self.events.peek_time()
    }

    /// Runs the next event. `None` when nothing is left to do.
    pub fn step(&mut self) -> Option<Step> {
        let (at, event) = self.events.pop()?;
        self.now = self.now.max(at);
        match event {
            Event::Arrive { node, port, packet } => self.arrive(node, port, packet),
            Event::PortFree { node, port } => self.port_free(node, port),
            Event::HostWake { host } => self.host_wake(host),
            Event::LinkDown { link } => self.link_down(link),
            Event::Reroute => self.compute_routes(),
            Event::Pause { node, port, pause } => self.pause(node, port, pause),
            Event::App { token } => return Some(Step::App(token)),
        }
        Some(Step::Internal)
    }

    /// Runs events until virtual time would pass `until` (or none remain).
    pub fn run_until(&mut self, until: Instant) {
        while self.events.peek_time().is_some_and(|t| t <= until) {
            self.step();
        }
        self.now = self.now.max(until);
    }

    fn arrive(&mut self, node: NodeId, port: usize, packet: Packet) {
        if self.nodes[node].ports[port].down {
            // In flight when the link failed.
            let (peer, peer_port) = {
                let p = &self.nodes[node].ports[port];
                (p.peer, p.peer_port)
            };
            self.nodes[peer].ports[peer_port].stats.failed += 1;
            self.spare_buffers.push(packet.bytes);
            return;
        }
        match self.nodes[node].kind {
            NodeKind::Host(h) => self.deliver(h, packet),
            NodeKind::Switch => self.forward(node, port, packet),
        }
    }

    fn deliver(&mut self, h: HostId, packet: Packet) {
        if packet.dst != h {
            self.stats.misaddressed += 1;
            self.spare_buffers.push(packet.bytes);
            return;
        }
        self.stats.delivered += 1;
        let meta = RxMeta {
            source: PeerAddr {
                ip: IpAddress::Ipv4(host_ip(packet.src)),
                port: packet.src_port,
            },
            ce: packet.ecn == metaroce_core::wire::encap::ecn::CE,
        };
        let host = &mut self.hosts[h];
        host.transport.handle_packet(
            self.now,
            &meta,
            packet.dst_port,
            &packet.bytes,
            &mut host.mem,
        );
        self.spare_buffers.push(packet.bytes);
        self.service_host(h);
    }

    fn tuple(&self, p: &Packet) -> FiveTuple {
        FiveTuple {
            src_ip: u32::from_be_bytes(host_ip(p.src).octets()),
            dst_ip: u32::from_be_bytes(host_ip(p.dst).octets()),
            protocol: ecmp::UDP,
            src_port: p.src_port,
            dst_port: p.dst_port,
        }
    }

    fn forward(&mut self, node: NodeId, ingress: usize, packet: Packet) {
        let Some(out) = self.ecmp_port(node, &packet) else {
            self.stats.unroutable += 1;
            self.spare_buffers.push(packet.bytes);
            return;
        };
        let out = usize::from(out);
        let len = self.config.overhead.frame_len(packet.bytes.len());
        let n = &mut self.nodes[node];
        let verdict = n.ports[out].queue.enqueue(packet, len, &mut n.rng);
        if verdict == Enqueued::Dropped {
            return;
        }
        if let Some(pfc) = self.pfc {
            n.ports[out].queued_from.push_back(ingress);
            let inp = &mut n.ports[ingress];
            inp.ingress_bytes += len;
            if inp.ingress_bytes > pfc.xoff_bytes && !inp.pausing_peer {
                inp.pausing_peer = true;
                inp.stats.pauses_sent += 1;
                let (peer, peer_port, delay) = (inp.peer, inp.peer_port, inp.delay);
                self.events.push(
                    self.now + delay,
                    Event::Pause {
                        node: peer,
                        port: peer_port,
                        pause: true,
                    },
                );
            }
        }
        let p = &self.nodes[node].ports[out];
        if !p.busy && !p.paused {
            self.start_next(node, out);
        }
    }

    /// Starts serialising the head of a switch port's queue (unless the
    /// peer paused it).
    fn start_next(&mut self, node: NodeId, port: usize) {
        if self.nodes[node].ports[port].paused {
            return;
        }
        let Some((packet, len)) = self.nodes[node].ports[port].queue.dequeue() else {
            return;
        };
        let ingress = match self.pfc {
            Some(_) => self.nodes[node].ports[port].queued_from.pop_front(),
            None => None,
        };
        if let (Some(pfc), Some(i)) = (self.pfc, ingress) {
            let inp = &mut self.nodes[node].ports[i];
            inp.ingress_bytes = inp.ingress_bytes.saturating_sub(len);
            if inp.pausing_peer && inp.ingress_bytes < pfc.xon_bytes {
                inp.pausing_peer = false;
                let (peer, peer_port, delay) = (inp.peer, inp.peer_port, inp.delay);
                self.events.push(
                    self.now + delay,
                    Event::Pause {
                        node: peer,
                        port: peer_port,
                        pause: false,
                    },
                );
            }
        }
        self.transmit(node, port, packet);
    }

    /// A PAUSE or RESUME reaches `port`'s transmitter.
    fn pause(&mut self, node: NodeId, port: usize, pause: bool) {
        let p = &mut self.nodes[node].ports[port];
        p.paused = pause;
        if pause || p.busy {
            return;
        }
        match self.nodes[node].kind {
            NodeKind::Host(h) => self.service_host(h),
            NodeKind::Switch => self.start_next(node, port),
        }
    }

    /// Puts `packet` on the line of `port`: busy for its line time, then
    /// it travels the link unless the link loses it.
    fn transmit(&mut self, node: NodeId, port: usize, packet: Packet) {
        let now_ps = self.now.as_nanos().saturating_mul(1_000);
        let line = self.config.overhead.line_len(packet.bytes.len());
        let frame = self.config.overhead.frame_len(packet.bytes.len());
        let p = &mut self.nodes[node].ports[port];
        // Sent at the instant the line freed (rounded up to a nanosecond):
        // start at the exact picosecond, so back-to-back packets keep line
        // rate without rounding loss.
        let start = if ps_to_instant(p.free_ps) == self.now {
            p.free_ps
        } else {
            p.free_ps.max(now_ps)
        };
        let end = start + serialization_ps(line, p.rate_bps);
        p.free_ps = end;
        p.busy = true;
        p.stats.tx_packets += 1;
        p.stats.tx_bytes += frame;
        let done = ps_to_instant(end);
        let (peer, peer_port, delay) = (p.peer, p.peer_port, p.delay);
        let down = p.down;
        let keep = if down {
            p.stats.failed += 1;
            false
        } else if p.loss.lose() {
            p.stats.lost += 1;
            false
        } else {
            true
        };
        self.events.push(done, Event::PortFree { node, port });
        if !keep {
            match self.losses.as_mut() {
                Some(log) => log.push(LostPacket {
                    at: self.now,
                    link_down: down,
                    packet,
                }),
                None => self.spare_buffers.push(packet.bytes),
            }
        } else {
            self.events.push(
                done + delay,
                Event::Arrive {
                    node: peer,
                    port: peer_port,
                    packet,
                },
            );
        }
    }

    fn port_free(&mut self, node: NodeId, port: usize) {
        self.nodes[node].ports[port].busy = false;
        match self.nodes[node].kind {
            NodeKind::Host(h) => self.service_host(h),
            NodeKind::Switch => self.start_next(node, port),
        }
    }

    fn host_wake(&mut self, h: HostId) {
        let host = &mut self.hosts[h];
        if host.timer == Some(self.now) {
            host.timer = None;
        }
        self.service_host(h);
    }

    /// After any input: timers that are due, completions, one packet if
    /// the NIC is idle, then the next wake-up. Due timers run here and not
    /// only on a wake-up, because a deadline that passes while the NIC is
    /// busy arms no wake-up (the NIC's `PortFree` comes first).
    fn service_host(&mut self, h: HostId) {
        let now = self.now;
        let node = self.hosts[h].node;
        let nic_busy = self.nodes[node]
            .ports
            .first()
            .is_none_or(|p| p.busy || p.paused);
        let mut buf = core::mem::take(&mut self.tx_buf);
        let host = &mut self.hosts[h];
        let due = host.transport.poll_timeout().is_some_and(|d| d <= now);
        let sent = match (due, nic_busy) {
            (true, true) => {
                host.transport.handle_timeout(now, &mut host.mem);
                None
            }
            (false, true) => None,
            (true, false) => host
                .transport
                .timeout_and_transmit(now, &mut host.mem, &mut buf),
            (false, false) => host.transport.poll_transmit(now, &mut host.mem, &mut buf),
        };
        while let Some(completion) = host.transport.poll_completion() {
            self.completions.push(HostCompletion {
                host: h,
                at: now,
                completion,
            });
        }
        let deadline = host.transport.poll_timeout();
        let busy_after = nic_busy || sent.is_some();
        if let Some(meta) = sent {
            match host_of_ip(meta.peer.ip, self.hosts.len()) {
                Some(dst) => {
                    let packet = Packet {
                        src: h,
                        dst,
                        src_port: meta.src_port,
                        dst_port: meta.peer.port,
                        ecn: meta.ecn,
                        bytes: core::mem::replace(
                            &mut buf,
                            self.spare_buffers.pop().unwrap_or_default(),
                        ),
                    };
                    self.transmit(node, 0, packet);
                }
                None => self.stats.misaddressed += 1,
            }
        }
        self.tx_buf = buf;
        if let Some(d) = deadline {
            // A deadline already due while the NIC is busy: the NIC's
            // PortFree wakes the host. Due while idle: the transport has
            // nothing to send yet, look again a nanosecond later.
            let at = if d > now {
                Some(d)
            } else if busy_after {
                None
            } else {
                Some(now + Duration::from_nanos(1))
            };
            if let Some(at) = at {
                let host = &mut self.hosts[h];
                if host.timer.is_none_or(|t| at < t) {
                    host.timer = Some(at);
                    self.events.push(at, Event::HostWake { host: h });
                }
            }
        }
    }

    fn link_down(&mut self, link: LinkId) {
        let ((na, pa), (nb, pb)) = self.links[link];
        self.nodes[na].ports[pa].down = true;
        self.nodes[nb].ports[pb].down = true;
        if let Some(d) = self.config.reroute_delay {
            self.events.push(self.now + d, Event::Reroute);
        }
    }
}
