//! Intrusive lists of element indices: the links live in the elements
//! (connection slots, pool entries), the list head is three integers. No
//! pointers, no allocation; an element is in a list iff its link says so,
//! so membership is O(1) and an element can never be queued twice.

/// Link value of an element that is in no list.
pub const UNLINKED: u32 = u32::MAX;
/// Link value that ends a list (the last element's `next`, the first's `prev`).
pub const END: u32 = u32::MAX - 1;

/// An optional index in 4 bytes (`u32::MAX` means none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptIndex(u32);

impl OptIndex {
    pub const NONE: OptIndex = OptIndex(UNLINKED);

    pub const fn some(i: u32) -> OptIndex {
        OptIndex(i)
    }

    pub const fn get(self) -> Option<u32> {
        if self.0 == UNLINKED {
            None
        } else {
            Some(self.0)
        }
    }

    pub const fn is_some(self) -> bool {
        self.0 != UNLINKED
    }

    pub const fn is_none(self) -> bool {
        self.0 == UNLINKED
    }

    /// Takes the value, leaving none.
    pub fn take(&mut self) -> Option<u32> {
        core::mem::replace(self, Self::NONE).get()
    }
}

impl From<Option<u32>> for OptIndex {
    #[inline]
    fn from(i: Option<u32>) -> Self {
        i.map_or(Self::NONE, Self::some)
    }
}

/// A singly linked FIFO of indices into a slice, threaded through one `u32`
/// of each element (selected by the `link` function).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fifo {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for Fifo {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl Fifo {
    pub const EMPTY: Fifo = Fifo {
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

    /// The first index, if any.
    pub const fn front(&self) -> Option<u32> {
        if self.head == END {
            None
        } else {
            Some(self.head)
        }
    }

    /// Appends `i` unless it is already in a list threaded through the same
    /// link. Returns whether it was appended.
    pub fn push_back<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        link: impl Fn(&mut T) -> &mut u32,
    ) -> bool {
        if *link(&mut items[i as usize]) != UNLINKED {
            return false;
        }
        *link(&mut items[i as usize]) = END;
        if self.tail == END {
            self.head = i;
        } else {
            *link(&mut items[self.tail as usize]) = i;
        }
        self.tail = i;
        self.len += 1;
        true
    }

    /// Removes and returns the first index.
    pub fn pop_front<T>(
        &mut self,
        items: &mut [T],
        link: impl Fn(&mut T) -> &mut u32,
    ) -> Option<u32> {
        let i = self.front()?;
        let next = core::mem::replace(link(&mut items[i as usize]), UNLINKED);
        self.head = next;
        if next == END {
            self.tail = END;
        }
        self.len -= 1;
        Some(i)
    }
}

/// Links of a doubly linked list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Links {
    pub prev: u32,
    pub next: u32,
}

impl Links {
    pub const UNLINKED: Links = Links {
        prev: UNLINKED,
        next: UNLINKED,
    };

    /// Whether the element is in a list.
    pub const fn is_linked(&self) -> bool {
        self.next != UNLINKED
    }
}

impl Default for Links {
    fn default() -> Self {
        Self::UNLINKED
    }
}

