//! The cost of packet protection (spec 5.3): sealing and opening one
//! protected WRITE with a 4 KiB payload through the core's own AES-256-GCM
//! session (RustCrypto `aes-gcm`, AES-NI and CLMUL selected at run time on
//! x86-64), without the engine around it.

use std::hint::black_box;

use metaroce_core::crypto::kdf;
use metaroce_core::crypto::session::{Role, Session};
use metaroce_core::wire::protect::{Sealed, SecurityRepr, SECURITY_LEN, TAG_LEN};
use metaroce_core::wire::{
    Body, CipherSuite, ConnectRepr, Flags, Header, MemoryTarget, MessageSpan, Repr, TimerProfile,
    WriteRepr, CRC_LEN,
};

use crate::measure::{self, Row, Sample};
use crate::PAYLOAD;

/// The two ends of a protected connection.
fn sessions() -> (Session, Session) {
    let c = ConnectRepr {
        src_conn: 1,
        src_token: 2,
        mtu: 4096,
        max_paths: 16,
        window: 256,
        initial_psn: 3,
        reply_port: 4795,
        timer_profile: TimerProfile::DataCenter,
        suite: CipherSuite::Aes256Gcm,
        key_id: 1,
        cookie: [0; 32],
    };
    let a = ConnectRepr {
        src_conn: 4,
        src_token: 5,
        initial_psn: 6,
        ..c
    };
    let keys = kdf::derive(&[0x42; 32], &kdf::transcript(&c, &a));
    (
        Session::new(1, &keys, Role::Initiator),
        Session::new(1, &keys, Role::Acceptor),
    )
}

/// A protected WRITE with a `PAYLOAD`-byte payload, unsealed; returns the
/// packet and the length of its associated data.
fn packet() -> (Vec<u8>, usize) {
    let repr = Repr {
        header: Header {
            flags: Flags::PROTECTED,
            dst_conn: 7,
            token: 8,
            psn: 9,
            path: 1,
            timestamp: 10,
        },
        body: Body::Write(WriteRepr {
            msg: MessageSpan {
                id: 1,
                offset: 0,
                len: PAYLOAD as u32,
            },
            target: MemoryTarget {
                key: 11,
                addr: 0x1000,
            },
            imm: None,
        }),
        payload_len: PAYLOAD as u16,
    };
    let hl = repr.header_len();
    let mut buf = vec![0xA5u8; hl + SECURITY_LEN + PAYLOAD + TAG_LEN + CRC_LEN];
    repr.emit_header(&mut buf);
    (buf, hl + SECURITY_LEN)
}

/// Seal then open, one 4 KiB packet per iteration, each with a new IV.
pub fn seal_open_sample() -> Sample {
    let (sender, mut receiver) = sessions();
    let (mut buf, aad) = packet();
    let mut out = vec![0u8; PAYLOAD];
    let mut iv = 0u64;
    measure::timed(|iterations| {
        for _ in 0..iterations {
            iv += 1;
            SecurityRepr { key_id: 1, iv }.emit(&mut buf[aad - SECURITY_LEN..aad]);
            assert!(sender.seal(black_box(&mut buf), aad, PAYLOAD));
            let sealed = Sealed::split(&buf).expect("protected");
            assert!(receiver.open(&sealed, &mut out).is_ok());
            black_box(&out);
        }
    })
}

/// Seal alone.
pub fn seal_sample() -> Sample {
    let (sender, _) = sessions();
    let (mut buf, aad) = packet();
    SecurityRepr { key_id: 1, iv: 1 }.emit(&mut buf[aad - SECURITY_LEN..aad]);
    measure::timed(|iterations| {
        for _ in 0..iterations {
            assert!(sender.seal(black_box(&mut buf), aad, PAYLOAD));
        }
    })
}

/// The rows of `cargo xtask bench`: best of `repeats` runs.
pub fn rows(repeats: u32) -> Vec<Row> {
    let both: Vec<Sample> = (0..repeats.max(1)).map(|_| seal_open_sample()).collect();
    let seal: Vec<Sample> = (0..repeats.max(1)).map(|_| seal_sample()).collect();
    let both = measure::best(&both).ns();
    let seal = measure::best(&seal).ns();
    vec![
        Row::new(
            "aead_ns_per_packet",
            both,
            "ns",
            "AES-256-GCM seal + open of a protected 4 KiB WRITE (spec 5.3; best, on-CPU)",
        ),
        Row::new(
            "aead_seal_ns_per_packet",
            seal,
            "ns",
            "  seal alone (encrypt + tag)",
        ),
        Row::new(
            "aead_key_slot_bytes",
            std::mem::size_of::<metaroce_core::crypto::KeySlot>() as f64,
            "B",
            "key pool slot per protected connection (two key schedules, IVs, replay window)",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_packet_opens_to_its_payload() {
        let (sender, mut receiver) = sessions();
        let (mut buf, aad) = packet();
        SecurityRepr { key_id: 1, iv: 1 }.emit(&mut buf[aad - SECURITY_LEN..aad]);
        assert!(sender.seal(&mut buf, aad, PAYLOAD));
        assert_ne!(buf[aad..aad + 16], [0xA5; 16], "encrypted");
        let mut out = vec![0u8; PAYLOAD];
        receiver
            .open(&Sealed::split(&buf).unwrap(), &mut out)
            .unwrap();
        assert!(out.iter().all(|&b| b == 0xA5));
    }
}
