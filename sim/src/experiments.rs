//! The fabric experiments, as library functions so that tests run small
//! versions of them and the `metaroce-sim` binary (`cargo xtask sim`) runs
//! the full ones. Each returns plain rows; printing, CSV and plots belong
//! to the caller.
//!
//! Done so far: `loss-sweep`, `incast`, `path-failure`, `permutation`,
//! `all-to-all`, `spray`.

use std::time::Duration;

use metaroce_core::api::PeerAddr;
use metaroce_core::Instant;

use crate::link::{LinkConfig, LossModel};
use crate::metaroce::{compact_layout, MetaRoce};
use crate::network::{SimConfig, Simulator};
use crate::packet::{FrameOverhead, HostId};
use crate::roce::Roce;
use crate::topology::{LeafSpine, Topology};
use crate::transport::SimTransport;
use crate::workload::{self, Flow, FlowStatus, HostMemory, Report, WorkloadConfig};

/// Which transport a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    MetaRoce,
    Roce,
}

impl Protocol {
    /// Both, MetaRoCE first.
    pub const ALL: [Protocol; 2] = [Protocol::MetaRoce, Protocol::Roce];
    /// MetaRoCE alone.
    pub const METAROCE: &'static [Protocol] = &[Protocol::MetaRoce];
    /// RoCEv2 alone.
    pub const ROCE: &'static [Protocol] = &[Protocol::Roce];

    /// The name tables use.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::MetaRoce => "MetaRoCE",
            Protocol::Roce => "RoCEv2",
        }
    }

    /// Bytes on the line (frames with their preamble and gap, as
    /// [`FrameOverhead::IPV4`] counts them) of `bytes` of WRITEs of
    /// `message` bytes each in packets of the protocol's default MTU.
    pub fn write_line_bytes(self, bytes: u64, message: u64) -> u64 {
        use metaroce_core::wire::packet::{PacketType, HEADER_LEN};
        let (mtu, per_packet, per_message) = match self {
            Protocol::MetaRoce => (
                metaroce_core::Config::default().mtu,
                HEADER_LEN
                    + PacketType::Write.extension_len().unwrap_or(0)
                    + metaroce_core::wire::CRC_LEN,
                0,
            ),
            Protocol::Roce => (
                // `QpSetup::new`'s path MTU, as `Roce` sets its QPs up.
                4096,
                roce_baseline::wire::BTH_LEN + roce_baseline::wire::ICRC_LEN,
                roce_baseline::wire::RETH_LEN,
            ),
        };
        let (mtu, message) = (u64::from(mtu).max(1), message.max(1));
        let messages = bytes.div_ceil(message);
        let packets = (bytes / message) * message.div_ceil(mtu) + (bytes % message).div_ceil(mtu);
        let overhead = FrameOverhead::IPV4;
        bytes
            + messages * per_message as u64
            + packets * (per_packet as u64 + u64::from(overhead.headers + overhead.gap))
    }

    /// The wire floor: the line time of `bytes` of WRITEs of `message`
    /// bytes through one link of `rate_bps`, before any latency or
    /// queueing.
    pub fn wire_floor(self, bytes: u64, message: u64, rate_bps: u64) -> Duration {
        let line = self.write_line_bytes(bytes, message);
        Duration::from_secs_f64(line as f64 * 8.0 / rate_bps.max(1) as f64)
    }
}

/// A finished run: the deterministic report plus the simulator's effort.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub report: Report,
    /// Events the simulator processed.
    pub events: u64,
    /// Mean and largest utilisation over every link direction between the
    /// first flow's start and the end of the run (0 to 1).
    pub utilisation: (f64, f64),
    /// Packets sent on each link, per direction (`a` to `b`, `b` to `a`),
    /// indexed by link id.
    pub link_tx_packets: Vec<(u64, u64)>,
}

/// Packets sent on every link, per direction.
fn link_tx_packets<T: SimTransport>(sim: &Simulator<T>, topology: &Topology) -> Vec<(u64, u64)> {
    (0..topology.links.len())
        .map(|i| {
            let (ab, ba) = sim.link_stats(i);
            (ab.tx_packets, ba.tx_packets)
        })
        .collect()
}

/// Runs `flows` over `topology` with `protocol` on every host, with
/// default protocol configurations. `many_connections` sizes each host
/// for 128 connections (MetaRoCE) or queue pairs (RoCE) instead of 4: for
/// runs where a host talks to many peers (about 1 MB of state per host).
pub fn run(
    protocol: Protocol,
    topology: &Topology,
    flows: &[Flow],
    seed: u64,
    workload: &WorkloadConfig,
    many_connections: bool,
) -> Run {
    if many_connections {
        // The engines build their connection tables by value (about 1 MB
        // for 128 connections) before boxing them: more than a test
        // thread's stack. Run on a thread with room.
        let (topology, flows, workload) = (topology.clone(), flows.to_vec(), *workload);
        let spawned = std::thread::Builder::new()
            .stack_size(BIG_STACK)
            .spawn(move || run_here(protocol, &topology, &flows, seed, &workload, true));
        if let Ok(handle) = spawned {
            return handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        }
    }
    run_here(protocol, topology, flows, seed, workload, many_connections)
}

