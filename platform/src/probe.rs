//! Probes of the per-packet path's shape, for tests: how often a received
//! frame's headers are parsed, and how many queues a completion passes
//! through on its way from the transport to the host. Counted per thread
//! with the `testing` feature (host tests), so a test that runs its
//! engines on one thread reads exactly its own; without it each probe is
//! an empty inline function and nothing is counted.

#[cfg(feature = "testing")]
extern crate std;

/// What the probes counted on this thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Probes {
    /// Frames a network interface classified.
    pub rx_frames: u64,
    /// Full Ethernet/IP/UDP parses of received frames.
    pub rx_parses: u64,
    /// Completions that reached a host completion queue (the engine's
    /// completion ring, or a set's completion queue in shared memory),
    /// from the transport or refused at post.
    pub completions: u64,
    /// Queue-to-queue moves those completions made to get there: one each
    /// since the engine writes the shared-memory queues directly.
    pub completion_hops: u64,
}

#[cfg(feature = "testing")]
std::thread_local! {
    static PROBES: core::cell::Cell<Probes> = const {
        core::cell::Cell::new(Probes {
            rx_frames: 0,
            rx_parses: 0,
            completions: 0,
            completion_hops: 0,
        })
    };
}

/// Counts with `f` (nothing without the `testing` feature).
#[inline(always)]
pub(crate) fn count(f: impl FnOnce(&mut Probes)) {
    #[cfg(feature = "testing")]
    PROBES.with(|p| {
        let mut v = p.get();
        f(&mut v);
        p.set(v);
    });
    #[cfg(not(feature = "testing"))]
    let _ = f;
}

/// What the probes counted on this thread so far.
#[cfg(feature = "testing")]
pub fn probes() -> Probes {
    PROBES.with(|p| p.get())
}
