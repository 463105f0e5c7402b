//! 24-bit packet sequence numbers: arithmetic modulo 2^24, and
//! comparison in serial-number style, valid while two PSNs are less than
//! 2^23 apart (the spec's window for "duplicate" versus "out of sequence").

/// PSNs are 24 bits wide.
pub const MASK: u32 = 0x00ff_ffff;
/// Half the PSN space: the largest distance comparisons understand.
pub const HALF: u32 = 1 << 23;

/// `psn + n` modulo 2^24.
pub const fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & MASK
}

/// `psn - n` modulo 2^24.
pub const fn sub(psn: u32, n: u32) -> u32 {
    psn.wrapping_sub(n) & MASK
}

/// Signed distance `a - b`, in `-2^23 ..= 2^23 - 1`.
pub const fn diff(a: u32, b: u32) -> i32 {
    // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// `a` comes before `b`.
pub const fn lt(a: u32, b: u32) -> bool {
    diff(a, b) < 0
}

/// `a` comes before or equals `b`.
pub const fn le(a: u32, b: u32) -> bool {
    diff(a, b) <= 0
}

/// Whether `psn` lies in `[start, start + len)`.
pub const fn in_range(psn: u32, start: u32, len: u32) -> bool {
    let d = diff(psn, start);
    d >= 0 && (d as u32) < len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert_eq!(add(MASK, 1), 0);
        assert_eq!(add(MASK - 1, 5), 3);
        assert_eq!(sub(0, 1), MASK);
        assert_eq!(diff(2, MASK), 3);
        assert_eq!(diff(MASK, 2), -3);
        assert!(lt(MASK, 0));
        assert!(le(5, 5));
        assert!(!lt(5, 5));
        assert_eq!(diff(HALF, 0), -(HALF as i32));
        assert_eq!(diff(HALF - 1, 0), (HALF - 1) as i32);
        assert!(in_range(1, MASK, 3));
        assert!(!in_range(2, MASK, 3));
        assert!(!in_range(MASK - 1, MASK, 3));
    }
}
