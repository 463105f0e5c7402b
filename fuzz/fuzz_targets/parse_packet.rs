//! Fuzz target: `wire::parse` on arbitrary bytes must never panic, and a
//! packet it accepts must be canonical: emitting the parsed `Repr` with its
//! payload (into a buffer pre-filled with 0xa5) gives back exactly the input.
//!
//! Each input is parsed twice: as it is, and with its last four bytes
//! replaced by the CRC-32 of the rest. A fuzzer cannot guess CRCs, so the
//! second pass is what lets mutations reach the checks behind the CRC
//! (flags, reserved fields, reason codes, CONNECT ranges, message spans,
//! the security extension of protected packets).

#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_core::wire::{self, packet::crc32, CRC_LEN};

fn check(data: &[u8]) {
    let Ok((repr, payload)) = wire::parse(data) else {
        return;
    };
    if let Some(sealed) = wire::protect::Sealed::split(data) {
        // A protected packet (spec 5.3.2): headers, the security
        // extension, the (encrypted) payload and the tag re-emit to it.
        let hl = repr.header_len();
        let sec = wire::protect::SECURITY_LEN;
        let tag = wire::protect::TAG_LEN;
        assert_eq!(repr.buffer_len() + sec + tag, data.len(), "length of {repr:?}");
        let mut buf = vec![0xa5u8; data.len()];
        repr.emit_header(&mut buf);
        sealed.security.emit(&mut buf[hl..hl + sec]);
        let start = hl + sec;
        buf[start..start + payload.len()].copy_from_slice(payload);
        let t = start + payload.len();
        buf[t..t + tag].copy_from_slice(sealed.tag);
        let end = buf.len() - CRC_LEN;
        let crc = crc32(&[&buf[..end]]);
        buf[end..].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(buf.as_slice(), data, "re-emit of protected {repr:?} differs");
        return;
    }
    assert_eq!(repr.buffer_len(), data.len(), "buffer_len of {repr:?}");
    let mut buf = vec![0xa5u8; repr.buffer_len()];
    repr.emit(&mut buf, payload);
    assert_eq!(buf.as_slice(), data, "re-emit of {repr:?} differs");
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= CRC_LEN {
        let mut fixed = data.to_vec();
        let end = fixed.len() - CRC_LEN;
        let crc = crc32(&[&fixed[..end]]);
        fixed[end..].copy_from_slice(&crc.to_be_bytes());
        check(&fixed);
    }
});
