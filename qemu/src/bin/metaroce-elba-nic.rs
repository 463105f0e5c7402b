//! `metaroce-elba-nic`: the host-side stand-in for the Elba's NIC pipeline
//! between Elba twins (`cargo xtask qemu --board elba-twin`). Each twin's
//! RAM is a shared file (QEMU `memory-backend-file,share=on`), so the
//! twin's per-core frame rings (`boards/pensando-elba/drivers/src/shm.rs`)
//! are in it. This program moves every frame a core of one twin puts on
//! its tx ring to the rx ring of the core of the other twin that owns the
//! frame's connection, by the steering rule of the Elba's README (the
//! table slot in the destination connection id, the connect hash for a
//! CONNECT, core 0 for ARP and ICMP: `metaroce_platform::shard`), drops
//! the given share of frames on the way (a lossy fabric), and rings the
//! rx doorbell word of each core it fed. Like the NIC it stands for, it
//! offloads checksums (the descriptor flags of `shm.rs`): it computes the
//! UDP checksum of every frame sent with `FLAG_TX_UDP_CHECKSUM`, and
//! verifies the IPv4 header and UDP checksums of every frame it delivers,
//! setting `FLAG_RX_CHECKSUMS_GOOD` when they are good (counted otherwise:
//! `bad_checksum`). Frames for a core whose rx ring
//! is full wait in a queue of that core's (up to `BACKLOG` frames, then
//! they are dropped and counted), as a NIC's buffers would hold them, so
//! the drops are the configured loss rather than the cores' polling.
//!
//! On the card the NIC side then writes the doorbell SPI's INTID to
//! `GICD_SETSPI_NSR` to wake the core. QEMU's GICv3 ignores writes to that
//! register (and a process outside QEMU cannot write the guest's MMIO), so
//! with `--bell` this program raises the SPI of a virtio-serial device of
//! each twin instead (`gic.doorbell_raise = "virtio-serial"`): after
//! feeding core 0 of a twin, the one core that takes the doorbell SPI, it
//! writes a byte to that device's socket. It prints its counters every
//! second, and runs until the `--stop` file exists (then prints them once
//! more and exits).

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use metaroce_core::Shard;
use metaroce_platform::shard::{Dispatcher, ShardMap, Steer};
use metaroce_platform::shmem::SharedMemory;
use metaroce_verbs::SharedFile;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, Ipv6Packet, UdpPacket,
    ETHERNET_HEADER_LEN,
};

#[derive(Debug, Parser)]
#[command(
    name = "metaroce-elba-nic",
    about = "Move frames between two Elba twins' per-core rings, steered to each connection's core"
)]
struct Args {
    /// The twins' RAM files (exactly two).
    #[arg(long, num_args = 2, required = true)]
    ram: Vec<PathBuf>,
    /// Guest physical address of the first byte of each RAM file.
    #[arg(long, value_parser = parse_int, default_value = "0x40000000")]
    ram_base: u64,
    /// Guest physical address of the ring region (`rings.base`).
    #[arg(long, value_parser = parse_int)]
    rings_base: u64,
    /// Offsets in the ring region (`cores::layout`): core 0's rx ring, its
    /// tx ring, from one core's rings to the next's, its doorbell words
    /// and from one core's doorbells to the next's.
    #[arg(long, value_parser = parse_int)]
    rx_ring: u64,
    #[arg(long, value_parser = parse_int)]
    tx_ring: u64,
    #[arg(long, value_parser = parse_int)]
    ring_stride: u64,
    #[arg(long, value_parser = parse_int)]
    rx_doorbell: u64,
    #[arg(long, value_parser = parse_int)]
    doorbell_stride: u64,
    /// Cores of each twin.
    #[arg(long)]
    cores: usize,
    /// Connection-table slots of each twin (the workload role: 64 a core).
    #[arg(long)]
    table_slots: u32,
    /// MetaRoCE's UDP port.
    #[arg(long, default_value_t = 4795)]
    port: u16,
    /// Share of frames dropped, in percent.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Seed of the drops.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop once this file exists.
    #[arg(long)]
    stop: PathBuf,
    /// The sockets of the twins' virtio-serial doorbell lines (QEMU
    /// `-chardev socket,server=on`), in the order of --ram.
    #[arg(long, num_args = 2)]
    bell: Vec<PathBuf>,
}

