//! `metaroce`: serve, benchmark, write and read over MetaRoCE on Linux UDP
//! sockets (see the `metaroce-host` crate). Not a daemon manager or a
//! kernel-bypass tool: one process, one endpoint, ordinary sockets.
//!
//! Exit codes: 0 success; 1 integrity check failed; 2 usage error (bad
//! address, size or option); 3 cannot bind (port in use, address not
//! local); 4 peer unreachable (no answer to the handshake, refused);
//! 5 transfer failed (stalled, connection failed); 6 file error (`--pcap`).

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use metaroce_core::crypto::Policy;
use metaroce_host::app::Operation;
use metaroce_host::pcap::PcapRecorder;
use metaroce_host::protection::{read_psk_file, Protection};
use metaroce_host::session::{
    run_client, run_hold, ClientOptions, Crowd, CrowdOptions, HoldOptions, PeerBudget, Progress,
    Server, ServerReport, Sources, Summary,
};
use metaroce_host::shard::{self, ShardedConfig, ShardedServer, ThreadOutcome, MAX_THREADS};
use metaroce_host::{HostError, Node, NodeConfig};

const EXIT_CODES: &str = "Exit codes: 0 success, 1 integrity check failed, 2 usage error, \
3 cannot bind (port in use), 4 peer unreachable, 5 transfer failed or timed out, 6 file error.";

#[derive(Parser, Debug)]
#[command(name = "metaroce", version, about = "MetaRoCE over UDP sockets", after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Accept connections, give each a region and verify what arrives.
    Serve(ServeArgs),
    /// Timed WRITE_IMM stream (default 5 s), verified by the server.
    Bench(ClientArgs),
    /// WRITE_IMM messages (default 64), verified by the server.
    Write(ClientArgs),
    /// READ messages (default 64) of the server's pre-filled region, verified here.
    Read(ClientArgs),
    /// Open many connections at once and check the server answers on each.
    Hold(HoldArgs),
    /// Many clients at once, some misbehaving (bad keys, huge or repeated
    /// announcements, abandoned handshakes, silence, too many
    /// connections); check the well-behaved ones are all served.
    Crowd(CrowdArgs),
}

#[derive(Args, Debug)]
struct CrowdArgs {
    /// The server's address and port.
    #[arg(long)]
    peer: String,
    /// Every client from this address (as through a gateway); the budget
    /// probes (huge announcements, hogs, too many connections) are left
    /// out. Default: each group from its own address in 127.0.0.0/24.
    #[arg(long)]
    single_source: Option<std::net::IpAddr>,
    /// Well-behaved clients.
    #[arg(long, default_value_t = 40)]
    well_behaved: usize,
    /// Their bytes per message.
    #[arg(long, default_value_t = 8192)]
    size: u32,
    /// Their messages each.
    #[arg(long, default_value_t = 32)]
    count: u64,
    /// The server's largest message size.
    #[arg(long, default_value_t = metaroce_host::app::MAX_MESSAGE)]
    max_message: u32,
    /// Message size the hogs announce.
    #[arg(long, default_value_t = 1 << 20)]
    hog_size: u32,
    /// Connections the greedy client opens.
    #[arg(long, default_value_t = 10)]
    greedy: usize,
    /// Seconds any one step (handshake, answer) may take.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Seconds the holding and silent clients stay after the others are done.
    #[arg(long, default_value_t = 0.0)]
    hold: f64,
    /// One JSON object instead of the text report.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct HoldArgs {
    /// The server's address and port.
    #[arg(long)]
    peer: String,
    /// Local address to bind (default: any, free port).
    #[arg(long)]
    bind: Option<String>,
    /// Connections to open at once.
    #[arg(long, default_value_t = 1024)]
    connections: u32,
    /// Seconds every connection has to be answered.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct Common {
    /// Logical paths per connection (distinct UDP source ports), 1..=16.
    #[arg(long, default_value_t = 4)]
    paths: u16,
    /// Largest payload per packet (1024 fits 1500-byte links).
    #[arg(long, default_value_t = 1024)]
    mtu: u16,
    /// Window offered, in PSNs a sender may have outstanding, 1..=65536
    /// (spec 4.4); a connection uses the smaller of both ends' offers.
    #[arg(long, default_value_t = metaroce_core::config::EMULATION_WINDOW)]
    window: u32,
    /// Rate cap, Mbit/s (default: none: the congestion controller sets the rate).
    #[arg(long)]
    rate_mbps: Option<u32>,
    /// First UDP source port of the path sockets (default: first free run above the bind port).
    #[arg(long)]
    entropy_base: Option<u16>,
    /// Machine-readable output (one JSON object per report).
    #[arg(long)]
    json: bool,
    /// Record every datagram sent and received to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Seconds a connection rides through an outage (retransmitting
    /// without progress) and a handshake keeps repeating CONNECT.
    #[arg(long, default_value_t = DEFAULT_RIDE_THROUGH)]
    ride_through: f64,
    /// Pre-shared key for packet protection (spec 5.3): a file of 64
    /// hexadecimal digits or 32 raw bytes.
    #[arg(long)]
    psk_file: Option<PathBuf>,
    /// Key ID the pre-shared key is known by (nonzero; both ends must agree).
    #[arg(long, default_value_t = 1)]
    key_id: u32,
    /// Packet protection policy (default: require with --psk-file, else off).
    #[arg(long, value_enum)]
    protect: Option<Protect>,
}

