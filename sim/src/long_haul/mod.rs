//! `long-haul`: one connection between two data-centre
//! sites ([`TwoSite`]) at round trips from 0.01 to 20 ms, with and without
//! random loss on the long-haul links, MetaRoCE beside RoCEv2; and a small
//! shared-bottleneck scenario for point 2 ([`shared`]).
//!
//! What is measured, and why this way:
//! * **One transfer of a size scaled by the bandwidth-delay product**
//!   (default 8 BDPs of the host's line rate, at least 64 MiB), so that
//!   every round trip sees the same number of windows. Memory stays
//!   bounded ([`crate::stream`]: message slots reused in a ring), so the
//!   size costs events, not RAM.
//! * **Goodput = the steady rate**: payload bytes the receiver
//!   acknowledged over the second half of the run's time (start to
//!   completion, or to the time limit), from the sender's acknowledged
//!   packets sampled every eighth of a round trip. The first half holds
//!   the handshake (one round trip for MetaRoCE) and the start-up ramp;
//!   the goals ("keeps at least 90 % of line rate") are about the rate it
//!   keeps. The whole-transfer goodput (completed bytes over the run's
//!   time) is reported beside it, as is the completion time.
//! * **A time limit** (default twice the transfer's line-rate time plus
//!   10 round trips): a run still going then reports its steady rate and
//!   no completion time. It bounds the simulation's cost: a go-back-N
//!   sender at 0.1 % loss keeps the line busy with retransmissions and
//!   would otherwise cost events in proportion to its slowness.
//! * **Line rate 25 Gbit/s** on every link (hosts, fabric, long haul),
//!   not 100: a 20 ms round trip at 100 Gbit/s is 61,000 packets in
//!   flight; at 25 Gbit/s it is 15,000 and the whole experiment runs in a
//!   minute or so. `pct_of_line_rate` is goodput over the raw line rate,
//!   so headers cap it near 97 % (MetaRoCE: 4096 payload bytes in 4218 of
//!   line time) and 98 % (RoCEv2).
//!
//! The windows, set in one place ([`Tuning`]): the application keeps
//! 3 BDPs of WRITEs posted per flow (at least 1 MiB), split over 16
//! messages. Three, because a lost packet holds its message, and the
//! messages behind it, for about 2.25 round trips (a round trip until
//! later packets' SACKs declare it lost, a round trip for the resend):
//! to keep the line busy meanwhile, more than 2.25 BDPs must be posted
//! (with 1.5, MetaRoCE kept 62.6 % of the line at 10 ms and 0.1 % loss;
//! with 3, 89.8 %). RoCEv2's only window is that: its requester sends
//! everything posted, its 24-bit PSN space allows 8 M PSNs outstanding,
//! and DCQCN paces but does not bound what is in flight. MetaRoCE is
//! offered as many packets as its window (at most 65,536 PSNs, spec 4.4,
//! `MAX_WINDOW`: 2.15 BDPs at 100 Gbit/s and 10 ms). Its timers are
//! scaled to the round trip by [`Tuning::metaroce`].

pub mod cli;
pub mod report;
pub mod shared;

use std::time::Duration;

use metaroce_core::api::PeerAddr;
use metaroce_core::Instant;

use crate::experiments::Protocol;
use crate::metaroce::MetaRoce;
use crate::network::{SimConfig, Simulator};
use crate::packet::HostId;
use crate::roce::Roce;
use crate::stream::{self, StreamConfig, StreamFlow, StreamReport};
use crate::topology::Topology;
use crate::transport::SimTransport;
use crate::two_site::TwoSite;
use crate::workload::FlowStatus;

/// Payload bytes per data packet: both protocols' MTU here.
pub const PACKET_PAYLOAD: u32 = 4096;

/// A path as the tuning sees it: its round trip (propagation, both ways)
/// and the sender's line rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathPlan {
    pub rtt: Duration,
    pub rate_bps: u64,
}

impl PathPlan {
    /// Bytes the line carries in one round trip.
    pub fn bdp_bytes(&self) -> u64 {
        (u128::from(self.rate_bps) * self.rtt.as_nanos() / 8_000_000_000) as u64
    }
}

