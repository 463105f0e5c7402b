//! # metaroce-node-engine
//!
//! The firmware node's per-packet code, in a crate of its own so the
//! build profile can compile it for speed while the rest of the firmware
//! (bring-up, configuration, the workload, serve and host-interface
//! tasks, reports) is compiled for size: a per-package `opt-level` applies
//! where a function is compiled, and generic code is compiled in the
//! crate that instantiates it, so the engine loop is instantiated here,
//! behind concretely typed functions.
//!
//! One endpoint type, one frame device type, one DMA type and one
//! host-queue type serve every role, so the platform's generic loop
//! ([`Engine::poll`]) and everything it pulls in from the endpoint
//! (packet handling, ACKs, loss recovery, transmission) is compiled once
//! for the whole firmware, in [`poll`], out of line. Before, each role
//! instantiated its own copy (the workload and the serve role over
//! virtio-net and the emulated host memory, the host role over virtio-net
//! and the ivshmem BAR, every core of a multi-core node over its ring to
//! the dispatcher, the datagram bring-up transport), which was most of
//! the firmware's code. What differs per role is chosen by a `match` per
//! device call and per DMA copy ([`NodeDevice`], [`NodeMemory`]): a
//! predictable branch beside the per-packet work (`cargo xtask bench
//! --firmware`, engine row). The multi-core dispatcher's two steps
//! ([`dispatch_receive`], [`dispatch_transmit`]) touch every frame of a
//! multi-core node, so they are here too.

#![no_std]
#![forbid(unsafe_code)]

use metaroce_board::Board;
use metaroce_core::api::{ConnHandle, PeerAddr, Region};
use metaroce_core::storage::Storage;
use metaroce_core::wire::CloseReason;
use metaroce_core::{Borrowed, CommandError, Endpoint, Event, Instant};
use metaroce_platform::control::{ConnCounters, ControlError, ControlEvent, HostControl};
use metaroce_platform::device::{MemFrameDevice, RxVerdict, MAX_FRAME_LEN};
use metaroce_platform::dma::{DmaCopy, DmaError, HostWindow};
use metaroce_platform::host::HostSide;
use metaroce_platform::shard::{Dispatcher, Round, ShardMap};
use metaroce_platform::shmem::SharedMemory;
use metaroce_platform::{Engine, EnginePort, FrameDevice, HostPort, HostQueues, PollOutcome};
use smoltcp::wire::Ipv4Address;

/// The board the node is built for (its image crate turns on one board
/// feature): its drivers, behind [`metaroce_board::Board`].
#[cfg(all(feature = "pensando-elba", not(feature = "qemu-virt")))]
pub use board_pensando_elba_drivers::PensandoElba as ThisBoard;
#[cfg(feature = "qemu-virt")]
pub use board_qemu_virt_drivers::QemuVirt as ThisBoard;
#[cfg(not(any(feature = "qemu-virt", feature = "pensando-elba")))]
compile_error!(
    "the node is built for one board: turn on its feature (`qemu-virt`, `pensando-elba`)"
);

/// Paths per connection.
pub const PATHS: usize = 8;
/// Every role's MetaRoCE endpoint: connections of 8 paths over static
/// storage.
pub type NodeEndpoint = Endpoint<Borrowed<'static>, PATHS>;
/// What a [`NodeEndpoint`] is built from.
pub type NodeStorage = Storage<Borrowed<'static>, PATHS>;

/// The board's network device.
pub type NetDevice = <ThisBoard as Board>::Net;
/// Frames per direction of a core's ring to the dispatcher.
pub const LINK_SLOTS: usize = 128;
/// A core's end of its rings to the dispatcher (multi-core nodes, the
/// bench role's two engines).
pub type LinkDevice = MemFrameDevice<'static, LINK_SLOTS>;

/// Every role's host queues: send, receive, completion and admin slots.
pub type NodeQueues = HostQueues<64, 64, 128, 4>;
/// The host's half of [`NodeQueues`] (the workload and serve tasks).
pub type NodeHostPort<'a> = HostPort<'a, 64, 64, 128, 4>;
/// The engine's half of [`NodeQueues`].
pub type NodeEnginePort<'a> = EnginePort<'a, 64, 64, 128, 4>;

