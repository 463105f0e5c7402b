//! Proof that the firmware-side crates link no allocator: build them in
//! release for the bare-metal target, then list every symbol of every
//! library that build produced (the crate and all its dependencies) with the
//! `llvm-nm` of rustup's `llvm-tools` component, and fail on any symbol of
//! Rust's global allocator interface.
//!
//! Using `alloc` (a `Vec`, a `Box`) leaves undefined references to these
//! symbols in the user's object code, so their absence from every library
//! is the proof. Since Rust 1.89 they are mangled
//! (`_RNv..7___rustc12___rust_alloc`), hence the substring match.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::project::{ALLOCATION_FREE_CRATES, FIRMWARE_TARGET};
use crate::util::{self, Error};

/// Symbol names (or parts of mangled names) of the global allocator.
pub const ALLOCATOR_SYMBOLS: &[&str] = &[
    "__rust_alloc",
    "__rust_dealloc",
    "__rust_realloc",
    "__rust_alloc_zeroed",
    "__rg_alloc",
    "__rust_no_alloc_shim_is_unstable",
];

/// The test step: release-build [`ALLOCATION_FREE_CRATES`] for the firmware
/// target and check every library of that build.
pub fn run() -> Result<(), Error> {
    let llvm_nm = find_llvm_nm()?;
    let mut args = vec![
        "build".to_string(),
        "--release".into(),
        "--target".into(),
        FIRMWARE_TARGET.into(),
        "--message-format=json-render-diagnostics".into(),
    ];
    for krate in ALLOCATION_FREE_CRATES {
        args.extend(["-p".to_string(), (*krate).to_string()]);
    }
    let mut cmd = util::cargo(&args);
    println!("$ {}", util::display(&cmd));
    let messages = util::output(&mut cmd)?;
    let libraries = built_libraries(&messages);
    if libraries.is_empty() {
        return Err(Error::new(format!(
            "the build reported no {FIRMWARE_TARGET} library to check"
        )));
    }
    let mut total_symbols = 0;
    let mut found = Vec::new();
    for lib in &libraries {
        let symbols = symbols(&llvm_nm, lib)?;
        total_symbols += symbols.len();
        for symbol in symbols {
            if let Some(pattern) = allocator_symbol(&symbol) {
                found.push(format!("{}: {symbol} ({pattern})", lib.display()));
            }
        }
    }
    let names: Vec<String> = libraries
        .iter()
        .filter_map(|p| p.file_stem())
        .map(|s| {
            let s = s.to_string_lossy();
            let s = s.strip_prefix("lib").unwrap_or(&s);
            // Drop cargo's `-<hash>` suffix of dependencies.
            s.split('-').next().unwrap_or(s).to_string()
        })
        .collect();
    println!(
        "no-alloc: {} symbols in {} libraries ({}) for {FIRMWARE_TARGET}",
        total_symbols,
        libraries.len(),
        names.join(", ")
    );
    if total_symbols == 0 {
        return Err(Error::new(
            "llvm-nm listed no symbols at all, so the check proves nothing",
        ));
    }
    if found.is_empty() {
        println!(
            "no-alloc: no allocator symbol ({})",
            ALLOCATOR_SYMBOLS.join(", ")
        );
        Ok(())
    } else {
        for f in &found {
            eprintln!("no-alloc: {f}");
        }
        Err(Error::new(format!(
            "{} allocator symbol(s) linked into code that must not allocate",
            found.len()
        )))
    }
}

/// The allocator symbol that `symbol` is or contains (the longest, so
/// `__rust_alloc_zeroed` is not reported as `__rust_alloc`), if any.
pub fn allocator_symbol(symbol: &str) -> Option<&'static str> {
    ALLOCATOR_SYMBOLS
        .iter()
        .copied()
        .filter(|pattern| symbol.contains(pattern))
        .max_by_key(|pattern| pattern.len())
}

