//! The reference costs measured beside the engine (CRC-32, one payload
//! copy), the memory rows, and the report: a table for people and CSV rows
//! (`metric,value,unit`) for tools.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant as WallClock;

use metaroce_core::wire::packet::crc32;
use metaroce_core::{Endpoint, Footprint};

use crate::BenchEndpoint;

/// One result.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Short machine name (CSV `metric`).
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
    /// What it is, for the table.
    pub label: String,
}

impl Row {
    pub fn new(
        metric: impl Into<String>,
        value: f64,
        unit: &'static str,
        label: impl Into<String>,
    ) -> Row {
        Row {
            metric: metric.into(),
            value,
            unit,
            label: label.into(),
        }
    }
}

/// Nanoseconds for one CRC-32 (the engine's own function) over `len` bytes,
/// averaged over `iterations`.
pub fn crc32_ns(len: usize, iterations: u64) -> f64 {
    let data = vec![0xA5u8; len];
    let mut acc = 0u32;
    let start = WallClock::now();
    for _ in 0..iterations {
        acc ^= crc32(&[black_box(&data[..])]);
    }
    let elapsed = start.elapsed();
    black_box(acc);
    per_iteration(elapsed, iterations)
}

/// Nanoseconds for one copy of `len` bytes between two buffers that stay in
/// cache, averaged over `iterations`. `black_box` keeps every copy.
///
/// Both buffers start on a cache line and lie half a page apart, as DMA
/// buffers do. Placement matters: two fresh 4 KiB `Vec`s from malloc lie
/// 16 bytes apart modulo the page, and on the AMD EPYC this was written on
/// glibc's `rep movsb` copy is then about 30 times slower (3 µs, not 0.1).
pub fn memcpy_ns(len: usize, iterations: u64) -> f64 {
    const LINE: usize = 64;
    const HALF_PAGE: usize = 2048;
    let gap = len.next_multiple_of(4096) + HALF_PAGE;
    let mut arena = vec![0x5Au8; LINE + gap + len];
    let start_at = arena.as_ptr().align_offset(LINE).min(LINE);
    let (front, back) = arena[start_at..].split_at_mut(gap);
    let src = &front[..len];
    let dst = &mut back[..len];
    let start = WallClock::now();
    for _ in 0..iterations {
        black_box(&mut *dst).copy_from_slice(black_box(src));
    }
    let elapsed = start.elapsed();
    black_box(&*dst);
    per_iteration(elapsed, iterations)
}

/// Mean nanoseconds per iteration.
pub fn per_iteration(elapsed: std::time::Duration, iterations: u64) -> f64 {
    elapsed.as_nanos() as f64 / iterations.max(1) as f64
}

/// The smallest of `repeats` measurements: the one least disturbed by
/// other work on the machine.
pub fn best_of(repeats: u32, mut f: impl FnMut() -> f64) -> f64 {
    (0..repeats.max(1))
        .map(|_| f())
        .fold(f64::INFINITY, f64::min)
}

fn footprint_rows(paths: usize, f: Footprint, rows: &mut Vec<Row>) {
    let parts = [
        ("connection", f.connection, "one connection, total"),
        ("window", f.window, "  sender window (256 PSNs)"),
        ("paths", f.paths, "  all paths"),
        ("per_path", f.per_path, "  one path"),
        ("queues", f.queues, "  send + receive work queues"),
        ("fixed", f.fixed, "  everything else"),
    ];
    for (name, bytes, label) in parts {
        rows.push(Row::new(
            format!("conn_p{paths}_{name}_bytes"),
            bytes as f64,
            "B",
            format!("{label} (P = {paths})"),
        ));
    }
}

/// Bytes per connection for 1, 16 and 256 paths, and one `Endpoint<8, 16>`.
pub fn memory_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    footprint_rows(16, Endpoint::<8, 16>::footprint(), &mut rows);
    footprint_rows(1, Endpoint::<8, 1>::footprint(), &mut rows);
    footprint_rows(256, Endpoint::<8, 256>::footprint(), &mut rows);
    rows.push(Row::new(
        "endpoint_8x16_bytes",
        core::mem::size_of::<BenchEndpoint>() as f64,
        "B",
        "size_of::<Endpoint<8, 16>>()",
    ));
    rows
}

fn format_value(v: f64, unit: &str) -> String {
    match unit {
        "B" | "count" => format!("{v:.0}"),
        "Mpps" | "ratio" | "per packet" => format!("{v:.2}"),
        _ => format!("{v:.1}"),
    }
}

/// A table for the terminal.
pub fn table(rows: &[Row]) -> String {
    let label_w = rows
        .iter()
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(0);
    let values: Vec<String> = rows.iter().map(|r| format_value(r.value, r.unit)).collect();
    let value_w = values.iter().map(String::len).max().unwrap_or(0);
    let mut out = String::new();
    for (r, v) in rows.iter().zip(&values) {
        let _ = writeln!(out, "  {:<label_w$}  {v:>value_w$} {}", r.label, r.unit);
    }
    out
}

/// CSV with a header line: `metric,value,unit`.
pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from("metric,value,unit\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{}",
            r.metric,
            format_value(r.value, r.unit),
            r.unit
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_rows_add_up() {
        let rows = memory_rows();
        let get = |m: &str| rows.iter().find(|r| r.metric == m).map(|r| r.value);
        for p in [1, 16, 256] {
            let total = get(&format!("conn_p{p}_connection_bytes")).expect("total");
            let parts: f64 = ["window", "paths", "queues", "fixed"]
                .iter()
                .map(|n| get(&format!("conn_p{p}_{n}_bytes")).expect("part"))
                .sum();
            assert_eq!(total, parts);
        }
    }

    #[test]
    fn csv_has_one_line_per_row() {
        let rows = vec![Row::new("a", 1.5, "ns", "A"), Row::new("b", 2.0, "B", "B")];
        assert_eq!(csv(&rows), "metric,value,unit\na,1.5,ns\nb,2,B\n");
        assert_eq!(table(&rows).lines().count(), 2);
    }

    #[test]
    fn reference_costs_are_measured() {
        assert!(crc32_ns(64, 10) >= 0.0);
        assert!(memcpy_ns(64, 10) >= 0.0);
        assert_eq!(best_of(3, || 2.0), 2.0);
    }
}
