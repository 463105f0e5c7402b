//! The board the node runs on, as the node reaches it: every call goes
//! through `metaroce_board::Board` for the one board the image is built
//! for ([`ThisBoard`], named by the engine crate's board feature), so it
//! compiles to a direct call of the board's driver.

use metaroce_board::Board;
use metaroce_core::Instant;
use metaroce_platform::entropy::{EntropyError, Seed};

pub use crate::engine::ThisBoard;
pub use metaroce_board::StartError;

/// Core 0's interrupt controller.
pub type Interrupts = <ThisBoard as Board>::Interrupts;
/// A secondary core's interrupts.
pub type CoreInterrupts = <ThisBoard as Board>::CoreInterrupts;
/// Buffers of the network device.
pub type NetBuffers = <ThisBoard as Board>::NetBuffers;
/// Most cores that run an engine.
pub const MAX_CORES: usize = <ThisBoard as Board>::MAX_CORES;

#[cfg(all(feature = "bench-role", feature = "qemu-virt"))]
pub use board_qemu_virt_drivers::hw::{pmu_read, pmu_start};

/// Writes a line to the console (see [`println`](crate::println)).
#[inline]
pub fn console_write_line(line: &metaroce_board::console::Line<'_>) {
    ThisBoard::write_line(line)
}

/// `println!` to the board's console; lines from several cores never mix.
/// The format strings are `console_line!`'s, a subset of `format_args!`'s
/// with the same output, and no `core::fmt` (its machinery costs about
/// 5 KB of the code budget): see `metaroce_board::console`.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        $crate::hw::console_write_line(&::metaroce_board::console_line!($($arg)*));
    }};
}

/// Ends the run with `code`.
#[inline]
pub fn exit(code: u32) -> ! {
    ThisBoard::exit(code)
}

/// Time since boot.
#[inline]
pub fn now() -> Instant {
    ThisBoard::now()
}

/// Ticks of the architected counter.
#[inline]
pub fn counter() -> u64 {
    ThisBoard::counter()
}

/// Ticks per second of [`counter`].
#[inline]
pub fn timer_hz() -> u64 {
    ThisBoard::timer_hz()
}

/// The board's entropy source (the engine's reseeding source too).
#[inline]
pub fn entropy(out: &mut Seed) -> Result<(), EntropyError> {
    ThisBoard::entropy(out)
}

/// Finds and starts the entropy source.
#[inline]
pub fn init_entropy() -> Result<(), EntropyError> {
    ThisBoard::init_entropy()
}

/// The calling core's number.
#[inline]
pub fn core_id() -> usize {
    ThisBoard::core_id()
}

pub use crate::cores::start_secondary;

/// Wakes core `core` if it sleeps.
#[inline]
pub fn wake(core: usize) {
    ThisBoard::wake(core)
}

/// Sleeps through `wait(ctx)` unless `has_work(ctx)`.
#[inline]
pub fn sleep<T: ?Sized>(ctx: &mut T, has_work: impl FnOnce(&T) -> bool, wait: impl FnOnce(&mut T)) {
    ThisBoard::sleep(ctx, has_work, wait)
}
