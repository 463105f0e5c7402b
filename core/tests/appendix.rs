//! Spec appendix A is this file's output: each example packet is emitted by
//! `metaroce_core::wire`, dumped and explained field by field, and the
//! document must equal what this test renders (so a layout change cannot
//! leave the appendix behind). `METAROCE_BLESS=1 cargo test -p
//! metaroce-core --test appendix` rewrites it.

use std::fmt::Write as _;
use std::path::PathBuf;

use metaroce_core::wire::{
    self, AckRepr, Body, CipherSuite, ConnectRepr, Flags, Header, MemoryTarget, MessageSpan,
    NewTokenRepr, Repr, RetryRepr, SackBits, TimerProfile, WriteImm, WriteRepr, COOKIE_LEN,
};

/// How a field's value is written in the table.
#[derive(Clone, Copy)]
enum Show {
    Dec,
    Hex,
    Text,
    Flags,
    Type,
    Profile,
    Suite,
    Sack,
    Bytes,
}

struct Example {
    title: &'static str,
    text: &'static str,
    repr: Repr,
    payload: &'static [u8],
}

const COMMON: [(&str, usize, Show); 9] = [
    ("Version", 1, Show::Dec),
    ("Type", 1, Show::Type),
    ("Flags", 2, Show::Flags),
    ("Destination Connection ID", 4, Show::Hex),
    ("Connection Token", 8, Show::Hex),
    ("PSN", 4, Show::Hex),
    ("Path ID", 2, Show::Dec),
    ("Payload Length", 2, Show::Dec),
    ("Timestamp", 4, Show::Hex),
];

fn extension_fields(body: &Body) -> Vec<(&'static str, usize, Show)> {
    let span = [
        ("Message ID", 4, Show::Dec),
        ("Message Offset", 4, Show::Dec),
        ("Message Length", 4, Show::Dec),
    ];
    let target = [("Memory Key", 4, Show::Hex), ("Address", 8, Show::Hex)];
    match body {
        Body::Write(w) => {
            let mut f: Vec<_> = span.into_iter().chain(target).collect();
            if w.imm.is_some() {
                f.push(("Immediate", 4, Show::Hex));
                f.push(("Receive Index", 4, Show::Dec));
            }
            f
        }
        Body::Ack(_) => vec![
            ("Cumulative PSN", 4, Show::Hex),
            ("Echo PSN", 4, Show::Hex),
            ("Echo Timestamp", 4, Show::Hex),
            ("Echo Path ID", 2, Show::Dec),
            ("Path RX Count", 2, Show::Dec),
            ("Path CE Count", 2, Show::Dec),
            ("SACK Offset", 2, Show::Dec),
            ("Rate Hint", 4, Show::Dec),
            ("SACK bitvector", 32, Show::Sack),
        ],
        Body::Connect(_) | Body::Accept(_) => vec![
            ("Source Connection ID", 4, Show::Hex),
            ("Source Token", 8, Show::Hex),
            ("MTU", 2, Show::Dec),
            ("Max Paths", 2, Show::Dec),
            ("Window", 4, Show::Dec),
            ("Reply Port", 2, Show::Dec),
            ("Timer Profile", 1, Show::Profile),
            ("Suite", 1, Show::Suite),
            ("Initial PSN", 4, Show::Hex),
            ("Key ID", 4, Show::Hex),
            ("Cookie", COOKIE_LEN, Show::Bytes),
        ],
        Body::Retry(_) => vec![("Cookie", COOKIE_LEN, Show::Bytes)],
        Body::NewToken(_) => vec![("Address Token", COOKIE_LEN, Show::Bytes)],
        Body::Keepalive => vec![],
        other => panic!("no appendix layout for {other:?}"),
    }
}

fn header(flags: Flags, dst_conn: u32, token: u64, psn: u32, path: u16, ts: u32) -> Header {
    Header {
        flags,
        dst_conn,
        token,
        psn,
        path,
        timestamp: ts,
    }
}

