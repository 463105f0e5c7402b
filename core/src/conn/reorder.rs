//! The receiver's window state (spec 4.3, 4.5): the cumulative PSN and
//! which PSNs after it arrived, for windows of up to 65,536 PSNs.
//!
//! A connection keeps only the cumulative PSN, the highest PSN received
//! and a handle to a bitmap; the bitmap itself (one bit per PSN of the
//! window beyond the cumulative PSN) comes from an endpoint-wide pool of
//! 64-bit words ([`ReorderPool`]) in power-of-two extents, and only while
//! something arrived out of order. A connection receiving in order holds
//! no bitmap at all, and an idle one costs a few bytes whatever its
//! window, so windows of tens of thousands of PSNs do not multiply the
//! memory of a table of tens of thousands of connections.
//!
//! The bitmap is a ring: PSN `p`'s bit is `p mod bits` of the extent,
//! where `bits` (a power of two, at least [`MIN_BITS`]) exceeds the
//! distance of every PSN recorded from the cumulative PSN. Bits are
//! cleared as the cumulative PSN passes them, so every word given back to
//! the pool is zero and an extent taken from it needs no clearing.

use core::ops::DerefMut;

use crate::psn::Psn;
use crate::storage::buddy::{order_for, Buddy, BuddyNode, Extent, MIN_SHIFT};
use crate::wire::sack::{SackBits, SACK_BITS};

/// Bits per pool word.
const WORD_BITS: u32 = u64::BITS;
/// Smallest bitmap: one buddy block of 16 words (1,024 PSNs, 128 bytes).
pub const MIN_BITS: u32 = WORD_BITS << MIN_SHIFT;

/// The endpoint-wide pool of out-of-order bitmap words and its allocator.
#[derive(Debug)]
pub struct ReorderPool<W, N> {
    words: W,
    buddy: Buddy<N>,
}

impl<W, N> ReorderPool<W, N>
where
    W: DerefMut<Target = [u64]>,
    N: DerefMut<Target = [BuddyNode]>,
{
    /// `words` must hold `nodes.len() << MIN_SHIFT` words.
    pub fn new(mut words: W, nodes: N) -> Self {
        debug_assert!(words.len() >= nodes.len() << MIN_SHIFT);
        // Free words are zero (the invariant `allocate` relies on).
        words.fill(0);
        ReorderPool {
            words,
            buddy: Buddy::new(nodes),
        }
    }

    /// Words not in use.
    pub fn free_words(&self) -> u64 {
        self.buddy.free_units()
    }

    /// Words managed.
    pub fn total_words(&self) -> u64 {
        self.buddy.total_units()
    }

    /// An all-zero extent of at least `bits` bits (free words are zero).
    fn allocate(&mut self, bits: u32) -> Option<Extent> {
        self.buddy.allocate(order_for(bits.div_ceil(WORD_BITS)))
    }

    /// Gives an extent back; its words must be zero.
    fn release(&mut self, e: Extent) {
        debug_assert!(self.words[Self::range(e)].iter().all(|&w| w == 0));
        self.buddy.release(e);
    }

    fn range(e: Extent) -> core::ops::Range<usize> {
        e.first_unit()..e.first_unit() + e.units() as usize
    }

    /// Word index and mask of PSN `p`'s bit in extent `e`.
    #[inline]
    fn locate(e: Extent, p: Psn) -> (usize, u64) {
        let bit = p.get() & (bits_of(e) - 1);
        (
            e.first_unit() + (bit / WORD_BITS) as usize,
            1u64 << (bit % WORD_BITS),
        )
    }

    #[inline]
    fn test(&self, e: Extent, p: Psn) -> bool {
        let (w, m) = Self::locate(e, p);
        self.words[w] & m != 0
    }

    #[inline]
    fn set(&mut self, e: Extent, p: Psn) {
        let (w, m) = Self::locate(e, p);
        self.words[w] |= m;
    }

    /// 64 bits of the ring starting at PSN `p`'s bit (bit 0 of the result
    /// is `p`), wrapping around the extent.
    fn read64(&self, e: Extent, p: Psn) -> u64 {
        let bits = bits_of(e);
        let words = e.units() as usize;
        let bit = p.get() & (bits - 1);
        let w = (bit / WORD_BITS) as usize;
        let shift = bit % WORD_BITS;
        let lo = self.words[e.first_unit() + w] >> shift;
        if shift == 0 {
            lo
        } else {
            let hi = self.words[e.first_unit() + (w + 1) % words];
            lo | hi << (WORD_BITS - shift)
        }
    }
}

