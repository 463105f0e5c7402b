//! # metaroce-qemu
//!
//! The host side of the QEMU runs: it boots N firmware nodes under
//! `qemu-system-aarch64` (QEMU `virt`, Cortex-A72), links their virtio-net
//! devices through an emulated Ethernet fabric on 127.0.0.1 with loss,
//! bursts, delay, jitter, reordering, duplication, a rate-limited queue and
//! ECN marking ([`fabric`]), captures every delivered frame to a pcap file,
//! decodes each node's defmt log from the ELF ([`defmt_log`]), collects the
//! nodes' `METAROCE-RESULT` lines and prints a summary. [`run`] fails (and
//! the binary exits non-zero) on any integrity failure, panic, missing
//! result or timeout.
//!
//! [`serve`] boots one node in the serve role (the firmware side of
//! `metaroce serve`) behind a host gateway ([`gateway`]): a UDP socket on
//! 127.0.0.1 through which host programs, such as the compliance suite,
//! talk MetaRoCE to the firmware. It runs until stopped.
//!
//! It is **not** a simulator: nodes run in real time under QEMU's TCG, so
//! timing numbers are those of emulated CPUs (see `docs/guide/qemu.md` on
//! what differs on hardware). It never touches the network beyond
//! 127.0.0.1; node addresses (198.18.0.0/15, the benchmarking range) exist
//! only inside the emulated fabric.

pub mod defmt_log;
pub mod fabric;
pub mod gateway;
pub mod hostapp;
pub mod hosts;
pub mod node;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fabric::{Fabric, Impairments, PortStats};
use node::{mac_string, Node, NodeSpec};

/// Who sends to whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Node 0 sends to node 1 (extra nodes idle).
    Pair,
    /// Every node but the last sends to the last one (fair-share test).
    Incast,
    /// Every node sends to the next one, the last to the first: with two
    /// nodes, each sends to the other. The multi-core default: every core
    /// of every node then has a connection of its own to serve.
    Ring,
}

/// Who drives the emulated DPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// One host process per DPU (`metaroce-host-app`) through the host
    /// library over the DPU's shared memory (ivshmem).
    Host,
    /// The workload task compiled into the firmware.
    Firmware,
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub driver: Driver,
    pub elf: PathBuf,
    pub qemu: String,
    pub nodes: usize,
    /// Cores per node (QEMU `-smp`); more than 1 runs one engine per core.
    pub cores: usize,
    pub topology: Topology,
    /// `mixed`, `write`, `send` or `read`.
    pub workload: String,
    /// Connections each sender opens to its target, per core (firmware
    /// driver), each with its own data.
    pub streams: u32,
    pub size: u32,
    pub count: u32,
    pub depth: u32,
    pub seed: u64,
    pub impairments: Impairments,
    /// Bound on the whole run; nodes still running are killed.
    pub timeout: Duration,
    pub pcap: Option<PathBuf>,
    /// Where consoles and decoded logs go.
    pub out_dir: PathBuf,
    pub progress: bool,
}

/// One node's outcome.
#[derive(Debug, Clone, Default)]
pub struct NodeReport {
    pub node: usize,
    pub exit_code: Option<i32>,
    /// Fields of the `METAROCE-RESULT` line.
    pub result: Option<BTreeMap<String, String>>,
    pub panic: Option<String>,
    pub errors: Vec<String>,
    pub warnings: usize,
    pub timed_out: bool,
    /// The host process driving this node (host-driven runs): pid and
    /// command line.
    pub host: Option<(u32, String)>,
    /// Fabric counters of the port toward this node.
    pub port: PortStats,
    pub log_lines: usize,
    /// Fields of each `METAROCE-CORE` line (multi-core nodes), by core.
    pub cores: BTreeMap<usize, BTreeMap<String, String>>,
    /// Fields of each `METAROCE-OWNERS` line, by core.
    pub owners: BTreeMap<usize, BTreeMap<String, String>>,
    /// Fields of the `METAROCE-DISPATCH` line.
    pub dispatch: Option<BTreeMap<String, String>>,
}

impl NodeReport {
    fn field(&self, key: &str) -> &str {
        self.result
            .as_ref()
            .and_then(|r| r.get(key))
            .map_or("-", String::as_str)
    }

    /// Whether this node finished with integrity OK.
    pub fn ok(&self) -> bool {
        !self.timed_out
            && self.panic.is_none()
            && self.exit_code == Some(0)
            && self.field("integrity") == "OK"
    }