/// Every protocol and application setting the long-haul runs derive from
/// the path, in one place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// Window, in bandwidth-delay products of the path: what the
    /// application keeps posted, and the window MetaRoCE is offered.
    pub window_bdps: f64,
    /// Smallest window in bytes: on short paths ACK coalescing and
    /// store-and-forward (8 hops of 1.3 us at 25 Gbit/s) add more to the
    /// round trip than propagation does.
    pub min_window_bytes: u64,
    /// WRITEs posted per flow (the window is split over them; at most
    /// MetaRoCE's 32-entry send queue).
    pub messages_in_flight: usize,
    /// MetaRoCE settings [`Tuning::metaroce`] does not derive from the path.
    pub metaroce_base: metaroce_core::Config,
    /// RoCEv2 settings [`Tuning::roce`] does not derive from the path.
    pub roce_base: roce_baseline::Config,
    /// Every MetaRoCE host holds a job key and requires protection, with
    /// 0-RTT (`--job-key`).
    pub job_key: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            window_bdps: 3.0,
            min_window_bytes: 1 << 20,
            messages_in_flight: 16,
            metaroce_base: metaroce_core::Config::default(),
            roce_base: roce_baseline::Config::default(),
            job_key: false,
        }
    }
}

impl Tuning {
    /// The window in bytes: `window_bdps` BDPs, at least `min_window_bytes`.
    pub fn window_bytes(&self, path: &PathPlan) -> u64 {
        ((path.bdp_bytes() as f64 * self.window_bdps) as u64).max(self.min_window_bytes)
    }

    /// Bytes per WRITE: the window over the messages posted, in whole
    /// packets.
    pub fn message_bytes(&self, path: &PathPlan) -> u32 {
        let per = self
            .window_bytes(path)
            .div_ceil(self.messages_in_flight.max(1) as u64);
        let packets = per.div_ceil(u64::from(PACKET_PAYLOAD)).max(1);
        u32::try_from(packets * u64::from(PACKET_PAYLOAD)).unwrap_or(u32::MAX)
    }

    /// MetaRoCE's configuration for `path`. The window is offered in
    /// packets (the core clamps it to what it supports); the link rate is
    /// the host's; every timer that must outlast a round trip is scaled to
    /// it (none shrinks below the data-centre default):
    /// * `rto_initial` 3 RTT: before any sample, a timeout inside the first
    ///   round trip is always spurious (RFC 6298 starts at 1 s for this);
    /// * `rto_min` 1.25 RTT: on a quiet long path the variance term falls
    ///   to nothing, and a timeout shorter than the round trip is spurious;
    /// * `rto_max` 10 RTT: backoff must be able to exceed a round trip;
    /// * `handshake_timeout` 2 RTT: an ACCEPT comes back after one;
    /// * `keepalive_interval` 5 RTT and `idle_timeout` 50 RTT: silence is
    ///   measured in round trips;
    /// * `active_sender_window` 2 RTT: a window-limited sender on a long
    ///   path delivers once per round trip, and must still count as active
    ///   at the receiver between its bursts.
    pub fn metaroce(&self, path: &PathPlan) -> metaroce_core::Config {
        self.metaroce_offering(path, path)
    }

    /// [`Tuning::metaroce`] for a host whose timers follow `path` but
    /// which offers the window of `window_path`: a data-centre receiver
    /// that a long-haul peer sends to must offer the long path's window
    /// (the connection takes the smaller offer), while its data-centre
    /// peers, offering theirs, still get theirs.
    pub fn metaroce_offering(
        &self,
        path: &PathPlan,
        window_path: &PathPlan,
    ) -> metaroce_core::Config {
        let base = self.metaroce_base;
        let rtt = path.rtt;
        let window_packets = self
            .window_bytes(window_path)
            .div_ceil(u64::from(PACKET_PAYLOAD))
            .clamp(1, u64::from(metaroce_core::config::MAX_WINDOW));
        metaroce_core::Config {
            window: window_packets as u32,
            link_rate_mbps: u32::try_from(path.rate_bps / 1_000_000).unwrap_or(u32::MAX),
            rto_initial: base.rto_initial.max(3 * rtt),
            rto_min: base.rto_min.max(rtt * 5 / 4),
            rto_max: base.rto_max.max(10 * rtt),
            handshake_timeout: base.handshake_timeout.max(2 * rtt),
            keepalive_interval: base.keepalive_interval.max(5 * rtt),
            idle_timeout: base.idle_timeout.max(50 * rtt),
            active_sender_window: base.active_sender_window.max(2 * rtt),
            ..base
        }
    }