/// Stack for runs with 128-connection endpoints.
const BIG_STACK: usize = 64 << 20;

fn run_here(
    protocol: Protocol,
    topology: &Topology,
    flows: &[Flow],
    seed: u64,
    workload: &WorkloadConfig,
    many_connections: bool,
) -> Run {
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    let per_host = crate::workload::connections_per_host(flows, topology.hosts.len());
    let posted = crate::workload::posted_per_host(flows, topology.hosts.len(), workload);
    match (protocol, many_connections) {
        // Pools sized to each host's connections and posts, every window
        // still fitting: the same runs as with `layout`'s fixed pools, in
        // a fraction of the memory.
        (Protocol::MetaRoce, _) => go(topology, config, flows, workload, |h, a, s| {
            let keyed = workload.job_key;
            let engine = MetaRoce::<16>::host_config(metaroce_core::Config::default(), a.ip, keyed);
            let layout = compact_layout(per_host[h], engine.window, posted[h], keyed);
            MetaRoce::<16>::with_layout(engine, layout, s)
        }),
        (Protocol::Roce, false) => go(topology, config, flows, workload, |_, a, s| {
            Roce::<4>::new(roce_baseline::Config::default(), a, s)
        }),
        (Protocol::Roce, true) => go(topology, config, flows, workload, |_, a, s| {
            Roce::<128>::new(roce_baseline::Config::default(), a, s)
        }),
    }
}

fn go<T: SimTransport>(
    topology: &Topology,
    config: SimConfig,
    flows: &[Flow],
    workload: &WorkloadConfig,
    make: impl FnMut(HostId, PeerAddr, u64) -> T,
) -> Run {
    let mut sim = Simulator::new(topology, config, make);
    let report = workload::run(&mut sim, flows, workload);
    let first = flows.iter().map(|f| f.start).min().unwrap_or(Instant::ZERO);
    let utilisation = utilisation(&sim, topology, report.end - first);
    Run {
        report,
        events: sim.events_processed(),
        utilisation,
        link_tx_packets: link_tx_packets(&sim, topology),
    }
}

/// Mean and largest share of line time used per link direction.
fn utilisation<T: SimTransport>(
    sim: &Simulator<T>,
    topology: &Topology,
    span: Duration,
) -> (f64, f64) {
    let secs = span.as_secs_f64();
    if secs <= 0.0 || topology.links.is_empty() {
        return (0.0, 0.0);
    }
    let mut all = Vec::with_capacity(2 * topology.links.len());
    for (i, l) in topology.links.iter().enumerate() {
        let (ab, ba) = sim.link_stats(i);
        for s in [ab, ba] {
            all.push(s.tx_bytes as f64 * 8.0 / (l.config.rate_bps.max(1) as f64 * secs));
        }
    }
    let mean = all.iter().sum::<f64>() / all.len() as f64;
    (mean, all.iter().copied().fold(0.0, f64::max))
}

/// `loss-sweep` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LossSweep {
    /// Bytes of the one transfer.
    pub bytes: u64,
    /// Random loss probabilities per link direction (data and ACKs alike).
    pub losses: Vec<f64>,
    /// Seeds per point; results are averaged over them.
    pub seeds: u64,
    /// Virtual time a transfer may take.
    pub time_limit: Duration,
    /// The protocols run, in this order (default: both).
    pub protocols: &'static [Protocol],
    /// Every MetaRoCE host holds a job key and requires protection, with
    /// 0-RTT (`--job-key`); RoCEv2 runs are unchanged.
    pub job_key: bool,
}

impl Default for LossSweep {
    /// One 16 MB transfer at 0, 0.1, 0.5, 1, 2, 5 and 10 % loss, 10 seeds
    /// (RoCEv2 is bimodal around 1 %: a run either finishes at line rate
    /// or waits out a 67 ms timeout, so a few seeds say little).
    fn default() -> Self {
        LossSweep {
            bytes: 16 << 20,
            losses: vec![0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1],
            seeds: 10,
            time_limit: Duration::from_secs(10),
            protocols: &Protocol::ALL,
            job_key: false,
        }
    }
}

/// One transfer of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct LossSweepRow {
    pub protocol: Protocol,
    pub loss: f64,
    pub seed: u64,
    pub status: FlowStatus,
    pub integrity_ok: Option<bool>,
    pub fct: Option<Duration>,
    pub goodput_gbps: f64,
    /// Packets the links lost (data and acknowledgments).
    pub lost: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub events: u64,
}