/// `--protect`: whether connections are protected (spec 5.3.6).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Protect {
    /// Never (a CONNECT asking for protection is answered without it).
    Off,
    /// When the peer agrees.
    Allow,
    /// Always: refuse peers without protection.
    Require,
}

/// The node's protection from `--protect`, `--psk-file` and `--key-id`.
fn protection(c: &Common) -> Result<Option<Protection>, HostError> {
    let policy = match (c.protect, &c.psk_file) {
        (None, None) | (Some(Protect::Off), _) => return Ok(None),
        (None, Some(_)) | (Some(Protect::Require), _) => Policy::Require,
        (Some(Protect::Allow), _) => Policy::Allow,
    };
    let Some(path) = &c.psk_file else {
        return Err(HostError::Usage(
            "--protect allow|require needs --psk-file".into(),
        ));
    };
    if c.key_id == 0 {
        return Err(HostError::Usage("--key-id must be nonzero".into()));
    }
    Ok(Some(Protection {
        policy,
        key_id: c.key_id,
        psk: read_psk_file(path)?,
    }))
}

/// `--ride-through` by default: the emulation profile's (spec 4.11).
const DEFAULT_RIDE_THROUGH: f64 = 10.0;

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address and port to listen on.
    #[arg(long, default_value = "0.0.0.0:4795")]
    bind: String,
    /// Exit after the first connection ends (exit code 1 if its data was corrupt).
    #[arg(long)]
    once: bool,
    /// Exit after this many seconds (SIGINT or SIGTERM also stops it, with
    /// the summary).
    #[arg(long)]
    duration: Option<f64>,
    /// Connections served at once (each costs about 0.5 KiB while idle).
    #[arg(long, default_value_t = metaroce_host::node::DEFAULT_SERVE_CONNECTIONS)]
    connections: u32,
    /// Connections one peer address may hold at once.
    #[arg(long, default_value_t = PeerBudget::default().connections_per_peer)]
    connections_per_peer: u32,
    /// MiB of announced regions one peer address may hold.
    #[arg(long, default_value_t = PeerBudget::default().bytes_per_peer >> 20)]
    mib_per_peer: u64,
    /// MiB of announced regions all peers may hold.
    #[arg(long, default_value_t = PeerBudget::default().bytes_total >> 20)]
    mib_total: u64,
    /// Regions (announced or joined) one peer address may hold.
    #[arg(long, default_value_t = PeerBudget::default().regions_per_peer)]
    regions_per_peer: u32,
    /// Connections one peer address may open per second (and at once);
    /// more are refused with CLOSE (REJECTED). 0: no limit.
    #[arg(long, default_value_t = metaroce_core::Config::default().source_limits.connects_per_second)]
    connects_per_second_per_peer: u32,
    /// Half-open connections (ACCEPT sent, not yet confirmed) one peer
    /// address may hold; more are refused. 0: no limit.
    #[arg(long, default_value_t = metaroce_core::Config::default().source_limits.half_open)]
    half_open_per_peer: u32,
    /// Engine threads, each serving its own shard of the connection table
    /// on its own UDP port (named in its ACCEPTs); up to the CPUs.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct ClientArgs {
    /// The server's address and port.
    #[arg(long)]
    peer: String,
    /// Local address to bind (default: any, free port).
    #[arg(long)]
    bind: Option<String>,
    /// Bytes per message.
    #[arg(long, default_value_t = 65536)]
    size: u32,
    /// Messages to move.
    #[arg(long)]
    count: Option<u64>,
    /// Seconds to keep posting.
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds without a completion before giving up (default: the
    /// ride-through and 5 s more: the connection itself gives up first).
    #[arg(long)]
    timeout: Option<f64>,
    /// Pattern seed (the server checks against it).
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// No live progress line.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    common: Common,
}

