//! The engine loop's entropy step (spec 5.1.6): an endpoint polled on a
//! virtual clock is reseeded from the platform's source exactly when its
//! policy says, a failing source is counted and retried a second later,
//! and what the endpoint draws after a reseed differs from what the same
//! generator would have drawn without it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use metaroce_core::api::{Access, Region, RxMeta};
use metaroce_core::rng::{seed_from_u64, ReseedPolicy};
use metaroce_core::{Config, Endpoint, Heap, Instant, Layout};
use metaroce_platform::dma::HostWindow;
use metaroce_platform::entropy::{EntropyError, Seed};
use metaroce_platform::{DatagramLink, DatagramTarget, Engine, HostQueues};

/// A link that never carries anything: the entropy step needs no traffic.
struct Quiet;

impl DatagramLink for Quiet {
    fn max_packet_len(&self) -> usize {
        1500
    }

    fn receive<R>(&mut self, _f: impl FnOnce(&RxMeta, &[u8]) -> R) -> Option<R> {
        None
    }

    fn transmit_ready(&mut self) -> bool {
        true
    }

    fn transmit<R>(
        &mut self,
        _to: DatagramTarget,
        _len: usize,
        _f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        None
    }
}

static GOOD_CALLS: AtomicU32 = AtomicU32::new(0);
static BAD_CALLS: AtomicU32 = AtomicU32::new(0);

/// A fake source: distinct bytes on every call.
fn good_source(out: &mut Seed) -> Result<(), EntropyError> {
    let n = GOOD_CALLS.fetch_add(1, Ordering::Relaxed);
    for (i, b) in out.iter_mut().enumerate() {
        *b = (n as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    Ok(())
}

/// A source that has failed for good.
fn failing_source(_out: &mut Seed) -> Result<(), EntropyError> {
    BAD_CALLS.fetch_add(1, Ordering::Relaxed);
    Err(EntropyError::Failed)
}

fn endpoint(policy: ReseedPolicy) -> Endpoint<Heap, 4> {
    let mut ep = Endpoint::new(
        Config::default(),
        Layout::for_connections(4).heap_storage(),
        seed_from_u64(7),
    );
    ep.set_reseed_policy(policy);
    ep
}

fn secs(s: f64) -> Instant {
    Instant::from_nanos((s * 1e9) as u64)
}

/// Polls `ep` through `engine` at each time of `times`.
fn poll_at(engine: &mut Engine, ep: &mut Endpoint<Heap, 4>, times: &[f64]) {
    let mut queues: HostQueues<4, 4, 8, 2> = HostQueues::new();
    let (_, mut port) = queues.ports();
    let mut memory = vec![0u8; 4096];
    let mut window = HostWindow::new(0, &mut memory);
    for &t in times {
        let _ = engine.poll_datagrams(secs(t), ep, &mut Quiet, &mut port, &mut window);
    }
}

fn key_of(ep: &mut Endpoint<Heap, 4>) -> u32 {
    ep.register_region(Region {
        base: 0,
        len: 64,
        access: Access::LOCAL_WRITE,
        pd: 0,
    })
    .unwrap()
}

#[test]
fn the_loop_reseeds_on_the_interval_and_on_the_draw_count() {
    let mut ep = endpoint(ReseedPolicy {
        interval: Duration::from_secs(10),
        max_draws: 1 << 20,
    });
    let mut engine = Engine::for_datagrams();
    // No source: never reseeded, however long it runs.
    poll_at(&mut engine, &mut ep, &[0.0, 11.0, 30.0]);
    assert_eq!((ep.reseeds(), engine.stats().reseeds), (0, 0));

    engine.set_entropy_source(good_source);
    let calls = GOOD_CALLS.load(Ordering::Relaxed);
    // Due since t = 10 s: the next poll reseeds, the ones before the
    // next interval do not.
    poll_at(&mut engine, &mut ep, &[30.0, 31.0, 39.9]);
    assert_eq!(ep.reseeds(), 1);
    poll_at(&mut engine, &mut ep, &[40.0]);
    assert_eq!(ep.reseeds(), 2);
    assert_eq!(engine.stats().reseeds, 2);
    assert_eq!(GOOD_CALLS.load(Ordering::Relaxed) - calls, 2);

    // Many draws make it due before the interval.
    ep.set_reseed_policy(ReseedPolicy {
        interval: Duration::from_secs(10),
        max_draws: 8,
    });
    for _ in 0..8 {
        key_of(&mut ep);
    }
    poll_at(&mut engine, &mut ep, &[41.0]);
    assert_eq!(ep.reseeds(), 3);
    poll_at(&mut engine, &mut ep, &[42.0]);
    assert_eq!(ep.reseeds(), 3);
    assert_eq!(engine.stats().entropy_failures, 0);
}

#[test]
fn a_failing_source_is_counted_and_retried_a_second_later() {
    let mut ep = endpoint(ReseedPolicy {
        interval: Duration::from_secs(1),
        max_draws: 1 << 20,
    });
    let mut engine = Engine::for_datagrams();
    engine.set_entropy_source(failing_source);
    let calls = BAD_CALLS.load(Ordering::Relaxed);
    poll_at(&mut engine, &mut ep, &[1.0, 1.5, 1.99, 2.0, 2.5, 3.0]);
    // Tried at 1.0, 2.0 and 3.0, not at every poll.
    assert_eq!(BAD_CALLS.load(Ordering::Relaxed) - calls, 3);
    assert_eq!(engine.stats().entropy_failures, 3);
    assert_eq!(ep.reseeds(), 0);
    // The endpoint keeps working on its key meanwhile.
    key_of(&mut ep);
}

#[test]
fn secrets_drawn_after_a_reseed_differ_from_the_unreseeded_stream() {
    let policy = ReseedPolicy {
        interval: Duration::from_secs(5),
        max_draws: 1 << 20,
    };
    let mut reseeded = endpoint(policy);
    let mut unreseeded = endpoint(policy);
    assert_eq!(key_of(&mut reseeded), key_of(&mut unreseeded));
    let mut engine = Engine::for_datagrams();
    engine.set_entropy_source(good_source);
    poll_at(&mut engine, &mut reseeded, &[6.0]);
    assert_eq!(reseeded.reseeds(), 1);
    let after: Vec<u32> = (0..8).map(|_| key_of(&mut reseeded)).collect();
    let without: Vec<u32> = (0..8).map(|_| key_of(&mut unreseeded)).collect();
    // Keys carry 24 random bits above an 8-bit slot number: compare those.
    let random = |k: &u32| k >> 8;
    assert!(after
        .iter()
        .map(random)
        .zip(without.iter().map(random))
        .all(|(a, b)| a != b));
}
