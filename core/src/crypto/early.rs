//! 0-RTT with a job key (spec 4.2.4, 5.3.3): the proof a CONNECT carries
//! in its Cookie field, and the initiator-to-acceptor key of a connection
//! whose data leaves with its CONNECT.
//!
//! The proof is `Time (8 bytes: ns since the Unix epoch, big-endian) ‖ 8
//! zero bytes ‖ Tag (16)`, the tag HKDF-Expand (RFC 5869) under a key
//! extracted from the job key, over the proof's first 16 bytes, both ends'
//! addresses and ports and the offer. Only a holder of the job key can
//! make one, and it is good for one initiator address and port, one
//! acceptor address and port, one offer, and a short window around its
//! time (the acceptor also remembers the proofs it took, so none is
//! taken twice).
//!
//! An early connection's initiator-to-acceptor key derives from the
//! CONNECT alone (the initiator needs it before any ACCEPT); the
//! acceptor-to-initiator key from CONNECT and ACCEPT as for every
//! connection, so an acceptor tricked into accepting one CONNECT twice
//! never seals under one key twice.

use hkdf::Hkdf;
use sha2::Sha256;
use smoltcp::wire::IpAddress;
use zeroize::Zeroize;

use super::kdf::{DirectionKeys, KEY_LEN, SALT_LEN};
use super::PSK_LEN;
use crate::wire::{ip16, ConnectRepr, COOKIE_LEN};

/// HKDF-Extract's salt for the proof key.
pub const PROOF_SALT: &[u8] = b"MetaRoCE v2 early admission";
/// HKDF-Expand's info for an early connection's initiator-to-acceptor key.
pub const EARLY_INFO: &[u8] = b"MetaRoCE v2 early AES-256-GCM";
/// Bytes the proof's tag covers: the proof's first 16 bytes, initiator IP
/// and UDP port, acceptor IP and UDP port, CONNECT extension bytes 0..32.
pub const PROOF_MESSAGE_LEN: usize = 16 + 16 + 2 + 16 + 2 + 32;

/// Who sent a CONNECT to whom: the addresses and UDP ports a proof binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProofAddresses {
    pub initiator: IpAddress,
    /// The CONNECT's UDP source port.
    pub initiator_port: u16,
    pub acceptor: IpAddress,
    /// The CONNECT's UDP destination port.
    pub acceptor_port: u16,
}

/// The proof's time, read from a Cookie field.
pub fn proof_time(cookie: &[u8; COOKIE_LEN]) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&cookie[..8]);
    u64::from_be_bytes(t)
}

fn message(head: &[u8], at: &ProofAddresses, c: &ConnectRepr) -> [u8; PROOF_MESSAGE_LEN] {
    let mut m = [0u8; PROOF_MESSAGE_LEN];
    m[..16].copy_from_slice(&head[..16]);
    m[16..32].copy_from_slice(&ip16(&at.initiator));
    m[32..34].copy_from_slice(&at.initiator_port.to_be_bytes());
    m[34..50].copy_from_slice(&ip16(&at.acceptor));
    m[50..52].copy_from_slice(&at.acceptor_port.to_be_bytes());
    m[52..].copy_from_slice(&c.offer_bytes());
    m
}

/// The tag of a proof whose first 16 bytes are `head`.
pub fn proof_tag(
    psk: &[u8; PSK_LEN],
    head: &[u8],
    at: &ProofAddresses,
    c: &ConnectRepr,
) -> [u8; 16] {
    let hk = Hkdf::<Sha256>::new(Some(PROOF_SALT), psk);
    let mut tag = [0u8; 16];
    // 16 bytes is far below HKDF-SHA256's limit.
    let _ = hk.expand(&message(head, at, c), &mut tag);
    tag
}

/// The proof an initiator puts in its CONNECT's Cookie field, made at
/// `unix_ns` (never all zero: the tag is not).
pub fn make_proof(
    psk: &[u8; PSK_LEN],
    unix_ns: u64,
    at: &ProofAddresses,
    c: &ConnectRepr,
) -> [u8; COOKIE_LEN] {
    let mut p = [0u8; COOKIE_LEN];
    p[..8].copy_from_slice(&unix_ns.to_be_bytes());
    let tag = proof_tag(psk, &p, at, c);
    p[16..].copy_from_slice(&tag);
    p
}

