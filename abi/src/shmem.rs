//! Shared memory between the device and host processes: a PCI BAR as the
//! firmware sees it (QEMU's ivshmem BAR2, a DPU's host-interface window),
//! or the same file mapped by a host process.
//!
//! [`SharedMemory`] is a bounds-checked view over raw memory that another
//! agent writes concurrently. It never hands out Rust references into that
//! memory: every access is a copy, the index and phase words go through
//! atomics (Acquire loads, Release stores: the ordering rules of spec 6.4),
//! descriptors through volatile word copies, so a torn or hostile write
//! yields wrong bytes that the reader validates, never undefined behaviour
//! in the reader's own state.
//!
//! Both sides use it: the firmware's host interface
//! (`metaroce_platform::hostif`, which re-exports this module as
//! `metaroce_platform::shmem`) and the host library (`metaroce-verbs`),
//! so the host library needs this crate alone. It is the only module of
//! this crate with `unsafe`, each block with its `SAFETY:` argument.
//!
//! **Address translation, the one place** (spec 6.3): the ABI's I/O
//! addresses (buffer addresses in work entries and regions) are byte
//! offsets into this shared memory. The platform's `DmaCopy`
//! implementation for [`SharedMemory`] (`metaroce_platform::dma`) turns an
//! I/O address into `base + address` after a bounds check, through
//! [`SharedMemory::copy_in`] and [`SharedMemory::copy_out`]; on a DPU over
//! PCIe they would be host physical (or IOMMU) addresses that the DMA
//! engine reaches, and only this translation would change.

// The one place of this crate allowed `unsafe` (see the crate's lints).
#![allow(unsafe_code)]

use core::marker::PhantomData;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Why a shared-memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ShmError {
    /// `[offset, offset + len)` is outside the memory.
    OutOfBounds { offset: u64, len: u64 },
    /// The offset is not aligned as the access needs.
    Misaligned { offset: u64 },
}

/// A view of `len` bytes of shared memory starting at an 8-byte aligned
/// base, valid for `'a`. Copyable: every copy is the same view.
#[derive(Clone, Copy)]
pub struct SharedMemory<'a> {
    base: NonNull<u8>,
    len: usize,
    _memory: PhantomData<&'a [u8]>,
}

impl core::fmt::Debug for SharedMemory<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the view only performs atomic, volatile or byte-copy accesses
// whose bounds it checks; concurrent use from several threads is exactly
// the concurrent use by device and host the type exists for.
unsafe impl Send for SharedMemory<'_> {}
// SAFETY: as for `Send`: `&SharedMemory` offers nothing beyond those
// accesses.
unsafe impl Sync for SharedMemory<'_> {}

impl<'a> SharedMemory<'a> {
    /// A view of `[base, base + len)`; `None` if `base` is null or not
    /// 8-byte aligned.
    ///
    /// # Safety
    /// The memory must stay mapped, readable and writable for `'a`, and
    /// nothing may hold a Rust reference into it meanwhile (other agents
    /// writing it through their own views or mappings is expected).
    pub unsafe fn new(base: *mut u8, len: usize) -> Option<Self> {
        let base = NonNull::new(base)?;
        (base.as_ptr() as usize)
            .is_multiple_of(8)
            .then_some(SharedMemory {
                base,
                len,
                _memory: PhantomData,
            })
    }

    /// Bytes in the view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pointer to `[offset, offset + len)`, checked.
    fn at(&self, offset: u64, len: usize, align: usize) -> Result<*mut u8, ShmError> {
        let out = ShmError::OutOfBounds {
            offset,
            len: len as u64,
        };
        let start = usize::try_from(offset).map_err(|_| out)?;
        let end = start.checked_add(len).ok_or(out)?;
        if end > self.len {
            return Err(out);
        }
        if !start.is_multiple_of(align) {
            return Err(ShmError::Misaligned { offset });
        }
        // SAFETY: `start + len <= self.len`, so the result stays inside the
        // mapping `new`'s caller vouched for.
        Ok(unsafe { self.base.as_ptr().add(start) })
    }

