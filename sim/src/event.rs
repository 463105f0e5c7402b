//! The event queue: a binary heap keyed by `(time, sequence number)`, so
//! events at the same instant run in the order they were scheduled and a
//! run is exactly reproducible.
//!
//! The heap holds only 16-byte keys, `(time, sequence, slot)` packed in
//! a `u128` so that they order as `(time, sequence)`; the events
//! themselves (packets among them) sit in a slab whose slots are reused.
//! Sifting then moves one 16-byte word per level instead of a whole event,
//! and scheduling allocates nothing once the slab has grown to the run's
//! largest backlog.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use metaroce_core::Instant;

/// Bits of a key for the slot; the sequence number takes the 40 above
/// them (10^12 events per run), the time the top 64.
const SLOT_BITS: u32 = 24;
const SEQ_BITS: u32 = 40;

fn key(at: Instant, seq: u64, slot: u32) -> u128 {
    (u128::from(at.as_nanos()) << 64) | (u128::from(seq) << SLOT_BITS) | u128::from(slot)
}

fn key_time(key: u128) -> Instant {
    Instant::from_nanos((key >> 64) as u64)
}

fn key_slot(key: u128) -> usize {
    (key as usize) & ((1 << SLOT_BITS) - 1)
}

/// Pending events, earliest first; ties broken by scheduling order.
pub struct EventQueue<E> {
    /// Earliest first: `Reverse` turns the max-heap around.
    heap: BinaryHeap<Reverse<u128>>,
    /// Events by slot; `None` in free slots.
    slots: Vec<Option<E>>,
    /// Free slots, reused last freed first.
    free: Vec<u32>,
    next_seq: u64,
}

impl<E> core::fmt::Debug for EventQueue<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EventQueue")
            .field("pending", &self.heap.len())
            .field("scheduled", &self.next_seq)
            .finish()
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            next_seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Instant, event: E) {
        let seq = self.next_seq;
        assert!(seq < 1 << SEQ_BITS, "more than 2^40 events in one run");
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(event);
                slot
            }
            None => {
                let slot = self.slots.len() as u32;
                assert!(slot < 1 << SLOT_BITS, "more than 2^24 pending events");
                self.slots.push(Some(event));
                slot
            }
        };
        self.heap.push(Reverse(key(at, seq, slot)));
    }

    /// Removes and returns the earliest event.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        let Reverse(key) = self.heap.pop()?;
        let slot = key_slot(key);
        let event = self.slots[slot]
            .take()
            .expect("a queued key's slot holds its event");
        self.free.push(slot as u32);
        Some((key_time(key), event))
    }

    /// When the earliest event is due.
    pub fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|&Reverse(k)| key_time(k))
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Events ever scheduled.
    pub fn scheduled(&self) -> u64 {
        self.next_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_fifo() {
        let mut q = EventQueue::default();
        q.push(Instant::from_nanos(20), 'c');
        q.push(Instant::from_nanos(10), 'a');
        q.push(Instant::from_nanos(20), 'd');
        q.push(Instant::from_nanos(10), 'b');
        let order: Vec<char> = core::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ['a', 'b', 'c', 'd']);
        assert_eq!(q.scheduled(), 4);
        assert!(q.is_empty());
    }

    #[test]
    fn slots_are_reused_and_order_holds_across_reuse() {
        let mut q = EventQueue::default();
        for i in 0..100u64 {
            q.push(Instant::from_nanos(i % 7), i);
            if i % 3 == 2 {
                q.pop();
            }
        }
        let mut last = (Instant::ZERO, 0);
        while let Some((at, e)) = q.pop() {
            // Same instant: scheduled earlier first (values rise with
            // scheduling order).
            assert!(at > last.0 || (at == last.0 && e >= last.1), "{at:?} {e}");
            last = (at, e);
        }
        assert!(q.slots.len() <= 100 - 33 + 1, "slots {}", q.slots.len());
    }
}
