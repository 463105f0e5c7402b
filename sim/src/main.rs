//! `metaroce-sim`: runs the simulator's experiments and prints their
//! tables; `cargo xtask sim <experiment>` builds it in release and runs it.
//! It is a thin front end: the experiments live in
//! `metaroce_sim::experiments`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use metaroce_sim::experiments::{
    self, Incast, LossSweep, LossSweepRow, PathFailure, Pattern, Protocol, Spray, Traffic,
};
use metaroce_sim::plot::{self, Chart, Scale, Series};
use metaroce_sim::workload::FlowStatus;
use metaroce_sim::LeafSpine;

const USAGE: &str = "\
Usage: metaroce-sim <experiment> [options]

Experiments (each runs MetaRoCE and RoCEv2 on the same fabric and flows):
  loss-sweep    one transfer between two hosts back to back, random loss per
                link direction; goodput per loss rate
  incast        N senders to host 0 of a leaf-spine at once; completion
                times against the ideal, retransmissions, drops, fairness
  path-failure  leaf 0's hosts send to leaf 1's; the leaf 0 - spine 0 link
                fails mid-transfer; every byte must still arrive
  permutation   every host sends to one other (seeded derangement) at 0, 1
                and 10 % path loss; FCT p50/p99, link utilisation
  all-to-all    every host sends to every other, same table
  spray         one loss-free transfer over 16 spines whose delays differ
                by up to 2 us; spurious retransmissions
  long-haul     one connection between two sites at round trips of 0.01 to
                20 ms, 0 and 0.1 % loss; goodput against the line rate;
                its own options: long-haul --help

Options:
  --bytes N        bytes per flow (defaults: 16 MiB; incast 1 MiB;
                   permutation 4 MiB; all-to-all 64 KiB)
  --losses LIST    loss percentages (loss-sweep: per link, default
                   0,0.1,0.5,1,2,5,10; permutation, all-to-all: per
                   cross-leaf path, default 0,1,10)
  --seeds N        loss-sweep: runs per point, averaged (default 3)
  --seed N         all but loss-sweep: the seed (default 1)
  --hosts N        leaf-spine size, 8 hosts per leaf (default 64)
  --senders N      incast: senders (default hosts - 1)
  --fail-at-us T   path-failure: when the link fails (default 200)
  --no-reroute     path-failure: switches never route around the failure
  --skew-us T      spray: delay skew between the paths (default 2)
  --pfc            leaf-spine experiments: switches run PFC (lossless
                   fabric: RoCEv2 as usually deployed)
  --out DIR        where CSV files go (default target/metaroce)
";

