//! The defmt global logger of every board: frames are rzCOBS-encoded by
//! `defmt::Encoder`, gathered in a 256-byte buffer and handed to the
//! board ([`Board::log_write`](metaroce_board::Board::log_write): QEMU's
//! semihosting, which the harness decodes with the ELF; the Elba's
//! console, where `defmt-print -e` decodes them and skips the text lines
//! between frames). Timestamps are microseconds of the generic timer, then
//! the core that logged (`c0`, `c1`, ...). A frame is written whole inside
//! the critical section, which with several cores is a lock they share, so
//! frames of different cores never interleave.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use critical_section::RestoreState;
use metaroce_board::Board;

use crate::hw::{self, ThisBoard};

defmt::timestamp!(
    "{=u64:us} c{=u8}",
    hw::now().as_nanos() / 1_000,
    hw::core_id() as u8
);

#[defmt::global_logger]
struct Logger;

/// Logger state, touched only between `acquire` and `release`, inside a
/// critical section (exceptions masked on this core, the cores' shared
/// lock held), by the one context holding `TAKEN`.
struct State {
    restore: RestoreState,
    encoder: defmt::Encoder,
    buf: [u8; 256],
    len: usize,
}

struct Shared(UnsafeCell<State>);

// SAFETY: accessed only while `TAKEN` is held inside a critical section
// (exceptions masked on this core and the lock shared by all cores held),
// so never from two contexts or two cores at once.
unsafe impl Sync for Shared {}

static TAKEN: AtomicBool = AtomicBool::new(false);
static STATE: Shared = Shared(UnsafeCell::new(State {
    restore: RestoreState::invalid(),
    encoder: defmt::Encoder::new(),
    buf: [0; 256],
    len: 0,
}));

/// # Safety
/// Only between `acquire` and `release` (the logger is taken).
unsafe fn state() -> &'static mut State {
    // SAFETY: the caller holds the logger inside a critical section, so
    // this is the only reference (see `Shared`).
    unsafe { &mut *STATE.0.get() }
}

// SAFETY: `acquire` enters a critical section and takes the logger once;
// `release` gives both back; `write`/`flush` run only in between.
unsafe impl defmt::Logger for Logger {
    fn acquire() {
        // SAFETY: paired with the `release` in `Logger::release`.
        let restore = unsafe { critical_section::acquire() };
        if TAKEN.swap(true, Ordering::Acquire) {
            // Re-entered (nothing logs from interrupt context, and the panic
            // handler does not use defmt): a bug, stop loudly.
            ThisBoard::log_fail();
        }
        // SAFETY: we hold the logger inside the critical section.
        let st = unsafe { state() };
        st.restore = restore;
        let State {
            encoder, buf, len, ..
        } = st;
        let mut tmp = StateWriter { buf, len };
        encoder.start_frame(|b| tmp.push(b));
    }

    unsafe fn flush() {}

    unsafe fn release() {
        // SAFETY: defmt calls `release` only after a successful `acquire`.
        let st = unsafe { state() };
        {
            let State {
                encoder, buf, len, ..
            } = &mut *st;
            let mut tmp = StateWriter { buf, len };
            encoder.end_frame(|b| tmp.push(b));
        }
        ThisBoard::log_write(&st.buf[..st.len]);
        st.len = 0;
        let restore = st.restore;
        TAKEN.store(false, Ordering::Release);
        // SAFETY: leaves the critical section `acquire` entered.
        unsafe { critical_section::release(restore) };
    }

    unsafe fn write(bytes: &[u8]) {
        // SAFETY: between `acquire` and `release`.
        let st = unsafe { state() };
        let State {
            encoder, buf, len, ..
        } = &mut *st;
        let mut tmp = StateWriter { buf, len };
        encoder.write(bytes, |b| tmp.push(b));
    }
}

/// Borrowed view of the frame buffer for the encoder's callback.
struct StateWriter<'a> {
    buf: &'a mut [u8; 256],
    len: &'a mut usize,
}

impl StateWriter<'_> {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if *self.len == self.buf.len() {
                ThisBoard::log_write(&self.buf[..]);
                *self.len = 0;
            }
            self.buf[*self.len] = b;
            *self.len += 1;
        }
    }
}
