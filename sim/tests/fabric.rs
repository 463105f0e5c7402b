//! The fabric on its own, driven by the scripted [`Probe`] transport:
//! serialisation at line rate, link failure, ECMP, ECN marking, drop-tail.

use std::time::Duration;

use metaroce_core::wire::encap::ecn;
use metaroce_core::Instant;
use metaroce_sim::link::LinkConfig;
use metaroce_sim::probe::{Probe, Send};
use metaroce_sim::queue::{EcnPolicy, QueueConfig};
use metaroce_sim::{LeafSpine, PfcConfig, SimConfig, Simulator, Topology};

fn probe_sim(t: &Topology) -> Simulator<Probe> {
    Simulator::new(t, SimConfig::default(), |_, _, _| Probe::default())
}

/// Gives host `from` packets to send and lets it start.
fn script(sim: &mut Simulator<Probe>, from: usize, sends: impl Iterator<Item = Send>) {
    sim.host_mut(from).transport.script.extend(sends);
    sim.poll_host(from);
}

fn send(sim: &Simulator<Probe>, to: usize, at_ns: u64, src_port: u16, len: usize) -> Send {
    Send {
        at: Instant::from_nanos(at_ns),
        to: sim.addr(to),
        src_port,
        len,
        ecn: ecn::ECT0,
    }
}

fn run_all(sim: &mut Simulator<Probe>) {
    let mut guard = 0;
    while sim.step().is_some() {
        guard += 1;
        assert!(guard < 10_000_000);
    }
}

#[test]
fn back_to_back_serialises_at_line_rate() {
    let mut sim = probe_sim(&Topology::back_to_back(LinkConfig::default()));
    let sends: Vec<Send> = (0..3).map(|_| send(&sim, 1, 0, 50_000, 4096)).collect();
    script(&mut sim, 0, sends.into_iter());
    run_all(&mut sim);
    let at: Vec<u64> = sim
        .host(1)
        .transport
        .received
        .iter()
        .map(|r| r.at.as_nanos())
        .collect();
    // Each frame: 4096 + 46 header + 20 preamble/gap bytes = 332.96 ns at
    // 100 Gbit/s; arrival = end of serialisation (rounded up to a ns) + 1 us.
    assert_eq!(at, [333 + 1_000, 666 + 1_000, 999 + 1_000]);
    let (ab, ba) = sim.link_stats(0);
    assert_eq!(
        (ab.tx_packets, ab.tx_bytes, ba.tx_packets),
        (3, 3 * 4142, 0)
    );
}

#[test]
fn failed_link_drops_in_flight_and_later_packets() {
    let link = LinkConfig {
        fail_at: Some(Instant::from_micros(10)),
        ..LinkConfig::default()
    };
    let mut sim = probe_sim(&Topology::back_to_back(link));
    let sends: Vec<Send> = (0..20)
        .map(|i| send(&sim, 1, i * 1_000, 50_000, 1024))
        .collect();
    script(&mut sim, 0, sends.into_iter());
    run_all(&mut sim);
    // Sent at 0..=8 us arrive before 10 us; the one sent at 9 us is on
    // the wire (arrives at 10.1 us) when the link fails.
    assert_eq!(sim.host(1).transport.received.len(), 9);
    let (ab, _) = sim.link_stats(0);
    assert_eq!((ab.tx_packets, ab.failed), (20, 11));
    assert_eq!(sim.stats().failed, 11);
}

#[test]
fn ecmp_spreads_source_ports_and_pins_one() {
    let spec = LeafSpine::default();
    let topo = Topology::leaf_spine(&spec);
    // Host 0 (leaf 0) to host 8 (leaf 1): 8 equal-cost uplinks.
    let leaf0 = spec.spines;
    let mut sim = probe_sim(&topo);
    assert_eq!(sim.route(leaf0, 8).len(), 8);
    assert_eq!(sim.route(leaf0, 1).len(), 1);
    let sends: Vec<Send> = (0..256u16)
        .map(|i| send(&sim, 8, u64::from(i) * 500, 49_152 + i, 256))
        .collect();
    script(&mut sim, 0, sends.into_iter());
    run_all(&mut sim);
    assert_eq!(sim.host(8).transport.received.len(), 256);
    let per_spine: Vec<u64> = (0..spec.spines)
        .map(|s| sim.link_stats(spec.fabric_link(0, s)).0.tx_packets)
        .collect();
    // 32 expected per uplink.
    assert!(
        per_spine.iter().all(|&n| (14..=50).contains(&n)),
        "{per_spine:?}"
    );
    assert_eq!(per_spine.iter().sum::<u64>(), 256);

    // One source port: every packet on the same uplink.
    let mut sim = probe_sim(&topo);
    let sends: Vec<Send> = (0..64)
        .map(|i| send(&sim, 8, i * 500, 50_001, 256))
        .collect();
    script(&mut sim, 0, sends.into_iter());
    run_all(&mut sim);
    let per_spine: Vec<u64> = (0..spec.spines)
        .map(|s| sim.link_stats(spec.fabric_link(0, s)).0.tx_packets)
        .collect();
    assert_eq!(
        per_spine.iter().filter(|&&n| n > 0).count(),
        1,
        "{per_spine:?}"
    );
    assert_eq!(per_spine.iter().sum::<u64>(), 64);
}

