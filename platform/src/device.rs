//! Frame devices: raw Ethernet frames in and out.
//!
//! smoltcp's `phy::Device` idea, folded into two calls: `receive` lends the
//! received frame in place (the RX ring slot) to a closure and recycles the
//! slot afterwards; `transmit` lends a TX slot of the requested length to a
//! closure that writes the frame, then hands it to the hardware. No copy
//! happens in the device layer, and a device never allocates.
//!
//! **Checksum offload.** smoltcp's idea (`phy::ChecksumCapabilities`),
//! per frame as NICs report it in their receive descriptors and Linux
//! keeps it in `ip_summed`: [`FrameDevice::receive_with_verdict`] says of
//! each received frame whether its IPv4 header and UDP checksums were
//! verified already ([`ChecksumVerdict`]: by the device, both or the UDP
//! checksum only, or never needed, the frame never having left memory
//! since its sender computed them, Linux's `CHECKSUM_UNNECESSARY` on
//! loopback and veth), and the engine verifies what is left
//! ([`ChecksumVerdict::capabilities`], handed to
//! `metaroce_core::wire::encap::parse_frame_with`). So each frame is
//! verified once on a node (spec 3.1.5): by the device that takes it off
//! the wire, or else by the engine that handles it, also behind a
//! software dispatcher, which copies frames into a core's ring with the
//! device's verdicts ([`MemFrameDevice::send_frame_with_verdict`]). A
//! device without the feature keeps the default (`NotChecked`). On transmit
//! every device here leaves the checksums to the engine: a [`MemLink`]
//! frame may leave the node through another device (a multi-core node's
//! frames leave through core 0's virtio-net), and the virtio-net device
//! does not negotiate `VIRTIO_NET_F_CSUM` ([`crate::virtio`]).
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
//! ring ([`crate::shard`]) keeps both verdicts: the ring's slot carries
//! them from the device to the core's engine.

use metaroce_core::wire::encap::{self, ChecksumCapabilities};
pub use metaroce_core::wire::CrcVerdict;

use crate::ring::{Consumer, Producer, RingConsumer, RingProducer, SpscRing};

/// What a device says of a received frame's IPv4 header and UDP
/// checksums (spec 3.1.5). A device that finds one wrong reports
/// `NotChecked` (or drops the frame), as Linux drivers report
/// `CHECKSUM_NONE`: the engine then finds it too, and counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ChecksumVerdict {
    /// Not verified: the engine verifies both (the default).
    #[default]
    NotChecked,
    /// The UDP checksum was validated (a NIC's checksum offload, virtio's
    /// `DATA_VALID`, Linux's `CHECKSUM_UNNECESSARY`): the engine verifies
    /// the IPv4 header's only.
    UdpVerified,
    /// Both verified already, or never at risk (the frame did not leave
    /// memory since its sender computed them): the engine verifies
    /// neither.
    Verified,
}

impl ChecksumVerdict {
    /// What the engine's parse verifies of a frame with this verdict.
    pub fn capabilities(self) -> ChecksumCapabilities {
        match self {
            ChecksumVerdict::NotChecked => encap::software_checksums(),
            ChecksumVerdict::UdpVerified => encap::rx_udp_verified_checksums(),
            ChecksumVerdict::Verified => encap::rx_verified_checksums(),
        }
    }
}

/// A device's verdicts on one received frame, as a NIC's receive
/// descriptor carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RxVerdict {
    /// On its IPv4 header and UDP checksums.
    pub checksums: ChecksumVerdict,
    /// On its CRC trailer, if it is a transport frame.
    pub crc: CrcVerdict,
}

