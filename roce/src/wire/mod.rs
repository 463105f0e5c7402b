//! RoCEv2 wire formats: InfiniBand transport headers carried in UDP
//! (InfiniBand Architecture Specification Vol. 1, chapter 9 and annex A17).
//!
//! ```text
//! | IPv4/IPv6 | UDP (dst 4791) | BTH 12 | ext. headers | payload | pad 0-3 | ICRC 4 |
//! ```
//!
//! Every header follows the smoltcp shape: a `Packet<T: AsRef<[u8]>>` view
//! with a `mod field` table of byte ranges and `new_checked`, plus a `Repr`
//! with `parse`, `emit` and `buffer_len`.
//!
//! * [`bth`]: Base Transport Header and the opcodes of the RC transport.
//! * [`reth`], [`aeth`], [`immdt`]: the extended headers RC uses.
//! * [`packet`]: a whole transport packet (BTH to ICRC) as one `Repr`.
//! * [`icrc`]: the invariant CRC with the masking annex A17 prescribes.
//! * [`frame`]: Ethernet/IP/UDP framing through `metaroce_core::wire::encap`.
//!
//! All multi-byte fields are big-endian, except the ICRC, which is sent
//! least significant byte first (as Ethernet's FCS).

pub mod aeth;
pub mod bth;
pub mod frame;
pub mod icrc;
pub mod immdt;
pub mod packet;
pub mod reth;

pub use aeth::{AethRepr, NakCode, Syndrome};
pub use bth::{BthRepr, Opcode};
pub use packet::Repr;
pub use reth::RethRepr;

/// IANA-assigned UDP destination port of RoCEv2 (annex A17).
pub const UDP_PORT: u16 = 4791;
/// Length of the Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Length of the RDMA Extended Transport Header.
pub const RETH_LEN: usize = 16;
/// Length of the ACK Extended Transport Header.
pub const AETH_LEN: usize = 4;
/// Length of the Immediate Data header.
pub const IMMDT_LEN: usize = 4;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;
/// Reserved bytes after the BTH of a CNP (annex A17).
pub const CNP_RESERVED_LEN: usize = 16;
/// The default partition key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Why bytes are not a valid RoCEv2 packet. Parsers return this and never panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Error {
    /// Shorter than the headers and trailer the packet needs.
    Truncated,
    /// An opcode this baseline does not implement (UC, UD, RD, atomics...).
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0.
    BadVersion(u8),
    /// The length does not fit the opcode (payload on a payload-less opcode,
    /// payload plus pad not a multiple of 4, pad larger than the payload).
    BadLength,
    /// The AETH syndrome uses a reserved encoding.
    BadSyndrome(u8),
    /// The ICRC does not match.
    BadIcrc,
    /// The frame is not RoCEv2 (other EtherType, protocol or UDP port).
    NotRoce,
    /// The Ethernet, IP or UDP layer is malformed, or carries IP options.
    Encapsulation,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => write!(f, "truncated packet"),
            Error::UnknownOpcode(o) => write!(f, "unsupported opcode {o:#04x}"),
            Error::BadVersion(v) => write!(f, "unsupported transport header version {v}"),
            Error::BadLength => write!(f, "length inconsistent with opcode or pad"),
            Error::BadSyndrome(s) => write!(f, "reserved AETH syndrome {s:#04x}"),
            Error::BadIcrc => write!(f, "ICRC mismatch"),
            Error::NotRoce => write!(f, "not a RoCEv2 frame"),
            Error::Encapsulation => write!(f, "malformed Ethernet/IP/UDP encapsulation"),
        }
    }
}

impl core::error::Error for Error {}

/// Result of parsing.
pub type Result<T> = core::result::Result<T, Error>;

/// A byte range within a header.
pub(crate) type Field = core::ops::Range<usize>;

pub(crate) fn read_u16(b: &[u8], f: Field) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[f]);
    u16::from_be_bytes(a)
}

pub(crate) fn read_u24(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a[1..].copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}

pub(crate) fn read_u32(b: &[u8], f: Field) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_be_bytes(a)
}

pub(crate) fn read_u64(b: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_be_bytes(a)
}

pub(crate) fn write_u16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Writes the low 24 bits of `v`.
pub(crate) fn write_u24(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn write_u32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn write_u64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

/// Pad bytes that bring a payload of `len` bytes to a multiple of 4
/// (the BTH PadCnt).
pub const fn pad_for(len: usize) -> usize {
    (4 - len % 4) % 4
}
