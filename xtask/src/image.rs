//! `cargo xtask image --board <BOARD>`: a firmware image U-Boot can load,
//! and the image checks of `cargo xtask test`.
//!
//! For a board (`pensando-elba`, `qemu-virt`) it builds the firmware ELF
//! (release, `aarch64-unknown-none`), makes a raw binary with the
//! toolchain's `llvm-objcopy` (rustup's `llvm-tools`), wraps it in a FIT
//! with `mkimage` from Debian's `u-boot-tools` (installed when missing and
//! running as root), and writes `<board>.elf`, `.bin`, `.its`, `.itb` and
//! `.size.txt` under `target/metaroce/images/`. It prints a size report
//! (`.text`, `.rodata`, `.data`, `.bss`, stack) read from the ELF's section
//! headers, and `dumpimage -l` of the FIT.
//!
//! Load and entry addresses: the Elba's come from
//! `boards/pensando-elba/board.toml` (the build script links the image
//! there; the ELF's entry is checked against it); QEMU's board has no
//! board file, so its addresses are the ELF's own (first loadable segment,
//! entry point).
//!
//! The FIT image is `type = "kernel"`, `os = "linux"`, `arch = "arm64"`,
//! uncompressed: the one kind every U-Boot's `bootm` starts on arm64, and
//! it uses the Linux arm64 boot protocol (caches and MMU off, EL2 or EL1,
//! x0 = device tree), which is what `aarch64-rt`'s entry code expects. The
//! README of the Elba board explains the choice and the U-Boot commands.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::firmware::{self, Cpu, CORTEX_A72};
use crate::no_alloc;
use crate::project::{FIRMWARE_PROFILE, FIRMWARE_SPEED_PROFILE, FIRMWARE_TARGET};
use crate::system;
use crate::test::Context;
use crate::util::{self, Error};

// The board file's reader, shared with the board's build script (which
// uses more of it than the xtask).
#[allow(dead_code)]
#[path = "../../boards/pensando-elba/board_toml.rs"]
mod board_toml;

/// A board the xtask can make an image for.
#[derive(Debug)]
pub struct Board {
    /// The `--board` name.
    pub name: &'static str,
    /// Its cargo package (a binary of the same name).
    pub package: &'static str,
    /// Its board file (relative to the project root), if it has one.
    pub board_toml: Option<&'static str>,
    pub description: &'static str,
    /// The cores its firmware is compiled for (`-C target-cpu`, features).
    pub cpu: Cpu,
    /// Most bytes of code (`.init` + `.text`) the firmware may have; the
    /// `images` step checks it.
    pub text_budget: u64,
    /// Cargo features of its package (a configuration of another board's
    /// image, such as the Elba's twin).
    pub features: &'static [&'static str],
    /// The cargo profile it is built with ([`FIRMWARE_PROFILE`], or
    /// [`FIRMWARE_SPEED_PROFILE`] where the code budget allows the engine
    /// loop compiled for speed).
    pub profile: &'static str,
}

/// Every board with an image.
pub const BOARDS: &[Board] = &[
    Board {
        name: "pensando-elba",
        package: "board-pensando-elba",
        board_toml: Some("boards/pensando-elba/board.toml"),
        description: "MetaRoCE firmware for the AMD Pensando Elba ARM complex",
        cpu: CORTEX_A72,
        text_budget: firmware::SPEED_TEXT_BUDGET,
        features: &[],
        profile: FIRMWARE_SPEED_PROFILE,
    },
    Board {
        name: "qemu-virt",
        package: "board-qemu-virt",
        board_toml: None,
        description: "MetaRoCE firmware for QEMU virt (Cortex-A72)",
        // The Elba's stand-in: built for the same cores.
        cpu: CORTEX_A72,
        text_budget: firmware::TEXT_BUDGET,
        features: &[],
        profile: FIRMWARE_PROFILE,
    },
    // A Salina board (16 x Neoverse N1) is one more entry here with
    // `cpu: Cpu { target_cpu: "neoverse-n1", .. }`; see `firmware::Cpu`.
];

/// What `image` produced.
#[derive(Debug)]
pub struct Image {
    pub elf: PathBuf,
    pub bin: PathBuf,
    pub fit: PathBuf,
    pub load: u64,
    pub entry: u64,
    pub sizes: SizeReport,
}

/// Entry point: `cargo xtask image --board <BOARD>`.
pub fn run(args: &[String]) -> Result<(), Error> {
    let usage = || {
        let names: Vec<&str> = BOARDS.iter().map(|b| b.name).collect();
        Error::new(format!(
            "usage: cargo xtask image --board <{}>",
            names.join("|")
        ))
    };
    let name = match args {
        [flag, name] if flag == "--board" => name.as_str(),
        [arg] => arg.strip_prefix("--board=").ok_or_else(usage)?,
        _ => return Err(usage()),
    };
    let board = find_board(name).ok_or_else(usage)?;
    let image = build(board)?;
    println!("\nsize report ({}):\n{}", image.elf.display(), image.sizes);
    firmware::print_breakdown(&image.elf, 12)?;
    println!("$ dumpimage -l {}", image.fit.display());
    print!("{}", dumpimage(&image.fit)?);
    println!(
        "\nimage: {} (load {:#x}, entry {:#x}); raw binary {}",
        image.fit.display(),
        image.load,
        image.entry,
        image.bin.display()
    );
    Ok(())
}

/// The Elba's twin: the Elba image and drivers configured by
/// `elba-twin.toml` for QEMU `virt` (GICv3, EL2, 16 cores). Not in
/// [`BOARDS`]: it is a configuration of the Elba's image, which the
/// `images` step already checks; `cargo xtask qemu --board elba-twin`
/// boots it.
pub const ELBA_TWIN: Board = Board {
    name: "elba-twin",
    package: "board-pensando-elba",
    board_toml: Some("boards/pensando-elba/elba-twin.toml"),
    description:
        "MetaRoCE firmware for the Pensando Elba, configured for QEMU virt standing in for it",
    cpu: CORTEX_A72,
    text_budget: firmware::SPEED_TEXT_BUDGET,
    features: &["elba-twin"],
    profile: FIRMWARE_SPEED_PROFILE,
};

pub fn find_board(name: &str) -> Option<&'static Board> {
    BOARDS.iter().chain([&ELBA_TWIN]).find(|b| b.name == name)
}

/// Where the images go: `target/metaroce/images/`.
pub fn images_dir() -> PathBuf {
    util::target_dir().join("metaroce").join("images")
}

/// The tools `image` runs: `mkimage` (and `dtc`, which it calls for `-f`)
/// and `dumpimage`.
fn ensure_tools() -> Result<(), Error> {
    system::ensure_system_packages(
        &[
            ("mkimage", "u-boot-tools"),
            ("dumpimage", "u-boot-tools"),
            ("dtc", "device-tree-compiler"),
        ],
        "to build and list the FIT images U-Boot boots",
    )
}