fn examples() -> Vec<Example> {
    let token = 0x0123_4567_89ab_cdef;
    let mut sack = SackBits::default();
    for bit in [0, 2, 9] {
        sack.set(bit);
    }
    let mut cookie = [0u8; COOKIE_LEN];
    for (i, b) in cookie.iter_mut().enumerate() {
        *b = 0xc0 + i as u8;
    }
    vec![
        Example {
            title: "A.1 WRITE, last packet of a message",
            text: "The last 8 bytes of a 4104-byte WRITE (message 7) with a 4096-byte MTU: Message Offset 4096, Address = remote address + 4096, ACK_REQUEST set because it ends the message (3.2.2, 3.4.1).",
            repr: Repr {
                header: header(Flags::ACK_REQUEST, 0x1234, token, 0x100, 3, 0x1122_3344),
                body: Body::Write(WriteRepr {
                    msg: MessageSpan {
                        id: 7,
                        offset: 4096,
                        len: 4104,
                    },
                    target: MemoryTarget {
                        key: 0x1a2b_3c05,
                        addr: 0x0000_7f00_0000_2000,
                    },
                    imm: None,
                }),
                payload_len: 8,
            },
            payload: b"MetaRoCE",
        },
        Example {
            title: "A.2 WRITE_IMM",
            text: "A 4-byte WRITE_IMM (message 8) that consumes receive index 2 at the responder and reports immediate `0xdeadbeef` (3.4.1).",
            repr: Repr {
                header: header(Flags::ACK_REQUEST, 0x1234, token, 0x101, 3, 0x1122_3344),
                body: Body::Write(WriteRepr {
                    msg: MessageSpan {
                        id: 8,
                        offset: 0,
                        len: 4,
                    },
                    target: MemoryTarget {
                        key: 0x1a2b_3c05,
                        addr: 0x0000_7f00_0000_3000,
                    },
                    imm: Some(WriteImm {
                        imm: 0xdead_beef,
                        recv_index: 2,
                    }),
                }),
                payload_len: 4,
            },
            payload: b"done",
        },
        Example {
            title: "A.3 ACK",
            text: "Cumulative PSN 0x100 (PSN 0x100 missing), PSNs 0x101, 0x103 and 0x10a received (SACK bits 0, 2, 9: bytes `a0 40`), triggered by PSN 0x10a on path 3, which has delivered 17 packets, 2 of them CE-marked; fair-share hint 50 Gbit/s (3.5, 3.6).",
            repr: Repr {
                header: header(Flags::NONE, 0x5678, 0xfedc_ba98_7654_3210, 0x42, 3, 0x1122_3399),
                body: Body::Ack(AckRepr {
                    cumulative: 0x100,
                    echo_psn: 0x10a,
                    echo_timestamp: 0x1122_3344,
                    echo_path: 3,
                    path_rx_count: 17,
                    path_ce_count: 2,
                    rate_hint_mbps: 50_000,
                    sack_offset: 0,
                    sack,
                }),
                payload_len: 0,
            },
            payload: b"",
        },
        Example {
            title: "A.4 CONNECT",
            text: "A first CONNECT (no cookie yet): an offer of MTU 4096, 16 paths, window 256, Reply Port 0 (the initiator receives on the port it sends the CONNECT to), data-centre timers, no packet protection, and the initiator serves 16 of the acceptor's READs at once (READ Depth, in the Path ID field); Destination Connection ID and Connection Token are 0, the PSN field holds the Initial PSN (3.2.4, 3.8.1).",
            repr: Repr {
                header: header(Flags::NONE, 0, 0, 0x1000, 16, 1),
                body: Body::Connect(ConnectRepr {
                    src_conn: 0x5678,
                    src_token: 0xfedc_ba98_7654_3210,
                    mtu: 4096,
                    max_paths: 16,
                    window: 256,
                    initial_psn: 0x1000,
                    reply_port: 0,
                    timer_profile: TimerProfile::DataCenter,
                    suite: CipherSuite::None,
                    key_id: 0,
                    cookie: [0; COOKIE_LEN],
                }),
                payload_len: 0,
            },
            payload: b"",
        },
        Example {
            title: "A.5 KEEPALIVE",
            text: "The smallest packet: common header and trailer only (3.8.3). Its PSN field holds the sender's next PSN, for information (3.2.4).",
            repr: Repr {
                header: header(Flags::NONE, 0x1234, token, 0x102, 0, 0x5566_7788),
                body: Body::Keepalive,
                payload_len: 0,
            },
            payload: b"",
        },
        Example {
            title: "A.6 RETRY",
            text: "The acceptor's stateless answer to the CONNECT of A.4 from an address it has not verified: addressed by the CONNECT's Source Connection ID and Source Token, carrying a cookie the initiator echoes in its next CONNECT (3.8.4, 5.1.4). 64 bytes against the CONNECT's 96.",
            repr: Repr {
                header: header(Flags::NONE, 0x5678, 0xfedc_ba98_7654_3210, 0, 0, 0x0bad_cafe),
                body: Body::Retry(RetryRepr { cookie }),
                payload_len: 0,
            },
            payload: b"",
        },
        Example {
            title: "A.7 ACK with a SACK Offset",
            text: "A long-haul connection (window 30000): PSN 0x100 is still missing and thousands of later PSNs have arrived. The ACK triggered by PSN 0x2000, the newest arrival, ends its SACK block there: SACK Offset 0x1e00 = 7680, so bit i stands for PSN 0x100 + 1 + 7680 + i = 0x1f01 + i. Every PSN from 0x1f01 to 0x2000 was received except 0x1f80 (bit 127), which the sender will declare lost (3.5, 3.6, 4.5, 4.6.2).",
            repr: Repr {
                header: header(Flags::NONE, 0x5678, 0xfedc_ba98_7654_3210, 0x43, 5, 0x1122_4000),
                body: Body::Ack(AckRepr {
                    cumulative: 0x100,
                    echo_psn: 0x2000,
                    echo_timestamp: 0x1122_3f00,
                    echo_path: 5,
                    path_rx_count: 515,
                    path_ce_count: 0,
                    rate_hint_mbps: 25_000,
                    sack_offset: 0x1e00,
                    sack: {
                        let mut s = SackBits::default();
                        for bit in (0..256).filter(|&b| b != 127) {
                            s.set(bit);
                        }
                        s
                    },
                }),
                payload_len: 0,
            },
            payload: b"",
        },
        Example {
            title: "A.8 CONNECT with EARLY (0-RTT)",
            text: "An early CONNECT (4.2.4): flag EARLY, an offer of packet protection under the job key's Key ID 1, and in the Cookie field the early proof: Time 0x18ed6e06645e4d15 (2026-12-02T12:00:00.123456789Z in ns since the Unix epoch), 8 zero bytes, then the 16-byte tag, HKDF-SHA256 under the job key over the proof's first 16 bytes, both ends' addresses and ports and the offer. It is `compliance/vectors/early/early_connect.vec`, where the tag is computed step by step (job key, 10.0.0.1:50000 to 10.0.0.2:4795). The first flight follows it: reliable packets with EARLY and PROTECTED, addressed with this CONNECT's Source Connection ID and Source Token (`early_write.vec`).",
            repr: Repr {
                header: header(Flags::EARLY, 0, 0, 0x4d, 16, 0x1000),
                body: Body::Connect(ConnectRepr {
                    src_conn: 0x0102_0304,
                    src_token: 0x1122_3344_5566_7788,
                    mtu: 4096,
                    max_paths: 16,
                    window: 256,
                    initial_psn: 0x4d,
                    reply_port: 4795,
                    timer_profile: TimerProfile::DataCenter,
                    suite: CipherSuite::Aes256Gcm,
                    key_id: 1,
                    cookie: {
                        let mut p = [0u8; COOKIE_LEN];
                        p[..8].copy_from_slice(&0x18ed_6e06_645e_4d15u64.to_be_bytes());
                        p[16..].copy_from_slice(&0x93df_6f94_14b5_c658_5193_fc2e_53bd_517au128.to_be_bytes());
                        p
                    },
                }),
                payload_len: 0,
            },
            payload: b"",
        },
        Example {
            title: "A.9 NEW_TOKEN",
            text: "The acceptor's address token for the initiator of an established connection (3.8.5, 4.2.5), addressed with the initiator's id and token; its PSN field holds the acceptor's next PSN. The token is 4.2.5's worked example: the RECOMMENDED construction (issue time 5, format 2, 11 zero bytes, then the SipHash-2-4-128 tag under the token secret 00..0f over its first 16 bytes and the address 10.0.0.1). The initiator puts it, unchanged, in the Cookie field of its next CONNECT to this acceptor from 10.0.0.1.",
            repr: Repr {
                header: header(Flags::NONE, 0x5678, 0xfedc_ba98_7654_3210, 0x4d, 0, 0x0bad_d00d),
                body: Body::NewToken(NewTokenRepr {
                    token: {
                        let mut t = [0u8; COOKIE_LEN];
                        t[3] = 5;
                        t[4] = 2;
                        t[16..].copy_from_slice(&0xd3b6_d071_3d04_2428_818e_2962_cb98_63d5u128.to_be_bytes());
                        t
                    },
                }),
                payload_len: 0,
            },
            payload: b"",
        },
    ]
}