/// A twin's doorbell line: the socket of its virtio-serial device, whose
/// SPI stands in for the one `GICD_SETSPI_NSR` raises on the card.
struct Bell {
    path: Option<PathBuf>,
    socket: Option<UnixStream>,
}

impl Bell {
    /// Raises the line (one byte); whether the byte went out. Connects at
    /// the first use; a full socket means the line is raised already.
    fn ring(&mut self) -> bool {
        if self.socket.is_none() {
            let Some(path) = &self.path else {
                return false;
            };
            self.socket = UnixStream::connect(path)
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .ok();
        }
        match self.socket.as_mut().map(|s| s.write(&[1])) {
            Some(Ok(1)) => true,
            Some(Err(e)) if e.kind() != std::io::ErrorKind::WouldBlock => {
                self.socket = None;
                false
            }
            _ => false,
        }
    }
}

fn parse_int(s: &str) -> Result<u64, String> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| e.to_string())
}

/// The ring header's words (`shm::RingHeader`) and the slots after it.
const MAGIC: u32 = u32::from_le_bytes(*b"MRRG");
const SLOTS_AT: u64 = 8;
const HEAD_AT: u64 = 0x40;
const TAIL_AT: u64 = 0x80;
const HEADER_BYTES: u64 = 192;
const SLOT_BYTES: u64 = 1536;
const DATA_AT: u64 = 4;
const DATA_BYTES: usize = 1532;
/// The descriptor flags (`boards/pensando-elba/drivers/src/shm.rs`).
const FLAG_TX_UDP_CHECKSUM: u16 = 1 << 0;
const FLAG_RX_CHECKSUMS_GOOD: u16 = 1 << 1;

/// The host's end of one shared-memory ring (the ring protocol of
/// `shm.rs`: head and tail are free-running counters; the producer
/// writes the slot, then head with Release; the consumer reads head with
/// Acquire, the slot, then writes tail with Release).
#[derive(Debug, Clone, Copy)]
struct Ring {
    at: u64,
}

impl Ring {
    /// The slot count, once the firmware has formatted the ring.
    fn slots(&self, m: &SharedMemory<'_>) -> Option<u32> {
        if m.load_u32(self.at).ok()? != MAGIC {
            return None;
        }
        let n = m.load_u32(self.at + SLOTS_AT).ok()?;
        (n.is_power_of_two() && n <= 1 << 15).then_some(n)
    }

    fn slot(&self, index: u32, slots: u32) -> u64 {
        self.at + HEADER_BYTES + u64::from(index & (slots - 1)) * SLOT_BYTES
    }

    /// Takes the next frame the firmware sent, into `out`; its flags.
    fn pop(&self, m: &SharedMemory<'_>, out: &mut Vec<u8>) -> Option<u16> {
        let slots = self.slots(m)?;
        let head = m.load_u32(self.at + HEAD_AT).ok()?;
        let tail = m.load_u32(self.at + TAIL_AT).ok()?;
        let fill = head.wrapping_sub(tail);
        if fill == 0 || fill > slots {
            return None;
        }
        let slot = self.slot(tail, slots);
        let mut words = [0u8; 4];
        m.copy_out(slot, &mut words).ok()?;
        let len = usize::from(u16::from_le_bytes([words[0], words[1]])).min(DATA_BYTES);
        out.resize(len, 0);
        m.copy_out(slot + DATA_AT, out).ok()?;
        m.store_u32(self.at + TAIL_AT, tail.wrapping_add(1)).ok()?;
        Some(u16::from_le_bytes([words[2], words[3]]))
    }

    /// Gives the firmware a frame with `flags`; `None` if the ring is full.
    fn push(&self, m: &SharedMemory<'_>, frame: &[u8], flags: u16) -> Option<()> {
        let slots = self.slots(m)?;
        let head = m.load_u32(self.at + HEAD_AT).ok()?;
        let tail = m.load_u32(self.at + TAIL_AT).ok()?;
        if head.wrapping_sub(tail) >= slots || frame.len() > DATA_BYTES {
            return None;
        }
        let slot = self.slot(head, slots);
        let len = u16::try_from(frame.len()).ok()?;
        m.copy_in(slot, &len.to_le_bytes()).ok()?;
        m.copy_in(slot + 2, &flags.to_le_bytes()).ok()?;
        m.copy_in(slot + DATA_AT, frame).ok()?;
        m.store_u32(self.at + HEAD_AT, head.wrapping_add(1)).ok()
    }
}

