//! Single-producer, single-consumer descriptor rings.
//!
//! A ring is `N` fixed slots plus two free-running 32-bit indices, as in
//! virtio and NIC descriptor rings: the producer owns `head` (next slot to
//! fill), the consumer owns `tail` (next slot to drain). The slot of index
//! `i` is `i % N`; `head - tail` (wrapping) is the fill level, so `N` must
//! be a power of two and at most 2^31.
//!
//! Memory ordering is the usual publication protocol: the producer writes
//! the slot, then stores `head` with `Release`; the consumer loads `head`
//! with `Acquire` before reading the slot. Symmetrically the consumer stores
//! `tail` with `Release` after it is done with a slot and the producer loads
//! it with `Acquire` before reusing it. That is all a device on the other
//! side of shared memory (or another thread) needs.
//!
//! The ring lives anywhere: a local, a `static`, or shared memory. It hands
//! out exactly one [`Producer`] and one [`Consumer`] ([`SpscRing::split`]
//! succeeds once), which is what makes the unsynchronised slot access sound.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The producer half of a descriptor ring.
pub trait RingProducer<T> {
    /// Appends `item`, or gives it back if the ring is full.
    fn push(&mut self, item: T) -> Result<(), T>;
    /// Slots free right now (the consumer may free more concurrently).
    fn free(&self) -> usize;
    /// Whether no slot is free right now.
    fn is_full(&self) -> bool {
        self.free() == 0
    }
}

/// The consumer half of a descriptor ring.
pub trait RingConsumer<T> {
    /// Calls `f` on the oldest item in place (its slot), then releases the
    /// slot. `None` if the ring is empty.
    fn pop_with<R>(&mut self, f: impl FnOnce(&T) -> R) -> Option<R>;
    /// A copy of the oldest item without releasing it.
    fn peek(&self) -> Option<T>;
    /// Items waiting right now (the producer may add more concurrently).
    fn len(&self) -> usize;
    /// Removes and returns the oldest item.
    fn pop(&mut self) -> Option<T>
    where
        T: Copy,
    {
        self.pop_with(|item| *item)
    }
    /// Whether no item is waiting right now.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A descriptor ring that can be split into its two halves.
pub trait DescriptorRing<T> {
    type Producer<'a>: RingProducer<T>
    where
        Self: 'a;
    type Consumer<'a>: RingConsumer<T>
    where
        Self: 'a;
    /// Number of slots.
    fn capacity(&self) -> usize;
    /// The producer and consumer halves; `None` after the first call.
    fn split(&self) -> Option<(Self::Producer<'_>, Self::Consumer<'_>)>;
}

/// A ring of `N` slots of `T` (`N` a power of two), usable from a local, a
/// `static` or shared memory. See the module documentation for the protocol.
pub struct SpscRing<T: Copy, const N: usize> {
    /// Next index the producer fills. Written only by the producer.
    head: AtomicU32,
    /// Next index the consumer drains. Written only by the consumer.
    tail: AtomicU32,
    /// Set once the halves have been handed out.
    split: AtomicBool,
    /// Whether slots may still be uninitialised (`new`); `false` when every
    /// slot was written at construction (`with_blank_slots`), which is what
    /// lets a producer fill a slot in place. Stored inverted so that a
    /// blank-slot ring of zeroes is all zero bytes (a `static` of it stays
    /// in `.bss`).
    slots_maybe_uninit: bool,
    slots: [UnsafeCell<MaybeUninit<T>>; N],
}

// SAFETY: slots are only touched through the single `Producer` and the single
// `Consumer` (`split` hands them out once), and the head/tail protocol gives
// each slot to exactly one of them at a time, with Acquire/Release ordering
// publishing the slot's contents. `T: Send` because items cross threads.
unsafe impl<T: Copy + Send, const N: usize> Sync for SpscRing<T, N> {}

impl<T: Copy, const N: usize> core::fmt::Debug for SpscRing<T, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SpscRing")
            .field("capacity", &N)
            .field("head", &self.head.load(Ordering::Relaxed))
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T: Copy, const N: usize> Default for SpscRing<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Copy, const N: usize> SpscRing<T, N> {
    const CHECK: () = assert!(
        N.is_power_of_two() && N <= 1 << 31,
        "ring size must be a power of two and at most 2^31"
    );

    /// An empty ring (usable in a `static`).
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        SpscRing {
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            split: AtomicBool::new(false),
            slots_maybe_uninit: true,
            slots: [const { UnsafeCell::new(MaybeUninit::uninit()) }; N],
        }
    }

