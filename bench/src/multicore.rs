//! Packets per second of sharded engines on host threads: the workload of
//! the `cycle_*` rows (TX -> RX -> ACK per 4 KiB WRITE between two
//! endpoints, payload never copied, software CRC-32), with each thread
//! running its own pair of endpoints that are shards of one connection
//! table (`Endpoint::new_shard`, ids naming their shard) and its own
//! connections, as `metaroce serve --threads N` and the firmware's cores
//! do. Nothing is shared between the threads but a start barrier, so the
//! figure is what sharding gives when steering costs nothing (a NIC that
//! steers, or peers that send to each thread's own port).
//!
//! The rate is every thread's data packets over the wall time from the
//! common start to the last thread's end. Wall time includes waiting for
//! a core while other programs run: on a shared machine the figure for 2
//! threads suffers first, so the busiest thread's on-CPU time is reported
//! too (what the rate would be if each thread had a core to itself).

use std::sync::Barrier;
use std::time::{Duration, Instant as WallClock};

use metaroce_core::Shard;

use crate::measure::{cpu_time, Row};
use crate::{BenchError, Pair};

/// Connections each thread's pair holds, all sending.
pub const SHARD_CONNECTIONS: u32 = 4;

/// One timed run over `threads` threads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MulticoreSample {
    pub threads: usize,
    /// Data packets of every thread.
    pub packets: u64,
    /// From the common start to the last thread's end.
    pub wall: Duration,
    /// The most on-CPU time one thread spent (Linux), if known.
    pub busiest_cpu: Option<Duration>,
}

impl MulticoreSample {
    /// Millions of data packets per second of wall time.
    pub fn mpps(&self) -> f64 {
        self.packets as f64 / self.wall.as_secs_f64().max(1e-9) / 1e6
    }

    /// Millions of data packets per second of the busiest thread's on-CPU
    /// time: the rate with a core per thread and nothing else running.
    pub fn cpu_mpps(&self) -> Option<f64> {
        self.busiest_cpu
            .map(|c| self.packets as f64 / c.as_secs_f64().max(1e-9) / 1e6)
    }
}

/// What one thread did in a run.
struct ThreadRun {
    packets: u64,
    start: WallClock,
    end: WallClock,
    cpu: Option<Duration>,
}

/// `threads` threads, each with its own shard pair of
/// [`SHARD_CONNECTIONS`] connections, each moving `messages` WRITEs after
/// a warm-up; they start together.
pub fn run(threads: usize, messages: u64) -> Result<MulticoreSample, BenchError> {
    let threads = threads.max(1);
    let table = SHARD_CONNECTIONS * threads as u32;
    let start = Barrier::new(threads);
    let results: Vec<Result<ThreadRun, BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    let shard = Shard::nth(t as u32, threads as u32, table);
                    // Built on its own thread: its memory is that thread's.
                    let pair = Pair::shard(SHARD_CONNECTIONS, SHARD_CONNECTIONS, shard);
                    let warm = pair.and_then(|mut p| {
                        p.run_writes((messages / 10).max(1), None)?;
                        Ok(p)
                    });
                    // Every thread reaches the barrier, failed or not.
                    start.wait();
                    let mut pair = warm?;
                    let cpu_before = cpu_time();
                    let begun = WallClock::now();
                    let counts = pair.run_writes(messages, None)?;
                    let end = WallClock::now();
                    let cpu = cpu_time()
                        .zip(cpu_before)
                        .map(|(after, before)| after.saturating_sub(before));
                    Ok(ThreadRun {
                        packets: counts.data_packets,
                        start: begun,
                        end,
                        cpu,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(BenchError::Stalled)))
            .collect()
    });
    let runs = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    let first = runs.iter().map(|r| r.start).min();
    let last = runs.iter().map(|r| r.end).max();
    let wall = match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    };
    let busiest_cpu = runs
        .iter()
        .map(|r| r.cpu)
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().max());
    Ok(MulticoreSample {
        threads,
        packets: runs.iter().map(|r| r.packets).sum(),
        wall,
        busiest_cpu,
    })
}

fn best(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(0.0, f64::max)
}

fn worst(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The `multicore_*` rows: 1 and 2 threads, `repeats` runs of each,
/// taken in turns (so both see the same machine load), `messages` WRITEs
/// per thread and run.
pub fn rows(messages: u64, repeats: u32) -> Result<Vec<Row>, BenchError> {
    let mut one = Vec::new();
    let mut two = Vec::new();
    let mut speedups = Vec::new();
    let mut cpu_one = Vec::new();
    let mut cpu_two = Vec::new();
    for _ in 0..repeats.max(1) {
        let a = run(1, messages)?;
        let b = run(2, messages)?;
        one.push(a.mpps());
        two.push(b.mpps());
        speedups.push(b.mpps() / a.mpps().max(1e-9));
        if let (Some(x), Some(y)) = (a.cpu_mpps(), b.cpu_mpps()) {
            cpu_one.push(x);
            cpu_two.push(y);
        }
    }
    let n = one.len();
    let mut rows = vec![
        Row::new(
            "multicore_mpps_cores_1",
            best(&one),
            "Mpps",
            format!(
                "sharded engine pairs on 1 thread: 4 KiB TX -> RX -> ACK, {SHARD_CONNECTIONS} connections per thread (wall, best of {n})"
            ),
        ),
        Row::new(
            "multicore_mpps_cores_2",
            best(&two),
            "Mpps",
            "  the same on 2 threads, one shard each (wall, best)",
        ),
        Row::new(
            "multicore_speedup_2_to_1",
            best(&two) / best(&one).max(1e-9),
            "ratio",
            "  2 threads / 1 thread, best rates (goal >= 1.8)",
        ),
        Row::new(
            "multicore_speedup_2_to_1_worst",
            worst(&speedups),
            "ratio",
            format!("  the lowest of the {n} paired runs (machine load shows here)"),
        ),
    ];
    if cpu_one.len() == n {
        rows.push(Row::new(
            "multicore_cpu_speedup_2_to_1",
            best(&cpu_two) / best(&cpu_one).max(1e-9),
            "ratio",
            "  the same over the busiest thread's on-CPU time (a core per thread)",
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_moves_its_packets() {
        let one = run(1, 200).expect("one thread");
        assert_eq!(one.packets, 200);
        let two = run(2, 200).expect("two threads");
        assert_eq!(two.packets, 400, "each thread its own 200");
        assert!(two.wall > Duration::ZERO);
    }

    #[test]
    fn shard_pairs_hand_out_ids_of_their_shard() {
        let shard = Shard::nth(1, 2, 2 * SHARD_CONNECTIONS);
        let pair = Pair::shard(SHARD_CONNECTIONS, SHARD_CONNECTIONS, shard).expect("pair");
        let (sender, receiver) = pair.endpoints();
        for ep in [sender, receiver] {
            let handles: Vec<_> = ep.handles().collect();
            assert_eq!(handles.len(), SHARD_CONNECTIONS as usize);
            for h in handles {
                assert_eq!(
                    Shard::owner(h.index, 2, 2 * SHARD_CONNECTIONS),
                    1,
                    "{h:?} outside shard 1"
                );
            }
        }
    }
}
