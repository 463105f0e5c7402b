//! CRC offload: a frame device that writes and checks the
//! transport's CRC trailer (spec 3.9) itself, as a NIC's DMA engine does
//! RoCEv2's ICRC, and the engine loop that then leaves that work to it
//! (`FrameDevice::FILLS_CRC_TRAILER`, `FrameDevice::receive_with_verdict`).
//!
//! Two MetaRoCE endpoints, each behind its own engine loop, exchange a
//! WRITE (A to B) and a READ (B's memory to A) over in-memory links joined
//! by a seeded wire that can drop and alter frames; one thread, a virtual
//! clock: fully deterministic. The fake device's CRC unit is a bitwise
//! CRC-32 written here, independent of the one the engine uses.

use std::ops::Range;
use std::time::Duration;

use metaroce_core::api::{Access, LocalBuf, Op, Opcode, PeerAddr, Region, Status, WorkRequest};
use metaroce_core::stats::DropStats;
use metaroce_core::wire::{MemoryTarget, CRC_LEN, DEFAULT_UDP_PORT};
use metaroce_core::{Config, Endpoint, Heap, Instant, Layout};
use metaroce_platform::device::{CrcVerdict, MemFrameDevice, MemLink, RxVerdict};
use metaroce_platform::dma::HostWindow;
use metaroce_platform::net::NetConfig;
use metaroce_platform::random::{RandomSource, XorShiftRng};
use metaroce_platform::{Engine, EnginePort, FrameDevice, HostQueues};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Address,
    Ipv4Packet, UdpPacket,
};

type Queues = HostQueues<32, 32, 64, 4>;
type Port<'q> = EnginePort<'q, 32, 32, 64, 4>;
type Ring<'a> = MemFrameDevice<'a, 256>;

const BASE: u64 = 0x10_0000_0000;
const MEM: usize = 64 * 1024;
const LEN: usize = 8 * 1024;
/// A's WRITE lands at B's `WRITE_AT`; A's READ fetches B's `READ_AT` into
/// A's `READ_AT`.
const WRITE_AT: usize = 0;
const READ_AT: usize = 32 * 1024;
const ETHERNET_HEADER_LEN: usize = 14;
const UDP_HEADER_LEN: usize = 8;
/// Transport packets longer than this carry payload (the longest without,
/// CONNECT and ACCEPT, are 96 bytes).
const DATA_PACKET_MIN: usize = 200;

fn net(n: u8) -> NetConfig {
    NetConfig {
        mac: EthernetAddress([0x02, 0, 0, 0, 0, n]),
        ip: Ipv4Address::new(198, 18, 0, n),
    }
}

/// CRC-32 of IEEE 802.3 (spec 3.9), one bit at a time: the fake device's
/// "hardware", sharing no code with the engine's CRC.
fn device_crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Where a frame's transport packet lies (the UDP payload of an IPv4
/// frame to `port`), and the IP addresses its UDP checksum covers: what a
/// NIC programmed for the transport finds in each frame.
fn transport_span(frame: &[u8], port: u16) -> Option<(Range<usize>, IpAddress, IpAddress)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Udp {
        return None;
    }
    let udp = UdpPacket::new_checked(ip.payload()).ok()?;
    if udp.dst_port() != port {
        return None;
    }
    let start = ETHERNET_HEADER_LEN + usize::from(ip.header_len()) + UDP_HEADER_LEN;
    let end = start - UDP_HEADER_LEN + usize::from(udp.len());
    (end >= start + CRC_LEN).then(|| (start..end, ip.src_addr().into(), ip.dst_addr().into()))
}

/// Recomputes the UDP checksum after the transport packet at `span`
/// changed (a NIC with UDP checksum offload computes it last).
fn fix_udp_checksum(frame: &mut [u8], span: &Range<usize>, src: IpAddress, dst: IpAddress) {
    UdpPacket::new_unchecked(&mut frame[span.start - UDP_HEADER_LEN..span.end])
        .fill_checksum(&src, &dst);
}

/// Whether the trailer of `packet` is its CRC-32.
fn trailer_matches(packet: &[u8]) -> bool {
    let (body, trailer) = packet.split_at(packet.len() - CRC_LEN);
    device_crc32(body).to_be_bytes() == trailer
}

