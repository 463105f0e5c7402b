//! The emulated Ethernet fabric: one UDP socket on 127.0.0.1 per node
//! (QEMU's `-netdev dgram` carries one frame per datagram), a switch that
//! forwards by destination MAC (broadcast to every other node), and per
//! egress port the impairments of a lossy data-centre link:
//!
//! * duplication, then random (Bernoulli) and burst (Gilbert-Elliott) drops;
//! * a rate-limited output queue of finite size (tail drop when full) that
//!   marks ECN-capable IPv4/IPv6 frames Congestion Experienced above a depth
//!   threshold, as a switch's RED/ECN does;
//! * propagation delay with uniform jitter, and extra delay for a fraction
//!   of frames, both of which reorder.
//!
//! An optional host gateway ([`crate::gateway`]) is one more switch port:
//! host datagrams enter the switch as frames from it, and frames to its MAC
//! (or broadcast ARP) are handed to it instead of a QEMU socket.
//!
//! Every delivered frame is written to a pcap file (LINKTYPE_ETHERNET) with
//! its delivery time. All randomness comes from one seeded generator, so a
//! run's impairment decisions depend only on the seed and the frame order.

use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io::BufWriter;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metaroce_core::wire::encap::mark_ce;

use crate::gateway::{Gateway, GatewaySpec, GatewayStats};
use metaroce_platform::random::{RandomSource, XorShiftRng};
use pcap_file::pcap::{PcapPacket, PcapWriter};

/// Impairments applied at every egress port.
#[derive(Debug, Clone, PartialEq)]
pub struct Impairments {
    /// Probability of a random drop.
    pub loss: f64,
    /// Probability that a good frame starts a loss burst.
    pub burst_start: f64,
    /// Mean frames lost per burst (geometric).
    pub burst_len: f64,
    /// Probability of delivering a frame twice.
    pub duplicate: f64,
    /// Fixed one-way delay.
    pub delay: Duration,
    /// Uniform extra delay in `[0, jitter)`.
    pub jitter: Duration,
    /// Probability of holding a frame back by `reorder_delay`.
    pub reorder: f64,
    pub reorder_delay: Duration,
    /// Egress rate in Mbit/s (0: unlimited).
    pub rate_mbps: u64,
    /// Output queue capacity in bytes (tail drop above).
    pub queue_bytes: usize,
    /// Queue depth above which ECN-capable frames are marked CE
    /// (`usize::MAX`: never).
    pub ecn_threshold_bytes: usize,
    pub seed: u64,
}

impl Default for Impairments {
    fn default() -> Self {
        Impairments {
            loss: 0.0,
            burst_start: 0.0,
            burst_len: 3.0,
            duplicate: 0.0,
            delay: Duration::from_micros(50),
            jitter: Duration::ZERO,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(300),
            rate_mbps: 0,
            queue_bytes: 256 * 1024,
            ecn_threshold_bytes: usize::MAX,
            seed: 1,
        }
    }
}

/// Counters of one egress port (traffic toward one node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    pub frames_in: u64,
    pub frames_out: u64,
    pub bytes_out: u64,
    pub dropped_random: u64,
    pub dropped_burst: u64,
    pub dropped_queue: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub ce_marked: u64,
}

impl PortStats {
    /// All drops.
    pub fn dropped(&self) -> u64 {
        self.dropped_random + self.dropped_burst + self.dropped_queue
    }
}

/// A fabric port as a node sees it: where QEMU must send (`fabric`) and
/// listen (`node`).
#[derive(Debug, Clone, Copy)]
pub struct PortAddrs {
    pub fabric: SocketAddr,
    pub node: SocketAddr,
}

