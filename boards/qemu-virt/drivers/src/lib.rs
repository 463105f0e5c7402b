//! # board-qemu-virt-drivers
//!
//! QEMU `virt` (`-cpu cortex-a72`) as a board of the MetaRoCE node: its
//! drivers behind `metaroce_board::Board` ([`QemuVirt`]). The node
//! (`metaroce-node`) holds every role; this crate holds only what is
//! QEMU's: the memory map and boot glue, the PL011 console, semihosting
//! (exit status, the transport of the node's defmt log), the GICv2 and generic timer, fw_cfg
//! (the node's configuration), virtio-mmio net (the NIC) and rng (the
//! entropy source), and the ivshmem BAR of the host interface (`pci`).
//! What is QEMU's in the cores' bring-up (the PSCI conduit `hvc`, MPIDRs,
//! per-core GIC state, waking a core) is in `smp`; starting them and the
//! multi-core critical section are the node's (`metaroce-node`, `cores`).
//!
//! Every `unsafe` of the image is in this crate, each block with a
//! `SAFETY:` comment.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod hw;
pub mod pci;
pub mod smp;

use metaroce_board::{Board, Capacities, CounterDelay};
use metaroce_core::Instant;
use metaroce_platform::entropy::{EntropyError, Seed};
use metaroce_platform::shmem::SharedMemory;
use metaroce_platform::virtio::{NetBuffers, PoolHal, VirtioNetDevice};
use virtio_drivers::transport::mmio::MmioTransport;

/// Entries per virtio queue.
pub const NET_QUEUE: usize = 64;
/// The node's virtio-net device.
pub type NetDevice = VirtioNetDevice<'static, PoolHal, MmioTransport<'static>, NET_QUEUE>;

/// QEMU `virt` as a MetaRoCE board.
#[derive(Debug)]
pub enum QemuVirt {}

impl metaroce_board::Interrupts for hw::Interrupts {
    #[inline]
    fn wait(&mut self, deadline: Instant, on_net: &mut dyn FnMut()) {
        self.wait_net(deadline, on_net)
    }

    #[inline]
    fn enable_wake(&mut self) {
        self.enable_wake_sgi()
    }
}

impl metaroce_board::CoreInterrupts for smp::CoreInterrupts {
    #[inline]
    fn new() -> Self {
        smp::CoreInterrupts::new()
    }

    #[inline]
    fn wait(&mut self, deadline: Instant) {
        self.wait_core(deadline)
    }
}

impl Board for QemuVirt {
    const NAME: &'static str = "qemu-virt";
    const MAX_CORES: usize = smp::MAX_CORES;

    type Console = hw::Console;
    type Delay = CounterDelay;
    type Interrupts = hw::Interrupts;
    type CoreInterrupts = smp::CoreInterrupts;
    type NetBuffers = NetBuffers<NET_QUEUE>;
    type Net = NetDevice;
    type HostMemoryError = pci::PciError;

    // The serve profile's: 1,024 clients, each with 16 posted receives and
    // a few sends, control buffers plus a data region and a read-only page.
    const ENDPOINT: Capacities = Capacities {
        connections: 1024,
        paths: 8,
        work_entries: 4 * 1024,
        recv_entries: 17 * 1024,
        senders: 1024,
        inflight_records: 16384,
        regions: 3 * 1024 + 64,
    };
    const HOST_QUEUE_SETS: u32 = 4;
    const ENTROPY_MISSING: &'static str =
        "no entropy source: the node needs a virtio-rng device (-device virtio-rng-device)";
    const ENTROPY_FAILED: &'static str = "the virtio-rng device gave no entropy";
    const ENTROPY_STUCK: &'static str = "the virtio-rng device is stuck (constant output)";
    const NET_BUFFERS: Self::NetBuffers = NetBuffers::new();
    const HOST_MEMORY_BASE: u64 = hw::HOST_BASE;
    const HOST_MEMORY_LEN: usize = hw::HOST_MEMORY_LEN;
    const HOST_MEMORY_IN_IMAGE: bool = true;
    const NIC_STEERS: bool = false;

    #[inline]
    fn write_line(line: &metaroce_board::console::Line<'_>) {
        hw::console_write_line(line)
    }

    #[inline]
    fn exit(code: u32) -> ! {
        hw::exit(code)
    }

    #[inline]
    fn log_write(bytes: &[u8]) {
        hw::log_write(bytes)
    }

    /// Ends the run loudly (semihosting takes no lock).
    #[inline]
    fn log_fail() -> ! {
        hw::exit(101)
    }

    #[inline]
    fn counter() -> u64 {
        hw::counter()
    }

    #[inline]
    fn timer_hz() -> u64 {
        hw::timer_hz()
    }

    #[inline]
    fn now() -> Instant {
        hw::now()
    }

    fn delay() -> CounterDelay {
        CounterDelay::new(hw::counter, hw::timer_hz())
    }

    #[inline]
    fn read_config(out: &mut [u8]) -> Result<usize, &'static str> {
        hw::fw_cfg_file("opt/metaroce/config", out)
            .ok_or("no fw_cfg file opt/metaroce/config (run through metaroce-qemu)")
    }

    #[inline]
    fn init_entropy() -> Result<(), EntropyError> {
        hw::init_entropy()
    }

    #[inline]
    fn entropy(out: &mut Seed) -> Result<(), EntropyError> {
        hw::entropy(out)
    }

    #[inline]
    fn interrupts() -> hw::Interrupts {
        hw::Interrupts::new()
    }

    #[inline]
    fn open_net(
        irq: &mut hw::Interrupts,
        buffers: &'static mut Self::NetBuffers,
        mac: [u8; 6],
    ) -> Result<NetDevice, &'static str> {
        let Some((transport, slot)) = hw::find_virtio_net() else {
            return Err("no virtio-net device");
        };
        let Ok(mut net) = VirtioNetDevice::new(transport, buffers) else {
            return Err("virtio-net initialisation failed");
        };
        irq.enable_virtio(slot);
        net.enable_interrupts();
        if net.mac_address() != mac {
            defmt::warn!("device MAC differs from the configured one");
        }
        Ok(net)
    }

    fn open_core_net(_core: usize) -> Result<NetDevice, &'static str> {
        Err("one virtio-net device: core 0 dispatches")
    }

    fn host_memory() -> Option<&'static mut [u8]> {
        None
    }

    #[inline]
    fn ack_net(net: &mut NetDevice) {
        net.ack_interrupt()
    }

    #[inline]
    fn host_interface_memory() -> Result<SharedMemory<'static>, pci::PciError> {
        pci::ivshmem_memory()
    }

    #[inline]
    fn core_id() -> usize {
        smp::core_id()
    }

    /// QEMU implements PSCI itself for a guest at EL1: `hvc`.
    type Psci = smccc::Hvc;
    const SECONDARY_STACK_PAGES: usize = smp::SECONDARY_STACK_PAGES;

    #[inline]
    fn mpidr_of(core: usize) -> u64 {
        smp::mpidr_of(core)
    }

    /// aarch64-rt's secondary entry installs no vectors here (its
    /// `exceptions` feature is off): the board's own table.
    #[inline]
    fn secondary_init() {
        hw::install_vectors()
    }

    #[inline]
    fn wake(core: usize) {
        smp::wake(core)
    }

    #[inline]
    fn sleep<T: ?Sized>(ctx: &mut T, has_work: impl FnOnce(&T) -> bool, wait: impl FnOnce(&mut T)) {
        smp::sleep(ctx, has_work, wait)
    }
}