fn incast(queue: QueueConfig) -> Simulator<Probe> {
    incast_with(queue, None)
}

fn incast_with(queue: QueueConfig, pfc: Option<PfcConfig>) -> Simulator<Probe> {
    let spec = LeafSpine {
        leaves: 1,
        spines: 1,
        hosts_per_leaf: 3,
        queue,
        pfc,
        ..LeafSpine::default()
    };
    let mut sim = probe_sim(&Topology::leaf_spine(&spec));
    for from in [1, 2] {
        let sends: Vec<Send> = (0..100).map(|_| send(&sim, 0, 0, 50_000, 4096)).collect();
        script(&mut sim, from, sends.into_iter());
    }
    run_all(&mut sim);
    sim
}

#[test]
fn dctcp_threshold_marks_once_queue_exceeds_k() {
    let sim = incast(QueueConfig {
        capacity_bytes: 1 << 20,
        ecn: EcnPolicy::Threshold { k_bytes: 100_000 },
    });
    let rx = &sim.host(0).transport.received;
    assert_eq!(rx.len(), 200);
    let marked = rx.iter().filter(|r| r.ce).count() as u64;
    // Two senders at line rate into one port: the queue grows by one frame
    // every two, passing 100 KB (24 frames of 4142 B) after ~50 packets.
    assert!(rx[..40].iter().all(|r| !r.ce));
    assert!(marked > 100 && marked < 160, "{marked}");
    assert_eq!(sim.stats().marked, marked);
    assert_eq!(sim.stats().queue_drops, 0);
    // Line rate out of the switch port: 200 frames in 200 * 332.96 ns.
    let span = rx[199].at - rx[0].at;
    assert!(span <= Duration::from_nanos(199 * 333 + 1), "{span:?}");
}

#[test]
fn drop_tail_when_the_buffer_is_full() {
    let sim = incast(QueueConfig {
        capacity_bytes: 64 << 10,
        ecn: EcnPolicy::Off,
    });
    let received = sim.host(0).transport.received.len() as u64;
    let stats = sim.stats();
    assert!(stats.queue_drops > 50, "{stats:?}");
    assert_eq!(received + stats.queue_drops, 200);
    assert_eq!(stats.marked, 0);
}

#[test]
fn switches_route_around_a_failed_uplink() {
    let mut spec = LeafSpine::default();
    let leaf0 = spec.spines;
    spec.fabric_link.fail_at = None;
    let mut topo = Topology::leaf_spine(&spec);
    topo.links[spec.fabric_link(0, 0)].config.fail_at = Some(Instant::from_micros(5));
    let mut sim = probe_sim(&topo);
    sim.run_until(Instant::from_micros(4));
    assert_eq!(sim.route(leaf0, 8).len(), 8);
    sim.run_until(Instant::from_micros(200));
    assert_eq!(sim.route(leaf0, 8).len(), 7);
    assert!(!sim.route(leaf0, 8).contains(&0));
}

#[test]
fn pfc_pauses_senders_instead_of_dropping() {
    let queue = QueueConfig {
        capacity_bytes: 256 << 10,
        ecn: EcnPolicy::Off,
    };
    let pfc = PfcConfig {
        xoff_bytes: 32_000,
        xon_bytes: 24_000,
    };
    // Without PFC the 256 KiB buffer overflows; with it nothing is lost.
    let lossy = incast_with(queue, None);
    assert!(lossy.stats().queue_drops > 0);
    let sim = incast_with(queue, Some(pfc));
    let stats = sim.stats();
    assert_eq!(stats.queue_drops, 0, "{stats:?}");
    assert_eq!(sim.host(0).transport.received.len(), 200);
    assert!(stats.pauses >= 2, "{stats:?}");
    // The receiver's link still runs at line rate.
    let rx = &sim.host(0).transport.received;
    let span = rx[199].at - rx[0].at;
    assert!(span <= Duration::from_nanos(199 * 333 + 1), "{span:?}");
}
