//! The reference costs measured beside the engine (CRC-32, one payload
//! copy), the memory rows, and the report: a table for people and CSV rows
//! (`metric,value,unit`) for tools.

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant as WallClock};

use metaroce_core::wire::packet::crc32;
use metaroce_core::{Endpoint, Footprint, Heap, Layout};

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

/// Time per iteration of one measurement, on two clocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Wall-clock nanoseconds (`std::time::Instant`).
    pub wall_ns: f64,
    /// Nanoseconds this thread spent on a CPU, where the OS tells
    /// (Linux): unlike wall time it leaves out waiting for a core while
    /// other builds run.
    pub cpu_ns: Option<f64>,
}

impl Sample {
    /// On-CPU time where known, else wall time.
    pub fn ns(&self) -> f64 {
        self.cpu_ns.unwrap_or(self.wall_ns)
    }
}

/// The smallest of several samples, per clock: the runs least disturbed
/// by other work on the machine.
pub fn best(samples: &[Sample]) -> Sample {
    let wall_ns = samples
        .iter()
        .map(|s| s.wall_ns)
        .fold(f64::INFINITY, f64::min);
    let cpu: Vec<f64> = samples.iter().filter_map(|s| s.cpu_ns).collect();
    let cpu_ns = (!cpu.is_empty() && cpu.len() == samples.len())
        .then(|| cpu.into_iter().fold(f64::INFINITY, f64::min));
    Sample { wall_ns, cpu_ns }
}

/// This thread's time on a CPU so far (`CLOCK_THREAD_CPUTIME_ID`, which
/// adds the running slice to what the scheduler booked, so it is exact to
/// the nanosecond; `/proc/thread-self/schedstat` alone moves by scheduler
/// ticks, which put 4 ms / 200,000 packets = 20 ns steps into per-packet
/// figures); `None` where the clock does not exist.
pub fn cpu_time() -> Option<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(Duration::from(t))
}

/// Measures wall and on-CPU time from `start` to `per_iteration`.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch {
    wall: WallClock,
    cpu: Option<Duration>,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch {
            cpu: cpu_time(),
            wall: WallClock::now(),
        }
    }

    /// Time since `start`, divided by `iterations`.
    pub fn per_iteration(&self, iterations: u64) -> Sample {
        let wall = self.wall.elapsed();
        let cpu = match (self.cpu, cpu_time()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let n = iterations.max(1) as f64;
        Sample {
            wall_ns: wall.as_nanos() as f64 / n,
            cpu_ns: cpu.map(|c| c.as_nanos() as f64 / n),
        }
    }
}

/// Runs `f(iterations)` long enough (about `MIN_RUN`) for the on-CPU clock
/// to be exact to about 1 %, after a short calibration run.
pub fn timed(mut f: impl FnMut(u64)) -> Sample {
    const MIN_RUN: Duration = Duration::from_millis(150);
    const CALIBRATION: u64 = 1_000;
    let t = WallClock::now();
    f(CALIBRATION);
    let per = t.elapsed().as_secs_f64() / CALIBRATION as f64;
    let iterations = (MIN_RUN.as_secs_f64() / per.max(1e-9)).clamp(1e3, 1e8) as u64;
    let watch = Stopwatch::start();
    f(iterations);
    watch.per_iteration(iterations)
}

/// One CRC-32 (the engine's own function) over `len` bytes.
pub fn crc32_sample(len: usize) -> Sample {
    let data = vec![0xA5u8; len];
    timed(|iterations| {
        let mut acc = 0u32;
        for _ in 0..iterations {
            acc ^= crc32(&[black_box(&data[..])]);
        }
        black_box(acc);
    })
}

/// One copy of `len` bytes between two buffers that stay in cache;
/// `black_box` keeps every copy.
///
/// Both buffers start on a cache line and lie half a page apart, as DMA
/// buffers do. Placement matters: two fresh 4 KiB `Vec`s from malloc lie
/// 16 bytes apart modulo the page, and on the AMD EPYC this was written on
/// glibc's `rep movsb` copy is then about 30 times slower (3 µs, not 0.1).
pub fn memcpy_sample(len: usize) -> Sample {
    const LINE: usize = 64;
    const HALF_PAGE: usize = 2048;
    let gap = len.next_multiple_of(4096) + HALF_PAGE;
    let mut arena = vec![0x5Au8; LINE + gap + len];
    let start_at = arena.as_ptr().align_offset(LINE).min(LINE);
    let (front, back) = arena[start_at..].split_at_mut(gap);
    let src = &front[..len];
    let dst = &mut back[..len];
    timed(|iterations| {
        for _ in 0..iterations {
            black_box(&mut *dst).copy_from_slice(black_box(src));
        }
        black_box(&*dst);
    })
}

