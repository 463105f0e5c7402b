//! The unmodified RoCEv2 baseline through the simulator, beside MetaRoCE
//! on the same topology and workload.

use metaroce_core::Instant;
use metaroce_sim::link::LinkConfig;
use metaroce_sim::metaroce::MetaRoce;
use metaroce_sim::roce::Roce;
use metaroce_sim::workload::{self, Flow, Report, WorkloadConfig};
use metaroce_sim::{LossModel, SimConfig, SimTransport, Simulator, Topology};

fn run<T: SimTransport>(
    loss: f64,
    seed: u64,
    make: impl FnMut(usize, metaroce_core::api::PeerAddr, u64) -> T,
) -> Report {
    let link = LinkConfig {
        loss: LossModel::Random(loss),
        ..LinkConfig::default()
    };
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    let mut sim = Simulator::new(&Topology::back_to_back(link), config, make);
    let flow = Flow {
        src: 0,
        dst: 1,
        bytes: 1 << 20,
        start: Instant::from_micros(1),
    };
    workload::run(&mut sim, &[flow], &WorkloadConfig::default())
}

fn roce(loss: f64, seed: u64) -> Report {
    run(loss, seed, |_, addr, s| {
        Roce::<4>::new(roce_baseline::Config::default(), addr, s)
    })
}

fn metaroce(loss: f64, seed: u64) -> Report {
    run(loss, seed, |_, _, s| {
        MetaRoce::<16>::new(metaroce_core::Config::default(), 4, s)
    })
}

fn line(r: &Report) -> String {
    let f = &r.flows[0];
    format!(
        "{:<8} {:?} fct {:>12?} goodput {:6.2} Gbit/s lost {} retx {} timeouts {}",
        r.protocol,
        f.status,
        f.fct().unwrap_or_default(),
        f.goodput_gbps().unwrap_or(0.0),
        r.fabric.lost,
        r.transport.retransmissions,
        r.transport.timeouts
    )
}

#[test]
fn one_megabyte_lossless_with_icrc() {
    let r = roce(0.0, 1);
    println!("{}", line(&r));
    assert!(r.all_ok(), "{r:?}");
    assert_eq!(r.transport.retransmissions, 0);
    assert_eq!(r.transport.discarded, 0, "every ICRC checked and matched");
}

#[test]
fn one_megabyte_at_one_percent_loss_recovers_by_go_back_n() {
    let r = roce(0.01, 1);
    println!("{}", line(&r));
    assert!(r.all_ok(), "{r:?}");
    assert!(r.fabric.lost > 0);
    // Go-back-N resends everything after a loss.
    assert!(r.transport.retransmissions > r.fabric.lost);
}

#[test]
fn same_seed_same_run() {
    assert_eq!(roce(0.02, 5), roce(0.02, 5));
}

#[test]
fn side_by_side() {
    for loss in [0.0, 0.01] {
        for seed in 1..=2 {
            println!("loss {:>4.1} % seed {seed}", loss * 100.0);
            println!("  {}", line(&metaroce(loss, seed)));
            println!("  {}", line(&roce(loss, seed)));
        }
    }
}
