//! `metaroce-sim`: runs the simulator's experiments and prints their
//! tables; `cargo xtask sim <experiment>` builds it in release and runs it.
//! It is a thin front end: the experiments live in
//! `metaroce_sim::experiments`.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::process::ExitCode;
use std::time::Duration;

use metaroce_sim::experiments::{
    self, FirstFlight, Incast, LossSweep, LossSweepRow, PathFailure, Pattern, Protocol, Spray,
    Traffic,
};
use metaroce_sim::long_haul::cli::LongHaulArgs;
use metaroce_sim::plot::{self, Chart, Scale, Series};
use metaroce_sim::scale::cli::{ReplayArgs, ScaleArgs};
use metaroce_sim::workload::FlowStatus;
use metaroce_sim::{HostMemory, LeafSpine};

/// The simulator's experiments; each runs MetaRoCE and RoCEv2 (or the one
/// `--protocol` names) on the same fabric and flows. Tables go to stdout,
/// CSV and SVG files to `--out`.
#[derive(Parser, Debug)]
#[command(name = "metaroce-sim", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    experiment: Experiment,
}

#[derive(Subcommand, Debug)]
enum Experiment {
    /// One transfer between two hosts back to back, random loss per link
    /// direction; goodput per loss rate.
    LossSweep(LossSweepArgs),
    /// N senders to host 0 of a leaf-spine at once; completion times
    /// against the ideal, retransmissions, drops, fairness.
    Incast(IncastArgs),
    /// Leaf 0's hosts send to leaf 1's; the leaf 0 - spine 0 link fails
    /// mid-transfer; every byte must still arrive.
    PathFailure(PathFailureArgs),
    /// Every host sends to one other (seeded derangement) at each loss
    /// rate per cross-leaf path; FCT p50/p99, link utilisation.
    Permutation(PermutationArgs),
    /// Every host sends to every other; same table as permutation.
    AllToAll(AllToAllArgs),
    /// One loss-free transfer over 16 spines whose delays differ by up to
    /// the skew; spurious retransmissions.
    Spray(SprayArgs),
    /// One WRITE of 4 KiB, 64 KiB, 1 MiB and 16 MiB between two hosts of
    /// a leaf, alone: MetaRoCE on a fresh connection, without and with a
    /// job key (its handshake, or 0-RTT), against RoCEv2 on a queue pair
    /// set up beforehand; completion time against the wire floor.
    FirstFlight(FirstFlightArgs),
    /// One connection between two sites at round trips of 0.01 to 20 ms,
    /// 0 and 0.1 % loss; goodput against the line rate; then a long-haul
    /// flow sharing a receiver with data-centre flows.
    // An option given twice: the last one counts, as with the
    // experiment's hand-written parser of old.
    #[command(args_override_self = true)]
    LongHaul(LongHaulArgs),
    /// Permutation and incast at 64 to 8,192 hosts, MetaRoCE alone:
    /// completion-time percentiles and what each run cost (wall and CPU
    /// time, peak memory, events per CPU-second).
    Scale(ScaleArgs),
    /// Flows from a file (`SRC DST BYTES [START_US]` a line) on a
    /// leaf-spine or fat tree of your shape, MetaRoCE alone.
    Replay(ReplayArgs),
}

/// `--protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProtocolChoice {
    Metaroce,
    Rocev2,
    Both,
}

impl ProtocolChoice {
    fn protocols(self) -> &'static [Protocol] {
        match self {
            ProtocolChoice::Metaroce => Protocol::METAROCE,
            ProtocolChoice::Rocev2 => Protocol::ROCE,
            ProtocolChoice::Both => &Protocol::ALL,
        }
    }
}

/// Options every experiment takes.
#[derive(Args, Debug)]
struct Common {
    /// Which transports run.
    #[arg(long, value_enum, default_value_t = ProtocolChoice::Both)]
    protocol: ProtocolChoice,
    /// Where CSV and SVG files go.
    #[arg(long, default_value = "target/metaroce")]
    out: PathBuf,
    /// Every MetaRoCE host holds one job key: packets protected, the
    /// first flight sent with the CONNECT (0-RTT, spec 4.2.4).
    #[arg(long)]
    job_key: bool,
}

/// The leaf-spine of the fabric experiments.
#[derive(Args, Debug)]
struct FabricArgs {
    /// Hosts, 8 per leaf (at least 16).
    #[arg(long, default_value_t = LeafSpine::default().hosts(), value_parser = clap::value_parser!(usize))]
    hosts: usize,
    /// Switches run PFC (a lossless fabric: RoCEv2 as usually deployed).
    #[arg(long)]
    pfc: bool,
    /// Hosts' memory: `synthetic` checks each packet's bytes on arrival
    /// and stores none (memory independent of the payload); `stored`
    /// keeps every byte and compares whole flows at the end. Same run,
    /// same figures.
    #[arg(long, value_enum, default_value_t = MemoryChoice::Synthetic)]
    memory: MemoryChoice,
}

/// `--memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum MemoryChoice {
    Synthetic,
    Stored,
}

