//! The shared-bottleneck scenario, for tuning congestion control at long
//! round trips: one long-haul flow (site A host 0 to site B host 0) and
//! `intra_flows` data-centre flows (other site-B hosts to the same host)
//! share the last link into site B's host 0. Every flow runs for the same
//! time; each one's share is its goodput over the second half of the run
//! (after every start-up), and Jain's index says how even the shares are.
//!
//! Hosts are configured for their own paths: the long-haul sender with
//! [`Tuning::metaroce`] / [`Tuning::roce`] at the long round trip, the
//! site-B hosts (the data-centre senders and the receiver) at the
//! data-centre round trip; each sender posts the window of its own path
//! ([`Tuning::window_bytes`]: 3 BDPs, at least 1 MiB). An endpoint's timers are endpoint-wide, so a
//! host that talked to both kinds of peer could not be configured for
//! both: here none has to.

use std::time::Duration;

use metaroce_core::Instant;

use super::{fabric_for, run_protocol, PathPlan, Tuning, PACKET_PAYLOAD};
use crate::experiments::{jain_fairness, Protocol};
use crate::packet::HostId;
use crate::stream::{StreamConfig, StreamFlow};
use crate::two_site::TwoSite;

/// Settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedBottleneck {
    pub fabric: TwoSite,
    /// Round trip of the long-haul flow.
    pub rtt: Duration,
    /// Random loss on the long-haul links.
    pub loss: f64,
    /// Data-centre flows into the same receiver.
    pub intra_flows: usize,
    /// Run length in long-haul round trips.
    pub duration_rtts: u32,
    pub tuning: Tuning,
    pub seed: u64,
}

impl Default for SharedBottleneck {
    /// 10 ms, no loss, 3 data-centre flows from the receiver's other
    /// leaf, 30 round trips (300 ms).
    fn default() -> Self {
        SharedBottleneck {
            fabric: TwoSite::default(),
            rtt: Duration::from_millis(10),
            loss: 0.0,
            intra_flows: 3,
            duration_rtts: 30,
            tuning: Tuning::default(),
            seed: 1,
        }
    }
}

/// Which kind a flow is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowKind {
    LongHaul,
    IntraDc,
}

impl FlowKind {
    pub fn name(self) -> &'static str {
        match self {
            FlowKind::LongHaul => "long-haul",
            FlowKind::IntraDc => "intra-DC",
        }
    }
}

/// One flow's share.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareFlow {
    pub kind: FlowKind,
    pub src: HostId,
    pub dst: HostId,
    /// Goodput over the second half of the run, Gbit/s.
    pub goodput_gbps: f64,
    /// That goodput over the bottleneck's line rate.
    pub share: f64,
    pub max_in_flight: Option<u64>,
    pub messages_corrupt: u64,
    /// Acknowledged payload bytes over time, from the start.
    pub samples: Vec<(Duration, u64)>,
}

/// One protocol's run.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareRow {
    pub protocol: Protocol,
    pub rtt: Duration,
    pub flows: Vec<ShareFlow>,
    /// Jain's index over the flows' goodputs.
    pub fairness: f64,
    /// Sum of the flows' goodputs, Gbit/s.
    pub total_gbps: f64,
    pub line_rate_bps: u64,
    pub queue_drops: u64,
    pub marked: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub duration: Duration,
    pub events: u64,
}

/// Runs the scenario for both protocols; `progress` after each.
pub fn shared_bottleneck(
    cfg: &SharedBottleneck,
    mut progress: impl FnMut(usize, usize),
) -> Vec<ShareRow> {
    let fabric = fabric_for(&cfg.fabric, cfg.rtt, cfg.loss);
    let layout = fabric.build();
    let rate_bps = fabric.site.host_link.rate_bps;
    let long = PathPlan {
        rtt: fabric.round_trip(),
        rate_bps,
    };
    let intra = PathPlan {
        rtt: 2 * (2 * fabric.site.host_link.delay + 2 * fabric.site.fabric_link.delay),
        rate_bps,
    };
    let per_site = fabric.hosts_per_site();
    let per_leaf = fabric.site.hosts_per_leaf;
    let dst = fabric.host(1, 0);
    // Data-centre senders from the receiver's other leaves first (their
    // packets cross a spine, as most would), then its own leaf.
    let intra_srcs: Vec<HostId> = (per_leaf..per_site)
        .chain(1..per_leaf.min(per_site))
        .take(cfg.intra_flows)
        .map(|i| fabric.host(1, i))
        .collect();
    let start = Instant::from_micros(1);
    // Each sender offers the window of its own path.
    let flow = |src, path: &PathPlan| StreamFlow {
        src,
        dst,
        bytes: StreamFlow::UNTIL_STOPPED,
        start,
        message_bytes: cfg.tuning.message_bytes(path),
    };
    let mut flows = vec![flow(fabric.host(0, 0), &long)];
    flows.extend(intra_srcs.iter().map(|&s| flow(s, &intra)));
    let duration = long.rtt * cfg.duration_rtts;
    let stream = StreamConfig {
        messages_in_flight: cfg.tuning.messages_in_flight,
        packet_payload: PACKET_PAYLOAD,
        stop_at: start + duration,
        sample_every: (long.rtt / 8).max(Duration::from_micros(10)),
        data_seed: cfg.seed ^ 0xda7a,
    };
    // Site A's sender and the shared receiver offer the long path's
    // window (the receiver takes connections of both kinds); site B's
    // senders run and offer the data-centre settings.
    let plan = |h: HostId| {
        if h < per_site {
            (long, long)
        } else if h == dst {
            (intra, long)
        } else {
            (intra, intra)
        }
    };
    let mut rows = Vec::new();
    for (i, protocol) in Protocol::ALL.into_iter().enumerate() {
        let report = run_protocol(
            protocol,
            &layout.topology,
            cfg.seed,
            &flows,
            &stream,
            plan,
            &cfg.tuning,
        );
        let mid = start + duration / 2;
        let end = start + duration;
        let shares: Vec<ShareFlow> = report
            .flows
            .iter()
            .enumerate()
            .map(|(j, f)| {
                let goodput_gbps = f.goodput_between(mid, end);
                ShareFlow {
                    kind: if j == 0 {
                        FlowKind::LongHaul
                    } else {
                        FlowKind::IntraDc
                    },
                    src: f.flow.src,
                    dst: f.flow.dst,
                    goodput_gbps,
                    share: goodput_gbps * 1e9 / rate_bps.max(1) as f64,
                    max_in_flight: f.max_in_flight,
                    messages_corrupt: f.messages_corrupt,
                    samples: f.samples.iter().map(|&(t, b)| (t - start, b)).collect(),
                }
            })
            .collect();
        let goodputs: Vec<f64> = shares.iter().map(|s| s.goodput_gbps).collect();
        rows.push(ShareRow {
            protocol,
            rtt: long.rtt,
            fairness: jain_fairness(&goodputs),
            total_gbps: goodputs.iter().sum(),
            flows: shares,
            line_rate_bps: rate_bps,
            queue_drops: report.fabric.queue_drops,
            marked: report.fabric.marked,
            retransmissions: report.transport.retransmissions,
            timeouts: report.transport.timeouts,
            duration,
            events: report.events,
        });
        progress(i + 1, Protocol::ALL.len());
    }
    rows
}
