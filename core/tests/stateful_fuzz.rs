//! The stateful fuzzing scenario (`metaroce_core::testing::endpoints`) on a
//! bounded, seeded set of inputs: random bytes, and inputs built to reach
//! deep (connect, register, post, deliver, in loops), with and without
//! packet protection. `cargo fuzz run endpoint` (fuzz/) runs the same
//! scenario for as long as one likes.

use metaroce_core::testing::{endpoints, Outcome};

/// SplitMix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn random_input(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed;
    (0..len).map(|_| next(&mut s) as u8).collect()
}

/// An input that connects, registers on both sides, then loops over
/// posting, delivering and time passing, with random bytes for the
/// details: it gets past the handshake far more often than noise.
fn structured_input(seed: u64, protected: bool) -> Vec<u8> {
    structured(seed, protected, false)
}

/// `structured_input`, with regions anywhere in the arena when `scatter`
/// (remote addresses then mostly miss them: the refusal paths).
fn structured(seed: u64, protected: bool, scatter: bool) -> Vec<u8> {
    let mut s = seed;
    let mut r = || next(&mut s) as u8;
    let mut v = vec![u8::from(protected)];
    // connect from side 1, register a region on each side
    v.extend([1, 1]);
    // A region at the arena's start with every right on each side, so
    // remote addresses in the first 256 bytes are in bounds.
    for who in [0u8, 1] {
        let base = if scatter { r() % 16 } else { 0 };
        v.extend([2, who, base, 0x10, 0x00, 7]);
    }
    for _ in 0..120 {
        let step = r() % 10;
        match step {
            8 | 9 => v.extend([11, 0, 11, 1, 11, 0]),
            0..=2 => v.extend([6, r() & 1, 31, r(), r() & 0x3f]),
            3 => v.extend([0, r() & 1, 0, r() % 32]),
            // post: who, choice (known handle, registered buffer), handle,
            // offset, length (< 4 KiB), key choice, remote address (first
            // 256 bytes), opcode, id
            4 => v.extend([
                4,
                r() & 1,
                r() & 0x3f,
                r(),
                0,
                r(),
                r() % 16,
                r(),
                r() | 1,
                0,
                r(),
                r(),
                r(),
            ]),
            5 => v.extend([5, r() & 1, r() & 0x3f, r(), r(), r(), r(), r(), r()]),
            6 => v.extend([7, r() & 1, 24]),
            _ => v.extend([8, r() & 1, 0, r(), r(), r(), r(), r()]),
        }
        for _ in 0..(r() % 4) {
            v.push(r());
        }
    }
    v
}

/// Inputs of a cruder shape (random offsets, lengths and remote
/// addresses, no calm moments): they reach the refusal paths.
fn crude(seed: u64, protected: bool) -> Vec<u8> {
    let mut s = seed;
    let mut r = || next(&mut s) as u8;
    let mut v = vec![u8::from(protected), 1, 1];
    for who in [0u8, 1] {
        v.extend([2, who, r() % 16, 0x10, 0x00, 7]);
    }
    for _ in 0..120 {
        match r() % 8 {
            0..=2 => v.extend([6, r() & 1, 31, r(), r() & 0x3f]),
            3 => v.extend([0, r() & 1, 0, r() % 32]),
            4 => {
                v.extend([4, r() & 1, r() & 0x3f]);
                v.extend((0..10).map(|_| r()));
            }
            5 => {
                v.extend([5, r() & 1, r() & 0x3f]);
                v.extend((0..6).map(|_| r()));
            }
            6 => v.extend([7, r() & 1, 24]),
            _ => v.extend([8, r() & 1, 0, r(), r(), r(), r(), r()]),
        }
        for _ in 0..(r() % 4) {
            v.push(r());
        }
    }
    v
}

fn run_many(inputs: impl Iterator<Item = Vec<u8>>) -> Outcome {
    let mut total = Outcome::default();
    for input in inputs {
        let o = endpoints(&input);
        total.operations += o.operations;
        total.packets_delivered += o.packets_delivered;
        total.strangers += o.strangers;
        total.completions += o.completions;
        total.connected += o.connected;
        total.memory_writes += o.memory_writes;
        total.memory_reads += o.memory_reads;
    }
    total
}

#[test]
fn random_inputs_break_no_invariant() {
    let total = run_many((0..400u64).map(|seed| random_input(seed, 64 + (seed as usize % 512))));
    assert!(total.operations > 5_000, "{total:?}");
    let crude_total = run_many((0..100u64).map(|seed| crude(seed, seed % 2 == 1)));
    assert!(crude_total.packets_delivered > 1_000, "{crude_total:?}");
    assert!(total.strangers > 100, "{total:?}");
}

#[test]
fn structured_inputs_reach_the_data_path_unprotected() {
    let total = run_many((0..150u64).map(|seed| structured_input(seed, false)));
    eprintln!("unprotected: {total:?}");
    assert!(total.connected > 0, "no handshake completed: {total:?}");
    assert!(total.packets_delivered > 1_000, "{total:?}");
    assert!(total.completions > 0, "{total:?}");
}

#[test]
fn structured_inputs_reach_the_data_path_protected() {
    let total = run_many((0..150u64).map(|seed| structured_input(seed, true)));
    eprintln!("protected: {total:?}");
    assert!(
        total.connected > 0,
        "no protected handshake completed: {total:?}"
    );
    assert!(total.packets_delivered > 1_000, "{total:?}");
}

/// A READ's responder whose application deregisters the source region
/// while the responses stream: each response packet checks the region
/// again (spec 4.8.6), so nothing is read from memory no longer registered
/// (the run panics if anything is) and the responder's side fails.
fn read_after_deregistration() -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend([1, 1]); // side 1 connects to side 0
    v.extend([2, 0, 0, 0x10, 0x00, 7]); // side 0: region at the start, all rights
    v.extend([2, 1, 0, 0x10, 0x00, 7]); // side 1: the same
    for _ in 0..8 {
        v.extend([11, 0, 0, 1, 0, 0]); // calm moments: the handshake completes
    }
    // side 1 READs 4 KiB of side 0's region into its own
    v.extend([4, 1, 0x00, 0, 0, 0, 0x10, 0x00, 1, 0, 0, 4, 1]);
    v.extend([11, 0]); // the request arrives; the first packets leave
    v.extend([3, 0, 0]); // side 0 deregisters the region
    for _ in 0..6 {
        v.extend([0, 0, 0, 50, 0, 1, 0, 50]); // time passes on both sides
    }
    v
}

#[test]
fn a_read_response_stops_at_deregistration() {
    let o = endpoints(&read_after_deregistration());
    assert!(o.connected > 0, "{o:?}");
    assert!(o.memory_reads > 0, "the responses started: {o:?}");
}
