//! The workload role on `cores=N` cores (QEMU `-smp N`): one engine loop
//! per core, each with its own MetaRoCE endpoint, host queues, host memory
//! and share of the workload, and core 0 steering frames between the one
//! virtio-net device and the cores. With one core (`Single`) the same loop
//! drives the virtio-net device itself and its report is the node's.
//!
//! ```text
//!            virtio-net (core 0 owns it)
//!                 |  ^
//!      Dispatcher::receive / transmit (core 0)
//!     /       |        |        \
//!  link 0   link 1   link 2   link 3     MemLink: an SPSC ring each way
//!    |        |        |        |
//!  engine   engine   engine   engine     Engine::poll, unchanged
//!  core 0   core 1   core 2   core 3
//! ```
//!
//! The node's connection table is split into one shard per core: core
//! `c` owns table slots `[c * s, (c + 1) * s)` and its endpoint
//! (`Endpoint::new_shard`) hands out connection ids whose index names its
//! slot, so the dispatcher finds a packet's core from its destination id
//! alone (`ShardMap`); an incoming CONNECT goes to the core chosen by the
//! hash of its source (`metaroce_platform::shard`) and the connection is
//! created there. A core that gets a packet for a connection it does not
//! have counts it (`misrouted`). Nothing is shared on the data path but the rings;
//! the workload's bookkeeping across cores (incoming connections accepted
//! node-wide, each core's report) and each core's count of active senders
//! (for the node-wide fair share) go through the critical section and
//! atomics.
//!
//! Each core prints a `METAROCE-CORE` line when its task is done; core 0
//! waits for all, then prints which connection ids each core owns
//! (`METAROCE-OWNERS`), the dispatcher's counters and cost
//! (`METAROCE-DISPATCH`) and the node's `METAROCE-RESULT`, and exits.

use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use core::time::Duration;

use critical_section::Mutex;
use metaroce_core::api::ConnHandle;
use metaroce_core::{Event, Instant, Shard};
use metaroce_platform::device::MemLink;
use metaroce_platform::dma::HostWindow;
use metaroce_platform::shard::{Dispatcher, Round, ShardMap};
use metaroce_platform::Engine;

use crate::config::NodeConfig;
use crate::engine::{
    self, LinkDevice, NetDevice, NodeDevice, NodeDispatcher, NodeEndpoint, NodeMemory, NodeStorage,
    LINK_SLOTS, PATHS,
};
use crate::hw;
use crate::hw::{ThisBoard, MAX_CORES};
use crate::node::fail;
use crate::println;
use crate::report::{Counters, Report};
use crate::workload::{self, NodeServices, Workload, HOST_BASE, MAX_SLOTS};
use metaroce_board::{Board, DelayNs as _};
use metaroce_board::{CoreInterrupts as _, Interrupts as _};

/// Table slots per core: its outgoing connections (`streams`, at most
/// `MAX_STREAMS`) plus as many incoming ones as its workload task can
/// take (`MAX_SLOTS`: the connect hash may hand one core every incoming
/// connection of its node).
const SLOTS_PER_CORE: u32 = 64;
const _: () = assert!(SLOTS_PER_CORE as usize >= MAX_SLOTS + crate::config::MAX_STREAMS);

// The workload role's connection table and pools, cut into one share per
// core at boot: per core its table slots, and pools for every stream's
// `depth` sends and every slot's receives.
metaroce_platform::static_endpoint_storage!(node_storage, PATHS,
    connections: SLOTS_PER_CORE * MAX_CORES as u32, work_entries: 256 * MAX_CORES as u32,
    recv_entries: 512 * MAX_CORES as u32, senders: SLOTS_PER_CORE * MAX_CORES as u32,
    inflight_records: 4096 * MAX_CORES as u32, regions: 64 * MAX_CORES as u32);

/// The workload role's endpoint storage, one equal share per possible
/// core (cores that do not run leave theirs unused); once.
pub fn core_storage() -> Option<heapless::Vec<NodeStorage, MAX_CORES>> {
    Some(node_storage()?.into_shares::<MAX_CORES>(MAX_CORES))
}

/// Frames the dispatcher moves per direction and round: no more than one
/// engine poll takes from its ring (`Budget::rx_frames`), so core 0, which
/// both fills its own ring and drains it, does not overrun it.
const DISPATCH_BUDGET: u32 = 32;
/// Longest sleep, so the loop notices a missed wake-up quickly.
const MAX_SLEEP: Duration = Duration::from_millis(20);

