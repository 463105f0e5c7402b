//! The receive and transmit driver: steps 2 and 5 of a poll, written once
//! over [`PacketLink`], the one abstraction of what carries transport
//! packets. A frame device carries them in Ethernet/IP/UDP frames that
//! the node's [`Interface`] addresses and classifies ([`Frames`]); a
//! datagram link carries them as UDP payloads whose owner (the kernel, a
//! simulator) has those layers ([`Datagrams`]). The driver sees only
//! transport packets: it hands each received one to
//! [`Transport::handle_packet`] with a [`DmaMemory`] that places payload,
//! and builds each outgoing one in the link's buffer (the headers
//! `poll_transmit` wrote, the payload gathered by DMA behind them, the
//! trailer from `finish_packet*`).

use metaroce_core::api::{RxMeta, Transmit};
use metaroce_core::wire::{encap, CrcVerdict, EncapRepr};
use metaroce_core::Instant;

use super::iface::{Interface, Route};
use super::EngineStats;
use crate::device::FrameDevice;
use crate::dma::{DmaCopy, DmaMemory};
use crate::link::{DatagramLink, DatagramTarget};
use crate::net;
use crate::transport::Transport;

/// Header scratch buffer for `poll_transmit`.
pub(super) const HEADER_BUF_LEN: usize = 128;

/// What happened to one outgoing transport packet.
pub(super) enum Sent {
    /// On the wire, this many bytes.
    Bytes(usize),
    /// Dropped: the peer's MAC is unknown (an ARP request went out).
    NoNeighbor,
    /// Dropped: it cannot be sent on this link (too long, no route).
    Unsendable,
}

/// What carries transport packets: one receive and one transmit, each
/// lending the packet to a closure so nothing is copied.
pub(super) trait PacketLink {
    /// The link writes the CRC trailer itself (a frame device's offload).
    const FILLS_CRC_TRAILER: bool;

    /// Takes one received unit, if any (`false`: none). If it carries a
    /// transport packet (for `udp_port`, where the link sees UDP
    /// headers), `deliver` gets it with its metadata and the link's
    /// verdict on its CRC trailer; anything else is the link's.
    fn receive(
        &mut self,
        now: Instant,
        udp_port: u16,
        stats: &mut EngineStats,
        deliver: impl FnOnce(&mut EngineStats, &RxMeta, &[u8], CrcVerdict),
    ) -> bool;

    /// Whether `transmit` can take a packet now.
    fn transmit_ready(&mut self) -> bool;

    /// Sends the transport packet `tx`, with `fill` writing its bytes (and
    /// the encapsulation, if the link builds one, for its CRC).
    fn transmit(
        &mut self,
        now: Instant,
        tx: &Transmit,
        stats: &mut EngineStats,
        fill: impl FnOnce(&mut [u8], Option<&EncapRepr>),
    ) -> Sent;
}

/// A frame device and the interface that addresses its frames.
pub(super) struct Frames<'a, D, const N: usize> {
    pub(super) device: &'a mut D,
    pub(super) iface: &'a mut Interface<N>,
}

impl<D: FrameDevice, const N: usize> PacketLink for Frames<'_, D, N> {
    const FILLS_CRC_TRAILER: bool = D::FILLS_CRC_TRAILER;

    fn receive(
        &mut self,
        now: Instant,
        udp_port: u16,
        stats: &mut EngineStats,
        deliver: impl FnOnce(&mut EngineStats, &RxMeta, &[u8], CrcVerdict),
    ) -> bool {
        let iface = &mut *self.iface;
        let received = self.device.receive_with_verdict(|frame, verdict| {
            iface.accept(now, frame, verdict, udp_port, stats, deliver)
        });
        let Some(control) = received else {
            return false;
        };
        self.iface.settle(control, self.device, now, stats);
        true
    }

    fn transmit_ready(&mut self) -> bool {
        self.device.transmit_ready()
    }

    fn transmit(
        &mut self,
        now: Instant,
        tx: &Transmit,
        stats: &mut EngineStats,
        fill: impl FnOnce(&mut [u8], Option<&EncapRepr>),
    ) -> Sent {
        let encap = match self.iface.route(self.device, tx, now, stats) {
            Route::Frame(encap) => encap,
            Route::NoNeighbor => return Sent::NoNeighbor,
            Route::Unsendable => return Sent::Unsendable,
        };
        let transport_len = tx.packet_len();
        let frame_len = encap.frame_len(transport_len);
        if tx.header_len > HEADER_BUF_LEN || frame_len > self.device.max_frame_len() {
            return Sent::Unsendable;
        }
        let wire_len = net::padded(frame_len);
        let caps = if self.device.computes_udp_checksum() {
            encap::udp_tx_offloaded_checksums()
        } else {
            encap::software_checksums()
        };
        let sent = self.device.transmit(wire_len, |slot| {
            slot[frame_len..].fill(0);
            encap.emit_with(slot, transport_len, &caps, |packet| {
                fill(packet, Some(&encap))
            })
        });
        match sent {
            Some(Ok(_)) => Sent::Bytes(wire_len),
            // `transmit_ready` said yes, so only a length error is left.
            Some(Err(_)) | None => Sent::Unsendable,
        }
    }
}

