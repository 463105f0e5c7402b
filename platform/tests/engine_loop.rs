//! The engine loop against in-memory devices: ARP and ICMP answers, a fake
//! device on another thread, and two engines moving RDMA work between their
//! host queues over an in-memory link with the bring-up transport.

#[path = "support/datagram.rs"]
mod datagram;

use std::sync::atomic::{AtomicBool, Ordering};

use datagram::DatagramTransport;
use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, Opcode, PeerAddr, RecvRequest, Region, Status,
    WorkRequest,
};
use metaroce_core::wire::MemoryTarget;
use metaroce_core::Instant;
use metaroce_platform::device::{MemFrameDevice, MemLink};
use metaroce_platform::dma::HostWindow;
use metaroce_platform::net::NetConfig;
use metaroce_platform::random::{RandomSource, XorShiftRng};
use metaroce_platform::{Engine, FrameDevice, HostPort, HostQueues};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, Icmpv4Packet, Icmpv4Repr, IpAddress, IpProtocol, Ipv4Address, Ipv4Packet,
    Ipv4Repr,
};

const PORT: u16 = 4795;
type Queues = HostQueues<16, 16, 32, 4>;
type Port<'a> = HostPort<'a, 16, 16, 32, 4>;

fn mac(n: u8) -> EthernetAddress {
    EthernetAddress([0x02, 0, 0, 0, 0, n])
}

fn ip(n: u8) -> Ipv4Address {
    Ipv4Address::new(198, 18, 0, n)
}

fn node(n: u8) -> NetConfig {
    NetConfig {
        mac: mac(n),
        ip: ip(n),
    }
}

fn arp_request_frame(from: u8, target: Ipv4Address) -> Vec<u8> {
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: mac(from),
        source_protocol_addr: ip(from),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    };
    let mut buf = vec![0u8; 14 + repr.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
    EthernetRepr {
        src_addr: mac(from),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EthernetProtocol::Arp,
    }
    .emit(&mut eth);
    repr.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    buf
}

fn echo_request_frame(from: u8, to: u8, ident: u16, seq_no: u16, data: &[u8]) -> Vec<u8> {
    let caps = ChecksumCapabilities::default();
    let icmp = Icmpv4Repr::EchoRequest {
        ident,
        seq_no,
        data,
    };
    let mut buf = vec![0u8; 14 + 20 + icmp.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut buf[..]);
    EthernetRepr {
        src_addr: mac(from),
        dst_addr: mac(to),
        ethertype: EthernetProtocol::Ipv4,
    }
    .emit(&mut eth);
    let mut ipp = Ipv4Packet::new_unchecked(eth.payload_mut());
    Ipv4Repr {
        src_addr: ip(from),
        dst_addr: ip(to),
        next_header: IpProtocol::Icmp,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    }
    .emit(&mut ipp, &caps);
    icmp.emit(&mut Icmpv4Packet::new_unchecked(ipp.payload_mut()), &caps);
    buf
}

/// One node's pieces, owned by the thread that polls it.
struct Node<'a> {
    engine: Engine,
    transport: DatagramTransport<4>,
    device: MemFrameDevice<'a, 64>,
    memory: Vec<u8>,
}

const MEM_BASE: u64 = 0x8000_0000;

impl<'a> Node<'a> {
    fn new(n: u8, peer: u8, device: MemFrameDevice<'a, 64>) -> Self {
        let mut engine = Engine::new(node(n));
        engine.add_static_neighbor(ip(peer), mac(peer));
        let transport = DatagramTransport::new(
            PORT,
            &[PeerAddr {
                ip: IpAddress::Ipv4(ip(peer)),
                port: PORT,
            }],
        );
        Node {
            engine,
            transport,
            device,
            memory: vec![0; 64 * 1024],
        }
    }

    fn poll(
        &mut self,
        now: Instant,
        port: &mut metaroce_platform::EnginePort<'_, 16, 16, 32, 4>,
    ) -> bool {
        let mut window = HostWindow::new(MEM_BASE, &mut self.memory);
        self.engine
            .poll(
                now,
                &mut self.transport,
                &mut self.device,
                port,
                &mut window,
            )
            .busy
    }
}

