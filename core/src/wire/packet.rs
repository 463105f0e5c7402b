//! The MetaRoCE transport packet (spec 3.2 - 3.9).
//!
//! ```text
//! +----------------+--------------------+-----------+-----------+
//! | common header  | extension header   | payload   | CRC-32    |
//! | 28 bytes       | 0-56 bytes by type | 0-MTU     | 4 bytes   |
//! +----------------+--------------------+-----------+-----------+
//! ```
//!
//! The CRC trailer is CRC-32 (the IEEE 802.3 polynomial, as Ethernet's FCS
//! and RoCEv2's ICRC) over everything before it. Every field it covers is
//! invariant end to end, so no field needs masking.

use super::protect::{SECURITY_LEN, TAG_LEN};
use super::{read_u16, read_u32, read_u64, write_u16, write_u32, write_u64, Error, Result};
use super::{CrcVerdict, SackBits, CRC_LEN, VERSION};

/// Byte ranges of the common header and of each extension header. Extension
/// offsets are relative to the end of the common header ([`field::HEADER_END`]).
pub mod field {
    use crate::wire::Field;

    pub const VERSION: usize = 0;
    pub const TYPE: usize = 1;
    pub const FLAGS: Field = 2..4;
    pub const DST_CONN: Field = 4..8;
    pub const TOKEN: Field = 8..16;
    pub const PSN: Field = 16..20;
    pub const PATH: Field = 20..22;
    pub const PAYLOAD_LEN: Field = 22..24;
    pub const TIMESTAMP: Field = 24..28;
    /// Length of the common header.
    pub const HEADER_END: usize = 28;

    /// WRITE, WRITE_IMM and READ_RESPONSE (spec 3.4.1, 3.4.4).
    pub mod memory {
        use crate::wire::Field;
        pub const MSG_ID: Field = 0..4;
        pub const MSG_OFFSET: Field = 4..8;
        pub const MSG_LEN: Field = 8..12;
        pub const KEY: Field = 12..16;
        pub const ADDR: Field = 16..24;
        /// WRITE_IMM only.
        pub const IMM: Field = 24..28;
        /// WRITE_IMM only: the receive it completes at the responder.
        pub const RECV_INDEX: Field = 28..32;
    }

    /// SEND and SEND_IMM (spec 3.4.2).
    pub mod send {
        use crate::wire::Field;
        pub const MSG_ID: Field = 0..4;
        pub const MSG_OFFSET: Field = 4..8;
        pub const MSG_LEN: Field = 8..12;
        pub const RECV_INDEX: Field = 12..16;
        pub const IMM: Field = 16..20;
    }

    /// READ_REQUEST (spec 3.4.3).
    pub mod read_request {
        use crate::wire::Field;
        pub const MSG_ID: Field = 0..4;
        pub const LENGTH: Field = 4..8;
        pub const SOURCE_KEY: Field = 8..12;
        pub const SOURCE_ADDR: Field = 12..20;
        pub const SINK_KEY: Field = 20..24;
        pub const SINK_ADDR: Field = 24..32;
    }

    /// ACK (spec 3.5).
    pub mod ack {
        use crate::wire::Field;
        pub const CUMULATIVE: Field = 0..4;
        pub const ECHO_PSN: Field = 4..8;
        pub const ECHO_TIMESTAMP: Field = 8..12;
        pub const ECHO_PATH: Field = 12..14;
        pub const PATH_RX_COUNT: Field = 14..16;
        pub const PATH_CE_COUNT: Field = 16..18;
        pub const SACK_OFFSET: Field = 18..20;
        pub const RATE_HINT: Field = 20..24;
        pub const SACK: Field = 24..56;
    }

    /// NAK (spec 3.7).
    pub mod nak {
        use crate::wire::Field;
        pub const CUMULATIVE: Field = 0..4;
        pub const NAK_PSN: Field = 4..8;
        pub const REASON: usize = 8;
        pub const RESERVED: Field = 9..12;
    }

    /// CONNECT and ACCEPT (spec 3.8.1).
    pub mod connect {
        use crate::wire::Field;
        pub const SRC_CONN: Field = 0..4;
        pub const SRC_TOKEN: Field = 4..12;
        pub const MTU: Field = 12..14;
        pub const MAX_PATHS: Field = 14..16;
        pub const WINDOW: Field = 16..20;
        pub const REPLY_PORT: Field = 20..22;
        pub const TIMER_PROFILE: usize = 22;
        pub const SUITE: usize = 23;
        pub const INITIAL_PSN: Field = 24..28;
        pub const KEY_ID: Field = 28..32;
        pub const COOKIE: Field = 32..64;
    }

