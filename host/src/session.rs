//! What `metaroce serve` and `metaroce bench|write|read` do over a
//! [`Node`]: the server side that verifies what it receives, and the
//! client that moves data and summarises it (see [`crate::app`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant as WallInstant};

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, RecvRequest, Region, Status, WorkRequest,
};
use metaroce_core::wire::{CloseReason, MemoryTarget};
use metaroce_core::{CommandError, Event};
use serde::Serialize;

use crate::app::{self, Message, Operation, CONTROL_LEN, SLOTS};
use crate::node::Node;
use crate::HostError;

/// Receive buffers each side keeps posted for control messages and
/// WRITE_IMM completions.
const RECV_SLOTS: u32 = 32;
/// Control-message send buffers (rotating).
const SEND_SLOTS: u32 = 4;
/// Work-request ids at or above this are control sends.
const CONTROL_WR: u64 = 1 << 62;
/// Turn length when idle: how often stop conditions are checked.
const IDLE_TURN: Duration = Duration::from_millis(20);

/// A connection's control buffers: `RECV_SLOTS` receive slots then
/// `SEND_SLOTS` send slots of [`CONTROL_LEN`] bytes each.
#[derive(Debug, Clone, Copy)]
struct Control {
    base: u64,
    key: u32,
    next_send: u32,
}

impl Control {
    /// Buffers for connection `h`, registered in its protection domain.
    fn new(node: &mut Node, h: ConnHandle) -> Result<Control, HostError> {
        let len = (RECV_SLOTS + SEND_SLOTS) * CONTROL_LEN;
        let pd = node.ep.pd(h).unwrap_or(0);
        let base = node.mem.alloc(len as usize, 0);
        let key = match node.ep.register_region(Region {
            base,
            len: u64::from(len),
            access: Access::LOCAL_WRITE,
            pd,
        }) {
            Ok(key) => key,
            Err(e) => {
                node.mem.free(base);
                return Err(HostError::Transfer(format!(
                    "cannot register buffers: {e:?}"
                )));
            }
        };
        Ok(Control {
            base,
            key,
            next_send: 0,
        })
    }

    fn recv_buf(&self, slot: u32) -> LocalBuf {
        LocalBuf {
            key: self.key,
            addr: self.base + u64::from(slot * CONTROL_LEN),
            len: CONTROL_LEN,
        }
    }

    fn post_recvs(&self, node: &mut Node, h: ConnHandle) -> Result<(), CommandError> {
        for slot in 0..RECV_SLOTS {
            self.post_recv(node, h, slot)?;
        }
        Ok(())
    }

    fn post_recv(&self, node: &mut Node, h: ConnHandle, slot: u32) -> Result<(), CommandError> {
        node.post_recv(
            h,
            RecvRequest {
                id: u64::from(slot),
                local: self.recv_buf(slot),
            },
        )
    }

    fn received(&self, node: &Node, c: &Completion) -> Option<Message> {
        let slot = u32::try_from(c.wr_id).ok().filter(|s| *s < RECV_SLOTS)?;
        let buf = self.recv_buf(slot);
        let bytes = node
            .mem
            .slice(buf.addr, c.byte_len.min(CONTROL_LEN) as usize)?;
        Message::decode(bytes)
    }

    fn send(&mut self, node: &mut Node, h: ConnHandle, m: &Message) -> Result<(), CommandError> {
        let slot = RECV_SLOTS + self.next_send % SEND_SLOTS;
        self.next_send += 1;
        let addr = self.base + u64::from(slot * CONTROL_LEN);
        let bytes = m.encode();
        if let Some(dst) = node.mem.slice_mut(addr, bytes.len()) {
            dst.copy_from_slice(&bytes);
        }
        node.post_send(
            h,
            WorkRequest {
                id: CONTROL_WR + u64::from(self.next_send),
                op: Op::Send,
                local: LocalBuf {
                    key: self.key,
                    addr,
                    len: bytes.len() as u32,
                },
            },
        )?;
        node.flush();
        Ok(())
    }
}

// ----- Server ------------------------------------------------------------

/// What the server reports about one finished connection.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ServerReport {
    pub peer: String,
    pub operation: String,
    pub message_size: u32,
    /// WRITE_IMM messages received and checked against the pattern.
    pub verified: u64,
    /// Messages whose bytes differed from the pattern.
    pub corrupt: u64,
    pub bytes: u64,
    pub packets_received: u64,
    pub duplicates_received: u64,
    pub ce_received: u64,
    pub naks_sent: u64,
    /// Every packet the endpoint dropped, by any reason, so far.
    pub endpoint_drops: u64,
    pub closed: String,
    pub integrity_ok: bool,
}