fn type_name(code: u8) -> &'static str {
    match wire::PacketType::from(code) {
        wire::PacketType::Write => "WRITE",
        wire::PacketType::WriteImm => "WRITE_IMM",
        wire::PacketType::Ack => "ACK",
        wire::PacketType::Connect => "CONNECT",
        wire::PacketType::Keepalive => "KEEPALIVE",
        wire::PacketType::Retry => "RETRY",
        wire::PacketType::NewToken => "NEW_TOKEN",
        _ => "?",
    }
}

fn value(bytes: &[u8], show: Show) -> String {
    let n = bytes.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b));
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match show {
        Show::Dec => n.to_string(),
        Show::Hex => format!("0x{hex}"),
        Show::Text => format!("'{}'", String::from_utf8_lossy(bytes)),
        Show::Type => type_name(bytes[0]).to_owned(),
        Show::Flags => match n {
            0 => "none".into(),
            1 => "ACK_REQUEST".into(),
            0x10 => "EARLY".into(),
            _ => format!("0x{hex}"),
        },
        Show::Profile => match n {
            0 => "DATA_CENTER".into(),
            _ => "EMULATION".into(),
        },
        Show::Suite => match n {
            0 => "NONE".into(),
            _ => "AES_256_GCM".into(),
        },
        Show::Sack => {
            let bits: Vec<String> = (0..bytes.len() * 8)
                .filter(|i| bytes[i / 8] & (0x80 >> (i % 8)) != 0)
                .map(|i| i.to_string())
                .collect();
            format!("bits {}", bits.join(", "))
        }
        Show::Bytes if bytes.iter().all(|&b| b == 0) => "all zero".into(),
        Show::Bytes => "opaque".into(),
    }
}