fn parse_addr(what: &str, s: &str) -> Result<SocketAddr, HostError> {
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| HostError::Usage(format!("{what} `{s}` is not ADDRESS:PORT ({e})")))?;
    addrs
        .next()
        .ok_or_else(|| HostError::Usage(format!("{what} `{s}` resolves to no address")))
}

/// The local address the kernel would use towards `peer` (port 0), so the
/// summary and the capture show real addresses; the unspecified address if
/// there is no route.
fn default_bind(peer: SocketAddr) -> SocketAddr {
    let any: SocketAddr = if peer.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    std::net::UdpSocket::bind(any)
        .and_then(|s| {
            s.connect(peer)?;
            s.local_addr()
        })
        .map(|a| SocketAddr::new(a.ip(), 0))
        .unwrap_or(any)
}

fn seconds(what: &str, s: f64) -> Result<Duration, HostError> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| HostError::Usage(format!("{what} must be a non-negative number of seconds")))
}

/// The link rate the core is given without `--rate-mbps`: 100 Gbit/s,
/// more than a host's sockets move, so the congestion controller (ECN,
/// loss and the receiver's fair-share hint) alone sets the rate.
const UNCAPPED_MBPS: u32 = 100_000;

/// The node's settings; its secrets come from the operating system.
fn node_config(
    bind: SocketAddr,
    c: &Common,
    accept: bool,
    connections: u32,
) -> Result<NodeConfig, HostError> {
    let ride_through = seconds("--ride-through", c.ride_through)?;
    if ride_through.is_zero() {
        return Err(HostError::Usage("--ride-through must be above 0".into()));
    }
    Ok(NodeConfig {
        bind,
        paths: c.paths,
        entropy_base: c.entropy_base,
        mtu: c.mtu,
        window: Some(c.window),
        rate_mbps: c.rate_mbps.unwrap_or(UNCAPPED_MBPS),
        accept,
        connections,
        receives_per_connection: if accept {
            metaroce_host::session::SERVER_RECEIVES
        } else {
            0
        },
        seed: None,
        ride_through: Some(ride_through),
        source_limits: None,
        protection: protection(c)?,
    })
}

/// A serving node's settings: the common ones and the per-source limits
/// on incoming connections (spec 4.2.3).
fn serve_node_config(a: &ServeArgs, bind: SocketAddr) -> Result<NodeConfig, HostError> {
    let mut config = node_config(bind, &a.common, true, a.connections)?;
    config.source_limits = Some(metaroce_core::config::SourceLimits {
        connects_per_second: a.connects_per_second_per_peer,
        half_open: a.half_open_per_peer,
    });
    Ok(config)
}

/// Prints a line; a closed stdout (the reader went away) does not stop
/// the server.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// SIGINT and SIGTERM, taken by a thread of their own: the first asks the
/// server to stop (it prints its summary and exits), a second ends the
/// process at once. Called before any other thread exists, so every
/// thread inherits the blocked mask and only that thread takes them.
fn stop_on_signals() -> Result<Arc<AtomicBool>, HostError> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals
        .thread_block()
        .map_err(|e| HostError::Usage(format!("cannot block SIGINT/SIGTERM: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        while let Ok(signal) = signals.wait() {
            if flag.swap(true, Ordering::Relaxed) {
                std::process::exit(128 + signal as i32);
            }
        }
    });
    Ok(stop)
}