#[derive(Debug)]
struct ServerConn {
    control: Control,
    peer: SocketAddr,
    region: Option<(u32, u64, u64)>,
    read_only: Option<(u32, u64)>,
    op: Option<Operation>,
    seed: u64,
    size: u32,
    verified: u64,
    corrupt: u64,
    bytes: u64,
}

/// The `serve` side: accepts connections, gives each a region, verifies.
#[derive(Debug)]
pub struct Server {
    pub node: Node,
    conns: HashMap<ConnHandle, ServerConn>,
    /// Connections that closed or failed, with how, waiting for their last
    /// completions before their report and release.
    ending: Vec<(ConnHandle, String)>,
    /// Reports of connections that ended, oldest first.
    pub finished: Vec<ServerReport>,
    /// Connections refused after the handshake (no room for their buffers).
    pub refused: u64,
}

impl Server {
    /// A server on a bound node (which must accept incoming connections).
    pub fn new(node: Node) -> Server {
        Server {
            node,
            conns: HashMap::new(),
            ending: Vec::new(),
            finished: Vec::new(),
            refused: 0,
        }
    }

    /// Runs until `stop` returns true (checked every turn).
    pub fn run(&mut self, mut stop: impl FnMut(&Server) -> bool) -> Result<(), HostError> {
        while !stop(self) {
            self.turn(IDLE_TURN)?;
        }
        Ok(())
    }

    /// One loop turn plus the server's bookkeeping.
    pub fn turn(&mut self, max_wait: Duration) -> Result<(), HostError> {
        self.node.turn(max_wait);
        while let Some(e) = self.node.events.pop_front() {
            match e {
                Event::Incoming { conn, peer } => self.adopt(conn, crate::node::socket_of(peer)),
                Event::Closed { conn, reason } => self.ending.push((conn, format!("{reason:?}"))),
                Event::Failed { conn, status } => {
                    self.ending.push((conn, format!("failed: {status:?}")));
                }
                Event::Connected(_) => {}
            }
        }
        while let Some(c) = self.node.completions.pop_front() {
            self.on_completion(&c);
        }
        // Reports and releases once the last completions were taken; a
        // connection whose completions are still coming waits a turn.
        let ending = std::mem::take(&mut self.ending);
        for (h, how) in ending {
            self.finish(h, &how);
            match self.node.ep.release(h) {
                Ok(()) | Err(CommandError::UnknownConnection) => {}
                Err(_) => self.ending.push((h, how)),
            }
        }
        Ok(())
    }

    /// A new connection: its buffers and receives. When there is no room
    /// for them the connection is closed at once, counted, and the server
    /// goes on serving everyone else.
    fn adopt(&mut self, h: ConnHandle, peer: SocketAddr) {
        {
            let control = match Control::new(&mut self.node, h) {
                Ok(c) => c,
                Err(_) => {
                    self.refused += 1;
                    let now = self.node.now();
                    let _ = self.node.ep.close(now, h);
                    return;
                }
            };
            let _ = control.post_recvs(&mut self.node, h);
            self.conns.insert(
                h,
                ServerConn {
                    control,
                    peer,
                    region: None,
                    read_only: None,
                    op: None,
                    seed: 0,
                    size: 0,
                    verified: 0,
                    corrupt: 0,
                    bytes: 0,
                },
            );
        }
    }

    fn on_completion(&mut self, c: &Completion) {
        let Some(conn) = self.conns.get_mut(&c.conn) else {
            return;
        };
        match (c.opcode, c.status) {
            (Opcode::Recv, Status::Success) => {
                let msg = conn.control.received(&self.node, c);
                let _ = conn
                    .control
                    .post_recv(&mut self.node, c.conn, c.wr_id as u32);
                match msg {
                    Some(Message::Announce { op, seed, size }) => {
                        Self::on_announce(&mut self.node, c.conn, conn, op, seed, size);
                    }
                    Some(Message::Done { .. }) => {
                        let report = Message::Report {
                            verified: conn.verified,
                            corrupt: conn.corrupt,
                            bytes: conn.bytes,
                        };
                        let _ = conn.control.send(&mut self.node, c.conn, &report);
                    }
                    _ => {}
                }
            }
            (Opcode::RecvWriteImm, Status::Success) => {
                let _ = conn
                    .control
                    .post_recv(&mut self.node, c.conn, c.wr_id as u32);
                let (Some((_, base, len)), Some(index)) = (conn.region, c.imm) else {
                    return;
                };
                let size = conn.size as usize;
                let slot = u64::from(index % SLOTS) * u64::from(conn.size);
                if slot + size as u64 > len {
                    return;
                }
                conn.bytes += size as u64;
                match self.node.mem.slice(base + slot, size) {
                    Some(data) if app::check_pattern(conn.seed, u64::from(index), data) => {
                        conn.verified += 1;
                    }
                    _ => conn.corrupt += 1,
                }
            }
            _ => {}
        }
    }

