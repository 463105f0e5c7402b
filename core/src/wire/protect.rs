//! The wire parts of packet protection (spec 5.3.2): the security
//! extension that follows a protected packet's extension header and the
//! authentication tag before its CRC trailer.
//!
//! ```text
//! +--------+-----------+--------------------+------------+------+-------+
//! | common | extension | security extension | ciphertext | tag  | CRC-32|
//! | 28     | by type   | 16                 | payload    | 16   | 4     |
//! +--------+-----------+--------------------+------------+------+-------+
//! |<----- associated data (authenticated) ->|<-encrypted>|
//! ```
//!
//! A packet is protected when its Flags carry `PROTECTED` (0x0008). The
//! cryptography itself (keys, nonces, the replay window) is in
//! `crate::crypto`; this module only lays the bytes out.

use super::packet::{Flags, Packet};
use super::{read_u32, read_u64, write_u32, write_u64, Error, Result};

/// Length of the security extension.
pub const SECURITY_LEN: usize = 16;
/// Length of the authentication tag (AES-GCM's full 128-bit tag).
pub const TAG_LEN: usize = 16;
/// Bytes protection adds to a packet: security extension and tag.
pub const OVERHEAD: usize = SECURITY_LEN + TAG_LEN;

/// Byte ranges of the security extension, relative to its start.
pub mod field {
    use crate::wire::Field;
    /// Which pre-shared key the connection's keys derive from: the Key ID
    /// negotiated in CONNECT/ACCEPT.
    pub const KEY_ID: Field = 0..4;
    /// MUST be 0.
    pub const RESERVED: Field = 4..8;
    /// The sender's transmission counter: the variable part of the nonce.
    pub const IV: Field = 8..16;
}

/// The security extension's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SecurityRepr {
    /// The connection's Key ID (nonzero).
    pub key_id: u32,
    /// This transmission's IV: never repeated under one key.
    pub iv: u64,
}

impl SecurityRepr {
    /// Parses the 16 bytes of a security extension: the reserved bytes
    /// must be zero (`Reserved`) and the Key ID nonzero (`BadField`).
    pub fn parse(bytes: &[u8]) -> Result<SecurityRepr> {
        if bytes.len() < SECURITY_LEN {
            return Err(Error::Truncated);
        }
        if read_u32(bytes, field::RESERVED) != 0 {
            return Err(Error::Reserved);
        }
        let key_id = read_u32(bytes, field::KEY_ID);
        if key_id == 0 {
            return Err(Error::BadField);
        }
        Ok(SecurityRepr {
            key_id,
            iv: read_u64(bytes, field::IV),
        })
    }

    /// Writes the extension into `bytes[..SECURITY_LEN]`.
    ///
    /// # Panics
    /// If `bytes` is shorter than [`SECURITY_LEN`].
    pub fn emit(&self, bytes: &mut [u8]) {
        write_u32(bytes, field::KEY_ID, self.key_id);
        write_u32(bytes, field::RESERVED, 0);
        write_u64(bytes, field::IV, self.iv);
    }
}

/// The parts of a protected packet that authentication needs, borrowed
/// from a packet that passed [`Packet::check_len`].
#[derive(Debug, Clone, Copy)]
pub struct Sealed<'a> {
    /// Every header byte: common header, extension header and security
    /// extension (the associated data).
    pub aad: &'a [u8],
    pub security: SecurityRepr,
    /// The encrypted payload (Payload Length bytes).
    pub ciphertext: &'a [u8],
    pub tag: &'a [u8; TAG_LEN],
}

impl<'a> Sealed<'a> {
    /// The parts of `bytes`, a whole MetaRoCE packet; `None` unless it is
    /// a well-formed protected packet.
    pub fn split(bytes: &'a [u8]) -> Option<Sealed<'a>> {
        let packet = Packet::new_checked(bytes).ok()?;
        if !packet.flags().contains(Flags::PROTECTED) {
            return None;
        }
        let aad_len = packet.header_bytes().len();
        let security = SecurityRepr::parse(packet.security()?).ok()?;
        let ct_len = usize::from(packet.payload_len());
        let (aad, rest) = bytes.split_at(aad_len);
        let (ciphertext, rest) = rest.split_at(ct_len);
        let tag = rest.get(..TAG_LEN)?.try_into().ok()?;
        Some(Sealed {
            aad,
            security,
            ciphertext,
            tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_extension_round_trips_and_checks_reserved_and_key_id() {
        let s = SecurityRepr {
            key_id: 0x0102_0304,
            iv: 0x1112_1314_1516_1718,
        };
        let mut b = [0xa5u8; SECURITY_LEN];
        s.emit(&mut b);
        assert_eq!(
            b,
            [1, 2, 3, 4, 0, 0, 0, 0, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]
        );
        assert_eq!(SecurityRepr::parse(&b), Ok(s));
        let mut r = b;
        r[7] = 1;
        assert_eq!(SecurityRepr::parse(&r), Err(Error::Reserved));
        let mut z = b;
        z[..4].fill(0);
        assert_eq!(SecurityRepr::parse(&z), Err(Error::BadField));
        assert_eq!(SecurityRepr::parse(&b[..15]), Err(Error::Truncated));
    }
}
