//! The bench role (`role=bench`): what the firmware's per-packet work
//! costs on this CPU, counted by the Performance Monitors Unit. Two
//! measurements, one console line each:
//!
//! ```text
//! METAROCE-BENCH crc32 bytes=4148 packets=2000 instructions_x10=... cycles_x10=... crc=1 aes=0 check=...
//! METAROCE-BENCH engine payload=1024 packets=2000 instructions_x10=... cycles_x10=... acks=... polls=... retransmits=...
//! ```
//!
//! **crc32**: the CRC-32 trailer of a 4 KiB WRITE data packet (28-byte
//! common header, 24-byte WRITE extension, 4096 bytes of payload: 4148
//! bytes covered) exactly as the engine computes it for every packet it
//! sends and receives (`metaroce_core::wire::packet::crc32`), [`PACKETS`]
//! times. `crc`/`aes` say which CPU features the firmware was compiled
//! for, so which code path crc32fast took (table-driven, `crc32x` chains,
//! or `PMULL` folding). `check` is the CRC itself, so a wrong path cannot
//! go unnoticed.
//!
//! **engine**: the whole engine loop, as the node runs it, for one
//! 1 KiB WRITE data packet (the QEMU MTU): two engines on this core, each
//! with its own endpoint, host queues and host memory, joined by an
//! in-memory link (the rings a core of a multi-core node uses). A host
//! driver keeps 32 WRITEs posted on one connection; each packet costs the
//! sender's TX (host queue, endpoint, Ethernet/IP/UDP, DMA gather, CRC),
//! the receiver's RX (parse, CRC check, DMA placement) and its share of
//! an ACK each way, and the completion back to the driver. Divided by
//! the data packets in the window: `acks` is the receiver's packets per
//! 100 data packets, `polls` the engine polls per 100 data packets
//! (counted work includes polls that found nothing), `retransmits` must
//! be 0.
//!
//! `instructions_x10` and `cycles_x10` are ten times the count per packet
//! (one decimal without floating point). Under QEMU with
//! `-icount shift=0` the instruction count is exact and the cycle count
//! is the same number (QEMU does not model the core's pipeline); on an
//! Elba the cycle count is the real one. `cargo xtask bench --firmware`
//! runs it for each CPU setting and prints the table.

use core::net::Ipv4Addr;

use metaroce_core::api::{Access, ConnHandle, LocalBuf, Op, PeerAddr, Region, WorkRequest};
use metaroce_core::config::CcAlgorithm;
use metaroce_core::wire::{MemoryTarget, DEFAULT_UDP_PORT};
use metaroce_core::{Config, Event, Instant};
use metaroce_platform::device::MemLink;
use metaroce_platform::dma::HostWindow;
use metaroce_platform::net::NetConfig;
use metaroce_platform::Engine;
use smoltcp::wire::{EthernetAddress, IpAddress};

use crate::engine::{
    self, NodeDevice, NodeEndpoint, NodeEnginePort, NodeHostPort, NodeMemory, NodeQueues,
    LINK_SLOTS,
};
use crate::hw;
use crate::println;
use crate::workload::HOST_BASE;

/// Packets per measurement: enough that the loop's own cost and the
/// counters' start/stop vanish in the average.
const PACKETS: u64 = 2000;
/// Bytes the trailer covers in a 4 KiB WRITE data packet.
const COVERED: usize = metaroce_core::wire::HEADER_LEN + 24 + 4096;
/// WRITE payload of the engine measurement: one packet at the QEMU MTU.
const PAYLOAD: u32 = 1024;
/// WRITEs the engine measurement keeps posted.
const DEPTH: u32 = 32;
/// WRITEs completed before counting starts (handshake, window opening).
const WARMUP: u64 = 256;
/// Polls of both engines without a completion before giving up.
const STALL_POLLS: u32 = 1_000_000;

static LINK: MemLink<LINK_SLOTS> = MemLink::new();

