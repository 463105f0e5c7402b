//! Shared memory between the device and host processes: a PCI BAR as the
//! firmware sees it (QEMU's ivshmem BAR2, a DPU's host-interface window),
//! or the same file mapped by a host process.
//!
//! The accessor itself, [`SharedMemory`], lives in `metaroce-abi`
//! (`metaroce_abi::shmem`), so that the host library shares it without
//! depending on this crate; it is re-exported here, where the firmware
//! has always found it. This module adds what only the device needs: the
//! [`DmaCopy`] implementation.
//!
//! **Address translation, the one place** (spec 6.3): the ABI's I/O
//! addresses (buffer addresses in work entries and regions) are byte
//! offsets into this shared memory. [`SharedMemory`]'s [`DmaCopy`]
//! implementation turns an I/O address into `base + address` after a
//! bounds check; on a DPU over PCIe they would be host physical (or IOMMU)
//! addresses that the DMA engine reaches, and only this translation would
//! change.

pub use metaroce_abi::shmem::{SharedMemory, ShmError};

use crate::dma::{DmaCopy, DmaError};

/// DMA between the I/O addresses of the ABI and the engine's buffers:
/// I/O address = offset into the shared memory (see the module docs).
impl DmaCopy for SharedMemory<'_> {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        self.copy_in(addr, data).map_err(|_| DmaError::OutOfRange {
            addr,
            len: data.len(),
        })
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        let len = out.len();
        self.copy_out(addr, out)
            .map_err(|_| DmaError::OutOfRange { addr, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_copies_are_bounds_checked_io_addresses() {
        let mut backing = [0u64; 16];
        // SAFETY: `backing` outlives the view and is only touched through it.
        let mut dma = unsafe { SharedMemory::new(backing.as_mut_ptr().cast(), 128) }.unwrap();
        dma.copy_to_host(1, &[1, 2, 3]).unwrap();
        let mut out = [0; 3];
        dma.copy_from_host(1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert!(dma.copy_to_host(127, &[1, 2]).is_err());
        assert!(dma.copy_from_host(u64::MAX, &mut out).is_err());
    }
}
