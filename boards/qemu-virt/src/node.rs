//! The node: hardware bring-up, the transport chosen by the configuration,
//! and the main loop that alternates the engine loop and the workload task
//! and sleeps (`wfi`) when neither has work.

use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;

use metaroce_core::api::ConnHandle;
use metaroce_core::wire::CloseReason;
use metaroce_core::{Borrowed, CommandError, Config, Endpoint, Event, Instant};
use metaroce_platform::datagram::DatagramTransport;
use metaroce_platform::dma::HostWindow;
use metaroce_platform::net::NetConfig;
use metaroce_platform::virtio::{NetBuffers, PoolHal, VirtioNetDevice};
use metaroce_platform::{Engine, EnginePort, HostQueues, PollOutcome, Transport};
use smoltcp::wire::EthernetAddress;
use virtio_drivers::transport::mmio::MmioTransport;

use crate::config::{NodeConfig, Role, TransportKind, MAX_PEERS};
use crate::hw;
use crate::println;
use crate::serve::{Serve, ServeNode, SERVE_CONNECTIONS};
use crate::workload::{
    self, Counters, NodeServices, Outcome, Workload, HOST_BASE, HOST_MEMORY_LEN,
};

/// Entries per virtio queue.
const NET_QUEUE: usize = 64;
pub(crate) type NetDevice = VirtioNetDevice<'static, PoolHal, MmioTransport<'static>, NET_QUEUE>;
/// Paths per connection.
const PATHS: usize = 8;
/// A node's MetaRoCE endpoint: connections of 8 paths over static storage.
pub(crate) type NodeEndpoint = Endpoint<Borrowed<'static>, PATHS>;

// The workload role's storage: a few connections (one per peer and role).
metaroce_platform::static_endpoint_storage!(workload_storage, PATHS,
    connections: 16, work_entries: 256, recv_entries: 256,
    senders: 16, inflight_records: 4096, regions: 64);
// The serve and host roles' storage (they never run together): clients
// come and go, up to SERVE_CONNECTIONS at once, each with the serve
// role's 16 posted receives and a few sends, control buffers plus a data
// region and a read-only page registered per slot.
metaroce_platform::static_endpoint_storage!(serve_storage, PATHS,
    connections: SERVE_CONNECTIONS as u32, work_entries: 4 * SERVE_CONNECTIONS as u32,
    recv_entries: 17 * SERVE_CONNECTIONS as u32, senders: SERVE_CONNECTIONS as u32,
    inflight_records: 16384, regions: 3 * SERVE_CONNECTIONS as u32 + 64);
/// Longest sleep, so the loop notices a missed wake-up quickly.
const MAX_SLEEP: Duration = Duration::from_millis(20);

static mut NET_BUFFERS: NetBuffers<NET_QUEUE> = NetBuffers::new();
static mut HOST_MEMORY: [u8; HOST_MEMORY_LEN] = [0; HOST_MEMORY_LEN];
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The statics that become DMA buffers and host memory; once.
fn take_statics() -> Option<(&'static mut NetBuffers<NET_QUEUE>, &'static mut [u8])> {
    if TAKEN.swap(true, Ordering::AcqRel) {
        return None;
    }
    // SAFETY: `TAKEN` guarantees these references are created once, so
    // they are the only references to the statics for the whole run.
    Some(unsafe {
        (
            &mut *addr_of_mut!(NET_BUFFERS),
            &mut *addr_of_mut!(HOST_MEMORY),
        )
    })
}

/// The emulated host memory (the bench role's).
pub(crate) fn host_memory() -> Option<&'static mut [u8]> {
    take_statics().map(|(_, memory)| memory)
}

/// Endpoint storage for the bench role's two endpoints.
pub(crate) fn bench_storage() -> Option<metaroce_core::storage::Storage<Borrowed<'static>, PATHS>> {
    workload_storage()
}

pub(crate) type LinkDevice = metaroce_platform::device::MemFrameDevice<'static, 128>;
pub(crate) type NodePort<'a> = NodeEnginePort<'a>;

pub(crate) fn link_device(d: LinkDevice) -> LinkDevice {
    d
}

#[inline(never)]
pub(crate) fn poll_link(
    engine: &mut Engine,
    now: Instant,
    endpoint: &mut NodeEndpoint,
    device: &mut LinkDevice,
    port: &mut NodeEnginePort<'_>,
    window: &mut HostWindow<'static>,
) -> PollOutcome {
    engine.poll(now, endpoint, device, port, window)
}

