//! Reader and checker of `board.toml`. [`BoardToml`] reads the small
//! subset of TOML the board file uses (`[section]` headers, `key = value`
//! with integers in decimal or `0x` hex with `_` separators, and
//! `"strings"`, `#` comments); anything else is an error with its line
//! number. [`BoardConfig::check`] checks the values (known keys,
//! alignment, regions inside DRAM and apart, MMIO and DRAM in different
//! identity-map blocks) and generates the firmware's constants and
//! `memory.ld`. Std only, no dependencies: `build.rs` and the xtask both
//! include this file with `#[path]`, so the firmware and its image read the
//! same values the same way, and the xtask's tests cover the checks.

use std::fmt;
use std::fmt::Write as _;

/// A value of the board file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(u64),
    Str(String),
}

/// Why the board file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardError(pub String);

impl fmt::Display for BoardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The parsed board file: `section.key` to value, in file order.
#[derive(Debug, Clone, Default)]
pub struct BoardToml {
    entries: Vec<(String, Value)>,
}

impl BoardToml {
    /// Parses the text of a board file.
    pub fn parse(text: &str) -> Result<BoardToml, BoardError> {
        let mut section = String::new();
        let mut entries: Vec<(String, Value)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let err = |msg: &str| BoardError(format!("board.toml line {line_no}: {msg}"));
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest
                    .strip_suffix(']')
                    .ok_or_else(|| err("unterminated section header"))?
                    .trim();
                if name.is_empty() || !name.chars().all(is_key_char) {
                    return Err(err("bad section name"));
                }
                section = name.to_string();
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| err("expected `key = value`"))?;
            let key = key.trim();
            if key.is_empty() || !key.chars().all(is_key_char) {
                return Err(err("bad key"));
            }
            let full = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            if entries.iter().any(|(k, _)| *k == full) {
                return Err(err(&format!("`{full}` set twice")));
            }
            let value = parse_value(value.trim()).map_err(|m| err(&m))?;
            entries.push((full, value));
        }
        Ok(BoardToml { entries })
    }

    /// The value of `section.key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The integer `section.key`; an error if missing or not an integer.
    pub fn int(&self, key: &str) -> Result<u64, BoardError> {
        match self.get(key) {
            Some(Value::Int(v)) => Ok(*v),
            Some(Value::Str(_)) => Err(BoardError(format!(
                "board.toml: `{key}` must be an integer"
            ))),
            None => Err(BoardError(format!("board.toml: `{key}` is missing"))),
        }
    }

    /// The string `section.key`; an error if missing or not a string.
    pub fn string(&self, key: &str) -> Result<&str, BoardError> {
        match self.get(key) {
            Some(Value::Str(v)) => Ok(v),
            Some(Value::Int(_)) => Err(BoardError(format!("board.toml: `{key}` must be a string"))),
            None => Err(BoardError(format!("board.toml: `{key}` is missing"))),
        }
    }

    /// Every `section.key` in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The line without a `#` comment (a `#` inside a string is kept).
fn strip_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

fn parse_value(text: &str) -> Result<Value, String> {
    if let Some(rest) = text.strip_prefix('"') {
        let body = rest
            .strip_suffix('"')
            .ok_or_else(|| "unterminated string".to_string())?;
        if body.contains('"') || body.contains('\\') {
            return Err("escapes and inner quotes are not supported".into());
        }
        return Ok(Value::Str(body.to_string()));
    }
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    if text.starts_with('_') || text.ends_with('_') || text.contains("__") || digits.is_empty() {
        return Err(format!("bad number `{text}`"));
    }
    let parsed = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => digits.parse::<u64>(),
    };
    parsed
        .map(Value::Int)
        .map_err(|_| format!("bad number `{text}` (unsigned decimal or 0x-hex)"))
}

// ----- checking and generating ------------------------------------------

/// Bytes of one frame slot of the shared-memory rings (`shm::FrameDescriptor`).
pub const FRAME_SLOT_BYTES: u64 = 1536;
/// Bytes of a ring header (`shm::RingHeader`): three cache lines.
pub const RING_HEADER_BYTES: u64 = 192;
/// Granule of the identity map's blocks (level-1 blocks of 1 GiB).
pub const BLOCK: u64 = 1 << 30;

