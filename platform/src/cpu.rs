//! What every aarch64 board shares below its interrupt controller: the Arm
//! architected (generic) timer, the clock of every board
//! ([`counter`], [`timer_hz`], [`now`]), and sleeping until an interrupt
//! or a deadline on the core's EL1 virtual timer
//! ([`wait_for_interrupt`]). A board's GIC driver (QEMU's GICv2, the
//! Elba's GICv3) only acknowledges what woke the core. Firmware only
//! (`aarch64`, no operating system); `unsafe` only for the system
//! registers, each block with `SAFETY:`. `#[inline]`: compiled in the
//! calling crate (the boards' drivers, built for size), not at this
//! crate's speed-first opt-level, which would inline the clock's scaling
//! into each of them.

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering};

use metaroce_core::Instant;

use crate::clock::{instant_to_ticks, ticks_to_instant};

static TIMER_HZ: AtomicU64 = AtomicU64::new(0);

/// Ticks per second of the generic timer's counter (`CNTFRQ_EL0`, read
/// once).
#[inline]
pub fn timer_hz() -> u64 {
    let hz = TIMER_HZ.load(Ordering::Relaxed);
    if hz != 0 {
        return hz;
    }
    let hz: u64;
    // SAFETY: reading the counter frequency register has no side effects.
    unsafe { asm!("mrs {}, cntfrq_el0", out(reg) hz, options(nomem, nostack)) };
    TIMER_HZ.store(hz, Ordering::Relaxed);
    hz
}

/// The virtual counter (`CNTVCT_EL0`).
#[inline]
pub fn counter() -> u64 {
    let ticks: u64;
    // SAFETY: the ISB orders the read after earlier instructions; reading
    // the virtual counter has no side effects.
    unsafe { asm!("isb", "mrs {}, cntvct_el0", out(reg) ticks, options(nomem, nostack)) };
    ticks
}

/// Time since the counter started, from the virtual counter.
#[inline]
pub fn now() -> Instant {
    ticks_to_instant(counter(), timer_hz())
}

/// Sleeps until an interrupt is pending at this core or `deadline` (the
/// core's EL1 virtual timer, banked per core, armed for it and disarmed
/// after). IRQs stay masked, so none is taken: the caller acknowledges
/// what is pending at its interrupt controller.
#[inline]
pub fn wait_for_interrupt(deadline: Instant) {
    let ticks = instant_to_ticks(deadline, timer_hz());
    // SAFETY: programs the EL1 virtual timer (compare value, enabled and
    // unmasked), then waits for an interrupt: IRQs are masked, so none is
    // taken (a pending one still ends the wait); no memory effects.
    unsafe {
        asm!("msr cntv_cval_el0, {}", "msr cntv_ctl_el0, {}", "isb", "dsb sy", "wfi",
             in(reg) ticks, in(reg) 1u64, options(nomem, nostack));
    }
    // SAFETY: disables the EL1 virtual timer; no memory effects.
    unsafe { asm!("msr cntv_ctl_el0, {}", "isb", in(reg) 0u64, options(nomem, nostack)) };
}
