//! The event queue: pending events ordered by `(time, sequence number)`,
//! so events at the same instant run in the order they were scheduled and
//! a run is exactly reproducible.
//!
//! Most events fall due within a few microseconds (a packet's line time
//! and link delay), and events scheduled for the same nanosecond are
//! scheduled in sequence order. So the queue is a calendar: a ring of
//! one first-in first-out list per nanosecond of the next [`WINDOW`]
//! nanoseconds, a bitmap of the lists that hold events, and a binary heap
//! of 16-byte keys, `(time, sequence, slot)` packed in a `u128`, for the
//! events due later ([`EventQueue::far`]). Scheduling near is an append
//! to a list and taking the earliest is a look at the bitmap and a list's
//! head, where the binary heap of every event (a tenth of an all-to-all
//! run's time) sifted a key through a dozen levels each way.
//!
//! The order is exactly the heap's: a list holds one nanosecond's events
//! in sequence order, since events scheduled into it directly come in
//! that order, and those due later move from the far heap into the ring,
//! in key order, as soon as their nanosecond enters the window, before any
//! event can be scheduled into it directly. Events scheduled in the past
//! (before the last one taken; the simulator never does) wait in a heap
//! of their own that comes first ([`EventQueue::early`]).
//!
//! The events themselves (packets among them) sit in a slab whose slots
//! are reused and link each list; scheduling allocates nothing once the
//! slab has grown to the run's largest backlog.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use metaroce_core::Instant;

/// Bits of a key for the slot; the sequence number takes the 40 above
/// them (10^12 events per run), the time the top 64.
const SLOT_BITS: u32 = 24;
const SEQ_BITS: u32 = 40;

/// Nanoseconds the ring covers, from the last event taken on.
const WINDOW: u64 = 1 << 13;

/// No slot: the end of a list.
const NIL: u32 = u32::MAX;

fn key(at: u64, seq: u64, slot: u32) -> u128 {
    (u128::from(at) << 64) | (u128::from(seq) << SLOT_BITS) | u128::from(slot)
}

fn key_time(key: u128) -> u64 {
    (key >> 64) as u64
}

fn key_slot(key: u128) -> u32 {
    (key as u32) & ((1 << SLOT_BITS) - 1)
}

/// An event's place in the slab.
struct Slot<E> {
    /// `None` in free slots.
    event: Option<E>,
    /// The next slot of the same ring list.
    next: u32,
}

/// Pending events, earliest first; ties broken by scheduling order.
pub struct EventQueue<E> {
    /// The ring's first nanosecond: the time of the last event taken from
    /// the ring or the far heap (0 before the first). The ring holds the
    /// events due in `[cur, cur + WINDOW)`, the far heap those due later.
    cur: u64,
    /// Per nanosecond `t` of the window, at `t % WINDOW`: the first and
    /// last slot of its list (`NIL` when empty).
    lists: Vec<(u32, u32)>,
    /// Bit `i` of word `i / 64` set when list `i` holds events.
    occupied: Vec<u64>,
    /// Events in the ring.
    ring_len: usize,
    /// Keys of events due at or after `cur + WINDOW`, earliest first.
    far: BinaryHeap<Reverse<u128>>,
    /// Keys of events scheduled before `cur`, earliest first.
    early: BinaryHeap<Reverse<u128>>,
    slots: Vec<Slot<E>>,
    /// Free slots, reused last freed first.
    free: Vec<u32>,
    next_seq: u64,
}