/// A checked board configuration: every value of `board.toml` plus the
/// ring layout and identity-map blocks derived from it.
#[derive(Debug, Clone)]
pub struct BoardConfig {
    pub load: u64,
    pub entry: u64,
    pub max_size: u64,
    pub stack_pages: u64,
    pub dram: (u64, u64),
    pub uart: u64,
    pub reg_shift: u64,
    pub uart_clock: u64,
    pub baud: u64,
    pub program_divisor: bool,
    /// The console's device (`console.kind`): a 16550 or, in the twin, a
    /// PL011.
    pub console_pl011: bool,
    pub gicd: u64,
    pub gicr: u64,
    pub gicr_size: u64,
    pub cpu_count: u64,
    pub doorbell_intid: u64,
    /// Whether the doorbell SPI is a virtio-serial device's (the twin's
    /// `gic.doorbell_raise`) rather than `doorbell_intid` raised through
    /// `GICD_SETSPI_NSR`.
    pub doorbell_virtio_serial: bool,
    pub rings: (u64, u64),
    pub rx_slots: u64,
    pub tx_slots: u64,
    /// Core 0's rings; core `i`'s are `i * core_ring_stride` further.
    pub rx_ring_offset: u64,
    pub tx_ring_offset: u64,
    pub core_ring_stride: u64,
    /// Core 0's doorbell words; core `i`'s are `i * doorbell_stride` further.
    pub rx_doorbell_offset: u64,
    pub tx_doorbell_offset: u64,
    pub doorbell_stride: u64,
    /// Cores running an engine, how many share a cluster (MPIDR Aff1 is
    /// the cluster, Aff0 the core in it), and each secondary's stack.
    pub core_count: u64,
    pub cores_per_cluster: u64,
    pub secondary_stack_pages: u64,
    pub host_memory: (u64, u64),
    pub host_address: u64,
    /// The shared-memory host interface (spec chapter 6): base, size.
    pub host_interface: (u64, u64),
    pub host_interface_sets: u64,
    pub host_interface_bar: u64,
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    pub udp_port: u64,
    pub peer: Option<([u8; 4], [u8; 6])>,
    /// The endpoint's capacities: connections, paths, work entries,
    /// receives, senders, in-flight records, regions.
    pub endpoint: EndpointCapacities,
    /// Where the endpoints' secrets come from (`entropy.source`): the
    /// variant name of `entropy::Source`.
    pub entropy_source: &'static str,
    /// What the node does (`node.role`) and further `key=value` words of
    /// the node's configuration (`node.extra`).
    pub role: String,
    pub node_extra: String,
    /// Where the node's configuration line comes from at boot
    /// (`node.config_from`): compiled in from this file, or, in the twin,
    /// QEMU's fw_cfg file `opt/metaroce/config`.
    pub config_fw_cfg: bool,
    pub device_blocks: Vec<u64>,
    pub normal_blocks: Vec<u64>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

fn inside(inner: (u64, u64), outer: (u64, u64)) -> bool {
    inner.0 >= outer.0 && inner.0 + inner.1 <= outer.0 + outer.1
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn parse_ip(text: &str) -> Option<[u8; 4]> {
    text.parse::<std::net::Ipv4Addr>()
        .ok()
        .map(|ip| ip.octets())
}

/// The `[endpoint]` section: the sizes of the endpoint's static storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointCapacities {
    pub connections: u64,
    pub paths: u64,
    pub work_entries: u64,
    pub recv_entries: u64,
    pub senders: u64,
    pub inflight_records: u64,
    pub regions: u64,
}

/// Every key the board file may set: a misspelt key is an error, not a
/// silently ignored setting.
pub const KNOWN_KEYS: &[&str] = &[
    "image.load_address",
    "image.entry_address",
    "image.max_size",
    "image.stack_pages",
    "memory.dram_base",
    "memory.dram_size",
    "console.uart_base",
    "console.reg_shift",
    "console.clock_hz",
    "console.baud",
    "console.program_divisor",
    "console.kind",
    "gic.distributor",
    "gic.redistributor",
    "gic.redistributor_size",
    "gic.cpu_count",
    "gic.doorbell_intid",
    "gic.doorbell_raise",
    "rings.base",
    "rings.size",
    "rings.rx_slots",
    "rings.tx_slots",
    "rings.rx_doorbell_offset",
    "rings.tx_doorbell_offset",
    "rings.doorbell_stride",
    "cores.count",
    "cores.per_cluster",
    "cores.stack_pages",
    "host_memory.local_base",
    "host_memory.size",
    "host_memory.host_address",
    "endpoint.connections",
    "endpoint.paths",
    "endpoint.work_entries",
    "endpoint.recv_entries",
    "endpoint.senders",
    "endpoint.inflight_records",
    "endpoint.regions",
    "host_interface.base",
    "host_interface.size",
    "host_interface.queue_sets",
    "host_interface.pci_bar",
    "net.mac",
    "net.ip",
    "net.udp_port",
    "net.peer_ip",
    "net.peer_mac",
    "entropy.source",
    "node.role",
    "node.extra",
    "node.config_from",
];

/// How the other side raises the doorbell SPI (`gic.doorbell_raise`): on
/// the card the NIC side writes `gic.doorbell_intid` to `GICD_SETSPI_NSR`;
/// QEMU's GICv3 does not implement that register (nor `GICD_TYPER.MBIS`),
/// so the twin's stand-in raises a virtio-serial device's SPI instead.
pub const DOORBELL_RAISES: &[&str] = &["setspi-nsr", "virtio-serial"];

/// The roles `node.role` may name (the node's `role=` values).
pub const NODE_ROLES: &[&str] = &["host", "serve", "workload"];

/// The entropy sources `entropy.source` may name, with the variant of
/// `entropy::Source` each is.
pub const ENTROPY_SOURCES: &[(&str, &str)] =
    &[("smccc-trng", "SmcccTrng"), ("virtio-rng", "VirtioRng")];

/// The consoles `console.kind` may name: the Elba's 16550, or the PL011
/// QEMU `virt` has in its place (the `elba-twin` configuration).
pub const CONSOLE_KINDS: &[&str] = &["ns16550a", "pl011"];

impl BoardConfig {
    /// Checks a parsed board file; the error says which key is wrong and why.
    pub fn check(b: &BoardToml) -> Result<BoardConfig, BoardError> {
        Self::check_inner(b).map_err(BoardError)
    }

