//! QEMU `virt` hardware: memory map, boot glue, console, semihosting,
//! generic timer, GICv2, fw_cfg, virtio-mmio probing and the virtio-rng
//! entropy source. Every `unsafe` of
//! the firmware is here, except what concerns several cores (secondary
//! start, per-core GIC state, the critical section), which is in `smp`, and
//! the PCIe side (ECAM, BAR assignment, the remapped first GiB), in `pci`.

use core::arch::asm;
use core::cell::RefCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use aarch64_paging::descriptor::El1Attributes as Attributes;
use aarch64_paging::mair::{Mair, MairAttribute, NormalMemory};
use aarch64_rt::{initial_pagetable, InitialPagetable};
use arm_gic::gicv2::GicV2;
use arm_gic::{IntId, InterruptGroup, Trigger};
use arm_pl011_uart::{PL011Registers, Uart, UniqueMmioPointer};
use critical_section::Mutex;
use metaroce_board::console::Line;
use metaroce_core::Instant;
use metaroce_platform::entropy::{EntropyError, Seed};
use metaroce_platform::virtio::{PoolHal, VirtioEntropy};
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::DeviceType;

/// PL011 UART0.
const UART_BASE: usize = 0x0900_0000;
/// fw_cfg MMIO interface: data at +0, selector (16-bit big-endian) at +8.
const FW_CFG_BASE: usize = 0x0902_0000;
/// GICv2 distributor and CPU interface.
const GICD_BASE: usize = 0x0800_0000;
const GICC_BASE: usize = 0x0801_0000;
/// virtio-mmio transports: 32 slots of 0x200 bytes; slot `n` raises SPI 16 + n.
const VIRTIO_BASE: usize = 0x0a00_0000;
const VIRTIO_STRIDE: usize = 0x200;
const VIRTIO_SLOTS: usize = 32;
const VIRTIO_FIRST_SPI: u32 = 16;
/// EL1 virtual timer: PPI 11 (INTID 27).
const TIMER_INTID: IntId = IntId::ppi(11);

const DEVICE_ATTRIBUTES: Attributes = Attributes::VALID
    .union(Attributes::ATTRIBUTE_INDEX_0)
    .union(Attributes::ACCESSED)
    .union(Attributes::UXN);
const MEMORY_ATTRIBUTES: Attributes = Attributes::VALID
    .union(Attributes::ATTRIBUTE_INDEX_1)
    .union(Attributes::INNER_SHAREABLE)
    .union(Attributes::ACCESSED)
    .union(Attributes::NON_GLOBAL);
const MAIR: Mair = Mair::EMPTY
    .with_attribute(0, MairAttribute::DEVICE_NGNRE)
    .with_attribute(
        1,
        MairAttribute::normal(
            NormalMemory::WriteBackNonTransientReadWriteAllocate,
            NormalMemory::WriteBackNonTransientReadWriteAllocate,
        ),
    );

// Identity map: the first GiB (all of virt's MMIO) as device memory, the
// second (RAM from 0x4000_0000) as normal memory, GiB 256 (the PCIe ECAM at
// 0x40_1000_0000) as device memory. `pci.rs` later remaps the first GiB to
// make a host-interface BAR normal memory.
initial_pagetable!(
    {
        let mut idmap = [0; 512];
        idmap[0] = DEVICE_ATTRIBUTES.bits();
        idmap[1] = MEMORY_ATTRIBUTES.bits() | 0x4000_0000;
        idmap[256] = DEVICE_ATTRIBUTES.bits() | 0x40_0000_0000;
        InitialPagetable(idmap)
    },
    MAIR.0
);

// The entry point (`aarch64_rt::entry!`, the boot stack) is the image
// crate's: it installs the vectors ([`install_vectors`]) and runs the node.

// ----- exceptions ------------------------------------------------------
//
// Every exception is fatal here: IRQs stay masked (a core waits with `wfi`
// and acknowledges its interrupts itself), so an exception is a fault.
// One vector table serves whichever EL the firmware runs at (EL1 when QEMU
// loads it, EL2 under U-Boot): each of its 16 entries puts its number in
// x0 and branches to `exception`, which reports and exits. (aarch64-rt's
// `exceptions` feature puts one table per EL in the image, EL1, EL2 and
// EL3, each entry saving and restoring the volatile registers around a
// handler that can only panic: 6 KiB of code.)

