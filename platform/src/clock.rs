//! Monotonic clocks. The core never reads one; the engine loop reads the
//! platform's clock once per poll and passes the instant down.

use core::cell::Cell;
use core::time::Duration;

use metaroce_core::Instant;

/// A monotonic clock.
pub trait Clock {
    /// The current instant; never earlier than a previous result.
    fn now(&self) -> Instant;
}

/// A clock that moves only when told to: for deterministic tests and
/// simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Cell<Instant>,
}

impl ManualClock {
    /// A clock at `start`.
    pub const fn new(start: Instant) -> Self {
        ManualClock {
            now: Cell::new(start),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now.set(self.now.get() + d);
    }

    /// Moves the clock to `t` if that is later (time never goes backwards).
    pub fn advance_to(&self, t: Instant) {
        if t > self.now.get() {
            self.now.set(t);
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.now.get()
    }
}

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A clock from a free-running tick counter and its frequency, such as the
/// AArch64 generic timer (`cntpct_el0`, `cntfrq_el0`).
pub fn ticks_to_instant(ticks: u64, hz: u64) -> Instant {
    if hz == 0 {
        return Instant::ZERO;
    }
    Instant::from_nanos(scale(ticks, NANOS_PER_SEC, hz))
}

/// The tick count of a counter running at `hz` when the clock of
/// [`ticks_to_instant`] reads `at` (rounded down): a deadline for a timer
/// compare register.
pub fn instant_to_ticks(at: Instant, hz: u64) -> u64 {
    scale(at.as_nanos(), hz, NANOS_PER_SEC)
}

/// `value * num / den` without overflow for any `value` (saturating at
/// `u64::MAX`) and without 128-bit division, which is a library call on
/// 64-bit targets: whole multiples of `den` and the remainder apart.
/// `num` and `den` are a frequency and 10^9 (either way round), so
/// `remainder * num` fits 64 bits for any frequency below 18 GHz; above
/// that the remainder's share is rounded down further.
fn scale(value: u64, num: u64, den: u64) -> u64 {
    let whole = (value / den).saturating_mul(num);
    let rest = value % den;
    let part = match rest.checked_mul(num) {
        Some(p) => p / den,
        None => rest / (den / num.max(1)).max(1),
    };
    whole.saturating_add(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_both_ways_without_overflow() {
        for hz in [1, 62_500_000, 1_000_000_000, 24_000_000_000] {
            for ticks in [0, 1, hz - 1, hz, 3 * hz + 7, u64::MAX / 2, u64::MAX] {
                let exact = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
                let got = ticks_to_instant(ticks, hz).as_nanos();
                if exact <= u128::from(u64::MAX) && hz <= 18_000_000_000 {
                    assert_eq!(u128::from(got), exact, "{ticks} ticks at {hz} Hz");
                }
                let back = instant_to_ticks(Instant::from_nanos(got), hz);
                assert!(
                    back <= ticks,
                    "{ticks} ticks at {hz} Hz came back as {back}"
                );
            }
        }
        assert_eq!(ticks_to_instant(5, 0), Instant::ZERO);
        assert_eq!(
            instant_to_ticks(Instant::from_nanos(1_500_000_000), 62_500_000),
            93_750_000
        );
    }

    #[test]
    fn manual_clock_is_monotonic() {
        let c = ManualClock::new(Instant::from_micros(10));
        c.advance(Duration::from_micros(5));
        c.advance_to(Instant::from_micros(3));
        assert_eq!(c.now(), Instant::from_micros(15));
    }

    #[test]
    fn ticks_convert_without_overflow() {
        assert_eq!(
            ticks_to_instant(62_500_000, 62_500_000),
            Instant::from_micros(1_000_000)
        );
        assert_eq!(
            ticks_to_instant(u64::MAX, 1_000_000_000).as_nanos(),
            u64::MAX
        );
        assert_eq!(ticks_to_instant(5, 0), Instant::ZERO);
    }
}