    fn check_inner(b: &BoardToml) -> Result<BoardConfig, String> {
        if let Some(key) = b.keys().find(|k| !KNOWN_KEYS.contains(k)) {
            return Err(format!("board.toml: unknown key `{key}`"));
        }
        let int = |k: &str| b.int(k).map_err(|e| e.0);
        let load = int("image.load_address")?;
        let entry = int("image.entry_address")?;
        let max_size = int("image.max_size")?;
        let dram = (int("memory.dram_base")?, int("memory.dram_size")?);
        let rings = (int("rings.base")?, int("rings.size")?);
        let host_memory = (int("host_memory.local_base")?, int("host_memory.size")?);
        let rx_slots = int("rings.rx_slots")?;
        let tx_slots = int("rings.tx_slots")?;
        let endpoint = EndpointCapacities {
            connections: int("endpoint.connections")?,
            paths: int("endpoint.paths")?,
            work_entries: int("endpoint.work_entries")?,
            recv_entries: int("endpoint.recv_entries")?,
            senders: int("endpoint.senders")?,
            inflight_records: int("endpoint.inflight_records")?,
            regions: int("endpoint.regions")?,
        };
        for (key, value, max) in [
            ("connections", endpoint.connections, 1 << 24),
            ("paths", endpoint.paths, 256),
            ("work_entries", endpoint.work_entries, 1 << 30),
            ("recv_entries", endpoint.recv_entries, 1 << 30),
            ("senders", endpoint.senders, endpoint.connections.max(1)),
            ("inflight_records", endpoint.inflight_records, 1 << 30),
            ("regions", endpoint.regions, 1 << 24),
        ] {
            if value == 0 || value > max {
                return Err(format!("endpoint.{key} must be 1..={max}, got {value}"));
            }
        }
        let image = (load, max_size);
        if load % 4096 != 0 {
            return Err("image.load_address must be 4 KiB aligned".into());
        }
        if entry != load {
            return Err(
                "image.entry_address must equal image.load_address: aarch64-rt puts the entry code first in the image"
                    .into(),
            );
        }
        for (name, region) in [
            ("image", image),
            ("rings", rings),
            ("host_memory", host_memory),
        ] {
            if region.1 == 0 || !inside(region, dram) {
                return Err(format!(
                    "{name} [{:#x}, +{:#x}) must be non-empty and inside memory.dram_base/dram_size",
                    region.0, region.1
                ));
            }
        }
        if overlaps(image, rings) || overlaps(image, host_memory) || overlaps(rings, host_memory) {
            return Err("image, rings and host_memory must not overlap".into());
        }
        let host_interface = (int("host_interface.base")?, int("host_interface.size")?);
        if !host_interface.1.is_power_of_two()
            || !inside(host_interface, dram)
            || [image, rings, host_memory]
                .iter()
                .any(|r| overlaps(*r, host_interface))
        {
            return Err("host_interface must be a power of two in size, inside DRAM, and overlap nothing else".into());
        }
        let host_interface_sets = int("host_interface.queue_sets")?;
        if host_interface_sets == 0 || host_interface_sets > 8 {
            return Err("host_interface.queue_sets must be 1..=8".into());
        }
        for (name, slots) in [("rx_slots", rx_slots), ("tx_slots", tx_slots)] {
            if !slots.is_power_of_two() || slots > 1 << 15 {
                return Err(format!("rings.{name} must be a power of two up to 32768"));
            }
        }
        let core_count = int("cores.count")?;
        let cores_per_cluster = int("cores.per_cluster")?;
        let secondary_stack_pages = int("cores.stack_pages")?;
        if !(1..=16).contains(&core_count) {
            return Err("cores.count must be 1..=16 (Elba and Salina have 16 cores)".into());
        }
        if !(1..=16).contains(&cores_per_cluster) {
            return Err("cores.per_cluster must be 1..=16".into());
        }
        if secondary_stack_pages == 0 {
            return Err("cores.stack_pages must be > 0".into());
        }
        // Layout of the ring region: every core's doorbell words in the
        // first page (`doorbell_stride` apart), then each core's rx ring
        // and tx ring (each 4 KiB aligned), core after core. (The host
        // interface has a region of its own, `[host_interface]`.)
        let ring_bytes = |slots: u64| RING_HEADER_BYTES + slots * FRAME_SLOT_BYTES;
        let align = |x: u64| x.div_ceil(4096) * 4096;
        let rx_ring_offset = 4096;
        let tx_ring_offset = align(rx_ring_offset + ring_bytes(rx_slots));
        let core_ring_stride = align(tx_ring_offset + ring_bytes(tx_slots)) - rx_ring_offset;
        let frame_rings_end = rx_ring_offset + core_count * core_ring_stride;
        let rx_doorbell_offset = int("rings.rx_doorbell_offset")?;
        let tx_doorbell_offset = int("rings.tx_doorbell_offset")?;
        let doorbell_stride = int("rings.doorbell_stride")?;
        if doorbell_stride % 64 != 0 {
            return Err(
                "rings.doorbell_stride must be a multiple of 64 (a cache line per word)".into(),
            );
        }
        for (name, off) in [
            ("rx_doorbell_offset", rx_doorbell_offset),
            ("tx_doorbell_offset", tx_doorbell_offset),
        ] {
            let last = off + (core_count - 1) * doorbell_stride;
            if off % 64 != 0 || last + 4 > 4096 {
                return Err(format!(
                    "rings.{name} must be 64-byte aligned and, for every core ({core_count}, doorbell_stride apart), in the first 4 KiB of the ring region"
                ));
            }
        }
        // Every doorbell word of every core on a cache line of its own.
        let mut lines: Vec<u64> = (0..core_count)
            .flat_map(|i| {
                [rx_doorbell_offset, tx_doorbell_offset].map(|o| (o + i * doorbell_stride) / 64)
            })
            .collect();
        lines.sort_unstable();
        lines.dedup();
        if lines.len() as u64 != 2 * core_count {
            return Err(
                "rings.rx_doorbell_offset and tx_doorbell_offset must differ and no doorbell word may share a cache line with another core's (check doorbell_stride)"
                    .into(),
            );
        }
        if frame_rings_end > rings.1 {
            return Err(format!(
                "rings.size must hold the doorbell page and the frame rings of {core_count} cores ({frame_rings_end:#x} bytes)"
            ));
        }
        if host_memory.1 / core_count < 4096 {
            return Err("host_memory.size must give every core at least 4 KiB".into());
        }
        let uart = int("console.uart_base")?;
        let console_kind = b.string("console.kind").map_err(|e| e.0)?;
        if !CONSOLE_KINDS.contains(&console_kind) {
            return Err(format!(
                "console.kind `{console_kind}` is not one of: {}",
                CONSOLE_KINDS.join(", ")
            ));
        }
        let console_pl011 = console_kind == "pl011";
        let gicd = int("gic.distributor")?;
        let gicr = int("gic.redistributor")?;
        let gicr_size = int("gic.redistributor_size")?;
        let cpu_count = int("gic.cpu_count")?;
        let doorbell_intid = int("gic.doorbell_intid")?;
        if doorbell_intid != 0 && !(32..1020).contains(&doorbell_intid) {
            return Err("gic.doorbell_intid must be 0 or an SPI (32..1020)".into());
        }
        let doorbell_raise = b.string("gic.doorbell_raise").map_err(|e| e.0)?;
        if !DOORBELL_RAISES.contains(&doorbell_raise) {
            return Err(format!(
                "gic.doorbell_raise `{doorbell_raise}` is not one of: {}",
                DOORBELL_RAISES.join(", ")
            ));
        }
        let doorbell_virtio_serial = doorbell_raise == "virtio-serial";
        if cpu_count == 0 || cpu_count * 0x2_0000 > gicr_size {
            return Err(
                "gic.cpu_count redistributor frames (128 KiB each) must fit gic.redistributor_size"
                    .into(),
            );
        }
        if core_count > cpu_count {
            return Err(
                "cores.count must not exceed gic.cpu_count (one redistributor per core)".into(),
            );
        }
        let reg_shift = int("console.reg_shift")?;
        if reg_shift > 3 {
            return Err("console.reg_shift must be 0..=3".into());
        }
        let mut device_blocks: Vec<u64> = [uart, gicd, gicr, gicr + gicr_size - 1]
            .iter()
            .map(|a| a / BLOCK)
            .collect();
        device_blocks.sort();
        device_blocks.dedup();
        let normal_blocks: Vec<u64> = (dram.0 / BLOCK..(dram.0 + dram.1).div_ceil(BLOCK)).collect();
        if device_blocks.iter().any(|d| normal_blocks.contains(d)) {
            return Err(
                "MMIO (console, GIC) and DRAM share a 1 GiB block of the identity map".into(),
            );
        }
        if normal_blocks
            .iter()
            .chain(&device_blocks)
            .any(|&i| i >= 512)
        {
            return Err("addresses must be below 512 GiB (one level-1 table)".into());
        }
        let net = |k: &str| b.string(k).map_err(|e| e.0);
        let mac = parse_mac(net("net.mac")?).ok_or("net.mac must look like 02:4d:52:00:00:01")?;
        let ip = parse_ip(net("net.ip")?).ok_or("net.ip must be an IPv4 address")?;
        let peer = match (net("net.peer_ip")?, net("net.peer_mac")?) {
            ("", "") => None,
            (ip, mac) => Some((
                parse_ip(ip).ok_or("net.peer_ip must be an IPv4 address or empty")?,
                parse_mac(mac).ok_or("net.peer_mac must be a MAC address or empty")?,
            )),
        };
        let udp_port = int("net.udp_port")?;
        if udp_port == 0 || udp_port > 0xffff {
            return Err("net.udp_port must be 1..=65535".into());
        }
        let source = b.string("entropy.source").map_err(|e| e.0)?;
        let Some(&(_, entropy_source)) = ENTROPY_SOURCES.iter().find(|(name, _)| *name == source)
        else {
            let known: Vec<&str> = ENTROPY_SOURCES.iter().map(|(name, _)| *name).collect();
            return Err(format!(
                "entropy.source `{source}` is not one of: {} (there is no running without entropy)",
                known.join(", ")
            ));
        };
        let role = b.string("node.role").map_err(|e| e.0)?.to_string();
        if !NODE_ROLES.contains(&role.as_str()) {
            return Err(format!(
                "node.role `{role}` is not one of: {}",
                NODE_ROLES.join(", ")
            ));
        }
        let node_extra = b.string("node.extra").map_err(|e| e.0)?.to_string();
        let config_fw_cfg = match b.string("node.config_from").map_err(|e| e.0)? {
            "board" => false,
            "fw_cfg" => true,
            other => {
                return Err(format!(
                    "node.config_from `{other}` is not one of: board, fw_cfg"
                ))
            }
        };
        if !node_extra.is_ascii() || node_extra.contains(['"', '\\']) {
            return Err("node.extra must be ASCII `key=value` words".into());
        }
        let stack_pages = int("image.stack_pages")?;
        if stack_pages == 0 || stack_pages * 4096 >= max_size {
            return Err("image.stack_pages must be > 0 and fit image.max_size".into());
        }
        if (stack_pages + (core_count - 1) * secondary_stack_pages) * 4096 >= max_size {
            return Err(
                "image.stack_pages plus cores.stack_pages for each secondary core must fit image.max_size"
                    .into(),
            );
        }
        Ok(BoardConfig {
            load,
            entry,
            max_size,
            stack_pages,
            dram,
            uart,
            reg_shift,
            uart_clock: int("console.clock_hz")?,
            baud: int("console.baud")?,
            program_divisor: int("console.program_divisor")? != 0,
            console_pl011,
            gicd,
            gicr,
            gicr_size,
            cpu_count,
            doorbell_intid,
            doorbell_virtio_serial,
            rings,
            rx_slots,
            tx_slots,
            rx_ring_offset,
            tx_ring_offset,
            core_ring_stride,
            rx_doorbell_offset,
            tx_doorbell_offset,
            doorbell_stride,
            core_count,
            cores_per_cluster,
            secondary_stack_pages,
            host_memory,
            host_address: int("host_memory.host_address")?,
            host_interface,
            host_interface_sets,
            host_interface_bar: int("host_interface.pci_bar")?,
            mac,
            ip,
            udp_port,
            peer,
            endpoint,
            entropy_source,
            role,
            node_extra,
            config_fw_cfg,
            device_blocks,
            normal_blocks,
        })
    }