#[test]
fn answers_arp_requests_for_its_address_only() {
    let link: MemLink<64> = MemLink::new();
    let (dev, mut wire) = link.ends().unwrap();
    let mut n = Node::new(1, 2, dev);
    let queues = Queues::new();
    let (_host, mut port) = queues.split().unwrap();
    assert!(wire.send_frame(&arp_request_frame(7, ip(1))));
    assert!(wire.send_frame(&arp_request_frame(7, ip(9))));
    n.poll(Instant::from_micros(1), &mut port);
    let reply = wire.receive(|f| f.to_vec()).expect("an ARP reply");
    assert!(
        wire.receive(|f| f.len()).is_none(),
        "no reply for another address"
    );
    assert_eq!(reply.len(), 60, "padded to the Ethernet minimum");
    let eth = EthernetFrame::new_checked(&reply[..]).unwrap();
    assert_eq!(eth.dst_addr(), mac(7));
    assert_eq!(eth.src_addr(), mac(1));
    assert_eq!(eth.ethertype(), EthernetProtocol::Arp);
    let arp = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    assert_eq!(
        arp,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: mac(1),
            source_protocol_addr: ip(1),
            target_hardware_addr: mac(7),
            target_protocol_addr: ip(7),
        }
    );
    assert_eq!(n.engine.neighbor(ip(7)), Some(mac(7)), "requester learned");
    let stats = n.engine.stats();
    assert_eq!((stats.rx_arp, stats.arp_replies + 1), (2, 1));
    assert_eq!(stats.rx_not_ours, 1);
}

#[test]
fn answers_icmp_echo_with_checksummed_reply() {
    let link: MemLink<64> = MemLink::new();
    let (dev, mut wire) = link.ends().unwrap();
    let mut n = Node::new(1, 2, dev);
    let queues = Queues::new();
    let (_host, mut port) = queues.split().unwrap();
    let data: Vec<u8> = (0..200u8).collect();
    assert!(wire.send_frame(&echo_request_frame(2, 1, 0x1234, 7, &data)));
    n.poll(Instant::from_micros(1), &mut port);
    let reply = wire.receive(|f| f.to_vec()).expect("an echo reply");
    let caps = ChecksumCapabilities::default();
    let eth = EthernetFrame::new_checked(&reply[..]).unwrap();
    assert_eq!((eth.src_addr(), eth.dst_addr()), (mac(1), mac(2)));
    let ipp = Ipv4Packet::new_checked(eth.payload()).unwrap();
    assert!(ipp.verify_checksum());
    let ip_repr = Ipv4Repr::parse(&ipp, &caps).unwrap();
    assert_eq!((ip_repr.src_addr, ip_repr.dst_addr), (ip(1), ip(2)));
    let icmp = Icmpv4Packet::new_checked(ipp.payload()).unwrap();
    assert!(icmp.verify_checksum());
    assert_eq!(
        Icmpv4Repr::parse(&icmp, &caps).unwrap(),
        Icmpv4Repr::EchoReply {
            ident: 0x1234,
            seq_no: 7,
            data: &data
        }
    );
    assert_eq!(n.engine.stats().echo_replies_sent, 1);
}

#[test]
fn malformed_and_foreign_frames_are_counted_not_fatal() {
    let link: MemLink<64> = MemLink::new();
    let (dev, mut wire) = link.ends().unwrap();
    let mut n = Node::new(1, 2, dev);
    let queues = Queues::new();
    let (_host, mut port) = queues.split().unwrap();
    let mut rng = XorShiftRng::new(42);
    let mut sent = 0;
    for round in 0..200 {
        let len = (rng.next_u64() % 1514) as usize;
        let mut frame = vec![0u8; len];
        rng.fill_bytes(&mut frame);
        if len >= 14 && round % 2 == 0 {
            // Address some to us so the IP/UDP parsers see garbage too.
            frame[..6].copy_from_slice(&mac(1).0);
            frame[12..14].copy_from_slice(&[0x08, 0x00]);
        }
        if wire.send_frame(&frame) {
            sent += 1;
        }
        n.poll(Instant::from_micros(round), &mut port);
        while wire.receive(|_| ()).is_some() {}
    }
    let stats = n.engine.stats();
    assert_eq!(stats.rx_frames, sent);
    assert_eq!(
        stats.rx_not_ours + stats.rx_malformed + stats.rx_arp + stats.rx_icmp + stats.rx_transport,
        sent
    );
}

/// A transport frame from node 2 to node 1 (its UDP payload arbitrary
/// bytes), with one payload byte flipped after the checksums were
/// computed when `corrupt`.
fn transport_frame(corrupt: bool) -> Vec<u8> {
    use metaroce_core::wire::encap::{ecn, EncapRepr, IpPair};
    let encap = EncapRepr {
        src_mac: mac(2),
        dst_mac: mac(1),
        ip: IpPair::V4 {
            src: ip(2),
            dst: ip(1),
        },
        src_port: 0xc001,
        dst_port: PORT,
        dscp: 0,
        ecn: ecn::ECT0,
        hop_limit: 64,
    };
    let payload: Vec<u8> = (0..96u8).collect();
    let mut frame = vec![0u8; encap.frame_len(payload.len())];
    encap
        .emit(&mut frame, payload.len(), |p| p.copy_from_slice(&payload))
        .unwrap();
    if corrupt {
        *frame.last_mut().unwrap() ^= 0x10;
    }
    frame
}