/// The board's load and entry addresses from its board file.
pub fn board_addresses(board: &Board) -> Result<Option<(u64, u64)>, Error> {
    let Some(rel) = board.board_toml else {
        return Ok(None);
    };
    let path = util::project_root().join(rel);
    let text = fs::read_to_string(&path)
        .map_err(|e| Error::new(format!("reading {}: {e}", path.display())))?;
    let toml = board_toml::BoardToml::parse(&text).map_err(|e| Error::new(e.0))?;
    let load = toml
        .int("image.load_address")
        .map_err(|e| Error::new(e.0))?;
    let entry = toml
        .int("image.entry_address")
        .map_err(|e| Error::new(e.0))?;
    Ok(Some((load, entry)))
}

/// Builds the firmware and its images; see the module documentation.
pub fn build(board: &Board) -> Result<Image, Error> {
    ensure_tools()?;
    let built = firmware::build(board, &board.cpu.rustflags())?;
    let elf_bytes =
        fs::read(&built).map_err(|e| Error::new(format!("reading {}: {e}", built.display())))?;
    let elf = Elf::parse(&elf_bytes)?;
    let (load, entry) = match board_addresses(board)? {
        Some((load, entry)) => {
            if elf.entry != entry || elf.load_address() != Some(load) {
                return Err(Error::new(format!(
                    "{}: the ELF is linked at {:#x} with entry {:#x}, but board.toml says load {load:#x}, entry {entry:#x} (a stale build?)",
                    built.display(),
                    elf.load_address().unwrap_or(0),
                    elf.entry
                )));
            }
            (load, entry)
        }
        None => (
            elf.load_address()
                .ok_or_else(|| Error::new("the ELF has no loadable segment"))?,
            elf.entry,
        ),
    };
    let dir = images_dir();
    fs::create_dir_all(&dir)?;
    let out = |ext: &str| dir.join(format!("{}.{ext}", board.name));
    let (elf_out, bin, its, fit, size_txt) = (
        out("elf"),
        out("bin"),
        out("its"),
        out("itb"),
        out("size.txt"),
    );
    fs::copy(&built, &elf_out)?;
    util::run(
        Command::new(llvm_tool("llvm-objcopy")?)
            .args(["-O", "binary"])
            .arg(&elf_out)
            .arg(&bin),
    )?;
    fs::write(
        &its,
        its_text(board, &format!("{}.bin", board.name), load, entry),
    )?;
    // mkimage resolves /incbin/ paths against its working directory.
    util::run(
        Command::new("mkimage")
            .current_dir(&dir)
            .arg("-f")
            .arg(its.file_name().unwrap_or_default())
            .arg(fit.file_name().unwrap_or_default()),
    )?;
    let mut sizes = elf.size_report();
    sizes.binary = fs::metadata(&bin)?.len();
    sizes.fit = fs::metadata(&fit)?.len();
    fs::write(&size_txt, sizes.to_string())?;
    Ok(Image {
        elf: elf_out,
        bin,
        fit,
        load,
        entry,
        sizes,
    })
}

/// An address as FIT cells: one cell below 4 GiB (what every U-Boot
/// reads), two above (needs `#address-cells = <2>`).
fn cells(addr: u64, two: bool) -> String {
    if two {
        format!("<{:#x} {:#x}>", addr >> 32, addr & 0xffff_ffff)
    } else {
        format!("<{addr:#x}>")
    }
}

/// The image tree source of a board's FIT.
pub fn its_text(board: &Board, bin_name: &str, load: u64, entry: u64) -> String {
    let two = load > u64::from(u32::MAX) || entry > u64::from(u32::MAX);
    format!(
        r#"/dts-v1/;

/ {{
	description = "{desc}";
	#address-cells = <{cells}>;

	images {{
		firmware-1 {{
			description = "{name} firmware (raw binary, aarch64-rt entry first)";
			data = /incbin/("{bin_name}");
			type = "kernel";
			arch = "arm64";
			os = "linux";
			compression = "none";
			load = {load};
			entry = {entry};
			hash-1 {{
				algo = "sha256";
			}};
		}};
	}};

	configurations {{
		default = "conf-1";
		conf-1 {{
			description = "{name}";
			kernel = "firmware-1";
		}};
	}};
}};
"#,
        desc = board.description,
        name = board.name,
        cells = if two { 2 } else { 1 },
        load = cells(load, two),
        entry = cells(entry, two),
    )
}

/// `dumpimage -l FILE`.
pub fn dumpimage(fit: &Path) -> Result<String, Error> {
    util::output(Command::new("dumpimage").arg("-l").arg(fit))
}

/// The first image's `Load Address` and `Entry Point` in `dumpimage -l`
/// output.
pub fn parse_dumpimage(text: &str) -> Option<(u64, u64)> {
    let field = |label: &str| {
        text.lines().find_map(|line| {
            let value = line.trim().strip_prefix(label)?.trim();
            let hex = value.strip_prefix("0x").or(value.strip_prefix("0X"))?;
            u64::from_str_radix(hex, 16).ok()
        })
    };
    Some((field("Load Address:")?, field("Entry Point:")?))
}

/// A tool from rustup's `llvm-tools` component, next to `llvm-nm`.
fn llvm_tool(name: &str) -> Result<PathBuf, Error> {
    let nm = no_alloc::find_llvm_nm()?;
    let tool = nm.with_file_name(name);
    if tool.is_file() {
        Ok(tool)
    } else {
        Err(Error::new(format!(
            "{} not found; install it with: rustup component add llvm-tools",
            tool.display()
        )))
    }
}

/// Sizes of the firmware, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeReport {
    /// Code: `.init` (entry, vectors) and `.text`.
    pub text: u64,
    /// Read-only data: `.rodata` and `.got`.
    pub rodata: u64,
    pub data: u64,
    pub bss: u64,
    /// The boot stack (`.stack`).
    pub stack: u64,
    /// Other allocated sections.
    pub other: u64,
    /// From the first loaded byte to the end of the last allocated section.
    pub footprint: u64,
    /// The raw binary (what U-Boot copies).
    pub binary: u64,
    /// The FIT file.
    pub fit: u64,
}

impl std::fmt::Display for SizeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kib = |b: u64| b as f64 / 1024.0;
        for (name, bytes) in [
            (".text", self.text),
            (".rodata", self.rodata),
            (".data", self.data),
            (".bss", self.bss),
            ("stack", self.stack),
            ("other", self.other),
            ("in memory", self.footprint),
            ("binary", self.binary),
            ("FIT", self.fit),
        ] {
            writeln!(f, "  {name:<10} {bytes:>9} B  {:>9.1} KiB", kib(bytes))?;
        }
        Ok(())
    }
}

/// The parts of an ELF64 little-endian file the image needs.
#[derive(Debug)]
pub struct Elf {
    pub entry: u64,
    /// `(name, address, size, flags)` of every section.
    pub sections: Vec<(String, u64, u64, u64)>,
    /// `(physical address, file size, memory size)` of each `PT_LOAD`.
    pub loads: Vec<(u64, u64, u64)>,
}

const SHF_ALLOC: u64 = 0x2;
const PT_LOAD: u32 = 1;

