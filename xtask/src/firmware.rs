//! Firmware built for its board's CPU, where its code size goes, and
//! `cargo xtask bench --firmware`.
//!
//! `aarch64-unknown-none` is a generic Armv8.0-A: only `neon`, and
//! `strict-align`. Each board's firmware is compiled for the cores it runs
//! on instead ([`Cpu`], one per board in [`crate::image::BOARDS`]): every
//! firmware `cargo` command of the xtask goes through [`cargo_for`], which
//! adds `-C target-cpu=...` and the board's target features to the flags
//! of the `aarch64-unknown-none` artifacts only (never a global `[build]`
//! setting, which would break host builds). Cargo hashes the flags into
//! the artifacts' names, so the plain `no_std` builds of the `no-alloc`
//! and `clippy-no-std` steps and the firmware builds keep their own copies.
//!
//! What the CPU setting changes, measured by the bench below: crc32fast
//! uses the `crc32x` instructions (three independent chains) only when
//! the `crc` feature is on at compile time, and, with `strict-align`, every
//! 8-byte load of its loop is built from eight byte loads.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::image::{self, Board};
use crate::no_alloc;
use crate::project::{FIRMWARE_SPEED_PROFILE, FIRMWARE_TARGET};
use crate::util::{self, Error};

/// How a board's firmware is compiled for its cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    /// `-C target-cpu`: LLVM's model of the cores (features and scheduling).
    pub target_cpu: &'static str,
    /// `-C target-feature`: changes to what `target_cpu` implies.
    pub target_features: &'static str,
}

/// The Cortex-A72 of the Elba (and of QEMU `virt -cpu cortex-a72`, the
/// Elba's stand-in). `cortex-a72` turns on `crc` (the CRC32 instructions,
/// always present in an A72) and also `aes`/`sha2`, the Cryptographic
/// Extension, which is an implementation option of the A72 that no public
/// source confirms for the Elba: off until it is read on one
/// (`ID_AA64ISAR0_EL1.AES`); it would also let crc32fast fold with `PMULL`,
/// which costs QEMU more instructions per 4 KiB than the `crc32x` chains
/// (`cargo xtask bench --firmware`). `-strict-align`: both boards turn the
/// MMU on (aarch64-rt's entry, `SCTLR_ELx.A` = 0) before any Rust code
/// runs and keep all data in normal memory, where unaligned loads are
/// allowed; device registers are read with aligned volatile accesses.
/// rustc warns that `strict-align` is not one of its stable feature names
/// and passes it to LLVM.
///
/// A Salina board (16 x Neoverse N1) would set `target_cpu: "neoverse-n1"`
/// (`crc`, `lse` atomics, `rcpc`, `dotprod`, ...) in its [`Board`] entry;
/// the N1 has the Cryptographic Extension in every product shipped, but the
/// same check applies before `aes` is left on.
pub const CORTEX_A72: Cpu = Cpu {
    target_cpu: "cortex-a72",
    target_features: "-aes,-sha2,-strict-align",
};

impl Cpu {
    /// The `rustc` flags for this CPU.
    pub fn rustflags(&self) -> Vec<String> {
        let mut flags = vec!["-C".to_string(), format!("target-cpu={}", self.target_cpu)];
        if !self.target_features.is_empty() {
            flags.extend([
                "-C".into(),
                format!("target-feature={}", self.target_features),
            ]);
        }
        flags
    }
}