impl RxVerdict {
    /// Nothing checked: the engine checks everything.
    pub const NOT_CHECKED: RxVerdict = RxVerdict {
        checksums: ChecksumVerdict::NotChecked,
        crc: CrcVerdict::NotChecked,
    };
    /// A frame an engine wrote into memory, read back from memory: its
    /// checksums need no verifying; its CRC trailer, the transport's own
    /// end-to-end check, is checked as always.
    pub const IN_MEMORY: RxVerdict = RxVerdict {
        checksums: ChecksumVerdict::Verified,
        crc: CrcVerdict::NotChecked,
    };
}

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
    /// [`FrameDevice::receive`] with the device's verdicts on the frame
    /// ([`RxVerdict`]). On its checksums: the engine does not verify again
    /// what the device did ([`ChecksumVerdict`]). On its CRC trailer:
    /// [`CrcVerdict::Good`] or [`CrcVerdict::Bad`] for a transport frame it
    /// checked, [`CrcVerdict::NotChecked`] otherwise; the engine hands it
    /// to the transport, which skips its own check on `Good` and drops (and
    /// counts, as a failed check) on `Bad`. Default: every frame
    /// [`RxVerdict::NOT_CHECKED`].
    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], RxVerdict) -> R) -> Option<R> {
        self.receive(|frame| f(frame, RxVerdict::NOT_CHECKED))
    }
    /// The device computes the UDP checksum of every UDP frame it
    /// transmits, IPv4 and IPv6 (checksum offload, as a NIC does): the
    /// engine leaves the field zero (spec 3.1.5). Asked per device value,
    /// not per type, because one type may stand for several links.
    /// Default: no.
    fn computes_udp_checksum(&self) -> bool {
        false
    }
    /// Whether `transmit` has a free slot now.
    fn transmit_ready(&mut self) -> bool;
    /// Calls `f` to fill a `len`-byte frame in a TX slot, then sends it.
    /// `None` (and `f` not called) if no slot is free or `len` is too long.
    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R>;
}

/// Bytes in an in-memory frame slot.
pub const FRAME_SLOT_LEN: usize = 1536;

/// One in-memory frame: a fixed slot, its used length and what is known
/// of it ([`RxVerdict`]: [`RxVerdict::IN_MEMORY`] for a frame an engine
/// wrote in place, the device's verdicts for one copied from a device).
#[derive(Clone, Copy)]
pub struct Frame {
    len: u16,
    verdict: RxVerdict,
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
        verdict: RxVerdict::NOT_CHECKED,
        bytes: [0; FRAME_SLOT_LEN],
    };

    /// Replaces the contents with `data`, nothing known of it
    /// ([`RxVerdict::NOT_CHECKED`]); `false` (unchanged) if it does not fit
    /// a slot.
    pub fn fill(&mut self, data: &[u8]) -> bool {
        self.fill_with_verdict(data, RxVerdict::NOT_CHECKED)
    }

    /// Replaces the contents with `data`, which the device that received
    /// it judged `verdict`; `false` (unchanged) if it does not fit a slot.
    pub fn fill_with_verdict(&mut self, data: &[u8], verdict: RxVerdict) -> bool {
        let (Ok(len), Some(bytes)) = (u16::try_from(data.len()), self.bytes.get_mut(..data.len()))
        else {
            return false;
        };
        bytes.copy_from_slice(data);
        self.len = len;
        self.verdict = verdict;
        true
    }

    /// A frame holding `data` (nothing known of it), or `None` if it does
    /// not fit a slot.
    pub fn from_bytes(data: &[u8]) -> Option<Frame> {
        let mut frame = Frame {
            len: u16::try_from(data.len()).ok()?,
            verdict: RxVerdict::NOT_CHECKED,
            bytes: [0; FRAME_SLOT_LEN],
        };
        frame.bytes.get_mut(..data.len())?.copy_from_slice(data);
        Some(frame)
    }

    /// What is known of the frame's checksums and trailer.
    pub fn verdict(&self) -> RxVerdict {
        self.verdict
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
                nic_udp_checksums: false,
            },
            MemFrameDevice {
                rx: ab_rx,
                tx: ba_tx,
                nic_udp_checksums: false,
            },
        ))
    }
}

/// One end of a [`MemLink`].
#[derive(Debug)]
pub struct MemFrameDevice<'a, const N: usize> {
    rx: Consumer<'a, Frame, N>,
    tx: Producer<'a, Frame, N>,
    /// See [`MemFrameDevice::set_nic_udp_checksums`].
    nic_udp_checksums: bool,
}