    /// RETRY (spec 3.8.4).
    pub mod retry {
        use crate::wire::Field;
        pub const COOKIE: Field = 0..32;
    }

    /// NEW_TOKEN (spec 3.8.5).
    pub mod new_token {
        use crate::wire::Field;
        pub const TOKEN: Field = 0..32;
    }

    /// CLOSE (spec 3.8.2).
    pub mod close {
        use crate::wire::Field;
        pub const REASON: usize = 0;
        pub const RESERVED: Field = 1..4;
    }
}

/// Length of the common header in bytes.
pub const HEADER_LEN: usize = field::HEADER_END;

/// Smallest and largest payload MTU a connection may negotiate (spec 3.8.1).
pub const MIN_MTU: u16 = 256;
/// See [`MIN_MTU`].
pub const MAX_MTU: u16 = 9000;
/// Largest number of logical paths and largest window (spec 3.8.1, 4.4).
pub const MAX_PATHS_WIRE: u16 = 256;
/// Largest window (PSNs in flight beyond the cumulative ACK) a CONNECT
/// or ACCEPT may carry.
pub const MAX_WINDOW_WIRE: u32 = 65_536;
/// The READ depth a peer assumes when a CONNECT or ACCEPT states none
/// (READ Depth 0 in its Path ID field, as every earlier endpoint sent; spec
/// 3.8.1): the reference endpoint's per-connection READ budget before the
/// depth was stated.
pub const DEFAULT_READ_DEPTH: u16 = 16;
/// Length of a handshake cookie (spec 3.8.4), opaque to the initiator.
pub const COOKIE_LEN: usize = 32;

/// Packet type (spec 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PacketType {
    Write,
    WriteImm,
    Send,
    SendImm,
    ReadRequest,
    ReadResponse,
    Ack,
    Nak,
    Connect,
    Accept,
    Close,
    Keepalive,
    Retry,
    NewToken,
    /// A value this version does not define; parsing rejects it.
    Unknown(u8),
}

impl From<u8> for PacketType {
    fn from(v: u8) -> Self {
        match v {
            0x01 => PacketType::Write,
            0x02 => PacketType::WriteImm,
            0x03 => PacketType::Send,
            0x04 => PacketType::SendImm,
            0x05 => PacketType::ReadRequest,
            0x06 => PacketType::ReadResponse,
            0x10 => PacketType::Ack,
            0x11 => PacketType::Nak,
            0x20 => PacketType::Connect,
            0x21 => PacketType::Accept,
            0x22 => PacketType::Close,
            0x23 => PacketType::Keepalive,
            0x24 => PacketType::Retry,
            0x25 => PacketType::NewToken,
            other => PacketType::Unknown(other),
        }
    }
}

impl From<PacketType> for u8 {
    fn from(t: PacketType) -> u8 {
        match t {
            PacketType::Write => 0x01,
            PacketType::WriteImm => 0x02,
            PacketType::Send => 0x03,
            PacketType::SendImm => 0x04,
            PacketType::ReadRequest => 0x05,
            PacketType::ReadResponse => 0x06,
            PacketType::Ack => 0x10,
            PacketType::Nak => 0x11,
            PacketType::Connect => 0x20,
            PacketType::Accept => 0x21,
            PacketType::Close => 0x22,
            PacketType::Keepalive => 0x23,
            PacketType::Retry => 0x24,
            PacketType::NewToken => 0x25,
            PacketType::Unknown(v) => v,
        }
    }
}

impl PacketType {
    /// Length of this type's extension header, `None` for unknown types.
    pub const fn extension_len(self) -> Option<usize> {
        Some(match self {
            PacketType::Write | PacketType::ReadResponse => 24,
            PacketType::WriteImm => 32,
            PacketType::Send => 16,
            PacketType::SendImm => 20,
            PacketType::ReadRequest => 32,
            PacketType::Ack => 56,
            PacketType::Nak => 12,
            PacketType::Connect | PacketType::Accept => 64,
            PacketType::Retry | PacketType::NewToken => 32,
            PacketType::Close => 4,
            PacketType::Keepalive => 0,
            PacketType::Unknown(_) => return None,
        })
    }

    /// Whether packets of this type carry payload.
    pub const fn carries_payload(self) -> bool {
        matches!(
            self,
            PacketType::Write
                | PacketType::WriteImm
                | PacketType::Send
                | PacketType::SendImm
                | PacketType::ReadResponse
        )
    }

