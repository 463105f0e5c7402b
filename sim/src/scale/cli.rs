//! `cargo xtask sim scale` and `cargo xtask sim replay`: their options,
//! progress on stderr, tables, CSV and plots.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{ClusterRow, ScalePattern, Shape};
use crate::link::LinkConfig;
use crate::plot::{self, Chart, Scale, Series};
use crate::topology::{FatTree, LeafSpine};
use crate::workload::{HostMemory, Progress};

/// `--topology`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopologyChoice {
    /// Two tiers: leaves and spines.
    LeafSpine,
    /// Three tiers: pods of leaves and spines, joined by core switches.
    FatTree,
}

/// `--memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MemoryChoice {
    /// Nothing stored; each packet's bytes checked on arrival.
    Synthetic,
    /// Every byte stored; flows compared whole at the end.
    Stored,
}

impl MemoryChoice {
    pub fn model(self) -> HostMemory {
        match self {
            MemoryChoice::Synthetic => HostMemory::Synthetic,
            MemoryChoice::Stored => HostMemory::Stored,
        }
    }
}

/// The cluster's shape, shared by `scale` and `replay`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ClusterArgs {
    /// Two tiers (leaf-spine) or three (fat tree).
    #[arg(long, value_enum, default_value_t = TopologyChoice::LeafSpine)]
    pub topology: TopologyChoice,
    /// Hosts per leaf.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub hosts_per_leaf: usize,
    /// Oversubscription of each tier, N to 1 (uplinks = downlinks / N,
    /// rounded up).
    #[arg(long, value_name = "N", default_value_t = 1.0)]
    pub oversubscription: f64,
    /// Host link rate, Gbit/s.
    #[arg(long, value_name = "N", default_value_t = 100.0)]
    pub host_gbps: f64,
    /// Rate of the links between switches, Gbit/s.
    #[arg(long, value_name = "N", default_value_t = 100.0)]
    pub fabric_gbps: f64,
    /// Propagation delay of every link, ns.
    #[arg(long, value_name = "NS", default_value_t = 1_000)]
    pub link_delay_ns: u64,
    /// Hosts' memory (synthetic: memory independent of the payload).
    #[arg(long, value_enum, default_value_t = MemoryChoice::Synthetic)]
    pub memory: MemoryChoice,
    /// The seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Simulated time after which a run stops, ms.
    #[arg(long, value_name = "MS", default_value_t = 1_000)]
    pub time_limit_ms: u64,
    /// Where CSV and SVG files go.
    #[arg(long, default_value = "target/metaroce")]
    pub out: PathBuf,
}

impl ClusterArgs {
    /// The fabric for at least `hosts` hosts.
    pub fn shape(&self, hosts: usize) -> Result<Shape, String> {
        let gbps = |flag: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v <= 1e4 {
                Ok((v * 1e9) as u64)
            } else {
                Err(format!("{flag}: a rate from 0 to 10,000 Gbit/s"))
            }
        };
        if !(self.oversubscription.is_finite() && self.oversubscription >= 1.0) {
            return Err("--oversubscription: at least 1".into());
        }
        if self.hosts_per_leaf == 0 || self.hosts_per_leaf > 1024 {
            return Err("--hosts-per-leaf: 1 to 1024".into());
        }
        let link = |rate_bps| LinkConfig {
            rate_bps,
            delay: Duration::from_nanos(self.link_delay_ns),
            ..LinkConfig::default()
        };
        let host_link = link(gbps("--host-gbps", self.host_gbps)?);
        let fabric_link = link(gbps("--fabric-gbps", self.fabric_gbps)?);
        let per = self.hosts_per_leaf;
        Ok(match self.topology {
            TopologyChoice::LeafSpine => {
                let mut s = LeafSpine::with_hosts(hosts, per);
                s.spines = ((per as f64 / self.oversubscription).ceil() as usize).max(1);
                s.host_link = host_link;
                s.fabric_link = fabric_link;
                Shape::LeafSpine(s)
            }
            TopologyChoice::FatTree => {
                let mut s = FatTree::with_hosts(hosts, per, self.oversubscription);
                s.host_link = host_link;
                s.leaf_link = fabric_link;
                s.core_link = fabric_link;
                Shape::FatTree(s)
            }
        })
    }
}

