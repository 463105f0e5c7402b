//! Fuzzing of packet protection's open path (spec 5.3.5): the receive
//! side of a protected connection as the endpoint runs it for every
//! protected packet (`Sealed::split`, then `Session::open` with its Key ID
//! check, replay window and AES-256-GCM tag), fed what a sender sealed,
//! re-delivered, reordered, tampered with, truncated, or noise.
//!
//! What must hold whatever the input: nothing panics; every packet is
//! either opened or refused and counted under one reason (the reasons the
//! endpoint counts in `ProtectionStats`); a packet with any authenticated
//! byte changed, cut short of its tag, or made up never opens; a replay
//! never opens (`Replay`); a valid packet opens exactly once, to the
//! plaintext sealed, whenever its IV is new and inside the replay window;
//! a refused packet leaves the output buffer as it was.
//!
//! `scenario` is shared with the cargo-fuzz target
//! (`fuzz/fuzz_targets/aead_open.rs`, which includes this file); the test
//! below runs it on a bounded, seeded set of inputs.

#![allow(dead_code)]

use std::collections::BTreeSet;

use metaroce_core::crypto::kdf::{DirectionKeys, KeyMaterial};
use metaroce_core::crypto::replay::Replay;
use metaroce_core::crypto::replay::WINDOW;
use metaroce_core::crypto::session::{OpenError, Role, Session};
use metaroce_core::wire::packet::crc32;
use metaroce_core::wire::protect::{Sealed, SecurityRepr, SECURITY_LEN, TAG_LEN};
use metaroce_core::wire::{
    Body, Flags, Header, MemoryTarget, MessageSpan, Repr, WriteRepr, CRC_LEN,
};

const KEY_ID: u32 = 0x5eed;

/// What a run did, by outcome (the receiver's counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub delivered: u64,
    pub opened: u64,
    /// Did not split (malformed) or did not authenticate.
    pub auth_failed: u64,
    pub replayed: u64,
    pub too_old: u64,
    pub wrong_key_id: u64,
    pub oversized: u64,
    pub iv_out_of_range: u64,
    /// Of the refused: tampered, truncated or noise packets.
    pub hostile_refused: u64,
}

impl Outcome {
    fn refused(&self) -> u64 {
        self.auth_failed
            + self.replayed
            + self.too_old
            + self.wrong_key_id
            + self.oversized
            + self.iv_out_of_range
    }
}

/// Reads the input as small numbers (zero when it runs out).
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.byte()) << 8 | u16::from(self.byte())
    }
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

fn keys() -> KeyMaterial {
    KeyMaterial {
        initiator_to_acceptor: DirectionKeys {
            key: [0x11; 32],
            salt: [1, 2, 3, 4],
        },
        acceptor_to_initiator: DirectionKeys {
            key: [0x22; 32],
            salt: [5, 6, 7, 8],
        },
    }
}

/// A packet the sender sealed: its bytes, IV and plaintext.
struct Sent {
    bytes: Vec<u8>,
    iv: u64,
    plaintext: Vec<u8>,
}

/// Seals a WRITE of `plaintext` with IV `iv` (the sender's next).
fn seal(sender: &Session, iv: u64, key_id: u32, psn: u32, plaintext: &[u8]) -> Vec<u8> {
    let repr = Repr {
        header: Header {
            flags: Flags::PROTECTED,
            dst_conn: 3,
            token: 0x0123_4567_89ab_cdef,
            psn,
            path: (psn % 4) as u16,
            timestamp: psn.wrapping_mul(7),
        },
        body: Body::Write(WriteRepr {
            msg: MessageSpan {
                id: psn,
                offset: 0,
                len: plaintext.len() as u32,
            },
            target: MemoryTarget {
                key: 9,
                addr: 0x1000,
            },
            imm: None,
        }),
        payload_len: plaintext.len() as u16,
    };
    let hl = repr.header_len();
    let len = hl + SECURITY_LEN + plaintext.len() + TAG_LEN + CRC_LEN;
    let mut buf = vec![0u8; len];
    repr.emit_header(&mut buf);
    SecurityRepr { key_id, iv }.emit(&mut buf[hl..]);
    let aad_len = hl + SECURITY_LEN;
    buf[aad_len..aad_len + plaintext.len()].copy_from_slice(plaintext);
    assert!(sender.seal(&mut buf, aad_len, plaintext.len()));
    let crc = crc32(&[&buf[..len - CRC_LEN]]);
    buf[len - CRC_LEN..].copy_from_slice(&crc.to_be_bytes());
    buf
}

