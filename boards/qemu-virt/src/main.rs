//! The qemu-virt firmware image: the shared node (`metaroce-node`) built
//! for QEMU `virt`'s drivers (`board-qemu-virt-drivers`). This crate holds
//! only the entry point and the linker scripts (`build.rs`, `memory.ld`).
#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
mod image {
    use board_qemu_virt_drivers::hw;

    // 1 MiB boot stack: the MetaRoCE endpoint lives in `main`'s frame.
    aarch64_rt::entry!(boot, 256);

    fn boot(_x0: u64, _x1: u64, _x2: u64, _x3: u64) -> ! {
        hw::install_vectors();
        metaroce_node::main()
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-qemu-virt is firmware: build it with --target aarch64-unknown-none");
}
