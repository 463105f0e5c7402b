//! Descriptor rings and doorbells in shared memory, at addresses from
//! `board.toml`: the firmware's side of the data-path queues between the
//! ARM complex and the NIC (or a host driver). The real Elba queue
//! interface is vendor-specific; this is a documented stand-in with the
//! usual NIC shape, implementing the platform's [`RingProducer`],
//! [`RingConsumer`], [`Doorbell`] and [`FrameDevice`] traits so the
//! platform's engine loop runs over it unchanged.
//!
//! # Ring layout (little-endian, offsets from the ring's base, 64-byte aligned)
//!
//! | offset | field | written by |
//! |---|---|---|
//! | `0x00` | magic `u32` = [`RING_MAGIC`] ("MRRG") | whoever formats the ring |
//! | `0x04` | version `u32` = [`RING_VERSION`] | formatter |
//! | `0x08` | slot count `u32` (a power of two) | formatter |
//! | `0x0c` | slot size `u32` in bytes | formatter |
//! | `0x40` | head `u32`: next slot the producer fills (free-running) | producer |
//! | `0x80` | tail `u32`: next slot the consumer drains (free-running) | consumer |
//! | `0xc0` | slots: `count` descriptors of `slot size` bytes | producer, then consumer |
//!
//! Slot `i` is `i % count`; `head - tail` (wrapping) is the fill level.
//! The producer writes a slot, then stores `head` with Release; the
//! consumer loads `head` with Acquire, reads the slot, then stores `tail`
//! with Release. Head and tail sit on their own cache lines. Indices from
//! the other side are not trusted: a fill level above `count` is reported
//! ([`ShmConsumer::fault`]) and treated as empty (or full), never followed.
//!
//! A frame slot is a [`FrameDescriptor`]: `u16` length, `u16` flags, then
//! the frame bytes (1536 bytes in all). Flags, as a NIC's descriptors
//! carry its checksum offload (spec 3.1.5, "Who verifies"):
//!
//! | bit | direction | meaning |
//! |---|---|---|
//! | [`FLAG_TX_UDP_CHECKSUM`] | to the NIC | compute the frame's UDP checksum (IPv4 or IPv6; the pseudo-header, the UDP header with the field zero, the payload; a computed 0 sent as `0xffff`) and write it; the firmware left it zero |
//! | [`FLAG_RX_CHECKSUMS_GOOD`] | from the NIC | the frame's IPv4 header checksum and UDP checksum were verified and are good; without it the engine verifies them |
//!
//! Other bits are zero; a NIC that finds a checksum wrong delivers the
//! frame without [`FLAG_RX_CHECKSUMS_GOOD`], and the engine finds and
//! counts it.
//!
//! A doorbell ([`ShmDoorbell`]) is a `u32` word the ringing side
//! increments (Release) and the other side compares with the last value
//! it saw; ringing may also notify ([`Notify`]): an MMIO write or an
//! interrupt, whatever the board wires.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::{align_of, size_of};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use metaroce_platform::device::{
    ChecksumVerdict, CrcVerdict, FrameDevice, RxVerdict, MAX_FRAME_LEN,
};
use metaroce_platform::doorbell::Doorbell;
use metaroce_platform::ring::{RingConsumer, RingProducer};

/// "MRRG", little-endian.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"MRRG");
/// Layout version of this module's rings.
pub const RING_VERSION: u32 = 1;
/// Most slots a ring may have.
pub const MAX_SLOTS: u32 = 1 << 15;
/// Bytes of frame data in a [`FrameDescriptor`].
pub const FRAME_DATA_BYTES: usize = 1532;
/// [`FrameDescriptor::flags`]: the NIC computes the UDP checksum.
pub const FLAG_TX_UDP_CHECKSUM: u16 = 1 << 0;
/// [`FrameDescriptor::flags`]: the NIC verified the IPv4 header and UDP
/// checksums.
pub const FLAG_RX_CHECKSUMS_GOOD: u16 = 1 << 1;

