//! Running cases and printing the pass/fail table.

use std::net::SocketAddr;
use std::time::Instant;

use crate::cases::{Ctx, CASES};

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
    run_with_options(target, filter, psk, false)
}

/// [`run_with_key`]; `single_source`: the target sees every peer at one
/// address (a gateway), so the cases that need a second one are skipped.
pub fn run_with_options(
    target: SocketAddr,
    filter: Option<&str>,
    psk: Option<(u32, [u8; 32])>,
    single_source: bool,
) -> Vec<Outcome> {
    let mut ctx = Ctx::new(target);
    ctx.psk = psk;
    ctx.single_source = single_source;
    let protected: &[crate::cases::Case] = if psk.is_some() {
        crate::protect::PROTECTED_CASES
    } else {
        &[]
    };
    println!("MetaRoCE compliance against {target}");
    println!(
        "{:<4} {:<56} {:<20} {:>7}  result",
        "#", "case", "spec", "ms"
    );
    let mut out = Vec::new();
    for (i, case) in CASES.iter().chain(protected).enumerate() {
        if filter.is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let started = Instant::now();
        ctx.skipped = None;
        let mut result = (case.run)(&mut ctx);
        let mut tries = 1;
        while result.is_err() && tries < case.attempts {
            tries += 1;
            result = (case.run)(&mut ctx);
        }
        let o = Outcome {
            number: i + 1,
            name: case.name,
            section: case.section,
            millis: started.elapsed().as_millis(),
            result,
            skipped: ctx.skipped.take(),
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
    out
}