impl MemoryChoice {
    fn model(self) -> HostMemory {
        match self {
            MemoryChoice::Synthetic => HostMemory::Synthetic,
            MemoryChoice::Stored => HostMemory::Stored,
        }
    }
}

#[derive(Args, Debug)]
struct LossSweepArgs {
    /// Bytes of the one transfer.
    #[arg(long, default_value_t = LossSweep::default().bytes)]
    bytes: u64,
    /// Loss percentages per link direction.
    #[arg(long, value_delimiter = ',', default_values_t = LOSS_SWEEP_PERCENT)]
    losses: Vec<f64>,
    /// Runs per loss rate (seeds 1..=N); the table shows mean, median and total.
    #[arg(long, default_value_t = LossSweep::default().seeds)]
    seeds: u64,
    #[command(flatten)]
    common: Common,
}

/// `LossSweep::default().losses` in percent, as `--help` shows them.
const LOSS_SWEEP_PERCENT: [f64; 7] = [0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0];
/// `Traffic::new(..).losses` in percent.
const TRAFFIC_PERCENT: [f64; 3] = [0.0, 1.0, 10.0];

#[derive(Args, Debug)]
struct IncastArgs {
    /// Bytes per sender.
    #[arg(long, default_value_t = Incast::default().bytes)]
    bytes: u64,
    /// Senders [default: hosts - 1].
    #[arg(long)]
    senders: Option<usize>,
    /// The seed.
    #[arg(long, default_value_t = Incast::default().seed)]
    seed: u64,
    #[command(flatten)]
    fabric: FabricArgs,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct FirstFlightArgs {
    /// Bytes of each WRITE (one run per size) [default: 4096 65536 1048576
    /// 16777216].
    #[arg(long, num_args = 1..)]
    sizes: Option<Vec<u64>>,
    /// The seed.
    #[arg(long, default_value_t = FirstFlight::default().seed)]
    seed: u64,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct PathFailureArgs {
    /// Bytes per flow.
    #[arg(long, default_value_t = PathFailure::default().bytes)]
    bytes: u64,
    /// When the link fails, in microseconds.
    #[arg(long, default_value_t = PathFailure::default().fail_at.as_micros() as u64)]
    fail_at_us: u64,
    /// Switches never route around the failure (the transport must move
    /// off the dead path itself).
    #[arg(long)]
    no_reroute: bool,
    /// The seed.
    #[arg(long, default_value_t = PathFailure::default().seed)]
    seed: u64,
    #[command(flatten)]
    fabric: FabricArgs,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct PermutationArgs {
    /// Bytes per flow.
    #[arg(long, default_value_t = Traffic::new(Pattern::Permutation).bytes)]
    bytes: u64,
    #[command(flatten)]
    traffic: TrafficArgs,
}

#[derive(Args, Debug)]
struct AllToAllArgs {
    /// Bytes per flow (per pair of hosts).
    #[arg(long, default_value_t = Traffic::new(Pattern::AllToAll).bytes)]
    bytes: u64,
    #[command(flatten)]
    traffic: TrafficArgs,
}

#[derive(Args, Debug)]
struct TrafficArgs {
    /// Loss percentages per cross-leaf path (4 links).
    #[arg(long, value_delimiter = ',', default_values_t = TRAFFIC_PERCENT)]
    losses: Vec<f64>,
    /// The seed.
    #[arg(long, default_value_t = Traffic::new(Pattern::Permutation).seed)]
    seed: u64,
    #[command(flatten)]
    fabric: FabricArgs,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct SprayArgs {
    /// Bytes of the one transfer.
    #[arg(long, default_value_t = Spray::default().bytes)]
    bytes: u64,
    /// Most delay difference between the paths, in microseconds.
    #[arg(long, default_value_t = Spray::default().skew.as_micros() as u64)]
    skew_us: u64,
    /// The seed.
    #[arg(long, default_value_t = Spray::default().seed)]
    seed: u64,
    #[command(flatten)]
    common: Common,
}

/// What the printing functions need: the experiment's settings and where
/// files go.
struct Options {
    sweep: LossSweep,
    incast: Incast,
    failure: PathFailure,
    permutation: Traffic,
    all_to_all: Traffic,
    spray: Spray,
    out: PathBuf,
}

impl Options {
    fn new(common: &Common) -> Options {
        let protocols = common.protocol.protocols();
        let mut o = Options {
            sweep: LossSweep::default(),
            incast: Incast::default(),
            failure: PathFailure::default(),
            permutation: Traffic::new(Pattern::Permutation),
            all_to_all: Traffic::new(Pattern::AllToAll),
            spray: Spray::default(),
            out: common.out.clone(),
        };
        o.sweep.protocols = protocols;
        o.incast.protocols = protocols;
        o.failure.protocols = protocols;
        o.permutation.protocols = protocols;
        o.all_to_all.protocols = protocols;
        o.spray.protocols = protocols;
        o.sweep.job_key = common.job_key;
        o.incast.job_key = common.job_key;
        o.failure.job_key = common.job_key;
        o.permutation.job_key = common.job_key;
        o.all_to_all.job_key = common.job_key;
        o.spray.job_key = common.job_key;
        o
    }
}

/// Loss rates from percentages.
fn fractions(flag: &str, percent: &[f64]) -> Result<Vec<f64>, String> {
    if percent.is_empty() || percent.iter().any(|p| !(0.0..=100.0).contains(p)) {
        return Err(format!("{flag}: percentages from 0 to 100"));
    }
    Ok(percent.iter().map(|p| p / 100.0).collect())
}

/// The leaf-spine of `--hosts` and `--pfc`.
fn fabric(args: &FabricArgs) -> Result<LeafSpine, String> {
    if args.hosts < 16 {
        return Err("--hosts: at least 16 (two leaves of 8)".into());
    }
    let mut fabric = LeafSpine::with_hosts(args.hosts, 8);
    if args.pfc {
        let config = metaroce_sim::PfcConfig::default();
        // Size every output buffer for lossless operation: a leaf has
        // hosts_per_leaf + spines ingress ports.
        let ports = (fabric.hosts_per_leaf + fabric.spines).max(fabric.leaves) as u64;
        let link = fabric.fabric_link;
        fabric.queue.capacity_bytes = fabric.queue.capacity_bytes.max(config.lossless_buffer(
            ports,
            link.rate_bps,
            link.delay,
            4_142,
        ));
        fabric.pfc = Some(config);
    }
    Ok(fabric)
}

fn traffic_config(cfg: &mut Traffic, bytes: u64, args: &TrafficArgs) -> Result<(), String> {
    cfg.bytes = bytes;
    cfg.losses = fractions("--losses", &args.losses)?;
    cfg.seed = args.seed;
    cfg.fabric = fabric(&args.fabric)?;
    cfg.memory = args.fabric.memory.model();
    Ok(())
}

/// Runs the experiment the command line names.
fn run(experiment: &Experiment) -> Result<(), String> {
    match experiment {
        Experiment::LossSweep(a) => {
            let mut o = Options::new(&a.common);
            if a.bytes == 0 || a.seeds == 0 {
                return Err("--bytes and --seeds must not be zero".into());
            }
            o.sweep.bytes = a.bytes;
            o.sweep.seeds = a.seeds;
            o.sweep.losses = fractions("--losses", &a.losses)?;
            loss_sweep(&o)
        }
        Experiment::Incast(a) => {
            let mut o = Options::new(&a.common);
            o.incast.fabric = fabric(&a.fabric)?;
            o.incast.memory = a.fabric.memory.model();
            o.incast.bytes = a.bytes;
            o.incast.seed = a.seed;
            o.incast.senders = a.senders.unwrap_or(o.incast.fabric.hosts() - 1);
            incast(&o)
        }
        Experiment::PathFailure(a) => {
            let mut o = Options::new(&a.common);
            o.failure.fabric = fabric(&a.fabric)?;
            o.failure.memory = a.fabric.memory.model();
            o.failure.bytes = a.bytes;
            o.failure.seed = a.seed;
            o.failure.fail_at = Duration::from_micros(a.fail_at_us);
            if a.no_reroute {
                o.failure.reroute_delay = None;
            }
            path_failure(&o)
        }
        Experiment::Permutation(a) => {
            let mut o = Options::new(&a.traffic.common);
            traffic_config(&mut o.permutation, a.bytes, &a.traffic)?;
            traffic(&o, &o.permutation, "permutation")
        }
        Experiment::AllToAll(a) => {
            let mut o = Options::new(&a.traffic.common);
            traffic_config(&mut o.all_to_all, a.bytes, &a.traffic)?;
            traffic(&o, &o.all_to_all, "all-to-all")
        }
        Experiment::Spray(a) => {
            let mut o = Options::new(&a.common);
            o.spray.bytes = a.bytes;
            o.spray.seed = a.seed;
            o.spray.skew = Duration::from_micros(a.skew_us);
            spray(&o)
        }
        Experiment::LongHaul(args) => long_haul(args),
        Experiment::Scale(args) => timed(|| metaroce_sim::scale::cli::scale(args)),
        Experiment::Replay(args) => timed(|| metaroce_sim::scale::cli::replay(args)),
        Experiment::FirstFlight(a) => {
            let o = Options::new(&a.common);
            let mut c = FirstFlight {
                seed: a.seed,
                protocols: a.common.protocol.protocols(),
                ..FirstFlight::default()
            };
            if let Some(sizes) = &a.sizes {
                if sizes.contains(&0) {
                    return Err("--sizes must not be zero".into());
                }
                c.sizes = sizes.clone();
            }
            first_flight(&o, &c)
        }
    }
}

fn write_csv(o: &Options, name: &str, csv: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let path = o.out.join(name);
    std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn write_svg(
    o: &Options,
    name: &str,
    chart: &Chart<'_>,
    series: &[Series],
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let path = o.out.join(name);
    plot::line_chart(&path, chart, series)?;
    Ok(path)
}

/// Cumulative distribution of sorted completion times, in microseconds.
fn cdf(fcts: &[Duration], total: usize) -> Vec<(f64, f64)> {
    fcts.iter()
        .enumerate()
        .map(|(i, d)| (d.as_secs_f64() * 1e6, (i + 1) as f64 / total.max(1) as f64))
        .collect()
}

/// CPU time (user + system) this process used so far, from
/// `/proc/self/stat` (Linux; its clock ticks are USER_HZ = 100 per second).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold
    // spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn speed(events: u64, wall: std::time::Instant, cpu_start: Option<f64>) {
    let secs = wall.elapsed().as_secs_f64();
    let cpu = cpu_start.and_then(|c0| cpu_seconds().map(|c1| c1 - c0));
    let cpu_text = cpu.map_or(String::new(), |c| {
        format!(
            ", {c:.2} s CPU = {:.2} M events/CPU-s",
            events as f64 / c.max(1e-9) / 1e6
        )
    });
    println!(
        "simulator: {events} events in {secs:.2} s wall = {:.2} M events/s{cpu_text} (setup and integrity checks included)",
        events as f64 / secs.max(1e-9) / 1e6
    );
}

fn us(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e6))
}

fn progress_bar(done: usize, total: usize) {
    let width = 40;
    let filled = done * width / total.max(1);
    eprint!(
        "\r[{}{}] {done}/{total}",
        "#".repeat(filled),
        " ".repeat(width - filled)
    );
    if done == total {
        eprintln!();
    }
    let _ = std::io::stderr().flush();
}

fn status_text(r: &LossSweepRow) -> String {
    match (r.status, r.integrity_ok) {
        (FlowStatus::Done, Some(true)) => "ok".into(),
        (FlowStatus::Done, _) => "CORRUPT".into(),
        (s, _) => format!("{s:?}"),
    }
}

fn loss_sweep(o: &Options) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let rows = experiments::loss_sweep(&o.sweep, progress_bar);
    let events: u64 = rows.iter().map(|r| r.events).sum();

    let mut csv = String::from(
        "protocol,loss_pct,seed,status,fct_us,goodput_gbps,lost_packets,retransmissions,timeouts,events\n",
    );
    for r in &rows {
        csv.push_str(&format!(
            "{},{},{},{},{:.3},{:.3},{},{},{},{}\n",
            r.protocol.name(),
            r.loss * 100.0,
            r.seed,
            status_text(r),
            r.fct.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6),
            r.goodput_gbps,
            r.lost,
            r.retransmissions,
            r.timeouts,
            r.events
        ));
    }
    let path = write_csv(o, "loss-sweep.csv", &csv)?;

