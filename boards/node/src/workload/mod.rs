//! The workload task: a host application that reaches the engine only
//! through the host-interface rings and doorbells (`HostPort`) and its own
//! memory (`HostWindow`, the memory the engine DMAs to and from).
//!
//! Protocol between nodes, all in RDMA operations:
//! 1. both: register one region over all host memory (admin queue), ping
//!    the peers (ARP and ICMP through the engine loop and the fabric);
//! 2. a sender opens `streams` connections to its target, each with a
//!    receive posted for the target's *hello*; a receiver, for each
//!    connection it accepts, posts a receive for every SEND / WRITE_IMM
//!    that stream will make plus one for its *done* message, then SENDs
//!    the hello: its region key and the stream's slot (where in its memory
//!    that stream writes);
//! 3. each stream posts `count` messages (`mixed`: WRITE, WRITE_IMM, SEND,
//!    READ in turn), at most `depth` in flight, each source filled with a
//!    pattern derived from (seed, receiver, slot, message); it checks every
//!    READ against the receiver's pattern, then SENDs *done*;
//! 4. on *done* the receiver checks every byte that stream placed (WRITE
//!    and WRITE_IMM targets, SEND receive buffers) by hash against the
//!    pattern. Both print a `METAROCE-RESULT` line.
//!
//! Every stream is a connection of its own with its own sources, READ
//! sinks and, at the receiver, its own slot of WRITE targets and receive
//! buffers, so every connection's data is checked on its own.

use core::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, PeerAddr, RecvRequest, Region, Status,
    WorkRequest,
};
use metaroce_core::wire::MemoryTarget;
use metaroce_core::Instant;
use metaroce_platform::dma::HostWindow;
use smoltcp::wire::IpAddress;

use crate::config::{NodeConfig, WorkloadKind, MAX_PEERS, MAX_STREAMS};
use crate::engine::NodeHostPort;
use crate::println;
use crate::report::{Counters, Report};

mod memory;
mod verify;

use memory::{fill_pattern, pattern_seed, put_u32s, Layout};
use memory::{CTRL_STRIDE, DONE_RECV, DONE_SEND, HELLO_RECV, HELLO_SEND};
pub use memory::{HOST_BASE, HOST_MEMORY_LEN, MAX_SLOTS};

const HELLO_MAGIC: u32 = 0x4d52_4831; // "MRH1"
const DONE_MAGIC: u32 = 0x4d52_4431; // "MRD1"
const CTRL_MSG_LEN: u32 = 16;
/// wr_id of the streams' hello receives and of the receivers' done receives.
const HELLO_WR: u64 = u64::MAX - 1;
const DONE_WR: u64 = u64::MAX - 2;
/// imm of the done message.
const DONE_IMM: u32 = 0xD0E0_0000;
/// Pattern "kind" of READ sources.
const READ_SOURCE: u64 = 0xFF;
const PING_INTERVAL: Duration = Duration::from_millis(20);

/// The operation of message `i`.
fn op_of(kind: WorkloadKind, i: u32) -> Opcode {
    match kind {
        WorkloadKind::Mixed => {
            [Opcode::Write, Opcode::WriteImm, Opcode::Send, Opcode::Read][(i % 4) as usize]
        }
        WorkloadKind::Write => Opcode::Write,
        WorkloadKind::Send => Opcode::Send,
        WorkloadKind::Read => Opcode::Read,
    }
}

fn consumes_receive(op: Opcode) -> bool {
    matches!(op, Opcode::WriteImm | Opcode::Send)
}

