//! `metaroce-compliance --target ADDR:PORT`: runs the suite (see the
//! library's documentation) and prints the pass/fail table;
//! `metaroce-compliance SHM0 ADDR0 SHM1 ADDR1`: the host-interface cases
//! against two devices (what the QEMU harness's `--exec` passes).

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use clap::Parser;
use metaroce_compliance::device::DeviceTarget;

#[derive(Parser, Debug)]
#[command(name = "metaroce-compliance", about = "MetaRoCE compliance suite")]
struct Cli {
    /// The implementation under test: ADDRESS:PORT where it serves.
    #[arg(long, required_unless_present = "devices")]
    target: Option<String>,
    /// Two devices' host interfaces: each one's shared-memory file and its
    /// MetaRoCE ADDRESS:PORT (`SHM0 ADDR0 SHM1 ADDR1`): runs the
    /// host-interface cases (spec chapter 6).
    #[arg(num_args = 4, value_names = ["SHM0", "ADDR0", "SHM1", "ADDR1"])]
    devices: Vec<String>,
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
    let mut outcomes = Vec::new();
    if let Some(target) = &cli.target {
        let Some(target) = address(target) else {
            eprintln!("metaroce-compliance: --target `{target}` is not ADDRESS:PORT");
            return ExitCode::from(2);
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
        outcomes.extend(metaroce_compliance::report::run_with_options(
            target,
            cli.filter.as_deref(),
            &metaroce_compliance::report::Target {
                psk,
                single_source: cli.single_source,
                half_open_limit: cli.half_open_limit,
            },
        ));
    }
    if let [shm0, addr0, shm1, addr1] = cli.devices.as_slice() {
        let device = |shm: &str, addr: &str| {
            address(addr).map(|addr| DeviceTarget {
                shm: shm.into(),
                addr,
            })
        };
        let (Some(d0), Some(d1)) = (device(shm0, addr0), device(shm1, addr1)) else {
            eprintln!("metaroce-compliance: `{addr0}` or `{addr1}` is not ADDRESS:PORT");
            return ExitCode::from(2);
        };
        outcomes.extend(metaroce_compliance::report::run_devices(
            [d0, d1],
            cli.filter.as_deref(),
        ));
    }
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    let ran = outcomes.len();
    if failed == 0 && ran > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn address(text: &str) -> Option<SocketAddr> {
    text.to_socket_addrs().ok().and_then(|mut a| a.next())
}