/// The sweep: two hosts back to back over one 100 Gbit/s, 1 us link whose
/// both directions lose packets independently with each probability.
/// `progress` is called after each transfer with (done, total).
pub fn loss_sweep(cfg: &LossSweep, mut progress: impl FnMut(usize, usize)) -> Vec<LossSweepRow> {
    let total = cfg.losses.len() * cfg.seeds as usize * cfg.protocols.len();
    let workload = WorkloadConfig {
        time_limit: cfg.time_limit,
        job_key: cfg.job_key,
        ..WorkloadConfig::default()
    };
    let flow = Flow {
        src: 0,
        dst: 1,
        bytes: cfg.bytes,
        start: Instant::from_micros(1),
    };
    let mut rows = Vec::with_capacity(total);
    for &loss in &cfg.losses {
        let topology = Topology::back_to_back(LinkConfig {
            loss: LossModel::Random(loss),
            ..LinkConfig::default()
        });
        for &protocol in cfg.protocols {
            for seed in 1..=cfg.seeds {
                let r = run(protocol, &topology, &[flow], seed, &workload, false);
                let f = r.report.flows[0];
                rows.push(LossSweepRow {
                    protocol,
                    loss,
                    seed,
                    status: f.status,
                    integrity_ok: f.integrity_ok,
                    fct: f.fct(),
                    goodput_gbps: f.goodput_gbps().unwrap_or(0.0),
                    lost: r.report.fabric.lost,
                    retransmissions: r.report.transport.retransmissions,
                    timeouts: r.report.transport.timeouts,
                    events: r.events,
                });
                progress(rows.len(), total);
            }
        }
    }
    rows
}

/// Mean goodput of `protocol` at `loss` over the seeds (failed runs count
/// as zero).
pub fn mean_goodput(rows: &[LossSweepRow], protocol: Protocol, loss: f64) -> f64 {
    let g = goodputs(rows, protocol, loss);
    if g.is_empty() {
        0.0
    } else {
        g.iter().sum::<f64>() / g.len() as f64
    }
}

/// The goodputs of `protocol`'s transfers at `loss`, one per seed.
fn goodputs(rows: &[LossSweepRow], protocol: Protocol, loss: f64) -> Vec<f64> {
    rows.iter()
        .filter(|r| r.protocol == protocol && r.loss == loss)
        .map(|r| r.goodput_gbps)
        .collect()
}

/// Median goodput over seeds (the mean of the middle two for an even count).
pub fn median_goodput(rows: &[LossSweepRow], protocol: Protocol, loss: f64) -> f64 {
    let mut g = goodputs(rows, protocol, loss);
    g.sort_by(f64::total_cmp);
    match g.len() {
        0 => 0.0,
        n if n % 2 == 1 => g[n / 2],
        n => (g[n / 2 - 1] + g[n / 2]) / 2.0,
    }
}

/// Total bytes over total time across the seeds, in Gbit/s: what the
/// transfers deliver back to back, where a run that waits out a timeout
/// weighs by the time it took (the mean of per-run goodputs does not: one
/// lucky run at line rate outweighs many stalled ones). A run that did not
/// finish counts its time limit and no bytes.
pub fn aggregate_goodput(
    rows: &[LossSweepRow],
    protocol: Protocol,
    loss: f64,
    bytes: u64,
    time_limit: Duration,
) -> f64 {
    let (mut delivered, mut secs) = (0u64, 0f64);
    for r in rows
        .iter()
        .filter(|r| r.protocol == protocol && r.loss == loss)
    {
        match r.fct {
            Some(t) if r.status == FlowStatus::Done => {
                delivered += bytes;
                secs += t.as_secs_f64();
            }
            _ => secs += time_limit.as_secs_f64(),
        }
    }
    if secs > 0.0 {
        delivered as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    }
}

/// Sorted completion times of the flows that finished.
fn finish_times(report: &Report) -> Vec<Duration> {
    let mut t: Vec<Duration> = report.flows.iter().filter_map(|f| f.fct()).collect();
    t.sort();
    t
}

/// Jain's fairness index of the flows' goodputs (1 = all equal).
pub fn jain_fairness(goodputs: &[f64]) -> f64 {
    let n = goodputs.len() as f64;
    let sum: f64 = goodputs.iter().sum();
    let squares: f64 = goodputs.iter().map(|g| g * g).sum();
    if squares <= 0.0 {
        0.0
    } else {
        sum * sum / (n * squares)
    }
}

/// `incast` settings: `senders` hosts each send `bytes` to host 0 at once.
#[derive(Debug, Clone, PartialEq)]
pub struct Incast {
    pub fabric: LeafSpine,
    pub senders: usize,
    pub bytes: u64,
    pub seed: u64,
    pub time_limit: Duration,
    /// The protocols run, in this order (default: both).
    pub protocols: &'static [Protocol],
    /// Hosts' memory: synthetic by default (the same run and checks,
    /// without storing the payload), stored byte for byte on request.
    pub memory: HostMemory,
    /// Every MetaRoCE host holds a job key and requires protection, with
    /// 0-RTT (`--job-key`); RoCEv2 runs are unchanged.
    pub job_key: bool,
}