    fn on_announce(
        node: &mut Node,
        h: ConnHandle,
        conn: &mut ServerConn,
        op: Operation,
        seed: u64,
        size: u32,
    ) {
        if size == 0 || size > app::MAX_MESSAGE || conn.region.is_some() {
            let _ = conn
                .control
                .send(node, h, &Message::region_refused(app::REGION_BAD_SIZE));
            return;
        }
        let len = u64::from(size) * u64::from(SLOTS);
        let base = node.mem.alloc(len as usize, 0);
        if op == Operation::Read {
            for j in 0..SLOTS {
                let off = u64::from(j) * u64::from(size);
                if let Some(dst) = node.mem.slice_mut(base + off, size as usize) {
                    app::fill_pattern(seed, u64::from(j), dst);
                }
            }
        }
        let pd = node.ep.pd(h).unwrap_or(0);
        let Ok(key) = node.ep.register_region(Region {
            base,
            len,
            access: Access::ALL,
            pd,
        }) else {
            node.mem.free(base);
            return;
        };
        let ro_len = app::READ_ONLY_LEN;
        let ro_base = node.mem.alloc(ro_len as usize, 0);
        if let Some(dst) = node.mem.slice_mut(ro_base, ro_len as usize) {
            app::fill_pattern(seed, app::READ_ONLY_INDEX, dst);
        }
        let ro_key = match node.ep.register_region(Region {
            base: ro_base,
            len: u64::from(ro_len),
            access: Access::REMOTE_READ,
            pd,
        }) {
            Ok(k) => {
                conn.read_only = Some((k, ro_base));
                k
            }
            Err(_) => {
                node.mem.free(ro_base);
                0
            }
        };
        conn.region = Some((key, base, len));
        conn.op = Some(op);
        conn.seed = seed;
        conn.size = size;
        let _ = conn.control.send(
            node,
            h,
            &Message::Region {
                status: app::REGION_OK,
                key,
                addr: base,
                len,
                slots: SLOTS,
                ro_key,
                ro_addr: ro_base,
            },
        );
    }

    fn finish(&mut self, h: ConnHandle, how: &str) {
        let Some(conn) = self.conns.remove(&h) else {
            return;
        };
        let stats = self.node.ep.stats(h).unwrap_or_default();
        if let Some((key, base, _)) = conn.region {
            let _ = self.node.ep.deregister_region(key);
            self.node.mem.free(base);
        }
        if let Some((key, base)) = conn.read_only {
            let _ = self.node.ep.deregister_region(key);
            self.node.mem.free(base);
        }
        let _ = self.node.ep.deregister_region(conn.control.key);
        self.node.mem.free(conn.control.base);
        let operation = match conn.op {
            Some(Operation::Write) => "write",
            Some(Operation::Read) => "read",
            None => "none",
        };
        self.finished.push(ServerReport {
            peer: conn.peer.to_string(),
            operation: operation.into(),
            message_size: conn.size,
            verified: conn.verified,
            corrupt: conn.corrupt,
            bytes: conn.bytes,
            packets_received: stats.packets_received,
            duplicates_received: stats.duplicates_received,
            ce_received: stats.ce_received,
            naks_sent: stats.naks_sent,
            endpoint_drops: self.node.ep.drops().total(),
            closed: how.into(),
            integrity_ok: conn.corrupt == 0,
        });
    }
}

// ----- Client ------------------------------------------------------------

