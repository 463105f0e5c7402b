//! The provider's message header: the first bytes of every SEND it puts on
//! a MetaRoCE connection. MetaRoCE places a SEND into the peer's next
//! posted receive; the provider's receives are its own buffers, so this
//! header says what the bytes are (an eager message, a rendezvous request,
//! or a rendezvous's end) and carries what libfabric matches on (tag) and
//! reports (remote CQ data). Layout (little-endian), `docs/guide/libfabric.md`:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind: 1 EAGER, 2 RTS (rendezvous request), 3 FIN (rendezvous done) |
//! | 1 | 1 | flags: bit 0 tagged, bit 1 carries remote CQ data |
//! | 2 | 2 | status (FIN: 0 success, else why the READ failed) |
//! | 4 | 4 | remote CQ data |
//! | 8 | 8 | tag |
//! | 16 | 8 | message length (EAGER: the payload that follows) |
//! | 24 | 4 | rendezvous id (RTS, FIN) |
//! | 28 | 4 | memory key of the sender's buffer (RTS) |
//! | 32 | 8 | address of the sender's buffer (RTS) |

/// Bytes of the header.
pub const HEADER_LEN: usize = 40;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The payload follows the header.
    Eager,
    /// Request to send: the receiver READs the payload from the sender's
    /// buffer once a receive matches, then answers FIN.
    Rts,
    /// The receiver finished (or failed) the READ of a rendezvous.
    Fin,
}

const FLAG_TAGGED: u8 = 1;
const FLAG_DATA: u8 = 2;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub tagged: bool,
    /// Remote CQ data, if the sender attached some.
    pub data: Option<u32>,
    pub tag: u64,
    pub len: u64,
    pub rndv_id: u32,
    pub key: u32,
    pub addr: u64,
    pub status: u16,
}

/// Why a received message was not understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than the header, or an EAGER whose length disagrees.
    Truncated,
    /// A kind this provider does not know.
    UnknownKind(u8),
}

impl Header {
    /// A header of `kind` with every other field empty.
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            tagged: false,
            data: None,
            tag: 0,
            len: 0,
            rndv_id: 0,
            key: 0,
            addr: 0,
            status: 0,
        }
    }

    /// Writes the header into `out[..HEADER_LEN]`.
    pub fn emit(&self, out: &mut [u8]) {
        let out = &mut out[..HEADER_LEN];
        out[0] = match self.kind {
            Kind::Eager => 1,
            Kind::Rts => 2,
            Kind::Fin => 3,
        };
        out[1] = if self.tagged { FLAG_TAGGED } else { 0 }
            | if self.data.is_some() { FLAG_DATA } else { 0 };
        out[2..4].copy_from_slice(&self.status.to_le_bytes());
        out[4..8].copy_from_slice(&self.data.unwrap_or(0).to_le_bytes());
        out[8..16].copy_from_slice(&self.tag.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out[24..28].copy_from_slice(&self.rndv_id.to_le_bytes());
        out[28..32].copy_from_slice(&self.key.to_le_bytes());
        out[32..40].copy_from_slice(&self.addr.to_le_bytes());
    }

    /// Reads the header of a received message of `bytes` (header and, for
    /// EAGER, payload).
    pub fn parse(bytes: &[u8]) -> Result<Header, WireError> {
        if bytes.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        let kind = match bytes[0] {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Fin,
            other => return Err(WireError::UnknownKind(other)),
        };
        let flags = bytes[1];
        let header = Header {
            kind,
            tagged: flags & FLAG_TAGGED != 0,
            data: (flags & FLAG_DATA != 0).then(|| u32_at(4)),
            status: u16_at(2),
            tag: u64_at(8),
            len: u64_at(16),
            rndv_id: u32_at(24),
            key: u32_at(28),
            addr: u64_at(32),
        };
        if kind == Kind::Eager && header.len != (bytes.len() - HEADER_LEN) as u64 {
            return Err(WireError::Truncated);
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTS as it appears on the wire.
    const RTS: [u8; HEADER_LEN] = [
        0x02, 0x03, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12, // kind, flags, status, data
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // tag
        0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, // len = 1 MiB
        0x2a, 0x00, 0x00, 0x00, 0xef, 0xbe, 0xad, 0xde, // rndv id 42, key
        0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, // addr
    ];

    fn rts() -> Header {
        Header {
            kind: Kind::Rts,
            tagged: true,
            data: Some(0x1234_5678),
            tag: 0x0102_0304_0506_0708,
            len: 1 << 20,
            rndv_id: 42,
            key: 0xdead_beef,
            addr: 0x7f00_0000_1000,
            status: 0,
        }
    }

    #[test]
    fn rts_emits_the_golden_bytes() {
        let mut out = [0xa5u8; HEADER_LEN];
        rts().emit(&mut out);
        assert_eq!(out, RTS);
    }

    #[test]
    fn rts_parses_from_the_golden_bytes() {
        assert_eq!(Header::parse(&RTS), Ok(rts()));
    }

    #[test]
    fn eager_length_must_match_the_payload() {
        let mut h = Header::new(Kind::Eager);
        h.len = 3;
        let mut bytes = vec![0u8; HEADER_LEN + 3];
        h.emit(&mut bytes);
        assert_eq!(Header::parse(&bytes), Ok(h));
        assert_eq!(
            Header::parse(&bytes[..HEADER_LEN + 2]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn short_or_unknown_messages_are_refused() {
        assert_eq!(Header::parse(&[1; 10]), Err(WireError::Truncated));
        let mut bytes = RTS;
        bytes[0] = 9;
        assert_eq!(Header::parse(&bytes), Err(WireError::UnknownKind(9)));
    }
}