/// Runs the measurements and exits QEMU with status 0 (1 if the engine
/// measurement could not run).
pub fn run(host_memory: &'static mut [u8]) -> ! {
    crc();
    match engine_cycle(host_memory) {
        Ok(()) => hw::exit(0),
        Err(why) => {
            println!("METAROCE-ERROR bench: {}", why);
            hw::exit(1)
        }
    }
}

fn crc() {
    let mut packet = [0u8; COVERED];
    for (i, byte) in packet.iter_mut().enumerate() {
        // Any pattern; not all zeros, so the CRC is not trivially constant.
        *byte = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    // Warm-up: page-table walks and the first touch of the tables.
    let mut check = metaroce_core::wire::packet::crc32(&[&packet]);
    hw::pmu_start();
    for i in 0..PACKETS {
        // A different packet each time (its PSN field), as in a real
        // stream, and the result kept, so nothing is hoisted out of the loop.
        packet[16..24].copy_from_slice(&i.to_be_bytes());
        check ^= metaroce_core::wire::packet::crc32(&[core::hint::black_box(&packet)]);
    }
    let counts = hw::pmu_read();
    println!(
        "METAROCE-BENCH crc32 bytes={} packets={} instructions_x10={} cycles_x10={} crc={} aes={} check={}",
        COVERED,
        PACKETS,
        counts.instructions * 10 / PACKETS,
        counts.cycles * 10 / PACKETS,
        u8::from(cfg!(target_feature = "crc")),
        u8::from(cfg!(target_feature = "aes")),
        check
    );
}

/// One engine with everything around it, as a node has it.
struct Side<'a> {
    engine: Engine,
    endpoint: NodeEndpoint,
    device: NodeDevice,
    window: HostWindow<'static>,
    host: NodeHostPort<'a>,
    port: NodeEnginePort<'a>,
    key: Option<u32>,
    conn: Option<ConnHandle>,
}

impl Side<'_> {
    fn poll(&mut self, now: Instant) -> bool {
        let polled = engine::poll(
            &mut self.engine,
            now,
            &mut self.endpoint,
            &mut self.device,
            &mut self.port,
            NodeMemory::Window(&mut self.window),
        );
        if self.key.is_none() {
            if let Some(result) = self.host.poll_admin() {
                self.key = result.result.ok();
            }
        }
        while let Some(event) = engine::poll_event(&mut self.endpoint) {
            if let Event::Incoming { conn, .. } | Event::Connected(conn) = event {
                self.conn = Some(conn);
            }
        }
        polled.busy
    }
}

