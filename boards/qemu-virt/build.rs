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
    // The exception vector table (`hw`, 2 KiB aligned) first in `.text`,
    // which starts 2 KiB aligned: anywhere else it leaves up to 2 KiB of
    // padding before it, counted in the code budget.
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let order = out.join("symbol-order.txt");
    std::fs::write(&order, "metaroce_vectors\n").expect("OUT_DIR is writable");
    println!(
        "cargo::rustc-link-arg=--symbol-ordering-file={}",
        order.display()
    );
}
