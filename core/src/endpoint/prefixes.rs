//! Fair admission (spec 4.2.3): what each source prefix holds of the
//! connection table, at a narrow and a wide prefix length (IPv4 /32 and
//! /24, IPv6 /64 and /48 by default), and which connection a full table
//! gives up for a prefix that holds less.
//!
//! A fixed table of [`SourceBucket`]s holds one entry per prefix and level
//! that has a connection (or a connect rate still draining). It is an open
//! hash table keyed by a secret SipHash of the prefix, probed at most
//! [`PROBES`] places: O(1) per CONNECT, no allocation, and exact (prefixes
//! never share an entry). Entries are never emptied, only reused once they
//! hold nothing, so a probe chain is never cut. Four entries per connection
//! slot keep it at most half full with two levels.
//!
//! Which prefix holds the most is kept as connections are charged; only
//! once it has lost one may another hold more, and a scan of this table
//! finds out, at most once per [`SCAN_INTERVAL`]. The connection it gives
//! up is searched for in the connection table from a moving cursor, so a
//! connection costs one flag here and nothing per prefix.

use core::time::Duration;

use smoltcp::wire::IpAddress;

use crate::wire::ip16;

use crate::config::{AdmissionPolicy, SourceLimits};
use crate::time::Instant;

/// Places a prefix's entry may lie from its hash.
pub(crate) const PROBES: usize = 16;
/// The most often the heaviest prefix is searched for.
const SCAN_INTERVAL: Duration = Duration::from_millis(10);

const VACANT: u8 = 0;
const NARROW: u8 = 1;
const WIDE: u8 = 2;

/// One entry of the prefix table: a source prefix at one level, what its
/// connections hold, and its connect rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceBucket {
    /// The prefix as 16 bytes (IPv4 mapped), bits past its length zero.
    prefix: [u8; 16],
    level: u8,
    /// When `debt` was last brought up to date: milliseconds of the
    /// endpoint's clock, wrapping.
    stamp_ms: u32,
    /// Connects charged and not yet drained, in thousandths of a connect
    /// (narrow entries).
    debt: u32,
    /// Its connections still half open (Accepting), and all of them.
    pub(crate) half_open: u32,
    pub(crate) total: u32,
    /// Narrow entries: the wide entry of their prefix (valid while they
    /// hold a connection, which holds the wide entry too).
    wide: u32,
}

impl SourceBucket {
    /// An unused entry.
    pub const EMPTY: SourceBucket = SourceBucket {
        prefix: [0; 16],
        level: VACANT,
        stamp_ms: 0,
        debt: 0,
        half_open: 0,
        total: 0,
        wide: u32::MAX,
    };

    /// Brings the rate debt up to `now`.
    fn drain(&mut self, now: Instant, per_second: u32) {
        let now_ms = (now.as_nanos() / 1_000_000) as u32;
        let elapsed = u64::from(now_ms.wrapping_sub(self.stamp_ms));
        // Drains `per_second` thousandths per millisecond.
        let drained = elapsed.saturating_mul(u64::from(per_second));
        self.debt = u64::from(self.debt).saturating_sub(drained) as u32;
        self.stamp_ms = now_ms;
    }
}

/// Why a prefix was refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefixRefusal {
    /// The narrow prefix opened connections faster than its rate.
    Rate,
    /// A prefix holds its limit of half-open connections.
    HalfOpen,
    /// A prefix holds its share of the table.
    Share,
    /// No place for the prefix within its probe range.
    TableFull,
}

/// The two entries a source address is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefixes {
    pub narrow: u32,
    pub wide: u32,
}

/// `ip` cut to `v4_bits` or `v6_bits` (as 16 bytes, IPv4 mapped).
fn prefix_of(ip: &IpAddress, v4_bits: u8, v6_bits: u8) -> [u8; 16] {
    let bits = match ip {
        IpAddress::Ipv4(_) => 96 + u32::from(v4_bits.min(32)),
        IpAddress::Ipv6(_) => u32::from(v6_bits.min(128)),
    };
    let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
    (u128::from_be_bytes(ip16(ip)) & mask).to_be_bytes()
}

/// `share` 256ths of `capacity`, at least 1; 0 means no limit.
fn share_of(share: u16, capacity: u32) -> u32 {
    if share == 0 {
        return u32::MAX;
    }
    ((u64::from(capacity) * u64::from(share)) >> 8).max(1) as u32
}

