//! The node: hardware bring-up, the role chosen by the configuration (the
//! workload role on one or more cores is `multicore`'s, the host role
//! `hostif`'s), and the serve role's loop, which alternates the engine
//! loop and the serve task and sleeps (`wfi`) when neither has work.

use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;

use metaroce_core::api::ConnHandle;
use metaroce_core::wire::CloseReason;
use metaroce_core::{CommandError, Config, Event, Instant};
use metaroce_platform::dma::HostWindow;
use metaroce_platform::entropy::EntropyError;
use metaroce_platform::net::NetConfig;
use metaroce_platform::{Engine, PollOutcome};
use smoltcp::wire::EthernetAddress;

use crate::config::{NodeConfig, Role};
use crate::engine::{self, NetDevice, NodeDevice, NodeEndpoint, NodeMemory, NodeQueues, PATHS};
use crate::hw::{self, ThisBoard};
use crate::println;
use crate::serve::{Serve, ServeNode, SERVE_CONNECTIONS};
use crate::workload::{HOST_BASE, HOST_MEMORY_LEN};
use metaroce_board::{Board, Interrupts as _};

// The serve and host roles' storage (they never run together), sized by
// the board (`Board::ENDPOINT`): clients come and go, up to
// SERVE_CONNECTIONS at once. (The workload role's is in `multicore`, one
// share per core.)
const CAPS: metaroce_board::Capacities = ThisBoard::ENDPOINT;
const _: () = assert!(
    CAPS.paths == PATHS,
    "the board's endpoint paths differ from the node's"
);
metaroce_platform::static_endpoint_storage!(serve_storage, PATHS,
    connections: CAPS.connections, work_entries: CAPS.work_entries,
    recv_entries: CAPS.recv_entries, senders: CAPS.senders,
    inflight_records: CAPS.inflight_records, regions: CAPS.regions);
/// Longest sleep, so the loop notices a missed wake-up quickly.
const MAX_SLEEP: Duration = Duration::from_millis(20);

