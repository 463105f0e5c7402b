//! Golden vectors: every file in `compliance/vectors/` (written by the
//! independent Python generator there, format in its README) checked both
//! ways against `metaroce_core::wire`.
//!
//! * valid packets: `wire::parse` yields exactly the file's fields and
//!   payload; `Repr::emit` (into a buffer pre-filled with 0xa5, so a field the
//!   emitter forgets shows) and the gather path `emit_header` + `trailer`
//!   reproduce the file's bytes;
//! * frames: `encap::parse_frame` reports the file's addresses, ports, DSCP,
//!   ECN and hop limit, and `EncapRepr::emit` reproduces the frame;
//! * malformed packets and frames: parsing returns exactly the named error.
//!
//! Each test collects every failing file before asserting, so one run shows
//! them all.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use metaroce_core::wire::encap::{self, ecn};
use metaroce_core::wire::packet::WriteImm;
use metaroce_core::wire::{
    self, AckRepr, Body, CipherSuite, CloseReason, CloseRepr, ConnectRepr, EncapRepr, Error, Flags,
    FrameInfo, Header, IpPair, MemoryTarget, MessageSpan, NakReason, NakRepr, NewTokenRepr, Packet,
    PacketType, ReadRequestRepr, ReadResponseRepr, Repr, RetryRepr, SackBits, SendRepr,
    TimerProfile, WriteRepr, COOKIE_LEN,
};
use smoltcp::wire::EthernetAddress;

/// Files the generator writes today; fewer means the folder went missing or
/// lost cases.
const MIN_VALID: usize = 33;
const MIN_MALFORMED: usize = 42;
const MIN_MALFORMED_FRAMES: usize = 13;
const MIN_FRAMES: usize = 6;

fn vector_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../compliance/vectors")
}

/// One `.vec` file: its `key = value` lines, and which keys a test read, so
/// a key nobody checks (a typo, a field the test forgot) is an error.
struct Vector {
    name: String,
    fields: BTreeMap<String, String>,
    used: std::cell::RefCell<BTreeSet<String>>,
}

type Check<T> = Result<T, String>;