static LINKS: [MemLink<LINK_SLOTS>; MAX_CORES] = [const { MemLink::new() }; MAX_CORES];
/// Each core's report, once its task is done.
static REPORTS: Mutex<Cell<[Option<Report>; MAX_CORES]>> = Mutex::new(Cell::new([None; MAX_CORES]));
/// Incoming connections accepted by any core of this node.
static ACCEPTED: AtomicU32 = AtomicU32::new(0);
/// Each core's active senders, so every core's fair-share hint divides the
/// node's link among all of them.
static SENDERS: [AtomicU32; MAX_CORES] = [const { AtomicU32::new(0) }; MAX_CORES];

/// Runs the workload role on `cfg.cores` cores: with one, its engine
/// drives the virtio-net device itself; with more, core 0 starts the
/// others and dispatches frames between the device and every core's
/// rings. Never returns (the node exits once every core reported).
pub fn run(
    cfg: &NodeConfig,
    net: NetDevice,
    mut irq: hw::Interrupts,
    host_memory: &'static mut [u8],
) -> ! {
    let cores = usize::from(cfg.cores);
    // Every stream of every core of every sender node opens one
    // connection to this node (the harness gives every node the same
    // core and stream counts).
    let expected_incoming = u32::from(cfg.expect) * u32::from(cfg.cores) * u32::from(cfg.streams);
    let Some(storage) = core_storage() else {
        fail("endpoint storage taken twice")
    };
    let mut shares = storage.into_iter();
    let table_slots = SLOTS_PER_CORE * cores as u32;
    if cores == 1 {
        let Some(share) = shares.next() else {
            fail("no storage share")
        };
        let shard = Shard::nth(0, 1, table_slots);
        let mut role = Single { irq };
        shard_loop(
            &core_config(cfg, 0),
            expected_incoming,
            NodeDevice::Net(net),
            host_memory,
            (share, shard),
            &mut role,
        )
    }
    if ThisBoard::NIC_STEERS {
        steered(cfg, expected_incoming, net, irq, host_memory, shares)
    }
    irq.enable_wake();
    // Each core gets its own slice of host memory, seen at HOST_BASE by
    // its own engine, as separate host processes would.
    let per_core = (host_memory.len() / cores) & !0xfff;
    let mut rest = host_memory;
    let mut rings: heapless::Vec<LinkDevice, MAX_CORES> = heapless::Vec::new();
    let mut own = None;
    for (core, link) in LINKS.iter().enumerate().take(cores) {
        let (memory, tail) = core::mem::take(&mut rest).split_at_mut(per_core);
        rest = tail;
        let Some((core_end, dispatch_end)) = link.ends() else {
            fail("core link split twice")
        };
        if rings.push(dispatch_end).is_err() {
            fail("too many cores");
        }
        let core_cfg = core_config(cfg, core);
        let Some(share) = shares.next() else {
            fail("no storage share for a core")
        };
        let shard = Shard::nth(core as u32, cores as u32, table_slots);
        if core == 0 {
            own = Some((core_cfg, core_end, memory, share, shard));
            continue;
        }
        let started = hw::start_secondary(core, move || {
            let mut role = Secondary {
                irq: <hw::CoreInterrupts as metaroce_board::CoreInterrupts>::new(),
            };
            shard_loop(
                &core_cfg,
                expected_incoming,
                NodeDevice::Link(core_end),
                memory,
                (share, shard),
                &mut role,
            )
        });
        match started {
            Ok(()) => defmt::info!("core {=usize} started", core),
            Err(e) => {
                defmt::error!("core {=usize} did not start: {}", core, e);
                fail("a secondary core did not start (is QEMU's -smp at least cores?)")
            }
        }
    }
    let Some((core_cfg, core_end, memory, share, shard)) = own else {
        fail("no core 0")
    };
    let Some(map) = ShardMap::for_table(Shard::index_bits(table_slots), table_slots, cores) else {
        fail("the connection table does not split between the cores")
    };
    let mut role = Dispatching {
        cores,
        dispatcher: Dispatcher::new(map, cores, cfg.port),
        net,
        irq,
        rings,
        ticks: 0,
        timed_frames: 0,
        node: cfg.node,
    };
    shard_loop(
        &core_cfg,
        expected_incoming,
        NodeDevice::Link(core_end),
        memory,
        (share, shard),
        &mut role,
    )
}

