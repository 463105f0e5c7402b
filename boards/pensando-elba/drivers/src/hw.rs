//! Elba hardware: identity map, boot glue, exception level, console,
//! generic timer, GICv3, PSCI, the TRNG conduit and the critical-section
//! implementation.
//! Every `unsafe` of the firmware binary is here. Addresses come from
//! `board.toml` through [`board`].
//!
//! Exception level: the image runs at the level U-Boot enters it at. On
//! ARMv8 boards with trusted firmware at EL3, U-Boot runs at EL2 and
//! `bootm` enters images at EL2; aarch64-rt is built without an `el`
//! feature, so its entry code reads `CurrentEL` and sets up the MMU and
//! vectors of EL2 (or EL1 if handed over there). Nothing here drops to
//! EL1: the timer (the EL1 virtual timer, usable from both) and the GIC
//! CPU interface (`ICC_*_EL1`, enabled for EL2 through `ICC_SRE_EL2`) work
//! at either level. PSCI calls use `smc`, as Elba's device tree says.
//!
//! Several cores (`cores.count` in `board.toml`): core 0 boots, sets up the
//! GIC distributor and every redistributor (each core's timer PPI); the
//! node then starts the others (`metaroce-node`'s `cores`: PSCI `CPU_ON`
//! through `smc`, this board's `Board::Psci`, via
//! `aarch64_rt::start_core`, each on its own stack of
//! `cores.stack_pages`) and holds the multi-core critical section. Each
//! core then turns on its own GIC CPU interface (system registers) and
//! waits on its own timer.

use core::arch::asm;
use core::cell::RefCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::board;
use crate::cores;
use crate::entropy::{Conduit, Source};
use crate::shm::{FrameDescriptor, Notify, ShmDoorbell, ShmFrameDevice, ShmRing};
use crate::uart16550::{Mmio, Uart16550, UartError};
use aarch64_paging::descriptor::El1Attributes as Attributes;
use aarch64_paging::mair::{Mair, MairAttribute, NormalMemory};
use aarch64_rt::{exception_handlers, initial_pagetable, ExceptionHandlers, InitialPagetable};
use arm_gic::gicv3::registers::{Gicd, GicrSgi};
use arm_gic::gicv3::{GicCpuInterface, GicV3, Group};
use arm_gic::{IntId, InterruptGroup, Trigger, UniqueMmioPointer};
use critical_section::Mutex;
use metaroce_board::console::Line;
use metaroce_core::Instant;
use metaroce_platform::entropy::{EntropyError, Seed};

/// EL1 virtual timer: PPI 11 (INTID 27), listed in Elba's timer node.
const TIMER_INTID: IntId = IntId::ppi(11);
/// Priority of our interrupts (non-secure range).
const PRIORITY: u8 = 0x80;

const DEVICE_ATTRIBUTES: Attributes = Attributes::VALID
    .union(Attributes::ATTRIBUTE_INDEX_0)
    .union(Attributes::ACCESSED)
    .union(Attributes::UXN);
// No NON_GLOBAL: the bit is RES0 in the EL2 translation regime, and this
// table serves EL1 and EL2 alike. Inner shareable: Elba is dma-coherent.
const MEMORY_ATTRIBUTES: Attributes = Attributes::VALID
    .union(Attributes::ATTRIBUTE_INDEX_1)
    .union(Attributes::INNER_SHAREABLE)
    .union(Attributes::ACCESSED);
const MAIR: Mair = Mair::EMPTY
    .with_attribute(0, MairAttribute::DEVICE_NGNRE)
    .with_attribute(
        1,
        MairAttribute::normal(
            NormalMemory::WriteBackNonTransientReadWriteAllocate,
            NormalMemory::WriteBackNonTransientReadWriteAllocate,
        ),
    );

// Identity map in 1 GiB blocks, from board.toml: the MMIO blocks (console,
// GIC) as device memory, the DRAM blocks as normal memory.
initial_pagetable!(
    {
        let mut idmap = [0; 512];
        let mut i = 0;
        while i < board::DEVICE_BLOCKS.len() {
            let block = board::DEVICE_BLOCKS[i];
            idmap[block] = DEVICE_ATTRIBUTES.bits() | (block << 30);
            i += 1;
        }
        let mut i = 0;
        while i < board::NORMAL_BLOCKS.len() {
            let block = board::NORMAL_BLOCKS[i];
            idmap[block] = MEMORY_ATTRIBUTES.bits() | (block << 30);
            i += 1;
        }
        InitialPagetable(idmap)
    },
    MAIR.0
);

struct Exceptions;
impl ExceptionHandlers for Exceptions {}
exception_handlers!(Exceptions);

