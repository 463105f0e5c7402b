//! Wire formats (spec section 3).
//!
//! Every format follows one shape, borrowed from smoltcp: a `Packet<T: AsRef<[u8]>>`
//! view over a buffer with a table of byte ranges (`mod field`), `new_checked`
//! that validates lengths once so no accessor can panic afterwards, and a
//! `Repr` that `parse`s from a checked view, `emit`s into one and knows its
//! `buffer_len`.
//!
//! Layers, outermost first:
//! * [`encap`]: Ethernet / IPv4 or IPv6 / UDP, built and parsed with
//!   `smoltcp::wire` (checksums on), plus the ECN field and the UDP source
//!   port that carries path entropy.
//! * [`packet`]: the MetaRoCE transport packet: 28-byte common header, a
//!   type-specific extension header, payload and the 32-bit CRC trailer.
//! * [`protect`]: the security extension and tag of a protected packet
//!   (spec 5.3).
//! * [`sack`]: the 256-bit selective acknowledgment bitvector.
//!
//! All multi-byte fields are big-endian (network order).

pub mod encap;
pub mod packet;
pub mod protect;
pub mod sack;

pub use encap::{EncapRepr, FrameInfo, IpPair};
pub use packet::{
    parse, parse_with_verdict, AcceptRepr, AckRepr, Body, CipherSuite, CloseReason, CloseRepr,
    ConnectRepr, DataRepr, Flags, Header, MemoryTarget, MessageSpan, NakReason, NakRepr,
    NewTokenRepr, Packet, PacketType, Placement, ReadRequestRepr, ReadResponseRepr, Repr,
    RetryRepr, SendRepr, TimerProfile, WriteImm, WriteRepr, COOKIE_LEN, HEADER_LEN,
};
pub use sack::SackBits;

/// Protocol version carried in every packet (spec 3.2).
pub const VERSION: u8 = 2;

/// Default UDP destination port (spec 3.1). Not IANA-assigned; every
/// endpoint and tool takes another one as configuration.
pub const DEFAULT_UDP_PORT: u16 = 4795;

/// Length of the end-to-end CRC trailer in bytes (spec 3.9).
pub const CRC_LEN: usize = 4;

/// What a network device reports about a received packet's CRC trailer,
/// as a NIC reports checksum status per receive descriptor (spec 3.9: a
/// receiver may rely on a device that checked the trailer in hardware).
/// The receiver's parser takes it in place of its own check (spec 3.11
/// step 5); everything else is checked as usual.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CrcVerdict {
    /// The device did not check it: the receiver verifies the trailer
    /// itself (software, the default).
    #[default]
    NotChecked,
    /// The device verified the trailer: the receiver does not recompute it.
    Good,
    /// The device found the trailer wrong: the packet is dropped as
    /// [`Error::BadCrc`], exactly as if the receiver's own check had failed.
    Bad,
}

/// Why a buffer is not a valid MetaRoCE packet or frame. Parsers return this
/// and never panic; the engine counts drops by these reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Error {
    /// The buffer is shorter than the headers it claims to hold.
    Truncated,
    /// The version field is not [`VERSION`].
    BadVersion(u8),
    /// The packet type is not one this version defines.
    UnknownType(u8),
    /// The CRC trailer does not match the packet's contents.
    BadCrc,
    /// A length field disagrees with the buffer or with the packet type.
    BadLength,
    /// Reserved bits or bytes that must be zero are not, or a flag is not
    /// allowed on this packet type.
    Reserved,
    /// A field holds a value outside its allowed range (spec gives ranges).
    BadField,
    /// The frame is not MetaRoCE over UDP (other EtherType, protocol or port).
    NotMetaRoce,
    /// The Ethernet, IP or UDP layer is malformed (bad checksum included).
    Encapsulation,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => write!(f, "truncated packet"),
            Error::BadVersion(v) => write!(f, "unsupported version {v}"),
            Error::UnknownType(t) => write!(f, "unknown packet type {t:#04x}"),
            Error::BadCrc => write!(f, "CRC trailer mismatch"),
            Error::BadLength => write!(f, "length field inconsistent with packet"),
            Error::Reserved => write!(f, "reserved bits set or flag not allowed"),
            Error::BadField => write!(f, "field value out of range"),
            Error::NotMetaRoce => write!(f, "not a MetaRoCE frame"),
            Error::Encapsulation => write!(f, "malformed Ethernet/IP/UDP encapsulation"),
        }
    }
}

impl core::error::Error for Error {}

/// Result of parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range within a header, as in smoltcp's `field` tables.
pub(crate) type Field = core::ops::Range<usize>;

#[inline]
pub(crate) fn read_u16(b: &[u8], f: Field) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[f]);
    u16::from_be_bytes(a)
}

#[inline]
pub(crate) fn read_u32(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}

#[inline]
pub(crate) fn read_u64(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_be_bytes(a)
}

#[inline]
pub(crate) fn write_u16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn write_u32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn write_u64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// An IP address as 16 bytes, IPv4 as the mapped `::ffff:a.b.c.d`: how
/// cookies, proofs and source prefixes take addresses of either family.
pub fn ip16(ip: &smoltcp::wire::IpAddress) -> [u8; 16] {
    match ip {
        smoltcp::wire::IpAddress::Ipv4(a) => {
            let mut b = [0u8; 16];
            b[10] = 0xff;
            b[11] = 0xff;
            b[12..].copy_from_slice(&a.octets());
            b
        }
        smoltcp::wire::IpAddress::Ipv6(a) => a.octets(),
    }
}