/// A datagram link: its owner has Ethernet, IP and UDP.
pub(super) struct Datagrams<'a, L>(pub(super) &'a mut L);

impl<L: DatagramLink> PacketLink for Datagrams<'_, L> {
    const FILLS_CRC_TRAILER: bool = false;

    fn receive(
        &mut self,
        _now: Instant,
        _udp_port: u16,
        stats: &mut EngineStats,
        deliver: impl FnOnce(&mut EngineStats, &RxMeta, &[u8], CrcVerdict),
    ) -> bool {
        self.0
            .receive(|meta, packet| {
                stats.rx_frames += 1;
                stats.rx_bytes += packet.len() as u64;
                deliver(stats, meta, packet, CrcVerdict::NotChecked);
            })
            .is_some()
    }

    fn transmit_ready(&mut self) -> bool {
        self.0.transmit_ready()
    }

    fn transmit(
        &mut self,
        _now: Instant,
        tx: &Transmit,
        _stats: &mut EngineStats,
        fill: impl FnOnce(&mut [u8], Option<&EncapRepr>),
    ) -> Sent {
        let len = tx.packet_len();
        if tx.header_len > HEADER_BUF_LEN || len > self.0.max_packet_len() {
            return Sent::Unsendable;
        }
        let to = DatagramTarget {
            peer: tx.peer,
            src_port: tx.src_port,
            ecn: tx.ecn,
        };
        match self.0.transmit(to, len, |packet| fill(packet, None)) {
            Some(()) => Sent::Bytes(len),
            // `transmit_ready` said yes, so only a length error is left.
            None => Sent::Unsendable,
        }
    }
}

/// Step 2: up to `budget` received units from `link`, each transport
/// packet to the transport.
#[inline(never)]
pub(super) fn receive<T: Transport, L: PacketLink, M: DmaCopy>(
    link: &mut L,
    now: Instant,
    budget: u32,
    stats: &mut EngineStats,
    transport: &mut T,
    dma: &mut M,
) -> bool {
    let mut any = false;
    let udp_port = transport.udp_port();
    for _ in 0..budget {
        let received = link.receive(now, udp_port, stats, |stats, meta, packet, crc| {
            stats.rx_transport += 1;
            stats.rx_ce += u64::from(meta.ce);
            let mut mem = DmaMemory::new(&mut *dma);
            transport.handle_packet(now, meta, packet, crc, &mut mem);
            stats.dma_faults += u64::from(mem.faults());
        });
        if !received {
            break;
        }
        any = true;
    }
    any
}

/// Step 5: `poll_transmit` into `link` until it is full or `budget`
/// packets went.
#[inline(never)]
pub(super) fn transmit<T: Transport, L: PacketLink, M: DmaCopy>(
    link: &mut L,
    now: Instant,
    budget: u32,
    header_buf: &mut [u8; HEADER_BUF_LEN],
    stats: &mut EngineStats,
    transport: &mut T,
    dma: &mut M,
) -> bool {
    let mut any = false;
    for _ in 0..budget {
        if !link.transmit_ready() {
            break;
        }
        let Some(tx) = transport.poll_transmit(now, header_buf) else {
            break;
        };
        any = true;
        let mut mem = DmaMemory::new(&mut *dma);
        let sent = link.transmit(now, &tx, stats, |packet, encap| {
            // The link checked `header_len` against the buffer.
            assemble(&tx, &header_buf[..tx.header_len], &mut mem, packet);
            // A constant: the branch not taken is not compiled in.
            if L::FILLS_CRC_TRAILER {
                transport.finish_packet_without_trailer(&tx, encap, packet);
            } else {
                transport.finish_packet(&tx, encap, packet);
            }
        });
        stats.dma_faults += u64::from(mem.faults());
        match sent {
            Sent::Bytes(len) => {
                stats.tx_frames += 1;
                stats.tx_transport += 1;
                stats.tx_bytes += len as u64;
            }
            Sent::NoNeighbor => stats.tx_no_neighbor += 1,
            Sent::Unsendable => stats.tx_unsendable += 1,
        }
    }
    any
}

/// Builds one transport packet in place, but its trailer: the headers
/// `poll_transmit` wrote, the payload gathered from host memory by DMA
/// behind them. The transport's `finish_packet*` finishes it.
fn assemble<M: DmaCopy>(
    tx: &Transmit,
    header: &[u8],
    mem: &mut DmaMemory<'_, M>,
    packet: &mut [u8],
) {
    let header_len = header.len();
    packet[..header_len].copy_from_slice(header);
    if let Some(payload) = tx.payload {
        let end = header_len + payload.len as usize;
        metaroce_core::api::Memory::read(mem, payload.addr, &mut packet[header_len..end]);
    }
}