    /// RoCEv2's configuration for `path`: DCQCN's line rate is the host's,
    /// and the retry timer (the IBA encoding, 4.096 us x 2^n) is the
    /// smallest at least the base value and 3 round trips (the default
    /// 67 ms covers every round trip up to 22 ms). Its window is what the
    /// application posts ([`Tuning::window_bytes`]).
    pub fn roce(&self, path: &PathPlan) -> roce_baseline::Config {
        let base = self.roce_base;
        let wanted = base.local_ack_timeout.max(3 * path.rtt);
        let local_ack_timeout = (0..32)
            .map(roce_baseline::config::local_ack_timeout)
            .find(|&t| t >= wanted)
            .unwrap_or(base.local_ack_timeout);
        roce_baseline::Config {
            line_rate_bps: path.rate_bps,
            local_ack_timeout,
            ..base
        }
    }
}

/// `long-haul` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LongHaul {
    /// The two sites; the round trip and the loss are set per run.
    pub fabric: TwoSite,
    /// Round trips (two-way propagation between the hosts).
    pub rtts: Vec<Duration>,
    /// Random loss on each long-haul link, each direction.
    pub losses: Vec<f64>,
    /// Transfer size in bandwidth-delay products of the line rate...
    pub transfer_bdps: f64,
    /// ... and at least this many bytes.
    pub min_bytes: u64,
    /// A run stops at this many times the transfer's line-rate time ...
    pub limit_factor: f64,
    /// ... plus this many round trips.
    pub limit_rtts: u32,
    pub tuning: Tuning,
    pub seed: u64,
}

impl Default for LongHaul {
    /// 0.01, 1, 5, 10 and 20 ms; 0 and 0.1 % loss; 8 BDPs of at least
    /// 64 MiB; stop at 2x the line-rate time plus 10 round trips.
    fn default() -> Self {
        LongHaul {
            fabric: TwoSite::default(),
            rtts: [10, 1_000, 5_000, 10_000, 20_000]
                .into_iter()
                .map(Duration::from_micros)
                .collect(),
            losses: vec![0.0, 0.001],
            transfer_bdps: 8.0,
            min_bytes: 64 << 20,
            limit_factor: 2.0,
            limit_rtts: 10,
            tuning: Tuning::default(),
            seed: 1,
        }
    }
}

/// One protocol at one round trip and loss.
#[derive(Debug, Clone, PartialEq)]
pub struct LongHaulRow {
    pub protocol: Protocol,
    /// The round trip asked for, and the one the fabric has (larger where
    /// the sites' own links take more).
    pub rtt: Duration,
    pub path_rtt: Duration,
    pub loss: f64,
    pub line_rate_bps: u64,
    pub bytes: u64,
    /// What the application kept posted, bytes.
    pub window_bytes: u64,
    pub message_bytes: u32,
    pub status: FlowStatus,
    /// Every completed message arrived intact (and the flow finished).
    pub intact: bool,
    pub messages_corrupt: u64,
    pub fct: Option<Duration>,
    /// Steady goodput (second half of the run), Gbit/s.
    pub goodput_gbps: f64,
    /// Completed bytes over the run's whole time, Gbit/s.
    pub transfer_goodput_gbps: f64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub max_in_flight: Option<u64>,
    /// Packets the long-haul links lost (data and acknowledgments).
    pub lost_long_haul: u64,
    /// Packets switch buffers dropped (anywhere).
    pub queue_drops: u64,
    /// When the run stopped, from the flow's start.
    pub run_time: Duration,
    /// Acknowledged payload bytes over time, from the flow's start.
    pub samples: Vec<(Duration, u64)>,
    pub events: u64,
}

impl LongHaulRow {
    /// Steady goodput as a percentage of the line rate.
    pub fn pct_of_line_rate(&self) -> f64 {
        100.0 * self.goodput_gbps * 1e9 / self.line_rate_bps.max(1) as f64
    }