/// The workload role on a board whose NIC side steers every frame to the
/// rings of the core owning its connection (`Board::NIC_STEERS`, the
/// Elba): every core opens its own frame device and runs its shard; core
/// 0 dispatches nothing, merges the reports and ends the node.
fn steered(
    cfg: &NodeConfig,
    expected_incoming: u32,
    net: NetDevice,
    irq: hw::Interrupts,
    host_memory: &'static mut [u8],
    mut shares: impl Iterator<Item = NodeStorage>,
) -> ! {
    let cores = usize::from(cfg.cores);
    let table_slots = SLOTS_PER_CORE * cores as u32;
    let per_core = (host_memory.len() / cores) & !0xfff;
    let (own_memory, mut rest) = host_memory.split_at_mut(per_core);
    for (core, up) in UP.iter().enumerate().take(cores).skip(1) {
        let (memory, tail) = core::mem::take(&mut rest).split_at_mut(per_core);
        rest = tail;
        let core_cfg = core_config(cfg, core);
        let Some(share) = shares.next() else {
            fail("no storage share for a core")
        };
        let shard = Shard::nth(core as u32, cores as u32, table_slots);
        let started = hw::start_secondary(core, move || {
            let mut role = Secondary {
                irq: <hw::CoreInterrupts as metaroce_board::CoreInterrupts>::new(),
            };
            let device = match ThisBoard::open_core_net(core) {
                Ok(net) => NodeDevice::Net(net),
                Err(e) => fail(e),
            };
            // Its rings are formatted: the NIC side may feed them.
            up.store(true, Ordering::Release);
            shard_loop(
                &core_cfg,
                expected_incoming,
                device,
                memory,
                (share, shard),
                &mut role,
            )
        });
        match started {
            Ok(()) => defmt::info!("core {=usize} started", core),
            Err(e) => {
                defmt::error!("core {=usize} did not start: {}", core, e);
                fail("a secondary core did not start")
            }
        }
    }
    // Bring-up wait: every started core has its rings formatted within
    // CORE_UP_TIMEOUT, or the node stops saying so (rather than run with
    // a core the NIC side would feed in vain).
    let mut delay = ThisBoard::delay();
    let mut waited_us = 0;
    while !UP[1..cores].iter().all(|up| up.load(Ordering::Acquire)) {
        if waited_us >= CORE_UP_TIMEOUT_US {
            fail("a secondary core started but did not come up")
        }
        delay.delay_us(100);
        waited_us += 100;
    }
    let Some(share) = shares.next() else {
        fail("no storage share")
    };
    let mut role = Collecting {
        cores,
        irq,
        node: cfg.node,
    };
    shard_loop(
        &core_config(cfg, 0),
        expected_incoming,
        NodeDevice::Net(net),
        own_memory,
        (share, Shard::nth(0, cores as u32, table_slots)),
        &mut role,
    )
}

/// Each secondary core of a steered node has formatted its rings.
static UP: [AtomicBool; MAX_CORES] = [const { AtomicBool::new(false) }; MAX_CORES];
/// How long core 0 waits for that (emulated cores start slowly).
const CORE_UP_TIMEOUT_US: u32 = 10_000_000;

/// Core 0 of a node whose NIC steers: its own shard, then every core's
/// report merged into the node's.
struct Collecting {
    cores: usize,
    irq: hw::Interrupts,
    node: u8,
}

impl CoreRole for Collecting {
    fn service(&mut self, _receive: bool) -> bool {
        let reports = critical_section::with(|cs| REPORTS.borrow(cs).get());
        if reports[..self.cores].iter().all(Option::is_some) {
            let mut reported = reports[..self.cores].iter().flatten();
            let Some(mut node) = reported.next().copied() else {
                fail("no core reported")
            };
            for report in reported {
                node.merge(report);
            }
            println!("METAROCE-STEERED node={} cores={}", self.node, self.cores);
            node.print_result();
            hw::exit(if node.ok { 0 } else { 1 })
        }
        false
    }

    fn transmitted(&mut self) {}

