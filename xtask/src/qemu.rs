//! `cargo xtask qemu`: the project's main job, and the QEMU steps of
//! `cargo xtask test`.
//!
//! It builds the `board-qemu-virt` firmware for `aarch64-unknown-none`
//! (release, defmt at `info`), makes sure `qemu-system-aarch64` is there
//! (`apt-get install qemu-system-arm` as root, else the command to run),
//! and runs the `metaroce-qemu` harness: two nodes exchanging a mixed RDMA
//! workload through an emulated fabric with 1 % loss, reordering and ECN
//! marking by default, the workload run by one host process per node
//! (`metaroce-host-app`) through the host library over the node's
//! shared-memory host interface (ivshmem). Every argument goes to the harness
//! (`cargo xtask qemu -- --help` lists them: nodes, loss, delay, rate,
//! workload, duration, pcap, ...).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::project::FIRMWARE_TARGET;
use crate::system;
use crate::test::Context;
use crate::util::{self, Error};

const BOARD: &str = "board-qemu-virt";
const HARNESS: &str = "metaroce-qemu";

/// Entry point: `cargo xtask qemu [HARNESS ARGS]`.
pub fn run(args: &[String]) -> Result<(), Error> {
    let elf = build_firmware()?;
    ensure_qemu()?;
    let mut harness_args: Vec<String> = args.iter().filter(|a| *a != "--").cloned().collect();
    if !harness_args
        .iter()
        .any(|a| a == "--pcap" || a.starts_with("--pcap="))
    {
        harness_args.extend([
            "--pcap".into(),
            out_dir().join("fabric.pcap").display().to_string(),
        ]);
    }
    if !harness_args
        .iter()
        .any(|a| a == "--out-dir" || a.starts_with("--out-dir="))
    {
        harness_args.extend(["--out-dir".into(), out_dir().display().to_string()]);
    }
    let status = harness(&elf, &harness_args)?
        .status()
        .map_err(|e| Error::new(format!("running the harness: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::new("the QEMU run failed (see the summary above)"))
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| util::project_root().join("target"))
}

fn out_dir() -> PathBuf {
    target_dir().join("qemu-run")
}

/// Builds the firmware; returns the ELF.
pub fn build_firmware() -> Result<PathBuf, Error> {
    let mut cmd = util::cargo([
        "build",
        "--release",
        "-p",
        BOARD,
        "--target",
        FIRMWARE_TARGET,
    ]);
    cmd.env("DEFMT_LOG", "info");
    util::run(&mut cmd)?;
    Ok(target_dir()
        .join(FIRMWARE_TARGET)
        .join("release")
        .join(BOARD))
}

/// Installs QEMU if missing (as root), else says how.
pub fn ensure_qemu() -> Result<(), Error> {
    system::ensure_system_packages(&[("qemu-system-aarch64", "qemu-system-arm")])
}

/// The harness command (built by cargo in the dev profile, which is
/// quick), after building its host program (`metaroce-host-app`, which the
/// harness starts once per emulated DPU).
fn harness(elf: &std::path::Path, args: &[String]) -> Result<Command, Error> {
    util::run(&mut util::cargo([
        "build", "--quiet", "-p", HARNESS, "--bins",
    ]))?;
    let mut cmd = util::cargo([
        "run", "--quiet", "-p", HARNESS, "--bin", HARNESS, "--", "--elf",
    ]);
    cmd.arg(elf).args(args);
    Ok(cmd)
}

/// `llvm-size` of the firmware, if the toolchain has it.
fn text_size(elf: &std::path::Path) -> Option<String> {
    let sysroot = util::output(Command::new("rustc").args(["--print", "sysroot"])).ok()?;
    let host = util::output(Command::new("rustc").args(["--print", "host-tuple"])).ok()?;
    let tool = PathBuf::from(sysroot.trim())
        .join("lib/rustlib")
        .join(host.trim())
        .join("bin/llvm-size");
    let out = util::output(Command::new(tool).arg(elf)).ok()?;
    let text = out.lines().nth(1)?.split_whitespace().next()?.to_owned();
    Some(text)
}

/// Test step `qemu-firmware`: lints and builds the firmware, reports its size.
pub fn firmware_step(_: &mut Context) -> Result<(), Error> {
    util::run(&mut util::cargo([
        "clippy",
        "--release",
        "-p",
        BOARD,
        "-p",
        "metaroce-platform",
        "--features",
        "metaroce-platform/virtio",
        "--target",
        FIRMWARE_TARGET,
        "--",
        "-D",
        "warnings",
    ]))?;
    let elf = build_firmware()?;
    if let Some(text) = text_size(&elf) {
        println!("firmware .text: {text} bytes ({})", elf.display());
    }
    Ok(())
}

/// One QEMU scenario of `cargo xtask test`.
struct Scenario {
    name: &'static str,
    args: &'static [&'static str],
    /// A summary line must show CE marks.
    needs_ce: bool,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "2 nodes, 0% loss, reorder + dup",
        args: &["--loss", "0", "--reorder", "5", "--duplicate", "2"],
        needs_ce: false,
    },
    Scenario {
        name: "2 nodes, 5% loss, reorder + dup",
        args: &["--loss", "5", "--reorder", "5", "--duplicate", "2"],
        needs_ce: false,
    },
    Scenario {
        name: "2 nodes, 20% loss, reorder + dup",
        args: &["--loss", "20", "--reorder", "5", "--duplicate", "2"],
        needs_ce: false,
    },
    Scenario {
        name: "2 nodes, ECN marking (50 Mbit/s, mark above 4 KiB)",
        args: &["--loss", "0", "--rate-mbps", "50", "--ecn-kib", "4"],
        needs_ce: true,
    },
    Scenario {
        name: "3 nodes incast (fair-share hints)",
        args: &["--nodes", "3", "--topology", "incast", "--loss", "1"],
        needs_ce: false,
    },
];

