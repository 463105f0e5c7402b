//! Frame devices: raw Ethernet frames in and out.
//!
//! smoltcp's `phy::Device` idea, folded into two calls: `receive` lends the
//! received frame in place (the RX ring slot) to a closure and recycles the
//! slot afterwards; `transmit` lends a TX slot of the requested length to a
//! closure that writes the frame, then hands it to the hardware. No copy
//! happens in the device layer, and a device never allocates.
//!
//! **CRC offload.** A device that computes and checks the transport's CRC
//! trailer (spec 3.9) in hardware, as a NIC's DMA engine does RoCEv2's
//! ICRC, says so and the engine skips that work: on transmit,
//! [`FrameDevice::FILLS_CRC_TRAILER`] (a constant, so a device without it
//! carries no trace of the seam in its engine loop); on receive, a verdict
//! per frame from [`FrameDevice::receive_with_verdict`], as NICs report
//! checksum status per descriptor. Such a device knows the transport's
//! frames as a NIC is programmed to: UDP to the transport's port, the
//! trailer the last [`metaroce_core::wire::CRC_LEN`] bytes of the UDP
//! payload. A frame that reaches a core through a software dispatcher's
//! ring ([`crate::shard`]) has lost its verdict: it arrives `NotChecked`
//! and is checked in software.

pub use metaroce_core::wire::CrcVerdict;

use crate::ring::{Consumer, Producer, RingConsumer, RingProducer, SpscRing};

/// Largest Ethernet frame without FCS at the standard 1500-byte MTU.
pub const MAX_FRAME_LEN: usize = 1514;
/// Shortest Ethernet frame without FCS; shorter frames are zero-padded.
pub const MIN_FRAME_LEN: usize = 60;

/// A network device that moves whole Ethernet frames (no FCS).
pub trait FrameDevice {
    /// The device writes the CRC trailer of every transport frame it
    /// transmits. The engine then leaves the trailer's bytes zero (the
    /// frame keeps its length) and computes the IP and UDP checksums over
    /// them: the device writes the trailer and then corrects the UDP
    /// checksum (or computes it, as a NIC with UDP checksum offload does).
    /// Other frames (ARP, ICMP) it sends as they are. Default: no.
    const FILLS_CRC_TRAILER: bool = false;
    /// The longest frame `transmit` accepts and `receive` delivers.
    fn max_frame_len(&self) -> usize;
    /// Calls `f` with the next received frame, if any, and recycles its
    /// buffer afterwards.
    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R>;
    /// [`FrameDevice::receive`] with the device's verdict on the frame's
    /// CRC trailer: [`CrcVerdict::Good`] or [`CrcVerdict::Bad`] for a
    /// transport frame it checked, [`CrcVerdict::NotChecked`] otherwise.
    /// The engine hands the verdict to the transport, which skips its own
    /// check on `Good` and drops (and counts, as a failed check) on `Bad`.
    /// Default: every frame `NotChecked`.
    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], CrcVerdict) -> R) -> Option<R> {
        self.receive(|frame| f(frame, CrcVerdict::NotChecked))
    }
    /// Whether `transmit` has a free slot now.
    fn transmit_ready(&mut self) -> bool;
    /// Calls `f` to fill a `len`-byte frame in a TX slot, then sends it.
    /// `None` (and `f` not called) if no slot is free or `len` is too long.
    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R>;
}

/// Bytes in an in-memory frame slot.
pub const FRAME_SLOT_LEN: usize = 1536;

/// One in-memory frame: a fixed slot and its used length.
#[derive(Clone, Copy)]
pub struct Frame {
    len: u16,
    bytes: [u8; FRAME_SLOT_LEN],
}

impl core::fmt::Debug for Frame {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Frame").field("len", &self.len).finish()
    }
}

impl Frame {
    /// An empty frame (all zero bytes).
    pub const EMPTY: Frame = Frame {
        len: 0,
        bytes: [0; FRAME_SLOT_LEN],
    };

    /// Replaces the contents with `data`; `false` (unchanged) if it does
    /// not fit a slot.
    pub fn fill(&mut self, data: &[u8]) -> bool {
        let (Ok(len), Some(bytes)) = (u16::try_from(data.len()), self.bytes.get_mut(..data.len()))
        else {
            return false;
        };
        bytes.copy_from_slice(data);
        self.len = len;
        true
    }

    /// A frame holding `data`, or `None` if it does not fit a slot.
    pub fn from_bytes(data: &[u8]) -> Option<Frame> {
        let mut frame = Frame {
            len: u16::try_from(data.len()).ok()?,
            bytes: [0; FRAME_SLOT_LEN],
        };
        frame.bytes.get_mut(..data.len())?.copy_from_slice(data);
        Some(frame)
    }

