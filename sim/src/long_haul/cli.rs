//! `cargo xtask sim long-haul [options]`: the experiment's options (a
//! clap [`Args`] the binary's `long-haul` subcommand flattens, so it has
//! `--help` and shows its defaults like every other experiment), then it
//! runs, prints its tables and writes its CSV and plots.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::shared::{self, SharedBottleneck};
use super::{report, LongHaul};
use crate::plot::{self, Chart, Scale, Series};
use crate::two_site::TwoSite;

/// One connection from a host of site A to a host of site B (two
/// leaf-spines joined by long-haul links between border switches),
/// MetaRoCE and RoCEv2 side by side, at each round trip and long-haul
/// loss; then one long-haul flow and N data-centre flows sharing the
/// receiver's link.
///
/// Every default is the experiment's own ([`LongHaul::default`],
/// [`SharedBottleneck::default`]): parsing no options gives them back
/// exactly (a test checks it).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct LongHaulArgs {
    /// Round trips in ms.
    #[arg(long, value_name = "LIST", action = clap::ArgAction::Set, value_delimiter = ',', default_values_t = default_rtts_ms())]
    pub rtts: Vec<f64>,
    /// Loss % on each long-haul link.
    #[arg(long, value_name = "LIST", action = clap::ArgAction::Set, value_delimiter = ',', default_values_t = default_losses_percent())]
    pub losses: Vec<f64>,
    /// Every link's rate, Gbit/s.
    #[arg(long, value_name = "N", default_value_t = TwoSite::default().long_haul.rate_bps as f64 / 1e9)]
    pub rate_gbps: f64,
    /// Parallel long-haul links.
    #[arg(long, value_name = "N", default_value_t = TwoSite::default().long_haul_links)]
    pub long_haul_links: usize,
    /// Transfer size in bandwidth-delay products (at least 64 MiB).
    #[arg(long, value_name = "X", default_value_t = LongHaul::default().transfer_bdps)]
    pub bdps: f64,
    /// Window posted and offered, in BDPs.
    #[arg(long, value_name = "X", default_value_t = LongHaul::default().tuning.window_bdps)]
    pub window_bdps: f64,
    /// The seed.
    #[arg(long, value_name = "N", default_value_t = LongHaul::default().seed)]
    pub seed: u64,
    /// Shared scenario: long-haul round trip, ms.
    #[arg(long, value_name = "X", default_value_t = SharedBottleneck::default().rtt.as_secs_f64() * 1e3)]
    pub share_rtt_ms: f64,
    /// Shared scenario: data-centre flows.
    #[arg(long, value_name = "N", default_value_t = SharedBottleneck::default().intra_flows)]
    pub intra_flows: usize,
    /// Shared scenario: length in round trips.
    #[arg(long, value_name = "N", default_value_t = SharedBottleneck::default().duration_rtts)]
    pub share_rtts: u32,
    /// Skip the shared scenario.
    #[arg(long)]
    pub no_share: bool,
    /// Run only the shared scenario.
    #[arg(long)]
    pub only_share: bool,
    /// Every MetaRoCE host holds one job key: packets protected, the
    /// first flight sent with the CONNECT (0-RTT, spec 4.2.4).
    #[arg(long)]
    pub job_key: bool,
    /// Where CSV and plots go.
    #[arg(long, value_name = "DIR", default_value = "target/metaroce")]
    pub out: PathBuf,
}

/// `LongHaul::default().rtts` in milliseconds, as `--help` shows them.
fn default_rtts_ms() -> Vec<f64> {
    LongHaul::default()
        .rtts
        .iter()
        .map(|d| d.as_secs_f64() * 1e3)
        .collect()
}

/// `LongHaul::default().losses` in percent.
fn default_losses_percent() -> Vec<f64> {
    LongHaul::default()
        .losses
        .iter()
        .map(|l| l * 100.0)
        .collect()
}

struct Options {
    sweep: LongHaul,
    share: SharedBottleneck,
    run_sweep: bool,
    run_share: bool,
    out: PathBuf,
}

