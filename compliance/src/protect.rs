//! Packet protection in the suite (spec 5.3): the peer's keys (a
//! pre-shared key given with `--psk-file`), sealing what it sends and
//! opening what it receives on a protected connection, and the cases that
//! need them. They run only when the suite has the target's key.

use std::cell::Cell;

use metaroce_core::crypto::kdf::{self, PSK_LEN};
use metaroce_core::crypto::session::{Role, Session};
use metaroce_core::wire::packet::Packet;
use metaroce_core::wire::protect::{Sealed, SecurityRepr, SECURITY_LEN, TAG_LEN};
use metaroce_core::wire::{self, CipherSuite, ConnectRepr, Flags, MemoryTarget, CRC_LEN};

use crate::cases::{Case, Ctx};
use crate::peer::{Fail, Peer, Rx};

/// A peer's protection: the key it offers and, once the ACCEPT chose it,
/// the connection's keys.
#[derive(Debug)]
pub struct PeerKeys {
    pub key_id: u32,
    psk: [u8; PSK_LEN],
    session: Option<Session>,
    next_iv: Cell<u64>,
    /// Protected packets that did not open (wrong tag, replay).
    pub rejected: u32,
    /// 0-RTT (spec 4.2.4, 5.3.3): the early initiator-to-acceptor key
    /// this peer seals with since its early CONNECT.
    early: Option<kdf::DirectionKeys>,
    /// Whether the ACCEPT keyed the target's direction: until then a
    /// protected packet cannot open yet.
    opening_keyed: bool,
    /// Protected packets that arrived before the ACCEPT was taken (the
    /// target's answer to an early packet can arrive in the same receive
    /// burst as the ACCEPT), opened once it is, as an initiator that takes
    /// its packets in order does.
    held: Vec<Vec<u8>>,
}

/// Protected packets held for the ACCEPT's keys at most.
const HELD_BEFORE_ACCEPT: usize = 16;

impl PeerKeys {
    pub fn new(key_id: u32, psk: [u8; PSK_LEN]) -> PeerKeys {
        PeerKeys {
            key_id,
            psk,
            session: None,
            next_iv: Cell::new(1),
            rejected: 0,
            early: None,
            opening_keyed: false,
            held: Vec::new(),
        }
    }

    /// The job key (spec 4.2.4: early proofs are made with it).
    pub fn psk(&self) -> &[u8; PSK_LEN] {
        &self.psk
    }

    /// 0-RTT (spec 4.2.4, 5.3.3): keyed for sending from the early
    /// CONNECT `connect` on, with the early key; nothing opens until the
    /// ACCEPT (its opening key is one no acceptor seals with).
    pub fn start_early(&mut self, connect: &ConnectRepr) {
        let early = metaroce_core::crypto::early::early_keys(&self.psk, connect);
        let mut unused = early.clone();
        unused.key.iter_mut().for_each(|b| *b = !*b);
        let keys = kdf::KeyMaterial {
            initiator_to_acceptor: early.clone(),
            acceptor_to_initiator: unused,
        };
        self.session = Some(Session::new(self.key_id, &keys, Role::Initiator));
        self.early = Some(early);
    }

    /// The early CONNECT drew a RETRY: the early key is dropped, the
    /// connection's keys will be the transcript's (spec 4.2.4 step 5).
    pub fn drop_early(&mut self) {
        self.session = None;
        self.early = None;
        self.opening_keyed = false;
        self.next_iv.set(1);
    }

    /// Whether the connection is keyed.
    pub fn keyed(&self) -> bool {
        self.session.is_some()
    }

    /// The initiator's keys from the CONNECT it sent and the ACCEPT.
    pub fn on_accept(&mut self, connect: &ConnectRepr, accept: &ConnectRepr) {
        if accept.suite == CipherSuite::Aes256Gcm && accept.key_id == self.key_id {
            let mut keys = kdf::derive(&self.psk, &kdf::transcript(connect, accept));
            // An early connection goes on sealing with its early key, and
            // its IV counter goes on (spec 5.3.3, 5.3.4).
            if let Some(early) = &self.early {
                keys.initiator_to_acceptor = early.clone();
            }
            self.session = Some(Session::new(self.key_id, &keys, Role::Initiator));
            self.opening_keyed = true;
        }
    }

