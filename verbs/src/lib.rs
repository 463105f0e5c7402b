//! # metaroce-verbs
//!
//! The host library of MetaRoCE: what an AI job on the host links to drive
//! the DPU it is plugged into. It maps the DPU's host-interface memory (a
//! file under QEMU: the ivshmem BAR2's backing file; a PCI BAR on
//! hardware), claims one queue set, and offers verbs-like objects, split
//! as libibverbs splits them so that posting and polling can run on
//! different threads:
//!
//! | object | as in libibverbs | what it does |
//! |---|---|---|
//! | [`Device`] | `ibv_context` (and its protection domain) | open ([`Device::open`]); carve, register and deregister memory ([`Device::alloc`], [`Device::register`], [`Device::deregister`]); connect, listen, accept, close and release connections; connection events ([`Device::poll_event`]); counters and quotas |
//! | [`QueuePair`] | `ibv_qp` | post lists of sends and receives on one connection, one doorbell per list ([`QueuePair::post_send`], [`QueuePair::post_recv`]; a partial post answers like `bad_wr`: [`PostError`]) |
//! | [`CompletionQueue`] | `ibv_cq` | poll the set's completions ([`CompletionQueue::poll`]) |
//! | [`Memory`] | | copy data in and out of the set's window ([`Memory::write`], [`Memory::read`]) |
//!
//! **Threads.** All four are `Send`. The `Device` runs its admin calls
//! with `&mut self` (one thread at a time). There is one
//! `CompletionQueue` per queue set, polled with `&mut self`. `QueuePair`s
//! and `Memory` handles are cloneable and `Sync`: posts from several
//! threads take turns on the set's send (or receive) ring, so two threads
//! never produce into one ring at once. The handles share the mapping
//! (`Arc`): it is unmapped when the last one is dropped.
//!
//! The byte layout it speaks is `metaroce-abi` (specification chapter 6),
//! the one crate it depends on in the project (with its shared-memory
//! accessor, `metaroce_abi::shmem`); the C API ([`capi`], header
//! `include/metaroce_verbs.h`) wraps the same objects.
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
//!
//! The `testing` feature adds hooks for tests that play a hostile host
//! (raw entries, doorbells and admin commands); nothing else needs it.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod capi;
mod device;
pub mod mapping;
mod queues;
mod types;

#[cfg(feature = "testing")]
pub use device::Queue;
pub use device::{Device, DeviceInfo, Memory, OpenOptions};
pub use mapping::SharedFile;
pub use metaroce_abi as abi;
pub use queues::{CompletionQueue, QueuePair};
pub use types::{
    Access, Conn, Error, Event, MemoryRegion, Opcode, PostError, RecvWr, Remote, SendOp, SendWr,
    Sge, Status, WorkCompletion,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The threading rules of the crate documentation, checked by the
    /// compiler: every object moves between threads; queue pairs and
    /// memory handles are shared and cloned across them.
    #[test]
    fn the_objects_move_and_share_as_documented() {
        fn send<T: Send>() {}
        fn shared<T: Send + Sync + Clone>() {}
        send::<Device>();
        send::<CompletionQueue>();
        shared::<QueuePair>();
        shared::<Memory>();
    }
}
