//! Two MetaRoCE endpoints, each driven by its own engine loop with host
//! queues and host memory, exchange WRITE / WRITE_IMM / SEND / READ through
//! a seeded lossy, reordering wire, on one thread and a virtual clock (fully
//! deterministic). Every byte placed is checked against the sender's pattern.
//! The same run goes once over Ethernet frames (`Engine::poll`, a frame
//! device) and once over datagrams (`Engine::poll_datagrams`, a link whose
//! owner has the lower layers, as the host's sockets and the simulator do).

use std::collections::VecDeque;
use std::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, PeerAddr, RecvRequest, Region, RxMeta,
    Status, WorkRequest,
};
use metaroce_core::wire::MemoryTarget;
use metaroce_core::{Config, Endpoint, Event, Heap, Instant, Layout};
use metaroce_platform::device::{MemFrameDevice, MemLink};
use metaroce_platform::dma::HostWindow;
use metaroce_platform::net::NetConfig;
use metaroce_platform::probe;
use metaroce_platform::random::{RandomSource, XorShiftRng};
use metaroce_platform::{
    DatagramLink, DatagramTarget, Engine, EnginePort, FrameDevice, HostPort, HostQueues,
};
use smoltcp::wire::{EthernetAddress, IpAddress, Ipv4Address};

type Queues = HostQueues<32, 32, 64, 4>;
const BASE: u64 = 0x10_0000_0000;
const MEM: usize = 256 * 1024;
const LEN: u32 = 6000;
const LOSS_PCT: u64 = 5;
const REORDER_PCT: u64 = 10;

fn net(n: u8) -> NetConfig {
    NetConfig {
        mac: EthernetAddress([0x02, 0, 0, 0, 0, n]),
        ip: Ipv4Address::new(198, 18, 0, n),
    }
}

/// A datagram link in memory: what this node sent, and what arrives.
#[derive(Default)]
struct VecLink {
    sent: VecDeque<(DatagramTarget, Vec<u8>)>,
    arriving: VecDeque<(RxMeta, Vec<u8>)>,
}

impl DatagramLink for VecLink {
    fn max_packet_len(&self) -> usize {
        1500
    }

    fn receive<R>(&mut self, f: impl FnOnce(&RxMeta, &[u8]) -> R) -> Option<R> {
        let (meta, packet) = self.arriving.pop_front()?;
        Some(f(&meta, &packet))
    }

    fn transmit_ready(&mut self) -> bool {
        self.sent.len() < 256
    }

    fn transmit<R>(
        &mut self,
        to: DatagramTarget,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let mut packet = vec![0; len];
        let r = f(&mut packet);
        self.sent.push_back((to, packet));
        Some(r)
    }
}

/// The wire a side is attached by: its frame device and the device's far
/// end (where the wire takes frames out and puts them in), or a link.
enum Wire<'a> {
    Frames {
        device: MemFrameDevice<'a, 256>,
        far: MemFrameDevice<'a, 256>,
    },
    Datagrams(VecLink),
}

struct Side<'a> {
    n: u8,
    engine: Engine,
    endpoint: Endpoint<Heap, 8>,
    wire: Wire<'a>,
    memory: Vec<u8>,
}

impl<'a> Side<'a> {
    fn new(n: u8, peer: u8, wire: Wire<'a>, seed: u64) -> Self {
        let mut engine = Engine::new(net(n));
        engine.add_static_neighbor(net(peer).ip, net(peer).mac);
        Side {
            n,
            engine,
            endpoint: Endpoint::new(
                config(),
                Layout::for_connections(4).heap_storage(),
                metaroce_core::rng::seed_from_u64(seed),
            ),
            wire,
            memory: vec![0; MEM],
        }
    }

    fn poll(&mut self, now: Instant, port: &mut EnginePort<'_, 32, 32, 64, 4>) {
        let mut window = HostWindow::new(BASE, &mut self.memory);
        let _ = match &mut self.wire {
            Wire::Frames { device, .. } => {
                self.engine
                    .poll(now, &mut self.endpoint, device, port, &mut window)
            }
            Wire::Datagrams(link) => {
                self.engine
                    .poll_datagrams(now, &mut self.endpoint, link, port, &mut window)
            }
        };
    }
}

/// The emulation settings with payloads that fit a 1514-byte frame.
fn config() -> Config {
    Config {
        mtu: 1024,
        ..Config::for_emulation()
    }
}

fn pattern(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; LEN as usize];
    XorShiftRng::new(seed).fill_bytes(&mut v);
    v
}

