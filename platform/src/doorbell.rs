//! Doorbells: how one side of a ring tells the other that there is work.
//!
//! On a NIC a doorbell is an MMIO register write (virtio's queue notify, a
//! DPU's host-interface doorbell page); in shared memory it is a flag the
//! other side polls or an interrupt it takes. The engine loop rings the
//! completion-queue doorbell after writing completions and checks the
//! send/receive-queue doorbells before draining them.

use core::sync::atomic::{AtomicU32, Ordering};

/// A doorbell. Ringing is cheap and may coalesce: several rings before one
/// `take` count as one.
pub trait Doorbell {
    /// Signals the other side.
    fn ring(&self);
    /// Consumes a pending signal: whether the doorbell rang since the last
    /// `take`.
    fn take(&self) -> bool;
}

/// A doorbell in (shared) memory: a ring counter the other side polls.
///
/// `ring` is a Release increment so everything written before it (ring
/// entries, indices) is visible to whoever sees the new count with Acquire.
#[derive(Debug, Default)]
pub struct AtomicDoorbell {
    rung: AtomicU32,
    seen: AtomicU32,
}

impl AtomicDoorbell {
    /// A doorbell that has not rung.
    pub const fn new() -> Self {
        AtomicDoorbell {
            rung: AtomicU32::new(0),
            seen: AtomicU32::new(0),
        }
    }

    /// How many times it has rung in total (wrapping).
    pub fn count(&self) -> u32 {
        self.rung.load(Ordering::Acquire)
    }
}

impl Doorbell for AtomicDoorbell {
    fn ring(&self) {
        self.rung.fetch_add(1, Ordering::Release);
    }

    fn take(&self) -> bool {
        let rung = self.rung.load(Ordering::Acquire);
        // Only the side that waits on this doorbell calls `take`.
        self.seen.swap(rung, Ordering::Relaxed) != rung
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_coalesce_until_taken() {
        let bell = AtomicDoorbell::new();
        assert!(!bell.take());
        bell.ring();
        bell.ring();
        assert!(bell.take());
        assert!(!bell.take());
        assert_eq!(bell.count(), 2);
    }
}