// The entry point (`aarch64_rt::entry!` with `image.stack_pages` of boot
// stack) is the image crate's: it brings up the console ([`init_console`]),
// prints the banner ([`banner`]) and runs the node.

/// Prints the boot banner: where the image runs, at which exception level,
/// on which core, what U-Boot handed over in x0 (the device tree), and the
/// counter's frequency.
pub fn banner(x0: u64) {
    crate::println!(
        "metaroce pensando-elba firmware {} at {:#x}: EL{}, MPIDR {:#x}, x0 {:#x}, counter {} Hz",
        env!("CARGO_PKG_VERSION"),
        board::LOAD_ADDRESS,
        current_el(),
        mpidr(),
        x0,
        timer_hz()
    );
    crate::println!("metaroce: defmt frames (rzCOBS) follow on this console");
    match psci_version() {
        Some((major, minor)) => defmt::info!("PSCI {=u16}.{=u16} (smc)", major, minor),
        None => defmt::warn!("no PSCI answer through smc"),
    }
}

/// The current exception level.
pub fn current_el() -> u8 {
    let el: u64;
    // SAFETY: reading CurrentEL has no side effects.
    unsafe { asm!("mrs {}, CurrentEL", out(reg) el, options(nomem, nostack)) };
    ((el >> 2) & 3) as u8
}

/// MPIDR_EL1 affinity fields (Aff3..Aff0), as GICR_TYPER reports them.
pub fn mpidr() -> u64 {
    let mpidr: u64;
    // SAFETY: reading MPIDR_EL1 has no side effects.
    unsafe { asm!("mrs {}, mpidr_el1", out(reg) mpidr, options(nomem, nostack)) };
    mpidr & 0xff_00ff_ffff
}

// ----- cores -------------------------------------------------------------

/// This core's number (`board_pensando_elba::cores`), or 0 for an MPIDR
/// outside `cores.count` (which never runs firmware code).
pub fn core_index() -> usize {
    cores::core_of_mpidr(mpidr()).unwrap_or(0)
}

// ----- console ---------------------------------------------------------

/// The console `board.toml` names (`console.kind`): the Elba's 16550, or
/// the PL011 QEMU `virt` has in its place (the twin).
#[derive(Debug)]
pub enum Console {
    Ns16550(Uart16550<Mmio>),
    Pl011(Pl011),
}

impl embedded_io::ErrorType for Console {
    type Error = embedded_io::ErrorKind;
}

