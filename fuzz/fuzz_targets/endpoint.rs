//! Stateful fuzzing of two endpoints and a hostile third party
//! (`metaroce_core::testing::endpoints`): arbitrary sequences of
//! connections, registrations, posts, deliveries with loss, duplication,
//! corruption and reordering, strangers' datagrams and time steps, with
//! and without packet protection. `METAROCE_FUZZ_STRICT_READS=1` also makes
//! a payload read outside the regions registered at that moment fatal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_core::testing::{endpoints_with, Checks};

fuzz_target!(|data: &[u8]| {
    let checks = Checks {
        strict_reads: std::env::var_os("METAROCE_FUZZ_STRICT_READS").is_some(),
    };
    endpoints_with(data, checks);
});
