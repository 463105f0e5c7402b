//! Several cores on QEMU `virt`: which core this is (MPIDR_EL1), each
//! core's MPIDR and stack size for the node's `CPU_ON` (the node starts
//! the secondaries and holds the multi-core critical section:
//! `metaroce-node`'s `cores`), each core's GIC CPU interface and timer
//! interrupt, and waking a core with a software-generated interrupt.
//!
//! The interrupt controller is QEMU `virt`'s default **GICv2** (distributor
//! at 0x0800_0000, CPU interface at 0x0801_0000, up to 8 cores). In a
//! GICv2 the CPU interface and the distributor's registers for interrupts
//! 0-31 (SGIs and PPIs: IGROUPR0, ISENABLER0, IPRIORITYR0-7) are *banked*:
//! every core sees its own copy at the same address. So each core enables
//! its own timer PPI (the EL1 virtual timer, PPI 11 = INTID 27, also
//! banked per core in the architected timer) and its wake-up SGI, and
//! acknowledges its own interrupts; core 0 alone configures the shared
//! distributor (enable, the virtio SPI, routed to core 0 with
//! ITARGETSR, which matters once there is more than one core).
//!
//! Secondaries start through `aarch64_rt::start_core` (in the node):
//! PSCI `CPU_ON` (by `hvc`: QEMU implements PSCI itself for a guest loaded
//! at EL1, `Board::Psci`) into
//! aarch64-rt's secondary entry, which turns on the MMU with the same
//! identity map, enables FP, installs the exception vectors and jumps to
//! a Rust closure on the core's own stack. The MMU must be on before
//! any atomic is used: exclusive loads and stores work only on normal,
//! cacheable memory on real cores.

use core::arch::asm;
use core::sync::atomic::{fence, AtomicBool, Ordering};

use metaroce_core::Instant;

/// Most cores: QEMU `virt`'s GICv2 serves up to 8.
pub const MAX_CORES: usize = 8;
/// Stack of each secondary core, in 4 KiB pages (its endpoint, engine,
/// host queues and workload live on it).
pub const SECONDARY_STACK_PAGES: usize = 256;
/// The SGI that wakes a core from `wfi`.
const WAKE_SGI: u32 = 1;

/// GICv2 distributor and CPU interface (as in `hw`).
const GICD_BASE: usize = 0x0800_0000;
const GICC_BASE: usize = 0x0801_0000;
const GICD_ISENABLER0: usize = GICD_BASE + 0x100;
const GICD_IPRIORITYR: usize = GICD_BASE + 0x400;
const GICD_ITARGETSR: usize = GICD_BASE + 0x800;
const GICD_SGIR: usize = GICD_BASE + 0xf00;
const GICC_CTLR: usize = GICC_BASE;
const GICC_PMR: usize = GICC_BASE + 0x4;
const GICC_IAR: usize = GICC_BASE + 0xc;
const GICC_EOIR: usize = GICC_BASE + 0x10;
/// INTID the CPU interface returns when nothing is pending.
const SPURIOUS: u32 = 1023;
/// EL1 virtual timer PPI (INTID 27).
const TIMER_INTID: u32 = 27;

// ----- core id ---------------------------------------------------------

/// This core's number: QEMU `virt` numbers its CPUs by MPIDR affinity,
/// Aff0 within a cluster of 8 (GICv2) and Aff1 the cluster.
pub fn core_id() -> usize {
    let mpidr: u64;
    // SAFETY: reading MPIDR_EL1 has no side effects.
    unsafe { asm!("mrs {}, mpidr_el1", out(reg) mpidr, options(nomem, nostack)) };
    ((mpidr >> 8) & 0xff) as usize * 8 + (mpidr & 0xff) as usize
}

/// The MPIDR affinity value of core `core` (for PSCI `CPU_ON`).
pub fn mpidr_of(core: usize) -> u64 {
    (((core / 8) as u64) << 8) | (core % 8) as u64
}

// ----- per-core interrupts ---------------------------------------------

