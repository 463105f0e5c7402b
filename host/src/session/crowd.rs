//! `metaroce crowd`: many clients at once against one server, some of
//! them misbehaving, to check that the server keeps serving the others.
//! Each group binds its own source address
//! (127.0.0.x on loopback) so the server's per-peer budgets meet it
//! alone; where only one address reaches the server (the QEMU harness's
//! gateway), every client shares it and the budget probes are left out.
//!
//! | group | clients | what they do | what they must see |
//! |---|---|---|---|
//! | well-behaved | `well_behaved` | write (4 in 5) or read `count` messages, verified | integrity OK |
//! | bad key | 3 | WRITE with a key the server never gave | `RemoteInvalidKey` |
//! | cross key | 1 | WRITE on one connection with another's key | `RemoteInvalidKey` |
//! | bad size | 1 | announce one byte past the server's largest message | `REGION_BAD_SIZE` |
//! | twice | 2 | announce twice, then write 4 messages | second refused, 4 verified |
//! | abandoned | 6 | CONNECT, then silence | nothing (whatever the handshake) |
//! | silent | 4 | announce, then silence without closing | their region (the server's idle timeout ends them) |
//! | huge\* | 2 | announce `max_message` messages (64 of them) | refused over budget |
//! | hogs\* | 4 | announce `hog_size` messages and hold | reported: granted or refused |
//! | greedy\* | 1 | open `greedy_connections` and hold them | reported: up or `REJECTED` |
//!
//! \* budget probes, only with a source address per group. Clients talk
//! through the core's API (connect, post, poll), so nothing assumes how
//! the handshake goes. The clients that hold (hogs, greedy) and the
//! silent ones stay until [`Crowd::finish`], so the server can be
//! inspected while they do.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant as WallInstant};

use metaroce_core::api::WorkRequest;
use metaroce_core::api::{Access, Completion, ConnHandle, LocalBuf, Op, Opcode, Region, Status};
use metaroce_core::wire::{CloseReason, MemoryTarget};
use metaroce_core::Event;
use serde::Serialize;

use super::{run_client, ClientOptions, Control, CONTROL_WR};
use crate::app::{self, Message, Operation};
use crate::node::{Node, NodeConfig};
use crate::HostError;

/// Where the clients' source addresses come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sources {
    /// Group addresses in the /24 of this address (host parts 10 to 80):
    /// per-peer budgets apply to each group.
    PerGroup(Ipv4Addr),
    /// Every client from this address (budget probes left out).
    Single(IpAddr),
}

/// What a crowd run does.
#[derive(Debug, Clone)]
pub struct CrowdOptions {
    pub peer: SocketAddr,
    pub sources: Sources,
    /// Well-behaved clients.
    pub well_behaved: usize,
    /// Their message size and count.
    pub size: u32,
    pub count: u64,
    /// The server's largest message.
    pub max_message: u32,
    /// Message size the hogs announce.
    pub hog_size: u32,
    /// Connections the greedy client opens.
    pub greedy_connections: usize,
    /// How long any one step (a handshake, an answer) may take.
    pub timeout: Duration,
}

/// The pattern seed of every hand-driven announcement.
const SEED: u64 = 0xbad;
/// Message size of the hand-driven clients.
const SMALL: u32 = 4096;
/// Messages the twice-announcing clients write after the refusal.
const TWICE_MESSAGES: u64 = 4;

/// What one client saw.
#[derive(Debug, Clone)]
enum Outcome {
    WellBehaved,
    BadKey(Status),
    CrossKey(Status),
    BadSize(u32),
    Twice {
        second: u32,
        verified: u64,
        corrupt: u64,
    },
    Abandoned,
    Silent(u32),
    Huge(u32),
    Hog(u32),
    Greedy {
        up: usize,
        rejected: usize,
    },
}

