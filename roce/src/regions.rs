//! Registered memory regions and their keys: the checks every placement
//! and every gather goes through.

use metaroce_core::api::{Access, Region};

/// Regions an endpoint can hold.
pub const MAX_REGIONS: usize = 32;

/// Why an access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AccessError {
    /// No region has this key, or it belongs to another protection domain.
    InvalidKey,
    /// The region does not grant the access.
    Rights,
    /// The range is not inside the region.
    Bounds,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: u32,
    region: Region,
}

/// The region table. A key is `(slot + 1) << 8 | generation`, so a key of a
/// deregistered region is not accepted for the next region in its slot.
#[derive(Debug, Clone)]
pub struct Regions {
    slots: [Option<Entry>; MAX_REGIONS],
    generation: u8,
}

impl Default for Regions {
    fn default() -> Regions {
        Regions::new()
    }
}

impl Regions {
    pub const fn new() -> Regions {
        Regions {
            slots: [None; MAX_REGIONS],
            generation: 0,
        }
    }

    /// Registers a region and returns its key (used as both lkey and rkey),
    /// or `None` when the table is full or the region wraps the address space.
    pub fn register(&mut self, region: Region) -> Option<u32> {
        region.base.checked_add(region.len)?;
        let slot = self.slots.iter().position(Option::is_none)?;
        self.generation = self.generation.wrapping_add(1);
        let key = ((slot as u32 + 1) << 8) | u32::from(self.generation);
        self.slots[slot] = Some(Entry { key, region });
        Some(key)
    }

    /// Removes a region; false if the key is unknown.
    pub fn deregister(&mut self, key: u32) -> bool {
        match self.slot_of(key) {
            Some(slot) => {
                self.slots[slot] = None;
                true
            }
            None => false,
        }
    }

    fn slot_of(&self, key: u32) -> Option<usize> {
        let slot = usize::try_from((key >> 8).checked_sub(1)?).ok()?;
        match self.slots.get(slot)? {
            Some(e) if e.key == key => Some(slot),
            _ => None,
        }
    }

    /// The region behind `key`.
    pub fn get(&self, key: u32) -> Option<&Region> {
        self.slot_of(key)
            .and_then(|s| self.slots[s].as_ref())
            .map(|e| &e.region)
    }

    /// Checks that `[addr, addr + len)` lies in the region of `key`, in
    /// domain `pd`, with the rights `need`.
    pub fn check(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
        pd: u32,
    ) -> Result<(), AccessError> {
        let region = self.get(key).ok_or(AccessError::InvalidKey)?;
        if region.pd != pd {
            return Err(AccessError::InvalidKey);
        }
        if !region.access.allows(need) {
            return Err(AccessError::Rights);
        }
        if !region.contains(addr, len) {
            return Err(AccessError::Bounds);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_checks() {
        let mut r = Regions::new();
        let region = Region {
            base: 0x1000,
            len: 0x100,
            access: Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
            pd: 1,
        };
        let k = r.register(region).unwrap();
        assert_eq!(r.check(k, 0x1000, 0x100, Access::REMOTE_WRITE, 1), Ok(()));
        assert_eq!(
            r.check(k, 0x1001, 0x100, Access::REMOTE_WRITE, 1),
            Err(AccessError::Bounds)
        );
        assert_eq!(
            r.check(k, 0x1000, 1, Access::REMOTE_READ, 1),
            Err(AccessError::Rights)
        );
        assert_eq!(
            r.check(k, 0x1000, 1, Access::REMOTE_WRITE, 2),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            r.check(k ^ 1, 0x1000, 1, Access::REMOTE_WRITE, 1),
            Err(AccessError::InvalidKey)
        );
        assert!(r.deregister(k));
        let k2 = r.register(region).unwrap();
        assert_ne!(k, k2);
        assert_eq!(
            r.check(k, 0x1000, 1, Access::REMOTE_WRITE, 1),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(
            r.check(0, 0, 0, Access::REMOTE_WRITE, 1),
            Err(AccessError::InvalidKey)
        );
        assert!(r
            .register(Region {
                base: u64::MAX,
                len: 2,
                access: Access::ALL,
                pd: 0
            })
            .is_none());
    }
}
