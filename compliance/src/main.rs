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
    let outcomes = metaroce_compliance::report::run_all(target, cli.filter.as_deref());
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let ran = outcomes.len();
    if failed == 0 && ran > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
