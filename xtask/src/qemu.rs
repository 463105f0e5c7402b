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

use crate::firmware;
use crate::image;
use crate::project::{FIRMWARE_PROFILE, FIRMWARE_TARGET};
use crate::system;
use crate::test::Context;
use crate::util::{self, Error};

const BOARD: &str = "board-qemu-virt";
/// Its code: the shared node and its engine loop, the board's drivers and
/// the traits between them.
const NODE: &str = "metaroce-node";
const ENGINE: &str = "metaroce-node-engine";
const DRIVERS: &str = "board-qemu-virt-drivers";
const BOARD_TRAITS: &str = "metaroce-board";
const HARNESS: &str = "metaroce-qemu";

/// Entry point: `cargo xtask qemu [HARNESS ARGS]`.
pub fn run(args: &[String]) -> Result<(), Error> {
    match args {
        [flag, name, ..] if flag == "--board" && name == "elba-twin" => {
            return image::elba_twin(None);
        }
        [arg, ..] if arg == "--board=elba-twin" => return image::elba_twin(None),
        _ => {}
    }
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

fn out_dir() -> PathBuf {
    util::target_dir().join("qemu-run")
}

/// The QEMU board (its package is [`BOARD`]).
fn board() -> Result<&'static image::Board, Error> {
    image::find_board("qemu-virt").ok_or_else(|| Error::new("no qemu-virt board"))
}

/// Builds the firmware for its CPU; returns the ELF.
pub fn build_firmware() -> Result<PathBuf, Error> {
    let board = board()?;
    firmware::build(board, &board.cpu.rustflags())
}

/// Installs QEMU if missing (as root), else says how.
pub fn ensure_qemu() -> Result<(), Error> {
    system::ensure_system_packages(
        &[("qemu-system-aarch64", "qemu-system-arm")],
        "to boot the emulated DPUs",
    )
}

/// The harness command (built by cargo in the dev profile, which is
/// quick), after building its host program (`metaroce-host-app`, which the
/// harness starts once per emulated DPU).
pub(crate) fn harness(elf: &std::path::Path, args: &[String]) -> Result<Command, Error> {
    util::run(&mut util::cargo([
        "build", "--quiet", "-p", HARNESS, "--bins",
    ]))?;
    let mut cmd = util::cargo([
        "run", "--quiet", "-p", HARNESS, "--bin", HARNESS, "--", "--elf",
    ]);
    cmd.arg(elf).args(args);
    Ok(cmd)
}

/// Test step `qemu-firmware`: lints and builds the firmware, reports its
/// size and where it goes, and checks it holds crc32fast's `crc32x` path.
pub fn firmware_step(_: &mut Context) -> Result<(), Error> {
    // Twice: the main image, and the bench image whose extra role (and PMU
    // access) is compiled only with the `bench-role` feature.
    for features in [
        "metaroce-platform/virtio",
        "metaroce-platform/virtio,bench-role",
    ] {
        firmware::run_cargo(&mut firmware::cargo_for(
            board()?,
            &[
                "clippy",
                "--profile",
                FIRMWARE_PROFILE,
                "-p",
                BOARD,
                "-p",
                NODE,
                "-p",
                ENGINE,
                "-p",
                DRIVERS,
                "-p",
                BOARD_TRAITS,
                "-p",
                "metaroce-platform",
                "--features",
                features,
                "--target",
                FIRMWARE_TARGET,
                "--",
                "-D",
                "warnings",
            ],
        ))?;
    }
    let elf = build_firmware()?;
    let sizes = image::Elf::parse(&std::fs::read(&elf)?)?.size_report();
    println!(
        "firmware code (.init + .text): {} B of its {} B budget; .rodata {} B ({})",
        sizes.text,
        board()?.text_budget,
        sizes.rodata,
        elf.display()
    );
    firmware::print_breakdown(&elf, 12)?;
    // The CRC path the board's CPU setting is for: crc32fast's `crc32x`
    // chains are in the firmware only when `crc` was on at compile time.
    let crc32x = firmware::count_mnemonic(&elf, "crc32x")?;
    println!("firmware: {crc32x} crc32x instructions (crc32fast's aarch64 path)");
    if crc32x == 0 {
        return Err(Error::new(
            "the firmware has no crc32x instruction: crc32fast fell back to its tables (is target-cpu set?)",
        ));
    }
    Ok(())
}

