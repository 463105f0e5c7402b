//! `cargo xtask bench`: the engine benchmark.
//!
//! Runs `metaroce-bench` in release: ns per 4 KiB data packet for the full
//! TX → RX → ACK cycle between two endpoints in one process, the same
//! without the software CRC-32, one 4 KiB memcpy measured in the same run
//! and the ratio of the two, and bytes per connection. It prints a table
//! and writes `target/metaroce/bench.csv` (`metric,value,unit`).
//!
//! `--firmware` measures the firmware's CRC per packet instead
//! (`firmware.rs`), `--host` the host tool against iperf3 (`host_bench.rs`),
//! `--fabric` the libfabric provider beside libfabric's tcp and udp
//! (`fabric.rs`).
//! `--simd-crc` builds the bench with crc32fast's run-time SIMD detection;
//! every other argument goes to the binary (`cargo xtask bench -- --help`).
//! Not part of `cargo xtask test`: timings are not pass/fail.

use crate::util::{self, Error};

/// Entry point: `cargo xtask bench [--simd-crc] [BENCH ARGS]`.
pub fn run(args: &[String]) -> Result<(), Error> {
    if args.iter().any(|a| a == "--firmware") {
        return crate::firmware::bench();
    }
    if args.iter().any(|a| a == "--fabric") {
        return crate::fabric::bench();
    }
    if args.iter().any(|a| a == "--host") {
        return crate::host_bench::run();
    }
    let csv = util::project_root()
        .join("target")
        .join("metaroce")
        .join("bench.csv");
    let mut cargo_args: Vec<String> = ["run", "--release", "--package", "metaroce-bench"]
        .map(String::from)
        .to_vec();
    if args.iter().any(|a| a == "--simd-crc") {
        cargo_args.extend(["--features".into(), "simd-crc".into()]);
    }
    cargo_args.push("--".into());
    let bench_args: Vec<&String> = args
        .iter()
        .filter(|a| *a != "--" && *a != "--simd-crc")
        .collect();
    if !bench_args.iter().any(|a| *a == "--csv") {
        cargo_args.extend(["--csv".into(), csv.display().to_string()]);
    }
    cargo_args.extend(bench_args.into_iter().cloned());
    util::run(&mut util::cargo(cargo_args))
}