fn serve(a: &ServeArgs) -> Result<(), HostError> {
    let signalled = stop_on_signals()?;
    if a.threads != 1 {
        return serve_sharded(a, &signalled);
    }
    let bind = parse_addr("--bind", &a.bind)?;
    let mut node = Node::bind(&serve_node_config(a, bind)?)?;
    if let Some(p) = &a.common.pcap {
        node.link.pcap = Some(PcapRecorder::create(p)?);
    }
    let local = node.local_addr();
    let protect = describe_protection(&a.common)?;
    if a.common.json {
        say(
            &serde_json::json!({"listening": local.to_string(), "paths": a.common.paths,
                "mtu": a.common.mtu, "window": a.common.window, "protection": protect})
            .to_string(),
        );
    } else {
        // The address stays last: scripts read it from the end of the line.
        say(&format!(
            "metaroce serve (packet protection {protect}, {} paths, MTU {}, window {}): listening on {local}",
            a.common.paths, a.common.mtu, a.common.window
        ));
    }
    let until = a
        .duration
        .map(|d| seconds("--duration", d))
        .transpose()?
        .map(|d| Instant::now() + d);
    let mut server = Server::with_budget(node, serve_budget(a));
    server.protection = protect;
    let mut printed = 0;
    let mut corrupt = false;
    let once = a.once;
    let json = a.common.json;
    server.run(|s| {
        for r in &s.finished[printed..] {
            corrupt |= !r.integrity_ok;
            say_report(r, json, false);
        }
        printed = s.finished.len();
        (once && printed > 0)
            || until.is_some_and(|t| Instant::now() >= t)
            || signalled.load(Ordering::Relaxed)
    })?;
    print_serve_summary(&server, json);
    if let Some(p) = server.node.link.pcap.take() {
        p.finish()?;
    }
    if corrupt {
        return Err(HostError::Integrity("a client's data differed".into()));
    }
    Ok(())
}

/// The budgets `serve` was given.
fn serve_budget(a: &ServeArgs) -> PeerBudget {
    PeerBudget {
        connections_per_peer: a.connections_per_peer,
        bytes_per_peer: a.mib_per_peer << 20,
        bytes_total: a.mib_total << 20,
        regions_per_peer: a.regions_per_peer,
    }
}

/// One finished connection's line (or JSON object); `sharded`: say which
/// engine thread served it.
fn say_report(r: &ServerReport, json: bool, sharded: bool) {
    if json {
        say(&serde_json::to_string(r).unwrap_or_default());
        return;
    }
    let thread = if sharded {
        format!(" (thread {}, slot {})", r.thread, r.slot)
    } else {
        String::new()
    };
    say(&format!(
        "connection from {}{thread} ({}): {} {} messages of {} B verified, {} corrupt, {} B, \
         {} packets, {} duplicates, {} CE, closed {} -> integrity {}",
        r.peer,
        r.suite,
        r.operation,
        r.verified,
        r.message_size,
        r.corrupt,
        r.bytes,
        r.packets_received,
        r.duplicates_received,
        r.ce_received,
        r.closed,
        if r.integrity_ok { "OK" } else { "FAILED" }
    ));
}

