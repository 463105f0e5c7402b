//! What every board's multi-core bring-up shares, so a board names only
//! its PSCI conduit, its cores' MPIDRs and their stack size
//! ([`Board::Psci`], [`Board::mpidr_of`], [`Board::SECONDARY_STACK_PAGES`]):
//!
//! - the critical section of every core: it masks the core's exceptions
//!   (DAIF) and takes one lock shared by all cores
//!   (`metaroce_platform::spinlock::CoreLock`, owner [`Board::core_id`]);
//!   a nested acquire on the holding core neither spins nor unlocks.
//!   Atomics work because every board turns the MMU on (normal,
//!   inner-shareable, write-back memory) before any Rust code runs on a
//!   core;
//! - starting a secondary core: PSCI `CPU_ON` through
//!   `aarch64_rt::start_core` (MMU with the same identity map, FP, then a
//!   Rust closure on the core's own stack, a static of this module), then
//!   [`Board::secondary_init`] and the node's entry.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, Ordering};

use aarch64_rt::Stack;
use critical_section::RawRestoreState;
use metaroce_board::{Board, StartError};
use metaroce_platform::spinlock::{CoreLock, Locked};

use crate::hw::{ThisBoard, MAX_CORES};

/// One lock for every core.
static CRITICAL: CoreLock = CoreLock::new();
/// Set in the restore state of a nested acquire.
const NESTED: u64 = 1 << 63;

struct SmpCriticalSection;
critical_section::set_impl!(SmpCriticalSection);

// SAFETY: `acquire` masks every exception, so nothing else runs in this
// context on this core, and `CRITICAL` excludes every other core (a core
// holding it never waits for another); a nested acquire on the holding
// core neither spins nor unlocks. `release` unlocks only what its
// `acquire` locked, then restores the DAIF bits it saved.
unsafe impl critical_section::Impl for SmpCriticalSection {
    unsafe fn acquire() -> RawRestoreState {
        let daif: u64;
        // SAFETY: reading DAIF and masking exceptions has no memory effects.
        unsafe {
            asm!("mrs {}, daif", "msr daifset, #0xf", out(reg) daif, options(nomem, nostack))
        };
        match CRITICAL.lock(ThisBoard::core_id()) {
            Locked::Outermost => daif,
            Locked::Nested => daif | NESTED,
        }
    }

    unsafe fn release(state: RawRestoreState) {
        CRITICAL.unlock(if state & NESTED != 0 {
            Locked::Nested
        } else {
            Locked::Outermost
        });
        let daif = state & !NESTED;
        // SAFETY: restores the mask saved by `acquire`.
        unsafe { asm!("msr daif, {}", in(reg) daif, options(nomem, nostack)) };
    }
}

const PAGES: usize = <ThisBoard as Board>::SECONDARY_STACK_PAGES;

/// Stacks of cores 1.. (`Board::SECONDARY_STACK_PAGES` each).
static mut SECONDARY_STACKS: [Stack<PAGES>; MAX_CORES - 1] =
    [const { Stack::new() }; MAX_CORES - 1];
static STARTED: [AtomicBool; MAX_CORES] = [const { AtomicBool::new(false) }; MAX_CORES];

/// Starts core `core` (1..`MAX_CORES`) with PSCI `CPU_ON` through the
/// board's conduit, running [`Board::secondary_init`] then `entry` (which
/// must never return) on its own stack.
pub fn start_secondary<F: FnOnce() + Send + 'static>(
    core: usize,
    entry: F,
) -> Result<(), StartError> {
    if core == 0 || core >= MAX_CORES {
        return Err(StartError::NoSuchCore);
    }
    if STARTED[core].swap(true, Ordering::AcqRel) {
        return Err(StartError::AlreadyStarted);
    }
    // SAFETY: `STARTED` hands each stack out once, to its core alone; the
    // stacks are in the image, mapped as normal memory by the identity map
    // every core uses, with the same attributes, for the whole program.
    let stack = unsafe { &raw mut SECONDARY_STACKS[core - 1] };
    // SAFETY: as above; `start_core` writes the closure at the stack's end
    // before `CPU_ON`, and the new core is its only user afterwards.
    unsafe {
        aarch64_rt::start_core::<<ThisBoard as Board>::Psci, _, PAGES>(
            ThisBoard::mpidr_of(core),
            stack,
            move || {
                ThisBoard::secondary_init();
                entry()
            },
        )
    }
    .map_err(|e| StartError::Psci(i32::try_from(i64::from(e)).unwrap_or(i32::MIN)))
}
