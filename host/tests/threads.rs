//! `serve --threads 2` on loopback: several clients at once, every byte
//! checked; both engine threads serve connections, each connection is
//! served by exactly one thread (its table slot lies in that thread's
//! shard), and the node-wide books come back to zero. Also `hold` against
//! it (connections spread, every one answered) and the binary's
//! `--threads` summary.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use metaroce_core::Shard;
use metaroce_host::app::Operation;
use metaroce_host::session::{run_client, run_hold, ClientOptions, HoldOptions, PeerBudget};
use metaroce_host::shard::{self, ShardedConfig, ShardedServer, ThreadOutcome};
use metaroce_host::{Node, NodeConfig};

const THREADS: usize = 2;
const CONNECTIONS: u32 = 64;

fn config(accept: bool, connections: u32, seed: u64) -> NodeConfig {
    NodeConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        paths: 4,
        entropy_base: None,
        mtu: 1024,
        window: None,
        rate_mbps: 1000,
        accept,
        connections,
        receives_per_connection: if accept {
            metaroce_host::session::SERVER_RECEIVES
        } else {
            0
        },
        seed: Some(seed),
        ride_through: None,
        source_limits: None,
        protection: None,
    }
}

/// A sharded server on loopback, run on its own threads until `reports`
/// connections ended or `stop` is set.
fn start_server(
    reports: usize,
    stop: Arc<AtomicBool>,
) -> (
    SocketAddr,
    Vec<SocketAddr>,
    thread::JoinHandle<Vec<ThreadOutcome>>,
) {
    start_server_with(PeerBudget::default(), reports, stop)
}

fn start_server_with(
    budget: PeerBudget,
    reports: usize,
    stop: Arc<AtomicBool>,
) -> (
    SocketAddr,
    Vec<SocketAddr>,
    thread::JoinHandle<Vec<ThreadOutcome>>,
) {
    let server = ShardedServer::bind(&ShardedConfig {
        node: config(true, CONNECTIONS, 1),
        threads: THREADS,
        budget,
    })
    .expect("bind the sharded server");
    let addr = server.local_addr();
    let ports = server.thread_addrs();
    let ledger = server.ledger().clone();
    let handle = thread::spawn(move || {
        let ended = AtomicUsize::new(0);
        let outcomes = server
            .run(
                |_| ended.fetch_add(1, Ordering::Relaxed) + 1 >= reports,
                || stop.load(Ordering::Relaxed),
            )
            .expect("run");
        if outcomes.iter().all(|o| o.server.open_connections() == 0) {
            assert_eq!(ledger.holdings(), (0, 0), "every booking given back");
        }
        outcomes
    });
    (addr, ports, handle)
}

fn client(peer: SocketAddr, op: Operation, seed: u64) -> metaroce_host::session::Summary {
    let mut node = Node::bind(&config(false, 4, 100 + seed)).expect("bind client");
    run_client(
        &mut node,
        &ClientOptions {
            peer,
            op,
            size: 8192,
            count: Some(40),
            duration: None,
            stall_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            seed,
        },
        |_| {},
    )
    .expect("client run")
}

