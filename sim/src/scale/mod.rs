//! Clusters of thousands of hosts: MetaRoCE alone on a leaf-spine or a
//! three-tier fat tree, with flows of a pattern (permutation, incast) or
//! from a file ([`crate::flow_file`]), summarised by percentiles rather
//! than a row per flow, with what the run cost (wall and CPU time, peak
//! memory, events per CPU-second).
//!
//! What keeps a host small: synthetic memory ([`HostMemory::Synthetic`]:
//! no payload stored) and an endpoint sized to the connections and work
//! requests the host has ([`compact_layout`]), with host-queue rings of
//! [`SMALL_RING`] slots where the host posts no more than that at once.

pub mod cli;

use std::time::Duration;

use metaroce_core::{Config, Instant};

use crate::experiments::percentile;
use crate::metaroce::{compact_layout, MetaRoce, SEND_RING};
use crate::network::{SimConfig, Simulator};
use crate::packet::HostId;
use crate::topology::{FatTree, LeafSpine, Topology};
use crate::transport::SimTransport;
use crate::workload::{self, Flow, HostMemory, Progress, Report, WorkloadConfig};

/// Send- and completion-ring slots of hosts that keep at most this many
/// work requests posted (a permutation or incast host keeps 8).
pub const SMALL_RING: usize = 64;

/// Ring slots of hosts that post more than [`SEND_RING`] work requests at
/// once (an all-to-all of more than 1,024 hosts); a host that posts more
/// than this waits for completions before it can post the rest of its
/// flows' first messages.
pub const LARGE_RING: usize = 8192;

/// The fabric of a cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    LeafSpine(LeafSpine),
    FatTree(FatTree),
}

impl Shape {
    /// The topology.
    pub fn topology(&self) -> Topology {
        match self {
            Shape::LeafSpine(s) => Topology::leaf_spine(s),
            Shape::FatTree(s) => Topology::fat_tree(s),
        }
    }

    /// Hosts.
    pub fn hosts(&self) -> usize {
        match self {
            Shape::LeafSpine(s) => s.hosts(),
            Shape::FatTree(s) => s.hosts(),
        }
    }

    /// A host link's rate.
    pub fn host_rate_bps(&self) -> u64 {
        match self {
            Shape::LeafSpine(s) => s.host_link.rate_bps,
            Shape::FatTree(s) => s.host_link.rate_bps,
        }
    }

    /// Hosts per leaf.
    pub fn hosts_per_leaf(&self) -> usize {
        match self {
            Shape::LeafSpine(s) => s.hosts_per_leaf,
            Shape::FatTree(s) => s.hosts_per_leaf,
        }
    }

    /// One line: tiers, counts and oversubscription.
    pub fn describe(&self) -> String {
        match self {
            Shape::LeafSpine(s) => format!(
                "leaf-spine: {} leaves of {} hosts, {} spines",
                s.leaves, s.hosts_per_leaf, s.spines
            ),
            Shape::FatTree(s) => format!(
                "fat tree: {} pods of {} leaves of {} hosts, {} spines per pod, {} cores ({:.3}:1 at the leaf, {:.3}:1 at the spine)",
                s.pods,
                s.leaves_per_pod,
                s.hosts_per_leaf,
                s.spines_per_pod,
                s.spines_per_pod * s.cores_per_plane,
                s.leaf_oversubscription(),
                s.spine_oversubscription()
            ),
        }
    }
}

/// Flow patterns of the `scale` experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalePattern {
    /// Every host sends to one other (a seeded derangement).
    Permutation,
    /// `senders` hosts spread evenly over the cluster send to host 0.
    Incast { senders: usize },
    /// Every host sends to every other.
    AllToAll,
}