struct Scheduled {
    at: Instant,
    seq: u64,
    port: usize,
    frame: Vec<u8>,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Egress {
    /// Departure times and sizes of frames still in the output queue.
    queue: VecDeque<(Instant, usize)>,
    queued_bytes: usize,
    free_at: Instant,
    in_burst: bool,
    stats: PortStats,
}

/// A running fabric.
pub struct Fabric {
    ports: Vec<PortAddrs>,
    gateway: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<SwitchResult>>>,
    receivers: Vec<JoinHandle<()>>,
}

/// What the switch thread returns: per-port counters and the gateway's.
type SwitchResult = (Vec<PortStats>, Option<GatewayStats>);
/// A frame entering the switch: ingress port, bytes, arrival time.
type Ingress = (usize, Vec<u8>, Instant);
/// The gateway as the switch holds it, with a way to answer into the fabric.
type GatewayPort = Option<(Gateway, mpsc::Sender<Ingress>)>;

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("ports", &self.ports)
            .finish()
    }
}

/// A free UDP port on 127.0.0.1 (bound and released; QEMU binds it next).
fn free_port() -> std::io::Result<SocketAddr> {
    UdpSocket::bind("127.0.0.1:0")?.local_addr()
}

impl Fabric {
    /// Starts a fabric for nodes with the given MAC addresses.
    pub fn start(
        macs: &[[u8; 6]],
        imp: Impairments,
        pcap_path: Option<&Path>,
    ) -> std::io::Result<Fabric> {
        Fabric::start_with_gateway(macs, imp, pcap_path, None)
    }

    /// Starts a fabric with a host gateway as one more port (its MAC is
    /// `gateway.mac`); see [`crate::gateway`].
    pub fn start_with_gateway(
        macs: &[[u8; 6]],
        imp: Impairments,
        pcap_path: Option<&Path>,
        gateway: Option<GatewaySpec>,
    ) -> std::io::Result<Fabric> {
        let mut sockets = Vec::new();
        let mut ports = Vec::new();
        for _ in macs {
            let socket = UdpSocket::bind("127.0.0.1:0")?;
            let fabric = socket.local_addr()?;
            let node = free_port()?;
            ports.push(PortAddrs { fabric, node });
            sockets.push(socket);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Ingress>();
        let mut receivers = Vec::new();
        for (i, socket) in sockets.iter().enumerate() {
            let socket = socket.try_clone()?;
            socket.set_read_timeout(Some(Duration::from_millis(50)))?;
            let tx = tx.clone();
            let stop = stop.clone();
            receivers.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, _)) = socket.recv_from(&mut buf) {
                        if tx.send((i, buf[..n].to_vec(), Instant::now())).is_err() {
                            return;
                        }
                    }
                }
            }));
        }
        let gateway = gateway.map(Gateway::bind).transpose()?;
        let gateway_addr = gateway.as_ref().map(Gateway::local_addr).transpose()?;
        if let Some(g) = &gateway {
            let receiver = g.receiver()?;
            let tx = tx.clone();
            let stop = stop.clone();
            let index = macs.len();
            receivers.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    if let Some(frame) = receiver.next_frame(&mut buf) {
                        if tx.send((index, frame, Instant::now())).is_err() {
                            return;
                        }
                    }
                }
            }));
        }
        // The switch keeps a sender for the gateway's answers (ARP).
        let inject = tx.clone();
        drop(tx);
        let pcap = match pcap_path {
            Some(p) => Some(
                PcapWriter::new(BufWriter::new(File::create(p)?)).map_err(std::io::Error::other)?,
            ),
            None => None,
        };
        let mut macs = macs.to_vec();
        if let Some(g) = &gateway {
            macs.push(g.spec.mac);
        }
        let node_addrs: Vec<SocketAddr> = ports.iter().map(|p| p.node).collect();
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut gateway = gateway.map(|g| (g, inject));
            let stats = switch(
                rx,
                sockets,
                node_addrs,
                macs,
                imp,
                pcap,
                stop2,
                &mut gateway,
            )?;
            Ok((stats, gateway.map(|(g, _)| g.stats)))
        });
        Ok(Fabric {
            ports,
            gateway: gateway_addr,
            stop,
            thread: Some(thread),
            receivers,
        })
    }

    /// The addresses of each node's port.
    pub fn ports(&self) -> &[PortAddrs] {
        &self.ports
    }

    /// The host address of the gateway, if the fabric has one.
    pub fn gateway_addr(&self) -> Option<SocketAddr> {
        self.gateway
    }

    /// Stops the fabric and returns each node port's egress counters.
    pub fn stop(self) -> std::io::Result<Vec<PortStats>> {
        let nodes = self.ports.len();
        self.stop_with_gateway().map(|(mut ports, _)| {
            ports.truncate(nodes);
            ports
        })
    }

    /// Stops the fabric; returns each port's counters (the gateway's port
    /// last, if any) and the gateway's own counters.
    pub fn stop_with_gateway(mut self) -> std::io::Result<SwitchResult> {
        self.stop.store(true, Ordering::Relaxed);
        for r in self.receivers.drain(..) {
            let _ = r.join();
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            _ => Err(std::io::Error::other("fabric thread panicked")),
        }
    }
}

