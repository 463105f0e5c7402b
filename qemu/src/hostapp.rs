//! The workload as a host process (`metaroce-host-app`): one process per
//! emulated DPU drives it through the host library (`metaroce-verbs`) over
//! the DPU's shared memory, as an AI job on the host would. The protocol
//! between processes is the firmware workload's, in RDMA operations:
//!
//! 1. both register one region over their buffers;
//! 2. a receiver listens, accepts each sender, posts a receive for every
//!    SEND / WRITE_IMM that sender will make plus one for its *done*, then
//!    SENDs a *hello*: its region key and the sender's slot;
//! 3. a sender connects, posts the hello's receive at once, then posts
//!    `count` messages (`mixed`: WRITE, WRITE_IMM, SEND, READ in turn), at
//!    most `depth` in flight, each source filled with a pattern of (seed,
//!    receiver, slot, message); it checks every READ, then SENDs *done*;
//! 4. on *done* the receiver checks every byte that sender placed.
//!
//! Each prints one `METAROCE-RESULT` line with the firmware workload's
//! fields plus the host-side figures: operations per second and
//! post-to-completion latency p50/p99 (sender), and `host=PID`.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use metaroce_platform::random::{RandomSource, XorShiftRng};
use metaroce_verbs::{
    Access, CompletionQueue, Conn, Device, MemoryRegion, Opcode, OpenOptions, QueuePair, RecvWr,
    Remote, SendOp, SendWr, Status, WorkCompletion,
};

/// What one host process does.
#[derive(Debug, Clone)]
pub struct HostAppOptions {
    pub shm: std::path::PathBuf,
    /// The host interface is this window of `shm`, `(offset, length)`:
    /// the Elba twin's `[host_interface]` in its RAM file. `None`: the
    /// whole file (an ivshmem BAR2).
    pub shm_window: Option<(u64, u64)>,
    pub node: u8,
    /// The receiver's address (makes this process a sender).
    pub target: Option<(u8, Ipv4Addr, u16)>,
    /// Senders this process receives from.
    pub expect: u8,
    pub workload: String,
    pub size: u32,
    pub count: u32,
    pub depth: u32,
    pub seed: u64,
    pub timeout: Duration,
}

const HELLO_MAGIC: u32 = 0x4d52_4831;
const DONE_MAGIC: u32 = 0x4d52_4431;
const CTRL: u32 = 16;
const HELLO_WR: u64 = u64::MAX - 1;
const DONE_WR: u64 = u64::MAX - 2;
const DONE_IMM: u32 = 0xD0E0_0000;
const READ_SOURCE: u64 = 0xFF;
const CTRL_LEN: u64 = 64 * 1024;

/// Bytes a process's buffers take for `senders` senders (the harness sizes
/// the shared memory from it).
pub fn window_needed(size: u32, count: u32, senders: u32) -> u64 {
    let area = u64::from(size) * u64::from(count);
    CTRL_LEN + area * (3 + 2 * u64::from(senders.max(1)))
}

fn op_of(kind: &str, i: u32) -> Opcode {
    match kind {
        "write" => Opcode::Write,
        "send" => Opcode::Send,
        "read" => Opcode::Read,
        _ => [Opcode::Write, Opcode::WriteImm, Opcode::Send, Opcode::Read][(i % 4) as usize],
    }
}

fn consumes_receive(op: Opcode) -> bool {
    matches!(op, Opcode::WriteImm | Opcode::Send)
}

fn pattern_seed(seed: u64, receiver: u8, slot: u64, i: u32) -> u64 {
    seed ^ (u64::from(receiver) << 56) ^ (slot << 40) ^ u64::from(i)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut rng = XorShiftRng::new(seed);
    for chunk in out.chunks_mut(256) {
        rng.fill_bytes(chunk);
    }
    out
}