/// What a client run does.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub peer: SocketAddr,
    pub op: Operation,
    /// Bytes per message.
    pub size: u32,
    /// Messages to move (`None`: until `duration`).
    pub count: Option<u64>,
    /// Stop posting after this long (`None`: until `count`).
    pub duration: Option<Duration>,
    /// Give up when nothing completes for this long.
    pub stall_timeout: Duration,
    /// Give up on the handshake after this long.
    pub connect_timeout: Duration,
    /// Pattern seed.
    pub seed: u64,
}

/// Telemetry of one path, as the summary prints it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PathRow {
    pub path: u8,
    pub src_port: u16,
    pub sent: u32,
    pub retransmitted: u32,
    pub lost: u32,
    pub ce_echoed: u32,
    pub rerolls: u32,
    pub srtt_us: u32,
}

/// The final summary of a client run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub operation: String,
    pub peer: String,
    pub local: String,
    pub message_size: u32,
    pub completions: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub goodput_mbps: f64,
    pub packets_sent: u64,
    pub retransmissions: u64,
    pub timeouts: u64,
    pub packets_lost: u64,
    pub ce_echoed: u64,
    pub ce_received: u64,
    pub naks_received: u64,
    pub paths: Vec<PathRow>,
    /// Messages the checker (server for writes, client for reads) verified.
    pub verified: u64,
    pub corrupt: u64,
    pub integrity_ok: bool,
}

/// Progress seen while the client runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub seconds: f64,
    pub completions: u64,
    pub bytes: u64,
    pub goodput_mbps: f64,
    pub retransmissions: u64,
    pub ce_echoed: u64,
}

fn wait_for<T>(
    node: &mut Node,
    timeout: Duration,
    mut check: impl FnMut(&mut Node) -> Option<Result<T, HostError>>,
    on_timeout: impl FnOnce(&Node) -> HostError,
) -> Result<T, HostError> {
    let deadline = WallInstant::now() + timeout;
    loop {
        if let Some(r) = check(node) {
            return r;
        }
        if WallInstant::now() >= deadline {
            return Err(on_timeout(node));
        }
        node.turn(IDLE_TURN);
    }
}

fn conn_failure(e: Event) -> Option<HostError> {
    match e {
        Event::Closed {
            reason: CloseReason::Rejected,
            ..
        } => Some(HostError::Unreachable(
            "the peer refused the connection".into(),
        )),
        Event::Closed { reason, .. } => Some(HostError::Transfer(format!(
            "the connection closed ({reason:?})"
        ))),
        Event::Failed { status, .. } => Some(HostError::Transfer(format!(
            "the connection failed ({status:?})"
        ))),
        Event::Connected(_) | Event::Incoming { .. } => None,
    }
}

