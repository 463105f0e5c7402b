//! The representations of a transport packet's header and body (spec 3.2 -
//! 3.9): what `parse` reads out of a checked [`Packet`] view and `emit`
//! writes into a buffer.

use super::field;
use super::{
    crc32, CloseReason, Flags, Layout, NakReason, Packet, PacketType, COOKIE_LEN, HEADER_LEN,
    MAX_MTU, MAX_PATHS_WIRE, MAX_WINDOW_WIRE, MIN_MTU,
};
use crate::wire::protect::SECURITY_LEN;
use crate::wire::{read_u16, read_u32, read_u64, write_u16, write_u32, write_u64, Error, Result};
use crate::wire::{CrcVerdict, SackBits, CRC_LEN, VERSION};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Header {
    pub flags: Flags,
    pub dst_conn: u32,
    pub token: u64,
    pub psn: u32,
    pub path: u16,
    pub timestamp: u32,
}

/// Which message a data packet belongs to and where its payload sits in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MessageSpan {
    /// Message id: per-direction sequence number of work requests.
    pub id: u32,
    /// Byte offset of this packet's payload within the message.
    pub offset: u32,
    /// Total message length in bytes.
    pub len: u32,
}

/// A registered-memory destination: key and the absolute address of this
/// packet's first payload byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MemoryTarget {
    pub key: u32,
    pub addr: u64,
}

/// WRITE and WRITE_IMM fields (spec 3.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WriteRepr {
    pub msg: MessageSpan,
    /// Where this packet's payload goes.
    pub target: MemoryTarget,
    /// WRITE_IMM: immediate data and the receive index it completes (shared
    /// counter with SEND, spec 4.8); carried by every packet of the message
    /// so whichever packet completes it can report it.
    pub imm: Option<WriteImm>,
}

/// The WRITE_IMM-only fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WriteImm {
    pub imm: u32,
    pub recv_index: u32,
}

/// SEND and SEND_IMM fields (spec 3.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SendRepr {
    pub msg: MessageSpan,
    /// Which posted receive buffer (the n-th SEND of the connection takes the
    /// n-th posted receive); the payload goes at `msg.offset` in it.
    pub recv_index: u32,
    /// Immediate data (SEND_IMM).
    pub imm: Option<u32>,
}

/// READ_RESPONSE fields (spec 3.4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ReadResponseRepr {
    /// `id` is the READ_REQUEST's message id; `len` its length.
    pub msg: MessageSpan,
    /// The request's sink, advanced by `msg.offset`.
    pub target: MemoryTarget,
}

/// Where a data packet's payload goes (spec 3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Placement {
    /// Registered memory (WRITE, WRITE_IMM, READ_RESPONSE).
    Memory(MemoryTarget),
    /// The posted receive buffer selected by the SEND's receive index, at the
    /// message offset (SEND, SEND_IMM).
    Receive { recv_index: u32 },
}

/// The fields every data packet has, whatever its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DataRepr {
    pub msg: MessageSpan,
    pub placement: Placement,
    pub imm: Option<u32>,
}

/// READ_REQUEST fields (spec 3.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ReadRequestRepr {
    pub msg_id: u32,
    pub len: u32,
    /// Where to read at the responder.
    pub source: MemoryTarget,
    /// Where the responses go at the requester (echoed in every response).
    pub sink: MemoryTarget,
}

/// ACK fields (spec 3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AckRepr {
    /// Every PSN before this one has been received.
    pub cumulative: u32,
    /// PSN of the packet that triggered this ACK.
    pub echo_psn: u32,
    /// Timestamp of the packet that triggered this ACK.
    pub echo_timestamp: u32,
    /// Path of the packet that triggered this ACK.
    pub echo_path: u16,
    /// Data packets received on `echo_path`, modulo 2^16.
    pub path_rx_count: u16,
    /// CE-marked data packets received on `echo_path`, modulo 2^16.
    pub path_ce_count: u16,
    /// Fair-share rate hint for this sender in Mbit/s; 0 = no hint.
    pub rate_hint_mbps: u32,
    /// Where the SACK block starts, in PSNs after `cumulative + 1`
    /// (spec 3.5): bit `i` of `sack` is PSN `cumulative + 1 +
    /// sack_offset + i`. Always 0 while the window is at most 256 PSNs.
    pub sack_offset: u16,
    /// Which of the 256 PSNs from `cumulative + 1 + sack_offset` were
    /// received.
    pub sack: SackBits,
}