fn write32(addr: usize, value: u32) {
    // SAFETY: `addr` is a GICv2 register in the first GiB, mapped as device
    // memory; the registers written here are banked per core (SGI/PPI
    // enables and priorities, the CPU interface) or write-only triggers
    // (SGIR), so no other core's state or driver is disturbed.
    unsafe { core::ptr::write_volatile(addr as *mut u32, value) };
}

fn read32(addr: usize) -> u32 {
    // SAFETY: as in `write32`; reading IAR acknowledges this core's own
    // highest pending interrupt, which `wait` then ends.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

fn write8(addr: usize, value: u8) {
    // SAFETY: a byte-accessible GICv2 distributor register (priority or
    // target byte), mapped as device memory.
    unsafe { core::ptr::write_volatile(addr as *mut u8, value) };
}

/// Routes SPI `intid` to core 0 (GICD_ITARGETSR). With one core QEMU
/// ignores the targets; with several an SPI targeting nobody is never
/// delivered. Core 0 only, after the distributor is set up.
pub fn route_to_core0(intid: u32) {
    write8(GICD_ITARGETSR + intid as usize, 0x01);
}

/// This core's interrupts on a secondary: its banked timer PPI and wake
/// SGI enabled (group 0, as core 0's `setup` leaves every interrupt), its
/// CPU interface on. IRQs stay masked at the core: `wait` wakes on them
/// with `wfi` and acknowledges them inline.
#[derive(Debug)]
pub struct CoreInterrupts {
    _private: (),
}

impl CoreInterrupts {
    /// Sets up the calling core's banked GIC state.
    // Not `Default`: it programs the hardware, once.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        for intid in [TIMER_INTID, WAKE_SGI] {
            write8(GICD_IPRIORITYR + intid as usize, 0x80);
        }
        write32(GICD_ISENABLER0, (1 << TIMER_INTID) | (1 << WAKE_SGI));
        write32(GICC_PMR, 0xff);
        write32(GICC_CTLR, 1);
        // SAFETY: masks IRQs at the CPU; no memory effects.
        unsafe { asm!("msr daifset, #2", options(nomem, nostack)) };
        CoreInterrupts { _private: () }
    }

    /// Sleeps until an interrupt (a wake SGI) or `deadline`.
    pub fn wait_core(&mut self, deadline: Instant) {
        metaroce_platform::cpu::wait_for_interrupt(deadline);
        loop {
            let iar = read32(GICC_IAR);
            if iar & 0x3ff == SPURIOUS {
                break;
            }
            write32(GICC_EOIR, iar);
        }
    }
}

/// The wake SGI's interrupt id, for core 0's own GIC driver to enable.
pub fn wake_sgi() -> u32 {
    WAKE_SGI
}

// ----- sleeping and waking ---------------------------------------------

/// Whether each core is (about to be) asleep in `wfi`.
static SLEEPING: [AtomicBool; MAX_CORES] = [const { AtomicBool::new(false) }; MAX_CORES];

/// Wakes core `core` if it sleeps: call after publishing work for it (a
/// frame in its ring). Pairs with [`sleep`]: either this sees the flag or
/// the sleeper sees the work.
pub fn wake(core: usize) {
    fence(Ordering::SeqCst);
    if SLEEPING.get(core).is_some_and(|s| s.load(Ordering::SeqCst)) {
        write32(GICD_SGIR, (1 << (16 + core)) | WAKE_SGI);
    }
}

/// Sleeps the calling core through `wait(ctx)` unless `has_work(ctx)`
/// (checked after announcing the sleep, so work published meanwhile is
/// not missed).
pub fn sleep<T: ?Sized>(ctx: &mut T, has_work: impl FnOnce(&T) -> bool, wait: impl FnOnce(&mut T)) {
    let Some(flag) = SLEEPING.get(core_id()) else {
        return;
    };
    flag.store(true, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if !has_work(ctx) {
        wait(ctx);
    }
    flag.store(false, Ordering::SeqCst);
}