/// What the crowd saw, group by group.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CrowdReport {
    pub clients: usize,
    pub well_behaved: usize,
    /// Well-behaved clients that completed with integrity.
    pub well_behaved_ok: usize,
    pub bad_key_refused: usize,
    pub cross_key_refused: usize,
    pub bad_size_refused: usize,
    /// Twice-announcing clients whose second announcement was refused
    /// and whose later messages were all verified.
    pub twice_refused_then_served: usize,
    pub abandoned: usize,
    pub silent: usize,
    pub huge_refused: usize,
    pub hogs_granted: usize,
    pub hogs_refused: usize,
    pub greedy_up: usize,
    pub greedy_rejected: usize,
    /// Every outcome that was not what its group must see.
    pub problems: Vec<String>,
    pub seconds: f64,
}

impl CrowdReport {
    /// Whether every client saw what it must.
    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.well_behaved_ok == self.well_behaved
    }
}

type Job = Box<dyn FnOnce() -> Result<Outcome, String> + Send>;

/// A running crowd.
#[derive(Debug)]
pub struct Crowd {
    stop: Arc<AtomicBool>,
    finite: Vec<JoinHandle<Result<Outcome, String>>>,
    holding: Vec<JoinHandle<Result<Outcome, String>>>,
    outcomes: Vec<Result<Outcome, String>>,
    ready: mpsc::Receiver<()>,
    holders: usize,
    well_behaved: usize,
    started: WallInstant,
}

impl Crowd {
    /// Starts every client at once.
    pub fn start(opts: &CrowdOptions) -> Crowd {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = mpsc::channel();
        let per_group = matches!(opts.sources, Sources::PerGroup(_));
        let mut finite: Vec<Job> = Vec::new();
        let mut holding: Vec<Job> = Vec::new();
        let o = opts.clone();
        let source = move |host: u8| match o.sources {
            Sources::PerGroup(base) => {
                let [a, b, c, _] = base.octets();
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(a, b, c, host)), 0)
            }
            Sources::Single(ip) => SocketAddr::new(ip, 0),
        };
        for n in 0..opts.well_behaved {
            let (o, bind) = (opts.clone(), source(10 + (n % 10) as u8));
            finite.push(Box::new(move || well_behaved(&o, bind, n)));
        }
        for n in 0..3 {
            let (o, bind) = (opts.clone(), source(20 + n));
            finite.push(Box::new(move || bad_key(&o, bind)));
        }
        let (o, bind) = (opts.clone(), source(23));
        finite.push(Box::new(move || cross_key(&o, bind)));
        let (o, bind) = (opts.clone(), source(32));
        finite.push(Box::new(move || {
            announce_only(&o, bind, o.max_message + 1).map(Outcome::BadSize)
        }));
        for n in 0..2 {
            let (o, bind) = (opts.clone(), source(50 + n));
            finite.push(Box::new(move || twice(&o, bind)));
        }
        for _ in 0..6 {
            let (o, bind, stop) = (opts.clone(), source(60), stop.clone());
            holding.push(Box::new(move || abandoned(&o, bind, &stop)));
        }
        for _ in 0..4 {
            let (o, bind, stop) = (opts.clone(), source(70), stop.clone());
            holding.push(Box::new(move || silent(&o, bind, &stop)));
        }
        let mut holders = 0;
        if per_group {
            for n in 0..2 {
                let (o, bind) = (opts.clone(), source(30 + n));
                finite.push(Box::new(move || {
                    announce_only(&o, bind, o.max_message).map(Outcome::Huge)
                }));
            }
            for n in 0..4 {
                let (o, bind, stop) = (opts.clone(), source(40 + n), stop.clone());
                let ready = ready_tx.clone();
                holding.push(Box::new(move || hog(&o, bind, &stop, &ready)));
                holders += 1;
            }
            let (o, bind, stop) = (opts.clone(), source(80), stop.clone());
            let ready = ready_tx.clone();
            holding.push(Box::new(move || greedy(&o, bind, &stop, &ready)));
            holders += 1;
        }
        let go = Arc::new(Barrier::new(finite.len() + holding.len()));
        let spawn = |jobs: Vec<Job>| -> Vec<JoinHandle<Result<Outcome, String>>> {
            jobs.into_iter()
                .map(|job| {
                    let go = go.clone();
                    thread::spawn(move || {
                        go.wait();
                        job()
                    })
                })
                .collect()
        };
        let finite = spawn(finite);
        let holding = spawn(holding);
        Crowd {
            stop,
            finite,
            holding,
            outcomes: Vec::new(),
            ready,
            holders,
            well_behaved: opts.well_behaved,
            started: WallInstant::now(),
        }
    }

    /// Clients in all.
    pub fn clients(&self) -> usize {
        self.finite.len() + self.holding.len() + self.outcomes.len()
    }

    /// Waits for the clients that finish on their own, and for the
    /// holders to have their connections settled (at most `timeout`).
    pub fn settle(&mut self, timeout: Duration) -> Result<(), HostError> {
        for t in self.finite.drain(..) {
            self.outcomes.push(joined(t));
        }
        for _ in 0..self.holders {
            self.ready
                .recv_timeout(timeout)
                .map_err(|_| HostError::Transfer("a holding client never settled".into()))?;
        }
        self.holders = 0;
        Ok(())
    }

    /// Stops the clients that hold or keep silent; what every client saw.
    pub fn finish(mut self) -> CrowdReport {
        for t in self.finite.drain(..) {
            self.outcomes.push(joined(t));
        }
        self.stop.store(true, Ordering::Relaxed);
        for t in self.holding.drain(..) {
            self.outcomes.push(joined(t));
        }
        let mut r = CrowdReport {
            clients: self.outcomes.len(),
            well_behaved: self.well_behaved,
            seconds: self.started.elapsed().as_secs_f64(),
            ..CrowdReport::default()
        };
        for o in &self.outcomes {
            tally(&mut r, o);
        }
        r
    }
}