impl embedded_io::Write for Console {
    fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        match self {
            Console::Ns16550(uart) => {
                embedded_io::Write::write(uart, buf).map_err(|e| embedded_io::Error::kind(&e))
            }
            Console::Pl011(uart) => {
                for &b in buf {
                    uart.put(b);
                }
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl Console {
    /// Writes text, each `\n` as CR LF; stops at the first byte the
    /// 16550 fails to send.
    pub fn write_text(&mut self, text: &[u8]) -> Result<(), UartError> {
        match self {
            Console::Ns16550(uart) => uart.write_text(text),
            Console::Pl011(uart) => {
                for &b in text {
                    if b == b'\n' {
                        uart.put(b'\r');
                    }
                    uart.put(b);
                }
                Ok(())
            }
        }
    }
}

/// A PL011's transmit side (data register at +0, flags at +0x18): the
/// twin's console, where QEMU `virt` has no 16550.
#[derive(Debug)]
pub struct Pl011 {
    base: NonNull<u32>,
}

// SAFETY: the registers are reached only through `CONSOLE`, under the
// critical section, so one core at a time.
unsafe impl Send for Pl011 {}

impl Pl011 {
    /// UARTFR.TXFF: the transmit FIFO is full.
    const TXFF: u32 = 1 << 5;

    fn put(&mut self, b: u8) {
        // Bounded: a console that does not drain loses bytes, never the
        // firmware.
        for _ in 0..100_000 {
            // SAFETY: UARTFR (+0x18) of the PL011 `board.toml` names, mapped
            // as device memory; reading it has no side effects.
            let flags = unsafe { self.base.as_ptr().add(6).read_volatile() };
            if flags & Self::TXFF == 0 {
                break;
            }
        }
        // SAFETY: UARTDR (+0) of the same PL011: writing queues one byte.
        unsafe { self.base.as_ptr().write_volatile(u32::from(b)) };
    }
}

static CONSOLE: Mutex<RefCell<Option<Console>>> = Mutex::new(RefCell::new(None));

/// Brings up the console from `board.toml` (first thing at boot).
pub fn init_console() {
    if board::CONSOLE_PL011 {
        // The PL011 is left as U-Boot (or QEMU) set it up.
        let base = NonNull::new(board::UART_BASE as *mut u32);
        if let Some(base) = base {
            set_console(Console::Pl011(Pl011 { base }));
        }
        return;
    }
    // SAFETY: the 16550 block from board.toml is mapped as device memory
    // by the identity map, and this is the only handle to it (boot only).
    let regs = unsafe { Mmio::new(NonNull::new_unchecked(board::UART_BASE as *mut u32)) };
    let mut uart = Uart16550::new(regs, board::UART_REG_SHIFT);
    if board::UART_PROGRAM_DIVISOR {
        // A bad clock/baud pair leaves U-Boot's settings, which work.
        let _ = uart.configure(board::UART_CLOCK_HZ, board::UART_BAUD);
    }
    set_console(Console::Ns16550(uart));
}

// The console's cell is reached with `try_borrow_mut`, not `borrow_mut`:
// no panic path, whose message would link `core::fmt` into the image.
// Only a panic in the middle of a line holds it while another use comes
// (the panic handler's line): that line is then not written, where
// `borrow_mut` would panic again, forever.

fn set_console(console: Console) {
    // Nothing holds the cell at boot.
    critical_section::with(|cs| {
        if let Ok(mut slot) = CONSOLE.borrow(cs).try_borrow_mut() {
            *slot = Some(console);
        }
    });
}

/// Runs `f` on the console, if it is up (and not in use by a line a panic
/// interrupted).
pub fn with_console<R>(f: impl FnOnce(&mut Console) -> R) -> Option<R> {
    critical_section::with(|cs| CONSOLE.borrow(cs).try_borrow_mut().ok()?.as_mut().map(f))
}

/// Writes `line` and a newline to the console: the critical section (a
/// lock shared by every core) keeps other cores' lines out of the middle
/// of it. A byte the console fails to send ends the line's text; the
/// newline is still tried.
pub fn console_write_line(line: &Line<'_>) {
    with_console(|uart| {
        let mut failed = false;
        line.write(&mut |text| {
            if !failed {
                failed = uart.write_text(text).is_err();
            }
        });
        let _ = uart.write_text(b"\n");
    });
}

/// `println!` to the console. `console_line!`'s format strings, without
/// `core::fmt` (see `metaroce_board::console`).
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        $crate::hw::console_write_line(&::metaroce_board::console_line!($($arg)*));
    }};
}

// ----- generic timer ---------------------------------------------------

/// The architected timer: the clock every aarch64 board shares.
pub use metaroce_platform::cpu::{counter, now, timer_hz};

// ----- GICv3 and waiting -----------------------------------------------

/// Why the GIC could not be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum GicSetupError {
    /// The redistributor frames could not be walked (wrong base?).
    Redistributors,
    /// No redistributor reports this core's MPIDR.
    NoRedistributorFor(u64),
}

/// The interrupt controller, set up for the timer and the doorbell SPI.
#[allow(missing_debug_implementations)] // the GIC driver has no `Debug`
pub struct Interrupts {
    /// Owned so that nothing else can take the distributor; waiting uses
    /// the CPU interface's system registers only.
    gic: GicV3<'static>,
    cpu: usize,
    doorbell: Option<IntId>,
    message_spis: bool,
}

/// GICD_TYPER offset and its MBIS bit: the distributor accepts
/// message-based SPIs (a write of the INTID to GICD_SETSPI_NSR, +0x40),
/// which is how the other side raises the doorbell SPI.
const GICD_TYPER: usize = 0x4;
const GICD_TYPER_MBIS: u32 = 1 << 16;

/// The doorbell SPI and its trigger: `gic.doorbell_intid`, which the NIC
/// side raises by writing it to `GICD_SETSPI_NSR` (edge: each write makes
/// it pending once), or in the twin (`gic.doorbell_raise =
/// "virtio-serial"`) the SPI of the virtio-serial device its stand-in
/// writes to (level, until acknowledged); 0: none.
fn doorbell_spi() -> (u32, Trigger) {
    #[cfg(feature = "elba-twin")]
    if board::DOORBELL_VIRTIO_SERIAL {
        return (twin::doorbell_line().unwrap_or(0), Trigger::Level);
    }
    (board::DOORBELL_INTID, Trigger::Edge)
}

