//! Workloads: flows of bytes from one host to another, each carried as
//! RDMA WRITEs of `message_bytes` on its own connection, with a few
//! messages posted ahead. A flow's completion time runs from its start to
//! the sender's last WRITE completion; its integrity is the bytes that
//! landed in the receiver's memory compared with the bytes sent.
//!
//! Memory: each host's arena holds the source range of every flow it sends
//! and the destination range of every flow it receives, registered as one
//! region with every right. The arenas store their bytes
//! ([`HostMemory::Stored`]) or only check them ([`HostMemory::Synthetic`]:
//! the same packets and the same run, with memory that does not grow with
//! the bytes a flow carries).

use std::time::Duration;

use metaroce_core::api::{Access, ConnHandle, LocalBuf, Op, Region, Status, WorkRequest};
use metaroce_core::wire::MemoryTarget;
use metaroce_core::Instant;

use crate::memory::{self, Arena, PatternRange, ARENA_BASE};
use crate::network::{FabricStats, HostCompletion, Simulator, Step};
use crate::packet::HostId;
use crate::transport::{SimTransport, TransportCounters, TransportError};

/// One transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: HostId,
    pub dst: HostId,
    pub bytes: u64,
    pub start: Instant,
}

/// Connections each of `hosts` takes part in (as initiator or acceptor):
/// what its endpoint is sized for.
pub fn connections_per_host(flows: &[Flow], hosts: usize) -> Vec<u32> {
    let mut n = vec![0u32; hosts];
    for f in flows {
        if let Some(c) = n.get_mut(f.src) {
            *c += 1;
        }
        if let Some(c) = n.get_mut(f.dst) {
            *c += 1;
        }
    }
    n
}

/// How hosts' memory holds the flows' data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostMemory {
    /// Every byte of every arena stored: the destination compared with the
    /// source byte for byte when a flow completes.
    #[default]
    Stored,
    /// Nothing stored ([`Arena::synthetic`]): sources computed from the
    /// data pattern when the transport reads them, each write into a
    /// destination checked against the pattern on arrival; a flow is
    /// intact when every byte of its destination was placed once, with
    /// the value sent, and nothing was written elsewhere.
    Synthetic,
}

/// Work requests each of `hosts` keeps posted at most under `config`: up
/// to `messages_in_flight` per flow it sends.
pub fn posted_per_host(flows: &[Flow], hosts: usize, config: &WorkloadConfig) -> Vec<u32> {
    let message = u64::from(config.message_bytes.max(1));
    let mut n = vec![0u32; hosts];
    for f in flows {
        if let Some(c) = n.get_mut(f.src) {
            let messages = f
                .bytes
                .div_ceil(message)
                .min(config.messages_in_flight as u64);
            *c = c.saturating_add(u32::try_from(messages).unwrap_or(u32::MAX));
        }
    }
    n
}

/// How flows are carried and how long a run may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadConfig {
    /// Bytes per WRITE.
    pub message_bytes: u32,
    /// WRITEs posted and not yet completed, per flow.
    pub messages_in_flight: usize,
    /// Virtual time after the first flow's start at which the run stops.
    pub time_limit: Duration,
    /// Seed of the data pattern.
    pub data_seed: u64,
    /// Stored or synthetic arenas.
    pub memory: HostMemory,
    /// Every MetaRoCE host holds the simulator's job key and requires
    /// protection, with 0-RTT (spec 5.3, `--job-key`).
    pub job_key: bool,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            message_bytes: 256 << 10,
            messages_in_flight: 8,
            time_limit: Duration::from_secs(1),
            data_seed: 0xda7a,
            memory: HostMemory::Stored,
            job_key: false,
        }
    }
}

/// How a flow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowStatus {
    /// Still running when the run stopped.
    Unfinished,
    /// Every WRITE completed successfully.
    Done,
    /// A WRITE completed with an error.
    Failed(Status),
    /// The transport refused the connection or a post.
    Refused(&'static str),
}

/// A flow's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowResult {
    pub flow: Flow,
    pub status: FlowStatus,
    /// When the last WRITE completed.
    pub finished: Option<Instant>,
    /// Received bytes equal to sent bytes (checked when done).
    pub integrity_ok: Option<bool>,
}

impl FlowResult {
    /// Flow completion time.
    pub fn fct(&self) -> Option<Duration> {
        self.finished.map(|t| t - self.flow.start)
    }

    /// Payload goodput in Gbit/s over the completion time.
    pub fn goodput_gbps(&self) -> Option<f64> {
        let t = self.fct()?.as_nanos() as f64;
        (t > 0.0).then(|| self.flow.bytes as f64 * 8.0 / t)
    }
}

/// What a run produced. Everything in it is a function of the inputs and
/// the seed (no wall-clock figures), so two runs can be compared whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub protocol: &'static str,
    pub flows: Vec<FlowResult>,
    /// Virtual time when the run stopped.
    pub end: Instant,
    pub fabric: FabricStats,
    /// Summed over every host.
    pub transport: TransportCounters,
    /// Memory accesses outside an arena (must be 0).
    pub out_of_bounds: u64,
    /// Bytes written into synthetic arenas outside every flow's
    /// destination (must be 0; always 0 with stored arenas, whose stray
    /// writes show only where a flow's check reads them).
    pub stray_bytes: u64,
}