/// How the fake device judges the trailers of the transport frames it
/// receives.
#[derive(Debug, Clone, Copy)]
enum RxCheck {
    /// Recomputes each trailer and reports `Good` or `Bad`, as a NIC does.
    Verify,
    /// Reports every one `Good` without looking: a broken device, here to
    /// show that the engine then does not check for itself.
    GoodBlindly,
    /// Reports every `n`-th one `Bad`, intact or not.
    BadEvery(u64),
}

/// What the fake device did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct DeviceCounts {
    /// Transport frames sent.
    sent: u64,
    /// Of those, the ones whose trailer the engine had left zero.
    left_zero: u64,
    /// Of those, the ones whose trailer the device wrote.
    filled: u64,
    /// Transport frames received and reported `Good`, and `Bad`.
    good: u64,
    bad: u64,
}

/// One end of a [`MemLink`] behind a "NIC" with CRC offload: it writes
/// the trailer of every transport frame it sends (then the UDP checksum)
/// and reports a verdict on the trailer of every one it receives.
struct OffloadDevice<'a> {
    ring: Ring<'a>,
    /// The transport's UDP port, as the NIC is programmed with it.
    port: u16,
    /// `false`: a device that claims the offload but never writes the
    /// trailer.
    fills: bool,
    rx_check: RxCheck,
    counts: DeviceCounts,
}

impl<'a> OffloadDevice<'a> {
    fn new(ring: Ring<'a>, rx_check: RxCheck) -> Self {
        OffloadDevice {
            ring,
            port: DEFAULT_UDP_PORT,
            fills: true,
            rx_check,
            counts: DeviceCounts::default(),
        }
    }
}

impl FrameDevice for OffloadDevice<'_> {
    const FILLS_CRC_TRAILER: bool = true;

    fn max_frame_len(&self) -> usize {
        self.ring.max_frame_len()
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        self.ring.receive(f)
    }

    fn receive_with_verdict<R>(&mut self, f: impl FnOnce(&[u8], RxVerdict) -> R) -> Option<R> {
        let (port, check, counts) = (self.port, self.rx_check, &mut self.counts);
        // The ring's own verdict on the checksums (the test's wire copies
        // every frame in: not checked), the device's on the trailer.
        self.ring.receive_with_verdict(|frame, ring| {
            let f = |frame, crc| f(frame, RxVerdict { crc, ..ring });
            let Some((span, ..)) = transport_span(frame, port) else {
                return f(frame, CrcVerdict::NotChecked);
            };
            let nth = counts.good + counts.bad + 1;
            let good = match check {
                RxCheck::Verify => trailer_matches(&frame[span]),
                RxCheck::GoodBlindly => true,
                RxCheck::BadEvery(n) => nth % n != 0,
            };
            if good {
                counts.good += 1;
                f(frame, CrcVerdict::Good)
            } else {
                counts.bad += 1;
                f(frame, CrcVerdict::Bad)
            }
        })
    }

    fn transmit_ready(&mut self) -> bool {
        self.ring.transmit_ready()
    }

    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let (port, fills, counts) = (self.port, self.fills, &mut self.counts);
        self.ring.transmit(len, |frame| {
            let r = f(frame);
            if let Some((span, src, dst)) = transport_span(frame, port) {
                let body_end = span.end - CRC_LEN;
                counts.sent += 1;
                counts.left_zero += u64::from(frame[body_end..span.end] == [0; CRC_LEN]);
                if fills {
                    let crc = device_crc32(&frame[span.start..body_end]);
                    frame[body_end..span.end].copy_from_slice(&crc.to_be_bytes());
                    fix_udp_checksum(frame, &span, src, dst);
                    counts.filled += 1;
                }
            }
            r
        })
    }
}

struct Side<D> {
    engine: Engine,
    endpoint: Endpoint<Heap, 8>,
    device: D,
    memory: Vec<u8>,
}

impl<D: FrameDevice> Side<D> {
    fn new(n: u8, peer: u8, device: D, seed: u64) -> Self {
        let mut engine = Engine::new(net(n));
        engine.add_static_neighbor(net(peer).ip, net(peer).mac);
        Side {
            engine,
            endpoint: Endpoint::new(
                Config::for_emulation(),
                Layout::for_connections(4).heap_storage(),
                metaroce_core::rng::seed_from_u64(seed),
            ),
            device,
            memory: vec![0; MEM],
        }
    }