fn joined(t: JoinHandle<Result<Outcome, String>>) -> Result<Outcome, String> {
    t.join()
        .unwrap_or_else(|_| Err("a client thread panicked".into()))
}

/// Adds one client's outcome to the report; what it must not have seen
/// goes to `problems`.
fn tally(r: &mut CrowdReport, o: &Result<Outcome, String>) {
    let mut problem = |what: String| r.problems.push(what);
    match o {
        Err(e) => problem(e.clone()),
        Ok(Outcome::WellBehaved) => r.well_behaved_ok += 1,
        Ok(Outcome::BadKey(Status::RemoteInvalidKey)) => r.bad_key_refused += 1,
        Ok(Outcome::CrossKey(Status::RemoteInvalidKey)) => r.cross_key_refused += 1,
        Ok(Outcome::BadSize(app::REGION_BAD_SIZE)) => r.bad_size_refused += 1,
        Ok(Outcome::Twice {
            second,
            verified: TWICE_MESSAGES,
            corrupt: 0,
        }) if *second != app::REGION_OK => r.twice_refused_then_served += 1,
        Ok(Outcome::Abandoned) => r.abandoned += 1,
        Ok(Outcome::Silent(app::REGION_OK)) => r.silent += 1,
        Ok(Outcome::Huge(app::REGION_OVER_BUDGET)) => r.huge_refused += 1,
        Ok(Outcome::Hog(app::REGION_OK)) => r.hogs_granted += 1,
        Ok(Outcome::Hog(app::REGION_OVER_BUDGET)) => r.hogs_refused += 1,
        Ok(Outcome::Greedy { up, rejected }) => {
            r.greedy_up += up;
            r.greedy_rejected += rejected;
        }
        Ok(other) => problem(format!("unexpected outcome {other:?}")),
    }
}

/// A client node bound to `bind`, its secrets from the operating system.
fn bind_node(bind: SocketAddr, connections: u32) -> Result<Node, String> {
    Node::bind(&NodeConfig {
        bind,
        paths: 2,
        entropy_base: None,
        mtu: 1024,
        window: None,
        rate_mbps: 1000,
        accept: false,
        connections,
        receives_per_connection: 0,
        seed: None,
        ride_through: None,
        source_limits: None,
        protection: None,
    })
    .map_err(|e| format!("bind {bind}: {e}"))
}