/// Bits of a bitmap extent.
#[inline]
const fn bits_of(e: Extent) -> u32 {
    e.units() * WORD_BITS
}

/// A bitmap handle packed small: block and order of the extent, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle {
    block: u32,
    /// Order + 1; 0: no bitmap.
    order: u8,
}

impl Handle {
    const NONE: Handle = Handle { block: 0, order: 0 };

    fn get(self) -> Option<Extent> {
        (self.order != 0).then(|| Extent::from_parts(self.block, self.order - 1))
    }

    fn of(e: Extent) -> Handle {
        Handle {
            block: e.block(),
            order: e.order() + 1,
        }
    }
}

/// Why a packet could not be recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordRefusal {
    /// The pool had no extent large enough for its distance.
    PoolEmpty,
}

/// One direction's receive window (spec 4.3): `C` and the PSNs received
/// in `C + 1 .. C + W − 1`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReceiveWindow {
    /// The cumulative PSN C: the lowest PSN not yet received.
    pub cum: Psn,
    /// The highest PSN received, meaningful while `held > 0`.
    highest: Psn,
    /// PSNs received beyond C (set bits).
    held: u32,
    bitmap: Handle,
}

impl ReceiveWindow {
    pub const EMPTY: ReceiveWindow = ReceiveWindow {
        cum: Psn(0),
        highest: Psn(0),
        held: 0,
        bitmap: Handle::NONE,
    };

    /// A window that starts at the peer's initial PSN.
    #[cfg(test)]
    pub fn starting_at(cum: Psn) -> ReceiveWindow {
        ReceiveWindow { cum, ..Self::EMPTY }
    }

    /// Whether `p` (beyond C) fills a gap: something after it has arrived.
    pub fn fills_gap(&self, d: i32, p: Psn) -> bool {
        self.held != 0 && (d == 0 || p.offset_from(self.highest) < 0)
    }

    /// Whether a bitmap is held from the pool.
    #[cfg(test)]
    pub fn holds_bitmap(&self) -> bool {
        self.bitmap.get().is_some()
    }