/// Moves what `from` sent to `to`, dropping `loss_pct` % and holding some
/// back one round (reordering), deterministically from `rng`.
fn carry(
    from: &mut Side<'_>,
    to: &mut Side<'_>,
    held: &mut VecDeque<Vec<u8>>,
    rng: &mut XorShiftRng,
    loss_pct: u64,
) -> u64 {
    let mut dropped = 0;
    let mut out: Vec<Vec<u8>> = held.drain(..).collect();
    let source = PeerAddr {
        ip: IpAddress::Ipv4(net(from.n).ip),
        port: 0,
    };
    loop {
        // Frames travel whole; datagrams as (entropy port, ECN, payload).
        let item = match &mut from.wire {
            Wire::Frames { far, .. } => far.receive(|f| f.to_vec()),
            Wire::Datagrams(link) => link.sent.pop_front().map(|(to, p)| {
                let mut item = vec![to.ecn];
                item.extend_from_slice(&to.src_port.to_be_bytes());
                item.extend_from_slice(&p);
                item
            }),
        };
        let Some(item) = item else { break };
        match rng.next_u64() % 100 {
            r if r < loss_pct => dropped += 1,
            r if r < loss_pct + REORDER_PCT => held.push_back(item),
            _ => out.push(item),
        }
    }
    for item in out {
        match &mut to.wire {
            Wire::Frames { far, .. } => assert!(far.send_frame(&item), "wire ring overflow"),
            Wire::Datagrams(link) => {
                let meta = RxMeta {
                    source: PeerAddr {
                        port: u16::from_be_bytes([item[1], item[2]]),
                        ..source
                    },
                    ce: item[0] == metaroce_core::wire::encap::ecn::CE,
                };
                link.arriving.push_back((meta, item[3..].to_vec()));
            }
        }
    }
    dropped
}

fn wait_key(
    host: &mut HostPort<'_, 32, 32, 64, 4>,
    side: &mut Side<'_>,
    port: &mut EnginePort<'_, 32, 32, 64, 4>,
) -> u32 {
    host.register_region(
        7,
        Region {
            base: BASE,
            len: MEM as u64,
            access: Access::ALL,
            pd: 0,
        },
    )
    .unwrap();
    side.poll(Instant::ZERO, port);
    host.poll_admin().unwrap().result.unwrap()
}

#[test]
fn endpoints_move_rdma_work_through_the_frame_loop_under_loss_and_reordering() {
    // Two endpoints and their engines are large for the default test stack.
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            let link_a: MemLink<256> = MemLink::new();
            let link_b: MemLink<256> = MemLink::new();
            let (device, far) = link_a.ends().unwrap();
            let a = Side::new(1, 2, Wire::Frames { device, far }, 11);
            let (device, far) = link_b.ends().unwrap();
            let b = Side::new(2, 1, Wire::Frames { device, far }, 22);
            run_pair(a, b);
            // The per-packet path's shape (this thread's engines only):
            // each received frame's headers parsed at most once
            // (`rx_parses_per_packet` <= 1), each completion moved once,
            // from the transport into the host's ring (`completion_hops`).
            let p = probe::probes();
            assert!(p.rx_frames > 0 && p.completions > 0, "{p:?}");
            assert!(p.rx_parses <= p.rx_frames, "a frame parsed twice: {p:?}");
            assert_eq!(p.completion_hops, p.completions, "{p:?}");
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn endpoints_move_rdma_work_through_the_datagram_loop_under_loss_and_reordering() {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            let a = Side::new(1, 2, Wire::Datagrams(VecLink::default()), 11);
            let b = Side::new(2, 1, Wire::Datagrams(VecLink::default()), 22);
            run_pair(a, b);
            // The link's owner parsed the headers; one hop per completion.
            let p = probe::probes();
            assert_eq!((p.rx_frames, p.rx_parses), (0, 0), "{p:?}");
            assert!(p.completions > 0, "{p:?}");
            assert_eq!(p.completion_hops, p.completions, "{p:?}");
        })
        .unwrap()
        .join()
        .unwrap();
}