impl LongHaulArgs {
    /// The experiment's settings; an error for values out of range.
    fn options(&self) -> Result<Options, String> {
        let mut o = Options {
            sweep: LongHaul::default(),
            share: SharedBottleneck::default(),
            run_sweep: !self.only_share,
            run_share: !self.no_share,
            out: self.out.clone(),
        };
        if self.rtts.iter().any(|&m| !(m > 0.0 && m < 10_000.0)) {
            return Err("--rtts: milliseconds above 0 and below 10 s".into());
        }
        o.sweep.rtts = self
            .rtts
            .iter()
            .map(|&m| Duration::from_secs_f64(m / 1e3))
            .collect();
        o.sweep.losses = self.losses.iter().map(|l| l * 0.01).collect();
        if o.sweep.losses.iter().any(|l| !(0.0..=1.0).contains(l)) {
            return Err("--losses: percentages from 0 to 100".into());
        }
        let bps = (self.rate_gbps * 1e9) as u64;
        if bps == 0 {
            return Err("--rate-gbps: above 0".into());
        }
        let links = self.long_haul_links.max(1);
        for fabric in [&mut o.sweep.fabric, &mut o.share.fabric] {
            fabric.site.host_link.rate_bps = bps;
            fabric.site.fabric_link.rate_bps = bps;
            fabric.border_link.rate_bps = bps;
            fabric.long_haul.rate_bps = bps;
            fabric.long_haul_links = links;
        }
        o.sweep.transfer_bdps = self.bdps.max(0.0);
        let window = self.window_bdps.max(0.0);
        o.sweep.tuning.window_bdps = window;
        o.share.tuning.window_bdps = window;
        o.sweep.tuning.job_key = self.job_key;
        o.share.tuning.job_key = self.job_key;
        o.sweep.seed = self.seed;
        o.share.seed = self.seed;
        o.share.rtt = Duration::from_secs_f64(self.share_rtt_ms.max(0.0) / 1e3);
        o.share.intra_flows = self.intra_flows;
        o.share.duration_rtts = self.share_rtts;
        if o.sweep.rtts.is_empty() || o.sweep.losses.is_empty() {
            return Err("--rtts and --losses must not be empty".into());
        }
        Ok(o)
    }
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
pub fn main(args: &LongHaulArgs, mut progress: impl FnMut(usize, usize)) -> Result<u64, String> {
    let o = args.options()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: LongHaulArgs,
    }

    fn options(args: &[&str]) -> Result<Options, String> {
        let cli = Cli::try_parse_from(std::iter::once("long-haul").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.args.options()
    }

    #[test]
    fn no_options_are_the_experiments_defaults() {
        let o = options(&[]).unwrap();
        assert_eq!(o.sweep, LongHaul::default());
        assert_eq!(o.share, SharedBottleneck::default());
        assert!(o.run_sweep && o.run_share);
        assert_eq!(o.out, PathBuf::from("target/metaroce"));
    }

    #[test]
    fn options_reach_both_scenarios() {
        let o = options(&[
            "--rtts",
            "0.5,2",
            "--losses",
            "1",
            "--rate-gbps",
            "10",
            "--long-haul-links",
            "0",
            "--bdps",
            "2",
            "--window-bdps",
            "1.5",
            "--seed",
            "9",
            "--share-rtt-ms",
            "4",
            "--intra-flows",
            "5",
            "--share-rtts",
            "7",
            "--no-share",
            "--out",
            "x",
        ])
        .unwrap();
        let s = &o.sweep;
        assert_eq!(
            s.rtts,
            [Duration::from_micros(500), Duration::from_millis(2)]
        );
        assert_eq!(s.losses, [0.01]);
        assert_eq!(
            (s.transfer_bdps, s.tuning.window_bdps, s.seed),
            (2.0, 1.5, 9)
        );
        let c = &o.share;
        assert_eq!(c.rtt, Duration::from_millis(4));
        assert_eq!(
            (c.intra_flows, c.duration_rtts, c.tuning.window_bdps, c.seed),
            (5, 7, 1.5, 9)
        );
        for f in [&s.fabric, &c.fabric] {
            assert_eq!(f.long_haul_links, 1, "at least one link");
            for link in [
                f.site.host_link,
                f.site.fabric_link,
                f.border_link,
                f.long_haul,
            ] {
                assert_eq!(link.rate_bps, 10_000_000_000);
            }
        }
        assert!(o.run_sweep && !o.run_share);
        assert_eq!(o.out, PathBuf::from("x"));
        assert!(!options(&["--only-share"]).unwrap().run_sweep);
    }

    #[test]
    fn out_of_range_values_are_refused() {
        for bad in [
            &["--rtts", "0"][..],
            &["--rtts", "10000"],
            &["--losses", "101"],
            &["--rate-gbps", "0"],
            &["--seed", "-1"],
            &["--rtts", "x"],
        ] {
            assert!(options(bad).is_err(), "{bad:?}");
        }
    }
}
