//! `cargo xtask qemu`: the project's main job.
//!
//! Until the QEMU issue (issue 4) lands, this is an honest placeholder that
//! runs on the host: it builds one packet of every MetaRoCE type with
//! `metaroce_core::wire`, wraps each in Ethernet/IPv4/UDP (and IPv6), parses
//! the frames back and prints what came out. Issue 4 replaces the body of
//! [`run`] with the real job: two emulated DPUs exchanging RDMA traffic under
//! QEMU through a lossy fabric.

use metaroce_core::wire::encap::{self, ecn};
use metaroce_core::wire::packet::WriteImm;
use metaroce_core::wire::{
    self, AckRepr, Body, CloseReason, CloseRepr, ConnectRepr, EncapRepr, Flags, Header, IpPair,
    MemoryTarget, MessageSpan, NakReason, NakRepr, PacketType, ReadRequestRepr, ReadResponseRepr,
    Repr, SackBits, SendRepr, WriteRepr, DEFAULT_UDP_PORT,
};
use smoltcp::wire::{EthernetAddress, Ipv4Address, Ipv6Address};

use crate::util::Error;

/// Payload bytes carried by each data packet of the demo.
const DEMO_PAYLOAD_LEN: u16 = 64;

/// Entry point: `cargo xtask qemu`.
pub fn run(args: &[String]) -> Result<(), Error> {
    if let Some(arg) = args.first() {
        return Err(Error::new(format!(
            "`cargo xtask qemu` takes no arguments yet (got `{arg}`); its flags arrive with issue 4"
        )));
    }
    println!("MetaRoCE main job: PLACEHOLDER.");
    println!(
        "The QEMU run (two emulated DPUs over a lossy fabric) arrives with issue 4. Until then this"
    );
    println!(
        "host demo encodes one packet of every MetaRoCE type, wraps it in Ethernet/IP/UDP, parses it back.\n"
    );
    let rows: Vec<Row> = sample_packets().iter().map(round_trip).collect();
    print_table(&rows);
    let failed = rows.iter().filter(|r| r.problem.is_some()).count();
    println!(
        "\n{} packet types, {} round-trip OK over IPv4 and IPv6; UDP destination port {DEFAULT_UDP_PORT}, \
         path entropy in the UDP source port.",
        rows.len(),
        rows.len() - failed
    );
    for row in rows.iter().filter(|r| r.problem.is_some()) {
        eprintln!("{}: {}", row.name, row.problem.as_deref().unwrap_or(""));
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(Error::new(format!(
            "{failed} packet type(s) failed to round-trip"
        )))
    }
}

/// One line of the table.
struct Row {
    name: &'static str,
    code: u8,
    header_len: usize,
    payload_len: usize,
    frame_v4: usize,
    frame_v6: usize,
    fields: String,
    /// Why the round trip failed, if it did.
    problem: Option<String>,
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<14} {:>4} {:>6} {:>7} {:>8} {:>8}  {:<12} decoded fields",
        "type", "code", "header", "payload", "frame v4", "frame v6", "round-trip"
    );
    println!("{}", "-".repeat(110));
    for r in rows {
        println!(
            "{:<14} 0x{:02x} {:>6} {:>7} {:>8} {:>8}  {:<12} {}",
            r.name,
            r.code,
            r.header_len,
            r.payload_len,
            r.frame_v4,
            r.frame_v6,
            if r.problem.is_none() { "OK" } else { "FAIL" },
            r.fields
        );
    }
    println!("(header = MetaRoCE common + extension header; frame = Ethernet + IP + UDP + header + payload + CRC-32)");
}

fn type_name(t: PacketType) -> &'static str {
    match t {
        PacketType::Write => "WRITE",
        PacketType::WriteImm => "WRITE_IMM",
        PacketType::Send => "SEND",
        PacketType::SendImm => "SEND_IMM",
        PacketType::ReadRequest => "READ_REQUEST",
        PacketType::ReadResponse => "READ_RESPONSE",
        PacketType::Ack => "ACK",
        PacketType::Nak => "NAK",
        PacketType::Connect => "CONNECT",
        PacketType::Accept => "ACCEPT",
        PacketType::Close => "CLOSE",
        PacketType::Keepalive => "KEEPALIVE",
        PacketType::Unknown(_) => "UNKNOWN",
    }
}