const SENDER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const RECEIVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const SENDER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const RECEIVER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn engine_cycle(memory: &'static mut [u8]) -> Result<(), &'static str> {
    let (Some((mut sender_end, mut receiver_end)), Some(storage)) =
        (LINK.ends(), crate::multicore::core_storage())
    else {
        return Err("statics taken twice");
    };
    // The Elba's build: each core's rings lead to a NIC that computes UDP
    // checksums, so the engines leave them to it.
    let nic_checksums = cfg!(feature = "nic-checksums");
    sender_end.set_nic_udp_checksums(nic_checksums);
    receiver_end.set_nic_udp_checksums(nic_checksums);
    let config = Config {
        mtu: PAYLOAD as u16,
        // No pacing and no congestion window to wait for: what is
        // counted is the per-packet work, not waiting.
        cc: CcAlgorithm::Fixed,
        link_rate_mbps: u32::MAX,
        ..Config::for_emulation()
    };
    let seed = metaroce_core::rng::seed_from_u64(1);
    let half = memory.len() / 2;
    let (sender_memory, receiver_memory) = memory.split_at_mut(half);
    let mut shares = storage.into_iter();
    let (Some(sender_storage), Some(receiver_storage)) = (shares.next(), shares.next()) else {
        return Err("endpoint storage does not split");
    };
    let sender_queues = NodeQueues::new();
    let receiver_queues = NodeQueues::new();
    let (Some((sender_host, sender_port)), Some((receiver_host, receiver_port))) =
        (sender_queues.split(), receiver_queues.split())
    else {
        return Err("host queues split twice");
    };
    let side = |ip: Ipv4Addr, mac, peer_ip, peer_mac, storage, device, memory, host, port| {
        let mut engine = Engine::new(NetConfig {
            mac: EthernetAddress(mac),
            ip,
        });
        engine.add_static_neighbor(peer_ip, EthernetAddress(peer_mac));
        Side {
            engine,
            endpoint: NodeEndpoint::new(config, storage, seed),
            device,
            window: HostWindow::new(HOST_BASE, memory),
            host,
            port,
            key: None,
            conn: None,
        }
    };
    let mut sender = side(
        SENDER_IP,
        SENDER_MAC,
        RECEIVER_IP,
        RECEIVER_MAC,
        sender_storage,
        NodeDevice::Link(sender_end),
        sender_memory,
        sender_host,
        sender_port,
    );
    let mut receiver = side(
        RECEIVER_IP,
        RECEIVER_MAC,
        SENDER_IP,
        SENDER_MAC,
        receiver_storage,
        NodeDevice::Link(receiver_end),
        receiver_memory,
        receiver_host,
        receiver_port,
    );
    for s in [&mut sender, &mut receiver] {
        let region = Region {
            base: HOST_BASE,
            len: half as u64,
            access: Access::ALL,
            pd: 0,
        };
        s.host
            .register_region(1, region)
            .map_err(|_| "admin queue full")?;
    }
    let peer = PeerAddr {
        ip: IpAddress::Ipv4(RECEIVER_IP),
        port: DEFAULT_UDP_PORT,
    };
    let conn =
        engine::connect(&mut sender.endpoint, hw::now(), peer, 0).map_err(|_| "connect refused")?;
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut stalled = 0u32;
    let mut counting: Option<(u64, u64, u64)> = None;
    let mut polls = 0u64;
    let end = WARMUP + PACKETS;
    while completed < end {
        let now = hw::now();
        let mut busy = sender.poll(now) | receiver.poll(now);
        polls += 2;
        while let Some(c) = sender.host.poll_completion() {
            if c.status != metaroce_core::api::Status::Success {
                return Err("a WRITE failed");
            }
            completed += 1;
            busy = true;
            if completed == WARMUP {
                counting = Some((
                    polls,
                    receiver.engine.stats().tx_transport,
                    sender.endpoint.stats(conn).map_or(0, |s| s.retransmissions),
                ));
                hw::pmu_start();
            }
        }
        if let (Some(key), Some(_), true) = (receiver.key, sender.key, sender.conn.is_some()) {
            while posted < end && posted - completed < u64::from(DEPTH) {
                let slot = posted % 64 * u64::from(PAYLOAD);
                let wr = WorkRequest {
                    id: posted,
                    op: Op::Write {
                        remote: MemoryTarget {
                            key,
                            addr: HOST_BASE + slot,
                        },
                    },
                    local: LocalBuf {
                        key: sender.key.unwrap_or(0),
                        addr: HOST_BASE + slot,
                        len: PAYLOAD,
                    },
                };
                if sender.host.post_send(conn, wr).is_err() {
                    break;
                }
                posted += 1;
            }
        }
        stalled = if busy { 0 } else { stalled + 1 };
        if stalled > STALL_POLLS {
            return Err("the transfer stalled");
        }
    }
    let counts = hw::pmu_read();
    let Some((polls_before, acks_before, retransmits_before)) = counting else {
        return Err("counting never started");
    };
    let acks = receiver.engine.stats().tx_transport - acks_before;
    let retransmits =
        sender.endpoint.stats(conn).map_or(0, |s| s.retransmissions) - retransmits_before;
    println!(
        "METAROCE-BENCH engine payload={} packets={} instructions_x10={} cycles_x10={} acks={} polls={} retransmits={}",
        PAYLOAD,
        PACKETS,
        counts.instructions * 10 / PACKETS,
        counts.cycles * 10 / PACKETS,
        acks * 100 / PACKETS,
        (polls - polls_before) * 100 / PACKETS,
        retransmits
    );
    Ok(())
}
