//! Property tests of `metaroce_core::wire` (seeded, so every run checks the
//! same cases):
//!
//! * any valid `Repr` with its payload survives emit then parse unchanged,
//!   and the gather path (`emit_header` + `trailer`) writes the same bytes;
//! * `wire::parse` and `encap::parse_frame` never panic, on random bytes and
//!   on valid packets with random bytes overwritten (CRC refreshed so the
//!   later checks are reached), and whatever parses re-emits identically;
//! * flipping any single bit of a valid packet never yields the same `Repr`;
//! * every proper prefix of a valid packet is rejected as truncated;
//! * Ethernet/IPv4 and IPv6/UDP encapsulation round-trips every field and ECN
//!   codepoint, and `encap::mark_ce` marks ECN-capable frames CE with valid
//!   checksums while leaving Not-ECT frames untouched.

use std::net::{Ipv4Addr, Ipv6Addr};

use metaroce_core::wire::encap::{self, ecn};
use metaroce_core::wire::packet::{
    crc32, WriteImm, MAX_MTU, MAX_PATHS_WIRE, MAX_WINDOW_WIRE, MIN_MTU,
};
use metaroce_core::wire::{
    self, AckRepr, Body, CipherSuite, CloseReason, CloseRepr, ConnectRepr, EncapRepr, Error, Flags,
    Header, IpPair, MemoryTarget, MessageSpan, NakReason, NakRepr, PacketType, ReadRequestRepr,
    ReadResponseRepr, Repr, RetryRepr, SackBits, SendRepr, TimerProfile, WriteRepr, COOKIE_LEN,
    CRC_LEN, DEFAULT_UDP_PORT,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, RngSeed};
use smoltcp::wire::EthernetAddress;

/// Cases per property. Fixed, with a fixed seed and no failure files, so the
/// result does not depend on the environment or on earlier runs.
const CASES: u32 = 512;
const SEED: u64 = 0x4d65_7461_526f_4345; // "MetaRoCE"

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(SEED),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Largest payload the strategies generate: a jumbo MTU, so lengths above
/// 255 and 8191 are exercised without slowing the debug build much.
const MAX_PAYLOAD: usize = MAX_MTU as usize;

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..=64),
        1 => proptest::collection::vec(any::<u8>(), 0..=MAX_PAYLOAD),
    ]
}

/// A payload and a message span it fits in: `offset + payload <= len`.
fn span_with_payload() -> impl Strategy<Value = (MessageSpan, Vec<u8>)> {
    (payload(), any::<u32>()).prop_flat_map(|(p, id)| {
        let plen = p.len() as u32;
        let max_offset = u32::MAX - plen;
        // Small offsets and lengths are the common case; the full range
        // checks the `offset + payload <= len` arithmetic near 2^32.
        let offset = prop_oneof![Just(0), 0..=max_offset.min(1 << 20), 0..=max_offset];
        offset.prop_flat_map(move |offset| {
            let p = p.clone();
            let min_len = offset + plen;
            let len = prop_oneof![
                Just(min_len),
                min_len..=min_len.saturating_add(4096),
                min_len..=u32::MAX
            ];
            len.prop_map(move |len| (MessageSpan { id, offset, len }, p.clone()))
        })
    })
}

fn target() -> impl Strategy<Value = MemoryTarget> {
    (any::<u32>(), any::<u64>()).prop_map(|(key, addr)| MemoryTarget { key, addr })
}

fn sack() -> impl Strategy<Value = SackBits> {
    prop_oneof![
        Just(SackBits::EMPTY),
        any::<[u8; 32]>().prop_map(|b| SackBits::from_bytes(&b)),
        proptest::collection::vec(0usize..256, 0..8).prop_map(|bits| {
            let mut s = SackBits::EMPTY;
            for b in bits {
                s.set(b);
            }
            s
        }),
    ]
}

fn nak_reason() -> impl Strategy<Value = NakReason> {
    (1u8..=6).prop_map(|c| NakReason::from_code(c).expect("codes 1..=6 are defined"))
}

fn close_reason() -> impl Strategy<Value = CloseReason> {
    (0u8..=4).prop_map(|c| CloseReason::from_code(c).expect("codes 0..=4 are defined"))
}

