//! The memory the engine places payload into and gathers it from: the
//! application's own buffers (registered with `fi_mr_reg`, or registered
//! by the provider for the length of one operation) and the provider's
//! bounce buffers, all at their virtual addresses (`FI_MR_VIRT_ADDR`).
//!
//! The MetaRoCE endpoint checks every address against the memory key's
//! region before it copies; this table checks again, so that even a wrong
//! region in the endpoint could never make the provider touch memory that
//! nobody registered.

use std::collections::BTreeMap;

use metaroce_platform::dma::{DmaCopy, DmaError};

/// Handle of one registered range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RangeId(u64);

/// Registered address ranges of this process.
#[derive(Debug, Default)]
pub struct AppMemory {
    /// `(start, id) -> end` (exclusive); ranges may overlap.
    ranges: BTreeMap<(u64, RangeId), u64>,
    next_id: u64,
}

impl AppMemory {
    /// Registers `[start, start + len)`.
    pub fn add(&mut self, start: u64, len: u64) -> RangeId {
        self.next_id += 1;
        let id = RangeId(self.next_id);
        self.ranges.insert((start, id), start.saturating_add(len));
        id
    }

    /// Forgets a range registered by [`AppMemory::add`].
    pub fn remove(&mut self, start: u64, id: RangeId) {
        self.ranges.remove(&(start, id));
    }

    /// Whether `[addr, addr + len)` lies inside one registered range.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        let Some(end) = addr.checked_add(len as u64) else {
            return false;
        };
        self.ranges
            .range(..=(addr, RangeId(u64::MAX)))
            .any(|(_, &range_end)| range_end >= end)
    }

    /// Ranges registered now.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl DmaCopy for AppMemory {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        if !self.contains(addr, data.len()) {
            return Err(DmaError::OutOfRange {
                addr,
                len: data.len(),
            });
        }
        // SAFETY: `[addr, addr + len)` lies inside a range registered with
        // `add`: memory the application registered with `fi_mr_reg` (which
        // it keeps valid until `fi_close` of the region, as libfabric
        // requires) or a buffer of the provider that outlives its
        // registration. `data` is the engine's packet buffer, never inside
        // such a range, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len());
        }
        Ok(())
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        if !self.contains(addr, out.len()) {
            return Err(DmaError::OutOfRange {
                addr,
                len: out.len(),
            });
        }
        // SAFETY: as in `copy_to_host`: the source range is registered and
        // valid, and `out` is the engine's own buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_stay_inside_registered_ranges() {
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let mut mem = AppMemory::default();
        let id = mem.add(base + 8, 16);
        assert!(mem.copy_to_host(base + 8, &[7; 16]).is_ok());
        assert!(mem.copy_to_host(base + 7, &[7; 2]).is_err());
        assert!(mem.copy_to_host(base + 20, &[7; 5]).is_err());
        let mut out = [0u8; 4];
        assert!(mem.copy_from_host(base + 12, &mut out).is_ok());
        assert_eq!(out, [7; 4]);
        mem.remove(base + 8, id);
        assert!(mem.copy_to_host(base + 8, &[1]).is_err());
        assert_eq!(&buf[..8], &[0; 8]);
        assert_eq!(&buf[24..], &[0; 40]);
    }

    #[test]
    fn overlapping_ranges_each_count() {
        let mut mem = AppMemory::default();
        let wide = mem.add(1000, 100);
        let _narrow = mem.add(1050, 10);
        assert!(mem.contains(1040, 50));
        mem.remove(1000, wide);
        assert!(!mem.contains(1040, 50));
        assert!(mem.contains(1050, 10));
        assert!(!mem.contains(u64::MAX, 2));
    }
}
