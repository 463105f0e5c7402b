//! The `long-haul` experiment's tables, CSV and chart lines (text only;
//! [`super::cli`] writes the files).

use std::fmt::Write as _;
use std::time::Duration;

use super::shared::{FlowKind, ShareRow};
use super::{LongHaulRow, PACKET_PAYLOAD};
use crate::experiments::Protocol;
use crate::plot::Series;
use crate::workload::FlowStatus;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.3}", ms(d)))
}

fn opt_u64(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

fn status(r: &LongHaulRow) -> String {
    match r.status {
        _ if r.messages_corrupt > 0 => "CORRUPT".into(),
        FlowStatus::Done => "done".into(),
        FlowStatus::Unfinished => "time limit".into(),
        s => format!("{s:?}"),
    }
}

fn goal_text(r: &LongHaulRow) -> &'static str {
    match r.goal() {
        Some((_, true)) => "met",
        Some((_, false)) => "missed",
        None => "",
    }
}

/// The main table.
pub fn table(rows: &[LongHaulRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>7} {:>6} {:<9} {:>8} {:>7} {:>6} {:>8} {:>10} {:<10} {:>7} {:>5} {:>9} {:>6}",
        "rtt ms",
        "loss %",
        "protocol",
        "Gbit/s",
        "% line",
        "goal",
        "xfer Gb/s",
        "fct ms",
        "status",
        "retx",
        "RTOs",
        "max infl",
        "lost"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>7} {:>6} {:<9} {:>8.3} {:>6.1}% {:>6} {:>8.3} {:>10} {:<10} {:>7} {:>5} {:>9} {:>6}",
            format!("{:.3}", ms(r.path_rtt)),
            r.loss * 100.0,
            r.protocol.name(),
            r.goodput_gbps,
            r.pct_of_line_rate(),
            goal_text(r),
            r.transfer_goodput_gbps,
            opt_ms(r.fct),
            status(r),
            r.retransmissions,
            r.timeouts,
            opt_u64(r.max_in_flight),
            r.lost_long_haul
        );
    }
    out
}

/// The goal lines under the table.
pub fn goals(rows: &[LongHaulRow]) -> String {
    let mut out = String::new();
    for r in rows {
        if let Some((required, met)) = r.goal() {
            let _ = writeln!(
                out,
                "goal: {} at {} ms, {} % loss: >= {required} % of line rate; measured {:.1} %: {}",
                r.protocol.name(),
                ms(r.rtt),
                r.loss * 100.0,
                r.pct_of_line_rate(),
                if met { "met" } else { "missed" }
            );
        }
    }
    out
}

/// `long-haul.csv`.
pub fn csv(rows: &[LongHaulRow]) -> String {
    let mut out = String::from(
        "rtt_ms,path_rtt_ms,loss_pct,protocol,bytes,window_bytes,message_bytes,status,intact,fct_ms,goodput_gbps,transfer_goodput_gbps,pct_of_line_rate,retransmissions,timeouts,max_in_flight,lost_long_haul,queue_drops,goal,run_time_ms,events\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.2},{},{},{},{},{},{},{:.3},{}",
            ms(r.rtt),
            ms(r.path_rtt),
            r.loss * 100.0,
            r.protocol.name(),
            r.bytes,
            r.window_bytes,
            r.message_bytes,
            status(r),
            r.intact,
            opt_ms(r.fct),
            r.goodput_gbps,
            r.transfer_goodput_gbps,
            r.pct_of_line_rate(),
            r.retransmissions,
            r.timeouts,
            opt_u64(r.max_in_flight),
            r.lost_long_haul,
            r.queue_drops,
            goal_text(r),
            ms(r.run_time),
            r.events
        );
    }
    out
}

/// `long-haul-timeseries.csv`: every run's acknowledged bytes over time.
pub fn timeseries_csv(rows: &[LongHaulRow]) -> String {
    let mut out = String::from("rtt_ms,loss_pct,protocol,t_ms,acked_bytes\n");
    for r in rows {
        for &(t, b) in &r.samples {
            let _ = writeln!(
                out,
                "{},{},{},{:.4},{}",
                ms(r.rtt),
                r.loss * 100.0,
                r.protocol.name(),
                ms(t),
                b
            );
        }
    }
    out
}

/// Goodput against round trip: one line per protocol and loss, plus the
/// line rate and the ceiling of a window of 256 PSNs (256 packets per
/// round trip, what one SACK bitvector describes), for comparison.
pub fn goodput_series(rows: &[LongHaulRow]) -> Vec<Series> {
    let mut losses: Vec<f64> = rows.iter().map(|r| r.loss).collect();
    losses.dedup();
    losses.sort_by(f64::total_cmp);
    losses.dedup();
    let mut series = Vec::new();
    for protocol in Protocol::ALL {
        for &loss in &losses {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.protocol == protocol && r.loss == loss)
                .map(|r| (ms(r.path_rtt), r.goodput_gbps))
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    name: format!("{} {} % loss", protocol.name(), loss * 100.0),
                    points,
                });
            }
        }
    }
    let mut rtts: Vec<(Duration, u64)> =
        rows.iter().map(|r| (r.path_rtt, r.line_rate_bps)).collect();
    rtts.sort();
    rtts.dedup();
    series.push(Series {
        name: "line rate".into(),
        points: rtts
            .iter()
            .map(|&(rtt, rate)| (ms(rtt), rate as f64 / 1e9))
            .collect(),
    });
    series.push(Series {
        name: "before: 256 PSNs x 4 KiB per round trip".into(),
        points: rtts
            .iter()
            .map(|&(rtt, rate)| {
                let window = 256.0 * f64::from(PACKET_PAYLOAD) * 8.0 / rtt.as_secs_f64() / 1e9;
                (ms(rtt), window.min(rate as f64 / 1e9))
            })
            .collect(),
    });
    series
}