    println!(
        "loss-sweep: one {} byte transfer, two hosts back to back (100 Gbit/s, 1 us), {} seed(s) per point",
        o.sweep.bytes, o.sweep.seeds
    );
    let protocols = o.sweep.protocols;
    // The ratio columns need both protocols.
    let both = protocols.len() == 2;
    let mut header = format!("{:>7} |", "loss %");
    for p in protocols {
        header.push_str(&format!(
            " {:>10} {:>7} {:>6} |",
            p.name(),
            "% free",
            "retx"
        ));
    }
    if both {
        header.push_str(&format!(" {:>9}", "MR/RoCE"));
    }
    println!("{}", header.trim_end_matches(" |"));
    let free = |p| experiments::mean_goodput(&rows, p, o.sweep.losses[0]);
    for &loss in &o.sweep.losses {
        let mut line = format!("{:>7} |", loss * 100.0);
        let mut marks = String::new();
        for &p in protocols {
            let g = experiments::mean_goodput(&rows, p, loss);
            let sel: Vec<&LossSweepRow> = rows
                .iter()
                .filter(|r| r.protocol == p && r.loss == loss)
                .collect();
            let retx = sel.iter().map(|r| r.retransmissions).sum::<u64>() / sel.len().max(1) as u64;
            let bad = sel.iter().filter(|r| status_text(r) != "ok").count();
            let pct = if free(p) > 0.0 {
                100.0 * g / free(p)
            } else {
                0.0
            };
            if bad > 0 {
                marks.push_str(&format!(" ({} {bad} failed)", p.name()));
            }
            line.push_str(&format!(" {g:>6.2} Gb/s {pct:>6.1}% {retx:>6} |"));
        }
        if both {
            let ratio = experiments::mean_goodput(&rows, Protocol::MetaRoce, loss)
                / experiments::mean_goodput(&rows, Protocol::Roce, loss);
            line.push_str(&format!(" {ratio:>8.2}x"));
        }
        println!("{}{marks}", line.trim_end_matches(" |"));
    }
    println!(
        "\nacross seeds (Gbit/s): median, and total bytes over total time (a stalled run weighs by its time)"
    );
    let mut header = format!("{:>7} |", "loss %");
    for p in protocols {
        header.push_str(&format!(
            " {:>8} {:>8} |",
            format!("{} med", p.name()),
            "total"
        ));
    }
    if both {
        header.push_str(&format!(" {:>9} {:>9}", "med ratio", "tot ratio"));
    }
    println!("{}", header.trim_end_matches(" |"));
    for &loss in &o.sweep.losses {
        let med = |p| experiments::median_goodput(&rows, p, loss);
        let tot =
            |p| experiments::aggregate_goodput(&rows, p, loss, o.sweep.bytes, o.sweep.time_limit);
        let mut line = format!("{:>7} |", loss * 100.0);
        for &p in protocols {
            line.push_str(&format!(" {:>8.2} {:>8.2} |", med(p), tot(p)));
        }
        if both {
            line.push_str(&format!(
                " {:>8.2}x {:>8.2}x",
                med(Protocol::MetaRoce) / med(Protocol::Roce),
                tot(Protocol::MetaRoce) / tot(Protocol::Roce)
            ));
        }
        println!("{}", line.trim_end_matches(" |"));
    }
    println!(
        "goals: MetaRoCE at 1 % >= 97 % of loss-free, at 10 % >= 85 %; MetaRoCE/RoCEv2 at 1 % >= 10x"
    );
    let series: Vec<Series> = o
        .sweep
        .protocols
        .iter()
        .map(|&p| Series {
            name: p.name().into(),
            points: o
                .sweep
                .losses
                .iter()
                .map(|&l| (l * 100.0, experiments::mean_goodput(&rows, p, l)))
                .collect(),
        })
        .collect();
    let chart = Chart {
        title: "loss-sweep: goodput of one transfer",
        x_label: "random loss per link direction (%)",
        y_label: "goodput (Gbit/s)",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
    };
    let svg = write_svg(o, "loss-sweep.svg", &chart, &series)?;
    speed(events, wall, cpu);
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

fn incast(o: &Options) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let c = &o.incast;
    let rows = experiments::incast(c, progress_bar);
    let mut csv = String::from(
        "protocol,senders,bytes,intact,first_us,median_us,last_us,ideal_us,last_over_ideal,wire_floor_us,last_over_floor,retransmissions,timeouts,probes,queue_drops,marked,pauses,fairness,events\n",
    );
    println!(
        "incast: {} senders x {} bytes to host 0, leaf-spine of {} hosts, seed {}{}",
        c.senders,
        c.bytes,
        c.fabric.hosts(),
        c.seed,
        if c.fabric.pfc.is_some() {
            ", PFC on"
        } else {
            ""
        }
    );
    println!(
        "{:<9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>6} {:>5} {:>6} {:>6} {:>8} {:>5}",
        "protocol",
        "intact",
        "first us",
        "median us",
        "last us",
        "ideal us",
        "last/idl",
        "floor us",
        "last/flr",
        "retx",
        "RTOs",
        "probes",
        "drops",
        "marked",
        "Jain"
    );
    for r in &rows {
        let ratio = r
            .last
            .map_or(f64::NAN, |l| l.as_secs_f64() / r.ideal.as_secs_f64());
        let over_floor = r
            .last
            .map_or(f64::NAN, |l| l.as_secs_f64() / r.wire_floor.as_secs_f64());
        println!(
            "{:<9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9.3} {:>10} {:>9.4} {:>6} {:>5} {:>6} {:>6} {:>8} {:>5.3}",
            r.protocol.name(),
            format!("{}/{}", r.intact, c.senders),
            us(r.first),
            us(r.median),
            us(r.last),
            us(Some(r.ideal)),
            ratio,
            us(Some(r.wire_floor)),
            over_floor,
            r.retransmissions,
            r.timeouts,
            r.probes,
            r.queue_drops,
            r.marked,
            r.fairness
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.4},{},{:.4},{},{},{},{},{},{},{:.4},{}\n",
            r.protocol.name(),
            c.senders,
            c.bytes,
            r.intact,
            us(r.first),
            us(r.median),
            us(r.last),
            us(Some(r.ideal)),
            ratio,
            us(Some(r.wire_floor)),
            over_floor,
            r.retransmissions,
            r.timeouts,
            r.probes,
            r.queue_drops,
            r.marked,
            r.pauses,
            r.fairness,
            r.events
        ));
    }
    println!("goal: last completion <= 1.01x the wire floor with fewer than 300 retransmissions");
    let path = write_csv(o, "incast.csv", &csv)?;
    let series: Vec<Series> = rows
        .iter()
        .map(|r| Series {
            name: r.protocol.name().into(),
            points: cdf(&r.fcts, c.senders),
        })
        .collect();
    let chart = Chart {
        title: "incast: completion times (ideal last = all bytes at line rate)",
        x_label: "flow completion time (us)",
        y_label: "fraction of flows done",
        x_scale: Scale::Log,
        y_scale: Scale::Linear,
    };
    let svg = write_svg(o, "incast.svg", &chart, &series)?;
    speed(rows.iter().map(|r| r.events).sum(), wall, cpu);
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

