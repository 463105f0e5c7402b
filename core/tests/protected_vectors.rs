//! The packet-protection vectors of `compliance/vectors/protected/`,
//! written by `generate_protected.py` with Python `cryptography`
//! (independent of `core/src/crypto/`), in both directions: the keys
//! derive from the PSK and the handshake as the vectors say; sealing a
//! packet built from its fields yields its bytes; opening its bytes
//! yields its plaintext; tampered packets fail authentication; malformed
//! ones fail to parse with their error (spec 5.3).

use metaroce_core::crypto::kdf::{self, KeyMaterial, PSK_LEN, TRANSCRIPT_LEN};
use metaroce_core::crypto::session::{nonce, OpenError, Role, Session};
use metaroce_core::wire::packet::Packet;
use metaroce_core::wire::protect::{Sealed, SecurityRepr, SECURITY_LEN, TAG_LEN};
use metaroce_core::wire::{self, Body, Error, Flags, PacketType};

mod vector_files;

use vector_files::Vector;

fn load() -> Vec<Vector> {
    vector_files::load("protected")
}

/// The keys the vector's handshake gives, checked step by step.
fn keys(v: &Vector) -> KeyMaterial {
    let (connect, _) = wire::parse(&v.hex("connect")).expect("CONNECT parses");
    let (accept, _) = wire::parse(&v.hex("accept")).expect("ACCEPT parses");
    let (Body::Connect(c), Body::Accept(a)) = (connect.body, accept.body) else {
        panic!("{}: not a CONNECT and an ACCEPT", v.name);
    };
    assert_eq!(u64::from(c.key_id), v.int("key_id"));
    assert_eq!(u64::from(a.key_id), v.int("key_id"));
    let t = kdf::transcript(&c, &a);
    assert_eq!(t, v.array::<TRANSCRIPT_LEN>("transcript"), "{}", v.name);
    assert_eq!(v.hex("info"), kdf::INFO);
    let k = kdf::derive(&v.array::<PSK_LEN>("psk"), &t);
    let okm = v.hex("okm");
    assert_eq!(k.initiator_to_acceptor.key[..], v.hex("i2a_key")[..]);
    assert_eq!(k.initiator_to_acceptor.salt[..], v.hex("i2a_salt")[..]);
    assert_eq!(k.acceptor_to_initiator.key[..], v.hex("a2i_key")[..]);
    assert_eq!(k.acceptor_to_initiator.salt[..], v.hex("a2i_salt")[..]);
    assert_eq!(okm[..32], v.hex("i2a_key")[..]);
    k
}

/// (sealing role, opening role) of the vector's direction.
fn roles(v: &Vector) -> (Role, Role) {
    match v.str("direction") {
        "initiator_to_acceptor" => (Role::Initiator, Role::Acceptor),
        "acceptor_to_initiator" => (Role::Acceptor, Role::Initiator),
        d => panic!("{}: direction {d}", v.name),
    }
}

fn type_name(t: PacketType) -> &'static str {
    match t {
        PacketType::Write => "WRITE",
        PacketType::WriteImm => "WRITE_IMM",
        PacketType::Send => "SEND",
        PacketType::SendImm => "SEND_IMM",
        PacketType::ReadRequest => "READ_REQUEST",
        PacketType::ReadResponse => "READ_RESPONSE",
        PacketType::Ack => "ACK",
        PacketType::Nak => "NAK",
        PacketType::Close => "CLOSE",
        PacketType::Keepalive => "KEEPALIVE",
        _ => "other",
    }
}

fn protected(v: &[Vector]) -> impl Iterator<Item = &Vector> {
    v.iter().filter(|v| v.has("plaintext"))
}

#[test]
fn keys_derive_as_the_vectors_say() {
    let all = load();
    assert!(protected(&all).count() >= 9);
    for v in protected(&all) {
        keys(v);
    }
}

/// Emit direction: headers from the parsed fields, the security
/// extension, the plaintext; sealed, they are the vector's bytes.
#[test]
fn sealing_yields_the_vector_bytes() {
    let all = load();
    let mut types = std::collections::BTreeSet::new();
    for v in protected(&all) {
        let k = keys(v);
        let (seal_role, _) = roles(v);
        let key_id = v.int("key_id") as u32;
        let session = Session::new(key_id, &k, seal_role);
        let salt = match seal_role {
            Role::Initiator => k.initiator_to_acceptor.salt,
            Role::Acceptor => k.acceptor_to_initiator.salt,
        };
        let iv = v.int("iv");
        assert_eq!(nonce(&salt, iv)[..], v.hex("nonce")[..], "{}", v.name);
        let want = v.hex("bytes");
        let (repr, _) = wire::parse(&want).expect("parses");
        let plaintext = v.hex("plaintext");
        assert_eq!(usize::from(repr.payload_len), plaintext.len());
        assert_eq!(type_name(repr.body.packet_type()), v.str("type"));
        assert_eq!(u64::from(repr.header.flags.0), v.int("flags"));
        assert!(repr.header.flags.contains(Flags::PROTECTED));
        assert_eq!(u64::from(repr.header.dst_conn), v.int("dst_conn"));
        assert_eq!(repr.header.token, v.int("token"));
        assert_eq!(u64::from(repr.header.psn), v.int("psn"));
        assert_eq!(u64::from(repr.header.path), v.int("path"));
        assert_eq!(u64::from(repr.header.timestamp), v.int("timestamp"));
        types.insert(v.str("type").to_string());

        let hl = repr.header_len();
        let len = hl + SECURITY_LEN + plaintext.len() + TAG_LEN + wire::CRC_LEN;
        assert_eq!(len, want.len(), "{}", v.name);
        let mut buf = vec![0xa5u8; len];
        repr.emit_header(&mut buf);
        SecurityRepr { key_id, iv }.emit(&mut buf[hl..]);
        let aad_len = hl + SECURITY_LEN;
        assert_eq!(buf[..aad_len], v.hex("aad")[..], "{}: AAD", v.name);
        buf[aad_len..aad_len + plaintext.len()].copy_from_slice(&plaintext);
        assert!(session.seal(&mut buf, aad_len, plaintext.len()));
        let crc = wire::packet::crc32(&[&buf[..len - 4]]);
        buf[len - 4..].copy_from_slice(&crc.to_be_bytes());
        let ct_end = aad_len + plaintext.len();
        assert_eq!(buf[aad_len..ct_end], v.hex("ciphertext")[..], "{}", v.name);
        assert_eq!(
            buf[ct_end..ct_end + TAG_LEN],
            v.hex("tag")[..],
            "{}",
            v.name
        );
        assert_eq!(buf, want, "{}: whole packet", v.name);
    }
    for t in [
        "WRITE",
        "SEND_IMM",
        "READ_REQUEST",
        "READ_RESPONSE",
        "ACK",
        "NAK",
        "CLOSE",
        "KEEPALIVE",
    ] {
        assert!(types.contains(t), "no protected {t} vector");
    }
}

