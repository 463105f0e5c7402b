//! Packet protection's open path (spec 5.3.5): a protected connection's
//! receive side fed sealed packets delivered again, reordered, tampered
//! with, truncated, keyed otherwise, and noise. The scenario and its
//! rules are `core/tests/aead_open.rs` (included here), which also runs
//! it on a bounded, seeded set of inputs in `cargo test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../core/tests/aead_open.rs"]
mod aead_open;

fuzz_target!(|data: &[u8]| {
    aead_open::scenario(data);
});