    /// The frame's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(FRAME_SLOT_LEN)]
    }
}

/// The two rings of an in-memory point-to-point link of `N` slots per
/// direction: what a NIC's RX and TX descriptor rings are to its driver.
/// Slots are filled in place (the rings are made with blank frames), so a
/// frame is written once, where the other end reads it.
#[derive(Debug, Default)]
pub struct MemLink<const N: usize> {
    a_to_b: SpscRing<Frame, N>,
    b_to_a: SpscRing<Frame, N>,
}

impl<const N: usize> MemLink<N> {
    pub const fn new() -> Self {
        MemLink {
            a_to_b: SpscRing::with_blank_slots(Frame::EMPTY),
            b_to_a: SpscRing::with_blank_slots(Frame::EMPTY),
        }
    }

    /// Both ends of the link; `None` after the first call. Either end can
    /// be an engine's device or a test thread playing the device.
    pub fn ends(&self) -> Option<(MemFrameDevice<'_, N>, MemFrameDevice<'_, N>)> {
        let (ab_tx, ab_rx) = self.a_to_b.split()?;
        let (ba_tx, ba_rx) = self.b_to_a.split()?;
        Some((
            MemFrameDevice {
                rx: ba_rx,
                tx: ab_tx,
            },
            MemFrameDevice {
                rx: ab_rx,
                tx: ba_tx,
            },
        ))
    }
}

/// One end of a [`MemLink`].
#[derive(Debug)]
pub struct MemFrameDevice<'a, const N: usize> {
    rx: Consumer<'a, Frame, N>,
    tx: Producer<'a, Frame, N>,
}

impl<const N: usize> MemFrameDevice<'_, N> {
    /// Sends a whole frame (test convenience); `false` if the ring is full
    /// or the frame too long.
    pub fn send_frame(&mut self, data: &[u8]) -> bool {
        self.tx
            .push_with(|slot| slot.fill(data).then_some(()))
            .is_some()
    }

    /// Calls `f` with the next frame the other end sent, in place, and
    /// frees its slot afterwards (as [`FrameDevice::receive`]).
    pub fn receive_frame<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.rx.pop_with(|frame| f(frame.as_bytes()))
    }

    /// Slots free for [`Self::send_frame`] right now.
    pub fn tx_free(&self) -> usize {
        self.tx.free()
    }

    /// Frames waiting to be received.
    pub fn rx_pending(&self) -> usize {
        self.rx.len()
    }
}

impl<const N: usize> FrameDevice for MemFrameDevice<'_, N> {
    fn max_frame_len(&self) -> usize {
        MAX_FRAME_LEN
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.rx.pop_with(|frame| f(frame.as_bytes()))
    }

    fn transmit_ready(&mut self) -> bool {
        !self.tx.is_full()
    }

    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if len > MAX_FRAME_LEN {
            return None;
        }
        // In place: the frame is written into the ring slot the other end
        // reads (the slot holds an older frame; `f` writes all `len` bytes).
        self.tx.push_with(|slot| {
            slot.len = u16::try_from(len).ok()?;
            Some(f(&mut slot.bytes[..len]))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_carries_frames_both_ways() {
        let link: MemLink<4> = MemLink::new();
        let (mut a, mut b) = link.ends().unwrap();
        assert!(link.ends().is_none());
        assert_eq!(a.transmit(3, |f| f.copy_from_slice(&[1, 2, 3])), Some(()));
        assert!(b.send_frame(&[9; 70]));
        assert_eq!(b.receive(|f| f.to_vec()), Some(std::vec![1, 2, 3]));
        assert_eq!(a.receive(|f| f.len()), Some(70));
        assert_eq!(a.receive(|f| f.len()), None);
        assert_eq!(a.transmit(MAX_FRAME_LEN + 1, |_| ()), None);
        for _ in 0..4 {
            assert!(a.transmit_ready());
            a.transmit(60, |_| ()).unwrap();
        }
        assert!(!a.transmit_ready());
        assert_eq!(a.transmit(60, |_| ()), None);
        assert!(Frame::from_bytes(&[0; FRAME_SLOT_LEN + 1]).is_none());
    }

    #[test]
    fn a_device_without_crc_offload_leaves_the_trailer_to_the_engine() {
        let link: MemLink<4> = MemLink::new();
        let (mut a, mut b) = link.ends().unwrap();
        const { assert!(!<MemFrameDevice<'_, 4> as FrameDevice>::FILLS_CRC_TRAILER) };
        assert!(b.send_frame(&[7; 64]));
        let got = a.receive_with_verdict(|frame, crc| (frame.len(), crc));
        assert_eq!(got, Some((64, CrcVerdict::NotChecked)));
    }
}