/// A frame whose UDP checksum is wrong is dropped and counted when it
/// comes from a device that did not verify it (a copy from a wire); one an
/// engine wrote into the in-memory link is not verified again (it cannot
/// have been corrupted in memory), so the same bytes go through.
#[test]
fn checksums_are_verified_unless_the_device_vouches() {
    let link: MemLink<64> = MemLink::new();
    let (dev, mut wire) = link.ends().unwrap();
    let mut n = Node::new(1, 2, dev);
    let queues = Queues::new();
    let (_host, mut port) = queues.split().unwrap();
    let (good, bad) = (transport_frame(false), transport_frame(true));
    assert!(metaroce_core::wire::encap::parse_frame(&bad, PORT).is_err());

    assert!(wire.send_frame(&good));
    assert!(wire.send_frame(&bad));
    n.poll(Instant::from_micros(1), &mut port);
    let stats = n.engine.stats();
    assert_eq!((stats.rx_transport, stats.rx_malformed), (1, 1));

    // Written in place by the other end, as another engine does.
    wire.transmit(bad.len(), |slot| slot.copy_from_slice(&bad))
        .unwrap();
    n.poll(Instant::from_micros(2), &mut port);
    let stats = n.engine.stats();
    assert_eq!((stats.rx_transport, stats.rx_malformed), (2, 1));
}

/// A fake device on another thread pings the engine and resolves it by ARP
/// while this thread runs the loop.
#[test]
fn fake_device_thread_gets_answers_through_the_loop() {
    let link: MemLink<64> = MemLink::new();
    let (dev, mut wire) = link.ends().unwrap();
    let mut n = Node::new(1, 2, dev);
    let queues = Queues::new();
    let (_host, mut port) = queues.split().unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut answers = Vec::new();
            for seq in 0..20u16 {
                let frame = if seq % 2 == 0 {
                    arp_request_frame(2, ip(1))
                } else {
                    echo_request_frame(2, 1, 9, seq, &seq.to_be_bytes())
                };
                while !wire.send_frame(&frame) {
                    std::thread::yield_now();
                }
                loop {
                    if let Some(f) = wire.receive(|f| f.to_vec()) {
                        answers.push(f);
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
            answers
        });
        let mut t = 0;
        while !done.load(Ordering::Acquire) {
            t += 1;
            if !n.poll(Instant::from_micros(t), &mut port) {
                std::thread::yield_now();
            }
        }
    });
    let stats = n.engine.stats();
    assert_eq!((stats.rx_arp, stats.rx_icmp), (10, 10));
    assert_eq!((stats.arp_replies + 10, stats.echo_replies_sent), (10, 10));
    assert_eq!(stats.tx_frames, 20);
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = XorShiftRng::new(seed);
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

fn wait_admin(
    host: &mut Port<'_>,
    node: &mut Node<'_>,
    port: &mut metaroce_platform::EnginePort<'_, 16, 16, 32, 4>,
) -> u32 {
    for t in 0..100 {
        node.poll(Instant::from_micros(t), port);
        if let Some(r) = host.poll_admin() {
            return r.result.expect("registration");
        }
    }
    panic!("no admin result");
}

