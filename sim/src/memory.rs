//! A host's memory: one flat byte arena at a base address, which the
//! transport reads payload from and places payload into: through
//! [`metaroce_core::api::Memory`] (the RoCEv2 adapter calls its endpoint
//! directly) or as the DMA target of the platform's engine loop
//! ([`DmaCopy`], the MetaRoCE adapter).

use std::sync::Mutex;

use metaroce_core::api::Memory;
use metaroce_platform::dma::{DmaCopy, DmaError};

/// Where every host's arena starts (any non-zero address works; zero is
/// avoided so that a null address is never valid).
pub const ARENA_BASE: u64 = 0x1000_0000;

/// Value memory is filled with before anything is written, so stray writes
/// and missing data both show in integrity checks.
pub const FILL: u8 = 0xEE;

/// Buffers of dropped arenas, for the next arenas to reuse: an experiment
/// runs one simulation after another with the same memory layout, and
/// writing into already-mapped pages is several times cheaper than having
/// the kernel fault in and zero fresh ones (a quarter of a permutation
/// run's time went there). Shared by every thread; bounded by
/// [`SPARE_LIMIT_BYTES`].
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Most bytes [`SPARE`] keeps.
const SPARE_LIMIT_BYTES: usize = 2 << 30;

/// Buffers smaller than this are left to the allocator.
const SPARE_MIN_BYTES: usize = 1 << 20;

/// The smallest spare buffer that holds `len` bytes, if any.
fn take_spare(len: usize) -> Option<Vec<u8>> {
    if len < SPARE_MIN_BYTES {
        return None;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let best = spare
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capacity() >= len)
        .min_by_key(|(_, b)| b.capacity())
        .map(|(i, _)| i)?;
    Some(spare.swap_remove(best))
}

/// Keeps `bytes` for a later arena unless the spares are full.
fn give_spare(bytes: Vec<u8>) {
    if bytes.capacity() < SPARE_MIN_BYTES {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = spare.iter().map(Vec::capacity).sum();
    if held + bytes.capacity() <= SPARE_LIMIT_BYTES {
        spare.push(bytes);
    }
}

/// A host's memory.
#[derive(Debug, Clone)]
pub struct Arena {
    base: u64,
    bytes: Vec<u8>,
    /// Accesses outside the arena (the transport validated them against
    /// its regions, so these mean a region was registered beyond the
    /// arena): ignored and counted rather than panicking.
    pub out_of_bounds: u64,
}

impl Arena {
    /// `len` bytes at [`ARENA_BASE`], filled with [`FILL`] (in a dropped
    /// arena's buffer when one is large enough).
    pub fn new(len: usize) -> Arena {
        let bytes = match take_spare(len) {
            Some(mut bytes) => {
                // Every byte refilled: nothing of an earlier run shows.
                bytes.clear();
                bytes.resize(len, FILL);
                bytes
            }
            None => vec![FILL; len],
        };
        Arena {
            base: ARENA_BASE,
            bytes,
            out_of_bounds: 0,
        }
    }

    /// First address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes in the arena.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the arena is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn range(&self, addr: u64, len: usize) -> Option<core::ops::Range<usize>> {
        let start = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.bytes.len()).then_some(start..end)
    }

    /// The bytes at `[addr, addr + len)`, if inside the arena.
    pub fn get(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.range(addr, len).map(|r| &self.bytes[r])
    }

    /// Mutable bytes at `[addr, addr + len)`, if inside the arena.
    pub fn get_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        self.range(addr, len).map(|r| &mut self.bytes[r])
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        give_spare(core::mem::take(&mut self.bytes));
    }
}

impl Memory for Arena {
    fn write(&mut self, addr: u64, data: &[u8]) {
        match self.get_mut(addr, data.len()) {
            Some(dst) => dst.copy_from_slice(data),
            None => self.out_of_bounds += 1,
        }
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        match self.range(addr, out.len()) {
            Some(r) => out.copy_from_slice(&self.bytes[r]),
            None => {
                self.out_of_bounds += 1;
                out.fill(0);
            }
        }
    }
}

/// Refused copies count in [`Arena::out_of_bounds`] too, so workload
/// reports see them whichever way the transport reached memory.
impl DmaCopy for Arena {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        match self.get_mut(addr, data.len()) {
            Some(dst) => {
                dst.copy_from_slice(data);
                Ok(())
            }
            None => {
                self.out_of_bounds += 1;
                Err(DmaError::OutOfRange {
                    addr,
                    len: data.len(),
                })
            }
        }
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        match self.get(addr, out.len()) {
            Some(src) => {
                out.copy_from_slice(src);
                Ok(())
            }
            None => {
                self.out_of_bounds += 1;
                Err(DmaError::OutOfRange {
                    addr,
                    len: out.len(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_not_panicked() {
        let mut a = Arena::new(16);
        a.write(ARENA_BASE + 4, &[1, 2, 3]);
        assert_eq!(a.get(ARENA_BASE + 3, 5), Some(&[FILL, 1, 2, 3, FILL][..]));
        a.write(ARENA_BASE + 15, &[9, 9]);
        a.write(ARENA_BASE - 1, &[9]);
        let mut out = [7u8; 2];
        a.read(u64::MAX, &mut out);
        assert_eq!((a.out_of_bounds, out), (3, [0, 0]));
    }

    #[test]
    fn a_reused_buffer_is_refilled() {
        let len = SPARE_MIN_BYTES + 8;
        let mut a = Arena::new(len);
        a.write(ARENA_BASE, &[1; 8]);
        a.write(ARENA_BASE + len as u64 - 8, &[2; 8]);
        drop(a);
        // Whichever buffer comes back (other tests share the spares),
        // every byte holds FILL.
        let b = Arena::new(len - 8);
        assert_eq!(b.len(), len - 8);
        assert!(b
            .get(ARENA_BASE, len - 8)
            .unwrap()
            .iter()
            .all(|&x| x == FILL));
    }

    #[test]
    fn dma_copies_are_bounds_checked_and_counted() {
        let mut a = Arena::new(16);
        a.copy_to_host(ARENA_BASE + 14, &[1, 2]).unwrap();
        let mut out = [0u8; 3];
        a.copy_from_host(ARENA_BASE + 13, &mut out).unwrap();
        assert_eq!(out, [FILL, 1, 2]);
        assert!(a.copy_to_host(ARENA_BASE + 15, &[1, 2]).is_err());
        assert!(a.copy_from_host(ARENA_BASE - 1, &mut out).is_err());
        assert_eq!(a.out_of_bounds, 2);
    }
}