    /// The protected packets that arrived before the ACCEPT keyed the
    /// connection, in arrival order, to be opened now.
    pub fn take_held(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.held)
    }

    /// `bytes` protected with the next IV when the connection is keyed and
    /// the packet is of a type that takes protection (spec 5.3.4); else as
    /// they are.
    pub fn seal(&self, bytes: &[u8]) -> Vec<u8> {
        let Some(session) = &self.session else {
            return bytes.to_vec();
        };
        let Ok(p) = Packet::new_checked(bytes) else {
            return bytes.to_vec();
        };
        if p.is_protected() || !p.packet_type().allows_protection() {
            return bytes.to_vec();
        }
        let hl = p.header_bytes().len();
        let payload = p.payload();
        let iv = self.next_iv.get();
        self.next_iv.set(iv + 1);
        let mut out = Vec::with_capacity(bytes.len() + SECURITY_LEN + TAG_LEN);
        out.extend_from_slice(&bytes[..hl]);
        let flags = u16::from_be_bytes([out[2], out[3]]) | Flags::PROTECTED.0;
        out[2..4].copy_from_slice(&flags.to_be_bytes());
        let mut sec = [0u8; SECURITY_LEN];
        SecurityRepr {
            key_id: self.key_id,
            iv,
        }
        .emit(&mut sec);
        out.extend_from_slice(&sec);
        out.extend_from_slice(payload);
        out.resize(out.len() + TAG_LEN + CRC_LEN, 0);
        session.seal(&mut out, hl + SECURITY_LEN, payload.len());
        let n = out.len();
        let crc = wire::packet::crc32(&[&out[..n - CRC_LEN]]);
        out[n - CRC_LEN..].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// A received packet, opened when protected: `None` when it must be
    /// dropped (protected but not opening, or unprotected on a keyed
    /// connection where that is not allowed).
    pub fn open(&mut self, bytes: &[u8]) -> Option<Rx> {
        let (repr, payload) = wire::parse(bytes).ok()?;
        let protected = repr.header.flags.contains(Flags::PROTECTED);
        if protected && !self.opening_keyed && self.held.len() < HELD_BEFORE_ACCEPT {
            self.held.push(bytes.to_vec());
            return None;
        }
        match (&mut self.session, protected) {
            (Some(session), true) => {
                let sealed = Sealed::split(bytes)?;
                let mut out = vec![0u8; sealed.ciphertext.len()];
                if session.open(&sealed, &mut out).is_err() {
                    self.rejected += 1;
                    return None;
                }
                Some(Rx { repr, payload: out })
            }
            (Some(_), false) if repr.body.packet_type().allows_protection() => {
                self.rejected += 1;
                None
            }
            (None, true) => {
                self.rejected += 1;
                None
            }
            _ => Some(Rx {
                repr,
                payload: payload.to_vec(),
            }),
        }
    }
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), Fail> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// A protected connection with a region, checked to be protected.
fn protected_victim(ctx: &mut Ctx) -> Result<(Peer, crate::peer::RemoteRegion), Fail> {
    let mut v = ctx.protected_peer()?;
    let r = v.open_with_region(0x5eed_a3ad, 4096)?;
    let a = v.accept.ok_or("no ACCEPT")?;
    ensure(
        a.suite == CipherSuite::Aes256Gcm && v.keys.as_ref().is_some_and(PeerKeys::keyed),
        || {
            format!(
                "ACCEPT chose {:?} key {}, expected AES_256_GCM",
                a.suite, a.key_id
            )
        },
    )?;
    Ok((v, r))
}

/// WRITE then READ back over a protected connection: the ACCEPT chose
/// AES_256_GCM with our Key ID, every packet both ways authenticates.
fn protected_transfer(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r) = protected_victim(ctx)?;
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
    let target = MemoryTarget {
        key: r.key,
        addr: r.addr + 1000,
    };
    let pk = v.write_packets(target, &data, None);
    for (repr, d) in &pk {
        v.send(repr, d)?;
    }
    v.wait_acked(
        pk.last().map_or(0, |p| p.0.header.psn),
        crate::cases::ACK_WAIT,
    )?;
    let back = v.read(target, data.len() as u32)?;
    let rejected = v.keys.as_ref().map_or(0, |k| k.rejected);
    v.close();
    ensure(back == data, || {
        "read back differs from what was written".into()
    })?;
    ensure(rejected == 0, || {
        format!("{rejected} of the target's packets did not authenticate")
    })
}

/// A protected WRITE changed on the way (one ciphertext bit, CRC fixed), an
/// unprotected WRITE with the right token, and a replayed protected WRITE:
/// each dropped silently, memory untouched; the intact packet is then
/// acknowledged (spec 5.3.5).
fn protected_tampered_dropped(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r) = protected_victim(ctx)?;
    let data = vec![0x5au8; 64];
    let target = MemoryTarget {
        key: r.key,
        addr: r.addr,
    };
    let pk = v.write_packets(target, &data, None);
    let (repr, d) = &pk[0];
    let plain = Peer::encode(repr, d);
    let sealed = v.keys.as_ref().ok_or("no keys")?.seal(&plain);
    // One ciphertext bit, CRC recomputed: only the tag can tell.
    let mut tampered = sealed.clone();
    let at = repr.header_len() + SECURITY_LEN + 3;
    tampered[at] ^= 0x10;
    let n = tampered.len();
    let crc = wire::packet::crc32(&[&tampered[..n - CRC_LEN]]);
    tampered[n - CRC_LEN..].copy_from_slice(&crc.to_be_bytes());
    crate::cases::expect_silence_raw(&mut v, &tampered)?;
    // The same packet unprotected, token right.
    crate::cases::expect_silence_raw(&mut v, &plain)?;
    // The intact packet: acknowledged.
    v.send_sealed(&sealed)?;
    v.wait_acked(repr.header.psn, crate::cases::ACK_WAIT)?;
    // The same bytes again: a replay, silently dropped (a retransmission
    // with a new IV would be acknowledged as a duplicate).
    crate::cases::expect_silence_raw(&mut v, &sealed)?;
    let back = v.read(target, 64)?;
    v.close();
    ensure(back == data, || {
        "region differs after the tampered packets".into()
    })
}

/// The cases that need the target's pre-shared key.
pub const PROTECTED_CASES: &[Case] = &[
    Case {
        name: "protection: protected WRITE and READ",
        section: "5.3.4, 5.3.6",
        run: protected_transfer,
        attempts: 1,
    },
    Case {
        name: "protection: tampered, clear and replayed dropped",
        section: "5.3.5",
        run: protected_tampered_dropped,
        attempts: 1,
    },
];