/// The prefix table over caller-supplied entries (a power of two of them
/// is used).
#[derive(Debug)]
pub(crate) struct PrefixTable<S> {
    buckets: S,
    mask: usize,
    key: (u64, u64),
    /// Wide prefixes holding a connection.
    pub(crate) wide_in_use: u32,
    /// The heaviest wide prefix as far as known, whether it is known to be
    /// (a scan found it, or a charge raised it above the known heaviest,
    /// and it has lost nothing since), and when a scan may run again.
    heaviest: u32,
    heaviest_exact: bool,
    next_scan: Instant,
}

impl<S: core::ops::DerefMut<Target = [SourceBucket]>> PrefixTable<S> {
    pub(crate) fn new(mut buckets: S, key: (u64, u64)) -> Self {
        buckets.fill(SourceBucket::EMPTY);
        let usable = if buckets.is_empty() {
            0
        } else {
            1usize << (usize::BITS - 1 - buckets.len().leading_zeros())
        };
        PrefixTable {
            buckets,
            mask: usable.wrapping_sub(1),
            key,
            wide_in_use: 0,
            heaviest: u32::MAX,
            heaviest_exact: true,
            next_scan: Instant::ZERO,
        }
    }

    pub(crate) fn entry(&self, i: u32) -> &SourceBucket {
        &self.buckets[i as usize]
    }

    pub(crate) fn entry_mut(&mut self, i: u32) -> &mut SourceBucket {
        &mut self.buckets[i as usize]
    }

    /// The entries of `ip`'s two prefixes, claimed if new; `None` without
    /// a table (no per-prefix accounting) or without room.
    pub(crate) fn locate(
        &mut self,
        ip: &IpAddress,
        policy: &AdmissionPolicy,
        limits: &SourceLimits,
        now: Instant,
    ) -> Result<Option<Prefixes>, PrefixRefusal> {
        if self.buckets.is_empty() || !cfg!(feature = "fair-admission") {
            return Ok(None);
        }
        let narrow = prefix_of(ip, policy.v4_prefixes.0, policy.v6_prefixes.0);
        let wide = prefix_of(ip, policy.v4_prefixes.1, policy.v6_prefixes.1);
        let narrow = self.claim(narrow, NARROW, limits, now);
        let wide = self.claim(wide, WIDE, limits, now);
        match (narrow, wide) {
            (Some(narrow), Some(wide)) => {
                self.buckets[narrow as usize].wide = wide;
                Ok(Some(Prefixes { narrow, wide }))
            }
            _ => Err(PrefixRefusal::TableFull),
        }
    }

    /// The entries of a connection counted in narrow entry `narrow`.
    pub(crate) fn of_narrow(&self, narrow: u32) -> Prefixes {
        Prefixes {
            narrow,
            wide: self.buckets[narrow as usize].wide,
        }
    }

    /// Whether wide entry `w` is `ip`'s wide prefix.
    pub(crate) fn is_wide_prefix_of(
        &self,
        w: u32,
        ip: &IpAddress,
        policy: &AdmissionPolicy,
    ) -> bool {
        self.buckets[w as usize].prefix == prefix_of(ip, policy.v4_prefixes.1, policy.v6_prefixes.1)
    }

    /// The entries counting `ip`, if it has both.
    pub(crate) fn find(&self, ip: &IpAddress, policy: &AdmissionPolicy) -> Option<Prefixes> {
        let narrow = prefix_of(ip, policy.v4_prefixes.0, policy.v6_prefixes.0);
        let wide = prefix_of(ip, policy.v4_prefixes.1, policy.v6_prefixes.1);
        Some(Prefixes {
            narrow: self.find_entry(&narrow, NARROW)?,
            wide: self.find_entry(&wide, WIDE)?,
        })
    }

    #[inline(never)]
    fn find_entry(&self, prefix: &[u8; 16], level: u8) -> Option<u32> {
        if self.buckets.is_empty() {
            return None;
        }
        let h = self.hash(prefix, level);
        (0..PROBES)
            .map(|k| (h + k) & self.mask)
            .take_while(|&i| self.buckets[i].level != VACANT)
            .find(|&i| self.buckets[i].level == level && self.buckets[i].prefix == *prefix)
            .map(|i| i as u32)
    }

    fn hash(&self, prefix: &[u8; 16], level: u8) -> usize {
        let ip = IpAddress::Ipv6(smoltcp::wire::Ipv6Address::from(*prefix));
        super::hash_with(self.key, &ip, u32::from(level), 0) as usize
    }

