//! `cargo xtask test`: every check and test of the project, in order,
//! stopping at the first failure.
//!
//! The steps are the list [`STEPS`]; each prints a header, its commands and
//! its duration. Steps that run tests add their counts to the run's
//! [`Tally`], printed at the end as `N passed, N failed, N skipped` alone
//! on a line (the line CI reads).
//!
//! A test that cannot run here (not root, no network namespaces, a tool
//! missing) is counted as skipped, never as passed, and its reason is
//! printed above the closing line. Such a test returns early and, when the
//! environment variable [`SKIP_LOG_VAR`] names a file, appends one line
//! `test name: reason` to it; [`SkipLog`] sets the variable for one cargo
//! run and moves that many tests from passed to skipped. A whole step that
//! cannot run calls [`Context::skip`].
//!
//! To add a step: write `fn my_step(ctx: &mut Context) -> Result<(), Error>`,
//! ideally calling into the module that owns the feature, and add a
//! [`Step`] to [`STEPS`] where it belongs in the order (cheap checks first,
//! slow runs last). If it runs tests, add their counts to `ctx.tally`.
//! `cargo xtask test STEP...` runs only the named steps; `--list` lists them.

use std::path::PathBuf;
use std::process::Command;
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
        what: "host tests (default members): cargo test --no-fail-fast (the netns_* tests run in host-netns)",
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
        name: "elba-twin",
        what: "the Elba image and drivers under QEMU virt standing in for it (GICv3, EL2, PSCI by smc, 16 cores, U-Boot FIT): two twins in the host role running the main job's workload for host processes through metaroce-verbs over their [host_interface]; two twins, every core sending and receiving; both through a stand-in NIC (steering, 1% loss, doorbell SPI), integrity checked",
        run: crate::image::elba_twin_step,
    },
    Step {
        name: "compliance-qemu",
        what: "compliance suite against the qemu-virt firmware's serve role through the harness gateway (cargo xtask compliance --target qemu), and its host-interface (quota) cases against two nodes in the host role (--target qemu-devices)",
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
    /// Tests (or whole steps) that could not run here; their reasons are in
    /// [`Context::skips`].
    pub skipped: u64,
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

    /// Moves `n` tests that libtest counted as passed (they returned early)
    /// to skipped.
    pub fn reclassify_skipped(&mut self, n: u64) {
        let n = n.min(self.passed);
        self.passed -= n;
        self.skipped += n;
    }
}

/// The environment variable naming the file a skipping test appends its
/// `name: reason` line to. Unset when the tests run by hand: they then
/// only print the reason.
pub const SKIP_LOG_VAR: &str = "METAROCE_SKIP_LOG";

/// The skip log of one cargo run: a fresh file under `target/metaroce/`,
/// named to the tests through [`SKIP_LOG_VAR`].
#[derive(Debug)]
pub struct SkipLog {
    path: PathBuf,
}