/// Test step `qemu-runs`: every scenario, each one test in the tally.
pub fn runs_step(ctx: &mut Context) -> Result<(), Error> {
    ensure_qemu()?;
    let elf = target_dir()
        .join(FIRMWARE_TARGET)
        .join("release")
        .join(BOARD);
    if !elf.exists() {
        build_firmware()?;
    }
    let mut failed = Vec::new();
    for (i, s) in SCENARIOS.iter().enumerate() {
        let started = Instant::now();
        let mut args: Vec<String> = [
            "--size",
            "16384",
            "--count",
            "32",
            "--duration",
            "120",
            "--quiet",
            "--seed",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push((i + 1).to_string());
        args.push("--out-dir".into());
        args.push(out_dir().join(format!("test{i}")).display().to_string());
        args.extend(s.args.iter().map(|a| a.to_string()));
        let mut cmd = harness(&elf, &args)?;
        let mut summary = String::new();
        let ok = util::run_streaming(&mut cmd, |line| {
            println!("    {line}");
            summary.push_str(line);
            summary.push('\n');
        })?;
        let ce_ok = !s.needs_ce || ce_marks(&summary) > 0;
        let passed = ok && ce_ok;
        println!(
            "qemu: {} ... {} ({})",
            s.name,
            if passed { "ok" } else { "FAILED" },
            util::fmt_duration(started.elapsed())
        );
        if passed {
            ctx.tally.passed += 1;
        } else {
            ctx.tally.failed += 1;
            failed.push(s.name);
        }
    }
    ctx.ran_tests = true;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "QEMU runs failed: {}",
            failed.join("; ")
        )))
    }
}

/// Test step `host-abi`: the C example `verbs/examples/abi_check.c`,
/// compiled with the system C compiler against the committed headers and
/// the library's static archive, run against two QEMU nodes in the host
/// role through the harness (`--exec`), 1 % loss; its `N passed, M
/// failed` line goes into the tally.
pub fn host_abi_step(ctx: &mut Context) -> Result<(), Error> {
    ensure_qemu()?;
    let elf = target_dir()
        .join(FIRMWARE_TARGET)
        .join("release")
        .join(BOARD);
    if !elf.exists() {
        build_firmware()?;
    }
    util::run(&mut util::cargo([
        "build",
        "--quiet",
        "-p",
        "metaroce-verbs",
    ]))?;
    let root = util::project_root();
    let out = target_dir().join("host-abi");
    std::fs::create_dir_all(&out).map_err(|e| Error::new(format!("{}: {e}", out.display())))?;
    let program = out.join("abi_check");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    util::run(
        Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
            .arg(root.join("abi/include"))
            .arg("-I")
            .arg(root.join("verbs/include"))
            .arg(root.join("verbs/examples/abi_check.c"))
            .arg(target_dir().join("debug/libmetaroce_verbs.a"))
            .args(["-lpthread", "-ldl", "-lm", "-o"])
            .arg(&program),
    )?;
    let args: Vec<String> = [
        "--quiet",
        "--loss",
        "1",
        "--duration",
        "90",
        "--seed",
        "7",
        "--exec",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([
        program.display().to_string(),
        "--out-dir".into(),
        out.join("run").display().to_string(),
    ])
    .collect();
    let mut counts = None;
    let ok = util::run_streaming(&mut harness(&elf, &args)?, |line| {
        if let Some((p, f)) = passed_failed(line) {
            counts = Some((p, f));
        }
    })?;
    ctx.ran_tests = true;
    let (passed, failed) = counts.unwrap_or((0, 1));
    ctx.tally.passed += passed;
    ctx.tally.failed += failed;
    if ok && failed == 0 && passed > 0 {
        Ok(())
    } else {
        Err(Error::new(format!(
            "host-abi: {passed} passed, {failed} failed (C example against QEMU)"
        )))
    }
}

/// `N passed, M failed` from a line.
fn passed_failed(line: &str) -> Option<(u64, u64)> {
    let (p, rest) = line.trim().split_once(" passed, ")?;
    let f = rest.strip_suffix(" failed")?;
    Some((p.parse().ok()?, f.parse().ok()?))
}

/// The fabric's CE-mark count from a summary.
fn ce_marks(summary: &str) -> u64 {
    summary
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("fabric: ")?;
            let (_, after) = rest.split_once("delivered, ")?;
            after.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_failed_lines_are_read() {
        assert_eq!(passed_failed("30 passed, 0 failed"), Some((30, 0)));
        assert_eq!(passed_failed("ok   post WRITE"), None);
    }

    #[test]
    fn ce_marks_are_read_from_the_summary() {
        let s = "node ...\nfabric: 640 frames delivered, 58 CE-marked, 3 reordered, 0 dropped; wall time 1.0 s\n";
        assert_eq!(ce_marks(s), 58);
        assert_eq!(ce_marks("nothing"), 0);
    }
}