impl Elf {
    /// Parses the headers of an ELF64 little-endian file.
    pub fn parse(bytes: &[u8]) -> Result<Elf, Error> {
        let bad = |what: &str| Error::new(format!("not a usable ELF64 little-endian file: {what}"));
        if bytes.get(..4) != Some(b"\x7fELF".as_slice()) {
            return Err(bad("no ELF magic"));
        }
        if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
            return Err(bad("not 64-bit little-endian"));
        }
        let u16_at = |off: usize| -> Result<u64, Error> {
            let b = bytes.get(off..off + 2).ok_or_else(|| bad("truncated"))?;
            Ok(u64::from(u16::from_le_bytes([b[0], b[1]])))
        };
        let u32_at = |off: usize| -> Result<u64, Error> {
            let b = bytes.get(off..off + 4).ok_or_else(|| bad("truncated"))?;
            Ok(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        };
        let u64_at = |off: usize| -> Result<u64, Error> {
            let b = bytes.get(off..off + 8).ok_or_else(|| bad("truncated"))?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Ok(u64::from_le_bytes(a))
        };
        let to_usize = |v: u64| usize::try_from(v).map_err(|_| bad("offset too large"));
        let entry = u64_at(0x18)?;
        let phoff = to_usize(u64_at(0x20)?)?;
        let shoff = to_usize(u64_at(0x28)?)?;
        let phentsize = to_usize(u16_at(0x36)?)?;
        let phnum = to_usize(u16_at(0x38)?)?;
        let shentsize = to_usize(u16_at(0x3a)?)?;
        let shnum = to_usize(u16_at(0x3c)?)?;
        let shstrndx = to_usize(u16_at(0x3e)?)?;
        let mut loads = Vec::new();
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            if u32_at(ph)? == PT_LOAD as u64 {
                loads.push((u64_at(ph + 0x18)?, u64_at(ph + 0x20)?, u64_at(ph + 0x28)?));
            }
        }
        let section = |i: usize| -> Result<(u64, u64, u64, u64, u64), Error> {
            let sh = shoff + i * shentsize;
            Ok((
                u32_at(sh)?,
                u64_at(sh + 0x08)?,
                u64_at(sh + 0x10)?,
                u64_at(sh + 0x18)?,
                u64_at(sh + 0x20)?,
            ))
        };
        let mut sections = Vec::new();
        if shnum > 0 {
            let (_, _, _, strtab_off, strtab_size) = section(shstrndx)?;
            let strtab_off = to_usize(strtab_off)?;
            let strtab = bytes
                .get(strtab_off..strtab_off + to_usize(strtab_size)?)
                .ok_or_else(|| bad("section names out of the file"))?;
            for i in 0..shnum {
                let (name_off, flags, addr, _, size) = section(i)?;
                let name_bytes = strtab.get(to_usize(name_off)?..).unwrap_or_default();
                let end = name_bytes.iter().position(|&b| b == 0).unwrap_or(0);
                let name = String::from_utf8_lossy(&name_bytes[..end]).into_owned();
                sections.push((name, addr, size, flags));
            }
        }
        Ok(Elf {
            entry,
            sections,
            loads,
        })
    }

    /// The physical address of the first loadable segment.
    pub fn load_address(&self) -> Option<u64> {
        self.loads
            .iter()
            .filter(|(_, filesz, _)| *filesz > 0)
            .map(|(paddr, _, _)| *paddr)
            .min()
    }

    /// Sizes by section kind (allocated sections only).
    pub fn size_report(&self) -> SizeReport {
        let mut r = SizeReport::default();
        let mut lo = u64::MAX;
        let mut hi = 0;
        for (name, addr, size, flags) in &self.sections {
            if flags & SHF_ALLOC == 0 || *size == 0 {
                continue;
            }
            lo = lo.min(*addr);
            hi = hi.max(addr + size);
            let n = name.as_str();
            let slot = if n == ".init" || n.starts_with(".init.") || n.starts_with(".text") {
                &mut r.text
            } else if n.starts_with(".rodata") || n == ".got" {
                &mut r.rodata
            } else if n.starts_with(".data") {
                &mut r.data
            } else if n.starts_with(".bss") {
                &mut r.bss
            } else if n.starts_with(".stack") {
                &mut r.stack
            } else {
                &mut r.other
            };
            *slot += size;
        }
        r.footprint = hi.saturating_sub(lo.min(hi));
        r
    }
}

/// Every symbol of the linked firmware that belongs to the global
/// allocator (none expected).
fn allocator_symbols(elf: &Path) -> Result<(usize, Vec<String>), Error> {
    let nm = no_alloc::find_llvm_nm()?;
    let text = util::output(Command::new(nm).arg(elf))?;
    let symbols = no_alloc::parse_nm(&text);
    let found = symbols
        .iter()
        .filter(|s| no_alloc::allocator_symbol(s).is_some())
        .cloned()
        .collect();
    Ok((symbols.len(), found))
}

/// Test step `images`: for each board, builds the image, reads the FIT
/// back with `dumpimage -l` and compares its load and entry addresses to
/// the board's (board.toml for the Elba), and checks the linked firmware
/// has no allocator symbol. Each check counts as one test.
pub fn test_step(ctx: &mut Context) -> Result<(), Error> {
    let mut failed = Vec::new();
    for board in BOARDS {
        let image = build(board)?;
        println!("size report ({}):\n{}", board.name, image.sizes);
        let listing = dumpimage(&image.fit)?;
        for line in listing.lines() {
            println!("    {line}");
        }
        let expected = board_addresses(board)?.unwrap_or((image.load, image.entry));
        let mut check = |name: String, ok: bool| {
            println!("image: {name} ... {}", if ok { "ok" } else { "FAILED" });
            if ok {
                ctx.tally.passed += 1;
            } else {
                ctx.tally.failed += 1;
                failed.push(name);
            }
        };
        let seen = parse_dumpimage(&listing);
        check(
            format!(
                "{}: dumpimage load/entry {:?} == expected ({:#x}, {:#x})",
                board.name,
                seen.map(|(l, e)| (format!("{l:#x}"), format!("{e:#x}"))),
                expected.0,
                expected.1
            ),
            seen == Some(expected),
        );
        let (count, alloc) = allocator_symbols(&image.elf)?;
        check(
            format!(
                "{}: no allocator symbol among {count} symbols of the ELF",
                board.name
            ),
            count > 0 && alloc.is_empty(),
        );
        for symbol in alloc {
            eprintln!("image: allocator symbol {symbol}");
        }
        check(
            format!(
                "{}: firmware has code ({} B .text) and fits its binary ({} B)",
                board.name, image.sizes.text, image.sizes.binary
            ),
            image.sizes.text > 0 && image.sizes.binary >= image.sizes.text,
        );
        let within_budget = image.sizes.text <= board.text_budget;
        check(
            format!(
                "{}: code ({} B .init + .text) within its budget of {} B",
                board.name, image.sizes.text, board.text_budget
            ),
            within_budget,
        );
        if !within_budget {
            firmware::print_breakdown(&image.elf, 20)?;
        }
    }
    ctx.ran_tests = true;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "image checks failed: {}",
            failed.join("; ")
        )))
    }
}