impl Vector {
    fn load(path: &std::path::Path) -> Check<Vector> {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        let mut fields = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("{stem}:{}: no '='", n + 1))?;
            let k = k.trim().to_owned();
            if fields.insert(k.clone(), v.trim().to_owned()).is_some() {
                return Err(format!("{stem}:{}: duplicate key {k}", n + 1));
            }
        }
        let v = Vector {
            name: stem,
            fields,
            used: Default::default(),
        };
        if v.str("name")? != v.name {
            return Err(format!("{}: name does not match file name", v.name));
        }
        Ok(v)
    }

    fn has(&self, key: &str) -> bool {
        self.fields.contains_key(key)
    }

    fn str(&self, key: &str) -> Check<&str> {
        self.used.borrow_mut().insert(key.to_owned());
        self.fields
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("{}: missing key {key}", self.name))
    }

    fn int<T: TryFrom<u64>>(&self, key: &str) -> Check<T> {
        let s = self.str(key)?;
        let v = match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => s.parse::<u64>(),
        }
        .map_err(|e| format!("{}: {key} = {s}: {e}", self.name))?;
        T::try_from(v).map_err(|_| format!("{}: {key} = {s} out of range", self.name))
    }

    fn hex(&self, key: &str) -> Check<Vec<u8>> {
        let s = self.str(key)?;
        if s.len() % 2 != 0 {
            return Err(format!("{}: {key}: odd hex length", self.name));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(&s[i..i + 2], 16)
                    .map_err(|e| format!("{}: {key}: {e}", self.name))
            })
            .collect()
    }

    fn mac(&self, key: &str) -> Check<EthernetAddress> {
        let s = self.str(key)?;
        let bytes: Vec<u8> = s
            .split(':')
            .map(|p| u8::from_str_radix(p, 16))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {key}: {e}", self.name))?;
        let arr: [u8; 6] = bytes
            .try_into()
            .map_err(|_| format!("{}: {key}: not 6 bytes", self.name))?;
        Ok(EthernetAddress(arr))
    }

    fn parsed<T: std::str::FromStr>(&self, key: &str) -> Check<T>
    where
        T::Err: std::fmt::Display,
    {
        let s = self.str(key)?;
        s.parse()
            .map_err(|e| format!("{}: {key} = {s}: {e}", self.name))
    }

    /// Fails if the file has a key no check read.
    fn all_used(&self) -> Check<()> {
        let used = self.used.borrow();
        let unread: Vec<&String> = self.fields.keys().filter(|k| !used.contains(*k)).collect();
        if unread.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: keys not checked: {unread:?}", self.name))
        }
    }

    fn kind(&self) -> Kind {
        if self.has("error") {
            Kind::Malformed
        } else if self.has("frame_error") {
            Kind::MalformedFrame
        } else {
            Kind::Valid
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Valid,
    Malformed,
    MalformedFrame,
}

fn load_all() -> Vec<Vector> {
    let dir = vector_dir();
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("vector folder {}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "vec"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| Vector::load(p).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn of_kind(kind: Kind) -> Vec<Vector> {
    load_all()
        .into_iter()
        .filter(|v| v.kind() == kind)
        .collect()
}

fn report(what: &str, checked: usize, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} of {checked} {what} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn type_by_name(name: &str) -> Option<PacketType> {
    Some(match name {
        "WRITE" => PacketType::Write,
        "WRITE_IMM" => PacketType::WriteImm,
        "SEND" => PacketType::Send,
        "SEND_IMM" => PacketType::SendImm,
        "READ_REQUEST" => PacketType::ReadRequest,
        "READ_RESPONSE" => PacketType::ReadResponse,
        "ACK" => PacketType::Ack,
        "NAK" => PacketType::Nak,
        "CONNECT" => PacketType::Connect,
        "ACCEPT" => PacketType::Accept,
        "CLOSE" => PacketType::Close,
        "KEEPALIVE" => PacketType::Keepalive,
        "RETRY" => PacketType::Retry,
        "NEW_TOKEN" => PacketType::NewToken,
        _ => return None,
    })
}

fn nak_reason_by_name(name: &str) -> Option<NakReason> {
    Some(match name {
        "InvalidKey" => NakReason::InvalidKey,
        "AccessDenied" => NakReason::AccessDenied,
        "OutOfBounds" => NakReason::OutOfBounds,
        "ProtocolError" => NakReason::ProtocolError,
        "ReceiverNotReady" => NakReason::ReceiverNotReady,
        "ReceiveTooSmall" => NakReason::ReceiveTooSmall,
        _ => return None,
    })
}

fn close_reason_by_name(name: &str) -> Option<CloseReason> {
    Some(match name {
        "Normal" => CloseReason::Normal,
        "Error" => CloseReason::Error,
        "IdleTimeout" => CloseReason::IdleTimeout,
        "Rejected" => CloseReason::Rejected,
        "Reclaimed" => CloseReason::Reclaimed,
        _ => return None,
    })
}

fn ecn_by_name(name: &str) -> Option<u8> {
    Some(match name {
        "NOT_ECT" => ecn::NOT_ECT,
        "ECT1" => ecn::ECT1,
        "ECT0" => ecn::ECT0,
        "CE" => ecn::CE,
        _ => return None,
    })
}

fn error_by_name(text: &str) -> Option<Error> {
    let arg =
        |prefix: &str| -> Option<u8> { text.strip_prefix(prefix)?.strip_suffix(')')?.parse().ok() };
    Some(match text {
        "Truncated" => Error::Truncated,
        "BadCrc" => Error::BadCrc,
        "BadLength" => Error::BadLength,
        "Reserved" => Error::Reserved,
        "BadField" => Error::BadField,
        "NotMetaRoce" => Error::NotMetaRoce,
        "Encapsulation" => Error::Encapsulation,
        t if t.starts_with("BadVersion(") => Error::BadVersion(arg("BadVersion(")?),
        t if t.starts_with("UnknownType(") => Error::UnknownType(arg("UnknownType(")?),
        _ => return None,
    })
}

fn span(v: &Vector) -> Check<MessageSpan> {
    Ok(MessageSpan {
        id: v.int("msg_id")?,
        offset: v.int("msg_offset")?,
        len: v.int("msg_len")?,
    })
}

fn target(v: &Vector) -> Check<MemoryTarget> {
    Ok(MemoryTarget {
        key: v.int("key")?,
        addr: v.int("addr")?,
    })
}

fn connect(v: &Vector) -> Check<ConnectRepr> {
    Ok(ConnectRepr {
        src_conn: v.int("src_conn")?,
        src_token: v.int("src_token")?,
        mtu: v.int("mtu")?,
        max_paths: v.int("max_paths")?,
        window: v.int("window")?,
        initial_psn: v.int("initial_psn")?,
        reply_port: v.int("reply_port")?,
        timer_profile: match v.str("timer_profile")? {
            "DataCenter" => TimerProfile::DataCenter,
            "Emulation" => TimerProfile::Emulation,
            other => return Err(format!("{}: timer_profile {other}", v.name)),
        },
        suite: match v.str("suite")? {
            "None" => CipherSuite::None,
            "Aes256Gcm" => CipherSuite::Aes256Gcm,
            other => return Err(format!("{}: suite {other}", v.name)),
        },
        key_id: v.int("key_id")?,
        cookie: cookie(v)?,
    })
}

/// An ACCEPT: CONNECT's fields, and its Rate Grant (spec 3.8.1), which
/// must be what the Cookie field's first 4 bytes say.
fn accept(v: &Vector) -> Check<ConnectRepr> {
    let a = connect(v)?;
    if v.has("rate_grant_mbps") && a.rate_grant_mbps() != v.int::<u32>("rate_grant_mbps")? {
        return Err(format!("{}: rate_grant_mbps disagrees with cookie", v.name));
    }
    Ok(a)
}

fn cookie(v: &Vector) -> Check<[u8; COOKIE_LEN]> {
    v.hex("cookie")?
        .try_into()
        .map_err(|_| format!("{}: cookie is not {COOKIE_LEN} bytes", v.name))
}

/// The `Repr` and payload a valid file describes, built from its fields alone.
fn expected(v: &Vector) -> Check<(Repr, Vec<u8>)> {
    let type_name = v.str("type")?;
    let t = type_by_name(type_name).ok_or_else(|| format!("{}: type {type_name}", v.name))?;
    let code: u8 = v.int("type_code")?;
    if u8::from(t) != code {
        return Err(format!("{}: type_code {code:#04x} is not {t:?}", v.name));
    }
    let body = match t {
        PacketType::Write | PacketType::WriteImm => Body::Write(WriteRepr {
            msg: span(v)?,
            target: target(v)?,
            imm: if t == PacketType::WriteImm {
                Some(WriteImm {
                    imm: v.int("imm")?,
                    recv_index: v.int("recv_index")?,
                })
            } else {
                None
            },
        }),
        PacketType::Send | PacketType::SendImm => Body::Send(SendRepr {
            msg: span(v)?,
            recv_index: v.int("recv_index")?,
            imm: if t == PacketType::SendImm {
                Some(v.int("imm")?)
            } else {
                None
            },
        }),
        PacketType::ReadRequest => Body::ReadRequest(ReadRequestRepr {
            msg_id: v.int("msg_id")?,
            len: v.int("len")?,
            source: MemoryTarget {
                key: v.int("source_key")?,
                addr: v.int("source_addr")?,
            },
            sink: MemoryTarget {
                key: v.int("sink_key")?,
                addr: v.int("sink_addr")?,
            },
        }),
        PacketType::ReadResponse => Body::ReadResponse(ReadResponseRepr {
            msg: span(v)?,
            target: target(v)?,
        }),
        PacketType::Ack => {
            let mut sack = SackBits::EMPTY;
            let list = v.str("sack")?;
            for bit in list.split(',').filter(|s| !s.is_empty()) {
                let i: usize = bit
                    .parse()
                    .map_err(|e| format!("{}: sack {bit}: {e}", v.name))?;
                if !sack.set(i) {
                    return Err(format!("{}: sack bit {i} out of range", v.name));
                }
            }
            Body::Ack(AckRepr {
                cumulative: v.int("cumulative")?,
                echo_psn: v.int("echo_psn")?,
                echo_timestamp: v.int("echo_timestamp")?,
                echo_path: v.int("echo_path")?,
                path_rx_count: v.int("path_rx_count")?,
                path_ce_count: v.int("path_ce_count")?,
                rate_hint_mbps: v.int("rate_hint_mbps")?,
                sack_offset: v.int("sack_offset")?,
                sack,
            })
        }
        PacketType::Nak => {
            let name = v.str("reason")?;
            let reason =
                nak_reason_by_name(name).ok_or_else(|| format!("{}: reason {name}", v.name))?;
            if reason.code() != v.int::<u8>("reason_code")? {
                return Err(format!("{}: reason_code disagrees with {name}", v.name));
            }
            Body::Nak(NakRepr {
                cumulative: v.int("cumulative")?,
                nak_psn: v.int("nak_psn")?,
                reason,
            })
        }
        PacketType::Connect => Body::Connect(connect(v)?),
        PacketType::Accept => Body::Accept(accept(v)?),
        PacketType::Close => {
            let name = v.str("reason")?;
            let reason =
                close_reason_by_name(name).ok_or_else(|| format!("{}: reason {name}", v.name))?;
            if reason.code() != v.int::<u8>("reason_code")? {
                return Err(format!("{}: reason_code disagrees with {name}", v.name));
            }
            Body::Close(CloseRepr { reason })
        }
        PacketType::Keepalive => Body::Keepalive,
        PacketType::Retry => Body::Retry(RetryRepr { cookie: cookie(v)? }),
        PacketType::NewToken => Body::NewToken(NewTokenRepr {
            token: v
                .hex("address_token")?
                .try_into()
                .map_err(|_| format!("{}: address_token is not {COOKIE_LEN} bytes", v.name))?,
        }),
        PacketType::Unknown(_) => return Err(format!("{}: unknown type", v.name)),
    };
    let payload = v.hex("payload")?;
    let payload_len: u16 = v.int("payload_len")?;
    if usize::from(payload_len) != payload.len() {
        return Err(format!("{}: payload_len disagrees with payload", v.name));
    }
    let repr = Repr {
        header: Header {
            flags: Flags(v.int("flags")?),
            dst_conn: v.int("dst_conn")?,
            token: v.int("token")?,
            psn: v.int("psn")?,
            path: v.int("path")?,
            timestamp: v.int("timestamp")?,
        },
        body,
        payload_len,
    };
    if repr.body.packet_type() != t {
        return Err(format!(
            "{}: body is sent as {:?}",
            v.name,
            repr.body.packet_type()
        ));
    }
    Ok((repr, payload))
}

fn check_parse(v: &Vector) -> Check<()> {
    let (want, want_payload) = expected(v)?;
    let bytes = v.hex("bytes")?;
    let (got, payload) = wire::parse(&bytes).map_err(|e| format!("{}: parse: {e:?}", v.name))?;
    if got != want {
        return Err(format!(
            "{}: parsed\n  {got:?}\nexpected\n  {want:?}",
            v.name
        ));
    }
    if payload != want_payload.as_slice() {
        return Err(format!("{}: payload differs", v.name));
    }
    // The checked view agrees with the Repr on the raw header fields.
    let p = Packet::new_checked(bytes.as_slice()).map_err(|e| format!("{}: {e:?}", v.name))?;
    let h = want.header;
    let raw_ok = p.version() == wire::VERSION
        && p.packet_type() == want.body.packet_type()
        && p.flags() == h.flags
        && p.dst_conn() == h.dst_conn
        && p.token() == h.token
        && p.psn() == h.psn
        && p.path() == h.path
        && p.payload_len() == want.payload_len
        && p.timestamp() == h.timestamp
        && p.payload() == want_payload.as_slice()
        && p.verify_crc()
        && p.header_bytes().len() == want.header_len();
    if !raw_ok {
        return Err(format!(
            "{}: Packet accessors disagree with the file",
            v.name
        ));
    }
    Ok(())
}

fn check_emit(v: &Vector) -> Check<()> {
    let (repr, payload) = expected(v)?;
    let bytes = v.hex("bytes")?;
    if repr.buffer_len() != bytes.len() {
        return Err(format!(
            "{}: buffer_len {} but the vector has {} bytes",
            v.name,
            repr.buffer_len(),
            bytes.len()
        ));
    }
    let mut buf = vec![0xa5u8; repr.buffer_len()];
    repr.emit(&mut buf, &payload);
    if buf != bytes {
        return Err(format!(
            "{}: emit differs\n  got  {}\n  want {}",
            v.name,
            hex(&buf),
            hex(&bytes)
        ));
    }
    // Gather path: headers, payload from elsewhere, trailer computed apart.
    let mut header = vec![0xa5u8; repr.header_len()];
    repr.emit_header(&mut header);
    let trailer = Repr::trailer(&header, &payload);
    let gathered: Vec<u8> = [header.as_slice(), &payload, &trailer].concat();
    if gathered != bytes {
        return Err(format!("{}: emit_header + trailer differs", v.name));
    }
    Ok(())
}

fn encap_of(v: &Vector) -> Check<EncapRepr> {
    let ip = match v.int::<u8>("ip_version")? {
        4 => IpPair::V4 {
            src: v.parsed::<Ipv4Addr>("ip_src")?,
            dst: v.parsed::<Ipv4Addr>("ip_dst")?,
        },
        6 => IpPair::V6 {
            src: v.parsed::<Ipv6Addr>("ip_src")?,
            dst: v.parsed::<Ipv6Addr>("ip_dst")?,
        },
        other => return Err(format!("{}: ip_version {other}", v.name)),
    };
    let ecn_name = v.str("ecn")?;
    Ok(EncapRepr {
        src_mac: v.mac("eth_src")?,
        dst_mac: v.mac("eth_dst")?,
        ip,
        src_port: v.int("udp_src_port")?,
        dst_port: v.int("udp_dst_port")?,
        dscp: v.int("dscp")?,
        ecn: ecn_by_name(ecn_name).ok_or_else(|| format!("{}: ecn {ecn_name}", v.name))?,
        hop_limit: v.int("hop_limit")?,
    })
}

fn check_frame(v: &Vector) -> Check<()> {
    let e = encap_of(v)?;
    let frame = v.hex("frame")?;
    let bytes = v.hex("bytes")?;
    let (info, transport) = encap::parse_frame(&frame, e.dst_port)
        .map_err(|err| format!("{}: parse_frame: {err:?}", v.name))?;
    let want = FrameInfo {
        src_mac: e.src_mac,
        dst_mac: e.dst_mac,
        ip: e.ip,
        src_port: e.src_port,
        dst_port: e.dst_port,
        dscp: e.dscp,
        ecn: e.ecn,
        hop_limit: e.hop_limit,
    };
    if info != want {
        return Err(format!(
            "{}: frame info\n  {info:?}\nexpected\n  {want:?}",
            v.name
        ));
    }
    if info.is_ce() != (e.ecn == ecn::CE) {
        return Err(format!("{}: is_ce disagrees with ecn", v.name));
    }
    if transport != bytes.as_slice() {
        return Err(format!("{}: UDP payload is not the packet bytes", v.name));
    }
    let (repr, _) = wire::parse(transport).map_err(|err| format!("{}: {err:?}", v.name))?;
    if repr != expected(v)?.0 {
        return Err(format!("{}: packet inside the frame differs", v.name));
    }
    let mut buf = vec![0xa5u8; e.frame_len(bytes.len())];
    let n = e
        .emit(&mut buf, bytes.len(), |udp_payload| {
            udp_payload.copy_from_slice(&bytes)
        })
        .map_err(|err| format!("{}: emit: {err:?}", v.name))?;
    if n != frame.len() || buf != frame {
        return Err(format!(
            "{}: frame emit differs\n  got  {}\n  want {}",
            v.name,
            hex(&buf[..n]),
            hex(&frame)
        ));
    }
    // A device that vouches for received checksums changes neither what
    // is sent nor what is read.
    let mut vouched = vec![0xa5u8; e.frame_len(bytes.len())];
    e.emit_with(
        &mut vouched,
        bytes.len(),
        &encap::rx_verified_checksums(),
        |udp_payload| udp_payload.copy_from_slice(&bytes),
    )
    .map_err(|err| format!("{}: emit_with: {err:?}", v.name))?;
    if vouched != frame {
        return Err(format!("{}: emit_with (rx verified) differs", v.name));
    }
    if encap::parse_frame_with(&frame, e.dst_port, &encap::rx_verified_checksums())
        != Ok((info, transport))
    {
        return Err(format!(
            "{}: parse_frame_with (rx verified) differs",
            v.name
        ));
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn for_each(kind: Kind, what: &str, min: usize, check: impl Fn(&Vector) -> Check<()>) {
    let vectors = of_kind(kind);
    assert!(
        vectors.len() >= min,
        "only {} {what} in {} (expected at least {min})",
        vectors.len(),
        vector_dir().display()
    );
    let failures: Vec<String> = vectors.iter().filter_map(|v| check(v).err()).collect();
    report(what, vectors.len(), failures);
}

#[test]
fn valid_vectors_parse_to_their_fields() {
    for_each(Kind::Valid, "valid vectors (parse)", MIN_VALID, check_parse);
}

#[test]
fn valid_vectors_emit_their_bytes() {
    for_each(Kind::Valid, "valid vectors (emit)", MIN_VALID, check_emit);
}

/// Spec 3.2.4: the PSN field of CONNECT and ACCEPT is the sender's Initial
/// PSN; a RETRY's is 0.
#[test]
fn valid_vectors_follow_the_psn_field_rule() {
    for_each(Kind::Valid, "valid vectors (PSN field)", MIN_VALID, |v| {
        let (repr, _) = expected(v)?;
        let ok = match repr.body {
            Body::Connect(c) | Body::Accept(c) => repr.header.psn == c.initial_psn,
            Body::Retry(_) => repr.header.psn == 0,
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{}: PSN field {:#x} breaks spec 3.2.4",
                v.name, repr.header.psn
            ))
        }
    });
}

/// Spec 3.8.1: an ACCEPT's Rate Grant is the first 4 bytes of its Cookie
/// field, big-endian; a vector without `rate_grant_mbps` grants nothing.
#[test]
fn accept_vectors_carry_their_rate_grant() {
    for_each(Kind::Valid, "valid vectors (rate grant)", MIN_VALID, |v| {
        let (repr, _) = expected(v)?;
        let Body::Accept(a) = repr.body else {
            return Ok(());
        };
        let want: u32 = if v.has("rate_grant_mbps") {
            v.int("rate_grant_mbps")?
        } else {
            0
        };
        if a.rate_grant_mbps() == want {
            Ok(())
        } else {
            Err(format!(
                "{}: rate grant {} != {want}",
                v.name,
                a.rate_grant_mbps()
            ))
        }
    });
}

#[test]
fn frame_vectors_parse_and_emit() {
    let vectors: Vec<Vector> = of_kind(Kind::Valid)
        .into_iter()
        .filter(|v| v.has("frame"))
        .collect();
    assert!(
        vectors.len() >= MIN_FRAMES,
        "only {} frame vectors",
        vectors.len()
    );
    let failures: Vec<String> = vectors
        .iter()
        .filter_map(|v| check_frame(v).err())
        .collect();
    report("frame vectors", vectors.len(), failures);
}

#[test]
fn malformed_vectors_fail_with_their_error() {
    for_each(Kind::Malformed, "malformed vectors", MIN_MALFORMED, |v| {
        let text = v.str("error")?;
        let want = error_by_name(text).ok_or_else(|| format!("{}: error {text}", v.name))?;
        let bytes = v.hex("bytes")?;
        match wire::parse(&bytes) {
            Err(got) if got == want => v.all_used(),
            other => Err(format!("{}: expected {want:?}, got {other:?}", v.name)),
        }
    });
}

#[test]
fn malformed_frame_vectors_fail_with_their_error() {
    for_each(
        Kind::MalformedFrame,
        "malformed frame vectors",
        MIN_MALFORMED_FRAMES,
        |v| {
            let text = v.str("frame_error")?;
            let want = error_by_name(text).ok_or_else(|| format!("{}: error {text}", v.name))?;
            let frame = v.hex("frame")?;
            match encap::parse_frame(&frame, v.int("udp_dst_port")?) {
                Err(got) if got == want => v.all_used(),
                other => Err(format!("{}: expected {want:?}, got {other:?}", v.name)),
            }
        },
    );
}

/// Every key of every valid file is read by some check above.
#[test]
fn valid_vectors_have_no_unchecked_keys() {
    for_each(Kind::Valid, "valid vectors (keys)", MIN_VALID, |v| {
        expected(v)?;
        v.hex("bytes")?;
        if v.has("frame") {
            encap_of(v)?;
            v.hex("frame")?;
        }
        v.all_used()
    });
}

#[test]
fn vectors_cover_every_type_error_reason_and_codepoint() {
    let all = load_all();
    let mut types = BTreeSet::new();
    let mut errors = BTreeSet::new();
    let mut naks = BTreeSet::new();
    let mut closes = BTreeSet::new();
    let mut ecns = BTreeSet::new();
    let mut ip_versions = BTreeSet::new();
    let mut close_reply = false;
    for v in &all {
        if let Ok(t) = v.str("type") {
            types.insert(t.to_owned());
            if t == "NAK" {
                naks.insert(v.str("reason").unwrap_or_default().to_owned());
            }
            if t == "CLOSE" {
                closes.insert(v.str("reason").unwrap_or_default().to_owned());
                close_reply |= v
                    .int::<u16>("flags")
                    .is_ok_and(|f| Flags(f).contains(Flags::CLOSE_REPLY));
            }
            if v.has("frame") {
                ecns.insert(v.str("ecn").unwrap_or_default().to_owned());
                ip_versions.insert(v.str("ip_version").unwrap_or_default().to_owned());
            }
        }
        if let Ok(e) = v.str("error") {
            // Strip the argument of BadVersion(v) / UnknownType(t).
            errors.insert(e.split('(').next().unwrap_or_default().to_owned());
        }
    }
    for t in PacketType::ALL {
        let name = [
            "WRITE",
            "WRITE_IMM",
            "SEND",
            "SEND_IMM",
            "READ_REQUEST",
            "READ_RESPONSE",
            "ACK",
            "NAK",
            "CONNECT",
            "ACCEPT",
            "CLOSE",
            "KEEPALIVE",
            "RETRY",
            "NEW_TOKEN",
        ]
        .into_iter()
        .find(|n| type_by_name(n) == Some(t))
        .unwrap_or_else(|| panic!("no name for {t:?}"));
        assert!(types.contains(name), "no valid vector of type {name}");
    }
    for e in [
        "Truncated",
        "BadVersion",
        "UnknownType",
        "BadCrc",
        "BadLength",
        "Reserved",
        "BadField",
    ] {
        assert!(errors.contains(e), "no malformed vector with error {e}");
    }
    for code in 0..=u8::MAX {
        if let Some(r) = NakReason::from_code(code) {
            assert!(
                naks.iter().any(|n| nak_reason_by_name(n) == Some(r)),
                "no NAK vector with reason {r:?}"
            );
        }
        if let Some(r) = CloseReason::from_code(code) {
            assert!(
                closes.iter().any(|n| close_reason_by_name(n) == Some(r)),
                "no CLOSE vector with reason {r:?}"
            );
        }
    }
    assert!(close_reply, "no CLOSE vector with CLOSE_REPLY");
    assert_eq!(ecns.len(), 4, "frame vectors cover ECN codepoints {ecns:?}");
    assert_eq!(
        ip_versions.len(),
        2,
        "frame vectors cover IP {ip_versions:?}"
    );
    assert!(
        all.len() >= MIN_VALID + MIN_MALFORMED + MIN_MALFORMED_FRAMES,
        "only {} vector files",
        all.len()
    );
}

/// A device's verdict on the CRC trailer stands in for spec 3.11 step 5
/// and nothing else: `Good` parses as a correct trailer does, even over a
/// wrong one; `Bad` fails as a wrong one does; every other check stays.
#[test]
fn a_device_verdict_replaces_only_the_crc_check() {
    use metaroce_core::wire::{parse_with_verdict, CrcVerdict};
    for_each(Kind::Valid, "valid vectors (verdict)", MIN_VALID, |v| {
        let bytes = v.hex("bytes")?;
        let want = wire::parse(&bytes).map_err(|e| format!("{}: {e:?}", v.name))?;
        let mut wrong = bytes.clone();
        let n = wrong.len();
        wrong[n - 1] ^= 1;
        let results = [
            parse_with_verdict(&bytes, CrcVerdict::NotChecked),
            parse_with_verdict(&bytes, CrcVerdict::Good),
            parse_with_verdict(&wrong, CrcVerdict::Good),
        ];
        if results.iter().any(|r| r.as_ref() != Ok(&want)) {
            return Err(format!("{}: {results:?}", v.name));
        }
        match parse_with_verdict(&bytes, CrcVerdict::Bad) {
            Err(Error::BadCrc) => Ok(()),
            other => Err(format!("{}: Bad gave {other:?}", v.name)),
        }
    });
    for_each(
        Kind::Malformed,
        "malformed vectors (verdict)",
        MIN_MALFORMED,
        |v| {
            let want = error_by_name(v.str("error")?).ok_or_else(|| v.name.clone())?;
            let bytes = v.hex("bytes")?;
            match (want, parse_with_verdict(&bytes, CrcVerdict::Good)) {
                // Only the CRC was wrong: the device's word makes it good.
                (Error::BadCrc, Ok(_)) => Ok(()),
                (want, Err(got)) if got == want => Ok(()),
                (_, other) => Err(format!("{}: expected {want:?}, got {other:?}", v.name)),
            }
        },
    );
}