/// The flags the user already gave cargo (`CARGO_ENCODED_RUSTFLAGS`, else
/// `RUSTFLAGS`), so [`cargo_for`] adds to them instead of replacing them.
fn inherited_rustflags() -> Vec<String> {
    if let Some(encoded) = std::env::var_os("CARGO_ENCODED_RUSTFLAGS") {
        let encoded = encoded.to_string_lossy().into_owned();
        return encoded
            .split('\x1f')
            .filter(|f| !f.is_empty())
            .map(String::from)
            .collect();
    }
    std::env::var("RUSTFLAGS")
        .map(|f| f.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// A `cargo` command for firmware artifacts compiled with `flags` added.
/// `CARGO_ENCODED_RUSTFLAGS` outranks every other source of flags, and with
/// `--target` it reaches only the target's artifacts, not build scripts.
pub fn cargo_with_flags(args: &[&str], flags: &[String]) -> Command {
    let mut all = inherited_rustflags();
    all.extend(flags.iter().cloned());
    let mut cmd = util::cargo(args);
    cmd.env("CARGO_ENCODED_RUSTFLAGS", all.join("\x1f"));
    // Every firmware command with the same defmt level as the builds
    // (`build_with`): `defmt-macros` is rebuilt whenever `DEFMT_LOG`
    // changes, and everything above it with it, so a lint between two
    // builds would otherwise recompile the firmware's whole tree twice.
    cmd.env("DEFMT_LOG", defmt_level());
    cmd
}

/// The defmt log level of firmware builds: `DEFMT_LOG`, else `warn`.
pub fn defmt_level() -> String {
    std::env::var("DEFMT_LOG").unwrap_or_else(|_| "warn".into())
}

/// A `cargo` command (`build`, `clippy`, ...) for `board`'s firmware,
/// compiled for its CPU. `args` must include `--target aarch64-unknown-none`.
pub fn cargo_for(board: &Board, args: &[&str]) -> Command {
    cargo_with_flags(args, &board.cpu.rustflags())
}

/// Runs a cargo command that compiles for a board's CPU ([`cargo_for`],
/// [`cargo_with_flags`]), passing its output through except rustc's
/// warning that `strict-align` is not a stable feature name: the flag is
/// deliberate (see [`CORTEX_A72`]) and rustc repeats the warning for every
/// crate, so the README's commands would otherwise print it seven times.
/// Every other line, warnings included, goes through unchanged.
pub fn run_cargo(cmd: &mut Command) -> Result<(), Error> {
    use std::io::{BufRead, BufReader, Write};
    println!("$ {}", util::display(cmd));
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::new(format!("cannot run `{}`: {e}", util::display(cmd))))?;
    if let Some(stderr) = child.stderr.take() {
        let mut filter = KnownWarningFilter::default();
        let err = std::io::stderr();
        for line in BufReader::new(stderr).lines() {
            let line = line?;
            if filter.keep(&line) {
                writeln!(err.lock(), "{line}")?;
            }
        }
    }
    let status = child.wait()?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "`{}` failed ({status})",
            util::display(cmd)
        )))
    }
}

/// Drops the `strict-align` warning block and the per-crate warning
/// summaries that count only it.
#[derive(Debug, Default)]
struct KnownWarningFilter {
    /// Inside the known warning's block (until its blank line).
    in_block: bool,
    /// Other warnings were printed since the last summary line.
    others: bool,
}

impl KnownWarningFilter {
    const HEAD: &'static str =
        "warning: unknown and unstable feature specified for `-Ctarget-feature`: `strict-align`";

    fn keep(&mut self, line: &str) -> bool {
        if self.in_block {
            if line.trim().is_empty() {
                self.in_block = false;
            }
            return false;
        }
        if line.starts_with(Self::HEAD) {
            self.in_block = true;
            return false;
        }
        // `warning: `crate` (lib) generated 1 warning (1 duplicate)`
        if line.starts_with("warning: `") && line.contains(") generated ") {
            let keep = self.others;
            self.others = false;
            return keep;
        }
        if line.starts_with("warning") || line.starts_with("error") {
            self.others = true;
        }
        true
    }
}

/// `cargo build --profile <the board's>` of a board's firmware; returns
/// the ELF cargo wrote.
pub fn build(board: &Board, flags: &[String]) -> Result<PathBuf, Error> {
    build_with(board, flags, board.features)
}

/// [`build`] with cargo `features` of the board's package on.
pub fn build_with(board: &Board, flags: &[String], features: &[&str]) -> Result<PathBuf, Error> {
    build_profile(board, board.profile, flags, features)
}

/// [`build_with`] with cargo `profile` instead of the board's.
pub fn build_profile(
    board: &Board,
    profile: &str,
    flags: &[String],
    features: &[&str],
) -> Result<PathBuf, Error> {
    let features = features.join(",");
    let mut args = vec![
        "build",
        "--profile",
        profile,
        "-p",
        board.package,
        "--target",
        FIRMWARE_TARGET,
    ];
    if !features.is_empty() {
        args.extend(["--features", &features]);
    }
    let mut cmd = cargo_with_flags(&args, flags);
    // Warnings and errors only, unless the caller asks for more
    // (`DEFMT_LOG=info cargo xtask qemu`): the info logs' code does not fit
    // the 128 KiB budget beside everything a node runs.
    cmd.env("DEFMT_LOG", defmt_level());
    run_cargo(&mut cmd)?;
    Ok(elf_path(board.package, profile))
}

