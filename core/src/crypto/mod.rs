//! Packet protection (spec 5.3): optional authenticated encryption per
//! connection, in the manner of Google's PSP.
//!
//! A connection is protected when its CONNECT asks for a suite with a Key
//! ID naming a pre-shared key both ends hold, and the ACCEPT agrees. Both
//! ends then derive the connection's keys ([`kdf`]): HKDF-SHA256 of the
//! pre-shared key, salted with the CONNECT and ACCEPT fields, one key and
//! nonce salt per direction. From then on every packet of the connection
//! (data, READ_REQUEST, ACK, NAK, CLOSE, KEEPALIVE) carries the PROTECTED
//! flag, a security extension with the Key ID and a 64-bit IV, its payload
//! encrypted with AES-256-GCM and a 16-byte tag over every header byte and
//! the payload ([`crate::wire::protect`]). A receiver drops, and counts by
//! reason, every packet of a protected connection that does not
//! authenticate, is replayed ([`replay`]) or comes unprotected.
//!
//! The key schedules (about 2 KiB a connection) do not live in the
//! connection table: protected connections take a slot of the endpoint's
//! key pool ([`KeyPool`], sized by `Layout::key_slots`), so an idle
//! unprotected connection costs no more than before.
//!
//! The cipher itself is behind the `aead` feature (RustCrypto's `aes-gcm`,
//! `hkdf`, `sha2`), off in firmware whose code budget it would break;
//! without it the endpoint negotiates no protection and refuses
//! connections that require it.

#[cfg(feature = "aead")]
pub mod early;
#[cfg(feature = "aead")]
pub mod kdf;
mod pool;
pub mod replay;
#[cfg(feature = "aead")]
pub mod session;

pub(crate) use pool::Admit;
pub use pool::{KeyPool, KeySlot, Scratch};
#[cfg(feature = "aead")]
pub use session::Session;

use crate::wire::CipherSuite;

/// Whether the cipher is compiled in (feature `aead`).
pub const SUPPORTED: bool = cfg!(feature = "aead");

/// Length of a pre-shared key.
pub const PSK_LEN: usize = 32;
/// Pre-shared keys an endpoint holds at most.
pub const MAX_PSKS: usize = 8;

/// Whether an endpoint protects its connections (spec 5.3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Policy {
    /// Never: CONNECTs offer no suite; an acceptor answers every offer
    /// with NONE.
    #[default]
    Off,
    /// When the peer agrees: an initiator offers AES_256_GCM with its Key
    /// ID and takes an unprotected ACCEPT too; an acceptor protects when
    /// asked with a key it holds. Open to downgrade by an on-path
    /// attacker: use `Require` where protection matters.
    Allow,
    /// Always: an initiator refuses an unprotected ACCEPT, an acceptor
    /// refuses (CLOSE REJECTED) a CONNECT without a suite.
    Require,
}

/// Packet protection settings of an endpoint (part of `Config`; the
/// keys themselves are installed with `Endpoint::add_psk`, never copied
/// with the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ProtectionConfig {
    pub policy: Policy,
    /// The Key ID an initiator offers (a key installed with that id).
    pub key_id: u32,
}

/// Why a handshake was refused for protection's sake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Refusal {
    /// The policy requires protection and the peer offered none (or chose
    /// none: a downgrade).
    ProtectionRequired,
    /// The Key ID names no installed pre-shared key.
    UnknownKeyId,
    /// Every slot of the key pool is in use.
    NoKeySlot,
    /// The suite is not compiled in (feature `aead` off) or not defined.
    Unsupported,
    /// The ACCEPT chose a suite or Key ID the CONNECT did not offer.
    Mismatch,
}

