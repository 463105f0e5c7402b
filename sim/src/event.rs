//! The event queue: a binary heap keyed by `(time, sequence number)`, so
//! events at the same instant run in the order they were scheduled and a
//! run is exactly reproducible.
//!
//! The heap holds only small keys; the events themselves (packets among
//! them) sit in a slab whose slots are reused, so sifting moves 24 bytes
//! per level instead of a whole event, and scheduling allocates nothing
//! once the slab has grown to the run's largest backlog.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use metaroce_core::Instant;

/// What the heap orders: when, the scheduling order for ties, and where
/// the event waits in the slab.
#[derive(Clone, Copy)]
struct Key {
    at: Instant,
    seq: u64,
    slot: u32,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest event must
    /// come out first. Sequence numbers are unique, so no two keys tie.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Pending events, earliest first; ties broken by scheduling order.
pub struct EventQueue<E> {
    heap: BinaryHeap<Key>,
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
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(event);
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 pending events");
                self.slots.push(Some(event));
                slot
            }
        };
        self.heap.push(Key { at, seq, slot });
    }

    /// Removes and returns the earliest event.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        let key = self.heap.pop()?;
        let event = self.slots[key.slot as usize]
            .take()
            .expect("a queued key's slot holds its event");
        self.free.push(key.slot);
        Some((key.at, event))
    }

    /// When the earliest event is due.
    pub fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|k| k.at)
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