    /// The entry of `prefix` at `level`: found, or claimed in the first
    /// empty or reusable place of its probe range.
    #[inline(never)]
    fn claim(
        &mut self,
        prefix: [u8; 16],
        level: u8,
        l: &SourceLimits,
        now: Instant,
    ) -> Option<u32> {
        let h = self.hash(&prefix, level);
        let mut spare = None;
        for k in 0..PROBES {
            let i = (h + k) & self.mask;
            let b = &mut self.buckets[i];
            if b.level == level && b.prefix == prefix {
                return Some(i as u32);
            }
            if b.level == VACANT {
                spare.get_or_insert(i);
                break;
            }
            if spare.is_none() && b.total == 0 {
                b.drain(now, l.connects_per_second);
                if b.debt == 0 || l.connects_per_second == 0 {
                    spare = Some(i);
                }
            }
        }
        let i = spare?;
        self.buckets[i] = SourceBucket {
            prefix,
            level,
            stamp_ms: (now.as_nanos() / 1_000_000) as u32,
            ..SourceBucket::EMPTY
        };
        Some(i as u32)
    }

    /// Whether `p` may open one more connection in a table of `capacity`.
    pub(crate) fn check(
        &mut self,
        p: Prefixes,
        now: Instant,
        limits: &SourceLimits,
        policy: &AdmissionPolicy,
        capacity: u32,
    ) -> Result<(), PrefixRefusal> {
        let (n, w) = (self.entry(p.narrow), self.entry(p.wide));
        let (narrow, wide) = (policy.narrow, policy.wide);
        if (limits.half_open != 0 && n.half_open >= limits.half_open)
            || n.half_open >= share_of(narrow.half_open, capacity)
            || w.half_open >= share_of(wide.half_open, capacity)
        {
            return Err(PrefixRefusal::HalfOpen);
        }
        if n.total >= share_of(narrow.all, capacity) || w.total >= share_of(wide.all, capacity) {
            return Err(PrefixRefusal::Share);
        }
        if limits.connects_per_second != 0 {
            let n = self.entry_mut(p.narrow);
            n.drain(now, limits.connects_per_second);
            let capacity = (u64::from(limits.connects_per_second) * 1000).min(u64::from(u32::MAX));
            if u64::from(n.debt) + 1000 > capacity {
                return Err(PrefixRefusal::Rate);
            }
        }
        Ok(())
    }

    /// Counts a new (half-open) connection in `p`.
    pub(crate) fn charge(&mut self, p: Prefixes) {
        let n = self.entry_mut(p.narrow);
        n.debt = n.debt.saturating_add(1000);
        n.half_open += 1;
        n.total += 1;
        let w = self.entry_mut(p.wide);
        w.half_open += 1;
        w.total += 1;
        let total = w.total;
        if total == 1 {
            self.wide_in_use += 1;
        }
        let heaviest = self.buckets.get(self.heaviest as usize);
        if heaviest.is_none_or(|h| h.level != WIDE || total > h.total || p.wide == self.heaviest) {
            self.heaviest = p.wide;
        }
    }

    /// A connection of `p` left Accepting.
    pub(crate) fn confirm(&mut self, p: Prefixes) {
        for i in [p.narrow, p.wide] {
            let b = self.entry_mut(i);
            b.half_open = b.half_open.saturating_sub(1);
        }
    }

    /// A connection of `p` is gone (its slot freed).
    pub(crate) fn release(&mut self, p: Prefixes) {
        let n = self.entry_mut(p.narrow);
        n.total = n.total.saturating_sub(1);
        let w = self.entry_mut(p.wide);
        w.total = w.total.saturating_sub(1);
        if w.total == 0 {
            self.wide_in_use = self.wide_in_use.saturating_sub(1);
        }
        if p.wide == self.heaviest {
            self.heaviest_exact = false;
        }
    }

