//! Packet sequence numbers (spec 1.4.3, 4.3): 32-bit serial numbers.
//!
//! Two PSNs compare by their signed distance modulo 2^32, so a window may
//! wrap through zero. The newtype keeps PSNs from mixing with counts and
//! indices by accident; arithmetic on it is always wrapping.

use core::ops::{Add, AddAssign};

/// A packet sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Psn(pub u32);

impl Psn {
    /// The raw value, as carried on the wire.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Signed distance from `base` to `self` (positive: `self` is later).
    #[inline]
    pub const fn offset_from(self, base: Psn) -> i32 {
        self.0.wrapping_sub(base.0) as i32
    }

    /// Unsigned distance from `base` forward to `self`, modulo 2^32.
    #[inline]
    pub const fn distance_from(self, base: Psn) -> u32 {
        self.0.wrapping_sub(base.0)
    }

    /// Whether `self` comes before `other` in serial order.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.offset_from(other) < 0
    }

    /// Whether `self` lies in `[start, start + len)`.
    #[inline]
    pub const fn is_within(self, start: Psn, len: u32) -> bool {
        self.distance_from(start) < len
    }

    /// The later of two PSNs in serial order.
    #[inline]
    pub const fn max(self, other: Psn) -> Psn {
        if self.offset_from(other) >= 0 {
            self
        } else {
            other
        }
    }

    /// The next PSN.
    #[inline]
    pub const fn next(self) -> Psn {
        Psn(self.0.wrapping_add(1))
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    #[inline]
    fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n))
    }
}

impl AddAssign<u32> for Psn {
    #[inline]
    fn add_assign(&mut self, n: u32) {
        self.0 = self.0.wrapping_add(n);
    }
}

/// Iterates `[start, end)` in serial order.
pub fn range(start: Psn, end: Psn) -> impl Iterator<Item = Psn> {
    (0..end.distance_from(start)).map(move |i| start + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_order_wraps() {
        let a = Psn(u32::MAX - 1);
        let b = a + 3;
        assert_eq!(b, Psn(1));
        assert_eq!(b.offset_from(a), 3);
        assert_eq!(a.offset_from(b), -3);
        assert!(a.is_before(b));
        assert!(!b.is_before(a));
        assert!(Psn(0).is_within(a, 3));
        assert!(!b.is_within(a, 3));
        assert_eq!(a.max(b), b);
        assert_eq!(range(a, b).count(), 3);
    }
}