/// Where cargo writes the ELF of a board's firmware `package` built with
/// `profile`.
pub fn elf_path(package: &str, profile: &str) -> PathBuf {
    util::target_dir()
        .join(FIRMWARE_TARGET)
        .join(profile)
        .join(package)
}

// ----- size breakdown ---------------------------------------------------

/// The code budget of a board's firmware with the engine loop for size:
/// 128 KiB of `.init` + `.text`.
pub const TEXT_BUDGET: u64 = 128 * 1024;

/// The code budget with the engine loop compiled for speed
/// ([`crate::project::FIRMWARE_SPEED_PROFILE`]): 160 KiB, so that code
/// growth still shows.
pub const SPEED_TEXT_BUDGET: u64 = 160 * 1024;

/// Code bytes by crate and the largest functions, from
/// `llvm-nm --print-size --size-sort --demangle`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CodeBreakdown {
    /// (crate, bytes), largest first.
    pub by_crate: Vec<(String, u64)>,
    /// (function, bytes), largest first.
    pub largest: Vec<(String, u64)>,
}

/// The crate a demangled symbol belongs to: its first path segment; for
/// `<T as Trait>::f` the crate of `T`, or of `Trait` when `T` is a
/// primitive. Generic code counts where rustc instantiated it (the crate
/// that used it). Names `llvm-nm` left half-mangled (`_$LT$a..b$GT$`) are
/// read the same way.
fn crate_of(symbol: &str) -> String {
    let readable = symbol
        .replace("$LT$", "<")
        .replace("$GT$", ">")
        .replace("$u20$", " ")
        .replace("..", "::");
    let s = readable.trim_start_matches('_').trim_start_matches('<');
    let s = s.trim_start_matches('&').trim_start_matches("mut ");
    let s = s.trim_start_matches("dyn ");
    let first_path = |s: &str| s.find("::").map(|end| s[..end].to_string());
    let self_type = s.split([' ', '<', '>']).next().unwrap_or(s);
    match (first_path(self_type), s.split_once(" as ")) {
        (Some(krate), _) => krate,
        (None, Some((_, rest))) => first_path(rest).unwrap_or_else(|| rest.to_string()),
        (None, None) => "(no crate: C symbols)".to_string(),
    }
}

/// Parses `llvm-nm -S --size-sort -C` output: code symbols only
/// (`t`, `T`, `w`, `W`).
pub fn code_breakdown(nm: &str) -> CodeBreakdown {
    let mut by_crate: Vec<(String, u64)> = Vec::new();
    let mut largest = Vec::new();
    for line in nm.lines() {
        let mut fields = line.splitn(4, ' ');
        let (Some(_addr), Some(size), Some(kind), Some(name)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !matches!(kind, "t" | "T" | "w" | "W") {
            continue;
        }
        let Ok(size) = u64::from_str_radix(size, 16) else {
            continue;
        };
        let krate = crate_of(name);
        match by_crate.iter_mut().find(|(c, _)| *c == krate) {
            Some((_, total)) => *total += size,
            None => by_crate.push((krate, size)),
        }
        // Drop the hash suffix `::h0123456789abcdef` rustc adds.
        let short = match name.rfind("::h") {
            Some(i) if name.len() - i == 19 => &name[..i],
            _ => name,
        };
        largest.push((short.to_string(), size));
    }
    by_crate.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    largest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    CodeBreakdown { by_crate, largest }
}

/// Prints where the code of `elf` goes: bytes per crate and the largest
/// functions (what `cargo bloat` shows, from `llvm-nm`).
pub fn print_breakdown(elf: &Path, rows: usize) -> Result<(), Error> {
    let nm = no_alloc::find_llvm_nm()?;
    let mut cmd = Command::new(nm);
    cmd.args(["--print-size", "--size-sort", "--demangle"])
        .arg(elf);
    let text = util::output(&mut cmd)?;
    let b = code_breakdown(&text);
    let total: u64 = b.by_crate.iter().map(|(_, n)| n).sum();
    println!(
        "code by crate ({total} B in functions; generic code counts where it was instantiated):"
    );
    for (krate, bytes) in b.by_crate.iter().take(rows) {
        println!("  {bytes:>8} B  {krate}");
    }
    println!("largest functions:");
    for (name, bytes) in b.largest.iter().take(rows) {
        let name: String = name.chars().take(110).collect();
        println!("  {bytes:>8} B  {name}");
    }
    Ok(())
}

/// How many instructions with this mnemonic `llvm-objdump -d` finds.
pub fn count_mnemonic(elf: &Path, mnemonic: &str) -> Result<usize, Error> {
    let objdump = no_alloc::find_llvm_nm()?.with_file_name("llvm-objdump");
    let mut cmd = Command::new(objdump);
    cmd.args(["-d", "--no-show-raw-insn"]).arg(elf);
    Ok(count_in_disassembly(&util::output(&mut cmd)?, mnemonic))
}

/// Instructions with this mnemonic in `llvm-objdump -d` output.
fn count_in_disassembly(text: &str, mnemonic: &str) -> usize {
    text.lines()
        .filter(|line| {
            line.split_once(':').is_some_and(|(addr, rest)| {
                addr.trim().chars().all(|c| c.is_ascii_hexdigit())
                    && rest.split_whitespace().next() == Some(mnemonic)
            })
        })
        .count()
}

// ----- cargo xtask bench --firmware ------------------------------------

/// One CPU setting the firmware bench compares.
struct Setting {
    name: &'static str,
    /// Added to the `aarch64-unknown-none` flags; `None`: the board's own.
    flags: Option<&'static [&'static str]>,
    /// The cargo profile (the board's unless named).
    profile: Option<&'static str>,
    /// Cargo features of the board's package besides `bench-role`.
    features: &'static [&'static str],
}