impl AckRepr {
    /// The PSN bit 0 of the SACK bitvector stands for.
    pub fn sack_base(&self) -> u32 {
        self.cumulative
            .wrapping_add(1)
            .wrapping_add(u32::from(self.sack_offset))
    }
}

/// NAK fields (spec 3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NakRepr {
    pub cumulative: u32,
    pub nak_psn: u32,
    pub reason: NakReason,
}

/// CONNECT and ACCEPT fields (spec 3.8.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConnectRepr {
    /// The sender's own connection id, the peer's `dst_conn` from now on.
    pub src_conn: u32,
    /// The token the peer must put in every packet to the sender.
    pub src_token: u64,
    /// Largest payload per packet.
    pub mtu: u16,
    /// Number of logical paths.
    pub max_paths: u16,
    /// PSNs in flight beyond the cumulative ACK (1..=[`MAX_WINDOW_WIRE`]).
    pub window: u32,
    /// First PSN the sender will use.
    pub initial_psn: u32,
    /// UDP port the sender receives MetaRoCE on; 0 means the same port this
    /// packet was sent to.
    pub reply_port: u16,
    /// The sender's timer profile (spec 4.11).
    pub timer_profile: TimerProfile,
    /// Protection of the connection's packets: offered in CONNECT, chosen
    /// in ACCEPT (spec 5.3).
    pub suite: CipherSuite,
    /// Which pre-shared key the connection's keys derive from (0 without a
    /// suite).
    pub key_id: u32,
    /// CONNECT: the cookie of the acceptor's RETRY, echoed; all zero in a
    /// first CONNECT. ACCEPT: the Rate Grant in its first four bytes
    /// ([`ConnectRepr::rate_grant_mbps`]), the rest zero.
    pub cookie: [u8; COOKIE_LEN],
}

impl ConnectRepr {
    /// The first 32 bytes of the extension as on the wire (spec 3.8.1):
    /// everything the sender offers or answers, the Cookie aside. Cookies,
    /// early proofs and the key transcript cover exactly these.
    pub fn offer_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(&self.src_conn.to_be_bytes());
        b[4..12].copy_from_slice(&self.src_token.to_be_bytes());
        b[12..14].copy_from_slice(&self.mtu.to_be_bytes());
        b[14..16].copy_from_slice(&self.max_paths.to_be_bytes());
        b[16..20].copy_from_slice(&self.window.to_be_bytes());
        b[20..22].copy_from_slice(&self.reply_port.to_be_bytes());
        b[22] = self.timer_profile.code();
        b[23] = self.suite.code();
        b[24..28].copy_from_slice(&self.initial_psn.to_be_bytes());
        b[28..32].copy_from_slice(&self.key_id.to_be_bytes());
        b
    }
}

impl ConnectRepr {
    /// ACCEPT: the share of the acceptor's link it grants the initiator's
    /// first flight, Mbit/s (spec 3.8.1, 4.10.6); 0 grants nothing.
    pub fn rate_grant_mbps(&self) -> u32 {
        let [a, b, c, d, ..] = self.cookie;
        u32::from_be_bytes([a, b, c, d])
    }

    /// Sets the Rate Grant of an ACCEPT.
    pub fn set_rate_grant_mbps(&mut self, mbps: u32) {
        self.cookie[..4].copy_from_slice(&mbps.to_be_bytes());
    }
}

