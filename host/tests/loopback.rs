//! Real sockets on loopback: a server thread and a client, IPv4 and IPv6,
//! writes and reads, every byte checked; and the `metaroce` binary as two
//! processes, with its error exit codes.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use metaroce_host::app::Operation;
use metaroce_host::session::{run_client, ClientOptions, Server};
use metaroce_host::{Node, NodeConfig};

fn config(bind: &str, accept: bool, seed: u64) -> NodeConfig {
    NodeConfig {
        bind: bind.parse().unwrap(),
        paths: 4,
        entropy_base: None,
        mtu: 1024,
        window: None,
        rate_mbps: 1000,
        accept,
        connections: 64,
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

fn transfer(server_bind: &str, client_bind: &str, op: Operation, size: u32, count: u64) {
    let server_node = Node::bind(&config(server_bind, true, 1)).expect("bind server");
    let server_addr = server_node.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = thread::spawn(move || {
        let mut s = Server::new(server_node);
        s.run(|s| !s.finished.is_empty() || stop2.load(Ordering::Relaxed))
            .unwrap();
        (s.finished, s.node.io())
    });
    let mut client = Node::bind(&config(client_bind, false, 2)).expect("bind client");
    let summary = run_client(
        &mut client,
        &ClientOptions {
            peer: server_addr,
            op,
            size,
            count: Some(count),
            duration: None,
            stall_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
            seed: 42,
        },
        |_| {},
    );
    stop.store(true, Ordering::Relaxed);
    let (reports, server_io) = server.join().unwrap();
    // The kernel delivered the ECN field the sender set: data left ECT(0).
    assert!(server_io.rx_ecn_capable > 0, "{server_io:?}");
    assert_eq!(server_io.rx_ce, 0);
    let summary = summary.expect("client run");
    assert_eq!(summary.completions, count);
    assert_eq!(summary.bytes, count * u64::from(size));
    assert!(summary.integrity_ok, "{summary:?}");
    assert_eq!(summary.verified, count);
    // Every path carried traffic, each from its own source port.
    let mut ports: Vec<u16> = summary.paths.iter().map(|p| p.src_port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 4);
    assert!(summary.paths.iter().all(|p| p.sent > 0));
    if op == Operation::Write {
        let r = &reports[0];
        assert_eq!(r.verified, count);
        assert_eq!(r.corrupt, 0);
    }
}

#[test]
fn ipv4_write_verified_by_server() {
    transfer("127.0.0.1:0", "127.0.0.1:0", Operation::Write, 16384, 200);
}

#[test]
fn ipv4_read_verified_by_client() {
    transfer("127.0.0.1:0", "127.0.0.1:0", Operation::Read, 10_000, 100);
}

#[test]
fn ipv6_write_and_read() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        common::skip("ipv6_write_and_read", "no IPv6 loopback on this machine");
        return;
    }
    transfer("[::1]:0", "[::1]:0", Operation::Write, 5000, 100);
    transfer("[::1]:0", "[::1]:0", Operation::Read, 3000, 50);
}

fn metaroce() -> Command {
    Command::new(env!("CARGO_BIN_EXE_metaroce"))
}

