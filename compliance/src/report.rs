//! Running cases and printing the pass/fail table.

use std::net::SocketAddr;
use std::time::Instant;

use crate::cases::{Case, Ctx, CASES};
use crate::device::{DeviceCtx, DeviceTarget, DEVICE_CASES};

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub number: usize,
    pub name: &'static str,
    pub section: &'static str,
    pub millis: u128,
    pub result: Result<(), String>,
    /// Why the case did not apply to the target (it counts as neither
    /// passed nor failed).
    pub skipped: Option<String>,
}

/// Runs every case whose name contains `filter` against `target`, printing
/// a table row as each ends.
pub fn run_all(target: SocketAddr, filter: Option<&str>) -> Vec<Outcome> {
    run_with_key(target, filter, None)
}

/// [`run_all`], plus the packet-protection cases (spec 5.3) when `psk`
/// (Key ID, pre-shared key) is the target's.
pub fn run_with_key(
    target: SocketAddr,
    filter: Option<&str>,
    psk: Option<(u32, [u8; 32])>,
) -> Vec<Outcome> {
    run_with_options(
        target,
        filter,
        &Target {
            psk,
            ..Target::default()
        },
    )
}

/// What the suite is told about the target.
#[derive(Debug, Clone, Copy, Default)]
pub struct Target {
    /// Key ID and pre-shared key: adds the packet-protection cases (5.3).
    pub psk: Option<(u32, [u8; 32])>,
    /// The target sees every peer at one address (a gateway): the cases
    /// that need a second one are skipped.
    pub single_source: bool,
    /// The most half-open connections the target lets one /32 hold
    /// (4.2.3, 1): the per-prefix limit case runs.
    pub half_open_limit: Option<u32>,
}

/// [`run_all`] with what is known of the target.
pub fn run_with_options(target: SocketAddr, filter: Option<&str>, known: &Target) -> Vec<Outcome> {
    let mut ctx = Ctx::new(target);
    ctx.psk = known.psk;
    ctx.single_source = known.single_source;
    ctx.half_open_limit = known.half_open_limit;
    let protected: &[crate::cases::Case] = if known.psk.is_some() {
        crate::protect::PROTECTED_CASES
    } else {
        &[]
    };
    println!("MetaRoCE compliance against {target}");
    let cases: Vec<&Case<Ctx>> = CASES.iter().chain(protected).collect();
    let out = run_cases(&cases, &mut ctx, filter, |c| c.skipped.take());
    summary(&out);
    out
}

/// The host-interface cases (spec chapter 6) against two devices, each
/// its shared memory and its address.
pub fn run_devices(devices: [DeviceTarget; 2], filter: Option<&str>) -> Vec<Outcome> {
    println!(
        "MetaRoCE compliance against the devices of {} and {}",
        devices[0].shm.display(),
        devices[1].shm.display()
    );
    let mut ctx = DeviceCtx {
        devices,
        skipped: None,
    };
    let cases: Vec<&Case<DeviceCtx>> = DEVICE_CASES.iter().collect();
    let out = run_cases(&cases, &mut ctx, filter, |c| c.skipped.take());
    summary(&out);
    out
}

/// Runs `cases` in order, a table row as each ends; `skipped` takes why
/// the case just run did not apply.
fn run_cases<C>(
    cases: &[&Case<C>],
    ctx: &mut C,
    filter: Option<&str>,
    skipped: fn(&mut C) -> Option<String>,
) -> Vec<Outcome> {
    println!(
        "{:<4} {:<56} {:<20} {:>7}  result",
        "#", "case", "spec", "ms"
    );
    let mut out = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        if filter.is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let started = Instant::now();
        skipped(ctx);
        let mut result = (case.run)(ctx);
        let mut tries = 1;
        while result.is_err() && tries < case.attempts {
            tries += 1;
            result = (case.run)(ctx);
        }
        let o = Outcome {
            number: i + 1,
            name: case.name,
            section: case.section,
            millis: started.elapsed().as_millis(),
            result,
            skipped: skipped(ctx),
        };
        let verdict = match (&o.result, &o.skipped) {
            (Ok(()), Some(why)) => format!("SKIP: {why}"),
            (Ok(()), None) if tries > 1 => format!("PASS (attempt {tries})"),
            (Ok(()), None) => "PASS".to_string(),
            (Err(why), _) => format!("FAIL: {why}"),
        };
        println!(
            "{:<4} {:<56} {:<20} {:>7}  {verdict}",
            o.number, o.name, o.section, o.millis
        );
        out.push(o);
    }
    out
}

/// The closing line: passed, failed, cases, skipped.
fn summary(out: &[Outcome]) {
    let failed = out.iter().filter(|o| o.result.is_err()).count();
    let skipped = out
        .iter()
        .filter(|o| o.result.is_ok() && o.skipped.is_some())
        .count();
    println!(
        "compliance: {} passed, {failed} failed, {} cases, {skipped} skipped",
        out.len() - failed - skipped,
        out.len()
    );
}
