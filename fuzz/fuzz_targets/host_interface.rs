//! Stateful fuzzing of the host interface's device side
//! (`metaroce_platform::testing::host_interface`): two tenants' host
//! processes claim their queue sets, post admin commands, send and receive
//! entries with any fields, ring doorbells at any index and write raw
//! bytes anywhere in their sets while the device runs. No panic, regions
//! and work only inside the posting set's window and domain, refusal
//! counters monotonic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metaroce_platform::testing::host_interface(data);
});