/// Whether the proof in `c`'s Cookie field is one `psk` made for these
/// addresses and this offer (its time is checked by the caller). The tag
/// is compared in constant time.
pub fn proof_matches(psk: &[u8; PSK_LEN], at: &ProofAddresses, c: &ConnectRepr) -> bool {
    if c.cookie[8..16].iter().any(|&b| b != 0) {
        return false;
    }
    let tag = proof_tag(psk, &c.cookie, at, c);
    tag.iter()
        .zip(&c.cookie[16..])
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// An early connection's initiator-to-acceptor key and salt:
/// HKDF-Expand(HKDF-Extract(salt = CONNECT extension bytes 0..32, IKM =
/// job key), [`EARLY_INFO`], 36).
pub fn early_keys(psk: &[u8; PSK_LEN], connect: &ConnectRepr) -> DirectionKeys {
    let salt = connect.offer_bytes();
    let hk = Hkdf::<Sha256>::new(Some(&salt), psk);
    let mut okm = [0u8; KEY_LEN + SALT_LEN];
    let _ = hk.expand(EARLY_INFO, &mut okm);
    let mut d = DirectionKeys {
        key: [0; KEY_LEN],
        salt: [0; SALT_LEN],
    };
    d.key.copy_from_slice(&okm[..KEY_LEN]);
    d.salt.copy_from_slice(&okm[KEY_LEN..]);
    okm.zeroize();
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CipherSuite, TimerProfile};
    use smoltcp::wire::Ipv4Address;

    fn offer() -> ConnectRepr {
        ConnectRepr {
            src_conn: 0x0102_0304,
            src_token: 0x1122_3344_5566_7788,
            mtu: 4096,
            max_paths: 16,
            window: 256,
            initial_psn: 77,
            reply_port: 4791,
            timer_profile: TimerProfile::DataCenter,
            suite: CipherSuite::Aes256Gcm,
            key_id: 1,
            cookie: [0; COOKIE_LEN],
        }
    }

    fn at() -> ProofAddresses {
        ProofAddresses {
            initiator: IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1)),
            initiator_port: 50_000,
            acceptor: IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 2)),
            acceptor_port: 4791,
        }
    }

    #[test]
    fn a_proof_is_good_for_its_key_addresses_and_offer_only() {
        let psk = [0x4a; PSK_LEN];
        let mut c = offer();
        c.cookie = make_proof(&psk, 1_800_000_000_000_000_000, &at(), &c);
        assert!(proof_matches(&psk, &at(), &c));
        assert_eq!(proof_time(&c.cookie), 1_800_000_000_000_000_000);
        assert!(!proof_matches(&[0x4b; PSK_LEN], &at(), &c), "another key");
        let mut other = at();
        other.acceptor = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 3));
        assert!(!proof_matches(&psk, &other, &c), "another acceptor");
        let mut other = at();
        other.initiator_port += 1;
        assert!(!proof_matches(&psk, &other, &c), "another source port");
        let mut d = c;
        d.initial_psn += 1;
        assert!(!proof_matches(&psk, &at(), &d), "another offer");
        let mut d = c;
        d.cookie[7] ^= 1;
        assert!(!proof_matches(&psk, &at(), &d), "another time");
        let mut d = c;
        d.cookie[9] = 1;
        assert!(!proof_matches(&psk, &at(), &d), "reserved bytes");
    }

    #[test]
    fn the_early_key_depends_on_the_offer() {
        let psk = [0x4a; PSK_LEN];
        let a = early_keys(&psk, &offer());
        let mut o = offer();
        o.src_token ^= 1;
        assert_ne!(a, early_keys(&psk, &o));
        // Not the transcript key of 5.3.3.
        let t = super::super::kdf::transcript(&offer(), &offer());
        let full = super::super::kdf::derive(&psk, &t);
        assert_ne!(a, full.initiator_to_acceptor);
    }
}