/// Frames a core's queue holds while its rx ring is full.
const BACKLOG: usize = 4096;

/// The IP addresses and the UDP datagram's place in an IPv4 or IPv6 UDP
/// frame; `None` for anything else.
fn udp_of(frame: &[u8]) -> Option<(IpAddress, IpAddress, usize)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let at = ETHERNET_HEADER_LEN;
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let ip = Ipv4Packet::new_checked(&frame[at..]).ok()?;
            (ip.next_header() == IpProtocol::Udp).then(|| {
                let udp = at + usize::from(ip.header_len());
                (ip.src_addr().into(), ip.dst_addr().into(), udp)
            })
        }
        EthernetProtocol::Ipv6 => {
            let ip = Ipv6Packet::new_checked(&frame[at..]).ok()?;
            (ip.next_header() == IpProtocol::Udp)
                .then(|| (ip.src_addr().into(), ip.dst_addr().into(), at + 40))
        }
        _ => None,
    }
}

/// Computes and writes a UDP frame's checksum, as the NIC's transmit
/// checksum offload does; other frames are left as they are.
fn fill_udp_checksum(frame: &mut [u8]) {
    if let Some((src, dst, at)) = udp_of(frame) {
        if let Ok(mut udp) = UdpPacket::new_checked(&mut frame[at..]) {
            udp.fill_checksum(&src, &dst);
        }
    }
}

/// Whether a frame's checksums are good, as the NIC's receive checksum
/// offload finds them: a UDP frame whose IPv4 header checksum (IPv6 has
/// none) and UDP checksum verify. Anything else gets no verdict.
fn checksums_good(frame: &[u8]) -> bool {
    let Some((src, dst, at)) = udp_of(frame) else {
        return false;
    };
    let ip_ok = match EthernetFrame::new_unchecked(frame).ethertype() {
        EthernetProtocol::Ipv4 => {
            Ipv4Packet::new_unchecked(&frame[ETHERNET_HEADER_LEN..]).verify_checksum()
        }
        _ => true,
    };
    ip_ok && UdpPacket::new_checked(&frame[at..]).is_ok_and(|udp| udp.verify_checksum(&src, &dst))
}

/// One twin: its RAM, and per core its rings, rx doorbell word and the
/// frames waiting for room in its rx ring.
struct Twin {
    backlog: Vec<VecDeque<Vec<u8>>>,
    file: SharedFile,
    rx: Vec<Ring>,
    tx: Vec<Ring>,
    bells: Vec<u64>,
    line: Bell,
    dispatcher: Dispatcher<ShardMap>,
}

