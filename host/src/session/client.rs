//! The client of `metaroce bench|write|read`: connects, announces, moves
//! data (WRITE_IMM or READ), asks the server what it verified, summarises.

use std::net::SocketAddr;
use std::time::{Duration, Instant as WallInstant};

use metaroce_core::api::{Access, ConnHandle, LocalBuf, Op, Opcode, Region, Status, WorkRequest};
use metaroce_core::wire::{CloseReason, MemoryTarget};
use metaroce_core::{CommandError, Event};
use serde::Serialize;

use super::{Control, CONTROL_WR, IDLE_TURN};
use crate::app::{self, Message, Operation, SLOTS};
use crate::node::Node;
use crate::HostError;

/// Receive-consuming messages (WRITE_IMM) a client keeps outstanding
/// towards `serve` (spec B.2): half of the server's 32 posted receives.
const RECEIVE_MESSAGES_OUTSTANDING: u64 = 16;

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
    /// Give up on the handshake after this long (the core gives up after
    /// its connect timeout, `Config::connect_timeout`: this is a guard
    /// above it).
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
    /// Seconds from `connect` to the handshake's completion (RETRY round
    /// trip included).
    pub connect_seconds: f64,
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
    /// Everything the client's endpoint refused or dropped, by reason.
    pub refusals: serde_json::Value,
    /// The same, the reasons that counted, as one line.
    #[serde(skip)]
    pub refusals_line: String,
    /// The connection's packet protection (spec 5.3): `none` or
    /// `AES_256_GCM key N`.
    pub suite: String,
    /// The endpoint's protection counters: sealed, opened, drops by reason.
    pub protection: serde_json::Value,
    #[serde(skip)]
    pub protection_line: String,
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
    let connect_started = WallInstant::now();
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
                if let Event::Failed {
                    status: Status::RetryExceeded,
                    ..
                } = e
                {
                    // The core repeated CONNECT for its connect timeout.
                    return Some(Err(if n.io().rx_errors > 0 {
                        HostError::Unreachable(format!(
                            "{peer}: port unreachable (nothing listens there)"
                        ))
                    } else {
                        HostError::Unreachable(format!(
                            "{peer}: no answer to the handshake within {:?}",
                            n.ep.config().connect_timeout
                        ))
                    }));
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
    let connect_seconds = connect_started.elapsed().as_secs_f64();

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
    let mut max_outstanding = (queue - 2).min(u64::from(SLOTS) / 2);
    if opts.op == Operation::Write {
        // Spec B.2: at most 16 receive-consuming messages outstanding,
        // counted in posting order (completions come in that order).
        max_outstanding = max_outstanding.min(RECEIVE_MESSAGES_OUTSTANDING);
    }
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
    let suite = node.ep.protection(h).map_or_else(
        || "none".into(),
        |(s, k)| crate::protection::suite_name(s, k),
    );

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
        connect_seconds,
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
        refusals: crate::counters::json(node),
        refusals_line: crate::counters::line(node),
        suite,
        protection: crate::protection::json(&node.ep.protection_stats()),
        protection_line: crate::protection::line(&node.ep.protection_stats()),
    })
}

fn ce_echoed(node: &Node, h: ConnHandle) -> u64 {
    (0..u8::try_from(node.ep.config().paths).unwrap_or(u8::MAX))
        .filter_map(|p| node.ep.path_stats(h, p))
        .map(|s| u64::from(s.ce_echoed))
        .sum()
}
