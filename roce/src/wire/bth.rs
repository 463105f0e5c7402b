//! Base Transport Header (IBA Vol. 1 chapter 9) and the RC opcodes.
//!
//! ```text
//!  byte 0   | OpCode                                  |
//!  byte 1   | SE | M | PadCnt(2) | TVer(4)            |
//!  byte 2-3 | P_Key                                   |
//!  byte 4   | FECN | BECN | Resv6   (the "resv8a" byte) |
//!  byte 5-7 | DestQP (24)                             |
//!  byte 8   | A | Resv7                               |
//!  byte 9-11| PSN (24)                                |
//! ```
//!
//! RoCEv2 reuses byte 4's top bits as FECN/BECN (annex A17: a CNP sets
//! BECN). The whole byte is masked in the ICRC.

use super::{read_u16, read_u24, write_u16, write_u24, Error, Result, BTH_LEN};

/// Byte ranges of the BTH.
pub mod field {
    use crate::wire::Field;

    pub const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (bit 6), reserved (bits 5-0).
    pub const RESV8A: usize = 4;
    pub const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), reserved (bits 6-0).
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Opcodes of the Reliable Connection transport (top three bits 000) plus the
/// RoCEv2 Congestion Notification Packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Opcode {
    SendFirst,
    SendMiddle,
    SendLast,
    SendLastImm,
    SendOnly,
    SendOnlyImm,
    WriteFirst,
    WriteMiddle,
    WriteLast,
    WriteLastImm,
    WriteOnly,
    WriteOnlyImm,
    ReadRequest,
    ReadResponseFirst,
    ReadResponseMiddle,
    ReadResponseLast,
    ReadResponseOnly,
    Acknowledge,
    /// Congestion Notification Packet (annex A17), sent by the DCQCN
    /// notification point.
    Cnp,
    /// Any other value (UC, UD, atomics, ...); parsing rejects it.
    Unknown(u8),
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Opcode {
        match v {
            0x00 => Opcode::SendFirst,
            0x01 => Opcode::SendMiddle,
            0x02 => Opcode::SendLast,
            0x03 => Opcode::SendLastImm,
            0x04 => Opcode::SendOnly,
            0x05 => Opcode::SendOnlyImm,
            0x06 => Opcode::WriteFirst,
            0x07 => Opcode::WriteMiddle,
            0x08 => Opcode::WriteLast,
            0x09 => Opcode::WriteLastImm,
            0x0a => Opcode::WriteOnly,
            0x0b => Opcode::WriteOnlyImm,
            0x0c => Opcode::ReadRequest,
            0x0d => Opcode::ReadResponseFirst,
            0x0e => Opcode::ReadResponseMiddle,
            0x0f => Opcode::ReadResponseLast,
            0x10 => Opcode::ReadResponseOnly,
            0x11 => Opcode::Acknowledge,
            0x81 => Opcode::Cnp,
            other => Opcode::Unknown(other),
        }
    }
}

impl From<Opcode> for u8 {
    fn from(o: Opcode) -> u8 {
        match o {
            Opcode::SendFirst => 0x00,
            Opcode::SendMiddle => 0x01,
            Opcode::SendLast => 0x02,
            Opcode::SendLastImm => 0x03,
            Opcode::SendOnly => 0x04,
            Opcode::SendOnlyImm => 0x05,
            Opcode::WriteFirst => 0x06,
            Opcode::WriteMiddle => 0x07,
            Opcode::WriteLast => 0x08,
            Opcode::WriteLastImm => 0x09,
            Opcode::WriteOnly => 0x0a,
            Opcode::WriteOnlyImm => 0x0b,
            Opcode::ReadRequest => 0x0c,
            Opcode::ReadResponseFirst => 0x0d,
            Opcode::ReadResponseMiddle => 0x0e,
            Opcode::ReadResponseLast => 0x0f,
            Opcode::ReadResponseOnly => 0x10,
            Opcode::Acknowledge => 0x11,
            Opcode::Cnp => 0x81,
            Opcode::Unknown(v) => v,
        }
    }
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Opcode {
    /// Every opcode this baseline implements, in code order.
    pub const ALL: [Opcode; 19] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastImm,
        Opcode::SendOnly,
        Opcode::SendOnlyImm,
        Opcode::WriteFirst,
        Opcode::WriteMiddle,
        Opcode::WriteLast,
        Opcode::WriteLastImm,
        Opcode::WriteOnly,
        Opcode::WriteOnlyImm,
        Opcode::ReadRequest,
        Opcode::ReadResponseFirst,
        Opcode::ReadResponseMiddle,
        Opcode::ReadResponseLast,
        Opcode::ReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::Cnp,
    ];

