//! Reads `board.toml` (the one board configuration) and generates:
//! - `$OUT_DIR/board.rs`: the constants of `metaroce_elba::board`;
//! - `$OUT_DIR/memory.ld`: the linker's `image` region at the load address.
//!
//! Every address is checked here (alignment, inside DRAM, no overlaps), so
//! a bad edit fails the build with a message instead of a dead board.
//! For the bare-metal target it also passes the linker scripts:
//! aarch64-rt's `image.ld`, the generated `memory.ld` and defmt's `defmt.x`.

#[path = "board_toml.rs"]
mod board_toml;

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

use board_toml::BoardToml;

/// Bytes of one frame slot of the shared-memory rings (`shm::FrameDescriptor`).
const FRAME_SLOT_BYTES: u64 = 1536;
/// Bytes of a ring header (`shm::RingHeader`): three cache lines.
const RING_HEADER_BYTES: u64 = 192;
/// Granule of the identity map's blocks (level-1 blocks of 1 GiB).
const BLOCK: u64 = 1 << 30;

fn main() {
    println!("cargo::rerun-if-changed=board.toml");
    println!("cargo::rerun-if-changed=board_toml.rs");
    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let text = fs::read_to_string(dir.join("board.toml"))
        .unwrap_or_else(|e| fail(&format!("cannot read board.toml: {e}")));
    let board = BoardToml::parse(&text).unwrap_or_else(|e| fail(&e.0));
    let cfg = Config::read(&board).unwrap_or_else(|e| fail(&e));
    fs::write(out.join("board.rs"), cfg.rust()).expect("write board.rs");
    fs::write(out.join("memory.ld"), cfg.memory_ld()).expect("write memory.ld");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("none") {
        println!("cargo::rustc-link-search={}", out.display());
        println!("cargo::rustc-link-arg-bins=-Timage.ld");
        println!("cargo::rustc-link-arg-bins=-Tmemory.ld");
        println!("cargo::rustc-link-arg-bins=-Tdefmt.x");
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}

struct Config {
    load: u64,
    entry: u64,
    max_size: u64,
    stack_pages: u64,
    dram: (u64, u64),
    uart: u64,
    reg_shift: u64,
    uart_clock: u64,
    baud: u64,
    program_divisor: bool,
    gicd: u64,
    gicr: u64,
    gicr_size: u64,
    cpu_count: u64,
    doorbell_intid: u64,
    rings: (u64, u64),
    rx_slots: u64,
    tx_slots: u64,
    rx_ring_offset: u64,
    tx_ring_offset: u64,
    host_queues_offset: u64,
    rx_doorbell_offset: u64,
    tx_doorbell_offset: u64,
    host_memory: (u64, u64),
    host_address: u64,
    mac: [u8; 6],
    ip: [u8; 4],
    udp_port: u64,
    peer: Option<([u8; 4], [u8; 6])>,
    device_blocks: Vec<u64>,
    normal_blocks: Vec<u64>,
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

/// Every key the board file may set: a misspelt key is an error, not a
/// silently ignored setting.
const KNOWN_KEYS: &[&str] = &[
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
    "gic.distributor",
    "gic.redistributor",
    "gic.redistributor_size",
    "gic.cpu_count",
    "gic.doorbell_intid",
    "rings.base",
    "rings.size",
    "rings.rx_slots",
    "rings.tx_slots",
    "rings.host_queues_offset",
    "rings.rx_doorbell_offset",
    "rings.tx_doorbell_offset",
    "host_memory.local_base",
    "host_memory.size",
    "host_memory.host_address",
    "net.mac",
    "net.ip",
    "net.udp_port",
    "net.peer_ip",
    "net.peer_mac",
];

impl Config {
    fn read(b: &BoardToml) -> Result<Config, String> {
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
        for (name, slots) in [("rx_slots", rx_slots), ("tx_slots", tx_slots)] {
            if !slots.is_power_of_two() || slots > 1 << 15 {
                return Err(format!("rings.{name} must be a power of two up to 32768"));
            }
        }
        // Layout of the ring region: doorbell words in the first page, then
        // the rx ring, then the tx ring (each 4 KiB aligned), then the host
        // queues at their configured offset.
        let ring_bytes = |slots: u64| RING_HEADER_BYTES + slots * FRAME_SLOT_BYTES;
        let align = |x: u64| x.div_ceil(4096) * 4096;
        let rx_ring_offset = 4096;
        let tx_ring_offset = align(rx_ring_offset + ring_bytes(rx_slots));
        let frame_rings_end = align(tx_ring_offset + ring_bytes(tx_slots));
        let host_queues_offset = int("rings.host_queues_offset")?;
        let rx_doorbell_offset = int("rings.rx_doorbell_offset")?;
        let tx_doorbell_offset = int("rings.tx_doorbell_offset")?;
        for (name, off) in [
            ("rx_doorbell_offset", rx_doorbell_offset),
            ("tx_doorbell_offset", tx_doorbell_offset),
        ] {
            if off % 64 != 0 || off + 4 > 4096 {
                return Err(format!(
                    "rings.{name} must be 64-byte aligned and in the first 4 KiB of the ring region"
                ));
            }
        }
        if rx_doorbell_offset == tx_doorbell_offset {
            return Err("rings.rx_doorbell_offset and tx_doorbell_offset must differ".into());
        }
        if host_queues_offset % 4096 != 0
            || host_queues_offset < frame_rings_end
            || host_queues_offset >= rings.1
        {
            return Err(format!(
                "rings.host_queues_offset must be 4 KiB aligned, at least {frame_rings_end:#x} (after the frame rings) and inside rings.size"
            ));
        }
        let uart = int("console.uart_base")?;
        let gicd = int("gic.distributor")?;
        let gicr = int("gic.redistributor")?;
        let gicr_size = int("gic.redistributor_size")?;
        let cpu_count = int("gic.cpu_count")?;
        let doorbell_intid = int("gic.doorbell_intid")?;
        if doorbell_intid != 0 && !(32..1020).contains(&doorbell_intid) {
            return Err("gic.doorbell_intid must be 0 or an SPI (32..1020)".into());
        }
        if cpu_count == 0 || cpu_count * 0x2_0000 > gicr_size {
            return Err(
                "gic.cpu_count redistributor frames (128 KiB each) must fit gic.redistributor_size"
                    .into(),
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
        let stack_pages = int("image.stack_pages")?;
        if stack_pages == 0 || stack_pages * 4096 >= max_size {
            return Err("image.stack_pages must be > 0 and fit image.max_size".into());
        }
        Ok(Config {
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
            gicd,
            gicr,
            gicr_size,
            cpu_count,
            doorbell_intid,
            rings,
            rx_slots,
            tx_slots,
            rx_ring_offset,
            tx_ring_offset,
            host_queues_offset,
            rx_doorbell_offset,
            tx_doorbell_offset,
            host_memory,
            host_address: int("host_memory.host_address")?,
            mac,
            ip,
            udp_port,
            peer,
            device_blocks,
            normal_blocks,
        })
    }

    fn rust(&self) -> String {
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
            "HOST_QUEUES_OFFSET",
            "usize",
            format!("{:#x}", self.host_queues_offset),
            "Offset of the host-interface queues.",
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

    fn memory_ld(&self) -> String {
        format!(
            "/* Generated by build.rs from board.toml. Do not edit. */\nMEMORY\n{{\n\timage : ORIGIN = {:#x}, LENGTH = {:#x}\n}}\n",
            self.load, self.max_size
        )
    }
}