struct Options {
    sweep: LossSweep,
    incast: Incast,
    failure: PathFailure,
    permutation: Traffic,
    all_to_all: Traffic,
    spray: Spray,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        sweep: LossSweep::default(),
        incast: Incast::default(),
        failure: PathFailure::default(),
        permutation: Traffic::new(Pattern::Permutation),
        all_to_all: Traffic::new(Pattern::AllToAll),
        spray: Spray::default(),
        out: PathBuf::from("target/metaroce"),
    };
    let mut senders = None;
    let mut pfc = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--bytes" => {
                let b: u64 = value()?.parse().map_err(|e| format!("--bytes: {e}"))?;
                o.sweep.bytes = b;
                o.incast.bytes = b;
                o.failure.bytes = b;
                o.permutation.bytes = b;
                o.all_to_all.bytes = b;
                o.spray.bytes = b;
            }
            "--seeds" => {
                o.sweep.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?;
            }
            "--seed" => {
                let s: u64 = value()?.parse().map_err(|e| format!("--seed: {e}"))?;
                o.incast.seed = s;
                o.failure.seed = s;
                o.permutation.seed = s;
                o.all_to_all.seed = s;
                o.spray.seed = s;
            }
            "--hosts" => {
                let n: usize = value()?.parse().map_err(|e| format!("--hosts: {e}"))?;
                if n < 16 {
                    return Err("--hosts: at least 16 (two leaves of 8)".into());
                }
                let spec = LeafSpine::with_hosts(n, 8);
                o.incast.fabric = spec;
                o.failure.fabric = spec;
                o.permutation.fabric = spec;
                o.all_to_all.fabric = spec;
            }
            "--senders" => {
                senders = Some(value()?.parse().map_err(|e| format!("--senders: {e}"))?);
            }
            "--fail-at-us" => {
                let t: u64 = value()?.parse().map_err(|e| format!("--fail-at-us: {e}"))?;
                o.failure.fail_at = Duration::from_micros(t);
            }
            "--no-reroute" => o.failure.reroute_delay = None,
            "--pfc" => pfc = true,
            "--skew-us" => {
                let t: u64 = value()?.parse().map_err(|e| format!("--skew-us: {e}"))?;
                o.spray.skew = Duration::from_micros(t);
            }
            "--losses" => {
                let losses: Vec<f64> = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<f64>().map(|p| p / 100.0))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--losses: {e}"))?;
                o.sweep.losses = losses.clone();
                o.permutation.losses = losses.clone();
                o.all_to_all.losses = losses;
            }
            "--out" => o.out = PathBuf::from(value()?),
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    o.incast.senders = senders.unwrap_or(o.incast.fabric.hosts() - 1);
    if pfc {
        for fabric in [
            &mut o.incast.fabric,
            &mut o.failure.fabric,
            &mut o.permutation.fabric,
            &mut o.all_to_all.fabric,
        ] {
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
    }
    if o.sweep.bytes == 0 || o.sweep.seeds == 0 || o.sweep.losses.is_empty() {
        return Err("--bytes, --seeds and --losses must not be empty or zero".into());
    }
    if o.sweep.losses.iter().any(|l| !(0.0..=1.0).contains(l)) {
        return Err("--losses: percentages from 0 to 100".into());
    }
    Ok(o)
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
        "simulator: {events} events in {secs:.2} s wall = {:.2} M events/s{cpu_text} (setup and integrity hashing included)",
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
        "\nacross seeds (Gbit/s): median, and total bytes over total time (a stalled run weighs by its time)"
    );
    println!(
        "{:>7} | {:>8} {:>8} {:>9} | {:>8} {:>8} {:>9}",
        "loss %", "MR med", "RoCE med", "ratio", "MR tot", "RoCE tot", "ratio"
    );
    for &loss in &o.sweep.losses {
        let med = |p| experiments::median_goodput(&rows, p, loss);
        let tot =
            |p| experiments::aggregate_goodput(&rows, p, loss, o.sweep.bytes, o.sweep.time_limit);
        let (mm, rm) = (med(Protocol::MetaRoce), med(Protocol::Roce));
        let (mt, rt) = (tot(Protocol::MetaRoce), tot(Protocol::Roce));
        println!(
            "{:>7} | {:>8.2} {:>8.2} {:>8.2}x | {:>8.2} {:>8.2} {:>8.2}x",
            loss * 100.0,
            mm,
            rm,
            mm / rm,
            mt,
            rt,
            mt / rt
        );
    }
    println!(
        "goals (issue 5): MetaRoCE at 1 % >= 97 % of loss-free, at 10 % >= 85 %; MetaRoCE/RoCEv2 at 1 % >= 10x"
    );
    let series: Vec<Series> = Protocol::ALL
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
        "protocol,senders,bytes,intact,first_us,median_us,last_us,ideal_us,last_over_ideal,retransmissions,timeouts,queue_drops,marked,pauses,fairness,events\n",
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
        "{:<9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9} {:>6} {:>5} {:>6} {:>8} {:>5}",
        "protocol",
        "intact",
        "first us",
        "median us",
        "last us",
        "ideal us",
        "last/idl",
        "retx",
        "RTOs",
        "drops",
        "marked",
        "Jain"
    );
    for r in &rows {
        let ratio = r
            .last
            .map_or(f64::NAN, |l| l.as_secs_f64() / r.ideal.as_secs_f64());
        println!(
            "{:<9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9.3} {:>6} {:>5} {:>6} {:>8} {:>5.3}",
            r.protocol.name(),
            format!("{}/{}", r.intact, c.senders),
            us(r.first),
            us(r.median),
            us(r.last),
            us(Some(r.ideal)),
            ratio,
            r.retransmissions,
            r.timeouts,
            r.queue_drops,
            r.marked,
            r.fairness
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.4},{},{},{},{},{},{:.4},{}\n",
            r.protocol.name(),
            c.senders,
            c.bytes,
            r.intact,
            us(r.first),
            us(r.median),
            us(r.last),
            us(Some(r.ideal)),
            ratio,
            r.retransmissions,
            r.timeouts,
            r.queue_drops,
            r.marked,
            r.pauses,
            r.fairness,
            r.events
        ));
    }
    println!("goal (issue 5): last completion <= 1.02x ideal with fewer than 300 retransmissions");
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
    println!("goal (issue 5): bytes lost must be 0 (every flow intact); extra us = time the failure cost");
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
        "{:<9} {:>6} {:>9} {:>10} {:>10} {:>10} {:>9} {:>8} {:>7} {:>5} {:>6}",
        "protocol",
        "loss %",
        "intact",
        "p50 us",
        "p99 us",
        "max us",
        "util avg",
        "util max",
        "retx",
        "RTOs",
        "drops"
    );
    let mut csv = String::from(
        "protocol,loss_pct,flows,intact,p50_us,p99_us,max_us,util_mean,util_max,retransmissions,timeouts,queue_drops,pauses,events\n",
    );
    for r in &rows {
        println!(
            "{:<9} {:>6} {:>9} {:>10} {:>10} {:>10} {:>8.1}% {:>7.1}% {:>7} {:>5} {:>6}",
            r.protocol.name(),
            r.loss * 100.0,
            format!("{}/{}", r.intact, r.flows),
            us(r.p50),
            us(r.p99),
            us(r.max),
            r.utilisation.0 * 100.0,
            r.utilisation.1 * 100.0,
            r.retransmissions,
            r.timeouts,
            r.queue_drops
        );
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{:.4},{:.4},{},{},{},{},{}\n",
            r.protocol.name(),
            r.loss * 100.0,
            r.flows,
            r.intact,
            us(r.p50),
            us(r.p99),
            us(r.max),
            r.utilisation.0,
            r.utilisation.1,
            r.retransmissions,
            r.timeouts,
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
    println!("goal (issue 5): spurious retransmissions < 0.1 % (RoCEv2 keeps one path: nothing to reorder; go-back-N cannot tell spurious ones)");
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

fn long_haul(args: &[String]) -> Result<(), String> {
    let wall = std::time::Instant::now();
    let cpu = cpu_seconds();
    let events = metaroce_sim::long_haul::cli::main(args, progress_bar)?;
    if events > 0 {
        speed(events, wall, cpu);
    }
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
        "incast" => parse(rest).and_then(|o| incast(&o)),
        "path-failure" => parse(rest).and_then(|o| path_failure(&o)),
        "permutation" => parse(rest).and_then(|o| traffic(&o, &o.permutation, "permutation")),
        "all-to-all" => parse(rest).and_then(|o| traffic(&o, &o.all_to_all, "all-to-all")),
        "spray" => parse(rest).and_then(|o| spray(&o)),
        "long-haul" => long_haul(rest),
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