    /// What is wrong with a node of `cores` cores beyond its result line:
    /// a core missing or failed, a core that handled no MetaRoCE traffic
    /// (no packet in or out), packets that reached a core without their
    /// connection, a connection id owned by two cores, no dispatcher line.
    /// Empty for a good node (and for any single-core node).
    pub fn core_problems(&self, cores: usize) -> Vec<String> {
        let mut problems = Vec::new();
        if cores <= 1 {
            return problems;
        }
        let num = |m: &BTreeMap<String, String>, k: &str| -> u64 {
            m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        for core in 0..cores {
            let Some(c) = self.cores.get(&core) else {
                problems.push(format!("core {core}: no METAROCE-CORE line"));
                continue;
            };
            if c.get("integrity").map(String::as_str) != Some("OK") {
                problems.push(format!("core {core}: integrity not OK"));
            }
            if num(c, "rx_packets") == 0 || num(c, "tx_packets") == 0 {
                problems.push(format!("core {core}: handled no MetaRoCE traffic"));
            }
            if num(c, "misrouted") != 0 {
                problems.push(format!(
                    "core {core}: {} packets for connections it does not have",
                    num(c, "misrouted")
                ));
            }
        }
        if self.dispatch.is_none() {
            problems.push("no METAROCE-DISPATCH line".into());
        }
        problems
    }
}

/// A whole run's outcome.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub nodes: Vec<NodeReport>,
    pub wall: Duration,
    /// Cores per node.
    pub cores: usize,
}

impl RunReport {
    /// Whether every node finished with integrity OK (and, on several
    /// cores, every core of every node did its part; see
    /// [`NodeReport::core_problems`]).
    pub fn ok(&self) -> bool {
        self.nodes
            .iter()
            .all(|n| n.ok() && n.core_problems(self.cores).is_empty())
    }

    /// The per-core table of a multi-core run (empty for one core).
    pub fn core_summary(&self) -> String {
        let mut s = String::new();
        if self.cores <= 1 {
            return s;
        }
        s.push_str(&format!(
            "{:<4} {:<4} {:>5} {:>4} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {}\n",
            "node",
            "core",
            "conns",
            "out",
            "in",
            "bytes",
            "steered",
            "rx_frames",
            "tx_frames",
            "rx_pkts",
            "tx_pkts",
            "misrt",
            "integrity"
        ));
        for n in &self.nodes {
            for core in 0..self.cores {
                let c = n.cores.get(&core);
                let o = n.owners.get(&core);
                let get = |m: Option<&BTreeMap<String, String>>, k: &str| {
                    m.and_then(|m| m.get(k))
                        .map_or("-".to_owned(), String::clone)
                };
                s.push_str(&format!(
                    "{:<4} {:<4} {:>5} {:>4} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {}\n",
                    n.node,
                    core,
                    get(c, "conns"),
                    get(c, "streams"),
                    get(c, "accepted"),
                    get(c, "bytes"),
                    get(o, "delivered"),
                    get(c, "rx_frames"),
                    get(c, "tx_frames"),
                    get(c, "rx_packets"),
                    get(c, "tx_packets"),
                    get(c, "misrouted"),
                    get(c, "integrity"),
                ));
            }
        }
        for n in &self.nodes {
            let total = |k: &str| -> u64 {
                n.cores
                    .values()
                    .filter_map(|c| c.get(k)?.parse::<u64>().ok())
                    .sum()
            };
            s.push_str(&format!(
                "node {}: {} connections opened, {} accepted, over {} cores\n",
                n.node,
                total("streams"),
                total("accepted"),
                n.cores.len()
            ));
            if let Some(d) = &n.dispatch {
                let get = |k: &str| d.get(k).map_or("-", String::as_str);
                s.push_str(&format!(
                    "node {} dispatcher (core 0): {} frames in ({} by connection, {} CONNECT by hash, {} replies to all, {} control, {} unroutable, {} ring full), {} out; {} ns per frame moved (emulated CPU)\n",
                    n.node,
                    get("rx_frames"),
                    get("by_conn"),
                    get("connects"),
                    get("replies"),
                    get("control"),
                    get("unroutable"),
                    get("ring_full"),
                    get("tx_frames"),
                    get("ns_per_frame"),
                ));
            }
            for p in n.core_problems(self.cores) {
                s.push_str(&format!("node {}: {p}\n", n.node));
            }
        }
        s.push_str("conns = connections of the core's endpoint, out = those it opened (its streams), in = those it accepted; steered = frames the dispatcher put in its ring; rx/tx_frames = frames its engine took from and gave to its rings; rx/tx_pkts = MetaRoCE packets among them; misrt = packets for a connection the core does not have\n");
        s
    }