/// One packet of every type, with recognisable field values.
fn sample_packets() -> Vec<Repr> {
    let header = |psn: u32, flags: Flags| Header {
        flags,
        dst_conn: 0x0000_0101,
        token: 0x5eed_cafe_f00d_0001,
        psn,
        path: 3,
        timestamp: 1_234_567,
    };
    let data = |body: Body, psn: u32| Repr {
        header: header(psn, Flags::ACK_REQUEST),
        body,
        payload_len: DEMO_PAYLOAD_LEN,
    };
    let control = |body: Body| Repr {
        header: header(0, Flags::NONE),
        body,
        payload_len: 0,
    };
    let msg = MessageSpan {
        id: 7,
        offset: 4096,
        len: 8192,
    };
    let target = MemoryTarget {
        key: 0x00ab_cdef,
        addr: 0x4000_1000,
    };
    let mut sack = SackBits::EMPTY;
    for bit in [0, 1, 2, 5, 130, 255] {
        sack.set(bit);
    }
    let connect = ConnectRepr {
        src_conn: 0x0000_0202,
        src_token: 0x0bad_5eed_0000_0002,
        mtu: 4096,
        max_paths: 16,
        window: 256,
        initial_psn: 1000,
        reply_port: 0,
    };
    vec![
        data(
            Body::Write(WriteRepr {
                msg,
                target,
                imm: None,
            }),
            100,
        ),
        data(
            Body::Write(WriteRepr {
                msg,
                target,
                imm: Some(WriteImm {
                    imm: 0xfeed_beef,
                    recv_index: 4,
                }),
            }),
            101,
        ),
        data(
            Body::Send(SendRepr {
                msg,
                recv_index: 5,
                imm: None,
            }),
            102,
        ),
        data(
            Body::Send(SendRepr {
                msg,
                recv_index: 5,
                imm: Some(42),
            }),
            103,
        ),
        Repr {
            header: header(104, Flags::ACK_REQUEST),
            body: Body::ReadRequest(ReadRequestRepr {
                msg_id: 8,
                len: 65536,
                source: MemoryTarget {
                    key: 0x0012_3456,
                    addr: 0x8000_0000,
                },
                sink: target,
            }),
            payload_len: 0,
        },
        data(Body::ReadResponse(ReadResponseRepr { msg, target }), 105),
        control(Body::Ack(AckRepr {
            cumulative: 99,
            echo_psn: 103,
            echo_timestamp: 1_234_000,
            echo_path: 3,
            path_rx_count: 40,
            path_ce_count: 2,
            rate_hint_mbps: 25_000,
            sack,
        })),
        control(Body::Nak(NakRepr {
            cumulative: 99,
            nak_psn: 104,
            reason: NakReason::OutOfBounds,
        })),
        Repr {
            header: Header {
                dst_conn: 0,
                token: 0,
                ..header(0, Flags::NONE)
            },
            body: Body::Connect(connect),
            payload_len: 0,
        },
        control(Body::Accept(ConnectRepr {
            src_conn: 0x0000_0101,
            src_token: 0x5eed_cafe_f00d_0001,
            ..connect
        })),
        control(Body::Close(CloseRepr {
            reason: CloseReason::Normal,
        })),
        control(Body::Keepalive),
    ]
}

/// A few decoded fields of a parsed packet, for the table.
fn describe(repr: &Repr) -> String {
    let h = &repr.header;
    let common = format!("psn={} path={}", h.psn, h.path);
    let fields = match &repr.body {
        Body::Write(w) => format!(
            "key={:#x} addr={:#x} msg={} off={}/{}{}",
            w.target.key,
            w.target.addr,
            w.msg.id,
            w.msg.offset,
            w.msg.len,
            w.imm
                .map(|i| format!(" imm={:#x} recv={}", i.imm, i.recv_index))
                .unwrap_or_default()
        ),
        Body::Send(s) => format!(
            "recv={} msg={} off={}/{}{}",
            s.recv_index,
            s.msg.id,
            s.msg.offset,
            s.msg.len,
            s.imm.map(|i| format!(" imm={i}")).unwrap_or_default()
        ),
        Body::ReadRequest(r) => format!(
            "len={} src={:#x}@{:#x} sink={:#x}@{:#x}",
            r.len, r.source.key, r.source.addr, r.sink.key, r.sink.addr
        ),
        Body::ReadResponse(r) => format!(
            "key={:#x} addr={:#x} msg={} off={}/{}",
            r.target.key, r.target.addr, r.msg.id, r.msg.offset, r.msg.len
        ),
        Body::Ack(a) => {
            let bits: Vec<String> = a.sack.iter_set().map(|b| b.to_string()).collect();
            format!(
                "cum={} echo_psn={} sack=[{}] ce={}/{} hint={} Mb/s",
                a.cumulative,
                a.echo_psn,
                bits.join(","),
                a.path_ce_count,
                a.path_rx_count,
                a.rate_hint_mbps
            )
        }
        Body::Nak(n) => format!(
            "cum={} nak_psn={} reason={:?}",
            n.cumulative, n.nak_psn, n.reason
        ),
        Body::Connect(c) | Body::Accept(c) => format!(
            "src_conn={:#x} mtu={} paths={} window={} ipsn={}",
            c.src_conn, c.mtu, c.max_paths, c.window, c.initial_psn
        ),
        Body::Close(c) => format!("reason={:?}", c.reason),
        Body::Keepalive => String::new(),
    };
    format!("{common} {fields}").trim_end().to_string()
}