fn first_flight(o: &Options, c: &FirstFlight) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let rows = experiments::first_flight(c, progress_bar);
    println!(
        "first-flight: one WRITE host 1 -> host 0 (same leaf), alone on a leaf-spine of {} hosts, seed {}; MetaRoCE connects first, RoCEv2's queue pair is set up beforehand",
        c.fabric.hosts(),
        c.seed
    );
    println!(
        "{:<13} {:>10} {:>7} {:>10} {:>10} {:>9} {:>10} {:>6}",
        "protocol", "bytes", "intact", "fct us", "floor us", "fct/flr", "vs RoCEv2", "retx"
    );
    let mut csv = String::from(
        "protocol,job_key,bytes,intact,fct_us,wire_floor_us,fct_over_floor,fct_over_rocev2,retransmissions,events\n",
    );
    for r in &rows {
        let over_floor = r
            .fct
            .map_or(f64::NAN, |f| f.as_secs_f64() / r.wire_floor.as_secs_f64());
        let roce = rows
            .iter()
            .find(|x| x.protocol == Protocol::Roce && x.bytes == r.bytes)
            .and_then(|x| x.fct);
        let name = if r.job_key {
            "MetaRoCE+key"
        } else {
            r.protocol.name()
        };
        let over_roce = match (r.fct, roce) {
            (Some(f), Some(b)) => f.as_secs_f64() / b.as_secs_f64(),
            _ => f64::NAN,
        };
        println!(
            "{:<13} {:>10} {:>7} {:>10} {:>10} {:>9.3} {:>10.3} {:>6}",
            name,
            r.bytes,
            r.intact,
            us(r.fct),
            us(Some(r.wire_floor)),
            over_floor,
            over_roce,
            r.retransmissions
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{:.4},{:.4},{},{}\n",
            r.protocol.name(),
            r.job_key,
            r.bytes,
            r.intact,
            us(r.fct),
            us(Some(r.wire_floor)),
            over_floor,
            over_roce,
            r.retransmissions,
            r.events
        ));
    }
    let path = write_csv(o, "first-flight.csv", &csv)?;
    let mut series: Vec<Series> = Vec::new();
    for &p in c.protocols {
        for key in [false, true] {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.protocol == p && r.job_key == key)
                .filter_map(|r| Some((r.bytes as f64, r.fct?.as_secs_f64() * 1e6)))
                .collect();
            if !points.is_empty() {
                let name = if key {
                    format!("{} with a job key", p.name())
                } else {
                    p.name().to_string()
                };
                series.push(Series { name, points });
            }
        }
    }
    if let Some(&p) = c.protocols.first() {
        series.push(Series {
            name: format!("wire floor ({})", p.name()),
            points: rows
                .iter()
                .filter(|r| r.protocol == p && !r.job_key)
                .map(|r| (r.bytes as f64, r.wire_floor.as_secs_f64() * 1e6))
                .collect(),
        });
    }
    let chart = Chart {
        title: "first flight: one WRITE alone (MetaRoCE handshake included)",
        x_label: "WRITE size (bytes)",
        y_label: "completion time (us)",
        x_scale: Scale::Log,
        y_scale: Scale::Log,
    };
    let svg = write_svg(o, "first-flight.svg", &chart, &series)?;
    speed(rows.iter().map(|r| r.events).sum(), wall, cpu);
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