    /// The Rust constants of `metaroce_elba::board` (`$OUT_DIR/board.rs`).
    pub fn rust(&self) -> String {
        let mut s = String::from("// Generated by build.rs from board.toml. Do not edit.\n");
        let mut c = |name: &str, ty: &str, value: String, doc: &str| {
            let _ = writeln!(s, "/// {doc}\npub const {name}: {ty} = {value};");
        };
        c(
            "LOAD_ADDRESS",
            "u64",
            format!("{:#x}", self.load),
            "Where U-Boot loads the image (`image.load_address`).",
        );
        c(
            "ENTRY_ADDRESS",
            "u64",
            format!("{:#x}", self.entry),
            "Where U-Boot enters the image (`image.entry_address`).",
        );
        c(
            "MAX_IMAGE_SIZE",
            "u64",
            format!("{:#x}", self.max_size),
            "Room for image, .bss and stack (`image.max_size`).",
        );
        c(
            "STACK_PAGES",
            "usize",
            self.stack_pages.to_string(),
            "Boot stack in 4 KiB pages (`image.stack_pages`).",
        );
        c(
            "DRAM_BASE",
            "u64",
            format!("{:#x}", self.dram.0),
            "First byte of usable DRAM (`memory.dram_base`, ASSUMED).",
        );
        c(
            "DRAM_SIZE",
            "u64",
            format!("{:#x}", self.dram.1),
            "Bytes of usable DRAM (`memory.dram_size`, ASSUMED).",
        );
        c(
            "UART_BASE",
            "usize",
            format!("{:#x}", self.uart),
            "16550 console (`console.uart_base`).",
        );
        c(
            "UART_REG_SHIFT",
            "u32",
            self.reg_shift.to_string(),
            "Register stride is `1 << UART_REG_SHIFT` bytes.",
        );
        c(
            "UART_CLOCK_HZ",
            "u32",
            self.uart_clock.to_string(),
            "UART input clock (`console.clock_hz`).",
        );
        c(
            "UART_BAUD",
            "u32",
            self.baud.to_string(),
            "Console baud rate (`console.baud`).",
        );
        c(
            "CONSOLE_PL011",
            "bool",
            self.console_pl011.to_string(),
            "Whether the console is a PL011 (`console.kind`), not a 16550.",
        );
        c(
            "UART_PROGRAM_DIVISOR",
            "bool",
            self.program_divisor.to_string(),
            "Whether the firmware reprograms the console (else U-Boot's settings stay).",
        );
        c(
            "GICD_BASE",
            "usize",
            format!("{:#x}", self.gicd),
            "GICv3 distributor (`gic.distributor`).",
        );
        c(
            "GICR_BASE",
            "usize",
            format!("{:#x}", self.gicr),
            "GICv3 redistributors (`gic.redistributor`).",
        );
        c(
            "GICR_SIZE",
            "usize",
            format!("{:#x}", self.gicr_size),
            "Bytes of the redistributor region.",
        );
        c(
            "GIC_CPU_COUNT",
            "usize",
            self.cpu_count.to_string(),
            "Redistributor frames (`gic.cpu_count`).",
        );
        c(
            "DOORBELL_INTID",
            "u32",
            self.doorbell_intid.to_string(),
            "SPI raised with a doorbell; 0: none (`gic.doorbell_intid`).",
        );
        c(
            "DOORBELL_VIRTIO_SERIAL",
            "bool",
            self.doorbell_virtio_serial.to_string(),
            "Whether the doorbell SPI is a virtio-serial device's, raised by the twin's stand-in, instead of `DOORBELL_INTID` through GICD_SETSPI_NSR (`gic.doorbell_raise`).",
        );
        c(
            "RINGS_BASE",
            "usize",
            format!("{:#x}", self.rings.0),
            "Shared-memory ring region (`rings.base`, ASSUMED).",
        );
        c(
            "RINGS_SIZE",
            "usize",
            format!("{:#x}", self.rings.1),
            "Bytes of the ring region (`rings.size`).",
        );
        c(
            "RX_SLOTS",
            "u32",
            self.rx_slots.to_string(),
            "Slots of the NIC -> firmware frame ring.",
        );
        c(
            "TX_SLOTS",
            "u32",
            self.tx_slots.to_string(),
            "Slots of the firmware -> NIC frame ring.",
        );
        c(
            "RX_RING_OFFSET",
            "usize",
            format!("{:#x}", self.rx_ring_offset),
            "Offset of the rx ring in the ring region.",
        );
        c(
            "TX_RING_OFFSET",
            "usize",
            format!("{:#x}", self.tx_ring_offset),
            "Offset of the tx ring in the ring region.",
        );
        c(
            "RX_DOORBELL_OFFSET",
            "usize",
            format!("{:#x}", self.rx_doorbell_offset),
            "Offset of the rx doorbell word.",
        );
        c(
            "TX_DOORBELL_OFFSET",
            "usize",
            format!("{:#x}", self.tx_doorbell_offset),
            "Offset of the tx doorbell word.",
        );
        c(
            "CORE_RING_STRIDE",
            "usize",
            format!("{:#x}", self.core_ring_stride),
            "From one core's rx ring to the next core's (`rings.*_slots`).",
        );
        c(
            "DOORBELL_STRIDE",
            "usize",
            format!("{:#x}", self.doorbell_stride),
            "From one core's doorbell words to the next core's (`rings.doorbell_stride`).",
        );
        c(
            "CORE_COUNT",
            "usize",
            self.core_count.to_string(),
            "Cores running an engine (`cores.count`).",
        );
        c(
            "CORES_PER_CLUSTER",
            "usize",
            self.cores_per_cluster.to_string(),
            "Cores per cluster: MPIDR Aff1 = core / this, Aff0 = core % this (`cores.per_cluster`).",
        );
        c(
            "SECONDARY_STACK_PAGES",
            "usize",
            self.secondary_stack_pages.to_string(),
            "Stack of each secondary core in 4 KiB pages (`cores.stack_pages`).",
        );
        c(
            "FRAME_SLOT_BYTES",
            "usize",
            FRAME_SLOT_BYTES.to_string(),
            "Bytes per frame-ring slot (as build.rs lays them out).",
        );
        c(
            "RING_HEADER_BYTES",
            "usize",
            RING_HEADER_BYTES.to_string(),
            "Bytes of a ring header (as build.rs lays them out).",
        );
        c(
            "HOST_MEMORY_LOCAL_BASE",
            "usize",
            format!("{:#x}", self.host_memory.0),
            "Local address of the DMA window (ASSUMED).",
        );
        c(
            "HOST_MEMORY_SIZE",
            "usize",
            format!("{:#x}", self.host_memory.1),
            "Bytes of the DMA window.",
        );
        c(
            "HOST_MEMORY_HOST_ADDRESS",
            "u64",
            format!("{:#x}", self.host_address),
            "The DMA window's first byte as the host addresses it.",
        );
        c(
            "HOST_INTERFACE_BASE",
            "usize",
            format!("{:#x}", self.host_interface.0),
            "Local address of the shared-memory host interface, spec chapter 6 (ASSUMED).",
        );
        c(
            "HOST_INTERFACE_SIZE",
            "usize",
            format!("{:#x}", self.host_interface.1),
            "Bytes of the host interface (a power of two).",
        );
        c(
            "HOST_INTERFACE_QUEUE_SETS",
            "u32",
            self.host_interface_sets.to_string(),
            "Queue sets (tenants) laid out in the host interface.",
        );
        c(
            "HOST_INTERFACE_PCI_BAR",
            "u32",
            self.host_interface_bar.to_string(),
            "The PCIe BAR a host maps the host interface through (documentation).",
        );
        c(
            "MAC",
            "[u8; 6]",
            format!("{:?}", self.mac),
            "This node's MAC (`net.mac`).",
        );
        c(
            "IP",
            "[u8; 4]",
            format!("{:?}", self.ip),
            "This node's IPv4 address (`net.ip`).",
        );
        c(
            "UDP_PORT",
            "u16",
            self.udp_port.to_string(),
            "MetaRoCE UDP port (`net.udp_port`).",
        );
        let e = self.endpoint;
        for (name, ty, value, key) in [
            ("ENDPOINT_CONNECTIONS", "u32", e.connections, "connections"),
            ("ENDPOINT_PATHS", "usize", e.paths, "paths"),
            (
                "ENDPOINT_WORK_ENTRIES",
                "u32",
                e.work_entries,
                "work_entries",
            ),
            (
                "ENDPOINT_RECV_ENTRIES",
                "u32",
                e.recv_entries,
                "recv_entries",
            ),
            ("ENDPOINT_SENDERS", "u32", e.senders, "senders"),
            (
                "ENDPOINT_INFLIGHT_RECORDS",
                "u32",
                e.inflight_records,
                "inflight_records",
            ),
            ("ENDPOINT_REGIONS", "u32", e.regions, "regions"),
        ] {
            c(
                name,
                ty,
                value.to_string(),
                &format!("Endpoint capacity (`endpoint.{key}`)."),
            );
        }
        let peer = match self.peer {
            Some((ip, mac)) => format!("Some(({ip:?}, {mac:?}))"),
            None => "None".into(),
        };
        c(
            "PEER",
            "Option<([u8; 4], [u8; 6])>",
            peer,
            "Static peer (IP, MAC) connected at boot (`net.peer_ip`, `net.peer_mac`).",
        );
        c(
            "ENTROPY_SOURCE",
            "crate::entropy::Source",
            format!("crate::entropy::Source::{}", self.entropy_source),
            "Where the endpoints' secrets come from (`entropy.source`).",
        );
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        let ip = |a: [u8; 4]| std::net::Ipv4Addr::from(a).to_string();
        let mut node = format!(
            "node=0 ip={} mac={} port={} role={} cores={}",
            ip(self.ip),
            mac(self.mac),
            self.udp_port,
            self.role,
            self.core_count
        );
        if let Some((peer_ip, peer_mac)) = self.peer {
            let _ = write!(node, " peer={}/{}", ip(peer_ip), mac(peer_mac));
        }
        if !self.node_extra.is_empty() {
            let _ = write!(node, " {}", self.node_extra);
        }
        c(
            "NODE_CONFIG_FW_CFG",
            "bool",
            self.config_fw_cfg.to_string(),
            "Whether the node reads its configuration from QEMU's fw_cfg (`node.config_from`, the twin's).",
        );
        c(
            "NODE_CONFIG",
            "&str",
            format!("{node:?}"),
            "The node's configuration (`key=value` words, the node's `config`) from `[net]`, `[cores]` and `[node]`.",
        );
        c(
            "DEVICE_BLOCKS",
            "&[usize]",
            format!("&{:?}", self.device_blocks),
            "1 GiB identity-map blocks mapped as device memory (MMIO).",
        );
        c(
            "NORMAL_BLOCKS",
            "&[usize]",
            format!("&{:?}", self.normal_blocks),
            "1 GiB identity-map blocks mapped as normal memory (DRAM).",
        );
        s
    }

