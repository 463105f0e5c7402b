//! The unmodified MetaRoCE engine through the simulator: whole transfers
//! with integrity checks, under loss, and reproducibility.

use std::time::Duration;

use metaroce_core::{Config, Instant};
use metaroce_sim::link::LinkConfig;
use metaroce_sim::metaroce::MetaRoce;
use metaroce_sim::workload::{self, Flow, Report, WorkloadConfig};
use metaroce_sim::{LeafSpine, LossModel, SimConfig, Simulator, Topology};

type Small = MetaRoce<16>;

fn run(topology: &Topology, flows: &[Flow], seed: u64) -> (Report, f64) {
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    let mut sim: Simulator<Small> = Simulator::new(topology, config, |_, _, s| {
        MetaRoce::new(Config::default(), 8, s)
    });
    let wall = std::time::Instant::now();
    let report = workload::run(&mut sim, flows, &WorkloadConfig::default());
    let secs = wall.elapsed().as_secs_f64();
    let events = sim.events_processed();
    let rate = events as f64 / secs.max(1e-9);
    println!(
        "{} flows, {} events in {:.3} s wall: {:.2} M events/s; {:.1} us virtual",
        flows.len(),
        events,
        secs,
        rate / 1e6,
        report.end.as_nanos() as f64 / 1e3
    );
    (report, rate)
}

fn one_megabyte(loss: f64) -> (Topology, Vec<Flow>) {
    let link = LinkConfig {
        loss: LossModel::Random(loss),
        ..LinkConfig::default()
    };
    let flow = Flow {
        src: 0,
        dst: 1,
        bytes: 1 << 20,
        start: Instant::from_micros(1),
    };
    (Topology::back_to_back(link), vec![flow])
}

fn describe(r: &Report) -> String {
    let f = &r.flows[0];
    format!(
        "{:?} fct {:?} goodput {:.1} Gbit/s; fabric {:?}; transport {:?}",
        f.status,
        f.fct(),
        f.goodput_gbps().unwrap_or(0.0),
        r.fabric,
        r.transport
    )
}

#[test]
fn one_megabyte_back_to_back_lossless() {
    let (topo, flows) = one_megabyte(0.0);
    let (r, _) = run(&topo, &flows, 1);
    println!("0 %: {}", describe(&r));
    assert!(r.all_ok(), "{}", describe(&r));
    assert_eq!(r.fabric.lost, 0);
    assert_eq!(r.transport.retransmissions, 0);
    // 1 MiB at 100 Gbit/s is 84 us of payload; handshake and headers add
    // a few microseconds.
    let fct = r.flows[0].fct().unwrap();
    assert!(fct > Duration::from_micros(84), "{fct:?}");
    assert!(fct < Duration::from_micros(200), "{fct:?}");
}

#[test]
fn one_megabyte_back_to_back_at_one_percent_loss() {
    let (topo, flows) = one_megabyte(0.01);
    let (r, rate) = run(&topo, &flows, 1);
    println!("1 %: {}", describe(&r));
    println!("simulator speed: {:.0} events/s", rate);
    assert!(r.all_ok(), "{}", describe(&r));
    assert!(r.fabric.lost > 0);
    assert!(r.transport.retransmissions >= r.fabric.lost / 2);
}

#[test]
fn same_seed_same_run() {
    let (topo, flows) = one_megabyte(0.02);
    let (a, _) = run(&topo, &flows, 42);
    let (b, _) = run(&topo, &flows, 42);
    assert!(a.all_ok());
    assert_eq!(a, b);
    let (c, _) = run(&topo, &flows, 43);
    assert!(c.all_ok());
    assert_ne!(
        a.fabric, c.fabric,
        "a different seed should lose other packets"
    );
}

#[test]
fn small_leaf_spine_permutation_with_loss() {
    let spec = LeafSpine {
        leaves: 2,
        spines: 2,
        hosts_per_leaf: 2,
        ..LeafSpine::default()
    };
    let mut topo = Topology::leaf_spine(&spec);
    topo.set_loss(LossModel::bursty(0.005, 4.0));
    // Every host sends 256 KiB to the host on the other leaf.
    let flows: Vec<Flow> = (0..4)
        .map(|h| Flow {
            src: h,
            dst: (h + 2) % 4,
            bytes: 256 << 10,
            start: Instant::from_micros(1),
        })
        .collect();
    let (r, _) = run(&topo, &flows, 7);
    for f in &r.flows {
        println!("{:?}", f);
    }
    println!("fabric {:?}", r.fabric);
    assert!(r.all_ok());
}

#[test]
fn leaf_spine_64_hosts_permutation_and_simulator_speed() {
    let spec = LeafSpine::default();
    let topo = Topology::leaf_spine(&spec);
    // Host h sends 1 MiB to host h + 8 (the same slot one leaf over).
    let flows: Vec<Flow> = (0..64)
        .map(|h| Flow {
            src: h,
            dst: (h + 8) % 64,
            bytes: 1 << 20,
            start: Instant::from_micros(1),
        })
        .collect();
    let (r, rate) = run(&topo, &flows, 3);
    let mut fct: Vec<Duration> = r.flows.iter().filter_map(|f| f.fct()).collect();
    fct.sort();
    println!(
        "64-host permutation, 1 MiB each: FCT min {:?} median {:?} max {:?}; fabric {:?}; transport {:?}",
        fct.first(),
        fct.get(fct.len() / 2),
        fct.last(),
        r.fabric,
        r.transport
    );
    println!("simulator speed: {:.0} events/s", rate);
    assert!(r.all_ok());
}