core::arch::global_asm!(
    ".section .text.vectors, \"ax\"",
    ".balign 0x800",
    ".global metaroce_vectors",
    "metaroce_vectors:",
    ".irp entry, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    ".balign 0x80",
    "mov x0, #\\entry",
    "b {exception}",
    ".endr",
    exception = sym exception,
);

/// Points this core's VBAR (of the EL it runs at) at the vector table.
/// Each core calls it before anything else.
pub fn install_vectors() {
    let el: u64;
    let table: usize;
    // SAFETY: reads CurrentEL and the table's address; no side effects.
    unsafe {
        asm!("mrs {el}, CurrentEL", "adr {table}, metaroce_vectors",
             el = out(reg) el, table = out(reg) table, options(nomem, nostack));
    }
    // SAFETY: the table is in the image (mapped executable at its link
    // address by the identity map) and every entry is a valid handler.
    unsafe {
        match (el >> 2) & 3 {
            1 => asm!("msr vbar_el1, {}", "isb", in(reg) table, options(nomem, nostack)),
            2 => asm!("msr vbar_el2, {}", "isb", in(reg) table, options(nomem, nostack)),
            _ => {}
        }
    }
}

/// An exception was taken: which (vector entry: current EL with SP0 or
/// SPx, lower EL AArch64 or AArch32; synchronous, IRQ, FIQ, SError in
/// turn), why (ESR), where (ELR) and what address (FAR), then exit.
extern "C" fn exception(entry: u64) -> ! {
    let (el, esr, elr, far): (u64, u64, u64, u64);
    // SAFETY: reads this EL's exception syndrome registers; no side effects.
    unsafe {
        asm!("mrs {}, CurrentEL", out(reg) el, options(nomem, nostack));
        if (el >> 2) & 3 == 2 {
            asm!("mrs {}, esr_el2", "mrs {}, elr_el2", "mrs {}, far_el2",
                 out(reg) esr, out(reg) elr, out(reg) far, options(nomem, nostack));
        } else {
            asm!("mrs {}, esr_el1", "mrs {}, elr_el1", "mrs {}, far_el1",
                 out(reg) esr, out(reg) elr, out(reg) far, options(nomem, nostack));
        }
    }
    crate::println!(
        "METAROCE-PANIC exception {} at EL{}: esr={:#x} elr={:#x} far={:#x}",
        entry,
        (el >> 2) & 3,
        esr,
        elr,
        far
    );
    exit(101)
}

// The critical-section implementation (DAIF mask plus a spinlock shared
// by every core) is in `smp`.

// ----- console ---------------------------------------------------------

/// Writes `line` and a newline to the console: the critical section (a
/// lock shared by every core) keeps other cores' lines out of the middle
/// of it.
pub fn console_write_line(line: &Line<'_>) {
    critical_section::with(|_| {
        // SAFETY: UART0 is mapped as device memory by the identity map, and
        // inside the critical section (which excludes every other core and
        // context) this is the only pointer to its registers in use: a
        // panic while a line is written prints its own line from the
        // panic handler, which never returns to the line it interrupted.
        // The driver keeps no state of its own, so one per line is the
        // same driver.
        let regs = unsafe {
            UniqueMmioPointer::new(NonNull::new_unchecked(UART_BASE as *mut PL011Registers))
        };
        let mut uart = Uart::new(regs);
        line.write(&mut |bytes| uart_write(&mut uart, bytes));
        uart_write(&mut uart, b"\n");
    });
}

/// Writes `bytes` to the PL011, waiting for room in its FIFO.
fn uart_write(uart: &mut Uart<'_>, bytes: &[u8]) {
    for &b in bytes {
        while uart.is_tx_fifo_full() {}
        uart.write_word(b);
    }
}

/// The PL011 as an `embedded-io` writer, for node code that writes raw
/// bytes (each call's bytes go out together, under the critical section).
#[derive(Debug, Default)]
pub struct Console;

impl embedded_io::ErrorType for Console {
    type Error = core::convert::Infallible;
}

impl embedded_io::Write for Console {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        critical_section::with(|_| {
            // SAFETY: as in `console_write_line`: UART0 is mapped device
            // memory and, inside the critical section, this is the only
            // pointer to its registers in use.
            let regs = unsafe {
                UniqueMmioPointer::new(NonNull::new_unchecked(UART_BASE as *mut PL011Registers))
            };
            uart_write(&mut Uart::new(regs), buf);
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// `println!` to the PL011 console; lines from several cores never mix.
/// `console_line!`'s format strings, without `core::fmt` (see
/// `metaroce_board::console`).
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        $crate::hw::console_write_line(&::metaroce_board::console_line!($($arg)*));
    }};
}