pub(crate) fn fail(msg: &str) -> ! {
    println!("METAROCE-ERROR {}", msg);
    defmt::error!("{=str}", msg);
    hw::exit(1)
}

pub fn main() -> ! {
    println!("metaroce qemu-virt firmware {}", env!("CARGO_PKG_VERSION"));
    let mut text = [0u8; 2048];
    let Some(len) = hw::fw_cfg_file("opt/metaroce/config", &mut text) else {
        fail("no fw_cfg file opt/metaroce/config (run through metaroce-qemu)")
    };
    let Ok(text) = core::str::from_utf8(&text[..len]) else {
        fail("configuration is not UTF-8")
    };
    let cfg = match NodeConfig::parse(text.trim_end_matches('\0')) {
        Ok(cfg) => cfg,
        Err(e) => {
            println!("METAROCE-ERROR bad configuration key `{}`", e.key);
            hw::exit(1)
        }
    };
    if cfg.role == Role::Bench {
        crate::bench::run()
    }
    defmt::info!("node {=u8} up, transport {}", cfg.node, cfg.transport);
    let mut irq = hw::Interrupts::new();
    let Some((transport, slot)) = hw::find_virtio_net() else {
        fail("no virtio-net device")
    };
    let Some((bufs, host_memory)) = take_statics() else {
        fail("statics taken twice")
    };
    let mut net: NetDevice = match VirtioNetDevice::new(transport, bufs) {
        Ok(net) => net,
        Err(_) => fail("virtio-net initialisation failed"),
    };
    irq.enable_virtio(slot);
    net.enable_interrupts();
    if net.mac_address() != cfg.mac {
        defmt::warn!("device MAC differs from the configured one");
    }
    if cfg.cores > 1 {
        crate::multicore::run(&cfg, net, irq, host_memory)
    }
    let mut engine = Engine::new(NetConfig {
        mac: EthernetAddress(cfg.mac),
        ip: cfg.ip,
    });
    if let Some(gateway) = cfg.gateway {
        engine.add_static_neighbor(gateway.ip, EthernetAddress(gateway.mac));
    }
    let window = HostWindow::new(HOST_BASE, host_memory);
    let seed = metaroce_core::rng::seed_from_u64(
        cfg.seed ^ (u64::from(cfg.node) << 32) ^ hw::now().as_nanos(),
    );
    match cfg.transport {
        TransportKind::MetaRoce if cfg.role == Role::Host => {
            let shm = match crate::pci::ivshmem_memory() {
                Ok(shm) => shm,
                Err(e) => {
                    println!("METAROCE-ERROR host interface memory: {:?}", e);
                    hw::exit(1)
                }
            };
            let config = Config {
                udp_port: cfg.port,
                paths: cfg.paths,
                accept_incoming: true,
                // Each host accepts a connection into its own domain.
                accept_domain: metaroce_core::config::AcceptDomain::PerConnection,
                mtu: 1024,
                ..Config::for_emulation()
            };
            // The host role and the serve role never run together: they
            // share the serve role's storage.
            let Some(storage) = serve_storage() else {
                fail("endpoint storage taken twice")
            };
            let mut endpoint = NodeEndpoint::new(config, storage, seed);
            crate::hostif::run(&cfg, &mut endpoint, engine, net, &mut irq, shm, |n| {
                n.ack_interrupt()
            })
        }
        TransportKind::MetaRoce if cfg.role == Role::Serve => {
            let config = Config {
                udp_port: cfg.port,
                paths: cfg.paths,
                accept_incoming: true,
                mtu: 1024,
                ..Config::for_emulation()
            };
            let Some(storage) = serve_storage() else {
                fail("endpoint storage taken twice")
            };
            let mut endpoint = NodeEndpoint::new(config, storage, seed);
            serve(&cfg, &mut endpoint, engine, net, irq, window, seed)
        }
        TransportKind::MetaRoce => {
            let config = Config {
                udp_port: cfg.port,
                paths: cfg.paths,
                // Payload per packet that fits a 1514-byte frame.
                mtu: 1024,
                ..Config::for_emulation()
            };
            let Some(storage) = workload_storage() else {
                fail("endpoint storage taken twice")
            };
            let mut endpoint = NodeEndpoint::new(config, storage, seed);
            run(&cfg, &mut endpoint, engine, net, irq, window)
        }
        TransportKind::Datagram => {
            let peers: heapless::Vec<_, MAX_PEERS> = (0..cfg.peers.len())
                .filter_map(|i| workload::peer_addr(&cfg, i))
                .collect();
            let mut datagram = DatagramTransport::<MAX_PEERS>::new(cfg.port, &peers);
            run(&cfg, &mut datagram, engine, net, irq, window)
        }
    }
}

