//! # metaroce-verbs
//!
//! The host library of MetaRoCE: what an AI job on the host links to drive
//! the DPU it is plugged into. It maps the DPU's host-interface memory (a
//! file under QEMU: the ivshmem BAR2's backing file; a PCI BAR on
//! hardware), claims one queue set, and offers verbs-like calls: open the
//! device ([`Device::open`]), carve and register memory ([`Device::alloc`],
//! [`Device::register`], [`Device::deregister`]), connect, listen, accept,
//! close and release connections, post sends and receives
//! ([`Device::post_send`], [`Device::post_recv`]), poll completions
//! ([`Device::poll_cq`]) and events, and query counters. The byte layout
//! it speaks is `metaroce-abi` (specification chapter 6); the C API
//! ([`capi`], header `include/metaroce_verbs.h`) wraps the same calls.
//!
//! Buffers live in the queue set's data window of the shared memory, and
//! addresses are the ABI's I/O addresses (offsets into that memory); data
//! moves in and out by copies ([`Device::write`], [`Device::read`]), so no
//! `unsafe` reaches the library's users. `unsafe` is confined to the
//! mapping ([`mapping`]) and the C entry points ([`capi`]).
//!
//! It is **not** a transport: the DPU's firmware runs MetaRoCE; this
//! library only fills and drains the rings. Calls do not block except the
//! admin ones (register, connect, ...), which wait for the device's answer
//! with a timeout; waiting polls with back-off.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod capi;
mod device;
pub mod mapping;
mod types;

pub use device::{read_struct, Device, DeviceInfo, OpenOptions, Queue};
pub use mapping::SharedFile;
pub use metaroce_abi as abi;
pub use types::{
    Access, Conn, Error, Event, MemoryRegion, Opcode, RecvWr, Remote, SendOp, SendWr, Sge, Status,
    WorkCompletion,
};
