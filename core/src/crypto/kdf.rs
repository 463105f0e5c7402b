//! Per-connection keys (spec 5.3.3): HKDF-SHA256 (RFC 5869) from a
//! pre-shared key, salted with the handshake transcript, so both ends get
//! the same keys only if both saw the same CONNECT and ACCEPT.

use hkdf::Hkdf;
use sha2::Sha256;
use zeroize::Zeroize;

use crate::wire::{Body, ConnectRepr, Header, Repr, HEADER_LEN};

/// Length of a pre-shared key.
pub const PSK_LEN: usize = 32;
/// Bytes of the transcript: the first 32 bytes (everything but the
/// cookie) of the CONNECT's and of the ACCEPT's extension headers.
pub const TRANSCRIPT_LEN: usize = 64;
/// Bytes of each extension header the transcript takes.
const TRANSCRIPT_PART: usize = 32;
/// HKDF-Expand's info: names the protocol, version and suite.
pub const INFO: &[u8] = b"MetaRoCE v2 AES-256-GCM";
/// A direction's key and salt.
pub const KEY_LEN: usize = 32;
/// See [`KEY_LEN`].
pub const SALT_LEN: usize = 4;
/// Bytes HKDF-Expand produces: initiator-to-acceptor key and salt, then
/// acceptor-to-initiator key and salt.
pub const OKM_LEN: usize = 2 * (KEY_LEN + SALT_LEN);

/// The handshake transcript the keys are bound to: CONNECT's extension
/// header bytes 0..32 then ACCEPT's (ids, tokens, MTU, paths, window,
/// reply port, timer profile, suite, initial PSN, key id of each side),
/// exactly as on the wire.
pub fn transcript(connect: &ConnectRepr, accept: &ConnectRepr) -> [u8; TRANSCRIPT_LEN] {
    let mut out = [0u8; TRANSCRIPT_LEN];
    out[..TRANSCRIPT_PART].copy_from_slice(&extension_prefix(Body::Connect(*connect)));
    out[TRANSCRIPT_PART..].copy_from_slice(&extension_prefix(Body::Accept(*accept)));
    out
}

/// The first 32 bytes of a CONNECT or ACCEPT extension header, through the
/// emitter, so the transcript is the wire bytes by construction.
fn extension_prefix(body: Body) -> [u8; TRANSCRIPT_PART] {
    let repr = Repr {
        header: Header {
            flags: crate::wire::Flags::NONE,
            dst_conn: 0,
            token: 0,
            psn: 0,
            path: 0,
            timestamp: 0,
        },
        body,
        payload_len: 0,
    };
    let mut buf = [0u8; HEADER_LEN + 64];
    repr.emit_header(&mut buf);
    let mut out = [0u8; TRANSCRIPT_PART];
    out.copy_from_slice(&buf[HEADER_LEN..HEADER_LEN + TRANSCRIPT_PART]);
    out
}

/// One direction's key and nonce salt.
#[derive(Clone, PartialEq, Eq)]
pub struct DirectionKeys {
    pub key: [u8; KEY_LEN],
    pub salt: [u8; SALT_LEN],
}

impl core::fmt::Debug for DirectionKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("DirectionKeys(..)")
    }
}

impl Drop for DirectionKeys {
    fn drop(&mut self) {
        self.key.zeroize();
        self.salt.zeroize();
    }
}

/// The keys of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyMaterial {
    /// Protects what the initiator sends.
    pub initiator_to_acceptor: DirectionKeys,
    /// Protects what the acceptor sends.
    pub acceptor_to_initiator: DirectionKeys,
}

/// PRK = HKDF-Extract(salt = transcript, IKM = PSK); OKM = HKDF-Expand(PRK,
/// [`INFO`], 72) split into key and salt of each direction.
pub fn derive(psk: &[u8; PSK_LEN], transcript: &[u8; TRANSCRIPT_LEN]) -> KeyMaterial {
    let hk = Hkdf::<Sha256>::new(Some(transcript), psk);
    let mut okm = [0u8; OKM_LEN];
    // 72 bytes is far below HKDF-SHA256's limit of 255 * 32.
    let _ = hk.expand(INFO, &mut okm);
    let split = |at: usize| {
        let mut d = DirectionKeys {
            key: [0; KEY_LEN],
            salt: [0; SALT_LEN],
        };
        d.key.copy_from_slice(&okm[at..at + KEY_LEN]);
        d.salt
            .copy_from_slice(&okm[at + KEY_LEN..at + KEY_LEN + SALT_LEN]);
        d
    };
    let keys = KeyMaterial {
        initiator_to_acceptor: split(0),
        acceptor_to_initiator: split(KEY_LEN + SALT_LEN),
    };
    okm.zeroize();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 5869 test case 1: the HKDF construction itself.
    #[test]
    fn hkdf_sha256_matches_rfc_5869_case_1() {
        let ikm = [0x0bu8; 22];
        let salt: [u8; 13] = core::array::from_fn(|i| i as u8);
        let info: [u8; 10] = core::array::from_fn(|i| 0xf0 + i as u8);
        let mut okm = [0u8; 42];
        Hkdf::<Sha256>::new(Some(&salt), &ikm)
            .expand(&info, &mut okm)
            .unwrap();
        let hex = okm.iter().fold(std::string::String::new(), |mut s, b| {
            use core::fmt::Write;
            let _ = write!(s, "{b:02x}");
            s
        });
        assert_eq!(
            hex,
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
        );
    }

    #[test]
    fn any_transcript_change_changes_every_key() {
        let c = ConnectRepr {
            src_conn: 1,
            src_token: 2,
            mtu: 1024,
            max_paths: 4,
            window: 256,
            initial_psn: 7,
            reply_port: 4795,
            timer_profile: crate::wire::TimerProfile::Emulation,
            suite: crate::wire::CipherSuite::Aes256Gcm,
            key_id: 9,
            cookie: [0xcc; 32],
        };
        let a = ConnectRepr {
            src_conn: 3,
            src_token: 4,
            initial_psn: 8,
            cookie: [0; 32],
            ..c
        };
        let psk = [0x42u8; PSK_LEN];
        let t = transcript(&c, &a);
        assert_eq!(&t[..4], &1u32.to_be_bytes());
        assert_eq!(&t[32..36], &3u32.to_be_bytes());
        let base = derive(&psk, &t);
        assert_ne!(
            base.initiator_to_acceptor.key,
            base.acceptor_to_initiator.key
        );
        // The cookie is not part of the transcript.
        let other_cookie = ConnectRepr {
            cookie: [0; 32],
            ..c
        };
        assert_eq!(derive(&psk, &transcript(&other_cookie, &a)), base);
        for (i, _) in t.iter().enumerate() {
            let mut t2 = t;
            t2[i] ^= 1;
            let k = derive(&psk, &t2);
            assert_ne!(k.initiator_to_acceptor.key, base.initiator_to_acceptor.key);
            assert_ne!(k.acceptor_to_initiator.key, base.acceptor_to_initiator.key);
        }
        let mut psk2 = psk;
        psk2[31] ^= 1;
        assert_ne!(derive(&psk2, &t), base);
    }
}
