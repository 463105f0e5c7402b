//! Long transfers in bounded memory, with goodput measured over time.
//!
//! A long-haul flow moves hundreds of megabytes (a 20 ms round trip at
//! 25 Gbit/s holds 62.5 MB); [`crate::workload`] would give each flow a
//! source and a destination range of its whole size. Here a flow cycles
//! through a **ring of message slots** on each side instead: message `j`
//! is a WRITE from source slot `j % slots` to destination slot
//! `j % slots`. Before it is posted its source slot is filled with a
//! pattern of its own (flow and message number); when it completes, its
//! destination slot is compared with the source slot (integrity) and
//! then refilled with [`FILL`], so a later message that misses bytes shows
//! up. A slot is reused only after its previous message completed.
//!
//! Goodput over an interval comes from the sender's acknowledged packets
//! ([`SendProgress::packets_acked`]), sampled at a fixed period, so that
//! it does not depend on how rarely messages complete (a message of a
//! window-limited long-haul flow can take several round trips). Messages
//! should be whole multiples of the transport's payload per packet, so
//! that every packet carries `packet_payload` bytes.
//!
//! [`SendProgress::packets_acked`]: crate::transport::SendProgress

use std::time::Duration;

use metaroce_core::api::{Access, ConnHandle, LocalBuf, Op, Region, Status, WorkRequest};
use metaroce_core::wire::MemoryTarget;
use metaroce_core::Instant;

use crate::memory::{Arena, FILL};
use crate::network::{FabricStats, HostCompletion, Simulator, Step};
use crate::packet::HostId;
use crate::transport::{SimTransport, TransportCounters, TransportError};
use crate::workload::{arrived_intact, fill_pattern, FlowStatus};

/// One long transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFlow {
    pub src: HostId,
    pub dst: HostId,
    /// Bytes to move; [`StreamFlow::UNTIL_STOPPED`] runs until the run stops.
    pub bytes: u64,
    pub start: Instant,
    /// Bytes per WRITE (a multiple of the packet payload): with
    /// [`StreamConfig::messages_in_flight`], the window the application
    /// offers on this flow's path.
    pub message_bytes: u32,
}

impl StreamFlow {
    /// `bytes` of a flow that runs until the run stops.
    pub const UNTIL_STOPPED: u64 = u64::MAX;
}

/// How streams are carried and measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// WRITEs posted and not yet completed, per flow.
    pub messages_in_flight: usize,
    /// Payload bytes per data packet (the MTU both protocols use).
    pub packet_payload: u32,
    /// The run stops at this instant, finished or not.
    pub stop_at: Instant,
    /// Period of the progress samples.
    pub sample_every: Duration,
    /// Seed of the data patterns.
    pub data_seed: u64,
}

/// A flow's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamResult {
    pub flow: StreamFlow,
    pub status: FlowStatus,
    /// When its last WRITE completed.
    pub finished: Option<Instant>,
    /// Bytes of the WRITEs that completed.
    pub bytes_completed: u64,
    /// Completed messages whose destination bytes matched the source, and
    /// those that did not.
    pub messages_intact: u64,
    pub messages_corrupt: u64,
    /// (instant, payload bytes the receiver acknowledged) every
    /// `sample_every` from the flow's start, and at its end.
    pub samples: Vec<(Instant, u64)>,
    /// Most packets its connection had in flight (`None`: not tracked).
    pub max_in_flight: Option<u64>,
}

impl StreamResult {
    /// Whether the flow finished and every message arrived intact.
    pub fn intact(&self) -> bool {
        self.status == FlowStatus::Done && self.messages_corrupt == 0
    }

    /// Completion time, if it finished.
    pub fn fct(&self) -> Option<Duration> {
        self.finished.map(|t| t - self.flow.start)
    }

    /// The instant its measurement ends: its completion, or else the last
    /// sample (the run's stop).
    pub fn end(&self) -> Instant {
        self.finished
            .or_else(|| self.samples.last().map(|s| s.0))
            .unwrap_or(self.flow.start)
    }