/// Runs a client transfer on `node`; `progress` is called about once a
/// second.
pub fn run_client(
    node: &mut Node,
    opts: &ClientOptions,
    mut progress: impl FnMut(&Progress),
) -> Result<Summary, HostError> {
    if opts.size == 0 || opts.size > app::MAX_MESSAGE {
        return Err(HostError::Usage(format!(
            "--size must be 1..={} bytes",
            app::MAX_MESSAGE
        )));
    }
    let h = node
        .connect(opts.peer)
        .map_err(|e| HostError::Transfer(format!("connect: {e:?}")))?;
    let mut control = Control::new(node, h)?;
    control
        .post_recvs(node, h)
        .map_err(|e| HostError::Transfer(format!("post receives: {e:?}")))?;
    node.flush();

    // Handshake.
    let peer = opts.peer;
    wait_for(
        node,
        opts.connect_timeout,
        |n| {
            while let Some(e) = n.events.pop_front() {
                if let Event::Connected(_) = e {
                    return Some(Ok(()));
                }
                if let Some(err) = conn_failure(e) {
                    return Some(Err(err));
                }
            }
            None
        },
        |n| {
            if n.io().rx_errors > 0 {
                HostError::Unreachable(format!("{peer}: port unreachable (nothing listens there)"))
            } else {
                HostError::Unreachable(format!(
                    "{peer}: no answer to the handshake within {:?}",
                    opts.connect_timeout
                ))
            }
        },
    )?;

    // Announce, get the region.
    control
        .send(
            node,
            h,
            &Message::Announce {
                op: opts.op,
                seed: opts.seed,
                size: opts.size,
            },
        )
        .map_err(|e| HostError::Transfer(format!("announce: {e:?}")))?;
    let (rkey, raddr, rlen, rslots) = wait_for(
        node,
        opts.connect_timeout.max(Duration::from_secs(2)),
        |n| {
            while let Some(c) = n.completions.pop_front() {
                if c.opcode == Opcode::Recv && c.status == Status::Success {
                    let msg = control.received(n, &c);
                    let _ = control.post_recv(n, h, c.wr_id as u32);
                    match msg {
                        Some(Message::Region {
                            status: app::REGION_OK,
                            key,
                            addr,
                            len,
                            slots,
                            ..
                        }) => return Some(Ok((key, addr, len, slots))),
                        Some(Message::Region { status, .. }) => {
                            return Some(Err(HostError::Usage(format!(
                                "the server refused the message size (status {status})"
                            ))))
                        }
                        _ => {}
                    }
                } else if c.status != Status::Success {
                    return Some(Err(HostError::Transfer(format!(
                        "announce completed with {:?}",
                        c.status
                    ))));
                }
            }
            while let Some(e) = n.events.pop_front() {
                if let Some(err) = conn_failure(e) {
                    return Some(Err(err));
                }
            }
            None
        },
        |_| HostError::Transfer("the server did not answer the announcement".into()),
    )?;
    if rslots == 0 || u64::from(rslots) * u64::from(opts.size) > rlen {
        return Err(HostError::Transfer(
            "the server's region is smaller than announced".into(),
        ));
    }

    // Data.
    let local_len = u64::from(SLOTS) * u64::from(opts.size);
    let local_base = node.mem.alloc(local_len as usize, 0);
    let local_key = node
        .ep
        .register_region(Region {
            base: local_base,
            len: local_len,
            access: Access::LOCAL_WRITE,
            pd: 0,
        })
        .map_err(|e| HostError::Transfer(format!("register: {e:?}")))?;
    // Two send-queue entries stay free for control messages.
    let queue = u64::from(node.ep.config().send_queue_limit);
    let max_outstanding = (queue - 2).min(u64::from(SLOTS) / 2);
    let started = WallInstant::now();
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut bytes = 0u64;
    let mut corrupt_local = 0u64;
    let mut last_progress = started;
    let mut last_completion = started;
    let want_more = |posted: u64, now: WallInstant| {
        let count_ok = opts.count.is_none_or(|c| posted < c);
        let time_ok = opts.duration.is_none_or(|d| now < started + d);
        count_ok && time_ok
    };
    loop {
        let now = WallInstant::now();
        while posted - completed < max_outstanding && want_more(posted, now) {
            let i = posted;
            let local_addr = local_base + (i % u64::from(SLOTS)) * u64::from(opts.size);
            let remote_slot = i % u64::from(rslots);
            let remote = MemoryTarget {
                key: rkey,
                addr: raddr + remote_slot * u64::from(opts.size),
            };
            let op = match opts.op {
                Operation::Write => {
                    if let Some(dst) = node.mem.slice_mut(local_addr, opts.size as usize) {
                        app::fill_pattern(opts.seed, i, dst);
                    }
                    Op::WriteImm {
                        remote,
                        imm: i as u32,
                    }
                }
                Operation::Read => Op::Read { remote },
            };
            let wr = WorkRequest {
                id: i,
                op,
                local: LocalBuf {
                    key: local_key,
                    addr: local_addr,
                    len: opts.size,
                },
            };
            match node.post_send(h, wr) {
                Ok(()) => posted += 1,
                Err(CommandError::QueueFull) => break,
                Err(e) => return Err(HostError::Transfer(format!("post: {e:?}"))),
            }
        }
        if posted == completed && !want_more(posted, now) {
            break;
        }
        node.turn(IDLE_TURN);
        while let Some(c) = node.completions.pop_front() {
            if c.wr_id >= CONTROL_WR {
                continue;
            }
            if matches!(c.opcode, Opcode::Recv | Opcode::RecvWriteImm) {
                let _ = control.post_recv(node, h, c.wr_id as u32);
                continue;
            }
            if c.status != Status::Success {
                return Err(HostError::Transfer(format!(
                    "message {} completed with {:?}",
                    c.wr_id, c.status
                )));
            }
            completed += 1;
            bytes += u64::from(c.byte_len);
            last_completion = WallInstant::now();
            if opts.op == Operation::Read {
                let local_addr = local_base + (c.wr_id % u64::from(SLOTS)) * u64::from(opts.size);
                let remote_slot = c.wr_id % u64::from(rslots);
                let ok = node
                    .mem
                    .slice(local_addr, opts.size as usize)
                    .is_some_and(|d| app::check_pattern(opts.seed, remote_slot, d));
                if !ok {
                    corrupt_local += 1;
                }
            }
        }
        while let Some(e) = node.events.pop_front() {
            if let Some(err) = conn_failure(e) {
                return Err(err);
            }
        }
        let now = WallInstant::now();
        if now.duration_since(last_completion) > opts.stall_timeout && posted > completed {
            return Err(HostError::Transfer(format!(
                "nothing completed for {:?} ({completed} of {posted} messages done)",
                opts.stall_timeout
            )));
        }
        if now.duration_since(last_progress) >= Duration::from_secs(1) {
            last_progress = now;
            let s = node.ep.stats(h).unwrap_or_default();
            let secs = now.duration_since(started).as_secs_f64();
            progress(&Progress {
                seconds: secs,
                completions: completed,
                bytes,
                goodput_mbps: bytes as f64 * 8.0 / secs.max(1e-9) / 1e6,
                retransmissions: s.retransmissions,
                ce_echoed: ce_echoed(node, h),
            });
        }
    }
    let seconds = started.elapsed().as_secs_f64();

    // Ask the server what it verified.
    control
        .send(
            node,
            h,
            &Message::Done {
                messages: completed,
                bytes,
            },
        )
        .map_err(|e| HostError::Transfer(format!("done: {e:?}")))?;
    let (verified_remote, corrupt_remote) = wait_for(
        node,
        opts.stall_timeout,
        |n| {
            while let Some(c) = n.completions.pop_front() {
                if c.opcode == Opcode::Recv && c.status == Status::Success {
                    if let Some(Message::Report {
                        verified, corrupt, ..
                    }) = control.received(n, &c)
                    {
                        return Some(Ok((verified, corrupt)));
                    }
                }
            }
            while let Some(e) = n.events.pop_front() {
                if let Some(err) = conn_failure(e) {
                    return Some(Err(err));
                }
            }
            None
        },
        |_| HostError::Transfer("the server did not report".into()),
    )?;

    let stats = node.ep.stats(h).unwrap_or_default();
    let paths: Vec<PathRow> = (0..u8::try_from(node.ep.config().paths).unwrap_or(u8::MAX))
        .filter_map(|p| node.ep.path_stats(h, p).map(|s| (p, s)))
        .map(|(p, s)| PathRow {
            path: p,
            src_port: s.entropy,
            sent: s.sent,
            retransmitted: s.retransmitted,
            lost: s.lost,
            ce_echoed: s.ce_echoed,
            rerolls: s.rerolls,
            srtt_us: s.srtt_ns / 1000,
        })
        .collect();
    let ce_echoed = ce_echoed(node, h);

    // Close gracefully; a peer that does not answer the CLOSE is not an error.
    let _ = node.ep.close(node.now(), h);
    node.flush();
    let _ = wait_for(
        node,
        Duration::from_secs(2),
        |n| {
            while let Some(e) = n.events.pop_front() {
                if matches!(e, Event::Closed { .. } | Event::Failed { .. }) {
                    return Some(Ok(()));
                }
            }
            None
        },
        |_| HostError::Transfer("close".into()),
    );

    let (verified, corrupt) = match opts.op {
        Operation::Write => (verified_remote, corrupt_remote),
        Operation::Read => (completed - corrupt_local, corrupt_local),
    };
    let integrity_ok = corrupt == 0 && verified == completed;
    Ok(Summary {
        operation: match opts.op {
            Operation::Write => "write".into(),
            Operation::Read => "read".into(),
        },
        peer: opts.peer.to_string(),
        local: node.local_addr().to_string(),
        message_size: opts.size,
        completions: completed,
        bytes,
        seconds,
        goodput_mbps: bytes as f64 * 8.0 / seconds.max(1e-9) / 1e6,
        packets_sent: stats.packets_sent,
        retransmissions: stats.retransmissions,
        timeouts: stats.timeouts,
        packets_lost: stats.packets_lost,
        ce_echoed,
        ce_received: stats.ce_received,
        naks_received: stats.naks_received,
        paths,
        verified,
        corrupt,
        integrity_ok,
    })
}

fn ce_echoed(node: &Node, h: ConnHandle) -> u64 {
    (0..u8::try_from(node.ep.config().paths).unwrap_or(u8::MAX))
        .filter_map(|p| node.ep.path_stats(h, p))
        .map(|s| u64::from(s.ce_echoed))
        .sum()
}
