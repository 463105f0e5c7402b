//! `cargo xtask sim long-haul [options]`: parses the experiment's options,
//! runs it, prints its tables and writes its CSV and plots. Kept apart
//! from the binary's own option parser so the experiment registers there
//! with one line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::shared::{self, SharedBottleneck};
use super::{report, LongHaul};
use crate::plot::{self, Chart, Scale, Series};

pub const USAGE: &str = "\
Usage: metaroce-sim long-haul [options]

One connection from a host of site A to a host of site B (two leaf-spines
joined by long-haul links between border switches), MetaRoCE and RoCEv2
side by side, at each round trip and long-haul loss; then one long-haul
flow and N data-centre flows sharing the receiver's link.

Options:
  --rtts LIST         round trips in ms (default 0.01,1,5,10,20)
  --losses LIST       loss % on each long-haul link (default 0,0.1)
  --rate-gbps N       every link's rate (default 25)
  --long-haul-links N parallel long-haul links (default 2)
  --bdps X            transfer size in bandwidth-delay products (default 8;
                      at least 64 MiB)
  --window-bdps X     window posted and offered, in BDPs (default 3)
  --seed N            the seed (default 1)
  --share-rtt-ms X    shared scenario: long-haul round trip (default 10)
  --intra-flows N     shared scenario: data-centre flows (default 3)
  --share-rtts N      shared scenario: length in round trips (default 30)
  --no-share          skip the shared scenario
  --only-share        run only the shared scenario
  --out DIR           where CSV and plots go (default target/metaroce)
";

struct Options {
    sweep: LongHaul,
    share: SharedBottleneck,
    run_sweep: bool,
    run_share: bool,
    out: PathBuf,
}

fn list(v: &str, what: &str, scale: f64) -> Result<Vec<f64>, String> {
    v.split(',')
        .map(|s| s.trim().parse::<f64>().map(|x| x * scale))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: {e}"))
}