    /// Acknowledged payload bytes at `at`, interpolated linearly between
    /// samples (0 before the first, the last after the last).
    pub fn acked_at(&self, at: Instant) -> f64 {
        let s = &self.samples;
        let i = s.partition_point(|&(t, _)| t <= at);
        match (i.checked_sub(1).and_then(|j| s.get(j)), s.get(i)) {
            (None, _) => 0.0,
            (Some(&(_, b)), None) => b as f64,
            (Some(&(t0, b0)), Some(&(t1, b1))) => {
                let span = (t1 - t0).as_secs_f64();
                let part = (at - t0).as_secs_f64();
                b0 as f64 + (b1 as f64 - b0 as f64) * part / span.max(1e-12)
            }
        }
    }

    /// Goodput in Gbit/s of the payload acknowledged between `from` and
    /// `to`: the least-squares slope of acknowledged bytes against time
    /// over the samples in between (and the two ends, interpolated).
    /// Acknowledgments of a window-limited flow arrive in one burst per
    /// round trip; a slope over many bursts does not depend on where the
    /// interval's ends fall between two bursts, as a difference of the two
    /// ends would (by up to a burst).
    pub fn goodput_between(&self, from: Instant, to: Instant) -> f64 {
        if to <= from {
            return 0.0;
        }
        let inner = self
            .samples
            .iter()
            .filter(|(t, _)| *t > from && *t < to)
            .map(|&(t, b)| (t, b as f64));
        let points: Vec<(f64, f64)> = [(from, self.acked_at(from))]
            .into_iter()
            .chain(inner)
            .chain([(to, self.acked_at(to))])
            .map(|(t, b)| ((t - from).as_secs_f64(), b))
            .collect();
        let n = points.len() as f64;
        let mean_t = points.iter().map(|p| p.0).sum::<f64>() / n;
        let mean_b = points.iter().map(|p| p.1).sum::<f64>() / n;
        let (mut cov, mut var) = (0.0, 0.0);
        for &(t, b) in &points {
            cov += (t - mean_t) * (b - mean_b);
            var += (t - mean_t) * (t - mean_t);
        }
        if var <= 0.0 {
            return 0.0;
        }
        cov / var * 8.0 / 1e9
    }

    /// Goodput over the second half of the flow's time (start to
    /// [`StreamResult::end`]): the steady rate, without the handshake and
    /// the start-up ramp of its first half.
    pub fn steady_goodput(&self) -> f64 {
        let end = self.end();
        let mid = self.flow.start + (end - self.flow.start) / 2;
        self.goodput_between(mid, end)
    }

    /// Completed bytes over the flow's whole time (start to end), Gbit/s.
    pub fn transfer_goodput(&self) -> f64 {
        let secs = (self.end() - self.flow.start).as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            self.bytes_completed as f64 * 8.0 / secs / 1e9
        }
    }
}

/// What a run produced (no wall-clock figures: comparable whole).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamReport {
    pub protocol: &'static str,
    pub flows: Vec<StreamResult>,
    /// Virtual time when the run stopped.
    pub end: Instant,
    pub fabric: FabricStats,
    /// Summed over every host.
    pub transport: TransportCounters,
    /// Memory accesses outside an arena (must be 0).
    pub out_of_bounds: u64,
    pub events: u64,
}

impl StreamReport {
    /// Whether every flow that was meant to finish did, intact, and no
    /// message of a still-running flow arrived corrupt.
    pub fn all_intact(&self) -> bool {
        self.out_of_bounds == 0
            && self.flows.iter().all(|f| {
                f.messages_corrupt == 0
                    && (f.flow.bytes == StreamFlow::UNTIL_STOPPED || f.status == FlowStatus::Done)
            })
    }
}

struct State {
    result: StreamResult,
    conn: Option<ConnHandle>,
    /// Slot rings: first byte of each side's ring.
    src_ring: u64,
    dst_ring: u64,
    slots: u64,
    messages: u64,
    posted: u64,
    completed: u64,
    /// Message number occupying each slot, until it completes.
    slot_busy: Vec<Option<u64>>,
    /// Acknowledged packets of the source host when the flow started (a
    /// host's counter covers every flow it sends).
    acked_base: u64,
}

/// Application tokens: flow starts are their index; samples have this bit.
const SAMPLE: u64 = 1 << 63;