impl Default for Incast {
    /// 63 senders to 1 receiver on the 64-host leaf-spine, 1 MiB each.
    fn default() -> Self {
        Incast {
            fabric: LeafSpine::default(),
            senders: 63,
            bytes: 1 << 20,
            seed: 1,
            time_limit: Duration::from_secs(10),
            protocols: &Protocol::ALL,
            job_key: false,
            memory: HostMemory::Synthetic,
        }
    }
}

/// One protocol's incast.
#[derive(Debug, Clone, PartialEq)]
pub struct IncastRow {
    pub protocol: Protocol,
    /// Flows that completed with their data intact, of `senders`.
    pub intact: usize,
    pub first: Option<Duration>,
    pub median: Option<Duration>,
    pub last: Option<Duration>,
    /// Every byte through the receiver's link at line rate (payload only).
    pub ideal: Duration,
    /// Every frame through the receiver's link at line rate (headers,
    /// preamble and gap included): no protocol can finish sooner.
    pub wire_floor: Duration,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub probes: u64,
    /// Packets dropped by full switch buffers.
    pub queue_drops: u64,
    pub marked: u64,
    /// PFC PAUSE frames sent (0 without PFC).
    pub pauses: u64,
    /// Jain's index over the flows' goodputs.
    pub fairness: f64,
    /// Completion times of the flows that finished, sorted.
    pub fcts: Vec<Duration>,
    pub events: u64,
}

/// Runs the incast for both protocols; `progress` after each.
pub fn incast(cfg: &Incast, mut progress: impl FnMut(usize, usize)) -> Vec<IncastRow> {
    let topology = Topology::leaf_spine(&cfg.fabric);
    let senders = cfg.senders.min(topology.host_count().saturating_sub(1));
    let start = Instant::from_micros(1);
    let flows: Vec<Flow> = (1..=senders)
        .map(|src| Flow {
            src,
            dst: 0,
            bytes: cfg.bytes,
            start,
        })
        .collect();
    let workload = WorkloadConfig {
        time_limit: cfg.time_limit,
        memory: cfg.memory,
        job_key: cfg.job_key,
        ..WorkloadConfig::default()
    };
    let rate = cfg.fabric.host_link.rate_bps.max(1) as f64;
    let ideal = Duration::from_secs_f64((senders as u64 * cfg.bytes) as f64 * 8.0 / rate);
    let mut rows = Vec::new();
    for (i, &protocol) in cfg.protocols.iter().enumerate() {
        let r = run(protocol, &topology, &flows, cfg.seed, &workload, true);
        let t = finish_times(&r.report);
        let goodputs: Vec<f64> = r
            .report
            .flows
            .iter()
            .map(|f| f.goodput_gbps().unwrap_or(0.0))
            .collect();
        rows.push(IncastRow {
            protocol,
            intact: intact(&r.report),
            first: t.first().copied(),
            median: t.get(t.len() / 2).copied(),
            last: (t.len() == senders).then(|| t.last().copied()).flatten(),
            ideal,
            wire_floor: protocol.wire_floor(
                senders as u64 * cfg.bytes,
                u64::from(workload.message_bytes),
                cfg.fabric.host_link.rate_bps,
            ),
            retransmissions: r.report.transport.retransmissions,
            timeouts: r.report.transport.timeouts,
            probes: r.report.transport.probes,
            queue_drops: r.report.fabric.queue_drops,
            marked: r.report.fabric.marked,
            pauses: r.report.fabric.pauses,
            fairness: jain_fairness(&goodputs),
            fcts: t,
            events: r.events,
        });
        progress(i + 1, cfg.protocols.len());
    }
    rows
}

/// `first-flight` settings: one WRITE of each size from a host to another
/// on the same leaf, alone on the fabric, on a fresh connection (MetaRoCE:
/// handshake included) or a queue pair set up beforehand (RoCEv2, as it
/// is deployed: out of band).
#[derive(Debug, Clone, PartialEq)]
pub struct FirstFlight {
    pub fabric: LeafSpine,
    /// Bytes of each WRITE, one run per size.
    pub sizes: Vec<u64>,
    pub seed: u64,
    pub time_limit: Duration,
    /// The protocols run, in this order (default: both).
    pub protocols: &'static [Protocol],
}

impl Default for FirstFlight {
    /// 4 KiB, 64 KiB, 1 MiB and 16 MiB on the 64-host leaf-spine.
    fn default() -> Self {
        FirstFlight {
            fabric: LeafSpine::default(),
            sizes: vec![4 << 10, 64 << 10, 1 << 20, 16 << 20],
            seed: 1,
            time_limit: Duration::from_secs(1),
            protocols: &Protocol::ALL,
        }
    }
}

