//! Helpers shared by the host tests.

use std::io::Write;

/// Reports that `test` cannot run here and why; the caller then returns.
///
/// The reason goes to stderr. When `METAROCE_SKIP_LOG` names a file (as
/// `cargo xtask test` sets it), one line `test: why` is appended to it, so
/// the xtask counts the test as skipped instead of passed.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Some(path) = std::env::var_os("METAROCE_SKIP_LOG") {
        let line = format!("{test}: {why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot append to {}: {e}", path.to_string_lossy());
        }
    }
}
