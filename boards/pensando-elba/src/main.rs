//! # board-pensando-elba (firmware)
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-pensando-elba is firmware: build it with --target aarch64-unknown-none");
}
