//! Fuzz target: `wire::parse` on arbitrary bytes must never panic, and a
//! packet it accepts must be canonical: emitting the parsed `Repr` with its
//! payload (into a buffer pre-filled with 0xa5) gives back exactly the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_core::wire;

fuzz_target!(|data: &[u8]| {
    let Ok((repr, payload)) = wire::parse(data) else {
        return;
    };
    assert_eq!(repr.buffer_len(), data.len(), "buffer_len of {repr:?}");
    let mut buf = vec![0xa5u8; repr.buffer_len()];
    repr.emit(&mut buf, payload);
    assert_eq!(buf.as_slice(), data, "re-emit of {repr:?} differs");
});
