//! An open-addressing hash index from a key to an element index (a
//! connection slot, a peer slot). The table stores only `u32` element
//! indices; the caller hashes keys (with a secret key, so a remote peer
//! cannot aim many keys at one probe sequence) and compares candidates
//! against its own elements. Linear probing with backward-shift deletion:
//! no tombstones, so lookups stay short under churn.

use core::ops::DerefMut;

const EMPTY: u32 = u32::MAX;

/// The index over a caller-supplied table whose length is a power of two
/// (a longer table is used up to its largest power of two).
#[derive(Debug)]
pub struct HashIndex<S> {
    slots: S,
    mask: usize,
    len: usize,
}

impl<S: DerefMut<Target = [u32]>> HashIndex<S> {
    /// An empty index over `slots` (overwritten).
    pub fn new(mut slots: S) -> Self {
        let usable = if slots.is_empty() {
            0
        } else {
            1usize << (usize::BITS - 1 - slots.len().leading_zeros())
        };
        slots.fill(EMPTY);
        HashIndex {
            slots,
            mask: usable.saturating_sub(1),
            len: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most entries it takes (7/8 of its slots: probes stay short).
    pub fn capacity(&self) -> usize {
        if self.slots.is_empty() {
            0
        } else {
            // Seven eighths, rounded down, of the slots (at least one slot
            // stays empty so probes end): `/ 8 * 7` made it 0 for tables of
            // up to 7 slots, so an endpoint of 2 or 3 connections indexed
            // none and took a repeated CONNECT for a new connection.
            let slots = self.mask + 1;
            (slots - slots.div_ceil(8)).max(1).min(slots - 1)
        }
    }

    fn home(&self, hash: u64) -> usize {
        // The high bits: the low ones of a keyed hash are as good, but a
        // table shared with an id layout should not correlate with it.
        (hash >> 32) as usize & self.mask
    }

    /// The element whose key hashes to `hash` and for which `eq` holds.
    pub fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let mut at = self.home(hash);
        loop {
            let v = self.slots[at];
            if v == EMPTY {
                return None;
            }
            if eq(v) {
                return Some(v);
            }
            at = (at + 1) & self.mask;
        }
    }

    /// Adds `value` under `hash`. The caller has checked it is absent.
    /// Returns `false` when the index is full.
    pub fn insert(&mut self, hash: u64, value: u32) -> bool {
        debug_assert_ne!(value, EMPTY);
        if self.len >= self.capacity() {
            return false;
        }
        let mut at = self.home(hash);
        while self.slots[at] != EMPTY {
            at = (at + 1) & self.mask;
        }
        self.slots[at] = value;
        self.len += 1;
        true
    }

    /// Removes `value`, filed under `hash`; `hash_of` gives the hash of any
    /// other element so the entries after it can move back. Returns whether
    /// it was there.
    pub fn remove(&mut self, hash: u64, value: u32, mut hash_of: impl FnMut(u32) -> u64) -> bool {
        if self.len == 0 {
            return false;
        }
        let mut at = self.home(hash);
        loop {
            match self.slots[at] {
                EMPTY => return false,
                v if v == value => break,
                _ => at = (at + 1) & self.mask,
            }
        }
        // Backward-shift deletion: pull later entries of the cluster into
        // the hole when their home does not lie (cyclically) after it.
        let mut hole = at;
        let mut next = (hole + 1) & self.mask;
        loop {
            let v = self.slots[next];
            if v == EMPTY {
                break;
            }
            let home = self.home(hash_of(v));
            let distance_to_next = next.wrapping_sub(home) & self.mask;
            let distance_to_hole = hole.wrapping_sub(home) & self.mask;
            if distance_to_hole < distance_to_next {
                self.slots[hole] = v;
                hole = next;
            }
            next = (next + 1) & self.mask;
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::vec::Vec;

    /// Keys collide often on purpose: the hash is the key's low byte.
    fn h(key: u32) -> u64 {
        u64::from(key % 7) << 32
    }

    #[test]
    fn small_tables_index_most_of_their_slots() {
        for (slots, capacity) in [(2, 1), (4, 3), (8, 7), (16, 14), (1024, 896)] {
            let index = HashIndex::new(std::vec![0u32; slots]);
            assert_eq!(index.capacity(), capacity, "{slots} slots");
        }
    }

    #[test]
    fn agrees_with_a_map_under_churn_and_collisions() {
        let mut keys: Vec<u32> = (0..64).map(|i| i * 31 + 5).collect();
        let mut index = HashIndex::new(std::vec![0u32; 64]);
        let mut map = HashMap::new();
        let mut seed = 11u64;
        for round in 0..5_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let k = (seed >> 33) as usize % keys.len();
            let key = keys[k];
            let value = k as u32;
            if map.remove(&key).is_some() {
                assert!(index.remove(h(key), value, |v| h(keys[v as usize])));
            } else if index.insert(h(key), value) {
                map.insert(key, value);
            } else {
                assert_eq!(map.len(), index.capacity(), "round {round}");
            }
            for (k2, &key2) in keys.iter().enumerate() {
                let got = index.find(h(key2), |v| keys[v as usize] == key2);
                assert_eq!(got, map.get(&key2).copied(), "round {round} key {key2}");
                assert_eq!(got.is_some(), map.contains_key(&keys[k2]));
            }
            if round == 2_500 {
                keys.reverse();
                index = HashIndex::new(std::vec![0u32; 64]);
                map.clear();
            }
        }
    }
}