    fn atomic_u32(&self, offset: u64) -> Result<&AtomicU32, ShmError> {
        let p = self.at(offset, 4, 4)?;
        // SAFETY: in bounds and 4-byte aligned (checked); the memory lives
        // for `'a` and is only ever accessed atomically at this word by
        // both sides (spec 6.4), so an atomic view of it is sound.
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    fn atomic_u64(&self, offset: u64) -> Result<&AtomicU64, ShmError> {
        let p = self.at(offset, 8, 8)?;
        // SAFETY: as in `atomic_u32`, for an 8-byte aligned word.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Loads the `u32` at `offset` with Acquire: what the other side wrote
    /// before its Release store of this word is visible afterwards.
    pub fn load_u32(&self, offset: u64) -> Result<u32, ShmError> {
        Ok(self.atomic_u32(offset)?.load(Ordering::Acquire))
    }

    /// Stores the `u32` at `offset` with Release: everything written before
    /// is visible to whoever loads this value with Acquire.
    pub fn store_u32(&self, offset: u64, value: u32) -> Result<(), ShmError> {
        self.atomic_u32(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    /// Compare-and-swap of the `u32` at `offset` (AcqRel): claims a queue
    /// set. `Err(actual)` if it did not hold `current`.
    pub fn compare_exchange_u32(
        &self,
        offset: u64,
        current: u32,
        new: u32,
    ) -> Result<Result<u32, u32>, ShmError> {
        Ok(self.atomic_u32(offset)?.compare_exchange(
            current,
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ))
    }

    /// Loads the `u64` at `offset` with Acquire.
    pub fn load_u64(&self, offset: u64) -> Result<u64, ShmError> {
        Ok(self.atomic_u64(offset)?.load(Ordering::Acquire))
    }

    /// Stores the `u64` at `offset` with Release.
    pub fn store_u64(&self, offset: u64, value: u64) -> Result<(), ShmError> {
        self.atomic_u64(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    /// Reads a `T` at `offset` (8-byte aligned, size a multiple of 8) by
    /// volatile word copies. Whatever the other side wrote, the result is
    /// some `T` (`FromBytes`); the caller validates it.
    pub fn read<T: FromBytes + IntoBytes>(&self, offset: u64) -> Result<T, ShmError> {
        let mut value = T::new_zeroed();
        let out = value.as_mut_bytes();
        let src = self.at(offset, out.len(), 8)?;
        if !out.len().is_multiple_of(8) {
            return Err(ShmError::Misaligned { offset });
        }
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: `src` is 8-byte aligned with `out.len()` bytes in
            // bounds (checked), so word `i` is in bounds and aligned.
            let word = unsafe { core::ptr::read_volatile(src.cast::<u64>().add(i)) };
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        Ok(value)
    }

    /// Writes `value` at `offset` (8-byte aligned, size a multiple of 8) by
    /// volatile word copies. Not ordered: publish with a Release store.
    pub fn write<T: IntoBytes + Immutable>(&self, offset: u64, value: &T) -> Result<(), ShmError> {
        self.write_words(offset, value.as_bytes())
    }

    /// Writes `bytes` (a multiple of 8 long) at `offset` (8-byte aligned) by
    /// volatile word copies: the part of an entry before its published
    /// last word.
    pub fn write_words(&self, offset: u64, bytes: &[u8]) -> Result<(), ShmError> {
        let dst = self.at(offset, bytes.len(), 8)?;
        if !bytes.len().is_multiple_of(8) {
            return Err(ShmError::Misaligned { offset });
        }
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            // SAFETY: as in `read`: word `i` is in bounds and aligned.
            unsafe {
                core::ptr::write_volatile(dst.cast::<u64>().add(i), u64::from_ne_bytes(word))
            };
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` into `out` (payload, any
    /// alignment).
    pub fn copy_out(&self, offset: u64, out: &mut [u8]) -> Result<(), ShmError> {
        let src = self.at(offset, out.len(), 1)?;
        // SAFETY: the source range is in bounds (checked) and cannot overlap
        // `out`, which Rust owns. By the protocol (spec 6.4) the host does
        // not write a buffer while the device reads it; if it does anyway,
        // the bytes copied are garbage for that host's own transfer, and
        // plain bytes have no invalid values.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `offset` (payload, any alignment).
    pub fn copy_in(&self, offset: u64, data: &[u8]) -> Result<(), ShmError> {
        let dst = self.at(offset, data.len(), 1)?;
        // SAFETY: as in `copy_out`, in the other direction.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: u64, len: usize, byte: u8) -> Result<(), ShmError> {
        let dst = self.at(offset, len, 1)?;
        // SAFETY: in bounds (checked); plain bytes.
        unsafe { core::ptr::write_bytes(dst, byte, len) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SendWqe;

    #[test]
    fn accesses_are_bounds_and_alignment_checked() {
        let mut backing = [0u64; 16];
        // SAFETY: `backing` outlives the view and is only touched through it.
        let shm = unsafe { SharedMemory::new(backing.as_mut_ptr().cast(), 128) }.unwrap();
        shm.store_u32(4, 7).unwrap();
        assert_eq!(shm.load_u32(4), Ok(7));
        assert!(shm.load_u32(2).is_err());
        assert!(shm.load_u32(128).is_err());
        assert!(shm.load_u64(u64::MAX).is_err());
        let wqe = SendWqe {
            wr_id: 9,
            opcode: 3,
            ..SendWqe::default()
        };
        shm.write(64, &wqe).unwrap();
        assert_eq!(shm.read::<SendWqe>(64), Ok(wqe));
        assert!(shm.read::<SendWqe>(72).is_err(), "runs past the end");
        assert!(shm.write(4, &wqe).is_err(), "misaligned");
        shm.copy_in(1, &[1, 2, 3]).unwrap();
        let mut out = [0; 3];
        shm.copy_out(1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert!(shm.copy_in(127, &[1, 2]).is_err());
    }
}