/// Timer profiles (spec 4.11): which set of timer defaults the sender
/// runs, so a peer (and a compliance checker) knows what to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TimerProfile {
    /// Data-centre round trips (microseconds).
    #[default]
    DataCenter,
    /// Emulated or software links (QEMU, loopback, veth): milliseconds.
    Emulation,
}

impl TimerProfile {
    /// Its wire code.
    pub const fn code(self) -> u8 {
        match self {
            TimerProfile::DataCenter => 0,
            TimerProfile::Emulation => 1,
        }
    }

    /// The profile of a wire code, if defined.
    pub const fn from_code(v: u8) -> Option<TimerProfile> {
        match v {
            0 => Some(TimerProfile::DataCenter),
            1 => Some(TimerProfile::Emulation),
            _ => None,
        }
    }
}

/// Packet protection suites (spec 5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CipherSuite {
    /// No protection beyond the token and the CRC.
    #[default]
    None,
    /// AES-256-GCM over the payload, the headers as associated data.
    Aes256Gcm,
}

impl CipherSuite {
    /// Its wire code.
    pub const fn code(self) -> u8 {
        match self {
            CipherSuite::None => 0,
            CipherSuite::Aes256Gcm => 1,
        }
    }

    /// The suite of a wire code, if defined.
    pub const fn from_code(v: u8) -> Option<CipherSuite> {
        match v {
            0 => Some(CipherSuite::None),
            1 => Some(CipherSuite::Aes256Gcm),
            _ => None,
        }
    }
}

/// RETRY fields (spec 3.8.4): the acceptor's answer to a CONNECT from an
/// address it has not verified. It keeps no state; the initiator repeats
/// its CONNECT with the cookie, which proves it receives at its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RetryRepr {
    pub cookie: [u8; COOKIE_LEN],
}

/// NEW_TOKEN fields (spec 3.8.5): an address token the acceptor hands an
/// initiator whose address it validated, for that initiator's later
/// CONNECTs from the same address to skip the RETRY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NewTokenRepr {
    pub token: [u8; COOKIE_LEN],
}

/// ACCEPT carries the same fields as CONNECT: the acceptor's side, with the
/// negotiated values.
pub type AcceptRepr = ConnectRepr;

/// CLOSE fields (spec 3.8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CloseRepr {
    pub reason: CloseReason,
}

/// The type-specific part of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Body {
    /// WRITE or, with `imm`, WRITE_IMM.
    Write(WriteRepr),
    /// SEND or, with `imm`, SEND_IMM.
    Send(SendRepr),
    ReadRequest(ReadRequestRepr),
    ReadResponse(ReadResponseRepr),
    Ack(AckRepr),
    Nak(NakRepr),
    Connect(ConnectRepr),
    Accept(AcceptRepr),
    Close(CloseRepr),
    Keepalive,
    Retry(RetryRepr),
    NewToken(NewTokenRepr),
}

impl Body {
    /// The packet type this body is sent as.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Body::Write(d) if d.imm.is_some() => PacketType::WriteImm,
            Body::Write(_) => PacketType::Write,
            Body::Send(d) if d.imm.is_some() => PacketType::SendImm,
            Body::Send(_) => PacketType::Send,
            Body::ReadRequest(_) => PacketType::ReadRequest,
            Body::ReadResponse(_) => PacketType::ReadResponse,
            Body::Ack(_) => PacketType::Ack,
            Body::Nak(_) => PacketType::Nak,
            Body::Connect(_) => PacketType::Connect,
            Body::Accept(_) => PacketType::Accept,
            Body::Close(_) => PacketType::Close,
            Body::Keepalive => PacketType::Keepalive,
            Body::Retry(_) => PacketType::Retry,
            Body::NewToken(_) => PacketType::NewToken,
        }
    }

    /// The placement fields of a data packet, whatever its type.
    pub fn data(&self) -> Option<DataRepr> {
        Some(match *self {
            Body::Write(w) => DataRepr {
                msg: w.msg,
                placement: Placement::Memory(w.target),
                imm: w.imm.map(|wi| wi.imm),
            },
            Body::Send(s) => DataRepr {
                msg: s.msg,
                placement: Placement::Receive {
                    recv_index: s.recv_index,
                },
                imm: s.imm,
            },
            Body::ReadResponse(r) => DataRepr {
                msg: r.msg,
                placement: Placement::Memory(r.target),
                imm: None,
            },
            _ => return None,
        })
    }
}

