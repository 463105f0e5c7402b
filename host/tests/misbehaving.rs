//! 64 concurrent clients against `metaroce serve` (the binary, as users
//! run it), 24 of them misbehaving, each group from its own loopback
//! address (127.0.0.x) so the per-peer budgets meet it alone. The clients are `metaroce_host::session::Crowd` (the library
//! behind `metaroce crowd`, whose module documentation lists the groups):
//! 40 well-behaved writers and readers, bad keys, a key of another
//! connection, a size past the maximum, a second announcement, abandoned
//! handshakes, clients that announce and fall silent, and the budget
//! probes: announcements over the peer's bytes, four 64 MiB hogs against
//! a 224 MiB total, ten connections against a limit of eight per address.
//!
//! The server must serve every well-behaved client with integrity, refuse
//! each misbehaving one on the wire, end the silent ones by its idle
//! timeout, never exit on its own, and count each refusal under its
//! reason in the JSON summary it prints when stopped with SIGTERM. About
//! 10 s, most of it the server's 10 s idle timeout reaping the silent
//! clients.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use metaroce_host::app;
use metaroce_host::session::{Crowd, CrowdOptions, Sources};
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
const WAIT: Duration = Duration::from_secs(10);

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

#[test]
fn the_server_keeps_serving_64_clients_while_24_misbehave() {
    let started = Instant::now();
    let mut server = Server::start();
    let mut crowd = Crowd::start(&CrowdOptions {
        peer: server.addr,
        sources: Sources::PerGroup(Ipv4Addr::new(127, 0, 0, 0)),
        well_behaved: WELL_BEHAVED,
        size: 8192,
        count: MESSAGES,
        max_message: app::MAX_MESSAGE,
        hog_size: 1 << 20,
        greedy_connections: 10,
        timeout: WAIT,
    });
    assert_eq!(crowd.clients(), 64);
    crowd
        .settle(Duration::from_secs(30))
        .expect("clients settle");

    // The silent clients' connections must be ended by the server's idle
    // timeout (10 s on host), one report each, while the rest goes on.
    let mut reports: Vec<Value> = Vec::new();
    let silent_ended = |r: &[Value]| {
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
    while silent_ended(&reports) < 4 && Instant::now() < deadline {
        if let Ok(line) = server.lines.recv_timeout(Duration::from_millis(200)) {
            reports.push(serde_json::from_str(&line).expect("JSON report"));
        }
    }
    assert_eq!(silent_ended(&reports), 4, "silent clients not reaped");
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited while clients misbehaved"
    );

    // The summary, asked for while the hogs and the greedy client hold.
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
    let r = crowd.finish();
    eprintln!("crowd: {r:?}\nsummary: {summary}");
    assert!(status.success(), "serve exited with {status}");

    // Every client saw what it must.
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.well_behaved_ok, WELL_BEHAVED);
    assert_eq!(
        (r.bad_key_refused, r.cross_key_refused, r.bad_size_refused),
        (3, 1, 1)
    );
    assert_eq!(r.twice_refused_then_served, 2);
    assert_eq!((r.abandoned, r.silent, r.huge_refused), (6, 4, 2));
    // 3 x 64 MiB and everyone else fit the 224 MiB, a fourth hog never.
    assert_eq!((r.hogs_granted, r.hogs_refused), (3, 1));
    // 8 connections per address.
    assert_eq!((r.greedy_up, r.greedy_rejected), (8, 2));

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
    assert!(
        n(&summary["endpoint"]["refused"]["nak_invalid_key"]) >= 4,
        "{summary}"
    );
    // The holders' connections were open when it summed up: 4 hogs and
    // the greedy client's 8.
    assert!(n(&summary["open"]) >= 12, "{summary}");
    // Nothing anyone wrote was corrupted, and the server verified every
    // well-behaved writer's messages (4 in 5 write, the others read).
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