/// Sets up memory, runs `flows` until every finite one finished or
/// `config.stop_at`, and reports. Hosts' arenas are replaced. A host may
/// send one flow at most (progress is read per host).
pub fn run<T: SimTransport>(
    sim: &mut Simulator<T>,
    flows: &[StreamFlow],
    config: &StreamConfig,
) -> StreamReport {
    let hosts = sim.host_count();
    let slots = config.messages_in_flight.max(1) as u64 + 1;
    let mut sizes = vec![0u64; hosts];
    let mut senders = vec![false; hosts];
    let mut states: Vec<State> = Vec::with_capacity(flows.len());
    for f in flows {
        let msg = u64::from(f.message_bytes.max(1));
        let ring = slots * msg;
        let mut status = FlowStatus::Unfinished;
        if f.src >= hosts || f.dst >= hosts || f.src == f.dst || senders[f.src] {
            status = FlowStatus::Refused("bad host pair, or a second flow from one host");
        }
        let (mut src_ring, mut dst_ring) = (0, 0);
        if status == FlowStatus::Unfinished {
            senders[f.src] = true;
            src_ring = sizes[f.src];
            sizes[f.src] += ring;
            dst_ring = sizes[f.dst];
            sizes[f.dst] += ring;
        }
        states.push(State {
            result: StreamResult {
                flow: *f,
                status,
                finished: None,
                bytes_completed: 0,
                messages_intact: 0,
                messages_corrupt: 0,
                samples: Vec::new(),
                max_in_flight: None,
            },
            conn: None,
            src_ring,
            dst_ring,
            slots,
            messages: f.bytes.div_ceil(msg),
            posted: 0,
            completed: 0,
            slot_busy: vec![None; slots as usize],
            acked_base: 0,
        });
    }
    let mut keys = vec![0u32; hosts];
    for (h, key) in keys.iter_mut().enumerate() {
        let host = sim.host_mut(h);
        // Goodput samples and the in-flight figure come from it.
        host.transport.track_send_progress();
        host.mem = Arena::new(usize::try_from(sizes[h]).unwrap_or(usize::MAX));
        if sizes[h] == 0 {
            continue;
        }
        let region = Region {
            base: host.mem.base(),
            len: sizes[h],
            access: Access::ALL,
            pd: 0,
        };
        match host.transport.register_region(region) {
            Ok(k) => *key = k,
            Err(_) => {
                for s in states
                    .iter_mut()
                    .filter(|s| s.result.flow.src == h || s.result.flow.dst == h)
                {
                    s.result.status = FlowStatus::Refused("region");
                }
            }
        }
    }
    for (i, s) in states.iter_mut().enumerate() {
        if s.result.status != FlowStatus::Unfinished {
            continue;
        }
        s.src_ring += sim.host(s.result.flow.src).mem.base();
        s.dst_ring += sim.host(s.result.flow.dst).mem.base();
        sim.schedule_app(s.result.flow.start, i as u64);
    }
    let first_start = flows.iter().map(|f| f.start).min().unwrap_or(Instant::ZERO);
    sim.schedule_app(first_start, SAMPLE);

    let mut open = states
        .iter()
        .filter(|s| {
            s.result.status == FlowStatus::Unfinished
                && s.result.flow.bytes != StreamFlow::UNTIL_STOPPED
        })
        .count();
    let endless = states.iter().any(|s| {
        s.result.status == FlowStatus::Unfinished
            && s.result.flow.bytes == StreamFlow::UNTIL_STOPPED
    });
    let mut done = Vec::new();
    while open > 0 || endless {
        if sim.next_event_at().is_none_or(|t| t > config.stop_at) {
            break;
        }
        match sim.step() {
            None => break,
            Some(Step::App(SAMPLE)) => {
                let now = sim.now();
                for s in &mut states {
                    sample(sim, s, now, config);
                }
                sim.schedule_app(now + config.sample_every, SAMPLE);
            }
            Some(Step::App(token)) => {
                let s = &mut states[token as usize];
                let f = s.result.flow;
                s.acked_base = acked_packets(sim, f.src);
                s.result.samples.push((sim.now(), 0));
                match sim.connect(f.src, f.dst) {
                    Ok(h) => {
                        s.conn = Some(h);
                        post_more(sim, s, token as usize, &keys, config);
                    }
                    Err(e) => s.result.status = FlowStatus::Refused(refusal(e)),
                }
                if s.result.status != FlowStatus::Unfinished && f.bytes != StreamFlow::UNTIL_STOPPED
                {
                    open -= 1;
                }
            }
            Some(Step::Internal) => {}
        }
        if !sim.has_completions() {
            continue;
        }
        sim.drain_completions(&mut done);
        for c in done.drain(..) {
            let i = (c.completion.wr_id >> 32) as usize;
            let Some(s) = states.get_mut(i) else {
                continue;
            };
            if c.host != s.result.flow.src || s.result.status != FlowStatus::Unfinished {
                continue;
            }
            on_completion(sim, s, i, &c, &keys, config);
            if s.result.status != FlowStatus::Unfinished {
                // The last sample: the instant it finished.
                sample(sim, s, c.at, config);
                if s.result.flow.bytes != StreamFlow::UNTIL_STOPPED {
                    open -= 1;
                }
            }
        }
    }

    let end = sim.now();
    let mut transport = TransportCounters::default();
    let mut out_of_bounds = 0;
    for h in 0..hosts {
        transport += sim.host(h).transport.counters();
        out_of_bounds += sim.host(h).mem.out_of_bounds;
    }
    for s in &mut states {
        if s.result.status == FlowStatus::Unfinished {
            sample(sim, s, end, config);
        }
        if s.conn.is_some() {
            s.result.max_in_flight = sim
                .host(s.result.flow.src)
                .transport
                .send_progress()
                .map(|p| p.max_in_flight);
        }
    }
    StreamReport {
        protocol: if hosts > 0 {
            sim.host(0).transport.name()
        } else {
            "none"
        },
        flows: states.into_iter().map(|s| s.result).collect(),
        end,
        fabric: sim.stats(),
        transport,
        out_of_bounds,
        events: sim.events_processed(),
    }
}

