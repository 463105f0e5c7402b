//! RDMA Extended Transport Header (IBA Vol. 1 chapter 9): where a WRITE
//! goes or where a READ comes from. Carried by the first (or only) packet of
//! a WRITE and by the READ request.

use super::{read_u32, read_u64, write_u32, write_u64, Error, Result, RETH_LEN};

/// Byte ranges of the RETH.
pub mod field {
    use crate::wire::Field;

    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

/// A view of a RETH.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer of at least [`RETH_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < RETH_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Virtual address of the first byte.
    pub fn va(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::VA)
    }

    pub fn rkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::RKEY)
    }

    /// Length of the whole message in bytes.
    pub fn dma_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_va(&mut self, v: u64) {
        write_u64(self.buffer.as_mut(), field::VA, v);
    }

    pub fn set_rkey(&mut self, v: u32) {
        write_u32(self.buffer.as_mut(), field::RKEY, v);
    }

    pub fn set_dma_len(&mut self, v: u32) {
        write_u32(self.buffer.as_mut(), field::DMA_LEN, v);
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RethRepr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl RethRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Packet<&T>) -> Result<RethRepr> {
        p.check_len()?;
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x7f12_3456_789a,
        rkey: 0xdead_beef,
        dma_len: 65536,
    };

    #[test]
    fn round_trip() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(RethRepr::parse(&p), Ok(REPR));
        let mut buf = [0xa5u8; 16];
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(
            Packet::new_checked(&BYTES[..15]).err(),
            Some(Error::Truncated)
        );
    }
}