/// Endpoint-wide counters of packet protection (spec 4.13, 5.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ProtectionStats {
    /// Packets sealed and packets opened.
    pub sealed: u64,
    pub opened: u64,
    /// Protected packets whose tag did not authenticate them: forged,
    /// tampered with, or keyed differently (a CONNECT or ACCEPT changed on
    /// the way).
    pub auth_failed: u64,
    /// Protected packets whose IV was seen before (replays, duplicates).
    pub replayed: u64,
    /// Protected packets older than the replay window.
    pub too_old: u64,
    /// Packets of a protected connection that came unprotected.
    pub unprotected: u64,
    /// Protected packets for a connection without keys.
    pub unexpected_protected: u64,
    /// Protected packets whose Key ID is not the connection's.
    pub wrong_key_id: u64,
    /// Protected packets longer than the receive buffer (the largest MTU).
    pub oversized: u64,
    /// Protected packets whose IV no sender may use (0, or 2^38 and up).
    pub iv_out_of_range: u64,
    /// Handshakes refused, by reason.
    pub refused_required: u64,
    pub refused_unknown_key: u64,
    pub refused_no_key_slot: u64,
    pub refused_unsupported: u64,
    pub refused_mismatch: u64,
    /// Packets not sent: the IV space of the key ran out.
    pub iv_exhausted: u64,
}

impl ProtectionStats {
    /// Every counter with its name, for summaries and telemetry export.
    pub fn by_reason(&self) -> [(&'static str, u64); 16] {
        [
            ("sealed", self.sealed),
            ("opened", self.opened),
            ("auth_failed", self.auth_failed),
            ("replayed", self.replayed),
            ("too_old", self.too_old),
            ("unprotected", self.unprotected),
            ("unexpected_protected", self.unexpected_protected),
            ("wrong_key_id", self.wrong_key_id),
            ("oversized", self.oversized),
            ("iv_out_of_range", self.iv_out_of_range),
            ("refused_required", self.refused_required),
            ("refused_unknown_key", self.refused_unknown_key),
            ("refused_no_key_slot", self.refused_no_key_slot),
            ("refused_unsupported", self.refused_unsupported),
            ("refused_mismatch", self.refused_mismatch),
            ("iv_exhausted", self.iv_exhausted),
        ]
    }

    /// Received packets dropped by protection, all reasons.
    pub fn dropped(&self) -> u64 {
        self.auth_failed
            + self.replayed
            + self.too_old
            + self.unprotected
            + self.unexpected_protected
            + self.wrong_key_id
            + self.oversized
            + self.iv_out_of_range
    }

    /// Handshakes refused, all reasons.
    pub fn refused(&self) -> u64 {
        self.refused_required
            + self.refused_unknown_key
            + self.refused_no_key_slot
            + self.refused_unsupported
            + self.refused_mismatch
    }

    pub(crate) fn count_refusal(&mut self, r: Refusal) {
        match r {
            Refusal::ProtectionRequired => self.refused_required += 1,
            Refusal::UnknownKeyId => self.refused_unknown_key += 1,
            Refusal::NoKeySlot => self.refused_no_key_slot += 1,
            Refusal::Unsupported => self.refused_unsupported += 1,
            Refusal::Mismatch => self.refused_mismatch += 1,
        }
    }
}

/// What a connection knows of its protection: 8 bytes in the connection
/// table; the keys are in the pool slot it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnProtection {
    /// Slot of the key pool (reserved by an initiator until the ACCEPT,
    /// holding the keys after it); none on an unprotected connection.
    pub(crate) slot: crate::storage::list::OptIndex,
    /// The connection's Key ID; 0 when unprotected.
    pub(crate) key_id: u32,
}

impl ConnProtection {
    /// Unprotected.
    pub const NONE: ConnProtection = ConnProtection {
        slot: crate::storage::list::OptIndex::NONE,
        key_id: 0,
    };

    /// The suite on the wire for this connection (offered or chosen).
    pub fn suite(&self) -> CipherSuite {
        if self.key_id == 0 {
            CipherSuite::None
        } else {
            CipherSuite::Aes256Gcm
        }
    }

    /// The Key ID on the wire (0 when unprotected).
    pub fn key_id(&self) -> u32 {
        self.key_id
    }
}

/// The pre-shared keys an endpoint holds, by Key ID. Wiped when dropped
/// or replaced.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: heapless::Vec<(u32, [u8; PSK_LEN]), MAX_PSKS>,
}

impl core::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|(id, _)| id))
            .finish()
    }
}

/// Why a pre-shared key was not installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum KeyringError {
    /// Key ID 0 means "no key" on the wire.
    ZeroKeyId,
    /// [`MAX_PSKS`] keys are installed already.
    Full,
}

