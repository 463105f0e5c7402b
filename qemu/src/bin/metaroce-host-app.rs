//! `metaroce-host-app`: the workload of `cargo xtask qemu` as a host
//! process driving one emulated DPU through the host library over its
//! shared-memory file (see `metaroce_qemu::hostapp`). The harness starts
//! one per DPU. Exit status 0 when every check passed, 1 on an integrity
//! failure, 2 when the run could not be carried out.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use metaroce_qemu::hostapp::{run, HostAppOptions};

#[derive(Debug, Parser)]
#[command(
    name = "metaroce-host-app",
    about = "Drive one emulated MetaRoCE DPU from a host process through its shared memory"
)]
struct Args {
    /// The DPU's shared-memory file (its ivshmem BAR2).
    #[arg(long)]
    shm: PathBuf,
    /// The host interface starts this many bytes into the file (a BAR that
    /// is a region of a larger memory: the Elba twin's `[host_interface]`
    /// in its RAM file); with --shm-len.
    #[arg(long, value_parser = parse_int, requires = "shm_len")]
    shm_offset: Option<u64>,
    /// Bytes of the host interface from --shm-offset.
    #[arg(long, value_parser = parse_int, requires = "shm_offset")]
    shm_len: Option<u64>,
    /// This DPU's node number.
    #[arg(long)]
    node: u8,
    /// Send to this node: NODE/IP:PORT.
    #[arg(long)]
    target: Option<String>,
    /// Senders to receive from.
    #[arg(long, default_value_t = 0)]
    expect: u8,
    #[arg(long, default_value = "mixed")]
    workload: String,
    #[arg(long, default_value_t = 65536)]
    size: u32,
    #[arg(long, default_value_t = 32)]
    count: u32,
    #[arg(long, default_value_t = 8)]
    depth: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

fn parse_int(s: &str) -> Result<u64, String> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| e.to_string())
}

fn parse_target(s: &str) -> Option<(u8, Ipv4Addr, u16)> {
    let (node, addr) = s.split_once('/')?;
    let (ip, port) = addr.split_once(':')?;
    Some((node.parse().ok()?, ip.parse().ok()?, port.parse().ok()?))
}

fn main() -> ExitCode {
    let a = Args::parse();
    let target = match a.target.as_deref().map(parse_target) {
        None => None,
        Some(Some(t)) => Some(t),
        Some(None) => {
            eprintln!("metaroce-host-app: --target wants NODE/IP:PORT");
            return ExitCode::from(2);
        }
    };
    let opts = HostAppOptions {
        shm: a.shm,
        shm_window: a.shm_offset.zip(a.shm_len),
        node: a.node,
        target,
        expect: a.expect,
        workload: a.workload,
        size: a.size,
        count: a.count,
        depth: a.depth.max(1),
        seed: a.seed,
        timeout: Duration::from_secs(a.timeout),
    };
    match run(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            println!("METAROCE-ERROR node={} {e}", opts.node);
            ExitCode::from(2)
        }
    }
}