/// Permutation and incast at each cluster size, MetaRoCE alone: the
/// protocol's figures (completion-time percentiles, retransmissions,
/// drops) and what each run cost this machine (wall and CPU time, peak
/// memory, events per CPU-second). Sizes are rounded up to whole leaves
/// (and pods).
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ScaleArgs {
    /// Cluster sizes, hosts.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = [64usize, 256, 1024, 4096, 8192])]
    pub sizes: Vec<usize>,
    /// Patterns to run.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = [PatternChoice::Permutation, PatternChoice::Incast])]
    pub patterns: Vec<PatternChoice>,
    /// Bytes per permutation flow.
    #[arg(long, value_name = "N", default_value_t = 4 << 20)]
    pub bytes: u64,
    /// Bytes per incast sender.
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    pub incast_bytes: u64,
    /// Incast senders (spread over the cluster, to host 0).
    #[arg(long, value_name = "N", default_value_t = 63)]
    pub incast_senders: usize,
    /// Bytes per pair of hosts in an all-to-all (`--patterns all-to-all`).
    #[arg(long, value_name = "N", default_value_t = 64 << 10)]
    pub all_to_all_bytes: u64,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `--patterns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PatternChoice {
    Permutation,
    Incast,
    AllToAll,
}

impl std::fmt::Display for PatternChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PatternChoice::Permutation => "permutation",
            PatternChoice::Incast => "incast",
            PatternChoice::AllToAll => "all-to-all",
        })
    }
}

/// Flows from a file on a cluster of your shape, MetaRoCE alone. The file
/// has one flow a line, `SRC DST BYTES [START_US]` (`#` comments; bytes
/// may end in KiB, MiB, GiB, KB, MB or GB); see the simulator guide.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ReplayArgs {
    /// The flow file.
    #[arg(long, value_name = "FILE")]
    pub flows: PathBuf,
    /// Hosts [default: enough for the highest host index in the file].
    #[arg(long, value_name = "N")]
    pub hosts: Option<usize>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Prints progress to stderr every five seconds of a run that takes that
/// long (runs of thousands of hosts take minutes).
struct Reporter {
    label: String,
    started: std::time::Instant,
    last: std::time::Instant,
}

impl Reporter {
    fn new(label: String) -> Reporter {
        let now = std::time::Instant::now();
        Reporter {
            label,
            started: now,
            last: now,
        }
    }

    fn observe(&mut self, p: &Progress) {
        if self.last.elapsed() < Duration::from_secs(5) {
            return;
        }
        self.last = std::time::Instant::now();
        eprintln!(
            "{}: {:.1} us simulated, {:.1} M events, {}/{} flows done, {:.0} s",
            self.label,
            p.now.as_nanos() as f64 / 1e3,
            p.events as f64 / 1e6,
            p.flows_done,
            p.flows,
            self.started.elapsed().as_secs_f64()
        );
    }
}

fn us(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e6))
}

const HEADER: &str = "pattern    hosts switches  flows   intact   p50 us   p90 us   p99 us   max us    retx  RTOs   drops   events   wall s    CPU s  M ev/CPU-s  RSS MiB  KiB/host";

fn table_line(r: &ClusterRow) -> String {
    format!(
        "{:<10} {:>5} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>5} {:>7} {:>7.1}M {:>8.2} {:>8.2} {:>11.2} {:>8.0} {:>9.1}",
        r.name,
        r.hosts,
        r.switches,
        r.flows,
        r.intact,
        us(r.fct(0.5)),
        us(r.fct(0.9)),
        us(r.fct(0.99)),
        us(r.fct(1.0)),
        r.retransmissions,
        r.timeouts,
        r.queue_drops,
        r.events as f64 / 1e6,
        r.cost.wall_s,
        r.cost.cpu_s,
        r.cost.events_per_cpu_s(r.events) / 1e6,
        r.cost.peak_rss as f64 / (1 << 20) as f64,
        r.cost.peak_rss as f64 / 1024.0 / r.hosts.max(1) as f64,
    )
}

const CSV_HEADER: &str = "pattern,topology,hosts,switches,flows,intact,p50_us,p90_us,p99_us,p999_us,max_us,retransmissions,timeouts,probes,queue_drops,ecn_marked,sim_end_us,events,wall_s,cpu_s,events_per_cpu_s,peak_rss_mib,rss_per_host_kib";