/// The ring header: three cache lines (see the module documentation).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct RingHeader {
    magic: AtomicU32,
    version: AtomicU32,
    slots: AtomicU32,
    slot_bytes: AtomicU32,
    _config_pad: [u32; 12],
    head: AtomicU32,
    _head_pad: [u32; 15],
    tail: AtomicU32,
    _tail_pad: [u32; 15],
}

const _: () = assert!(size_of::<RingHeader>() == crate::board::RING_HEADER_BYTES);
const _: () = assert!(size_of::<FrameDescriptor>() == crate::board::FRAME_SLOT_BYTES);

/// Plain data that may live in a shared-memory slot.
///
/// # Safety
/// The type must be `repr(C)` (or a primitive) with no padding bytes and
/// accept every bit pattern, because the other side writes the slots.
pub unsafe trait Descriptor: Copy {}

// SAFETY: primitives accept every bit pattern and have no padding.
unsafe impl Descriptor for u32 {}
// SAFETY: as above.
unsafe impl Descriptor for u64 {}

/// One frame in a ring slot.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FrameDescriptor {
    /// Bytes of `data` in use.
    pub len: u16,
    /// Checksum offload ([`FLAG_TX_UDP_CHECKSUM`],
    /// [`FLAG_RX_CHECKSUMS_GOOD`]); other bits zero.
    pub flags: u16,
    pub data: [u8; FRAME_DATA_BYTES],
}

// SAFETY: `repr(C)`, two u16 then bytes: no padding, any bit pattern valid.
unsafe impl Descriptor for FrameDescriptor {}

impl core::fmt::Debug for FrameDescriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FrameDescriptor")
            .field("len", &self.len)
            .field("flags", &self.flags)
            .finish()
    }
}

/// Why a ring could not be formatted or attached, or misbehaved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmError {
    /// The region is smaller than the ring.
    TooSmall {
        needed: usize,
        have: usize,
    },
    /// The region is not 64-byte aligned.
    Misaligned,
    /// The slot count is not a power of two in `1..=MAX_SLOTS`.
    BadSlotCount(u32),
    /// No ring header at this address.
    BadMagic(u32),
    BadVersion(u32),
    /// The ring was formatted for another descriptor size.
    SlotSizeMismatch {
        expected: u32,
        found: u32,
    },
    /// The other side published indices more than `count` apart.
    CorruptIndices {
        head: u32,
        tail: u32,
    },
}

/// A ring of `T` descriptors over a shared-memory region, borrowed for `'a`.
#[derive(Debug)]
pub struct ShmRing<'a, T: Descriptor> {
    header: NonNull<RingHeader>,
    slots: NonNull<T>,
    count: u32,
    _memory: PhantomData<&'a mut [u8]>,
    _item: PhantomData<T>,
}

impl<'a, T: Descriptor> ShmRing<'a, T> {
    /// Bytes a ring of `slots` descriptors occupies.
    pub const fn bytes_for(slots: u32) -> usize {
        size_of::<RingHeader>() + slots as usize * size_of::<T>()
    }

    /// Formats `memory` as an empty ring of `slots` descriptors.
    pub fn format(memory: &'a mut [u8], slots: u32) -> Result<Self, ShmError> {
        let base = NonNull::from(&mut *memory).cast::<u8>();
        // SAFETY: `memory` is exclusively borrowed for 'a, so nothing else
        // touches it while the ring lives.
        unsafe { Self::format_raw(base, memory.len(), slots) }
    }

    /// Attaches to a ring already formatted in `memory`, keeping its state.
    pub fn attach(memory: &'a mut [u8]) -> Result<Self, ShmError> {
        let base = NonNull::from(&mut *memory).cast::<u8>();
        // SAFETY: as in `format`.
        unsafe { Self::attach_raw(base, memory.len()) }
    }