#[test]
fn several_clients_on_two_engine_threads() {
    const CLIENTS: u64 = 8;
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, ports, server) = start_server(CLIENTS as usize, stop.clone());
    assert_eq!(ports.len(), THREADS);
    assert_eq!(ports[0], addr, "thread 0 receives on the public port");
    assert_ne!(ports[0].port(), ports[1].port());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let op = if k % 3 == 2 {
                Operation::Read
            } else {
                Operation::Write
            };
            thread::spawn(move || (op, client(addr, op, k)))
        })
        .collect();
    for c in clients {
        let (op, summary) = c.join().expect("client thread");
        assert!(summary.integrity_ok, "{summary:?}");
        assert_eq!(summary.completions, 40, "{op:?}");
        assert_eq!(summary.verified, 40, "{op:?}");
    }
    // The server stops once every connection ended (its last reports
    // come as the clients' closes are handled); a deadline in case not.
    let deadline = thread::spawn(move || {
        thread::sleep(Duration::from_secs(20));
        stop.store(true, Ordering::Relaxed);
    });
    let outcomes = server.join().expect("server thread");
    drop(deadline);
    assert_eq!(outcomes.len(), THREADS);
    let table = CONNECTIONS;
    let mut reports = 0;
    for o in &outcomes {
        assert!(
            o.server.counters().connections > 0,
            "thread {} served no connection: {:?}",
            o.thread,
            shard::thread_summaries(&outcomes)
        );
        for r in &o.server.finished {
            assert_eq!(r.thread, o.thread);
            assert_eq!(
                Shard::owner(r.slot, THREADS as u32, table) as usize,
                o.thread,
                "slot {} reported by thread {}",
                r.slot,
                o.thread
            );
            assert!(r.integrity_ok, "{r:?}");
            reports += 1;
        }
    }
    // Every client connection was adopted exactly once, by one thread.
    let total = shard::total_counters(&outcomes);
    assert_eq!(total.connections, CLIENTS, "{total:?}");
    assert_eq!(reports, CLIENTS as usize);
    // Clients send to the port their ACCEPT named: only CONNECTs cross.
    let steering = shard::total_steering(&outcomes);
    assert_eq!(steering.packets_forwarded, 0, "{steering:?}");
    assert_eq!(steering.ring_full, 0, "{steering:?}");
    assert_eq!(steering.received_forwarded, steering.connects_forwarded);
}

#[test]
fn hold_spreads_connections_over_both_threads() {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, _, server) = start_server(usize::MAX, stop.clone());
    let mut node = Node::bind(&config(false, 48, 7)).expect("bind client");
    let summary = run_hold(
        &mut node,
        &HoldOptions {
            peer: addr,
            connections: 48,
            timeout: Duration::from_secs(30),
        },
    )
    .expect("hold");
    assert!(summary.all_answered(), "{summary:?}");
    // Each connection's packets go to the port its ACCEPT named: the
    // client's peers are both threads' ports.
    stop.store(true, Ordering::Relaxed);
    let outcomes = server.join().expect("server thread");
    let per_thread: Vec<u64> = outcomes
        .iter()
        .map(|o| o.server.counters().connections)
        .collect();
    assert_eq!(per_thread.iter().sum::<u64>(), 48);
    // The CONNECT hash spreads 48 connections: neither thread gets fewer
    // than 8 unless the hash is broken (binomial: p < 1e-5).
    assert!(per_thread.iter().all(|&n| n >= 8), "{per_thread:?}");
}

/// The budget of connections per peer address holds for the node: 8
/// connections from one address, spread over both threads, 3 served.
#[test]
fn a_peer_budget_holds_for_the_node_not_per_thread() {
    let stop = Arc::new(AtomicBool::new(false));
    let budget = PeerBudget {
        connections_per_peer: 3,
        ..PeerBudget::default()
    };
    let (addr, _, server) = start_server_with(budget, usize::MAX, stop.clone());
    let mut node = Node::bind(&config(false, 8, 9)).expect("bind client");
    let summary = run_hold(
        &mut node,
        &HoldOptions {
            peer: addr,
            connections: 8,
            timeout: Duration::from_secs(20),
        },
    )
    .expect("hold");
    assert_eq!((summary.answered, summary.refused), (3, 5), "{summary:?}");
    stop.store(true, Ordering::Relaxed);
    let outcomes = server.join().expect("server thread");
    let adopted: Vec<u64> = outcomes
        .iter()
        .map(|o| o.server.counters().connections)
        .collect();
    assert!(adopted.iter().all(|&n| n > 0), "{adopted:?}");
    // Exactly the budget is served, node-wide. A refused initiator whose
    // handshake timer fired before the refusal reached it (a loaded
    // machine) repeats its CONNECT; a copy that arrives after the refused
    // connection was released opens a new one (spec 4.2.2), refused
    // again: so 8 or more arrive, every one beyond 8 such a repeat.
    let total = shard::total_counters(&outcomes);
    assert_eq!(total.refused_no_buffers, 0, "{total:?}");
    assert_eq!(
        total.connections - total.refused_peer_connections,
        3,
        "{total:?}"
    );
    assert!(total.refused_peer_connections >= 5, "{total:?}");
}