    fn pending(&self) -> bool {
        false
    }

    fn wait(&mut self, deadline: Instant, device: &mut NodeDevice) {
        self.irq.wait(deadline, &mut || device.ack_interrupt());
    }

    fn done(&mut self, core: usize, report: Report) {
        publish(core, report);
    }
}

/// Core `core`'s copy of the node configuration: as many receive slots
/// as the node's senders could open to it (the hash may put any of them
/// on any core).
fn core_config(cfg: &NodeConfig, core: usize) -> NodeConfig {
    let mut c = cfg.clone();
    c.core = core as u8;
    let incoming = usize::from(cfg.expect) * usize::from(cfg.cores) * usize::from(cfg.streams);
    c.expect = incoming.min(MAX_SLOTS) as u8;
    c
}

/// What a core does besides its own shard. Taken as `dyn`: a few calls
/// per loop, and one copy of the loop for every kind of core.
trait CoreRole {
    /// Work outside the shard (core 0: moving frames between the device
    /// and the rings; received frames only when `receive`, so that core 0
    /// feeds its own ring no faster than its engine drains it); whether
    /// anything moved.
    fn service(&mut self, receive: bool) -> bool;
    /// The shard queued frames to send.
    fn transmitted(&mut self);
    /// Whether work waits that `service` would take (checked before sleeping).
    fn pending(&self) -> bool;
    /// Sleeps until `deadline` or an interrupt (`device`'s, for the one
    /// core that drives the device itself).
    fn wait(&mut self, deadline: Instant, device: &mut NodeDevice);
    /// This core's task is done: `report`.
    fn done(&mut self, core: usize, report: Report);
}

/// The only core: its engine drives the device; its report is the node's.
struct Single {
    irq: hw::Interrupts,
}

impl CoreRole for Single {
    fn service(&mut self, _receive: bool) -> bool {
        false
    }

    fn transmitted(&mut self) {}

    fn pending(&self) -> bool {
        false
    }

    fn wait(&mut self, deadline: Instant, device: &mut NodeDevice) {
        self.irq.wait(deadline, &mut || device.ack_interrupt());
    }

    fn done(&mut self, _core: usize, report: Report) {
        report.print_result();
        hw::exit(if report.ok { 0 } else { 1 })
    }
}

/// One core of several: its `METAROCE-CORE` line, and its report for
/// core 0 to merge.
fn publish(core: usize, report: Report) {
    report.print_core(core);
    critical_section::with(|cs| {
        let reports: &Cell<[Option<Report>]> = REPORTS.borrow(cs);
        reports.as_slice_of_cells()[core].set(Some(report));
    });
}

/// Core 0: the device, the dispatcher and the node's result.
struct Dispatching {
    cores: usize,
    dispatcher: NodeDispatcher,
    net: NetDevice,
    irq: hw::Interrupts,
    rings: heapless::Vec<LinkDevice, MAX_CORES>,
    /// Counter ticks spent in dispatcher rounds that moved frames, and
    /// the frames they moved: the dispatch cost.
    ticks: u64,
    timed_frames: u64,
    node: u8,
}

impl CoreRole for Dispatching {
    fn service(&mut self, receive: bool) -> bool {
        let start = hw::counter();
        let rx = if receive {
            engine::dispatch_receive(
                &mut self.dispatcher,
                &mut self.net,
                &mut self.rings,
                DISPATCH_BUDGET,
            )
        } else {
            Round::default()
        };
        let tx = engine::dispatch_transmit(
            &mut self.dispatcher,
            &mut self.net,
            &mut self.rings,
            DISPATCH_BUDGET,
        );
        let moved = rx.frames + tx.frames;
        if moved > 0 {
            self.ticks += hw::counter().wrapping_sub(start);
            self.timed_frames += u64::from(moved);
        }
        for core in 1..self.cores {
            if rx.cores_fed & (1 << core) != 0 {
                hw::wake(core);
            }
        }
        if moved > 0 {
            return true;
        }
        let reported = critical_section::with(|cs| {
            let reports: &Cell<[Option<Report>]> = REPORTS.borrow(cs);
            reports.as_slice_of_cells()[..self.cores]
                .iter()
                .all(|r| r.get().is_some())
        });
        if reported {
            self.finish();
        }
        false
    }

    fn transmitted(&mut self) {}