    /// An empty ring whose every slot starts as a copy of `blank`, so the
    /// producer can fill slots in place ([`Producer::push_with`]) instead
    /// of building an item elsewhere and copying it in: what a frame ring
    /// wants, where an item is a 1.5 KiB buffer.
    pub const fn with_blank_slots(blank: T) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        let mut slots = [const { UnsafeCell::new(MaybeUninit::uninit()) }; N];
        let mut i = 0;
        while i < N {
            slots[i] = UnsafeCell::new(MaybeUninit::new(blank));
            i += 1;
        }
        SpscRing {
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            split: AtomicBool::new(false),
            slots_maybe_uninit: false,
            slots,
        }
    }

    /// Number of slots.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Items in the ring right now.
    pub fn len(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        head.wrapping_sub(tail) as usize
    }

    /// Whether the ring is empty right now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The producer and consumer halves. Succeeds once per ring, so there is
    /// never a second producer or consumer.
    pub fn split(&self) -> Option<(Producer<'_, T, N>, Consumer<'_, T, N>)> {
        if self.split.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some((Producer { ring: self }, Consumer { ring: self }))
    }

    /// The producer and consumer halves, for an owner that holds the ring
    /// exclusively (a single-threaded host program or simulator that keeps
    /// the ring beside the code using both halves). The `&mut` borrow proves
    /// no other half is alive, so the halves can be handed out again; the
    /// ring's contents and indices are kept.
    pub fn split_mut(&mut self) -> (Producer<'_, T, N>, Consumer<'_, T, N>) {
        *self.split.get_mut() = true;
        let ring: &Self = self;
        (Producer { ring }, Consumer { ring })
    }

    fn slot(&self, index: u32) -> *mut MaybeUninit<T> {
        // `N` is a power of two, so this is `index % N` and in bounds.
        self.slots[index as usize & (N - 1)].get()
    }
}

impl<T: Copy, const N: usize> DescriptorRing<T> for SpscRing<T, N> {
    type Producer<'a>
        = Producer<'a, T, N>
    where
        Self: 'a;
    type Consumer<'a>
        = Consumer<'a, T, N>
    where
        Self: 'a;

    fn capacity(&self) -> usize {
        N
    }

    fn split(&self) -> Option<(Producer<'_, T, N>, Consumer<'_, T, N>)> {
        SpscRing::split(self)
    }
}

/// The only producer of an [`SpscRing`].
pub struct Producer<'a, T: Copy, const N: usize> {
    ring: &'a SpscRing<T, N>,
}

impl<T: Copy, const N: usize> core::fmt::Debug for Producer<'_, T, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Producer").field(self.ring).finish()
    }
}

impl<T: Copy, const N: usize> RingProducer<T> for Producer<'_, T, N> {
    fn push(&mut self, item: T) -> Result<(), T> {
        // Only this producer writes `head`.
        let head = self.ring.head.load(Ordering::Relaxed);
        // Acquire: the consumer is done with every slot before `tail`.
        let tail = self.ring.tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) as usize >= N {
            return Err(item);
        }
        // SAFETY: the slot of `head` is outside `[tail, head)`, so the
        // consumer does not read it until we publish `head + 1` below, and we
        // are the only producer.
        unsafe { (*self.ring.slot(head)).write(item) };
        // Release: the slot's contents are visible before the new head.
        self.ring
            .head
            .store(head.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    fn free(&self) -> usize {
        N - self.ring.len()
    }
}