/// The `.rlib`s for the firmware target named in cargo's JSON messages.
fn built_libraries(messages: &str) -> Vec<PathBuf> {
    let target_dir_part = format!("/{FIRMWARE_TARGET}/");
    let mut libs: Vec<PathBuf> = messages
        .lines()
        .filter(|line| {
            util::json_string_field(line, "reason").as_deref() == Some("compiler-artifact")
        })
        .filter_map(|line| util::json_string_array(line, "filenames"))
        .flatten()
        .filter(|f| f.ends_with(".rlib") && f.replace('\\', "/").contains(&target_dir_part))
        .map(PathBuf::from)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

/// Every symbol name (defined or undefined) in an archive or object file.
fn symbols(llvm_nm: &Path, file: &Path) -> Result<Vec<String>, Error> {
    let out = Command::new(llvm_nm)
        .arg(file)
        .output()
        .map_err(|e| Error::new(format!("cannot run {}: {e}", llvm_nm.display())))?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "{} {} failed: {}",
            llvm_nm.display(),
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(parse_nm(&String::from_utf8_lossy(&out.stdout)))
}

/// Symbol names from `llvm-nm`'s default output: `ADDRESS TYPE NAME` or
/// `TYPE NAME` lines, with `member.o:` headers and blank lines between.
pub fn parse_nm(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [_address, kind, name] if kind.len() == 1 => Some(name.to_string()),
                [kind, name] if kind.len() == 1 => Some(name.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// `llvm-nm` from the active toolchain's `llvm-tools` component:
/// `$(rustc --print sysroot)/lib/rustlib/*/bin/llvm-nm`.
pub fn find_llvm_nm() -> Result<PathBuf, Error> {
    let mut rustc = Command::new("rustc");
    rustc
        .args(["--print", "sysroot"])
        .current_dir(util::project_root());
    let sysroot = PathBuf::from(util::output(&mut rustc)?.trim());
    let rustlib = sysroot.join("lib").join("rustlib");
    let exe = if cfg!(windows) {
        "llvm-nm.exe"
    } else {
        "llvm-nm"
    };
    if let Ok(entries) = std::fs::read_dir(&rustlib) {
        let mut candidates: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin").join(exe))
            .filter(|p| p.is_file())
            .collect();
        candidates.sort();
        if let Some(found) = candidates.into_iter().next() {
            return Ok(found);
        }
    }
    Err(Error::new(format!(
        "llvm-nm not found under {}/*/bin; install it with:\n    rustup component add llvm-tools\n(run in {}, so the toolchain of rust-toolchain.toml gets it)",
        rustlib.display(),
        util::project_root().display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    // What llvm-nm printed for a no_std crate that used `alloc::vec!` and
    // `Vec::with_capacity` (Rust 1.95, aarch64-unknown-none).
    const NM_WITH_ALLOC: &str = "
lib.rmeta:

allocprobe-1.allocprobe.abc-cgu.0.rcgu.o:
                 U _RNvCsfLfy6EI15iL_7___rustc12___rust_alloc
                 U _RNvCsfLfy6EI15iL_7___rustc19___rust_alloc_zeroed
                 U _RNvCsfLfy6EI15iL_7___rustc35___rust_no_alloc_shim_is_unstable_v2
0000000000000000 T _ZN10allocprobe4make17h0123456789abcdefE
";

    const NM_CLEAN: &str = "
metaroce_core-1.metaroce_core.b9-cgu.0.rcgu.o:
                 U _RNvNtCsbcsGJ9IzBgZ_4core3fmt5write
---------------- T _ZN13metaroce_core4wire5encap11parse_frame17hf62c62f6178e86daE
";

    #[test]
    fn nm_output_is_parsed_into_names() {
        let names = parse_nm(NM_WITH_ALLOC);
        assert_eq!(names.len(), 4);
        assert_eq!(names[3], "_ZN10allocprobe4make17h0123456789abcdefE");
        assert_eq!(parse_nm(NM_CLEAN).len(), 2);
    }

    #[test]
    fn mangled_allocator_symbols_are_caught() {
        let hits: Vec<_> = parse_nm(NM_WITH_ALLOC)
            .iter()
            .filter_map(|s| allocator_symbol(s))
            .collect();
        assert_eq!(
            hits,
            [
                "__rust_alloc",
                "__rust_alloc_zeroed",
                "__rust_no_alloc_shim_is_unstable"
            ]
        );
        assert!(parse_nm(NM_CLEAN)
            .iter()
            .all(|s| allocator_symbol(s).is_none()));
        assert_eq!(allocator_symbol("__rg_alloc"), Some("__rg_alloc"));
        assert_eq!(allocator_symbol("__rust_dealloc"), Some("__rust_dealloc"));
    }

    #[test]
    fn only_firmware_rlibs_are_taken_from_cargo_messages() {
        let messages = [
            r#"{"reason":"compiler-artifact","filenames":["/t/aarch64-unknown-none/release/deps/libsmoltcp-1.rlib","/t/aarch64-unknown-none/release/deps/libsmoltcp-1.rmeta"]}"#,
            r#"{"reason":"compiler-artifact","filenames":["/t/release/build/x/build_script_build-1"]}"#,
            r#"{"reason":"compiler-artifact","filenames":["/t/release/deps/libproc-1.so"]}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            built_libraries(&messages),
            [PathBuf::from(
                "/t/aarch64-unknown-none/release/deps/libsmoltcp-1.rlib"
            )]
        );
    }
}