    /// Formats the region at `base` as an empty ring.
    ///
    /// # Safety
    /// `[base, base + len)` must be valid, mapped normal memory for `'a`,
    /// and any other agent touching it (the NIC, a host driver) must follow
    /// the ring protocol of the module documentation.
    pub unsafe fn format_raw(base: NonNull<u8>, len: usize, slots: u32) -> Result<Self, ShmError> {
        Self::check_region(base, len, slots)?;
        let header = base.cast::<RingHeader>();
        // SAFETY: the region is valid and 64-byte aligned (checked above)
        // and holds at least a header.
        let h = unsafe { header.as_ref() };
        h.head.store(0, Ordering::Relaxed);
        h.tail.store(0, Ordering::Relaxed);
        h.slots.store(slots, Ordering::Relaxed);
        h.slot_bytes.store(size_of::<T>() as u32, Ordering::Relaxed);
        h.version.store(RING_VERSION, Ordering::Relaxed);
        // Release: whoever reads the magic sees the rest of the header.
        h.magic.store(RING_MAGIC, Ordering::Release);
        // SAFETY: as above.
        Ok(unsafe { Self::at(base, slots) })
    }

    /// Attaches to a ring formatted by the other side at `base`.
    ///
    /// # Safety
    /// As for [`Self::format_raw`].
    pub unsafe fn attach_raw(base: NonNull<u8>, len: usize) -> Result<Self, ShmError> {
        if !(base.as_ptr() as usize).is_multiple_of(align_of::<RingHeader>()) {
            return Err(ShmError::Misaligned);
        }
        let needed = size_of::<RingHeader>();
        if len < needed {
            return Err(ShmError::TooSmall { needed, have: len });
        }
        // SAFETY: valid, aligned and large enough for a header (checked).
        let h = unsafe { base.cast::<RingHeader>().as_ref() };
        let magic = h.magic.load(Ordering::Acquire);
        if magic != RING_MAGIC {
            return Err(ShmError::BadMagic(magic));
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != RING_VERSION {
            return Err(ShmError::BadVersion(version));
        }
        let found = h.slot_bytes.load(Ordering::Relaxed);
        let expected = size_of::<T>() as u32;
        if found != expected {
            return Err(ShmError::SlotSizeMismatch { expected, found });
        }
        let slots = h.slots.load(Ordering::Relaxed);
        Self::check_region(base, len, slots)?;
        // SAFETY: the region holds a header and `slots` descriptors.
        Ok(unsafe { Self::at(base, slots) })
    }

    fn check_region(base: NonNull<u8>, len: usize, slots: u32) -> Result<(), ShmError> {
        if !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(ShmError::BadSlotCount(slots));
        }
        if !(base.as_ptr() as usize).is_multiple_of(align_of::<RingHeader>())
            || !size_of::<RingHeader>().is_multiple_of(align_of::<T>())
        {
            return Err(ShmError::Misaligned);
        }
        let needed = Self::bytes_for(slots);
        if len < needed {
            return Err(ShmError::TooSmall { needed, have: len });
        }
        Ok(())
    }

    /// # Safety
    /// `base` holds a checked header and `slots` descriptors, valid for 'a.
    unsafe fn at(base: NonNull<u8>, slots: u32) -> Self {
        ShmRing {
            header: base.cast(),
            // SAFETY: the slots start right after the header, inside the
            // region (checked by the caller).
            slots: unsafe { base.add(size_of::<RingHeader>()) }.cast(),
            count: slots,
            _memory: PhantomData,
            _item: PhantomData,
        }
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: checked at construction, valid for 'a.
        unsafe { self.header.as_ref() }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.count as usize
    }

    /// Both halves (a test, or one agent playing both sides). The `&mut`
    /// borrow makes them the only producer and consumer in this program.
    pub fn split(&mut self) -> (ShmProducer<'_, T>, ShmConsumer<'_, T>) {
        let ring = &*self;
        (
            ShmProducer {
                ring,
                fault: Cell::new(None),
            },
            ShmConsumer {
                ring,
                fault: Cell::new(None),
            },
        )
    }

