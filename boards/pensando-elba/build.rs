//! Reads `board.toml` (the one board configuration) and generates
//! `$OUT_DIR/memory.ld`, the linker's `image` region at the load address
//! (the drivers crate's build script generates the Rust constants from the
//! same file).
//!
//! Every value is checked first (`board_toml.rs`: known keys, alignment,
//! inside DRAM, no overlaps), so a bad edit fails the build with a message
//! instead of a dead board.
//! For the bare-metal target it also passes the linker scripts:
//! aarch64-rt's `image.ld`, the generated `memory.ld` and defmt's `defmt.x`.

#[allow(dead_code)] // the drivers crate generates the constants
#[path = "board_toml.rs"]
mod board_toml;

use std::env;
use std::fs;
use std::path::PathBuf;

use board_toml::{BoardConfig, BoardToml};

fn main() {
    println!("cargo::rerun-if-changed=board.toml");
    println!("cargo::rerun-if-changed=elba-twin.toml");
    println!("cargo::rerun-if-changed=board_toml.rs");
    let file = if env::var_os("CARGO_FEATURE_ELBA_TWIN").is_some() {
        "elba-twin.toml"
    } else {
        "board.toml"
    };
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let text = fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| fail(&format!("cannot read {file}: {e}")));
    let board = BoardToml::parse(&text).unwrap_or_else(|e| fail(&e.0));
    let cfg = BoardConfig::check(&board).unwrap_or_else(|e| fail(&e.0));
    fs::write(out.join("memory.ld"), cfg.memory_ld()).expect("write memory.ld");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        println!("cargo::rustc-link-search={}", out.display());
        println!("cargo::rustc-link-arg-bins=-Timage.ld");
        println!("cargo::rustc-link-arg-bins=-Tmemory.ld");
        println!("cargo::rustc-link-arg-bins=-Tdefmt.x");
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