impl Interrupts {
    /// Sets up the GICv3 (distributor, every redistributor, this core's
    /// CPU interface) with the timer PPI and the doorbell SPI enabled as
    /// non-secure group 1, the SPI routed to this core. IRQs stay masked at
    /// the CPU: [`Self::wait`] wakes on them with `wfi` and acknowledges
    /// them inline.
    pub fn new() -> Result<Self, GicSetupError> {
        let boot_mpidr = mpidr();
        // SAFETY: GICD_TYPER is a read-only register of the mapped
        // distributor; reading it has no side effects, and the driver below
        // is not created yet.
        let typer = unsafe { ((board::GICD_BASE + GICD_TYPER) as *const u32).read_volatile() };
        // SAFETY: the distributor and redistributor region from board.toml
        // are mapped as device memory and nothing else refers to them
        // (called once, at boot).
        let mut gic = unsafe {
            GicV3::new(
                UniqueMmioPointer::new(NonNull::new_unchecked(board::GICD_BASE as *mut Gicd)),
                NonNull::new_unchecked(board::GICR_BASE as *mut GicrSgi),
                board::GIC_CPU_COUNT,
            )
        }
        .map_err(|_| GicSetupError::Redistributors)?;
        let cpu = (0..board::GIC_CPU_COUNT)
            .find(|&i| {
                gic.gicr_typer(i)
                    .is_ok_and(|t| t.core_mpidr() == boot_mpidr)
            })
            .ok_or(GicSetupError::NoRedistributorFor(boot_mpidr))?;
        if current_el() == 2 {
            GicCpuInterface::enable_system_register_el2(true);
        }
        gic.setup(cpu);
        GicCpuInterface::set_priority_mask(0xff);
        let configure = |gic: &mut GicV3<'static>, intid: IntId, trigger: Trigger| {
            let core = intid.is_private().then_some(cpu);
            let _ = gic.set_group(intid, core, Group::Group1NS);
            let _ = gic.set_interrupt_priority(intid, core, PRIORITY);
            let _ = gic.set_trigger(intid, core, trigger);
            let _ = gic.enable_interrupt(intid, core, true);
        };
        configure(&mut gic, TIMER_INTID, Trigger::Level);
        let (intid, trigger) = doorbell_spi();
        let doorbell = (intid >= 32).then(|| IntId::spi(intid - 32));
        if let Some(intid) = doorbell {
            let _ = gic.distributor().set_routing(intid, Some(boot_mpidr));
            configure(&mut gic, intid, trigger);
        }
        // SAFETY: masks IRQs at the CPU; no memory effects.
        unsafe { asm!("msr daifset, #2", options(nomem, nostack)) };
        let mut irq = Interrupts {
            gic,
            cpu,
            doorbell,
            message_spis: typer & GICD_TYPER_MBIS != 0,
        };
        // Every other core's redistributor, before the node starts it.
        for core in 1..board::CORE_COUNT {
            if let Err(e) = irq.prepare_core(core) {
                defmt::warn!("core {=usize}: GIC not ready ({})", core, e);
            }
        }
        defmt::info!(
            "GICv3 up: redistributor {=usize}, doorbell INTID {=u32}, message-based SPIs {=bool}",
            irq.cpu,
            intid,
            irq.message_spis
        );
        Ok(irq)
    }

    /// Readies core `core`'s redistributor before that core starts: wakes
    /// it and enables its timer PPI (group 1 non-secure), as `new` did for
    /// the boot core. The core then only turns on its CPU interface
    /// ([`CoreInterrupts::new`]).
    pub fn prepare_core(&mut self, core: usize) -> Result<(), GicSetupError> {
        let mpidr = cores::mpidr_of(core);
        let cpu = (0..board::GIC_CPU_COUNT)
            .find(|&i| {
                self.gic
                    .gicr_typer(i)
                    .is_ok_and(|t| t.core_mpidr() == mpidr)
            })
            .ok_or(GicSetupError::NoRedistributorFor(mpidr))?;
        let _ = self.gic.redistributor_mark_core_awake(cpu);
        let gic = &mut self.gic;
        let _ = gic.set_group(TIMER_INTID, Some(cpu), Group::Group1NS);
        let _ = gic.set_interrupt_priority(TIMER_INTID, Some(cpu), PRIORITY);
        let _ = gic.set_trigger(TIMER_INTID, Some(cpu), Trigger::Level);
        let _ = gic.enable_interrupt(TIMER_INTID, Some(cpu), true);
        Ok(())
    }

    /// Whether the distributor takes message-based SPIs (GICD_TYPER.MBIS),
    /// so the other side can raise the doorbell SPI by an MMIO write.
    pub fn message_spis(&self) -> bool {
        self.message_spis
    }

    /// The redistributor index of this core.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// Sleeps until an interrupt (the doorbell SPI, or anything else
    /// pending) or `deadline`; returns whether the doorbell SPI fired.
    pub fn wait_doorbell(&mut self, deadline: Instant) -> bool {
        metaroce_platform::cpu::wait_for_interrupt(deadline);
        let mut doorbell = false;
        while let Some(intid) =
            GicCpuInterface::get_and_acknowledge_interrupt(InterruptGroup::Group1)
        {
            if Some(intid) == self.doorbell {
                doorbell = true;
                // The twin's doorbell line is level-triggered: lowered
                // before the end of the interrupt.
                #[cfg(feature = "elba-twin")]
                twin::doorbell_line_ack();
            }
            GicCpuInterface::end_interrupt(intid, InterruptGroup::Group1);
        }
        doorbell
    }
}