/// One protocol's single WRITE of one size.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstFlightRow {
    pub protocol: Protocol,
    /// MetaRoCE with a job key (a pre-shared key, every packet protected,
    /// spec 5.3); always false for RoCEv2.
    pub job_key: bool,
    pub bytes: u64,
    /// Whether it completed with its data intact.
    pub intact: bool,
    /// From the post (the connect, for MetaRoCE) to the completion.
    pub fct: Option<Duration>,
    /// Every frame of the WRITE through one link at line rate.
    pub wire_floor: Duration,
    pub retransmissions: u64,
    pub events: u64,
}

/// Runs one WRITE of each size for each protocol, host 1 to host 0;
/// `progress` after each run.
pub fn first_flight(
    cfg: &FirstFlight,
    mut progress: impl FnMut(usize, usize),
) -> Vec<FirstFlightRow> {
    let topology = Topology::leaf_spine(&cfg.fabric);
    let runs_per_size: usize = cfg
        .protocols
        .iter()
        .map(|p| if *p == Protocol::MetaRoce { 2 } else { 1 })
        .sum();
    let total = cfg.sizes.len() * runs_per_size;
    let mut rows = Vec::new();
    for &bytes in &cfg.sizes {
        let flows = [Flow {
            src: 1,
            dst: 0,
            bytes,
            start: Instant::from_micros(1),
        }];
        // One WRITE of the whole size.
        let workload = WorkloadConfig {
            message_bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
            messages_in_flight: 1,
            time_limit: cfg.time_limit,
            ..WorkloadConfig::default()
        };
        let runs = cfg.protocols.iter().flat_map(|&p| {
            let keyed: &[bool] = match p {
                Protocol::MetaRoce => &[false, true],
                Protocol::Roce => &[false],
            };
            keyed.iter().map(move |&k| (p, k))
        });
        for (protocol, job_key) in runs {
            let r = if job_key {
                run_with_job_key(&topology, &flows, cfg.seed, &workload)
            } else {
                run(protocol, &topology, &flows, cfg.seed, &workload, false)
            };
            rows.push(FirstFlightRow {
                protocol,
                job_key,
                bytes,
                intact: intact(&r.report) == 1,
                fct: r.report.flows.first().and_then(|f| f.fct()),
                wire_floor: protocol.wire_floor(bytes, bytes, cfg.fabric.host_link.rate_bps),
                retransmissions: r.report.transport.retransmissions,
                events: r.events,
            });
            progress(rows.len(), total);
        }
    }
    rows
}

/// MetaRoCE with every host holding the same job key and requiring
/// protection (spec 5.3): AES-256-GCM on every packet, 0-RTT.
fn run_with_job_key(
    topology: &Topology,
    flows: &[Flow],
    seed: u64,
    workload: &WorkloadConfig,
) -> Run {
    let keyed = WorkloadConfig {
        job_key: true,
        ..*workload
    };
    run(Protocol::MetaRoce, topology, flows, seed, &keyed, false)
}

fn intact(report: &Report) -> usize {
    report
        .flows
        .iter()
        .filter(|f| f.status == FlowStatus::Done && f.integrity_ok == Some(true))
        .count()
}

/// `path-failure` settings: every host of leaf 0 sends `bytes` to its
/// counterpart on leaf 1; the link between leaf 0 and spine 0 fails at
/// `fail_at`. Each protocol runs with and without the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct PathFailure {
    pub fabric: LeafSpine,
    pub bytes: u64,
    pub fail_at: Duration,
    /// When the switches route around the failure; `None`: never (the
    /// transport must move off the dead path itself).
    pub reroute_delay: Option<Duration>,
    pub seed: u64,
    pub time_limit: Duration,
    /// The protocols run, in this order (default: both).
    pub protocols: &'static [Protocol],
    /// Hosts' memory: synthetic by default (the same run and checks,
    /// without storing the payload), stored byte for byte on request.
    pub memory: HostMemory,
    /// Every MetaRoCE host holds a job key and requires protection, with
    /// 0-RTT (`--job-key`); RoCEv2 runs are unchanged.
    pub job_key: bool,
}

impl Default for PathFailure {
    /// 8 flows of 16 MiB; the link fails at 200 us; routes converge 100 us later.
    fn default() -> Self {
        PathFailure {
            fabric: LeafSpine::default(),
            bytes: 16 << 20,
            fail_at: Duration::from_micros(200),
            reroute_delay: Some(Duration::from_micros(100)),
            seed: 1,
            time_limit: Duration::from_secs(10),
            protocols: &Protocol::ALL,
            job_key: false,
            memory: HostMemory::Synthetic,
        }
    }
}

/// One protocol's run with or without the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct PathFailureRow {
    pub protocol: Protocol,
    pub failure: bool,
    pub flows: usize,
    /// Flows that completed with their data intact.
    pub intact: usize,
    /// The last completion (all flows), if all completed.
    pub last: Option<Duration>,
    /// Each flow's completion time, in flow order (flow `i`: host `i` of
    /// leaf 0 to host `i` of leaf 1); `None` if it did not complete.
    pub fcts: Vec<Option<Duration>>,
    /// Packets lost on the failed link.
    pub lost_on_link: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub events: u64,
}