fn well_behaved(o: &CrowdOptions, bind: SocketAddr, n: usize) -> Result<Outcome, String> {
    let mut node = bind_node(bind, 4)?;
    let op = if n % 5 == 4 {
        Operation::Read
    } else {
        Operation::Write
    };
    let s = run_client(
        &mut node,
        &ClientOptions {
            peer: o.peer,
            op,
            size: o.size,
            count: Some(o.count),
            duration: None,
            stall_timeout: o.timeout * 2,
            connect_timeout: o.timeout,
            seed: 1000 + n as u64,
        },
        |_| {},
    )
    .map_err(|e| format!("well-behaved client {n} from {bind}: {e}"))?;
    if s.integrity_ok && s.verified == o.count && s.corrupt == 0 {
        Ok(Outcome::WellBehaved)
    } else {
        Err(format!(
            "well-behaved client {n} from {bind}: {} of {} verified, {} corrupt",
            s.verified, o.count, s.corrupt
        ))
    }
}

/// One connection of a hand-driven client.
struct Conn {
    h: ConnHandle,
    control: Control,
    connected: bool,
    ended: Option<Event>,
    inbox: Vec<Message>,
    /// Completions of data requests (not control messages).
    done: Vec<Completion>,
}

/// The server's `REGION` answer to an announcement.
#[derive(Debug, Clone, Copy)]
struct RegionAnswer {
    status: u32,
    key: u32,
    addr: u64,
    slots: u32,
}

/// A client driven through the core's API.
struct Client {
    node: Node,
    conns: Vec<Conn>,
    timeout: Duration,
}

impl Client {
    fn new(o: &CrowdOptions, bind: SocketAddr) -> Result<Client, String> {
        Ok(Client {
            node: bind_node(bind, 16)?,
            conns: Vec::new(),
            timeout: o.timeout,
        })
    }

    /// Starts a connection to `peer` with its receives posted.
    fn connect(&mut self, peer: SocketAddr) -> Result<usize, String> {
        let h = self
            .node
            .connect(peer)
            .map_err(|e| format!("connect: {e:?}"))?;
        let control = Control::new(&mut self.node, h).map_err(|e| e.to_string())?;
        control
            .post_recvs(&mut self.node, h)
            .map_err(|e| format!("post receives: {e:?}"))?;
        self.node.flush();
        self.conns.push(Conn {
            h,
            control,
            connected: false,
            ended: None,
            inbox: Vec::new(),
            done: Vec::new(),
        });
        Ok(self.conns.len() - 1)
    }

    /// One turn; completions and events go to their connection.
    fn turn(&mut self) {
        self.node.turn(Duration::from_millis(10));
        while let Some(c) = self.node.completions.pop_front() {
            let Some(k) = self.conns.iter_mut().find(|k| k.h == c.conn) else {
                continue;
            };
            if c.opcode == Opcode::Recv {
                if c.status == Status::Success {
                    k.inbox.extend(k.control.received(&self.node, &c));
                    let _ = k.control.post_recv(&mut self.node, c.conn, c.wr_id as u32);
                }
            } else if c.wr_id < CONTROL_WR {
                k.done.push(c);
            }
        }
        while let Some(e) = self.node.events.pop_front() {
            let h = match e {
                Event::Connected(h) => h,
                Event::Closed { conn, .. }
                | Event::Failed { conn, .. }
                | Event::Incoming { conn, .. } => conn,
            };
            if let Some(k) = self.conns.iter_mut().find(|k| k.h == h) {
                match e {
                    Event::Connected(_) => k.connected = true,
                    _ => k.ended = Some(e),
                }
            }
        }
    }

    /// Turns until `done` holds; whether it did within the timeout.
    fn wait(&mut self, mut done: impl FnMut(&Client) -> bool) -> bool {
        let deadline = WallInstant::now() + self.timeout;
        while !done(self) {
            if WallInstant::now() >= deadline {
                return false;
            }
            self.turn();
        }
        true
    }

    fn wait_connected(&mut self, i: usize) -> Result<(), String> {
        self.wait(|c| c.conns[i].connected || c.conns[i].ended.is_some());
        match (&self.conns[i].connected, &self.conns[i].ended) {
            (true, None) => Ok(()),
            (_, ended) => Err(format!("handshake: {ended:?}")),
        }
    }