#[test]
fn the_binary_serves_on_two_threads_and_sums_up() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        common::skip(
            "the_binary_serves_on_two_threads_and_sums_up",
            "--threads 2 needs 2 CPUs",
        );
        return;
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args([
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--connections",
            "64",
            "--duration",
            "6",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let addr: SocketAddr = first["listening"].as_str().unwrap().parse().unwrap();
    assert_eq!(first["threads"], 2);
    assert_eq!(first["thread_ports"].as_array().unwrap().len(), 2);
    for k in 0..3 {
        let out = Command::new(env!("CARGO_BIN_EXE_metaroce"))
            .args(["write", "--peer", &addr.to_string(), "--count", "20"])
            .args(["--size", "4096", "--json", "--seed", &k.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(server.wait().unwrap().success());
    let summary: serde_json::Value = rest
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v.get("summary").is_some())
        .expect("a summary line")["summary"]
        .clone();
    assert_eq!(summary["connections"], 3, "{summary}");
    let threads = summary["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 2);
    let served: u64 = threads
        .iter()
        .map(|t| t["connections"].as_u64().unwrap())
        .sum();
    assert_eq!(served, 3);
    assert!(summary["endpoint"]["dropped"].is_object(), "{summary}");
    // Usage errors: too many threads, a capture with threads.
    let many = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(["serve", "--bind", "127.0.0.1:0", "--threads", "999"])
        .output()
        .unwrap();
    assert_eq!(many.status.code(), Some(2), "{many:?}");
    let pcap = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(["serve", "--bind", "127.0.0.1:0", "--threads", "2"])
        .args(["--pcap", "/tmp/never.pcap"])
        .output()
        .unwrap();
    assert_eq!(pcap.status.code(), Some(2), "{pcap:?}");
    assert!(String::from_utf8_lossy(&pcap.stderr).contains("--pcap"));
}

/// A hand-driven client connection for the JOIN test: its control
/// buffers (receives, then one send slot) and a data buffer.
struct Conn {
    h: metaroce_core::api::ConnHandle,
    key: u32,
    base: u64,
}

const SLOTS: u64 = 8;
const CONTROL: u64 = metaroce_host::app::CONTROL_LEN as u64;
const DATA: u64 = 4096;

impl Conn {
    fn open(node: &mut Node, peer: SocketAddr) -> Conn {
        use metaroce_core::api::{Access, LocalBuf, RecvRequest, Region};
        let h = node.connect(peer).expect("connect");
        let len = (SLOTS + 1) * CONTROL + DATA;
        let base = node.mem.alloc(len as usize, 0);
        let key = node
            .ep
            .register_region(Region {
                base,
                len,
                access: Access::ALL,
                pd: 0,
            })
            .expect("register");
        for slot in 0..SLOTS {
            let local = LocalBuf {
                key,
                addr: base + slot * CONTROL,
                len: CONTROL as u32,
            };
            node.post_recv(h, RecvRequest { id: slot, local })
                .expect("post receive");
        }
        node.flush();
        Conn { h, key, base }
    }

    fn data(&self) -> metaroce_core::api::LocalBuf {
        metaroce_core::api::LocalBuf {
            key: self.key,
            addr: self.base + (SLOTS + 1) * CONTROL,
            len: DATA as u32,
        }
    }

    fn post(
        &self,
        node: &mut Node,
        id: u64,
        op: metaroce_core::api::Op,
        local: metaroce_core::api::LocalBuf,
    ) {
        let wr = metaroce_core::api::WorkRequest { id, op, local };
        node.post_send(self.h, wr).expect("post");
        node.flush();
    }

    /// Sends a control message and waits for the server's `REGION`.
    fn ask(&self, node: &mut Node, m: &metaroce_host::app::Message) -> metaroce_host::app::Message {
        use metaroce_core::api::{LocalBuf, Op, Opcode};
        let bytes = m.encode();
        let addr = self.base + SLOTS * CONTROL;
        node.mem
            .slice_mut(addr, bytes.len())
            .unwrap()
            .copy_from_slice(&bytes);
        let local = LocalBuf {
            key: self.key,
            addr,
            len: bytes.len() as u32,
        };
        self.post(node, 1 << 40, Op::Send, local);
        let answer = wait(node, |c| {
            (c.conn == self.h && c.opcode == Opcode::Recv).then(|| {
                (
                    self.base + c.wr_id * CONTROL,
                    c.byte_len.min(CONTROL as u32) as usize,
                )
            })
        });
        let (at, len) = answer;
        metaroce_host::app::Message::decode(node.mem.slice(at, len).unwrap()).expect("a message")
    }
}

/// Turns the node until `f` picks a completion (others are dropped).
fn wait<T>(node: &mut Node, mut f: impl FnMut(&metaroce_core::api::Completion) -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        node.turn(Duration::from_millis(5));
        while let Some(c) = node.completions.pop_front() {
            if let Some(t) = f(&c) {
                return t;
            }
        }
    }
    panic!("no completion in time");
}

/// A connection on thread 1 JOINs a region a connection on thread 0
/// announced: its WRITE lands in the announcer's memory (read back by the
/// announcer); once the announcer ends, the joiner's key is refused.
#[test]
fn join_across_threads_shares_the_region_until_its_owner_ends() {
    use metaroce_core::api::{Op, Opcode, Status};
    use metaroce_core::wire::MemoryTarget;
    use metaroce_host::app::{Message, Operation, REGION_OK};

    let stop = Arc::new(AtomicBool::new(false));
    let (addr, ports, server) = start_server(usize::MAX, stop.clone());
    let mut node = Node::bind(&config(false, 16, 11)).expect("bind client");
    let [owner, joiner] = one_per_thread(&mut node, addr, &ports);
    let Message::Region {
        status: REGION_OK,
        addr: region,
        ticket,
        key: owner_key,
        ..
    } = owner.ask(
        &mut node,
        &Message::Announce {
            op: Operation::Write,
            seed: 5,
            size: DATA as u32,
        },
    )
    else {
        panic!("announce refused");
    };
    let Message::Region {
        status: REGION_OK,
        key: joined_key,
        addr: joined_addr,
        ..
    } = joiner.ask(&mut node, &Message::Join { ticket })
    else {
        panic!("join refused");
    };
    assert_eq!(joined_addr, region);
    assert_ne!(joined_key, owner_key, "each connection its own key");
    // The joiner (thread 1) writes; the owner (thread 0) reads it back.
    let pattern: Vec<u8> = (0..DATA).map(|i| (i * 7 + 3) as u8).collect();
    let data = joiner.data();
    node.mem
        .slice_mut(data.addr, DATA as usize)
        .unwrap()
        .copy_from_slice(&pattern);
    let remote = |key| MemoryTarget { key, addr: region };
    joiner.post(
        &mut node,
        1,
        Op::Write {
            remote: remote(joined_key),
        },
        data,
    );
    let status = wait(&mut node, |c| {
        (c.conn == joiner.h && c.opcode == Opcode::Write).then_some(c.status)
    });
    assert_eq!(status, Status::Success);
    let back = owner.data();
    owner.post(
        &mut node,
        2,
        Op::Read {
            remote: remote(owner_key),
        },
        back,
    );
    let status = wait(&mut node, |c| {
        (c.conn == owner.h && c.opcode == Opcode::Read).then_some(c.status)
    });
    assert_eq!(status, Status::Success);
    assert_eq!(
        node.mem.slice(back.addr, DATA as usize).unwrap(),
        &pattern[..]
    );
    // The owner ends: the joiner's key goes with its region.
    let now = node.now();
    node.ep.close(now, owner.h).expect("close");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut refused = false;
    let mut id = 10;
    while !refused && std::time::Instant::now() < deadline {
        node.turn(Duration::from_millis(20));
        node.events.clear();
        id += 1;
        joiner.post(
            &mut node,
            id,
            Op::Write {
                remote: remote(joined_key),
            },
            data,
        );
        let status = wait(&mut node, |c| {
            (c.conn == joiner.h && c.opcode == Opcode::Write).then_some(c.status)
        });
        refused = status != Status::Success;
        if refused {
            assert_eq!(status, Status::RemoteInvalidKey);
        }
    }
    assert!(refused, "the joiner's key outlived the region's owner");
    stop.store(true, Ordering::Relaxed);
    let outcomes = server.join().expect("server thread");
    let joins: u64 = outcomes.iter().map(|o| o.server.counters().joins).sum();
    assert_eq!(joins, 1);
    assert_eq!(
        outcomes[1].server.counters().joins,
        1,
        "the joiner is thread 1's"
    );
}

/// Connections to `addr` until one is served by each thread (the port its
/// ACCEPT named says which).
fn one_per_thread(node: &mut Node, addr: SocketAddr, ports: &[SocketAddr]) -> [Conn; 2] {
    use metaroce_core::Event;
    let mut by_thread: [Option<Conn>; 2] = [None, None];
    for _ in 0..16 {
        if by_thread.iter().all(Option::is_some) {
            break;
        }
        let c = Conn::open(node, addr);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut up = false;
        while !up && std::time::Instant::now() < deadline {
            node.turn(Duration::from_millis(5));
            up = node
                .events
                .drain(..)
                .any(|e| matches!(e, Event::Connected(h) if h == c.h));
        }
        assert!(up, "handshake");
        let port = node.ep.peer(c.h).expect("peer").port;
        let t = ports
            .iter()
            .position(|p| p.port() == port)
            .expect("a thread's port");
        if by_thread[t].is_none() {
            by_thread[t] = Some(c);
        }
    }
    let [Some(a), Some(b)] = by_thread else {
        panic!("16 connections all on one thread: the CONNECT hash is broken");
    };
    [a, b]
}

/// Two connections sending at once, one on each thread: each thread's
/// fair-share hint divides the node's link (1,000 Mbit/s) between both
/// senders, not just its own one.
#[test]
fn the_fair_share_hint_counts_the_other_threads_senders() {
    use metaroce_core::api::{Op, Opcode, Status};
    use metaroce_core::wire::MemoryTarget;
    use metaroce_host::app::{Message, Operation, REGION_OK};

    let stop = Arc::new(AtomicBool::new(false));
    let (addr, ports, server) = start_server(usize::MAX, stop.clone());
    let mut node = Node::bind(&config(false, 16, 21)).expect("bind client");
    let conns = one_per_thread(&mut node, addr, &ports);
    let mut targets = Vec::new();
    for c in &conns {
        let announce = Message::Announce {
            op: Operation::Write,
            seed: 1,
            size: DATA as u32,
        };
        let Message::Region {
            status: REGION_OK,
            key,
            addr,
            ..
        } = c.ask(&mut node, &announce)
        else {
            panic!("announce refused");
        };
        targets.push(MemoryTarget { key, addr });
    }
    // Both send WRITEs together, 4 in flight each, for 200 rounds; the
    // lowest hint each saw is what its thread told it while both sent.
    let mut lowest = [u32::MAX; 2];
    let mut outstanding = [0u32; 2];
    let mut sent = [0u32; 2];
    const WRITES: u32 = 200;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while (sent[0] < WRITES || sent[1] < WRITES || outstanding.iter().any(|&n| n > 0))
        && std::time::Instant::now() < deadline
    {
        for (i, c) in conns.iter().enumerate() {
            while outstanding[i] < 4 && sent[i] < WRITES {
                let op = Op::Write { remote: targets[i] };
                c.post(&mut node, u64::from(sent[i]), op, c.data());
                outstanding[i] += 1;
                sent[i] += 1;
            }
        }
        node.turn(Duration::from_millis(2));
        while let Some(done) = node.completions.pop_front() {
            if done.opcode != Opcode::Write {
                continue;
            }
            assert_eq!(done.status, Status::Success);
            let i = conns.iter().position(|c| c.h == done.conn).expect("ours");
            outstanding[i] -= 1;
        }
        for (i, c) in conns.iter().enumerate() {
            let hint = node.ep.stats(c.h).expect("stats").rate_hint_mbps;
            if hint > 0 {
                lowest[i] = lowest[i].min(hint);
            }
        }
    }
    assert_eq!(sent, [WRITES; 2]);
    stop.store(true, Ordering::Relaxed);
    server.join().expect("server thread");
    // Each thread alone would say 1,000 (its one sender); node-wide, 500.
    for (i, hint) in lowest.iter().enumerate() {
        assert!(
            *hint <= 500,
            "thread {i}'s lowest hint {hint} Mbit/s: {lowest:?}"
        );
    }
}
