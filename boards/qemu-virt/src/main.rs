//! # board-qemu-virt
//!
//! MetaRoCE firmware for QEMU `virt` (`-cpu cortex-a72`): one image for
//! every node. It boots on `aarch64-rt` (identity map, exception vectors,
//! PSCI), brings up the PL011 console, the GICv2, the generic timer and the
//! first virtio-net device, reads its role from QEMU's fw_cfg file
//! `opt/metaroce/config`, and runs the platform's engine loop with a
//! workload task that plays a host application: it registers memory and
//! posts work only through the host-interface rings and doorbells, checks
//! the integrity of every byte moved, prints one `METAROCE-RESULT` line on
//! the console and exits through semihosting with a status the harness
//! reads (0 ok, 1 integrity or workload failure, 101 panic). With
//! `role=serve` it runs the serve profile of `metaroce serve` instead
//! (`serve`): host clients and the compliance suite reach it through the
//! harness's gateway, and it runs until the harness stops QEMU. With
//! `role=host` it is driven by host processes outside QEMU through the
//! shared-memory host interface in an ivshmem BAR (`pci`, `hostif`).
//!
//! Logs are `defmt` frames written through semihosting to QEMU's standard
//! output (the harness decodes them with the ELF); the PL011 console, which
//! the harness sends to a file, carries only text.
//! With `cores=N` (and QEMU's `-smp N`) core 0 starts the other cores with
//! PSCI `CPU_ON` and every core runs its own engine loop, endpoint and
//! share of the workload; core 0 also owns the virtio-net device and
//! steers each received frame to the core that owns its connection
//! (`multicore`, `smp`, `metaroce_platform::shard`).
//! It is **not** a general OS: polling plus `wfi`, no heap.

#![cfg_attr(target_os = "none", no_std, no_main)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_os = "none")]
mod bench;
#[cfg(target_os = "none")]
mod config;
/// The per-packet code, compiled for speed in a crate of its own.
#[cfg(target_os = "none")]
use board_qemu_virt_engine as engine;
#[cfg(target_os = "none")]
mod hostif;
#[cfg(target_os = "none")]
mod hw;
#[cfg(target_os = "none")]
mod logger;
#[cfg(target_os = "none")]
mod multicore;
#[cfg(target_os = "none")]
mod node;
#[cfg(target_os = "none")]
mod pci;
#[cfg(target_os = "none")]
mod report;
#[cfg(target_os = "none")]
mod serve;
#[cfg(target_os = "none")]
mod smp;
#[cfg(target_os = "none")]
mod workload;

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-qemu-virt is firmware: build it with --target aarch64-unknown-none");
}