/// What differs per transport around the rings: connection setup and
/// counters.
trait NodeTransport: Transport {
    fn open(&mut self, now: Instant, cfg: &NodeConfig, peer_index: usize) -> Option<ConnHandle>;
    fn poll_accepted(&mut self, cfg: &NodeConfig, accepted_so_far: &mut u8) -> Option<ConnHandle>;
    fn counters(&self, now: Instant) -> Counters;
}

impl NodeTransport for NodeEndpoint {
    fn open(&mut self, now: Instant, cfg: &NodeConfig, peer_index: usize) -> Option<ConnHandle> {
        self.connect(now, workload::peer_addr(cfg, peer_index)?, 0)
            .ok()
    }

    fn poll_accepted(&mut self, _cfg: &NodeConfig, _accepted: &mut u8) -> Option<ConnHandle> {
        while let Some(event) = self.poll_event() {
            match event {
                Event::Incoming { conn, .. } => return Some(conn),
                Event::Connected(h) => defmt::info!("connection {=u32} up", h.index),
                Event::Closed { conn, .. } => defmt::info!("connection {=u32} closed", conn.index),
                Event::Failed { conn, status } => {
                    defmt::warn!("connection {=u32} failed: {}", conn.index, status)
                }
            }
        }
        None
    }

    fn counters(&self, _now: Instant) -> Counters {
        let mut c = Counters {
            rate_hint_mbps: self.last_rate_hint(),
            ..Counters::default()
        };
        for h in self.handles() {
            if let Some(s) = self.stats(h) {
                c.retransmits += s.retransmissions;
                c.timeouts += s.timeouts;
            }
        }
        c
    }
}

impl NodeTransport for DatagramTransport<MAX_PEERS> {
    fn open(&mut self, _now: Instant, _cfg: &NodeConfig, peer_index: usize) -> Option<ConnHandle> {
        Some(ConnHandle {
            index: u32::try_from(peer_index).ok()?,
            generation: 0,
        })
    }

    /// Connections are static: peer `i` is handle index `i`; the senders
    /// are the first `expect` peers.
    fn poll_accepted(&mut self, cfg: &NodeConfig, accepted: &mut u8) -> Option<ConnHandle> {
        if *accepted >= cfg.expect {
            return None;
        }
        let h = ConnHandle {
            index: u32::from(*accepted),
            generation: 0,
        };
        *accepted += 1;
        Some(h)
    }

    fn counters(&self, _now: Instant) -> Counters {
        Counters::default()
    }
}

/// The workload's view of the node.
struct Services<'a, T: NodeTransport> {
    cfg: &'a NodeConfig,
    transport: &'a mut T,
    engine: &'a mut Engine,
    net: &'a mut NetDevice,
    accepted: u8,
}

impl<T: NodeTransport> NodeServices for Services<'_, T> {
    fn open(&mut self, now: Instant, peer_index: usize) -> Option<ConnHandle> {
        self.transport.open(now, self.cfg, peer_index)
    }

    fn poll_accepted(&mut self) -> Option<ConnHandle> {
        self.transport.poll_accepted(self.cfg, &mut self.accepted)
    }

    fn ping(&mut self, now: Instant, peer_index: usize, seq: u16) {
        if let Some(peer) = self.cfg.peers.get(peer_index) {
            let _ = self.engine.send_ping(self.net, peer.ip, seq, now);
        }
    }

    fn last_echo(&self) -> Option<(u16, u64)> {
        self.engine.last_echo().map(|e| (e.seq_no, e.rtt_nanos))
    }

    fn counters(&self, now: Instant) -> Counters {
        let stats = self.engine.stats();
        Counters {
            ce: stats.rx_ce,
            tx_frames: stats.tx_frames,
            rx_frames: stats.rx_frames,
            ..self.transport.counters(now)
        }
    }
}