fn csv_line(r: &ClusterRow, topology: &str) -> String {
    let us =
        |d: Option<Duration>| d.map_or(String::new(), |d| format!("{:.1}", d.as_secs_f64() * 1e6));
    format!(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.1},{},{:.3},{:.3},{:.0},{:.1},{:.1}",
        r.name,
        topology,
        r.hosts,
        r.switches,
        r.flows,
        r.intact,
        us(r.fct(0.5)),
        us(r.fct(0.9)),
        us(r.fct(0.99)),
        us(r.fct(0.999)),
        us(r.fct(1.0)),
        r.retransmissions,
        r.timeouts,
        r.probes,
        r.queue_drops,
        r.ecn_marked,
        r.end.as_nanos() as f64 / 1e3,
        r.events,
        r.cost.wall_s,
        r.cost.cpu_s,
        r.cost.events_per_cpu_s(r.events),
        r.cost.peak_rss as f64 / (1 << 20) as f64,
        r.cost.peak_rss as f64 / 1024.0 / r.hosts.max(1) as f64,
    )
}

/// At most `points` points of the completion-time CDF (in us): readable
/// and small whatever the number of flows.
pub fn cdf_points(fcts: &[Duration], flows: usize, points: usize) -> Vec<(f64, f64)> {
    let n = fcts.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(points.max(1)).max(1);
    let mut out: Vec<(f64, f64)> = (step - 1..n)
        .step_by(step)
        .map(|i| {
            (
                fcts[i].as_secs_f64() * 1e6,
                (i + 1) as f64 / flows.max(1) as f64,
            )
        })
        .collect();
    if out.last().map(|p| p.1) != Some(n as f64 / flows.max(1) as f64) {
        out.push((
            fcts[n - 1].as_secs_f64() * 1e6,
            n as f64 / flows.max(1) as f64,
        ));
    }
    out
}

fn write(out: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let path = out.join(name);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn topology_name(shape: &Shape) -> &'static str {
    match shape {
        Shape::LeafSpine(_) => "leaf-spine",
        Shape::FatTree(_) => "fat-tree",
    }
}