/// A parsed MetaRoCE packet, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Repr {
    pub header: Header,
    pub body: Body,
    /// Payload length in bytes (0 for types without payload).
    pub payload_len: u16,
}

fn check_zero(bytes: &[u8]) -> Result<()> {
    if bytes.iter().any(|&b| b != 0) {
        Err(Error::Reserved)
    } else {
        Ok(())
    }
}

/// The message span of a data extension header, `N` bytes long, checked
/// to hold this packet's `payload_len` bytes within the message. MSG_ID,
/// MSG_OFFSET and MSG_LEN sit at the same offsets in every data extension
/// header. The fixed length lets every field read go unchecked.
#[inline(always)]
fn parse_span<const N: usize>(ext: &[u8], payload_len: u16) -> Result<(&[u8; N], MessageSpan)> {
    use field::memory as f;
    let ext: &[u8; N] = ext.first_chunk().ok_or(Error::Truncated)?;
    let msg = MessageSpan {
        id: read_u32(ext, f::MSG_ID),
        offset: read_u32(ext, f::MSG_OFFSET),
        len: read_u32(ext, f::MSG_LEN),
    };
    if u64::from(msg.offset) + u64::from(payload_len) > u64::from(msg.len) {
        return Err(Error::BadField);
    }
    Ok((ext, msg))
}

/// A known type's extension header length, as a constant (a fixed-size
/// view's length).
const fn ext_len(t: PacketType) -> usize {
    match t.extension_len() {
        Some(n) => n,
        None => 0,
    }
}

#[inline(always)]
fn parse_target(ext: &[u8]) -> MemoryTarget {
    use field::memory as f;
    MemoryTarget {
        key: read_u32(ext, f::KEY),
        addr: read_u64(ext, f::ADDR),
    }
}

fn emit_span(ext: &mut [u8], msg: &MessageSpan) {
    use field::memory as f;
    write_u32(ext, f::MSG_ID, msg.id);
    write_u32(ext, f::MSG_OFFSET, msg.offset);
    write_u32(ext, f::MSG_LEN, msg.len);
}

fn emit_target(ext: &mut [u8], target: &MemoryTarget) {
    use field::memory as f;
    write_u32(ext, f::KEY, target.key);
    write_u64(ext, f::ADDR, target.addr);
}

#[inline]
fn parse_connect(ext: &[u8]) -> Result<ConnectRepr> {
    use field::connect as f;
    let mut cookie = [0u8; COOKIE_LEN];
    cookie.copy_from_slice(&ext[f::COOKIE]);
    let r = ConnectRepr {
        src_conn: read_u32(ext, f::SRC_CONN),
        src_token: read_u64(ext, f::SRC_TOKEN),
        mtu: read_u16(ext, f::MTU),
        max_paths: read_u16(ext, f::MAX_PATHS),
        window: read_u32(ext, f::WINDOW),
        initial_psn: read_u32(ext, f::INITIAL_PSN),
        reply_port: read_u16(ext, f::REPLY_PORT),
        timer_profile: TimerProfile::from_code(ext[f::TIMER_PROFILE]).ok_or(Error::BadField)?,
        suite: CipherSuite::from_code(ext[f::SUITE]).ok_or(Error::BadField)?,
        key_id: read_u32(ext, f::KEY_ID),
        cookie,
    };
    let mtu_ok = (MIN_MTU..=MAX_MTU).contains(&r.mtu);
    let paths_ok = (1..=MAX_PATHS_WIRE).contains(&r.max_paths);
    let window_ok = (1..=MAX_WINDOW_WIRE).contains(&r.window);
    let key_ok = (r.suite == CipherSuite::None) == (r.key_id == 0);
    if !(mtu_ok && paths_ok && window_ok && key_ok) || r.src_conn == 0 || r.src_token == 0 {
        return Err(Error::BadField);
    }
    Ok(r)
}

