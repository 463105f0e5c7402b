//! Debian packages that a step needs (QEMU, `u-boot-tools`, `tshark`, ...):
//! found on `PATH`, installed with `apt-get` when running as root (CI is a
//! fresh Debian machine as root), otherwise a clear message with the exact
//! command to run.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::util::{self, Error};

/// `apt-get update` runs at most once per xtask process.
static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// Makes sure each `(binary, debian_package)` is available: a binary missing
/// from `PATH` gets its package installed (all missing ones in one
/// `apt-get install`) when running as root, or the xtask stops with the
/// command to run. Example:
/// `ensure_system_packages(&[("qemu-system-aarch64", "qemu-system-arm")], "to boot the
/// emulated DPUs")`; `why` is printed in the one line that says what
/// is installed.
///
/// Packages are installed without their recommendations: QEMU's would
/// bring a desktop's worth of GUI and codec libraries the harness never
/// loads.
pub fn ensure_system_packages(needed: &[(&str, &str)], why: &str) -> Result<(), Error> {
    let missing = missing_packages(needed);
    if missing.is_empty() {
        return Ok(());
    }
    let install = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() {
        return Err(Error::new(format!(
            "missing system packages: {}\nrun as root:\n    apt-get update && {install}",
            missing.join(", ")
        )));
    }
    if !APT_UPDATED.swap(true, Ordering::SeqCst) {
        util::run(Command::new("apt-get").arg("update"))?;
    }
    println!("installing {} ({why})", missing.join(" "));
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    util::run(&mut cmd)?;
    let still_missing = missing_packages(needed);
    if still_missing.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "installed {} but still missing the binaries of: {}",
            missing.join(" "),
            still_missing.join(", ")
        )))
    }
}

/// The packages whose binary is not on `PATH`, each once, in order.
fn missing_packages<'a>(needed: &[(&str, &'a str)]) -> Vec<&'a str> {
    let mut missing = Vec::new();
    for &(binary, package) in needed {
        if find_on_path(binary).is_none() && !missing.contains(&package) {
            missing.push(package);
        }
    }
    missing
}

/// The first executable file named `binary` in the folders of `PATH`.
pub fn find_on_path(binary: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// Whether this process runs as root (`id -u` prints 0).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_on_path_are_found() {
        // `sh` is on every machine that can run this xtask.
        assert!(find_on_path("sh").is_some());
        assert!(find_on_path("metaroce-no-such-binary-xyz").is_none());
    }

    #[test]
    fn only_missing_packages_are_listed_once() {
        let needed = [
            ("sh", "dash"),
            ("metaroce-no-such-binary-a", "pkg-a"),
            ("metaroce-no-such-binary-b", "pkg-a"),
            ("metaroce-no-such-binary-c", "pkg-c"),
        ];
        assert_eq!(missing_packages(&needed), ["pkg-a", "pkg-c"]);
    }

    #[test]
    fn present_binaries_need_no_install() {
        assert!(ensure_system_packages(&[("sh", "dash")], "a shell").is_ok());
    }
}
