//! `metaroce-compliance --target ADDR:PORT`: runs the suite (see the
//! library's documentation) and prints the pass/fail table.

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

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
    /// The target's pre-shared key (64 hexadecimal digits or 32 raw
    /// bytes): adds the packet-protection cases (spec 5.3).
    #[arg(long)]
    psk_file: Option<std::path::PathBuf>,
    /// Key ID of that key.
    #[arg(long, default_value_t = 1)]
    key_id: u32,
    /// The target sees every peer at one source address (a gateway such
    /// as the QEMU harness's): skip the cases that need a second one.
    #[arg(long)]
    single_source: bool,
    /// The most half-open connections the target lets one source address
    /// (/32) hold before it answers CLOSE (REJECTED) (spec 4.2.3): adds
    /// the per-prefix limit case.
    #[arg(long, value_name = "N")]
    half_open_limit: Option<u32>,
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
    let psk = match &cli.psk_file {
        None => None,
        Some(path) => match metaroce_host::protection::read_psk_file(path) {
            Ok(k) => Some((cli.key_id, k)),
            Err(e) => {
                eprintln!("metaroce-compliance: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let outcomes = metaroce_compliance::report::run_with_options(
        target,
        cli.filter.as_deref(),
        &metaroce_compliance::report::Target {
            psk,
            single_source: cli.single_source,
            half_open_limit: cli.half_open_limit,
        },
    );
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let ran = outcomes.len();
    if failed == 0 && ran > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