/// The frames an engine loop moves: the board's network device itself
/// (QEMU's virtio-net, which one core owns and runs the only engine on;
/// one of the Elba's per-core ring pairs) or a core's rings to QEMU's
/// software dispatcher.
// The virtio device is the large variant (its queues' bookkeeping): one
// device per engine, built once, so the size costs nothing per packet and
// there is no heap to box it on.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum NodeDevice {
    Net(NetDevice),
    Link(LinkDevice),
}

impl NodeDevice {
    /// Acknowledges the device's interrupt (virtio-net; a link has none).
    pub fn ack_interrupt(&mut self) {
        if let NodeDevice::Net(net) = self {
            ThisBoard::ack_net(net);
        }
    }

    /// Frames waiting in a link's receive ring (0 for virtio-net, whose
    /// frames announce themselves by interrupt).
    pub fn rx_pending(&self) -> usize {
        match self {
            NodeDevice::Net(_) => 0,
            NodeDevice::Link(link) => link.rx_pending(),
        }
    }
}

impl FrameDevice for NodeDevice {
    fn max_frame_len(&self) -> usize {
        MAX_FRAME_LEN
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match self {
            NodeDevice::Net(net) => net.receive(f),
            NodeDevice::Link(link) => link.receive(f),
        }
    }

    /// Each device's own verdicts: a link's frame written by another
    /// engine needs no checksum verification, one the dispatcher took off
    /// the wire carries the wire device's.
    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], RxVerdict) -> R) -> Option<R> {
        match self {
            NodeDevice::Net(net) => net.receive_with_verdict(f),
            NodeDevice::Link(link) => link.receive_with_verdict(f),
        }
    }

    /// Each device's own offload: the Elba's NIC rings compute UDP
    /// checksums, virtio-net here does not.
    fn computes_udp_checksum(&self) -> bool {
        match self {
            NodeDevice::Net(net) => net.computes_udp_checksum(),
            NodeDevice::Link(link) => link.computes_udp_checksum(),
        }
    }

    fn transmit_ready(&mut self) -> bool {
        match self {
            NodeDevice::Net(net) => net.transmit_ready(),
            NodeDevice::Link(link) => link.transmit_ready(),
        }
    }

    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        match self {
            NodeDevice::Net(net) => net.transmit(len, f),
            NodeDevice::Link(link) => link.transmit(len, f),
        }
    }
}

/// Where the engine places and gathers payload: the emulated host memory
/// of the firmware's own tasks, or the ivshmem BAR that host processes
/// share with the node (the host role).
#[derive(Debug)]
pub enum NodeMemory<'a> {
    Window(&'a mut HostWindow<'static>),
    Shared(SharedMemory<'static>),
}

impl DmaCopy for NodeMemory<'_> {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        match self {
            NodeMemory::Window(w) => w.copy_to_host(addr, data),
            NodeMemory::Shared(s) => s.copy_to_host(addr, data),
        }
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        match self {
            NodeMemory::Window(w) => w.copy_from_host(addr, out),
            NodeMemory::Shared(s) => s.copy_from_host(addr, out),
        }
    }
}

/// One round of the engine loop (see [`Engine::poll`]): the firmware's
/// only instantiation of it, shared by every role and core.
#[inline(never)]
pub fn poll(
    engine: &mut Engine,
    now: Instant,
    endpoint: &mut NodeEndpoint,
    device: &mut NodeDevice,
    host: &mut dyn HostSide,
    mut memory: NodeMemory<'_>,
) -> PollOutcome {
    engine.poll(now, endpoint, device, host, &mut memory)
}

/// Sends an ICMP echo request (the workload's pings); its reply shows in
/// [`Engine::last_echo`].
#[inline(never)]
pub fn ping(
    engine: &mut Engine,
    device: &mut NodeDevice,
    dst: Ipv4Address,
    seq: u16,
    now: Instant,
) {
    let _ = engine.send_ping(device, dst, seq, now);
}

/// Which core owns a connection: by its table index, nothing learned (the
/// dispatcher parses no frame a core sends; a core counts what reaches
/// it misrouted).
pub type Owners = ShardMap;
/// Core 0's frame dispatcher on a multi-core node.
pub type NodeDispatcher = Dispatcher<Owners>;

/// Moves up to `budget` received frames from the device into the cores'
/// rings (see [`Dispatcher::receive`]).
#[inline(never)]
pub fn dispatch_receive(
    dispatcher: &mut NodeDispatcher,
    net: &mut NetDevice,
    rings: &mut [LinkDevice],
    budget: u32,
) -> Round {
    dispatcher.receive(net, rings, budget)
}

