//! Time as the core sees it: a monotonic instant handed in by the caller.
//!
//! The core never reads a clock. Every input that depends on time takes a
//! `now: Instant`, and time never goes backwards between calls.

use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point on the caller's monotonic clock, in nanoseconds since an
/// arbitrary origin (boot, simulation start).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant { nanos: 0 };
    /// Later than any instant a run reaches (used for "no deadline").
    pub const FAR_FUTURE: Instant = Instant { nanos: u64::MAX };

    /// From nanoseconds since the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant { nanos }
    }

    /// From microseconds since the origin.
    pub const fn from_micros(micros: u64) -> Instant {
        Instant {
            nanos: micros.saturating_mul(1_000),
        }
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    /// `nanos` later (saturating): cheaper than adding a `Duration`, whose
    /// seconds-and-nanoseconds form costs a division and 128-bit products
    /// in firmware code on the per-packet path.
    pub const fn plus_nanos(self, nanos: u64) -> Instant {
        Instant {
            nanos: self.nanos.saturating_add(nanos),
        }
    }

    /// `nanos` earlier (saturating at the origin).
    pub const fn minus_nanos(self, nanos: u64) -> Instant {
        Instant {
            nanos: self.nanos.saturating_sub(nanos),
        }
    }

    /// The low 32 bits of the nanosecond count: the wire timestamp (spec 3.2).
    pub const fn wire_timestamp(self) -> u32 {
        self.nanos as u32
    }

    /// Time since `earlier`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }
}

/// An optional instant in 8 bytes (`u64::MAX` means none): connection
/// state keeps several, and `Option<Instant>` takes 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MaybeInstant(u64);

impl MaybeInstant {
    pub const NONE: MaybeInstant = MaybeInstant(u64::MAX);

    pub const fn some(t: Instant) -> MaybeInstant {
        MaybeInstant(t.nanos)
    }

    pub const fn get(self) -> Option<Instant> {
        if self.0 == u64::MAX {
            None
        } else {
            Some(Instant { nanos: self.0 })
        }
    }

    pub const fn is_some(self) -> bool {
        self.0 != u64::MAX
    }

    pub const fn is_none(self) -> bool {
        self.0 == u64::MAX
    }

    /// The earlier of two (none is later than any instant): one compare,
    /// where `Option<Instant>` needs a match.
    #[inline]
    pub const fn min(self, other: MaybeInstant) -> MaybeInstant {
        if other.0 < self.0 {
            other
        } else {
            self
        }
    }
}

impl From<Option<Instant>> for MaybeInstant {
    fn from(t: Option<Instant>) -> Self {
        t.map_or(Self::NONE, Self::some)
    }
}

pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant {
            nanos: self.nanos.saturating_add(duration_nanos(d)),
        }
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant {
            nanos: self.nanos.saturating_sub(duration_nanos(d)),
        }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturating: an earlier minus a later instant is zero.
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_micros(5);
        assert_eq!((t + Duration::from_nanos(7)).as_nanos(), 5_007);
        assert_eq!(t - Instant::from_micros(9), Duration::ZERO);
        assert_eq!(
            (Instant::FAR_FUTURE + Duration::from_secs(1)),
            Instant::FAR_FUTURE
        );
        assert_eq!(Instant::from_nanos(0x1_0000_0005).wire_timestamp(), 5);
    }
}
