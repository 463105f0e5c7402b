//! Experiments of issue 5, as library functions so that tests run small
//! versions of them and the `metaroce-sim` binary (`cargo xtask sim`) runs
//! the full ones. Each returns plain rows; printing, CSV and plots belong
//! to the caller.
//!
//! Done so far: `loss-sweep`. Still to come: `incast`, `permutation`,
//! `all-to-all`, `spray`, `path-failure`.

use std::time::Duration;

use metaroce_core::api::PeerAddr;
use metaroce_core::Instant;

use crate::link::{LinkConfig, LossModel};
use crate::metaroce::MetaRoce;
use crate::network::{SimConfig, Simulator};
use crate::packet::HostId;
use crate::roce::Roce;
use crate::topology::Topology;
use crate::transport::SimTransport;
use crate::workload::{self, Flow, FlowStatus, Report, WorkloadConfig};

/// Which transport a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    MetaRoce,
    Roce,
}

impl Protocol {
    /// Both, MetaRoCE first.
    pub const ALL: [Protocol; 2] = [Protocol::MetaRoce, Protocol::Roce];

    /// The name tables use.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::MetaRoce => "MetaRoCE",
            Protocol::Roce => "RoCEv2",
        }
    }
}

/// A finished run: the deterministic report plus the simulator's effort.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub report: Report,
    /// Events the simulator processed.
    pub events: u64,
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
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    match (protocol, many_connections) {
        (Protocol::MetaRoce, false) => go(topology, config, flows, workload, |_, _, s| {
            MetaRoce::<4, 16>::new(metaroce_core::Config::default(), s)
        }),
        (Protocol::MetaRoce, true) => go(topology, config, flows, workload, |_, _, s| {
            MetaRoce::<128, 16>::new(metaroce_core::Config::default(), s)
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
    Run {
        report,
        events: sim.events_processed(),
    }
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
}

impl Default for LossSweep {
    /// One 16 MB transfer at 0, 0.1, 0.5, 1, 2, 5 and 10 % loss, 3 seeds.
    fn default() -> Self {
        LossSweep {
            bytes: 16 << 20,
            losses: vec![0.0, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1],
            seeds: 3,
            time_limit: Duration::from_secs(10),
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
    let total = cfg.losses.len() * cfg.seeds as usize * Protocol::ALL.len();
    let workload = WorkloadConfig {
        time_limit: cfg.time_limit,
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
        for protocol in Protocol::ALL {
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
    let sel: Vec<f64> = rows
        .iter()
        .filter(|r| r.protocol == protocol && r.loss == loss)
        .map(|r| r.goodput_gbps)
        .collect();
    if sel.is_empty() {
        0.0
    } else {
        sel.iter().sum::<f64>() / sel.len() as f64
    }
}