    fn pending(&self) -> bool {
        self.rings.iter().any(|r| r.rx_pending() > 0)
    }

    fn wait(&mut self, deadline: Instant, _device: &mut NodeDevice) {
        let net = &mut self.net;
        self.irq.wait(deadline, &mut || ThisBoard::ack_net(net));
    }

    fn done(&mut self, core: usize, report: Report) {
        publish(core, report);
    }
}

impl Dispatching {
    /// Every core reported: the node's lines, then exit.
    fn finish(&mut self) -> ! {
        let reports = critical_section::with(|cs| REPORTS.borrow(cs).get());
        let mut reported = reports[..self.cores].iter().flatten();
        let Some(mut node) = reported.next().copied() else {
            fail("no core reported")
        };
        for report in reported {
            node.merge(report);
        }
        for core in 0..self.cores {
            println!(
                "METAROCE-OWNERS node={} core={} delivered={}",
                self.node,
                core,
                self.dispatcher.delivered(core),
            );
        }
        let s = self.dispatcher.stats();
        let ns_per_frame = metaroce_platform::clock::ticks_to_instant(self.ticks, hw::timer_hz())
            .as_nanos()
            / self.timed_frames.max(1);
        println!(
            "METAROCE-DISPATCH node={} cores={} rx_frames={} tx_frames={} by_conn={} connects={} replies={} control={} unroutable={} ring_full={} ns_per_frame={}",
            self.node,
            self.cores,
            s.rx_frames,
            s.tx_frames,
            s.by_conn,
            s.connects,
            s.replies,
            s.control,
            s.unroutable,
            s.ring_full,
            ns_per_frame
        );
        defmt::info!("dispatcher: {}", s);
        // The node's frames are the device's, not the sum of the rings'.
        node.counters.rx_frames = s.rx_frames;
        node.counters.tx_frames = s.tx_frames;
        node.print_result();
        hw::exit(if node.ok { 0 } else { 1 })
    }
}

/// Cores 1..N: only their shard, woken by core 0's SGI.
struct Secondary {
    irq: hw::CoreInterrupts,
}

impl CoreRole for Secondary {
    fn service(&mut self, _receive: bool) -> bool {
        false
    }

    fn transmitted(&mut self) {
        hw::wake(0);
    }

    fn pending(&self) -> bool {
        false
    }

    fn wait(&mut self, deadline: Instant, _device: &mut NodeDevice) {
        self.irq.wait(deadline);
    }

    fn done(&mut self, core: usize, report: Report) {
        publish(core, report);
        // Core 0 may be asleep waiting for the last report.
        hw::wake(0);
    }
}