    fn poll(&mut self, now: Instant, port: &mut Port<'_>) {
        let mut window = HostWindow::new(BASE, &mut self.memory);
        let _ = self
            .engine
            .poll(now, &mut self.endpoint, &mut self.device, port, &mut window);
    }
}

/// Bytes in 1..=0x7f, so that a placed byte is either still 0 or the
/// pattern's, and one with its top bit flipped is neither.
fn pattern(seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; LEN];
    XorShiftRng::new(seed).fill_bytes(&mut v);
    v.iter().map(|b| b % 0x7f + 1).collect()
}

/// Which way a frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    AtoB,
    BtoA,
}

/// What the wire does to each frame: `false` drops it; it may change it.
type Tamper<'t> = &'t mut dyn FnMut(Dir, &mut [u8]) -> bool;

/// What one run showed.
#[derive(Debug)]
struct Outcome {
    /// A's completions: (work request id, opcode, status), by id.
    completions: Vec<(u64, Opcode, Status)>,
    /// Every frame each side's device put on the wire, in order, before
    /// the wire touched it.
    sent: [Vec<Vec<u8>>; 2],
    drops_a: DropStats,
    drops_b: DropStats,
    /// B's memory at the WRITE's target, and A's at the READ's.
    written: Vec<u8>,
    read: Vec<u8>,
}

impl Outcome {
    fn finished_intact(&self) -> bool {
        self.completions
            == [
                (1, Opcode::Write, Status::Success),
                (2, Opcode::Read, Status::Success),
            ]
            && self.written == pattern(1)
            && self.read == pattern(2)
    }
}

/// Registers `memory` as one region through the host queues; its key.
fn register<D: FrameDevice>(
    side: &mut Side<D>,
    host: &mut metaroce_platform::HostPort<'_, 32, 32, 64, 4>,
    port: &mut Port<'_>,
) -> u32 {
    let region = Region {
        base: BASE,
        len: MEM as u64,
        access: Access::ALL,
        pd: 0,
    };
    host.register_region(7, region).unwrap();
    side.poll(Instant::ZERO, port);
    host.poll_admin().unwrap().result.unwrap()
}

/// A WRITE from A to B and a READ of B's memory into A, through `tamper`,
/// for at most `rounds` rounds of 20 us. After every round, every byte B
/// holds at the WRITE's target is still 0 or A's: nothing altered was
/// ever placed.
fn run<DA: FrameDevice, DB: FrameDevice>(
    a: &mut Side<DA>,
    far_a: &mut Ring<'_>,
    b: &mut Side<DB>,
    far_b: &mut Ring<'_>,
    tamper: Tamper<'_>,
    rounds: u32,
) -> Outcome {
    let (qa, qb) = (Queues::new(), Queues::new());
    let (mut host_a, mut port_a) = qa.split().unwrap();
    let (mut host_b, mut port_b) = qb.split().unwrap();
    let key_a = register(a, &mut host_a, &mut port_a);
    let key_b = register(b, &mut host_b, &mut port_b);
    a.memory[..LEN].copy_from_slice(&pattern(1));
    b.memory[READ_AT..READ_AT + LEN].copy_from_slice(&pattern(2));
    let peer_b = PeerAddr {
        ip: IpAddress::Ipv4(net(2).ip),
        port: DEFAULT_UDP_PORT,
    };
    let conn = a.endpoint.connect(Instant::ZERO, peer_b, 0).unwrap();
    let local = |at: usize| LocalBuf {
        key: key_a,
        addr: BASE + at as u64,
        len: LEN as u32,
    };
    let remote = |at: usize| MemoryTarget {
        key: key_b,
        addr: BASE + at as u64,
    };
    host_a
        .post_send(
            conn,
            WorkRequest {
                id: 1,
                op: Op::Write {
                    remote: remote(WRITE_AT),
                },
                local: local(0),
            },
        )
        .unwrap();
    host_a
        .post_send(
            conn,
            WorkRequest {
                id: 2,
                op: Op::Read {
                    remote: remote(READ_AT),
                },
                local: local(READ_AT),
            },
        )
        .unwrap();

    let sent_pattern = pattern(1);
    let mut sent: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut completions = Vec::new();
    let mut now = Instant::ZERO;
    for _ in 0..rounds {
        now += Duration::from_micros(20);
        a.poll(now, &mut port_a);
        b.poll(now, &mut port_b);
        carry(Dir::AtoB, far_a, far_b, &mut sent[0], tamper);
        carry(Dir::BtoA, far_b, far_a, &mut sent[1], tamper);
        let placed = &b.memory[WRITE_AT..WRITE_AT + LEN];
        assert!(
            placed
                .iter()
                .zip(&sent_pattern)
                .all(|(&got, &want)| got == 0 || got == want),
            "B placed bytes A never sent"
        );
        completions.extend(std::iter::from_fn(|| host_a.poll_completion()));
        if completions.len() == 2 {
            break;
        }
    }
    // Every frame carried reaches its engine.
    for _ in 0..4 {
        a.poll(now, &mut port_a);
        b.poll(now, &mut port_b);
    }
    let mut completions: Vec<_> = completions
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.status))
        .collect();
    completions.sort_by_key(|c| c.0);
    Outcome {
        completions,
        sent,
        drops_a: a.endpoint.drops(),
        drops_b: b.endpoint.drops(),
        written: b.memory[WRITE_AT..WRITE_AT + LEN].to_vec(),
        read: a.memory[READ_AT..READ_AT + LEN].to_vec(),
    }
}

