//! ACK Extended Transport Header (IBA Vol. 1 chapter 9): syndrome and MSN.
//!
//! ```text
//! byte 0   | 0 | type(2) | value(5) |   type 00 ACK (value: credit count)
//!          |               (syndrome) |   type 01 RNR NAK (value: timer code)
//!          |                          |   type 11 NAK (value: NAK code)
//! byte 1-3 | MSN (24)                 |   type 10 and bit 7 are reserved
//! ```

use super::{read_u24, write_u24, Error, Result, AETH_LEN};

/// Byte ranges of the AETH.
pub mod field {
    use crate::wire::Field;

    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

/// The credit count meaning "no end-to-end flow control";
/// what this responder always advertises, like rxe.
pub const UNLIMITED_CREDITS: u8 = 0b1_1111;

/// NAK codes (the IBA NAK code table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum NakCode {
    /// The responder expected another PSN; the requester goes back to it.
    PsnSequenceError,
    /// Malformed or out-of-order opcode sequence, length, or too many READs.
    InvalidRequest,
    /// R_Key, access rights or bounds check failed.
    RemoteAccessError,
    /// The responder could not complete the request for a local reason.
    RemoteOperationalError,
    /// Reliable Datagram only; parsed for completeness.
    InvalidRdRequest,
    /// A reserved code.
    Unknown(u8),
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(v) => v & 0x1f,
        }
    }

    pub const fn from_code(v: u8) -> NakCode {
        match v & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Unknown(other),
        }
    }
}

/// The AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Syndrome {
    /// Positive acknowledgment with an end-to-end credit count (5 bits).
    Ack { credits: u8 },
    /// Receiver not ready: retry after the time the 5-bit code names
    /// (see [`rnr_timer_nanos`]).
    RnrNak { timer: u8 },
    /// Negative acknowledgment.
    Nak(NakCode),
}

impl Syndrome {
    /// The syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.code(),
        }
    }

    /// From the syndrome byte; the reserved encodings are errors.
    pub const fn from_byte(b: u8) -> Result<Syndrome> {
        if b & 0x80 != 0 {
            return Err(Error::BadSyndrome(b));
        }
        let value = b & 0x1f;
        match (b >> 5) & 0b11 {
            0b00 => Ok(Syndrome::Ack { credits: value }),
            0b01 => Ok(Syndrome::RnrNak { timer: value }),
            0b11 => Ok(Syndrome::Nak(NakCode::from_code(value))),
            _ => Err(Error::BadSyndrome(b)),
        }
    }
}

/// The minimum RNR NAK timer of each 5-bit code, in nanoseconds (the IBA
/// table that rdma-core's `enum ibv_rnr_timer` repeats). Code 0 is the
/// longest, 655.36 ms.
pub const fn rnr_timer_nanos(code: u8) -> u64 {
    const TENS_OF_MICROS: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    TENS_OF_MICROS[(code & 0x1f) as usize] * 10_000
}

/// A view of an AETH.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer of at least [`AETH_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < AETH_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_syndrome_byte(&mut self, v: u8) {
        self.buffer.as_mut()[field::SYNDROME] = v;
    }

    pub fn set_msn(&mut self, v: u32) {
        write_u24(self.buffer.as_mut(), field::MSN, v);
    }
}

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AethRepr {
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<AethRepr> {
        p.check_len()?;
        Ok(AethRepr {
            syndrome: Syndrome::from_byte(p.syndrome_byte())?,
            msn: p.msn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_syndrome_byte(self.syndrome.to_byte());
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes() {
        let cases = [
            (
                0x1f,
                Syndrome::Ack {
                    credits: UNLIMITED_CREDITS,
                },
            ),
            (0x2e, Syndrome::RnrNak { timer: 14 }),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
            (0x7f, Syndrome::Nak(NakCode::Unknown(0x1f))),
        ];
        for (byte, s) in cases {
            assert_eq!(Syndrome::from_byte(byte), Ok(s));
            assert_eq!(s.to_byte(), byte);
        }
        assert_eq!(Syndrome::from_byte(0x40), Err(Error::BadSyndrome(0x40)));
        assert_eq!(Syndrome::from_byte(0x80), Err(Error::BadSyndrome(0x80)));
    }

    #[test]
    fn round_trip() {
        let bytes = [0x22u8, 0x00, 0x01, 0x02];
        let repr = AethRepr {
            syndrome: Syndrome::RnrNak { timer: 2 },
            msn: 0x102,
        };
        assert_eq!(
            AethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(repr)
        );
        let mut buf = [0xa5u8; 4];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }

    #[test]
    fn rnr_table() {
        assert_eq!(rnr_timer_nanos(0), 655_360_000);
        assert_eq!(rnr_timer_nanos(1), 10_000);
        assert_eq!(rnr_timer_nanos(12), 640_000);
        assert_eq!(rnr_timer_nanos(31), 491_520_000);
    }
}
