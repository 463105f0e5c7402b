//! # board-pensando-elba (firmware image)
//!
//! MetaRoCE firmware for the AMD Pensando Elba ARM complex (Cortex-A72),
//! loaded by U-Boot from a FIT image (`cargo xtask image --board
//! pensando-elba`): the shared node (`metaroce-node`, the same code as the
//! QEMU image) built for the Elba's drivers
//! (`board-pensando-elba-drivers`), configured by `board.toml`. This crate
//! holds only the entry point and the linker scripts (`build.rs`
//! generates `memory.ld` from `board.toml`).
//!
//! It boots on `aarch64-rt` at the exception level U-Boot hands over (EL2
//! expected), brings up the ns16550a console and prints the banner, then
//! runs the node. What is read from public sources, what is assumed and
//! what is unverified is listed in `README.md`.

#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
mod image {
    use board_pensando_elba_drivers::{board, hw};

    aarch64_rt::entry!(boot, { board::STACK_PAGES });

    fn boot(x0: u64, _x1: u64, _x2: u64, _x3: u64) -> ! {
        hw::init_console();
        hw::banner(x0);
        metaroce_node::main()
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-pensando-elba is firmware: build it with --target aarch64-unknown-none");
}