#[test]
fn two_processes_and_exit_codes() {
    let mut server = metaroce()
        .args(["serve", "--bind", "127.0.0.1:0", "--once"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr: SocketAddr = first.rsplit(' ').next().unwrap().parse().unwrap();
    // What it offers in its handshake (spec B.7).
    assert!(first.contains("4 paths, MTU 1024, window 4096"), "{first}");

    // A window or MTU outside the wire's range: exit 2.
    for bad in [["--window", "0"], ["--window", "65537"], ["--mtu", "100"]] {
        let out = metaroce()
            .args(["serve", "--bind", "127.0.0.1:0", "--once"])
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }

    // Port in use: exit 3.
    let busy = metaroce()
        .args(["serve", "--bind", &addr.to_string(), "--once"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(3), "{busy:?}");
    assert!(String::from_utf8_lossy(&busy.stderr).contains("in use"));

    let client = metaroce()
        .args([
            "write",
            "--peer",
            &addr.to_string(),
            "--count",
            "50",
            "--size",
            "20000",
        ])
        .args(["--json", "--paths", "3"])
        .output()
        .unwrap();
    assert!(client.status.success(), "{client:?}");
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(out.contains("\"integrity_ok\":true"), "{out}");
    assert!(out.contains("\"completions\":50"), "{out}");
    let report = lines.next().unwrap().unwrap();
    assert!(report.contains("integrity OK"), "{report}");
    assert!(server.wait().unwrap().success());

    // Bad address: exit 2.
    let bad = metaroce()
        .args(["write", "--peer", "not-an-address"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    // Nobody listening: exit 4, after the ride-through (the handshake
    // repeats CONNECT that long).
    let gone = metaroce()
        .args(["write", "--peer", &addr.to_string(), "--ride-through", "1"])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(4), "{gone:?}");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("unreachable"));
}

/// A protected node: policy and the pre-shared key (spec 5.3).
fn protected(mut c: NodeConfig, policy: metaroce_core::crypto::Policy, key_id: u32) -> NodeConfig {
    c.protection = Some(metaroce_host::protection::Protection {
        policy,
        key_id,
        psk: [0x3c; 32],
    });
    c
}

/// Packet protection over real sockets: WRITE and READ with AES-256-GCM,
/// every byte checked, nothing failing authentication; a client whose
/// Key ID the server lacks is refused.
#[test]
fn protected_write_and_read_on_loopback() {
    use metaroce_core::crypto::Policy;
    for op in [Operation::Write, Operation::Read] {
        let server_node = Node::bind(&protected(
            config("127.0.0.1:0", true, 11),
            Policy::Require,
            3,
        ))
        .unwrap();
        let server_addr = server_node.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let server = thread::spawn(move || {
            let mut s = Server::new(server_node);
            s.run(|s| !s.finished.is_empty() || stop2.load(Ordering::Relaxed))
                .unwrap();
            (s.finished, s.node.ep.protection_stats())
        });
        let mut client = Node::bind(&protected(
            config("127.0.0.1:0", false, 12),
            Policy::Require,
            3,
        ))
        .unwrap();
        let summary = run_client(
            &mut client,
            &ClientOptions {
                peer: server_addr,
                op,
                size: 20_000,
                count: Some(64),
                duration: None,
                stall_timeout: Duration::from_secs(20),
                connect_timeout: Duration::from_secs(5),
                seed: 43,
            },
            |_| {},
        );
        stop.store(true, Ordering::Relaxed);
        let (reports, server_stats) = server.join().unwrap();
        let summary = summary.expect("protected client run");
        assert!(summary.integrity_ok, "{summary:?}");
        assert_eq!(summary.verified, 64);
        assert_eq!(summary.suite, "AES_256_GCM key 3");
        let cs = client.ep.protection_stats();
        assert!(cs.sealed > 64 && cs.opened > 0, "{cs:?}");
        assert_eq!(cs.auth_failed + server_stats.auth_failed, 0);
        assert!(server_stats.opened > 64, "{server_stats:?}");
        assert_eq!(reports[0].suite, "AES_256_GCM key 3");
    }

    // Key ID 4 is unknown to the server: refused, nothing transferred.
    let server_node = Node::bind(&protected(
        config("127.0.0.1:0", true, 13),
        Policy::Require,
        3,
    ))
    .unwrap();
    let server_addr = server_node.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = thread::spawn(move || {
        let mut s = Server::new(server_node);
        s.run(|_| stop2.load(Ordering::Relaxed)).unwrap();
        s.node.ep.protection_stats()
    });
    let mut client = Node::bind(&protected(
        config("127.0.0.1:0", false, 14),
        Policy::Require,
        4,
    ))
    .unwrap();
    let r = run_client(
        &mut client,
        &ClientOptions {
            peer: server_addr,
            op: Operation::Write,
            size: 1000,
            count: Some(1),
            duration: None,
            stall_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            seed: 1,
        },
        |_| {},
    );
    stop.store(true, Ordering::Relaxed);
    let s = server.join().unwrap();
    assert!(r.is_err(), "an unknown Key ID must be refused");
    assert!(s.refused_unknown_key >= 1, "{s:?}");
}

/// `--psk-file`, `--key-id` and `--protect` on the command line: the
/// summaries show the suite and the protection counters.
#[test]
fn protected_processes_show_the_suite() {
    let dir = std::env::temp_dir().join(format!("metaroce-psk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let psk = dir.join("psk");
    std::fs::write(
        &psk,
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let psk = psk.to_str().unwrap();
    let mut server = metaroce()
        .args(["serve", "--bind", "127.0.0.1:0", "--once"])
        .args(["--psk-file", psk, "--key-id", "9"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(
        first.contains("packet protection require, key id 9"),
        "{first}"
    );
    let addr: SocketAddr = first.rsplit(' ').next().unwrap().parse().unwrap();
    let client = metaroce()
        .args(["write", "--peer", &addr.to_string(), "--count", "20"])
        .args(["--psk-file", psk, "--key-id", "9", "--protect", "allow"])
        .output()
        .unwrap();
    assert!(client.status.success(), "{client:?}");
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        out.contains("protection AES_256_GCM key 9: sealed"),
        "{out}"
    );
    assert!(out.contains("auth_failed 0, replayed 0"), "{out}");
    let report = lines.next().unwrap().unwrap();
    assert!(report.contains("(AES_256_GCM key 9)"), "{report}");
    assert!(report.contains("integrity OK"), "{report}");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(
        rest.iter()
            .any(|l| l.starts_with("protection: require, key id 9: sealed")),
        "{rest:?}"
    );
    assert!(server.wait().unwrap().success());
    // --protect require without a key is a usage error.
    let bad = metaroce()
        .args(["write", "--peer", &addr.to_string(), "--protect", "require"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The server writes a READ region's pattern a few slots per loop turn
/// (here 1 MiB slots, four a turn): the loop comes back to take datagrams
/// between slots instead of filling the whole region in one turn. Counted
/// in turns, not timed, so a busy machine cannot fail it.
#[test]
fn a_read_region_is_filled_a_few_slots_per_turn() {
    const SIZE: u32 = 1 << 20;
    let server_node = Node::bind(&config("127.0.0.1:0", true, 5)).expect("bind server");
    let server_addr = server_node.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = thread::spawn(move || {
        let mut s = Server::new(server_node);
        // Turns that ended with pattern work still to do.
        let mut turns_left_filling = 0u32;
        while s.finished.is_empty() && !stop2.load(Ordering::Relaxed) {
            s.turn(Duration::from_millis(20)).unwrap();
            turns_left_filling += u32::from(s.filling());
        }
        turns_left_filling
    });
    let mut client = Node::bind(&config("127.0.0.1:0", false, 6)).expect("bind client");
    let summary = run_client(
        &mut client,
        &ClientOptions {
            peer: server_addr,
            op: Operation::Read,
            size: SIZE,
            count: Some(2),
            duration: None,
            stall_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            seed: 43,
        },
        |_| {},
    );
    stop.store(true, Ordering::Relaxed);
    let turns_left_filling = server.join().unwrap();
    let summary = summary.expect("client run");
    assert!(summary.integrity_ok, "{summary:?}");
    // The region's 64 slots at one largest message's bytes a turn: filled
    // at once there would be no such turn; four slots a turn leave 15.
    let slots_per_turn = metaroce_host::app::MAX_MESSAGE / SIZE;
    let expected = metaroce_host::app::SLOTS / slots_per_turn - 1;
    assert!(
        turns_left_filling >= expected,
        "{turns_left_filling} turns ended with the region partly filled, expected at least {expected}"
    );
}