/// What the workload asks of the node around it (connections, pings,
/// counters): the parts of a host driver that are not rings yet. Taken as
/// `dyn`: a few calls per step.
pub trait NodeServices {
    fn open(&mut self, now: Instant, peer_index: usize) -> Option<ConnHandle>;
    fn poll_accepted(&mut self) -> Option<ConnHandle>;
    /// Sends a ping to `peer_index`; the echo shows in `last_echo`.
    fn ping(&mut self, now: Instant, peer_index: usize, seq: u16);
    /// The last echo reply: (sequence, round trip in ns).
    fn last_echo(&self) -> Option<(u16, u64)>;
    fn counters(&self, now: Instant) -> Counters;
    /// This task accepted an incoming connection (a node whose cores
    /// share the incoming connections counts them node-wide).
    fn on_incoming_accepted(&mut self);
    /// Whether every connection this node expects has arrived (on this
    /// core or another).
    fn incoming_complete(&self) -> bool;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Register,
    Ping,
    Connect,
    Run,
    Linger(Instant),
}

/// One stream: a connection this task opened to its target, its messages
/// and their checks.
#[derive(Debug, Default, Clone, Copy)]
struct Sender {
    conn: Option<ConnHandle>,
    remote_key: Option<u32>,
    slot: u32,
    next: u32,
    completed: u32,
    failed: u32,
    reads_bad: u32,
    bytes: u64,
    done_posted: bool,
    done: bool,
}

/// One accepted connection: a remote stream's receives, hello and checks.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    conn: Option<ConnHandle>,
    /// Next message index whose receive is still to be posted.
    next_recv: u32,
    done_recv_posted: bool,
    hello_sent: bool,
    receives: u32,
    failed: u32,
    done: bool,
    bad: u32,
    bytes: u64,
}

pub struct Workload<'a> {
    cfg: NodeConfig,
    layout: Layout,
    port: NodeHostPort<'a>,
    phase: Phase,
    registration_posted: bool,
    key: Option<u32>,
    pinged: [bool; MAX_PEERS],
    last_ping: Option<Instant>,
    ping_seq: u16,
    ping_rtt_ns: u64,
    senders: [Sender; MAX_STREAMS],
    slots: [Slot; MAX_SLOTS],
    accepted: usize,
    completions: u64,
    started: Instant,
    first_data: Option<Instant>,
    last_data: Option<Instant>,
    next_progress: Instant,
    next_hint_sample: Instant,
    min_rate_hint: Option<u32>,
    memory_len: usize,
    /// Every expected connection has arrived (to this core or another).
    incoming_complete: bool,
}

impl<'a> Workload<'a> {
    /// `None` if the configured sizes do not fit host memory.
    /// `memory_len`: bytes of host memory from `HOST_BASE` this task owns.
    /// `cfg.expect` is the connections this task may accept (at most
    /// [`MAX_SLOTS`]), `cfg.streams` those it opens.
    pub fn new(
        cfg: &NodeConfig,
        port: NodeHostPort<'a>,
        now: Instant,
        memory_len: usize,
    ) -> Option<Self> {
        if usize::from(cfg.expect) > MAX_SLOTS || usize::from(cfg.streams) > MAX_STREAMS {
            return None;
        }
        Some(Workload {
            layout: Layout::new(cfg, memory_len)?,
            cfg: cfg.clone(),
            port,
            phase: Phase::Register,
            registration_posted: false,
            key: None,
            pinged: [false; MAX_PEERS],
            last_ping: None,
            ping_seq: 0,
            ping_rtt_ns: 0,
            senders: [Sender::default(); MAX_STREAMS],
            slots: [Slot::default(); MAX_SLOTS],
            accepted: 0,
            completions: 0,
            started: now,
            first_data: None,
            last_data: None,
            next_progress: now,
            next_hint_sample: now,
            min_rate_hint: None,
            memory_len,
            incoming_complete: cfg.expect == 0,
        })
    }

    fn is_sender(&self) -> bool {
        self.cfg.target.is_some()
    }

    fn is_receiver(&self) -> bool {
        self.cfg.expect > 0
    }

    /// This task's streams (none unless it has a target).
    fn streams(&self) -> &[Sender] {
        let n = if self.is_sender() {
            usize::from(self.cfg.streams)
        } else {
            0
        };
        &self.senders[..n]
    }

