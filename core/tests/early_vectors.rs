//! The 0-RTT vectors of `compliance/vectors/early/`, written by
//! `generate_early.py` (HKDF with Python's `hmac` and `hashlib`,
//! AES-256-GCM with Python `cryptography`; independent of
//! `core/src/crypto/early.rs`): the early CONNECT parses with EARLY and
//! re-emits byte for byte, its proof's message is laid out as spec 4.2.4
//! says, the proof the core makes for the vector's key, addresses, ports,
//! offer and time is the vector's, and the core verifies it; the early
//! key derives as spec 5.3.3 says, and the early WRITE seals to the
//! vector's bytes and opens to its plaintext.

use metaroce_core::crypto::early::{
    early_keys, make_proof, proof_matches, proof_time, ProofAddresses, EARLY_INFO, PROOF_SALT,
};
use metaroce_core::crypto::kdf::{self, KeyMaterial, PSK_LEN};
use metaroce_core::crypto::session::{nonce, OpenError, Role, Session};
use metaroce_core::wire::protect::{Sealed, SecurityRepr, SECURITY_LEN, TAG_LEN};
use metaroce_core::wire::{self, ip16, Body, ConnectRepr, Flags, COOKIE_LEN};

mod vector_files;

use vector_files::Vector;

fn load() -> Vec<Vector> {
    vector_files::load("early")
}

/// The CONNECT in `bytes`: it parses, carries EARLY, and its Repr emits
/// the same bytes.
fn early_connect(v: &Vector, bytes: &[u8]) -> ConnectRepr {
    let (repr, _) = wire::parse(bytes).unwrap_or_else(|e| panic!("{}: {e}", v.name));
    assert_eq!(repr.header.flags, Flags::EARLY, "{}", v.name);
    assert_eq!((repr.header.dst_conn, repr.header.token), (0, 0));
    let mut out = vec![0xa5u8; repr.buffer_len()];
    repr.emit(&mut out, &[]);
    assert_eq!(out, bytes, "{}: re-emitted", v.name);
    match repr.body {
        Body::Connect(c) => c,
        other => panic!("{}: {other:?}", v.name),
    }
}

#[test]
fn early_proofs_are_the_vectors() {
    let all = load();
    let connects: Vec<&Vector> = all.iter().filter(|v| v.has("proof")).collect();
    assert!(connects.len() >= 2, "early CONNECT vectors missing");
    for v in connects {
        let psk = v.array::<PSK_LEN>("job_key");
        let c = early_connect(v, &v.hex("bytes"));
        assert_eq!(u64::from(c.key_id), v.int("key_id"));
        assert_eq!(c.cookie[..], v.hex("proof")[..], "{}", v.name);
        assert_eq!(proof_time(&c.cookie), v.int("time"), "{}", v.name);
        assert_eq!(c.offer_bytes()[..], v.hex("offer")[..], "{}", v.name);
        assert_eq!(v.hex("proof_salt"), PROOF_SALT);
        let at = ProofAddresses {
            initiator: v.ip("initiator_ip"),
            initiator_port: v.int("initiator_port") as u16,
            acceptor: v.ip("acceptor_ip"),
            acceptor_port: v.int("acceptor_port") as u16,
        };
        // The message of spec 4.2.4, laid out here from its parts.
        let mut msg = Vec::new();
        msg.extend_from_slice(&c.cookie[..16]);
        msg.extend_from_slice(&ip16(&at.initiator));
        msg.extend_from_slice(&at.initiator_port.to_be_bytes());
        msg.extend_from_slice(&ip16(&at.acceptor));
        msg.extend_from_slice(&at.acceptor_port.to_be_bytes());
        msg.extend_from_slice(&c.offer_bytes());
        assert_eq!(msg, v.hex("message"), "{}: message", v.name);
        let (prk, _) = hkdf::Hkdf::<sha2::Sha256>::extract(Some(PROOF_SALT), &psk);
        assert_eq!(prk[..], v.hex("prk")[..], "{}: PRK", v.name);
        // The core makes the same proof, and takes it.
        let mut offer = c;
        offer.cookie = [0; COOKIE_LEN];
        let made = make_proof(&psk, v.int("time"), &at, &offer);
        assert_eq!(made[..], v.hex("proof")[..], "{}: made", v.name);
        assert_eq!(made[16..], v.hex("tag")[..]);
        assert!(proof_matches(&psk, &at, &c), "{}", v.name);
        let mut other = at;
        other.acceptor_port ^= 1;
        assert!(!proof_matches(&psk, &other, &c), "{}: another port", v.name);
    }
}