    /// Whether packets of this type occupy a PSN and are delivered reliably
    /// (acknowledged, retransmitted). Spec 4.3.
    pub const fn is_reliable(self) -> bool {
        self.carries_payload() || matches!(self, PacketType::ReadRequest)
    }

    /// Whether packets of this type may be protected (spec 5.3): all but
    /// the handshake's CONNECT, ACCEPT and RETRY, which are sent before
    /// (or without) keys.
    pub const fn allows_protection(self) -> bool {
        !matches!(
            self,
            PacketType::Connect | PacketType::Accept | PacketType::Retry | PacketType::Unknown(_)
        )
    }

    /// Every type this version defines, in code order.
    pub const ALL: [PacketType; 14] = [
        PacketType::Write,
        PacketType::WriteImm,
        PacketType::Send,
        PacketType::SendImm,
        PacketType::ReadRequest,
        PacketType::ReadResponse,
        PacketType::Ack,
        PacketType::Nak,
        PacketType::Connect,
        PacketType::Accept,
        PacketType::Close,
        PacketType::Keepalive,
        PacketType::Retry,
        PacketType::NewToken,
    ];
}

/// Header flags (spec 3.2). Undefined bits must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Flags(pub u16);

impl Flags {
    /// The sender asks for an immediate ACK (last packet of a message, a
    /// retransmission, or a window about to fill). Reliable types only.
    pub const ACK_REQUEST: Flags = Flags(0x0001);
    /// This packet is a retransmission. Reliable types only.
    pub const RETRANSMISSION: Flags = Flags(0x0002);
    /// On CLOSE: this CLOSE answers a CLOSE.
    pub const CLOSE_REPLY: Flags = Flags(0x0004);
    /// The packet is protected (spec 5.3): a security extension follows the
    /// extension header and an authentication tag precedes the CRC trailer.
    /// Every type but CONNECT, ACCEPT and RETRY.
    pub const PROTECTED: Flags = Flags(0x0008);
    /// 0-RTT (spec 4.2.4). On CONNECT: the Cookie field carries an early
    /// admission proof made with a job key. On a reliable packet: sent
    /// before the ACCEPT, addressed with the sender's own connection id
    /// and token.
    pub const EARLY: Flags = Flags(0x0010);
    const RELIABLE_MASK: u16 = 0x0013;
    const CLOSE_MASK: u16 = 0x0004;

    /// No flags.
    pub const NONE: Flags = Flags(0);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    #[must_use]
    pub const fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    fn allowed_for(t: PacketType) -> u16 {
        let protected = if t.allows_protection() {
            Flags::PROTECTED.0
        } else {
            0
        };
        protected
            | match t {
                PacketType::Close => Flags::CLOSE_MASK,
                PacketType::Connect => Flags::EARLY.0,
                t if t.is_reliable() => Flags::RELIABLE_MASK,
                _ => 0,
            }
    }
}

/// NAK reason codes (spec 3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum NakReason {
    /// The memory key is not registered (or not in the connection's domain).
    InvalidKey,
    /// The region does not allow this access (remote write / remote read).
    AccessDenied,
    /// The address range falls outside the registered region.
    OutOfBounds,
    /// The packet is well formed but breaks a protocol rule (e.g. an
    /// inconsistent message length).
    ProtocolError,
    /// No receive buffer is posted for this SEND; the sender retries later.
    ReceiverNotReady,
    /// The SEND is longer than the posted receive buffer.
    ReceiveTooSmall,
}

impl NakReason {
    /// Wire code.
    pub const fn code(self) -> u8 {
        match self {
            NakReason::InvalidKey => 1,
            NakReason::AccessDenied => 2,
            NakReason::OutOfBounds => 3,
            NakReason::ProtocolError => 4,
            NakReason::ReceiverNotReady => 5,
            NakReason::ReceiveTooSmall => 6,
        }
    }

    /// From wire code.
    pub const fn from_code(code: u8) -> Option<NakReason> {
        Some(match code {
            1 => NakReason::InvalidKey,
            2 => NakReason::AccessDenied,
            3 => NakReason::OutOfBounds,
            4 => NakReason::ProtocolError,
            5 => NakReason::ReceiverNotReady,
            6 => NakReason::ReceiveTooSmall,
            _ => return None,
        })
    }