    /// Carries a RETH (first or only packet of a WRITE; READ request).
    pub const fn has_reth(self) -> bool {
        matches!(
            self,
            Opcode::WriteFirst | Opcode::WriteOnly | Opcode::WriteOnlyImm | Opcode::ReadRequest
        )
    }

    /// Carries an AETH (acknowledgments and the READ responses that can ack).
    pub const fn has_aeth(self) -> bool {
        matches!(
            self,
            Opcode::ReadResponseFirst
                | Opcode::ReadResponseLast
                | Opcode::ReadResponseOnly
                | Opcode::Acknowledge
        )
    }

    /// Carries immediate data.
    pub const fn has_immdt(self) -> bool {
        matches!(
            self,
            Opcode::SendLastImm | Opcode::SendOnlyImm | Opcode::WriteLastImm | Opcode::WriteOnlyImm
        )
    }

    /// May carry payload.
    pub const fn carries_payload(self) -> bool {
        self.is_send() || self.is_write() || self.is_read_response()
    }

    /// A SEND packet.
    pub const fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::SendFirst
                | Opcode::SendMiddle
                | Opcode::SendLast
                | Opcode::SendLastImm
                | Opcode::SendOnly
                | Opcode::SendOnlyImm
        )
    }

    /// An RDMA WRITE packet.
    pub const fn is_write(self) -> bool {
        matches!(
            self,
            Opcode::WriteFirst
                | Opcode::WriteMiddle
                | Opcode::WriteLast
                | Opcode::WriteLastImm
                | Opcode::WriteOnly
                | Opcode::WriteOnlyImm
        )
    }

    /// An RDMA READ response packet.
    pub const fn is_read_response(self) -> bool {
        matches!(
            self,
            Opcode::ReadResponseFirst
                | Opcode::ReadResponseMiddle
                | Opcode::ReadResponseLast
                | Opcode::ReadResponseOnly
        )
    }

    /// A request the responder executes in PSN order (SEND, WRITE, READ request).
    pub const fn is_request(self) -> bool {
        self.is_send() || self.is_write() || matches!(self, Opcode::ReadRequest)
    }

    /// Position of the packet in its message, for SEND, WRITE and READ
    /// response packets.
    pub const fn position(self) -> Option<Position> {
        Some(match self {
            Opcode::SendFirst | Opcode::WriteFirst | Opcode::ReadResponseFirst => Position::First,
            Opcode::SendMiddle | Opcode::WriteMiddle | Opcode::ReadResponseMiddle => {
                Position::Middle
            }
            Opcode::SendLast
            | Opcode::SendLastImm
            | Opcode::WriteLast
            | Opcode::WriteLastImm
            | Opcode::ReadResponseLast => Position::Last,
            Opcode::SendOnly
            | Opcode::SendOnlyImm
            | Opcode::WriteOnly
            | Opcode::WriteOnlyImm
            | Opcode::ReadResponseOnly => Position::Only,
            _ => return None,
        })
    }

    /// Bytes of transport headers (BTH and extended headers) for this opcode;
    /// the CNP's 16 reserved bytes count as header. `None` for unknown opcodes.
    pub const fn header_len(self) -> Option<usize> {
        if let Opcode::Unknown(_) = self {
            return None;
        }
        if let Opcode::Cnp = self {
            return Some(BTH_LEN + super::CNP_RESERVED_LEN);
        }
        let mut len = BTH_LEN;
        if self.has_reth() {
            len += super::RETH_LEN;
        }
        if self.has_aeth() {
            len += super::AETH_LEN;
        }
        if self.has_immdt() {
            len += super::IMMDT_LEN;
        }
        Some(len)
    }
}