fn acked_packets<T: SimTransport>(sim: &Simulator<T>, host: HostId) -> u64 {
    sim.host(host)
        .transport
        .send_progress()
        .map_or(0, |p| p.packets_acked)
}

/// Records a flow's acknowledged bytes at `now` (once per instant; not
/// after it finished, nor before it started).
fn sample<T: SimTransport>(sim: &Simulator<T>, s: &mut State, now: Instant, config: &StreamConfig) {
    let started = s.result.samples.first().is_some_and(|f| f.0 <= now);
    let ended = s.result.finished.is_some_and(|f| f < now);
    if !started || ended {
        return;
    }
    let packets = acked_packets(sim, s.result.flow.src).saturating_sub(s.acked_base);
    let bytes = packets * u64::from(config.packet_payload);
    match s.result.samples.last_mut() {
        // A later look at the same instant saw more of it.
        Some(last) if last.0 == now => last.1 = bytes,
        _ => s.result.samples.push((now, bytes)),
    }
}

fn refusal(e: TransportError) -> &'static str {
    match e {
        TransportError::Retry => "queue full",
        TransportError::Refused(why) => why,
    }
}

/// The pattern stream of message `j` of flow `i`.
fn pattern_stream(i: usize, j: u64) -> usize {
    ((i as u64) << 40 | j) as usize
}

fn on_completion<T: SimTransport>(
    sim: &mut Simulator<T>,
    s: &mut State,
    i: usize,
    c: &HostCompletion,
    keys: &[u32],
    config: &StreamConfig,
) {
    if c.completion.status != Status::Success {
        s.result.status = FlowStatus::Failed(c.completion.status);
        return;
    }
    let j = c.completion.wr_id & 0xffff_ffff;
    let slot = j % s.slots;
    let msg = u64::from(s.result.flow.message_bytes.max(1));
    let len = message_len(s, j, msg) as usize;
    let f = s.result.flow;
    let (src_addr, dst_addr) = (s.src_ring + slot * msg, s.dst_ring + slot * msg);
    if arrived_intact(sim, (f.src, src_addr), (f.dst, dst_addr), len) {
        s.result.messages_intact += 1;
    } else {
        s.result.messages_corrupt += 1;
    }
    // Missing bytes of the slot's next message must not pass for this one's.
    if let Some(dst) = sim.host_mut(f.dst).mem.get_mut(dst_addr, len) {
        dst.fill(FILL);
    }
    s.slot_busy[slot as usize] = None;
    s.completed += 1;
    s.result.bytes_completed += len as u64;
    if s.completed < s.messages {
        post_more(sim, s, i, keys, config);
        return;
    }
    s.result.status = FlowStatus::Done;
    s.result.finished = Some(c.at);
}

