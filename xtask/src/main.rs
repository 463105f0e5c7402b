//! # xtask
//!
//! The project's developer and CI entry points, run as `cargo xtask <command>`
//! (the alias lives in `.cargo/config.toml`). It follows rust-analyzer's xtask:
//! plain Rust with the standard library only, so it builds in seconds on a
//! fresh machine and needs no extra tools.
//!
//! It is **not** a build system: it only orders `cargo` invocations and a few
//! checks (formatting, lints, host tests, the no_std release build, the
//! allocator check and the source tidy rules) and prints what it does.
//!
//! One module per subcommand (`test`, `qemu`); shared helpers live in
//! `util` (running commands), `project` (crate lists, targets, paths),
//! `system` (installing Debian packages a step needs), `toolchain`
//! (installing the targets and components of `rust-toolchain.toml`, before
//! every command) and `firmware` (building firmware for its board's CPU). To add a subcommand,
//! add a module and a line to [`COMMANDS`] and to the `match` in `main`.

mod bench;
mod compliance;
mod fabric;
mod firmware;
mod host_bench;
mod image;
mod no_alloc;
mod project;
mod qemu;
mod sim;
mod system;
mod test;
mod tidy;
mod toolchain;
mod util;

use std::process::ExitCode;

use util::Error;

/// Subcommands and their one-line help, printed by `cargo xtask help`.
const COMMANDS: &[(&str, &str)] = &[
    (
        "test [--list] [STEP...]",
        "run every check and test in order (or only the named steps); see --list",
    ),
    (
        "qemu [HARNESS ARGS]",
        "the main job: 2 QEMU nodes, mixed RDMA workload, 1% loss + reordering + ECN (args go to metaroce-qemu; `-- --help`)",
    ),
    (
        "bench [--simd-crc] [ARGS]",
        "engine ns/packet (TX -> RX -> ACK, 4 KiB) beside one 4 KiB memcpy, bytes per connection; CSV in target/metaroce/",
    ),
    (
        "bench --host",
        "metaroce bench vs serve on loopback beside iperf3 UDP at 1024 and 8192 B per datagram, same run",
    ),
    (
        "bench --fabric",
        "libfabric provider: fi_pingpong latency/bandwidth of metaroce, tcp, udp (and under 1% loss), MPI_Allreduce 16 MiB; CSV in target/metaroce/",
    ),
    (
        "bench --firmware",
        "qemu-virt firmware per CPU setting: instructions per 4 KiB packet's CRC and per 1 KiB packet of the engine loop under QEMU -icount, .text; CSV in target/metaroce/",
    ),
    (
        "sim <EXPERIMENT> [ARGS]",
        "fabric simulator experiments, MetaRoCE beside RoCEv2 (loss-sweep, incast, path-failure, permutation, all-to-all, spray, long-haul, first-flight); tables, CSV and SVG in target/metaroce/",
    ),
    (
        "image --board <pensando-elba|qemu-virt>",
        "firmware ELF, raw binary and U-Boot FIT (mkimage) in target/metaroce/images/, size report, dumpimage -l",
    ),
    (
        "compliance --target <host|ADDR:PORT|qemu>",
        "the compliance suite (compliance/) against metaroce serve on loopback or any implementation; pass/fail table",
    ),
    ("help", "print this message"),
];

fn usage() -> String {
    let mut s = String::from("Usage: cargo xtask <command> [args]\n\nCommands:\n");
    let width = COMMANDS.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    for (cmd, help) in COMMANDS {
        s.push_str(&format!("  {cmd:<width$}  {help}\n"));
    }
    s
}

fn run(args: &[String]) -> Result<(), Error> {
    let (cmd, rest) = match args.split_first() {
        Some((cmd, rest)) => (cmd.as_str(), rest),
        None => ("help", &[][..]),
    };
    if !matches!(cmd, "help" | "-h" | "--help") {
        // The targets and components of rust-toolchain.toml, installed
        // when missing, as QEMU is: the README's commands need nothing else.
        toolchain::ensure()?;
    }
    match cmd {
        "test" => test::run(rest),
        "compliance" => compliance::run(rest),
        "qemu" => qemu::run(rest),
        "image" => image::run(rest),
        "bench" => bench::run(rest),
        "sim" => sim::run(rest),
        "help" | "-h" | "--help" => {
            print!("{}", usage());
            Ok(())
        }
        other => Err(Error::new(format!(
            "unknown command `{other}`\n\n{}",
            usage()
        ))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}