fn path_failure(o: &Options) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let c = &o.failure;
    let rows = experiments::path_failure(c, progress_bar);
    println!(
        "path-failure: {} flows of {} bytes leaf 0 -> leaf 1 ({} hosts{}); leaf 0 - spine 0 fails at {} us; reroute {}",
        c.fabric.hosts_per_leaf,
        c.bytes,
        c.fabric.hosts(),
        if c.fabric.pfc.is_some() { ", PFC on" } else { "" },
        c.fail_at.as_micros(),
        c.reroute_delay.map_or("never".into(), |d| format!("after {} us", d.as_micros()))
    );
    println!(
        "{:<9} {:>8} {:>7} {:>12} {:>12} {:>10} {:>6} {:>5}",
        "protocol", "failure", "intact", "last us", "extra us", "lost pkts", "retx", "RTOs"
    );
    let mut csv = String::from(
        "protocol,failure,flows,intact,last_us,extra_us,lost_on_link,retransmissions,timeouts,events\n",
    );
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.protocol == r.protocol && !b.failure)
            .and_then(|b| b.last);
        let extra = match (r.last, base) {
            (Some(l), Some(b)) => format!("{:.1}", (l.as_secs_f64() - b.as_secs_f64()) * 1e6),
            _ => "-".into(),
        };
        println!(
            "{:<9} {:>8} {:>7} {:>12} {:>12} {:>10} {:>6} {:>5}",
            r.protocol.name(),
            if r.failure { "yes" } else { "no" },
            format!("{}/{}", r.intact, r.flows),
            us(r.last),
            extra,
            r.lost_on_link,
            r.retransmissions,
            r.timeouts
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{}\n",
            r.protocol.name(),
            r.failure,
            r.flows,
            r.intact,
            us(r.last),
            extra,
            r.lost_on_link,
            r.retransmissions,
            r.timeouts,
            r.events
        ));
    }
    println!("goal: bytes lost must be 0 (every flow intact); extra us = time the failure cost");
    let path = write_csv(o, "path-failure.csv", &csv)?;
    let chart = Chart {
        title: "path-failure: per-flow completion time (flat lines: failure, reroute)",
        x_label: "flow (host i of leaf 0 -> host i of leaf 1)",
        y_label: "completion time (us)",
        x_scale: Scale::Linear,
        y_scale: Scale::Log,
    };
    let svg = write_svg(
        o,
        "path-failure.svg",
        &chart,
        &plot::path_failure_series(&rows, c),
    )?;
    speed(rows.iter().map(|r| r.events).sum(), wall, cpu);
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

