//! `metaroce hold`: opens many connections to one server at once and holds
//! them, to see how many it serves together. Each connection completes its
//! handshake, then one control round trip (`DONE`, answered by `REPORT`)
//! proves the server posted receives for it and answers on it; every
//! connection ends in exactly one of: answered, refused (`CLOSE` with
//! `REJECTED`), closed otherwise, failed, or still waiting at the
//! deadline. Then all are closed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant as WallInstant};

use metaroce_core::api::{ConnHandle, Opcode, Status};
use metaroce_core::wire::CloseReason;
use metaroce_core::Event;
use serde::Serialize;

use super::{Control, IDLE_TURN};
use crate::app::Message;
use crate::node::Node;
use crate::HostError;

/// What a hold run does.
#[derive(Debug, Clone)]
pub struct HoldOptions {
    pub peer: SocketAddr,
    /// Connections opened at once.
    pub connections: u32,
    /// How long every connection has to be answered.
    pub timeout: Duration,
}

/// How the connections of a hold run ended up.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HoldSummary {
    pub peer: String,
    pub requested: u32,
    /// Handshakes completed.
    pub established: u32,
    /// Connections whose `DONE` was answered with a `REPORT`.
    pub answered: u32,
    /// Closed by the server with `REJECTED` (over its capacity or budget).
    pub refused: u32,
    /// Closed by the server for another reason.
    pub closed: u32,
    /// Failed (handshake timeout, fatal error).
    pub failed: u32,
    /// Failures and other closes by status or reason, most frequent first.
    pub endings: Vec<(String, u32)>,
    /// Neither answered nor ended when the time was up.
    pub waiting: u32,
    /// Seconds until every connection had its outcome (or the deadline).
    pub seconds: f64,
    /// Seconds until the last handshake completed.
    pub establish_seconds: f64,
    /// Connections closed at the end whose close completed.
    pub closed_at_end: u32,
}

impl HoldSummary {
    /// Whether every connection was served.
    pub fn all_answered(&self) -> bool {
        self.answered == self.requested
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Waiting,
    Answered,
    Refused,
    Closed,
    Failed,
}

struct Held {
    handle: ConnHandle,
    control: Option<Control>,
    outcome: Outcome,
}

/// Runs a hold on `node` (bound with room for `opts.connections`).
pub fn run_hold(node: &mut Node, opts: &HoldOptions) -> Result<HoldSummary, HostError> {
    if opts.connections == 0 {
        return Err(HostError::Usage("--connections must be at least 1".into()));
    }
    let started = WallInstant::now();
    let mut held: HashMap<u32, Held> = HashMap::with_capacity(opts.connections as usize);
    for i in 0..opts.connections {
        let h = node.connect(opts.peer).map_err(|e| {
            HostError::Transfer(format!("connection {i} of {}: {e:?}", opts.connections))
        })?;
        held.insert(
            h.index,
            Held {
                handle: h,
                control: None,
                outcome: Outcome::Waiting,
            },
        );
    }
    node.flush();
    let mut summary = HoldSummary {
        peer: opts.peer.to_string(),
        requested: opts.connections,
        ..HoldSummary::default()
    };
    let mut decided = 0u32;
    let mut endings: HashMap<String, u32> = HashMap::new();
    let deadline = started + opts.timeout;
    while decided < opts.connections && WallInstant::now() < deadline {
        node.turn(IDLE_TURN);
        while let Some(e) = node.events.pop_front() {
            let (h, outcome) = match e {
                Event::Connected(h) => {
                    summary.established += 1;
                    summary.establish_seconds = started.elapsed().as_secs_f64();
                    start_round_trip(node, &mut held, h)?;
                    continue;
                }
                Event::Closed {
                    conn,
                    reason: CloseReason::Rejected,
                } => (conn, Outcome::Refused),
                Event::Closed { conn, reason } => {
                    *endings.entry(format!("closed {reason:?}")).or_default() += 1;
                    (conn, Outcome::Closed)
                }
                Event::Failed { conn, status } => {
                    *endings.entry(format!("failed {status:?}")).or_default() += 1;
                    (conn, Outcome::Failed)
                }
                Event::Incoming { .. } => continue,
            };
            if let Some(c) = held.get_mut(&h.index).filter(|c| c.handle == h) {
                if c.outcome == Outcome::Waiting {
                    c.outcome = outcome;
                    decided += 1;
                }
            }
        }
        while let Some(c) = node.completions.pop_front() {
            if c.opcode != Opcode::Recv || c.status != Status::Success {
                continue;
            }
            let Some(entry) = held.get_mut(&c.conn.index).filter(|e| e.handle == c.conn) else {
                continue;
            };
            let report = entry
                .control
                .as_ref()
                .and_then(|control| control.received(node, &c));
            if matches!(report, Some(Message::Report { .. })) && entry.outcome == Outcome::Waiting {
                entry.outcome = Outcome::Answered;
                decided += 1;
            }
        }
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.endings = endings.into_iter().collect();
    summary
        .endings
        .sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for c in held.values() {
        match c.outcome {
            Outcome::Waiting => summary.waiting += 1,
            Outcome::Answered => summary.answered += 1,
            Outcome::Refused => summary.refused += 1,
            Outcome::Closed => summary.closed += 1,
            Outcome::Failed => summary.failed += 1,
        }
    }
    summary.closed_at_end = close_all(node, &held);
    Ok(summary)
}

/// Registers control buffers for a new connection, posts one receive and
/// sends `DONE`.
fn start_round_trip(
    node: &mut Node,
    held: &mut HashMap<u32, Held>,
    h: ConnHandle,
) -> Result<(), HostError> {
    let Some(entry) = held.get_mut(&h.index).filter(|e| e.handle == h) else {
        return Ok(());
    };
    let mut control = Control::new(node, h)?;
    control
        .post_recv(node, h, 0)
        .and_then(|()| {
            control.send(
                node,
                h,
                &Message::Done {
                    messages: 0,
                    bytes: 0,
                },
            )
        })
        .map_err(|e| HostError::Transfer(format!("connection {h}: {e:?}")))?;
    entry.control = Some(control);
    Ok(())
}

/// Closes every connection still open and waits (up to 5 s) for each to
/// end, so the server frees their slots at once instead of at its idle
/// timeout; returns how many ended.
fn close_all(node: &mut Node, held: &HashMap<u32, Held>) -> u32 {
    let now = node.now();
    let mut open = 0u32;
    for c in held.values() {
        if node.ep.close(now, c.handle).is_ok() {
            open += 1;
        }
    }
    let mut ended = 0u32;
    let until = WallInstant::now() + Duration::from_secs(5);
    while ended < open && WallInstant::now() < until {
        node.flush();
        node.turn(IDLE_TURN);
        while let Some(e) = node.events.pop_front() {
            if matches!(e, Event::Closed { .. } | Event::Failed { .. }) {
                ended += 1;
            }
        }
        node.completions.clear();
    }
    ended
}