fn parse(args: &[String]) -> Result<Option<Options>, String> {
    let mut o = Options {
        sweep: LongHaul::default(),
        share: SharedBottleneck::default(),
        run_sweep: true,
        run_share: true,
        out: PathBuf::from("target/metaroce"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        let num = |v: &String| v.parse::<f64>().map_err(|e| format!("{a}: {e}"));
        match a.as_str() {
            "-h" | "--help" | "help" => return Ok(None),
            "--rtts" => {
                let ms = list(value()?, a, 1.0)?;
                if ms.iter().any(|&m| !(m > 0.0 && m < 10_000.0)) {
                    return Err("--rtts: milliseconds above 0 and below 10 s".into());
                }
                o.sweep.rtts = ms
                    .iter()
                    .map(|&m| Duration::from_secs_f64(m / 1e3))
                    .collect();
            }
            "--losses" => {
                o.sweep.losses = list(value()?, a, 0.01)?;
                if o.sweep.losses.iter().any(|l| !(0.0..=1.0).contains(l)) {
                    return Err("--losses: percentages from 0 to 100".into());
                }
            }
            "--rate-gbps" => {
                let bps = (num(value()?)? * 1e9) as u64;
                if bps == 0 {
                    return Err("--rate-gbps: above 0".into());
                }
                for fabric in [&mut o.sweep.fabric, &mut o.share.fabric] {
                    fabric.site.host_link.rate_bps = bps;
                    fabric.site.fabric_link.rate_bps = bps;
                    fabric.border_link.rate_bps = bps;
                    fabric.long_haul.rate_bps = bps;
                }
            }
            "--long-haul-links" => {
                let n: usize = value()?.parse().map_err(|e| format!("{a}: {e}"))?;
                o.sweep.fabric.long_haul_links = n.max(1);
                o.share.fabric.long_haul_links = n.max(1);
            }
            "--bdps" => o.sweep.transfer_bdps = num(value()?)?.max(0.0),
            "--window-bdps" => {
                let w = num(value()?)?.max(0.0);
                o.sweep.tuning.window_bdps = w;
                o.share.tuning.window_bdps = w;
            }
            "--seed" => {
                let s: u64 = value()?.parse().map_err(|e| format!("{a}: {e}"))?;
                o.sweep.seed = s;
                o.share.seed = s;
            }
            "--share-rtt-ms" => {
                o.share.rtt = Duration::from_secs_f64(num(value()?)?.max(0.0) / 1e3);
            }
            "--intra-flows" => {
                o.share.intra_flows = value()?.parse().map_err(|e| format!("{a}: {e}"))?;
            }
            "--share-rtts" => {
                o.share.duration_rtts = value()?.parse().map_err(|e| format!("{a}: {e}"))?;
            }
            "--no-share" => o.run_share = false,
            "--only-share" => o.run_sweep = false,
            "--out" => o.out = PathBuf::from(value()?),
            other => return Err(format!("unknown option `{other}`\n\n{USAGE}")),
        }
    }
    if o.sweep.rtts.is_empty() || o.sweep.losses.is_empty() {
        return Err("--rtts and --losses must not be empty".into());
    }
    Ok(Some(o))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn svg(dir: &Path, name: &str, chart: &Chart<'_>, series: &[Series]) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(name);
    plot::line_chart(&path, chart, series)?;
    Ok(path)
}

/// Runs the experiment with `args`; `progress` after each run. Returns
/// the simulator events processed.
pub fn main(args: &[String], mut progress: impl FnMut(usize, usize)) -> Result<u64, String> {
    let Some(o) = parse(args)? else {
        print!("{USAGE}");
        return Ok(0);
    };
    let mut events = 0;
    if o.run_sweep {
        events += sweep(&o, &mut progress)?;
    }
    if o.run_share {
        events += share(&o, &mut progress)?;
    }
    Ok(events)
}

fn sweep(o: &Options, progress: &mut impl FnMut(usize, usize)) -> Result<u64, String> {
    let c = &o.sweep;
    let f = &c.fabric;
    let rows = super::long_haul(c, progress);
    println!(
        "long-haul: one connection site A -> site B; {} long-haul link(s), every link {} Gbit/s; \
         transfer {} BDPs (at least {} MiB), stopped at {}x its line-rate time + {} round trips; seed {}",
        f.long_haul_links,
        f.site.host_link.rate_bps as f64 / 1e9,
        c.transfer_bdps,
        c.min_bytes >> 20,
        c.limit_factor,
        c.limit_rtts,
        c.seed
    );
    println!(
        "windows: {} BDPs (at least {} MiB) posted in {} WRITEs; RoCEv2 sends all of it, \
         MetaRoCE is offered as many packets (at most {} PSNs)",
        c.tuning.window_bdps,
        c.tuning.min_window_bytes >> 20,
        c.tuning.messages_in_flight,
        metaroce_core::config::MAX_WINDOW
    );
    println!(
        "Gbit/s: goodput over the second half of the run (steady); xfer: completed bytes over the whole run"
    );
    print!("{}", report::table(&rows));
    print!("{}", report::goals(&rows));
    let csv = write(&o.out, "long-haul.csv", &report::csv(&rows))?;
    let series_csv = write(
        &o.out,
        "long-haul-timeseries.csv",
        &report::timeseries_csv(&rows),
    )?;
    let chart = Chart {
        title: "long-haul: goodput of one connection against round trip",
        x_label: "round trip (ms)",
        y_label: "goodput (Gbit/s)",
        x_scale: Scale::Log,
        y_scale: Scale::Log,
    };
    let plot = svg(
        &o.out,
        "long-haul.svg",
        &chart,
        &report::goodput_series(&rows),
    )?;
    println!(
        "CSV: {}, {}\nplot: {}",
        csv.display(),
        series_csv.display(),
        plot.display()
    );
    // Goodput over time at the goal's round trip (or the longest run).
    let ten = Duration::from_millis(10);
    let ramp_rtt = if c.rtts.contains(&ten) {
        Some(ten)
    } else {
        c.rtts.iter().copied().max()
    };
    if let Some(rtt) = ramp_rtt {
        let title = format!(
            "long-haul: goodput over time at {} ms (one round trip average)",
            rtt.as_secs_f64() * 1e3
        );
        let chart = Chart {
            title: &title,
            x_label: "time since the flow started (ms)",
            y_label: "goodput (Gbit/s)",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
        };
        let path = svg(
            &o.out,
            "long-haul-ramp.svg",
            &chart,
            &report::ramp_series(&rows, rtt),
        )?;
        println!("plot: {}", path.display());
    }
    Ok(rows.iter().map(|r| r.events).sum())
}

fn share(o: &Options, progress: &mut impl FnMut(usize, usize)) -> Result<u64, String> {
    let c = &o.share;
    let rows = shared::shared_bottleneck(c, progress);
    let rtt = rows.first().map_or(c.rtt, |r| r.rtt);
    println!(
        "\nlong-haul shared bottleneck: 1 flow site A -> site B host 0 ({:.3} ms) and {} data-centre flow(s) \
         to the same host, {} round trips ({} ms); shares over the second half",
        rtt.as_secs_f64() * 1e3,
        c.intra_flows,
        c.duration_rtts,
        (rtt * c.duration_rtts).as_millis()
    );
    print!("{}", report::share_table(&rows));
    let csv = write(&o.out, "long-haul-share.csv", &report::share_csv(&rows))?;
    let chart = Chart {
        title: "long-haul shared bottleneck: goodput over time (one round trip average)",
        x_label: "time (ms)",
        y_label: "goodput (Gbit/s)",
        x_scale: Scale::Linear,
        y_scale: Scale::Linear,
    };
    let plot = svg(
        &o.out,
        "long-haul-share.svg",
        &chart,
        &report::share_series(&rows, rtt),
    )?;
    println!("CSV: {}\nplot: {}", csv.display(), plot.display());
    Ok(rows.iter().map(|r| r.events).sum())
}