/// Test step `elba-host`: the Elba board's drivers crate (board
/// constants, 16550 driver, shared-memory rings, cores' layout, entropy
/// seeding) linted and tested on the host, and the firmware (the shared
/// node built for the Elba) linted for its target. The board crates are
/// kept out of the workspace's default members, so this is where their
/// code is checked.
pub fn elba_host_step(ctx: &mut Context) -> Result<(), Error> {
    let drivers = "board-pensando-elba-drivers";
    util::run(&mut util::cargo([
        "clippy",
        "-p",
        drivers,
        "-p",
        "board-pensando-elba",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    let elba = find_board("pensando-elba").ok_or_else(|| Error::new("no pensando-elba board"))?;
    firmware::run_cargo(&mut firmware::cargo_for(
        elba,
        &[
            "clippy",
            "--profile",
            FIRMWARE_PROFILE,
            "-p",
            elba.package,
            "-p",
            drivers,
            "-p",
            "metaroce-node",
            "-p",
            "metaroce-node-engine",
            "-p",
            "metaroce-board",
            "--target",
            FIRMWARE_TARGET,
            "--",
            "-D",
            "warnings",
        ],
    ))?;
    let mut tally = crate::test::Tally::default();
    let ok = util::run_streaming(
        &mut util::cargo(["test", "-p", drivers, "--lib", "--no-fail-fast"]),
        |line| {
            tally.add_libtest_line(line);
        },
    )?;
    ctx.tally.passed += tally.passed;
    ctx.tally.failed += tally.failed;
    ctx.ran_tests = true;
    match (ok, tally.failed) {
        (true, 0) => Ok(()),
        (_, 0) => Err(Error::new(format!(
            "cargo test -p {drivers} failed without a failing test (see above)"
        ))),
        (_, n) => Err(Error::new(format!("{n} {drivers} test(s) failed"))),
    }
}

/// Cores of the twin: all of the Elba's.
const TWIN_CORES: u32 = 16;
/// Guard against a hung twin; U-Boot and 16 cores start in about 5 s.
const TWIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);
/// Frames the stand-in NIC drops between twins, in percent.
const TWIN_LOSS: f64 = 1.0;

/// `cargo xtask qemu --board elba-twin` and the test step `elba-twin`:
/// the Elba image with its own drivers, configured by `elba-twin.toml`,
/// booted from its FIT by U-Boot at EL2 in QEMU `virt` standing in for
/// the Elba (`gic-version=3`, `virtualization=on` so PSCI goes through
/// `smc`, 16 Cortex-A72 cores, virtio-rng for the TRNG), with the node's
/// configuration line from fw_cfg:
///
/// 1. two twins in the host role, each serving the host interface of
///    spec chapter 6 over its `[host_interface]` (`METAROCE-HOSTIF`) and
///    driven by a host process (`metaroce-host-app`) through the host
///    library, which maps that region of the twin's RAM file as a host
///    maps the card's BAR: twin 0's process sends the main job's workload
///    (WRITE, WRITE_IMM, SEND, READ, 32 x 64 KiB) to twin 1's, both check
///    every byte; the frames between the twins' core 0 rings go through
///    the stand-in NIC below at 1 % loss;
/// 2. two twins in the workload role, every core of each sending to the
///    other and receiving (WRITE, WRITE_IMM, SEND, READ, integrity
///    checked), their frame rings in their RAM files, moved by
///    `metaroce-elba-nic` (the host-side stand-in for the NIC pipeline:
///    steering to each connection's core, 1 % loss, rx doorbells).
pub fn elba_twin(ctx: Option<&mut Context>) -> Result<(), Error> {
    system::ensure_system_packages(
        &[("qemu-system-aarch64", "qemu-system-arm")],
        "to boot U-Boot and the image under emulation",
    )?;
    let uboot = ensure_uboot_qemu()?;
    let image = build(&ELBA_TWIN)?;
    let tftp = images_dir().join("elba-twin-tftp");
    fs::create_dir_all(&tftp)?;
    let fit_name = "elba-twin.itb";
    fs::copy(&image.fit, tftp.join(fit_name))?;
    fs::write(
        tftp.join("boot.cmd"),
        uboot_boot_commands(fit_name, UBOOT_FIT_ADDR),
    )?;
    util::run(
        Command::new("mkimage")
            .current_dir(&tftp)
            .args(["-A", "arm64", "-T", "script", "-C", "none", "-n"])
            .args(["metaroce-boot", "-d", "boot.cmd", "boot.scr.uimg"]),
    )?;
    let mut checks: Vec<(String, bool)> = Vec::new();
    let load = format!("Load Address: {:#x}", image.load);
    let boot_checks = |console: &str, run: &str, checks: &mut Vec<(String, bool)>| {
        checks.push((
            format!("{run}: the stand-in's doorbell SPI woke core 0 (virtio-serial line for GICD_SETSPI_NSR)"),
            console.contains("METAROCE-DOORBELL-SPI woke core 0"),
        ));
        for (name, needle) in [
            ("U-Boot fetched the FIT by TFTP", "Bytes transferred"),
            ("bootm verified the FIT's sha256", "sha256+ OK"),
            ("bootm used elba-twin.toml's load address", load.as_str()),
            ("bootm started the image", "Starting kernel"),
        ] {
            checks.push((format!("{run}: {name}"), console.contains(needle)));
        }
        checks.push((
            format!("{run}: the Elba firmware ran at EL2 (banner)"),
            console
                .lines()
                .any(|l| l.contains("metaroce pensando-elba firmware") && l.contains(": EL2,")),
        ));
    };

    let cfg = twin_config()?;
    util::run(&mut util::cargo([
        "build",
        "--quiet",
        "-p",
        "metaroce-qemu",
        "--bin",
        "metaroce-elba-nic",
        "--bin",
        "metaroce-host-app",
    ]))?;

    // 1. The main job's workload through the host library: two twins in
    // the host role, each driven by a host process over its
    // [host_interface].
    let rams = pair_rams(&tftp, "host");
    let plan = host_plan(&cfg, [&rams[0], &rams[1]]);
    let pair = twin_pair(&uboot, &tftp, &cfg, &plan, TWIN_LOSS)?;
    for (n, console) in pair.consoles.iter().enumerate() {
        let run = format!("host{n}");
        boot_checks(console, &run, &mut checks);
        checks.push((
            format!(
                "{run}: the host interface formatted over [host_interface] (64 MiB, 4 queue sets)"
            ),
            console.contains(&format!(
                "METAROCE-HOSTIF node={n} shm=67108864 sets=4 ip={} port=4795",
                twin_ip(n as u8)
            )),
        ));
    }
    for (n, (out, status)) in pair.hosts.iter().enumerate() {
        let result = out
            .lines()
            .find(|l| l.starts_with("METAROCE-RESULT"))
            .unwrap_or("");
        println!("elba-twin: host process {n}: {result}");
        let what = if n == 0 { "sender" } else { "receiver" };
        checks.push((
            format!("host{n}: the host process ({what}, metaroce-verbs) checked every byte: integrity OK, status 0"),
            result.contains(" integrity=OK") && *status == Some(0),
        ));
        checks.push((
            format!("host{n}: data moved through the host interface"),
            result.contains(&format!(" role={what} ")) && !result.contains(" bytes=0 "),
        ));
    }
    print_nic(&pair.nic, "host");
    checks.push((
        format!("host: the stand-in NIC dropped frames ({TWIN_LOSS} % loss)"),
        nic_dropped(&pair.nic),
    ));
    checks.push((
        "host: the stand-in NIC found every UDP checksum good (it computes those the firmware leaves to it)".to_string(),
        nic_checksums_good(&pair.nic),
    ));

    // 2. Every core of both twins: the workload role's traffic.
    let pair = twin_pair(&uboot, &tftp, &cfg, &workload_plan(), TWIN_LOSS)?;
    for (n, console) in pair.consoles.iter().enumerate() {
        let run = format!("twin{n}");
        boot_checks(console, &run, &mut checks);
        checks.push((
            format!("{run}: integrity OK"),
            console
                .lines()
                .any(|l| l.starts_with("METAROCE-RESULT") && l.contains("integrity=OK")),
        ));
        checks.push((
            format!("{run}: ended with status 0"),
            console.contains("METAROCE-EXIT 0"),
        ));
        let busy = (0..TWIN_CORES)
            .filter(|c| {
                console.lines().any(|l| {
                    l.starts_with(&format!("METAROCE-CORE node={n} core={c} "))
                        && !l.contains(" bytes=0 ")
                })
            })
            .count();
        checks.push((
            format!("{run}: every core carried traffic ({busy} of {TWIN_CORES})"),
            busy == TWIN_CORES as usize,
        ));
    }
    print_nic(&pair.nic, "twin");
    checks.push((
        format!("twin: the stand-in NIC dropped frames ({TWIN_LOSS} % loss)"),
        nic_dropped(&pair.nic),
    ));
    checks.push((
        "twin: the stand-in NIC found every UDP checksum good (it computes those the firmware leaves to it)".to_string(),
        nic_checksums_good(&pair.nic),
    ));

    let mut failed = Vec::new();
    for (name, ok) in &checks {
        println!(
            "elba-twin: {name} ... {}",
            if *ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failed.push(name.clone());
        }
    }
    if let Some(ctx) = ctx {
        ctx.tally.passed += (checks.len() - failed.len()) as u64;
        ctx.tally.failed += failed.len() as u64;
        ctx.ran_tests = true;
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "the Elba twin failed: {} (consoles in {})",
            failed.join("; "),
            tftp.display()
        )))
    }
}