impl Keyring {
    /// Installs `key` under `key_id`, replacing a key with the same id.
    pub fn insert(&mut self, key_id: u32, key: &[u8; PSK_LEN]) -> Result<(), KeyringError> {
        if key_id == 0 {
            return Err(KeyringError::ZeroKeyId);
        }
        if let Some(e) = self.keys.iter_mut().find(|(id, _)| *id == key_id) {
            e.1 = *key;
            return Ok(());
        }
        self.keys
            .push((key_id, *key))
            .map_err(|_| KeyringError::Full)
    }

    /// Removes the key `key_id` (connections keyed from it keep their
    /// derived keys); whether it was there.
    pub fn remove(&mut self, key_id: u32) -> bool {
        let Some(i) = self.keys.iter().position(|(id, _)| *id == key_id) else {
            return false;
        };
        self.keys[i].1.fill(0);
        self.keys.swap_remove(i);
        true
    }

    /// The key with `key_id`.
    pub fn get(&self, key_id: u32) -> Option<&[u8; PSK_LEN]> {
        self.keys
            .iter()
            .find(|(id, _)| *id == key_id && key_id != 0)
            .map(|(_, k)| k)
    }

    /// Installed Key IDs.
    pub fn key_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.keys.iter().map(|(id, _)| *id)
    }
}

impl Drop for Keyring {
    fn drop(&mut self) {
        for (_, k) in self.keys.iter_mut() {
            #[cfg(feature = "aead")]
            zeroize::Zeroize::zeroize(k);
            #[cfg(not(feature = "aead"))]
            k.fill(0);
        }
    }
}

/// What an acceptor answers to a CONNECT's offer (spec 5.3.6): the Key
/// ID to protect with (0: none), or a refusal.
pub fn choose(
    policy: Policy,
    keys: &Keyring,
    suite: CipherSuite,
    key_id: u32,
) -> Result<u32, Refusal> {
    match (policy, suite) {
        (Policy::Off, _) | (Policy::Allow, CipherSuite::None) => Ok(0),
        (Policy::Require, CipherSuite::None) => Err(Refusal::ProtectionRequired),
        (_, CipherSuite::Aes256Gcm) if !SUPPORTED => {
            if policy == Policy::Require {
                Err(Refusal::Unsupported)
            } else {
                Ok(0)
            }
        }
        (_, CipherSuite::Aes256Gcm) => keys
            .get(key_id)
            .map(|_| key_id)
            .ok_or(Refusal::UnknownKeyId),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptor_choices_follow_the_policy() {
        let mut keys = Keyring::default();
        keys.insert(7, &[1; PSK_LEN]).unwrap();
        let aes = CipherSuite::Aes256Gcm;
        let none = CipherSuite::None;
        assert_eq!(choose(Policy::Off, &keys, aes, 7), Ok(0));
        assert_eq!(choose(Policy::Allow, &keys, none, 0), Ok(0));
        assert_eq!(choose(Policy::Allow, &keys, aes, 7), Ok(7));
        assert_eq!(
            choose(Policy::Allow, &keys, aes, 8),
            Err(Refusal::UnknownKeyId)
        );
        assert_eq!(choose(Policy::Require, &keys, aes, 7), Ok(7));
        assert_eq!(
            choose(Policy::Require, &keys, none, 0),
            Err(Refusal::ProtectionRequired)
        );
    }

    #[test]
    fn keyring_replaces_removes_and_refuses_id_zero() {
        let mut keys = Keyring::default();
        assert_eq!(keys.insert(0, &[1; PSK_LEN]), Err(KeyringError::ZeroKeyId));
        for id in 1..=MAX_PSKS as u32 {
            keys.insert(id, &[id as u8; PSK_LEN]).unwrap();
        }
        assert_eq!(keys.insert(99, &[0; PSK_LEN]), Err(KeyringError::Full));
        keys.insert(3, &[0x33; PSK_LEN]).unwrap();
        assert_eq!(keys.get(3), Some(&[0x33; PSK_LEN]));
        assert!(keys.remove(3));
        assert!(!keys.remove(3));
        assert_eq!(keys.get(3), None);
        assert_eq!(keys.get(0), None);
        assert!(
            !std::format!("{keys:?}").contains("51"),
            "no key bytes in Debug"
        );
    }
}