/// One QEMU scenario of `cargo xtask test`.
struct Scenario {
    name: &'static str,
    args: &'static [&'static str],
    /// A summary line must show CE marks.
    needs_ce: bool,
    /// Cores per node: above 1 the summary must show each node's
    /// dispatcher (the harness itself checks every core's part).
    cores: usize,
    /// A node must have had more than this many PSNs outstanding on one
    /// connection (the summary's `infl` column); 0: not checked.
    more_in_flight_than: u64,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "2 nodes, 0% loss, reorder + dup",
        args: &["--loss", "0", "--reorder", "5", "--duplicate", "2"],
        needs_ce: false,
        cores: 1,
        more_in_flight_than: 0,
    },
    Scenario {
        name: "2 nodes, 5% loss, reorder + dup",
        args: &["--loss", "5", "--reorder", "5", "--duplicate", "2"],
        needs_ce: false,
        cores: 1,
        more_in_flight_than: 0,
    },
    Scenario {
        name: "2 nodes, 20% loss, reorder + dup",
        args: &["--loss", "20", "--reorder", "5", "--duplicate", "2"],
        needs_ce: false,
        cores: 1,
        more_in_flight_than: 0,
    },
    Scenario {
        name: "2 nodes, ECN marking (50 Mbit/s, mark above 4 KiB)",
        args: &["--loss", "0", "--rate-mbps", "50", "--ecn-kib", "4"],
        needs_ce: true,
        cores: 1,
        more_in_flight_than: 0,
    },
    Scenario {
        name: "3 nodes incast (fair-share hints)",
        args: &["--nodes", "3", "--topology", "incast", "--loss", "1"],
        needs_ce: false,
        cores: 1,
        more_in_flight_than: 0,
    },
];

/// The multi-core runs: 2 nodes of 4 cores, each node sending to the
/// other from every core (so every core of both nodes owns a connection
/// of its own, whatever the CONNECT hash does with the incoming ones).
const MULTICORE_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "2 nodes x 4 cores x 8 streams (64 connections), 2% loss, reorder + dup",
        args: &[
            // Several cores run the workload role (a task per core); the
            // host role drives one engine.
            "--driver",
            "firmware",
            "--cores",
            "4",
            "--loss",
            "2",
            "--reorder",
            "5",
            "--duplicate",
            "2",
        ],
        needs_ce: false,
        cores: 4,
        more_in_flight_than: 0,
    },
    Scenario {
        name: "2 nodes x 4 cores x 8 streams (64 connections), 10% loss, reorder + dup",
        args: &[
            // Several cores run the workload role (a task per core); the
            // host role drives one engine.
            "--driver",
            "firmware",
            "--cores",
            "4",
            "--loss",
            "10",
            "--reorder",
            "5",
            "--duplicate",
            "2",
        ],
        needs_ce: false,
        cores: 4,
        more_in_flight_than: 0,
    },
];

/// The long-haul run: 5 ms one way (a 10 ms round trip), 1 %
/// loss, 16 messages of 64 KiB in flight: the window must let one
/// connection keep more than the 256 PSNs of one SACK bitvector
/// outstanding (spec 4.4), with every byte intact.
const LONGHAUL_SCENARIOS: &[Scenario] = &[Scenario {
    name: "2 nodes, 5 ms one way, 1% loss: more than 256 PSNs in flight",
    args: &[
        "--delay-us",
        "5000",
        "--jitter-us",
        "0",
        "--reorder",
        "0",
        "--loss",
        "1",
        "--depth",
        "16",
    ],
    needs_ce: false,
    cores: 1,
    more_in_flight_than: 256,
}];

/// Test step `qemu-longhaul`: the long-haul run, integrity and the
/// packets in flight checked.
pub fn longhaul_step(ctx: &mut Context) -> Result<(), Error> {
    run_scenarios(
        ctx,
        LONGHAUL_SCENARIOS,
        &["--size", "65536", "--count", "32"],
        "longhaul",
    )
}

/// Test step `qemu-runs`: every scenario, each one test in the tally.
pub fn runs_step(ctx: &mut Context) -> Result<(), Error> {
    let entropy = entropy_required(ctx);
    run_scenarios(
        ctx,
        SCENARIOS,
        &["--size", "16384", "--count", "32"],
        "test",
    )?;
    entropy
}