    /// The producer half, when the other side consumes.
    pub fn producer(&mut self) -> ShmProducer<'_, T> {
        self.split().0
    }

    /// The consumer half, when the other side produces.
    pub fn consumer(&mut self) -> ShmConsumer<'_, T> {
        self.split().1
    }

    fn slot(&self, index: u32) -> *mut T {
        // SAFETY: `count` is a power of two, so the masked index is inside
        // the `count` slots of the region.
        unsafe { self.slots.as_ptr().add((index & (self.count - 1)) as usize) }
    }

    /// `(head, tail, fill)`; `fill > count` means the indices are corrupt.
    fn indices(&self) -> (u32, u32, u32) {
        let h = self.header();
        let head = h.head.load(Ordering::Acquire);
        let tail = h.tail.load(Ordering::Acquire);
        (head, tail, head.wrapping_sub(tail))
    }
}

/// The producer half of a [`ShmRing`].
#[derive(Debug)]
pub struct ShmProducer<'r, T: Descriptor> {
    ring: &'r ShmRing<'r, T>,
    fault: Cell<Option<ShmError>>,
}

impl<T: Descriptor> ShmProducer<'_, T> {
    /// Fills the next slot in place with `f` and publishes it; `None` (and
    /// `f` not called) if the ring is full.
    pub fn push_with<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        if self.free() == 0 {
            return None;
        }
        let h = self.ring.header();
        // Only this producer writes `head`.
        let head = h.head.load(Ordering::Relaxed);
        // SAFETY: the slot of `head` is outside `[tail, head)` (there is a
        // free slot), so the consumer does not read it until `head + 1` is
        // published below; every bit pattern is a valid `T`.
        let result = f(unsafe { &mut *self.ring.slot(head) });
        // Release: the slot is written before the new head is visible.
        h.head.store(head.wrapping_add(1), Ordering::Release);
        Some(result)
    }

    /// The first index fault seen (the consumer's tail ran past head).
    pub fn fault(&self) -> Option<ShmError> {
        self.fault.get()
    }
}

impl<T: Descriptor> RingProducer<T> for ShmProducer<'_, T> {
    fn push(&mut self, item: T) -> Result<(), T> {
        self.push_with(|slot| *slot = item).ok_or(item)
    }

    fn free(&self) -> usize {
        let (head, tail, fill) = self.ring.indices();
        if fill > self.ring.count {
            if self.fault.get().is_none() {
                self.fault
                    .set(Some(ShmError::CorruptIndices { head, tail }));
            }
            return 0;
        }
        (self.ring.count - fill) as usize
    }
}

/// The consumer half of a [`ShmRing`].
#[derive(Debug)]
pub struct ShmConsumer<'r, T: Descriptor> {
    ring: &'r ShmRing<'r, T>,
    fault: Cell<Option<ShmError>>,
}

impl<T: Descriptor> ShmConsumer<'_, T> {
    /// The first index fault seen (the producer's head ran ahead by more
    /// than the ring holds).
    pub fn fault(&self) -> Option<ShmError> {
        self.fault.get()
    }

    /// The slot of the oldest item, if any (not released).
    fn front(&self) -> Option<(u32, *mut T)> {
        (self.len() > 0).then(|| {
            // Only this consumer writes `tail`.
            let tail = self.ring.header().tail.load(Ordering::Relaxed);
            (tail, self.ring.slot(tail))
        })
    }
}

impl<T: Descriptor> RingConsumer<T> for ShmConsumer<'_, T> {
    fn pop_with<R>(&mut self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let (tail, slot) = self.front()?;
        // SAFETY: the slot of `tail` is inside `[tail, head)`: published by
        // the producer (Acquire in `len`) and not rewritten until we
        // release it below.
        let result = f(unsafe { &*slot });
        // Release: we are done with the slot before the producer reuses it.
        self.ring
            .header()
            .tail
            .store(tail.wrapping_add(1), Ordering::Release);
        Some(result)
    }

    fn peek(&self) -> Option<T> {
        let (_, slot) = self.front()?;
        // SAFETY: as in `pop_with`; the slot stays ours (tail not moved).
        Some(unsafe { slot.read() })
    }

    fn len(&self) -> usize {
        let (head, tail, fill) = self.ring.indices();
        if fill > self.ring.count {
            if self.fault.get().is_none() {
                self.fault
                    .set(Some(ShmError::CorruptIndices { head, tail }));
            }
            return 0;
        }
        fill as usize
    }
}

