//! Stateful fuzzing of two endpoints and a hostile third party
//! (`metaroce_core::testing::endpoints`): arbitrary sequences of
//! connections, registrations, posts, deliveries with loss, duplication,
//! corruption and reordering, strangers' datagrams and time steps, with
//! and without packet protection. Any memory access outside the regions
//! registered at that moment is fatal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_core::testing::endpoints;

fuzz_target!(|data: &[u8]| {
    endpoints(data);
});
