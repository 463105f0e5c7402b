//! DMA copies between host memory and packet buffers.
//!
//! On a DPU the engine never dereferences host memory: it asks a DMA engine
//! to copy between host addresses and its own packet buffers. [`DmaCopy`] is
//! that operation; [`DmaMemory`] adapts it to the core's
//! [`metaroce_core::api::Memory`], which is how the engine places payloads
//! and gathers them for transmission. [`HostWindow`] is the implementation
//! for memory the platform can address directly (QEMU, host programs, tests):
//! a byte slice standing at a base address.

use metaroce_core::api::Memory;

/// Why a DMA copy was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DmaError {
    /// The host address range is outside the memory this DMA engine reaches.
    OutOfRange { addr: u64, len: usize },
}

/// Copies between host memory (addressed by 64-bit host addresses) and
/// local buffers.
pub trait DmaCopy {
    /// Copies `data` to host memory at `addr`.
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError>;
    /// Copies host memory at `addr` into `out`.
    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError>;
}

/// [`Memory`] over a [`DmaCopy`]. The endpoint checks every address against
/// its registered regions first, so a refused copy means a region was
/// registered outside the DMA window: the copy is skipped (a read yields
/// zeroes) and counted in [`DmaMemory::faults`], never a panic.
#[derive(Debug)]
pub struct DmaMemory<'a, D: DmaCopy> {
    dma: &'a mut D,
    faults: u32,
}

impl<'a, D: DmaCopy> DmaMemory<'a, D> {
    pub fn new(dma: &'a mut D) -> Self {
        DmaMemory { dma, faults: 0 }
    }

    /// Copies refused since this adapter was made.
    pub fn faults(&self) -> u32 {
        self.faults
    }
}

impl<D: DmaCopy> Memory for DmaMemory<'_, D> {
    fn write(&mut self, addr: u64, data: &[u8]) {
        if self.dma.copy_to_host(addr, data).is_err() {
            self.faults = self.faults.saturating_add(1);
        }
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        if self.dma.copy_from_host(addr, out).is_err() {
            out.fill(0);
            self.faults = self.faults.saturating_add(1);
        }
    }
}

/// Host memory the platform can address directly: `bytes` seen at host
/// addresses `[base, base + bytes.len())`.
#[derive(Debug)]
pub struct HostWindow<'a> {
    base: u64,
    bytes: &'a mut [u8],
}

impl<'a> HostWindow<'a> {
    pub fn new(base: u64, bytes: &'a mut [u8]) -> Self {
        HostWindow { base, bytes }
    }

    /// First host address of the window.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Window size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn range(&self, addr: u64, len: usize) -> Result<core::ops::Range<usize>, DmaError> {
        let err = DmaError::OutOfRange { addr, len };
        let start = addr
            .checked_sub(self.base)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(err)?;
        let end = start.checked_add(len).ok_or(err)?;
        if end > self.bytes.len() {
            return Err(err);
        }
        Ok(start..end)
    }

    /// The bytes at `[addr, addr + len)`, as the host application sees them.
    pub fn slice(&self, addr: u64, len: usize) -> Result<&[u8], DmaError> {
        let r = self.range(addr, len)?;
        Ok(&self.bytes[r])
    }

    /// Mutable bytes at `[addr, addr + len)`.
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> Result<&mut [u8], DmaError> {
        let r = self.range(addr, len)?;
        Ok(&mut self.bytes[r])
    }
}

impl DmaCopy for HostWindow<'_> {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        self.slice_mut(addr, data.len())?.copy_from_slice(data);
        Ok(())
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        out.copy_from_slice(self.slice(addr, out.len())?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bounds_are_checked() {
        let mut backing = [0u8; 16];
        let mut w = HostWindow::new(0x1000, &mut backing);
        w.copy_to_host(0x1004, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 4];
        w.copy_from_host(0x1003, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3]);
        assert!(w.copy_to_host(0x0fff, &[1]).is_err());
        assert!(w.copy_to_host(0x100f, &[1, 2]).is_err());
        assert!(w.copy_from_host(u64::MAX, &mut out).is_err());
        let mut mem = DmaMemory::new(&mut w);
        let mut out = [9u8; 2];
        mem.read(0x2000, &mut out);
        assert_eq!(out, [0, 0]);
        mem.write(0x1000, &[5]);
        assert_eq!(mem.faults(), 1);
    }
}
