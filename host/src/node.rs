//! One MetaRoCE endpoint on host sockets: the event loop that feeds the
//! core datagrams and time and sends what it asks for.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, RxMeta};
use metaroce_core::wire::encap::ecn;
use metaroce_core::{finish_packet, CommandError, Config, Endpoint, Event, Instant};
use smoltcp::wire::IpAddress;

use crate::io::Sockets;
use crate::memory::Arenas;
use crate::pcap::PcapRecorder;
use crate::HostError;

/// Connections per host endpoint.
pub const MAX_CONNECTIONS: usize = 16;
/// Paths per connection at most.
pub const MAX_PATHS: usize = 16;
/// The endpoint type the host runs.
pub type HostEndpoint = Endpoint<MAX_CONNECTIONS, MAX_PATHS>;

/// Datagrams handled per loop turn before timers and transmission run, so
/// a flood of arrivals cannot starve the sending side.
const RX_BATCH: usize = 256;
/// Largest datagram accepted.
const RX_BUFFER: usize = 65_536;

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
    /// Sending rate cap and starting rate, Mbit/s.
    pub rate_mbps: u32,
    /// Accept incoming connections.
    pub accept: bool,
    /// Seed of the endpoint's tokens, ids and PSNs.
    pub seed: u64,
}

impl NodeConfig {
    /// The core configuration: emulation timers (round trips of
    /// milliseconds on loopback and veth), this node's ports and limits.
    pub fn core_config(&self, udp_port: u16, entropy_base: u16, entropy_span: u16) -> Config {
        Config {
            udp_port,
            accept_incoming: self.accept,
            mtu: self.mtu,
            paths: self.paths,
            link_rate_mbps: self.rate_mbps,
            entropy_base,
            entropy_span,
            ..Config::for_emulation()
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
}

/// A host endpoint: the core endpoint, its memory and its sockets.
#[derive(Debug)]
pub struct Node {
    pub ep: Box<HostEndpoint>,
    pub mem: Arenas,
    sockets: Sockets,
    origin: std::time::Instant,
    pub pcap: Option<PcapRecorder>,
    pub io: IoStats,
    pub completions: VecDeque<Completion>,
    pub events: VecDeque<Event>,
    rx: Vec<u8>,
    tx: Vec<u8>,
    last_source: Option<SocketAddr>,
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
        if !(1..=MAX_PATHS as u16).contains(&config.paths) {
            return Err(HostError::Usage(format!(
                "--paths must be 1..={MAX_PATHS}, got {}",
                config.paths
            )));
        }
        // Twice the paths: a path whose entropy is re-drawn finds a fresh
        // port without colliding with the others.
        let span = config.paths * 2;
        let sockets = Sockets::bind(config.bind, config.entropy_base, span)?;
        let core = config.core_config(
            sockets.local_addr().port(),
            sockets.entropy_base(),
            sockets.entropy_span(),
        );
        Ok(Node {
            ep: Box::new(HostEndpoint::new(core, config.seed)),
            mem: Arenas::new(),
            sockets,
            origin: std::time::Instant::now(),
            pcap: None,
            io: IoStats::default(),
            completions: VecDeque::new(),
            events: VecDeque::new(),
            rx: vec![0; RX_BUFFER],
            tx: vec![0; RX_BUFFER],
            last_source: None,
        })
    }

    /// The address this node receives on.
    pub fn local_addr(&self) -> SocketAddr {
        self.sockets.local_addr()
    }

    /// Source address of the last datagram received.
    pub fn last_source(&self) -> Option<SocketAddr> {
        self.last_source
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

    /// One turn of the loop: waits up to `max_wait` (less if the core has
    /// a deadline sooner) for datagrams, handles what arrived and the due
    /// timers, sends everything the core has, and queues completions and
    /// events. Returns whether anything arrived.
    pub fn turn(&mut self, max_wait: Duration) -> bool {
        // Work posted since the last turn goes out before any waiting.
        self.transmit_all();
        self.collect();
        let max_wait = if self.completions.is_empty() && self.events.is_empty() {
            max_wait
        } else {
            Duration::ZERO
        };
        let now = self.now();
        let wait = match self.ep.poll_timeout() {
            Some(t) if t <= now => Duration::ZERO,
            Some(t) => t.saturating_duration_since(now).min(max_wait),
            None => max_wait,
        };
        if !wait.is_zero() {
            self.sockets.wait(wait);
        }
        let got = self.receive_batch();
        let now = self.now();
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.ep.handle_timeout(now);
        }
        self.transmit_all();
        self.collect();
        got
    }

    fn receive_batch(&mut self) -> bool {
        let mut got = false;
        for _ in 0..RX_BATCH {
            let r = match self.sockets.try_recv(&mut self.rx) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(_) => {
                    self.io.rx_errors += 1;
                    continue;
                }
            };
            got = true;
            self.io.rx_datagrams += 1;
            self.io.rx_bytes += r.len as u64;
            if r.ecn != ecn::NOT_ECT {
                self.io.rx_ecn_capable += 1;
            }
            let ce = r.ecn == ecn::CE;
            if ce {
                self.io.rx_ce += 1;
            }
            self.last_source = Some(r.from);
            let bytes = &self.rx[..r.len];
            if let Some(p) = self.pcap.as_mut() {
                p.record(r.from, self.sockets.local_addr(), r.ecn, bytes, false);
            }
            let meta = RxMeta {
                source: peer_of(r.from),
                ce,
            };
            let now = self.now();
            self.ep.handle_packet(now, &meta, bytes, &mut self.mem);
        }
        got
    }

    fn transmit_all(&mut self) {
        loop {
            let now = self.now();
            let Some(t) = self.ep.poll_transmit(now, &mut self.tx) else {
                break;
            };
            let len = t.packet_len();
            if len > self.tx.len() {
                self.io.tx_errors += 1;
                continue;
            }
            let len = finish_packet(&t, &mut self.tx[..len], &mut self.mem);
            let to = socket_of(t.peer);
            let data = &self.tx[..len];
            if let Some(p) = self.pcap.as_mut() {
                p.record(self.sockets.source_of(t.src_port), to, t.ecn, data, true);
            }
            match self.sockets.send(t.src_port, to, t.ecn, data) {
                Ok(()) => {
                    self.io.tx_datagrams += 1;
                    self.io.tx_bytes += len as u64;
                }
                Err(_) => self.io.tx_errors += 1,
            }
        }
    }

    fn collect(&mut self) {
        while let Some(c) = self.ep.poll_completion() {
            self.completions.push_back(c);
        }
        while let Some(e) = self.ep.poll_event() {
            self.events.push_back(e);
        }
    }

    /// Sends what the core has queued now (after commands were posted).
    pub fn flush(&mut self) {
        self.transmit_all();
        self.collect();
    }
}
