//! Two endpoints in one process on a virtual clock, joined without a
//! channel: the sender's packets go straight to the receiver's
//! `handle_packet`, its ACKs straight back. They may hold many connections
//! between them, of which some send and the rest stay idle (what a DPU's
//! table looks like: most connections quiet at any moment).
//!
//! One round: the sender emits everything it may (up to a ring of transmit
//! buffers), the receiver takes them in as one receive batch and then
//! sends its replies, the sender takes the replies in and yields
//! completions, then both answer `poll_timeout` and run any timer that is
//! due. This follows the call order of the platform's engine loop (a
//! receive burst, then transmit) and keeps the send queue full, so several
//! packets are in flight as in a real pipeline.
//!
//! With [`Pair::set_crc_offload`] the CRC trailer is left to a device, as
//! the platform's engine does behind a device with CRC offload: the sender
//! leaves it zero (`Endpoint::seal_transmit`) and the receiver takes it as
//! verified (`CrcVerdict::Good`).

use std::fmt;
use std::time::{Duration, Instant as WallClock};

use metaroce_core::api::{
    Access, ConnHandle, LocalBuf, Memory, Op, PeerAddr, Region, RxMeta, Status, Transmit,
    WorkRequest,
};
use metaroce_core::config::CcAlgorithm;
use metaroce_core::wire::{CrcVerdict, MemoryTarget, CRC_LEN, DEFAULT_UDP_PORT, HEADER_LEN};
use metaroce_core::{
    finish_packet, CommandError, Config, Endpoint, Event, Heap, Instant, Layout, Shard,
};
use smoltcp::wire::{IpAddress, Ipv4Address};

/// Payload of every WRITE: one packet at the default MTU.
pub const PAYLOAD: usize = 4096;

/// The endpoint measured: connections of up to 16 paths (the default),
/// on heap storage sized for the run.
pub type BenchEndpoint = Endpoint<Heap, 16>;

/// WRITEs each sending connection keeps posted.
const PER_CONN_OUTSTANDING: u64 = 32;

/// Room for the largest header (`HEADER_LEN` + 56), a full payload and the
/// CRC trailer.
const PACKET_BUF: usize = HEADER_LEN + 64 + PAYLOAD + CRC_LEN;
/// Packets the sender may emit in one round.
const TX_RING: usize = 256;
/// WRITEs rotate over this many 4 KiB slots of the receiver's region.
const REMOTE_SLOTS: u64 = 64;
const LOCAL_BASE: u64 = 0x1000_0000;
const REMOTE_BASE: u64 = 0x2000_0000;
/// Rounds in a row without a packet, completion or timer before a run is
/// declared stuck.
const STALL_ROUNDS: u32 = 10_000;
/// Rounds a handshake may take, per connection opened.
const HANDSHAKE_ROUNDS: u32 = 1_000;
/// Connections opened per round while establishing many.
const CONNECTS_PER_ROUND: u32 = 64;

const SENDER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const RECEIVER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// Why a run could not finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchError {
    /// The engine refused a command.
    Command(CommandError),
    /// The handshake did not complete.
    Handshake,
    /// A WRITE completed with an error status.
    Completion(Status),
    /// Nothing happened for many rounds and no timer is pending.
    Stalled,
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Command(e) => write!(f, "the engine refused a command: {e:?}"),
            BenchError::Handshake => f.write_str("the handshake did not complete"),
            BenchError::Completion(s) => write!(f, "a WRITE completed with {s:?}"),
            BenchError::Stalled => f.write_str("the transfer stalled"),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<CommandError> for BenchError {
    fn from(e: CommandError) -> BenchError {
        BenchError::Command(e)
    }
}

/// Memory that records placements instead of copying: `write` notes the
/// address and length, `read` leaves the buffer as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlacementLog {
    /// `write` calls.
    pub placements: u64,
    /// Bytes those calls would have placed.
    pub bytes: u64,
    /// Lowest address written (`u64::MAX` before the first write).
    pub lowest: u64,
    /// One past the highest byte written.
    pub end: u64,
}

