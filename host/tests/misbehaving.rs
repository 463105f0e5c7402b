//! 64 concurrent clients against `metaroce serve` (the binary, as users
//! run it), 24 of them misbehaving, from 26 loopback source addresses
//! (127.0.0.x) so the per-peer budgets apply to each group on its own
//! (issue 12, point 4):
//!
//! | clients | from | what they do | what the server must do |
//! |---|---|---|---|
//! | 40 | 127.0.0.10-19, 4 each | write or read 32 messages, verified | serve every one, integrity OK |
//! | 3 | .20-.22 | WRITE with a wrong key | refuse (NAK invalid key), counted |
//! | 1 | .23 | WRITE on one connection with another's key | refuse, counted |
//! | 2 | .30, .31 | announce 4 MiB messages (256 MiB) | refuse: over the peer's bytes |
//! | 1 | .32 | announce a size past the maximum | refuse: bad size |
//! | 4 | .40-.43 | announce 1 MiB messages (64 MiB) and hold | grant 3, refuse 1: over the total |
//! | 2 | .50, .51 | announce twice, then write 4 messages | refuse the second, verify the 4 |
//! | 6 | .60 | CONNECT, then silence | nothing (whatever the handshake) |
//! | 4 | .70 | announce, then silence (never close) | fail them by the idle timeout |
//! | 1 | .80 | open 10 connections and hold them | serve 8, refuse 2 (peer's budget) |
//!
//! The clients use the library's client for the well-behaved runs and the
//! core's API (connect, post, poll) for the rest, so nothing here assumes
//! how the handshake goes. The server never exits on its own: the test
//! checks it is still running, stops it with SIGTERM and reads its JSON
//! summary, which must count each refusal under its reason. About 12 s,
//! most of it the server's 10 s idle timeout reaping the silent clients.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, RecvRequest, Region, Status, WorkRequest,
};
use metaroce_core::wire::{CloseReason, MemoryTarget};
use metaroce_core::Event;
use metaroce_host::app::{self, Message, Operation, CONTROL_LEN};
use metaroce_host::session::{run_client, ClientOptions, Summary};
use metaroce_host::{Node, NodeConfig};
use serde_json::Value;

/// The server's budgets: 8 connections and 96 MiB per peer address,
/// 224 MiB in all (three 64 MiB hogs and everyone else fit, a fourth
/// hog does not, whatever the order of arrival).
const SERVE_BUDGET: [&str; 6] = [
    "--connections-per-peer",
    "8",
    "--mib-per-peer",
    "96",
    "--mib-total",
    "224",
];
const WELL_BEHAVED: usize = 40;
const MESSAGES: u64 = 32;
const MESSAGE_SIZE: u32 = 8192;
const HOG_SIZE: u32 = 1 << 20;
const GREEDY_CONNECTIONS: usize = 10;
const PER_PEER_CONNECTIONS: usize = 8;
const WAIT: Duration = Duration::from_secs(10);
/// Control receive slots each client connection keeps posted.
const RECV_SLOTS: u32 = 8;
const CONTROL_WR: u64 = 1 << 62;