/// Moves every frame `from` sent to `to`, through `tamper`, noting each
/// in `sent` as it left.
fn carry(
    dir: Dir,
    from: &mut Ring<'_>,
    to: &mut Ring<'_>,
    sent: &mut Vec<Vec<u8>>,
    tamper: Tamper<'_>,
) {
    while let Some(mut frame) = from.receive_frame(|f| f.to_vec()) {
        sent.push(frame.clone());
        if tamper(dir, &mut frame) {
            assert!(to.send_frame(&frame), "wire ring overflow");
        }
    }
}

/// Enough rounds for the whole exchange under the losses used here.
const ROUNDS: u32 = 50_000;

/// Drops `loss_pct` % of frames, seeded: the same frames in every run
/// that sends the same frames.
fn lossy(seed: u64, loss_pct: u64) -> impl FnMut(Dir, &mut [u8]) -> bool {
    let mut rng = XorShiftRng::new(seed);
    move |_, _| rng.next_u64() % 100 >= loss_pct
}

/// Runs `body` on a thread with room for two endpoints and their engines.
fn with_big_stack(body: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(body)
        .unwrap()
        .join()
        .unwrap();
}

/// Which device each side gets.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Plain,
    Offload(RxCheck),
}

/// One run between a side of `kind_a` and one of `kind_b`; the outcome
/// and the offloading devices' counts.
fn run_kinds(
    kind_a: Kind,
    kind_b: Kind,
    tamper: Tamper<'_>,
    rounds: u32,
) -> (Outcome, Option<DeviceCounts>, Option<DeviceCounts>) {
    let (link_a, link_b): (MemLink<256>, MemLink<256>) = (MemLink::new(), MemLink::new());
    let (device_a, mut far_a) = link_a.ends().unwrap();
    let (device_b, mut far_b) = link_b.ends().unwrap();
    macro_rules! with_b {
        ($a:ident) => {
            match kind_b {
                Kind::Plain => {
                    let mut b = Side::new(2, 1, device_b, 22);
                    let o = run(&mut $a, &mut far_a, &mut b, &mut far_b, tamper, rounds);
                    (o, None)
                }
                Kind::Offload(check) => {
                    let mut b = Side::new(2, 1, OffloadDevice::new(device_b, check), 22);
                    let o = run(&mut $a, &mut far_a, &mut b, &mut far_b, tamper, rounds);
                    (o, Some(b.device.counts))
                }
            }
        };
    }
    match kind_a {
        Kind::Plain => {
            let mut a = Side::new(1, 2, device_a, 11);
            let (o, b) = with_b!(a);
            (o, None, b)
        }
        Kind::Offload(check) => {
            let mut a = Side::new(1, 2, OffloadDevice::new(device_a, check), 11);
            let (o, b) = with_b!(a);
            (o, Some(a.device.counts), b)
        }
    }
}

/// Transport packets (UDP payloads) among `frames`.
fn transport_packets(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    frames
        .iter()
        .filter_map(|f| transport_span(f, DEFAULT_UDP_PORT).map(|(span, ..)| f[span].to_vec()))
        .collect()
}

