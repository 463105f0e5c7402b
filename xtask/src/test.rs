//! `cargo xtask test`: every check and test of the project, in order,
//! stopping at the first failure.
//!
//! The steps are the list [`STEPS`]; each prints a header, its commands and
//! its duration. Steps that run tests add their counts to the run's
//! [`Tally`], printed at the end as `N passed, N failed` alone on a line
//! (the line CI reads).
//!
//! To add a step (a later issue's QEMU runs, simulator checks, image
//! checks): write `fn my_step(ctx: &mut Context) -> Result<(), Error>`,
//! ideally calling into the module that owns the feature, and add a
//! [`Step`] to [`STEPS`] where it belongs in the order (cheap checks first,
//! slow runs last). If it runs tests, add their counts to `ctx.tally`.
//! `cargo xtask test STEP...` runs only the named steps; `--list` lists them.

use std::time::{Duration, Instant};

use crate::project::{FIRMWARE_TARGET, NO_STD_CRATES};
use crate::util::{self, Error};
use crate::{no_alloc, tidy};

/// One step of `cargo xtask test`.
#[derive(Debug)]
pub struct Step {
    /// Short name, used on the command line and in the summary.
    pub name: &'static str,
    /// What it checks, in one line.
    pub what: &'static str,
    pub run: fn(&mut Context) -> Result<(), Error>,
}

/// Every step, in the order they run.
pub const STEPS: &[Step] = &[
    Step {
        name: "toolchain",
        what: "targets and components of rust-toolchain.toml installed (rustup adds what is missing)",
        run: crate::toolchain::test_step,
    },
    Step {
        name: "fmt",
        what: "formatting: cargo fmt --all -- --check",
        run: fmt,
    },
    Step {
        name: "tidy",
        what: "source rules: no unsafe/alloc in the core, no todo!/unimplemented!/#[ignore]",
        run: tidy_step,
    },
    Step {
        name: "clippy-host",
        what: "lints on the host (default members): cargo clippy --all-targets -- -D warnings",
        run: clippy_host,
    },
    Step {
        name: "clippy-no-std",
        what: "lints of the no_std crates for aarch64-unknown-none (the core also with packet protection, feature aead)",
        run: clippy_no_std,
    },
    Step {
        name: "test-host",
        what: "host tests (default members): cargo test --no-fail-fast",
        run: test_host,
    },
    Step {
        name: "no-alloc",
        what: "release build of the core for aarch64-unknown-none, no allocator linked",
        run: no_alloc_step,
    },
    Step {
        name: "host-netns",
        what: "metaroce serve/bench in two network namespaces: nftables 0/1/10% loss + CE, 100,000-CONNECT flood from 1,000 addresses, 3.5/9 s blackouts, loss bursts from the handshake on; integrity checked",
        run: crate::compliance::netns_step,
    },
    Step {
        name: "fabric",
        what: "libfabric provider metaroce: clippy + unit tests, fi_info, fi_pingpong rdm (msg/tagged, -c, 8 B-1 MiB), C tests (RMA, tagged, errors, threads), Open MPI ofi MTL -np 2/4 (+1% nftables loss)",
        run: crate::fabric::test_step,
    },
    Step {
        name: "compliance",
        what: "compliance suite against metaroce serve on loopback, 1 and 2 engine threads (cargo xtask compliance --target host, host-threads)",
        run: crate::compliance::compliance_step,
    },
    Step {
        name: "wireshark",
        what: "tshark with tools/wireshark/metaroce.lua decodes a capture of the suite as the core does",
        run: crate::compliance::wireshark_step,
    },
    Step {
        name: "qemu-firmware",
        what: "lints and builds the qemu-virt firmware for its CPU (release): size and where it goes, crc32x present",
        run: crate::qemu::firmware_step,
    },
    Step {
        name: "elba-host",
        what: "pensando-elba: 16550 driver, shared-memory rings and board.toml tested on the host; firmware linted",
        run: crate::image::elba_host_step,
    },
    Step {
        name: "images",
        what: "FIT images (pensando-elba, qemu-virt): dumpimage load/entry == board addresses, no allocator symbol, code within 128 KiB",
        run: crate::image::test_step,
    },
    Step {
        name: "uboot-qemu",
        what: "the qemu-virt FIT booted by U-Boot (QEMU virt, EL2): TFTP, bootm, sha256 checked, firmware banner",
        run: crate::image::uboot_qemu_step,
    },
    Step {
        name: "compliance-qemu",
        what: "compliance suite against the qemu-virt firmware's serve role through the harness gateway (cargo xtask compliance --target qemu)",
        run: crate::compliance::compliance_qemu_step,
    },
    Step {
        name: "host-abi",
        what: "C example (system cc, committed headers, libmetaroce_verbs.a) drives two QEMU DPUs through the shared-memory host interface: WRITE, READ back, SEND, WRITE_IMM, bad requests",
        run: crate::qemu::host_abi_step,
    },
    Step {
        name: "fabric-qemu",
        what: "libfabric fi_pingpong (plain, tagged, -c, 8 B..1 MiB) between two QEMU DPUs through the provider's DPU backend (FI_METAROCE_DEVICE), 1 % loss",
        run: crate::qemu::fabric_step,
    },
    Step {
        name: "qemu-runs",
        what: "QEMU runs: 0/5/20% loss with reorder+dup, ECN marking, 3-node incast; integrity checked",
        run: crate::qemu::runs_step,
    },
    Step {
        name: "qemu-longhaul",
        what: "QEMU run of 2 nodes 5 ms apart (10 ms round trip), 1% loss: integrity, and one connection with more than 256 PSNs outstanding (windows beyond one SACK bitvector)",
        run: crate::qemu::longhaul_step,
    },
    Step {
        name: "qemu-multicore",
        what: "QEMU runs of 2 nodes x 4 cores (one engine per core, core 0 steering frames), 2/10% loss + reorder + dup; integrity, every core's traffic, one owner per connection",
        run: crate::qemu::multicore_step,
    },
];