fn connect() -> impl Strategy<Value = ConnectRepr> {
    (
        1..=u32::MAX,
        1..=u64::MAX,
        MIN_MTU..=MAX_MTU,
        1..=MAX_PATHS_WIRE,
        1..=MAX_WINDOW_WIRE,
        any::<u16>(),
        any::<u32>(),
        (
            any::<bool>(),
            any::<bool>(),
            1..=u32::MAX,
            any::<[u8; COOKIE_LEN]>(),
        ),
    )
        .prop_map(
            |(src_conn, src_token, mtu, max_paths, window, reply_port, initial_psn, extra)| {
                let (emulation, encrypted, key_id, cookie) = extra;
                ConnectRepr {
                    src_conn,
                    src_token,
                    mtu,
                    max_paths,
                    window,
                    initial_psn,
                    reply_port,
                    timer_profile: if emulation {
                        TimerProfile::Emulation
                    } else {
                        TimerProfile::DataCenter
                    },
                    suite: if encrypted {
                        CipherSuite::Aes256Gcm
                    } else {
                        CipherSuite::None
                    },
                    key_id: if encrypted { key_id } else { 0 },
                    cookie,
                }
            },
        )
}

/// Every body, with its payload (empty for types without payload).
fn body() -> impl Strategy<Value = (Body, Vec<u8>)> {
    let no_payload = |b: Body| (b, Vec::new());
    prop_oneof![
        (
            span_with_payload(),
            target(),
            proptest::option::of((any::<u32>(), any::<u32>()))
        )
            .prop_map(|((msg, p), target, imm)| {
                let imm = imm.map(|(imm, recv_index)| WriteImm { imm, recv_index });
                (Body::Write(WriteRepr { msg, target, imm }), p)
            }),
        (
            span_with_payload(),
            any::<u32>(),
            proptest::option::of(any::<u32>())
        )
            .prop_map(|((msg, p), recv_index, imm)| (
                Body::Send(SendRepr {
                    msg,
                    recv_index,
                    imm
                }),
                p
            )),
        (any::<u32>(), any::<u32>(), target(), target()).prop_map(
            move |(msg_id, len, source, sink)| {
                no_payload(Body::ReadRequest(ReadRequestRepr {
                    msg_id,
                    len,
                    source,
                    sink,
                }))
            }
        ),
        (span_with_payload(), target()).prop_map(|((msg, p), target)| (
            Body::ReadResponse(ReadResponseRepr { msg, target }),
            p
        )),
        (any::<[u32; 3]>(), any::<[u16; 4]>(), sack()).prop_map(
            move |(
                [cumulative, echo_psn, echo_timestamp],
                [echo_path, rx, ce, sack_offset],
                sack,
            )| {
                no_payload(Body::Ack(AckRepr {
                    cumulative,
                    echo_psn,
                    echo_timestamp,
                    echo_path,
                    path_rx_count: rx,
                    path_ce_count: ce,
                    rate_hint_mbps: echo_timestamp.rotate_left(7) ^ cumulative,
                    sack_offset,
                    sack,
                }))
            }
        ),
        (any::<u32>(), any::<u32>(), nak_reason()).prop_map(
            move |(cumulative, nak_psn, reason)| {
                no_payload(Body::Nak(NakRepr {
                    cumulative,
                    nak_psn,
                    reason,
                }))
            }
        ),
        connect().prop_map(move |c| no_payload(Body::Connect(c))),
        connect().prop_map(move |c| no_payload(Body::Accept(ConnectRepr {
            cookie: [0; COOKIE_LEN],
            ..c
        }))),
        close_reason().prop_map(move |reason| no_payload(Body::Close(CloseRepr { reason }))),
        Just(no_payload(Body::Keepalive)),
        any::<[u8; COOKIE_LEN]>()
            .prop_map(move |cookie| no_payload(Body::Retry(RetryRepr { cookie }))),
        any::<[u8; COOKIE_LEN]>().prop_map(move |mut token| {
            // Never all zero (spec 3.8.5).
            token[COOKIE_LEN - 1] |= 1;
            no_payload(Body::NewToken(wire::NewTokenRepr { token }))
        }),
    ]
}

/// Flags this type may carry (spec 3.2).
fn allowed_flags(t: PacketType) -> u16 {
    match t {
        PacketType::Close => Flags::CLOSE_REPLY.0,
        t if t.is_reliable() => Flags::ACK_REQUEST.0 | Flags::RETRANSMISSION.0,
        _ => 0,
    }
}