#[test]
fn offloaded_crc_moves_data_intact_with_the_same_bytes_on_the_wire() {
    with_big_stack(|| {
        let verify = Kind::Offload(RxCheck::Verify);
        let (reference, ..) = run_kinds(Kind::Plain, Kind::Plain, &mut lossy(7, 5), ROUNDS);
        assert!(reference.finished_intact(), "{:?}", reference.completions);
        for (kind_a, kind_b) in [
            (verify, Kind::Plain),
            (Kind::Plain, verify),
            (verify, verify),
        ] {
            let (outcome, dev_a, dev_b) = run_kinds(kind_a, kind_b, &mut lossy(7, 5), ROUNDS);
            let what = format!("A {kind_a:?}, B {kind_b:?}");
            assert!(
                outcome.finished_intact(),
                "{what}: {:?}",
                outcome.completions
            );
            // Every frame, both ways: the device's CRC is the engine's, and
            // its UDP checksum the one the engine would have computed.
            assert!(
                outcome.sent == reference.sent,
                "{what}: the wire bytes differ"
            );
            assert_eq!(
                (outcome.drops_a, outcome.drops_b),
                (reference.drops_a, reference.drops_b),
                "{what}"
            );
            assert_eq!(
                outcome.drops_a.bad_crc + outcome.drops_b.bad_crc,
                0,
                "{what}"
            );
            for (dev, sent_by_it, sent_to_it) in [
                (dev_a, &outcome.sent[0], &outcome.sent[1]),
                (dev_b, &outcome.sent[1], &outcome.sent[0]),
            ] {
                let Some(dev) = dev else { continue };
                let (sent, received) = (
                    transport_packets(sent_by_it).len() as u64,
                    transport_packets(sent_to_it).len() as u64,
                );
                // (The last polls' frames are not on the wire yet.)
                assert!(sent > 0 && dev.sent >= sent, "{what}: {dev:?}");
                assert_eq!(dev.filled, dev.sent, "{what}");
                // Every frame that reached the device was verified by it
                // (some were lost on the wire).
                assert!(
                    dev.good > 0 && dev.good <= received && dev.bad == 0,
                    "{what}: {dev:?}"
                );
            }
        }
    });
}

#[test]
fn the_engine_leaves_the_trailer_to_an_offloading_device() {
    with_big_stack(|| {
        let (outcome, dev_a, _) = run_kinds(
            Kind::Offload(RxCheck::Verify),
            Kind::Plain,
            &mut lossy(7, 0),
            ROUNDS,
        );
        assert!(outcome.finished_intact());
        let dev = dev_a.unwrap();
        assert!(dev.sent > 0);
        assert_eq!(
            dev.left_zero, dev.sent,
            "the engine wrote a trailer the device was to write"
        );
    });
}

#[test]
fn a_device_that_claims_the_offload_but_writes_no_trailer_is_refused_by_its_peer() {
    with_big_stack(|| {
        let (link_a, link_b): (MemLink<256>, MemLink<256>) = (MemLink::new(), MemLink::new());
        let (device_a, mut far_a) = link_a.ends().unwrap();
        let (device_b, mut far_b) = link_b.ends().unwrap();
        let mut lazy = OffloadDevice::new(device_a, RxCheck::Verify);
        lazy.fills = false;
        let mut a = Side::new(1, 2, lazy, 11);
        let mut b = Side::new(2, 1, device_b, 22);
        let outcome = run(
            &mut a,
            &mut far_a,
            &mut b,
            &mut far_b,
            &mut lossy(7, 0),
            2_000,
        );
        // Had the engine computed the CRC anyway, B would have accepted.
        let packets = transport_packets(&outcome.sent[0]);
        assert!(!packets.is_empty());
        assert!(packets.iter().all(|p| p.ends_with(&[0; CRC_LEN])));
        assert_eq!(outcome.drops_b.bad_crc, packets.len() as u64);
        assert!(outcome.completions.is_empty());
        assert!(outcome.written.iter().all(|&x| x == 0));
    });
}

/// Flips the top bit of one payload byte of every `n`-th data packet from
/// A to B and fixes the UDP checksum, so only the CRC can tell; counts
/// them in `altered`.
fn corrupt_every(n: u64, altered: &mut u64) -> impl FnMut(Dir, &mut [u8]) -> bool + '_ {
    let mut data_packets = 0;
    move |dir, frame| {
        if dir == Dir::AtoB {
            if let Some((span, src, dst)) = transport_span(frame, DEFAULT_UDP_PORT) {
                if span.len() > DATA_PACKET_MIN {
                    data_packets += 1;
                    if data_packets % n == 0 {
                        frame[span.start + span.len() / 2] ^= 0x80;
                        fix_udp_checksum(frame, &span, src, dst);
                        *altered += 1;
                    }
                }
            }
        }
        true
    }
}