static mut NET_BUFFERS: hw::NetBuffers = ThisBoard::NET_BUFFERS;
/// The host memory of a board that emulates it (none elsewhere).
static mut HOST_MEMORY: [u8; EMULATED_HOST_MEMORY] = [0; EMULATED_HOST_MEMORY];
const EMULATED_HOST_MEMORY: usize = if ThisBoard::HOST_MEMORY_IN_IMAGE {
    HOST_MEMORY_LEN
} else {
    0
};
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The statics that become DMA buffers and host memory; once.
fn take_statics() -> Option<(&'static mut hw::NetBuffers, &'static mut [u8])> {
    if TAKEN.swap(true, Ordering::AcqRel) {
        return None;
    }
    if !ThisBoard::HOST_MEMORY_IN_IMAGE {
        // SAFETY: `TAKEN` guarantees this reference is created once, so it
        // is the only reference to the static for the whole run.
        let buffers = unsafe { &mut *addr_of_mut!(NET_BUFFERS) };
        return Some((buffers, ThisBoard::host_memory()?));
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

/// A role's engine loop at this node's addresses, reseeding its endpoint
/// from the board's entropy source, with `peers` and the gateway as
/// static neighbours (no ARP round trip before the first packets): one
/// copy of the set-up for every role and core.
#[inline(never)]
pub(crate) fn new_engine(cfg: &NodeConfig, peers: &[crate::config::Peer]) -> Engine {
    let mut engine = Engine::new(NetConfig {
        mac: EthernetAddress(cfg.mac),
        ip: cfg.ip,
    });
    engine.set_entropy_source(hw::entropy);
    for peer in peers.iter().chain(cfg.gateway.as_ref()) {
        engine.add_static_neighbor(peer.ip, EthernetAddress(peer.mac));
    }
    engine
}

/// What every role's endpoint is configured with: the node's port and
/// paths, the emulation's timers, a 1,024-byte MTU; one copy for every
/// role and core (a role adds its own).
pub(crate) fn endpoint_config(cfg: &NodeConfig) -> Config {
    Config {
        udp_port: cfg.port,
        paths: cfg.paths,
        mtu: 1024,
        ..Config::for_emulation()
    }
}

/// Fresh host queues between a role's task (or the host interface) and
/// its engine: one copy of their initialisation for every role.
#[inline(never)]
pub(crate) fn host_queues() -> NodeQueues {
    NodeQueues::new()
}

pub(crate) fn fail(msg: &str) -> ! {
    // On the console only: a defmt copy of the same text costs code.
    println!("METAROCE-ERROR {}", msg);
    hw::exit(1)
}

/// 32 fresh bytes from the board's entropy source for a generator that
/// keeps secrets (an endpoint's, the serve task's); the node stops with a
/// `METAROCE-ERROR` line rather than run on a guessable seed.
pub(crate) fn secret_seed() -> [u8; 32] {
    match metaroce_platform::entropy::seed_from(hw::entropy) {
        Ok(seed) => seed,
        Err(EntropyError::Missing) => fail(ThisBoard::ENTROPY_MISSING),
        Err(EntropyError::Failed) => fail(ThisBoard::ENTROPY_FAILED),
        Err(EntropyError::Stuck) => fail(ThisBoard::ENTROPY_STUCK),
    }
}

pub fn main() -> ! {
    println!(
        "metaroce {} firmware {}",
        ThisBoard::NAME,
        env!("CARGO_PKG_VERSION")
    );
    let mut text = [0u8; 2048];
    let len = match ThisBoard::read_config(&mut text) {
        Ok(len) => len,
        Err(e) => fail(e),
    };
    // The file is padded with NULs: the configuration ends at the last
    // other byte.
    let len = text[..len]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |last| last + 1);
    let text = &text[..len];
    if !text.is_ascii() {
        fail("configuration is not ASCII")
    }
    // SAFETY: ASCII is valid UTF-8 (checked just above; a full UTF-8
    // validator is half a kilobyte of code for a line the harness writes
    // in ASCII).
    let text = unsafe { core::str::from_utf8_unchecked(text) };
    let cfg = match NodeConfig::parse(text) {
        Ok(cfg) => cfg,
        Err(e) => {
            println!("METAROCE-ERROR bad configuration key `{}`", e.key);
            hw::exit(1)
        }
    };
    let Some((bufs, host_memory)) = take_statics() else {
        fail("statics taken twice")
    };
    if cfg.role == Role::Bench {
        #[cfg(feature = "bench-role")]
        crate::bench::run(host_memory);
        #[cfg(not(feature = "bench-role"))]
        fail("this image has no bench role: `cargo xtask bench --firmware` builds one")
    }
    defmt::info!("node {=u8} up, role {}", cfg.node, cfg.role);
    // Secrets come from the board's entropy source or the node does not run.
    if hw::init_entropy().is_err() {
        fail(ThisBoard::ENTROPY_MISSING)
    }
    let mut irq = ThisBoard::interrupts();
    let net: NetDevice = match ThisBoard::open_net(&mut irq, bufs, cfg.mac) {
        Ok(net) => net,
        Err(e) => fail(e),
    };
    if cfg.role == Role::Workload {
        crate::multicore::run(&cfg, net, irq, host_memory)
    }
    // The host role's peers are reached without an ARP round trip.
    let peers: &[crate::config::Peer] = if cfg.role == Role::Host {
        &cfg.peers
    } else {
        &[]
    };
    let engine = new_engine(&cfg, peers);
    let window = HostWindow::new(HOST_BASE, host_memory);
    // The endpoint's secrets (tokens, ids, PSNs, keys) from the device;
    // `seed=` drives only the workload's data patterns.
    let seed = secret_seed();
    let config = Config {
        accept_incoming: true,
        // Each host accepts a connection into its own domain.
        accept_domain: if cfg.role == Role::Host {
            metaroce_core::config::AcceptDomain::PerConnection
        } else {
            Config::default().accept_domain
        },
        // Every CONNECT proves its address with a RETRY's cookie first
        // (spec 4.2); one source (the harness gateway, a client opening
        // the whole table) may hold the table.
        address_validation: metaroce_core::config::AddressValidation::Always,
        source_limits: metaroce_core::config::SourceLimits {
            connects_per_second: 4 * SERVE_CONNECTIONS as u32,
            half_open: SERVE_CONNECTIONS as u32,
        },
        ..endpoint_config(&cfg)
    };
    // The host role and the serve role never run together: they share
    // the serve role's storage.
    let Some(storage) = serve_storage() else {
        fail("endpoint storage taken twice")
    };
    let mut endpoint = NodeEndpoint::new(config, storage, seed);
    let device = NodeDevice::Net(net);
    if cfg.role == Role::Host {
        let shm = match ThisBoard::host_interface_memory() {
            Ok(shm) => shm,
            Err(e) => {
                defmt::error!("host interface memory: {}", e);
                fail("no host interface memory (ivshmem)")
            }
        };
        crate::hostif::run(&cfg, &mut endpoint, engine, device, &mut irq, shm)
    }
    serve(&cfg, &mut endpoint, engine, device, irq, window)
}

/// Sleeps, unless the loop was busy or the host has work queued, until the
/// earliest of the task's next wake-up, the transport's next deadline and
/// `MAX_SLEEP` (a frame's interrupt ends it early).
fn idle(
    irq: &mut hw::Interrupts,
    device: &mut NodeDevice,
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
        irq.wait(deadline, &mut || device.ack_interrupt());
    }
}