/// What ringing a doorbell does besides bumping its word: an MMIO write
/// to the other side, raising an interrupt, or nothing (`()`).
pub trait Notify {
    /// Called after the doorbell word became `count`.
    fn notify(&self, count: u32);
}

impl Notify for () {
    fn notify(&self, _count: u32) {}
}

/// A doorbell word in shared memory (see the module documentation).
#[derive(Debug)]
pub struct ShmDoorbell<'a, N: Notify = ()> {
    word: &'a AtomicU32,
    seen: Cell<u32>,
    notify: N,
}

impl<'a, N: Notify> ShmDoorbell<'a, N> {
    /// A doorbell over `word`; rings before this call do not count.
    pub fn new(word: &'a AtomicU32, notify: N) -> Self {
        ShmDoorbell {
            seen: Cell::new(word.load(Ordering::Acquire)),
            word,
            notify,
        }
    }

    /// Whether it rang since the last [`Doorbell::take`], without taking it.
    pub fn pending(&self) -> bool {
        self.word.load(Ordering::Acquire) != self.seen.get()
    }
}

impl<N: Notify> Doorbell for ShmDoorbell<'_, N> {
    fn ring(&self) {
        // Release: the ring entries written before are visible to whoever
        // sees the new count.
        let count = self.word.fetch_add(1, Ordering::Release).wrapping_add(1);
        self.notify.notify(count);
    }

    fn take(&self) -> bool {
        let now = self.word.load(Ordering::Acquire);
        self.seen.replace(now) != now
    }
}

/// Counters of a [`ShmFrameDevice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmDeviceStats {
    /// Received descriptors dropped: length above the slot or the MTU.
    pub rx_bad_length: u64,
}

/// A frame device over two shared-memory rings: frames from the NIC side
/// arrive on `rx`; frames to send go on `tx`, then `tx_bell` rings.
#[derive(Debug)]
pub struct ShmFrameDevice<'r, N: Notify> {
    rx: ShmConsumer<'r, FrameDescriptor>,
    tx: ShmProducer<'r, FrameDescriptor>,
    tx_bell: ShmDoorbell<'r, N>,
    stats: ShmDeviceStats,
}

impl<'r, N: Notify> ShmFrameDevice<'r, N> {
    pub fn new(
        rx: ShmConsumer<'r, FrameDescriptor>,
        tx: ShmProducer<'r, FrameDescriptor>,
        tx_bell: ShmDoorbell<'r, N>,
    ) -> Self {
        ShmFrameDevice {
            rx,
            tx,
            tx_bell,
            stats: ShmDeviceStats::default(),
        }
    }

    /// Frames waiting on the rx ring.
    pub fn rx_pending(&self) -> usize {
        self.rx.len()
    }

    pub fn stats(&self) -> ShmDeviceStats {
        self.stats
    }

    /// The first index fault of either ring.
    pub fn fault(&self) -> Option<ShmError> {
        self.rx.fault().or(self.tx.fault())
    }
}