/// `serve --threads N` (N > 1): the same server on N engine threads, each
/// with its shard of the connection table ([`metaroce_host::shard`]).
fn serve_sharded(a: &ServeArgs, signalled: &AtomicBool) -> Result<(), HostError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if a.threads == 0 || a.threads > cpus.min(MAX_THREADS) {
        return Err(HostError::Usage(format!(
            "--threads must be 1..={} (the CPUs of this machine, at most {MAX_THREADS}), got {}",
            cpus.min(MAX_THREADS),
            a.threads
        )));
    }
    if a.common.pcap.is_some() {
        return Err(HostError::Usage(
            "--pcap records one engine thread's sockets: use it with --threads 1".into(),
        ));
    }
    let bind = parse_addr("--bind", &a.bind)?;
    let sharded = ShardedServer::bind(&ShardedConfig {
        node: serve_node_config(a, bind)?,
        threads: a.threads,
        budget: serve_budget(a),
    })?;
    let local = sharded.local_addr();
    let ports: Vec<u16> = sharded.thread_addrs().iter().map(|t| t.port()).collect();
    let json = a.common.json;
    if json {
        say(&serde_json::json!({
            "listening": local.to_string(),
            "paths": a.common.paths,
            "mtu": a.common.mtu,
            "window": a.common.window,
            "threads": a.threads,
            "thread_ports": ports,
        })
        .to_string());
    } else {
        // The address comes last, as without threads (scripts read it).
        say(&format!(
            "metaroce serve: {} engine threads (ports {}), listening on {local}",
            a.threads,
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let until = a
        .duration
        .map(|d| seconds("--duration", d))
        .transpose()?
        .map(|d| Instant::now() + d);
    let corrupt = AtomicBool::new(false);
    let once = a.once;
    let outcomes = sharded.run(
        |r| {
            corrupt.fetch_or(!r.integrity_ok, Ordering::Relaxed);
            say_report(r, json, true);
            once
        },
        || until.is_some_and(|t| Instant::now() >= t) || signalled.load(Ordering::Relaxed),
    )?;
    print_sharded_summary(&outcomes, json);
    if corrupt.load(Ordering::Relaxed) {
        return Err(HostError::Integrity("a client's data differed".into()));
    }
    Ok(())
}

/// What every engine thread did and refused, added up, and what each
/// served.
fn print_sharded_summary(outcomes: &[ThreadOutcome], json: bool) {
    let c = shard::total_counters(outcomes);
    let open: usize = outcomes.iter().map(|o| o.server.open_connections()).sum();
    let threads = shard::thread_summaries(outcomes);
    let steering = shard::total_steering(outcomes);
    let nodes = shard::nodes(outcomes);
    let live: u32 = nodes.iter().map(|n| n.ep.live_connections()).sum();
    let half_open: u32 = nodes.iter().map(|n| n.ep.half_open()).sum();
    if json {
        say(&serde_json::json!({
            "summary": {
                "connections": c.connections,
                "open": open,
                "live": live,
                "half_open": half_open,
                "server": metaroce_host::session::counters_json(&c),
                "endpoint": metaroce_host::counters::json_sum(&nodes),
                "steering": steering,
                "threads": threads,
            }
        })
        .to_string());
        return;
    }
    say(&format!(
        "serve summary: {} connections ({} open, {} joins, {} in the table, {} half open); refused: {} over the peer's connection budget, \
         {} without buffers, {} bad size, {} over budget, {} bad ticket, {} second announce",
        c.connections,
        open,
        c.joins,
        live,
        half_open,
        c.refused_peer_connections,
        c.refused_no_buffers,
        c.refused_bad_size,
        c.refused_over_budget,
        c.refused_bad_ticket,
        c.refused_second_announce
    ));
    for t in &threads {
        say(&format!(
            "  thread {} (port {}): {} connections ({} open); forwarded {} CONNECTs and {} packets \
             to other threads, received {} from them, {} dropped on a full ring",
            t.thread,
            t.port,
            t.connections,
            t.open,
            t.steering.connects_forwarded,
            t.steering.packets_forwarded,
            t.steering.received_forwarded,
            t.steering.ring_full
        ));
    }
    say(&format!(
        "endpoint: {}",
        metaroce_host::counters::line_sum(&nodes)
    ));
}

/// What the server did and refused, by reason (docs/counters.md).
fn print_serve_summary(server: &Server, json: bool) {
    let c = server.counters();
    let node = &server.node;
    if json {
        say(&serde_json::json!({
            "summary": {
                "connections": c.connections,
                "open": server.open_connections(),
                "live": node.ep.live_connections(),
                "half_open": node.ep.half_open(),
                "server": metaroce_host::session::counters_json(&c),
                "endpoint": metaroce_host::counters::json(node),
                "reseeds": node.engine_stats().reseeds,
                "protection": {
                    "policy": server.protection,
                    "counters": metaroce_host::protection::json(&node.ep.protection_stats()),
                },
            }
        })
        .to_string());
        return;
    }
    say(&format!(
        "serve summary: {} connections ({} open, {} in the table, {} half open, {} closed ({} idle timeouts), {} failed, {} joins); refused: \
         {} over the peer's connection budget, {} without buffers, {} bad size, {} second announce, \
         {} bad ticket, {} over budget ({} peer bytes, {} total bytes, {} peer regions, {} no keys)",
        c.connections,
        server.open_connections(),
        node.ep.live_connections(),
        node.ep.half_open(),
        c.closed,
        c.idle_timeouts,
        c.failed,
        c.joins,
        c.refused_peer_connections,
        c.refused_no_buffers,
        c.refused_bad_size,
        c.refused_second_announce,
        c.refused_bad_ticket,
        c.refused_over_budget,
        c.refused_peer_bytes,
        c.refused_total_bytes,
        c.refused_peer_regions,
        c.refused_no_keys,
    ));
    say(&format!(
        "dropped or refused by reason: {}; {} reseeds",
        metaroce_host::counters::line(node),
        node.engine_stats().reseeds
    ));
    say(&format!(
        "protection: {}: {}",
        server.protection,
        metaroce_host::protection::line(&node.ep.protection_stats())
    ));
}

/// `require, key id 1` / `off`: the policy a node runs, for its banner.
fn describe_protection(c: &Common) -> Result<String, HostError> {
    Ok(match protection(c)? {
        None => "off".into(),
        Some(p) => format!(
            "{}, key id {}",
            metaroce_host::protection::policy_name(p.policy),
            p.key_id
        ),
    })
}

fn client(
    a: &ClientArgs,
    op: Operation,
    default_count: Option<u64>,
    default_secs: Option<f64>,
) -> Result<(), HostError> {
    let peer = parse_addr("--peer", &a.peer)?;
    if peer.port() == 0 || peer.ip().is_unspecified() {
        return Err(HostError::Usage(format!(
            "--peer `{peer}` is not a reachable address"
        )));
    }
    let bind = match &a.bind {
        Some(b) => parse_addr("--bind", b)?,
        None => default_bind(peer),
    };
    if bind.is_ipv4() != peer.is_ipv4() {
        return Err(HostError::Usage(
            "--bind and --peer must be the same address family".into(),
        ));
    }
    let (count, duration) = match (a.count, a.duration) {
        (None, None) => (
            default_count,
            default_secs.map(|s| seconds("--duration", s)).transpose()?,
        ),
        (c, d) => (c, d.map(|s| seconds("--duration", s)).transpose()?),
    };
    let mut node = Node::bind(&node_config(bind, &a.common, false, 4)?)?;
    if let Some(p) = &a.common.pcap {
        node.link.pcap = Some(PcapRecorder::create(p)?);
    }
    let opts = ClientOptions {
        peer,
        op,
        size: a.size,
        count,
        duration,
        stall_timeout: match a.timeout {
            Some(t) => seconds("--timeout", t)?,
            None => node.ep.config().ride_through + Duration::from_secs(5),
        },
        // The core repeats CONNECT for its connect timeout (the
        // ride-through); this only guards it.
        connect_timeout: node.ep.config().connect_timeout + Duration::from_secs(2),
        seed: a.seed,
    };
    let live = !a.quiet && !a.common.json;
    let cpu_before = cpu_time();
    let result = run_client(&mut node, &opts, |p: &Progress| {
        if live {
            eprint!(
                "\r{:6.1} s  {:8} msgs  {:10.1} Mbit/s  retx {:6}  CE {:6}   ",
                p.seconds, p.completions, p.goodput_mbps, p.retransmissions, p.ce_echoed
            );
        }
    });
    if live {
        eprintln!();
    }
    if let Some(p) = node.link.pcap.take() {
        p.finish()?;
    }
    let summary = result?;
    let cpu_busy = (cpu_time() - cpu_before).as_secs_f64() / summary.seconds.max(1e-9);
    let limit = run_limit(&summary, &node, a.common.rate_mbps, cpu_busy);
    print_summary(&summary, &limit, a.common.json);
    if !summary.integrity_ok {
        return Err(HostError::Integrity(format!(
            "{} of {} messages verified, {} corrupt",
            summary.verified, summary.completions, summary.corrupt
        )));
    }
    Ok(())
}

/// `metaroce hold`: many connections at once, one round trip on each.
fn hold(a: &HoldArgs) -> Result<(), HostError> {
    let peer = parse_addr("--peer", &a.peer)?;
    if peer.port() == 0 || peer.ip().is_unspecified() {
        return Err(HostError::Usage(format!(
            "--peer `{peer}` is not a reachable address"
        )));
    }
    let bind = match &a.bind {
        Some(b) => parse_addr("--bind", b)?,
        None => default_bind(peer),
    };
    let mut node = Node::bind(&node_config(bind, &a.common, false, a.connections.max(1))?)?;
    if let Some(p) = &a.common.pcap {
        node.link.pcap = Some(PcapRecorder::create(p)?);
    }
    let opts = HoldOptions {
        peer,
        connections: a.connections,
        timeout: seconds("--timeout", a.timeout)?,
    };
    let result = run_hold(&mut node, &opts);
    if let Some(p) = node.link.pcap.take() {
        p.finish()?;
    }
    let s = result?;
    if a.common.json {
        say(&serde_json::to_string(&s).unwrap_or_default());
    } else {
        say(&format!(
            "hold {}: {} connections: {} established (last after {:.2} s), {} answered, \
             {} refused, {} closed, {} failed, {} still waiting after {:.2} s",
            s.peer,
            s.requested,
            s.established,
            s.establish_seconds,
            s.answered,
            s.refused,
            s.closed,
            s.failed,
            s.waiting,
            s.seconds
        ));
        for (what, n) in &s.endings {
            say(&format!("  {n} {what}"));
        }
    }
    if s.all_answered() {
        Ok(())
    } else {
        Err(HostError::Transfer(format!(
            "{} of {} connections were not served",
            s.requested - s.answered,
            s.requested
        )))
    }
}

/// `metaroce crowd`: well-behaved and misbehaving clients at once.
fn crowd(a: &CrowdArgs) -> Result<(), HostError> {
    let peer = parse_addr("--peer", &a.peer)?;
    let timeout = seconds("--timeout", a.timeout)?;
    let opts = CrowdOptions {
        peer,
        sources: match a.single_source {
            Some(ip) => Sources::Single(ip),
            None => Sources::PerGroup(std::net::Ipv4Addr::new(127, 0, 0, 0)),
        },
        well_behaved: a.well_behaved,
        size: a.size,
        count: a.count,
        max_message: a.max_message,
        hog_size: a.hog_size,
        greedy_connections: a.greedy,
        timeout,
    };
    let mut crowd = Crowd::start(&opts);
    let settled = crowd.settle(timeout * 3);
    std::thread::sleep(seconds("--hold", a.hold)?);
    let r = crowd.finish();
    settled?;
    if a.json {
        say(&serde_json::to_string(&r).unwrap_or_default());
    } else {
        say(&format!(
            "crowd {peer}: {} clients in {:.1} s: {} of {} well-behaved served with integrity; \
             refused as they must be: {} bad key, {} cross key, {} bad size, {} second announce \
             (then served), {} huge; {} abandoned, {} silent; hogs {} granted {} refused; \
             greedy {} up {} rejected",
            r.clients,
            r.seconds,
            r.well_behaved_ok,
            r.well_behaved,
            r.bad_key_refused,
            r.cross_key_refused,
            r.bad_size_refused,
            r.twice_refused_then_served,
            r.huge_refused,
            r.abandoned,
            r.silent,
            r.hogs_granted,
            r.hogs_refused,
            r.greedy_up,
            r.greedy_rejected
        ));
        for p in &r.problems {
            say(&format!("  problem: {p}"));
        }
    }
    if r.ok() {
        Ok(())
    } else {
        Err(HostError::Transfer(format!(
            "{} of {} well-behaved clients served, {} problems",
            r.well_behaved_ok,
            r.well_behaved,
            r.problems.len()
        )))
    }
}

/// CPU time (user and system) this process has used.
fn cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let t = |tv: nix::sys::time::TimeVal| {
            Duration::new(tv.tv_sec().max(0) as u64, tv.tv_usec().max(0) as u32 * 1000)
        };
        t(u.user_time()) + t(u.system_time())
    })
}