    fn send(&mut self, i: usize, m: &Message) -> Result<(), String> {
        let k = &mut self.conns[i];
        k.control
            .send(&mut self.node, k.h, m)
            .map_err(|e| format!("send: {e:?}"))
    }

    /// The next message on connection `i`.
    fn receive(&mut self, i: usize) -> Result<Message, String> {
        if !self.wait(|c| !c.conns[i].inbox.is_empty()) {
            return Err(format!("no answer (connection {:?})", self.conns[i].ended));
        }
        Ok(self.conns[i].inbox.remove(0))
    }

    /// Announces on connection `i`; the server's answer.
    fn announce_on(&mut self, i: usize, size: u32) -> Result<RegionAnswer, String> {
        self.send(
            i,
            &Message::Announce {
                op: Operation::Write,
                seed: SEED,
                size,
            },
        )?;
        match self.receive(i)? {
            Message::Region {
                status,
                key,
                addr,
                slots,
                ..
            } => Ok(RegionAnswer {
                status,
                key,
                addr,
                slots,
            }),
            m => Err(format!("expected REGION, got {m:?}")),
        }
    }

    /// A new connection to `peer` and its announcement.
    fn announce(&mut self, peer: SocketAddr, size: u32) -> Result<(usize, RegionAnswer), String> {
        let i = self.connect(peer)?;
        self.wait_connected(i)?;
        Ok((i, self.announce_on(i, size)?))
    }

    /// Posts one data request on connection `i` from a fresh local buffer
    /// holding `bytes`; its completion status.
    fn post_data(&mut self, i: usize, id: u64, op: Op, bytes: &[u8]) -> Result<Status, String> {
        let base = self.node.mem.alloc(bytes.len(), 0);
        if let Some(dst) = self.node.mem.slice_mut(base, bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        let key = self
            .node
            .ep
            .register_region(Region {
                base,
                len: bytes.len() as u64,
                access: Access::LOCAL_WRITE,
                pd: 0,
            })
            .map_err(|e| format!("register: {e:?}"))?;
        let wr = WorkRequest {
            id,
            op,
            local: LocalBuf {
                key,
                addr: base,
                len: bytes.len() as u32,
            },
        };
        let h = self.conns[i].h;
        self.node
            .post_send(h, wr)
            .map_err(|e| format!("post: {e:?}"))?;
        self.node.flush();
        self.wait(|c| c.conns[i].done.iter().any(|d| d.wr_id == id));
        self.conns[i]
            .done
            .iter()
            .find(|d| d.wr_id == id)
            .map(|d| d.status)
            .ok_or_else(|| format!("request {id} never completed"))
    }

    /// Closes connection `i` and sends the CLOSE.
    fn close(&mut self, i: usize) {
        let _ = self.node.ep.close(self.node.now(), self.conns[i].h);
        self.node.flush();
    }

    /// Keeps answering (keep-alives, retransmissions) until `stop`.
    fn hold(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.turn();
        }
    }
}

/// Waits, doing nothing at all, until `stop`.
fn stay_silent(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
    }
}

fn bad_key(o: &CrowdOptions, bind: SocketAddr) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    let (i, r) = c.announce(o.peer, SMALL)?;
    if r.status != app::REGION_OK {
        return Err(format!("bad-key client refused a region ({})", r.status));
    }
    // The key's random upper bits flipped: a key the server never gave.
    let remote = MemoryTarget {
        key: r.key ^ 0x8000_0000,
        addr: r.addr,
    };
    let op = Op::Write { remote };
    Ok(Outcome::BadKey(c.post_data(
        i,
        1,
        op,
        &[0x5a; SMALL as usize],
    )?))
}

fn cross_key(o: &CrowdOptions, bind: SocketAddr) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    let (_, first) = c.announce(o.peer, SMALL)?;
    let (b, second) = c.announce(o.peer, SMALL)?;
    if (first.status, second.status) != (app::REGION_OK, app::REGION_OK) {
        return Err(format!(
            "cross-key client refused regions ({}, {})",
            first.status, second.status
        ));
    }
    // The first connection's key and address, used on the second
    // (another protection domain at the server).
    let op = Op::Write {
        remote: MemoryTarget {
            key: first.key,
            addr: first.addr,
        },
    };
    Ok(Outcome::CrossKey(c.post_data(
        b,
        1,
        op,
        &[0xa5; SMALL as usize],
    )?))
}

