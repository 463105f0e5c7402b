//! `metaroce-sim`: runs the simulator's experiments and prints their
//! tables; `cargo xtask sim <experiment>` builds it in release and runs it.
//! It is a thin front end: the experiments live in
//! `metaroce_sim::experiments`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use metaroce_sim::experiments::{self, LossSweep, LossSweepRow, Protocol};
use metaroce_sim::workload::FlowStatus;

const USAGE: &str = "\
Usage: metaroce-sim <experiment> [options]

Experiments:
  loss-sweep   one transfer between two hosts back to back, random loss per
               link direction; goodput of MetaRoCE and RoCEv2 per loss rate

Options:
  --bytes N        transfer size in bytes (default 16777216)
  --losses LIST    comma-separated loss percentages (default 0,0.1,0.5,1,2,5,10)
  --seeds N        runs per point, averaged (default 3)
  --out DIR        where CSV files go (default target/metaroce)
";

struct Options {
    sweep: LossSweep,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        sweep: LossSweep::default(),
        out: PathBuf::from("target/metaroce"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--bytes" => {
                o.sweep.bytes = value()?.parse().map_err(|e| format!("--bytes: {e}"))?;
            }
            "--seeds" => {
                o.sweep.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?;
            }
            "--losses" => {
                o.sweep.losses = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<f64>().map(|p| p / 100.0))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--losses: {e}"))?;
            }
            "--out" => o.out = PathBuf::from(value()?),
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    if o.sweep.bytes == 0 || o.sweep.seeds == 0 || o.sweep.losses.is_empty() {
        return Err("--bytes, --seeds and --losses must not be empty or zero".into());
    }
    Ok(o)
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
    let rows = experiments::loss_sweep(&o.sweep, progress_bar);
    let secs = wall.elapsed().as_secs_f64();
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
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let path = o.out.join("loss-sweep.csv");
    std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;

    println!(
        "loss-sweep: one {} byte transfer, two hosts back to back (100 Gbit/s, 1 us), {} seed(s) per point",
        o.sweep.bytes, o.sweep.seeds
    );
    println!(
        "{:>7} | {:>10} {:>7} {:>6} | {:>10} {:>7} {:>6} | {:>9}",
        "loss %", "MetaRoCE", "% free", "retx", "RoCEv2", "% free", "retx", "MR/RoCE"
    );
    let free = |p| experiments::mean_goodput(&rows, p, o.sweep.losses[0]);
    for &loss in &o.sweep.losses {
        let mut cells = Vec::new();
        for p in Protocol::ALL {
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
            let mark = if bad > 0 {
                format!(" ({bad} failed)")
            } else {
                String::new()
            };
            cells.push((format!("{g:>6.2} Gb/s"), format!("{pct:>6.1}%"), retx, mark));
        }
        let ratio = experiments::mean_goodput(&rows, Protocol::MetaRoce, loss)
            / experiments::mean_goodput(&rows, Protocol::Roce, loss);
        println!(
            "{:>7} | {} {} {:>6} | {} {} {:>6} | {:>8.2}x{}{}",
            loss * 100.0,
            cells[0].0,
            cells[0].1,
            cells[0].2,
            cells[1].0,
            cells[1].1,
            cells[1].2,
            ratio,
            cells[0].3,
            cells[1].3
        );
    }
    println!(
        "goals (issue 5): MetaRoCE at 1 % >= 97 % of loss-free, at 10 % >= 85 %; MetaRoCE/RoCEv2 at 1 % >= 10x"
    );
    println!(
        "simulator: {events} events in {:.2} s wall = {:.2} M events/s",
        secs,
        events as f64 / secs.max(1e-9) / 1e6
    );
    println!("CSV: {}", path.display());
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::FAILURE;
    };
    let result = match cmd.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        "loss-sweep" => parse(rest).and_then(|o| loss_sweep(&o)),
        other => Err(format!("unknown experiment `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metaroce-sim: {e}");
            ExitCode::FAILURE
        }
    }
}
