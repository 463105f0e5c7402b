//! # metaroce-bench
//!
//! Host micro-benchmark of the MetaRoCE engine ([`metaroce_core::Endpoint`]):
//! the cost per data packet of the full TX → RX → ACK cycle between two
//! endpoints in one process, set beside the cost of copying its 4 KiB
//! payload once, and the engine's memory per connection. `cargo xtask bench`
//! runs the binary in release and writes `target/metaroce/bench.csv`.
//!
//! It is **not** a correctness test (the engine tests in `metaroce-core` are)
//! and nothing here asserts on time: the `cargo test` smoke test drives the
//! same [`Pair`] and checks counts only.
//!
//! Payload is never copied. The receiver's [`PlacementLog`] records where
//! each payload would be placed instead of writing it, the sender's reads
//! nothing, and a data packet's payload is whatever bytes already lie after
//! the header in its transmit buffer. The CRC-32 trailer is real: the sender
//! computes it over the whole packet and the receiver verifies it, as on a
//! host without CRC offload. [`measure`] times that CRC alone so it can be
//! taken out of the total, and [`Pair::set_crc_offload`] runs the cycle
//! with the trailer left to a device (the platform's CRC-offload seam), so
//! the engine's cost without the CRC is also measured, not only derived.
//!
//! [`aead`] times packet protection: AES-256-GCM seal and open of one
//! 4 KiB packet.
//!
//! [`dispatch`] times the multi-core frame dispatcher of
//! `metaroce_platform::shard`: what the core that owns a NIC without
//! steering pays per frame to bring it to the core owning its connection.
//! [`multicore`] runs the cycle on 1 and 2 threads, each a shard of one
//! connection table with its own connections, and reports the packet rate.

pub mod aead;
pub mod dispatch;
pub mod measure;
pub mod multicore;
mod pair;

pub use pair::{BenchEndpoint, BenchError, Pair, PhaseTimes, PlacementLog, RunCounts, PAYLOAD};