/// Parse direction: the vector's bytes open to its plaintext, once; a
/// second time they are a replay; with the other direction's keys they
/// do not authenticate.
#[test]
fn opening_yields_the_plaintext_and_refuses_replays() {
    let all = load();
    for v in protected(&all) {
        let k = keys(v);
        let (seal_role, open_role) = roles(v);
        let key_id = v.int("key_id") as u32;
        let bytes = v.hex("bytes");
        let sealed = Sealed::split(&bytes).expect("a protected packet");
        assert_eq!(sealed.aad, &v.hex("aad")[..]);
        assert_eq!(sealed.security.iv, v.int("iv"));
        let mut out = vec![0u8; 9000];
        let mut session = Session::new(key_id, &k, open_role);
        session.open(&sealed, &mut out).expect(&v.name);
        let plaintext = v.hex("plaintext");
        assert_eq!(out[..plaintext.len()], plaintext[..], "{}", v.name);
        assert!(matches!(
            session.open(&sealed, &mut out),
            Err(OpenError::Replay(_))
        ));
        let mut wrong = Session::new(key_id, &k, seal_role);
        assert_eq!(wrong.open(&sealed, &mut out), Err(OpenError::Auth));
        let mut other_key = Session::new(key_id + 1, &k, open_role);
        assert_eq!(
            other_key.open(&sealed, &mut out),
            Err(OpenError::WrongKeyId)
        );
    }
}

/// A receiver refuses an IV no sender may use (0, or 2^38 and up, spec
/// 5.3.5 step 2) before the replay window or the cipher sees it.
#[test]
fn ivs_outside_the_senders_range_are_refused() {
    let all = load();
    let v = protected(&all)
        .into_iter()
        .find(|v| v.name == "protected_close")
        .expect("protected_close");
    let k = keys(v);
    let iv_at = 28 + 4 + 8;
    for iv in [0u64, 1 << 38, u64::MAX] {
        let mut bytes = v.hex("bytes");
        bytes[iv_at..iv_at + 8].copy_from_slice(&iv.to_be_bytes());
        let sealed = Sealed::split(&bytes).expect("a protected packet");
        assert_eq!(sealed.security.iv, iv);
        let mut session = Session::new(v.int("key_id") as u32, &k, roles(v).1);
        let mut out = vec![0u8; 9000];
        assert_eq!(
            session.open(&sealed, &mut out),
            Err(OpenError::IvOutOfRange)
        );
    }
}

#[test]
fn tampered_packets_parse_but_do_not_authenticate() {
    let all = load();
    let tampered: Vec<&Vector> = all.iter().filter(|v| v.has("auth_error")).collect();
    assert!(tampered.len() >= 5);
    for v in tampered {
        let k = keys(v);
        let bytes = v.hex("bytes");
        wire::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let sealed = Sealed::split(&bytes).expect("protected");
        let mut s = Session::new(v.int("key_id") as u32, &k, roles(v).1);
        let mut out = vec![0u8; 9000];
        assert_eq!(
            s.open(&sealed, &mut out),
            Err(OpenError::Auth),
            "{}",
            v.name
        );
        assert!(
            out.iter().all(|&b| b == 0),
            "{}: no plaintext on failure",
            v.name
        );
    }
}

#[test]
fn malformed_protected_packets_fail_with_their_error() {
    let all = load();
    let malformed: Vec<&Vector> = all.iter().filter(|v| v.has("error")).collect();
    assert!(malformed.len() >= 5);
    for v in malformed {
        let want = match v.str("error") {
            "Reserved" => Error::Reserved,
            "BadField" => Error::BadField,
            "Truncated" => Error::Truncated,
            "BadLength" => Error::BadLength,
            e => panic!("{}: error {e}", v.name),
        };
        let bytes = v.hex("bytes");
        assert_eq!(wire::parse(&bytes).err(), Some(want), "{}", v.name);
        if want != Error::Truncated && want != Error::BadLength {
            assert!(Packet::new_checked(&bytes[..]).unwrap().verify_crc());
        }
    }
}