/// The stand-in NIC's last counter line of `twin`.
fn nic_last(nic: &str, twin: u32) -> &str {
    nic.lines()
        .rfind(|l| l.starts_with(&format!("ELBA-NIC twin={twin} ")))
        .unwrap_or("")
}

fn print_nic(nic: &str, run: &str) {
    for twin in 0..2 {
        println!("elba-twin: {run}: {}", nic_last(nic, twin));
    }
}

/// Whether the stand-in NIC dropped frames of either twin.
fn nic_dropped(nic: &str) -> bool {
    (0..2).any(|t| {
        let l = nic_last(nic, t);
        l.contains(" lost=") && !l.contains(" lost=0 ")
    })
}

/// Whether the stand-in NIC found every UDP checksum good, on frames it
/// completed itself (the firmware leaves the field to it) and delivered.
fn nic_checksums_good(nic: &str) -> bool {
    (0..2).all(|t| nic_last(nic, t).contains(" bad_checksum=0 "))
}

/// Starts one twin with the node's configuration line `config` (and, with
/// `ram`, its RAM in that shared file); its console goes to
/// `console-{run}.log`.
fn twin_spawn(
    uboot: &Path,
    tftp: &Path,
    run: &str,
    config: &str,
    ram: Option<&Path>,
) -> Result<(std::process::Child, PathBuf), Error> {
    let log_path = tftp.join(format!("console-{run}.log"));
    let log = fs::File::create(&log_path)?;
    let mut machine = "virt,gic-version=3,virtualization=on".to_string();
    let mut cmd = Command::new("qemu-system-aarch64");
    if let Some(ram) = ram {
        let _ = fs::remove_file(ram);
        machine.push_str(",memory-backend=ram");
        cmd.arg("-object").arg(format!(
            "memory-backend-file,id=ram,size=2G,mem-path={},share=on",
            ram.display()
        ));
        // The doorbell line (`gic.doorbell_raise = "virtio-serial"`): the
        // stand-in NIC writes to this socket to raise the device's SPI.
        let bell = twin_bell(ram);
        let _ = fs::remove_file(&bell);
        cmd.arg("-chardev")
            .arg(format!(
                "socket,id=bell,path={},server=on,wait=off",
                bell.display()
            ))
            .args(["-device", "virtio-serial-device"])
            .args(["-device", "virtconsole,chardev=bell"]);
    }
    cmd.args(["-M", &machine, "-cpu", "cortex-a72", "-smp"])
        .arg(TWIN_CORES.to_string())
        .args(["-m", "2G", "-nographic", "-bios"])
        .arg(uboot)
        .arg("-netdev")
        .arg(format!("user,id=n0,tftp={}", tftp.display()))
        .args(["-device", "virtio-net-device,netdev=n0"])
        .args(["-device", "virtio-rng-device"])
        .arg("-fw_cfg")
        .arg(format!("name=opt/metaroce/config,string={config}"))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    println!("$ {}", util::display(&cmd));
    Ok((cmd.spawn()?, log_path))
}

/// The socket of the doorbell line of the twin whose RAM is `ram`.
fn twin_bell(ram: &Path) -> PathBuf {
    ram.with_extension("bell")
}