    /// The wide prefix holding the most connections, if it holds at least
    /// `at_least`: the known one while it does; none if it is known to be
    /// the heaviest; else a scan, at most once per [`SCAN_INTERVAL`].
    pub(crate) fn heaviest(&mut self, at_least: u32, now: Instant) -> Option<u32> {
        let cached = self.buckets.get(self.heaviest as usize);
        if cached.is_some_and(|b| b.level == WIDE && b.total >= at_least) {
            return Some(self.heaviest);
        }
        // Known to be the heaviest and not enough: no other prefix is.
        if self.heaviest_exact || now < self.next_scan {
            return None;
        }
        self.next_scan = now + SCAN_INTERVAL;
        let best = self
            .buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| b.level == WIDE)
            .max_by_key(|(_, b)| b.total)?;
        self.heaviest = best.0 as u32;
        self.heaviest_exact = true;
        (best.1.total >= at_least).then_some(self.heaviest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{Ipv4Address, Ipv6Address};

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddress {
        IpAddress::Ipv4(Ipv4Address::new(a, b, c, d))
    }

    #[test]
    fn prefixes_cut_at_their_length() {
        let p = prefix_of(&v4(192, 0, 2, 77), 24, 64);
        assert_eq!(&p[10..], &[0xff, 0xff, 192, 0, 2, 0]);
        let p = prefix_of(&v4(192, 0, 2, 77), 20, 64);
        assert_eq!(&p[12..], &[192, 0, 0, 0]);
        let ip = IpAddress::Ipv6(Ipv6Address::new(0x2001, 0xdb8, 1, 2, 3, 4, 5, 6));
        let p = prefix_of(&ip, 24, 48);
        assert_eq!(&p[..8], &[0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0]);
        assert!(p[6..].iter().all(|&b| b == 0));
    }

    #[test]
    fn addresses_of_one_prefix_share_its_entry_and_limits() {
        let mut t = PrefixTable::new(std::vec![SourceBucket::EMPTY; 256], (1, 2));
        let mut policy = AdmissionPolicy::default();
        policy.narrow.all = 128;
        policy.wide.all = 192;
        let limits = SourceLimits::NONE;
        let now = Instant::from_micros(1000);
        let a = t
            .locate(&v4(10, 0, 0, 1), &policy, &limits, now)
            .unwrap()
            .unwrap();
        let b = t
            .locate(&v4(10, 0, 0, 2), &policy, &limits, now)
            .unwrap()
            .unwrap();
        assert_ne!(a.narrow, b.narrow);
        assert_eq!(a.wide, b.wide);
        // A 64-slot table: a /24 may hold 3/4 of it, a /32 half.
        for _ in 0..32 {
            t.check(a, now, &limits, &policy, 64).unwrap();
            t.charge(a);
            t.confirm(a);
        }
        assert_eq!(
            t.check(a, now, &limits, &policy, 64),
            Err(PrefixRefusal::Share)
        );
        for _ in 0..16 {
            t.check(b, now, &limits, &policy, 64).unwrap();
            t.charge(b);
            t.confirm(b);
        }
        assert_eq!(
            t.check(b, now, &limits, &policy, 64),
            Err(PrefixRefusal::Share)
        );
        assert_eq!(t.wide_in_use, 1);
        assert_eq!(t.heaviest(2, now), Some(a.wide));
        for _ in 0..48 {
            let p = if t.entry(a.narrow).total > 0 { a } else { b };
            t.release(p);
        }
        assert_eq!(t.wide_in_use, 0);
        // An empty entry is reused by another prefix.
        let c = t
            .locate(&v4(10, 0, 0, 1), &policy, &limits, now)
            .unwrap()
            .unwrap();
        assert_eq!(c, a);
    }

    #[test]
    fn the_connect_rate_drains_with_time() {
        let mut t = PrefixTable::new(std::vec![SourceBucket::EMPTY; 64], (1, 2));
        let policy = AdmissionPolicy::default();
        let limits = SourceLimits {
            connects_per_second: 10,
            half_open: 4,
        };
        let now = Instant::from_micros(10);
        let p = t
            .locate(&v4(192, 0, 2, 1), &policy, &limits, now)
            .unwrap()
            .unwrap();
        for _ in 0..4 {
            t.check(p, now, &limits, &policy, 1024).unwrap();
            t.charge(p);
        }
        assert_eq!(
            t.check(p, now, &limits, &policy, 1024),
            Err(PrefixRefusal::HalfOpen)
        );
        for _ in 0..4 {
            t.confirm(p);
            t.release(p);
        }
        for _ in 0..6 {
            t.check(p, now, &limits, &policy, 1024).unwrap();
            t.charge(p);
            t.confirm(p);
            t.release(p);
        }
        assert_eq!(
            t.check(p, now, &limits, &policy, 1024),
            Err(PrefixRefusal::Rate)
        );
        let later = now + Duration::from_millis(100);
        t.check(p, later, &limits, &policy, 1024).unwrap();
        let empty: PrefixTable<std::vec::Vec<SourceBucket>> =
            PrefixTable::new(std::vec::Vec::new(), (1, 2));
        let mut empty = empty;
        assert_eq!(
            empty.locate(&v4(1, 2, 3, 4), &policy, &limits, now),
            Ok(None)
        );
    }
}