    fn accepted_slots(&self) -> &[Slot] {
        &self.slots[..self.accepted]
    }

    /// Peers this node pings: its target, and as a receiver all peers.
    fn ping_targets(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.cfg.peers.len())
            .filter(|&i| self.is_receiver() || self.cfg.target == Some(i as u8))
    }

    /// One step. Returns the report when the run is over.
    pub fn step(
        &mut self,
        now: Instant,
        mem: &mut HostWindow<'_>,
        node: &mut dyn NodeServices,
    ) -> Option<Report> {
        self.drain_completions(now, mem);
        self.incoming_complete = node.incoming_complete();
        match self.phase {
            Phase::Register => self.register(now, mem),
            Phase::Ping => {
                self.open_streams(now, node);
                self.ping(now, node);
            }
            Phase::Connect | Phase::Run => {
                self.connect(now, mem, node);
                self.run_streams(now, mem);
                if self.finished() {
                    defmt::info!("workload done; lingering");
                    self.phase =
                        Phase::Linger(now + Duration::from_millis(u64::from(self.cfg.linger_ms)));
                }
            }
            Phase::Linger(until) => {
                if now >= until {
                    return Some(self.report(now, node));
                }
            }
        }
        if self.is_receiver() && self.phase == Phase::Run && now >= self.next_hint_sample {
            // The fair-share hint while senders are active (it rises again
            // once they go quiet).
            self.next_hint_sample = now + Duration::from_millis(5);
            let hint = node.counters(now).rate_hint_mbps;
            if hint > 0 && self.accepted_slots().iter().any(|s| !s.done) {
                self.min_rate_hint = Some(self.min_rate_hint.map_or(hint, |m| m.min(hint)));
            }
        }
        if now >= self.next_progress {
            self.next_progress =
                now + Duration::from_millis(u64::from(self.cfg.progress_ms.max(50)));
            println!(
                "METAROCE-PROGRESS node={} phase={} bytes={} completions={}",
                self.cfg.node,
                self.phase_name(),
                self.bytes(),
                self.completions
            );
        }
        None
    }

    /// When the workload next needs to run even without completions.
    pub fn next_wake(&self) -> Instant {
        let mut t = self.next_progress;
        if self.phase == Phase::Ping {
            if let Some(last) = self.last_ping {
                t = t.min(last + PING_INTERVAL);
            }
        }
        if let Phase::Linger(until) = self.phase {
            t = t.min(until);
        }
        t
    }

    fn phase_name(&self) -> &'static str {
        match self.phase {
            Phase::Register => "register",
            Phase::Ping => "ping",
            Phase::Connect => "connect",
            Phase::Run => "run",
            Phase::Linger(_) => "done",
        }
    }

    fn bytes(&self) -> u64 {
        self.streams().iter().map(|s| s.bytes).sum::<u64>()
            + self.accepted_slots().iter().map(|s| s.bytes).sum::<u64>()
    }

    fn register(&mut self, now: Instant, mem: &mut HostWindow<'_>) {
        if self.key.is_some() {
            return;
        }
        if let Some(result) = self.port.poll_admin() {
            match result.result {
                Ok(key) => {
                    self.key = Some(key);
                    // The READ sources this node serves as a receiver.
                    if self.is_receiver() {
                        for i in 0..self.cfg.count {
                            let seed = pattern_seed(self.cfg.seed, self.cfg.node, READ_SOURCE);
                            fill_pattern(
                                mem,
                                self.layout.at(self.layout.read_source, 0, i),
                                self.layout.size,
                                seed,
                                i,
                            );
                        }
                    }
                    defmt::debug!("region registered, key {=u32:#x}", key);
                    self.phase = Phase::Ping;
                }
                Err(_) => {
                    println!("METAROCE-ERROR node={} registration refused", self.cfg.node);
                    self.phase = Phase::Linger(now);
                }
            }
            return;
        }
        let region = Region {
            base: HOST_BASE,
            len: self.memory_len as u64,
            access: Access::ALL,
            pd: 0,
        };
        if !self.registration_posted && self.port.register_region(1, region).is_ok() {
            self.registration_posted = true;
        }
    }

    fn ping(&mut self, now: Instant, node: &mut dyn NodeServices) {
        if let Some((seq, rtt)) = node.last_echo() {
            let peer = usize::from(seq / 1000);
            if peer < MAX_PEERS && !self.pinged[peer] {
                self.pinged[peer] = true;
                self.ping_rtt_ns = self.ping_rtt_ns.max(rtt);
                defmt::info!(
                    "peer {=usize} answered ping, rtt {=u64} us",
                    peer,
                    rtt / 1000
                );
            }
        }
        if self.ping_targets().all(|p| self.pinged[p]) {
            self.phase = Phase::Connect;
            return;
        }
        if self.last_ping.is_some_and(|t| now < t + PING_INTERVAL) {
            return;
        }
        self.last_ping = Some(now);
        self.ping_seq = self.ping_seq.wrapping_add(1) % 1000;
        for p in self.ping_targets() {
            if !self.pinged[p] {
                node.ping(now, p, p as u16 * 1000 + self.ping_seq);
            }
        }
    }

    /// A sender opens its streams' connections and posts the receive for
    /// each one's hello before it pings, so the hello (sent by the
    /// receiver once the ping answered, a round trip later) always finds
    /// it.
    fn open_streams(&mut self, now: Instant, node: &mut dyn NodeServices) {
        let (Some(key), Some(target)) = (self.key, self.cfg.target) else {
            return;
        };
        for k in 0..self.streams().len() {
            if self.senders[k].conn.is_some() || self.port.recv_free() == 0 {
                continue;
            }
            let Some(conn) = node.open(now, usize::from(target)) else {
                return;
            };
            self.senders[k].conn = Some(conn);
            let hello = RecvRequest {
                id: HELLO_WR,
                local: LocalBuf {
                    key,
                    addr: HELLO_RECV + CTRL_STRIDE * k as u64,
                    len: CTRL_MSG_LEN,
                },
            };
            let _ = self.port.post_recv(conn, hello);
            defmt::debug!("stream {=usize}: connecting to peer {=u8}", k, target);
        }
    }

    fn connect(&mut self, now: Instant, mem: &mut HostWindow<'_>, node: &mut dyn NodeServices) {
        let Some(key) = self.key else { return };
        self.open_streams(now, node);
        while let Some(conn) = node.poll_accepted() {
            if self.streams().iter().any(|s| s.conn == Some(conn))
                || self.accepted >= usize::from(self.cfg.expect)
            {
                continue;
            }
            self.slots[self.accepted].conn = Some(conn);
            node.on_incoming_accepted();
            defmt::debug!(
                "accepted connection {=u32} as slot {=usize}",
                conn.index,
                self.accepted
            );
            self.accepted += 1;
        }
        // Receives and hello for each accepted stream.
        for s in 0..self.accepted {
            let slot = self.slots[s];
            let Some(conn) = slot.conn else { continue };
            let mut next = slot.next_recv;
            while next < self.cfg.count && self.port.recv_free() > 0 {
                let op = op_of(self.cfg.workload, next);
                if consumes_receive(op) {
                    let addr = self.layout.at(self.layout.recv_bufs, s, next);
                    let rr = RecvRequest {
                        id: u64::from(next),
                        local: LocalBuf {
                            key,
                            addr,
                            len: self.cfg.size,
                        },
                    };
                    if self.port.post_recv(conn, rr).is_err() {
                        break;
                    }
                }
                next += 1;
            }
            self.slots[s].next_recv = next;
            if next < self.cfg.count {
                continue;
            }
            if !slot.done_recv_posted {
                let rr = RecvRequest {
                    id: DONE_WR,
                    local: LocalBuf {
                        key,
                        addr: DONE_RECV + CTRL_STRIDE * s as u64,
                        len: CTRL_MSG_LEN,
                    },
                };
                if self.port.post_recv(conn, rr).is_err() {
                    continue;
                }
                self.slots[s].done_recv_posted = true;
            }
            if !slot.hello_sent && self.port.send_free() > 0 {
                let addr = HELLO_SEND + CTRL_STRIDE * s as u64;
                put_u32s(
                    mem,
                    addr,
                    [HELLO_MAGIC, s as u32, key, u32::from(self.cfg.node)],
                );
                let wr = WorkRequest {
                    id: HELLO_WR,
                    op: Op::Send,
                    local: LocalBuf {
                        key,
                        addr,
                        len: CTRL_MSG_LEN,
                    },
                };
                if self.port.post_send(conn, wr).is_ok() {
                    self.slots[s].hello_sent = true;
                    defmt::debug!("hello sent to slot {=usize}", s);
                }
            }
        }
        if self.phase == Phase::Connect && self.streams().iter().all(|s| s.remote_key.is_some()) {
            self.phase = Phase::Run;
        }
    }

    fn run_streams(&mut self, now: Instant, mem: &mut HostWindow<'_>) {
        let (Some(key), Some(target)) = (self.key, self.cfg.target) else {
            return;
        };
        let receiver = target_node(&self.cfg, target);
        for k in 0..self.streams().len() {
            self.run_stream(now, mem, key, receiver, k);
        }
    }

    /// Posts what stream `k` may post: its messages up to `depth` in
    /// flight, then its done message.
    fn run_stream(
        &mut self,
        now: Instant,
        mem: &mut HostWindow<'_>,
        key: u32,
        receiver: u8,
        k: usize,
    ) {
        let stream = self.senders[k];
        let (Some(conn), Some(rkey)) = (stream.conn, stream.remote_key) else {
            return;
        };
        let l = self.layout;
        let slot = stream.slot as usize;
        let mut next = stream.next;
        while next < self.cfg.count
            && next - stream.completed < self.cfg.depth
            && self.port.send_free() > 0
        {
            let i = next;
            let op = op_of(self.cfg.workload, i);
            let local = LocalBuf {
                key,
                addr: l.at(l.src, k, i),
                len: self.cfg.size,
            };
            let remote = MemoryTarget {
                key: rkey,
                addr: l.at(l.write_sink, slot, i),
            };
            let wr = WorkRequest {
                id: u64::from(i),
                op: match op {
                    Opcode::Write => Op::Write { remote },
                    Opcode::WriteImm => Op::WriteImm { remote, imm: i },
                    Opcode::Send => Op::Send,
                    _ => Op::Read {
                        remote: MemoryTarget {
                            key: rkey,
                            addr: l.at(l.read_source, 0, i),
                        },
                    },
                },
                local: if op == Opcode::Read {
                    LocalBuf {
                        addr: l.at(l.read_sink, k, i),
                        ..local
                    }
                } else {
                    local
                },
            };
            if op != Opcode::Read {
                fill_pattern(
                    mem,
                    local.addr,
                    l.size,
                    pattern_seed(self.cfg.seed, receiver, slot as u64),
                    i,
                );
            }
            if self.port.post_send(conn, wr).is_err() {
                break;
            }
            self.first_data.get_or_insert(now);
            next += 1;
        }
        self.senders[k].next = next;
        if stream.completed == self.cfg.count && !stream.done_posted && self.port.send_free() > 0 {
            let addr = DONE_SEND + CTRL_STRIDE * k as u64;
            put_u32s(
                mem,
                addr,
                [
                    DONE_MAGIC,
                    u32::from(self.cfg.node),
                    self.cfg.count,
                    stream.failed,
                ],
            );
            let wr = WorkRequest {
                id: DONE_WR,
                op: Op::SendImm { imm: DONE_IMM },
                local: LocalBuf {
                    key,
                    addr,
                    len: CTRL_MSG_LEN,
                },
            };
            if self.port.post_send(conn, wr).is_ok() {
                self.senders[k].done_posted = true;
                defmt::debug!(
                    "stream {=usize}: all {=u32} messages complete; done sent",
                    k,
                    self.cfg.count
                );
            }
        }
    }

    /// Every expected connection arrived, and every one on this task is
    /// done.
    fn receiver_complete(&self) -> bool {
        self.incoming_complete && self.accepted_slots().iter().all(|s| s.done)
    }

    fn streams_complete(&self) -> bool {
        self.streams()
            .iter()
            .all(|s| s.done && s.completed == self.cfg.count)
    }

    fn finished(&self) -> bool {
        let sender_done = self.streams().iter().all(|s| s.done);
        let receiver_done = !self.is_receiver() || self.receiver_complete();
        sender_done && receiver_done && self.phase == Phase::Run
    }

    fn drain_completions(&mut self, now: Instant, mem: &mut HostWindow<'_>) {
        let _ = self.port.take_completion_doorbell();
        while let Some(c) = self.port.poll_completion() {
            self.completions += 1;
            self.on_completion(now, mem, c);
        }
    }

    fn on_completion(&mut self, now: Instant, mem: &mut HostWindow<'_>, c: Completion) {
        let ok = c.status == Status::Success;
        if !ok {
            defmt::warn!("completion wr {=u64} failed: {}", c.wr_id, c.status);
            println!("METAROCE-WARN node={} wr={} failed", self.cfg.node, c.wr_id);
        }
        if let Some(k) = self.streams().iter().position(|s| s.conn == Some(c.conn)) {
            self.on_stream_completion(now, mem, k, &c, ok);
            return;
        }
        let Some(s) = self
            .accepted_slots()
            .iter()
            .position(|s| s.conn == Some(c.conn))
        else {
            return;
        };
        match c.opcode {
            Opcode::Recv | Opcode::RecvWriteImm if c.wr_id == DONE_WR => {
                self.verify_slot(s, mem);
                self.slots[s].done = true;
                self.last_data = Some(now);
            }
            Opcode::Recv | Opcode::RecvWriteImm => {
                self.slots[s].receives += 1;
                self.first_data.get_or_insert(now);
                if !ok {
                    self.slots[s].failed += 1;
                }
            }
            _ => {}
        }
    }

    fn report(&self, now: Instant, node: &dyn NodeServices) -> Report {
        let counters = node.counters(now);
        let errors = self
            .streams()
            .iter()
            .map(|s| s.failed + s.reads_bad)
            .sum::<u32>()
            + self.accepted_slots().iter().map(|s| s.bad).sum::<u32>();
        let complete = self.streams_complete() && (!self.is_receiver() || self.receiver_complete());
        let ok = errors == 0 && complete && self.phase != Phase::Register;
        let role = match (self.is_sender(), self.is_receiver()) {
            (true, true) => "both",
            (true, false) => "sender",
            (false, true) => "receiver",
            (false, false) => "idle",
        };
        Report {
            node: self.cfg.node,
            role,
            streams: self.streams().len() as u32,
            accepted: self.accepted as u32,
            bytes: self.bytes(),
            start: self.first_data.unwrap_or(self.started),
            end: self.last_data.unwrap_or(now),
            completions: self.completions,
            errors,
            rate_hint_mbps: self.min_rate_hint.unwrap_or(counters.rate_hint_mbps),
            counters,
            ping_rtt_us: self.ping_rtt_ns / 1000,
            ok,
        }
    }
}

/// The node number of peer `index`, as the harness numbers them: peers are
/// listed in node order, skipping this node.
fn target_node(cfg: &NodeConfig, index: u8) -> u8 {
    if index < cfg.node {
        index
    } else {
        index + 1
    }
}

/// The transport address of peer `index`.
pub fn peer_addr(cfg: &NodeConfig, index: usize) -> Option<PeerAddr> {
    let peer = cfg.peers.get(index)?;
    Some(PeerAddr {
        ip: IpAddress::Ipv4(peer.ip),
        port: cfg.port,
    })
}