// ----- semihosting -----------------------------------------------------

const SYS_OPEN: usize = 0x01;
const SYS_WRITE: usize = 0x05;
const SYS_EXIT: usize = 0x18;
const ADP_STOPPED_APPLICATION_EXIT: u64 = 0x20026;

fn semihost(op: usize, param: usize) -> usize {
    let ret: usize;
    // SAFETY: the AArch64 semihosting trap; QEMU reads the parameter block
    // at `param` (a live stack value of the caller) and writes only x0.
    unsafe { asm!("hlt #0xf000", inout("x0") op => ret, in("x1") param, options(nostack)) };
    ret
}

/// Opens the semihosting console (`:tt`) for binary writes.
pub fn semihosting_stdout() -> usize {
    let name = b":tt\0";
    // Mode 5 = "wb": stdout.
    let block: [usize; 3] = [name.as_ptr() as usize, 5, 3];
    semihost(SYS_OPEN, block.as_ptr() as usize)
}

/// Writes `bytes` to a semihosting handle.
pub fn semihosting_write(handle: usize, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let block: [usize; 3] = [handle, bytes.as_ptr() as usize, bytes.len()];
    semihost(SYS_WRITE, block.as_ptr() as usize);
}

/// The semihosting handle of the defmt log, opened at its first frame.
static LOG_HANDLE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Writes defmt log bytes to semihosting's standard output (the harness
/// decodes them with the ELF).
pub fn log_write(bytes: &[u8]) {
    let mut handle = LOG_HANDLE.load(Ordering::Relaxed);
    if handle == usize::MAX {
        handle = semihosting_stdout();
        LOG_HANDLE.store(handle, Ordering::Relaxed);
    }
    semihosting_write(handle, bytes);
}

static EXITING: AtomicBool = AtomicBool::new(false);

/// Ends the run: QEMU exits with `code` (semihosting), or, should that
/// return, powers off through PSCI.
pub fn exit(code: u32) -> ! {
    if !EXITING.swap(true, Ordering::AcqRel) {
        let block: [u64; 2] = [ADP_STOPPED_APPLICATION_EXIT, u64::from(code)];
        semihost(SYS_EXIT, block.as_ptr() as usize);
    }
    let _ = smccc::psci::system_off::<smccc::Hvc>();
    loop {
        // SAFETY: waiting for an interrupt has no memory effects.
        unsafe { asm!("wfi", options(nomem, nostack)) };
    }
}

// ----- generic timer ---------------------------------------------------

/// The architected timer: the clock every aarch64 board shares.
pub use metaroce_platform::cpu::{counter, now, timer_hz};

// ----- GIC and waiting -------------------------------------------------

/// The interrupt controller, set up for the timer and one virtio device.
#[allow(missing_debug_implementations)] // the GIC driver has no `Debug`
pub struct Interrupts {
    gic: GicV2<'static>,
    net_intid: Option<IntId>,
}

impl Interrupts {
    /// Sets up the GICv2 with the timer interrupt enabled. IRQs stay masked
    /// at the CPU: `wait` wakes on them with `wfi` and handles them inline.
    // Not `Default`: it programs the hardware, once.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        // SAFETY: the GIC distributor and CPU interface are mapped as device
        // memory and nothing else refers to them (called once, at boot).
        let mut gic = unsafe { GicV2::new(GICD_BASE as *mut _, GICC_BASE as *mut _) };
        gic.setup();
        // SAFETY: masks IRQs at the CPU; no memory effects.
        unsafe { asm!("msr daifset, #2", options(nomem, nostack)) };
        let mut irq = Interrupts {
            gic,
            net_intid: None,
        };
        irq.enable_level(TIMER_INTID);
        irq
    }

    /// Enables the level-triggered interrupt `intid` (the timer, a virtio
    /// device) at the priority every interrupt of the node has.
    fn enable_level(&mut self, intid: IntId) {
        self.gic.set_interrupt_priority(intid, 0x80);
        self.gic.set_trigger(intid, Trigger::Level);
        let _ = self.gic.enable_interrupt(intid, true);
    }

    /// Enables the interrupt of the virtio-mmio device in `slot`.
    pub fn enable_virtio(&mut self, slot: usize) {
        let intid = IntId::spi(VIRTIO_FIRST_SPI + slot as u32);
        self.enable_level(intid);
        // With several cores an SPI must name its target; core 0 drives
        // the device.
        crate::smp::route_to_core0(intid.into());
        self.net_intid = Some(intid);
    }

    /// Enables this (boot) core's wake-up SGI, which other cores send
    /// when they queue frames for it (`smp::wake`).
    pub fn enable_wake_sgi(&mut self) {
        let intid = IntId::sgi(crate::smp::wake_sgi());
        self.gic.set_interrupt_priority(intid, 0x80);
        let _ = self.gic.enable_interrupt(intid, true);
    }

    /// Sleeps until an interrupt or `deadline`; `on_net` runs (to
    /// acknowledge the device) if the network interrupt fired.
    pub fn wait_net(&mut self, deadline: Instant, on_net: &mut dyn FnMut()) {
        metaroce_platform::cpu::wait_for_interrupt(deadline);
        while let Some(intid) = self
            .gic
            .get_and_acknowledge_interrupt(InterruptGroup::Group0)
        {
            if Some(intid) == self.net_intid {
                on_net();
            }
            self.gic.end_interrupt(intid, InterruptGroup::Group0);
        }
    }
}

