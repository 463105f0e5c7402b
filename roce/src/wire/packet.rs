//! A whole RoCEv2 transport packet: the UDP payload from BTH to ICRC.
//!
//! ```text
//! | BTH 12 | RETH 16? | AETH 4? | ImmDt 4? | payload | pad 0-3 | ICRC 4 |
//! ```
//!
//! The opcode decides which extended headers follow the BTH (IBA chapter 9,
//! the opcode table) and whether payload may follow. A CNP is a BTH, 16 reserved
//! bytes and the ICRC (annex A17); its reserved bytes count as header
//! here and are emitted as zeros.
//!
//! [`Repr::parse`] does not check the ICRC: it needs the IP and UDP headers,
//! which the caller has (see [`super::icrc`] and [`super::frame`]).

use super::aeth::{self, AethRepr};
use super::bth::{self, BthRepr};
use super::immdt;
use super::reth::{self, RethRepr};
use super::{icrc, pad_for, Error, Result, AETH_LEN, BTH_LEN, ICRC_LEN, IMMDT_LEN, RETH_LEN};

/// A transport packet's headers and payload length.
///
/// The extended headers present must match the opcode: emit writes those the
/// opcode calls for (a missing one as zeros) and ignores the others; parse
/// fills exactly those the opcode carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Repr {
    /// The BTH. On emit its `pad_count` is ignored: it follows from
    /// `payload_len`.
    pub bth: BthRepr,
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub imm: Option<u32>,
    /// Payload bytes, without the pad.
    pub payload_len: usize,
}

impl Repr {
    /// Parses a transport packet (BTH through ICRC) and returns it with its
    /// payload (pad excluded). The ICRC is not verified here.
    pub fn parse(bytes: &[u8]) -> Result<(Repr, &[u8])> {
        if bytes.len() < BTH_LEN + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let mut bth = BthRepr::parse(&bth::Packet::new_unchecked(bytes))?;
        let opcode = bth.opcode;
        let header_len = opcode
            .header_len()
            .ok_or(Error::UnknownOpcode(u8::from(opcode)))?;
        if bytes.len() < header_len + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let mut offset = BTH_LEN;
        let reth = if opcode.has_reth() {
            let r = RethRepr::parse(&reth::Packet::new_unchecked(&bytes[offset..]))?;
            offset += RETH_LEN;
            Some(r)
        } else {
            None
        };
        let aeth = if opcode.has_aeth() {
            let a = AethRepr::parse(&aeth::Packet::new_unchecked(&bytes[offset..]))?;
            offset += AETH_LEN;
            Some(a)
        } else {
            None
        };
        let imm = if opcode.has_immdt() {
            Some(immdt::parse(&immdt::Packet::new_unchecked(
                &bytes[offset..],
            ))?)
        } else {
            None
        };
        let rest = bytes.len() - header_len - ICRC_LEN;
        let pad = usize::from(bth.pad_count);
        let payload_len = if opcode.carries_payload() {
            if !rest.is_multiple_of(4) || pad > rest {
                return Err(Error::BadLength);
            }
            rest - pad
        } else {
            if rest != 0 || pad != 0 {
                return Err(Error::BadLength);
            }
            0
        };
        bth.pad_count = pad as u8;
        let repr = Repr {
            bth,
            reth,
            aeth,
            imm,
            payload_len,
        };
        Ok((repr, &bytes[header_len..header_len + payload_len]))
    }

    /// Bytes of BTH and extended headers (for a CNP, with its reserved bytes).
    pub fn header_len(&self) -> usize {
        self.bth.opcode.header_len().unwrap_or(BTH_LEN)
    }

    /// Pad bytes after the payload.
    pub fn pad_len(&self) -> usize {
        pad_for(self.payload_len)
    }