fn footprint_rows(paths: usize, f: Footprint, rows: &mut Vec<Row>) {
    let parts = [
        (
            "idle_connection",
            f.idle_connection,
            "an idle connection in all: slot + index share",
        ),
        (
            "slot",
            f.slot,
            "  table slot (connection, generation, list links, timer)",
        ),
        (
            "connection",
            f.connection,
            "    of which the connection's own state",
        ),
        (
            "sender_state",
            f.sender_state,
            "pooled while sending: sender state, all paths",
        ),
        (
            "path_telemetry",
            f.path_telemetry,
            "  of which one path's telemetry",
        ),
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

/// Bytes per connection and per pooled element, from `size_of`; the
/// whole storage of a 65,536-connection endpoint.
pub fn memory_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let f16 = Endpoint::<Heap, 16>::footprint();
    rows.push(Row::new(
        "bytes_per_idle_connection_paths_16",
        f16.idle_connection as f64,
        "B",
        "an idle established 16-path connection (goal <= 512)",
    ));
    let layout = Layout::for_connections(65_536);
    rows.push(Row::new(
        "endpoint_bytes_conns_65536",
        layout.bytes::<16>() as f64,
        "B",
        format!(
            "endpoint of 65,536 connections, 16 paths: table, index and pools \
             ({} work entries, {} receives, {} senders, {} in-flight records, {} regions)",
            layout.work_entries,
            layout.recv_entries,
            layout.senders,
            layout.inflight_records,
            layout.regions
        ),
    ));
    footprint_rows(16, f16, &mut rows);
    footprint_rows(1, Endpoint::<Heap, 1>::footprint(), &mut rows);
    footprint_rows(256, Endpoint::<Heap, 256>::footprint(), &mut rows);
    rows.extend(long_haul_rows(&f16));
    for (name, bytes, label) in [
        (
            "work_entry_bytes",
            f16.work_entry,
            "pooled send-queue entry",
        ),
        ("recv_entry_bytes", f16.recv_entry, "pooled receive"),
        (
            "inflight_record_bytes",
            f16.inflight_record,
            "in-flight packet record, allocator share included",
        ),
    ] {
        rows.push(Row::new(name, bytes as f64, "B", label));
    }
    rows
}

/// Pool bytes one long-haul connection needs: the sender's
/// in-flight records and the receiver's out-of-order bitmap for a window
/// of 3 bandwidth-delay products in 4 KiB packets (what keeps the line
/// busy while a loss is repaired, spec 4.4), capped at the 65,536-PSN
/// maximum; each rounded up to the power of two the pools hand out.
pub fn long_haul_rows(f: &Footprint) -> Vec<Row> {
    let mut rows = Vec::new();
    for (gbps, rtt_ms) in [(100u64, 10u64), (25, 10)] {
        let bdp_packets = (gbps * 1_000_000_000 / 8 * rtt_ms / 1000).div_ceil(4096);
        let window = (3 * bdp_packets).min(u64::from(metaroce_core::config::MAX_WINDOW)) as u32;
        let (records, words) = Layout::per_connection_window(window);
        let sender = records as usize * f.inflight_record;
        let receiver = words as usize * f.reorder_word;
        let tag = format!("{gbps}g_{rtt_ms}ms");
        rows.push(Row::new(
            format!("long_haul_window_psns_{tag}"),
            f64::from(window),
            "count",
            format!(
                "window for {gbps} Gbit/s x {rtt_ms} ms: 3 BDPs of 4 KiB ({bdp_packets} packets \
                 per round trip), at most 65,536"
            ),
        ));
        rows.push(Row::new(
            format!("long_haul_pool_bytes_{tag}"),
            (sender + receiver) as f64,
            "B",
            format!(
                "pool bytes one {gbps} Gbit/s x {rtt_ms} ms connection needs: {records} in-flight \
                 records ({sender} B) + {words} bitmap words ({receiver} B)"
            ),
        ));
    }
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
            let idle = get(&format!("conn_p{p}_idle_connection_bytes")).expect("idle");
            let slot = get(&format!("conn_p{p}_slot_bytes")).expect("slot");
            assert_eq!(idle, slot + 8.0, "slot plus two index entries");
        }
        assert!(get("bytes_per_idle_connection_paths_16").expect("row") <= 512.0);
        // 100 Gbit/s x 10 ms: 65,536 PSNs, 12-byte records + bitmap.
        assert_eq!(get("long_haul_window_psns_100g_10ms"), Some(65_536.0));
        let pool = get("long_haul_pool_bytes_100g_10ms").expect("row");
        let f = Endpoint::<Heap, 16>::footprint();
        assert_eq!(
            pool,
            (65_536 * f.inflight_record + 1024 * f.reorder_word) as f64
        );
    }

    #[test]
    fn csv_has_one_line_per_row() {
        let rows = vec![Row::new("a", 1.5, "ns", "A"), Row::new("b", 2.0, "B", "B")];
        assert_eq!(csv(&rows), "metric,value,unit\na,1.5,ns\nb,2,B\n");
        assert_eq!(table(&rows).lines().count(), 2);
    }

    #[test]
    fn best_takes_the_minimum_per_clock() {
        let a = Sample {
            wall_ns: 5.0,
            cpu_ns: Some(3.0),
        };
        let b = Sample {
            wall_ns: 4.0,
            cpu_ns: Some(3.5),
        };
        let m = best(&[a, b]);
        assert_eq!((m.wall_ns, m.cpu_ns), (4.0, Some(3.0)));
        assert_eq!(m.ns(), 3.0);
        let no_cpu = Sample {
            wall_ns: 1.0,
            cpu_ns: None,
        };
        assert_eq!(best(&[a, no_cpu]).ns(), 1.0);
    }
}