impl<T: Copy, const N: usize> Producer<'_, T, N> {
    /// Fills the next free slot in place and publishes it: `fill` gets the
    /// slot (holding an older item, or the blank it was made with) and
    /// returns `Some` to publish it or `None` to leave the ring unchanged.
    /// `None` also if the ring is full or was not made with
    /// [`SpscRing::with_blank_slots`] (its slots may be uninitialised).
    pub fn push_with<R>(&mut self, fill: impl FnOnce(&mut T) -> Option<R>) -> Option<R> {
        if self.ring.slots_maybe_uninit {
            return None;
        }
        // Only this producer writes `head`.
        let head = self.ring.head.load(Ordering::Relaxed);
        // Acquire: the consumer is done with every slot before `tail`.
        let tail = self.ring.tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) as usize >= N {
            return None;
        }
        // SAFETY: the slot of `head` is outside `[tail, head)`, so the
        // consumer does not touch it until we publish `head + 1`, and we
        // are the only producer; it is initialised because the ring was
        // made with `with_blank_slots` and slots are only ever overwritten
        // with whole items.
        let slot = unsafe { (*self.ring.slot(head)).assume_init_mut() };
        let result = fill(slot)?;
        // Release: the slot's contents are visible before the new head.
        self.ring
            .head
            .store(head.wrapping_add(1), Ordering::Release);
        Some(result)
    }
}

/// The only consumer of an [`SpscRing`].
pub struct Consumer<'a, T: Copy, const N: usize> {
    ring: &'a SpscRing<T, N>,
}

impl<T: Copy, const N: usize> core::fmt::Debug for Consumer<'_, T, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("Consumer").field(self.ring).finish()
    }
}

impl<T: Copy, const N: usize> Consumer<'_, T, N> {
    /// The oldest slot, if any: `(tail index, slot pointer)`.
    fn front(&self) -> Option<(u32, *mut MaybeUninit<T>)> {
        // Only this consumer writes `tail`.
        let tail = self.ring.tail.load(Ordering::Relaxed);
        // Acquire: pairs with the producer's Release store of `head`.
        let head = self.ring.head.load(Ordering::Acquire);
        (head != tail).then(|| (tail, self.ring.slot(tail)))
    }
}