fn traffic(o: &Options, cfg: &Traffic, name: &str) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let rows = experiments::traffic(cfg, progress_bar);
    println!(
        "{name}: {} flows of {} bytes on a leaf-spine of {} hosts, seed {}{}; loss per cross-leaf path",
        rows.first().map_or(0, |r| r.flows),
        cfg.bytes,
        cfg.fabric.hosts(),
        cfg.seed,
        if cfg.fabric.pfc.is_some() { ", PFC on" } else { "" }
    );
    println!(
        "{:<9} {:>6} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>7} {:>5} {:>6} {:>6}",
        "protocol",
        "loss %",
        "intact",
        "p50 us",
        "p99 us",
        "max us",
        "floor us",
        "util avg",
        "util max",
        "retx",
        "RTOs",
        "probes",
        "drops"
    );
    let mut csv = String::from(
        "protocol,loss_pct,flows,intact,p50_us,p99_us,max_us,wire_floor_us,util_mean,util_max,retransmissions,timeouts,probes,queue_drops,pauses,events\n",
    );
    for r in &rows {
        println!(
            "{:<9} {:>6} {:>9} {:>10} {:>10} {:>10} {:>9} {:>8.1}% {:>7.1}% {:>7} {:>5} {:>6} {:>6}",
            r.protocol.name(),
            r.loss * 100.0,
            format!("{}/{}", r.intact, r.flows),
            us(r.p50),
            us(r.p99),
            us(r.max),
            us(Some(r.wire_floor)),
            r.utilisation.0 * 100.0,
            r.utilisation.1 * 100.0,
            r.retransmissions,
            r.timeouts,
            r.probes,
            r.queue_drops
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.4},{:.4},{},{},{},{},{},{}\n",
            r.protocol.name(),
            r.loss * 100.0,
            r.flows,
            r.intact,
            us(r.p50),
            us(r.p99),
            us(r.max),
            us(Some(r.wire_floor)),
            r.utilisation.0,
            r.utilisation.1,
            r.retransmissions,
            r.timeouts,
            r.probes,
            r.queue_drops,
            r.pauses,
            r.events
        ));
    }
    let path = write_csv(o, &format!("{name}.csv"), &csv)?;
    let series: Vec<Series> = rows
        .iter()
        .map(|r| Series {
            name: format!("{} {} %", r.protocol.name(), r.loss * 100.0),
            points: cdf(&r.fcts, r.flows),
        })
        .collect();
    let title = format!("{name}: flow completion times");
    let chart = Chart {
        title: &title,
        x_label: "flow completion time (us)",
        y_label: "fraction of flows done",
        x_scale: Scale::Log,
        y_scale: Scale::Linear,
    };
    let svg = write_svg(o, &format!("{name}.svg"), &chart, &series)?;
    speed(rows.iter().map(|r| r.events).sum(), wall, cpu);
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