impl PlacementLog {
    fn new() -> PlacementLog {
        PlacementLog {
            lowest: u64::MAX,
            ..PlacementLog::default()
        }
    }
}

impl Memory for PlacementLog {
    fn write(&mut self, addr: u64, data: &[u8]) {
        let len = data.len() as u64;
        self.placements += 1;
        self.bytes += len;
        self.lowest = self.lowest.min(addr);
        self.end = self.end.max(addr.saturating_add(len));
    }

    fn read(&mut self, _addr: u64, _out: &mut [u8]) {}
}

/// What one run moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Data packets (with payload) from sender to receiver.
    pub data_packets: u64,
    /// Packets from receiver to sender (ACKs, NAKs, control).
    pub replies: u64,
    /// Sender packets without payload (keep-alives, control).
    pub other_packets: u64,
    /// Successful WRITE completions.
    pub completions: u64,
}

/// Wall-clock time spent in each part of the cycle (only when asked for:
/// reading the clock costs a few ns per phase).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// `post_send` refills.
    pub post: Duration,
    /// Sender `poll_transmit` and the CRC trailer.
    pub sender_tx: Duration,
    /// Receiver `handle_packet` (CRC check, placement), its replies out.
    pub receiver: Duration,
    /// Sender `handle_packet` of the replies, completions, events.
    pub sender_rx: Duration,
    /// `poll_timeout` of both and any due `handle_timeout`.
    pub timers: Duration,
}

/// A packet waiting in a ring buffer: its length and receive metadata.
#[derive(Debug, Clone, Copy)]
struct Queued {
    len: usize,
    meta: RxMeta,
}

/// A sender and a receiver endpoint, connected, on one virtual clock.
#[derive(Debug)]
pub struct Pair {
    now: Instant,
    /// Virtual time per packet the sender emits.
    step: Duration,
    sender: Box<BenchEndpoint>,
    receiver: Box<BenchEndpoint>,
    sender_mem: PlacementLog,
    receiver_mem: PlacementLog,
    /// The connections that send, and the WRITEs each has outstanding
    /// (by the sender's slot index).
    sending: Vec<ConnHandle>,
    outstanding: Vec<u64>,
    next_sender: usize,
    local: LocalBuf,
    remote: MemoryTarget,
    tx_ring: Vec<Vec<u8>>,
    tx_queued: Vec<Queued>,
    reply_ring: Vec<Vec<u8>>,
    reply_queued: Vec<Queued>,
    sender_connected: u32,
    receiver_connected: u32,
    posted: u64,
    completed: u64,
    counts: RunCounts,
    /// Length of the last data packet and of the last reply, CRC included.
    last_data_len: usize,
    last_reply_len: usize,
    /// The CRC trailer is left to a device (see the module comment).
    crc_offload: bool,
}

/// Default configuration with a link so fast that pacing never waits.
pub fn bench_config() -> Config {
    Config {
        cc: CcAlgorithm::Fixed,
        link_rate_mbps: u32::MAX,
        // One peer opens the whole table as fast as it can: the scale rows
        // measure the table, not the per-source limits.
        source_limits: metaroce_core::config::SourceLimits::NONE,
        ..Config::default()
    }
}

fn meta(ip: Ipv4Address, port: u16) -> RxMeta {
    RxMeta {
        source: PeerAddr {
            ip: IpAddress::Ipv4(ip),
            port,
        },
        ce: false,
    }
}

