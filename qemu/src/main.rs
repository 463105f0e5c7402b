//! `metaroce-qemu`: boots MetaRoCE firmware nodes under QEMU through an
//! emulated lossy fabric and prints a summary. Exit status 0 only if every
//! node finished with integrity OK; 1 on integrity failure, panic or hang;
//! 2 if the run could not start.
//!
//! `metaroce-qemu --serve`: boots one node in the serve role behind a host
//! gateway (`--gateway`, default 127.0.0.1:4795) and runs until killed,
//! `--duration` passes, or with `--until-stdin-closes` until its standard
//! input closes. It prints `METAROCE-QEMU-READY ADDR` once host programs
//! (`metaroce-compliance --target ADDR`, `metaroce bench ADDR`) can use it.
//! Exit status 0 if the node served until stopped, 1 if it failed.

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use metaroce_qemu::fabric::Impairments;
use metaroce_qemu::{run, run_program, serve, Driver, RunOptions, ServeOptions, Topology};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DriverArg {
    /// One host process per DPU, through the host library over ivshmem.
    Host,
    /// The workload task compiled into the firmware.
    Firmware,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TopologyArg {
    Pair,
    Incast,
    Ring,
}

#[derive(Debug, Parser)]
#[command(
    name = "metaroce-qemu",
    about = "Run MetaRoCE firmware nodes under QEMU through an emulated lossy Ethernet fabric"
)]
struct Args {
    /// Firmware ELF (built for aarch64-unknown-none).
    #[arg(long)]
    elf: PathBuf,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-aarch64")]
    qemu: String,
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Cores per node (QEMU -smp, 1 to 8): one engine, endpoint and
    /// workload share per core, core 0 steering frames to their owner.
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// pair: node 0 sends to node 1; incast: all send to the last node;
    /// ring: each node sends to the next (default with --cores above 1,
    /// so every core of every node has a connection of its own).
    #[arg(long, value_enum)]
    topology: Option<TopologyArg>,
    /// Who runs the workload: host processes through the host interface
    /// (shared memory, ivshmem), or a task inside the firmware (default:
    /// host; firmware with --cores above 1, whose per-core workload shares
    /// run inside the firmware).
    #[arg(long, value_enum)]
    driver: Option<DriverArg>,
    /// mixed, write, send or read.
    #[arg(long, default_value = "mixed")]
    workload: String,
    /// Connections each sender opens to its target, per core, each with
    /// its own data (firmware driver).
    #[arg(long, default_value_t = 1)]
    streams: u32,
    /// Bytes per message.
    #[arg(long, default_value_t = 65536)]
    size: u32,
    /// Messages per sender stream (default 32, fewer where a core's share
    /// of the node's host memory could not hold them: see --cores).
    #[arg(long)]
    count: Option<u32>,
    /// Messages in flight per sender.
    #[arg(long, default_value_t = 8)]
    depth: u32,
    /// Random loss in percent.
    #[arg(long, default_value_t = 1.0)]
    loss: f64,
    /// Probability (percent) that a frame starts a loss burst.
    #[arg(long, default_value_t = 0.0)]
    burst_loss: f64,
    /// Mean frames per loss burst.
    #[arg(long, default_value_t = 3.0)]
    burst_len: f64,
    /// Duplicated frames in percent.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Reordered (held back) frames in percent.
    #[arg(long, default_value_t = 2.0)]
    reorder: f64,
    /// One-way delay in microseconds.
    #[arg(long, default_value_t = 100)]
    delay_us: u64,
    /// Uniform jitter in microseconds.
    #[arg(long, default_value_t = 100)]
    jitter_us: u64,
    /// Egress rate limit in Mbit/s (0: none).
    #[arg(long, default_value_t = 200)]
    rate_mbps: u64,
    /// Egress queue size in KiB.
    #[arg(long, default_value_t = 128)]
    queue_kib: usize,
    /// Queue depth in KiB above which ECN-capable frames are CE-marked (0: never).
    #[arg(long, default_value_t = 16)]
    ecn_kib: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bound on the run in seconds; nodes still running are killed
    /// (default 60; with --serve: none).
    #[arg(long)]
    duration: Option<u64>,
    /// Serve role: one node runs the serve profile behind a host gateway
    /// until stopped (the node-to-node options do not apply).
    #[arg(long)]
    serve: bool,
    /// With --serve: the host UDP address of the gateway.
    #[arg(long, default_value = "127.0.0.1:4795")]
    gateway: SocketAddr,
    /// With --serve: stop when standard input reaches end of file.
    #[arg(long)]
    until_stdin_closes: bool,
    /// Write every delivered frame here (open with tshark/Wireshark).
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Consoles and decoded defmt logs go here.
    #[arg(long, default_value = "target/qemu-run")]
    out_dir: PathBuf,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Boot the nodes in the host role and run this program with
    /// `SHM_i IP_i:PORT` for every node (its exit status is the run's),
    /// instead of the workload.
    #[arg(long)]
    exec: Option<PathBuf>,
}