    /// Whether the NAK ends the connection (sticky error, spec 4.7) rather
    /// than asking for a later retry.
    pub const fn is_fatal(self) -> bool {
        !matches!(self, NakReason::ReceiverNotReady)
    }
}

/// CLOSE reason codes (spec 3.8.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CloseReason {
    /// The application closed the connection after its work completed.
    Normal,
    /// The connection entered the error state.
    Error,
    /// Nothing was heard from the peer for the idle timeout.
    IdleTimeout,
    /// A CONNECT was refused (nobody accepts, or parameters unacceptable).
    Rejected,
    /// The acceptor's table was full and this idle or unconfirmed
    /// connection's source prefix held the most: its slot went to a
    /// source that held less (spec 4.2.3).
    Reclaimed,
}

impl CloseReason {
    /// Wire code.
    pub const fn code(self) -> u8 {
        match self {
            CloseReason::Normal => 0,
            CloseReason::Error => 1,
            CloseReason::IdleTimeout => 2,
            CloseReason::Rejected => 3,
            CloseReason::Reclaimed => 4,
        }
    }

    /// From wire code.
    pub const fn from_code(code: u8) -> Option<CloseReason> {
        Some(match code {
            0 => CloseReason::Normal,
            1 => CloseReason::Error,
            2 => CloseReason::IdleTimeout,
            3 => CloseReason::Rejected,
            4 => CloseReason::Reclaimed,
            _ => return None,
        })
    }
}

/// A read-only or read-write view of a MetaRoCE transport packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it. Accessors may panic on a short
    /// buffer; use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`Packet::check_len`]. After this no accessor panics.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the whole packet its header describes:
    /// the version, a known type, its extension header, the payload length it
    /// claims and the CRC trailer, with nothing after it.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN + CRC_LEN {
            return Err(Error::Truncated);
        }
        if b[field::VERSION] != VERSION {
            return Err(Error::BadVersion(b[field::VERSION]));
        }
        let t = PacketType::from(b[field::TYPE]);
        let ext = t
            .extension_len()
            .ok_or(Error::UnknownType(b[field::TYPE]))?;
        let payload = usize::from(read_u16(b, field::PAYLOAD_LEN));
        // PROTECTED is read before the CRC check: it says where the
        // trailer is (spec 3.11 step 4).
        let protection = if self.is_protected() {
            SECURITY_LEN + TAG_LEN
        } else {
            0
        };
        let total = HEADER_LEN + ext + protection + payload + CRC_LEN;
        if b.len() < total {
            return Err(Error::Truncated);
        }
        if b.len() > total {
            return Err(Error::BadLength);
        }
        Ok(())
    }

    /// Consumes the view and returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version field.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// Packet type.
    pub fn packet_type(&self) -> PacketType {
        PacketType::from(self.buffer.as_ref()[field::TYPE])
    }

    /// Flags.
    pub fn flags(&self) -> Flags {
        Flags(read_u16(self.buffer.as_ref(), field::FLAGS))
    }

    /// Destination connection id.
    pub fn dst_conn(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DST_CONN)
    }

    /// Connection token (anti-spoofing).
    pub fn token(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::TOKEN)
    }

    /// Packet sequence number.
    pub fn psn(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::PSN)
    }

    /// Logical path id.
    pub fn path(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PATH)
    }

    /// Payload length field.
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }

    /// Sender timestamp, nanoseconds of the sender's clock modulo 2^32.
    pub fn timestamp(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::TIMESTAMP)
    }

    fn extension_len(&self) -> usize {
        self.packet_type().extension_len().unwrap_or(0)
    }

    /// Whether the PROTECTED flag is set (spec 5.3).
    pub fn is_protected(&self) -> bool {
        self.flags().contains(Flags::PROTECTED)
    }

    /// Length of the security extension: 16 on a protected packet, else 0.
    fn security_len(&self) -> usize {
        if self.is_protected() {
            SECURITY_LEN
        } else {
            0
        }
    }

    /// Header bytes: common header, extension header and, on a protected
    /// packet, the security extension: the associated data of spec 5.3.
    pub fn header_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..HEADER_LEN + self.extension_len() + self.security_len()]
    }

    /// The security extension of a protected packet (spec 5.3.2).
    pub fn security(&self) -> Option<&[u8]> {
        let start = HEADER_LEN + self.extension_len();
        self.is_protected()
            .then(|| &self.buffer.as_ref()[start..start + SECURITY_LEN])
    }

    /// The authentication tag of a protected packet: the 16 bytes before
    /// the CRC trailer.
    pub fn tag(&self) -> Option<&[u8]> {
        let b = self.buffer.as_ref();
        let end = b.len() - CRC_LEN;
        self.is_protected().then(|| &b[end - TAG_LEN..end])
    }

    /// The extension header.
    pub fn extension(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.extension_len()]
    }

    /// The payload (the ciphertext on a protected packet).
    pub fn payload(&self) -> &[u8] {
        let start = HEADER_LEN + self.extension_len() + self.security_len();
        let end = start + usize::from(self.payload_len());
        &self.buffer.as_ref()[start..end]
    }

    /// The CRC trailer field.
    pub fn crc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let end = b.len();
        read_u32(b, end - CRC_LEN..end)
    }

    /// CRC computed over everything before the trailer.
    pub fn compute_crc(&self) -> u32 {
        let b = self.buffer.as_ref();
        crc32(&[&b[..b.len() - CRC_LEN]])
    }

    /// Whether the trailer matches the contents.
    pub fn verify_crc(&self) -> bool {
        self.crc() == self.compute_crc()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = HEADER_LEN + self.extension_len() + self.security_len();
        let end = start + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[start..end]
    }

    /// Computes and writes the CRC trailer.
    pub fn fill_crc(&mut self) {
        let crc = self.compute_crc();
        let b = self.buffer.as_mut();
        let end = b.len();
        write_u32(b, end - CRC_LEN..end, crc);
    }
}

