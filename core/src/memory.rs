//! Memory regions and keys (spec 4.8, 5.1).
//!
//! A key is `random 24 bits << 8 | slot`: the slot finds the region in one
//! step, the random part makes keys unguessable and stale keys (of a region
//! since deregistered and its slot reused) invalid.

use crate::api::{Access, Region};
use crate::config::MAX_REGIONS;
use crate::wire::NakReason;

const _: () = assert!(MAX_REGIONS <= 256, "the slot is the key's low byte");

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

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u32,
    region: Region,
}

/// The endpoint's registered regions.
#[derive(Debug)]
pub struct RegionTable {
    slots: [Option<Slot>; MAX_REGIONS],
}

impl Default for RegionTable {
    fn default() -> Self {
        RegionTable {
            slots: [None; MAX_REGIONS],
        }
    }
}

impl RegionTable {
    /// Registers `region` with a key built from `random`.
    pub fn register(&mut self, region: Region, random: u32) -> Result<u32, RegionError> {
        if region.len == 0 || region.base.checked_add(region.len).is_none() {
            return Err(RegionError::BadRange);
        }
        let index = self
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(RegionError::Full)?;
        // Never zero: key 0 marks "no key" in diagnostics and vectors.
        let high = (random & 0xffff_ff00).max(0x100);
        let key = high | index as u32;
        self.slots[index] = Some(Slot { key, region });
        Ok(key)
    }

    /// Removes the region with `key`.
    pub fn deregister(&mut self, key: u32) -> Result<Region, RegionError> {
        let index = (key & 0xff) as usize;
        match self.slots.get(index).copied().flatten() {
            Some(slot) if slot.key == key => {
                self.slots[index] = None;
                Ok(slot.region)
            }
            _ => Err(RegionError::UnknownKey),
        }
    }

    /// The region with `key`, if registered.
    pub fn get(&self, key: u32) -> Option<&Region> {
        let index = (key & 0xff) as usize;
        match self.slots.get(index) {
            Some(Some(slot)) if slot.key == key => Some(&slot.region),
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
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let mut t = RegionTable::default();
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
    }

    #[test]
    fn rejects_bad_ranges_and_fills_up() {
        let mut t = RegionTable::default();
        assert_eq!(
            t.register(region(0, 0, Access::ALL), 1),
            Err(RegionError::BadRange)
        );
        assert_eq!(
            t.register(region(u64::MAX, 2, Access::ALL), 1),
            Err(RegionError::BadRange)
        );
        for i in 0..MAX_REGIONS {
            t.register(region(i as u64 * 10, 10, Access::ALL), i as u32 * 0x1000)
                .unwrap();
        }
        assert_eq!(
            t.register(region(0, 1, Access::ALL), 0),
            Err(RegionError::Full)
        );
    }
}