/// `metaroce serve` and its output lines.
struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
    addr: SocketAddr,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_metaroce"))
            .args(["serve", "--bind", "127.0.0.1:0", "--json", "--paths", "2"])
            .args(SERVE_BUDGET)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start metaroce serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = lines.recv_timeout(WAIT).expect("listening line");
        let v: Value = serde_json::from_str(&first).expect("JSON");
        let addr = v["listening"].as_str().expect("address").parse().unwrap();
        Server { child, lines, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client node bound to `ip`, seeded by the operating system (as the
/// `metaroce` programs are).
fn node(ip: &str) -> Node {
    Node::bind(&NodeConfig {
        bind: format!("{ip}:0").parse().unwrap(),
        paths: 2,
        entropy_base: None,
        mtu: 1024,
        rate_mbps: 1000,
        accept: false,
        connections: 16,
        receives_per_connection: 0,
        seed: None,
    })
    .unwrap_or_else(|e| panic!("bind {ip}: {e}"))
}

/// One connection of a hand-driven client: its control buffers (receive
/// slots, then one send slot) and what arrived on it.
struct Conn {
    h: ConnHandle,
    base: u64,
    key: u32,
    sends: u64,
    connected: bool,
    ended: Option<Event>,
    inbox: VecDeque<Message>,
    /// Completions of data requests (not control messages).
    done: Vec<Completion>,
}

/// A client driven through the core's API.
struct Client {
    node: Node,
    conns: Vec<Conn>,
}

impl Client {
    fn new(ip: &str) -> Client {
        Client {
            node: node(ip),
            conns: Vec::new(),
        }
    }

    /// Starts a connection to `peer` with its receives posted; returns
    /// its index.
    fn connect(&mut self, peer: SocketAddr) -> usize {
        let h = self.node.connect(peer).expect("connect");
        let len = (RECV_SLOTS + 1) * CONTROL_LEN;
        let base = self.node.mem.alloc(len as usize, 0);
        let key = self
            .node
            .ep
            .register_region(Region {
                base,
                len: u64::from(len),
                access: Access::LOCAL_WRITE,
                pd: 0,
            })
            .expect("register control buffers");
        for slot in 0..RECV_SLOTS {
            self.post_recv(h, base, key, slot);
        }
        self.node.flush();
        self.conns.push(Conn {
            h,
            base,
            key,
            sends: 0,
            connected: false,
            ended: None,
            inbox: VecDeque::new(),
            done: Vec::new(),
        });
        self.conns.len() - 1
    }

    fn post_recv(&mut self, h: ConnHandle, base: u64, key: u32, slot: u32) {
        let rr = RecvRequest {
            id: u64::from(slot),
            local: LocalBuf {
                key,
                addr: base + u64::from(slot * CONTROL_LEN),
                len: CONTROL_LEN,
            },
        };
        self.node.post_recv(h, rr).expect("post receive");
    }

    /// One turn of the node; completions and events go to their
    /// connection.
    fn turn(&mut self) {
        self.node.turn(Duration::from_millis(10));
        while let Some(c) = self.node.completions.pop_front() {
            let Some(i) = self.conns.iter().position(|k| k.h == c.conn) else {
                continue;
            };
            let (base, key) = (self.conns[i].base, self.conns[i].key);
            if c.opcode == Opcode::Recv {
                if c.status == Status::Success {
                    let addr = base + c.wr_id * u64::from(CONTROL_LEN);
                    let msg = self
                        .node
                        .mem
                        .slice(addr, c.byte_len.min(CONTROL_LEN) as usize)
                        .and_then(Message::decode);
                    self.conns[i].inbox.extend(msg);
                    self.post_recv(c.conn, base, key, c.wr_id as u32);
                }
            } else if c.wr_id < CONTROL_WR {
                self.conns[i].done.push(c);
            }
        }
        while let Some(e) = self.node.events.pop_front() {
            let h = match e {
                Event::Connected(h) => h,
                Event::Closed { conn, .. } | Event::Failed { conn, .. } => conn,
                Event::Incoming { conn, .. } => conn,
            };
            if let Some(k) = self.conns.iter_mut().find(|k| k.h == h) {
                match e {
                    Event::Connected(_) => k.connected = true,
                    _ => k.ended = Some(e),
                }
            }
        }
    }

    /// Turns until `done` holds or `WAIT` passes; returns whether it held.
    fn wait(&mut self, mut done: impl FnMut(&Client) -> bool) -> bool {
        let deadline = Instant::now() + WAIT;
        while !done(self) {
            if Instant::now() >= deadline {
                return false;
            }
            self.turn();
        }
        true
    }

    fn wait_connected(&mut self, i: usize) {
        assert!(
            self.wait(|c| c.conns[i].connected || c.conns[i].ended.is_some()),
            "no handshake"
        );
        assert!(self.conns[i].connected, "{:?}", self.conns[i].ended);
    }

    fn send(&mut self, i: usize, m: &Message) {
        let k = &mut self.conns[i];
        let addr = k.base + u64::from(RECV_SLOTS * CONTROL_LEN);
        let bytes = m.encode();
        k.sends += 1;
        let (h, key, id) = (k.h, k.key, CONTROL_WR + k.sends);
        self.node
            .mem
            .slice_mut(addr, bytes.len())
            .unwrap()
            .copy_from_slice(&bytes);
        let wr = WorkRequest {
            id,
            op: Op::Send,
            local: LocalBuf {
                key,
                addr,
                len: bytes.len() as u32,
            },
        };
        self.node.post_send(h, wr).expect("post send");
        self.node.flush();
    }

    /// The next message on connection `i`.
    fn receive(&mut self, i: usize) -> Message {
        assert!(
            self.wait(|c| !c.conns[i].inbox.is_empty()),
            "no answer; connection {:?}",
            self.conns[i].ended
        );
        self.conns[i].inbox.pop_front().unwrap()
    }

    /// Connects and announces; returns the connection and the `REGION`
    /// answer (status, key, address, slots).
    fn announce(&mut self, peer: SocketAddr, size: u32) -> (usize, (u32, u32, u64, u32)) {
        let i = self.connect(peer);
        self.wait_connected(i);
        let region = self.announce_on(i, size);
        (i, region)
    }

    fn announce_on(&mut self, i: usize, size: u32) -> (u32, u32, u64, u32) {
        self.send(
            i,
            &Message::Announce {
                op: Operation::Write,
                seed: SEED,
                size,
            },
        );
        match self.receive(i) {
            Message::Region {
                status,
                key,
                addr,
                slots,
                ..
            } => (status, key, addr, slots),
            m => panic!("expected REGION, got {m:?}"),
        }
    }

    /// Posts one data request on connection `i` from a local buffer and
    /// waits for its completion status.
    fn post_data(&mut self, i: usize, id: u64, op: Op, bytes: &[u8]) -> Status {
        let base = self.node.mem.alloc(bytes.len(), 0);
        self.node
            .mem
            .slice_mut(base, bytes.len())
            .unwrap()
            .copy_from_slice(bytes);
        let key = self
            .node
            .ep
            .register_region(Region {
                base,
                len: bytes.len() as u64,
                access: Access::LOCAL_WRITE,
                pd: 0,
            })
            .unwrap();
        let h = self.conns[i].h;
        let wr = WorkRequest {
            id,
            op,
            local: LocalBuf {
                key,
                addr: base,
                len: bytes.len() as u32,
            },
        };
        self.node.post_send(h, wr).expect("post");
        self.node.flush();
        assert!(
            self.wait(|c| c.conns[i].done.iter().any(|d| d.wr_id == id)),
            "request {id} never completed"
        );
        self.conns[i]
            .done
            .iter()
            .find(|d| d.wr_id == id)
            .unwrap()
            .status
    }

    /// Keeps the node answering (keep-alives, retransmissions) until
    /// `stop`.
    fn hold(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.turn();
        }
    }
}

/// What each client saw.
#[derive(Debug)]
enum Outcome {
    WellBehaved(Box<Summary>),
    BadKey(Status),
    CrossKey(Status),
    Huge(u32),
    BadSize(u32),
    Hog(u32),
    Twice {
        second: u32,
        verified: u64,
        corrupt: u64,
    },
    Abandoned,
    Silent(u32),
    Greedy {
        connected: usize,
        rejected: usize,
    },
}

fn well_behaved(ip: &str, peer: SocketAddr, n: usize) -> Outcome {
    let mut node = node(ip);
    let op = if n % 5 == 4 {
        Operation::Read
    } else {
        Operation::Write
    };
    let summary = run_client(
        &mut node,
        &ClientOptions {
            peer,
            op,
            size: MESSAGE_SIZE,
            count: Some(MESSAGES),
            duration: None,
            stall_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(10),
            seed: 1000 + n as u64,
        },
        |_| {},
    )
    .unwrap_or_else(|e| panic!("well-behaved client {n} from {ip}: {e}"));
    Outcome::WellBehaved(Box::new(summary))
}

fn bad_key(ip: &str, peer: SocketAddr) -> Outcome {
    let mut c = Client::new(ip);
    let (i, (status, key, addr, _)) = c.announce(peer, 4096);
    assert_eq!(status, app::REGION_OK);
    // The key's random upper bits flipped: a key the server never gave.
    let remote = MemoryTarget {
        key: key ^ 0x8000_0000,
        addr,
    };
    Outcome::BadKey(c.post_data(i, 1, Op::Write { remote }, &[0x5a; 4096]))
}

fn cross_key(ip: &str, peer: SocketAddr) -> Outcome {
    let mut c = Client::new(ip);
    let (_, (sa, key_a, addr_a, _)) = c.announce(peer, 4096);
    let (b, (sb, _, _, _)) = c.announce(peer, 4096);
    assert_eq!((sa, sb), (app::REGION_OK, app::REGION_OK));
    // The first connection's key and address, used on the second
    // (another protection domain at the server).
    let remote = MemoryTarget {
        key: key_a,
        addr: addr_a,
    };
    Outcome::CrossKey(c.post_data(b, 1, Op::Write { remote }, &[0xa5; 4096]))
}

fn announce_only(ip: &str, peer: SocketAddr, size: u32) -> u32 {
    let mut c = Client::new(ip);
    let (i, (status, ..)) = c.announce(peer, size);
    let _ = c.node.ep.close(c.node.now(), c.conns[i].h);
    c.node.flush();
    status
}

fn hog(ip: &str, peer: SocketAddr, stop: &AtomicBool, ready: &mpsc::Sender<()>) -> Outcome {
    let mut c = Client::new(ip);
    let (_, (status, ..)) = c.announce(peer, HOG_SIZE);
    let _ = ready.send(());
    c.hold(stop);
    Outcome::Hog(status)
}

/// The pattern seed every hand-driven announcement carries.
const SEED: u64 = 0xbad;

fn twice(ip: &str, peer: SocketAddr) -> Outcome {
    let mut c = Client::new(ip);
    let (i, (status, key, addr, slots)) = c.announce(peer, 4096);
    assert_eq!(status, app::REGION_OK);
    let (second, ..) = c.announce_on(i, 4096);
    // Still served: four verified messages after the refusal.
    for m in 0..4u64 {
        let mut data = vec![0u8; 4096];
        app::fill_pattern(SEED, m, &mut data);
        let remote = MemoryTarget {
            key,
            addr: addr + (m % u64::from(slots)) * 4096,
        };
        let op = Op::WriteImm {
            remote,
            imm: m as u32,
        };
        assert_eq!(c.post_data(i, m + 1, op, &data), Status::Success);
    }
    c.send(
        i,
        &Message::Done {
            messages: 4,
            bytes: 4 * 4096,
        },
    );
    let (verified, corrupt) = match c.receive(i) {
        Message::Report {
            verified, corrupt, ..
        } => (verified, corrupt),
        m => panic!("expected REPORT, got {m:?}"),
    };
    let _ = c.node.ep.close(c.node.now(), c.conns[i].h);
    c.node.flush();
    Outcome::Twice {
        second,
        verified,
        corrupt,
    }
}

fn abandoned(ip: &str, peer: SocketAddr, stop: &AtomicBool) -> Outcome {
    let mut c = Client::new(ip);
    c.connect(peer);
    // The CONNECT left in `connect`'s flush; from now on nothing is
    // received, answered or sent.
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
    }
    Outcome::Abandoned
}

