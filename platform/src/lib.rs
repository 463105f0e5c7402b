//! # metaroce-platform
//!
//! The platform layer between a transport engine and hardware: small traits
//! for DMA descriptor rings ([`ring`]), doorbells ([`doorbell`]), a
//! monotonic clock ([`clock`]), DMA copies between host memory and packet
//! buffers ([`dma`]), random numbers ([`random`]), entropy sources for
//! the endpoint's secrets ([`entropy`]), frame devices
//! ([`device`], with their CRC offload) and datagram links ([`link`], where a kernel or simulator
//! owns Ethernet/IP/UDP); the host interface a host driver uses ([`host`]: send,
//! receive, completion and admin queues as rings, each with a doorbell);
//! its shared-memory form for host processes outside the firmware
//! ([`hostif`] over [`shmem`], the byte layout of `metaroce-abi`), with
//! every control operation behind one trait ([`control::HostControl`]);
//! and the one engine loop ([`engine`]: a network interface, a host-queue
//! pump and one receive/transmit driver over frames or datagrams) that
//! drives a [`transport::Transport`] through them, answering ARP and ICMP
//! echo on the way ([`net`]), with [`probe`]s of its per-packet path's
//! shape for tests. The same loop runs on the DPU, under QEMU and on a
//! host, on one core or on each of several ([`shard`]: per-core rings and
//! the dispatcher that steers frames to the core owning their connection
//! where the NIC cannot; [`spinlock`]: the lock of the boards' multi-core
//! critical sections; `cpu`, on aarch64 firmware: the architected timer
//! and the wait for an interrupt every board's GIC code shares); only the trait implementations differ: in-memory ones here
//! (for host tests), virtio-net over `virtio-drivers` behind the `virtio`
//! feature ([`virtio`]), UDP sockets in `metaroce-host`, the simulated
//! fabric in `metaroce-sim`.
//!
//! It is **not** a protocol: MetaRoCE (and the RoCEv2 baseline) live in
//! their own sans-IO crates and plug in through [`transport::Transport`]
//! (the engine loop's own tests carry a minimal unreliable stand-in).
//! `no_std`, no allocation; `unsafe` only in the ring slots, the virtio
//! DMA glue and the system registers of `cpu`, each block with a
//! `SAFETY:` comment.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(test)]
extern crate std;

pub mod clock;
pub mod control;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod cpu;
pub mod device;
pub mod dma;
pub mod doorbell;
pub mod engine;
pub mod entropy;
pub mod host;
pub mod hostif;
pub mod link;
pub mod metaroce;
pub mod net;
pub mod probe;
pub mod random;
pub mod ring;
pub mod shard;
pub mod shmem;
pub mod spinlock;
pub mod storage;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
#[cfg(feature = "virtio")]
pub mod virtio;

pub use clock::Clock;
pub use device::FrameDevice;
pub use dma::DmaCopy;
pub use doorbell::Doorbell;
pub use engine::{Engine, EngineStats, PollOutcome};
pub use host::{EnginePort, HostPort, HostQueues};
pub use link::{DatagramLink, DatagramTarget};
pub use random::RandomSource;
pub use ring::{DescriptorRing, RingConsumer, RingProducer, SpscRing};
pub use transport::Transport;

/// The core, for [`static_endpoint_storage!`]'s expansion.
#[doc(hidden)]
pub use metaroce_core as __core;