fn short_hex(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if bytes.len() > 8 {
        format!("{}…{}", &hex[..8], &hex[hex.len() - 4..])
    } else {
        hex
    }
}

fn render() -> String {
    let mut out = String::from(
        "# Appendix A. Example packets (informative)\n\n\
         Each example is emitted by the reference implementation (`core/src/wire/`)\n\
         and this appendix is generated from it (`core/tests/appendix.rs`, which\n\
         fails when the two differ); every CRC trailer is also checked with zlib's\n\
         `crc32` by the golden vectors in `compliance/vectors/`, the normative test\n\
         data (5.2.2). They show byte order, the position of every field and the\n\
         CRC.\n",
    );
    for ex in examples() {
        let mut bytes = vec![0u8; ex.repr.buffer_len()];
        ex.repr.emit(&mut bytes, ex.payload);
        let _ = write!(out, "\n## {}\n\n{}\n\n```\n", ex.title, ex.text);
        for (i, row) in bytes.chunks(16).enumerate() {
            let cells: Vec<String> = row.iter().map(|b| format!("{b:02x}")).collect();
            let _ = writeln!(out, "{:04x}  {}", i * 16, cells.join(" "));
        }
        out.push_str("```\n\n| offset | bytes | field | value |\n|---|---|---|---|\n");
        let mut at = 0;
        let mut row = |out: &mut String, name: &str, len: usize, show: Show| {
            let b = &bytes[at..at + len];
            let _ = writeln!(
                out,
                "| {at} | `{}` | {name} | {} |",
                short_hex(b),
                value(b, show)
            );
            at += len;
        };
        for (name, len, show) in COMMON {
            // Spec 3.2.4: what the PSN field holds on each type.
            let name = match (name, &ex.repr.body) {
                ("PSN", Body::Connect(_) | Body::Accept(_)) => "PSN (the Initial PSN, 3.2.4)",
                ("PSN", Body::Retry(_)) => "PSN (0, 3.2.4)",
                ("Path ID", Body::Connect(_) | Body::Accept(_)) => "Path ID: READ Depth (3.8.1)",
                ("PSN", b) if !b.packet_type().is_reliable() => "PSN (the next PSN, 3.2.4)",
                _ => name,
            };
            row(&mut out, name, len, show);
        }
        for (name, len, show) in extension_fields(&ex.repr.body) {
            row(&mut out, name, len, show);
        }
        if !ex.payload.is_empty() {
            row(&mut out, "payload", ex.payload.len(), Show::Text);
        }
        row(&mut out, "CRC-32", 4, Show::Hex);
        assert_eq!(at, bytes.len(), "{}: table covers every byte", ex.title);
        let _ = writeln!(out, "\nTotal: {} bytes.", bytes.len());
    }
    out
}

#[test]
fn appendix_a_is_what_the_wire_module_emits() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/spec/appendix-a-examples.md");
    let rendered = render();
    if std::env::var_os("METAROCE_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("write the appendix");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).expect("read the appendix");
    assert!(
        on_disk == rendered,
        "docs/spec/appendix-a-examples.md differs from what the wire module emits; \
         rerun with METAROCE_BLESS=1 to rewrite it"
    );
}
