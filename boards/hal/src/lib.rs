//! # metaroce-board
//!
//! What a board supplies to the MetaRoCE firmware node (`metaroce-node`):
//! the node (bring-up order, roles, host interface, multi-core dispatch,
//! serve, bench, workload) is written once, and a board crate implements
//! [`Board`] for its drivers: console, clock and delay, interrupt
//! controller, network device, entropy source, the memory of the host
//! interface and its cores. Hubris, Tock and Zephyr are the models: one
//! kernel, small board crates; the node reaches hardware only through
//! these traits, as Tock's capsules reach it through HIL traits.
//!
//! Where the embedded Rust ecosystem has a trait, the board implements it
//! and the node depends on that: [`DelayNs`] (`embedded-hal` 1.0) for
//! bring-up waits and timeouts over the architected timer, and
//! `embedded-io`'s `Write` for a console ([`Board::Console`]).
//!
//! The node is compiled for one board at a time (the image crate turns on
//! the node's board feature), so every call through [`Board`] is a direct
//! call to the board's function: no vtable, no generic code instantiated
//! in the image crate, nothing added to the code budget.
//!
//! The console prints lines built by [`console_line!`] ([`console`]), not
//! `core::fmt`, whose machinery the code budget has no room for.
//!
//! `forbid(unsafe_code)`: the drivers' `unsafe` stays in the board crates.

#![no_std]
#![forbid(unsafe_code)]

pub mod console;

use metaroce_core::Instant;
use metaroce_platform::entropy::{EntropyError, Seed};
use metaroce_platform::shmem::SharedMemory;
use metaroce_platform::FrameDevice;

pub use embedded_hal::delay::DelayNs;
pub use embedded_io;

/// Core 0's interrupt controller, as the node uses it: it sleeps until an
/// interrupt or a deadline (IRQs stay masked; a pending interrupt ends
/// `wfi` and is acknowledged inline).
pub trait Interrupts {
    /// Sleeps until an interrupt or `deadline`; `on_net` runs (to
    /// acknowledge the network device) if the device's interrupt fired.
    fn wait(&mut self, deadline: Instant, on_net: &mut dyn FnMut());
    /// Lets the other cores wake this one ([`Board::wake`]).
    fn enable_wake(&mut self);
}

/// A secondary core's own interrupt state (its timer and wake-up).
pub trait CoreInterrupts {
    /// Sets up the calling core's interrupts.
    fn new() -> Self;
    /// Sleeps until an interrupt (a wake-up) or `deadline`.
    fn wait(&mut self, deadline: Instant);
}

/// Why a secondary core did not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum StartError {
    /// Core 0 is the boot core; cores past [`Board::MAX_CORES`] do not
    /// exist.
    NoSuchCore,
    AlreadyStarted,
    /// PSCI refused (`CPU_ON` error code).
    Psci(i32),
}

/// The capacities of the endpoint of the host-interface and serve roles
/// (their tables and pools are statics of these sizes, spec 4.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacities {
    /// Connections held at once.
    pub connections: u32,
    /// Logical paths per connection (the node's `PATHS`: checked).
    pub paths: usize,
    /// Send-queue entries and posted receives shared by all connections.
    pub work_entries: u32,
    pub recv_entries: u32,
    /// Connections sending at once.
    pub senders: u32,
    /// In-flight packet records shared by the senders.
    pub inflight_records: u32,
    /// Memory regions.
    pub regions: u32,
}