#[test]
fn loss_trace_names_each_lost_packet() {
    use metaroce_core::wire;
    let link = LinkConfig {
        loss: LossModel::Random(0.01),
        // Only the data direction loses.
        reverse_loss: Some(LossModel::None),
        ..LinkConfig::default()
    };
    let topo = Topology::back_to_back(link);
    let mut sim: Simulator<Small> = Simulator::new(&topo, SimConfig::default(), |_, _, s| {
        MetaRoce::new(Config::default(), 8, s)
    });
    sim.record_losses();
    let flows = [Flow {
        src: 0,
        dst: 1,
        bytes: 4 << 20,
        start: Instant::from_micros(1),
    }];
    let r = workload::run(&mut sim, &flows, &WorkloadConfig::default());
    println!("{}", describe(&r));
    assert!(r.all_ok());
    assert_eq!(sim.losses().len() as u64, r.fabric.lost);
    for l in sim.losses() {
        assert_eq!((l.packet.src, l.packet.dst, l.link_down), (0, 1, false));
        let (repr, _) = wire::parse(&l.packet.bytes).expect("a MetaRoCE packet");
        println!(
            "lost at {:>7} ns: psn {} path {} udp src {}",
            l.at.as_nanos(),
            repr.header.psn,
            repr.header.path,
            l.packet.src_port
        );
    }
    // Every lost data packet was sent again exactly once.
    let h = sim.host(0).transport.endpoint().handles().next().unwrap();
    let stats = sim.host(0).transport.endpoint().stats(h).unwrap();
    println!("{stats:?}");
    assert_eq!(stats.retransmissions, r.fabric.lost);
}

#[test]
fn every_work_request_packet_and_completion_goes_through_the_engine_loop() {
    let (topo, flows) = one_megabyte(0.01);
    let mut sim: Simulator<Small> = Simulator::new(&topo, SimConfig::default(), |_, _, s| {
        MetaRoce::new(Config::default(), 8, s)
    });
    let r = workload::run(&mut sim, &flows, &WorkloadConfig::default());
    assert!(r.all_ok(), "{}", describe(&r));
    let (tx, rx) = (
        sim.host(0).transport.loop_stats(),
        sim.host(1).transport.loop_stats(),
    );
    println!("sender loop: {tx:?}\nreceiver loop: {rx:?}");
    // 1 MiB in 256 KiB WRITEs: four posts, four completions, all via rings.
    assert_eq!((tx.posted_sends, tx.completions, tx.post_errors), (4, 4, 0));
    assert_eq!((tx.dma_faults, rx.dma_faults, r.out_of_bounds), (0, 0, 0));
    // Every packet either side sent left through the loop's link (back to
    // back, the two NICs are the fabric's only transmitters), and every
    // packet delivered to a host entered through it.
    assert_eq!(tx.tx_transport + rx.tx_transport, r.fabric.packets_sent);
    assert_eq!(tx.rx_transport + rx.rx_transport, r.fabric.delivered);
}

#[test]
fn a_refused_work_request_completes_with_an_error_from_the_ring() {
    use metaroce_core::api::{LocalBuf, Op, Status, WorkRequest};
    use metaroce_core::wire::MemoryTarget;
    use metaroce_sim::metaroce::SEND_RING;
    use metaroce_sim::{SimTransport, TransportError};

    let (topo, _) = one_megabyte(0.0);
    let mut sim: Simulator<Small> = Simulator::new(&topo, SimConfig::default(), |_, _, s| {
        MetaRoce::new(Config::default(), 8, s)
    });
    let conn = sim.connect(0, 1).unwrap();
    // No region has key 99: the endpoint refuses this for good.
    let wr = WorkRequest {
        id: 7,
        op: Op::Write {
            remote: MemoryTarget { key: 99, addr: 0 },
        },
        local: LocalBuf {
            key: 99,
            addr: 0x1000_0000,
            len: 64,
        },
    };
    assert_eq!(sim.post_send(0, conn, wr), Ok(()), "the ring takes it");
    sim.run_until(Instant::from_micros(50));
    let mut done = Vec::new();
    sim.drain_completions(&mut done);
    let c: Vec<_> = done
        .iter()
        .map(|c| (c.host, c.completion.wr_id, c.completion.status))
        .collect();
    assert_eq!(c, [(0, 7, Status::LocalProtection)]);
    assert_eq!(sim.host(0).transport.loop_stats().post_errors, 1);

    // Posted without a poll in between, the send ring fills: Retry.
    let t = &mut sim.host_mut(0).transport;
    for i in 0..SEND_RING {
        assert_eq!(t.post_send(conn, wr), Ok(()), "post {i}");
    }
    assert_eq!(t.post_send(conn, wr), Err(TransportError::Retry));
}