/// The receiver: the endpoint's open path and its counting.
struct Receiver {
    session: Session,
    out: Vec<u8>,
    outcome: Outcome,
}

impl Receiver {
    /// Opens `bytes` as the endpoint does; the plaintext when it opened.
    fn deliver(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        self.outcome.delivered += 1;
        self.out.fill(0xee);
        let Some(sealed) = Sealed::split(bytes) else {
            self.outcome.auth_failed += 1;
            return None;
        };
        match self.session.open(&sealed, &mut self.out) {
            Ok(()) => {
                self.outcome.opened += 1;
                Some(self.out[..sealed.ciphertext.len()].to_vec())
            }
            Err(e) => {
                let o = &mut self.outcome;
                match e {
                    OpenError::WrongKeyId => o.wrong_key_id += 1,
                    OpenError::Replay(Replay::Duplicate) => o.replayed += 1,
                    OpenError::Replay(Replay::TooOld) => o.too_old += 1,
                    OpenError::Auth => o.auth_failed += 1,
                    OpenError::Oversized => o.oversized += 1,
                    OpenError::IvOutOfRange => o.iv_out_of_range += 1,
                }
                assert!(
                    self.out.iter().all(|&b| b == 0xee),
                    "a refused packet ({e:?}) wrote plaintext"
                );
                None
            }
        }
    }
}

/// Runs the moves `data` describes; panics if a rule breaks.
pub fn scenario(data: &[u8]) -> Outcome {
    let mut input = Input { bytes: data, at: 0 };
    let k = keys();
    let mut sender = Session::new(KEY_ID, &k, Role::Initiator);
    let mut rx = Receiver {
        session: Session::new(KEY_ID, &k, Role::Acceptor),
        // The endpoint's receive buffer: the largest payload.
        out: vec![0u8; 1200],
        outcome: Outcome::default(),
    };
    let mut sent: Vec<Sent> = Vec::new();
    // The receiver's state as the rules say it must be: IVs opened, and
    // the highest.
    let mut opened: BTreeSet<u64> = BTreeSet::new();
    let mut top = 0u64;
    let mut moves = 0u32;
    while !input.done() && moves < 2_000 {
        moves += 1;
        match input.byte() % 8 {
            0 | 1 => {
                // The sender seals its next packet (sometimes skipping
                // IVs, as lost packets do for the receiver).
                for _ in 0..input.byte() % 3 {
                    let _ = sender.next_iv();
                }
                let Some(iv) = sender.next_iv() else { continue };
                // Up to 1275 bytes: past the receive buffer at the top.
                let n = usize::from(input.byte()) * 5;
                let fill = input.byte();
                let plaintext: Vec<u8> = (0..n).map(|i| fill ^ i as u8).collect();
                let bytes = seal(&sender, iv, KEY_ID, iv as u32, &plaintext);
                sent.push(Sent {
                    bytes,
                    iv,
                    plaintext,
                });
            }
            2 | 3 => {
                // A sealed packet delivered as it was: new, a duplicate or
                // a late one.
                if sent.is_empty() {
                    continue;
                }
                let s = &sent[usize::from(input.u16()) % sent.len()];
                let fresh = !opened.contains(&s.iv);
                let in_window = s.iv.saturating_add(WINDOW) > top;
                let fits = s.plaintext.len() <= rx.out.len();
                let got = rx.deliver(&s.bytes);
                match (fresh, in_window, fits) {
                    (true, true, true) => {
                        let p = got.expect("a valid packet with a new IV in the window opens");
                        assert_eq!(p, s.plaintext, "it opens to what was sealed");
                        opened.insert(s.iv);
                        top = top.max(s.iv);
                    }
                    (false, _, _) => assert!(got.is_none(), "IV {} opened twice", s.iv),
                    _ => assert!(got.is_none(), "IV {} opened outside the rules", s.iv),
                }
            }
            4 => {
                // One authenticated byte (header, security extension,
                // ciphertext or tag) changed.
                if sent.is_empty() {
                    continue;
                }
                let s = &sent[usize::from(input.u16()) % sent.len()];
                let mut bytes = s.bytes.clone();
                let at = usize::from(input.u16()) % (bytes.len() - CRC_LEN);
                bytes[at] ^= input.byte() | 1;
                let got = rx.deliver(&bytes);
                assert!(got.is_none(), "a packet changed at byte {at} opened");
                rx.outcome.hostile_refused += 1;
            }
            5 => {
                // Cut short of its tag's end (the CRC trailer is not
                // authenticated; a cut inside it may open).
                if sent.is_empty() {
                    continue;
                }
                let s = &sent[usize::from(input.u16()) % sent.len()];
                let keep = usize::from(input.u16()) % (s.bytes.len() - CRC_LEN);
                let got = rx.deliver(&s.bytes[..keep]);
                assert!(got.is_none(), "a packet cut to {keep} bytes opened");
                rx.outcome.hostile_refused += 1;
            }
            6 => {
                // Another key: the wrong Key ID, or the right one with a
                // key the receiver does not hold.
                let other = KeyMaterial {
                    initiator_to_acceptor: DirectionKeys {
                        key: [input.byte(); 32],
                        salt: [9; 4],
                    },
                    ..keys()
                };
                let forger = Session::new(KEY_ID, &other, Role::Initiator);
                let key_id = if input.byte() & 1 == 0 {
                    KEY_ID
                } else {
                    KEY_ID + 1
                };
                let iv = top + 1 + u64::from(input.byte());
                let bytes = seal(&forger, iv, key_id, 1, b"forged");
                let got = rx.deliver(&bytes);
                assert!(got.is_none(), "a packet of another key opened");
                rx.outcome.hostile_refused += 1;
            }
            _ => {
                // Noise.
                let n = usize::from(input.byte()) + usize::from(input.byte());
                let bytes: Vec<u8> = (0..n).map(|_| input.byte()).collect();
                let got = rx.deliver(&bytes);
                assert!(got.is_none(), "noise opened");
                rx.outcome.hostile_refused += 1;
            }
        }
        let o = rx.outcome;
        assert_eq!(
            o.delivered,
            o.opened + o.refused(),
            "every packet counted once"
        );
        assert_eq!(o.opened, opened.len() as u64, "each IV opened at most once");
    }
    rx.outcome
}