impl<E> core::fmt::Debug for EventQueue<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EventQueue")
            .field("pending", &self.len())
            .field("scheduled", &self.next_seq)
            .finish()
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            cur: 0,
            lists: vec![(NIL, NIL); WINDOW as usize],
            occupied: vec![0; WINDOW as usize / 64],
            ring_len: 0,
            far: BinaryHeap::new(),
            early: BinaryHeap::new(),
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
        let slot = Slot {
            event: Some(event),
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                let i = self.slots.len() as u32;
                assert!(i < 1 << SLOT_BITS, "more than 2^24 pending events");
                self.slots.push(slot);
                i
            }
        };
        let t = at.as_nanos();
        if t < self.cur {
            self.early.push(Reverse(key(t, seq, slot)));
        } else if t - self.cur < WINDOW {
            self.append(t, slot);
        } else {
            self.far.push(Reverse(key(t, seq, slot)));
        }
    }

    /// Appends `slot` to the list of nanosecond `t` (in the window).
    fn append(&mut self, t: u64, slot: u32) {
        let i = (t % WINDOW) as usize;
        let list = &mut self.lists[i];
        if list.0 == NIL {
            *list = (slot, slot);
            self.occupied[i / 64] |= 1 << (i % 64);
        } else {
            let tail = list.1;
            list.1 = slot;
            self.slots[tail as usize].next = slot;
        }
        self.ring_len += 1;
    }

    /// The nanosecond of the ring's earliest events, if it holds any.
    fn ring_first(&self) -> Option<u64> {
        let start = (self.cur % WINDOW) as usize;
        // Most often more events are due at the instant just taken.
        if self.lists[start].0 != NIL {
            return Some(self.cur);
        }
        if self.ring_len == 0 {
            return None;
        }
        let words = self.occupied.len();
        let (w0, b0) = (start / 64, start % 64);
        // The first word from `start`'s bit on, then the words after it
        // around the ring, then the first word's bits before `start`.
        let first = self.occupied[w0] & (!0u64 << b0);
        let found = if first != 0 {
            w0 * 64 + first.trailing_zeros() as usize
        } else {
            (1..=words)
                .find_map(|k| {
                    let w = (w0 + k) % words;
                    let bits = self.occupied[w];
                    (bits != 0).then(|| w * 64 + bits.trailing_zeros() as usize)
                })
                .expect("a ring holding events has a list bit set")
        };
        let ahead = (found + WINDOW as usize - start) % WINDOW as usize;
        Some(self.cur + ahead as u64)
    }

    /// Moves the ring's start to `t` (no event in the ring before it),
    /// and the far events now inside the window into it, in key order.
    fn advance(&mut self, t: u64) {
        self.cur = t;
        while let Some(&Reverse(k)) = self.far.peek() {
            let at = key_time(k);
            if at - self.cur >= WINDOW {
                break;
            }
            self.far.pop();
            self.append(at, key_slot(k));
        }
    }

    /// Empties slot `slot` and returns its event.
    fn take(&mut self, slot: u32) -> E {
        self.free.push(slot);
        self.slots[slot as usize]
            .event
            .take()
            .expect("a queued slot holds its event")
    }

    /// Removes and returns the earliest event.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        if let Some(Reverse(k)) = self.early.pop() {
            let event = self.take(key_slot(k));
            return Some((Instant::from_nanos(key_time(k)), event));
        }
        let t = match self.ring_first() {
            Some(t) => t,
            None => {
                let &Reverse(k) = self.far.peek()?;
                key_time(k)
            }
        };
        if t != self.cur || self.ring_len == 0 {
            self.advance(t);
        }
        let i = (t % WINDOW) as usize;
        let slot = self.lists[i].0;
        let next = self.slots[slot as usize].next;
        if next == NIL {
            self.lists[i] = (NIL, NIL);
            self.occupied[i / 64] &= !(1 << (i % 64));
        } else {
            self.lists[i].0 = next;
        }
        self.ring_len -= 1;
        Some((Instant::from_nanos(t), self.take(slot)))
    }

    /// When the earliest event is due.
    pub fn peek_time(&self) -> Option<Instant> {
        let t = match self.early.peek() {
            Some(&Reverse(k)) => key_time(k),
            None => match self.ring_first() {
                Some(t) => t,
                None => key_time(self.far.peek()?.0),
            },
        };
        Some(Instant::from_nanos(t))
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.ring_len + self.far.len() + self.early.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// Against a sorted list: pops and peeks interleaved with pushes at
    /// the current instant, soon, beyond the ring's window, and a few in
    /// the past.
    #[test]
    fn matches_a_sorted_list() {
        let mut rng = crate::rng::SimRng::new(7);
        let mut q = EventQueue::default();
        let mut want: Vec<(u64, u64)> = Vec::new();
        let mut now = 0u64;
        for i in 0..50_000u64 {
            let r = rng.next_u64();
            if r % 5 < 3 {
                let at = match r % 97 {
                    0 => now / 2,
                    1..=20 => now,
                    21..=30 => now + WINDOW - 1 + (r >> 40) % 3,
                    31..=40 => now + (r >> 40) % (50 * WINDOW),
                    _ => now + (r >> 40) % 3_000,
                };
                q.push(Instant::from_nanos(at), i);
                want.push((at, i));
            } else {
                want.sort();
                let expected = (!want.is_empty()).then(|| want.remove(0));
                assert_eq!(q.peek_time(), expected.map(|e| Instant::from_nanos(e.0)));
                let got = q.pop().map(|(at, e)| (at.as_nanos(), e));
                assert_eq!(got, expected);
                if let Some((at, _)) = got {
                    now = now.max(at);
                }
            }
            assert_eq!(q.len(), want.len());
        }
        want.sort();
        for expected in want {
            assert_eq!(q.peek_time(), Some(Instant::from_nanos(expected.0)));
            assert_eq!(q.pop().map(|(at, e)| (at.as_nanos(), e)), Some(expected));
        }
        assert!(q.pop().is_none() && q.peek_time().is_none() && q.is_empty());
    }
}
