//! PCI on QEMU `virt`: find the ivshmem-plain device (1af4:1110) by walking
//! the PCIe ECAM, assign its BAR2 (BARs are unassigned at reset on `virt`:
//! firmware enumerates and assigns them itself) in the host bridge's 32-bit
//! MMIO window, enable memory decoding, and map the BAR as normal
//! cacheable memory so the host-interface queues and payload copies work
//! on it like on RAM (device memory would fault on unaligned copies).
//!
//! Addresses from QEMU 7.2's `virt` device tree (`pcie@10000000`): ECAM
//! 256 MiB at 0x40_1000_0000 (the high ECAM, on by default), 32-bit MMIO
//! window 0x1000_0000..0x3eff_0000.

use core::arch::asm;

use aarch64_paging::descriptor::El1Attributes as Attributes;
use metaroce_platform::shmem::SharedMemory;

/// ECAM of the `virt` PCIe host bridge (highmem ECAM).
const ECAM_BASE: usize = 0x40_1000_0000;
/// The 32-bit MMIO window BARs are assigned in.
const MMIO_BASE: u64 = 0x1000_0000;
const MMIO_END: u64 = 0x3eff_0000;
/// ivshmem (Red Hat, Inc. / Inter-VM shared memory).
const IVSHMEM_VENDOR: u16 = 0x1af4;
const IVSHMEM_DEVICE: u16 = 0x1110;
/// Configuration-space registers.
const COMMAND: usize = 0x04;
const BAR2: usize = 0x18;
const BAR3: usize = 0x1c;
const COMMAND_MEMORY: u32 = 1 << 1;
/// A 64-bit memory BAR (type bits 2:1 = 0b10).
const BAR_64BIT: u32 = 0b100;

/// Why the host-interface memory could not be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum PciError {
    /// No ivshmem device on bus 0.
    NoIvshmem,
    /// BAR2 is not a 64-bit memory BAR, or its size is not a power of two.
    BadBar,
    /// The BAR does not fit the MMIO window or the 1 GiB the page table
    /// remaps.
    NoRoom,
    /// Not running at EL1 (the remapping writes TTBR0_EL1).
    NotEl1,
}

fn config_address(dev: usize, reg: usize) -> usize {
    // Bus 0, function 0: ECAM + device << 15 + register.
    ECAM_BASE + (dev << 15) + reg
}

fn config_read(dev: usize, reg: usize) -> u32 {
    // SAFETY: the ECAM is mapped as device memory by the initial page table
    // (GiB 256); every device number below 32 has a 4 KiB configuration
    // space there, and absent devices read as all-ones.
    unsafe { core::ptr::read_volatile(config_address(dev, reg) as *const u32) }
}

fn config_write(dev: usize, reg: usize, value: u32) {
    // SAFETY: as in `config_read`; writing configuration registers of the
    // device we enumerate has no effect on memory Rust owns.
    unsafe { core::ptr::write_volatile(config_address(dev, reg) as *mut u32, value) }
}

