//! The host interface's stateful fuzzing scenario
//! (`metaroce_platform::testing::host_interface`) on a bounded, seeded set
//! of inputs: two tenants' host processes doing anything to their queue
//! sets while the device runs; `cargo fuzz run host_interface` (fuzz/)
//! runs it for as long as one likes.

use metaroce_platform::testing::{host_interface, Outcome};

/// SplitMix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Random moves, led by each tenant claiming its set and registering a
/// region in its window, so later moves reach past the claim.
fn input(seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut v = Vec::new();
    for set in [0u8, 1] {
        v.extend([set, 0, 0]); // claim with the set's own process id
                               // REGISTER (opcode 1): tag, opcode, flags, access, conn, gen,
                               // address in its own window, length 4 KiB, key, peer
        v.extend([set, 1, 0, 1, 1, 0, 7, 0, 0, 0, 0, 0x10, 0x00, 0, 0, 0, 0, 0]);
        // CONNECT (opcode 3) to the other node
        v.extend([set, 1, 0, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // LISTEN (opcode 4)
        v.extend([set, 1, 0, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
    // Set 0 connects five more times: past its default share of the
    // connection table (half of 8), so the quota refuses.
    for tag in 4..9 {
        v.extend([0, 1, 0, tag, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
    for _ in 0..(200 + seed % 400) {
        v.push(next(&mut s) as u8);
    }
    v
}

#[test]
fn two_tenants_doing_anything_break_no_rule() {
    let mut total = Outcome::default();
    for seed in 0..300u64 {
        let o = host_interface(&input(seed));
        total.operations += o.operations;
        total.regions_registered += o.regions_registered;
        total.connections += o.connections;
        total.work_reaching_the_engine += o.work_reaching_the_engine;
        total.refusals += o.refusals;
        total.quota_refusals += o.quota_refusals;
    }
    eprintln!("{total:?}");
    // The moves reach the device's checks: connections open, regions are
    // registered, hostile entries are refused and counted.
    assert!(total.operations > 10_000, "{total:?}");
    assert!(total.connections > 100, "{total:?}");
    assert!(total.regions_registered > 0, "{total:?}");
    assert!(total.refusals > 1_000, "{total:?}");
    assert!(total.quota_refusals > 0, "{total:?}");
}