/// What bounded a client run, and the socket side's batching, for the
/// summary.
#[derive(Debug, Clone, serde::Serialize)]
struct RunLimit {
    /// One line: the rate cap, this process's CPU, loss, or the peer and
    /// the congestion controller.
    limited_by: String,
    /// This process's CPU time over the run's wall time (1.0 = one core).
    cpu_busy: f64,
    datagrams_per_send_call: f64,
    datagrams_per_receive_call: f64,
    /// Sends the kernel refused (full buffer, unreachable, too long).
    send_refused: u64,
    receive_buffer_bytes: usize,
    send_buffer_bytes: usize,
}

/// Why the run went no faster, from what the client can see: a rate cap
/// it reached, its own CPU, loss, or else the peer and the congestion
/// controller.
fn run_limit(s: &Summary, node: &Node, cap: Option<u32>, cpu_busy: f64) -> RunLimit {
    let io = node.io();
    let buffers = node.link.buffer_sizes();
    let per_call = |n: u64, calls: u64| n as f64 / calls.max(1) as f64;
    let lost_share = s.packets_lost as f64 / s.packets_sent.max(1) as f64;
    let limited_by = match cap {
        Some(cap) if s.goodput_mbps >= 0.9 * f64::from(cap) => {
            format!("the rate cap (--rate-mbps {cap})")
        }
        _ if cpu_busy >= 0.9 => format!(
            "this process's CPU ({:.0} % of one core busy)",
            cpu_busy * 100.0
        ),
        _ if lost_share >= 0.001 => format!(
            "loss: {} of {} packets lost ({} refused by the local kernel)",
            s.packets_lost, s.packets_sent, io.tx_errors
        ),
        _ => format!(
            "the peer or the congestion controller (this process {:.0} % busy, {} packets lost)",
            cpu_busy * 100.0,
            s.packets_lost
        ),
    };
    RunLimit {
        limited_by,
        cpu_busy,
        datagrams_per_send_call: per_call(io.tx_datagrams, io.tx_calls),
        datagrams_per_receive_call: per_call(io.rx_datagrams, io.rx_calls),
        send_refused: io.tx_errors,
        receive_buffer_bytes: buffers.receive,
        send_buffer_bytes: buffers.send,
    }
}

