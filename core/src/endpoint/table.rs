//! The connection table: slots with generations, the wire id layout, and
//! the links that put a slot on the endpoint's lists (spec 4.14).
//!
//! A wire connection id is `tag << index_bits | index`: the index finds the
//! slot in one step, the tag (random, nonzero, never the slot's previous
//! one) makes ids of a slot's successive connections differ, so a late
//! packet of an old connection finds no connection. A [`ConnHandle`] is the
//! index and the slot's generation, which counts allocations: a handle of
//! a released connection never names its successor.

use crate::api::ConnHandle;
use crate::conn::Connection;
use crate::storage::list::{Links, UNLINKED};
use crate::storage::wheel::TimerEntry;

/// A mark of a slot: filed in the CONNECT-duplicate index.
pub(crate) const INDEXED: u8 = 1;
/// A mark of a slot: its latest packet ended a burst, so it counts for the
/// window's floor only (spec 4.10.4).
pub(crate) const IDLE: u8 = 2;

/// A mark of a slot: half open, yet already delivering its early first
/// flight (spec 4.2.4), so the fair-share hint counts it as a sender, not
/// also as a sender about to start.
pub(crate) const SENDING_HALF_OPEN: u8 = 4;

/// A mark of a slot: a received packet touched it since its last refresh
/// (it is in the endpoint's touched list).
pub(crate) const TOUCHED: u8 = 8;

/// [`ConnSlot::prefix`] of a connection counted in no source prefix.
pub(crate) const NOT_COUNTED: u32 = u32::MAX;

/// One slot of the table: a connection and its place on the endpoint's
/// lists. Everything here is per connection and counts in its footprint.
#[derive(Debug, Clone, Copy)]
pub struct ConnSlot<const P: usize> {
    pub(crate) conn: Connection<P>,
    pub(crate) generation: u32,
    pub(crate) live: bool,
    /// The application released it; it is freed once nothing is left to send.
    pub(crate) released: bool,
    /// [`INDEXED`] and [`IDLE`] (one byte: the slot is at its 8-byte
    /// boundary).
    pub(crate) marks: u8,
    /// Counted as half open (endpoint-wide and in its source's bucket)
    /// until it leaves Accepting.
    pub(crate) half_open: bool,
    /// The narrow source-prefix entry it is counted in (an accepted
    /// connection, spec 4.2.3), which names the wide one; [`NOT_COUNTED`]
    /// otherwise.
    pub(crate) prefix: u32,
    pub(crate) timer: TimerEntry,
    /// Intrusive links: ready to transmit, a control packet or an ACK
    /// ready (served before data, spec 4.5), completions waiting, events
    /// waiting, starved of pool space.
    pub(crate) ready: u32,
    pub(crate) urgent: u32,
    pub(crate) completions: u32,
    pub(crate) events: u32,
    pub(crate) waiting: u32,
    /// Position among the receiver's active senders (by last data). A free
    /// slot is on no such list, so its `next` threads the free list.
    pub(crate) active: Links,
}

impl<const P: usize> ConnSlot<P> {
    /// A free slot (a `static` in firmware is built from it).
    pub const VACANT: ConnSlot<P> = ConnSlot {
        conn: Connection::VACANT,
        generation: 0,
        live: false,
        released: false,
        marks: 0,
        half_open: false,
        prefix: NOT_COUNTED,
        timer: TimerEntry::IDLE,
        ready: UNLINKED,
        urgent: UNLINKED,
        completions: UNLINKED,
        events: UNLINKED,
        waiting: UNLINKED,
        active: Links::UNLINKED,
    };

    pub(crate) fn has(&self, mark: u8) -> bool {
        self.marks & mark != 0
    }

    pub(crate) fn set(&mut self, mark: u8, on: bool) {
        self.marks = if on {
            self.marks | mark
        } else {
            self.marks & !mark
        };
    }