/// A secondary core's interrupts: its GIC CPU interface (system
/// registers, banked per core) on, group 1 enabled; its redistributor was
/// readied by core 0 ([`Interrupts::prepare_core`]). IRQs stay masked at
/// the core: `wait` wakes on them with `wfi`.
#[derive(Debug)]
pub struct CoreInterrupts {
    _private: (),
}

impl CoreInterrupts {
    // Not `Default`: it programs the hardware, once per core.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        if current_el() == 2 {
            GicCpuInterface::enable_system_register_el2(true);
        } else {
            GicCpuInterface::enable_system_register_el1();
        }
        GicCpuInterface::set_priority_mask(0xff);
        GicCpuInterface::enable_group1(true);
        // SAFETY: masks IRQs at the CPU; no memory effects.
        unsafe { asm!("msr daifset, #2", options(nomem, nostack)) };
        CoreInterrupts { _private: () }
    }

    /// Sleeps until an interrupt or `deadline` (this core's own timer).
    pub fn wait_core(&mut self, deadline: Instant) {
        metaroce_platform::cpu::wait_for_interrupt(deadline);
        while let Some(intid) =
            GicCpuInterface::get_and_acknowledge_interrupt(InterruptGroup::Group1)
        {
            GicCpuInterface::end_interrupt(intid, InterruptGroup::Group1);
        }
    }
}

/// Ringing the tx doorbell: a barrier so the ring writes reach memory
/// before the other side can see the new count (the SoC is coherent, but
/// the NIC side may poll from outside the CPU cluster).
#[derive(Debug, Clone, Copy)]
pub struct BarrierNotify;

impl Notify for BarrierNotify {
    fn notify(&self, _count: u32) {
        // SAFETY: a data synchronisation barrier has no other effect.
        unsafe { asm!("dsb st", options(nostack, preserves_flags)) };
    }
}

// ----- power -----------------------------------------------------------

/// Ends the node's run with `code` (0 ok, 1 failure, 101 panic): the code
/// on the console (`METAROCE-EXIT`), then this core parks ([`halt`]); the
/// card's other software is left alone.
pub fn exit(code: u32) -> ! {
    crate::println!("METAROCE-EXIT {}", code);
    halt()
}

/// Parks this core for good: PSCI CPU_OFF through `smc`, or `wfe` forever
/// should that return.
pub fn halt() -> ! {
    let _ = smccc::psci::cpu_off::<smccc::Smc>();
    loop {
        // SAFETY: waiting for an event has no memory effects.
        unsafe { asm!("wfe", options(nomem, nostack)) };
    }
}

/// The PSCI version through `smc`, if the secure firmware answers.
pub fn psci_version() -> Option<(u16, u16)> {
    smccc::psci::version::<smccc::Smc>()
        .ok()
        .map(|v| (v.major, v.minor))
}

// ----- entropy -----------------------------------------------------------

/// SMCCC calls into the secure firmware through `smc` (the TRNG service,
/// `board_pensando_elba::entropy`).
#[derive(Debug, Clone, Copy)]
pub struct SmcConduit;

impl Conduit for SmcConduit {
    fn call(&mut self, function: u32, args: [u64; 3]) -> [u64; 4] {
        let mut regs = [0u64; 17];
        regs[..3].copy_from_slice(&args);
        let r = smccc::smc64(function, regs);
        [r[0], r[1], r[2], r[3]]
    }
}

/// The board's entropy source (`board.toml` `[entropy]`): 256 bits from
/// the secure firmware's TRNG service (or, in the twin, the virtio-rng
/// device), for the endpoints' seeds and the engine's reseeds.
pub fn entropy(out: &mut Seed) -> Result<(), EntropyError> {
    match board::ENTROPY_SOURCE {
        Source::SmcccTrng => crate::entropy::fill(&mut SmcConduit, out),
        #[cfg(feature = "elba-twin")]
        Source::VirtioRng => twin::entropy(out),
        #[cfg(not(feature = "elba-twin"))]
        Source::VirtioRng => Err(EntropyError::Missing),
    }
}