/// Bytes of message `j` (the last one may be short).
fn message_len(s: &State, j: u64, msg: u64) -> u64 {
    msg.min(s.result.flow.bytes - j * msg)
}

/// Posts WRITEs while fewer than `messages_in_flight` are outstanding and
/// the next one's slot is free.
fn post_more<T: SimTransport>(
    sim: &mut Simulator<T>,
    s: &mut State,
    i: usize,
    keys: &[u32],
    config: &StreamConfig,
) {
    let Some(conn) = s.conn else {
        return;
    };
    let f = s.result.flow;
    let msg = u64::from(f.message_bytes.max(1));
    while s.posted < s.messages
        && s.posted - s.completed < config.messages_in_flight as u64
        && s.slot_busy[(s.posted % s.slots) as usize].is_none()
    {
        let j = s.posted;
        let slot = j % s.slots;
        let len = message_len(s, j, msg);
        let src_addr = s.src_ring + slot * msg;
        if let Some(src) = sim.host_mut(f.src).mem.get_mut(src_addr, len as usize) {
            fill_pattern(config.data_seed, pattern_stream(i, j), src);
        }
        let wr = WorkRequest {
            id: ((i as u64) << 32) | j,
            op: Op::Write {
                remote: MemoryTarget {
                    key: keys[f.dst],
                    addr: s.dst_ring + slot * msg,
                },
            },
            local: LocalBuf {
                key: keys[f.src],
                addr: src_addr,
                len: len as u32,
            },
        };
        match sim.post_send(f.src, conn, wr) {
            Ok(()) => {
                s.slot_busy[slot as usize] = Some(j);
                s.posted += 1;
            }
            // Retried on the next completion.
            Err(TransportError::Retry) => return,
            Err(TransportError::Refused(why)) => {
                s.result.status = FlowStatus::Refused(why);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(samples: &[(u64, u64)]) -> StreamResult {
        StreamResult {
            flow: StreamFlow {
                src: 0,
                dst: 1,
                bytes: 1 << 20,
                start: Instant::ZERO,
                message_bytes: 4096,
            },
            status: FlowStatus::Unfinished,
            finished: None,
            bytes_completed: 0,
            messages_intact: 0,
            messages_corrupt: 0,
            samples: samples
                .iter()
                .map(|&(us, b)| (Instant::from_micros(us), b))
                .collect(),
            max_in_flight: None,
        }
    }

    #[test]
    fn goodput_interpolates_between_samples() {
        // 0 bytes at 0, 1000 at 10 us, 3000 at 20 us.
        let r = result(&[(0, 0), (10, 1000), (20, 3000)]);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(near(r.acked_at(Instant::from_micros(5)), 500.0));
        assert!(near(r.acked_at(Instant::from_micros(15)), 2000.0));
        assert!(near(r.acked_at(Instant::from_micros(99)), 3000.0));
        // Second half (10..20 us): 2000 bytes in 10 us = 1.6 Gbit/s.
        assert!((r.steady_goodput() - 1.6).abs() < 1e-9);
        assert!(
            (r.goodput_between(Instant::from_micros(2), Instant::from_micros(8)) - 0.8).abs()
                < 1e-9
        );
        // A step every 10 us of 1000 bytes: 0.8 Gbit/s, wherever the ends fall.
        let steps: Vec<(u64, u64)> = (0..=100)
            .flat_map(|i| [(10 * i, 1000 * i), (10 * i + 9, 1000 * i)])
            .collect();
        let r = result(&steps);
        for (from, to) in [(0, 1000), (5, 905), (9, 500)] {
            let g = r.goodput_between(Instant::from_micros(from), Instant::from_micros(to));
            assert!((g - 0.8).abs() < 0.02, "{from}..{to}: {g}");
        }
    }
}