fn run_pair(mut a: Side<'_>, mut b: Side<'_>) {
    let (qa, qb) = (Queues::new(), Queues::new());
    let (mut host_a, mut port_a) = qa.split().unwrap();
    let (mut host_b, mut port_b) = qb.split().unwrap();
    let key_a = wait_key(&mut host_a, &mut a, &mut port_a);
    let key_b = wait_key(&mut host_b, &mut b, &mut port_b);

    // Sources at A, READ source at B.
    for i in 0..3u64 {
        let at = (i * u64::from(LEN)) as usize;
        a.memory[at..at + LEN as usize].copy_from_slice(&pattern(i + 1));
    }
    b.memory[128 * 1024..128 * 1024 + LEN as usize].copy_from_slice(&pattern(4));

    let peer_b = PeerAddr {
        ip: IpAddress::Ipv4(net(2).ip),
        port: a.endpoint.config().udp_port,
    };
    let conn_a = a.endpoint.connect(Instant::ZERO, peer_b, 0).unwrap();
    let local = |i: u64| LocalBuf {
        key: key_a,
        addr: BASE + i * u64::from(LEN),
        len: LEN,
    };
    let remote = |at: u64| MemoryTarget {
        key: key_b,
        addr: BASE + at,
    };
    let wrs = [
        WorkRequest {
            id: 1,
            op: Op::Write { remote: remote(0) },
            local: local(0),
        },
        WorkRequest {
            id: 2,
            op: Op::WriteImm {
                remote: remote(16 * 1024),
                imm: 5,
            },
            local: local(1),
        },
        WorkRequest {
            id: 3,
            op: Op::Send,
            local: local(2),
        },
        WorkRequest {
            id: 4,
            op: Op::Read {
                remote: remote(128 * 1024),
            },
            local: LocalBuf {
                key: key_a,
                addr: BASE + 64 * 1024,
                len: LEN,
            },
        },
    ];
    for wr in wrs {
        host_a.post_send(conn_a, wr).unwrap();
    }

    let mut rng = XorShiftRng::new(2026);
    let (mut held_ab, mut held_ba) = (VecDeque::new(), VecDeque::new());
    let mut conn_b: Option<ConnHandle> = None;
    let mut done_a: Vec<Completion> = Vec::new();
    let mut done_b: Vec<Completion> = Vec::new();
    let mut dropped = 0;
    let mut now = Instant::ZERO;
    for _ in 0..200_000 {
        now += Duration::from_micros(20);
        a.poll(now, &mut port_a);
        b.poll(now, &mut port_b);
        while let Some(event) = b.endpoint.poll_event() {
            if let Event::Connected(h) = event {
                conn_b = Some(h);
                for (id, at) in [(10u64, 32 * 1024u64), (11, 48 * 1024)] {
                    host_b
                        .post_recv(
                            h,
                            RecvRequest {
                                id,
                                local: LocalBuf {
                                    key: key_b,
                                    addr: BASE + at,
                                    len: 8192,
                                },
                            },
                        )
                        .unwrap();
                }
            }
        }
        dropped += carry(&mut a, &mut b, &mut held_ab, &mut rng, LOSS_PCT);
        dropped += carry(&mut b, &mut a, &mut held_ba, &mut rng, LOSS_PCT);
        done_a.extend(std::iter::from_fn(|| host_a.poll_completion()));
        done_b.extend(std::iter::from_fn(|| host_b.poll_completion()));
        if done_a.len() == wrs.len() && done_b.len() == 2 {
            break;
        }
    }
    assert!(conn_b.is_some(), "B accepted the connection");
    let mut summary: Vec<(u64, Opcode, Status)> = done_a
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status))
        .collect();
    summary.sort_by_key(|s| s.0);
    assert_eq!(
        summary,
        [
            (1, Opcode::Write, Status::Success),
            (2, Opcode::WriteImm, Status::Success),
            (3, Opcode::Send, Status::Success),
            (4, Opcode::Read, Status::Success),
        ]
    );
    let recv: Vec<(u64, Opcode, Option<u32>)> =
        done_b.iter().map(|c| (c.wr_id, c.opcode, c.imm)).collect();
    assert_eq!(
        recv,
        [
            (10, Opcode::RecvWriteImm, Some(5)),
            (11, Opcode::Recv, None)
        ]
    );
    let l = LEN as usize;
    assert!(b.memory[..l] == pattern(1)[..], "WRITE placed");
    assert!(
        b.memory[16 * 1024..16 * 1024 + l] == pattern(2)[..],
        "WRITE_IMM placed"
    );
    assert!(
        b.memory[48 * 1024..48 * 1024 + l] == pattern(3)[..],
        "SEND placed"
    );
    assert!(
        a.memory[64 * 1024..64 * 1024 + l] == pattern(4)[..],
        "READ placed"
    );
    assert!(dropped > 0, "the wire dropped frames");
    assert!(a.engine.stats().rx_transport > 0 && b.engine.stats().rx_transport > 0);
}