impl Report {
    /// Whether every flow finished with its data intact.
    pub fn all_ok(&self) -> bool {
        self.flows
            .iter()
            .all(|f| f.status == FlowStatus::Done && f.integrity_ok == Some(true))
            && self.out_of_bounds == 0
            && self.stray_bytes == 0
    }

    /// The latest completion time.
    pub fn last_finish(&self) -> Option<Instant> {
        self.flows.iter().filter_map(|f| f.finished).max()
    }
}

/// Whether the `len` bytes at `dst_addr` in host `dst`'s memory equal
/// those at `src_addr` in host `src`'s: compared directly, which is exact
/// and faster than hashing both sides. A synthetic destination answers
/// from what it checked on arrival: every byte placed once, as sent.
pub fn arrived_intact<T: SimTransport>(
    sim: &Simulator<T>,
    (src, src_addr): (HostId, u64),
    (dst, dst_addr): (HostId, u64),
    len: usize,
) -> bool {
    let dst_mem = &sim.host(dst).mem;
    if dst_mem.is_synthetic() {
        return dst_mem.placement(dst_addr, len).is_some_and(|p| p.intact());
    }
    let sent = sim.host(src).mem.get(src_addr, len);
    sent.is_some() && sent == dst_mem.get(dst_addr, len)
}

/// Fills `out` with flow `flow`'s data pattern.
pub fn fill_pattern(seed: u64, flow: usize, out: &mut [u8]) {
    memory::fill_pattern(seed, flow as u64, out);
}

struct FlowState {
    result: FlowResult,
    src_addr: u64,
    dst_addr: u64,
    conn: Option<ConnHandle>,
    messages: u64,
    posted: u64,
    completed: u64,
}

/// Where a run stands, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Virtual time.
    pub now: Instant,
    /// Events processed so far.
    pub events: u64,
    /// Flows finished (done, failed or refused).
    pub flows_done: usize,
    pub flows: usize,
}

/// Events between two calls of [`run_observed`]'s observer: often enough
/// for a report every second, rarely enough to cost nothing.
pub const OBSERVE_EVERY: u64 = 1 << 16;

/// Sets up memory, runs `flows` to completion (or the time limit) and
/// reports. Hosts' arenas are replaced.
pub fn run<T: SimTransport>(
    sim: &mut Simulator<T>,
    flows: &[Flow],
    config: &WorkloadConfig,
) -> Report {
    run_observed(sim, flows, config, |_| {})
}

