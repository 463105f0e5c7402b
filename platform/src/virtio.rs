//! A [`FrameDevice`] over a virtio-net device, using `virtio-drivers`'
//! heap-free `VirtIONetRaw`; [`VirtioEntropy`], the entropy source over a
//! virtio-rng device (`VirtIORng`); and [`PoolHal`], a DMA `Hal` backed by
//! a static page pool.
//!
//! Buffers: `Q` receive and `Q` transmit buffers of [`NET_BUF_LEN`] bytes in
//! a caller-provided [`NetBuffers`] (a `static` in firmware). Every receive
//! buffer is posted to the device at start and re-posted as soon as the
//! frame in it has been handled, so `receive` lends the DMA buffer itself.
//!
//! Assumptions of [`PoolHal`], true on QEMU `virt` with an identity map:
//! virtual and physical addresses are equal and DMA is cache-coherent.
//!
//! Checksums: the device is offered `VIRTIO_NET_F_GUEST_CSUM` (the
//! driver reads each received packet's header flags), so a device that
//! validates UDP checksums (`DATA_VALID`) or hands over a local sender's
//! packet with its checksum left partial (`NEEDS_CSUM`) spares the engine
//! that check ([`ChecksumVerdict::UdpVerified`]); QEMU offers the feature
//! only with a tap back end (its socket and user netdevs have no virtio
//! header), so under the QEMU harness every checksum is verified in
//! software. `VIRTIO_NET_F_CSUM` (the device computing checksums on
//! transmit) is not negotiated: the engine computes them.

use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};

use heapless::Vec;
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::device::rng::VirtIORng;
use virtio_drivers::transport::Transport as VirtioTransport;
use virtio_drivers::{BufferDirection, Hal, PhysAddr, PAGE_SIZE};

use crate::device::{ChecksumVerdict, FrameDevice, RxVerdict, MAX_FRAME_LEN};
use crate::entropy::{EntropyError, Seed};

/// Bytes per DMA frame buffer: the virtio-net header (at most 12 bytes)
/// plus a full frame, rounded up.
pub const NET_BUF_LEN: usize = 1536;

/// Receive and transmit buffers for a `Q`-entry virtio-net device.
#[repr(C, align(64))]
pub struct NetBuffers<const Q: usize> {
    rx: [[u8; NET_BUF_LEN]; Q],
    tx: [[u8; NET_BUF_LEN]; Q],
}

impl<const Q: usize> NetBuffers<Q> {
    /// Zeroed buffers (usable in a `static`).
    pub const fn new() -> Self {
        NetBuffers {
            rx: [[0; NET_BUF_LEN]; Q],
            tx: [[0; NET_BUF_LEN]; Q],
        }
    }
}

impl<const Q: usize> Default for NetBuffers<Q> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const Q: usize> core::fmt::Debug for NetBuffers<Q> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NetBuffers").field("entries", &Q).finish()
    }
}

/// Counters of the virtio-net device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct VirtioNetStats {
    pub rx_errors: u32,
    pub tx_errors: u32,
}

/// A virtio-net [`FrameDevice`] with `Q`-entry queues.
pub struct VirtioNetDevice<'a, H: Hal, T: VirtioTransport, const Q: usize> {
    raw: VirtIONetRaw<H, T, Q>,
    bufs: &'a mut NetBuffers<Q>,
    /// Receive buffer index per outstanding receive token.
    rx_buffer_of: [u16; Q],
    /// (transmit buffer index, submitted length) per outstanding transmit token.
    tx_buffer_of: [Option<(u16, u16)>; Q],
    tx_free: Vec<u16, Q>,
    stats: VirtioNetStats,
}