/// Runs both protocols with and without the failure.
pub fn path_failure(
    cfg: &PathFailure,
    mut progress: impl FnMut(usize, usize),
) -> Vec<PathFailureRow> {
    let per_leaf = cfg.fabric.hosts_per_leaf;
    let start = Instant::from_micros(1);
    let flows: Vec<Flow> = (0..per_leaf)
        .map(|h| Flow {
            src: h,
            dst: h + per_leaf,
            bytes: cfg.bytes,
            start,
        })
        .collect();
    let workload = WorkloadConfig {
        time_limit: cfg.time_limit,
        memory: cfg.memory,
        job_key: cfg.job_key,
        ..WorkloadConfig::default()
    };
    let link = cfg.fabric.fabric_link(0, 0);
    let mut rows = Vec::new();
    let total = 2 * cfg.protocols.len();
    for failure in [false, true] {
        let mut topology = Topology::leaf_spine(&cfg.fabric);
        if failure {
            topology.links[link].config.fail_at = Some(Instant::ZERO + cfg.fail_at);
        }
        for &protocol in cfg.protocols {
            let config = SimConfig {
                seed: cfg.seed,
                reroute_delay: cfg.reroute_delay,
                ..SimConfig::default()
            };
            let (r, lost_on_link) = match protocol {
                Protocol::MetaRoce => {
                    let per_host =
                        crate::workload::connections_per_host(&flows, topology.hosts.len());
                    failure_run(&topology, config, &flows, &workload, link, |h, _, s| {
                        MetaRoce::<16>::new(metaroce_core::Config::default(), per_host[h], s)
                    })
                }
                Protocol::Roce => {
                    failure_run(&topology, config, &flows, &workload, link, |_, a, s| {
                        Roce::<4>::new(roce_baseline::Config::default(), a, s)
                    })
                }
            };
            let t = finish_times(&r.report);
            rows.push(PathFailureRow {
                protocol,
                failure,
                flows: flows.len(),
                intact: intact(&r.report),
                last: (t.len() == flows.len())
                    .then(|| t.last().copied())
                    .flatten(),
                fcts: r.report.flows.iter().map(|f| f.fct()).collect(),
                lost_on_link,
                retransmissions: r.report.transport.retransmissions,
                timeouts: r.report.transport.timeouts,
                events: r.events,
            });
            progress(rows.len(), total);
        }
    }
    rows
}

fn failure_run<T: SimTransport>(
    topology: &Topology,
    config: SimConfig,
    flows: &[Flow],
    workload: &WorkloadConfig,
    link: usize,
    make: impl FnMut(HostId, PeerAddr, u64) -> T,
) -> (Run, u64) {
    let mut sim = Simulator::new(topology, config, make);
    let report = workload::run(&mut sim, flows, workload);
    let (ab, ba) = sim.link_stats(link);
    let first = flows.iter().map(|f| f.start).min().unwrap_or(Instant::ZERO);
    let utilisation = utilisation(&sim, topology, report.end - first);
    (
        Run {
            report,
            events: sim.events_processed(),
            utilisation,
            link_tx_packets: link_tx_packets(&sim, topology),
        },
        ab.failed + ba.failed,
    )
}

/// Per-link loss that makes a path of `hops` links lose `end_to_end`.
pub fn per_link_loss(end_to_end: f64, hops: u32) -> f64 {
    1.0 - (1.0 - end_to_end.clamp(0.0, 1.0)).powf(1.0 / f64::from(hops.max(1)))
}

/// Traffic patterns on the leaf-spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Every host sends to one other host, every host receives from one
    /// (a seeded random derangement).
    Permutation,
    /// Every host sends to every other host.
    AllToAll,
}

/// `permutation` and `all-to-all` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Traffic {
    pub pattern: Pattern,
    pub fabric: LeafSpine,
    /// Bytes per flow.
    pub bytes: u64,
    /// End-to-end loss of a cross-leaf path (4 links); each link loses
    /// [`per_link_loss`] of it.
    pub losses: Vec<f64>,
    pub seed: u64,
    pub time_limit: Duration,
    /// The protocols run, in this order (default: both).
    pub protocols: &'static [Protocol],
    /// Hosts' memory: synthetic by default (the same run and checks,
    /// without storing the payload), stored byte for byte on request.
    pub memory: HostMemory,
    /// Every MetaRoCE host holds a job key and requires protection, with
    /// 0-RTT (`--job-key`); RoCEv2 runs are unchanged.
    pub job_key: bool,
}