fn encapsulation(ip: IpPair, data: bool) -> EncapRepr {
    EncapRepr {
        src_mac: EthernetAddress([0x02, 0, 0, 0, 0, 0x01]),
        dst_mac: EthernetAddress([0x02, 0, 0, 0, 0, 0x02]),
        ip,
        src_port: 49152 + 3,
        dst_port: DEFAULT_UDP_PORT,
        dscp: 26,
        // Data is ECN-capable; control packets are not (spec 3.1).
        ecn: if data { ecn::ECT0 } else { ecn::NOT_ECT },
        hop_limit: 64,
    }
}

/// Emits `repr` (with a patterned payload) into a frame over `ip`, parses
/// it back, and checks that everything survived. Returns the frame length
/// and the decoded packet.
fn frame_round_trip(repr: &Repr, ip: IpPair) -> Result<(usize, Repr), String> {
    let payload: Vec<u8> = (0..repr.payload_len).map(|i| (i % 251) as u8).collect();
    let mut packet = vec![0u8; repr.buffer_len()];
    repr.emit(&mut packet, &payload);
    let encap = encapsulation(ip, repr.body.packet_type().carries_payload());
    let mut frame = vec![0xa5u8; encap.frame_len(packet.len())];
    let frame_len = encap
        .emit(&mut frame, packet.len(), |udp_payload| {
            udp_payload.copy_from_slice(&packet)
        })
        .map_err(|e| format!("encapsulation emit: {e}"))?;
    let (info, transport) = encap::parse_frame(&frame[..frame_len], DEFAULT_UDP_PORT)
        .map_err(|e| format!("frame parse: {e}"))?;
    let (parsed, parsed_payload) = wire::parse(transport).map_err(|e| format!("parse: {e}"))?;
    if parsed != *repr {
        return Err(format!("decoded {parsed:?}, sent {repr:?}"));
    }
    if parsed_payload != payload.as_slice() {
        return Err("payload changed".into());
    }
    if (info.src_port, info.dst_port, info.ecn, info.ip)
        != (encap.src_port, encap.dst_port, encap.ecn, encap.ip)
    {
        return Err(format!("encapsulation changed: {info:?}"));
    }
    let mut again = vec![0u8; parsed.buffer_len()];
    parsed.emit(&mut again, parsed_payload);
    if again != packet {
        return Err("re-emitting the decoded packet gave other bytes".into());
    }
    Ok((frame_len, parsed))
}

fn round_trip(repr: &Repr) -> Row {
    let v4 = IpPair::V4 {
        src: Ipv4Address::new(10, 0, 0, 1),
        dst: Ipv4Address::new(10, 0, 0, 2),
    };
    let v6 = IpPair::V6 {
        src: Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
        dst: Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
    };
    let t = repr.body.packet_type();
    let (frame_v4, frame_v6, fields, problem) =
        match (frame_round_trip(repr, v4), frame_round_trip(repr, v6)) {
            (Ok((a, decoded)), Ok((b, _))) => (a, b, describe(&decoded), None),
            (Err(e), _) => (0, 0, String::new(), Some(format!("IPv4: {e}"))),
            (_, Err(e)) => (0, 0, String::new(), Some(format!("IPv6: {e}"))),
        };
    Row {
        name: type_name(t),
        code: u8::from(t),
        header_len: repr.header_len(),
        payload_len: usize::from(repr.payload_len),
        frame_v4,
        frame_v6,
        fields,
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_packet_type_is_in_the_demo_and_round_trips() {
        let samples = sample_packets();
        let types: Vec<PacketType> = samples.iter().map(|r| r.body.packet_type()).collect();
        assert_eq!(types, PacketType::ALL);
        for repr in &samples {
            let row = round_trip(repr);
            assert!(row.problem.is_none(), "{}: {:?}", row.name, row.problem);
            assert_eq!(row.frame_v6, row.frame_v4 + 20);
        }
    }
}