#[derive(Debug, Default)]
struct Counters {
    moved: u64,
    lost: u64,
    full: u64,
    unroutable: u64,
    /// UDP frames delivered whose checksums were wrong (without
    /// `FLAG_RX_CHECKSUMS_GOOD`, for the engine to find and count).
    bad_checksum: u64,
    /// Bytes written to the twin's doorbell line.
    spi: u64,
    per_core: Vec<[u64; 2]>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(map) = ShardMap::for_table(
        Shard::index_bits(args.table_slots),
        args.table_slots,
        args.cores,
    ) else {
        eprintln!("metaroce-elba-nic: the table does not split between the cores");
        return ExitCode::from(2);
    };
    let ring_base = args.rings_base - args.ram_base;
    let mut twins = Vec::new();
    for (n, path) in args.ram.iter().enumerate() {
        let file = match SharedFile::open(path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("metaroce-elba-nic: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        };
        let at = |off: u64, core: usize, stride: u64| ring_base + off + core as u64 * stride;
        twins.push(Twin {
            backlog: vec![VecDeque::new(); args.cores],
            file,
            rx: (0..args.cores)
                .map(|c| Ring {
                    at: at(args.rx_ring, c, args.ring_stride),
                })
                .collect(),
            tx: (0..args.cores)
                .map(|c| Ring {
                    at: at(args.tx_ring, c, args.ring_stride),
                })
                .collect(),
            bells: (0..args.cores)
                .map(|c| at(args.rx_doorbell, c, args.doorbell_stride))
                .collect(),
            line: Bell {
                path: args.bell.get(n).cloned(),
                socket: None,
            },
            dispatcher: Dispatcher::new(map, args.cores, args.port),
        });
    }
    let mut counters = vec![
        Counters {
            per_core: vec![[0; 2]; args.cores],
            ..Counters::default()
        },
        Counters {
            per_core: vec![[0; 2]; args.cores],
            ..Counters::default()
        },
    ];
    let mut rng = args.seed | 1;
    let mut frame = Vec::with_capacity(DATA_BYTES);
    let mut next_report = Instant::now() + Duration::from_secs(1);
    loop {
        let mut moved = false;
        for from in 0..2 {
            let to = 1 - from;
            let mut fed = vec![false; args.cores];
            for core in 0..args.cores {
                for _ in 0..64 {
                    let src = twins[from].file.view();
                    let Some(flags) = twins[from].tx[core].pop(&src, &mut frame) else {
                        break;
                    };
                    if flags & FLAG_TX_UDP_CHECKSUM != 0 {
                        fill_udp_checksum(&mut frame);
                    }
                    moved = true;
                    counters[from].per_core[core][0] += 1;
                    twins[from].dispatcher.note_sent(core, &frame);
                    // xorshift64: the drops of a seed repeat.
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if (rng % 1_000_000) as f64 <= args.loss * 10_000.0 - 1.0 {
                        counters[from].lost += 1;
                        continue;
                    }
                    let targets: Vec<usize> = match twins[to].dispatcher.steer(&frame) {
                        Steer::Core(c) => vec![c],
                        Steer::AllCores => (0..args.cores).collect(),
                        Steer::Drop => {
                            counters[from].unroutable += 1;
                            continue;
                        }
                    };
                    for c in targets {
                        if twins[to].backlog[c].len() < BACKLOG {
                            twins[to].backlog[c].push_back(frame.clone());
                        } else {
                            counters[from].full += 1;
                        }
                    }
                }
            }
            let twin = &mut twins[to];
            let dst = twin.file.view();
            for (c, queue) in twin.backlog.iter_mut().enumerate() {
                while let Some(frame) = queue.front() {
                    let good = checksums_good(frame);
                    let flags = if good { FLAG_RX_CHECKSUMS_GOOD } else { 0 };
                    if twin.rx[c].push(&dst, frame, flags).is_none() {
                        break;
                    }
                    if !good && udp_of(frame).is_some() {
                        counters[to].bad_checksum += 1;
                    }
                    queue.pop_front();
                    counters[from].moved += 1;
                    counters[to].per_core[c][1] += 1;
                    fed[c] = true;
                    moved = true;
                }
            }
            for (c, fed) in fed.iter().enumerate() {
                if *fed {
                    let bell = twin.bells[c];
                    if let Ok(v) = dst.load_u32(bell) {
                        let _ = dst.store_u32(bell, v.wrapping_add(1));
                    }
                }
            }
            // Core 0 takes the doorbell SPI: raise it after its doorbell.
            if fed[0] && twin.line.ring() {
                counters[to].spi += 1;
            }
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(1);
            report(&counters);
            if args.stop.exists() {
                break;
            }
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    report(&counters);
    ExitCode::SUCCESS
}

fn report(counters: &[Counters]) {
    for (twin, c) in counters.iter().enumerate() {
        let tx: Vec<String> = c.per_core.iter().map(|p| p[0].to_string()).collect();
        let rx: Vec<String> = c.per_core.iter().map(|p| p[1].to_string()).collect();
        println!(
            "ELBA-NIC twin={twin} moved={} lost={} backlog_full={} unroutable={} bad_checksum={} spi={} tx_per_core={} rx_per_core={}",
            c.moved,
            c.lost,
            c.full,
            c.unroutable,
            c.bad_checksum,
            c.spi,
            tx.join(","),
            rx.join(",")
        );
    }
}