/// Goodput over time, averaged over a sliding `window`: (ms, Gbit/s).
pub fn rate_over_time(samples: &[(Duration, u64)], window: Duration) -> Vec<(f64, f64)> {
    let at = |t: Duration| -> f64 {
        let i = samples.partition_point(|s| s.0 <= t);
        match (i.checked_sub(1).map(|j| samples[j]), samples.get(i)) {
            (None, _) => 0.0,
            (Some((_, b)), None) => b as f64,
            (Some((t0, b0)), Some(&(t1, b1))) => {
                let part = (t - t0).as_secs_f64() / (t1 - t0).as_secs_f64().max(1e-12);
                b0 as f64 + (b1 as f64 - b0 as f64) * part
            }
        }
    };
    let secs = window.as_secs_f64().max(1e-12);
    samples
        .iter()
        .filter(|s| s.0 >= window)
        .map(|&(t, _)| (ms(t), (at(t) - at(t - window)) * 8.0 / secs / 1e9))
        .collect()
}

/// Goodput over time of the runs at `rtt` (one line per protocol and
/// loss), averaged over one round trip.
pub fn ramp_series(rows: &[LongHaulRow], rtt: Duration) -> Vec<Series> {
    rows.iter()
        .filter(|r| r.rtt == rtt)
        .map(|r| Series {
            name: format!("{} {} % loss", r.protocol.name(), r.loss * 100.0),
            points: rate_over_time(&r.samples, r.path_rtt),
        })
        .collect()
}

/// The shared-bottleneck table.
pub fn share_table(rows: &[ShareRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:<10} {:>5} {:>5} {:>8} {:>7} {:>9}",
        "protocol", "flow", "src", "dst", "Gbit/s", "share", "max infl"
    );
    for r in rows {
        for f in &r.flows {
            let _ = writeln!(
                out,
                "{:<9} {:<10} {:>5} {:>5} {:>8.3} {:>6.1}% {:>9}",
                r.protocol.name(),
                f.kind.name(),
                f.src,
                f.dst,
                f.goodput_gbps,
                f.share * 100.0,
                opt_u64(f.max_in_flight)
            );
        }
        let corrupt: u64 = r.flows.iter().map(|f| f.messages_corrupt).sum();
        let _ = writeln!(
            out,
            "{:<9} total {:.3} Gbit/s ({:.1} % of the bottleneck), Jain {:.3}, drops {}, marked {}, retx {}, RTOs {}{}",
            r.protocol.name(),
            r.total_gbps,
            100.0 * r.total_gbps * 1e9 / r.line_rate_bps.max(1) as f64,
            r.fairness,
            r.queue_drops,
            r.marked,
            r.retransmissions,
            r.timeouts,
            if corrupt > 0 {
                format!(", {corrupt} CORRUPT messages")
            } else {
                String::new()
            }
        );
    }
    out
}

/// `long-haul-share.csv`: one line per flow.
pub fn share_csv(rows: &[ShareRow]) -> String {
    let mut out = String::from(
        "protocol,rtt_ms,flow,kind,src,dst,goodput_gbps,share,max_in_flight,jain,total_gbps,queue_drops,marked,retransmissions,timeouts,duration_ms,events\n",
    );
    for r in rows {
        for (i, f) in r.flows.iter().enumerate() {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{:.4},{:.4},{},{:.4},{:.4},{},{},{},{},{:.3},{}",
                r.protocol.name(),
                ms(r.rtt),
                i,
                f.kind.name(),
                f.src,
                f.dst,
                f.goodput_gbps,
                f.share,
                opt_u64(f.max_in_flight),
                r.fairness,
                r.total_gbps,
                r.queue_drops,
                r.marked,
                r.retransmissions,
                r.timeouts,
                ms(r.duration),
                r.events
            );
        }
    }
    out
}

/// Each protocol's long-haul flow and its data-centre flows' mean, over
/// time, averaged over `window`.
pub fn share_series(rows: &[ShareRow], window: Duration) -> Vec<Series> {
    let mut series = Vec::new();
    for r in rows {
        let long: Vec<&_> = r
            .flows
            .iter()
            .filter(|f| f.kind == FlowKind::LongHaul)
            .collect();
        let intra: Vec<&_> = r
            .flows
            .iter()
            .filter(|f| f.kind == FlowKind::IntraDc)
            .collect();
        for f in long {
            series.push(Series {
                name: format!("{} long-haul", r.protocol.name()),
                points: rate_over_time(&f.samples, window),
            });
        }
        if let Some(first) = intra.first() {
            let mut points = rate_over_time(&first.samples, window);
            for f in &intra[1..] {
                for (p, q) in points.iter_mut().zip(rate_over_time(&f.samples, window)) {
                    p.1 += q.1;
                }
            }
            for p in &mut points {
                p.1 /= intra.len() as f64;
            }
            series.push(Series {
                name: format!("{} intra-DC (mean of {})", r.protocol.name(), intra.len()),
                points,
            });
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_over_time_averages_over_the_window() {
        // 1250 bytes per 1 us: 10 Gbit/s.
        let samples: Vec<(Duration, u64)> = (0..=10)
            .map(|i| (Duration::from_micros(i), 1250 * i))
            .collect();
        let r = rate_over_time(&samples, Duration::from_micros(4));
        assert_eq!(r.len(), 7);
        assert!(r.iter().all(|p| (p.1 - 10.0).abs() < 1e-9), "{r:?}");
        assert_eq!(r[0].0, 0.004);
    }
}
