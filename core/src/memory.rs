//! Memory regions and keys (spec 4.8, 5.1.3).
//!
//! A key is `random tag << index_bits | slot`: the slot finds the region in
//! one step, the random tag makes keys unguessable and a stale key (of a
//! region since deregistered and its slot reused) invalid. Slots come from
//! a free list, so registering is O(1) whatever the table's size.

use core::ops::DerefMut;

use crate::api::{Access, Region};
use crate::storage::list::{END, UNLINKED};
use crate::wire::NakReason;

/// Why a region operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RegionError {
    /// Every slot is taken.
    Full,
    /// Zero length, or the range wraps around the address space.
    BadRange,
    /// No region has this key.
    UnknownKey,
}

/// One slot of the region table.
#[derive(Debug, Clone, Copy)]
pub struct RegionSlot {
    key: u32,
    region: Region,
    live: bool,
    next_free: u32,
}

impl RegionSlot {
    pub const VACANT: RegionSlot = RegionSlot {
        key: 0,
        region: Region {
            base: 0,
            len: 0,
            access: Access(0),
            pd: 0,
        },
        live: false,
        next_free: UNLINKED,
    };
}

/// The endpoint's registered regions over caller-supplied slots.
#[derive(Debug)]
pub struct RegionTable<S> {
    slots: S,
    index_bits: u32,
    free_head: u32,
    len: u32,
}

impl<S: DerefMut<Target = [RegionSlot]>> RegionTable<S> {
    /// An empty table over `slots` (at most 2^24 of them are used).
    pub fn new(mut slots: S) -> Self {
        let n = slots.len().min(1 << 24);
        for (i, s) in slots.iter_mut().enumerate() {
            *s = RegionSlot::VACANT;
            s.next_free = if i + 1 < n { i as u32 + 1 } else { END };
        }
        RegionTable {
            slots,
            index_bits: crate::storage::index_bits(n),
            free_head: if n == 0 { END } else { 0 },
            len: 0,
        }
    }

    fn index_of(&self, key: u32) -> usize {
        (key & ((1u64 << self.index_bits) - 1) as u32) as usize
    }

    /// Registers `region` with a key built from `random`.
    pub fn register(&mut self, region: Region, random: u32) -> Result<u32, RegionError> {
        if region.len == 0 || region.base.checked_add(region.len).is_none() {
            return Err(RegionError::BadRange);
        }
        if self.free_head == END {
            return Err(RegionError::Full);
        }
        let index = self.free_head;
        let slot = &mut self.slots[index as usize];
        self.free_head = slot.next_free;
        // Never zero (key 0 marks "no key"), never the slot's previous key.
        let tag_mask = (u64::from(u32::MAX) >> self.index_bits) as u32;
        let make = |tag: u32| (u64::from(tag) << self.index_bits) as u32 | index;
        let mut tag = (random & tag_mask).max(1);
        if make(tag) == slot.key {
            tag = if tag >= tag_mask { 1 } else { tag + 1 };
        }
        let key = make(tag);
        *slot = RegionSlot {
            key,
            region,
            live: true,
            next_free: UNLINKED,
        };
        self.len += 1;
        Ok(key)
    }

    /// Removes the region with `key`.
    pub fn deregister(&mut self, key: u32) -> Result<Region, RegionError> {
        let index = self.index_of(key);
        match self.slots.get_mut(index) {
            Some(slot) if slot.live && slot.key == key => {
                slot.live = false;
                slot.next_free = self.free_head;
                self.free_head = index as u32;
                self.len -= 1;
                Ok(slot.region)
            }
            _ => Err(RegionError::UnknownKey),
        }
    }

    /// The region with `key`, if registered.
    pub fn get(&self, key: u32) -> Option<&Region> {
        match self.slots.get(self.index_of(key)) {
            Some(slot) if slot.live && slot.key == key => Some(&slot.region),
            _ => None,
        }
    }

    /// Checks an access of `len` bytes at `addr` under `key` by a connection
    /// in protection domain `pd` that needs `rights`. The error is what a
    /// NAK reports (spec 3.7 order: key, then rights, then bounds).
    pub fn check(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        rights: Access,
    ) -> Result<(), NakReason> {
        let region = match self.get(key) {
            Some(r) if r.pd == pd => r,
            _ => return Err(NakReason::InvalidKey),
        };
        if !region.access.allows(rights) {
            return Err(NakReason::AccessDenied);
        }
        if !region.contains(addr, len) {
            return Err(NakReason::OutOfBounds);
        }
        Ok(())
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most regions it holds.
    pub fn capacity(&self) -> usize {
        self.slots.len().min(1 << 24)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(base: u64, len: u64, access: Access) -> Region {
        Region {
            base,
            len,
            access,
            pd: 7,
        }
    }

    #[test]
    fn checks_key_domain_rights_and_bounds() {
        let mut t = RegionTable::new(std::vec![RegionSlot::VACANT; 32]);
        let k = t
            .register(region(0x1000, 0x100, Access::REMOTE_WRITE), 0xdead_be00)
            .unwrap();
        assert_eq!(t.check(k, 7, 0x1000, 0x100, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(t.check(k, 7, 0x10ff, 1, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(
            t.check(k, 7, 0x1000, 0x101, Access::REMOTE_WRITE),
            Err(NakReason::OutOfBounds)
        );
        assert_eq!(
            t.check(k, 7, 0xfff, 1, Access::REMOTE_WRITE),
            Err(NakReason::OutOfBounds)
        );
        assert_eq!(
            t.check(k, 7, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(NakReason::OutOfBounds)
        );
        assert_eq!(
            t.check(k, 7, 0x1000, 1, Access::REMOTE_READ),
            Err(NakReason::AccessDenied)
        );
        assert_eq!(
            t.check(k, 8, 0x1000, 1, Access::REMOTE_WRITE),
            Err(NakReason::InvalidKey)
        );
        assert_eq!(
            t.check(k ^ 0x100, 7, 0x1000, 1, Access::REMOTE_WRITE),
            Err(NakReason::InvalidKey)
        );
        t.deregister(k).unwrap();
        assert_eq!(
            t.check(k, 7, 0x1000, 1, Access::REMOTE_WRITE),
            Err(NakReason::InvalidKey)
        );
        assert_eq!(t.deregister(k), Err(RegionError::UnknownKey));
        // The slot comes back with another key.
        let k2 = t
            .register(region(0x1000, 0x100, Access::REMOTE_WRITE), 0xdead_be00)
            .unwrap();
        assert_ne!(k2, k);
        assert_eq!(
            t.check(k, 7, 0x1000, 1, Access::REMOTE_WRITE),
            Err(NakReason::InvalidKey)
        );
    }

    #[test]
    fn rejects_bad_ranges_and_fills_up() {
        let mut t = RegionTable::new(std::vec![RegionSlot::VACANT; 32]);
        assert_eq!(
            t.register(region(0, 0, Access::ALL), 1),
            Err(RegionError::BadRange)
        );
        assert_eq!(
            t.register(region(u64::MAX, 2, Access::ALL), 1),
            Err(RegionError::BadRange)
        );
        for i in 0..32u32 {
            t.register(region(u64::from(i) * 10, 10, Access::ALL), i * 0x1000)
                .unwrap();
        }
        assert_eq!(
            t.register(region(0, 1, Access::ALL), 0),
            Err(RegionError::Full)
        );
        assert_eq!(t.len(), 32);
    }
}
