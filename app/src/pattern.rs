//! The deterministic data pattern both sides check integrity against
//! (spec appendix B.5).

// Out of line in firmware (code budget; its serve checks patterns once per
// message), inline on hosts, where it is most of `metaroce bench`'s work.
#[cfg_attr(target_os = "none", inline(never))]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` with the pattern of message `index` under `seed`.
pub fn fill_pattern(seed: u64, index: u64, out: &mut [u8]) {
    let mut counter = mix(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for chunk in out.chunks_mut(8) {
        let word = mix(counter).to_le_bytes();
        // A whole word is one store; a copy of a run-time length per 8
        // bytes was a `memcpy` call each, a third of `metaroce bench`'s
        // time. Only the last chunk can be shorter.
        match <&mut [u8; 8]>::try_from(&mut *chunk) {
            Ok(whole) => *whole = word,
            Err(_) => chunk.copy_from_slice(&word[..chunk.len()]),
        }
        counter = counter.wrapping_add(1);
    }
}

/// Whether `data` is the pattern of message `index` under `seed`.
pub fn check_pattern(seed: u64, index: u64, data: &[u8]) -> bool {
    let mut counter = mix(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    data.chunks(8).all(|chunk| {
        let word = mix(counter).to_le_bytes();
        counter = counter.wrapping_add(1);
        // A whole word is one integer comparison; a slice comparison per 8
        // bytes was a `memcmp` call each, four fifths of `metaroce serve`'s
        // time at 8 KiB datagrams. Only the last chunk can be shorter.
        match <[u8; 8]>::try_from(chunk) {
            Ok(whole) => u64::from_le_bytes(whole) == u64::from_le_bytes(word),
            Err(_) => chunk == &word[..chunk.len()],
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appendix B.5's example: pattern(0, 0) starts with mix(mix(0)) and
    /// mix(mix(0) + 1), little-endian.
    #[test]
    fn pattern_is_that_of_appendix_b() {
        let mut out = [0u8; 12];
        fill_pattern(0, 0, &mut out);
        let start = mix(0);
        assert_eq!(out[..8], mix(start).to_le_bytes());
        assert_eq!(out[8..], mix(start + 1).to_le_bytes()[..4]);
    }

    #[test]
    fn pattern_checks() {
        let mut b = vec![0u8; 1001];
        fill_pattern(5, 9, &mut b);
        assert!(check_pattern(5, 9, &b));
        assert!(!check_pattern(5, 10, &b));
        b[1000] ^= 1;
        assert!(!check_pattern(5, 9, &b));
        // A flipped bit inside a whole word, too.
        b[1000] ^= 1;
        b[3] ^= 0x80;
        assert!(!check_pattern(5, 9, &b));
        b[3] ^= 0x80;
        assert!(check_pattern(5, 9, &b));
    }
}
