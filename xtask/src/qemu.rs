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
    fn ce_marks_are_read_from_the_summary() {
        let s = "node ...\nfabric: 640 frames delivered, 58 CE-marked, 3 reordered, 0 dropped; wall time 1.0 s\n";
        assert_eq!(ce_marks(s), 58);
        assert_eq!(ce_marks("nothing"), 0);
    }
}