impl<H: Hal, T: VirtioTransport, const Q: usize> core::fmt::Debug for VirtioNetDevice<'_, H, T, Q> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VirtioNetDevice")
            .field("mac", &self.raw.mac_address())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<'a, H: Hal, T: VirtioTransport, const Q: usize> VirtioNetDevice<'a, H, T, Q> {
    /// Initialises the device on `transport` (offering
    /// `VIRTIO_NET_F_GUEST_CSUM`) and posts every receive buffer.
    pub fn new(transport: T, bufs: &'a mut NetBuffers<Q>) -> Result<Self, virtio_drivers::Error> {
        let mut raw = VirtIONetRaw::<H, T, Q>::new_with_guest_csum(transport)?;
        let mut rx_buffer_of = [0u16; Q];
        for (index, buf) in bufs.rx.iter_mut().enumerate() {
            // SAFETY: the buffer is borrowed from `bufs` for `'a`, which
            // outlives the driver; we touch it again only after the device
            // returns it through `poll_receive` / `receive_complete`.
            let token = unsafe { raw.receive_begin(buf)? };
            let slot = rx_buffer_of
                .get_mut(usize::from(token))
                .ok_or(virtio_drivers::Error::WrongToken)?;
            *slot = u16::try_from(index).map_err(|_| virtio_drivers::Error::InvalidParam)?;
        }
        let mut tx_free = Vec::new();
        for index in 0..Q {
            let index = u16::try_from(index).map_err(|_| virtio_drivers::Error::InvalidParam)?;
            let _ = tx_free.push(index);
        }
        Ok(VirtioNetDevice {
            raw,
            bufs,
            rx_buffer_of,
            tx_buffer_of: [None; Q],
            tx_free,
            stats: VirtioNetStats::default(),
        })
    }

    /// The device's MAC address.
    pub fn mac_address(&self) -> [u8; 6] {
        self.raw.mac_address()
    }

    /// Counters so far.
    pub fn stats(&self) -> VirtioNetStats {
        self.stats
    }

    /// Acknowledges the device's interrupt (call from the IRQ path).
    pub fn ack_interrupt(&mut self) {
        let _ = self.raw.ack_interrupt();
    }

    /// Asks the device to interrupt on used buffers.
    pub fn enable_interrupts(&mut self) {
        self.raw.enable_interrupts();
    }

    /// Takes back transmit buffers the device has finished with.
    fn reclaim(&mut self) {
        while let Some(token) = self.raw.poll_transmit() {
            let Some((index, len)) = self
                .tx_buffer_of
                .get_mut(usize::from(token))
                .and_then(Option::take)
            else {
                self.stats.tx_errors += 1;
                return;
            };
            let buf = &self.bufs.tx[usize::from(index)][..usize::from(len)];
            // SAFETY: `buf` is the same slice (buffer and length) passed to
            // `transmit_begin` for this token.
            if unsafe { self.raw.transmit_complete(token, buf) }.is_err() {
                self.stats.tx_errors += 1;
            }
            let _ = self.tx_free.push(index);
        }
    }
}

/// `flags` of the virtio-net header (its first byte): the packet's
/// checksum is partial (a local sender's, the packet valid).
const NEEDS_CSUM: u8 = 1;
/// `flags`: the device validated the packet's (UDP) checksum.
const DATA_VALID: u8 = 2;

/// What a received packet's header `flags` say of its checksums: zero
/// unless `VIRTIO_NET_F_GUEST_CSUM` was negotiated.
fn checksum_verdict(flags: u8) -> ChecksumVerdict {
    if flags & (NEEDS_CSUM | DATA_VALID) != 0 {
        ChecksumVerdict::UdpVerified
    } else {
        ChecksumVerdict::NotChecked
    }
}

impl<H: Hal, T: VirtioTransport, const Q: usize> FrameDevice for VirtioNetDevice<'_, H, T, Q> {
    fn max_frame_len(&self) -> usize {
        MAX_FRAME_LEN
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.receive_with_verdict(|frame, _| f(frame))
    }

    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], RxVerdict) -> R) -> Option<R> {
        let token = self.raw.poll_receive()?;
        let index = usize::from(*self.rx_buffer_of.get(usize::from(token))?);
        let buf = self.bufs.rx.get_mut(index)?;
        // SAFETY: `buf` is the buffer passed to `receive_begin` for `token`.
        let result = match unsafe { self.raw.receive_complete(token, buf) } {
            Ok((header, len)) => {
                let verdict = RxVerdict {
                    checksums: checksum_verdict(buf[0]),
                    ..RxVerdict::NOT_CHECKED
                };
                buf.get(header..header + len).map(|frame| f(frame, verdict))
            }
            Err(_) => None,
        };
        if result.is_none() {
            self.stats.rx_errors += 1;
        }
        // SAFETY: as in `new`: the buffer outlives the driver and is not
        // touched again until the device returns it.
        match unsafe { self.raw.receive_begin(buf) } {
            Ok(new_token) => {
                if let Some(slot) = self.rx_buffer_of.get_mut(usize::from(new_token)) {
                    *slot = index as u16;
                }
            }
            Err(_) => self.stats.rx_errors += 1,
        }
        result
    }

    fn transmit_ready(&mut self) -> bool {
        self.reclaim();
        !self.tx_free.is_empty() && self.raw.can_send()
    }

    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if len > MAX_FRAME_LEN || !self.transmit_ready() {
            return None;
        }
        let index = self.tx_free.pop()?;
        let buf = &mut self.bufs.tx[usize::from(index)];
        let Ok(header) = self.raw.fill_buffer_header(buf) else {
            let _ = self.tx_free.push(index);
            return None;
        };
        let total = header + len;
        let result = f(&mut buf[header..total]);
        // SAFETY: the buffer is not touched again until `reclaim` sees its
        // token come back and calls `transmit_complete` with the same slice.
        match unsafe { self.raw.transmit_begin(&buf[..total]) } {
            Ok(token) => {
                if let Some(slot) = self.tx_buffer_of.get_mut(usize::from(token)) {
                    *slot = Some((index, total as u16));
                }
                Some(result)
            }
            Err(_) => {
                self.stats.tx_errors += 1;
                let _ = self.tx_free.push(index);
                None
            }
        }
    }
}