/// Buffer addresses (identical in every process, relative to its region).
#[derive(Debug, Clone, Copy)]
struct Layout {
    size: u64,
    count: u64,
    ctrl: u64,
    src: u64,
    read_sink: u64,
    read_source: u64,
    write_sink: u64,
    recv_bufs: u64,
}

impl Layout {
    fn new(base: u64, o: &HostAppOptions) -> Layout {
        let (size, count) = (u64::from(o.size), u64::from(o.count));
        let area = size * count;
        let slots = u64::from(o.expect.max(1));
        let src = base + CTRL_LEN;
        Layout {
            size,
            count,
            ctrl: base,
            src,
            read_sink: src + area,
            read_source: src + 2 * area,
            write_sink: src + 3 * area,
            recv_bufs: src + 3 * area + area * slots,
        }
    }

    fn at(&self, base: u64, slot: u32, i: u32) -> u64 {
        base + u64::from(slot) * self.size * self.count + u64::from(i) * self.size
    }
}

/// The result of one host process.
#[derive(Debug, Default)]
struct Report {
    bytes: u64,
    completions: u64,
    errors: u64,
    first_data: Option<Instant>,
    last_data: Option<Instant>,
    latencies_us: Vec<f64>,
    ops: u64,
    min_hint: Option<u64>,
}

fn ctrl_words(words: [u32; 4]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_be_bytes()).collect()
}

