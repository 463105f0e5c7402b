//! The wire messages of the serve protocol (spec appendix B.1): five
//! fixed-layout SENDs of at most [`CONTROL_LEN`] bytes, little-endian.

use core::ops::Deref;

/// Slots per connection region. More than the send queue depth, so a slot
/// is never rewritten before the server has verified it.
pub const SLOTS: u32 = 64;
/// Size of the receive buffers both sides post for these messages.
pub const CONTROL_LEN: u32 = 64;
/// Largest message size the server accepts.
pub const MAX_MESSAGE: u32 = 4 << 20;

/// What the client will do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Write,
    Read,
}

/// The application messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    Announce {
        op: Operation,
        seed: u64,
        size: u32,
    },
    /// `ro_*`: a second, small region peers may only READ (pre-filled with
    /// `pattern(seed, READ_ONLY_INDEX)`), for permission checks.
    Region {
        status: u32,
        key: u32,
        addr: u64,
        len: u64,
        slots: u32,
        ro_key: u32,
        ro_addr: u64,
        /// Capability that lets another connection `JOIN` this region (0:
        /// none).
        ticket: u64,
    },
    /// Asks for keys, on this connection, of the region `ticket` names.
    Join {
        ticket: u64,
    },
    Done {
        messages: u64,
        bytes: u64,
    },
    Report {
        verified: u64,
        corrupt: u64,
        bytes: u64,
    },
}

const ANNOUNCE: &[u8; 4] = b"MRAN";
const REGION: &[u8; 4] = b"MRRG";
const DONE: &[u8; 4] = b"MRDN";
const REPORT: &[u8; 4] = b"MRRP";
const JOIN: &[u8; 4] = b"MRJN";

/// Pattern index of the read-only region's contents.
pub const READ_ONLY_INDEX: u64 = u64::MAX;
/// Length of the read-only region.
pub const READ_ONLY_LEN: u32 = 4096;

/// Region status: accepted.
pub const REGION_OK: u32 = 0;
/// Region status: message size out of range.
pub const REGION_BAD_SIZE: u32 = 1;
/// Region status: the `JOIN` ticket names no region.
pub const REGION_NO_TICKET: u32 = 2;
/// Region status: over this peer's or the server's budget (regions,
/// memory or connections).
pub const REGION_OVER_BUDGET: u32 = 3;

impl Message {
    /// The `REGION` answer refusing an announcement with `status`.
    pub fn region_refused(status: u32) -> Message {
        Message::Region {
            status,
            key: 0,
            addr: 0,
            len: 0,
            slots: 0,
            ro_key: 0,
            ro_addr: 0,
            ticket: 0,
        }
    }

    /// Encodes into at most [`CONTROL_LEN`] bytes.
    pub fn encode(&self) -> Encoded {
        let mut v = Encoded {
            bytes: [0; CONTROL_LEN as usize],
            len: 0,
        };
        match *self {
            Message::Announce { op, seed, size } => {
                v.extend_from_slice(ANNOUNCE);
                v.push(match op {
                    Operation::Write => 1,
                    Operation::Read => 2,
                });
                v.extend_from_slice(&[0; 3]);
                v.extend_from_slice(&seed.to_le_bytes());
                v.extend_from_slice(&size.to_le_bytes());
            }
            Message::Region {
                status,
                key,
                addr,
                len,
                slots,
                ro_key,
                ro_addr,
                ticket,
            } => {
                v.extend_from_slice(REGION);
                v.extend_from_slice(&status.to_le_bytes());
                v.extend_from_slice(&key.to_le_bytes());
                v.extend_from_slice(&addr.to_le_bytes());
                v.extend_from_slice(&len.to_le_bytes());
                v.extend_from_slice(&slots.to_le_bytes());
                v.extend_from_slice(&ro_key.to_le_bytes());
                v.extend_from_slice(&ro_addr.to_le_bytes());
                v.extend_from_slice(&ticket.to_le_bytes());
            }
            Message::Join { ticket } => {
                v.extend_from_slice(JOIN);
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&ticket.to_le_bytes());
            }
            Message::Done { messages, bytes } => {
                v.extend_from_slice(DONE);
                v.extend_from_slice(&messages.to_le_bytes());
                v.extend_from_slice(&bytes.to_le_bytes());
            }
            Message::Report {
                verified,
                corrupt,
                bytes,
            } => {
                v.extend_from_slice(REPORT);
                v.extend_from_slice(&verified.to_le_bytes());
                v.extend_from_slice(&corrupt.to_le_bytes());
                v.extend_from_slice(&bytes.to_le_bytes());
            }
        }
        v
    }

    /// Decodes; `None` for anything malformed.
    pub fn decode(b: &[u8]) -> Option<Message> {
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let magic: &[u8] = b.get(..4)?;
        if magic == ANNOUNCE {
            let op = match b.get(4)? {
                1 => Operation::Write,
                2 => Operation::Read,
                _ => return None,
            };
            Some(Message::Announce {
                op,
                seed: u64_at(8)?,
                size: u32_at(16)?,
            })
        } else if magic == REGION {
            Some(Message::Region {
                status: u32_at(4)?,
                key: u32_at(8)?,
                addr: u64_at(12)?,
                len: u64_at(20)?,
                slots: u32_at(28)?,
                ro_key: u32_at(32)?,
                ro_addr: u64_at(36)?,
                ticket: u64_at(44)?,
            })
        } else if magic == JOIN {
            Some(Message::Join { ticket: u64_at(8)? })
        } else if magic == DONE {
            Some(Message::Done {
                messages: u64_at(4)?,
                bytes: u64_at(12)?,
            })
        } else if magic == REPORT {
            Some(Message::Report {
                verified: u64_at(4)?,
                corrupt: u64_at(12)?,
                bytes: u64_at(20)?,
            })
        } else {
            None
        }
    }
}