    /// Whole packet: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad_len() + ICRC_LEN
    }

    /// Writes the headers into `buf[..header_len()]`. Payload, pad and ICRC
    /// are the caller's (see [`Repr::emit`] for the one-buffer case), so a
    /// DMA engine can gather the payload from registered memory.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Repr::header_len`].
    pub fn emit_header(&self, buf: &mut [u8]) {
        let opcode = self.bth.opcode;
        let buf = &mut buf[..self.header_len()];
        let mut bth = self.bth;
        bth.pad_count = self.pad_len() as u8;
        bth.emit(&mut bth::Packet::new_unchecked(&mut buf[..]));
        let mut offset = BTH_LEN;
        if opcode.has_reth() {
            let r = self.reth.unwrap_or_default();
            r.emit(&mut reth::Packet::new_unchecked(&mut buf[offset..]));
            offset += RETH_LEN;
        }
        if opcode.has_aeth() {
            let a = self.aeth.unwrap_or(AethRepr {
                syndrome: aeth::Syndrome::Ack { credits: 0 },
                msn: 0,
            });
            a.emit(&mut aeth::Packet::new_unchecked(&mut buf[offset..]));
            offset += AETH_LEN;
        }
        if opcode.has_immdt() {
            immdt::emit(
                self.imm.unwrap_or(0),
                &mut immdt::Packet::new_unchecked(&mut buf[offset..offset + IMMDT_LEN]),
            );
            offset += IMMDT_LEN;
        }
        // The CNP's reserved bytes.
        buf[offset..].fill(0);
    }

    /// Emits the whole packet into `buf` (exactly [`Repr::buffer_len`]
    /// bytes): headers, `payload`, zero pad and the ICRC computed against the
    /// IP and UDP headers in `ip_udp` (see [`icrc::compute`]).
    ///
    /// # Panics
    /// If `buf.len() != buffer_len()` or `payload.len() != payload_len`.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8], ip_udp: &[u8]) -> Result<()> {
        assert_eq!(buf.len(), self.buffer_len(), "emit buffer length");
        assert_eq!(payload.len(), self.payload_len, "payload length");
        self.emit_header(buf);
        let hl = self.header_len();
        let end = hl + payload.len() + self.pad_len();
        buf[hl..hl + payload.len()].copy_from_slice(payload);
        buf[hl + payload.len()..end].fill(0);
        let crc = icrc::compute(ip_udp, &[&buf[..end]])?;
        buf[end..].copy_from_slice(&icrc::to_wire(crc));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::aeth::{NakCode, Syndrome};
    use crate::wire::bth::Opcode;

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 7,
        }
    }

    #[test]
    fn write_only_imm_with_pad() {
        let repr = Repr {
            bth: bth(Opcode::WriteOnlyImm),
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x42,
                dma_len: 5,
            }),
            aeth: None,
            imm: Some(0xfeed),
            payload_len: 5,
        };
        assert_eq!(repr.header_len(), 32);
        assert_eq!(repr.buffer_len(), 32 + 5 + 3 + 4);
        let mut buf = [0xa5u8; 44];
        repr.emit_header(&mut buf);
        buf[32..37].copy_from_slice(b"hello");
        buf[37..40].fill(0);
        let (parsed, payload) = Repr::parse(&buf).unwrap();
        assert_eq!(payload, b"hello");
        assert_eq!(parsed.bth.pad_count, 3);
        assert_eq!(
            parsed,
            Repr {
                bth: BthRepr {
                    pad_count: 3,
                    ..repr.bth
                },
                ..repr
            }
        );
    }

    #[test]
    fn rejects_bad_lengths() {
        let ack = Repr {
            bth: bth(Opcode::Acknowledge),
            reth: None,
            aeth: Some(AethRepr {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: 3,
            }),
            imm: None,
            payload_len: 0,
        };
        let mut buf = [0u8; 24];
        ack.emit_header(&mut buf);
        assert!(Repr::parse(&buf[..20]).is_ok());
        // An ACK with payload.
        assert_eq!(Repr::parse(&buf[..24]).err(), Some(Error::BadLength));
        // Shorter than its AETH.
        assert_eq!(Repr::parse(&buf[..15]).err(), Some(Error::Truncated));
        // A SEND whose payload and pad are not a multiple of 4.
        let send = Repr {
            bth: bth(Opcode::SendOnly),
            reth: None,
            aeth: None,
            imm: None,
            payload_len: 2,
        };
        let mut buf = [0u8; 20];
        send.emit_header(&mut buf);
        assert_eq!(Repr::parse(&buf[..19]).err(), Some(Error::BadLength));
        assert!(Repr::parse(&buf[..20]).is_ok());
        // Pad larger than the payload.
        buf[1] = 0x30;
        assert_eq!(Repr::parse(&buf[..16]).err(), Some(Error::BadLength));
    }
}
