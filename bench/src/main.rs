//! `metaroce-bench`: measures the engine's cost per packet and memory per
//! connection and prints them as a table and as CSV. Run it in release,
//! through `cargo xtask bench` (which also names the CSV file).
//!
//! Not a test: it asserts nothing about time. Numbers vary with the machine
//! and with whatever else runs on it; each timing is the best of a few runs,
//! and on Linux the on-CPU time is reported beside wall time.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use metaroce_bench::measure::{self, Row, Sample, Stopwatch};
use metaroce_bench::{BenchError, Pair, PhaseTimes, PAYLOAD};
use metaroce_core::wire::CRC_LEN;

const USAGE: &str = "\
Usage: metaroce-bench [--messages N] [--repeats R] [--csv PATH] [--cycle-only] [--no-scale]
                      [--crc-offload] [--multicore-only] [--paths-only]

  --messages N  4 KiB WRITEs per timed run (default 200000)
  --no-scale    skip the runs with 1,024 and 65,536 connections
  --repeats R   timed runs; the best is reported (default 3)
  --csv PATH    where to write metric,value,unit rows
                (default target/metaroce/bench.csv)
  --cycle-only  time only the TX -> RX -> ACK loop, write no CSV
                (for profiling, e.g. under `perf record`)
  --crc-offload with --cycle-only: the CRC trailer left to a device, so a
                profile shows the engine's own work
  --connections N
                with --cycle-only: N connections established, up to 64 of
                them sending in turn (as the scale rows run; default 1)
  --multicore-only
                only the multicore_* rows (1 and 2 threads), printed,
                no CSV (to repeat that measurement on its own)
  --paths-only  only the engine_without_crc_*_paths_* rows (1, 2, 4, 8 and
                16 paths per connection), printed, no CSV
";

