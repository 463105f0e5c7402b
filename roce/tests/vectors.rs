//! Golden vectors (`compliance/vectors/roce/*.vec`, written by
//! `generate.py` there, plus two public captures): every packet parses to
//! the fields its file lists and passes the ICRC check, and every field set
//! emits exactly the packet's bytes, ICRC included.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use roce_baseline::parse_frame;
use roce_baseline::wire::icrc;
use roce_baseline::wire::{AethRepr, BthRepr, NakCode, Opcode, Repr, RethRepr, Syndrome};

struct Vector {
    name: String,
    fields: BTreeMap<String, String>,
    packet: Vec<u8>,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../compliance/vectors/roce")
}

fn load() -> Vec<Vector> {
    let mut out = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir())
        .expect("vector directory")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "vec"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut fields = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (k, v) = line.split_once(':').expect("key: value");
            fields.insert(k.trim().to_string(), v.trim().to_string());
        }
        let packet = hex(&fields["packet"]);
        out.push(Vector {
            name: fields["name"].clone(),
            fields,
            packet,
        });
    }
    out
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn num(v: &Vector, key: &str) -> u64 {
    let s = &v.fields[key];
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

fn flag(v: &Vector, key: &str) -> bool {
    num(v, key) != 0
}

fn opcode(name: &str) -> Opcode {
    Opcode::ALL
        .into_iter()
        .find(|o| format!("{o:?}") == name)
        .unwrap_or_else(|| panic!("unknown opcode {name}"))
}

fn expected_repr(v: &Vector) -> Repr {
    let op = opcode(&v.fields["opcode"]);
    let bth = BthRepr {
        opcode: op,
        solicited: flag(v, "se"),
        mig_req: flag(v, "m"),
        pad_count: num(v, "pad") as u8,
        pkey: num(v, "pkey") as u16,
        fecn: flag(v, "fecn"),
        becn: flag(v, "becn"),
        dest_qp: num(v, "dqpn") as u32,
        ack_req: flag(v, "ackreq"),
        psn: num(v, "psn") as u32,
    };
    assert_eq!(num(v, "tver"), 0);
    let reth = op.has_reth().then(|| RethRepr {
        va: num(v, "reth.va"),
        rkey: num(v, "reth.rkey") as u32,
        dma_len: num(v, "reth.len") as u32,
    });
    let aeth = op.has_aeth().then(|| {
        let (kind, value) = v.fields["aeth.syndrome"].split_once(' ').unwrap();
        let value: u8 = value.parse().unwrap();
        AethRepr {
            syndrome: match kind {
                "ack" => Syndrome::Ack { credits: value },
                "rnr" => Syndrome::RnrNak { timer: value },
                "nak" => Syndrome::Nak(NakCode::from_code(value)),
                other => panic!("syndrome kind {other}"),
            },
            msn: num(v, "aeth.msn") as u32,
        }
    });
    let imm = op.has_immdt().then(|| num(v, "imm") as u32);
    Repr {
        bth,
        reth,
        aeth,
        imm,
        payload_len: num(v, "payload_len") as usize,
    }
}

#[test]
fn every_vector_parses_emits_and_checks_its_icrc() {
    let vectors = load();
    assert!(vectors.len() >= 30, "only {} vectors", vectors.len());
    let mut opcodes = BTreeSet::new();
    let mut families = BTreeSet::new();
    for v in &vectors {
        let transport = icrc::verify_ip_packet(&v.packet)
            .unwrap_or_else(|e| panic!("{}: ICRC check: {e}", v.name));
        let ip_udp = &v.packet[..v.packet.len() - transport.len()];
        if v.fields["kind"] == "icrc-only" {
            // Outside the RC baseline (a UC opcode): the ICRC is all we check.
            assert!(Repr::parse(transport).is_err(), "{}", v.name);
            continue;
        }
        let expected = expected_repr(v);
        // Deconstruct: bytes to fields.
        let (repr, payload) =
            Repr::parse(transport).unwrap_or_else(|e| panic!("{}: parse: {e}", v.name));
        assert_eq!(repr, expected, "{}", v.name);
        let hl = repr.header_len();
        assert_eq!(payload, &transport[hl..hl + repr.payload_len], "{}", v.name);
        // Construct: fields to bytes, in a buffer that shows missed bytes.
        let mut buf = vec![0xa5u8; expected.buffer_len()];
        expected.emit(&mut buf, payload, ip_udp).unwrap();
        assert_eq!(buf, transport, "{}: emitted bytes", v.name);
        // The same through a whole Ethernet frame.
        let ethertype: [u8; 2] = if v.packet[0] >> 4 == 4 {
            [0x08, 0x00]
        } else {
            [0x86, 0xdd]
        };
        let mut frame = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        frame.extend_from_slice(&ethertype);
        frame.extend_from_slice(&v.packet);
        let (_, t) = parse_frame(&frame).unwrap_or_else(|e| panic!("{}: frame: {e}", v.name));
        assert_eq!(t, transport);
        opcodes.insert(u8::from(repr.bth.opcode));
        families.insert((v.packet[0] >> 4, format!("{:?}", repr.bth.opcode)));
    }
    for op in Opcode::ALL {
        assert!(opcodes.contains(&u8::from(op)), "no vector for {op:?}");
    }
    assert!(families.iter().any(|(ip, _)| *ip == 6), "no IPv6 vector");
}

#[test]
fn the_hardware_cnp_is_among_the_vectors_and_a_flipped_bit_fails() {
    let vectors = load();
    let cx4 = vectors
        .iter()
        .find(|v| v.name == "cnp_connectx4lx")
        .expect("ConnectX-4 Lx capture");
    let transport = icrc::verify_ip_packet(&cx4.packet).unwrap();
    assert_eq!(&transport[transport.len() - 4..], &[0x82, 0xfd, 0x00, 0x2a]);
    for i in [20, 28, 30, 33, 40, 55] {
        // Invariant bytes: UDP source port, opcode, P_Key, DestQP, reserved.
        let mut bad = cx4.packet.clone();
        bad[i] ^= 0x01;
        assert_eq!(
            icrc::verify_ip_packet(&bad).err(),
            Some(roce_baseline::wire::Error::BadIcrc),
            "byte {i}"
        );
    }
}
