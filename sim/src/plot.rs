//! SVG line charts of experiment results (with `plotters`' SVG backend:
//! no fonts or system libraries needed), and the lines the `path-failure`
//! and `spray` charts draw.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use crate::experiments::{PathFailure, PathFailureRow, SprayRow};

/// One line of a chart: a name for the legend and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Axis scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Base-10 logarithmic (values must be positive; others are skipped).
    Log,
}

/// A chart's labels and axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_scale: Scale,
    pub y_scale: Scale,
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

fn bounds(values: impl Iterator<Item = f64>, scale: Scale) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (scale == Scale::Linear || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if lo > hi {
        return if scale == Scale::Log {
            (1.0, 10.0)
        } else {
            (0.0, 1.0)
        };
    }
    match scale {
        Scale::Linear => {
            let lo = lo.min(0.0);
            let pad = (hi - lo).abs().max(1e-9) * 0.05;
            (lo, hi + pad)
        }
        Scale::Log => (lo / 1.5, hi * 1.5),
    }
}

/// Writes `series` as an SVG line chart with markers to `path`.
pub fn line_chart(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let xs = bounds(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        chart.x_scale,
    );
    let ys = bounds(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        chart.y_scale,
    );
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let keep = |p: &&(f64, f64)| {
        p.0.is_finite()
            && p.1.is_finite()
            && (chart.x_scale == Scale::Linear || p.0 > 0.0)
            && (chart.y_scale == Scale::Linear || p.1 > 0.0)
    };
    // One generic drawing routine per axis combination (plotters types the
    // coordinate system statically).
    macro_rules! draw {
        ($x:expr, $y:expr) => {{
            let mut c = ChartBuilder::on(&root)
                .caption(chart.title, ("sans-serif", 22))
                .margin(16)
                .x_label_area_size(48)
                .y_label_area_size(72)
                .build_cartesian_2d($x, $y)
                .map_err(|e| err(&e))?;
            c.configure_mesh()
                .x_desc(chart.x_label)
                .y_desc(chart.y_label)
                .draw()
                .map_err(|e| err(&e))?;
            for (i, s) in series.iter().enumerate() {
                let colour = COLOURS[i % COLOURS.len()];
                let pts: Vec<(f64, f64)> = s.points.iter().filter(keep).copied().collect();
                c.draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
                c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled())))
                    .map_err(|e| err(&e))?;
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    match (chart.x_scale, chart.y_scale) {
        (Scale::Linear, Scale::Linear) => draw!(xs.0..xs.1, ys.0..ys.1),
        (Scale::Log, Scale::Linear) => draw!((xs.0..xs.1).log_scale(), ys.0..ys.1),
        (Scale::Linear, Scale::Log) => draw!(xs.0..xs.1, (ys.0..ys.1).log_scale()),
        (Scale::Log, Scale::Log) => draw!((xs.0..xs.1).log_scale(), (ys.0..ys.1).log_scale()),
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// `path-failure` chart lines: each run's per-flow completion times (x:
/// flow index, y: microseconds), plus flat lines at the failure instant
/// and, if the switches reroute, at the reroute instant (both measured
/// from the flows' start, like the completion times).
pub fn path_failure_series(rows: &[PathFailureRow], cfg: &PathFailure) -> Vec<Series> {
    let mut series: Vec<Series> = rows
        .iter()
        .map(|r| Series {
            name: format!(
                "{}{}",
                r.protocol.name(),
                if r.failure {
                    ", link fails"
                } else {
                    ", no failure"
                }
            ),
            points: r
                .fcts
                .iter()
                .enumerate()
                .filter_map(|(i, t)| t.map(|t| (i as f64, t.as_secs_f64() * 1e6)))
                .collect(),
        })
        .collect();
    let last_flow = rows.iter().map(|r| r.fcts.len()).max().unwrap_or(1).max(2) - 1;
    let flat = |name: String, at: Duration| Series {
        name,
        points: vec![
            (0.0, at.as_secs_f64() * 1e6),
            (last_flow as f64, at.as_secs_f64() * 1e6),
        ],
    };
    series.push(flat(
        format!("link fails ({} us)", cfg.fail_at.as_micros()),
        cfg.fail_at,
    ));
    if let Some(d) = cfg.reroute_delay {
        series.push(flat(
            format!("switches reroute ({} us)", (cfg.fail_at + d).as_micros()),
            cfg.fail_at + d,
        ));
    }
    series
}

/// `spray` chart lines: data packets per path (x: path = spine index,
/// y: packets the source leaf sent through that spine), one line per
/// protocol.
pub fn spray_series(rows: &[SprayRow]) -> Vec<Series> {
    rows.iter()
        .map(|r| Series {
            name: r.protocol.name().into(),
            points: r
                .path_packets
                .iter()
                .enumerate()
                .map(|(i, &n)| (i as f64, n as f64))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::Protocol;

    fn temp_svg(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("metaroce-sim-plot-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.svg"));
        (dir, path)
    }

    #[test]
    fn path_failure_chart_marks_the_failure() {
        let cfg = PathFailure::default();
        let row = |protocol, failure, fcts: &[u64]| PathFailureRow {
            protocol,
            failure,
            flows: fcts.len(),
            intact: fcts.len(),
            last: fcts.iter().max().map(|&t| Duration::from_micros(t)),
            fcts: fcts
                .iter()
                .map(|&t| Some(Duration::from_micros(t)))
                .collect(),
            lost_on_link: u64::from(failure),
            retransmissions: 0,
            timeouts: 0,
            events: 0,
        };
        let rows = [
            row(Protocol::MetaRoce, false, &[1600, 1610, 1615]),
            row(Protocol::MetaRoce, true, &[1700, 2100, 2178]),
            row(Protocol::Roce, true, &[270_000, 600_000, 609_083]),
        ];
        let series = path_failure_series(&rows, &cfg);
        // Three runs, the failure and the reroute.
        assert_eq!(series.len(), 5);
        assert_eq!(series[3].points, vec![(0.0, 200.0), (2.0, 200.0)]);
        assert_eq!(series[4].points, vec![(0.0, 300.0), (2.0, 300.0)]);
        let (dir, path) = temp_svg("path-failure");
        let chart = Chart {
            title: "path-failure",
            x_label: "flow",
            y_label: "completion time (us)",
            x_scale: Scale::Linear,
            y_scale: Scale::Log,
        };
        line_chart(&path, &chart, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("link fails (200 us)") && svg.contains("RoCEv2, link fails"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn spray_chart_has_a_point_per_path() {
        let row = |protocol, path_packets: Vec<u64>| SprayRow {
            protocol,
            intact: true,
            fct: None,
            goodput_gbps: 0.0,
            first_transmissions: path_packets.iter().sum(),
            retransmissions: 0,
            spurious_retransmissions: 0,
            path_packets,
            events: 0,
        };
        let mut roce = vec![0; 16];
        roce[5] = 4096;
        let rows = [
            row(Protocol::MetaRoce, vec![256; 16]),
            row(Protocol::Roce, roce),
        ];
        let series = spray_series(&rows);
        assert_eq!(series.len(), 2);
        assert!(series.iter().all(|s| s.points.len() == 16));
        assert_eq!(series[1].points[5], (5.0, 4096.0));
        let (dir, path) = temp_svg("spray");
        let chart = Chart {
            title: "spray",
            x_label: "path",
            y_label: "packets",
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
        };
        line_chart(&path, &chart, &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("MetaRoCE"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writes_an_svg_with_both_series() {
        let dir = std::env::temp_dir().join(format!("metaroce-sim-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        let series = [
            Series {
                name: "MetaRoCE".into(),
                points: vec![(0.0, 96.8), (1.0, 46.5), (10.0, 26.2)],
            },
            Series {
                name: "RoCEv2".into(),
                points: vec![(0.0, 97.9), (1.0, 30.9), (10.0, 0.02)],
            },
        ];
        for (x_scale, y_scale) in [(Scale::Linear, Scale::Linear), (Scale::Linear, Scale::Log)] {
            let chart = Chart {
                title: "goodput",
                x_label: "loss %",
                y_label: "Gbit/s",
                x_scale,
                y_scale,
            };
            line_chart(&path, &chart, &series).unwrap();
            let svg = std::fs::read_to_string(&path).unwrap();
            assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
            assert!(svg.contains("MetaRoCE") && svg.contains("RoCEv2"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
