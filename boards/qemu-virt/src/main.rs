//! The qemu-virt firmware image: everything is in `board-qemu-virt-node`.
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
use board_qemu_virt_node as _;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-qemu-virt is firmware: build it with --target aarch64-unknown-none");
}
