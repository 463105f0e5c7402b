//! A spinlock for the boards' `critical-section` implementations when
//! several cores run the firmware.
//!
//! On one core, masking exceptions (DAIF) is a whole critical section. On
//! several, each core masks its own exceptions *and* takes one lock shared
//! by all cores; [`CoreLock`] is that lock. It records which core holds it,
//! so a nested `critical_section::with` on the same core does not deadlock
//! against itself: the inner acquire sees its own core id and only the
//! outermost release unlocks. The board does the masking (assembly) and
//! calls [`CoreLock::lock`] / [`CoreLock::unlock`] with its core id.
//!
//! Atomics need the MMU on (normal, cacheable, inner-shareable memory) for
//! exclusive loads and stores to work between cores on real hardware;
//! `aarch64-rt` turns it on before any Rust code runs, on every core.

use core::sync::atomic::{AtomicUsize, Ordering};

/// Held by nobody.
const FREE: usize = usize::MAX;

/// A spinlock owned by one core at a time, re-entrant on that core.
#[derive(Debug)]
pub struct CoreLock {
    /// The holding core's id, or [`FREE`].
    owner: AtomicUsize,
}

impl Default for CoreLock {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`CoreLock::lock`] did: pass it back to [`CoreLock::unlock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Locked {
    /// This call took the lock; its unlock frees it.
    Outermost,
    /// This core already held it (a nested critical section); its unlock
    /// leaves it held.
    Nested,
}

impl CoreLock {
    /// An unlocked lock (usable in a `static`).
    pub const fn new() -> Self {
        CoreLock {
            owner: AtomicUsize::new(FREE),
        }
    }

    /// Takes the lock for core `core` (any id but `usize::MAX`), spinning
    /// while another core holds it. The caller has masked this core's
    /// exceptions, so nothing on this core can interrupt the holder.
    pub fn lock(&self, core: usize) -> Locked {
        // Only this core ever stores its own id, so reading it back means
        // this core holds the lock (program order), whatever the others do.
        if self.owner.load(Ordering::Relaxed) == core {
            return Locked::Nested;
        }
        loop {
            // Acquire: what the previous holder wrote inside its critical
            // section is visible to ours.
            if self
                .owner
                .compare_exchange_weak(FREE, core, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Locked::Outermost;
            }
            while self.owner.load(Ordering::Relaxed) != FREE {
                core::hint::spin_loop();
            }
        }
    }

    /// Gives back what [`Self::lock`] took.
    pub fn unlock(&self, locked: Locked) {
        if locked == Locked::Outermost {
            // Release: our critical section's writes before the next holder's.
            self.owner.store(FREE, Ordering::Release);
        }
    }

    /// The core holding the lock, if any (diagnostics).
    pub fn holder(&self) -> Option<usize> {
        let owner = self.owner.load(Ordering::Relaxed);
        (owner != FREE).then_some(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::UnsafeCell;

    #[test]
    fn nesting_on_one_core_keeps_the_lock_until_the_outermost_unlock() {
        let lock = CoreLock::new();
        let outer = lock.lock(3);
        assert_eq!(outer, Locked::Outermost);
        let inner = lock.lock(3);
        assert_eq!(inner, Locked::Nested);
        lock.unlock(inner);
        assert_eq!(lock.holder(), Some(3));
        lock.unlock(outer);
        assert_eq!(lock.holder(), None);
    }

    /// A counter only touched under the lock.
    struct Guarded(UnsafeCell<u64>);
    // SAFETY: the test touches the cell only while holding the lock.
    unsafe impl Sync for Guarded {}

    #[test]
    fn cores_exclude_each_other() {
        const ROUNDS: u64 = 20_000;
        let lock = CoreLock::new();
        let counter = Guarded(UnsafeCell::new(0));
        std::thread::scope(|s| {
            for core in 0..4 {
                let (lock, counter) = (&lock, &counter);
                s.spawn(move || {
                    for _ in 0..ROUNDS {
                        let outer = lock.lock(core);
                        let inner = lock.lock(core);
                        // SAFETY: we hold the lock; no other thread touches
                        // the counter now.
                        unsafe {
                            let v = core::ptr::read_volatile(counter.0.get());
                            core::ptr::write_volatile(counter.0.get(), v + 1);
                        }
                        lock.unlock(inner);
                        lock.unlock(outer);
                    }
                });
            }
        });
        assert_eq!(counter.0.into_inner(), 4 * ROUNDS);
        assert_eq!(lock.holder(), None);
    }
}