const SETTINGS: &[Setting] = &[
    Setting {
        name: "aarch64-unknown-none (generic Armv8.0-A)",
        flags: Some(&[]),
        profile: None,
        features: &[],
    },
    Setting {
        name: "cortex-a72, strict-align kept",
        flags: Some(&[
            "-C",
            "target-cpu=cortex-a72",
            "-C",
            "target-feature=-aes,-sha2",
        ]),
        profile: None,
        features: &[],
    },
    Setting {
        name: "cortex-a72 with PMULL (aes on)",
        flags: Some(&[
            "-C",
            "target-cpu=cortex-a72",
            "-C",
            "target-feature=-strict-align",
        ]),
        profile: None,
        features: &[],
    },
    Setting {
        name: "the board's setting",
        flags: None,
        profile: None,
        features: &[],
    },
    Setting {
        name: "the Elba's build: the board's setting, engine loop for speed, path index, UDP checksums in the NIC",
        flags: None,
        profile: Some(FIRMWARE_SPEED_PROFILE),
        features: &["elba-bench"],
    },
];

/// The `METAROCE-BENCH` lines of the firmware's bench role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchLine {
    pub bytes: u64,
    pub packets: u64,
    /// Instructions per packet's CRC, times ten.
    pub instructions_x10: u64,
    pub crc: bool,
    pub aes: bool,
    pub check: String,
    /// The engine loop per 1 KiB WRITE data packet (TX -> RX -> ACK,
    /// both engines, CRC and payload copies included), times ten; `None`
    /// if the firmware printed no engine line.
    pub engine_x10: Option<u64>,
}

/// Reads the bench line from the console text.
pub fn parse_bench_line(console: &str) -> Option<BenchLine> {
    let find = |prefix: &str| {
        console
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(str::to_owned))
    };
    let line = find("METAROCE-BENCH crc32 ")?;
    let engine = find("METAROCE-BENCH engine ").unwrap_or_default();
    let field_of = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    let field = |key: &str| field_of(&line, key);
    let number = |key: &str| field(key)?.parse::<u64>().ok();
    Some(BenchLine {
        bytes: number("bytes")?,
        packets: number("packets")?,
        instructions_x10: number("instructions_x10")?,
        crc: field("crc")? == "1",
        aes: field("aes")? == "1",
        check: field("check")?,
        engine_x10: field_of(&engine, "instructions_x10").and_then(|v| v.parse().ok()),
    })
}

/// Runs the firmware's bench role once under QEMU with exact instruction
/// counting (`-icount shift=0`).
fn run_bench(elf: &Path, out_dir: &Path, name: &str) -> Result<BenchLine, Error> {
    let console = out_dir.join(format!("{name}.console"));
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
    .args(["-display", "none", "-monitor", "none", "-icount", "shift=0"])
    .args(["-semihosting-config", "enable=on,target=native"])
    .arg("-serial")
    .arg(format!("file:{}", console.display()))
    .arg("-kernel")
    .arg(elf)
    .args(["-fw_cfg", "name=opt/metaroce/config,string=role=bench"]);
    util::output(&mut cmd)?;
    let text = fs::read_to_string(&console)?;
    parse_bench_line(&text).ok_or_else(|| {
        Error::new(format!(
            "no METAROCE-BENCH line in {} (console: {text:?})",
            console.display()
        ))
    })
}

