//! The node: bring-up, the shared-memory rings from `board.toml`, the
//! MetaRoCE endpoint, and the main loop, which is the platform's engine
//! loop (`Engine::poll`, the same code as under QEMU) over the frame rings,
//! the host-interface queues and the DMA window, sleeping (`wfi`) on the
//! timer or the doorbell interrupt when nothing moves.

use core::time::Duration;

use metaroce_core::api::PeerAddr;
use metaroce_core::{Borrowed, Config, Endpoint, Event};
use metaroce_platform::dma::HostWindow;
use metaroce_platform::net::NetConfig;
use metaroce_platform::{Doorbell, Engine, HostQueues};
use smoltcp::wire::{EthernetAddress, IpAddress, Ipv4Address};

use board_pensando_elba::board;
use board_pensando_elba::shm::{ShmDoorbell, ShmFrameDevice};

use crate::hw::{self, BarrierNotify, BootInfo};
use crate::println;

/// The host-interface queues: send, receive, completion, admin slots.
pub type Queues = HostQueues<64, 64, 128, 4>;
/// The endpoint: 4 connections of 8 paths.
type ElbaEndpoint = Endpoint<Borrowed<'static>, { board::ENDPOINT_PATHS }>;

// The endpoint's tables and pools: statics sized by `board.toml`'s
// `[endpoint]` section.
metaroce_platform::static_endpoint_storage!(endpoint_storage, board::ENDPOINT_PATHS,
    connections: board::ENDPOINT_CONNECTIONS, work_entries: board::ENDPOINT_WORK_ENTRIES,
    recv_entries: board::ENDPOINT_RECV_ENTRIES, senders: board::ENDPOINT_SENDERS,
    inflight_records: board::ENDPOINT_INFLIGHT_RECORDS, regions: board::ENDPOINT_REGIONS);
/// Longest sleep, so a missed wake-up costs little.
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// How often the counters are logged.
const STATS_PERIOD: Duration = Duration::from_secs(10);

const _: () = assert!(
    board::HOST_QUEUES_OFFSET + core::mem::size_of::<Queues>() <= board::RINGS_SIZE,
    "board.toml: the host queues do not fit rings.size after rings.host_queues_offset"
);

fn fail(msg: &str) -> ! {
    println!("METAROCE-ERROR {}", msg);
    defmt::error!("{=str}", msg);
    hw::halt()
}

pub fn main(boot: BootInfo) -> ! {
    println!(
        "metaroce pensando-elba firmware {} at {:#x}: EL{}, MPIDR {:#x}, x0 {:#x}, counter {} Hz",
        env!("CARGO_PKG_VERSION"),
        board::LOAD_ADDRESS,
        boot.el,
        boot.mpidr,
        boot.x0,
        hw::counter_hz()
    );
    println!("metaroce: defmt frames (rzCOBS) follow on this console");
    match hw::psci_version() {
        Some((major, minor)) => defmt::info!("PSCI {=u16}.{=u16} (smc)", major, minor),
        None => defmt::warn!("no PSCI answer through smc"),
    }
    let mut irq = match hw::Interrupts::new(&boot) {
        Ok(irq) => irq,
        Err(e) => {
            defmt::error!("GICv3 setup failed: {}", e);
            fail("GICv3 setup failed")
        }
    };
    defmt::info!(
        "GICv3 up: redistributor {=usize}, doorbell INTID {=u32}, message-based SPIs {=bool}",
        irq.cpu(),
        board::DOORBELL_INTID,
        irq.message_spis()
    );
    let Some(shared) = hw::shared_memory() else {
        fail("shared-memory rings could not be formatted (see board.toml)")
    };
    let hw::SharedMemory {
        mut rx_ring,
        mut tx_ring,
        rx_bell,
        tx_bell,
        queues,
        host_memory,
    } = shared;
    let rx_bell = ShmDoorbell::new(rx_bell, ());
    let mut device = ShmFrameDevice::new(
        rx_ring.consumer(),
        tx_ring.producer(),
        ShmDoorbell::new(tx_bell, BarrierNotify),
    );
    let Some((_host, mut port)) = queues.split() else {
        fail("host queues split twice")
    };
    let mut window = HostWindow::new(board::HOST_MEMORY_HOST_ADDRESS, host_memory);
    let mut engine: Engine = Engine::new(NetConfig {
        mac: EthernetAddress(board::MAC),
        ip: Ipv4Address::from(board::IP),
    });
    let config = Config {
        udp_port: board::UDP_PORT,
        // Payload per packet that fits a 1514-byte frame.
        mtu: 1024,
        ..Config::default()
    };
    let seed = metaroce_core::rng::seed_from_u64(hw::now().as_nanos() ^ (boot.mpidr << 32));
    let Some(storage) = endpoint_storage() else {
        panic!("endpoint storage taken twice")
    };
    let mut endpoint = ElbaEndpoint::new(config, storage, seed);
    if let Some((ip, mac)) = board::PEER {
        let ip = Ipv4Address::from(ip);
        engine.add_static_neighbor(ip, EthernetAddress(mac));
        let peer = PeerAddr {
            ip: IpAddress::Ipv4(ip),
            port: board::UDP_PORT,
        };
        match endpoint.connect(hw::now(), peer, 0) {
            Ok(h) => defmt::info!("connecting to the static peer: connection {=u32}", h.index),
            Err(e) => defmt::warn!("connect failed: {}", defmt::Debug2Format(&e)),
        }
    }
    defmt::info!(
        "engine loop over rings at {=usize:#x} (rx {=u32}, tx {=u32} slots), DMA window {=usize:#x} (+{=usize:#x})",
        board::RINGS_BASE,
        board::RX_SLOTS,
        board::TX_SLOTS,
        board::HOST_MEMORY_LOCAL_BASE,
        board::HOST_MEMORY_SIZE
    );
    let mut next_stats = hw::now() + STATS_PERIOD;
    let mut fault_reported = false;
    loop {
        let now = hw::now();
        let polled = engine.poll(now, &mut endpoint, &mut device, &mut port, &mut window);
        while let Some(event) = endpoint.poll_event() {
            match event {
                Event::Incoming { conn, peer } => {
                    defmt::info!("connection {=u32} from {}", conn.index, peer)
                }
                Event::Connected(h) => defmt::info!("connection {=u32} up", h.index),
                Event::Closed { conn, .. } => {
                    defmt::info!("connection {=u32} closed", conn.index);
                    let _ = endpoint.release(conn);
                }
                Event::Failed { conn, status } => {
                    defmt::warn!("connection {=u32} failed: {}", conn.index, status);
                    let _ = endpoint.release(conn);
                }
            }
        }
        if let (Some(fault), false) = (device.fault(), fault_reported) {
            defmt::error!("frame ring fault: {}", defmt::Debug2Format(&fault));
            fault_reported = true;
        }
        if now >= next_stats {
            defmt::info!("engine: {}", engine.stats());
            next_stats = now + STATS_PERIOD;
        }
        // The rx doorbell is only a wake-up hint: the rings are polled.
        let rung = rx_bell.take() | port.take_doorbells();
        if !rung && !polled.busy && !port.has_work() && device.rx_pending() == 0 {
            let mut deadline = (now + MAX_SLEEP).min(next_stats);
            if let Some(t) = polled.next_timeout {
                deadline = deadline.min(t);
            }
            if deadline > hw::now() {
                irq.wait(deadline);
            }
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // No defmt here: the panic may have come from inside the logger.
    println!("METAROCE-PANIC {}", info);
    hw::halt()
}