    /// The goal that applies to this row, if one does: (required
    /// percentage of line rate, met).
    pub fn goal(&self) -> Option<(f64, bool)> {
        let required = goal_pct(self.rtt, self.loss)?;
        Some((
            required,
            self.intact_or_running() && self.pct_of_line_rate() >= required,
        ))
    }

    /// Not corrupt, and not failed (a run stopped by the time limit counts:
    /// its steady rate is what it kept).
    fn intact_or_running(&self) -> bool {
        self.messages_corrupt == 0
            && matches!(self.status, FlowStatus::Done | FlowStatus::Unfinished)
    }
}

/// The long-haul goals: at 10 ms, at least 90 % of line rate without loss
/// and at least 85 % at 0.1 % loss.
pub fn goal_pct(rtt: Duration, loss: f64) -> Option<f64> {
    if rtt != Duration::from_millis(10) {
        return None;
    }
    if loss == 0.0 {
        Some(90.0)
    } else if (loss - 0.001).abs() < 1e-12 {
        Some(85.0)
    } else {
        None
    }
}

/// Runs every round trip, loss and protocol; `progress` after each run.
pub fn long_haul(cfg: &LongHaul, mut progress: impl FnMut(usize, usize)) -> Vec<LongHaulRow> {
    let total = cfg.rtts.len() * cfg.losses.len() * Protocol::ALL.len();
    let mut rows = Vec::with_capacity(total);
    for &rtt in &cfg.rtts {
        for &loss in &cfg.losses {
            for protocol in Protocol::ALL {
                rows.push(run_one(cfg, rtt, loss, protocol));
                progress(rows.len(), total);
            }
        }
    }
    rows
}

/// The fabric of one run: round trip and loss set, border buffers sized
/// for that round trip.
pub fn fabric_for(base: &TwoSite, rtt: Duration, loss: f64) -> TwoSite {
    let mut fabric = *base;
    fabric.set_round_trip(rtt);
    fabric.set_long_haul_loss(loss);
    fabric.border_queue = fabric.deep_border_queue();
    fabric
}

fn run_one(cfg: &LongHaul, rtt: Duration, loss: f64, protocol: Protocol) -> LongHaulRow {
    let fabric = fabric_for(&cfg.fabric, rtt, loss);
    let layout = fabric.build();
    let rate_bps = fabric.site.host_link.rate_bps;
    let path = PathPlan {
        rtt: fabric.round_trip(),
        rate_bps,
    };
    let tuning = &cfg.tuning;
    let message_bytes = tuning.message_bytes(&path);
    let msg = u64::from(message_bytes);
    let wanted = ((path.bdp_bytes() as f64 * cfg.transfer_bdps) as u64).max(cfg.min_bytes);
    let bytes = wanted.div_ceil(msg) * msg;
    let start = Instant::from_micros(1);
    let flow = StreamFlow {
        src: fabric.host(0, 0),
        dst: fabric.host(1, 0),
        bytes,
        start,
        message_bytes,
    };
    let ideal = Duration::from_secs_f64(bytes as f64 * 8.0 / rate_bps.max(1) as f64);
    let limit = ideal.mul_f64(cfg.limit_factor) + path.rtt * cfg.limit_rtts;
    let stream = StreamConfig {
        messages_in_flight: tuning.messages_in_flight,
        packet_payload: PACKET_PAYLOAD,
        stop_at: start + limit,
        sample_every: (path.rtt / 8).max(Duration::from_micros(10)),
        data_seed: cfg.seed ^ 0xda7a,
    };
    let report = run_protocol(
        protocol,
        &layout.topology,
        cfg.seed,
        &[flow],
        &stream,
        |_| (path, path),
        tuning,
    );
    let f = &report.flows[0];
    // Only the long-haul links lose packets at random.
    let lost_long_haul = report.fabric.lost;
    LongHaulRow {
        protocol,
        rtt,
        path_rtt: path.rtt,
        loss,
        line_rate_bps: rate_bps,
        bytes,
        window_bytes: tuning.window_bytes(&path),
        message_bytes,
        status: f.status,
        intact: f.intact(),
        messages_corrupt: f.messages_corrupt,
        fct: f.fct(),
        goodput_gbps: f.steady_goodput(),
        transfer_goodput_gbps: f.transfer_goodput(),
        retransmissions: report.transport.retransmissions,
        timeouts: report.transport.timeouts,
        max_in_flight: f.max_in_flight,
        lost_long_haul,
        queue_drops: report.fabric.queue_drops,
        run_time: f.end() - start,
        samples: f.samples.iter().map(|&(t, b)| (t - start, b)).collect(),
        events: report.events,
    }
}