impl ScalePattern {
    /// Its name in tables and files.
    pub fn name(self) -> &'static str {
        match self {
            ScalePattern::Permutation => "permutation",
            ScalePattern::Incast { .. } => "incast",
            ScalePattern::AllToAll => "all-to-all",
        }
    }

    /// The flows among `hosts` hosts, `bytes` each, all starting at 1 us.
    pub fn flows(self, hosts: usize, bytes: u64, seed: u64) -> Vec<Flow> {
        let start = Instant::from_micros(1);
        let flow = |src, dst| Flow {
            src,
            dst,
            bytes,
            start,
        };
        match self {
            ScalePattern::Permutation => crate::experiments::derangement(hosts, seed)
                .into_iter()
                .enumerate()
                .map(|(s, d)| flow(s, d))
                .collect(),
            ScalePattern::Incast { senders } => {
                let senders = senders.clamp(1, hosts.saturating_sub(1).max(1));
                // Hosts 1.. spread evenly: across leaves, pods and the core.
                (0..senders)
                    .map(|i| 1 + i * (hosts - 1) / senders)
                    .map(|s| flow(s, 0))
                    .collect()
            }
            ScalePattern::AllToAll => (0..hosts)
                .flat_map(|s| (0..hosts).filter(move |&d| d != s).map(move |d| (s, d)))
                .map(|(s, d)| flow(s, d))
                .collect(),
        }
    }
}

/// What one cluster run measured: the protocol's figures (deterministic)
/// and what the run cost (not).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterRow {
    pub name: String,
    pub hosts: usize,
    pub switches: usize,
    pub flows: usize,
    /// Flows done with every byte placed once, as sent.
    pub intact: usize,
    /// Completion times of the flows that finished, sorted.
    pub fcts: Vec<Duration>,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub probes: u64,
    pub queue_drops: u64,
    pub ecn_marked: u64,
    /// Virtual time when the run stopped.
    pub end: Instant,
    pub events: u64,
    pub cost: Cost,
}

impl ClusterRow {
    /// The completion time at quantile `p` (0 to 1) of the flows that
    /// finished.
    pub fn fct(&self, p: f64) -> Option<Duration> {
        percentile(&self.fcts, p)
    }
}

/// What a run cost this machine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    pub wall_s: f64,
    /// User and system CPU time of the process during the run.
    pub cpu_s: f64,
    /// Peak resident memory of the process during the run, bytes (0 where
    /// it cannot be read).
    pub peak_rss: u64,
}

impl Cost {
    /// Events per CPU-second.
    pub fn events_per_cpu_s(&self, events: u64) -> f64 {
        events as f64 / self.cpu_s.max(1e-3)
    }
}

/// CPU seconds (user and system) this process used so far, from
/// `/proc/self/stat` (Linux; `None` elsewhere).
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (in parentheses, may hold spaces):
    // utime is field 14, stime 15, in clock ticks of 1/100 s.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Resets the process's peak resident memory to its current one (Linux:
/// `/proc/self/clear_refs`), so a run's peak is its own.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident memory in bytes since the last reset
/// (`VmHWM`); 0 where it cannot be read.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// Runs `flows` on `shape` with MetaRoCE on every host, `memory` as the
/// hosts' memory, measuring what it cost; `observe` sees the run's
/// progress every [`workload::OBSERVE_EVERY`] events.
pub fn run(
    name: &str,
    shape: &Shape,
    flows: &[Flow],
    seed: u64,
    memory: HostMemory,
    time_limit: Duration,
    observe: impl FnMut(&Progress),
) -> ClusterRow {
    reset_peak_rss();
    let wall = std::time::Instant::now();
    let cpu0 = cpu_seconds();
    let topology = shape.topology();
    let workload = WorkloadConfig {
        time_limit,
        memory,
        ..WorkloadConfig::default()
    };
    let hosts = topology.host_count();
    let config = Config::default();
    let mtu = u64::from(config.mtu.max(1));
    let connections = workload::connections_per_host(flows, hosts);
    let posted = workload::posted_per_host(flows, hosts, &workload);
    // Packets of the largest flow each host takes part in.
    let mut packets = vec![0u64; hosts];
    for f in flows.iter().filter(|f| f.src < hosts && f.dst < hosts) {
        for h in [f.src, f.dst] {
            packets[h] = packets[h].max(f.bytes.div_ceil(mtu));
        }
    }
    let most_posted = posted.iter().copied().max().unwrap_or(0) as usize;
    let sim_config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    // A connection's PSNs in flight never span more than its flow's
    // packets plus as many retransmissions: a window beyond twice that
    // would be storage no packet uses (an all-to-all of 64 KiB flows
    // needs 32 records per connection, not 256).
    let make = |h: HostId| {
        let window = config
            .window
            .min(u32::try_from(2 * packets[h]).unwrap_or(u32::MAX));
        compact_layout(connections[h], window, posted[h], false)
    };
    let (report, events) = if most_posted <= SMALL_RING {
        go(
            &topology,
            sim_config,
            flows,
            &workload,
            observe,
            |h, _, s| MetaRoce::<16, SMALL_RING>::with_layout(config, make(h), s),
        )
    } else if most_posted <= SEND_RING {
        go(
            &topology,
            sim_config,
            flows,
            &workload,
            observe,
            |h, _, s| MetaRoce::<16, SEND_RING>::with_layout(config, make(h), s),
        )
    } else {
        go(
            &topology,
            sim_config,
            flows,
            &workload,
            observe,
            |h, _, s| MetaRoce::<16, LARGE_RING>::with_layout(config, make(h), s),
        )
    };
    let cost = Cost {
        wall_s: wall.elapsed().as_secs_f64(),
        cpu_s: match (cpu0, cpu_seconds()) {
            (Some(a), Some(b)) => b - a,
            _ => 0.0,
        },
        peak_rss: peak_rss(),
    };
    // A stray write or an access outside an arena cannot be laid at one
    // flow's door: it spoils them all.
    let clean = report.out_of_bounds == 0 && report.stray_bytes == 0;
    let intact = report
        .flows
        .iter()
        .filter(|f| clean && f.status == workload::FlowStatus::Done && f.integrity_ok == Some(true))
        .count();
    let mut fcts: Vec<Duration> = report.flows.iter().filter_map(|f| f.fct()).collect();
    fcts.sort_unstable();
    ClusterRow {
        name: name.to_string(),
        hosts,
        switches: topology.nodes.len() - hosts,
        flows: flows.len(),
        intact,
        fcts,
        retransmissions: report.transport.retransmissions,
        timeouts: report.transport.timeouts,
        probes: report.transport.probes,
        queue_drops: report.fabric.queue_drops,
        ecn_marked: report.fabric.marked,
        end: report.end,
        events,
        cost,
    }
}

fn go<T: SimTransport>(
    topology: &Topology,
    config: SimConfig,
    flows: &[Flow],
    workload: &WorkloadConfig,
    observe: impl FnMut(&Progress),
    make: impl FnMut(HostId, metaroce_core::api::PeerAddr, u64) -> T,
) -> (Report, u64) {
    let mut sim = Simulator::new(topology, config, make);
    let report = workload::run_observed(&mut sim, flows, workload, observe);
    (report, sim.events_processed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incast_senders_spread_over_the_cluster() {
        let flows = ScalePattern::Incast { senders: 4 }.flows(64, 1, 1);
        let srcs: Vec<_> = flows.iter().map(|f| f.src).collect();
        assert_eq!(srcs, [1, 16, 32, 48]);
        assert!(flows.iter().all(|f| f.dst == 0));
        assert_eq!(
            ScalePattern::Incast { senders: 500 }.flows(8, 1, 1).len(),
            7
        );
    }

    /// A small fat tree and a leaf-spine carry a permutation and an
    /// incast intact, the same way twice.
    #[test]
    fn small_clusters_run_intact_and_reproducibly() {
        for shape in [
            Shape::LeafSpine(LeafSpine::with_hosts(32, 8)),
            Shape::FatTree(FatTree::with_hosts(32, 4, 2.0)),
        ] {
            let hosts = shape.hosts();
            for pattern in [
                ScalePattern::Permutation,
                ScalePattern::Incast { senders: 7 },
            ] {
                let bytes = match pattern {
                    ScalePattern::AllToAll => 16 << 10,
                    _ => 256 << 10,
                };
                let flows = pattern.flows(hosts, bytes, 3);
                let run = |memory| {
                    run(
                        pattern.name(),
                        &shape,
                        &flows,
                        3,
                        memory,
                        Duration::from_secs(1),
                        |_| {},
                    )
                };
                let a = run(HostMemory::Synthetic);
                assert_eq!(a.intact, flows.len(), "{shape:?} {pattern:?}");
                let b = run(HostMemory::Stored);
                let figures = |r: &ClusterRow| {
                    (
                        r.fcts.clone(),
                        r.retransmissions,
                        r.queue_drops,
                        r.events,
                        r.end,
                    )
                };
                assert_eq!(figures(&a), figures(&b), "{shape:?} {pattern:?}");
            }
        }
    }
}