fn serve_main(a: Args) -> ExitCode {
    let stopped = Arc::new(AtomicBool::new(false));
    if a.until_stdin_closes {
        let stopped = stopped.clone();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin();
            while stdin.read(&mut sink).is_ok_and(|n| n > 0) {}
            stopped.store(true, Ordering::Relaxed);
        });
    }
    let opts = ServeOptions {
        elf: a.elf,
        qemu: a.qemu,
        gateway: a.gateway,
        timeout: a.duration.map(Duration::from_secs),
        pcap: a.pcap,
        out_dir: a.out_dir,
        seed: a.seed,
    };
    let result = serve(
        &opts,
        || stopped.load(Ordering::Relaxed),
        |line| {
            if !a.quiet || line.starts_with("METAROCE-QEMU-") {
                println!("{line}");
            }
        },
    );
    match result {
        Ok(report) => {
            println!(
                "serve: {} connections ended; gateway {} datagrams to the node, {} to the host, {} ARP replies; logs: {}",
                report.connections,
                report.gateway.to_node,
                report.gateway.to_host,
                report.gateway.arp_replies,
                opts.out_dir.display()
            );
            if let Some(p) = &report.panic {
                println!("node panicked: {p}");
            }
            for e in &report.errors {
                println!("node error: {e}");
            }
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                println!("FAILED: the serve node did not run until stopped");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("metaroce-qemu: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let exec = a.exec.clone();
    if a.serve {
        return serve_main(a);
    }
    let driver = match (a.driver, a.cores) {
        (Some(DriverArg::Host), cores) if cores > 1 => {
            eprintln!(
                "metaroce-qemu: --driver host drives one core per DPU (the host interface is served by a single engine); use --driver firmware with --cores {cores}"
            );
            return ExitCode::from(2);
        }
        (Some(DriverArg::Host), _) => Driver::Host,
        (None, cores) if cores > 1 => Driver::Firmware,
        (None, _) => Driver::Host,
        (Some(DriverArg::Firmware), _) => Driver::Firmware,
    };
    let opts = RunOptions {
        driver,
        elf: a.elf,
        qemu: a.qemu,
        nodes: a.nodes,
        cores: a.cores,
        topology: match a.topology {
            Some(TopologyArg::Pair) => Topology::Pair,
            Some(TopologyArg::Incast) => Topology::Incast,
            Some(TopologyArg::Ring) => Topology::Ring,
            None if a.cores > 1 => Topology::Ring,
            None => Topology::Pair,
        },
        workload: a.workload,
        streams: a.streams,
        size: a.size,
        count: a.count.unwrap_or_else(|| {
            let fit = metaroce_qemu::default_count(a.size, a.cores, a.nodes, a.streams);
            if fit < 32 {
                eprintln!(
                    "metaroce-qemu: --count {fit}: what a core's share of host memory holds at --size {} on {} cores",
                    a.size, a.cores
                );
            }
            fit
        }),
        depth: a.depth,
        seed: a.seed,
        impairments: Impairments {
            loss: a.loss / 100.0,
            burst_start: a.burst_loss / 100.0,
            burst_len: a.burst_len,
            duplicate: a.duplicate / 100.0,
            delay: Duration::from_micros(a.delay_us),
            jitter: Duration::from_micros(a.jitter_us),
            reorder: a.reorder / 100.0,
            reorder_delay: Duration::from_micros(a.delay_us.max(100) * 3),
            rate_mbps: a.rate_mbps,
            queue_bytes: a.queue_kib * 1024,
            ecn_threshold_bytes: if a.ecn_kib == 0 {
                usize::MAX
            } else {
                a.ecn_kib * 1024
            },
            seed: a.seed,
        },
        timeout: Duration::from_secs(a.duration.unwrap_or(60)),
        pcap: a.pcap,
        out_dir: a.out_dir,
        progress: !a.quiet,
    };
    if let Some(program) = &exec {
        return match run_program(&opts, program) {
            Ok(Some(0)) => ExitCode::SUCCESS,
            Ok(code) => {
                println!("FAILED: {} exited with {code:?}", program.display());
                ExitCode::from(1)
            }
            Err(e) => {
                eprintln!("metaroce-qemu: {e}");
                ExitCode::from(2)
            }
        };
    }
    match run(&opts) {
        Ok(report) => {
            print!("{}", report.summary());
            print!("{}", report.core_summary());
            for n in &report.nodes {
                if let Some(p) = &n.panic {
                    println!("node {} panicked: {p}", n.node);
                }
                for e in &n.errors {
                    println!("node {} error: {e}", n.node);
                }
            }
            println!("logs: {}", opts.out_dir.display());
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                println!("FAILED: integrity, panic or hang (see the table)");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("metaroce-qemu: {e}");
            ExitCode::from(2)
        }
    }
}