impl<const N: usize> MemFrameDevice<'_, N> {
    /// Says that frames sent on this end leave the node through a NIC
    /// that computes their UDP checksums ([`FrameDevice::computes_udp_checksum`]),
    /// as a core's rings to the Elba's NIC do: the engine leaves the
    /// field zero. Off by default: a core's rings to a dispatcher that
    /// hands frames to a device without that offload.
    pub fn set_nic_udp_checksums(&mut self, on: bool) {
        self.nic_udp_checksums = on;
    }

    /// Sends a copy of a whole frame from elsewhere (a wire, a test),
    /// nothing known of it: the receiving engine checks everything.
    /// `false` if the ring is full or the frame too long.
    pub fn send_frame(&mut self, data: &[u8]) -> bool {
        self.send_frame_with_verdict(data, RxVerdict::NOT_CHECKED)
    }

    /// Sends a copy of a frame that a device received and judged
    /// `verdict` (a dispatcher passing on a frame it took off the wire):
    /// the receiving engine relies on it as on that device's.
    pub fn send_frame_with_verdict(&mut self, data: &[u8], verdict: RxVerdict) -> bool {
        self.tx
            .push_with(|slot| slot.fill_with_verdict(data, verdict).then_some(()))
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

/// The in-memory link's device: what a frame's writer made of it reaches
/// its reader. A frame the other end's engine wrote in place
/// ([`FrameDevice::transmit`]) cannot have been corrupted on the way, so
/// it arrives [`RxVerdict::IN_MEMORY`]: its checksums are not verified
/// again (a frame in memory, like Linux's loopback and veth,
/// `CHECKSUM_UNNECESSARY`); its CRC trailer, the transport's end-to-end
/// check, is. One copied in from a device arrives with that device's
/// verdicts ([`MemFrameDevice::send_frame_with_verdict`]), so a frame a
/// dispatcher takes off the wire unverified is verified by the engine
/// that receives it, once. On transmit the engine computes every checksum
/// (the frame may leave through a real device), unless the frames leave
/// through a NIC that computes UDP checksums
/// ([`MemFrameDevice::set_nic_udp_checksums`]).
impl<const N: usize> FrameDevice for MemFrameDevice<'_, N> {
    fn max_frame_len(&self) -> usize {
        MAX_FRAME_LEN
    }

    fn computes_udp_checksum(&self) -> bool {
        self.nic_udp_checksums
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.rx.pop_with(|frame| f(frame.as_bytes()))
    }

    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], RxVerdict) -> R) -> Option<R> {
        self.rx.pop_with(|frame| f(frame.as_bytes(), frame.verdict))
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
            slot.verdict = RxVerdict::IN_MEMORY;
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
        let got = a.receive_with_verdict(|frame, verdict| (frame.len(), verdict.crc));
        assert_eq!(got, Some((64, CrcVerdict::NotChecked)));
    }

    /// A frame written in place by the other end's engine needs no
    /// checksum verification; one copied in carries its device's verdict
    /// (none: everything is checked).
    #[test]
    fn the_link_vouches_for_checksums_of_frames_written_in_memory_only() {
        let link: MemLink<4> = MemLink::new();
        let (mut a, mut b) = link.ends().unwrap();
        b.transmit(64, |f| f.fill(1)).unwrap();
        assert!(b.send_frame(&[2; 64]));
        let vouched = RxVerdict {
            checksums: ChecksumVerdict::Verified,
            crc: CrcVerdict::Good,
        };
        assert!(b.send_frame_with_verdict(&[3; 64], vouched));
        let mut got = std::vec::Vec::new();
        while let Some(v) = a.receive_with_verdict(|frame, verdict| (frame[0], verdict)) {
            got.push(v);
        }
        assert_eq!(
            got,
            [
                (1, RxVerdict::IN_MEMORY),
                (2, RxVerdict::NOT_CHECKED),
                (3, vouched)
            ]
        );
        assert_eq!(RxVerdict::IN_MEMORY.crc, CrcVerdict::NotChecked);
        // A slot reused by `send_frame` forgets the last writer's verdict.
        b.transmit(60, |f| f.fill(4)).unwrap();
        a.receive(|_| ()).unwrap();
        assert!(b.send_frame(&[5; 60]));
        assert_eq!(
            a.receive_with_verdict(|_, verdict| verdict),
            Some(RxVerdict::NOT_CHECKED)
        );
    }
}