    /// Whether PSN `p`, at distance `d > 0` from C, was received.
    pub fn received<W, N>(&self, pool: &ReorderPool<W, N>, p: Psn) -> bool
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        let d = p.distance_from(self.cum);
        match self.bitmap.get() {
            Some(e) if d != 0 && d < bits_of(e) => pool.test(e, p),
            _ => false,
        }
    }

    /// Makes sure PSN distance `d` can be recorded (a bitmap covering it
    /// is held), before the packet is placed. An extent taken here for a
    /// packet then refused goes back with the next packet in order.
    pub fn reserve<W, N>(
        &mut self,
        pool: &mut ReorderPool<W, N>,
        d: u32,
    ) -> Result<(), RecordRefusal>
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        if d == 0 {
            return Ok(());
        }
        self.room_for(pool, d).map(|_| ())
    }

    /// Records PSN `p`, new and inside the window (distance `d` from C,
    /// `0 <= d < W`): C advances past every PSN received when `d` is 0,
    /// else `p`'s bit is set, taking or growing a bitmap as needed.
    pub fn record<W, N>(
        &mut self,
        pool: &mut ReorderPool<W, N>,
        p: Psn,
        d: u32,
    ) -> Result<(), RecordRefusal>
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        if d == 0 {
            self.cum = self.cum.next();
            self.advance(pool);
            return Ok(());
        }
        let e = self.room_for(pool, d)?;
        pool.set(e, p);
        self.held += 1;
        if self.held == 1 || p.offset_from(self.highest) > 0 {
            self.highest = p;
        }
        Ok(())
    }

    /// A bitmap whose ring covers distance `d`: the one held, or a new one
    /// (grown by doubling, at least `MIN_BITS`) with the held bits moved in.
    fn room_for<W, N>(
        &mut self,
        pool: &mut ReorderPool<W, N>,
        d: u32,
    ) -> Result<Extent, RecordRefusal>
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        let old = self.bitmap.get();
        if let Some(e) = old {
            if d < bits_of(e) {
                return Ok(e);
            }
        }
        let want = (d + 1)
            .next_power_of_two()
            .max(old.map_or(0, |e| 2 * bits_of(e)))
            .max(MIN_BITS);
        let new = pool.allocate(want).ok_or(RecordRefusal::PoolEmpty)?;
        if let Some(old) = old {
            // Every set bit lies in (C, C + old bits): move each to its
            // place in the larger ring, clearing the old words as it goes.
            let base = self.cum.next();
            for w in ReorderPool::<W, N>::range(old) {
                let mut word = core::mem::take(&mut pool.words[w]);
                while word != 0 {
                    let b = word.trailing_zeros();
                    word &= word - 1;
                    // The PSN whose old ring position is this bit: the one
                    // at that position at or after C + 1.
                    let pos = (w - old.first_unit()) as u32 * WORD_BITS + b;
                    let rel = pos.wrapping_sub(base.get()) & (bits_of(old) - 1);
                    pool.set(new, base + rel);
                }
            }
            pool.release(old);
        }
        self.bitmap = Handle::of(new);
        Ok(new)
    }

    /// Moves C past every received PSN at its front, clearing their bits;
    /// gives the bitmap back once nothing beyond C is held.
    fn advance<W, N>(&mut self, pool: &mut ReorderPool<W, N>)
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        let Some(e) = self.bitmap.get() else {
            return;
        };
        while self.held > 0 {
            let (w, _) = ReorderPool::<W, N>::locate(e, self.cum);
            let shift = self.cum.get() % WORD_BITS;
            let run = (pool.words[w] >> shift)
                .trailing_ones()
                .min(WORD_BITS - shift);
            if run == 0 {
                break;
            }
            let mask = if run == WORD_BITS {
                u64::MAX
            } else {
                ((1u64 << run) - 1) << shift
            };
            pool.words[w] &= !mask;
            self.held -= run;
            self.cum += run;
        }
        if self.held == 0 {
            pool.release(e);
            self.bitmap = Handle::NONE;
        }
    }

    /// Gives the bitmap back whatever it holds (the connection ended).
    pub fn discard<W, N>(&mut self, pool: &mut ReorderPool<W, N>)
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        if let Some(e) = self.bitmap.get() {
            pool.words[ReorderPool::<W, N>::range(e)].fill(0);
            pool.release(e);
        }
        self.bitmap = Handle::NONE;
        self.held = 0;
    }

    /// The SACK block of an ACK (spec 3.5, 3.6, 4.5): its offset from
    /// `C + 1` and its 256 bits. Where everything received lies within
    /// 256 PSNs of C the offset is 0; otherwise the block ends at the
    /// PSN that triggered the ACK (`echo`) plus a quarter block beyond it
    /// (packets of the same moment on faster paths), never past the
    /// highest PSN received, and never starts before `C + 1`. So each ACK
    /// reports the newest arrivals, and the sender learns of every packet
    /// delivered after a hole, which is what declares the hole lost
    /// (4.6.2), however far behind the hole lies.
    pub fn sack_block<W, N>(&self, pool: &ReorderPool<W, N>, echo: Psn) -> (u16, SackBits)
    where
        W: DerefMut<Target = [u64]>,
        N: DerefMut<Target = [BuddyNode]>,
    {
        let Some(e) = self.bitmap.get() else {
            return (0, SackBits::EMPTY);
        };
        if self.held == 0 {
            return (0, SackBits::EMPTY);
        }
        // Distances from C: the block covers C + 1 + offset + i.
        let high = self.highest.distance_from(self.cum);
        let block = SACK_BITS as u32;
        let offset = if high <= block {
            0
        } else {
            let e_d = echo.offset_from(self.cum).max(0) as u32;
            let end = high.min(e_d.saturating_add(block / 4));
            end.saturating_sub(block).min(u32::from(u16::MAX))
        };
        let base = self.cum + 1 + offset;
        // Bits at distance `bits_of(e)` or more would alias lower PSNs in
        // the ring; nothing is recorded there, so they are masked off.
        let valid = bits_of(e).saturating_sub(1 + offset);
        let mut words = [0u64; 4];
        for (k, w) in words.iter_mut().enumerate() {
            let first = 64 * k as u32;
            if first >= valid {
                break;
            }
            let mut v = pool.read64(e, base + first);
            let left = valid - first;
            if left < 64 {
                v &= (1u64 << left) - 1;
            }
            *w = v;
        }
        (offset as u16, SackBits::from_words(words))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::vec;

    type Pool = ReorderPool<std::vec::Vec<u64>, std::vec::Vec<BuddyNode>>;

    fn pool(blocks: usize) -> Pool {
        ReorderPool::new(vec![0; blocks << MIN_SHIFT], vec![BuddyNode::INIT; blocks])
    }

    /// Against a set: random arrivals inside a window, every query and
    /// every SACK block checked, every word back in the pool at the end.
    #[test]
    fn matches_a_set_of_received_psns_and_gives_every_word_back() {
        for (window, start) in [(256u32, u32::MAX - 100), (65_536, 7), (5_000, 1 << 31)] {
            let mut pool = pool(1 << 7);
            let total = pool.free_words();
            let mut w = ReceiveWindow::starting_at(Psn(start));
            let mut got: BTreeSet<u32> = BTreeSet::new();
            let mut model_cum = Psn(start);
            let mut seed = u64::from(window);
            let mut next = |n: u32| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 33) % u64::from(n)) as u32
            };
            for _ in 0..40_000 {
                // Mostly near C (gaps filled), sometimes far (new gaps).
                let d = if next(4) == 0 { next(window) } else { next(64) };
                let p = w.cum + d;
                let already = d > 0 && got.contains(&p.get());
                assert_eq!(w.received(&pool, p), already);
                if already {
                    continue;
                }
                w.record(&mut pool, p, d).expect("room");
                if d == 0 {
                    model_cum = p.next();
                    while got.remove(&model_cum.get()) {
                        model_cum = model_cum.next();
                    }
                } else {
                    got.insert(p.get());
                }
                assert_eq!(w.cum, model_cum);
                assert_eq!(w.held as usize, got.len());
                let echo = p;
                let (offset, bits) = w.sack_block(&pool, echo);
                let base = w.cum + 1 + u32::from(offset);
                for i in 0..256u32 {
                    assert_eq!(bits.get(i as usize), got.contains(&(base + i).get()));
                }
                if got.len() as u32 > 0 {
                    let high = w.highest.distance_from(w.cum);
                    if high <= 256 {
                        assert_eq!(offset, 0);
                    } else {
                        // The block holds the echo when it is beyond C.
                        let e = echo.distance_from(w.cum);
                        if e > 0 && e <= high {
                            assert!(e > u32::from(offset) && e <= u32::from(offset) + 256);
                        }
                    }
                }
            }
            w.discard(&mut pool);
            assert_eq!(pool.free_words(), total);
            assert!(pool.words.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn in_order_arrivals_take_no_bitmap() {
        let mut pool = pool(4);
        let mut w = ReceiveWindow::starting_at(Psn(10));
        for _ in 0..5000 {
            let c = w.cum;
            w.record(&mut pool, c, 0).unwrap();
            assert!(!w.holds_bitmap());
        }
        assert_eq!(w.cum, Psn(5010));
    }

    #[test]
    fn grows_by_doubling_and_refuses_when_the_pool_is_empty() {
        // 8 blocks = 128 words = 8192 bits.
        let mut pool = pool(8);
        let mut w = ReceiveWindow::starting_at(Psn(0));
        w.record(&mut pool, Psn(5), 5).unwrap();
        assert_eq!(pool.free_words(), 112, "one 1,024-bit extent");
        w.record(&mut pool, Psn(3000), 3000).unwrap();
        assert_eq!(
            pool.free_words(),
            64,
            "grown to 4,096 bits, the old one back"
        );
        assert!(w.received(&pool, Psn(5)) && w.received(&pool, Psn(3000)));
        assert_eq!(
            w.record(&mut pool, Psn(5000), 5000),
            Err(RecordRefusal::PoolEmpty)
        );
        // Filling the front releases everything.
        for p in 0..5 {
            w.record(&mut pool, Psn(p), 0).unwrap();
        }
        assert_eq!(w.cum, Psn(6));
        for p in 6..3000 {
            w.record(&mut pool, Psn(p), 0).unwrap();
        }
        assert_eq!(w.cum, Psn(3001));
        assert!(!w.holds_bitmap());
        assert_eq!(pool.free_words(), 128);
    }

    #[test]
    fn far_gaps_report_the_newest_arrivals() {
        let mut pool = pool(64);
        let mut w = ReceiveWindow::starting_at(Psn(0));
        // PSN 0 lost; 1..=20_000 arrive in order.
        for p in 1..=20_000u32 {
            w.record(&mut pool, Psn(p), p).unwrap();
            let (offset, bits) = w.sack_block(&pool, Psn(p));
            let base = 1 + u32::from(offset);
            assert!(p >= base && p < base + 256, "{p} in the block");
            assert!(bits.get((p - base) as usize));
        }
        let (offset, bits) = w.sack_block(&pool, Psn(20_000));
        assert_eq!(u32::from(offset), 20_000 - 256);
        assert_eq!(bits.count(), 256);
        // The hole filled: C jumps past all of them, the bitmap goes back.
        w.record(&mut pool, Psn(0), 0).unwrap();
        assert_eq!(w.cum, Psn(20_001));
        assert!(!w.holds_bitmap());
    }
}