impl<N: Notify> FrameDevice for ShmFrameDevice<'_, N> {
    fn max_frame_len(&self) -> usize {
        MAX_FRAME_LEN
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.receive_with_verdict(|frame, _| f(frame))
    }

    /// The NIC's checksum verdict from the descriptor's flags; the CRC
    /// trailer is the engine's to check.
    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], RxVerdict) -> R) -> Option<R> {
        let mut f = Some(f);
        loop {
            let delivered = self.rx.pop_with(|d| {
                let len = usize::from(d.len);
                if len > MAX_FRAME_LEN {
                    return None;
                }
                let verdict = RxVerdict {
                    checksums: if d.flags & FLAG_RX_CHECKSUMS_GOOD != 0 {
                        ChecksumVerdict::Verified
                    } else {
                        ChecksumVerdict::NotChecked
                    },
                    crc: CrcVerdict::NotChecked,
                };
                f.take().map(|f| f(&d.data[..len], verdict))
            })?;
            match delivered {
                Some(result) => return Some(result),
                // A bad descriptor: drop it and look at the next one.
                None => self.stats.rx_bad_length += 1,
            }
        }
    }

    /// The NIC computes UDP checksums ([`FLAG_TX_UDP_CHECKSUM`] on every
    /// frame sent).
    fn computes_udp_checksum(&self) -> bool {
        true
    }

    fn transmit_ready(&mut self) -> bool {
        !self.tx.is_full()
    }

    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let wire_len = u16::try_from(len).ok().filter(|_| len <= MAX_FRAME_LEN)?;
        let result = self.tx.push_with(|d| {
            d.len = wire_len;
            d.flags = FLAG_TX_UDP_CHECKSUM;
            f(&mut d.data[..len])
        })?;
        self.tx_bell.ring();
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Fake shared memory: 64-byte aligned bytes.
    #[repr(C, align(64))]
    struct Memory<const N: usize>([u8; N]);

    impl<const N: usize> Memory<N> {
        fn new() -> Self {
            Memory([0xa5; N])
        }
    }

    /// Deterministic xorshift for the randomized exchange.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let mut mem = Memory::<4096>::new();
        ShmRing::<u64>::format(&mut mem.0, 8).unwrap();
        fn word(mem: &[u8], off: usize) -> u32 {
            u32::from_le_bytes(mem[off..off + 4].try_into().unwrap())
        }
        assert_eq!(&mem.0[0..4], b"MRRG");
        assert_eq!(word(&mem.0, 0x04), RING_VERSION);
        assert_eq!(word(&mem.0, 0x08), 8);
        assert_eq!(word(&mem.0, 0x0c), 8);
        assert_eq!(word(&mem.0, 0x40), 0, "head");
        assert_eq!(word(&mem.0, 0x80), 0, "tail");
        assert_eq!(ShmRing::<FrameDescriptor>::bytes_for(64), 0xc0 + 64 * 1536);
        let mut ring = ShmRing::<u64>::attach(&mut mem.0).unwrap();
        let (mut p, _) = ring.split();
        p.push(0x1122_3344_5566_7788).unwrap();
        assert_eq!(word(&mem.0, 0x40), 1, "head after one push");
        assert_eq!(
            &mem.0[0xc0..0xc8],
            &0x1122_3344_5566_7788u64.to_le_bytes(),
            "slot 0 right after the header"
        );
    }

    #[test]
    fn bad_regions_and_headers_are_typed_errors() {
        let mut mem = Memory::<1024>::new();
        assert_eq!(
            ShmRing::<u64>::format(&mut mem.0, 3).unwrap_err(),
            ShmError::BadSlotCount(3)
        );
        assert_eq!(
            ShmRing::<u64>::format(&mut mem.0, 0).unwrap_err(),
            ShmError::BadSlotCount(0)
        );
        assert_eq!(
            ShmRing::<u64>::format(&mut mem.0, 128).unwrap_err(),
            ShmError::TooSmall {
                needed: 192 + 1024,
                have: 1024
            }
        );
        assert_eq!(
            ShmRing::<u64>::format(&mut mem.0[8..], 4).unwrap_err(),
            ShmError::Misaligned
        );
        assert_eq!(
            ShmRing::<u64>::attach(&mut mem.0).unwrap_err(),
            ShmError::BadMagic(0xa5a5_a5a5)
        );
        ShmRing::<u64>::format(&mut mem.0, 4).unwrap();
        assert_eq!(
            ShmRing::<u32>::attach(&mut mem.0).unwrap_err(),
            ShmError::SlotSizeMismatch {
                expected: 4,
                found: 8
            }
        );
        mem.0[4] = 9;
        assert_eq!(
            ShmRing::<u64>::attach(&mut mem.0).unwrap_err(),
            ShmError::BadVersion(9)
        );
        mem.0[4] = 1;
        mem.0[8] = 128; // 128 slots no longer fit 1 KiB
        assert!(matches!(
            ShmRing::<u64>::attach(&mut mem.0),
            Err(ShmError::TooSmall { .. })
        ));
    }

    #[test]
    fn fifo_full_empty_and_wraparound() {
        let mut mem = Memory::<1024>::new();
        let mut ring = ShmRing::<u32>::format(&mut mem.0, 4).unwrap();
        let (mut p, mut c) = ring.split();
        assert!(c.is_empty());
        assert_eq!(c.pop(), None);
        let mut seed = 0x5eed_u64;
        let (mut sent, mut got) = (0u32, 0u32);
        for _ in 0..1000 {
            for _ in 0..next(&mut seed) % 6 {
                if p.push(sent).is_ok() {
                    sent += 1;
                } else {
                    assert!(p.is_full());
                    assert_eq!(c.len(), 4);
                }
            }
            for _ in 0..next(&mut seed) % 6 {
                if let Some(v) = c.peek() {
                    assert_eq!(c.pop(), Some(v));
                    assert_eq!(v, got);
                    got += 1;
                }
            }
        }
        while let Some(v) = c.pop() {
            assert_eq!(v, got);
            got += 1;
        }
        assert_eq!(sent, got);
        assert!(sent > 1000);
        assert!(p.fault().is_none() && c.fault().is_none());
    }

    #[test]
    fn indices_wrap_around_u32() {
        let mut mem = Memory::<1024>::new();
        ShmRing::<u32>::format(&mut mem.0, 8).unwrap();
        let start = (u32::MAX - 2).to_le_bytes();
        mem.0[0x40..0x44].copy_from_slice(&start);
        mem.0[0x80..0x84].copy_from_slice(&start);
        let mut ring = ShmRing::<u32>::attach(&mut mem.0).unwrap();
        let (mut p, mut c) = ring.split();
        for i in 0..8 {
            p.push(i).unwrap();
        }
        assert!(p.push(8).is_err());
        let got: Vec<u32> = core::iter::from_fn(|| c.pop()).collect();
        assert_eq!(got, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn corrupt_indices_from_the_other_side_are_reported_not_followed() {
        let mut mem = Memory::<1024>::new();
        ShmRing::<u32>::format(&mut mem.0, 4).unwrap();
        // The "NIC" publishes a head 100 slots ahead of the tail.
        mem.0[0x40..0x44].copy_from_slice(&100u32.to_le_bytes());
        let mut ring = ShmRing::<u32>::attach(&mut mem.0).unwrap();
        let (mut p, mut c) = ring.split();
        assert_eq!(c.pop(), None);
        assert_eq!(
            c.fault(),
            Some(ShmError::CorruptIndices { head: 100, tail: 0 })
        );
        assert!(p.push(1).is_err());
        assert!(p.fault().is_some());
    }

    #[test]
    fn doorbells_count_coalesce_and_notify() {
        struct Log(Cell<u32>);
        impl Notify for &Log {
            fn notify(&self, count: u32) {
                self.0.set(count);
            }
        }
        let word = AtomicU32::new(7);
        let log = Log(Cell::new(0));
        let ringer = ShmDoorbell::new(&word, &log);
        let waiter = ShmDoorbell::new(&word, ());
        assert!(!waiter.take(), "rings before `new` do not count");
        ringer.ring();
        ringer.ring();
        assert_eq!(log.0.get(), 9);
        assert!(waiter.pending());
        assert!(waiter.take());
        assert!(!waiter.take());
        assert!(!waiter.pending());
    }

    #[test]
    fn frame_device_moves_frames_in_place_and_drops_bad_lengths() {
        const SLOTS: u32 = 4;
        let mut rx_mem = Memory::<{ 192 + 4 * 1536 }>::new();
        let mut tx_mem = Memory::<{ 192 + 4 * 1536 }>::new();
        let mut rx_ring = ShmRing::<FrameDescriptor>::format(&mut rx_mem.0, SLOTS).unwrap();
        let mut tx_ring = ShmRing::<FrameDescriptor>::format(&mut tx_mem.0, SLOTS).unwrap();
        let (mut nic_rx, rx) = rx_ring.split();
        let (tx, mut nic_tx) = tx_ring.split();
        let tx_word = AtomicU32::new(0);
        let nic_bell = ShmDoorbell::new(&tx_word, ());
        let mut dev = ShmFrameDevice::new(rx, tx, ShmDoorbell::new(&tx_word, ()));

        // NIC side: one frame with a bad length, then two good ones.
        let frame = |len: u16, fill: u8| {
            let mut d = FrameDescriptor {
                len,
                flags: 0,
                data: [0; FRAME_DATA_BYTES],
            };
            d.data[..usize::from(len).min(FRAME_DATA_BYTES)].fill(fill);
            d
        };
        nic_rx.push(frame(1515, 1)).unwrap();
        nic_rx.push(frame(60, 2)).unwrap();
        nic_rx.push(frame(1514, 3)).unwrap();
        assert_eq!(dev.rx_pending(), 3);
        assert_eq!(dev.receive(|f| (f.len(), f[0])), Some((60, 2)));
        assert_eq!(dev.stats().rx_bad_length, 1);
        assert_eq!(dev.receive(|f| (f.len(), f[1513])), Some((1514, 3)));
        assert_eq!(dev.receive(|f| f.len()), None);

        // Firmware side transmits; the NIC sees frames and the doorbell.
        assert_eq!(dev.max_frame_len(), 1514);
        assert_eq!(dev.transmit(1515, |_| ()), None);
        for i in 0..SLOTS {
            assert!(dev.transmit_ready());
            dev.transmit(64 + i as usize, |f| f.fill(i as u8)).unwrap();
        }
        assert!(!dev.transmit_ready());
        assert_eq!(dev.transmit(60, |_| ()), None, "full ring: f not called");
        assert!(nic_bell.take());
        assert_eq!(tx_word.load(Ordering::Relaxed), SLOTS);
        for i in 0..SLOTS {
            let (len, first, last) = nic_tx
                .pop_with(|d| (d.len, d.data[0], d.data[usize::from(d.len) - 1]))
                .unwrap();
            assert_eq!((len, first, last), (64 + i as u16, i as u8, i as u8));
        }
        assert!(dev.fault().is_none());
    }

    #[test]
    fn checksum_offload_is_asked_of_the_nic_and_its_verdict_passed_on() {
        let mut rx_mem = Memory::<{ 192 + 4 * 1536 }>::new();
        let mut tx_mem = Memory::<{ 192 + 4 * 1536 }>::new();
        let mut rx_ring = ShmRing::<FrameDescriptor>::format(&mut rx_mem.0, 4).unwrap();
        let mut tx_ring = ShmRing::<FrameDescriptor>::format(&mut tx_mem.0, 4).unwrap();
        let (mut nic_rx, rx) = rx_ring.split();
        let (tx, mut nic_tx) = tx_ring.split();
        let word = AtomicU32::new(0);
        let mut dev = ShmFrameDevice::new(rx, tx, ShmDoorbell::new(&word, ()));
        assert!(dev.computes_udp_checksum());
        dev.transmit(60, |f| f.fill(0)).unwrap();
        assert_eq!(nic_tx.pop_with(|d| d.flags), Some(FLAG_TX_UDP_CHECKSUM));
        for flags in [FLAG_RX_CHECKSUMS_GOOD, 0] {
            let d = FrameDescriptor {
                len: 60,
                flags,
                data: [0; FRAME_DATA_BYTES],
            };
            nic_rx.push(d).unwrap();
        }
        let checksums = |dev: &mut ShmFrameDevice<'_, ()>| {
            dev.receive_with_verdict(|_, v| (v.checksums, v.crc))
                .unwrap()
        };
        assert_eq!(
            checksums(&mut dev),
            (ChecksumVerdict::Verified, CrcVerdict::NotChecked)
        );
        assert_eq!(
            checksums(&mut dev),
            (ChecksumVerdict::NotChecked, CrcVerdict::NotChecked)
        );
    }
}