impl Traffic {
    /// 64 hosts; 4 MiB per flow for a permutation, 64 KiB per pair for
    /// all-to-all (4 MiB per host either way); 0, 1 and 10 % loss.
    pub fn new(pattern: Pattern) -> Traffic {
        Traffic {
            pattern,
            fabric: LeafSpine::default(),
            bytes: match pattern {
                Pattern::Permutation => 4 << 20,
                Pattern::AllToAll => 64 << 10,
            },
            losses: vec![0.0, 0.01, 0.1],
            seed: 1,
            time_limit: Duration::from_secs(10),
            protocols: &Protocol::ALL,
            job_key: false,
            memory: HostMemory::Synthetic,
        }
    }

    /// The flows of the pattern.
    pub fn flows(&self) -> Vec<Flow> {
        let n = self.fabric.hosts();
        let start = Instant::from_micros(1);
        let flow = |src, dst| Flow {
            src,
            dst,
            bytes: self.bytes,
            start,
        };
        match self.pattern {
            Pattern::AllToAll => (0..n)
                .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
                .map(|(s, d)| flow(s, d))
                .collect(),
            Pattern::Permutation => derangement(n, self.seed)
                .into_iter()
                .enumerate()
                .map(|(s, d)| flow(s, d))
                .collect(),
        }
    }
}

/// A seeded permutation of `0..n` with no fixed point (Sattolo's
/// algorithm: a single cycle).
pub fn derangement(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut rng = crate::rng::SimRng::stream(seed, 0xd0e5);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % i as u64) as usize;
        p.swap(i, j);
    }
    p
}

/// One protocol at one loss rate.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficRow {
    pub protocol: Protocol,
    pub loss: f64,
    pub flows: usize,
    pub intact: usize,
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
    pub max: Option<Duration>,
    /// Mean and largest link utilisation.
    pub utilisation: (f64, f64),
    /// The line time of what one host sends through its link (every
    /// frame's headers, preamble and gap included): a permutation flow
    /// cannot finish sooner, nor can a host's last all-to-all flow.
    pub wire_floor: Duration,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub probes: u64,
    pub queue_drops: u64,
    /// PFC PAUSE frames sent (0 without PFC).
    pub pauses: u64,
    /// Completion times of the flows that finished, sorted.
    pub fcts: Vec<Duration>,
    pub events: u64,
}

/// The value at quantile `p` (0 to 1) of `sorted` (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

/// Runs the pattern for both protocols at each loss rate.
pub fn traffic(cfg: &Traffic, mut progress: impl FnMut(usize, usize)) -> Vec<TrafficRow> {
    let flows = cfg.flows();
    let workload = WorkloadConfig {
        time_limit: cfg.time_limit,
        memory: cfg.memory,
        job_key: cfg.job_key,
        ..WorkloadConfig::default()
    };
    let many = cfg.pattern == Pattern::AllToAll;
    let flows_per_host = flows.len() / cfg.fabric.hosts().max(1);
    let total = cfg.losses.len() * cfg.protocols.len();
    let mut rows = Vec::new();
    for &loss in &cfg.losses {
        let mut topology = Topology::leaf_spine(&cfg.fabric);
        topology.set_loss(LossModel::Random(per_link_loss(loss, 4)));
        for &protocol in cfg.protocols {
            let r = run(protocol, &topology, &flows, cfg.seed, &workload, many);
            let t = finish_times(&r.report);
            rows.push(TrafficRow {
                protocol,
                loss,
                flows: flows.len(),
                intact: intact(&r.report),
                p50: percentile(&t, 0.5),
                p99: percentile(&t, 0.99),
                max: (t.len() == flows.len())
                    .then(|| t.last().copied())
                    .flatten(),
                utilisation: r.utilisation,
                wire_floor: (0..flows_per_host)
                    .map(|_| {
                        protocol.wire_floor(
                            cfg.bytes,
                            u64::from(workload.message_bytes),
                            cfg.fabric.host_link.rate_bps,
                        )
                    })
                    .sum(),
                retransmissions: r.report.transport.retransmissions,
                timeouts: r.report.transport.timeouts,
                probes: r.report.transport.probes,
                queue_drops: r.report.fabric.queue_drops,
                pauses: r.report.fabric.pauses,
                fcts: t,
                events: r.events,
            });
            progress(rows.len(), total);
        }
    }
    rows
}

/// `spray` settings: one transfer between two leaves over `paths` spines
/// whose links differ in delay by up to `skew`, loss-free.
#[derive(Debug, Clone, PartialEq)]
pub struct Spray {
    pub paths: usize,
    pub skew: Duration,
    pub bytes: u64,
    pub seed: u64,
    pub time_limit: Duration,
    /// The protocols run, in this order (default: both).
    pub protocols: &'static [Protocol],
    /// Every MetaRoCE host holds a job key and requires protection, with
    /// 0-RTT (`--job-key`); RoCEv2 runs are unchanged.
    pub job_key: bool,
}