/// One core's engine loop over its device, with its endpoint and
/// workload task; after the task reports, the engine keeps answering (a
/// peer's last retransmissions) until core 0 ends the node.
fn shard_loop(
    cfg: &NodeConfig,
    expected_incoming: u32,
    mut device: NodeDevice,
    memory: &'static mut [u8],
    (storage, shard): (NodeStorage, Shard),
    role: &mut dyn CoreRole,
) -> ! {
    let core = usize::from(cfg.core);
    // Every core sends to the configured peers without its own ARP round
    // trip (ARP replies reach every core too, but need not).
    let mut engine = crate::node::new_engine(cfg, &cfg.peers);
    let config = crate::node::endpoint_config(cfg);
    // Each core's endpoint has its own seed from the virtio-rng device and
    // reseeds from it (the device is shared under the critical section).
    let seed = crate::node::secret_seed();
    let mut endpoint = NodeEndpoint::new_shard(config, storage, seed, shard);
    let memory_len = memory.len();
    let mut window = HostWindow::new(HOST_BASE, memory);
    let queues = crate::node::host_queues();
    let Some((host, mut port)) = queues.split() else {
        fail("host queues split twice")
    };
    let Some(mut workload) = Workload::new(cfg, host, hw::now(), memory_len) else {
        fail("size x count does not fit a core's share of the emulated host memory")
    };
    defmt::info!(
        "core {=usize} up: {=usize} KiB host memory, expects {=u32} incoming node-wide",
        core,
        memory_len / 1024,
        expected_incoming
    );
    let mut reported = false;
    loop {
        let now = hw::now();
        let mut busy = role.service(true);
        let sent_before = engine.stats().tx_frames;
        // The node-wide fair share: this core's active senders out, the
        // other cores' in.
        let others: u32 = SENDERS
            .iter()
            .enumerate()
            .filter(|&(c, _)| c != core)
            .map(|(_, n)| n.load(Ordering::Relaxed))
            .sum();
        let senders = engine::active_senders(&mut endpoint, now, others);
        SENDERS[core].store(senders, Ordering::Relaxed);
        let polled = engine::poll(
            &mut engine,
            now,
            &mut endpoint,
            &mut device,
            &mut port,
            NodeMemory::Window(&mut window),
        );
        if !reported {
            let mut services = CoreServices {
                cfg,
                endpoint: &mut endpoint,
                engine: &mut engine,
                device: &mut device,
                expected_incoming,
            };
            if let Some(report) = workload.step(now, &mut window, &mut services) {
                defmt::info!("engine: {}", engine.stats());
                reported = true;
                role.done(core, report);
            }
        }
        if engine.stats().tx_frames != sent_before {
            role.transmitted();
        }
        busy |= role.service(false) | polled.busy | port.has_work();
        if busy {
            continue;
        }
        let mut deadline = now + MAX_SLEEP;
        if !reported {
            deadline = deadline.min(workload.next_wake());
        }
        if let Some(t) = polled.next_timeout {
            deadline = deadline.min(t);
        }
        if deadline > hw::now() {
            // The rings are checked after the core says it sleeps, so a
            // frame queued meanwhile either is seen or wakes it.
            let mut ctx = (&mut *role, &mut device);
            hw::sleep(
                &mut ctx,
                |(role, device)| device.rx_pending() > 0 || role.pending(),
                |(role, device)| role.wait(deadline, device),
            );
        }
    }
}

/// The workload's view of one core.
struct CoreServices<'a> {
    cfg: &'a NodeConfig,
    endpoint: &'a mut NodeEndpoint,
    engine: &'a mut Engine,
    device: &'a mut NodeDevice,
    expected_incoming: u32,
}

impl NodeServices for CoreServices<'_> {
    fn open(&mut self, now: Instant, peer_index: usize) -> Option<ConnHandle> {
        engine::connect(
            self.endpoint,
            now,
            workload::peer_addr(self.cfg, peer_index)?,
            0,
        )
        .ok()
    }

    fn poll_accepted(&mut self) -> Option<ConnHandle> {
        while let Some(event) = engine::poll_event(self.endpoint) {
            match event {
                Event::Incoming { conn, .. } => return Some(conn),
                Event::Connected(h) => defmt::debug!("connection {=u32} up", h.index),
                Event::Closed { conn, .. } => defmt::debug!("connection {=u32} closed", conn.index),
                Event::Failed { conn, status } => {
                    defmt::warn!("connection {=u32} failed: {}", conn.index, status)
                }
            }
        }
        None
    }

    fn ping(&mut self, now: Instant, peer_index: usize, seq: u16) {
        if let Some(peer) = self.cfg.peers.get(peer_index) {
            engine::ping(self.engine, self.device, peer.ip, seq, now);
        }
    }

    fn last_echo(&self) -> Option<(u16, u64)> {
        self.engine.last_echo().map(|e| (e.seq_no, e.rtt_nanos))
    }

    fn counters(&self, _now: Instant) -> Counters {
        let stats = self.engine.stats();
        let mut c = Counters {
            ce: stats.rx_ce,
            tx_frames: stats.tx_frames,
            rx_frames: stats.rx_frames,
            rx_packets: stats.rx_transport,
            tx_packets: stats.tx_transport,
            rate_hint_mbps: self.endpoint.last_rate_hint(),
            misrouted: self.endpoint.drops().unknown_connection,
            ..Counters::default()
        };
        for h in self.endpoint.handles() {
            c.conns += 1;
            if let Some(s) = self.endpoint.stats(h) {
                c.retransmits += s.retransmissions;
                c.timeouts += s.timeouts;
                c.max_in_flight = c.max_in_flight.max(s.max_in_flight);
            }
        }
        c
    }

    fn on_incoming_accepted(&mut self) {
        ACCEPTED.fetch_add(1, Ordering::Relaxed);
    }

    fn incoming_complete(&self) -> bool {
        ACCEPTED.load(Ordering::Relaxed) >= self.expected_incoming
    }
}
