//! # metaroce-core
//!
//! The MetaRoCE protocol core: wire formats and (in later modules) the
//! connection engine, logical paths, congestion control and memory keys of an
//! RDMA transport for lossy Ethernet. It is a sans-IO state machine: it reads
//! no clock (time is an argument), performs no I/O, never allocates and
//! contains no `unsafe`; every capacity is fixed at compile time. The same
//! code runs in DPU firmware, under QEMU and in host programs.
//!
//! It is **not** a driver: moving frames, ringing doorbells and copying
//! payloads belong to `metaroce-platform`.
//!
//! Layers:
//! * [`wire`]: packet formats in the smoltcp style (checked views, `Repr`s
//!   with `parse`/`emit`), the 256-bit SACK bitvector and the Ethernet/IP/UDP
//!   encapsulation.
//!
//! Section numbers in comments (`spec 4.2`) refer to `docs/spec/`.

#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod api;
pub mod cc;
pub mod config;
pub mod conn;
pub mod crypto;
pub mod endpoint;
pub mod memory;
pub mod path;
pub mod psn;
pub mod rng;
pub mod rtt;
pub mod stats;
pub mod storage;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
pub mod wire;

pub use config::Config;
pub use conn::{ConnState, Event};
pub use endpoint::{
    finish_packet, CommandError, ConnSlot, Endpoint, Footprint, PoolUsage, Shard, SourceBucket,
};
#[cfg(feature = "alloc")]
pub use storage::Heap;
pub use storage::{Backing, Borrowed, Layout, Storage};
pub use time::Instant;