fn wait(cq: &mut CompletionQueue, deadline: Instant) -> Result<WorkCompletion, String> {
    loop {
        if let Some(c) = cq.poll_one() {
            return Ok(c);
        }
        if Instant::now() > deadline {
            return Err("timed out waiting for a completion".into());
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Runs the process's part; prints its result line; `Ok(true)` when the
/// integrity checks passed.
pub fn run(o: &HostAppOptions) -> Result<bool, String> {
    let options = OpenOptions {
        window: o.shm_window,
        // The DPU may still be booting: wait for it as long as for the run.
        ready_timeout: o.timeout,
        ..OpenOptions::default()
    };
    let mut dev =
        Device::open_with(&o.shm, options).map_err(|e| format!("open {}: {e}", o.shm.display()))?;
    let info = dev.info();
    let base = dev
        .alloc(window_needed(o.size, o.count, u32::from(o.expect)), 4096)
        .map_err(|e| format!("size x count does not fit the window: {e}"))?;
    let l = Layout::new(base, o);
    let len = window_needed(o.size, o.count, u32::from(o.expect));
    let mr = dev
        .register(base, len, Access::ALL)
        .map_err(|e| format!("register: {e}"))?;
    let mut cq = dev
        .completion_queue()
        .map_err(|e| format!("completion queue: {e}"))?;
    let deadline = Instant::now() + o.timeout;
    let mut report = Report::default();
    eprintln!(
        "host-app pid {} drives node {} (queue set {}, pd {}, window {:#x}+{:#x})",
        std::process::id(),
        info.node,
        info.queue_set,
        info.pd,
        info.window_addr,
        info.window_len
    );
    if o.expect > 0 {
        receive(&mut dev, &mut cq, o, &l, mr, deadline, &mut report)?;
    }
    if let Some(target) = o.target {
        send(&mut dev, &mut cq, o, &l, mr, target, deadline, &mut report)?;
    }
    let counters = dev.counters().map_err(|e| format!("counters: {e}"))?;
    let ok = report.errors == 0;
    let elapsed_us = match (report.first_data, report.last_data) {
        (Some(a), Some(b)) => b.duration_since(a).as_micros().max(1) as u64,
        _ => 1,
    };
    let mut lat = report.latencies_us.clone();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    let role = match (o.target.is_some(), o.expect > 0) {
        (true, true) => "both",
        (true, false) => "sender",
        (false, true) => "receiver",
        _ => "idle",
    };
    println!(
        "METAROCE-RESULT node={} role={role} transport=metaroce bytes={} elapsed_us={elapsed_us} goodput_mbps={:.2} completions={} errors={} retransmits={} timeouts={} ce={} max_in_flight={} rate_hint_mbps={} host={} ops_per_s={:.0} lat_p50_us={:.0} lat_p99_us={:.0} integrity={}",
        o.node,
        report.bytes,
        report.bytes as f64 * 8.0 / elapsed_us as f64,
        report.completions,
        report.errors,
        counters.transport_retransmissions,
        counters.transport_timeouts,
        counters.transport_ce_received,
        counters.transport_max_in_flight,
        report.min_hint.unwrap_or(counters.device_rate_hint_mbps),
        std::process::id(),
        report.ops as f64 * 1e6 / elapsed_us as f64,
        pct(0.50),
        pct(0.99),
        if ok { "OK" } else { "FAIL" }
    );
    Ok(ok)
}

#[allow(clippy::too_many_arguments)]
fn send(
    dev: &mut Device,
    cq: &mut CompletionQueue,
    o: &HostAppOptions,
    l: &Layout,
    mr: MemoryRegion,
    (receiver, ip, port): (u8, Ipv4Addr, u16),
    deadline: Instant,
    report: &mut Report,
) -> Result<(), String> {
    // The receiver's process may not listen yet: its DPU then refuses the
    // connection (the hello's receive is flushed), and the sender tries
    // again, as a client retries a refused TCP connection.
    let (conn, slot, rkey) = loop {
        let conn = dev
            .connect_start(SocketAddr::new(ip.into(), port))
            .map_err(|e| format!("connect: {e}"))?;
        dev.queue_pair(conn)
            .post_recv(&[RecvWr {
                wr_id: HELLO_WR,
                local: Sge(mr, l.ctrl, CTRL),
            }])
            .map_err(|e| format!("post hello receive: {e}"))?;
        let c = loop {
            let c = wait(cq, deadline)?;
            report.completions += 1;
            if c.wr_id == HELLO_WR {
                break c;
            }
        };
        if c.status.is_success() {
            let mut b = [0u8; 16];
            dev.read(l.ctrl, &mut b).map_err(|e| e.to_string())?;
            let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            if w(0) != HELLO_MAGIC {
                return Err("bad hello".into());
            }
            break (conn, w(4), w(8));
        }
        if c.status != Status::Flushed || Instant::now() > deadline {
            return Err(format!("hello receive failed: {:?}", c.status));
        }
        // Wait for the end of the refused connection, give it back, retry.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            if let Some(
                metaroce_verbs::Event::Closed { conn: c, .. }
                | metaroce_verbs::Event::Failed { conn: c, .. },
            ) = dev.poll_event()
            {
                if c == conn {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = dev.release(conn);
        std::thread::sleep(Duration::from_millis(50));
    };
    let qp = dev.queue_pair(conn);
    let mut posted_at: Vec<Option<Instant>> = vec![None; o.count as usize];
    let (mut next, mut in_flight, mut completed) = (0u32, 0u32, 0u32);
    while completed < o.count {
        while next < o.count && in_flight < o.depth && qp.send_free() > 0 {
            let i = next;
            let op = op_of(&o.workload, i);
            let local = Sge(mr, l.at(l.src, 0, i), o.size);
            let target = Remote {
                addr: l.at(l.write_sink, slot, i),
                key: rkey,
            };
            let (op, local) = match op {
                Opcode::Write => (SendOp::Write(target), local),
                Opcode::WriteImm => (SendOp::WriteImm(target, i), local),
                Opcode::Send => (SendOp::Send, local),
                _ => (
                    SendOp::Read(Remote {
                        addr: l.at(l.read_source, 0, i),
                        key: rkey,
                    }),
                    Sge(mr, l.at(l.read_sink, 0, i), o.size),
                ),
            };
            if !matches!(op, SendOp::Read(_)) {
                let data = pattern(
                    pattern_seed(o.seed, receiver, u64::from(slot), i),
                    o.size as usize,
                );
                dev.write(local.addr, &data).map_err(|e| e.to_string())?;
            }
            let wr = SendWr {
                wr_id: u64::from(i),
                op,
                local,
            };
            if qp.post_send(&[wr]).is_err() {
                break;
            }
            let now = Instant::now();
            posted_at[i as usize] = Some(now);
            report.first_data.get_or_insert(now);
            next += 1;
            in_flight += 1;
        }
        let c = wait(cq, deadline)?;
        report.completions += 1;
        let now = Instant::now();
        let Some(Some(at)) = posted_at.get(c.wr_id as usize).copied() else {
            continue;
        };
        in_flight -= 1;
        completed += 1;
        report.ops += 1;
        report.last_data = Some(now);
        report
            .latencies_us
            .push(now.duration_since(at).as_secs_f64() * 1e6);
        if c.status != Status::Success {
            report.errors += 1;
            eprintln!(
                "node {}: message {} failed: {:?}",
                o.node, c.wr_id, c.status
            );
            continue;
        }
        report.bytes += u64::from(o.size);
        if c.opcode == Opcode::Read {
            let i = c.wr_id as u32;
            let want = pattern(
                pattern_seed(o.seed, receiver, READ_SOURCE, i),
                o.size as usize,
            );
            let mut got = vec![0u8; o.size as usize];
            dev.read(l.at(l.read_sink, 0, i), &mut got)
                .map_err(|e| e.to_string())?;
            if got != want {
                report.errors += 1;
                eprintln!("node {}: READ {i} corrupt", o.node);
            }
        }
    }
    dev.write(
        l.ctrl + 64,
        &ctrl_words([DONE_MAGIC, u32::from(o.node), o.count, 0]),
    )
    .map_err(|e| e.to_string())?;
    let done = SendWr {
        wr_id: DONE_WR,
        op: SendOp::SendImm(DONE_IMM),
        local: Sge(mr, l.ctrl + 64, CTRL),
    };
    qp.post_send(&[done])
        .map_err(|e| format!("post done: {e}"))?;
    loop {
        let c = wait(cq, deadline)?;
        report.completions += 1;
        if c.wr_id == DONE_WR {
            if !c.status.is_success() {
                report.errors += 1;
            }
            return Ok(());
        }
    }
}

/// A local buffer in `mr`.
#[allow(non_snake_case)]
fn Sge(mr: MemoryRegion, addr: u64, len: u32) -> metaroce_verbs::Sge {
    metaroce_verbs::Sge {
        addr,
        len,
        key: mr.key,
    }
}

fn receive(
    dev: &mut Device,
    cq: &mut CompletionQueue,
    o: &HostAppOptions,
    l: &Layout,
    mr: MemoryRegion,
    deadline: Instant,
    report: &mut Report,
) -> Result<(), String> {
    for i in 0..o.count {
        let data = pattern(
            pattern_seed(o.seed, o.node, READ_SOURCE, i),
            o.size as usize,
        );
        dev.write(l.at(l.read_source, 0, i), &data)
            .map_err(|e| e.to_string())?;
    }
    dev.listen().map_err(|e| format!("listen: {e}"))?;
    let mut conns: Vec<(Conn, u32, bool)> = Vec::new();
    for s in 0..u32::from(o.expect) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (conn, peer) = dev.accept(left).map_err(|e| format!("accept: {e}"))?;
        eprintln!("node {}: accepted {peer} as slot {s}", o.node);
        // Every receive of the slot, posted as one list (one doorbell per
        // batch that fits).
        let qp = dev.queue_pair(conn);
        let mut wrs: Vec<RecvWr> = (0..o.count)
            .filter(|&i| consumes_receive(op_of(&o.workload, i)))
            .map(|i| RecvWr {
                wr_id: u64::from(i),
                local: Sge(mr, l.at(l.recv_bufs, s, i), o.size),
            })
            .collect();
        wrs.push(RecvWr {
            wr_id: DONE_WR,
            local: Sge(mr, l.ctrl + 4096 + 64 * u64::from(s), CTRL),
        });
        post_recv_retrying(&qp, cq, &wrs, deadline, report)?;
        let hello_at = l.ctrl + 8192 + 64 * u64::from(s);
        dev.write(
            hello_at,
            &ctrl_words([HELLO_MAGIC, s, mr.key, u32::from(o.node)]),
        )
        .map_err(|e| e.to_string())?;
        let hello = SendWr {
            wr_id: HELLO_WR,
            op: SendOp::Send,
            local: Sge(mr, hello_at, CTRL),
        };
        qp.post_send(&[hello])
            .map_err(|e| format!("post hello: {e}"))?;
        conns.push((conn, s, false));
    }
    let mut next_hint = Instant::now();
    while conns.iter().any(|c| !c.2) {
        if Instant::now() >= next_hint {
            next_hint = Instant::now() + Duration::from_millis(5);
            if let Ok(c) = dev.counters() {
                if c.device_rate_hint_mbps > 0 {
                    report.min_hint = Some(
                        report
                            .min_hint
                            .map_or(c.device_rate_hint_mbps, |m| m.min(c.device_rate_hint_mbps)),
                    );
                }
            }
        }
        let Some(c) = cq.poll_one() else {
            if Instant::now() > deadline {
                return Err("timed out waiting for the senders".into());
            }
            std::thread::sleep(Duration::from_micros(50));
            continue;
        };
        report.completions += 1;
        let now = Instant::now();
        let Some(entry) = conns.iter_mut().find(|e| e.0 == c.conn) else {
            continue;
        };
        if matches!(c.opcode, Opcode::Recv | Opcode::RecvWriteImm) {
            report.first_data.get_or_insert(now);
            report.last_data = Some(now);
            if !c.status.is_success() {
                report.errors += 1;
            }
            if c.wr_id == DONE_WR {
                let s = entry.1;
                entry.2 = true;
                verify_slot(dev, o, l, s, report)?;
            }
        } else if c.wr_id == HELLO_WR && !c.status.is_success() {
            report.errors += 1;
        }
    }
    Ok(())
}

/// Posts `wrs` in order, as many per doorbell as fit, polling
/// completions while the ring is full.
fn post_recv_retrying(
    qp: &QueuePair,
    cq: &mut CompletionQueue,
    mut wrs: &[RecvWr],
    deadline: Instant,
    report: &mut Report,
) -> Result<(), String> {
    loop {
        let error = match qp.post_recv(wrs) {
            Ok(()) => return Ok(()),
            Err(e) => {
                wrs = &wrs[e.posted..];
                e.error
            }
        };
        match error {
            metaroce_verbs::Error::QueueFull if Instant::now() < deadline => {
                // Room comes back as completions are polled.
                if let Some(c) = cq.poll_one() {
                    report.completions += 1;
                    if !c.status.is_success() {
                        report.errors += 1;
                    }
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            e => return Err(format!("post receive: {e}")),
        }
    }
}

/// Checks every byte the sender of slot `s` placed.
fn verify_slot(
    dev: &mut Device,
    o: &HostAppOptions,
    l: &Layout,
    s: u32,
    report: &mut Report,
) -> Result<(), String> {
    let mut got = vec![0u8; o.size as usize];
    for i in 0..o.count {
        let addr = match op_of(&o.workload, i) {
            Opcode::Write | Opcode::WriteImm => l.at(l.write_sink, s, i),
            Opcode::Send => l.at(l.recv_bufs, s, i),
            _ => continue,
        };
        dev.read(addr, &mut got).map_err(|e| e.to_string())?;
        let want = pattern(
            pattern_seed(o.seed, o.node, u64::from(s), i),
            o.size as usize,
        );
        if got == want {
            report.bytes += u64::from(o.size);
        } else {
            report.errors += 1;
            eprintln!("node {}: slot {s} message {i} corrupt", o.node);
        }
    }
    Ok(())
}