/// Runs `flows` with `protocol` on every host; host `h` is configured for
/// the path `plan(h).0` (its flows' round trip) and offers MetaRoCE's
/// window for the path `plan(h).1` (the longest it receives over).
pub fn run_protocol(
    protocol: Protocol,
    topology: &Topology,
    seed: u64,
    flows: &[StreamFlow],
    stream: &StreamConfig,
    plan: impl Fn(HostId) -> (PathPlan, PathPlan),
    tuning: &Tuning,
) -> StreamReport {
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    match protocol {
        Protocol::MetaRoce => go(topology, config, flows, stream, |h, a, s| {
            let (timers, window) = plan(h);
            let config = MetaRoce::<16>::host_config(
                tuning.metaroce_offering(&timers, &window),
                a.ip,
                tuning.job_key,
            );
            MetaRoce::<16>::new(config, 4, s)
        }),
        Protocol::Roce => go(topology, config, flows, stream, |h, a, s| {
            Roce::<4>::new(tuning.roce(&plan(h).0), a, s)
        }),
    }
}

fn go<T: SimTransport>(
    topology: &Topology,
    config: SimConfig,
    flows: &[StreamFlow],
    stream: &StreamConfig,
    make: impl FnMut(HostId, PeerAddr, u64) -> T,
) -> StreamReport {
    let mut sim = Simulator::new(topology, config, make);
    stream::run(&mut sim, flows, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_scales_windows_and_timers_with_the_round_trip() {
        let t = Tuning::default();
        let path = PathPlan {
            rtt: Duration::from_millis(10),
            rate_bps: 25_000_000_000,
        };
        assert_eq!(path.bdp_bytes(), 31_250_000);
        assert_eq!(t.window_bytes(&path), 93_750_000);
        // 93.75 MB over 16 messages, in whole 4 KiB packets.
        assert_eq!(t.message_bytes(&path), 1431 * 4096);
        let m = t.metaroce(&path);
        assert_eq!(m.window, 22_889);
        // At 100 Gbit/s the window is capped at what the wire carries.
        let fast = PathPlan {
            rate_bps: 100_000_000_000,
            ..path
        };
        assert_eq!(t.metaroce(&fast).window, metaroce_core::config::MAX_WINDOW);
        assert_eq!(m.link_rate_mbps, 25_000);
        assert_eq!(m.rto_min, Duration::from_micros(12_500));
        assert_eq!(m.handshake_timeout, Duration::from_millis(20));
        assert_eq!(m.idle_timeout, Duration::from_millis(1_000));
        let r = t.roce(&path);
        assert_eq!(r.line_rate_bps, 25_000_000_000);
        assert_eq!(
            r.local_ack_timeout,
            roce_baseline::config::local_ack_timeout(14)
        );
        // A data-centre path keeps the data-centre timers and 1 MiB.
        let short = PathPlan {
            rtt: Duration::from_micros(12),
            ..path
        };
        let d = metaroce_core::Config::default();
        let m = t.metaroce(&short);
        assert_eq!(
            (m.rto_min, m.handshake_timeout),
            (d.rto_min, d.handshake_timeout)
        );
        assert_eq!(t.window_bytes(&short), 1 << 20);
        assert_eq!(t.message_bytes(&short), 64 << 10);
        // 30 ms: 3 RTT exceeds 67 ms, so the next IBA value (134 ms).
        let far = PathPlan {
            rtt: Duration::from_millis(30),
            ..path
        };
        assert_eq!(
            t.roce(&far).local_ack_timeout,
            roce_baseline::config::local_ack_timeout(15)
        );
    }

    #[test]
    fn goals_apply_at_10_ms() {
        let ten = Duration::from_millis(10);
        assert_eq!(goal_pct(ten, 0.0), Some(90.0));
        assert_eq!(goal_pct(ten, 0.001), Some(85.0));
        assert_eq!(goal_pct(Duration::from_millis(20), 0.0), None);
        assert_eq!(goal_pct(ten, 0.01), None);
    }
}
