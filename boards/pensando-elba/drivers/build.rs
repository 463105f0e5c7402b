//! Reads the board's `board.toml` (one directory up: the one board
//! configuration) and generates `$OUT_DIR/board.rs`, the constants of
//! `board_pensando_elba_drivers::board`. Every value is checked first
//! (`board_toml.rs`: known keys, alignment, inside DRAM, no overlaps), so
//! a bad edit fails the build with a message instead of a dead board. The
//! image crate's build script reads the same file for `memory.ld`.

#[allow(dead_code)] // memory.ld is the image crate's
#[path = "../board_toml.rs"]
mod board_toml;

use std::env;
use std::fs;
use std::path::PathBuf;

use board_toml::{BoardConfig, BoardToml};

fn main() {
    println!("cargo::rerun-if-changed=../board.toml");
    println!("cargo::rerun-if-changed=../elba-twin.toml");
    println!("cargo::rerun-if-changed=../board_toml.rs");
    // The `elba-twin` feature builds the same drivers for the twin's
    // configuration (QEMU `virt` standing in for the Elba).
    let file = if env::var_os("CARGO_FEATURE_ELBA_TWIN").is_some() {
        "../elba-twin.toml"
    } else {
        "../board.toml"
    };
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let text = fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| fail(&format!("cannot read {file}: {e}")));
    let board = BoardToml::parse(&text).unwrap_or_else(|e| fail(&format!("{file}: {}", e.0)));
    let cfg = BoardConfig::check(&board).unwrap_or_else(|e| fail(&format!("{file}: {}", e.0)));
    fs::write(out.join("board.rs"), cfg.rust()).expect("write board.rs");
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
