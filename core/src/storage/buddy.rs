//! A buddy allocator of power-of-two extents over an array of units (the
//! endpoint's in-flight packet records). A connection's sender window is
//! one extent: a PSN's record is at `start + (psn mod size)`, found without
//! a search; the extent grows by doubling while more packets are in
//! flight and goes back when the connection is idle, so memory follows
//! the bytes in flight, not the window a connection may use.
//!
//! Bookkeeping is one small node per minimum block (`2^MIN_SHIFT` units):
//! free lists per order, doubly linked, so splitting and merging are
//! O(log n) and never search.

use core::ops::DerefMut;

use super::list::{Links, List};

/// Units per minimum block, as a power of two (16 records).
pub const MIN_SHIFT: u32 = 4;
/// Largest extent: `2^(MIN_SHIFT + MAX_ORDER)` units (2^20 records).
pub const MAX_ORDER: u8 = 16;
const ORDERS: usize = MAX_ORDER as usize + 1;

/// Bookkeeping of one minimum block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuddyNode {
    links: Links,
    /// Order of the free block starting here (valid while `free`).
    order: u8,
    free: bool,
}

impl BuddyNode {
    pub const INIT: BuddyNode = BuddyNode {
        links: Links::UNLINKED,
        order: 0,
        free: false,
    };
}

/// An allocated extent: `2^(order + MIN_SHIFT)` units from `first_unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Extent {
    block: u32,
    order: u8,
}

impl Extent {
    /// First unit.
    pub const fn first_unit(self) -> usize {
        (self.block as usize) << MIN_SHIFT
    }

    /// Units (a power of two).
    pub const fn units(self) -> u32 {
        1 << (self.order as u32 + MIN_SHIFT)
    }

    pub const fn order(self) -> u8 {
        self.order
    }

    /// First minimum block.
    pub const fn block(self) -> u32 {
        self.block
    }

    /// The extent of `block` and `order`, as [`Extent::block`] and
    /// [`Extent::order`] gave them (a handle stored in fewer bytes, or
    /// worked out again from where the extent is and how long).
    pub const fn from_parts(block: u32, order: u8) -> Extent {
        Extent { block, order }
    }
}

/// The smallest order whose extent holds `units`.
pub const fn order_for(units: u32) -> u8 {
    let blocks = units.div_ceil(1 << MIN_SHIFT);
    if blocks <= 1 {
        0
    } else {
        (32 - (blocks - 1).leading_zeros()) as u8
    }
}

/// The allocator over caller-supplied nodes (one per minimum block).
#[derive(Debug)]
pub struct Buddy<S> {
    nodes: S,
    free_lists: [List; ORDERS],
    free_blocks: u32,
}

impl<S: DerefMut<Target = [BuddyNode]>> Buddy<S> {
    /// Every block free. The unit array it manages holds
    /// `nodes.len() << MIN_SHIFT` units.
    pub fn new(mut nodes: S) -> Self {
        nodes.fill(BuddyNode::INIT);
        let total = nodes.len().min(u32::MAX as usize / 2) as u32;
        let mut buddy = Buddy {
            nodes,
            free_lists: [List::EMPTY; ORDERS],
            free_blocks: 0,
        };
        // Cover the blocks with the largest aligned free blocks that fit.
        let mut block = 0u32;
        while block < total {
            let mut order = (block.trailing_zeros().min(u32::from(MAX_ORDER))) as u8;
            while order > 0 && block + (1 << order) > total {
                order -= 1;
            }
            buddy.push_free(block, order);
            block += 1 << order;
        }
        buddy
    }

    fn link(n: &mut BuddyNode) -> &mut Links {
        &mut n.links
    }

    fn push_free(&mut self, block: u32, order: u8) {
        let n = &mut self.nodes[block as usize];
        n.free = true;
        n.order = order;
        self.free_lists[usize::from(order)].push_back(&mut self.nodes, block, Self::link);
        self.free_blocks += 1 << order;
    }

    fn take_free(&mut self, block: u32, order: u8) {
        self.free_lists[usize::from(order)].remove(&mut self.nodes, block, Self::link);
        self.nodes[block as usize].free = false;
        self.free_blocks -= 1 << order;
    }

    /// Units not allocated.
    pub fn free_units(&self) -> u64 {
        u64::from(self.free_blocks) << MIN_SHIFT
    }

    /// Units managed.
    pub fn total_units(&self) -> u64 {
        (self.nodes.len() as u64) << MIN_SHIFT
    }

    /// An extent of `2^(order + MIN_SHIFT)` units, if one is free.
    pub fn allocate(&mut self, order: u8) -> Option<Extent> {
        if order > MAX_ORDER {
            return None;
        }
        let mut k = order;
        while self.free_lists[usize::from(k)].is_empty() {
            k += 1;
            if k > MAX_ORDER {
                return None;
            }
        }
        let block = self.free_lists[usize::from(k)].front()?;
        self.take_free(block, k);
        while k > order {
            k -= 1;
            self.push_free(block + (1 << k), k);
        }
        Some(Extent { block, order })
    }

    /// Gives an extent back, merging it with free buddies.
    pub fn release(&mut self, extent: Extent) {
        let (mut block, mut order) = (extent.block, extent.order);
        let total = self.nodes.len() as u32;
        while order < MAX_ORDER {
            let buddy = block ^ (1 << order);
            if buddy >= total {
                break;
            }
            let b = self.nodes[buddy as usize];
            if !(b.free && b.order == order) {
                break;
            }
            self.take_free(buddy, order);
            block = block.min(buddy);
            order += 1;
        }
        self.push_free(block, order);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn allocations_never_overlap_and_everything_merges_back() {
        // 100 blocks: not a power of two, so the edges are exercised.
        let mut buddy = Buddy::new(std::vec![BuddyNode::INIT; 100]);
        let total = buddy.free_units();
        assert_eq!(total, 1600);
        let mut owner = std::vec![u32::MAX; 1600];
        let mut live: Vec<(Extent, u32)> = Vec::new();
        let mut seed = 3u64;
        for round in 0..20_000u32 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (seed >> 33) as u32;
            if !r.is_multiple_of(3) || live.is_empty() {
                let order = (r % 5) as u8;
                if let Some(e) = buddy.allocate(order) {
                    assert_eq!(e.units(), 16 << order);
                    assert_eq!(e.first_unit() % e.units() as usize, 0, "aligned");
                    for u in &mut owner[e.first_unit()..e.first_unit() + e.units() as usize] {
                        assert_eq!(*u, u32::MAX, "round {round}: overlap");
                        *u = round;
                    }
                    live.push((e, round));
                }
            } else {
                let (e, _) = live.swap_remove(r as usize % live.len());
                owner[e.first_unit()..e.first_unit() + e.units() as usize].fill(u32::MAX);
                buddy.release(e);
            }
            let used: u64 = live.iter().map(|(e, _)| u64::from(e.units())).sum();
            assert_eq!(buddy.free_units() + used, total);
        }
        for (e, _) in live.drain(..) {
            buddy.release(e);
        }
        assert_eq!(buddy.free_units(), total);
        // Fully merged: the largest aligned block (64 blocks) is whole again.
        assert!(buddy.allocate(6).is_some());
    }

    #[test]
    fn order_for_rounds_up() {
        assert_eq!(order_for(0), 0);
        assert_eq!(order_for(16), 0);
        assert_eq!(order_for(17), 1);
        assert_eq!(order_for(256), 4);
        assert_eq!(order_for(65_536), 12);
    }
}
