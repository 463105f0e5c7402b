//! # board-pensando-elba (firmware)
//!
//! MetaRoCE firmware for the AMD Pensando Elba ARM complex (Cortex-A72),
//! loaded by U-Boot from a FIT image (`cargo xtask image --board
//! pensando-elba`). It boots on `aarch64-rt` at the exception level U-Boot
//! hands over (EL2 expected; see `hw`), maps DRAM and MMIO from
//! `board.toml`, brings up the ns16550a console (text, then `defmt`
//! frames), the GICv3 (timer and doorbell interrupts), the generic timer,
//! formats the shared-memory descriptor rings and host queues at the
//! addresses of `board.toml`, and runs the platform's engine loop (the
//! same code as under QEMU) with a MetaRoCE endpoint.
//!
//! It is **not** verified on hardware: no Elba was available. What is read
//! from public sources, what is assumed and what is unverified is listed in
//! `README.md`. One engine loop per core (`cores.count` in `board.toml`),
//! polling plus `wfi`, no heap.

#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_os = "none")]
mod hw;
#[cfg(target_os = "none")]
mod logger;
#[cfg(target_os = "none")]
mod node;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-pensando-elba is firmware: build it with --target aarch64-unknown-none");
}