struct Args {
    messages: u64,
    repeats: u32,
    csv: PathBuf,
    cycle_only: bool,
    crc_offload: bool,
    multicore_only: bool,
    paths_only: bool,
    scale: bool,
    connections: u32,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args {
        messages: 200_000,
        repeats: 3,
        csv: PathBuf::from("target/metaroce/bench.csv"),
        cycle_only: false,
        crc_offload: false,
        multicore_only: false,
        paths_only: false,
        scale: true,
        connections: 1,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--messages" => {
                parsed.messages = value("--messages")?
                    .parse()
                    .map_err(|e| format!("--messages: {e}"))?;
            }
            "--repeats" => {
                parsed.repeats = value("--repeats")?
                    .parse()
                    .map_err(|e| format!("--repeats: {e}"))?;
            }
            "--csv" => parsed.csv = PathBuf::from(value("--csv")?),
            "--connections" => {
                parsed.connections = value("--connections")?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?;
            }
            "--cycle-only" => parsed.cycle_only = true,
            "--crc-offload" => parsed.crc_offload = true,
            "--no-scale" => parsed.scale = false,
            "--multicore-only" => parsed.multicore_only = true,
            "--paths-only" => parsed.paths_only = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if parsed.crc_offload && !parsed.cycle_only {
        return Err("--crc-offload needs --cycle-only".into());
    }
    if parsed.connections != 1 && !parsed.cycle_only {
        return Err("--connections needs --cycle-only".into());
    }
    if parsed.connections == 0 {
        return Err("--connections must be at least 1".into());
    }
    if parsed.messages == 0 || parsed.repeats == 0 {
        return Err("--messages and --repeats must be at least 1".into());
    }
    Ok(parsed)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The timed cycle runs and, unless `cycle_only`, the reference costs
/// measured between them (so both see the same machine load).
struct Timings {
    cycle: Vec<Sample>,
    /// The same cycle with the CRC trailer left to a device.
    offloaded: Vec<Sample>,
    crc_data: Vec<Sample>,
    crc_reply: Vec<Sample>,
    memcpy: Vec<Sample>,
    replies_per_packet: f64,
    data_len: usize,
    reply_len: usize,
}

fn time_runs(pair: &mut Pair, args: &Args) -> Result<Timings, BenchError> {
    let mut t = Timings {
        cycle: Vec::new(),
        offloaded: Vec::new(),
        crc_data: Vec::new(),
        crc_reply: Vec::new(),
        memcpy: Vec::new(),
        replies_per_packet: 0.0,
        data_len: 0,
        reply_len: 0,
    };
    for _ in 0..args.repeats {
        let watch = Stopwatch::start();
        let counts = pair.run_writes(args.messages, None)?;
        t.cycle.push(watch.per_iteration(counts.data_packets));
        t.replies_per_packet = counts.replies as f64 / counts.data_packets.max(1) as f64;
        (t.data_len, t.reply_len) = pair.packet_lens();
        if !args.cycle_only {
            t.crc_data.push(measure::crc32_sample(t.data_len - CRC_LEN));
            t.crc_reply
                .push(measure::crc32_sample(t.reply_len.max(CRC_LEN) - CRC_LEN));
            t.memcpy.push(measure::memcpy_sample(PAYLOAD));
            pair.set_crc_offload(true);
            let watch = Stopwatch::start();
            let counts = pair.run_writes(args.messages, None)?;
            t.offloaded.push(watch.per_iteration(counts.data_packets));
            pair.set_crc_offload(false);
        }
    }
    Ok(t)
}

fn cycle_rows(t: &Timings, n: u32, crc: &str) -> Vec<Row> {
    let best = measure::best(&t.cycle);
    let mut rows = vec![
        Row::new(
            "cycle_ns_per_packet",
            best.wall_ns,
            "ns",
            format!("TX -> RX -> ACK per 4 KiB data packet, engine + {crc} (wall, best of {n})"),
        ),
        Row::new(
            "cycle_ns_per_packet_median",
            median(t.cycle.iter().map(|s| s.wall_ns).collect()),
            "ns",
            format!("  the same, median of {n}"),
        ),
        Row::new(
            "cycle_mpps",
            1000.0 / best.wall_ns,
            "Mpps",
            "  packet rate (wall, best)",
        ),
    ];
    if let Some(cpu) = best.cpu_ns {
        rows.push(Row::new(
            "cycle_cpu_ns_per_packet",
            cpu,
            "ns",
            format!("  the same, on-CPU time (best of {n})"),
        ));
    }
    rows
}

fn run(args: &Args) -> Result<Vec<Row>, BenchError> {
    if args.multicore_only {
        return metaroce_bench::multicore::rows(args.messages, args.repeats);
    }
    if args.paths_only {
        return paths_rows(args);
    }
    let mut pair = if args.connections == 1 {
        Pair::connected()?
    } else {
        Pair::with_connections(args.connections, SCALE_SENDERS.min(args.connections))?
    };
    pair.set_crc_offload(args.crc_offload);
    // Warm caches, branch predictors and the RTT estimators.
    pair.run_writes((args.messages / 10).max(1), None)?;
    let t = time_runs(&mut pair, args)?;
    let n = args.repeats;
    let crc = if args.crc_offload {
        "CRC left to a device"
    } else {
        "software CRC-32"
    };
    let mut rows = cycle_rows(&t, n, crc);
    if args.cycle_only {
        return Ok(rows);
    }

    let mut phases = PhaseTimes::default();
    let phase_counts = pair.run_writes(args.messages, Some(&mut phases))?;

    // Reference costs and the derived rows use on-CPU time where the OS
    // gives it (wall time otherwise): it is what the work itself costs.
    let clock = if measure::best(&t.cycle).cpu_ns.is_some() {
        "on-CPU"
    } else {
        "wall"
    };
    let cycle = measure::best(&t.cycle).ns();
    let crc_data = measure::best(&t.crc_data).ns();
    let crc_reply = measure::best(&t.crc_reply).ns();
    let memcpy = measure::best(&t.memcpy).ns();
    // Each data packet: CRC by the sender, check by the receiver; the same
    // for each reply.
    let crc_cycle = 2.0 * crc_data + 2.0 * t.replies_per_packet * crc_reply;
    let without_crc = cycle - crc_cycle;
    let offloaded = measure::best(&t.offloaded).ns();

    rows.extend([
        Row::new(
            "crc32_data_packet_ns",
            crc_data,
            "ns",
            format!(
                "CRC-32 over one data packet, {} B ({clock})",
                t.data_len - CRC_LEN
            ),
        ),
        Row::new(
            "crc32_reply_ns",
            crc_reply,
            "ns",
            format!(
                "CRC-32 over one ACK, {} B ({clock})",
                t.reply_len.max(CRC_LEN) - CRC_LEN
            ),
        ),
        Row::new(
            "crc32_per_cycle_ns",
            crc_cycle,
            "ns",
            "CRC-32 per cycle: 2 x data packet (send, check) + 2 x ACK",
        ),
        Row::new(
            "engine_without_crc_ns_per_packet",
            without_crc,
            "ns",
            format!("engine without CRC (derived: {clock} cycle - CRC per cycle)"),
        ),
        Row::new(
            "engine_without_crc_mpps",
            1000.0 / without_crc.max(1e-3),
            "Mpps",
            "  packet rate without CRC (derived)",
        ),
        Row::new(
            "engine_crc_offloaded_ns_per_packet",
            offloaded,
            "ns",
            format!(
                "  the same measured: the cycle with the CRC left to a device (seal_transmit, CrcVerdict::Good; {clock}, best of {n})"
            ),
        ),
        Row::new(
            "memcpy_4k_ns",
            memcpy,
            "ns",
            format!("memcpy of 4 KiB, cache-line aligned, in cache ({clock})"),
        ),
        Row::new(
            "ratio_cycle_to_memcpy",
            cycle / memcpy,
            "ratio",
            "engine + CRC / memcpy (goal <= 1)",
        ),
        Row::new(
            "ratio_engine_without_crc_to_memcpy",
            without_crc / memcpy,
            "ratio",
            "engine without CRC / memcpy (goal <= 1)",
        ),
        Row::new(
            "replies_per_data_packet",
            t.replies_per_packet,
            "per packet",
            "ACKs (and other replies) per data packet",
        ),
    ]);
    let phase_ns = |d: Duration| d.as_nanos() as f64 / phase_counts.data_packets.max(1) as f64;
    let phase_rows = [
        ("phase_post_ns", phases.post, "post_send"),
        (
            "phase_sender_tx_ns",
            phases.sender_tx,
            "sender poll_transmit + CRC",
        ),
        (
            "phase_receiver_ns",
            phases.receiver,
            "receiver handle_packet (CRC check) + ACK out (+ CRC)",
        ),
        (
            "phase_sender_rx_ns",
            phases.sender_rx,
            "sender handle_packet(ACK) (CRC check) + completions",
        ),
        (
            "phase_timers_ns",
            phases.timers,
            "poll_timeout x2 + handle_timeout",
        ),
    ];
    for (metric, d, label) in phase_rows {
        rows.push(Row::new(
            metric,
            phase_ns(d),
            "ns",
            format!("  per packet, wall, clocked run: {label}"),
        ));
    }
    rows.push(Row::new(
        "crc_simd",
        if cfg!(feature = "simd-crc") { 1.0 } else { 0.0 },
        "count",
        "CRC-32 uses run-time SIMD detection (feature simd-crc)",
    ));
    rows.extend(metaroce_bench::dispatch::rows(n));
    rows.extend(metaroce_bench::aead::rows(n));
    rows.extend(metaroce_bench::multicore::rows(args.messages, n)?);
    rows.extend(measure::memory_rows());
    rows.extend(paths_rows(args)?);
    if args.scale {
        rows.extend(scale_rows(args, cycle, crc_cycle)?);
    }
    Ok(rows)
}

/// Logical paths per connection of the path rows.
const PATH_COUNTS: [u16; 5] = [1, 2, 4, 8, 16];

/// The engine's cost per data packet (CRC left to a device) with 1, 2, 4,
/// 8 and 16 paths per connection, and 16 over 1. The counts take turns
/// run by run, so a load that comes and goes on a shared machine falls on
/// all of them alike.
fn paths_rows(args: &Args) -> Result<Vec<Row>, BenchError> {
    let mut pairs = Vec::new();
    for paths in PATH_COUNTS {
        let mut pair = Pair::connected_paths(paths)?;
        pair.set_crc_offload(true);
        pair.run_writes((args.messages / 10).max(1), None)?;
        pairs.push(pair);
    }
    let mut samples = vec![Vec::new(); PATH_COUNTS.len()];
    for _ in 0..args.repeats {
        for (pair, s) in pairs.iter_mut().zip(samples.iter_mut()) {
            let watch = Stopwatch::start();
            let counts = pair.run_writes(args.messages, None)?;
            s.push(watch.per_iteration(counts.data_packets));
        }
    }
    let ns: Vec<f64> = samples.iter().map(|s| measure::best(s).ns()).collect();
    let mut rows: Vec<Row> = PATH_COUNTS
        .iter()
        .zip(&ns)
        .map(|(paths, &ns)| {
            Row::new(
                format!("engine_without_crc_ns_per_packet_paths_{paths}"),
                ns,
                "ns",
                format!(
                    "TX -> RX -> ACK per 4 KiB data packet, CRC left to a device, \
                     {paths} paths per connection (best of {})",
                    args.repeats
                ),
            )
        })
        .collect();
    rows.push(Row::new(
        "paths_ratio_16_to_1",
        ns[ns.len() - 1] / ns[0].max(1e-3),
        "ratio",
        "engine cost per packet at 16 paths / at 1 (goal <= 1.15)",
    ));
    Ok(rows)
}

/// Connections sending in the scale runs (all of them when fewer).
const SCALE_SENDERS: u32 = 64;

/// The cost per data packet with 1, 1,024 and 65,536 connections
/// established (64 sending, the rest idle), and what establishing them
/// cost. `one` is the 1-connection figure already measured.
fn scale_rows(args: &Args, one: f64, crc_cycle: f64) -> Result<Vec<Row>, BenchError> {
    let mut rows = vec![Row::new(
        "scale_ns_per_packet_conns_1",
        one,
        "ns",
        "TX -> RX -> ACK per 4 KiB data packet, 1 connection (best, on-CPU)",
    )];
    let mut at_max = one;
    // The engine alone, measured with the CRC left to a device (not
    // derived by subtracting the CRC's own timing, a number ten times
    // the difference sought).
    let mut offloaded = Vec::new();
    let mut one_pair = Pair::with_connections(1, 1)?;
    offloaded.push((1, offloaded_ns(&mut one_pair, args)?));
    for total in [1_024u32, 65_536] {
        let watch = Stopwatch::start();
        let mut pair = Pair::with_connections(total, SCALE_SENDERS.min(total))?;
        let establish = watch.per_iteration(u64::from(total)).ns();
        let ns = best_ns(&mut pair, args)?;
        offloaded.push((total, offloaded_ns(&mut pair, args)?));
        at_max = ns;
        rows.push(Row::new(
            format!("scale_ns_per_packet_conns_{total}"),
            ns,
            "ns",
            format!(
                "  the same with {total} connections established, {} sending",
                SCALE_SENDERS.min(total)
            ),
        ));
        if total == 65_536 {
            rows.push(Row::new(
                "establish_ns_per_connection",
                establish,
                "ns",
                "opening 65,536 connections: both ends' handshake work per connection",
            ));
        }
    }
    rows.push(Row::new(
        "scale_ratio_65536_to_1",
        at_max / one,
        "ratio",
        "cost per packet at 65,536 connections / at 1 (goal <= 1.2)",
    ));
    rows.push(Row::new(
        "scale_engine_derived_ratio_65536_to_1",
        (at_max - crc_cycle) / (one - crc_cycle).max(1e-3),
        "ratio",
        "  the same less the separately timed CRC-32 (derived; noisy)",
    ));
    for &(total, ns) in &offloaded {
        rows.push(Row::new(
            format!("scale_offloaded_ns_per_packet_conns_{total}"),
            ns,
            "ns",
            format!("  the engine alone (CRC left to a device), {total} connections"),
        ));
    }
    let (first, last) = (offloaded[0].1, offloaded[offloaded.len() - 1].1);
    rows.push(Row::new(
        "scale_engine_ratio_65536_to_1",
        last / first.max(1e-3),
        "ratio",
        "  the engine alone at 65,536 connections / at 1 (goal <= 1.2)",
    ));
    Ok(rows)
}

/// The best per-packet cost of `pair` over `args.repeats` timed runs,
/// after a warm-up run a tenth as long.
fn best_ns(pair: &mut Pair, args: &Args) -> Result<f64, BenchError> {
    pair.run_writes((args.messages / 10).max(1), None)?;
    let mut samples = Vec::new();
    for _ in 0..args.repeats {
        let watch = Stopwatch::start();
        let counts = pair.run_writes(args.messages, None)?;
        samples.push(watch.per_iteration(counts.data_packets));
    }
    Ok(measure::best(&samples).ns())
}

/// [`best_ns`] with the CRC left to a device.
fn offloaded_ns(pair: &mut Pair, args: &Args) -> Result<f64, BenchError> {
    pair.set_crc_offload(true);
    let ns = best_ns(pair, args);
    pair.set_crc_offload(false);
    ns
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(a) => a,
        Err(msg) => {
            if msg.is_empty() {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            eprintln!("metaroce-bench: {msg}\n\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "metaroce-bench: {} x 4 KiB WRITE per run, {} runs, 16-path endpoints on heap storage, Config::default() with CcAlgorithm::Fixed at an unlimited link rate, payload never copied",
        args.messages, args.repeats
    );
    let rows = match run(&args) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("metaroce-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", measure::table(&rows));
    if args.cycle_only || args.multicore_only || args.paths_only {
        return ExitCode::SUCCESS;
    }
    if let Some(dir) = args.csv.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("metaroce-bench: cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = std::fs::write(&args.csv, measure::csv(&rows)) {
        eprintln!("metaroce-bench: cannot write {}: {e}", args.csv.display());
        return ExitCode::FAILURE;
    }
    println!("CSV: {}", args.csv.display());
    ExitCode::SUCCESS
}