fn spray(o: &Options) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let c = &o.spray;
    let rows = experiments::spray(c, progress_bar);
    println!(
        "spray: one {} byte transfer over {} spines, path delays {} us apart at most, no loss",
        c.bytes,
        c.paths,
        c.skew.as_secs_f64() * 1e6
    );
    println!(
        "{:<9} {:>7} {:>10} {:>10} {:>9} {:>6} {:>9} {:>9}",
        "protocol", "intact", "fct us", "Gbit/s", "sent", "retx", "spurious", "spur %"
    );
    let mut csv = String::from(
        "protocol,intact,fct_us,goodput_gbps,first_transmissions,retransmissions,spurious_retransmissions,spurious_pct,events\n",
    );
    for r in &rows {
        let pct = 100.0 * r.spurious_retransmissions as f64 / r.first_transmissions.max(1) as f64;
        println!(
            "{:<9} {:>7} {:>10} {:>10.2} {:>9} {:>6} {:>9} {:>8.3}%",
            r.protocol.name(),
            r.intact,
            us(r.fct),
            r.goodput_gbps,
            r.first_transmissions,
            r.retransmissions,
            r.spurious_retransmissions,
            pct
        );
        csv.push_str(&format!(
            "{},{},{},{:.3},{},{},{},{:.4},{}\n",
            r.protocol.name(),
            r.intact,
            us(r.fct),
            r.goodput_gbps,
            r.first_transmissions,
            r.retransmissions,
            r.spurious_retransmissions,
            pct,
            r.events
        ));
    }
    println!("goal: spurious retransmissions < 0.1 % (RoCEv2 keeps one path: nothing to reorder; go-back-N cannot tell spurious ones)");
    for r in &rows {
        let counts: Vec<String> = r.path_packets.iter().map(u64::to_string).collect();
        println!(
            "{} packets per path (spine 0..{}): {}",
            r.protocol.name(),
            r.path_packets.len(),
            counts.join(" ")
        );
    }
    let path = write_csv(o, "spray.csv", &csv)?;
    let chart = Chart {
        title: "spray: data packets per path (path i: spine i, delay grows with i)",
        x_label: "path (spine)",
        y_label: "packets sent by the source leaf",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
    };
    let svg = write_svg(o, "spray.svg", &chart, &plot::spray_series(&rows))?;
    speed(rows.iter().map(|r| r.events).sum(), wall, cpu);
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(())
}