impl Repr {
    /// Parses a checked packet and verifies its CRC trailer. Rejects reserved
    /// bits, disallowed flags, payload on types without payload, and message
    /// spans that do not fit their message.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        Repr::parse_with_verdict(packet, CrcVerdict::NotChecked)
    }

    /// [`Repr::parse`] with the device's verdict on the CRC trailer in
    /// place of the software check (spec 3.11 step 5): `Good` skips it,
    /// `Bad` fails it, `NotChecked` runs it.
    pub fn parse_with_verdict<T: AsRef<[u8]> + ?Sized>(
        packet: &Packet<&T>,
        crc: CrcVerdict,
    ) -> Result<Repr> {
        let Layout {
            packet_type: t,
            extension_len,
            flags,
            payload_len,
        } = packet.layout()?;
        let crc_ok = match crc {
            CrcVerdict::NotChecked => packet.verify_crc(),
            CrcVerdict::Good => true,
            CrcVerdict::Bad => false,
        };
        if !crc_ok {
            return Err(Error::BadCrc);
        }
        if flags.0 & !Flags::allowed_for(t) != 0 {
            return Err(Error::Reserved);
        }
        if payload_len != 0 && !t.carries_payload() {
            return Err(Error::BadLength);
        }
        let bytes: &[u8] = packet.buffer.as_ref();
        let ext_end = HEADER_LEN + extension_len;
        if flags.contains(Flags::PROTECTED) {
            crate::wire::protect::SecurityRepr::parse(&bytes[ext_end..ext_end + SECURITY_LEN])?;
        }
        let ext = &bytes[HEADER_LEN..ext_end];
        // Data types: the span is checked as it is read (spec 3.4: a
        // packet's payload lies within its message).
        let body = match t {
            PacketType::Write => {
                let (ext, msg) = parse_span::<{ ext_len(PacketType::Write) }>(ext, payload_len)?;
                Body::Write(WriteRepr {
                    msg,
                    target: parse_target(ext),
                    imm: None,
                })
            }
            PacketType::WriteImm => {
                let (ext, msg) = parse_span::<{ ext_len(PacketType::WriteImm) }>(ext, payload_len)?;
                Body::Write(WriteRepr {
                    msg,
                    target: parse_target(ext),
                    imm: Some(WriteImm {
                        imm: read_u32(ext, field::memory::IMM),
                        recv_index: read_u32(ext, field::memory::RECV_INDEX),
                    }),
                })
            }
            PacketType::Send => {
                let (ext, msg) = parse_span::<{ ext_len(PacketType::Send) }>(ext, payload_len)?;
                Body::Send(SendRepr {
                    msg,
                    recv_index: read_u32(ext, field::send::RECV_INDEX),
                    imm: None,
                })
            }
            PacketType::SendImm => {
                let (ext, msg) = parse_span::<{ ext_len(PacketType::SendImm) }>(ext, payload_len)?;
                Body::Send(SendRepr {
                    msg,
                    recv_index: read_u32(ext, field::send::RECV_INDEX),
                    imm: Some(read_u32(ext, field::send::IMM)),
                })
            }
            PacketType::ReadResponse => {
                let (ext, msg) =
                    parse_span::<{ ext_len(PacketType::ReadResponse) }>(ext, payload_len)?;
                Body::ReadResponse(ReadResponseRepr {
                    msg,
                    target: parse_target(ext),
                })
            }
            PacketType::ReadRequest => {
                use field::read_request as f;
                Body::ReadRequest(ReadRequestRepr {
                    msg_id: read_u32(ext, f::MSG_ID),
                    len: read_u32(ext, f::LENGTH),
                    source: MemoryTarget {
                        key: read_u32(ext, f::SOURCE_KEY),
                        addr: read_u64(ext, f::SOURCE_ADDR),
                    },
                    sink: MemoryTarget {
                        key: read_u32(ext, f::SINK_KEY),
                        addr: read_u64(ext, f::SINK_ADDR),
                    },
                })
            }
            PacketType::Ack => {
                use field::ack as f;
                let ext: &[u8; ext_len(PacketType::Ack)] =
                    ext.first_chunk().ok_or(Error::Truncated)?;
                let mut sack = [0u8; 32];
                sack.copy_from_slice(&ext[f::SACK]);
                Body::Ack(AckRepr {
                    cumulative: read_u32(ext, f::CUMULATIVE),
                    echo_psn: read_u32(ext, f::ECHO_PSN),
                    echo_timestamp: read_u32(ext, f::ECHO_TIMESTAMP),
                    echo_path: read_u16(ext, f::ECHO_PATH),
                    path_rx_count: read_u16(ext, f::PATH_RX_COUNT),
                    path_ce_count: read_u16(ext, f::PATH_CE_COUNT),
                    rate_hint_mbps: read_u32(ext, f::RATE_HINT),
                    sack_offset: read_u16(ext, f::SACK_OFFSET),
                    sack: SackBits::from_bytes(&sack),
                })
            }
            PacketType::Nak => {
                use field::nak as f;
                check_zero(&ext[f::RESERVED])?;
                Body::Nak(NakRepr {
                    cumulative: read_u32(ext, f::CUMULATIVE),
                    nak_psn: read_u32(ext, f::NAK_PSN),
                    reason: NakReason::from_code(ext[f::REASON]).ok_or(Error::BadField)?,
                })
            }
            PacketType::Connect => {
                // A CONNECT is addressed to the endpoint, not to a connection.
                if packet.dst_conn() != 0 || packet.token() != 0 {
                    return Err(Error::Reserved);
                }
                Body::Connect(parse_connect(ext)?)
            }
            PacketType::Accept => {
                let a = parse_connect(ext)?;
                // The Rate Grant, then reserved bytes (spec 3.8.1).
                let [_, _, _, _, reserved @ ..] = &a.cookie;
                check_zero(reserved)?;
                Body::Accept(a)
            }
            // The same 32 bytes: a RETRY's cookie, a NEW_TOKEN's token.
            PacketType::Retry | PacketType::NewToken => {
                let mut value = [0u8; COOKIE_LEN];
                value.copy_from_slice(&ext[field::retry::COOKIE]);
                if t == PacketType::Retry {
                    Body::Retry(RetryRepr { cookie: value })
                } else if value == [0; COOKIE_LEN] {
                    // An all-zero token would read as "no cookie" (spec 3.8.5).
                    return Err(Error::BadField);
                } else {
                    Body::NewToken(NewTokenRepr { token: value })
                }
            }
            PacketType::Close => {
                use field::close as f;
                check_zero(&ext[f::RESERVED])?;
                Body::Close(CloseRepr {
                    reason: CloseReason::from_code(ext[f::REASON]).ok_or(Error::BadField)?,
                })
            }
            PacketType::Keepalive => Body::Keepalive,
            PacketType::Unknown(v) => return Err(Error::UnknownType(v)),
        };
        let h: &[u8; HEADER_LEN] = bytes.first_chunk().ok_or(Error::Truncated)?;
        Ok(Repr {
            header: Header {
                flags,
                dst_conn: read_u32(h, field::DST_CONN),
                token: read_u64(h, field::TOKEN),
                psn: read_u32(h, field::PSN),
                path: read_u16(h, field::PATH),
                timestamp: read_u32(h, field::TIMESTAMP),
            },
            body,
            payload_len,
        })
    }

    /// Common plus extension header length.
    #[inline]
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.body.packet_type().extension_len().unwrap_or(0)
    }

    /// Whole packet length: headers, payload and CRC trailer.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + usize::from(self.payload_len) + CRC_LEN
    }

    /// Writes the common and extension headers into `buf[..header_len()]`.
    /// The payload and CRC are the caller's (see [`Repr::emit`] for the
    /// one-buffer case); this split lets a DMA engine gather the payload
    /// from registered memory without a copy.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Repr::header_len`].
    pub fn emit_header(&self, buf: &mut [u8]) {
        let t = self.body.packet_type();
        let h = &self.header;
        let buf = &mut buf[..self.header_len()];
        buf[field::VERSION] = VERSION;
        buf[field::TYPE] = u8::from(t);
        write_u16(buf, field::FLAGS, h.flags.0);
        write_u32(buf, field::DST_CONN, h.dst_conn);
        write_u64(buf, field::TOKEN, h.token);
        write_u32(buf, field::PSN, h.psn);
        write_u16(buf, field::PATH, h.path);
        write_u16(buf, field::PAYLOAD_LEN, self.payload_len);
        write_u32(buf, field::TIMESTAMP, h.timestamp);
        let ext = &mut buf[HEADER_LEN..];
        match &self.body {
            Body::Write(w) => {
                emit_span(ext, &w.msg);
                emit_target(ext, &w.target);
                if let Some(wi) = w.imm {
                    write_u32(ext, field::memory::IMM, wi.imm);
                    write_u32(ext, field::memory::RECV_INDEX, wi.recv_index);
                }
            }
            Body::ReadResponse(r) => {
                emit_span(ext, &r.msg);
                emit_target(ext, &r.target);
            }
            Body::Send(d) => {
                emit_span(ext, &d.msg);
                write_u32(ext, field::send::RECV_INDEX, d.recv_index);
                if let Some(imm) = d.imm {
                    write_u32(ext, field::send::IMM, imm);
                }
            }
            Body::ReadRequest(r) => {
                use field::read_request as f;
                write_u32(ext, f::MSG_ID, r.msg_id);
                write_u32(ext, f::LENGTH, r.len);
                write_u32(ext, f::SOURCE_KEY, r.source.key);
                write_u64(ext, f::SOURCE_ADDR, r.source.addr);
                write_u32(ext, f::SINK_KEY, r.sink.key);
                write_u64(ext, f::SINK_ADDR, r.sink.addr);
            }
            Body::Ack(a) => {
                use field::ack as f;
                write_u32(ext, f::CUMULATIVE, a.cumulative);
                write_u32(ext, f::ECHO_PSN, a.echo_psn);
                write_u32(ext, f::ECHO_TIMESTAMP, a.echo_timestamp);
                write_u16(ext, f::ECHO_PATH, a.echo_path);
                write_u16(ext, f::PATH_RX_COUNT, a.path_rx_count);
                write_u16(ext, f::PATH_CE_COUNT, a.path_ce_count);
                write_u16(ext, f::SACK_OFFSET, a.sack_offset);
                write_u32(ext, f::RATE_HINT, a.rate_hint_mbps);
                ext[f::SACK].copy_from_slice(&a.sack.to_bytes());
            }
            Body::Nak(n) => {
                use field::nak as f;
                write_u32(ext, f::CUMULATIVE, n.cumulative);
                write_u32(ext, f::NAK_PSN, n.nak_psn);
                ext[f::REASON] = n.reason.code();
                ext[f::RESERVED].fill(0);
            }
            Body::Connect(c) | Body::Accept(c) => {
                use field::connect as f;
                write_u32(ext, f::SRC_CONN, c.src_conn);
                write_u64(ext, f::SRC_TOKEN, c.src_token);
                write_u16(ext, f::MTU, c.mtu);
                write_u16(ext, f::MAX_PATHS, c.max_paths);
                write_u32(ext, f::WINDOW, c.window);
                write_u16(ext, f::REPLY_PORT, c.reply_port);
                ext[f::TIMER_PROFILE] = c.timer_profile.code();
                ext[f::SUITE] = c.suite.code();
                write_u32(ext, f::INITIAL_PSN, c.initial_psn);
                write_u32(ext, f::KEY_ID, c.key_id);
                ext[f::COOKIE].copy_from_slice(&c.cookie);
            }
            Body::Retry(RetryRepr { cookie: value })
            | Body::NewToken(NewTokenRepr { token: value }) => {
                ext[field::new_token::TOKEN].copy_from_slice(value)
            }
            Body::Close(c) => {
                use field::close as f;
                ext[f::REASON] = c.reason.code();
                ext[f::RESERVED].fill(0);
            }
            Body::Keepalive => {}
        }
    }

    /// Emits the whole packet (headers, `payload`, CRC) into `buf`, which
    /// must be exactly [`Repr::buffer_len`] long, and returns the packet view.
    ///
    /// # Panics
    /// If `buf.len() != buffer_len()` or `payload.len() != payload_len`.
    pub fn emit<'a>(&self, buf: &'a mut [u8], payload: &[u8]) -> Packet<&'a mut [u8]> {
        assert_eq!(buf.len(), self.buffer_len(), "emit buffer length");
        assert_eq!(
            payload.len(),
            usize::from(self.payload_len),
            "payload length"
        );
        self.emit_header(buf);
        let hl = self.header_len();
        buf[hl..hl + payload.len()].copy_from_slice(payload);
        let mut p = Packet::new_unchecked(buf);
        p.fill_crc();
        p
    }

    /// The CRC trailer for this header with `payload`, for gather-emit:
    /// `header` must be what [`Repr::emit_header`] wrote.
    pub fn trailer(header: &[u8], payload: &[u8]) -> [u8; CRC_LEN] {
        crc32(&[header, payload]).to_be_bytes()
    }
}

