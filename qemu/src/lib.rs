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
//! timing numbers are those of emulated CPUs (see the README's notes on
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
    pub topology: Topology,
    /// `mixed`, `write`, `send` or `read`.
    pub workload: String,
    /// `metaroce` or `datagram`.
    pub transport: String,
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
}

/// A whole run's outcome.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub nodes: Vec<NodeReport>,
    pub wall: Duration,
}

impl RunReport {
    /// Whether every node finished with integrity OK.
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(NodeReport::ok)
    }

    /// The summary table.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let hosted = self.nodes.iter().any(|n| n.host.is_some());
        s.push_str(&format!(
            "{:<4} {:<8} {:>10} {:>9} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>7} {:>6} {:>5} {:<9}",
            "node",
            "role",
            "bytes",
            "Mbit/s",
            "compl",
            "retx",
            "rto",
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
                "{:<4} {:<8} {:>10} {:>9} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>7} {:>6} {:>5} {:<9}",
                n.node,
                n.field("role"),
                n.field("bytes"),
                n.field("goodput_mbps"),
                n.field("completions"),
                n.field("retransmits"),
                n.field("timeouts"),
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
        s.push_str("drops and dup count frames toward the node; ce_rx = CE-marked frames the node received; hint = receiver's fair-share rate hint (Mbit/s)\n");
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
pub fn node_specs(opts: &RunOptions) -> Vec<NodeSpec> {
    let n = opts.nodes;
    let receiver = match opts.topology {
        Topology::Pair => 1,
        Topology::Incast => n - 1,
    };
    let senders: Vec<usize> = match opts.topology {
        Topology::Pair => vec![0],
        Topology::Incast => (0..n - 1).collect(),
    };
    (0..n)
        .map(|i| {
            let mut config = format!(
                "node={i} ip={} mac={} workload={} transport={} size={} count={} depth={} seed={} progress_ms=500",
                ip_string(&node_ip(i)),
                mac_string(&node_mac(i)),
                opts.workload,
                opts.transport,
                opts.size,
                opts.count,
                opts.depth,
                opts.seed
            );
            let peers: Vec<usize> = (0..n).filter(|&j| j != i).collect();
            for &j in &peers {
                config.push_str(&format!(" peer={}/{}", ip_string(&node_ip(j)), mac_string(&node_mac(j))));
            }
            if senders.contains(&i) {
                let index = peers.iter().position(|&j| j == receiver).unwrap_or(0);
                config.push_str(&format!(" target={index}"));
            }
            if i == receiver {
                config.push_str(&format!(" expect={}", senders.len()));
            }
            let shm = (opts.driver == Driver::Host).then(|| {
                config.push_str(" role=host");
                let window = hostapp::window_needed(opts.size, opts.count, senders.len() as u32);
                (opts.out_dir.join(format!("node{i}.shm")), hosts::shm_size(window))
            });
            NodeSpec {
                index: i,
                mac: node_mac(i),
                ip: node_ip(i),
                config,
                shm,
            }
        })
        .collect()
}

/// The arguments of the host process driving node `i` (host-driven runs).
pub fn host_app_args(opts: &RunOptions, spec: &NodeSpec) -> Vec<String> {
    let n = opts.nodes;
    let i = spec.index;
    let (receiver, senders) = match opts.topology {
        Topology::Pair => (1, 1),
        Topology::Incast => (n - 1, n - 1),
    };
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
    let is_sender = match opts.topology {
        Topology::Pair => i == 0,
        Topology::Incast => i < n - 1,
    };
    if is_sender {
        args.push("--target".to_owned());
        args.push(format!(
            "{receiver}/{}:{}",
            ip_string(&node_ip(receiver)),
            metaroce_core::wire::DEFAULT_UDP_PORT
        ));
    }
    if i == receiver {
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

/// The configuration line of the serve node, on MetaRoCE UDP port `port`.
pub fn serve_config(seed: u64, port: u16) -> String {
    format!(
        "node=0 ip={} mac={} role=serve gateway={}/{} seed={seed} port={port}",
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

/// Takes in one console line.
fn absorb(line: &str, report: &mut NodeReport, progress: &mut String) {
    if let Some(rest) = line.strip_prefix("METAROCE-RESULT ") {
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

/// The default location of the release firmware built by `cargo xtask`.
pub fn default_elf(target_dir: &Path) -> PathBuf {
    target_dir.join("aarch64-unknown-none/release/board-qemu-virt")
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
            topology,
            workload: "mixed".into(),
            transport: "metaroce".into(),
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