/// Test counts summed over every step that runs tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
}

impl Tally {
    /// Adds the counts of one libtest `test result:` line, if it is one.
    pub fn add_libtest_line(&mut self, line: &str) -> bool {
        let Some(rest) = line.trim().strip_prefix("test result:") else {
            return false;
        };
        let count = |label: &str| {
            // Parts look like `ok. 12 passed` and ` 0 failed`.
            rest.split(';').find_map(|part| {
                let number = part.trim().strip_suffix(label)?.split_whitespace().last()?;
                number.parse::<u64>().ok()
            })
        };
        match (count(" passed"), count(" failed")) {
            (Some(passed), Some(failed)) => {
                self.passed += passed;
                self.failed += failed;
                true
            }
            _ => false,
        }
    }
}

/// State shared by the steps of one run.
#[derive(Debug, Default)]
pub struct Context {
    pub tally: Tally,
    /// Whether any step ran tests (so the totals line means something).
    pub ran_tests: bool,
}

/// Entry point: `cargo xtask test [--list] [STEP...]`.
pub fn run(args: &[String]) -> Result<(), Error> {
    if args.iter().any(|a| a == "--list") {
        for step in STEPS {
            println!("{:<14} {}", step.name, step.what);
        }
        return Ok(());
    }
    if let Some(flag) = args.iter().find(|a| a.starts_with('-')) {
        return Err(Error::new(format!(
            "unknown flag `{flag}`; usage: cargo xtask test [--list] [STEP...]"
        )));
    }
    let selected = select_steps(args)?;
    let mut ctx = Context::default();
    let mut done: Vec<(&str, Duration, bool)> = Vec::new();
    let started = Instant::now();
    let count = selected.len();
    let mut failure = None;
    for (i, step) in selected.into_iter().enumerate() {
        println!("\n==> [{}/{count}] {}: {}", i + 1, step.name, step.what);
        let step_started = Instant::now();
        let result = (step.run)(&mut ctx);
        let took = step_started.elapsed();
        let ok = result.is_ok();
        println!(
            "<== {} {} ({})",
            step.name,
            if ok { "ok" } else { "FAILED" },
            util::fmt_duration(took)
        );
        done.push((step.name, took, ok));
        if let Err(e) = result {
            failure = Some((step.name, e));
            break;
        }
    }
    println!("\n== summary");
    for (name, took, ok) in &done {
        let status = if *ok { "ok" } else { "FAILED" };
        println!("  {name:<14} {status:<7} {}", util::fmt_duration(*took));
    }
    println!(
        "  {:<14} {:<7} {}",
        "total",
        "",
        util::fmt_duration(started.elapsed())
    );
    if ctx.ran_tests {
        println!("{} passed, {} failed", ctx.tally.passed, ctx.tally.failed);
    }
    match failure {
        Some((name, e)) => Err(Error::new(format!("step `{name}` failed: {e}"))),
        None => Ok(()),
    }
}