/// [`run`], calling `observe` every [`OBSERVE_EVERY`] events (for
/// progress on long runs; it cannot change the run).
pub fn run_observed<T: SimTransport>(
    sim: &mut Simulator<T>,
    flows: &[Flow],
    config: &WorkloadConfig,
    mut observe: impl FnMut(&Progress),
) -> Report {
    let hosts = sim.host_count();
    let msg = u64::from(config.message_bytes.max(1));
    // Lay out each host's arena: sources, then destinations, per flow.
    let mut sizes = vec![0u64; hosts];
    let mut states: Vec<FlowState> = Vec::with_capacity(flows.len());
    for f in flows {
        let mut r = FlowResult {
            flow: *f,
            status: FlowStatus::Unfinished,
            finished: None,
            integrity_ok: None,
        };
        if f.src >= hosts || f.dst >= hosts || f.src == f.dst {
            r.status = FlowStatus::Refused("bad host pair");
        }
        let (mut src_addr, mut dst_addr) = (0, 0);
        if r.status == FlowStatus::Unfinished {
            src_addr = sizes[f.src];
            sizes[f.src] += f.bytes;
            dst_addr = sizes[f.dst];
            sizes[f.dst] += f.bytes;
        }
        states.push(FlowState {
            result: r,
            src_addr,
            dst_addr,
            conn: None,
            messages: f.bytes.div_ceil(msg),
            posted: 0,
            completed: 0,
        });
    }
    // Regions first, then the arenas they describe (registration reads
    // no memory; every arena starts at `ARENA_BASE`): only flows still to
    // run get their source data.
    let mut keys = vec![0u32; hosts];
    for (h, key) in keys.iter_mut().enumerate() {
        if sizes[h] > 0 {
            match sim.host_mut(h).transport.register_region(Region {
                base: ARENA_BASE,
                len: sizes[h],
                access: Access::ALL,
                pd: 0,
            }) {
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
    }
    // Each source range holds its flow's data pattern
    // (`Arena::with_patterns`: the same bytes as a fill after the arena is
    // made, and not written again where a reused buffer holds them); a
    // synthetic arena expects the same pattern in each destination range.
    let mut sources: Vec<Vec<PatternRange>> = vec![Vec::new(); hosts];
    let mut sinks: Vec<Vec<PatternRange>> = vec![Vec::new(); hosts];
    for (i, s) in states.iter().enumerate() {
        if s.result.status == FlowStatus::Unfinished {
            let f = s.result.flow;
            let range = |offset| PatternRange {
                offset,
                len: f.bytes,
                seed: config.data_seed,
                stream: i as u64,
            };
            sources[f.src].push(range(s.src_addr));
            sinks[f.dst].push(range(s.dst_addr));
        }
    }
    for h in 0..hosts {
        let len = usize::try_from(sizes[h]).unwrap_or(usize::MAX);
        sim.host_mut(h).mem = match config.memory {
            HostMemory::Stored => Arena::with_patterns(len, &sources[h]),
            HostMemory::Synthetic => Arena::synthetic(len, &sources[h], &sinks[h]),
        };
    }
    for (i, s) in states.iter_mut().enumerate() {
        if s.result.status != FlowStatus::Unfinished {
            continue;
        }
        s.src_addr += sim.host(s.result.flow.src).mem.base();
        s.dst_addr += sim.host(s.result.flow.dst).mem.base();
        sim.schedule_app(s.result.flow.start, i as u64);
    }

    let first_start = flows.iter().map(|f| f.start).min().unwrap_or(Instant::ZERO);
    let limit = first_start + config.time_limit;
    let mut open = states
        .iter()
        .filter(|s| s.result.status == FlowStatus::Unfinished)
        .count();
    let mut done = Vec::new();
    let mut steps = 0u64;
    while open > 0 {
        if sim.next_event_at().is_none_or(|t| t > limit) {
            break;
        }
        steps += 1;
        if steps.is_multiple_of(OBSERVE_EVERY) {
            observe(&Progress {
                now: sim.now(),
                events: sim.events_processed(),
                flows_done: flows.len() - open,
                flows: flows.len(),
            });
        }
        match sim.step() {
            None => break,
            Some(Step::App(token)) => {
                let i = token as usize;
                let f = states[i].result.flow;
                match sim.connect(f.src, f.dst) {
                    Ok(h) => {
                        states[i].conn = Some(h);
                        post_more(sim, &mut states[i], i, &keys, config);
                    }
                    Err(e) => states[i].result.status = FlowStatus::Refused(refusal(e)),
                }
                if states[i].result.status != FlowStatus::Unfinished {
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
                open -= 1;
            }
        }
    }

    let mut transport = TransportCounters::default();
    let (mut out_of_bounds, mut stray_bytes) = (0, 0);
    for h in 0..hosts {
        transport += sim.host(h).transport.counters();
        out_of_bounds += sim.host(h).mem.out_of_bounds;
        stray_bytes += sim.host(h).mem.stray_bytes();
    }
    Report {
        protocol: if hosts > 0 {
            sim.host(0).transport.name()
        } else {
            "none"
        },
        flows: states.into_iter().map(|s| s.result).collect(),
        end: sim.now(),
        fabric: sim.stats(),
        transport,
        out_of_bounds,
        stray_bytes,
    }
}

fn refusal(e: TransportError) -> &'static str {
    match e {
        TransportError::Retry => "queue full",
        TransportError::Refused(why) => why,
    }
}

fn on_completion<T: SimTransport>(
    sim: &mut Simulator<T>,
    s: &mut FlowState,
    i: usize,
    c: &HostCompletion,
    keys: &[u32],
    config: &WorkloadConfig,
) {
    if c.completion.status != Status::Success {
        s.result.status = FlowStatus::Failed(c.completion.status);
        return;
    }
    s.completed += 1;
    if s.completed < s.messages {
        post_more(sim, s, i, keys, config);
        return;
    }
    s.result.status = FlowStatus::Done;
    s.result.finished = Some(c.at);
    let f = s.result.flow;
    let len = f.bytes as usize;
    s.result.integrity_ok = Some(arrived_intact(
        sim,
        (f.src, s.src_addr),
        (f.dst, s.dst_addr),
        len,
    ));
}

/// Posts WRITEs until `messages_in_flight` are outstanding.
fn post_more<T: SimTransport>(
    sim: &mut Simulator<T>,
    s: &mut FlowState,
    i: usize,
    keys: &[u32],
    config: &WorkloadConfig,
) {
    let Some(conn) = s.conn else {
        return;
    };
    let f = s.result.flow;
    let msg = u64::from(config.message_bytes.max(1));
    while s.posted < s.messages && s.posted - s.completed < config.messages_in_flight as u64 {
        let offset = s.posted * msg;
        let len = msg.min(f.bytes - offset) as u32;
        let wr = WorkRequest {
            id: ((i as u64) << 32) | s.posted,
            op: Op::Write {
                remote: MemoryTarget {
                    key: keys[f.dst],
                    addr: s.dst_addr + offset,
                },
            },
            local: LocalBuf {
                key: keys[f.src],
                addr: s.src_addr + offset,
                len,
            },
        };
        match sim.post_send(f.src, conn, wr) {
            Ok(()) => s.posted += 1,
            // Retried on the next completion.
            Err(TransportError::Retry) => return,
            Err(TransportError::Refused(why)) => {
                s.result.status = FlowStatus::Refused(why);
                return;
            }
        }
    }
}