/// `cargo xtask bench --firmware`: the qemu-virt firmware built for each
/// CPU setting, its bench role run under QEMU, instructions per 4 KiB
/// packet's CRC, per 1 KiB packet of the whole engine loop (TX -> RX ->
/// ACK between two engines) and `.text` printed side by side (CSV in
/// `target/metaroce/firmware-bench.csv`).
pub fn bench() -> Result<(), Error> {
    crate::qemu::ensure_qemu()?;
    let board = image::find_board("qemu-virt").ok_or_else(|| Error::new("no qemu-virt board"))?;
    let out_dir = util::target_dir().join("metaroce").join("firmware-bench");
    fs::create_dir_all(&out_dir)?;
    let mut rows = Vec::new();
    for (i, setting) in SETTINGS.iter().enumerate() {
        let flags: Vec<String> = match setting.flags {
            Some(flags) => flags.iter().map(|f| f.to_string()).collect(),
            None => board.cpu.rustflags(),
        };
        let profile = setting.profile.unwrap_or(board.profile);
        let features: Vec<&str> = ["bench-role"]
            .into_iter()
            .chain(setting.features.iter().copied())
            .collect();
        let built = build_profile(board, profile, &flags, &features)?;
        let elf = out_dir.join(format!("setting{i}.elf"));
        fs::copy(&built, &elf)?;
        let text = image::Elf::parse(&fs::read(&elf)?)?.size_report().text;
        let line = run_bench(&elf, &out_dir, &format!("setting{i}"))?;
        rows.push((setting.name, flags.join(" "), line, text));
    }
    let base = rows[0].2.instructions_x10.max(1);
    println!(
        "\nCRC-32 trailer of one 4 KiB WRITE data packet ({} bytes) in the qemu-virt firmware, QEMU -icount shift=0 (instructions are exact; cycles need hardware):\n",
        rows[0].2.bytes
    );
    println!(
        "| setting | rustc flags | CRC path | instructions per packet | vs generic | engine per 1 KiB packet | .text bytes |"
    );
    println!("|---|---|---|---:|---:|---:|---:|");
    let mut csv = String::from(
        "setting,rustflags,crc_path,instructions_per_packet,engine_instructions_per_packet,text_bytes\n",
    );
    for (name, flags, line, text) in &rows {
        let path = match (line.crc, line.aes) {
            (false, _) => "table (crc32fast baseline)",
            (true, false) => "crc32x, 3 chains",
            (true, true) => "PMULL folding",
        };
        let per_packet = line.instructions_x10 as f64 / 10.0;
        let engine = line
            .engine_x10
            .map_or("-".to_string(), |e| format!("{:.1}", e as f64 / 10.0));
        println!(
            "| {name} | `{}` | {path} | {per_packet:.1} | {:.2}x | {engine} | {text} |",
            if flags.is_empty() { "(none)" } else { flags },
            base as f64 / line.instructions_x10.max(1) as f64
        );
        csv.push_str(&format!(
            "{},{},{},{per_packet:.1},{engine},{text}\n",
            csv_field(name),
            csv_field(flags),
            csv_field(path)
        ));
    }
    if rows.iter().any(|r| r.2.check != rows[0].2.check) {
        return Err(Error::new("the settings computed different CRCs"));
    }
    let csv_path = util::target_dir()
        .join("metaroce")
        .join("firmware-bench.csv");
    fs::write(&csv_path, csv)?;
    println!("\nCSV: {}", csv_path.display());
    // The board's setting is the last one built with the board's profile:
    // its build stays the current one.
    Ok(())
}