/// Probes the entropy source once, at boot.
pub fn init_entropy() -> Result<(), EntropyError> {
    match board::ENTROPY_SOURCE {
        Source::SmcccTrng => crate::entropy::probe(&mut SmcConduit).map(|_| ()),
        #[cfg(feature = "elba-twin")]
        Source::VirtioRng => twin::init_entropy(),
        #[cfg(not(feature = "elba-twin"))]
        Source::VirtioRng => Err(EntropyError::Missing),
    }
}

/// What the twin substitutes for what QEMU `virt` cannot offer: the
/// virtio-rng device for the SMCCC TRNG, fw_cfg for the compiled-in
/// configuration, and a virtio-serial device's SPI for the doorbell SPI
/// the NIC side raises through `GICD_SETSPI_NSR` (QEMU's GICv3 ignores
/// writes to that register).
#[cfg(feature = "elba-twin")]
pub(crate) mod twin {
    use core::cell::RefCell;
    use core::ptr::NonNull;
    use core::sync::atomic::{AtomicBool, Ordering};

    use critical_section::Mutex;
    use metaroce_platform::entropy::{EntropyError, Seed};
    use metaroce_platform::virtio::{PoolHal, VirtioEntropy};
    use virtio_drivers::device::common::Feature;
    use virtio_drivers::queue::VirtQueue;
    use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
    use virtio_drivers::transport::{DeviceType, Transport};

    /// QEMU `virt`'s virtio-mmio slots (in the device block of the map).
    const VIRTIO_BASE: usize = 0x0a00_0000;
    const VIRTIO_STRIDE: usize = 0x200;
    const VIRTIO_SLOTS: usize = 32;
    /// "virt": the magic of a virtio-mmio block; its device id at +8.
    const VIRTIO_MAGIC: u32 = 0x7472_6976;

