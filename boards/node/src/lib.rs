//! # board-qemu-virt-node
//!
//! MetaRoCE firmware for QEMU `virt` (`-cpu cortex-a72`): one image for
//! every node (the `board-qemu-virt` crate links this one into it; the
//! per-packet code is in `board-qemu-virt-engine`, compiled for speed,
//! while this crate is compiled for size). It boots on `aarch64-rt`
//! (identity map, PSCI; its own exception vectors, `hw`), brings up the PL011 console, the GICv2, the generic timer and the
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
//! With `role=bench` it measures the CRC and the engine loop per packet
//! with the PMU and exits (`bench`; only in the images `cargo xtask bench
//! --firmware` builds with the `bench-role` feature, so the code budget
//! counts what a node runs).
//! It is **not** a general OS: polling plus `wfi`, no heap.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "bench-role")]
mod bench;
mod config;
/// The per-packet code, compiled in a crate of its own.
use metaroce_node_engine as engine;
mod hostif;
pub mod hw;
mod memcpy;
mod multicore;
mod node;
mod report;
mod serve;
mod workload;

pub use node::main;
