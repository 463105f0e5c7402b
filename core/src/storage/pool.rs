//! Fixed pools of entries shared by every connection of an endpoint, and
//! the per-connection FIFO queues threaded through them. A connection holds
//! only a queue head (12 bytes) however many entries it may use; what it
//! uses comes from the pool while it uses it. An empty pool is reported to
//! the caller, who turns it into back-pressure.

use core::ops::DerefMut;

use super::list::{END, UNLINKED};

/// One pool slot: a value and the link to the next slot of its queue (or
/// of the free list).
#[derive(Debug, Clone, Copy)]
pub struct PoolEntry<T> {
    value: T,
    next: u32,
}

impl<T: Copy> PoolEntry<T> {
    /// A free slot holding `filler` (a `static` in firmware is built from it).
    pub const fn vacant(filler: T) -> PoolEntry<T> {
        PoolEntry {
            value: filler,
            next: UNLINKED,
        }
    }
}

/// A FIFO of pool entries belonging to one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for Queue {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl Queue {
    pub const EMPTY: Queue = Queue {
        head: END,
        tail: END,
        len: 0,
    };

    pub const fn len(&self) -> u32 {
        self.len
    }

    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first entry's index.
    pub const fn head(&self) -> Option<u32> {
        if self.head == END {
            None
        } else {
            Some(self.head)
        }
    }
}

/// A pool of `T` over caller-supplied slots.
#[derive(Debug)]
pub struct Pool<S> {
    slots: S,
    free_head: u32,
    free: u32,
}

impl<T: Copy, S: DerefMut<Target = [PoolEntry<T>]>> Pool<S> {
    /// A pool whose every slot is free.
    pub fn new(mut slots: S) -> Self {
        let n = u32::try_from(slots.len())
            .unwrap_or(u32::MAX - 2)
            .min(u32::MAX - 2);
        for (i, slot) in slots.iter_mut().enumerate().take(n as usize) {
            slot.next = if i as u32 + 1 == n { END } else { i as u32 + 1 };
        }
        Pool {
            slots,
            free_head: if n == 0 { END } else { 0 },
            free: n,
        }
    }

    /// Slots in all.
    pub fn capacity(&self) -> u32 {
        self.slots.len().min(u32::MAX as usize - 2) as u32
    }

    /// Free slots.
    pub fn available(&self) -> u32 {
        self.free
    }

    /// Appends `value` to `queue`; `Err(value)` when the pool is empty.
    pub fn push_back(&mut self, queue: &mut Queue, value: T) -> Result<u32, T> {
        if self.free_head == END {
            return Err(value);
        }
        let i = self.free_head;
        self.free_head = self.slots[i as usize].next;
        self.free -= 1;
        self.slots[i as usize] = PoolEntry { value, next: END };
        if queue.tail == END {
            queue.head = i;
        } else {
            self.slots[queue.tail as usize].next = i;
        }
        queue.tail = i;
        queue.len += 1;
        Ok(i)
    }

    /// Removes the first entry of `queue` and returns its value.
    pub fn pop_front(&mut self, queue: &mut Queue) -> Option<T> {
        let i = queue.head()?;
        let slot = &mut self.slots[i as usize];
        let value = slot.value;
        queue.head = slot.next;
        if queue.head == END {
            queue.tail = END;
        }
        queue.len -= 1;
        slot.next = self.free_head;
        self.free_head = i;
        self.free += 1;
        Some(value)
    }

    /// Returns every entry of `queue` to the pool.
    pub fn clear(&mut self, queue: &mut Queue) {
        while self.pop_front(queue).is_some() {}
    }

    /// The value at entry `i` (an index from this pool's queues).
    pub fn get(&self, i: u32) -> &T {
        &self.slots[i as usize].value
    }

    /// The value at entry `i`, mutably.
    pub fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.slots[i as usize].value
    }

    /// The entry after `i` in its queue.
    pub fn next_of(&self, i: u32) -> Option<u32> {
        let n = self.slots[i as usize].next;
        (n != END).then_some(n)
    }

    /// Entry indices of `queue`, first to last.
    pub fn iter<'a>(&'a self, queue: &Queue) -> impl Iterator<Item = u32> + 'a {
        self.iter_from(queue.head())
    }

    /// Entry indices from `start` to the end of its queue.
    pub fn iter_from(&self, start: Option<u32>) -> impl Iterator<Item = u32> + '_ {
        let mut cursor = start;
        core::iter::from_fn(move || {
            let i = cursor?;
            cursor = self.next_of(i);
            Some(i)
        })
    }

    /// Takes one slot for `value` outside any queue (a single owner holds
    /// its index); `None` when the pool is empty.
    pub fn alloc(&mut self, value: T) -> Option<u32> {
        if self.free_head == END {
            return None;
        }
        let i = self.free_head;
        self.free_head = self.slots[i as usize].next;
        self.free -= 1;
        self.slots[i as usize] = PoolEntry {
            value,
            next: UNLINKED,
        };
        Some(i)
    }

    /// Gives back a slot taken with [`Pool::alloc`].
    pub fn free(&mut self, i: u32) {
        debug_assert_eq!(self.slots[i as usize].next, UNLINKED);
        self.slots[i as usize].next = self.free_head;
        self.free_head = i;
        self.free += 1;
    }

    /// The `n`-th entry of `queue` (0 = first): O(n).
    pub fn nth(&self, queue: &Queue, n: u32) -> Option<u32> {
        if n >= queue.len {
            return None;
        }
        self.iter(queue).nth(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn queues_share_the_pool_and_give_everything_back() {
        let mut pool = Pool::new(std::vec![PoolEntry::vacant(0u64); 5]);
        let (mut a, mut b) = (Queue::EMPTY, Queue::EMPTY);
        for v in 0..3 {
            pool.push_back(&mut a, v).unwrap();
        }
        pool.push_back(&mut b, 10).unwrap();
        pool.push_back(&mut b, 11).unwrap();
        assert_eq!(pool.push_back(&mut a, 99), Err(99), "empty pool refuses");
        assert_eq!(pool.available(), 0);
        assert_eq!(pool.pop_front(&mut a), Some(0));
        pool.push_back(&mut b, 12).unwrap();
        let vb: Vec<u64> = pool.iter(&b).map(|i| *pool.get(i)).collect();
        assert_eq!(vb, [10, 11, 12]);
        assert_eq!(pool.nth(&a, 1).map(|i| *pool.get(i)), Some(2));
        assert_eq!(pool.nth(&a, 2), None);
        pool.clear(&mut a);
        pool.clear(&mut b);
        assert_eq!(pool.available(), 5);
        assert!(a.is_empty() && b.is_empty());
    }
}