/// Gathers the payload behind the headers in `buf` and writes the CRC
/// trailer, or leaves it zero for a device (`offload`). The packet length.
fn finish(
    offload: bool,
    endpoint: &BenchEndpoint,
    t: &Transmit,
    buf: &mut [u8],
    mem: &mut PlacementLog,
) -> usize {
    if !offload {
        return finish_packet(t, buf, mem);
    }
    let (hl, len) = (t.header_len, t.packet_len());
    if let Some(p) = t.payload {
        mem.read(p.addr, &mut buf[hl..hl + p.len as usize]);
    }
    endpoint.seal_transmit(t, &mut buf[..len]);
    len
}

/// What the receiving device reports about each trailer.
fn verdict(offload: bool) -> CrcVerdict {
    if offload {
        CrcVerdict::Good
    } else {
        CrcVerdict::NotChecked
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The storage of a bench endpoint with `connections`: pools for 64
/// senders with full windows.
pub fn bench_layout(connections: u32) -> Layout {
    Layout {
        inflight_records: 64 * 256,
        ..Layout::for_connections(connections)
    }
}

impl Pair {
    /// Two endpoints with [`bench_config`], regions registered, one
    /// connection between them.
    pub fn connected() -> Result<Pair, BenchError> {
        Pair::with_connections(1, 1)
    }

    /// Two endpoints with `total` connections established between them,
    /// the first `sending` of which carry the WRITEs.
    pub fn with_connections(total: u32, sending: u32) -> Result<Pair, BenchError> {
        Pair::shard(
            total,
            sending,
            Shard {
                first_slot: 0,
                table_slots: total,
            },
        )
    }

    /// Like [`Pair::with_connections`], but both endpoints are `shard` of
    /// a connection table split between several (one per core or thread):
    /// their connection ids name the shard, as in a sharded node.
    pub fn shard(total: u32, sending: u32, shard: Shard) -> Result<Pair, BenchError> {
        Pair::build(total, sending, shard, bench_config())
    }

    /// Like [`Pair::connected`], with `paths` logical paths per connection
    /// (1 to 16).
    pub fn connected_paths(paths: u16) -> Result<Pair, BenchError> {
        let config = Config {
            paths,
            ..bench_config()
        };
        let shard = Shard {
            first_slot: 0,
            table_slots: 1,
        };
        Pair::build(1, 1, shard, config)
    }

    fn build(total: u32, sending: u32, shard: Shard, config: Config) -> Result<Pair, BenchError> {
        let layout = bench_layout(total);
        // Every shard its own seeds, as every core of a node has.
        let seed = |n: u64| metaroce_core::rng::seed_from_u64(n ^ u64::from(shard.first_slot) << 8);
        let endpoint = |n| {
            Box::new(BenchEndpoint::new_shard(
                config,
                layout.heap_storage(),
                seed(n),
                shard,
            ))
        };
        let mut sender = endpoint(1);
        let mut receiver = endpoint(2);
        let local_key = sender.register_region(Region {
            base: LOCAL_BASE,
            len: PAYLOAD as u64,
            access: Access::ALL,
            pd: 0,
        })?;
        let remote_key = receiver.register_region(Region {
            base: REMOTE_BASE,
            len: REMOTE_SLOTS * PAYLOAD as u64,
            access: Access::REMOTE_WRITE,
            pd: 0,
        })?;
        let now = Instant::from_micros(1);
        let peer = PeerAddr {
            ip: IpAddress::Ipv4(RECEIVER_IP),
            port: DEFAULT_UDP_PORT,
        };
        // A constant payload pattern: the bytes no `Memory::read` overwrites.
        let packet = vec![0xA5u8; PACKET_BUF];
        // Handles carry their index in the whole table.
        let capacity =
            (shard.first_slot as usize + sender.capacity()).max(shard.table_slots as usize);
        let mut pair = Pair {
            now,
            step: Duration::from_nanos(100),
            sender,
            receiver,
            sender_mem: PlacementLog::new(),
            receiver_mem: PlacementLog::new(),
            sending: Vec::new(),
            outstanding: vec![0; capacity],
            next_sender: 0,
            local: LocalBuf {
                key: local_key,
                addr: LOCAL_BASE,
                len: PAYLOAD as u32,
            },
            remote: MemoryTarget {
                key: remote_key,
                addr: REMOTE_BASE,
            },
            tx_ring: vec![packet.clone(); TX_RING],
            tx_queued: Vec::with_capacity(TX_RING),
            reply_ring: vec![packet; TX_RING],
            reply_queued: Vec::with_capacity(TX_RING),
            sender_connected: 0,
            receiver_connected: 0,
            posted: 0,
            completed: 0,
            counts: RunCounts::default(),
            last_data_len: 0,
            last_reply_len: 0,
            crc_offload: false,
        };
        let mut opened = 0u32;
        let mut rounds = 0u64;
        while pair.sender_connected < total || pair.receiver_connected < total {
            let batch = CONNECTS_PER_ROUND.min(total - opened);
            for _ in 0..batch {
                let h = pair.sender.connect(pair.now, peer, 0)?;
                if pair.sending.len() < sending as usize {
                    pair.sending.push(h);
                }
                opened += 1;
            }
            pair.round(None)?;
            rounds += 1;
            if rounds > u64::from(HANDSHAKE_ROUNDS) * u64::from(total.max(1)) {
                return Err(BenchError::Handshake);
            }
        }
        Ok(pair)
    }

    /// Leaves the CRC trailer to a device from now on (`true`), or
    /// computes and checks it in software (`false`, the default).
    pub fn set_crc_offload(&mut self, offload: bool) {
        self.crc_offload = offload;
    }

    /// Connections established at each end.
    pub fn established(&self) -> (u32, u32) {
        (self.sender_connected, self.receiver_connected)
    }

    /// The two endpoints, for inspection.
    pub fn endpoints(&self) -> (&BenchEndpoint, &BenchEndpoint) {
        (&self.sender, &self.receiver)
    }

    /// Where the receiver would have placed payload so far.
    pub fn receiver_placements(&self) -> PlacementLog {
        self.receiver_mem
    }

    /// Where the sender would have placed payload so far (nothing, for WRITEs).
    pub fn sender_placements(&self) -> PlacementLog {
        self.sender_mem
    }

    /// Length of the last data packet and of the last reply (headers,
    /// payload and CRC trailer): what each CRC-32 runs over.
    pub fn packet_lens(&self) -> (usize, usize) {
        (self.last_data_len, self.last_reply_len)
    }

    /// The receiver region's bounds `[start, end)`.
    pub fn remote_region(&self) -> (u64, u64) {
        (REMOTE_BASE, REMOTE_BASE + REMOTE_SLOTS * PAYLOAD as u64)
    }

    /// Sends `messages` WRITEs of [`PAYLOAD`] bytes, keeping the send queue
    /// full, until every one has completed. With `phases`, adds the time
    /// spent in each part of the cycle.
    pub fn run_writes(
        &mut self,
        messages: u64,
        mut phases: Option<&mut PhaseTimes>,
    ) -> Result<RunCounts, BenchError> {
        let before = self.counts;
        let target = self.posted + messages;
        let mut idle_rounds = 0u32;
        while self.completed < target {
            let progressed = self.refill(target, phases.as_deref_mut())?;
            let moved = self.round(phases.as_deref_mut())?;
            if progressed || moved {
                idle_rounds = 0;
            } else {
                idle_rounds += 1;
                if idle_rounds > STALL_ROUNDS {
                    return Err(BenchError::Stalled);
                }
            }
        }
        Ok(RunCounts {
            data_packets: self.counts.data_packets - before.data_packets,
            replies: self.counts.replies - before.replies,
            other_packets: self.counts.other_packets - before.other_packets,
            completions: self.counts.completions - before.completions,
        })
    }

    /// Posts WRITEs, taking the sending connections in turn, until each
    /// has its share outstanding or `target` are posted.
    fn refill(&mut self, target: u64, phases: Option<&mut PhaseTimes>) -> Result<bool, BenchError> {
        let started = phases.as_ref().map(|_| WallClock::now());
        let mut any = false;
        let mut full = 0;
        while self.posted < target && full < self.sending.len() {
            let conn = self.sending[self.next_sender];
            self.next_sender = (self.next_sender + 1) % self.sending.len();
            if self.outstanding[conn.index as usize] >= PER_CONN_OUTSTANDING {
                full += 1;
                continue;
            }
            full = 0;
            let slot = self.posted % REMOTE_SLOTS;
            let wr = WorkRequest {
                id: self.posted,
                op: Op::Write {
                    remote: MemoryTarget {
                        key: self.remote.key,
                        addr: self.remote.addr + slot * PAYLOAD as u64,
                    },
                },
                local: self.local,
            };
            self.sender.post_send(conn, wr)?;
            self.outstanding[conn.index as usize] += 1;
            self.posted += 1;
            any = true;
        }
        if let (Some(p), Some(t)) = (phases, started) {
            p.post += t.elapsed();
        }
        Ok(any)
    }

    /// One round (see the module comment). Returns whether any packet,
    /// completion or timer moved.
    fn round(&mut self, mut phases: Option<&mut PhaseTimes>) -> Result<bool, BenchError> {
        let mut clock = phases.as_ref().map(|_| WallClock::now());
        let mut lap = |slot: fn(&mut PhaseTimes) -> &mut Duration,
                       phases: &mut Option<&mut PhaseTimes>| {
            if let (Some(p), Some(t)) = (phases.as_deref_mut(), clock.as_mut()) {
                let now = WallClock::now();
                *slot(p) += now - *t;
                *t = now;
            }
        };

        // Sender: every packet it may send now, headers in place, payload
        // left as it lies in the buffer, CRC trailer appended.
        self.tx_queued.clear();
        while self.tx_queued.len() < self.tx_ring.len() {
            let buf = &mut self.tx_ring[self.tx_queued.len()];
            let Some(t) = self.sender.poll_transmit(self.now, buf) else {
                break;
            };
            let len = finish(
                self.crc_offload,
                &self.sender,
                &t,
                buf,
                &mut self.sender_mem,
            );
            if t.payload.is_some() {
                self.counts.data_packets += 1;
                self.last_data_len = len;
            } else {
                self.counts.other_packets += 1;
            }
            self.tx_queued.push(Queued {
                len,
                meta: meta(SENDER_IP, t.src_port),
            });
            self.now += self.step;
        }
        lap(|p| &mut p.sender_tx, &mut phases);

        // Receiver: the packets in as one batch, then its replies out.
        self.reply_queued.clear();
        for i in 0..self.tx_queued.len() {
            let q = self.tx_queued[i];
            self.receiver.handle_packet_with_verdict(
                self.now,
                &q.meta,
                &self.tx_ring[i][..q.len],
                verdict(self.crc_offload),
                &mut self.receiver_mem,
            );
        }
        loop {
            if self.reply_queued.len() == self.reply_ring.len() {
                self.reply_ring.push(vec![0u8; PACKET_BUF]);
            }
            let buf = &mut self.reply_ring[self.reply_queued.len()];
            let Some(t) = self.receiver.poll_transmit(self.now, buf) else {
                break;
            };
            let len = finish(
                self.crc_offload,
                &self.receiver,
                &t,
                buf,
                &mut self.receiver_mem,
            );
            self.reply_queued.push(Queued {
                len,
                meta: meta(RECEIVER_IP, t.src_port),
            });
            self.counts.replies += 1;
            self.last_reply_len = len;
        }
        // WRITEs complete nothing at the receiver; drained all the same.
        while self.receiver.poll_completion().is_some() {}
        while let Some(e) = self.receiver.poll_event() {
            if matches!(e, Event::Connected(_)) {
                self.receiver_connected += 1;
            }
        }
        lap(|p| &mut p.receiver, &mut phases);

        // Sender: replies in, completions out.
        for i in 0..self.reply_queued.len() {
            let q = self.reply_queued[i];
            self.sender.handle_packet_with_verdict(
                self.now,
                &q.meta,
                &self.reply_ring[i][..q.len],
                verdict(self.crc_offload),
                &mut self.sender_mem,
            );
        }
        let mut completions = 0u64;
        while let Some(c) = self.sender.poll_completion() {
            if c.status != Status::Success {
                return Err(BenchError::Completion(c.status));
            }
            if let Some(n) = self.outstanding.get_mut(c.conn.index as usize) {
                *n = n.saturating_sub(1);
            }
            completions += 1;
        }
        self.completed += completions;
        self.counts.completions += completions;
        while let Some(e) = self.sender.poll_event() {
            match e {
                Event::Connected(_) => self.sender_connected += 1,
                Event::Failed { status, .. } => return Err(BenchError::Completion(status)),
                _ => {}
            }
        }
        lap(|p| &mut p.sender_rx, &mut phases);

        // Timers: jump the clock to the next deadline when idle.
        let moved = !self.tx_queued.is_empty() || !self.reply_queued.is_empty() || completions > 0;
        let deadline = earliest(self.sender.poll_timeout(), self.receiver.poll_timeout());
        let mut fired = false;
        if let Some(d) = deadline {
            if !moved && d > self.now {
                self.now = d;
            }
            if d <= self.now {
                if self.sender.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.sender.handle_timeout(self.now);
                }
                if self.receiver.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.receiver.handle_timeout(self.now);
                }
                fired = true;
            }
        }
        lap(|p| &mut p.timers, &mut phases);
        Ok(moved || fired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_completes_and_is_placed_once() {
        let mut pair = Pair::connected().expect("handshake");
        let messages = 100;
        let counts = pair.run_writes(messages, None).expect("run");
        assert_eq!(counts.completions, messages);
        assert_eq!(counts.data_packets, messages, "one packet per 4 KiB WRITE");
        assert!(counts.replies >= 1);
        let placed = pair.receiver_placements();
        assert_eq!(placed.placements, messages);
        assert_eq!(placed.bytes, messages * PAYLOAD as u64);
        let (start, end) = pair.remote_region();
        assert!(placed.lowest >= start && placed.end <= end);
        assert_eq!(pair.sender_placements().placements, 0);
    }

    #[test]
    fn many_connections_establish_and_only_the_sending_ones_carry_writes() {
        let mut pair = Pair::with_connections(300, 8).expect("handshakes");
        assert_eq!(pair.established(), (300, 300));
        let counts = pair.run_writes(400, None).expect("run");
        assert_eq!(counts.completions, 400);
        assert_eq!(pair.receiver_placements().placements, 400);
        let (s, r) = pair.endpoints();
        assert_eq!(s.live_connections(), 300);
        assert_eq!(r.live_connections(), 300);
    }

    #[test]
    fn with_the_crc_offloaded_every_write_completes_the_same() {
        let mut pair = Pair::connected().expect("handshake");
        pair.set_crc_offload(true);
        let counts = pair.run_writes(100, None).expect("run");
        assert_eq!(counts.completions, 100);
        assert_eq!(pair.receiver_placements().placements, 100);
        let (s, r) = pair.endpoints();
        assert_eq!(s.drops().bad_crc + r.drops().bad_crc, 0);
    }

    #[test]
    fn phase_timing_does_not_change_the_outcome() {
        let mut pair = Pair::connected().expect("handshake");
        let mut phases = PhaseTimes::default();
        let counts = pair.run_writes(100, Some(&mut phases)).expect("run");
        assert_eq!(counts.completions, 100);
        assert_eq!(pair.receiver_placements().placements, 100);
    }
}