fn select_steps(names: &[String]) -> Result<Vec<&'static Step>, Error> {
    if names.is_empty() {
        return Ok(STEPS.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            STEPS.iter().find(|s| s.name == name).ok_or_else(|| {
                let all: Vec<&str> = STEPS.iter().map(|s| s.name).collect();
                Error::new(format!("no step `{name}`; steps: {}", all.join(", ")))
            })
        })
        .collect()
}

fn fmt(_: &mut Context) -> Result<(), Error> {
    util::run(&mut util::cargo(["fmt", "--all", "--", "--check"]))
}

fn tidy_step(_: &mut Context) -> Result<(), Error> {
    tidy::run()
}

/// Host lints. No `--workspace`: cargo then lints the workspace's
/// `default-members`, which are the host crates; firmware crates are members
/// outside `default-members` and are linted for their own target.
fn clippy_host(_: &mut Context) -> Result<(), Error> {
    util::run(&mut util::cargo([
        "clippy",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
}

/// The library code of each no_std crate, linted as the firmware sees it
/// (`--all-targets` would add test code, which needs `std`).
fn clippy_no_std(_: &mut Context) -> Result<(), Error> {
    let mut args: Vec<&str> = vec!["clippy", "--target", FIRMWARE_TARGET];
    for krate in NO_STD_CRATES {
        args.extend(["-p", krate]);
    }
    args.extend(["--", "-D", "warnings"]);
    util::run(&mut util::cargo(args))?;
    // Packet protection (spec 5.3) is off in firmware but must build and
    // lint for the firmware target too, ready for a board that turns it on.
    util::run(&mut util::cargo([
        "clippy",
        "--target",
        FIRMWARE_TARGET,
        "-p",
        "metaroce-core",
        "--features",
        "aead",
        "--",
        "-D",
        "warnings",
    ]))
}

/// Host tests of the default members. `--no-fail-fast` so that the totals
/// cover every test binary even when one fails; the step still fails then.
fn test_host(ctx: &mut Context) -> Result<(), Error> {
    let mut tally = Tally::default();
    let ok = util::run_streaming(&mut util::cargo(["test", "--no-fail-fast"]), |line| {
        tally.add_libtest_line(line);
    })?;
    ctx.tally.passed += tally.passed;
    ctx.tally.failed += tally.failed;
    ctx.ran_tests = true;
    println!(
        "host tests: {} passed, {} failed",
        tally.passed, tally.failed
    );
    match (ok, tally.failed) {
        (true, 0) => Ok(()),
        (_, 0) => Err(Error::new(
            "cargo test failed without a failing test (a build error or a crashed test binary; see above)",
        )),
        (_, failed) => Err(Error::new(format!("{failed} host test(s) failed"))),
    }
}

fn no_alloc_step(_: &mut Context) -> Result<(), Error> {
    no_alloc::run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_result_lines_are_summed() {
        let mut t = Tally::default();
        assert!(t.add_libtest_line(
            "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s"
        ));
        assert!(t.add_libtest_line(
            "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.20s"
        ));
        assert!(!t.add_libtest_line("test wire::tests::parse ... ok"));
        assert!(!t.add_libtest_line("running 12 tests"));
        assert_eq!(
            t,
            Tally {
                passed: 15,
                failed: 2
            }
        );
    }

    #[test]
    fn step_names_are_unique_and_selectable() {
        let mut names: Vec<&str> = STEPS.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), STEPS.len());
        let picked = select_steps(&["no-alloc".to_string(), "fmt".to_string()]).unwrap();
        assert_eq!(picked[0].name, "no-alloc");
        assert_eq!(picked[1].name, "fmt");
        assert!(select_steps(&["nope".to_string()]).is_err());
        assert_eq!(select_steps(&[]).unwrap().len(), STEPS.len());
    }
}
