//! The Elba as a board of the node: `metaroce_board::Board` over `hw`.
//!
//! What differs from QEMU's board, besides the drivers: the NIC side
//! steers every frame to the rings of the core owning its connection
//! (`NIC_STEERS`), so every core opens its own frame device and no core
//! dispatches; the DMA window and the host interface are regions of
//! `board.toml`, not statics of the image; the configuration is the
//! `[node]`, `[net]` and `[cores]` sections, compiled in.

use metaroce_board::{Board, Capacities, CounterDelay};
use metaroce_core::Instant;
use metaroce_platform::entropy::{EntropyError, Seed};
use metaroce_platform::shmem::SharedMemory;

use crate::board;
#[cfg(not(feature = "elba-twin"))]
const _: () = assert!(
    !matches!(board::ENTROPY_SOURCE, crate::entropy::Source::VirtioRng)
        && !board::NODE_CONFIG_FW_CFG
        && !board::DOORBELL_VIRTIO_SERIAL,
    "virtio-rng, fw_cfg and the virtio-serial doorbell line are the twin's substitutions: build with the elba-twin feature"
);
use crate::hw;

/// The Elba as a MetaRoCE board.
#[derive(Debug)]
pub enum PensandoElba {}

impl metaroce_board::Interrupts for hw::Interrupts {
    fn wait(&mut self, deadline: Instant, on_net: &mut dyn FnMut()) {
        if self.wait_doorbell(deadline) {
            on_net();
        }
    }

    /// Nothing to enable: no core waits for another here (each has its
    /// own rings; a sleeping core polls them at least every 20 ms).
    fn enable_wake(&mut self) {}
}

impl metaroce_board::CoreInterrupts for hw::CoreInterrupts {
    fn new() -> Self {
        hw::CoreInterrupts::new()
    }

    fn wait(&mut self, deadline: Instant) {
        self.wait_core(deadline)
    }
}

impl Board for PensandoElba {
    const NAME: &'static str = "pensando-elba";
    const MAX_CORES: usize = board::CORE_COUNT;

    type Console = hw::Console;
    type Delay = CounterDelay;
    type Interrupts = hw::Interrupts;
    type CoreInterrupts = hw::CoreInterrupts;
    type NetBuffers = ();
    type Net = hw::FrameDevice;
    type HostMemoryError = hw::HostInterfaceError;

    const ENDPOINT: Capacities = Capacities {
        connections: board::ENDPOINT_CONNECTIONS,
        paths: board::ENDPOINT_PATHS,
        work_entries: board::ENDPOINT_WORK_ENTRIES,
        recv_entries: board::ENDPOINT_RECV_ENTRIES,
        senders: board::ENDPOINT_SENDERS,
        inflight_records: board::ENDPOINT_INFLIGHT_RECORDS,
        regions: board::ENDPOINT_REGIONS,
    };
    const HOST_QUEUE_SETS: u32 = board::HOST_INTERFACE_QUEUE_SETS;
    const ENTROPY_MISSING: &'static str =
        "no entropy source: the secure firmware has no Arm TRNG interface (board.toml [entropy])";
    const ENTROPY_FAILED: &'static str = "the TRNG gave no entropy";
    const ENTROPY_STUCK: &'static str = "the TRNG is stuck (constant output)";
    const NET_BUFFERS: () = ();
    const HOST_MEMORY_BASE: u64 = board::HOST_MEMORY_HOST_ADDRESS;
    const HOST_MEMORY_LEN: usize = board::HOST_MEMORY_SIZE;
    const HOST_MEMORY_IN_IMAGE: bool = false;
    const NIC_STEERS: bool = true;

    fn write_line(line: &metaroce_board::console::Line<'_>) {
        hw::console_write_line(line)
    }

    fn exit(code: u32) -> ! {
        hw::exit(code)
    }

    fn log_write(bytes: &[u8]) {
        hw::with_console(|uart| {
            // A console that times out loses log bytes, never the firmware.
            let _ = embedded_io::Write::write_all(uart, bytes);
        });
    }

    /// Parks the core: `exit` would print through the console's lock,
    /// which the logger may hold.
    fn log_fail() -> ! {
        hw::halt()
    }

    fn counter() -> u64 {
        hw::counter()
    }

    fn timer_hz() -> u64 {
        hw::timer_hz()
    }

    fn now() -> Instant {
        hw::now()
    }

    fn delay() -> CounterDelay {
        CounterDelay::new(hw::counter, hw::timer_hz())
    }

    fn read_config(out: &mut [u8]) -> Result<usize, &'static str> {
        #[cfg(feature = "elba-twin")]
        if board::NODE_CONFIG_FW_CFG {
            return hw::twin::fw_cfg_file("opt/metaroce/config", out)
                .ok_or("no fw_cfg file opt/metaroce/config (board.toml node.config_from)");
        }
        let text = board::NODE_CONFIG.as_bytes();
        let Some(out) = out.get_mut(..text.len()) else {
            return Err("board.toml: the node configuration is too long");
        };
        out.copy_from_slice(text);
        Ok(text.len())
    }

    fn init_entropy() -> Result<(), EntropyError> {
        hw::init_entropy()
    }

    fn entropy(out: &mut Seed) -> Result<(), EntropyError> {
        hw::entropy(out)
    }

    fn interrupts() -> hw::Interrupts {
        match hw::Interrupts::new() {
            Ok(irq) => irq,
            Err(e) => {
                defmt::error!("GICv3 setup failed: {}", e);
                crate::println!("METAROCE-ERROR GICv3 setup failed");
                hw::exit(1)
            }
        }
    }

    fn open_net(
        _irq: &mut hw::Interrupts,
        _buffers: &'static mut (),
        _mac: [u8; 6],
    ) -> Result<hw::FrameDevice, &'static str> {
        Self::open_core_net(0)
    }

    fn open_core_net(core: usize) -> Result<hw::FrameDevice, &'static str> {
        hw::core_frame_device(core)
            .ok_or("the core's frame rings could not be formatted (see board.toml [rings])")
    }

    fn host_memory() -> Option<&'static mut [u8]> {
        hw::host_memory()
    }

    /// Nothing to acknowledge: the rings are polled.
    fn ack_net(_net: &mut hw::FrameDevice) {}

    fn host_interface_memory() -> Result<SharedMemory<'static>, hw::HostInterfaceError> {
        hw::host_interface_memory()
    }

    fn core_id() -> usize {
        hw::core_index()
    }

    /// PSCI 0.2 `method = "smc"` (elba.dtsi): the secure firmware's.
    type Psci = smccc::Smc;
    const SECONDARY_STACK_PAGES: usize = board::SECONDARY_STACK_PAGES;

    fn mpidr_of(core: usize) -> u64 {
        crate::cores::mpidr_of(core)
    }

    /// No wake-up: see [`metaroce_board::Interrupts::enable_wake`] above.
    fn wake(_core: usize) {}

    fn sleep<T: ?Sized>(ctx: &mut T, has_work: impl FnOnce(&T) -> bool, wait: impl FnOnce(&mut T)) {
        if !has_work(ctx) {
            wait(ctx);
        }
    }
}