/// A valid packet: any body, a header whose flags suit its type, and for
/// CONNECT a zero destination connection id and token.
fn packet() -> impl Strategy<Value = (Repr, Vec<u8>)> {
    (
        body(),
        any::<u16>(),
        any::<u32>(),
        any::<u64>(),
        any::<[u32; 2]>(),
        any::<u16>(),
    )
        .prop_map(
            |((body, payload), flags, dst_conn, token, [psn, timestamp], path)| {
                let t = body.packet_type();
                let (dst_conn, token) = if t == PacketType::Connect {
                    (0, 0)
                } else {
                    (dst_conn, token)
                };
                let repr = Repr {
                    header: Header {
                        flags: Flags(flags & allowed_flags(t)),
                        dst_conn,
                        token,
                        psn,
                        path,
                        timestamp,
                    },
                    body,
                    payload_len: u16::try_from(payload.len()).expect("payload fits u16"),
                };
                (repr, payload)
            },
        )
}

fn emit(repr: &Repr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0xa5u8; repr.buffer_len()];
    repr.emit(&mut buf, payload);
    buf
}

fn mac() -> impl Strategy<Value = EthernetAddress> {
    any::<[u8; 6]>().prop_map(EthernetAddress)
}

fn ip_pair() -> impl Strategy<Value = IpPair> {
    prop_oneof![
        any::<([u8; 4], [u8; 4])>().prop_map(|(s, d)| IpPair::V4 {
            src: Ipv4Addr::from(s),
            dst: Ipv4Addr::from(d),
        }),
        any::<([u8; 16], [u8; 16])>().prop_map(|(s, d)| IpPair::V6 {
            src: Ipv6Addr::from(s),
            dst: Ipv6Addr::from(d),
        }),
    ]
}

fn encap_repr() -> impl Strategy<Value = EncapRepr> {
    (
        mac(),
        mac(),
        ip_pair(),
        any::<u16>(),
        1..=u16::MAX,
        0u8..64,
        0u8..4,
        any::<u8>(),
    )
        .prop_map(
            |(src_mac, dst_mac, ip, src_port, dst_port, dscp, ecn, hop_limit)| EncapRepr {
                src_mac,
                dst_mac,
                ip,
                src_port,
                dst_port,
                dscp,
                ecn,
                hop_limit,
            },
        )
}

fn emit_frame(e: &EncapRepr, transport: &[u8]) -> Vec<u8> {
    let mut frame = vec![0xa5u8; e.frame_len(transport.len())];
    let n = e
        .emit(&mut frame, transport.len(), |p| {
            p.copy_from_slice(transport)
        })
        .expect("frame fits");
    assert_eq!(n, frame.len());
    frame
}