/// A doubly linked list of indices: O(1) push, pop and removal from the
/// middle (an element leaves the active-sender list or a timer bucket
/// without a search).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for List {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl List {
    pub const EMPTY: List = List {
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

    pub const fn front(&self) -> Option<u32> {
        if self.head == END {
            None
        } else {
            Some(self.head)
        }
    }

    pub const fn back(&self) -> Option<u32> {
        if self.tail == END {
            None
        } else {
            Some(self.tail)
        }
    }

    /// Appends `i`, which must be unlinked.
    pub fn push_back<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        link: impl Fn(&mut T) -> &mut Links + Copy,
    ) {
        debug_assert!(!link(&mut items[i as usize]).is_linked());
        *link(&mut items[i as usize]) = Links {
            prev: self.tail,
            next: END,
        };
        if self.tail == END {
            self.head = i;
        } else {
            link(&mut items[self.tail as usize]).next = i;
        }
        self.tail = i;
        self.len += 1;
    }

    /// Removes `i`, which must be in this list.
    pub fn remove<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        link: impl Fn(&mut T) -> &mut Links + Copy,
    ) {
        let Links { prev, next } =
            core::mem::replace(link(&mut items[i as usize]), Links::UNLINKED);
        debug_assert!(next != UNLINKED, "removing an unlinked element");
        if prev == END {
            self.head = next;
        } else {
            link(&mut items[prev as usize]).next = next;
        }
        if next == END {
            self.tail = prev;
        } else {
            link(&mut items[next as usize]).prev = prev;
        }
        self.len -= 1;
    }

    /// Removes and returns the first index.
    pub fn pop_front<T>(
        &mut self,
        items: &mut [T],
        link: impl Fn(&mut T) -> &mut Links + Copy,
    ) -> Option<u32> {
        let i = self.front()?;
        self.remove(items, i, link);
        Some(i)
    }

    /// Makes `i` the last index, whether it was in this list or unlinked
    /// (nothing to do when it is last already: a busy element usually is).
    pub fn move_to_back<T>(
        &mut self,
        items: &mut [T],
        i: u32,
        link: impl Fn(&mut T) -> &mut Links + Copy,
    ) {
        if self.tail == i {
            return;
        }
        if link(&mut items[i as usize]).is_linked() {
            self.remove(items, i, link);
        }
        self.push_back(items, i, link);
    }

    /// The index after `i` in this list.
    pub fn next_of<T>(&self, items: &[T], i: u32, link: impl Fn(&T) -> &Links) -> Option<u32> {
        let n = link(&items[i as usize]).next;
        (n != END && n != UNLINKED).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[derive(Clone, Copy)]
    struct Item {
        fifo: u32,
        links: Links,
    }

    fn items(n: usize) -> Vec<Item> {
        (0..n)
            .map(|_| Item {
                fifo: UNLINKED,
                links: Links::UNLINKED,
            })
            .collect()
    }

    fn fifo_link(i: &mut Item) -> &mut u32 {
        &mut i.fifo
    }

    fn list_link(i: &mut Item) -> &mut Links {
        &mut i.links
    }

    #[test]
    fn fifo_keeps_order_and_refuses_duplicates() {
        let mut v = items(4);
        let mut q = Fifo::EMPTY;
        assert!(q.push_back(&mut v, 2, fifo_link));
        assert!(q.push_back(&mut v, 0, fifo_link));
        assert!(!q.push_back(&mut v, 2, fifo_link), "already queued");
        assert!(q.push_back(&mut v, 3, fifo_link));
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop_front(&mut v, fifo_link), Some(2));
        assert!(q.push_back(&mut v, 2, fifo_link), "requeued after leaving");
        let rest: Vec<u32> = core::iter::from_fn(|| q.pop_front(&mut v, fifo_link)).collect();
        assert_eq!(rest, [0, 3, 2]);
        assert!(q.is_empty());
        assert!(v.iter().all(|i| i.fifo == UNLINKED));
    }

    #[test]
    fn list_removes_from_anywhere() {
        let mut v = items(5);
        let mut l = List::EMPTY;
        for i in 0..5 {
            l.push_back(&mut v, i, list_link);
        }
        l.remove(&mut v, 2, list_link);
        l.remove(&mut v, 0, list_link);
        l.remove(&mut v, 4, list_link);
        assert_eq!(l.len(), 2);
        assert_eq!(l.front(), Some(1));
        assert_eq!(l.next_of(&v, 1, |i| &i.links), Some(3));
        assert_eq!(l.next_of(&v, 3, |i| &i.links), None);
        assert_eq!(l.pop_front(&mut v, list_link), Some(1));
        assert_eq!(l.pop_front(&mut v, list_link), Some(3));
        assert_eq!(l.pop_front(&mut v, list_link), None);
        assert!(v.iter().all(|i| !i.links.is_linked()));
    }

    #[test]
    fn move_to_back_links_or_moves_and_keeps_the_rest_in_order() {
        let mut v = items(4);
        let mut l = List::EMPTY;
        // Unlinked: appended.
        for i in [0, 1, 2] {
            l.move_to_back(&mut v, i, list_link);
        }
        // Last already: nothing changes.
        l.move_to_back(&mut v, 2, list_link);
        // From the front and the middle.
        l.move_to_back(&mut v, 0, list_link);
        l.move_to_back(&mut v, 3, list_link);
        l.move_to_back(&mut v, 2, list_link);
        assert_eq!(l.len(), 4);
        let order: Vec<u32> = core::iter::from_fn(|| l.pop_front(&mut v, list_link)).collect();
        assert_eq!(order, [1, 0, 3, 2]);
    }
}