    /// The linker's `memory.ld`: the `image` region at the load address.
    pub fn memory_ld(&self) -> String {
        format!(
            "/* Generated by build.rs from board.toml. Do not edit. */\nMEMORY\n{{\n\timage : ORIGIN = {:#x}, LENGTH = {:#x}\n}}\n",
            self.load, self.max_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_numbers_and_strings() {
        let b = BoardToml::parse(
            "# head\n[image]\nload_address = 0xC008_0000 # comment\nstack_pages = 256\n\n[net]\nmac = \"02:00#:00\"\nempty = \"\"\n",
        )
        .unwrap();
        assert_eq!(b.int("image.load_address").unwrap(), 0xC008_0000);
        assert_eq!(b.int("image.stack_pages").unwrap(), 256);
        assert_eq!(b.string("net.mac").unwrap(), "02:00#:00");
        assert_eq!(b.string("net.empty").unwrap(), "");
        assert!(b.int("net.mac").is_err());
        assert!(b.string("image.stack_pages").is_err());
        assert!(b.int("image.missing").is_err());
        assert_eq!(b.keys().count(), 4);
    }

    const BOARD: &str = include_str!("board.toml");

    fn check(text: &str) -> Result<BoardConfig, BoardError> {
        BoardConfig::check(&BoardToml::parse(text)?)
    }

    /// The board file with one line replaced (the line must exist).
    fn edited(old: &str, new: &str) -> String {
        assert!(BOARD.contains(old), "board.toml has no `{old}`");
        BOARD.replacen(old, new, 1)
    }

    #[test]
    fn the_board_file_checks_and_generates() {
        let cfg = check(BOARD).unwrap();
        assert_eq!((cfg.load, cfg.entry), (0xC008_0000, 0xC008_0000));
        assert_eq!(cfg.device_blocks, [0]);
        assert_eq!(cfg.normal_blocks, [3]);
        assert_eq!(cfg.rx_ring_offset, 0x1000);
        assert!(cfg.peer.is_none());
        // 16 cores, each an rx and a tx ring of 64 slots (96 KiB + header,
        // 100 KiB aligned) after the doorbell page.
        assert_eq!(cfg.core_count, 16);
        assert_eq!(cfg.core_ring_stride, 2 * 0x19000);
        assert!(cfg.rx_ring_offset + 16 * cfg.core_ring_stride <= cfg.rings.1);
        let rust = cfg.rust();
        assert!(rust.contains("pub const LOAD_ADDRESS: u64 = 0xc0080000;"));
        assert!(rust.contains("pub const UART_BASE: usize = 0x4800;"));
        assert!(rust.contains("pub const NORMAL_BLOCKS: &[usize] = &[3];"));
        assert!(rust.contains("pub const MAC: [u8; 6] = [2, 77, 82, 0, 0, 1];"));
        assert!(rust.contains("pub const CORE_COUNT: usize = 16;"));
        assert!(rust.contains("pub const CORES_PER_CLUSTER: usize = 4;"));
        assert!(rust.contains("pub const CORE_RING_STRIDE: usize = 0x32000;"));
        assert!(rust.contains("pub const DOORBELL_VIRTIO_SERIAL: bool = false;"));
        assert!(rust.contains(
            "pub const ENTROPY_SOURCE: crate::entropy::Source = crate::entropy::Source::SmcccTrng;"
        ));
        assert!(cfg
            .memory_ld()
            .contains("image : ORIGIN = 0xc0080000, LENGTH = 0x4000000"));
    }

    #[test]
    fn bad_board_values_are_refused_with_the_reason() {
        for (old, new, reason) in [
            (
                "entry_address = 0xC008_0000",
                "entry_address = 0xC008_1000",
                "entry_address",
            ),
            (
                "load_address = 0xC008_0000",
                "load_address = 0xC008_0800",
                "4 KiB aligned",
            ),
            ("base = 0xC800_0000", "base = 0xC000_0000", "overlap"),
            (
                "dram_size = 0x4000_0000",
                "dram_size = 0x0800_0000",
                "inside memory",
            ),
            (
                "uart_base = 0x4800",
                "uart_base = 0xC000_4800",
                "1 GiB block",
            ),
            ("rx_slots = 64", "rx_slots = 63", "power of two"),
            (
                "source = \"smccc-trng\"",
                "source = \"timer\"",
                "not one of: smccc-trng",
            ),
            (
                "tx_doorbell_offset = 0x0000_0040",
                "tx_doorbell_offset = 0x0000_0000",
                "must differ",
            ),
            ("doorbell_intid = 96", "doorbell_intid = 27", "SPI"),
            (
                "doorbell_raise = \"setspi-nsr\"",
                "doorbell_raise = \"msi\"",
                "not one of: setspi-nsr, virtio-serial",
            ),
            ("cpu_count = 16", "cpu_count = 17", "cpu_count"),
            ("reg_shift = 2", "reg_shift = 4", "reg_shift"),
            (
                "mac = \"02:4d:52:00:00:01\"",
                "mac = \"02:4d:52\"",
                "net.mac",
            ),
            ("udp_port = 4795", "udp_port = 0", "udp_port"),
            ("peer_ip = \"\"", "peer_ip = \"10.0.0.2\"", "peer_mac"),
            ("stack_pages = 256", "stack_pages = 20000", "stack_pages"),
            ("[net]", "[net]\nmtu = 9000", "unknown key `net.mtu`"),
            ("count = 16", "count = 17", "cores.count must be 1..=16"),
            ("count = 16", "count = 0", "cores.count must be 1..=16"),
            ("per_cluster = 4", "per_cluster = 0", "cores.per_cluster"),
            ("stack_pages = 128", "stack_pages = 0", "cores.stack_pages"),
            (
                "stack_pages = 128",
                "stack_pages = 2048",
                "for each secondary core must fit image.max_size",
            ),
            (
                "doorbell_stride = 0x80",
                "doorbell_stride = 0x40",
                "cache line",
            ),
            (
                "doorbell_stride = 0x80",
                "doorbell_stride = 0x200",
                "first 4 KiB",
            ),
            (
                "doorbell_stride = 0x80",
                "doorbell_stride = 0x44",
                "multiple of 64",
            ),
            (
                "rx_slots = 64",
                "rx_slots = 1024",
                "the frame rings of 16 cores",
            ),
            (
                "cpu_count = 16",
                "cpu_count = 8",
                "cores.count must not exceed gic.cpu_count",
            ),
            ("baud = 115_200", "baud = \"fast\"", "integer"),
        ] {
            let e = check(&edited(old, new)).unwrap_err();
            assert!(e.0.contains(reason), "`{new}`: {e} lacks `{reason}`");
        }
        let peer = edited("peer_ip = \"\"", "peer_ip = \"10.0.0.2\"");
        let peer = peer.replacen("peer_mac = \"\"", "peer_mac = \"02:4d:52:00:00:02\"", 1);
        assert_eq!(
            check(&peer).unwrap().peer,
            Some(([10, 0, 0, 2], [2, 0x4d, 0x52, 0, 0, 2]))
        );
        assert!(
            check(&edited("[gic]", "")).is_err(),
            "keys outside a section"
        );
    }

    #[test]
    fn bad_lines_are_typed_errors_with_line_numbers() {
        for (text, line) in [
            ("[a\n", 1),
            ("[a]\nx = 0xZZ\n", 2),
            ("x = 1\nx = 2\n", 2),
            ("x 1\n", 1),
            ("x = \"open\n", 1),
            ("x = 1__0\n", 1),
            ("x = 99999999999999999999\n", 1),
            ("x = -1\n", 1),
            ("bad key = 1\n", 1),
        ] {
            let e = BoardToml::parse(text).unwrap_err();
            assert!(e.0.contains(&format!("line {line}:")), "{text:?} gave {e}");
        }
    }
}