/// CRC-32 (IEEE) over several slices in order, as one buffer. Used so a
/// header and a payload gathered from different memory need no copy.
pub fn crc32(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

/// Common header fields (spec 3.2); the type follows from the [`Body`].
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

fn parse_span(ext: &[u8]) -> MessageSpan {
    // MSG_ID, MSG_OFFSET and MSG_LEN sit at the same offsets in every data
    // extension header.
    use field::memory as f;
    MessageSpan {
        id: read_u32(ext, f::MSG_ID),
        offset: read_u32(ext, f::MSG_OFFSET),
        len: read_u32(ext, f::MSG_LEN),
    }
}

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
        packet.check_len()?;
        let crc_ok = match crc {
            CrcVerdict::NotChecked => packet.verify_crc(),
            CrcVerdict::Good => true,
            CrcVerdict::Bad => false,
        };
        if !crc_ok {
            return Err(Error::BadCrc);
        }
        let t = packet.packet_type();
        let flags = packet.flags();
        if flags.0 & !Flags::allowed_for(t) != 0 {
            return Err(Error::Reserved);
        }
        let payload_len = packet.payload_len();
        if payload_len != 0 && !t.carries_payload() {
            return Err(Error::BadLength);
        }
        if let Some(security) = packet.security() {
            super::protect::SecurityRepr::parse(security)?;
        }
        let ext = packet.extension();
        let body = match t {
            PacketType::Write | PacketType::WriteImm => Body::Write(WriteRepr {
                msg: parse_span(ext),
                target: parse_target(ext),
                imm: (t == PacketType::WriteImm).then(|| WriteImm {
                    imm: read_u32(ext, field::memory::IMM),
                    recv_index: read_u32(ext, field::memory::RECV_INDEX),
                }),
            }),
            PacketType::Send | PacketType::SendImm => Body::Send(SendRepr {
                msg: parse_span(ext),
                recv_index: read_u32(ext, field::send::RECV_INDEX),
                imm: (t == PacketType::SendImm).then(|| read_u32(ext, field::send::IMM)),
            }),
            PacketType::ReadResponse => Body::ReadResponse(ReadResponseRepr {
                msg: parse_span(ext),
                target: parse_target(ext),
            }),
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
        if let Some(d) = body.data() {
            let end = u64::from(d.msg.offset) + u64::from(payload_len);
            if end > u64::from(d.msg.len) {
                return Err(Error::BadField);
            }
        }
        Ok(Repr {
            header: Header {
                flags,
                dst_conn: packet.dst_conn(),
                token: packet.token(),
                psn: packet.psn(),
                path: packet.path(),
                timestamp: packet.timestamp(),
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
    // `Repr::parse_with_verdict` checks the lengths first: once.
    let packet = Packet::new_unchecked(bytes);
    let repr = Repr::parse_with_verdict(&packet, crc)?;
    let mut hl = repr.header_len();
    if packet.is_protected() {
        hl += SECURITY_LEN;
    }
    Ok((repr, &bytes[hl..hl + usize::from(repr.payload_len)]))
}