/// Waits until every console shows `done` (or the timeout); kills the
/// twins. Whether it timed out.
fn twin_wait(children: &mut [(std::process::Child, PathBuf)], done: &str) -> Result<bool, Error> {
    let started = std::time::Instant::now();
    let timed_out = loop {
        let mut all = true;
        for (child, log) in children.iter_mut() {
            let finished = String::from_utf8_lossy(&fs::read(log.as_path())?).contains(done);
            all &= finished || child.try_wait()?.is_some();
        }
        if all {
            std::thread::sleep(std::time::Duration::from_millis(300));
            break false;
        }
        if started.elapsed() > TWIN_TIMEOUT {
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    for (child, log) in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
        println!(
            "elba-twin: console in {} ({:.1} s{})",
            log.display(),
            started.elapsed().as_secs_f64(),
            if timed_out {
                ", killed at the timeout"
            } else {
                ""
            }
        );
    }
    Ok(timed_out)
}

/// Test step `elba-twin`: the twin's configuration linted for its target
/// (the code only its feature compiles: virtio-rng, fw_cfg), then
/// [`elba_twin`].
pub fn elba_twin_step(ctx: &mut Context) -> Result<(), Error> {
    firmware::run_cargo(&mut firmware::cargo_for(
        &ELBA_TWIN,
        &[
            "clippy",
            "--profile",
            FIRMWARE_PROFILE,
            "-p",
            ELBA_TWIN.package,
            "-p",
            "board-pensando-elba-drivers",
            "--features",
            "board-pensando-elba/elba-twin",
            "--target",
            FIRMWARE_TARGET,
            "--",
            "-D",
            "warnings",
        ],
    ))?;
    elba_twin(Some(ctx))
}

/// What a pair of twins printed: their consoles, the stand-in NIC's
/// output, and (host role) each host process's output and exit status.
struct PairRun {
    consoles: [String; 2],
    nic: String,
    hosts: Vec<(String, Option<i32>)>,
}

/// How a pair of twins runs: the node's configuration line of each twin,
/// the cores the stand-in NIC steers to and the connection table it
/// steers by, and (host role) the arguments of the host process driving
/// each twin through the host library.
struct PairPlan {
    run: &'static str,
    lines: [String; 2],
    nic_cores: u64,
    table_slots: u64,
    hosts: Option<[Vec<String>; 2]>,
}

/// The twin's board configuration (`elba-twin.toml`), checked.
fn twin_config() -> Result<board_toml::BoardConfig, Error> {
    let text = fs::read_to_string(
        util::project_root().join(
            ELBA_TWIN
                .board_toml
                .ok_or_else(|| Error::new("elba-twin has no board file"))?,
        ),
    )?;
    let toml = board_toml::BoardToml::parse(&text).map_err(|e| Error::new(e.0))?;
    board_toml::BoardConfig::check(&toml).map_err(|e| Error::new(e.0))
}

/// Twin `n`'s MAC and IPv4 address.
fn twin_mac(n: u8) -> String {
    format!("02:4d:52:00:00:{:02x}", n + 1)
}
fn twin_ip(n: u8) -> String {
    format!("10.0.0.{}", n + 1)
}

/// The first part of twin `n`'s configuration line: its addresses and its
/// peer's (the other twin).
fn twin_addresses(n: u8) -> String {
    let p = 1 - n;
    format!(
        "node={n} ip={} mac={} peer={}/{} port=4795",
        twin_ip(n),
        twin_mac(n),
        twin_ip(p),
        twin_mac(p)
    )
}

/// Two twins in the workload role, 16 cores each, exchanging its traffic
/// (WRITE, WRITE_IMM, SEND, READ from every core of each twin to the
/// other, integrity checked).
fn workload_plan() -> PairPlan {
    let common = format!(
        "role=workload cores={TWIN_CORES} target=0 expect=1 size=8192 count=4 depth=2 streams=1 linger_ms=500 progress_ms=1000"
    );
    PairPlan {
        run: "twin",
        lines: [0, 1].map(|n| format!("{} {common}", twin_addresses(n))),
        nic_cores: u64::from(TWIN_CORES),
        // The workload role's table: 64 slots a core.
        table_slots: 64 * u64::from(TWIN_CORES),
        hosts: None,
    }
}

/// Messages of the main job's workload (`cargo xtask qemu`'s defaults:
/// `mixed`, 32 messages of 64 KiB, 8 in flight) that the host pair runs.
const HOST_SIZE: u32 = 65_536;
const HOST_COUNT: u32 = 32;
const HOST_DEPTH: u32 = 8;
/// Guard against a hung host process.
const HOST_TIMEOUT_S: u64 = 90;

/// Two twins in the host role, each driven by a host process
/// (`metaroce-host-app`) through the host library over the twin's
/// `[host_interface]` in its RAM file: twin 0's process sends the main
/// job's workload to twin 1's, which checks every byte.
fn host_plan(cfg: &board_toml::BoardConfig, ram: [&Path; 2]) -> PairPlan {
    let (base, len) = cfg.host_interface;
    let offset = base - cfg.dram.0;
    let host = |n: u8| {
        let mut args: Vec<String> = vec![
            "--shm".into(),
            ram[usize::from(n)].display().to_string(),
            format!("--shm-offset={offset:#x}"),
            format!("--shm-len={len:#x}"),
            format!("--node={n}"),
            "--workload=mixed".into(),
            format!("--size={HOST_SIZE}"),
            format!("--count={HOST_COUNT}"),
            format!("--depth={HOST_DEPTH}"),
            "--seed=7".into(),
            format!("--timeout={HOST_TIMEOUT_S}"),
        ];
        if n == 0 {
            args.push(format!("--target=1/{}:4795", twin_ip(1)));
        } else {
            args.push("--expect=1".into());
        }
        args
    };
    PairPlan {
        run: "host",
        lines: [0, 1].map(|n| format!("{} role=host", twin_addresses(n))),
        // The host role runs on core 0: every frame goes to its rings.
        nic_cores: 1,
        table_slots: cfg.endpoint.connections,
        hosts: Some([host(0), host(1)]),
    }
}

/// The RAM files of a pair's twins.
fn pair_rams(tftp: &Path, run: &str) -> [PathBuf; 2] {
    [0, 1].map(|n| tftp.join(format!("{run}{n}.ram")))
}

/// Two twins, their RAM in shared files, the frames between their cores
/// moved by `metaroce-elba-nic` (the host-side stand-in for the NIC
/// pipeline, which steers each frame to its core and drops `loss`
/// percent); with host processes, each drives its twin through the host
/// library and the run ends when both have ended, else when both twins
/// print `METAROCE-EXIT`.
fn twin_pair(
    uboot: &Path,
    tftp: &Path,
    cfg: &board_toml::BoardConfig,
    plan: &PairPlan,
    loss: f64,
) -> Result<PairRun, Error> {
    let rams = pair_rams(tftp, plan.run);
    let stop = tftp.join(format!("{}-nic.stop", plan.run));
    let _ = fs::remove_file(&stop);
    let mut children = Vec::new();
    for (n, line) in plan.lines.iter().enumerate() {
        children.push(twin_spawn(
            uboot,
            tftp,
            &format!("{}{n}", plan.run),
            line,
            Some(&rams[n]),
        )?);
    }
    // QEMU creates the RAM files (2 GiB) as it starts.
    let started = std::time::Instant::now();
    let sized = |r: &PathBuf| fs::metadata(r).is_ok_and(|m| m.len() >= 2 << 30);
    while !rams.iter().all(sized) && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let nic_log = tftp.join(format!("{}-nic.log", plan.run));
    let mut nic = Command::new(util::target_dir().join("debug").join("metaroce-elba-nic"));
    nic.arg("--ram")
        .args(&rams)
        .arg(format!("--ram-base={:#x}", cfg.dram.0))
        .arg(format!("--rings-base={:#x}", cfg.rings.0))
        .arg(format!("--rx-ring={:#x}", cfg.rx_ring_offset))
        .arg(format!("--tx-ring={:#x}", cfg.tx_ring_offset))
        .arg(format!("--ring-stride={:#x}", cfg.core_ring_stride))
        .arg(format!("--rx-doorbell={:#x}", cfg.rx_doorbell_offset))
        .arg(format!("--doorbell-stride={:#x}", cfg.doorbell_stride))
        .arg(format!("--cores={}", plan.nic_cores))
        .arg(format!("--table-slots={}", plan.table_slots))
        .arg(format!("--loss={loss}"))
        .arg("--stop")
        .arg(&stop)
        .arg("--bell")
        .args(rams.iter().map(|r| twin_bell(r)))
        .stdout(fs::File::create(&nic_log)?);
    println!("$ {}", util::display(&nic));
    let mut nic = nic.spawn()?;
    let mut hosts = Vec::new();
    for (n, args) in plan.hosts.iter().flatten().enumerate() {
        let log = tftp.join(format!("{}{n}-app.log", plan.run));
        let mut app = Command::new(util::target_dir().join("debug").join("metaroce-host-app"));
        app.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(fs::File::create(&log)?)
            .stderr(fs::File::create(
                tftp.join(format!("{}{n}-app.err", plan.run)),
            )?);
        println!("$ {}", util::display(&app));
        hosts.push((app.spawn()?, log));
    }
    let mut statuses = vec![None; hosts.len()];
    if !hosts.is_empty() {
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_secs(HOST_TIMEOUT_S + 30);
        while statuses.iter().any(Option::is_none) && std::time::Instant::now() < deadline {
            for ((app, _), status) in hosts.iter_mut().zip(statuses.iter_mut()) {
                if status.is_none() {
                    *status = app.try_wait()?.map(|s| s.code().unwrap_or(-1));
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        for (app, _) in &mut hosts {
            let _ = app.kill();
            let _ = app.wait();
        }
    }
    // The host role never ends: its twins stop here, once served.
    let done = if plan.hosts.is_some() {
        "METAROCE-HOSTIF"
    } else {
        "METAROCE-EXIT"
    };
    let timed_out = twin_wait(&mut children, done);
    fs::write(&stop, b"")?;
    let nic_started = std::time::Instant::now();
    while nic.try_wait()?.is_none() && nic_started.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = nic.kill();
    let _ = nic.wait();
    for ram in &rams {
        let _ = fs::remove_file(ram);
        let _ = fs::remove_file(twin_bell(ram));
    }
    println!(
        "elba-twin: {} pair: {:.1} s from start to stop",
        plan.run,
        started.elapsed().as_secs_f64()
    );
    timed_out?;
    let read = |p: &Path| -> Result<String, Error> {
        Ok(String::from_utf8_lossy(&fs::read(p)?).into_owned())
    };
    let mut host_out = Vec::new();
    for ((_, log), status) in hosts.iter().zip(statuses) {
        host_out.push((read(log)?, status));
    }
    Ok(PairRun {
        consoles: [read(&children[0].1)?, read(&children[1].1)?],
        nic: read(&nic_log)?,
        hosts: host_out,
    })
}

/// U-Boot for QEMU's arm64 `virt` machine, from Debian's `u-boot-qemu`.
const UBOOT_QEMU_ARM64: &str = "/usr/lib/u-boot/qemu_arm64/u-boot.bin";
/// Where the boot script puts the FIT before `bootm` (QEMU RAM starts at
/// 0x4000_0000; U-Boot relocates itself to the top of the 512 MiB).
const UBOOT_FIT_ADDR: u64 = 0x4800_0000;
/// Guard against a hung boot; a good run takes about 3 s.
const UBOOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Installs `u-boot-qemu` (a file, not a command on `PATH`) like
/// [`system::ensure_system_packages`] does for commands.
fn ensure_uboot_qemu() -> Result<PathBuf, Error> {
    let path = PathBuf::from(UBOOT_QEMU_ARM64);
    if path.is_file() {
        return Ok(path);
    }
    if !system::is_root() {
        return Err(Error::new(format!(
            "missing {UBOOT_QEMU_ARM64}; run as root:\n    apt-get update && apt-get install -y u-boot-qemu"
        )));
    }
    util::run(Command::new("apt-get").arg("update"))?;
    util::run(
        Command::new("apt-get")
            .args(["install", "-y", "u-boot-qemu"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::new(format!(
            "installed u-boot-qemu but {UBOOT_QEMU_ARM64} is missing"
        )))
    }
}

/// The U-Boot commands that load and start a FIT, as on a board: fetch it
/// by TFTP, then `bootm` its configuration with U-Boot's own device tree
/// (the Linux arm64 boot path needs one).
pub fn uboot_boot_commands(fit_name: &str, addr: u64) -> String {
    format!("tftpboot {addr:#x} {fit_name}\nbootm {addr:#x}#conf-1 - ${{fdtcontroladdr}}\n")
}

/// Test step `uboot-qemu`: the qemu-virt FIT booted the way U-Boot boots
/// it on a board. QEMU `virt` at EL2 (`virtualization=on`) runs Debian's
/// U-Boot, whose default boot fetches `boot.scr.uimg` by TFTP from QEMU's
/// user network; that script fetches the FIT and runs `bootm`. Passes when
/// U-Boot verifies the FIT and the firmware prints its banner (it then
/// stops through semihosting: it has no node configuration here).
pub fn uboot_qemu_step(ctx: &mut Context) -> Result<(), Error> {
    system::ensure_system_packages(
        &[("qemu-system-aarch64", "qemu-system-arm")],
        "to boot U-Boot and the image under emulation",
    )?;
    let uboot = ensure_uboot_qemu()?;
    let board = find_board("qemu-virt").ok_or_else(|| Error::new("no qemu-virt board"))?;
    let image = build(board)?;
    let tftp = images_dir().join("uboot-tftp");
    fs::create_dir_all(&tftp)?;
    let fit_name = "qemu-virt.itb";
    fs::copy(&image.fit, tftp.join(fit_name))?;
    fs::write(
        tftp.join("boot.cmd"),
        uboot_boot_commands(fit_name, UBOOT_FIT_ADDR),
    )?;
    util::run(
        Command::new("mkimage")
            .current_dir(&tftp)
            .args(["-A", "arm64", "-T", "script", "-C", "none", "-n"])
            .args(["metaroce-boot", "-d", "boot.cmd", "boot.scr.uimg"]),
    )?;
    let log_path = tftp.join("console.log");
    let log = fs::File::create(&log_path)?;
    let mut cmd = Command::new("qemu-system-aarch64");
    cmd.args([
        "-M",
        "virt,virtualization=on",
        "-cpu",
        "cortex-a72",
        "-m",
        "512M",
    ])
    .args(["-nographic", "-semihosting", "-bios"])
    .arg(&uboot)
    .arg("-netdev")
    .arg(format!("user,id=n0,tftp={}", tftp.display()))
    .args(["-device", "virtio-net-device,netdev=n0"])
    .stdin(std::process::Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log);
    println!("$ {}", util::display(&cmd));
    let mut child = cmd.spawn()?;
    let started = std::time::Instant::now();
    let timed_out = loop {
        if child.try_wait()?.is_some() {
            break false;
        }
        if started.elapsed() > UBOOT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let bytes = fs::read(&log_path)?;
    let console = String::from_utf8_lossy(&bytes);
    let mut failed = Vec::new();
    for (name, needle) in [
        ("U-Boot fetched the FIT by TFTP", "Bytes transferred"),
        ("bootm verified the FIT's sha256", "sha256+ OK"),
        (
            "bootm used the FIT's load address",
            "Load Address: 0x40080000",
        ),
        ("bootm started the image", "Starting kernel"),
        ("the firmware ran (banner)", "metaroce qemu-virt firmware"),
    ] {
        let ok = console.contains(needle);
        println!(
            "uboot-qemu: {name} ... {}",
            if ok { "ok" } else { "FAILED" }
        );
        if ok {
            ctx.tally.passed += 1;
        } else {
            ctx.tally.failed += 1;
            failed.push(name);
        }
    }
    ctx.ran_tests = true;
    println!(
        "uboot-qemu: console in {} ({:.1} s{})",
        log_path.display(),
        started.elapsed().as_secs_f64(),
        if timed_out {
            ", killed at the timeout"
        } else {
            ""
        }
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "U-Boot boot of the FIT failed: {} (see {})",
            failed.join("; "),
            log_path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // What Debian bookworm's dumpimage (u-boot-tools 2023.01) printed for
    // the Elba image.
    const LISTING: &str = "FIT description: MetaRoCE firmware for the AMD Pensando Elba ARM complex
Created:         Mon Nov 30 21:30:00 2026
 Image 0 (firmware-1)
  Description:  pensando-elba firmware (raw binary, aarch64-rt entry first)
  Created:      Mon Nov 30 21:30:00 2026
  Type:         Kernel Image
  Compression:  uncompressed
  Data Size:    114688 Bytes = 112.00 KiB = 0.11 MiB
  Architecture: AArch64
  OS:           Linux
  Load Address: 0xc0080000
  Entry Point:  0xc0080000
  Hash algo:    sha256
  Hash value:   00
 Default Configuration: 'conf-1'
 Configuration 0 (conf-1)
  Description:  pensando-elba
  Kernel:       firmware-1
";

    #[test]
    fn boot_script_fetches_then_boots_the_configuration() {
        assert_eq!(
            uboot_boot_commands("x.itb", 0x4800_0000),
            "tftpboot 0x48000000 x.itb\nbootm 0x48000000#conf-1 - ${fdtcontroladdr}\n"
        );
    }

    #[test]
    fn dumpimage_addresses_are_parsed() {
        assert_eq!(parse_dumpimage(LISTING), Some((0xc008_0000, 0xc008_0000)));
        assert_eq!(parse_dumpimage("Load Address: 0x10\n"), None);
        assert_eq!(
            parse_dumpimage("Load Address: zz\nEntry Point: 0x1\n"),
            None
        );
    }

    #[test]
    fn its_uses_one_cell_below_4g_and_two_above() {
        let board = &BOARDS[0];
        let low = its_text(board, "x.bin", 0xc008_0000, 0xc008_0000);
        assert!(low.contains("#address-cells = <1>;"));
        assert!(low.contains("load = <0xc0080000>;"));
        assert!(low.contains("type = \"kernel\";") && low.contains("os = \"linux\";"));
        assert!(low.contains("/incbin/(\"x.bin\")"));
        let high = its_text(board, "x.bin", 0x8_0008_0000, 0x8_0008_0000);
        assert!(high.contains("#address-cells = <2>;"));
        assert!(high.contains("entry = <0x8 0x80000>;"));
    }

    #[test]
    fn board_toml_addresses_are_read() {
        let (load, entry) = board_addresses(&BOARDS[0]).unwrap().unwrap();
        assert_eq!(load, entry);
        assert_eq!(load % 4096, 0);
        assert!(board_addresses(&BOARDS[1]).unwrap().is_none());
        assert!(find_board("pensando-elba").is_some());
        assert!(find_board("nope").is_none());
    }

    /// A minimal ELF64: header, one PT_LOAD, sections (null, .text, .bss,
    /// .stack, .comment, .shstrtab).
    fn tiny_elf() -> Vec<u8> {
        let names = b"\0.text\0.bss\0.stack\0.comment\0.shstrtab\0";
        let mut b = vec![0u8; 0x40];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[0x18..0x20].copy_from_slice(&0x4008_0000u64.to_le_bytes());
        let phoff = b.len() as u64;
        let mut ph = vec![0u8; 56];
        ph[..4].copy_from_slice(&1u32.to_le_bytes());
        ph[0x18..0x20].copy_from_slice(&0x4008_0000u64.to_le_bytes());
        ph[0x20..0x28].copy_from_slice(&0x100u64.to_le_bytes());
        ph[0x28..0x30].copy_from_slice(&0x3100u64.to_le_bytes());
        b.extend_from_slice(&ph);
        let strtab_off = b.len() as u64;
        b.extend_from_slice(names);
        let shoff = b.len() as u64;
        // (name offset, flags, addr, offset, size)
        let sections: [(u32, u64, u64, u64, u64); 6] = [
            (0, 0, 0, 0, 0),
            (1, 0x6, 0x4008_0000, 0, 0x100),
            (7, 0x3, 0x4008_1000, 0, 0x40),
            (12, 0x3, 0x4008_2000, 0, 0x1000),
            (19, 0x30, 0, 0, 0x20),
            (28, 0, 0, strtab_off, names.len() as u64),
        ];
        for (name, flags, addr, off, size) in sections {
            let mut sh = vec![0u8; 64];
            sh[..4].copy_from_slice(&name.to_le_bytes());
            sh[8..16].copy_from_slice(&flags.to_le_bytes());
            sh[0x10..0x18].copy_from_slice(&addr.to_le_bytes());
            sh[0x18..0x20].copy_from_slice(&off.to_le_bytes());
            sh[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&sh);
        }
        b[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&6u16.to_le_bytes());
        b[0x3e..0x40].copy_from_slice(&5u16.to_le_bytes());
        b
    }

    #[test]
    fn elf_sections_are_sized_by_kind() {
        let elf = Elf::parse(&tiny_elf()).unwrap();
        assert_eq!(elf.entry, 0x4008_0000);
        assert_eq!(elf.load_address(), Some(0x4008_0000));
        let r = elf.size_report();
        assert_eq!(
            (r.text, r.rodata, r.data, r.bss, r.stack),
            (0x100, 0, 0, 0x40, 0x1000)
        );
        assert_eq!(r.other, 0, ".comment is not allocated");
        assert_eq!(r.footprint, 0x3000);
        assert!(r.to_string().contains(".bss"));
    }

    #[test]
    fn bad_elf_files_are_errors_not_panics() {
        assert!(Elf::parse(b"").is_err());
        assert!(Elf::parse(b"\x7fELF\x01\x01").is_err());
        let mut truncated = tiny_elf();
        truncated.truncate(0x50);
        assert!(Elf::parse(&truncated).is_err());
        let mut bad_strtab = tiny_elf();
        bad_strtab[0x3e] = 0; // shstrndx -> the null section: empty names
        assert!(Elf::parse(&bad_strtab).is_ok());
    }
}
