//! How a domain's transport is set up: defaults by where it binds, each
//! overridable by an `FI_METAROCE_*` environment variable (the guide's
//! settings table).

use std::net::SocketAddr;
use std::time::Duration;

/// How a domain's transport is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Address to bind (port 0: any free port in `port_range`).
    pub bind: SocketAddr,
    /// Ports the sockets may use (inclusive); `None`: any.
    pub port_range: Option<(u16, u16)>,
    pub paths: u16,
    pub mtu: u16,
    pub rate_mbps: u32,
    /// Receive buffers each accepted connection keeps posted.
    pub rx_slots: usize,
    /// How long a connection may go without progress before it fails.
    pub timeout: Duration,
    /// The shared memory of a DPU's host interface to drive instead of
    /// UDP sockets (`FI_METAROCE_DEVICE`).
    pub device: Option<std::path::PathBuf>,
}

impl Settings {
    /// Defaults for `bind`, overridden by `FI_METAROCE_*` variables (see
    /// the guide): `PORT_RANGE=lo-hi`, `PATHS`, `MTU`, `RATE_MBPS`,
    /// `RX_SLOTS`, `TIMEOUT_MS`, `DEVICE`.
    pub fn from_env(bind: SocketAddr) -> Result<Settings, String> {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| format!("{name}={v}: not a number")),
                Err(_) => Ok(default),
            }
        }
        let port_range = match std::env::var("FI_METAROCE_PORT_RANGE") {
            Ok(v) => {
                let parsed = v.split_once('-').and_then(|(lo, hi)| {
                    Some((
                        lo.trim().parse::<u16>().ok()?,
                        hi.trim().parse::<u16>().ok()?,
                    ))
                });
                match parsed {
                    Some((lo, hi)) if lo > 0 && lo <= hi => Some((lo, hi)),
                    _ => return Err(format!("FI_METAROCE_PORT_RANGE={v}: expected LOW-HIGH")),
                }
            }
            Err(_) => None,
        };
        // Loopback carries 64 KiB datagrams; an Ethernet link 1,500 bytes.
        let default_mtu = if bind.ip().is_loopback() { 8192 } else { 1024 };
        // Loopback has one path: spraying over several sockets only
        // reorders datagrams there (each socket's batch leaves in turn).
        let default_paths = if bind.ip().is_loopback() { 1 } else { 4 };
        let settings = Settings {
            bind,
            port_range,
            paths: var("FI_METAROCE_PATHS", default_paths)?,
            mtu: var("FI_METAROCE_MTU", default_mtu)?,
            rate_mbps: var("FI_METAROCE_RATE_MBPS", 40_000)?,
            rx_slots: var("FI_METAROCE_RX_SLOTS", 32)?,
            timeout: Duration::from_millis(var("FI_METAROCE_TIMEOUT_MS", 5_000)?),
            device: device_path(),
        };
        if !(1..=16).contains(&settings.paths) {
            return Err(format!("FI_METAROCE_PATHS={}: 1..=16", settings.paths));
        }
        if !(256..=9_000).contains(&settings.mtu) {
            return Err(format!("FI_METAROCE_MTU={}: 256..=9000", settings.mtu));
        }
        if !(2..=64).contains(&settings.rx_slots) {
            return Err(format!(
                "FI_METAROCE_RX_SLOTS={}: 2..=64",
                settings.rx_slots
            ));
        }
        Ok(settings)
    }
}

/// The DPU shared memory `FI_METAROCE_DEVICE` names, if set.
pub fn device_path() -> Option<std::path::PathBuf> {
    std::env::var_os("FI_METAROCE_DEVICE")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
}