/// Overwrites `edits` bytes of `bytes` (positions taken modulo the length)
/// and refreshes the CRC trailer when `fix_crc` is set.
fn mutate(bytes: &mut [u8], edits: &[(usize, u8)], fix_crc: bool) {
    if bytes.is_empty() {
        return;
    }
    for &(at, value) in edits {
        let i = at % bytes.len();
        bytes[i] = value;
    }
    if fix_crc && bytes.len() >= CRC_LEN {
        let end = bytes.len() - CRC_LEN;
        let crc = crc32(&[&bytes[..end]]);
        bytes[end..].copy_from_slice(&crc.to_be_bytes());
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn emit_then_parse_is_identity((repr, payload) in packet()) {
        let bytes = emit(&repr, &payload);
        prop_assert_eq!(bytes.len(), repr.buffer_len());
        let (parsed, parsed_payload) = wire::parse(&bytes).map_err(|e| {
            TestCaseError::fail(format!("parse failed with {e:?} for {repr:?}"))
        })?;
        prop_assert_eq!(parsed, repr);
        prop_assert_eq!(parsed_payload, payload.as_slice());
        // Gather-emit: header and trailer written apart give the same bytes.
        let mut header = vec![0x5au8; repr.header_len()];
        repr.emit_header(&mut header);
        let trailer = Repr::trailer(&header, &payload);
        prop_assert_eq!([header.as_slice(), &payload, &trailer].concat(), bytes);
    }

    #[test]
    fn parse_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = wire::parse(&bytes);
        let _ = encap::parse_frame(&bytes, DEFAULT_UDP_PORT);
    }

    /// Random bytes almost always fail the first checks; starting from a
    /// valid packet with a refreshed CRC reaches every later check. Whatever
    /// parses must be canonical: emitting it again gives the same bytes.
    #[test]
    fn parse_of_mutated_packet_never_panics_and_is_canonical(
        (repr, payload) in packet(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        fix_crc in proptest::bool::weighted(0.9),
    ) {
        let mut bytes = emit(&repr, &payload);
        mutate(&mut bytes, &edits, fix_crc);
        if let Ok((parsed, parsed_payload)) = wire::parse(&bytes) {
            prop_assert_eq!(emit(&parsed, parsed_payload), bytes);
        }
    }

    #[test]
    fn parse_frame_of_mutated_frame_never_panics(
        e in encap_repr(),
        (repr, payload) in packet(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut frame = emit_frame(&e, &emit(&repr, &payload));
        mutate(&mut frame, &edits, false);
        if let Ok((_, transport)) = encap::parse_frame(&frame, e.dst_port) {
            let _ = wire::parse(transport);
        }
        let cut = cut % (frame.len() + 1);
        let _ = encap::parse_frame(&frame[..cut], e.dst_port);
        let _ = encap::mark_ce(&mut frame[..cut]);
    }

    #[test]
    fn single_bit_flip_never_yields_the_same_repr(
        (repr, payload) in packet(),
        bit in any::<usize>(),
    ) {
        let original = emit(&repr, &payload);
        let mut bytes = original.clone();
        let bit = bit % (bytes.len() * 8);
        bytes[bit / 8] ^= 0x80 >> (bit % 8);
        if let Ok((parsed, parsed_payload)) = wire::parse(&bytes) {
            prop_assert!(
                parsed != repr || parsed_payload != payload.as_slice(),
                "bit {} flipped and the packet still parses as the original", bit
            );
        }
    }

    #[test]
    fn every_proper_prefix_is_rejected((repr, payload) in packet()) {
        let bytes = emit(&repr, &payload);
        for len in 0..bytes.len() {
            match wire::parse(&bytes[..len]) {
                Err(Error::Truncated | Error::BadLength) => {}
                other => prop_assert!(false, "prefix of {} of {} bytes gave {:?}", len, bytes.len(), other),
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(wire::parse(&longer).map(|_| ()), Err(Error::BadLength));
    }

    #[test]
    fn frame_round_trip(e in encap_repr(), (repr, payload) in packet()) {
        let transport = emit(&repr, &payload);
        let frame = emit_frame(&e, &transport);
        let (info, got) = encap::parse_frame(&frame, e.dst_port)
            .map_err(|err| TestCaseError::fail(format!("{err:?} for {e:?}")))?;
        prop_assert_eq!(info.src_mac, e.src_mac);
        prop_assert_eq!(info.dst_mac, e.dst_mac);
        prop_assert_eq!(info.ip, e.ip);
        prop_assert_eq!(info.src_port, e.src_port);
        prop_assert_eq!(info.dst_port, e.dst_port);
        prop_assert_eq!(info.dscp, e.dscp);
        prop_assert_eq!(info.ecn, e.ecn);
        prop_assert_eq!(info.hop_limit, e.hop_limit);
        prop_assert_eq!(got, transport.as_slice());
        prop_assert_eq!(wire::parse(got).map(|(r, _)| r), Ok(repr));
        // Ethernet padding after the IP packet is ignored.
        let mut padded = frame.clone();
        padded.resize(frame.len().max(60) + 4, 0);
        let (padded_info, padded_got) = encap::parse_frame(&padded, e.dst_port)
            .map_err(|err| TestCaseError::fail(format!("padded: {err:?}")))?;
        prop_assert_eq!(padded_info, info);
        prop_assert_eq!(padded_got, transport.as_slice());
        // Another port is not ours.
        let other_port = if e.dst_port == u16::MAX { 1 } else { e.dst_port + 1 };
        prop_assert_eq!(
            encap::parse_frame(&frame, other_port).map(|_| ()),
            Err(Error::NotMetaRoce)
        );
    }

    #[test]
    fn mark_ce_marks_ecn_capable_frames(e in encap_repr(), (repr, payload) in packet()) {
        let transport = emit(&repr, &payload);
        let frame = emit_frame(&e, &transport);
        let mut marked = frame.clone();
        let was_marked = encap::mark_ce(&mut marked);
        prop_assert_eq!(was_marked, e.ecn != ecn::NOT_ECT);
        let (info, got) = encap::parse_frame(&marked, e.dst_port)
            .map_err(|err| TestCaseError::fail(format!("marked frame: {err:?}")))?;
        prop_assert_eq!(got, transport.as_slice());
        if e.ecn == ecn::NOT_ECT {
            prop_assert_eq!(marked, frame);
            prop_assert!(!info.is_ce());
        } else {
            prop_assert!(info.is_ce());
            prop_assert_eq!(info.dscp, e.dscp);
        }
    }
}

fn sample_encap(ip: IpPair, ecn_codepoint: u8) -> EncapRepr {
    EncapRepr {
        src_mac: EthernetAddress([0x02, 0, 0, 0, 0, 1]),
        dst_mac: EthernetAddress([0x02, 0, 0, 0, 0, 2]),
        ip,
        src_port: 49_152,
        dst_port: DEFAULT_UDP_PORT,
        dscp: 26,
        ecn: ecn_codepoint,
        hop_limit: 64,
    }
}

fn sample_ips() -> [IpPair; 2] {
    [
        IpPair::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        },
        IpPair::V6 {
            src: "fd00::1".parse().expect("literal"),
            dst: "fd00::2".parse().expect("literal"),
        },
    ]
}

fn sample_packet() -> (Repr, Vec<u8>) {
    let payload: Vec<u8> = (0..100u8).collect();
    let repr = Repr {
        header: Header {
            flags: Flags::ACK_REQUEST,
            dst_conn: 7,
            token: 0x1122_3344_5566_7788,
            psn: 42,
            path: 1,
            timestamp: 1000,
        },
        body: Body::Write(WriteRepr {
            msg: MessageSpan {
                id: 1,
                offset: 0,
                len: 100,
            },
            target: MemoryTarget {
                key: 9,
                addr: 0x1000,
            },
            imm: None,
        }),
        payload_len: 100,
    };
    (repr, payload)
}

/// Both IP families with each of the four ECN codepoints, explicitly (the
/// property above draws them at random).
#[test]
fn frame_round_trip_every_family_and_codepoint() {
    let (repr, payload) = sample_packet();
    let transport = emit(&repr, &payload);
    for ip in sample_ips() {
        for codepoint in [ecn::NOT_ECT, ecn::ECT1, ecn::ECT0, ecn::CE] {
            let e = sample_encap(ip, codepoint);
            let frame = emit_frame(&e, &transport);
            let (info, got) = encap::parse_frame(&frame, DEFAULT_UDP_PORT).expect("valid frame");
            assert_eq!(info.ecn, codepoint, "{ip:?}");
            assert_eq!(info.is_ce(), codepoint == ecn::CE);
            assert_eq!(info.ip, ip);
            assert_eq!(got, transport.as_slice());
            // A reply goes back to the sender's host, at its MetaRoCE port.
            let reply = info.reply(50_000, DEFAULT_UDP_PORT, ecn::ECT0);
            assert_eq!(reply.ip, ip_reversed(ip));
            assert_eq!(reply.dst_port, DEFAULT_UDP_PORT);
            assert_eq!(reply.src_port, 50_000);
            assert_eq!((reply.src_mac, reply.dst_mac), (e.dst_mac, e.src_mac));
        }
    }
}

fn ip_reversed(ip: IpPair) -> IpPair {
    match ip {
        IpPair::V4 { src, dst } => IpPair::V4 { src: dst, dst: src },
        IpPair::V6 { src, dst } => IpPair::V6 { src: dst, dst: src },
    }
}

/// ECT(0) becomes CE with a recomputed IPv4 header checksum; Not-ECT frames
/// are left byte for byte alone; IPv6 has no header checksum but the UDP one
/// must stay valid too.
#[test]
fn mark_ce_turns_ect0_into_ce_and_leaves_not_ect_alone() {
    let (repr, payload) = sample_packet();
    let transport = emit(&repr, &payload);
    for ip in sample_ips() {
        let mut frame = emit_frame(&sample_encap(ip, ecn::ECT0), &transport);
        let before = frame.clone();
        assert!(encap::mark_ce(&mut frame), "{ip:?}");
        let (info, got) = encap::parse_frame(&frame, DEFAULT_UDP_PORT)
            .unwrap_or_else(|e| panic!("marked {ip:?} frame no longer parses: {e:?}"));
        assert!(info.is_ce());
        assert_eq!(info.dscp, 26);
        assert_eq!(got, transport.as_slice());
        let changed: Vec<usize> = (0..frame.len())
            .filter(|&i| frame[i] != before[i])
            .collect();
        match ip {
            // The TOS byte and the two header checksum bytes at most.
            IpPair::V4 { .. } => assert!(
                changed.iter().all(|&i| i == 15 || i == 24 || i == 25),
                "IPv4 bytes changed: {changed:?}"
            ),
            // Traffic class straddles bytes 14 and 15.
            IpPair::V6 { .. } => assert!(
                changed.iter().all(|&i| i == 14 || i == 15),
                "IPv6 bytes changed: {changed:?}"
            ),
        }
        // Marking twice changes nothing more.
        let once = frame.clone();
        assert!(encap::mark_ce(&mut frame));
        assert_eq!(frame, once);

        let mut not_ect = emit_frame(&sample_encap(ip, ecn::NOT_ECT), &transport);
        let untouched = not_ect.clone();
        assert!(!encap::mark_ce(&mut not_ect));
        assert_eq!(not_ect, untouched);
        let (info, _) = encap::parse_frame(&not_ect, DEFAULT_UDP_PORT).expect("still valid");
        assert_eq!(info.ecn, ecn::NOT_ECT);
    }
    // Non-IP and short frames are not marked.
    assert!(!encap::mark_ce(&mut [0u8; 10]));
    let mut arp = emit_frame(&sample_encap(sample_ips()[0], ecn::ECT0), &transport);
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert!(!encap::mark_ce(&mut arp));
}

/// Exhaustive single-bit flips of one packet of every type: each flip must
/// change what parses (the CRC catches it, or an earlier check does).
#[test]
fn every_single_bit_flip_of_every_type_is_detected() {
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let strategy = packet();
    let mut seen = std::collections::BTreeSet::new();
    let mut packets = Vec::new();
    // Draw from the seeded strategy until every type has a small sample.
    for _ in 0..10_000 {
        let (repr, payload) = strategy
            .new_tree(&mut runner)
            .expect("strategy draws")
            .current();
        let t = u8::from(repr.body.packet_type());
        if payload.len() <= 64 && seen.insert(t) {
            packets.push((repr, payload));
        }
        if seen.len() == PacketType::ALL.len() {
            break;
        }
    }
    assert_eq!(seen.len(), PacketType::ALL.len(), "types drawn: {seen:?}");
    let mut flips = 0;
    for (repr, payload) in &packets {
        let original = emit(repr, payload);
        for bit in 0..original.len() * 8 {
            let mut bytes = original.clone();
            bytes[bit / 8] ^= 0x80 >> (bit % 8);
            if let Ok((parsed, p)) = wire::parse(&bytes) {
                assert!(
                    parsed != *repr || p != payload.as_slice(),
                    "{:?}: flipping bit {bit} is not detected",
                    repr.body.packet_type()
                );
            }
            flips += 1;
        }
    }
    assert!(flips > 12 * 32 * 8, "only {flips} flips checked");
}

/// Spec 3.1.5: a receiver MUST accept IPv4 options, skipping them by the
/// header length, and a zero UDP checksum over IPv4 means "not computed".
#[test]
fn ipv4_options_and_zero_udp_checksum_are_accepted() {
    let (repr, payload) = sample_packet();
    let transport = emit(&repr, &payload);
    let e = sample_encap(sample_ips()[0], ecn::ECT0);
    let plain = emit_frame(&e, &transport);
    let ip_start = encap::ETHERNET_HEADER_LEN;
    let options_at = ip_start + encap::IPV4_HEADER_LEN;

    // Four NOP options: IHL 6, total length + 4, checksum recomputed. The UDP
    // checksum does not cover the IP header, so it stays valid.
    let mut with_options = plain[..options_at].to_vec();
    with_options.extend_from_slice(&[1, 1, 1, 1]);
    with_options.extend_from_slice(&plain[options_at..]);
    {
        let mut ip = smoltcp::wire::Ipv4Packet::new_unchecked(&mut with_options[ip_start..]);
        ip.set_header_len(24);
        ip.set_total_len(ip.total_len() + 4);
        ip.fill_checksum();
    }
    let (info, got) =
        encap::parse_frame(&with_options, DEFAULT_UDP_PORT).expect("IPv4 options are accepted");
    assert_eq!(got, transport.as_slice());
    assert_eq!(info.ecn, ecn::ECT0);

    let mut zero_checksum = plain.clone();
    let udp_checksum = options_at + 6;
    zero_checksum[udp_checksum..udp_checksum + 2].copy_from_slice(&[0, 0]);
    let (_, got) = encap::parse_frame(&zero_checksum, DEFAULT_UDP_PORT)
        .expect("a zero UDP checksum is accepted over IPv4");
    assert_eq!(got, transport.as_slice());
}