/// SplitMix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn the_open_path_refuses_and_counts_everything_but_valid_packets_once() {
    let mut total = Outcome::default();
    for seed in 0..200u64 {
        let mut s = seed;
        let len = 300 + (seed as usize % 7) * 200;
        let data: Vec<u8> = (0..len).map(|_| next(&mut s) as u8).collect();
        let o = scenario(&data);
        total.delivered += o.delivered;
        total.opened += o.opened;
        total.auth_failed += o.auth_failed;
        total.replayed += o.replayed;
        total.too_old += o.too_old;
        total.wrong_key_id += o.wrong_key_id;
        total.oversized += o.oversized;
        total.iv_out_of_range += o.iv_out_of_range;
        total.hostile_refused += o.hostile_refused;
    }
    eprintln!("{total:?}");
    // Every path is reached.
    assert!(total.opened > 100, "{total:?}");
    assert!(total.replayed > 10, "{total:?}");
    assert!(total.auth_failed > 100, "{total:?}");
    assert!(total.wrong_key_id > 10, "{total:?}");
    assert!(total.oversized > 0, "{total:?}");
    assert!(total.hostile_refused > 100, "{total:?}");
}

#[test]
fn packets_older_than_the_replay_window_are_refused() {
    // Seal an old IV, skip past the window, open the newest: the old one
    // is then too old, and the newest a replay.
    let k = keys();
    let mut sender = Session::new(KEY_ID, &k, Role::Initiator);
    let mut rx = Receiver {
        session: Session::new(KEY_ID, &k, Role::Acceptor),
        out: vec![0u8; 1200],
        outcome: Outcome::default(),
    };
    let old_iv = sender.next_iv().unwrap();
    let old = seal(&sender, old_iv, KEY_ID, 1, b"old");
    let mut iv = old_iv;
    while iv < old_iv + WINDOW + 1 {
        iv = sender.next_iv().unwrap();
    }
    let new = seal(&sender, iv, KEY_ID, 2, b"new");
    assert_eq!(rx.deliver(&new).as_deref(), Some(&b"new"[..]));
    assert!(rx.deliver(&old).is_none());
    assert_eq!(rx.outcome.too_old, 1);
    assert!(rx.deliver(&new).is_none());
    assert_eq!(rx.outcome.replayed, 1);
}