/// A CSV field, quoted when it holds a comma or a quote (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod filter_tests {
    use super::KnownWarningFilter;

    #[test]
    fn only_the_strict_align_warning_and_its_summaries_are_dropped() {
        let text = [
            "   Compiling metaroce-node v0.1.0",
            "warning: unknown and unstable feature specified for `-Ctarget-feature`: `strict-align`",
            "  |",
            "  = note: it is still passed through to the codegen backend",
            "",
            "warning: `metaroce-node` (lib) generated 1 warning (1 duplicate)",
            "warning: unused variable: `x`",
            " --> src/lib.rs:1:1",
            "",
            "warning: `metaroce-app` (lib) generated 2 warnings (1 duplicate)",
            "    Finished `firmware` profile",
        ];
        let mut f = KnownWarningFilter::default();
        let kept: Vec<&str> = text.iter().copied().filter(|l| f.keep(l)).collect();
        assert_eq!(
            kept,
            [
                "   Compiling metaroce-node v0.1.0",
                "warning: unused variable: `x`",
                " --> src/lib.rs:1:1",
                "",
                "warning: `metaroce-app` (lib) generated 2 warnings (1 duplicate)",
                "    Finished `firmware` profile",
            ]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_flags_name_the_cpu_and_features() {
        assert_eq!(
            CORTEX_A72.rustflags(),
            [
                "-C",
                "target-cpu=cortex-a72",
                "-C",
                "target-feature=-aes,-sha2,-strict-align"
            ]
        );
        let bare = Cpu {
            target_cpu: "neoverse-n1",
            target_features: "",
        };
        assert_eq!(bare.rustflags(), ["-C", "target-cpu=neoverse-n1"]);
    }

    #[test]
    fn every_board_is_built_for_its_cpu() {
        for board in image::BOARDS {
            assert!(!board.cpu.target_cpu.is_empty(), "{}", board.name);
        }
    }

    #[test]
    fn code_is_summed_by_crate() {
        let nm = "\
0000000040080000 0000000000000010 T memcpy
0000000040080010 0000000000000100 t metaroce_core::conn::Connection<_>::on_packet::h0123456789abcdef
0000000040080110 0000000000000020 t <metaroce_core::wire::Repr as core::fmt::Debug>::fmt::hfedcba9876543210
0000000040080130 0000000000000040 T core::fmt::write
0000000040080170 0000000000000008 t <u64 as core::fmt::Display>::fmt
0000000040080178 0000000000000008 t _$LT$board_qemu_virt..node..Services$LT$T$GT$$u20$as$u20$board_qemu_virt..workload..NodeServices$GT$::open::h1
0000000042000000 0000000000100000 B boot_stack
0000000040080170 0000000000000008 r some_table";
        let b = code_breakdown(nm);
        assert_eq!(
            b.by_crate,
            [
                ("metaroce_core".to_string(), 0x120),
                ("core".to_string(), 0x48),
                ("(no crate: C symbols)".to_string(), 0x10),
                ("board_qemu_virt".to_string(), 0x8),
            ]
        );
        assert_eq!(
            b.largest[0],
            (
                "metaroce_core::conn::Connection<_>::on_packet".to_string(),
                0x100
            )
        );
        assert_eq!(b.largest.len(), 6);
    }

    #[test]
    fn mnemonics_are_counted_in_disassembly() {
        let text = "\
0000000040080000 <crc>:
40080000:      \tcrc32x\tw10, w10, x13
40080004:      \tcrc32b\tw10, w10, w11
40080008:      \tbl\t0x40080000 <crc32x_helper>
4008000c:      \tcrc32x\tw1, w1, x2";
        assert_eq!(count_in_disassembly(text, "crc32x"), 2);
        assert_eq!(count_in_disassembly(text, "crc32b"), 1);
        assert_eq!(count_in_disassembly(text, "pmull"), 0);
    }

    #[test]
    fn bench_lines_are_parsed() {
        let console = "metaroce qemu-virt firmware 0.1.0\nMETAROCE-BENCH crc32 bytes=4148 packets=2000 instructions_x10=12370 cycles_x10=12370 crc=1 aes=0 check=e9a3a519\n";
        let crc_only = BenchLine {
            bytes: 4148,
            packets: 2000,
            instructions_x10: 12370,
            crc: true,
            aes: false,
            check: "e9a3a519".into(),
            engine_x10: None,
        };
        assert_eq!(parse_bench_line(console), Some(crc_only.clone()));
        let both = format!("{console}METAROCE-BENCH engine payload=1024 packets=2000 instructions_x10=70618 cycles_x10=70618 acks=6 polls=12 retransmits=0\n");
        assert_eq!(
            parse_bench_line(&both),
            Some(BenchLine {
                engine_x10: Some(70618),
                ..crc_only
            })
        );
        assert_eq!(parse_bench_line("METAROCE-BENCH crc32 bytes=x"), None);
        assert_eq!(parse_bench_line(""), None);
    }
}

#[cfg(test)]
mod csv_tests {
    use super::csv_field;

    #[test]
    fn fields_with_commas_or_quotes_are_quoted() {
        assert_eq!(csv_field("crc32x"), "crc32x");
        assert_eq!(csv_field("crc32x, 3 chains"), "\"crc32x, 3 chains\"");
        assert_eq!(csv_field("a \"b\""), "\"a \"\"b\"\"\"");
    }
}