/// Device round trips [`VirtioEntropy::fill`] makes at most for 32 bytes
/// (a device may return fewer bytes than asked).
const ENTROPY_REQUESTS: usize = 8;

/// The virtio-rng device as an entropy source (spec 5.1.6): QEMU's
/// `virtio-rng-device`, whose default back end is the host's
/// `getrandom`.
pub struct VirtioEntropy<H: Hal, T: VirtioTransport> {
    rng: VirtIORng<H, T>,
}

impl<H: Hal, T: VirtioTransport> core::fmt::Debug for VirtioEntropy<H, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("VirtioEntropy")
    }
}

impl<H: Hal, T: VirtioTransport> VirtioEntropy<H, T> {
    /// Initialises the device on `transport`.
    pub fn new(transport: T) -> Result<Self, EntropyError> {
        VirtIORng::new(transport)
            .map(|rng| VirtioEntropy { rng })
            .map_err(|_| EntropyError::Failed)
    }

    /// Fills `out` from the device, asking again while it returns fewer
    /// bytes than still missing (at most [`ENTROPY_REQUESTS`] times).
    pub fn fill(&mut self, out: &mut Seed) -> Result<(), EntropyError> {
        let mut filled = 0;
        for _ in 0..ENTROPY_REQUESTS {
            let Some(rest) = out.get_mut(filled..).filter(|r| !r.is_empty()) else {
                break;
            };
            let got = self
                .rng
                .request_entropy(rest)
                .map_err(|_| EntropyError::Failed)?;
            filled += got.min(rest.len());
        }
        if filled == out.len() {
            Ok(())
        } else {
            Err(EntropyError::Failed)
        }
    }
}

/// Pages in the DMA pool of [`PoolHal`] (virtqueue rings only; frame
/// buffers are in [`NetBuffers`]).
pub const POOL_PAGES: usize = 32;

#[repr(C, align(4096))]
struct Pool(UnsafeCell<[[u8; PAGE_SIZE]; POOL_PAGES]>);

// SAFETY: pages are handed out at most once each (the bump index below only
// grows), so no two users share one.
unsafe impl Sync for Pool {}

static POOL: Pool = Pool(UnsafeCell::new([[0; PAGE_SIZE]; POOL_PAGES]));
static POOL_NEXT: AtomicUsize = AtomicUsize::new(0);

/// A virtio `Hal` that hands out pages from a static pool and never takes
/// them back (queues live as long as the firmware). Identity-mapped,
/// coherent DMA: see the module documentation.
#[derive(Debug)]
pub struct PoolHal;

// SAFETY: `dma_alloc` returns distinct, page-aligned, zeroed pages of a
// static that nothing else references; physical equals virtual under the
// identity map this Hal requires; `share` gives the device the buffer's
// own address (coherent DMA, nothing to copy).
unsafe impl Hal for PoolHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let start = POOL_NEXT.fetch_add(pages, Ordering::AcqRel);
        // A configuration error (more queues than the pool was sized for),
        // found at the first boot: there is no error path in `Hal`.
        assert!(start + pages <= POOL_PAGES, "virtio DMA pool exhausted");
        let base = POOL.0.get().cast::<u8>();
        // SAFETY: `start + pages <= POOL_PAGES`, so the offset stays inside
        // the pool.
        let ptr = unsafe { base.add(start * PAGE_SIZE) };
        // SAFETY: these pages were never handed out before (the index only
        // grows), so nobody else reads or writes them.
        unsafe { core::ptr::write_bytes(ptr, 0, pages * PAGE_SIZE) };
        let vaddr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        (ptr as usize as PhysAddr, vaddr)
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) -> i32 {
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as usize as *mut u8).unwrap_or(NonNull::dangling())
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as usize as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_flags_give_the_checksum_verdict() {
        assert_eq!(checksum_verdict(0), ChecksumVerdict::NotChecked);
        assert_eq!(checksum_verdict(DATA_VALID), ChecksumVerdict::UdpVerified);
        assert_eq!(checksum_verdict(NEEDS_CSUM), ChecksumVerdict::UdpVerified);
        // RSC_INFO says nothing of checksums.
        assert_eq!(checksum_verdict(4), ChecksumVerdict::NotChecked);
    }
}
