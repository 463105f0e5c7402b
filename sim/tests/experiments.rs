//! Small, fast versions of the experiments: every transfer completes with
//! its data intact, and the same seed gives the same rows.

use std::time::Duration;

use metaroce_sim::experiments::{self, LossSweep, Protocol};
use metaroce_sim::workload::FlowStatus;

fn tiny() -> LossSweep {
    LossSweep {
        bytes: 256 << 10,
        losses: vec![0.0, 0.05],
        seeds: 2,
        time_limit: Duration::from_secs(5),
    }
}

#[test]
fn loss_sweep_small_is_complete_intact_and_reproducible() {
    let mut calls = Vec::new();
    let rows = experiments::loss_sweep(&tiny(), |done, total| calls.push((done, total)));
    assert_eq!(rows.len(), 2 * 2 * 2);
    assert_eq!(calls.last(), Some(&(8, 8)));
    for r in &rows {
        println!("{r:?}");
        assert_eq!(r.status, FlowStatus::Done, "{r:?}");
        assert_eq!(r.integrity_ok, Some(true), "{r:?}");
    }
    assert!(rows.iter().any(|r| r.loss > 0.0 && r.lost > 0));
    let lossless = experiments::mean_goodput(&rows, Protocol::MetaRoce, 0.0);
    assert!(lossless > 50.0, "{lossless}");
    let again = experiments::loss_sweep(&tiny(), |_, _| {});
    assert_eq!(rows, again);
}
