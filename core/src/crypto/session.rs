//! One protected connection's cipher state (spec 5.3.4, 5.3.5): the key
//! schedules of both directions, the sender's IV counter and the
//! receiver's replay window.

use aes_gcm::aead::inout::InOutBuf;
use aes_gcm::aead::AeadInOut;
use aes_gcm::{Aes256Gcm, KeyInit};

use super::kdf::{DirectionKeys, KeyMaterial, SALT_LEN};
use super::replay::{Replay, ReplayWindow};
use crate::wire::protect::{Sealed, SecurityRepr, SECURITY_LEN, TAG_LEN};

/// IVs a sender may use under one key: 1 to 2^38 − 1. With payloads of
/// at most 9000 bytes (566 AES blocks with the counter block) that keeps
/// the blocks under one key below 2^48, where AES-GCM's confidentiality
/// bound (sigma^2 / 2^129) is 2^-33. v0.1 has no key update: a sender
/// that reaches the limit stops sending and the connection fails by its
/// retransmission limit.
pub const IV_LIMIT: u64 = 1 << 38;

/// Which end of the connection this is: it picks which derived key seals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Role {
    /// Sent the CONNECT.
    Initiator,
    /// Sent the ACCEPT.
    Acceptor,
}

/// Why a protected packet was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum OpenError {
    /// Its Key ID is not the connection's.
    WrongKeyId,
    /// Replayed or older than the replay window.
    Replay(Replay),
    /// The tag does not authenticate it.
    Auth,
    /// The output buffer is smaller than the payload.
    Oversized,
    /// Its IV is outside 1 to 2^38 - 1, the range a sender may use (5.3.4):
    /// refused before the replay window or the cipher sees it.
    IvOutOfRange,
}

/// The 96-bit AES-GCM nonce: the direction's 4-byte salt, then the IV
/// big-endian (spec 5.3.4; RFC 4106's construction).
pub fn nonce(salt: &[u8; SALT_LEN], iv: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..SALT_LEN].copy_from_slice(salt);
    n[SALT_LEN..].copy_from_slice(&iv.to_be_bytes());
    n
}

fn cipher(keys: &DirectionKeys) -> Aes256Gcm {
    Aes256Gcm::new(&keys.key.into())
}

/// A protected connection's cipher state.
#[derive(Clone)]
pub struct Session {
    key_id: u32,
    seal: Aes256Gcm,
    seal_salt: [u8; SALT_LEN],
    /// The IV of the next packet sent.
    next_iv: u64,
    open: Aes256Gcm,
    open_salt: [u8; SALT_LEN],
    replay: ReplayWindow,
}

impl core::fmt::Debug for Session {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Session")
            .field("key_id", &self.key_id)
            .field("next_iv", &self.next_iv)
            .field("highest_iv_received", &self.replay.highest())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// The state of the `role` end, from the connection's keys.
    pub fn new(key_id: u32, keys: &KeyMaterial, role: Role) -> Session {
        let (tx, rx) = match role {
            Role::Initiator => (&keys.initiator_to_acceptor, &keys.acceptor_to_initiator),
            Role::Acceptor => (&keys.acceptor_to_initiator, &keys.initiator_to_acceptor),
        };
        Session {
            key_id,
            seal: cipher(tx),
            seal_salt: tx.salt,
            next_iv: 1,
            open: cipher(rx),
            open_salt: rx.salt,
            replay: ReplayWindow::NEW,
        }
    }

    /// Replaces the key packets are opened with, keeping the sealing key
    /// and its IV counter: an early initiator learns the
    /// acceptor-to-initiator key from the ACCEPT, after it sealed its
    /// first flight (spec 5.3.3).
    pub fn set_open_key(&mut self, rx: &DirectionKeys) {
        self.open = cipher(rx);
        self.open_salt = rx.salt;
        self.replay = ReplayWindow::NEW;
    }

    /// The connection's Key ID.
    pub fn key_id(&self) -> u32 {
        self.key_id
    }

    /// Takes the IV of the next packet; `None` once [`IV_LIMIT`] is reached.
    pub fn next_iv(&mut self) -> Option<u64> {
        let iv = self.next_iv;
        if iv >= IV_LIMIT {
            return None;
        }
        self.next_iv += 1;
        Some(iv)
    }

    /// Encrypts a packet in place and writes its tag. `packet` holds the
    /// associated data (`aad_len` bytes, ending with the security
    /// extension that carries the IV), `payload_len` bytes of plaintext,
    /// then at least [`TAG_LEN`] bytes for the tag. Returns `false` (and
    /// writes nothing) when the lengths do not fit.
    pub fn seal(&self, packet: &mut [u8], aad_len: usize, payload_len: usize) -> bool {
        let end = aad_len + payload_len;
        if aad_len < SECURITY_LEN || packet.len() < end + TAG_LEN {
            return false;
        }
        let Ok(security) = SecurityRepr::parse(&packet[aad_len - SECURITY_LEN..aad_len]) else {
            return false;
        };
        let nonce = nonce(&self.seal_salt, security.iv);
        let (aad, rest) = packet.split_at_mut(aad_len);
        let (payload, rest) = rest.split_at_mut(payload_len);
        match self
            .seal
            .encrypt_inout_detached(&nonce.into(), aad, InOutBuf::from(payload))
        {
            Ok(tag) => {
                rest[..TAG_LEN].copy_from_slice(&tag);
                true
            }
            Err(_) => false,
        }
    }

    /// Authenticates a received packet and decrypts its payload into
    /// `out[..len]`, checking the Key ID and the replay window first;
    /// the window moves only for a packet that authenticated.
    pub fn open(&mut self, sealed: &Sealed<'_>, out: &mut [u8]) -> Result<(), OpenError> {
        if sealed.security.key_id != self.key_id {
            return Err(OpenError::WrongKeyId);
        }
        let iv = sealed.security.iv;
        if iv == 0 || iv >= IV_LIMIT {
            return Err(OpenError::IvOutOfRange);
        }
        self.replay.check(iv).map_err(OpenError::Replay)?;
        let len = sealed.ciphertext.len();
        let Some(out) = out.get_mut(..len) else {
            return Err(OpenError::Oversized);
        };
        let nonce = nonce(&self.open_salt, iv);
        let buf = InOutBuf::new(sealed.ciphertext, out).map_err(|_| OpenError::Oversized)?;
        self.open
            .decrypt_inout_detached(&nonce.into(), sealed.aad, buf, &(*sealed.tag).into())
            .map_err(|_| OpenError::Auth)?;
        self.replay.accept(iv);
        Ok(())
    }
}