impl Default for Spray {
    /// 16 spines, 2 us of skew (the slowest path is 2 us longer one way
    /// than the fastest), one 16 MiB transfer.
    fn default() -> Self {
        Spray {
            paths: 16,
            skew: Duration::from_micros(2),
            bytes: 16 << 20,
            seed: 1,
            time_limit: Duration::from_secs(10),
            protocols: &Protocol::ALL,
            job_key: false,
        }
    }
}

/// One protocol's spray run.
#[derive(Debug, Clone, PartialEq)]
pub struct SprayRow {
    pub protocol: Protocol,
    pub intact: bool,
    pub fct: Option<Duration>,
    pub goodput_gbps: f64,
    /// Data packets sent for the first time.
    pub first_transmissions: u64,
    pub retransmissions: u64,
    pub spurious_retransmissions: u64,
    /// Packets the source's leaf sent towards each spine (path `i` runs
    /// through spine `i`; its one-way delay grows with `i`).
    pub path_packets: Vec<u64>,
    pub events: u64,
}

/// Runs the spray experiment for both protocols.
pub fn spray(cfg: &Spray, mut progress: impl FnMut(usize, usize)) -> Vec<SprayRow> {
    let spec = LeafSpine {
        leaves: 2,
        spines: cfg.paths.max(1),
        hosts_per_leaf: 1,
        ..LeafSpine::default()
    };
    let mut topology = Topology::leaf_spine(&spec);
    let n = spec.spines;
    for leaf in 0..2 {
        for spine in 0..n {
            let extra = if n > 1 {
                cfg.skew.mul_f64(spine as f64 / (n - 1) as f64) / 2
            } else {
                Duration::ZERO
            };
            topology.links[spec.fabric_link(leaf, spine)].config.delay += extra;
        }
    }
    let flow = Flow {
        src: 0,
        dst: 1,
        bytes: cfg.bytes,
        start: Instant::from_micros(1),
    };
    let workload = WorkloadConfig {
        time_limit: cfg.time_limit,
        job_key: cfg.job_key,
        ..WorkloadConfig::default()
    };
    let mut rows = Vec::new();
    for (i, &protocol) in cfg.protocols.iter().enumerate() {
        let r = run(protocol, &topology, &[flow], cfg.seed, &workload, false);
        let f = r.report.flows[0];
        rows.push(SprayRow {
            protocol,
            intact: intact(&r.report) == 1,
            fct: f.fct(),
            goodput_gbps: f.goodput_gbps().unwrap_or(0.0),
            first_transmissions: r.report.transport.first_transmissions,
            retransmissions: r.report.transport.retransmissions,
            spurious_retransmissions: r.report.transport.spurious_retransmissions,
            path_packets: (0..n)
                .map(|spine| {
                    // The leaf is the link's `a` end (`Topology::leaf_spine`).
                    r.link_tx_packets
                        .get(spec.fabric_link(0, spine))
                        .map_or(0, |p| p.0)
                })
                .collect(),
            events: r.events,
        });
        progress(i + 1, cfg.protocols.len());
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(protocol: Protocol, seed: u64, micros: Option<u64>) -> LossSweepRow {
        let fct = micros.map(Duration::from_micros);
        LossSweepRow {
            protocol,
            loss: 0.01,
            seed,
            status: if fct.is_some() {
                FlowStatus::Done
            } else {
                FlowStatus::Unfinished
            },
            integrity_ok: fct.map(|_| true),
            fct,
            // 1 MB per run.
            goodput_gbps: micros.map_or(0.0, |us| 8e6 / (us as f64 * 1e3)),
            lost: 0,
            retransmissions: 0,
            timeouts: 0,
            events: 0,
        }
    }

    #[test]
    fn median_and_total_weigh_stalled_runs_as_a_user_sees_them() {
        // Two runs at 8 Gbit/s (1 ms) and two that waited 99 ms more.
        let rows = [
            row(Protocol::Roce, 1, Some(1_000)),
            row(Protocol::Roce, 2, Some(100_000)),
            row(Protocol::Roce, 3, Some(1_000)),
            row(Protocol::Roce, 4, Some(100_000)),
        ];
        let mean = mean_goodput(&rows, Protocol::Roce, 0.01);
        let median = median_goodput(&rows, Protocol::Roce, 0.01);
        let total = aggregate_goodput(
            &rows,
            Protocol::Roce,
            0.01,
            1_000_000,
            Duration::from_secs(1),
        );
        assert!((mean - 4.04).abs() < 1e-9, "{mean}");
        assert!((median - 4.04).abs() < 1e-9, "{median}");
        // 4 MB in 202 ms.
        assert!((total - 32.0 / 202.0).abs() < 1e-9, "{total}");
        // A run that never finished counts its time limit and no bytes.
        let rows = [
            row(Protocol::Roce, 1, Some(1_000)),
            row(Protocol::Roce, 2, None),
        ];
        let total = aggregate_goodput(
            &rows,
            Protocol::Roce,
            0.01,
            1_000_000,
            Duration::from_millis(9),
        );
        assert!((total - 0.8).abs() < 1e-9, "{total}");
    }
}
