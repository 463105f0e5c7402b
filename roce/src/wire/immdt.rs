//! Immediate Data header (IBA Vol. 1 chapter 9): four opaque bytes handed to
//! the receiver's completion, carried by SEND and WRITE "with immediate".

use super::{read_u32, write_u32, Error, Result, IMMDT_LEN};

/// Byte ranges of the ImmDt header.
pub mod field {
    use crate::wire::Field;

    pub const IMM: Field = 0..4;
}

/// A view of an ImmDt header.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer of at least [`IMMDT_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < IMMDT_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn imm(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::IMM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_imm(&mut self, v: u32) {
        write_u32(self.buffer.as_mut(), field::IMM, v);
    }
}

/// Parses the immediate value of a checked header.
pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<u32> {
    p.check_len()?;
    Ok(p.imm())
}

/// Writes an immediate value.
pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(imm: u32, p: &mut Packet<T>) {
    p.set_imm(imm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0x01u8, 0x02, 0x03, 0x04];
        assert_eq!(
            parse(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(0x0102_0304)
        );
        let mut buf = [0xa5u8; 4];
        emit(0x0102_0304, &mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert_eq!(
            Packet::new_checked(&bytes[..3]).err(),
            Some(Error::Truncated)
        );
    }
}