    /// The summary table.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let hosted = self.nodes.iter().any(|n| n.host.is_some());
        s.push_str(&format!(
            "{:<4} {:<8} {:>10} {:>9} {:>6} {:>7} {:>7} {:>6} {:>7} {:>9} {:>9} {:>7} {:>6} {:>5} {:<9}",
            "node",
            "role",
            "bytes",
            "Mbit/s",
            "compl",
            "retx",
            "rto",
            "infl",
            "ce_rx",
            "drop_rand",
            "drop_brst",
            "drop_q",
            "dup",
            "hint",
            "integrity"
        ));
        if hosted {
            s.push_str(&format!(
                " {:>8} {:>8} {:>8} {:>8}",
                "host", "ops/s", "p50_us", "p99_us"
            ));
        }
        s.push('\n');
        for n in &self.nodes {
            let integrity = if n.timed_out {
                "HANG".to_owned()
            } else if n.panic.is_some() {
                "PANIC".to_owned()
            } else {
                n.field("integrity").to_owned()
            };
            s.push_str(&format!(
                "{:<4} {:<8} {:>10} {:>9} {:>6} {:>7} {:>7} {:>6} {:>7} {:>9} {:>9} {:>7} {:>6} {:>5} {:<9}",
                n.node,
                n.field("role"),
                n.field("bytes"),
                n.field("goodput_mbps"),
                n.field("completions"),
                n.field("retransmits"),
                n.field("timeouts"),
                n.field("max_in_flight"),
                n.field("ce"),
                n.port.dropped_random,
                n.port.dropped_burst,
                n.port.dropped_queue,
                n.port.duplicated,
                n.field("rate_hint_mbps"),
                integrity
            ));
            if let Some((pid, _)) = &n.host {
                s.push_str(&format!(
                    " {:>8} {:>8} {:>8} {:>8}",
                    pid,
                    n.field("ops_per_s"),
                    n.field("lat_p50_us"),
                    n.field("lat_p99_us")
                ));
            }
            s.push('\n');
        }
        let marked: u64 = self.nodes.iter().map(|n| n.port.ce_marked).sum();
        let reordered: u64 = self.nodes.iter().map(|n| n.port.reordered).sum();
        s.push_str(&format!(
            "fabric: {} frames delivered, {} CE-marked, {} reordered, {} dropped; wall time {:.1} s\n",
            self.nodes.iter().map(|n| n.port.frames_out).sum::<u64>(),
            marked,
            reordered,
            self.nodes.iter().map(|n| n.port.dropped()).sum::<u64>(),
            self.wall.as_secs_f64()
        ));
        s.push_str("infl = the most PSNs one of the node's connections had outstanding at once (sent, not cumulatively acknowledged: what the window bounds); drops and dup count frames toward the node; ce_rx = CE-marked frames the node received; hint = receiver's fair-share rate hint (Mbit/s)\n");
        if hosted {
            s.push_str("host = pid of the host process driving the node through the host library (shared memory, ivshmem); ops/s and p50/p99 post-to-completion latency measured by that process (senders)\n");
            for n in &self.nodes {
                if let Some((pid, command)) = &n.host {
                    s.push_str(&format!("  node {} <- pid {pid}: {command}\n", n.node));
                }
            }
        }
        s
    }
}