fn print_summary(s: &Summary, limit: &RunLimit, json: bool) {
    if json {
        let mut value = serde_json::to_value(s).unwrap_or_default();
        if let (Some(map), Ok(serde_json::Value::Object(extra))) =
            (value.as_object_mut(), serde_json::to_value(limit))
        {
            map.extend(extra);
        }
        println!("{value}");
        return;
    }
    println!(
        "{} {} -> {}: connected in {:.3} s; {} messages x {} B = {} B in {:.2} s: goodput {:.1} Mbit/s",
        s.operation,
        s.local,
        s.peer,
        s.connect_seconds,
        s.completions,
        s.message_size,
        s.bytes,
        s.seconds,
        s.goodput_mbps
    );
    println!(
        "packets {}  retransmissions {}  timeouts {}  lost {}  CE echoed {}  NAKs {}",
        s.packets_sent, s.retransmissions, s.timeouts, s.packets_lost, s.ce_echoed, s.naks_received
    );
    println!("path  src-port      sent     retx     lost      CE  rerolls  srtt(us)");
    for p in &s.paths {
        println!(
            "{:4}  {:8}  {:8} {:8} {:8} {:7} {:8} {:9}",
            p.path, p.src_port, p.sent, p.retransmitted, p.lost, p.ce_echoed, p.rerolls, p.srtt_us
        );
    }
    println!(
        "limited by {}; {:.1} datagrams per send call, {:.1} per receive call, {} refused; socket buffers {} KiB receive, {} KiB send",
        limit.limited_by,
        limit.datagrams_per_send_call,
        limit.datagrams_per_receive_call,
        limit.send_refused,
        limit.receive_buffer_bytes / 1024,
        limit.send_buffer_bytes / 1024
    );
    println!("refused or dropped by reason: {}", s.refusals_line);
    println!("protection {}: {}", s.suite, s.protection_line);
    println!(
        "integrity {}: {} verified, {} corrupt",
        if s.integrity_ok { "OK" } else { "FAILED" },
        s.verified,
        s.corrupt
    );
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Serve(a) => serve(a),
        Command::Bench(a) => client(a, Operation::Write, None, Some(5.0)),
        Command::Write(a) => client(a, Operation::Write, Some(64), None),
        Command::Read(a) => client(a, Operation::Read, Some(64), None),
        Command::Hold(a) => hold(a),
        Command::Crowd(a) => crowd(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metaroce: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