// ----- fw_cfg ----------------------------------------------------------

fn fw_cfg_select(key: u16) {
    // SAFETY: the fw_cfg selector register is mapped device memory; the
    // interface is big-endian.
    unsafe { core::ptr::write_volatile((FW_CFG_BASE + 8) as *mut u16, key.to_be()) };
}

fn fw_cfg_read(out: &mut [u8]) {
    for byte in out {
        // SAFETY: the fw_cfg data register is mapped device memory; each
        // byte read returns the next byte of the selected item.
        *byte = unsafe { core::ptr::read_volatile(FW_CFG_BASE as *const u8) };
    }
}

/// Reads the fw_cfg file `name` into `out`; returns its length (truncated
/// to `out`), or `None` if QEMU was not given it.
pub fn fw_cfg_file(name: &str, out: &mut [u8]) -> Option<usize> {
    const FILE_DIR: u16 = 0x19;
    fw_cfg_select(FILE_DIR);
    let mut count = [0u8; 4];
    fw_cfg_read(&mut count);
    for _ in 0..u32::from_be_bytes(count).min(1024) {
        let mut entry = [0u8; 64];
        fw_cfg_read(&mut entry);
        let size = u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]]) as usize;
        let select = u16::from_be_bytes([entry[4], entry[5]]);
        let raw = &entry[8..];
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        if &raw[..end] == name.as_bytes() {
            let len = size.min(out.len());
            fw_cfg_select(select);
            fw_cfg_read(&mut out[..len]);
            return Some(len);
        }
    }
    None
}

// ----- virtio-mmio -----------------------------------------------------

/// "virt" in little-endian: the magic value of a virtio-mmio block.
const VIRTIO_MAGIC: u32 = 0x7472_6976;
/// Offset of the device id register (virtio 1.1, 4.2.2; 0: empty slot).
const VIRTIO_DEVICE_ID: usize = 0x008;

/// The first virtio device of type `kind`: its transport and slot number.
/// Only that slot gets a transport: dropping one resets its device, so
/// probing must not make (and drop) transports of the others.
fn find_virtio(kind: DeviceType) -> Option<(MmioTransport<'static>, usize)> {
    for slot in 0..VIRTIO_SLOTS {
        let base = VIRTIO_BASE + slot * VIRTIO_STRIDE;
        // SAFETY: every slot is a mapped virtio-mmio register block of
        // VIRTIO_STRIDE bytes; reading its magic and device id registers
        // has no side effects.
        let (magic, id) = unsafe {
            (
                core::ptr::read_volatile(base as *const u32),
                core::ptr::read_volatile((base + VIRTIO_DEVICE_ID) as *const u32),
            )
        };
        if magic != VIRTIO_MAGIC || id != kind as u32 {
            continue;
        }
        let header = NonNull::new(base as *mut VirtIOHeader)?;
        // SAFETY: as above; the caller keeps this transport for the one
        // device of its kind it drives (net, rng), so no two live
        // transports share a slot.
        let transport = unsafe { MmioTransport::new(header, VIRTIO_STRIDE) }.ok()?;
        return Some((transport, slot));
    }
    None
}

/// The first virtio-net device: its transport and slot number.
pub fn find_virtio_net() -> Option<(MmioTransport<'static>, usize)> {
    find_virtio(DeviceType::Network)
}

// ----- virtio-rng: the entropy source -----------------------------------

type EntropyDevice = VirtioEntropy<PoolHal, MmioTransport<'static>>;

