//! Linker scripts for the firmware: aarch64-rt's `image.ld`, our
//! `memory.ld` (where QEMU `virt` loads the image) and defmt's `defmt.x`.
//! Only for the bare-metal target; host builds of the stub need nothing.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-changed=memory.ld");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("none") {
        return;
    }
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!("cargo::rustc-link-search={}", dir.display());
    println!("cargo::rustc-link-arg=-Timage.ld");
    println!("cargo::rustc-link-arg=-Tmemory.ld");
    println!("cargo::rustc-link-arg=-Tdefmt.x");
}