/// The serve role's view of the node: connection events and releases.
struct ServeServices<'a> {
    endpoint: &'a mut NodeEndpoint,
}

impl ServeNode for ServeServices<'_> {
    fn poll_event(&mut self) -> Option<Event> {
        engine::poll_event(self.endpoint)
    }

    fn release(&mut self, h: ConnHandle) -> Result<(), CommandError> {
        engine::release(self.endpoint, h)
    }

    fn set_pd(&mut self, h: ConnHandle, pd: u32) -> Result<(), CommandError> {
        self.endpoint.set_pd(h, pd)
    }

    fn close_with(&mut self, h: ConnHandle, reason: CloseReason) -> Result<(), CommandError> {
        engine::close_with(self.endpoint, hw::now(), h, reason)
    }
}

/// The serve role's loop: the engine loop and the serve task, until the
/// harness stops QEMU.
fn serve(
    cfg: &NodeConfig,
    endpoint: &mut NodeEndpoint,
    mut engine: Engine,
    mut device: NodeDevice,
    mut irq: hw::Interrupts,
    mut window: HostWindow<'static>,
) -> ! {
    let queues = host_queues();
    let Some((host, mut port)) = queues.split() else {
        fail("host queues split twice")
    };
    // The task's own generator (tickets), seeded apart from the endpoint's.
    let mut task = Serve::new(cfg, host, hw::now(), secret_seed());
    let mut next_stats = hw::now();
    loop {
        let now = hw::now();
        if now >= next_stats {
            next_stats = now + Duration::from_secs(5);
            defmt::info!("engine: {}", engine.stats());
            defmt::info!("endpoint drops: {}", endpoint.drops());
        }
        let polled = engine::poll(
            &mut engine,
            now,
            endpoint,
            &mut device,
            &mut port,
            NodeMemory::Window(&mut window),
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
            &mut device,
            now,
            polled,
            port.has_work(),
            task.next_wake(),
        );
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // No defmt here: the panic may have come from inside the logger. The
    // location, not the message: the line names the check, and formatting
    // messages links the formatting machinery of every payload type into
    // the 128 KiB image (184 B).
    match info.location() {
        Some(l) => println!("METAROCE-PANIC at {}:{}", l.file(), l.line()),
        None => println!("METAROCE-PANIC at an unknown location"),
    }
    hw::exit(101)
}
