//! Datagram links: transport packets in and out as UDP payloads.
//!
//! Where the platform owns the wire (a DPU port, virtio-net) the engine
//! loop sees Ethernet frames through a [`crate::FrameDevice`] and builds
//! Ethernet/IP/UDP itself. Where something else owns those layers (the
//! kernel's UDP sockets in a host program, a simulator's fabric) the loop
//! sees only UDP payloads and their addressing through a [`DatagramLink`];
//! everything above that, [`crate::Engine::poll_datagrams`], is the same
//! code as for frames.
//!
//! The shape is the frame device's: `receive` lends a received packet to
//! a closure, `transmit` lends a buffer of the requested length to a
//! closure that writes the packet, then sends it. A link never allocates
//! per packet.

use metaroce_core::api::{PeerAddr, RxMeta};

/// Where one outgoing packet goes and how it is marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DatagramTarget {
    /// Destination IP address and UDP port.
    pub peer: PeerAddr,
    /// UDP source port: the path entropy the fabric hashes.
    pub src_port: u16,
    /// ECN codepoint for the IP header.
    pub ecn: u8,
}

/// A network attachment that moves transport packets as UDP payloads.
pub trait DatagramLink {
    /// The longest transport packet `transmit` accepts.
    fn max_packet_len(&self) -> usize;
    /// Calls `f` with the next received packet (the UDP payload) and its
    /// metadata (source address and port, CE mark), if any.
    fn receive<R>(&mut self, f: impl FnOnce(&RxMeta, &[u8]) -> R) -> Option<R>;
    /// Whether `transmit` can take a packet now.
    fn transmit_ready(&mut self) -> bool;
    /// Calls `f` to fill a `len`-byte packet, then sends it to `to`.
    /// `None` (and `f` not called) if the link cannot take it now or `len`
    /// is too long. A packet the network then refuses (a full kernel
    /// buffer, an unreachable port) counts as sent: to the transport it is
    /// a loss like any other, and it recovers.
    fn transmit<R>(
        &mut self,
        to: DatagramTarget,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R>;
}