/// A board: its drivers and its configuration, as the node reaches them.
/// Every function is an associated function (the hardware is one per
/// image); state a driver keeps lives in the board crate.
pub trait Board: 'static {
    /// The board's name, as in the banner and `cargo xtask image --board`.
    const NAME: &'static str;
    /// Most cores that run an engine.
    const MAX_CORES: usize;

    /// The console, for a board whose node logic writes raw bytes to it.
    type Console: embedded_io::Write;
    /// Waits of bring-up and timeouts, over the architected timer.
    type Delay: DelayNs;
    /// Core 0's interrupt controller.
    type Interrupts: Interrupts;
    /// A secondary core's interrupts.
    type CoreInterrupts: CoreInterrupts;
    /// Buffers the network device takes at start (DMA memory), a static of
    /// the node's: [`Board::NET_BUFFERS`] is their initial value.
    type NetBuffers: 'static;
    /// The frames of the node: the NIC, or the rings the NIC side fills.
    type Net: FrameDevice;
    /// Why the host interface's memory is missing.
    type HostMemoryError: defmt::Format;

    /// The host-interface and serve roles' endpoint.
    const ENDPOINT: Capacities;
    /// Queue sets (tenants, each a protection domain) of the host
    /// interface.
    const HOST_QUEUE_SETS: u32;
    /// What the node says when the entropy source is missing, gives
    /// nothing, or gives constant output (it then stops).
    const ENTROPY_MISSING: &'static str;
    const ENTROPY_FAILED: &'static str;
    const ENTROPY_STUCK: &'static str;
    /// The initial value of the node's static network buffers.
    const NET_BUFFERS: Self::NetBuffers;
    /// Where the memory the engine places payloads in and gathers them
    /// from (the DMA window: host memory as the host addresses it) starts,
    /// in the host's address space, and its bytes.
    const HOST_MEMORY_BASE: u64;
    const HOST_MEMORY_LEN: usize;
    /// Whether that memory is emulated: a static of the node's, in the
    /// image's `.bss`; otherwise it is the board's ([`Board::host_memory`]).
    const HOST_MEMORY_IN_IMAGE: bool;
    /// Whether the NIC side steers every received frame to the rings of
    /// the core owning its connection (each core opens its own device,
    /// [`Board::open_core_net`]); otherwise core 0 owns the one device
    /// and dispatches frames to the other cores in software.
    const NIC_STEERS: bool;

    /// Writes `line` and a newline to the console; lines from several
    /// cores never mix.
    fn write_line(line: &console::Line<'_>);
    /// Ends the run with `code` (0 ok, 1 failure, 101 panic).
    fn exit(code: u32) -> !;
    /// Writes bytes of the defmt log (the node's global logger hands over
    /// whole rzCOBS frames, or 256-byte pieces of longer ones) to where the
    /// board's log goes: QEMU's semihosting, the Elba's console.
    fn log_write(bytes: &[u8]);
    /// Stops the core when the log is entered while taken (a bug: nothing
    /// logs from interrupt context), without the console's lock, which the
    /// logger may hold.
    fn log_fail() -> !;

    /// Ticks of the architected counter.
    fn counter() -> u64;
    /// Ticks per second of [`Board::counter`].
    fn timer_hz() -> u64;
    /// Time since boot.
    fn now() -> Instant;
    /// A delay over the architected timer.
    fn delay() -> Self::Delay;

    /// The node's configuration text (`key=value` words, see the node's
    /// `config`) into `out`: its length, or why there is none.
    fn read_config(out: &mut [u8]) -> Result<usize, &'static str>;

    /// Finds and starts the entropy source (`Missing` without one).
    fn init_entropy() -> Result<(), EntropyError>;
    /// 32 fresh bytes from the entropy source, for the endpoints' secrets.
    fn entropy(out: &mut Seed) -> Result<(), EntropyError>;

    /// Sets up the interrupt controller (core 0, once).
    fn interrupts() -> Self::Interrupts;
    /// Starts the network device over `buffers`, with its interrupt
    /// enabled in `irq`; the error says what is missing. `mac` is the
    /// configured address (a device with another one is logged).
    fn open_net(
        irq: &mut Self::Interrupts,
        buffers: &'static mut Self::NetBuffers,
        mac: [u8; 6],
    ) -> Result<Self::Net, &'static str>;
    /// Core `core`'s own network device (its rings), on a board whose NIC
    /// side steers frames ([`Board::NIC_STEERS`]); called on that core.
    fn open_core_net(core: usize) -> Result<Self::Net, &'static str>;
    /// The DMA window ([`Board::HOST_MEMORY_LEN`] bytes, seen by the host
    /// at [`Board::HOST_MEMORY_BASE`]) where it is not in the image; once.
    fn host_memory() -> Option<&'static mut [u8]>;
    /// Acknowledges the network device's interrupt (from
    /// [`Interrupts::wait`]'s `on_net`).
    fn ack_net(net: &mut Self::Net);
    /// The shared memory of the host interface (spec chapter 6).
    fn host_interface_memory() -> Result<SharedMemory<'static>, Self::HostMemoryError>;

    /// The calling core's number (0 boots); unique per running core (the
    /// node's multi-core critical section names its owner by it).
    fn core_id() -> usize;
    /// The conduit of PSCI calls: `smccc::Hvc` where the emulator itself
    /// implements PSCI for a guest at EL1 (QEMU), `smccc::Smc` where the
    /// secure firmware does (the Elba, and the twin at EL2). The node
    /// starts secondary cores with `CPU_ON` through it.
    type Psci: smccc::Call;
    /// 4 KiB pages of each secondary core's stack (the node's statics).
    const SECONDARY_STACK_PAGES: usize;
    /// The MPIDR affinity fields of core `core`, `CPU_ON`'s target.
    fn mpidr_of(core: usize) -> u64;
    /// Runs first on a secondary core, before the node's entry: what the
    /// runtime's secondary entry leaves to the board (QEMU: its exception
    /// vectors). Nothing by default.
    #[inline]
    fn secondary_init() {}
    /// Wakes core `core` if it sleeps in [`Board::sleep`]: call after
    /// publishing work for it.
    fn wake(core: usize);
    /// Sleeps the calling core through `wait(ctx)` unless `has_work(ctx)`
    /// (checked after announcing the sleep, so work published meanwhile
    /// is not missed).
    fn sleep<T: ?Sized>(ctx: &mut T, has_work: impl FnOnce(&T) -> bool, wait: impl FnOnce(&mut T));
}

/// [`DelayNs`] over a board's architected counter: busy-waits (the node
/// sleeps with `wfi` on its timer instead once it runs; this is for
/// bring-up waits and bounded register polls).
#[derive(Debug, Clone, Copy)]
pub struct CounterDelay {
    counter: fn() -> u64,
    hz: u64,
}

impl CounterDelay {
    /// A delay counting `counter`'s ticks at `hz` per second.
    pub fn new(counter: fn() -> u64, hz: u64) -> Self {
        CounterDelay { counter, hz }
    }

    /// Ticks that cover `ns` nanoseconds (at least one).
    fn ticks(&self, ns: u32) -> u64 {
        (u64::from(ns) * self.hz).div_ceil(1_000_000_000).max(1)
    }
}

impl DelayNs for CounterDelay {
    fn delay_ns(&mut self, ns: u32) {
        let start = (self.counter)();
        let ticks = self.ticks(ns);
        while (self.counter)().wrapping_sub(start) < ticks {
            core::hint::spin_loop();
        }
    }
}