/// Runs an experiment that returns its event count, then prints the
/// simulator's speed.
fn timed(f: impl FnOnce() -> Result<u64, String>) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let events = f()?;
    speed(events, wall, cpu);
    Ok(())
}

fn long_haul(args: &LongHaulArgs) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let events = metaroce_sim::long_haul::cli::main(args, progress_bar)?;
    if events > 0 {
        speed(events, wall, cpu);
    }
    Ok(())
}

/// Makes the allocator keep the memory one run frees for the next: an
/// experiment builds one simulation after another, each with hundreds of
/// megabytes of endpoints, queues and packet buffers, and memory handed
/// back to the kernel is faulted in and zeroed again by the next run.
/// glibc's malloc raises its mmap threshold (and its trim threshold, to
/// twice that) to the size of an mmap-served block when that block is
/// freed, up to 32 MiB: one such block, allocated and freed here, makes
/// blocks under 24 MiB come from the heap, which is trimmed only above
/// 48 MiB free. Other allocators ignore it; it changes no result.
fn keep_freed_memory() {
    drop(std::hint::black_box(vec![0u8; 24 << 20]));
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    match run(&cli.experiment) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metaroce-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_defaults_are_the_experiments_defaults() {
        let percent = |l: &[f64]| l.iter().map(|x| x * 100.0).collect::<Vec<f64>>();
        let close = |a: &[f64], b: &[f64]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
        };
        assert!(close(
            &LOSS_SWEEP_PERCENT,
            &percent(&LossSweep::default().losses)
        ));
        assert!(close(
            &TRAFFIC_PERCENT,
            &percent(&Traffic::new(Pattern::Permutation).losses)
        ));
        assert!(close(
            &TRAFFIC_PERCENT,
            &percent(&Traffic::new(Pattern::AllToAll).losses)
        ));
    }

    #[test]
    fn every_experiment_has_help_and_the_defaults_parse() {
        for name in [
            "loss-sweep",
            "incast",
            "path-failure",
            "permutation",
            "all-to-all",
            "spray",
            "first-flight",
        ] {
            let err = Cli::try_parse_from(["metaroce-sim", name, "--help"]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{name}");
            assert!(err.to_string().contains("--protocol"), "{name}");
            Cli::try_parse_from(["metaroce-sim", name]).expect(name);
        }
        let help = Cli::try_parse_from(["metaroce-sim", "loss-sweep", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("[default: 10]"),
            "seeds default shown: {help}"
        );
    }

    #[test]
    fn scale_and_replay_parse_their_defaults() {
        let Experiment::Scale(a) = Cli::try_parse_from(["metaroce-sim", "scale"])
            .unwrap()
            .experiment
        else {
            panic!("scale parses as scale");
        };
        assert_eq!(a.sizes, [64, 256, 1024, 4096, 8192]);
        assert_eq!(a.cluster.hosts_per_leaf, 8);
        // A flow file is required.
        assert!(Cli::try_parse_from(["metaroce-sim", "replay"]).is_err());
        let replay = [
            "metaroce-sim",
            "replay",
            "--flows",
            "f",
            "--topology",
            "fat-tree",
        ];
        Cli::try_parse_from(replay).unwrap();
    }

    #[test]
    fn long_haul_has_help_with_defaults_and_the_last_option_counts() {
        let help = Cli::try_parse_from(["metaroce-sim", "long-haul", "--help"])
            .unwrap_err()
            .to_string();
        for shown in [
            "--rtts <LIST>",
            "[default: 0.01 1 5 10 20]",
            "[default: 0 0.1]",
            "--rate-gbps <N>",
            "[default: 25]",
            "--only-share",
        ] {
            assert!(help.contains(shown), "{shown}: {help}");
        }
        let cli = Cli::try_parse_from([
            "metaroce-sim",
            "long-haul",
            "--out",
            "a",
            "--rtts",
            "1,2",
            "--out",
            "b",
            "--rtts",
            "5",
        ])
        .unwrap();
        let Experiment::LongHaul(a) = cli.experiment else {
            panic!("long-haul")
        };
        assert_eq!((a.out, a.rtts), (PathBuf::from("b"), vec![5.0]));
    }

    #[test]
    fn protocol_selects_the_transports() {
        let cli = Cli::try_parse_from(["metaroce-sim", "incast", "--protocol", "rocev2"]).unwrap();
        let Experiment::Incast(a) = cli.experiment else {
            panic!("incast")
        };
        assert_eq!(Options::new(&a.common).incast.protocols, Protocol::ROCE);
        assert!(Cli::try_parse_from(["metaroce-sim", "incast", "--protocol", "tcp"]).is_err());
    }
}