/// How long a node without an entropy source may take to give up.
const NO_ENTROPY_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// One case of `qemu-runs`: booted without a virtio-rng device, a serve
/// node must stop at once with its `METAROCE-ERROR no entropy source`
/// line and exit status 1, never run on a guessable seed (spec 5.1.6).
fn entropy_required(ctx: &mut Context) -> Result<(), Error> {
    ensure_qemu()?;
    let elf = build_firmware()?;
    let dir = out_dir();
    std::fs::create_dir_all(&dir).map_err(|e| Error::new(format!("{}: {e}", dir.display())))?;
    let console = dir.join("no-entropy.console");
    let mut cmd = Command::new("qemu-system-aarch64");
    cmd.args([
        "-M",
        "virt",
        "-cpu",
        "cortex-a72",
        "-m",
        "256M",
        "-nodefaults",
    ])
    .args(["-display", "none", "-monitor", "none"])
    .args(["-semihosting-config", "enable=on,target=native"])
    .arg("-serial")
    .arg(format!("file:{}", console.display()))
    .arg("-kernel")
    .arg(&elf)
    // A network device, as every node has; no virtio-rng-device.
    .args([
        "-netdev",
        "user,id=n0",
        "-device",
        "virtio-net-device,netdev=n0",
    ])
    .args([
        "-fw_cfg",
        "name=opt/metaroce/config,string=node=0 ip=198.18.0.1 mac=02:00:00:00:00:01 role=serve",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    println!("$ {}", util::display(&cmd));
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::new(format!("qemu-system-aarch64: {e}")))?;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > NO_ENTROPY_WAIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    let refused = text.contains("METAROCE-ERROR no entropy source")
        && status.is_some_and(|s| s.code() == Some(1));
    println!(
        "qemu: a node without an entropy device refuses to run ... {} ({})",
        if refused { "ok" } else { "FAILED" },
        util::fmt_duration(started.elapsed())
    );
    ctx.ran_tests = true;
    if refused {
        ctx.tally.passed += 1;
        Ok(())
    } else {
        ctx.tally.failed += 1;
        Err(Error::new(format!(
            "without a virtio-rng device the node did not stop with its METAROCE-ERROR line (exit {status:?}; console {})",
            console.display()
        )))
    }
}

/// Test step `qemu-multicore`: every core of 2 nodes x 4 cores handles
/// its own connections (one endpoint per core behind core 0's frame
/// dispatcher), under loss and reordering: each core opens 8 connections
/// (streams) to the other node, 64 in all, each with its own data checked
/// end to end; integrity, per-core traffic and single ownership of every
/// connection id checked by the harness.
pub fn multicore_step(ctx: &mut Context) -> Result<(), Error> {
    run_scenarios(
        ctx,
        MULTICORE_SCENARIOS,
        &["--size", "8192", "--count", "8", "--streams", "8"],
        "multicore",
    )
}

/// Runs `scenarios` with `sizes`, each one test in the tally; output in
/// `target/qemu-run/<dir_prefix>N`.
fn run_scenarios(
    ctx: &mut Context,
    scenarios: &[Scenario],
    sizes: &[&str],
    dir_prefix: &str,
) -> Result<(), Error> {
    ensure_qemu()?;
    let elf = firmware::elf_path(BOARD, FIRMWARE_PROFILE);
    if !elf.exists() {
        build_firmware()?;
    }
    let mut failed = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let started = Instant::now();
        let mut args: Vec<String> = sizes
            .iter()
            .chain(&["--duration", "120", "--quiet", "--seed"])
            .map(|a| a.to_string())
            .collect();
        args.push((i + 1).to_string());
        args.push("--out-dir".into());
        args.push(
            out_dir()
                .join(format!("{dir_prefix}{i}"))
                .display()
                .to_string(),
        );
        args.extend(s.args.iter().map(|a| a.to_string()));
        let mut cmd = harness(&elf, &args)?;
        let mut summary = String::new();
        // run_streaming echoes every line itself.
        let ok = util::run_streaming(&mut cmd, |line| {
            summary.push_str(line);
            summary.push('\n');
        })?;
        let ce_ok = !s.needs_ce || ce_marks(&summary) > 0;
        let cores_ok = s.cores <= 1 || dispatchers(&summary) == 2;
        let in_flight = max_in_flight(&summary);
        let in_flight_ok = in_flight > s.more_in_flight_than || s.more_in_flight_than == 0;
        if s.more_in_flight_than > 0 {
            println!(
                "qemu: most PSNs outstanding on one connection: {in_flight} (must exceed {})",
                s.more_in_flight_than
            );
        }
        let passed = ok && ce_ok && cores_ok && in_flight_ok;
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

/// Nodes whose dispatcher line the summary shows (multi-core runs).
fn dispatchers(summary: &str) -> usize {
    summary
        .lines()
        .filter(|l| l.contains(" dispatcher (core 0): "))
        .count()
}

/// Test step `host-abi`: the C example `verbs/examples/abi_check.c`,
/// compiled with the system C compiler against the committed headers and
/// the library's static archive, run against two QEMU nodes in the host
/// role through the harness (`--exec`), 1 % loss; its `N passed, M
/// failed` line goes into the tally.
pub fn host_abi_step(ctx: &mut Context) -> Result<(), Error> {
    ensure_qemu()?;
    let elf = build_firmware()?;
    util::run(&mut util::cargo([
        "build",
        "--quiet",
        "-p",
        "metaroce-verbs",
    ]))?;
    let root = util::project_root();
    let out = util::target_dir().join("host-abi");
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
            .arg(util::target_dir().join("debug/libmetaroce_verbs.a"))
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

/// Test step `fabric-qemu`: libfabric's `fi_pingpong` between two
/// emulated DPUs through the provider's DPU backend
/// (`FI_METAROCE_DEVICE`): `fabric/tests/run/dpu_pingpong.sh`, run by the
/// harness (`--exec`) with each node's shared memory and address, every
/// size fi_pingpong knows (1 B to 6 MiB) with its data check, 1 % loss on
/// the emulated fabric. A DPU serves one listening process for its life,
/// so plain and tagged messages each get a boot of their own. Each run's
/// `N passed, M failed` line goes into the tally.
pub fn fabric_step(ctx: &mut Context) -> Result<(), Error> {
    ensure_qemu()?;
    crate::fabric::ensure_packages()?;
    let run = crate::fabric::run_dir()?;
    crate::fabric::build_provider(&run)?;
    let elf = build_firmware()?;
    let root = util::project_root();
    let out = util::target_dir().join("fabric-qemu");
    std::fs::create_dir_all(&out).map_err(|e| Error::new(format!("{}: {e}", out.display())))?;
    let mut failures = Vec::new();
    for mode in ["msg", "tagged"] {
        // Windows for the largest message staged both ways at once.
        let args: Vec<String> = [
            "--quiet",
            "--loss",
            "1",
            "--duration",
            "600",
            "--seed",
            "7",
            "--size",
            "262144",
            "--count",
            "24",
            "--exec",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([
            root.join("fabric/tests/run/dpu_pingpong.sh")
                .display()
                .to_string(),
            "--out-dir".into(),
            out.join(mode).display().to_string(),
        ])
        .collect();
        let mut counts = None;
        let mut cmd = harness(&elf, &args)?;
        cmd.env("FI_PROVIDER_PATH", &run).env("PINGPONG_MODE", mode);
        let ok = util::run_streaming(&mut cmd, |line| {
            if let Some((p, f)) = passed_failed(line) {
                counts = Some((p, f));
            }
        })?;
        ctx.ran_tests = true;
        let (passed, failed) = counts.unwrap_or((0, 1));
        ctx.tally.passed += passed;
        ctx.tally.failed += failed;
        if !ok || failed > 0 || passed == 0 {
            failures.push(mode);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "fabric-qemu: fi_pingpong between two DPUs failed ({})",
            failures.join(", ")
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
/// The largest `infl` of the summary's node rows (0 without the column).
fn max_in_flight(summary: &str) -> u64 {
    let mut column = None;
    let mut most = 0;
    for line in summary.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"node") && words.get(1) == Some(&"role") {
            column = words.iter().position(|w| *w == "infl");
        } else if let (Some(c), Some(first)) = (column, words.first()) {
            if first.parse::<u32>().is_ok() {
                most = most.max(words.get(c).and_then(|w| w.parse().ok()).unwrap_or(0));
            }
        }
    }
    most
}

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
    fn in_flight_is_read_from_the_summary() {
        let s = "node role          bytes    Mbit/s  compl    retx     rto   infl   ce_rx\n\
                 0    sender      2097152     98.52     34      20       0    462     131\n\
                 1    receiver    1572864     96.52     18       4       0    232     504\n\
                 fabric: 2237 frames delivered, 635 CE-marked, 0 reordered, 25 dropped\n";
        assert_eq!(max_in_flight(s), 462);
        assert_eq!(max_in_flight("nothing"), 0);
    }

    #[test]
    fn ce_marks_are_read_from_the_summary() {
        let s = "node ...\nfabric: 640 frames delivered, 58 CE-marked, 3 reordered, 0 dropped; wall time 1.0 s\n";
        assert_eq!(ce_marks(s), 58);
        assert_eq!(ce_marks("nothing"), 0);
    }

    #[test]
    fn dispatcher_lines_are_counted() {
        let s = "node 0 dispatcher (core 0): 10 frames in\nnode 1 dispatcher (core 0): 9 frames in\nfabric: ...\n";
        assert_eq!(dispatchers(s), 2);
        assert_eq!(dispatchers("fabric: 1 frames"), 0);
    }
}