/// An encoded message: at most [`CONTROL_LEN`] bytes, used as a `&[u8]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    bytes: [u8; CONTROL_LEN as usize],
    len: usize,
}

impl Encoded {
    fn push(&mut self, b: u8) {
        self.extend_from_slice(&[b]);
    }

    fn extend_from_slice(&mut self, more: &[u8]) {
        // Every message is well under CONTROL_LEN; the bound keeps the
        // copy panic-free regardless.
        let end = (self.len + more.len()).min(self.bytes.len());
        let n = end - self.len;
        self.bytes[self.len..end].copy_from_slice(&more[..n]);
        self.len = end;
    }
}

impl Deref for Encoded {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl AsRef<[u8]> for Encoded {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_roundtrip() {
        let all = [
            Message::Announce {
                op: Operation::Read,
                seed: 7,
                size: 4096,
            },
            Message::Region {
                status: 0,
                key: 9,
                addr: 1 << 32,
                len: 1 << 20,
                slots: 64,
                ro_key: 3,
                ro_addr: 5 << 32,
                ticket: 0xfeed_beef_0123_4567,
            },
            Message::Join {
                ticket: 0xfeed_beef_0123_4567,
            },
            Message::Done {
                messages: 3,
                bytes: 4,
            },
            Message::Report {
                verified: 1,
                corrupt: 2,
                bytes: 3,
            },
        ];
        for m in all {
            let e = m.encode();
            assert!(e.len() <= CONTROL_LEN as usize);
            assert_eq!(Message::decode(&e), Some(m));
        }
        assert_eq!(Message::decode(b"MRAN"), None);
        assert_eq!(Message::decode(b"xxxxxxxxxxxxxxxxxxxxxxxx"), None);
    }

    /// The layouts of spec appendix B.1, byte for byte.
    #[test]
    fn layouts_are_those_of_appendix_b() {
        let a = Message::Announce {
            op: Operation::Read,
            seed: 0x0102_0304_0506_0708,
            size: 0x0a0b_0c0d,
        }
        .encode();
        assert_eq!(a.len(), 20);
        assert_eq!(&a[..8], b"MRAN\x02\0\0\0");
        assert_eq!(a[8..16], 0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(a[16..20], 0x0a0b_0c0du32.to_le_bytes());
        let r = Message::Region {
            status: 3,
            key: 4,
            addr: 5,
            len: 6,
            slots: 7,
            ro_key: 8,
            ro_addr: 9,
            ticket: 10,
        }
        .encode();
        assert_eq!(r.len(), 52);
        let at = |o: usize, n: usize| {
            r[o..o + n]
                .iter()
                .rev()
                .fold(0u64, |v, &b| v << 8 | u64::from(b))
        };
        let fields = [
            (4, 4, 3),
            (8, 4, 4),
            (12, 8, 5),
            (20, 8, 6),
            (28, 4, 7),
            (32, 4, 8),
            (36, 8, 9),
            (44, 8, 10),
        ];
        for (offset, len, value) in fields {
            assert_eq!(at(offset, len), value, "REGION field at {offset}");
        }
        assert_eq!(Message::Join { ticket: 1 }.encode().len(), 16);
        assert_eq!(
            Message::Done {
                messages: 1,
                bytes: 2
            }
            .encode()
            .len(),
            20
        );
        let rep = Message::Report {
            verified: 1,
            corrupt: 2,
            bytes: 3,
        }
        .encode();
        assert_eq!((rep.len(), rep[12], rep[20]), (28, 2, 3));
    }
}
