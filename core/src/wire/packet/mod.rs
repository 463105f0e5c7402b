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
use super::{read_u16, read_u32, read_u64, write_u32, Error, Result};
use super::{CRC_LEN, VERSION};

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

/// What [`Packet::layout`] read while it checked a packet's lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub packet_type: PacketType,
    pub extension_len: usize,
    pub flags: Flags,
    pub payload_len: u16,
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
        self.layout().map(|_| ())
    }

    /// [`Packet::check_len`], returning what it read on the way: the type,
    /// its extension header's length, the flags and the payload length,
    /// so a parse reads none of them again.
    #[inline]
    pub(crate) fn layout(&self) -> Result<Layout> {
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
        let payload_len = read_u16(b, field::PAYLOAD_LEN);
        let flags = Flags(read_u16(b, field::FLAGS));
        // PROTECTED is read before the CRC check: it says where the
        // trailer is (spec 3.11 step 4).
        let protection = if flags.contains(Flags::PROTECTED) {
            SECURITY_LEN + TAG_LEN
        } else {
            0
        };
        let total = HEADER_LEN + ext + protection + usize::from(payload_len) + CRC_LEN;
        if b.len() < total {
            return Err(Error::Truncated);
        }
        if b.len() > total {
            return Err(Error::BadLength);
        }
        Ok(Layout {
            packet_type: t,
            extension_len: ext,
            flags,
            payload_len,
        })
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
mod repr;

pub use repr::{
    parse, parse_repr, parse_with_verdict, AcceptRepr, AckRepr, Body, CipherSuite, CloseRepr,
    ConnectRepr, DataRepr, Header, MemoryTarget, MessageSpan, NakRepr, NewTokenRepr, Placement,
    ReadRequestRepr, ReadResponseRepr, Repr, RetryRepr, SendRepr, TimerProfile, WriteImm,
    WriteRepr,
};