/// Why a run could not be carried out at all.
#[derive(Debug)]
pub enum RunError {
    Io(std::io::Error),
    Elf(String),
    Options(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Io(e) => write!(f, "{e}"),
            RunError::Elf(e) => write!(f, "firmware: {e}"),
            RunError::Options(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RunError {}

impl From<std::io::Error> for RunError {
    fn from(e: std::io::Error) -> Self {
        RunError::Io(e)
    }
}

fn parse_fields(line: &str) -> BTreeMap<String, String> {
    line.split_ascii_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn node_mac(i: usize) -> [u8; 6] {
    [0x02, 0x00, 0x00, 0x00, 0x00, (i + 1) as u8]
}

fn node_ip(i: usize) -> [u8; 4] {
    [198, 18, 0, (i + 1) as u8]
}

fn ip_string(ip: &[u8; 4]) -> String {
    format!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3])
}

/// The node configurations of a run (peers listed in node order, skipping
/// the node itself, as the firmware expects).
/// The (sender, receiver) pairs of a run's topology.
fn flows(opts: &RunOptions) -> Vec<(usize, usize)> {
    let n = opts.nodes;
    match opts.topology {
        Topology::Pair => vec![(0, 1)],
        Topology::Incast => (0..n - 1).map(|i| (i, n - 1)).collect(),
        Topology::Ring => (0..n).map(|i| (i, (i + 1) % n)).collect(),
    }
}

pub fn node_specs(opts: &RunOptions) -> Vec<NodeSpec> {
    let n = opts.nodes;
    let flows = flows(opts);
    (0..n)
        .map(|i| {
            let mut config = format!(
                "node={i} ip={} mac={} workload={} size={} count={} depth={} seed={} progress_ms=500",
                ip_string(&node_ip(i)),
                mac_string(&node_mac(i)),
                opts.workload,
                opts.size,
                opts.count,
                opts.depth,
                opts.seed
            );
            let peers: Vec<usize> = (0..n).filter(|&j| j != i).collect();
            for &j in &peers {
                config.push_str(&format!(" peer={}/{}", ip_string(&node_ip(j)), mac_string(&node_mac(j))));
            }
            if let Some(&(_, receiver)) = flows.iter().find(|f| f.0 == i) {
                let index = peers.iter().position(|&j| j == receiver).unwrap_or(0);
                config.push_str(&format!(" target={index}"));
            }
            let senders = flows.iter().filter(|f| f.1 == i).count();
            if senders > 0 {
                config.push_str(&format!(" expect={senders}"));
            }
            if opts.cores > 1 {
                config.push_str(&format!(" cores={}", opts.cores));
            }
            if opts.streams > 1 {
                config.push_str(&format!(" streams={}", opts.streams));
            }
            let shm = (opts.driver == Driver::Host).then(|| {
                config.push_str(" role=host");
                let window = hostapp::window_needed(opts.size, opts.count, senders as u32);
                (opts.out_dir.join(format!("node{i}.shm")), hosts::shm_size(window))
            });
            NodeSpec {
                index: i,
                mac: node_mac(i),
                ip: node_ip(i),
                config,
                cores: opts.cores,
                shm,
            }
        })
        .collect()
}

/// The arguments of the host process driving node `i` (host-driven runs).
pub fn host_app_args(opts: &RunOptions, spec: &NodeSpec) -> Vec<String> {
    let i = spec.index;
    let flows = flows(opts);
    let mut args = vec![
        "--shm".to_owned(),
        spec.shm
            .as_ref()
            .map_or_else(String::new, |(p, _)| p.display().to_string()),
        "--node".to_owned(),
        i.to_string(),
        "--workload".to_owned(),
        opts.workload.clone(),
        "--size".to_owned(),
        opts.size.to_string(),
        "--count".to_owned(),
        opts.count.to_string(),
        "--depth".to_owned(),
        opts.depth.to_string(),
        "--seed".to_owned(),
        opts.seed.to_string(),
        "--timeout".to_owned(),
        opts.timeout.as_secs().to_string(),
    ];
    if let Some(&(_, receiver)) = flows.iter().find(|f| f.0 == i) {
        args.push("--target".to_owned());
        args.push(format!(
            "{receiver}/{}:{}",
            ip_string(&node_ip(receiver)),
            metaroce_core::wire::DEFAULT_UDP_PORT
        ));
    }
    let senders = flows.iter().filter(|f| f.1 == i).count();
    if senders > 0 {
        args.push("--expect".to_owned());
        args.push(senders.to_string());
    }
    args
}

/// Reads the firmware ELF and creates the output folder and the pcap's
/// folder.
fn read_elf_and_make_dirs(
    elf: &Path,
    out_dir: &Path,
    pcap: Option<&Path>,
) -> Result<Vec<u8>, RunError> {
    let bytes = std::fs::read(elf).map_err(|e| RunError::Elf(format!("{}: {e}", elf.display())))?;
    std::fs::create_dir_all(out_dir)?;
    if let Some(dir) = pcap
        .and_then(Path::parent)
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    Ok(bytes)
}

/// Runs the nodes through the fabric and collects their reports.
pub fn run(opts: &RunOptions) -> Result<RunReport, RunError> {
    if opts.nodes < 2 || opts.nodes > 8 {
        return Err(RunError::Options(format!(
            "--nodes must be 2..=8, not {}",
            opts.nodes
        )));
    }
    if opts.cores == 0 || opts.cores > MAX_CORES {
        return Err(RunError::Options(format!(
            "--cores must be 1..={MAX_CORES} (QEMU virt's GICv2), not {}",
            opts.cores
        )));
    }
    if opts.streams == 0 || opts.streams > MAX_STREAMS {
        return Err(RunError::Options(format!(
            "--streams must be 1..={MAX_STREAMS}, not {}",
            opts.streams
        )));
    }
    if opts.streams > 1 && opts.driver == Driver::Host {
        return Err(RunError::Options(
            "--streams above 1 needs --driver firmware (a host process opens one connection per peer)".into(),
        ));
    }
    let elf = read_elf_and_make_dirs(&opts.elf, &opts.out_dir, opts.pcap.as_deref())?;
    let specs = node_specs(opts);
    let macs: Vec<[u8; 6]> = specs.iter().map(|s| s.mac).collect();
    let fabric = Fabric::start(&macs, opts.impairments.clone(), opts.pcap.as_deref())?;
    let ports = fabric.ports().to_vec();
    let started = Instant::now();
    let host_app = match opts.driver {
        Driver::Host => Some(hosts::host_app_path()?),
        Driver::Firmware => None,
    };
    let mut nodes = Vec::new();
    let mut host_args = Vec::new();
    for (spec, port) in specs.into_iter().zip(&ports) {
        if let Some((path, size)) = &spec.shm {
            hosts::create_shm(path, *size)?;
            host_args.push(host_app_args(opts, &spec));
        }
        nodes.push(Node::start(
            &opts.qemu,
            &opts.elf,
            spec,
            port,
            &opts.out_dir,
        )?);
    }
    // One host process per DPU: it waits for the firmware to format the
    // shared memory, then drives it.
    let mut hosts: Vec<hosts::HostProcess> = Vec::new();
    if let Some(app) = &host_app {
        for args in &host_args {
            hosts.push(hosts::HostProcess::start(app, args)?);
        }
    }
    let mut reports: Vec<NodeReport> = (0..nodes.len())
        .map(|i| NodeReport {
            node: i,
            ..NodeReport::default()
        })
        .collect();
    let mut progress: Vec<String> = vec!["boot".to_owned(); nodes.len()];
    let terminal = std::io::stderr().is_terminal();
    let mut last_progress = Instant::now();
    loop {
        let mut all_done = true;
        for (node, report) in nodes.iter_mut().zip(reports.iter_mut()) {
            let exited = node.poll_exit();
            for line in node.new_console_lines() {
                absorb(&line, report, &mut progress[report.node]);
            }
            // Host-driven firmware serves until stopped: its host decides.
            all_done &= exited || !hosts.is_empty();
        }
        for (host, report) in hosts.iter_mut().zip(reports.iter_mut()) {
            let exited = host.poll_exit();
            for line in host.new_lines() {
                absorb(&line, report, &mut progress[report.node]);
            }
            all_done &= exited;
        }
        if all_done {
            for node in &mut nodes {
                if !node.poll_exit() {
                    node.kill();
                }
            }
            break;
        }
        if started.elapsed() > opts.timeout {
            for (node, report) in nodes.iter_mut().zip(reports.iter_mut()) {
                if !node.poll_exit() {
                    node.kill();
                    report.timed_out = hosts.is_empty();
                }
            }
            for (host, report) in hosts.iter_mut().zip(reports.iter_mut()) {
                if !host.poll_exit() {
                    host.kill();
                    report.timed_out = true;
                }
            }
            break;
        }
        if opts.progress
            && last_progress.elapsed() >= Duration::from_millis(if terminal { 500 } else { 5000 })
        {
            last_progress = Instant::now();
            let line = format!(
                "[{:5.1}s] {}",
                started.elapsed().as_secs_f64(),
                progress.join(" | ")
            );
            if terminal {
                eprint!("\r{line:<120}");
            } else {
                eprintln!("{line}");
            }
            let _ = std::io::stderr().flush();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if opts.progress && terminal {
        eprintln!();
    }
    let wall = started.elapsed();
    let port_stats = fabric.stop()?;
    for (host, report) in hosts.iter_mut().zip(reports.iter_mut()) {
        host.finish();
        for line in host.new_lines() {
            absorb(&line, report, &mut String::new());
        }
        report.host = Some((host.pid, host.command.clone()));
    }
    for ((node, report), port) in nodes.iter_mut().zip(reports.iter_mut()).zip(port_stats) {
        for line in node.new_console_lines() {
            absorb(&line, report, &mut String::new());
        }
        report.exit_code = match hosts.get(report.node) {
            Some(host) => host.exit_code,
            None => node.exit_code,
        };
        report.port = port;
        let (defmt, stderr) = node.finish();
        let log_path = opts.out_dir.join(format!("node{}.log", report.node));
        let lines = match defmt_log::decode(&elf, &defmt) {
            Ok(lines) => lines,
            Err(e) => vec![format!("(defmt decoding failed: {e})")],
        };
        report.log_lines = lines.len();
        let mut text = lines.join("\n");
        if !stderr.trim().is_empty() {
            text.push_str("\n--- qemu stderr ---\n");
            text.push_str(&stderr);
            report.errors.push(format!("qemu: {}", stderr.trim()));
        }
        std::fs::write(&log_path, text)?;
    }
    Ok(RunReport {
        nodes: reports,
        wall,
        cores: opts.cores,
    })
}

/// Boots the nodes in the host role (each with its shared-memory file) and
/// runs `program` with `SHM_i IP_i:PORT` for every node `i` as its
/// arguments, its output passed through; stops the nodes when it exits.
/// Returns its exit status (`None`: killed after the timeout).
pub fn run_program(opts: &RunOptions, program: &Path) -> Result<Option<i32>, RunError> {
    let opts = RunOptions {
        driver: Driver::Host,
        ..opts.clone()
    };
    read_elf_and_make_dirs(&opts.elf, &opts.out_dir, opts.pcap.as_deref())?;
    let specs = node_specs(&opts);
    let macs: Vec<[u8; 6]> = specs.iter().map(|s| s.mac).collect();
    let fabric = Fabric::start(&macs, opts.impairments.clone(), opts.pcap.as_deref())?;
    let ports = fabric.ports().to_vec();
    let mut args = Vec::new();
    let mut nodes = Vec::new();
    for (spec, port) in specs.into_iter().zip(&ports) {
        if let Some((path, size)) = &spec.shm {
            hosts::create_shm(path, *size)?;
            args.push(path.display().to_string());
            args.push(format!(
                "{}:{}",
                ip_string(&spec.ip),
                metaroce_core::wire::DEFAULT_UDP_PORT
            ));
        }
        nodes.push(Node::start(
            &opts.qemu,
            &opts.elf,
            spec,
            port,
            &opts.out_dir,
        )?);
    }
    let started = Instant::now();
    let mut child = hosts::HostProcess::start(program, &args)?;
    println!("running pid {}: {}", child.pid, child.command);
    loop {
        for line in child.new_lines() {
            println!("{line}");
        }
        for node in &mut nodes {
            for line in node.new_console_lines() {
                if line.starts_with("METAROCE-PANIC") || line.starts_with("METAROCE-ERROR") {
                    println!("node {}: {line}", node.spec.index);
                }
            }
        }
        if child.poll_exit() || started.elapsed() > opts.timeout {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.exit_code.is_none() {
        child.kill();
    }
    child.finish();
    for line in child.new_lines() {
        println!("{line}");
    }
    for node in &mut nodes {
        node.kill();
        let _ = node.finish();
    }
    fabric.stop()?;
    Ok(child.exit_code)
}

/// Everything a serve run needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub elf: PathBuf,
    pub qemu: String,
    /// Host address of the gateway socket (port 0: any free port).
    pub gateway: std::net::SocketAddr,
    /// Stop after this long (`None`: until [`ServeOptions::stop`] says so).
    pub timeout: Option<Duration>,
    pub pcap: Option<PathBuf>,
    pub out_dir: PathBuf,
    pub seed: u64,
}

/// The gateway's addresses on the emulated subnet.
pub const GATEWAY_IP: [u8; 4] = [198, 18, 0, 254];
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0xfe];

/// Connections the serve node lets one address hold: every host program
/// reaches it from the gateway's one address, so that address may fill
/// the node's whole table (its 1,024 connections).
pub const SERVE_PEER_CONNECTIONS: u32 = 1024;

/// The configuration line of the serve node, on MetaRoCE UDP port `port`.
pub fn serve_config(seed: u64, port: u16) -> String {
    format!(
        "node=0 ip={} mac={} role=serve gateway={}/{} seed={seed} port={port} \
         peer_connections={SERVE_PEER_CONNECTIONS}",
        ip_string(&node_ip(0)),
        mac_string(&node_mac(0)),
        ip_string(&GATEWAY_IP),
        mac_string(&GATEWAY_MAC)
    )
}

/// How a serve run ended.
#[derive(Debug, Clone, Default)]
pub struct ServeReport {
    /// The node printed its ready line.
    pub ready: bool,
    /// QEMU exited by itself (the firmware failed or panicked).
    pub exit_code: Option<i32>,
    pub panic: Option<String>,
    pub errors: Vec<String>,
    /// `METAROCE-SERVE` lines: connections that ended.
    pub connections: usize,
    pub gateway: gateway::GatewayStats,
}

impl ServeReport {
    /// Whether the node served until it was stopped.
    pub fn ok(&self) -> bool {
        self.ready && self.exit_code.is_none() && self.panic.is_none()
    }
}

/// Boots one serve node behind a gateway and runs until `stop` returns
/// true, the timeout passes or QEMU exits. `on_line` sees every console
/// line, and first `METAROCE-QEMU-GATEWAY <addr>` (the host address to
/// use) and `METAROCE-QEMU-READY <addr>` once the node can serve.
pub fn serve(
    opts: &ServeOptions,
    mut stop: impl FnMut() -> bool,
    mut on_line: impl FnMut(&str),
) -> Result<ServeReport, RunError> {
    let elf = read_elf_and_make_dirs(&opts.elf, &opts.out_dir, opts.pcap.as_deref())?;
    let [a, b, c, d] = node_ip(0);
    let [ga, gb, gc, gd] = GATEWAY_IP;
    let spec = gateway::GatewaySpec {
        listen: opts.gateway,
        ip: std::net::Ipv4Addr::new(ga, gb, gc, gd),
        mac: GATEWAY_MAC,
        node_ip: std::net::Ipv4Addr::new(a, b, c, d),
        node_mac: node_mac(0),
        // The node serves on the gateway's port: host clients send to
        // the port the node's ACCEPT names, so both must be the same.
        node_port: 0,
    };
    // A clean link: the suite scripts loss and reordering itself.
    let imp = Impairments {
        delay: Duration::from_micros(20),
        ..Impairments::default()
    };
    let fabric = Fabric::start_with_gateway(&[node_mac(0)], imp, opts.pcap.as_deref(), Some(spec))?;
    let addr = fabric
        .gateway_addr()
        .ok_or_else(|| RunError::Options("the gateway did not bind".into()))?;
    on_line(&format!("METAROCE-QEMU-GATEWAY {addr}"));
    let node_spec = NodeSpec {
        index: 0,
        mac: node_mac(0),
        ip: node_ip(0),
        config: serve_config(opts.seed, addr.port()),
        cores: 1,
        shm: None,
    };
    let mut node = Node::start(
        &opts.qemu,
        &opts.elf,
        node_spec,
        &fabric.ports()[0],
        &opts.out_dir,
    )?;
    let started = Instant::now();
    let mut report = ServeReport::default();
    let mut take = |line: &str, report: &mut ServeReport| {
        if line.starts_with("METAROCE-READY ") && !report.ready {
            report.ready = true;
            on_line(line);
            on_line(&format!("METAROCE-QEMU-READY {addr}"));
            return;
        }
        if line.starts_with("METAROCE-SERVE ") {
            report.connections += 1;
        } else if let Some(rest) = line.strip_prefix("METAROCE-PANIC ") {
            report.panic = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("METAROCE-ERROR ") {
            report.errors.push(rest.to_owned());
        }
        on_line(line);
    };
    loop {
        let exited = node.poll_exit();
        for line in node.new_console_lines() {
            take(&line, &mut report);
        }
        if exited || stop() || opts.timeout.is_some_and(|t| started.elapsed() > t) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if node.poll_exit() {
        report.exit_code = node.exit_code;
    } else {
        node.kill();
    }
    for line in node.new_console_lines() {
        take(&line, &mut report);
    }
    let (_, gateway_stats) = fabric.stop_with_gateway()?;
    report.gateway = gateway_stats.unwrap_or_default();
    let (defmt, stderr) = node.finish();
    let mut text = match defmt_log::decode(&elf, &defmt) {
        Ok(lines) => lines.join("\n"),
        Err(e) => format!("(defmt decoding failed: {e})"),
    };
    if !stderr.trim().is_empty() {
        text.push_str("\n--- qemu stderr ---\n");
        text.push_str(&stderr);
    }
    std::fs::write(opts.out_dir.join("node0.log"), text)?;
    Ok(report)
}

/// Most cores per node: QEMU `virt`'s GICv2 serves 8.
pub const MAX_CORES: usize = 8;
/// Most connections a sender opens to its target per core (the
/// firmware's `MAX_STREAMS`).
pub const MAX_STREAMS: u32 = 16;
/// Most connections one core's workload accepts (the firmware's
/// `MAX_SLOTS`).
pub const MAX_SLOTS: u64 = 48;

/// Emulated host memory of a node (the firmware's `HOST_MEMORY_LEN`),
/// split evenly between its cores.
pub const NODE_HOST_MEMORY: u64 = 64 << 20;

/// Messages per stream by default: 32, or as many as fit a core's share
/// of host memory. A core lays out one area of `size x count` (its READ
/// sources), two per receive slot (WRITE targets, receive buffers) and two
/// per stream it opens (sources, READ sinks), plus 64 KiB of control
/// buffers; it takes as many slots as its node's senders could open to
/// it (every stream of every core of every sender: with `nodes` nodes at
/// most `nodes - 1` senders per receiver, times `cores` and `streams`, at
/// most the firmware's `MAX_SLOTS`), since the connect hash may hand one
/// core all of them.
pub fn default_count(size: u32, cores: usize, nodes: usize, streams: u32) -> u32 {
    let cores = cores.max(1) as u64;
    let streams = u64::from(streams.max(1));
    let slots = ((nodes.max(2) as u64 - 1) * cores * streams).min(MAX_SLOTS);
    let share = NODE_HOST_MEMORY / cores;
    let areas = 1 + 2 * slots + 2 * streams;
    let per_area = share.saturating_sub(64 << 10) / areas;
    (per_area / u64::from(size.max(1))).clamp(1, 32) as u32
}

/// The `core=` field of a per-core line.
fn core_of(fields: &BTreeMap<String, String>) -> Option<usize> {
    fields.get("core")?.parse().ok()
}

/// Takes in one console line.
fn absorb(line: &str, report: &mut NodeReport, progress: &mut String) {
    if let Some(rest) = line.strip_prefix("METAROCE-CORE ") {
        let f = parse_fields(rest);
        if let Some(core) = core_of(&f) {
            report.cores.insert(core, f);
        }
    } else if let Some(rest) = line.strip_prefix("METAROCE-OWNERS ") {
        let f = parse_fields(rest);
        if let Some(core) = core_of(&f) {
            report.owners.insert(core, f);
        }
    } else if let Some(rest) = line.strip_prefix("METAROCE-DISPATCH ") {
        report.dispatch = Some(parse_fields(rest));
    } else if let Some(rest) = line.strip_prefix("METAROCE-RESULT ") {
        report.result = Some(parse_fields(rest));
        *progress = format!("n{} done", report.node);
    } else if let Some(rest) = line.strip_prefix("METAROCE-PROGRESS ") {
        let f = parse_fields(rest);
        let get = |k: &str| f.get(k).map_or("?", String::as_str).to_owned();
        *progress = format!(
            "n{} {} {}B {}c",
            report.node,
            get("phase"),
            get("bytes"),
            get("completions")
        );
    } else if let Some(rest) = line.strip_prefix("METAROCE-PANIC ") {
        report.panic = Some(rest.to_owned());
    } else if let Some(rest) = line.strip_prefix("METAROCE-ERROR ") {
        report.errors.push(rest.to_owned());
    } else if line.starts_with("METAROCE-WARN ") {
        report.warnings += 1;
    }
}

/// The default location of the firmware built by `cargo xtask` (its
/// `firmware` profile).
pub fn default_elf(target_dir: &Path) -> PathBuf {
    target_dir.join("aarch64-unknown-none/firmware/board-qemu-virt")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(nodes: usize, topology: Topology) -> RunOptions {
        RunOptions {
            driver: Driver::Firmware,
            elf: PathBuf::new(),
            qemu: String::new(),
            nodes,
            cores: 1,
            topology,
            workload: "mixed".into(),
            streams: 1,
            size: 4096,
            count: 8,
            depth: 4,
            seed: 3,
            impairments: Impairments::default(),
            timeout: Duration::from_secs(1),
            pcap: None,
            out_dir: PathBuf::new(),
            progress: false,
        }
    }

    #[test]
    fn incast_configs_point_every_sender_at_the_last_node() {
        let specs = node_specs(&opts(3, Topology::Incast));
        assert!(specs[0].config.contains(" target=1"), "{}", specs[0].config);
        assert!(specs[1].config.contains(" target=1"), "{}", specs[1].config);
        assert!(specs[2].config.contains(" expect=2"));
        assert!(!specs[2].config.contains("target="));
        assert!(specs[2]
            .config
            .contains("peer=198.18.0.1/02:00:00:00:00:01 peer=198.18.0.2/02:00:00:00:00:02"));
    }

    #[test]
    fn ring_configs_make_every_node_send_to_the_next_on_every_core() {
        let mut o = opts(2, Topology::Ring);
        o.cores = 4;
        let specs = node_specs(&o);
        for s in &specs {
            assert!(s.config.contains(" target=0"), "{}", s.config);
            assert!(s.config.contains(" expect=1"), "{}", s.config);
            assert!(s.config.contains(" cores=4"), "{}", s.config);
            assert_eq!(s.cores, 4);
        }
        let single = node_specs(&opts(2, Topology::Pair));
        assert!(!single[0].config.contains("cores="));
    }

    fn core_line(core: usize, rx: u32, misrouted: u32) -> String {
        format!("METAROCE-CORE node=0 core={core} conns=2 rx_packets={rx} tx_packets=5 misrouted={misrouted} integrity=OK")
    }

    #[test]
    fn multi_core_nodes_must_use_every_core_and_own_each_id_once() {
        let mut r = NodeReport::default();
        let mut p = String::new();
        assert_eq!(r.core_problems(1), Vec::<String>::new());
        for line in [
            core_line(0, 10, 0),
            core_line(1, 10, 0),
            "METAROCE-OWNERS node=0 core=0 delivered=9".into(),
            "METAROCE-OWNERS node=0 core=1 delivered=9".into(),
            "METAROCE-DISPATCH node=0 cores=2 rx_frames=20".into(),
        ] {
            absorb(&line, &mut r, &mut p);
        }
        assert_eq!(r.core_problems(2), Vec::<String>::new());
        let problems = r.core_problems(3);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("core 2: no METAROCE-CORE")),
            "{problems:?}"
        );
        absorb(&core_line(1, 0, 3), &mut r, &mut p);
        absorb("METAROCE-OWNERS node=0 core=1 delivered=0", &mut r, &mut p);
        let problems = r.core_problems(2);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("handled no MetaRoCE traffic")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("3 packets")),
            "{problems:?}"
        );
    }

    #[test]
    fn default_count_fits_a_cores_share() {
        assert_eq!(default_count(65536, 1, 2, 1), 32);
        assert_eq!(default_count(65536, 2, 2, 1), 32);
        // 4 cores: 16 MiB each, 4 receive slots, 11 areas of 64 KiB x N.
        let n = default_count(65536, 4, 2, 1);
        assert!(
            n < 32 && 11 * 65536 * u64::from(n) + (64 << 10) <= 16 << 20,
            "{n}"
        );
        // 8 streams: 32 slots and 8 streams, 81 areas.
        let n = default_count(8192, 4, 2, 8);
        assert!(81 * 8192 * u64::from(n) + (64 << 10) <= 16 << 20, "{n}");
        assert!(82 * 8192 * u64::from(n + 1) + (64 << 10) > 16 << 20, "{n}");
        assert_eq!(default_count(1 << 30, 8, 8, 1), 1);
    }

    #[test]
    fn result_lines_are_parsed() {
        let mut r = NodeReport::default();
        let mut p = String::new();
        absorb(
            "METAROCE-RESULT node=1 role=receiver bytes=10 integrity=OK",
            &mut r,
            &mut p,
        );
        r.exit_code = Some(0);
        assert!(r.ok());
        absorb("METAROCE-PANIC at x.rs:1", &mut r, &mut p);
        assert!(!r.ok());
    }
}
