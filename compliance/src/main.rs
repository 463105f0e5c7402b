//! # metaroce-compliance
//!
//! The MetaRoCE compliance suite (spec 5.2.3): it tests an implementation
//! from outside, over UDP, by playing its peer. Every packet is built by
//! hand with `metaroce_core::wire`, so the suite can reorder, duplicate,
//! drop and break them; the target's memory is checked through later READs.
//!
//! The target must run the *serve profile* of `metaroce serve` (see
//! `metaroce_host::app`): accept connections, answer an announcement SEND
//! with a SEND describing a fresh region pre-filled with a known pattern
//! and a small read-only region. It is **not** a load test or a fuzzer.
//!
//! Usage: `metaroce-compliance --target ADDR:PORT` (or `cargo xtask
//! compliance --target host`). Prints a pass/fail table; exit code 0 when
//! every case passed, 1 otherwise, 2 on a usage error.

mod cases;
mod peer;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "metaroce-compliance", about = "MetaRoCE compliance suite")]
struct Cli {
    /// The implementation under test: ADDRESS:PORT where it serves.
    #[arg(long)]
    target: String,
    /// Run only the cases whose name contains this text.
    #[arg(long)]
    filter: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let target: SocketAddr = match cli.target.to_socket_addrs().ok().and_then(|mut a| a.next()) {
        Some(t) => t,
        None => {
            eprintln!(
                "metaroce-compliance: --target `{}` is not ADDRESS:PORT",
                cli.target
            );
            return ExitCode::from(2);
        }
    };
    let mut ctx = cases::Ctx::new(target);
    let mut failed = 0;
    let mut ran = 0;
    println!("MetaRoCE compliance against {target}");
    println!(
        "{:<4} {:<56} {:<20} {:>7}  result",
        "#", "case", "spec", "ms"
    );
    for (i, case) in cases::CASES.iter().enumerate() {
        if cli
            .filter
            .as_ref()
            .is_some_and(|f| !case.name.contains(f.as_str()))
        {
            continue;
        }
        ran += 1;
        let started = Instant::now();
        let result = (case.run)(&mut ctx);
        let ms = started.elapsed().as_millis();
        match result {
            Ok(()) => println!(
                "{:<4} {:<56} {:<20} {ms:>7}  PASS",
                i + 1,
                case.name,
                case.section
            ),
            Err(why) => {
                failed += 1;
                println!(
                    "{:<4} {:<56} {:<20} {ms:>7}  FAIL: {why}",
                    i + 1,
                    case.name,
                    case.section
                );
            }
        }
    }
    println!(
        "compliance: {} passed, {failed} failed, {ran} cases",
        ran - failed
    );
    if failed == 0 && ran > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