    struct Device(VirtioEntropy<PoolHal, MmioTransport<'static>>);

    // SAFETY: the device is reached only through `RNG`, under the
    // critical section, so by one core at a time.
    unsafe impl Send for Device {}

    static RNG: Mutex<RefCell<Option<Device>>> = Mutex::new(RefCell::new(None));

    /// The transport of the first virtio-mmio slot holding a `kind`
    /// device, and the slot; once per kind (the caller keeps it for the
    /// whole run).
    fn transport(kind: DeviceType) -> Option<(MmioTransport<'static>, usize)> {
        for slot in 0..VIRTIO_SLOTS {
            let base = VIRTIO_BASE + slot * VIRTIO_STRIDE;
            // SAFETY: every slot is a mapped virtio-mmio register block;
            // reading its magic and device id has no side effects.
            let (magic, id) = unsafe {
                (
                    core::ptr::read_volatile(base as *const u32),
                    core::ptr::read_volatile((base + 8) as *const u32),
                )
            };
            if magic != VIRTIO_MAGIC || id != kind as u32 {
                continue;
            }
            let header = NonNull::new(base as *mut VirtIOHeader)?;
            // SAFETY: as above; each caller asks for its kind once, so this
            // is the only transport made for this slot.
            let transport = unsafe { MmioTransport::new(header, VIRTIO_STRIDE) }.ok()?;
            return Some((transport, slot));
        }
        None
    }

    pub fn init_entropy() -> Result<(), EntropyError> {
        let (transport, _) = transport(DeviceType::EntropySource).ok_or(EntropyError::Missing)?;
        let device = VirtioEntropy::new(transport)?;
        // `try_borrow_mut`: no panic path (see `set_console`).
        critical_section::with(|cs| {
            let mut slot = RNG
                .borrow(cs)
                .try_borrow_mut()
                .map_err(|_| EntropyError::Failed)?;
            *slot = Some(Device(device));
            Ok(())
        })
    }

    /// `virt` wires virtio-mmio slot `i` to SPI 16 + `i` (INTID 48 + `i`).
    const VIRTIO_FIRST_INTID: u32 = 48;

    /// The doorbell line (`gic.doorbell_raise = "virtio-serial"`): port 0
    /// of a virtio-serial device, whose socket the stand-in NIC writes a
    /// byte to after ringing core 0's rx doorbell word. The byte lands in
    /// the one receive buffer posted here and the device raises its SPI
    /// (level) until [`doorbell_line_ack`] acknowledges it and posts the
    /// buffer again. The bytes mean nothing: the SPI is the message, as the
    /// INTID written to `GICD_SETSPI_NSR` is on the card.
    struct Line {
        transport: MmioTransport<'static>,
        rx: VirtQueue<PoolHal, 2>,
        token: Option<u16>,
    }

    // SAFETY: the line is reached only through `LINE`, under the critical
    // section, so by one core at a time.
    unsafe impl Send for Line {}

    static LINE: Mutex<RefCell<Option<Line>>> = Mutex::new(RefCell::new(None));
    /// The line's receive buffer, lent to the device while posted.
    static mut LINE_BUFFER: [u8; 64] = [0; 64];
    static LINE_RANG: AtomicBool = AtomicBool::new(false);

    impl Line {
        /// Posts the receive buffer unless it is posted.
        fn post(&mut self) {
            if self.token.is_some() {
                return;
            }
            // SAFETY: the buffer is a static lent to the device from here
            // until `pop_used` below takes it back; only `LINE`'s holder,
            // under the critical section, touches it.
            let buffer = unsafe { &mut *core::ptr::addr_of_mut!(LINE_BUFFER) };
            // SAFETY: as above: it stays valid and untouched until popped.
            self.token = unsafe { self.rx.add(&[], &mut [buffer]) }.ok();
            if self.rx.should_notify() {
                self.transport.notify(0);
            }
        }
    }

    /// Sets up the doorbell line; its SPI's INTID (`None`: no
    /// virtio-serial device, the doorbell is polled only).
    pub fn doorbell_line() -> Option<u32> {
        let (mut transport, slot) = transport(DeviceType::Console)?;
        let features = transport.begin_init(Feature::VERSION_1);
        let rx = VirtQueue::new(
            &mut transport,
            0,
            false,
            features.contains(Feature::RING_EVENT_IDX),
        )
        .ok()?;
        transport.finish_init();
        let mut line = Line {
            transport,
            rx,
            token: None,
        };
        line.post();
        // `try_borrow_mut`: no panic path (see `set_console`); nothing
        // holds the cell at bring-up.
        critical_section::with(|cs| {
            let mut held = LINE.borrow(cs).try_borrow_mut().ok()?;
            *held = Some(line);
            Some(VIRTIO_FIRST_INTID + slot as u32)
        })
    }

    /// Lowers the doorbell line (acknowledges the device, takes back and
    /// posts again its buffer); the first time, says so on the console.
    pub fn doorbell_line_ack() {
        critical_section::with(|cs| {
            let Ok(mut line) = LINE.borrow(cs).try_borrow_mut() else {
                return;
            };
            let Some(line) = line.as_mut() else {
                return;
            };
            let _ = line.transport.ack_interrupt();
            if let Some(token) = line.token.filter(|_| line.rx.can_pop()) {
                // SAFETY: the buffer `post` lent with this token.
                let buffer = unsafe { &mut *core::ptr::addr_of_mut!(LINE_BUFFER) };
                // SAFETY: the same buffer `add` was given for `token`.
                let _ = unsafe { line.rx.pop_used(token, &[], &mut [buffer]) };
                line.token = None;
            }
            line.post();
        });
        if !LINE_RANG.swap(true, Ordering::Relaxed) {
            crate::println!("METAROCE-DOORBELL-SPI woke core 0 (virtio-serial line)");
        }
    }

    pub fn entropy(out: &mut Seed) -> Result<(), EntropyError> {
        critical_section::with(|cs| match RNG.borrow(cs).try_borrow_mut().as_deref_mut() {
            Ok(Some(device)) => device.0.fill(out),
            Ok(None) => Err(EntropyError::Missing),
            // Held: only by a panic in the middle of `fill`.
            Err(_) => Err(EntropyError::Failed),
        })
    }

    /// QEMU `virt`'s fw_cfg MMIO interface: data at +0, selector
    /// (16-bit big-endian) at +8.
    const FW_CFG_BASE: usize = 0x0902_0000;

    fn fw_cfg_select(key: u16) {
        // SAFETY: the fw_cfg selector register, in the device block of the
        // identity map; the interface is big-endian.
        unsafe { core::ptr::write_volatile((FW_CFG_BASE + 8) as *mut u16, key.to_be()) };
    }

    fn fw_cfg_read(out: &mut [u8]) {
        for byte in out {
            // SAFETY: the fw_cfg data register; each read returns the next
            // byte of the selected item.
            *byte = unsafe { core::ptr::read_volatile(FW_CFG_BASE as *const u8) };
        }
    }

    /// Reads the fw_cfg file `name` into `out`: its length (truncated to
    /// `out`, trailing NULs dropped), or `None` if QEMU was not given it.
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
}

// ----- shared memory ---------------------------------------------------

/// The frame device of a core: its two rings in the ring region.
pub type FrameDevice = ShmFrameDevice<'static, BarrierNotify>;

/// Each core's two rings, formatted once, lent to its frame device for
/// the rest of the run.
static mut RINGS: [Option<(
    ShmRing<'static, FrameDescriptor>,
    ShmRing<'static, FrameDescriptor>,
)>; board::CORE_COUNT] = [const { None }; board::CORE_COUNT];
static SHARED_TAKEN: [AtomicBool; board::CORE_COUNT] =
    [const { AtomicBool::new(false) }; board::CORE_COUNT];

/// Formats core `core`'s frame rings and zeroes its doorbell words in the
/// ring region, and returns its frame device (rx ring from the NIC side,
/// tx ring to it, the tx doorbell rung after each burst); once per core
/// (`None` after, for a core past `cores.count`, or if a ring does not
/// fit, which build.rs already rules out).
pub fn core_frame_device(core: usize) -> Option<FrameDevice> {
    let layout = cores::layout(core)?;
    if SHARED_TAKEN[core].swap(true, Ordering::AcqRel) {
        return None;
    }
    let base = board::RINGS_BASE as *mut u8;
    // SAFETY: build.rs checked that the ring region lies in DRAM (mapped as
    // normal memory), outside the image, with every core's doorbells and
    // rings at disjoint, aligned offsets inside it (`cores::layout`, tested
    // on the host). `SHARED_TAKEN` makes these the only references this
    // program creates to this core's share, and the only access to its
    // entry of `RINGS`; the other side (the NIC) is assumed to follow the
    // protocol of `shm`.
    unsafe {
        let rx_bell = AtomicU32::from_ptr(base.add(layout.rx_doorbell).cast());
        let tx_bell: &'static AtomicU32 = AtomicU32::from_ptr(base.add(layout.tx_doorbell).cast());
        rx_bell.store(0, Ordering::Relaxed);
        tx_bell.store(0, Ordering::Relaxed);
        let rx_ring = ShmRing::format_raw(
            NonNull::new_unchecked(base.add(layout.rx_ring)),
            layout.rx_ring_len,
            board::RX_SLOTS,
        )
        .ok()?;
        let tx_ring = ShmRing::format_raw(
            NonNull::new_unchecked(base.add(layout.tx_ring)),
            layout.tx_ring_len,
            board::TX_SLOTS,
        )
        .ok()?;
        let slot = &mut (*core::ptr::addr_of_mut!(RINGS))[core];
        let (rx, tx) = slot.insert((rx_ring, tx_ring));
        Some(ShmFrameDevice::new(
            rx.consumer(),
            tx.producer(),
            ShmDoorbell::new(tx_bell, BarrierNotify),
        ))
    }
}

static HOST_MEMORY_TAKEN: AtomicBool = AtomicBool::new(false);

/// The DMA window of `[host_memory]` (local DRAM the host addresses at
/// `host_memory.host_address`); once.
pub fn host_memory() -> Option<&'static mut [u8]> {
    if HOST_MEMORY_TAKEN.swap(true, Ordering::AcqRel) {
        return None;
    }
    // SAFETY: build.rs checked that the window lies in DRAM (mapped as
    // normal memory), apart from the image, the rings and the host
    // interface; `HOST_MEMORY_TAKEN` makes this the only reference.
    Some(unsafe {
        core::slice::from_raw_parts_mut(
            board::HOST_MEMORY_LOCAL_BASE as *mut u8,
            board::HOST_MEMORY_SIZE,
        )
    })
}

static HOST_INTERFACE_TAKEN: AtomicBool = AtomicBool::new(false);

/// Why the host interface's memory is not available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum HostInterfaceError {
    /// Already handed out.
    Taken,
    /// `[host_interface]` does not describe usable shared memory.
    BadRegion,
}

/// The host interface's region of `[host_interface]` (spec chapter 6): the
/// DRAM the card exposes to the host through a PCIe BAR; once.
pub fn host_interface_memory(
) -> Result<metaroce_platform::shmem::SharedMemory<'static>, HostInterfaceError> {
    if HOST_INTERFACE_TAKEN.swap(true, Ordering::AcqRel) {
        return Err(HostInterfaceError::Taken);
    }
    // SAFETY: build.rs checked that the region lies in DRAM (mapped as
    // normal memory), apart from the image, the rings and the DMA window;
    // `HOST_INTERFACE_TAKEN` hands it out once, and nothing in the firmware
    // makes Rust references into it (the host side writes it too).
    unsafe {
        metaroce_platform::shmem::SharedMemory::new(
            board::HOST_INTERFACE_BASE as *mut u8,
            board::HOST_INTERFACE_SIZE,
        )
    }
    .ok_or(HostInterfaceError::BadRegion)
}