/// Two engines on two threads, each with its host queues and memory, move
/// WRITE, WRITE_IMM, SEND and READ over an in-memory link; the receiver
/// checks every byte against the sender's pattern.
#[test]
fn two_engines_move_rdma_work_between_host_queues() {
    const LEN: u32 = 5000;
    let link: MemLink<64> = MemLink::new();
    let (dev_a, dev_b) = link.ends().unwrap();
    let receiver_ready = AtomicBool::new(false);
    let sender_done = AtomicBool::new(false);
    let conn = ConnHandle {
        index: 0,
        generation: 0,
    };
    let region = |access| Region {
        base: MEM_BASE,
        len: 64 * 1024,
        access,
        pd: 0,
    };
    let (a_completions, b_result) = std::thread::scope(|s| {
        let b = s.spawn(|| {
            let mut node = Node::new(2, 1, dev_b);
            let queues = Queues::new();
            let (mut host, mut port) = queues.split().unwrap();
            host.register_region(1, region(Access::ALL)).unwrap();
            let key = wait_admin(&mut host, &mut node, &mut port);
            assert_eq!(key, 1);
            // The READ source: B's pattern at +48 KiB.
            let read_src = pattern(4, LEN as usize);
            node.memory[48 * 1024..48 * 1024 + LEN as usize].copy_from_slice(&read_src);
            for (i, at) in [(10u64, 16 * 1024u64), (11, 32 * 1024)] {
                host.post_recv(
                    conn,
                    RecvRequest {
                        id: i,
                        local: LocalBuf {
                            key,
                            addr: MEM_BASE + at,
                            len: 8 * 1024,
                        },
                    },
                )
                .unwrap();
            }
            let mut completions: Vec<Completion> = Vec::new();
            let mut t = 0;
            while completions.len() < 2 || !sender_done.load(Ordering::Acquire) {
                t += 1;
                assert!(t < 50_000_000, "receiver hung");
                let busy = node.poll(Instant::from_micros(t), &mut port);
                if host.take_completion_doorbell() {
                    while let Some(c) = host.poll_completion() {
                        completions.push(c);
                    }
                }
                if node.engine.stats().posted_recvs == 2 {
                    receiver_ready.store(true, Ordering::Release);
                }
                if !busy {
                    std::thread::yield_now();
                }
            }
            (completions, node.memory, node.transport.stats())
        });
        let a = s.spawn(|| {
            let mut node = Node::new(1, 2, dev_a);
            let queues = Queues::new();
            let (mut host, mut port) = queues.split().unwrap();
            host.register_region(1, region(Access::ALL)).unwrap();
            let key = wait_admin(&mut host, &mut node, &mut port);
            for (i, chunk) in node.memory.chunks_mut(LEN as usize).take(3).enumerate() {
                chunk.copy_from_slice(&pattern(i as u64 + 1, LEN as usize));
            }
            while !receiver_ready.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            let local = |i: u64| LocalBuf {
                key,
                addr: MEM_BASE + i * u64::from(LEN),
                len: LEN,
            };
            let remote = MemoryTarget {
                key: 1,
                addr: MEM_BASE,
            };
            let wrs = [
                WorkRequest {
                    id: 1,
                    op: Op::Write { remote },
                    local: local(0),
                },
                WorkRequest {
                    id: 2,
                    op: Op::WriteImm {
                        remote: MemoryTarget {
                            key: 1,
                            addr: MEM_BASE + 8 * 1024,
                        },
                        imm: 77,
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
                        remote: MemoryTarget {
                            key: 1,
                            addr: MEM_BASE + 48 * 1024,
                        },
                    },
                    local: LocalBuf {
                        key,
                        addr: MEM_BASE + 40 * 1024,
                        len: LEN,
                    },
                },
                // Refused at post: outside any region.
                WorkRequest {
                    id: 5,
                    op: Op::Send,
                    local: LocalBuf {
                        key,
                        addr: 0,
                        len: 1,
                    },
                },
            ];
            for wr in wrs {
                host.post_send(conn, wr).unwrap();
            }
            let mut completions = Vec::new();
            let mut t = 0;
            while completions.len() < wrs.len() {
                t += 1;
                assert!(t < 50_000_000, "sender hung");
                let busy = node.poll(Instant::from_micros(t), &mut port);
                while let Some(c) = host.poll_completion() {
                    completions.push(c);
                }
                if !busy {
                    std::thread::yield_now();
                }
            }
            sender_done.store(true, Ordering::Release);
            let read_back = node.memory[40 * 1024..40 * 1024 + LEN as usize].to_vec();
            (completions, read_back)
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    let (mut a_done, read_back) = a_completions;
    a_done.sort_by_key(|c| c.wr_id);
    let summary: Vec<(u64, Opcode, Status)> = a_done
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status))
        .collect();
    assert_eq!(
        summary,
        [
            (1, Opcode::Write, Status::Success),
            (2, Opcode::WriteImm, Status::Success),
            (3, Opcode::Send, Status::Success),
            (4, Opcode::Read, Status::Success),
            (5, Opcode::Send, Status::LocalProtection),
        ]
    );
    assert!(
        read_back == pattern(4, LEN as usize),
        "READ brought B's pattern"
    );
    let (b_done, b_mem, b_stats) = b_result;
    assert_eq!(b_stats.rx_dropped, 0, "nothing dropped on a lossless link");
    assert!(b_stats.rx_bytes_placed >= 3 * u64::from(LEN), "{b_stats:?}");
    let l = LEN as usize;
    assert!(b_mem[..l] == pattern(1, l)[..], "WRITE placed");
    assert!(
        b_mem[8 * 1024..8 * 1024 + l] == pattern(2, l)[..],
        "WRITE_IMM placed"
    );
    assert!(
        b_mem[32 * 1024..32 * 1024 + l] == pattern(3, l)[..],
        "SEND placed in the second receive (WRITE_IMM took the first)"
    );
    let recv: Vec<(u64, Opcode, u32, Option<u32>)> = b_done
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm))
        .collect();
    assert_eq!(
        recv,
        [
            (10, Opcode::RecvWriteImm, LEN, Some(77)),
            (11, Opcode::Recv, LEN, None)
        ]
    );
}