/// Parses a whole MetaRoCE packet (the UDP payload): checks, verifies the
/// CRC, and returns the representation and the payload.
///
/// On a protected packet (spec 5.3) the payload is the ciphertext; see
/// [`super::protect::Sealed`] for the parts that authenticate it.
#[inline]
pub fn parse(bytes: &[u8]) -> Result<(Repr, &[u8])> {
    parse_with_verdict(bytes, CrcVerdict::NotChecked)
}

/// [`parse`] with a device's verdict on the CRC trailer (see
/// [`Repr::parse_with_verdict`]).
pub fn parse_with_verdict(bytes: &[u8], crc: CrcVerdict) -> Result<(Repr, &[u8])> {
    let repr = parse_repr(bytes, crc)?;
    Ok((repr, repr.payload_in(bytes)))
}

/// [`parse_with_verdict`] without the payload ([`Repr::payload_in`] finds
/// it): the representation is returned where the caller keeps it, with no
/// tuple built around it. Not generic, so it is compiled once, in this
/// crate and at its opt-level, not in each crate that instantiates an
/// endpoint (the firmware's engine loop is compiled for size).
pub fn parse_repr(bytes: &[u8], crc: CrcVerdict) -> Result<Repr> {
    // `Repr::parse_with_verdict` checks the lengths first: once.
    Repr::parse_with_verdict(&Packet::new_unchecked(bytes), crc)
}

impl Repr {
    /// The payload of the packet this was parsed from (`bytes`, which
    /// [`Repr::parse_with_verdict`] accepted), taken apart from the parse
    /// ([`parse_repr`]).
    #[inline]
    pub fn payload_in<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        let mut start = self.header_len();
        if self.header.flags.contains(Flags::PROTECTED) {
            start += SECURITY_LEN;
        }
        &bytes[start..start + usize::from(self.payload_len)]
    }
}
