//! The host role (`role=host`): the node is driven by host processes
//! through the shared-memory host interface (spec chapter 6) in the
//! ivshmem BAR2, instead of a task compiled into the firmware. The loop is
//! the platform's: [`HostInterface::poll_control`] (admin commands and
//! events), [`Engine::poll`] with the interface as its host side (work
//! entries read from the sets' queues, completions written into them) and
//! the BAR as the DMA target, then a sleep
//! that backs off from 20 us to 200 us while no host rings a doorbell
//! (doorbells are polled; the timer and the NIC interrupt end a sleep).
//! It runs until the harness stops QEMU.

use core::time::Duration;

use metaroce_platform::hostif::{DeviceInfo, HostInterface};
use metaroce_platform::shmem::SharedMemory;
use metaroce_platform::Engine;

use crate::config::NodeConfig;
use crate::engine::{self, NodeControl, NodeDevice, NodeEndpoint, NodeMemory};
use crate::hw;
use crate::println;
use crate::serve::SERVE_CONNECTIONS;
use metaroce_board::Interrupts as _;

/// Queue sets laid out in the shared memory (each a protection domain).
const QUEUE_SETS: u32 = <crate::hw::ThisBoard as metaroce_board::Board>::HOST_QUEUE_SETS;
/// Doorbell polling back-off while idle.
const POLL_MIN: Duration = Duration::from_micros(20);
const POLL_MAX: Duration = Duration::from_micros(200);
const STATS_PERIOD: Duration = Duration::from_secs(5);

/// Serves the host interface in `shm` until QEMU is stopped.
pub fn run(
    cfg: &NodeConfig,
    endpoint: &mut NodeEndpoint,
    mut engine: Engine,
    mut device: NodeDevice,
    irq: &mut hw::Interrupts,
    shm: SharedMemory<'static>,
) -> ! {
    let info = DeviceInfo {
        node: u16::from(cfg.node),
        ipv4: cfg.ip.octets(),
        udp_port: cfg.port,
        queue_sets: QUEUE_SETS,
    };
    let regions = endpoint.regions().capacity() as u32;
    let mut hostif = match HostInterface::<SERVE_CONNECTIONS>::format(shm, info, regions) {
        Ok(h) => h,
        Err(e) => {
            defmt::error!("host interface: {}", e);
            crate::node::fail("the host interface does not fit the shared memory")
        }
    };
    let [a, b, c, d] = cfg.ip.octets();
    println!(
        "METAROCE-HOSTIF node={} shm={} sets={} ip={}.{}.{}.{} port={}",
        cfg.node,
        shm.len(),
        QUEUE_SETS,
        a,
        b,
        c,
        d,
        // As a u32: the console then formats no 16-bit integers.
        u32::from(cfg.port)
    );
    let mut backoff = POLL_MIN;
    let mut next_stats = hw::now() + STATS_PERIOD;
    loop {
        let now = hw::now();
        let stats = engine.stats();
        let mut busy = hostif.poll_control(now, &mut NodeControl(endpoint), &stats);
        let polled = engine::poll(
            &mut engine,
            now,
            endpoint,
            &mut device,
            &mut hostif,
            NodeMemory::Shared(shm),
        );
        busy |= polled.busy;
        if now >= next_stats {
            next_stats = now + STATS_PERIOD;
            defmt::info!("engine: {}", engine.stats());
            defmt::info!("host interface: {}", hostif.stats());
        }
        if busy || hostif.has_work() {
            backoff = POLL_MIN;
            continue;
        }
        let mut deadline = now + backoff;
        if let Some(t) = polled.next_timeout {
            deadline = deadline.min(t);
        }
        if deadline > hw::now() {
            irq.wait(deadline, &mut || device.ack_interrupt());
        }
        // Saturating: `Duration`'s `*` panics on overflow, with a
        // message that links `core::fmt` into the image.
        backoff = backoff.saturating_mul(2).min(POLL_MAX);
    }
}