fn chance(rng: &mut XorShiftRng, p: f64) -> bool {
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    p > 0.0 && unit < p
}

fn uniform(rng: &mut XorShiftRng, max: Duration) -> Duration {
    let nanos = max.as_nanos() as u64;
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.next_u64() % nanos)
}

#[allow(clippy::too_many_arguments)]
fn switch(
    rx: mpsc::Receiver<Ingress>,
    sockets: Vec<UdpSocket>,
    node_addrs: Vec<SocketAddr>,
    macs: Vec<[u8; 6]>,
    imp: Impairments,
    mut pcap: Option<PcapWriter<BufWriter<File>>>,
    stop: Arc<AtomicBool>,
    gateway: &mut GatewayPort,
) -> std::io::Result<Vec<PortStats>> {
    let start = Instant::now();
    let wall_start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut rng = XorShiftRng::new(imp.seed);
    let mut egress: Vec<Egress> = macs
        .iter()
        .map(|_| Egress {
            queue: VecDeque::new(),
            queued_bytes: 0,
            free_at: start,
            in_burst: false,
            stats: PortStats::default(),
        })
        .collect();
    let mut heap: BinaryHeap<Scheduled> = BinaryHeap::new();
    let mut seq = 0u64;
    let burst_end = if imp.burst_len > 1.0 {
        1.0 / imp.burst_len
    } else {
        1.0
    };
    loop {
        let now = Instant::now();
        // Deliver everything due.
        while heap.peek().is_some_and(|s| s.at <= now) {
            let Some(s) = heap.pop() else { break };
            let port = &mut egress[s.port];
            port.stats.frames_out += 1;
            port.stats.bytes_out += s.frame.len() as u64;
            if let Some(socket) = sockets.get(s.port) {
                let _ = socket.send_to(&s.frame, node_addrs[s.port]);
            } else if let Some((g, inject)) = gateway.as_mut() {
                if let Some(answer) = g.deliver(&s.frame) {
                    let _ = inject.send((s.port, answer, Instant::now()));
                }
            }
            if let Some(w) = pcap.as_mut() {
                let ts = wall_start + s.at.saturating_duration_since(start);
                let _ = w.write_packet(&PcapPacket::new(ts, s.frame.len() as u32, &s.frame));
            }
        }
        if stop.load(Ordering::Relaxed) && heap.is_empty() {
            break;
        }
        let wait = heap
            .peek()
            .map_or(Duration::from_millis(20), |s| {
                s.at.saturating_duration_since(now)
            })
            .min(Duration::from_millis(20));
        let (from, frame, arrived) = match rx.recv_timeout(wait) {
            Ok(x) => x,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if heap.is_empty() {
                    break;
                }
                std::thread::sleep(wait);
                continue;
            }
        };
        if frame.len() < 14 {
            continue;
        }
        if from == sockets.len() && frame[12..14] == [0x08, 0x00] {
            if let Some((g, _)) = gateway.as_mut() {
                g.stats.to_node += 1;
            }
        }
        let dst: [u8; 6] = frame[..6].try_into().unwrap_or([0; 6]);
        let broadcast = dst[0] & 1 == 1;
        for (to, mac) in macs.iter().enumerate() {
            if to == from || !(broadcast || *mac == dst) {
                continue;
            }
            let port = &mut egress[to];
            port.stats.frames_in += 1;
            let copies = if chance(&mut rng, imp.duplicate) {
                port.stats.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                // Burst state (Gilbert-Elliott with a lossless good state).
                if port.in_burst {
                    if chance(&mut rng, burst_end) {
                        port.in_burst = false;
                    } else {
                        port.stats.dropped_burst += 1;
                        continue;
                    }
                } else if chance(&mut rng, imp.burst_start) {
                    port.in_burst = true;
                    port.stats.dropped_burst += 1;
                    continue;
                }
                if chance(&mut rng, imp.loss) {
                    port.stats.dropped_random += 1;
                    continue;
                }
                // Output queue: drain what has left by now.
                while port.queue.front().is_some_and(|(t, _)| *t <= arrived) {
                    if let Some((_, len)) = port.queue.pop_front() {
                        port.queued_bytes -= len;
                    }
                }
                let len = frame.len();
                if port.queued_bytes + len > imp.queue_bytes {
                    port.stats.dropped_queue += 1;
                    continue;
                }
                let mut out = frame.clone();
                if port.queued_bytes > imp.ecn_threshold_bytes && mark_ce(&mut out) {
                    port.stats.ce_marked += 1;
                }
                let departs = if let Some(ns) = (len as u64 * 8 * 1000).checked_div(imp.rate_mbps) {
                    let serialise = Duration::from_nanos(ns);
                    let d = port.free_at.max(arrived) + serialise;
                    port.free_at = d;
                    port.queue.push_back((d, len));
                    port.queued_bytes += len;
                    d
                } else {
                    arrived
                };
                let mut at = departs + imp.delay + uniform(&mut rng, imp.jitter);
                if chance(&mut rng, imp.reorder) {
                    port.stats.reordered += 1;
                    at += imp.reorder_delay;
                }
                seq += 1;
                heap.push(Scheduled {
                    at,
                    seq,
                    port: to,
                    frame: out,
                });
            }
        }
    }
    if let Some(w) = pcap {
        let _ = w.into_writer().into_inner();
    }
    Ok(egress.into_iter().map(|e| e.stats).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: u8, src: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, dst]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, src]);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        f
    }

    /// Two fake nodes on sockets exchange frames through a lossless fabric
    /// and then a lossy one; counters add up.
    #[test]
    fn forwards_by_mac_and_counts_drops() {
        let macs = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
        for (loss, expect_all) in [(0.0, true), (0.5, false)] {
            let imp = Impairments {
                loss,
                seed: 7,
                ..Impairments::default()
            };
            let fabric = Fabric::start(&macs, imp, None).unwrap();
            let ports: Vec<PortAddrs> = fabric.ports().to_vec();
            let a = UdpSocket::bind(ports[0].node).unwrap();
            let b = UdpSocket::bind(ports[1].node).unwrap();
            b.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            for i in 0..50u8 {
                let mut f = frame(2, 1, 100);
                f[20] = i;
                a.send_to(&f, ports[0].fabric).unwrap();
            }
            // A broadcast reaches B too; a frame to an unknown MAC goes nowhere.
            let mut broadcast = frame(0, 1, 60);
            broadcast[..6].fill(0xff);
            a.send_to(&broadcast, ports[0].fabric).unwrap();
            a.send_to(&frame(9, 1, 60), ports[0].fabric).unwrap();
            let mut got = 0;
            let mut buf = [0u8; 2048];
            while b.recv_from(&mut buf).is_ok() {
                got += 1;
            }
            let stats = fabric.stop().unwrap();
            assert_eq!(stats[1].frames_in, 51, "loss {loss}: {stats:?}");
            assert_eq!(stats[1].frames_out, got);
            assert_eq!(stats[1].frames_out + stats[1].dropped(), 51);
            assert_eq!(expect_all, got == 51);
            assert_eq!(stats[0].frames_in, 0);
        }
    }
}