fn silent(ip: &str, peer: SocketAddr, stop: &AtomicBool) -> Outcome {
    let mut c = Client::new(ip);
    let (_, (status, ..)) = c.announce(peer, 4096);
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(50));
    }
    Outcome::Silent(status)
}

fn greedy(ip: &str, peer: SocketAddr, stop: &AtomicBool, ready: &mpsc::Sender<()>) -> Outcome {
    let mut c = Client::new(ip);
    for _ in 0..GREEDY_CONNECTIONS {
        c.connect(peer);
    }
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
    // Every connection answered: up (and still up), or refused.
    let settled = c.wait(|c| {
        rejected(c) == GREEDY_CONNECTIONS - PER_PEER_CONNECTIONS
            && c.conns
                .iter()
                .filter(|k| k.connected && k.ended.is_none())
                .count()
                == PER_PEER_CONNECTIONS
    });
    let connected = c
        .conns
        .iter()
        .filter(|k| k.connected && k.ended.is_none())
        .count();
    let outcome = Outcome::Greedy {
        connected,
        rejected: rejected(&c),
    };
    let _ = ready.send(());
    if settled {
        c.hold(stop);
    }
    outcome
}

#[test]
fn the_server_keeps_serving_64_clients_while_24_misbehave() {
    let started = Instant::now();
    let mut server = Server::start();
    let peer = server.addr;
    let stop = Arc::new(AtomicBool::new(false));
    // The holders (4 hogs, the greedy client) say when their connections
    // are settled.
    let (ready_tx, ready) = mpsc::channel();
    type Job = Box<dyn FnOnce() -> Outcome + Send>;
    // Clients that finish on their own, and those that hold (or stay
    // silent) until `stop`.
    let mut finite: Vec<Job> = Vec::new();
    let mut holding: Vec<Job> = Vec::new();
    for n in 0..WELL_BEHAVED {
        let ip = format!("127.0.0.{}", 10 + n / 4);
        finite.push(Box::new(move || well_behaved(&ip, peer, n)));
    }
    for n in 0..3 {
        finite.push(Box::new(move || {
            bad_key(&format!("127.0.0.{}", 20 + n), peer)
        }));
    }
    finite.push(Box::new(move || cross_key("127.0.0.23", peer)));
    for n in 0..2 {
        finite.push(Box::new(move || {
            Outcome::Huge(announce_only(
                &format!("127.0.0.{}", 30 + n),
                peer,
                app::MAX_MESSAGE,
            ))
        }));
    }
    finite.push(Box::new(move || {
        Outcome::BadSize(announce_only("127.0.0.32", peer, app::MAX_MESSAGE + 1))
    }));
    for n in 0..2 {
        finite.push(Box::new(move || {
            twice(&format!("127.0.0.{}", 50 + n), peer)
        }));
    }
    for n in 0..4 {
        let (stop, ready) = (stop.clone(), ready_tx.clone());
        holding.push(Box::new(move || {
            hog(&format!("127.0.0.{}", 40 + n), peer, &stop, &ready)
        }));
    }
    for _ in 0..6 {
        let stop = stop.clone();
        holding.push(Box::new(move || abandoned("127.0.0.60", peer, &stop)));
    }
    for _ in 0..4 {
        let stop = stop.clone();
        holding.push(Box::new(move || silent("127.0.0.70", peer, &stop)));
    }
    {
        let (stop, ready) = (stop.clone(), ready_tx.clone());
        holding.push(Box::new(move || greedy("127.0.0.80", peer, &stop, &ready)));
    }
    assert_eq!(finite.len() + holding.len(), 64);
    let go = Arc::new(Barrier::new(finite.len() + holding.len()));
    let spawn = |jobs: Vec<Job>| -> Vec<thread::JoinHandle<Outcome>> {
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
    let mut outcomes: Vec<Outcome> = finite
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    for _ in 0..5 {
        ready
            .recv_timeout(Duration::from_secs(30))
            .expect("a holder never settled");
    }

    // The silent clients' connections must be failed by the server's idle
    // timeout (10 s on host), one report each, while the rest goes on.
    let mut reports: Vec<Value> = Vec::new();
    let silent_failed = |r: &[Value]| {
        r.iter()
            .filter(|v| {
                v["peer"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("127.0.0.70:"))
                    && v["closed"] == "IdleTimeout"
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while silent_failed(&reports) < 4 && Instant::now() < deadline {
        if let Ok(line) = server.lines.recv_timeout(Duration::from_millis(200)) {
            reports.push(serde_json::from_str(&line).expect("JSON report"));
        }
    }
    assert_eq!(silent_failed(&reports), 4, "silent clients not reaped");
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited while clients misbehaved"
    );

    // Ask for the summary while the holders are still connected.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut summary = Value::Null;
    while let Ok(line) = server.lines.recv_timeout(WAIT) {
        let v: Value = serde_json::from_str(&line).expect("JSON line");
        if v.get("summary").is_some() {
            summary = v["summary"].clone();
            break;
        }
        reports.push(v);
    }
    let status = server.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    for t in holding {
        outcomes.push(t.join().expect("client thread"));
    }
    eprintln!("summary: {summary}");
    assert!(status.success(), "serve exited with {status}");

    // Every client saw what it should have.
    let abandoned = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Abandoned))
        .count();
    assert_eq!(abandoned, 6);
    let mut well_behaved = 0;
    let mut hogs_granted = 0;
    for o in &outcomes {
        match o {
            Outcome::WellBehaved(s) => {
                assert!(s.integrity_ok, "{s:?}");
                assert_eq!(
                    (s.completions, s.verified, s.corrupt),
                    (MESSAGES, MESSAGES, 0)
                );
                well_behaved += 1;
            }
            Outcome::BadKey(st) | Outcome::CrossKey(st) => {
                assert_eq!(*st, Status::RemoteInvalidKey, "{o:?}");
            }
            Outcome::Huge(st) => assert_eq!(*st, app::REGION_OVER_BUDGET),
            Outcome::BadSize(st) => assert_eq!(*st, app::REGION_BAD_SIZE),
            Outcome::Hog(st) => {
                assert!([app::REGION_OK, app::REGION_OVER_BUDGET].contains(st));
                hogs_granted += usize::from(*st == app::REGION_OK);
            }
            Outcome::Twice {
                second,
                verified,
                corrupt,
            } => {
                assert_ne!(*second, app::REGION_OK);
                assert_eq!((*verified, *corrupt), (4, 0));
            }
            Outcome::Silent(st) => assert_eq!(*st, app::REGION_OK),
            Outcome::Greedy {
                connected,
                rejected,
            } => assert_eq!(
                (*connected, *rejected),
                (
                    PER_PEER_CONNECTIONS,
                    GREEDY_CONNECTIONS - PER_PEER_CONNECTIONS
                )
            ),
            Outcome::Abandoned => {}
        }
    }
    assert_eq!(well_behaved, WELL_BEHAVED);
    assert_eq!(hogs_granted, 3);

    // The server counted every refusal under its reason.
    let s = &summary["server"];
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    assert_eq!(n(&s["refused_peer_connections"]), 2, "{summary}");
    assert_eq!(n(&s["refused_peer_bytes"]), 2, "{summary}");
    assert_eq!(n(&s["refused_total_bytes"]), 1, "{summary}");
    assert_eq!(n(&s["refused_over_budget"]), 3, "{summary}");
    assert_eq!(n(&s["refused_bad_size"]), 1, "{summary}");
    assert_eq!(n(&s["refused_second_announce"]), 2, "{summary}");
    assert!(n(&s["idle_timeouts"]) >= 4, "{summary}");
    let refused = &summary["endpoint"]["refused"];
    assert!(n(&refused["nak_invalid_key"]) >= 4, "{summary}");
    // The holders' connections were open when it summed up: 4 hogs and
    // the greedy client's 8.
    assert!(n(&summary["open"]) >= 12, "{summary}");
    // Nothing anyone wrote was corrupted, and every well-behaved writer's
    // messages were verified by the server.
    assert!(reports
        .iter()
        .all(|r| r["integrity_ok"].as_bool() == Some(true)));
    let verified_writers = reports
        .iter()
        .filter(|r| r["operation"] == "write" && r["verified"].as_u64() == Some(MESSAGES))
        .count();
    assert_eq!(verified_writers, WELL_BEHAVED - WELL_BEHAVED / 5);
    eprintln!(
        "64 clients, 24 misbehaving: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