    pub(crate) fn ready_link(s: &mut Self) -> &mut u32 {
        &mut s.ready
    }
    pub(crate) fn urgent_link(s: &mut Self) -> &mut u32 {
        &mut s.urgent
    }
    pub(crate) fn completions_link(s: &mut Self) -> &mut u32 {
        &mut s.completions
    }
    pub(crate) fn events_link(s: &mut Self) -> &mut u32 {
        &mut s.events
    }
    pub(crate) fn waiting_link(s: &mut Self) -> &mut u32 {
        &mut s.waiting
    }
    pub(crate) fn free_link(s: &mut Self) -> &mut u32 {
        &mut s.active.next
    }
    pub(crate) fn active_link(s: &mut Self) -> &mut Links {
        &mut s.active
    }
    pub(crate) fn timer_entry(s: &mut Self) -> &mut TimerEntry {
        &mut s.timer
    }
    pub(crate) fn timer_entry_ref(s: &Self) -> &TimerEntry {
        &s.timer
    }

    /// The handle of the connection in this slot, whose index in the whole
    /// table (all shards) is `index`.
    pub(crate) fn handle(&self, index: u32) -> ConnHandle {
        ConnHandle {
            index,
            generation: self.generation,
        }
    }
}

/// How wire connection ids split into tag and index. With several shards
/// (one endpoint per core), the index is the slot's place in the whole
/// table, `first` the shard's first slot: an id names its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdLayout {
    pub index_bits: u32,
    pub first: u32,
    pub slots: u32,
}

impl IdLayout {
    /// The table index an id names (whatever shard it belongs to).
    pub fn table_index(self, id: u32) -> u32 {
        id & self.index_mask()
    }

    /// The local slot an id names, if it is in this shard.
    pub fn index_of(self, id: u32) -> Option<usize> {
        let local = self.table_index(id).checked_sub(self.first)?;
        (local < self.slots).then_some(local as usize)
    }

    /// The table index of local slot `i`.
    pub fn global(self, i: u32) -> u32 {
        self.first + i
    }

    pub fn index_mask(self) -> u32 {
        ((1u64 << self.index_bits) - 1) as u32
    }

    /// An id for slot `index` from `random`, nonzero and different from
    /// `previous`.
    pub fn make(self, local: u32, random: u32, previous: u32) -> u32 {
        let index = self.global(local);
        let tag_mask = (u64::from(u32::MAX) >> self.index_bits) as u32;
        let make = |tag: u32| ((u64::from(tag) << self.index_bits) as u32) | index;
        let mut tag = (random & tag_mask).max(1);
        if make(tag) == previous {
            tag = if tag >= tag_mask { 1 } else { tag + 1 };
        }
        make(tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_index_and_differ_per_incarnation() {
        let l = IdLayout {
            index_bits: 16,
            first: 0,
            slots: 1 << 16,
        };
        let a = l.make(0x1234, 0xabcd, 0);
        assert_eq!(l.index_of(a), Some(0x1234));
        assert_eq!(a >> 16, 0xabcd);
        assert_ne!(l.make(0x1234, 0xabcd, a), a, "never the previous id");
        assert_ne!(l.make(7, 0, 0), 7, "tag never zero");
        let wide = IdLayout {
            index_bits: 24,
            first: 0,
            slots: 1 << 24,
        };
        assert_eq!(
            wide.index_of(wide.make(0xff_ffff, 0xffff_ffff, 0)),
            Some(0xff_ffff)
        );
        // The third of four shards of 256 slots: ids carry the table index.
        let shard = IdLayout {
            index_bits: 10,
            first: 512,
            slots: 256,
        };
        let id = shard.make(3, 0x77, 0);
        assert_eq!(shard.table_index(id), 515);
        assert_eq!(shard.index_of(id), Some(3));
        assert_eq!(shard.index_of(id - 3 - 512 + 256), None, "another shard's");
    }
}