impl SkipLog {
    /// A new, empty log for the run called `label`.
    pub fn new(label: &str) -> Result<SkipLog, Error> {
        let dir = util::target_dir().join("metaroce").join("skips");
        std::fs::create_dir_all(&dir).map_err(|e| Error::new(format!("{}: {e}", dir.display())))?;
        let path = dir.join(format!("{label}-{}.log", std::process::id()));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::new(format!("{}: {e}", path.display())))
            }
            _ => {}
        }
        Ok(SkipLog { path })
    }

    /// Names the log to the tests `cmd` runs.
    pub fn attach(&self, cmd: &mut Command) {
        cmd.env(SKIP_LOG_VAR, &self.path);
    }

    /// The `name: reason` lines the tests wrote (none if none skipped).
    pub fn reasons(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .map(|text| parse_skip_log(&text))
            .unwrap_or_default()
    }

    /// Moves the tests that skipped from `tally`'s passed to its skipped
    /// and records their reasons in `ctx`; removes the log.
    pub fn settle(self, tally: &mut Tally, ctx: &mut Context) {
        let reasons = self.reasons();
        tally.reclassify_skipped(reasons.len() as u64);
        ctx.skips.extend(reasons);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The non-empty lines of a skip log.
fn parse_skip_log(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// State shared by the steps of one run.
#[derive(Debug, Default)]
pub struct Context {
    pub tally: Tally,
    /// Whether any step ran tests (so the totals line means something).
    pub ran_tests: bool,
    /// Why each skipped test or step did not run, one `name: reason` each.
    pub skips: Vec<String>,
}

impl Context {
    /// Counts `what` (a step or a test) as skipped, with the reason.
    pub fn skip(&mut self, what: &str, why: &str) {
        println!("SKIPPED {what}: {why}");
        self.tally.skipped += 1;
        self.skips.push(format!("{what}: {why}"));
        self.ran_tests = true;
    }

    /// Adds the counts of one step's tests.
    pub fn add(&mut self, tally: Tally) {
        self.tally.passed += tally.passed;
        self.tally.failed += tally.failed;
        self.tally.skipped += tally.skipped;
        self.ran_tests = true;
    }
}

/// Entry point: `cargo xtask test [--list] [STEP...]`.
pub fn run(args: &[String]) -> Result<(), Error> {
    if args.iter().any(|a| a == "--list") {
        for step in STEPS {
            println!("{:<15} {}", step.name, step.what);
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
        println!("  {name:<15} {status:<7} {}", util::fmt_duration(*took));
    }
    println!(
        "  {:<15} {:<7} {}",
        "total",
        "",
        util::fmt_duration(started.elapsed())
    );
    if !ctx.skips.is_empty() {
        println!("skipped (could not run here):");
        for why in &ctx.skips {
            println!("  {why}");
        }
    }
    if ctx.ran_tests {
        println!("{}", closing_line(&ctx.tally));
    }
    match failure {
        Some((name, e)) => Err(Error::new(format!("step `{name}` failed: {e}"))),
        None => Ok(()),
    }
}

/// The run's last line, the one CI reads.
fn closing_line(t: &Tally) -> String {
    format!(
        "{} passed, {} failed, {} skipped",
        t.passed, t.failed, t.skipped
    )
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
/// The network-namespace tests (`host/tests/netns.rs`, every one named
/// `netns_*`) are left to the `host-netns` step, which runs them as root
/// with their output shown; here libtest filters them out, so they are
/// neither run twice nor counted as skipped.
fn test_host(ctx: &mut Context) -> Result<(), Error> {
    let mut tally = Tally::default();
    let skips = SkipLog::new("test-host")?;
    let mut command = util::cargo(["test", "--no-fail-fast", "--", "--skip", "netns_"]);
    skips.attach(&mut command);
    let ok = util::run_streaming(&mut command, |line| {
        tally.add_libtest_line(line);
    })?;
    skips.settle(&mut tally, ctx);
    ctx.add(tally);
    println!(
        "host tests: {} passed, {} failed, {} skipped",
        tally.passed, tally.failed, tally.skipped
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
                failed: 2,
                skipped: 0
            }
        );
    }

    #[test]
    fn skipped_tests_leave_passed_for_skipped() {
        let mut t = Tally {
            passed: 10,
            failed: 1,
            skipped: 0,
        };
        t.reclassify_skipped(3);
        assert_eq!((t.passed, t.failed, t.skipped), (7, 1, 3));
        // A log longer than the passed count (a test that wrote twice)
        // never makes the counts wrap.
        t.reclassify_skipped(100);
        assert_eq!((t.passed, t.failed, t.skipped), (0, 1, 10));
        assert_eq!(closing_line(&t), "0 passed, 1 failed, 10 skipped");
    }

    #[test]
    fn skip_log_lines_are_read_back_and_settled() {
        assert_eq!(
            parse_skip_log("netns_a: not root\n\n  ipv6: no loopback  \n"),
            ["netns_a: not root", "ipv6: no loopback"]
        );
        let log = SkipLog::new("xtask-unit-test").unwrap();
        let mut cmd = Command::new("true");
        log.attach(&mut cmd);
        let path = cmd
            .get_envs()
            .find(|(k, _)| *k == SKIP_LOG_VAR)
            .and_then(|(_, v)| v)
            .map(PathBuf::from)
            .unwrap();
        std::fs::write(&path, "t1: why one\nt2: why two\n").unwrap();
        let mut tally = Tally {
            passed: 5,
            ..Tally::default()
        };
        let mut ctx = Context::default();
        log.settle(&mut tally, &mut ctx);
        assert_eq!((tally.passed, tally.skipped), (3, 2));
        assert_eq!(ctx.skips, ["t1: why one", "t2: why two"]);
        assert!(!path.exists());
        ctx.add(tally);
        ctx.skip("host-netns", "not running as root");
        assert_eq!(ctx.tally.skipped, 3);
        assert_eq!(ctx.skips.len(), 3);
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
