//! SVG line charts of experiment results (with `plotters`' SVG backend:
//! no fonts or system libraries needed).

use std::path::Path;

use plotters::prelude::*;

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

#[cfg(test)]
mod tests {
    use super::*;

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