/// The entropy device, shared by every core (each core's engine reseeds
/// its endpoint from it) behind the critical section.
static ENTROPY: Mutex<RefCell<Option<SendEntropy>>> = Mutex::new(RefCell::new(None));

/// The device, movable into the static.
struct SendEntropy(EntropyDevice);

// SAFETY: the device (its MMIO block and its virtqueue's DMA pages) is
// reached only through `ENTROPY`, under the critical section, so only one
// core drives it at a time, whichever core that is.
unsafe impl Send for SendEntropy {}

/// Finds and initialises the virtio-rng device (`-device
/// virtio-rng-device`, which the harness adds). `Missing` without one.
pub fn init_entropy() -> Result<(), EntropyError> {
    let (transport, _) = find_virtio(DeviceType::EntropySource).ok_or(EntropyError::Missing)?;
    let device = VirtioEntropy::new(transport)?;
    critical_section::with(|cs| {
        // `try_borrow_mut`, not `borrow_mut`: no panic path, whose message
        // would link `core::fmt` into the image. Nothing holds the cell
        // outside the critical section.
        let mut slot = ENTROPY
            .borrow(cs)
            .try_borrow_mut()
            .map_err(|_| EntropyError::Failed)?;
        *slot = Some(SendEntropy(device));
        Ok(())
    })
}

/// The platform's entropy source: 32 bytes from the virtio-rng device.
pub fn entropy(out: &mut Seed) -> Result<(), EntropyError> {
    critical_section::with(
        |cs| match ENTROPY.borrow(cs).try_borrow_mut().as_deref_mut() {
            Ok(Some(device)) => device.0.fill(out),
            Ok(None) => Err(EntropyError::Missing),
            // Held: only by a panic in the middle of `fill`, whose handler
            // never asks for entropy.
            Err(_) => Err(EntropyError::Failed),
        },
    )
}

// ----- emulated host memory ---------------------------------------------

/// Where the emulated host memory sits in the host address space.
pub const HOST_BASE: u64 = 0x10_0000_0000;
/// Bytes of emulated host memory (in the image's `.bss`, the node's).
pub const HOST_MEMORY_LEN: usize = 64 << 20;

// ----- performance monitors ---------------------------------------------

#[cfg(feature = "bench-role")]
/// PMU event number of `INST_RETIRED` (Arm ARM, D11.11 "PMU events").
const PMU_EVENT_INST_RETIRED: u64 = 0x08;

/// Cycle and instruction counts from the Performance Monitors Unit.
#[cfg(feature = "bench-role")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuCounts {
    /// `PMCCNTR_EL0`: CPU cycles. Under QEMU this follows the virtual clock
    /// (with `-icount shift=0`, one per instruction), not a model of the core.
    pub cycles: u64,
    /// `PMEVCNTR0_EL0` counting `INST_RETIRED`. QEMU counts it only with
    /// `-icount`; otherwise it reads 0.
    pub instructions: u64,
}

/// Starts the cycle counter and event counter 0 (instructions retired),
/// both from zero, counting at EL1.
#[cfg(feature = "bench-role")]
pub fn pmu_start() {
    // SAFETY: writes only PMU control registers, which EL1 may program on a
    // board without a hypervisor; no memory effects. PMCR_EL0: E (bit 0)
    // enables the counters, P (bit 1) and C (bit 2) reset them, LC (bit 6)
    // makes the cycle counter 64 bits wide. PMCNTENSET_EL0 bit 31 enables
    // the cycle counter, bit 0 event counter 0.
    unsafe {
        asm!(
            "msr pmevtyper0_el0, {event}",
            "msr pmccfiltr_el0, xzr",
            "msr pmcntenset_el0, {enable}",
            "msr pmcr_el0, {control}",
            "isb",
            event = in(reg) PMU_EVENT_INST_RETIRED,
            enable = in(reg) (1u64 << 31) | 1,
            control = in(reg) 0b100_0111u64,
            options(nomem, nostack)
        )
    };
}

/// The counts since [`pmu_start`].
#[cfg(feature = "bench-role")]
pub fn pmu_read() -> PmuCounts {
    let (cycles, instructions): (u64, u64);
    // SAFETY: reads PMU counters; the ISB orders the reads after the
    // measured code. No memory effects.
    unsafe {
        asm!(
            "isb",
            "mrs {cycles}, pmccntr_el0",
            "mrs {instructions}, pmevcntr0_el0",
            cycles = out(reg) cycles,
            instructions = out(reg) instructions,
            options(nomem, nostack)
        )
    };
    PmuCounts {
        cycles,
        instructions,
    }
}
