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
    let mut ctx = Ctx::new(target);
    ctx.psk = psk;
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
        };
        let verdict = match &o.result {
            Ok(()) if tries > 1 => format!("PASS (attempt {tries})"),
            Ok(()) => "PASS".to_string(),
            Err(why) => format!("FAIL: {why}"),
        };
        println!(
            "{:<4} {:<56} {:<20} {:>7}  {verdict}",
            o.number, o.name, o.section, o.millis
        );
        out.push(o);
    }
    let failed = out.iter().filter(|o| o.result.is_err()).count();
    println!(
        "compliance: {} passed, {failed} failed, {} cases",
        out.len() - failed,
        out.len()
    );
    out
}
