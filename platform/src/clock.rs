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

/// A clock from a free-running tick counter and its frequency, such as the
/// AArch64 generic timer (`cntpct_el0`, `cntfrq_el0`).
pub fn ticks_to_instant(ticks: u64, hz: u64) -> Instant {
    if hz == 0 {
        return Instant::ZERO;
    }
    // 128-bit intermediate: no overflow for any 64-bit tick count.
    let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
    Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

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