fn run<T: NodeTransport>(
    cfg: &NodeConfig,
    transport: &mut T,
    mut engine: Engine,
    mut net: NetDevice,
    mut irq: hw::Interrupts,
    mut window: HostWindow<'static>,
) -> ! {
    let queues: HostQueues<64, 64, 128, 4> = HostQueues::new();
    let Some((host, mut port)) = queues.split() else {
        fail("host queues split twice")
    };
    let Some(mut workload) = Workload::new(cfg, host, hw::now(), HOST_MEMORY_LEN) else {
        fail("size x count does not fit the emulated host memory")
    };
    let mut accepted = 0u8;
    loop {
        let now = hw::now();
        let polled = poll_engine(
            &mut engine,
            now,
            transport,
            &mut net,
            &mut port,
            &mut window,
        );
        let mut services = Services {
            cfg,
            transport: &mut *transport,
            engine: &mut engine,
            net: &mut net,
            accepted,
        };
        let outcome = workload.step(now, &mut window, &mut services);
        accepted = services.accepted;
        if let Some(report) = outcome {
            let stats = engine.stats();
            defmt::info!("engine: {}", stats);
            report.print_result();
            hw::exit(match report.outcome() {
                Outcome::Ok => 0,
                Outcome::Failed => 1,
            });
        }
        idle(
            &mut irq,
            &mut net,
            now,
            polled,
            port.has_work(),
            workload.next_wake(),
        );
    }
}

/// The host queues of every role.
type NodeEnginePort<'a> = EnginePort<'a, 64, 64, 128, 4>;

/// One round of the engine loop, kept out of line so the workload and serve
/// roles share one copy of it per transport: inlined into both, the loop
/// (the firmware's largest code) was there twice.
#[inline(never)]
fn poll_engine<T: Transport>(
    engine: &mut Engine,
    now: Instant,
    transport: &mut T,
    net: &mut NetDevice,
    port: &mut NodeEnginePort<'_>,
    window: &mut HostWindow<'static>,
) -> PollOutcome {
    engine.poll(now, transport, net, port, window)
}

/// Sleeps, unless the loop was busy or the host has work queued, until the
/// earliest of the task's next wake-up, the transport's next deadline and
/// `MAX_SLEEP` (a frame's interrupt ends it early).
fn idle(
    irq: &mut hw::Interrupts,
    net: &mut NetDevice,
    now: Instant,
    polled: PollOutcome,
    host_work: bool,
    task_wake: Instant,
) {
    if polled.busy || host_work {
        return;
    }
    let mut deadline = task_wake.min(now + MAX_SLEEP);
    if let Some(t) = polled.next_timeout {
        deadline = deadline.min(t);
    }
    if deadline > hw::now() {
        irq.wait(deadline, || net.ack_interrupt());
    }
}

/// The serve role's view of the node: connection events and releases.
struct ServeServices<'a> {
    endpoint: &'a mut NodeEndpoint,
}

impl ServeNode for ServeServices<'_> {
    fn poll_event(&mut self) -> Option<Event> {
        self.endpoint.poll_event()
    }

    fn release(&mut self, h: ConnHandle) -> Result<(), CommandError> {
        self.endpoint.release(h)
    }

    fn set_pd(&mut self, h: ConnHandle, pd: u32) -> Result<(), CommandError> {
        self.endpoint.set_pd(h, pd)
    }

    fn close_with(&mut self, h: ConnHandle, reason: CloseReason) -> Result<(), CommandError> {
        self.endpoint.close_with(hw::now(), h, reason)
    }
}

/// The serve role's loop: the engine loop and the serve task, until the
/// harness stops QEMU.
fn serve(
    cfg: &NodeConfig,
    endpoint: &mut NodeEndpoint,
    mut engine: Engine,
    mut net: NetDevice,
    mut irq: hw::Interrupts,
    mut window: HostWindow<'static>,
    seed: [u8; 32],
) -> ! {
    let queues: HostQueues<64, 64, 128, 4> = HostQueues::new();
    let Some((host, mut port)) = queues.split() else {
        fail("host queues split twice")
    };
    let mut task = Serve::new(cfg, host, hw::now(), seed);
    let mut next_stats = hw::now();
    loop {
        let now = hw::now();
        if now >= next_stats {
            next_stats = now + Duration::from_secs(5);
            defmt::info!("engine: {}", engine.stats());
            defmt::info!("endpoint drops: {}", endpoint.drops());
        }
        let polled = poll_engine(
            &mut engine,
            now,
            &mut *endpoint,
            &mut net,
            &mut port,
            &mut window,
        );
        task.step(
            now,
            &mut window,
            &mut ServeServices {
                endpoint: &mut *endpoint,
            },
        );
        // What the task just posted (a new connection's receives) goes to
        // the transport first in the next poll, before any received frame
        // (the engine loop takes host work before RX), so a client's first
        // SEND right after the ACCEPT finds its receive posted.
        idle(
            &mut irq,
            &mut net,
            now,
            polled,
            port.has_work(),
            task.next_wake(),
        );
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // No defmt here: the panic may have come from inside the logger.
    println!("METAROCE-PANIC {}", info);
    hw::exit(101)
}