fn announce_only(o: &CrowdOptions, bind: SocketAddr, size: u32) -> Result<u32, String> {
    let mut c = Client::new(o, bind)?;
    let (i, r) = c.announce(o.peer, size)?;
    c.close(i);
    Ok(r.status)
}

fn twice(o: &CrowdOptions, bind: SocketAddr) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    let (i, r) = c.announce(o.peer, SMALL)?;
    if r.status != app::REGION_OK || r.slots == 0 {
        return Err(format!(
            "twice-announcing client refused a region ({})",
            r.status
        ));
    }
    let second = c.announce_on(i, SMALL)?.status;
    // Still served after the refusal: messages verified by the server.
    for m in 0..TWICE_MESSAGES {
        let mut data = vec![0u8; SMALL as usize];
        app::fill_pattern(SEED, m, &mut data);
        let remote = MemoryTarget {
            key: r.key,
            addr: r.addr + (m % u64::from(r.slots)) * u64::from(SMALL),
        };
        let op = Op::WriteImm {
            remote,
            imm: m as u32,
        };
        let status = c.post_data(i, m + 1, op, &data)?;
        if status != Status::Success {
            return Err(format!("twice-announcing client's write {m}: {status:?}"));
        }
    }
    c.send(
        i,
        &Message::Done {
            messages: TWICE_MESSAGES,
            bytes: TWICE_MESSAGES * u64::from(SMALL),
        },
    )?;
    let outcome = match c.receive(i)? {
        Message::Report {
            verified, corrupt, ..
        } => Outcome::Twice {
            second,
            verified,
            corrupt,
        },
        m => return Err(format!("expected REPORT, got {m:?}")),
    };
    c.close(i);
    Ok(outcome)
}

fn abandoned(o: &CrowdOptions, bind: SocketAddr, stop: &AtomicBool) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    // The CONNECT leaves in `connect`'s flush; then nothing is received,
    // answered or sent.
    c.connect(o.peer)?;
    stay_silent(stop);
    Ok(Outcome::Abandoned)
}

fn silent(o: &CrowdOptions, bind: SocketAddr, stop: &AtomicBool) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    let (_, r) = c.announce(o.peer, SMALL)?;
    stay_silent(stop);
    Ok(Outcome::Silent(r.status))
}

fn hog(
    o: &CrowdOptions,
    bind: SocketAddr,
    stop: &AtomicBool,
    ready: &mpsc::Sender<()>,
) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    let announced = c.announce(o.peer, o.hog_size);
    let _ = ready.send(());
    let (_, r) = announced?;
    c.hold(stop);
    Ok(Outcome::Hog(r.status))
}

fn greedy(
    o: &CrowdOptions,
    bind: SocketAddr,
    stop: &AtomicBool,
    ready: &mpsc::Sender<()>,
) -> Result<Outcome, String> {
    let mut c = Client::new(o, bind)?;
    let mut opened = Ok(());
    for _ in 0..o.greedy_connections {
        if let Err(e) = c.connect(o.peer) {
            opened = Err(e);
            break;
        }
    }
    let up = |c: &Client| {
        c.conns
            .iter()
            .filter(|k| k.connected && k.ended.is_none())
            .count()
    };
    let rejected = |c: &Client| {
        c.conns
            .iter()
            .filter(|k| {
                matches!(
                    k.ended,
                    Some(Event::Closed {
                        reason: CloseReason::Rejected,
                        ..
                    })
                )
            })
            .count()
    };
    // Every connection has its answer: up (and still up after a moment,
    // in case a refusal follows the handshake), or refused.
    c.wait(|c| up(c) + rejected(c) == c.conns.len());
    let settle = WallInstant::now() + Duration::from_millis(500);
    c.wait(|_| WallInstant::now() >= settle);
    let outcome = Outcome::Greedy {
        up: up(&c),
        rejected: rejected(&c),
    };
    let _ = ready.send(());
    opened?;
    c.hold(stop);
    Ok(outcome)
}