/// Runs `scale`; returns the events simulated.
pub fn scale(args: &ScaleArgs) -> Result<u64, String> {
    if args.sizes.is_empty() || args.sizes.iter().any(|&n| n < 2) {
        return Err("--sizes: cluster sizes of at least 2 hosts".into());
    }
    let c = &args.cluster;
    println!(
        "scale: MetaRoCE alone; permutation {} B per flow, incast {} senders x {} B to host 0, all-to-all {} B per pair; {} memory",
        args.bytes,
        args.incast_senders,
        args.incast_bytes,
        args.all_to_all_bytes,
        match c.memory {
            MemoryChoice::Synthetic => "synthetic",
            MemoryChoice::Stored => "stored",
        }
    );
    println!("{HEADER}");
    let mut rows: Vec<(ClusterRow, &'static str)> = Vec::new();
    let mut csv = format!("{CSV_HEADER}\n");
    let mut events = 0;
    for &size in &args.sizes {
        let shape = c.shape(size)?;
        let hosts = shape.hosts();
        for &pattern in &args.patterns {
            let (pattern, bytes) = match pattern {
                PatternChoice::Permutation => (ScalePattern::Permutation, args.bytes),
                PatternChoice::Incast => (
                    ScalePattern::Incast {
                        senders: args.incast_senders,
                    },
                    args.incast_bytes,
                ),
                PatternChoice::AllToAll => (ScalePattern::AllToAll, args.all_to_all_bytes),
            };
            let flows = pattern.flows(hosts, bytes, c.seed);
            let mut reporter = Reporter::new(format!("{} {hosts} hosts", pattern.name()));
            let row = super::run(
                pattern.name(),
                &shape,
                &flows,
                c.seed,
                c.memory.model(),
                Duration::from_millis(c.time_limit_ms),
                |p| reporter.observe(p),
            );
            println!("{}", table_line(&row));
            let _ = std::io::stdout().flush();
            csv.push_str(&csv_line(&row, topology_name(&shape)));
            csv.push('\n');
            events += row.events;
            rows.push((row, topology_name(&shape)));
        }
    }
    let path = write(&c.out, "scale.csv", &csv)?;
    println!("CSV: {}", path.display());
    // Events per CPU-second against cluster size, one line per pattern;
    // and the completion-time CDFs of every run.
    let mut speed: Vec<Series> = Vec::new();
    let mut cdfs: Vec<Series> = Vec::new();
    for (row, _) in &rows {
        let point = (
            row.hosts as f64,
            row.cost.events_per_cpu_s(row.events) / 1e6,
        );
        match speed.iter_mut().find(|s| s.name == row.name) {
            Some(s) => s.points.push(point),
            None => speed.push(Series {
                name: row.name.clone(),
                points: vec![point],
            }),
        }
        cdfs.push(Series {
            name: format!("{} {} hosts", row.name, row.hosts),
            points: cdf_points(&row.fcts, row.flows, 200),
        });
    }
    let svg = c.out.join("scale.svg");
    plot::line_chart(
        &svg,
        &Chart {
            title: "MetaRoCE simulator speed against cluster size",
            x_label: "hosts",
            y_label: "M events per CPU-second",
            x_scale: Scale::Log,
            y_scale: Scale::Linear,
        },
        &speed,
    )?;
    let fct_svg = c.out.join("scale-fct.svg");
    plot::line_chart(
        &fct_svg,
        &Chart {
            title: "Flow completion time CDF per run",
            x_label: "completion time (us)",
            y_label: "fraction of flows",
            x_scale: Scale::Log,
            y_scale: Scale::Linear,
        },
        &cdfs,
    )?;
    println!("plots: {} {}", svg.display(), fct_svg.display());
    Ok(events)
}

/// Runs `replay`; returns the events simulated.
pub fn replay(args: &ReplayArgs) -> Result<u64, String> {
    let text = std::fs::read_to_string(&args.flows)
        .map_err(|e| format!("{}: {e}", args.flows.display()))?;
    // First parse without a host bound to find how many hosts it needs.
    let needed = crate::flow_file::parse(&text, usize::MAX)
        .map_err(|e| format!("{}: {e}", args.flows.display()))?
        .iter()
        .map(|f| f.src.max(f.dst) + 1)
        .max()
        .ok_or_else(|| format!("{}: no flows", args.flows.display()))?;
    let c = &args.cluster;
    let shape = c.shape(args.hosts.unwrap_or(needed).max(needed))?;
    let flows = crate::flow_file::parse(&text, shape.hosts())
        .map_err(|e| format!("{}: {e}", args.flows.display()))?;
    println!(
        "replay: {} flows from {} on a {} ({} hosts), MetaRoCE",
        flows.len(),
        args.flows.display(),
        shape.describe(),
        shape.hosts()
    );
    let mut reporter = Reporter::new("replay".into());
    let row = super::run(
        "replay",
        &shape,
        &flows,
        c.seed,
        c.memory.model(),
        Duration::from_millis(c.time_limit_ms),
        |p| reporter.observe(p),
    );
    println!("{HEADER}");
    println!("{}", table_line(&row));
    let csv = format!("{CSV_HEADER}\n{}\n", csv_line(&row, topology_name(&shape)));
    let path = write(&c.out, "replay.csv", &csv)?;
    let svg = c.out.join("replay.svg");
    plot::line_chart(
        &svg,
        &Chart {
            title: "Flow completion time CDF",
            x_label: "completion time (us)",
            y_label: "fraction of flows",
            x_scale: Scale::Log,
            y_scale: Scale::Linear,
        },
        &[Series {
            name: "MetaRoCE".into(),
            points: cdf_points(&row.fcts, row.flows, 200),
        }],
    )?;
    println!("CSV: {}\nplot: {}", path.display(), svg.display());
    Ok(row.events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdf_has_at_most_the_points_asked_and_ends_at_the_last_flow() {
        let fcts: Vec<Duration> = (1..=8_192).map(Duration::from_micros).collect();
        let points = cdf_points(&fcts, 8_192, 200);
        assert!(points.len() <= 201, "{}", points.len());
        assert_eq!(points.last(), Some(&(8_192.0, 1.0)));
        assert!(points
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert_eq!(cdf_points(&fcts[..3], 4, 200).last(), Some(&(3.0, 0.75)));
    }
}