/// A view of a Base Transport Header.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer of at least [`BTH_LEN`] bytes; no accessor panics after.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < BTH_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn opcode(&self) -> Opcode {
        Opcode::from(self.buffer.as_ref()[field::OPCODE])
    }

    /// Solicited event.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }

    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }

    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0b11
    }

    /// Transport header version (0 for every IBA release so far).
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0f
    }

    pub fn pkey(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PKEY)
    }

    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x80 != 0
    }

    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & 0x40 != 0
    }

    pub fn dest_qp(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::DEST_QP)
    }

    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }

    pub fn psn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::PSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_opcode(&mut self, o: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = u8::from(o);
    }

    /// Sets SE, MigReq, PadCnt and TVer (byte 1) at once.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad_count & 0b11) << 4)
            | (tver & 0x0f);
    }

    pub fn set_pkey(&mut self, v: u16) {
        write_u16(self.buffer.as_mut(), field::PKEY, v);
    }

    /// Sets FECN and BECN; the six reserved bits are written as zero.
    pub fn set_ecn_bits(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::RESV8A] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Sets the 24-bit destination QP (higher bits ignored).
    pub fn set_dest_qp(&mut self, v: u32) {
        write_u24(self.buffer.as_mut(), field::DEST_QP, v);
    }

    /// Sets AckReq; the seven reserved bits are written as zero.
    pub fn set_ack_req(&mut self, v: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(v) << 7;
    }

    /// Sets the 24-bit PSN (higher bits ignored).
    pub fn set_psn(&mut self, v: u32) {
        write_u24(self.buffer.as_mut(), field::PSN, v);
    }
}

/// BTH fields. Reserved bits are zero on emit and ignored on parse, as
/// the IBA asks of receivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    /// Pad bytes after the payload (0-3).
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// Destination queue pair number (24 bits).
    pub dest_qp: u32,
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// Parses a checked BTH. Unknown opcodes and a non-zero TVer are errors.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<BthRepr> {
        p.check_len()?;
        let opcode = p.opcode();
        if let Opcode::Unknown(v) = opcode {
            return Err(Error::UnknownOpcode(v));
        }
        if p.tver() != 0 {
            return Err(Error::BadVersion(p.tver()));
        }
        Ok(BthRepr {
            opcode,
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Length of the BTH.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes the BTH into the first [`BTH_LEN`] bytes of `p`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.mig_req, self.pad_count, 0);
        p.set_pkey(self.pkey);
        p.set_ecn_bits(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // SEND Only, SE, PadCnt 3, P_Key 0xffff, BECN, QP 0x123456, AckReq, PSN 0xabcdef.
    static BYTES: [u8; 12] = [
        0x04, 0xb0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::SendOnly,
            solicited: true,
            mig_req: false,
            pad_count: 3,
            pkey: 0xffff,
            fecn: false,
            becn: true,
            dest_qp: 0x12_3456,
            ack_req: true,
            psn: 0xab_cdef,
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::SendOnly);
        assert!(p.solicited());
        assert!(!p.mig_req());
        assert_eq!(p.pad_count(), 3);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), 0xffff);
        assert!(!p.fecn());
        assert!(p.becn());
        assert_eq!(p.dest_qp(), 0x12_3456);
        assert!(p.ack_req());
        assert_eq!(p.psn(), 0xab_cdef);
    }

    #[test]
    fn construct() {
        let mut buf = [0xa5u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        repr().emit(&mut p);
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn parse_and_reject() {
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&BYTES[..])),
            Ok(repr())
        );
        let mut bad = BYTES;
        bad[1] |= 0x01;
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&bad[..])),
            Err(Error::BadVersion(1))
        );
        bad = BYTES;
        bad[0] = 0x24; // UC SEND Only
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&bad[..])),
            Err(Error::UnknownOpcode(0x24))
        );
        assert_eq!(
            Packet::new_checked(&BYTES[..11]).err(),
            Some(Error::Truncated)
        );
    }

    #[test]
    fn opcode_table() {
        for o in Opcode::ALL {
            assert_eq!(Opcode::from(u8::from(o)), o);
            assert!(o.header_len().is_some());
        }
        assert_eq!(Opcode::WriteOnlyImm.header_len(), Some(32));
        assert_eq!(Opcode::ReadResponseMiddle.header_len(), Some(12));
        assert_eq!(Opcode::Acknowledge.header_len(), Some(16));
        assert_eq!(Opcode::Cnp.header_len(), Some(28));
        assert_eq!(Opcode::Unknown(0x64).header_len(), None);
    }
}