/// Moves up to `budget` frames from the cores' rings to the device (see
/// [`Dispatcher::transmit`]).
#[inline(never)]
pub fn dispatch_transmit(
    dispatcher: &mut NodeDispatcher,
    net: &mut NetDevice,
    rings: &mut [LinkDevice],
    budget: u32,
) -> Round {
    dispatcher.transmit(net, rings, budget)
}

// ----- the endpoint's control operations ---------------------------------
//
// What the tasks ask of the endpoint besides the data path (connections
// opened, closed and released, their events, the host interface's
// control operations), compiled here beside the loop: these share the
// endpoint's scheduling code (`refresh` and what it calls) with the loop,
// which would otherwise be compiled a second time, for size, in the board.

/// Opens a connection (see [`Endpoint::connect`]).
pub fn connect(
    endpoint: &mut NodeEndpoint,
    now: Instant,
    peer: PeerAddr,
    pd: u32,
) -> Result<ConnHandle, CommandError> {
    endpoint.connect(now, peer, pd)
}

/// Closes a connection with `reason` (see [`Endpoint::close_with`]).
pub fn close_with(
    endpoint: &mut NodeEndpoint,
    now: Instant,
    conn: ConnHandle,
    reason: CloseReason,
) -> Result<(), CommandError> {
    endpoint.close_with(now, conn, reason)
}

/// Gives an ended connection's slot back (see [`Endpoint::release`]).
pub fn release(endpoint: &mut NodeEndpoint, conn: ConnHandle) -> Result<(), CommandError> {
    endpoint.release(conn)
}

/// The next connection event (see [`Endpoint::poll_event`]).
pub fn poll_event(endpoint: &mut NodeEndpoint) -> Option<Event> {
    endpoint.poll_event()
}

/// This endpoint's active senders, after telling it those of the node's
/// other cores (the node-wide fair share).
pub fn active_senders(endpoint: &mut NodeEndpoint, now: Instant, other_cores: u32) -> u32 {
    endpoint.set_other_shards_senders(other_cores);
    endpoint.active_senders(now)
}

/// The endpoint as the host interface controls it: every operation
/// forwarded to [`HostControl`] for the endpoint, compiled here.
#[derive(Debug)]
pub struct NodeControl<'a>(pub &'a mut NodeEndpoint);

impl HostControl for NodeControl<'_> {
    fn register_region(&mut self, region: Region) -> Result<u32, ControlError> {
        HostControl::register_region(self.0, region)
    }

    fn deregister_region(&mut self, key: u32) -> Result<(), ControlError> {
        HostControl::deregister_region(self.0, key)
    }

    fn connect(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        pd: u32,
    ) -> Result<ConnHandle, ControlError> {
        HostControl::connect(self.0, now, peer, pd)
    }

    fn accept(&mut self, now: Instant, conn: ConnHandle, pd: u32) -> Result<(), ControlError> {
        HostControl::accept(self.0, now, conn, pd)
    }

    fn close(&mut self, now: Instant, conn: ConnHandle) -> Result<(), ControlError> {
        HostControl::close(self.0, now, conn)
    }

    fn release(&mut self, conn: ConnHandle) -> Result<(), ControlError> {
        HostControl::release(self.0, conn)
    }

    fn poll_event(&mut self) -> Option<ControlEvent> {
        HostControl::poll_event(self.0)
    }

    fn peer(&self, conn: ConnHandle) -> Option<PeerAddr> {
        HostControl::peer(self.0, conn)
    }

    fn has_ended(&self, conn: ConnHandle) -> bool {
        HostControl::has_ended(self.0, conn)
    }

    fn slot(&self, conn: ConnHandle) -> usize {
        HostControl::slot(self.0, conn)
    }

    fn counters(&self, conn: ConnHandle) -> Option<ConnCounters> {
        HostControl::counters(self.0, conn)
    }

    fn rate_hint(&self, now: Instant) -> u32 {
        HostControl::rate_hint(self.0, now)
    }

    fn incoming_domain(&self) -> Option<u32> {
        HostControl::incoming_domain(self.0)
    }

    fn max_connections(&self) -> usize {
        HostControl::max_connections(self.0)
    }

    fn max_regions(&self) -> usize {
        HostControl::max_regions(self.0)
    }
}