/// Finds the ivshmem device, assigns and enables its BAR2, maps it as
/// normal memory and returns it as shared memory.
pub fn ivshmem_memory() -> Result<SharedMemory<'static>, PciError> {
    let dev = (0..32)
        .find(|&d| {
            let id = config_read(d, 0);
            id as u16 == IVSHMEM_VENDOR && (id >> 16) as u16 == IVSHMEM_DEVICE
        })
        .ok_or(PciError::NoIvshmem)?;
    // Size the BAR with decoding off: write all ones, read the mask back.
    let command = config_read(dev, COMMAND);
    config_write(dev, COMMAND, command & !COMMAND_MEMORY);
    let original = config_read(dev, BAR2);
    if original & 0b111 != BAR_64BIT {
        return Err(PciError::BadBar);
    }
    config_write(dev, BAR2, u32::MAX);
    config_write(dev, BAR3, u32::MAX);
    let mask = u64::from(config_read(dev, BAR2) & !0xf) | (u64::from(config_read(dev, BAR3)) << 32);
    let size = (!mask).wrapping_add(1);
    if size == 0 || !size.is_power_of_two() {
        return Err(PciError::BadBar);
    }
    // The window's first address aligned to the size (BARs are naturally
    // aligned); 2 MiB at least, the granule of the remapping below.
    let base = MMIO_BASE.next_multiple_of(size.max(BLOCK));
    if base + size > MMIO_END {
        return Err(PciError::NoRoom);
    }
    config_write(dev, BAR2, base as u32);
    config_write(dev, BAR3, (base >> 32) as u32);
    config_write(dev, COMMAND, command | COMMAND_MEMORY);
    map_normal(base, size)?;
    defmt::info!(
        "ivshmem at 00:{=usize:02x}.0, BAR2 {=u64:#x} (+{=u64:#x})",
        dev,
        base,
        size
    );
    // SAFETY: the BAR is assigned, decoding is on, and `map_normal` mapped
    // `[base, base + size)` as normal memory for the rest of the run;
    // nothing in the firmware makes Rust references into it.
    unsafe { SharedMemory::new(base as *mut u8, size as usize) }.ok_or(PciError::BadBar)
}

// ----- remapping the first GiB ----------------------------------------

/// 2 MiB: a level-2 block.
const BLOCK: u64 = 2 << 20;

#[repr(C, align(4096))]
struct Table([u64; 512]);

static mut ROOT: Table = Table([0; 512]);
static mut FIRST_GIB: Table = Table([0; 512]);

const DEVICE: Attributes = Attributes::VALID
    .union(Attributes::ATTRIBUTE_INDEX_0)
    .union(Attributes::ACCESSED)
    .union(Attributes::UXN);
const NORMAL: Attributes = Attributes::VALID
    .union(Attributes::ATTRIBUTE_INDEX_1)
    .union(Attributes::INNER_SHAREABLE)
    .union(Attributes::ACCESSED)
    .union(Attributes::NON_GLOBAL);
/// Level-1/2 table descriptor type bits.
const TABLE: u64 = 0b11;

/// Switches to a page table that maps the first GiB in 2 MiB blocks, as
/// device memory except `[base, base + size)` as normal memory; RAM (GiB
/// 1) and the ECAM (GiB 256) as in the initial table.
fn map_normal(base: u64, size: u64) -> Result<(), PciError> {
    let el: u64;
    // SAFETY: reading CurrentEL has no side effects.
    unsafe { asm!("mrs {}, CurrentEL", out(reg) el, options(nomem, nostack)) };
    if (el >> 2) & 3 != 1 {
        return Err(PciError::NotEl1);
    }
    if base + size > 1 << 30 {
        return Err(PciError::NoRoom);
    }
    // SAFETY: called once, before any other use of these tables, from the
    // only core; nothing else refers to them.
    let (root, first) = unsafe {
        (
            &mut *core::ptr::addr_of_mut!(ROOT),
            &mut *core::ptr::addr_of_mut!(FIRST_GIB),
        )
    };
    for (i, entry) in first.0.iter_mut().enumerate() {
        let addr = i as u64 * BLOCK;
        let attrs = if addr >= base && addr < base + size {
            NORMAL
        } else {
            DEVICE
        };
        *entry = attrs.bits() as u64 | addr;
    }
    root.0[0] = first.0.as_ptr() as u64 | TABLE;
    root.0[1] = NORMAL.bits() as u64 | 0x4000_0000;
    root.0[256] = DEVICE.bits() as u64 | 0x40_0000_0000;
    let root_addr = root.0.as_ptr() as u64;
    // SAFETY: the new table maps the code, data and stack (GiB 1) exactly
    // as the initial one did, so execution continues unchanged; the
    // barriers make the table writes visible to the walker before TTBR0
    // changes, and the TLB invalidation drops the old first-GiB blocks.
    unsafe {
        asm!(
            "dsb ishst",
            "msr ttbr0_el1, {}",
            "isb",
            "tlbi vmalle1",
            "dsb ish",
            "isb",
            in(reg) root_addr,
            options(nostack)
        );
    }
    Ok(())
}
