//! `cargo xtask sim <experiment>`: the fabric simulator's experiments.
//!
//! Builds `metaroce-sim` in release and runs it; every argument goes to the
//! binary (`cargo xtask sim help` lists experiments and options). Tables go
//! to stdout, CSV files to `target/metaroce/`. Not part of
//! `cargo xtask test` (the simulator's tests are, through the host tests):
//! `cargo xtask sim scale` alone runs clusters of up to 8,192 hosts for
//! many minutes (`--sizes` picks a subset).

use crate::util::{self, Error};

/// Entry point: `cargo xtask sim <experiment> [OPTIONS]`.
pub fn run(args: &[String]) -> Result<(), Error> {
    let out = util::project_root().join("target").join("metaroce");
    let mut cargo_args: Vec<String> = ["run", "--release", "--package", "metaroce-sim", "--"]
        .map(String::from)
        .to_vec();
    let sim_args: Vec<String> = args.iter().filter(|a| *a != "--").cloned().collect();
    let wants_out = sim_args
        .first()
        .is_some_and(|c| !c.starts_with('-') && c != "help");
    cargo_args.extend(sim_args.iter().cloned());
    if wants_out && !sim_args.iter().any(|a| a == "--out") {
        cargo_args.extend(["--out".into(), out.display().to_string()]);
    }
    util::run(&mut util::cargo(cargo_args))
}
