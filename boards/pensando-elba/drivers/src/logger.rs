//! The defmt global logger: frames are rzCOBS-encoded by `defmt::Encoder`
//! and written straight to the 16550 console (what `defmt-serial` does,
//! without its dependency). Decode them on the host with the ELF, e.g.
//! `defmt-print -e board-pensando-elba.elf < /dev/ttyUSB0`; text printed
//! before the first frame (the boot banner) is skipped by the decoder's
//! resynchronisation at the next frame delimiter. Timestamps are
//! microseconds of the generic timer, then the core that logged. A frame
//! is written whole inside the critical section, which with several cores
//! is a lock they share, so frames of different cores never interleave.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use critical_section::RestoreState;

use crate::hw;

defmt::timestamp!(
    "{=u64:us} c{=u8}",
    hw::now().as_nanos() / 1_000,
    hw::core_index() as u8
);

#[defmt::global_logger]
struct Logger;

/// Logger state, touched only between `acquire` and `release`, inside a
/// critical section, by the one context holding `TAKEN`.
struct State {
    restore: RestoreState,
    encoder: defmt::Encoder,
}

struct Shared(UnsafeCell<State>);

// SAFETY: accessed only while `TAKEN` is held inside a critical section
// (exceptions masked on this core, the lock shared by all cores held), so
// never from two contexts or cores at once.
unsafe impl Sync for Shared {}

static TAKEN: AtomicBool = AtomicBool::new(false);
static STATE: Shared = Shared(UnsafeCell::new(State {
    restore: RestoreState::invalid(),
    encoder: defmt::Encoder::new(),
}));

/// # Safety
/// Only between `acquire` and `release` (the logger is taken).
unsafe fn state() -> &'static mut State {
    // SAFETY: the caller holds the logger inside a critical section, so
    // this is the only reference (see `Shared`).
    unsafe { &mut *STATE.0.get() }
}

fn emit(bytes: &[u8]) {
    hw::with_console(|uart| {
        // A console that times out loses log bytes, never the firmware.
        let _ = embedded_io::Write::write_all(uart, bytes);
    });
}

// SAFETY: `acquire` enters a critical section and takes the logger once;
// `release` gives both back; `write`/`flush` run only in between.
unsafe impl defmt::Logger for Logger {
    fn acquire() {
        // SAFETY: paired with the `release` in `Logger::release`.
        let restore = unsafe { critical_section::acquire() };
        if TAKEN.swap(true, Ordering::Acquire) {
            // Re-entered: nothing logs from interrupt context and the panic
            // handler does not use defmt, so this is a bug: stop here.
            hw::halt();
        }
        // SAFETY: we hold the logger inside the critical section.
        let st = unsafe { state() };
        st.restore = restore;
        st.encoder.start_frame(emit);
    }

    unsafe fn flush() {}

    unsafe fn release() {
        // SAFETY: defmt calls `release` only after a successful `acquire`.
        let st = unsafe { state() };
        st.encoder.end_frame(emit);
        let restore = st.restore;
        TAKEN.store(false, Ordering::Release);
        // SAFETY: leaves the critical section `acquire` entered.
        unsafe { critical_section::release(restore) };
    }

    unsafe fn write(bytes: &[u8]) {
        // SAFETY: between `acquire` and `release`.
        let st = unsafe { state() };
        st.encoder.write(bytes, emit);
    }
}