impl<T: Copy, const N: usize> RingConsumer<T> for Consumer<'_, T, N> {
    fn pop_with<R>(&mut self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let (tail, slot) = self.front()?;
        // SAFETY: the slot of `tail` is inside `[tail, head)`: the producer
        // initialised it and published it with `head` (Acquire above), and it
        // does not write it again until we release it below.
        let result = f(unsafe { (*slot).assume_init_ref() });
        // Release: we are done reading before the producer may reuse it.
        self.ring
            .tail
            .store(tail.wrapping_add(1), Ordering::Release);
        Some(result)
    }

    fn peek(&self) -> Option<T> {
        let (_, slot) = self.front()?;
        // SAFETY: as in `pop_with`; the slot stays ours because we do not
        // advance `tail`.
        Some(unsafe { (*slot).assume_init_read() })
    }

    fn len(&self) -> usize {
        self.ring.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn empty_full_and_order() {
        let ring: SpscRing<u32, 4> = SpscRing::new();
        let (mut p, mut c) = ring.split().unwrap();
        assert!(ring.split().is_none(), "second split must fail");
        assert!(c.is_empty());
        assert_eq!(c.pop(), None);
        assert_eq!(c.peek(), None);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        assert!(p.is_full());
        assert_eq!(p.push(99), Err(99));
        assert_eq!(c.len(), 4);
        assert_eq!(c.peek(), Some(0));
        assert_eq!(c.pop(), Some(0));
        assert_eq!(p.free(), 1);
        p.push(4).unwrap();
        let drained: Vec<u32> = core::iter::from_fn(|| c.pop()).collect();
        assert_eq!(drained, [1, 2, 3, 4]);
        assert!(c.is_empty());
    }

    #[test]
    fn exclusive_owner_splits_again_and_keeps_the_contents() {
        let mut ring: SpscRing<u32, 4> = SpscRing::new();
        {
            let (mut p, _) = ring.split_mut();
            p.push(1).unwrap();
            p.push(2).unwrap();
        }
        {
            let (_, mut c) = ring.split_mut();
            assert_eq!(c.pop(), Some(1));
        }
        let (mut p, mut c) = ring.split_mut();
        p.push(3).unwrap();
        let drained: Vec<u32> = core::iter::from_fn(|| c.pop()).collect();
        assert_eq!(drained, [2, 3]);
        assert!(
            ring.split().is_none(),
            "shared split stays refused afterwards"
        );
    }

    #[test]
    fn indices_wrap_around_u32() {
        let ring: SpscRing<u64, 8> = SpscRing::new();
        // Start just before the 32-bit wrap to exercise it.
        ring.head.store(u32::MAX - 3, Ordering::Relaxed);
        ring.tail.store(u32::MAX - 3, Ordering::Relaxed);
        let (mut p, mut c) = ring.split().unwrap();
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..50 {
            let burst = round % 9;
            for _ in 0..burst {
                if p.push(next_in).is_ok() {
                    next_in += 1;
                }
            }
            assert!(c.len() <= 8);
            for _ in 0..(round % 7) {
                match c.pop() {
                    Some(v) => {
                        assert_eq!(v, next_out);
                        next_out += 1;
                    }
                    None => break,
                }
            }
        }
        while let Some(v) = c.pop() {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert_eq!(next_in, next_out);
        assert!(ring.head.load(Ordering::Relaxed) < 1000, "head wrapped");
    }

    #[test]
    fn pop_with_reads_the_slot_in_place() {
        let ring: SpscRing<[u8; 64], 2> = SpscRing::new();
        let (mut p, mut c) = ring.split().unwrap();
        p.push([7; 64]).unwrap();
        let sum = c.pop_with(|slot| slot.iter().map(|&b| u32::from(b)).sum::<u32>());
        assert_eq!(sum, Some(7 * 64));
        assert!(c.is_empty());
    }

    #[test]
    fn blank_slots_are_filled_in_place() {
        let ring: SpscRing<[u8; 8], 2> = SpscRing::with_blank_slots([0; 8]);
        let (mut p, mut c) = ring.split().unwrap();
        assert_eq!(p.push_with(|slot| Some(slot[0])), Some(0), "blank slot");
        assert_eq!(p.push_with(|_| None::<()>), None, "declined: not published");
        assert_eq!(c.len(), 1);
        p.push_with(|slot| {
            slot[1] = 7;
            Some(())
        })
        .unwrap();
        assert_eq!(p.push_with(|_| Some(())), None, "full");
        assert_eq!(c.pop(), Some([0; 8]));
        assert_eq!(c.pop().map(|s| s[1]), Some(7));
        // The first slot comes round again holding the old item.
        assert_eq!(p.push_with(|slot| Some(*slot)), Some([0; 8]));
        let plain: SpscRing<u8, 2> = SpscRing::new();
        let (mut p, _) = plain.split().unwrap();
        assert_eq!(
            p.push_with(|_| Some(())),
            None,
            "slots may be uninitialised"
        );
    }

    #[test]
    fn threads_see_every_item_once_in_order() {
        const ITEMS: u64 = 200_000;
        let ring: SpscRing<u64, 16> = SpscRing::new();
        let (mut p, mut c) = ring.split().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..ITEMS {
                    let mut item = i;
                    while let Err(back) = p.push(item) {
                        item = back;
                        std::thread::yield_now();
                    }
                }
            });
            let mut expected = 0;
            while expected < ITEMS {
                match c.pop() {
                    Some(v) => {
                        assert_eq!(v, expected);
                        expected += 1;
                    }
                    None => std::thread::yield_now(),
                }
            }
        });
        assert!(ring.is_empty());
    }
}
