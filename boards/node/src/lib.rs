//! # metaroce-node
//!
//! The MetaRoCE firmware node, one for every board: the image crate of a
//! board (`board-qemu-virt`, `board-pensando-elba`) links this crate with
//! one board feature on, and reaches the hardware only through the
//! board's drivers behind `metaroce_board::Board` (`hw`, [`hw::ThisBoard`]).
//! The per-packet code is in `metaroce-node-engine` (the one instantiation
//! of the engine loop for every role and core). After the board's entry
//! point it reads its configuration line (`config`: QEMU's fw_cfg file
//! `opt/metaroce/config`, or the Elba's `board.toml`), starts the entropy
//! source, the interrupt controller and the network device, and runs its
//! role:
//!
//! - `role=workload` (`multicore`, `workload`): a task that plays a host
//!   application registers memory and posts work only through the
//!   host-interface rings and doorbells, checks the integrity of every
//!   byte moved, prints one `METAROCE-RESULT` line and ends the run with a
//!   status the harness reads (0 ok, 1 integrity or workload failure, 101
//!   panic). With `cores=N` core 0 starts the others (PSCI `CPU_ON`) and
//!   every core runs its own engine loop, endpoint (a shard of the
//!   connection table) and share of the workload; on a board with one
//!   NIC device (QEMU) core 0 steers each received frame to the core that
//!   owns its connection (`metaroce_platform::shard`), on a board whose
//!   NIC side steers (`Board::NIC_STEERS`, the Elba) every core opens its
//!   own rings.
//! - `role=serve` (`serve`): the serve profile of `metaroce serve`; host
//!   clients and the compliance suite reach it, until stopped.
//! - `role=host` (`hostif`): driven by host processes through the
//!   shared-memory host interface of spec chapter 6 (QEMU's ivshmem BAR,
//!   the Elba's `[host_interface]` region), until stopped.
//! - `role=bench` (`bench`, QEMU only, feature `bench-role`): the CRC and
//!   the engine loop per packet counted by the PMU.
//!
//! Text lines go to the board's console; logs are `defmt` frames through
//! the board's transport (QEMU: semihosting; Elba: the console). It is
//! **not** a general OS: polling plus `wfi`, no heap.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "bench-role")]
mod bench;
mod config;
mod cores;
/// The per-packet code, compiled in a crate of its own.
use metaroce_node_engine as engine;
mod hostif;
pub mod hw;
mod logger;
mod memcpy;
mod multicore;
mod node;
mod report;
mod serve;
mod workload;

pub use node::main;