#[test]
fn a_frame_the_device_marks_bad_is_dropped_and_counted_as_a_software_crc_failure() {
    with_big_stack(|| {
        // Altered payload: the device finds it, as the software check does
        // without offload; the same drops, in the same counter, and
        // nothing altered is placed (`run` checks B's memory every round).
        let mut altered_offloaded = 0;
        let (offloaded, _, dev_b) = run_kinds(
            Kind::Plain,
            Kind::Offload(RxCheck::Verify),
            &mut corrupt_every(3, &mut altered_offloaded),
            ROUNDS,
        );
        let mut altered_software = 0;
        let (software, ..) = run_kinds(
            Kind::Plain,
            Kind::Plain,
            &mut corrupt_every(3, &mut altered_software),
            ROUNDS,
        );
        assert!(offloaded.finished_intact() && software.finished_intact());
        let dev_b = dev_b.unwrap();
        assert!(altered_offloaded > 0);
        assert_eq!(dev_b.bad, altered_offloaded);
        assert_eq!(offloaded.drops_b.bad_crc, altered_offloaded);
        assert_eq!(offloaded.drops_b.total(), offloaded.drops_b.bad_crc);
        assert_eq!(
            (altered_software, software.drops_b),
            (altered_offloaded, offloaded.drops_b)
        );

        // Intact frames the device calls bad are dropped all the same: its
        // verdict is final, not checked again.
        let (outcome, _, dev_b) = run_kinds(
            Kind::Plain,
            Kind::Offload(RxCheck::BadEvery(4)),
            &mut lossy(7, 0),
            ROUNDS,
        );
        assert!(outcome.finished_intact());
        let dev_b = dev_b.unwrap();
        assert!(dev_b.bad > 0);
        assert_eq!(outcome.drops_b.bad_crc, dev_b.bad);
        assert_eq!(outcome.drops_b.total(), dev_b.bad);
    });
}

/// Inverts the trailer of every transport packet from A to B and fixes
/// the UDP checksum: only a CRC check can tell.
fn wrong_trailers(dir: Dir, frame: &mut [u8]) -> bool {
    if dir == Dir::AtoB {
        if let Some((span, src, dst)) = transport_span(frame, DEFAULT_UDP_PORT) {
            for byte in &mut frame[span.end - CRC_LEN..span.end] {
                *byte ^= 0xff;
            }
            fix_udp_checksum(frame, &span, src, dst);
        }
    }
    true
}

#[test]
fn a_frame_the_device_marks_good_is_accepted_even_with_a_wrong_trailer() {
    with_big_stack(|| {
        let (outcome, _, dev_b) = run_kinds(
            Kind::Plain,
            Kind::Offload(RxCheck::GoodBlindly),
            &mut wrong_trailers,
            ROUNDS,
        );
        assert!(outcome.finished_intact(), "{:?}", outcome.completions);
        assert_eq!(outcome.drops_b.bad_crc, 0, "the engine checked the trailer");
        let dev_b = dev_b.unwrap();
        assert_eq!(dev_b.good, transport_packets(&outcome.sent[0]).len() as u64);
    });
}

#[test]
fn without_offload_the_engine_writes_and_checks_the_trailer_itself() {
    with_big_stack(|| {
        let (outcome, ..) = run_kinds(Kind::Plain, Kind::Plain, &mut lossy(7, 0), ROUNDS);
        assert!(outcome.finished_intact());
        for frames in &outcome.sent {
            let packets = transport_packets(frames);
            assert!(!packets.is_empty());
            assert!(packets.iter().all(|p| trailer_matches(p)));
        }
        // The wire that a blindly trusting device let through: B's own
        // check refuses every packet, and nothing is placed.
        let (outcome, ..) = run_kinds(Kind::Plain, Kind::Plain, &mut wrong_trailers, 2_000);
        let packets = transport_packets(&outcome.sent[0]).len() as u64;
        assert!(packets > 0);
        assert_eq!(outcome.drops_b.bad_crc, packets);
        assert!(outcome.completions.is_empty());
        assert!(outcome.written.iter().all(|&x| x == 0));
    });
}