#[test]
fn the_early_write_seals_and_opens_as_the_vector_says() {
    let all = load();
    let v = all
        .iter()
        .find(|v| v.name == "early_write")
        .expect("early_write");
    let psk = v.array::<PSK_LEN>("job_key");
    let c = early_connect(v, &v.hex("connect"));
    let (accept, _) = wire::parse(&v.hex("accept")).expect("ACCEPT parses");
    let Body::Accept(a) = accept.body else {
        panic!("not an ACCEPT");
    };
    // Spec 5.3.3: the early key from the CONNECT alone; a2i from the
    // transcript.
    assert_eq!(v.hex("early_salt")[..], c.offer_bytes()[..]);
    assert_eq!(v.hex("early_info"), EARLY_INFO);
    let (prk, _) = hkdf::Hkdf::<sha2::Sha256>::extract(Some(&c.offer_bytes()), &psk);
    assert_eq!(prk[..], v.hex("early_prk")[..]);
    let early = early_keys(&psk, &c);
    assert_eq!(early.key[..], v.hex("i2a_key")[..]);
    assert_eq!(early.salt[..], v.hex("i2a_salt")[..]);
    assert_eq!(v.hex("early_okm")[..32], early.key[..]);
    let t = kdf::transcript(&c, &a);
    assert_eq!(t[..], v.hex("transcript")[..]);
    let full = kdf::derive(&psk, &t);
    assert_eq!(full.acceptor_to_initiator.key[..], v.hex("a2i_key")[..]);
    assert_eq!(full.acceptor_to_initiator.salt[..], v.hex("a2i_salt")[..]);
    let keys = KeyMaterial {
        initiator_to_acceptor: early,
        acceptor_to_initiator: full.acceptor_to_initiator.clone(),
    };

    // The header: EARLY | PROTECTED, the initiator's own id and token, its
    // Initial PSN.
    let want = v.hex("bytes");
    let (repr, _) = wire::parse(&want).expect("parses");
    assert_eq!(u64::from(repr.header.flags.0), v.int("flags"));
    assert!(repr
        .header
        .flags
        .contains(Flags::EARLY.with(Flags::PROTECTED)));
    assert_eq!(repr.header.dst_conn, c.src_conn);
    assert_eq!(repr.header.token, c.src_token);
    assert_eq!(repr.header.psn, c.initial_psn);
    assert_eq!(u64::from(repr.header.path), v.int("path"));
    assert_eq!(u64::from(repr.header.timestamp), v.int("timestamp"));
    assert_eq!(v.str("type"), "WRITE");
    assert_eq!(u64::from(repr.header.dst_conn), v.int("dst_conn"));
    assert_eq!(repr.header.token, v.int("token"));
    assert_eq!(u64::from(repr.header.psn), v.int("psn"));

    // Sealing with the early key yields the vector's bytes.
    let iv = v.int("iv");
    assert_eq!(
        nonce(&keys.initiator_to_acceptor.salt, iv)[..],
        v.hex("nonce")[..]
    );
    let plaintext = v.hex("plaintext");
    assert_eq!(v.int("payload_len") as usize, plaintext.len());
    let hl = repr.header_len();
    let len = hl + SECURITY_LEN + plaintext.len() + TAG_LEN + wire::CRC_LEN;
    assert_eq!(len, want.len());
    let mut buf = vec![0xa5u8; len];
    repr.emit_header(&mut buf);
    SecurityRepr {
        key_id: v.int("key_id") as u32,
        iv,
    }
    .emit(&mut buf[hl..]);
    let aad_len = hl + SECURITY_LEN;
    assert_eq!(buf[..aad_len], v.hex("aad")[..]);
    buf[aad_len..aad_len + plaintext.len()].copy_from_slice(&plaintext);
    let session = Session::new(v.int("key_id") as u32, &keys, Role::Initiator);
    assert!(session.seal(&mut buf, aad_len, plaintext.len()));
    let crc = wire::packet::crc32(&[&buf[..len - 4]]);
    buf[len - 4..].copy_from_slice(&crc.to_be_bytes());
    let ct_end = aad_len + plaintext.len();
    assert_eq!(buf[aad_len..ct_end], v.hex("ciphertext")[..]);
    assert_eq!(buf[ct_end..ct_end + TAG_LEN], v.hex("tag")[..]);
    assert_eq!(buf, want, "whole packet");

    // The acceptor opens it with the early key; the transcript's i2a key
    // does not open it.
    let sealed = Sealed::split(&want).expect("protected");
    let mut out = vec![0u8; 9000];
    let mut acceptor = Session::new(v.int("key_id") as u32, &keys, Role::Acceptor);
    acceptor.open(&sealed, &mut out).expect("opens");
    assert_eq!(out[..plaintext.len()], plaintext[..]);
    let mut plain = Session::new(v.int("key_id") as u32, &full, Role::Acceptor);
    assert_eq!(plain.open(&sealed, &mut out), Err(OpenError::Auth));
}
