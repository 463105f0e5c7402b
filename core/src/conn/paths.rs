//! What the per-packet path asks of a sender's paths, kept current where
//! the telemetry changes instead of found by scanning every path (spec
//! 4.6.2, 4.6.4, 4.9.1).
//!
//! * **Which path next** (spec 4.9.1): each path's cost, `(in_flight + 1)
//!   x delay / weight`, is a leaf of a tournament tree whose nodes hold
//!   the cheapest leaf of their subtree (the lower index among equals).
//!   A path whose inputs changed (a send, a delivery, a loss, an RTT
//!   sample, an echo) is marked; the next choice replays the marked
//!   leaves' matches (four each at 16 paths) and reads the winner at the
//!   root. When the winner lies before the round-robin start, the paths
//!   from the start on are asked for one as cheap (the subtrees covering
//!   them, left to right). It is the path a scan from the start finds
//!   (the first of the cheapest, round-robin among equals), so the spray
//!   is the one the scan gave.
//! * **What loss detection and the timeout need** (spec 4.6.2, 4.6.4):
//!   the slowest path's timeout, smoothed RTT and variation, the newest
//!   delivery's send time and the soonest a packet can be judged lost.
//!   Each moves with one path's sample, delivery or reordering evidence;
//!   a maximum that falls from its holder is found again among the paths'
//!   copies in their own small arrays (one cache line each at 16 paths).
//!
//! The per-path arrays are a few hundred bytes beside the paths' counters
//! (about a kilobyte at 16 paths), which the per-packet path no longer
//! reads.
//!
//! Without the `path-index` feature ([`crate::config::PATH_INDEX`],
//! firmware) `PathIndex` holds nothing and every question is answered by
//! scanning the paths, as before: the same answers in 1.6 KB less code
//! and no memory.

use super::sender::{PathSender, ONE};
use crate::psn::Psn;

/// The cost leaves, the tournament tree and the loss-detection inputs of
/// one sender's paths.
#[cfg(feature = "path-index")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathIndex<const P: usize> {
    /// Per path, `(in_flight + 1) x delay`: the cost is `num / den`,
    /// compared by cross-multiplication (no division per packet).
    num: [u64; P],
    /// Per path, its weight (1 to 1024).
    den: [u16; P],
    /// Node `k` (1 to `P - 1`) holds the cheapest leaf of its subtree;
    /// the children of `k` are `2k` and `2k + 1`, leaf `i` is node `P +
    /// i` (a complete tree when `P` is a power of two; otherwise only the
    /// nodes a range query meets are ordered, and the root is not read).
    tree: [u8; P],
    /// Paths whose cost inputs changed since their leaf was computed, bit
    /// `i % 64` for path `i`.
    dirty: u64,
    /// The unqueued round trip the leaves were computed with.
    base: u64,
    /// Paths the tree was built for; 0 before the first choice.
    active: u16,
    /// Paths the loss-detection inputs were computed for (0: none).
    agg_active: u16,
    /// Per path, its timeout (`srtt + 4 rttvar`; 0: no estimate yet).
    timeout: [u32; P],
    /// Per path with an estimate, the shortest time after its send at
    /// which a packet on it can be declared lost.
    due: [u32; P],
    /// The largest `timeout`.
    slowest_timeout: u32,
    /// The least `due` (valid while every path has an estimate).
    soonest: u32,
    /// Active paths without a round-trip estimate.
    unestimated: u16,
    /// The send time of the newest packet delivered on any active path.
    newest: Option<Psn>,
}

/// The soonest a packet on `p` can be declared lost after its send, for
/// the path's estimate `(rtt, var)` (spec 4.6.2).
#[inline]
fn due(p: &PathSender, rtt: u32, var: u32) -> u32 {
    rtt.saturating_add(p.same_path_allowance(rtt, var).max(1_000))
}

/// The path a scan from `start` finds among the first `n`: the first of
/// the least `(in_flight + 1) x delay / weight`, round-robin among equals
/// (see [`super::SenderState::choose_path`]); `base`: the unqueued round
/// trip.
#[cfg(not(feature = "path-index"))]
pub(crate) fn scan(paths: &[PathSender], n: usize, base: u64, start: usize) -> usize {
    // Least (in_flight + 1) * delay / weight, compared by
    // cross-multiplication (no division on the per-packet path).
    let mut best = start;
    let mut best_num = u64::MAX;
    let mut best_den = 1u64;
    let mut i = start;
    for _ in 0..n {
        let (num, den) = leaf(&paths[i], base);
        let den = u64::from(den);
        if num * best_den < best_num.saturating_mul(den) {
            best_num = num;
            best_den = den;
            best = i;
        }
        i += 1;
        if i == n {
            i = 0;
        }
    }
    best
}

/// Path `p`'s cost as `(numerator, denominator)` (spec 4.9.1, see
/// [`super::SenderState::choose_path`]).
#[inline]
fn leaf(p: &PathSender, base: u64) -> (u64, u16) {
    let q = if p.loss_frac < ONE / 16 {
        u64::from(p.rtt.srtt_ns())
            .saturating_sub(base)
            .min(2 * base)
    } else {
        0
    };
    let delay = base + 3 * q;
    (
        (u64::from(p.in_flight) + 1) * delay,
        p.weight().max(1) as u16,
    )
}

/// [`due`] on the path's own estimate.
#[inline]
fn own_due(p: &PathSender) -> u32 {
    due(p, p.rtt.srtt_ns(), p.rtt.rttvar_ns())
}

/// Entry `i` of `values` becomes `new`; `*cur`, the greatest of them
/// (`sign` 0) or the least (`sign` `u32::MAX`: compared complemented),
/// follows, and is found again among them only when its holder moved
/// away from it.
#[cfg(feature = "path-index")]
#[inline(never)]
fn track(values: &mut [u32], cur: &mut u32, i: usize, new: u32, sign: u32) {
    let old = core::mem::replace(&mut values[i], new);
    if new ^ sign >= *cur ^ sign {
        *cur = new;
    } else if old == *cur {
        *cur = values.iter().map(|&v| v ^ sign).max().unwrap_or(0) ^ sign;
    }
}

#[cfg(feature = "path-index")]
impl<const P: usize> PathIndex<P> {
    /// Holds for every `P` an endpoint may be built with (the wire's
    /// largest path count).
    const FITS: () = assert!(P >= 1 && P <= 256, "1 to 256 paths per connection");

    pub(crate) const EMPTY: PathIndex<P> = PathIndex {
        num: [0; P],
        den: [1; P],
        tree: [0; P],
        dirty: 0,
        base: 0,
        active: 0,
        agg_active: 0,
        timeout: [0; P],
        due: [0; P],
        slowest_timeout: 0,
        soonest: 0,
        unestimated: 0,
        newest: None,
    };

    /// Marks path `i`'s cost as changed.
    #[inline]
    pub(crate) fn touch(&mut self, i: usize) {
        self.dirty |= 1 << (i % 64);
    }

    /// Path `i`'s leaf from its telemetry (spec 4.9.1, see
    /// [`super::SenderState::choose_path`]).
    #[inline]
    fn compute_leaf(&mut self, i: usize, p: &PathSender) {
        (self.num[i], self.den[i]) = leaf(p, self.base);
    }

    /// The leaf that wins node `node` (a leaf's own index for a leaf).
    #[inline]
    fn winner(&self, node: usize) -> usize {
        if node >= P {
            node - P
        } else {
            usize::from(self.tree[node])
        }
    }

    /// Whether leaf `b` costs strictly less than leaf `a`; leaves past the
    /// active paths never win.
    #[inline]
    fn cheaper(&self, b: usize, a: usize) -> bool {
        let n = usize::from(self.active);
        if b >= n {
            return false;
        }
        if a >= n {
            return true;
        }
        self.num[b] * u64::from(self.den[a]) < self.num[a] * u64::from(self.den[b])
    }

    /// [`Self::cheaper`] when every leaf is active (the usual case): no
    /// bounds to check.
    #[inline]
    fn cheaper_active(&self, b: usize, a: usize) -> bool {
        self.num[b] * u64::from(self.den[a]) < self.num[a] * u64::from(self.den[b])
    }

    /// Replays the match at `node`: the left child's winner keeps it on a
    /// tie (the lower index). `ALL`: every leaf is active.
    #[inline]
    fn play<const ALL: bool>(&mut self, node: usize) {
        let (l, r) = (self.winner(2 * node), self.winner(2 * node + 1));
        let right = if ALL {
            self.cheaper_active(r, l)
        } else {
            self.cheaper(r, l)
        };
        self.tree[node] = if right { r } else { l } as u8;
    }

    /// Replays the matches above leaf `i`.
    #[inline]
    fn climb<const ALL: bool>(&mut self, i: usize) {
        let mut node = (P + i) / 2;
        while node > 0 {
            self.play::<ALL>(node);
            node /= 2;
        }
    }

    /// The first of the cheapest leaves of `[lo, hi)` (`hi` at most the
    /// active paths, `lo` below it), from the subtrees covering it: those
    /// met from the left in order, those from the right in reverse.
    fn first_cheapest(&self, lo: usize, hi: usize) -> usize {
        let (mut l, mut r) = (lo + P, hi + P);
        let (mut left, mut right) = (usize::MAX, usize::MAX);
        while l < r {
            if l & 1 == 1 {
                let c = self.winner(l);
                if left == usize::MAX || self.cheaper(c, left) {
                    left = c;
                }
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                let c = self.winner(r);
                if right == usize::MAX || !self.cheaper(right, c) {
                    right = c;
                }
            }
            l >>= 1;
            r >>= 1;
        }
        if left == usize::MAX || (right != usize::MAX && self.cheaper(right, left)) {
            right
        } else {
            left
        }
    }

    /// The path for the next packet among the first `active`: the first
    /// of the cheapest at or after `start`, wrapping round (`start` below
    /// `active`). `base`: the unqueued round trip (at least 1).
    pub(crate) fn choose(
        &mut self,
        paths: &[PathSender; P],
        active: usize,
        base: u64,
        start: usize,
    ) -> usize {
        let () = Self::FITS;
        let n = active.min(P);
        if base != self.base || n != usize::from(self.active) {
            // A new minimum round trip moves every delay: rebuilt.
            self.base = base;
            self.active = n as u16;
            for (i, p) in paths.iter().enumerate().take(n) {
                self.compute_leaf(i, p);
            }
            for node in (1..P).rev() {
                self.play::<false>(node);
            }
        } else if P <= 64 && self.dirty & self.dirty.wrapping_sub(1) != 0 {
            // Several marked leaves (a delivery ACK marks each path it
            // acknowledged on): their matches, each node once. A node's
            // children have larger indices, so nodes replayed from the
            // largest down see both children final, and leaves that share
            // an ancestor share its match (at 16 paths, 4 marked leaves
            // replay about 9 matches instead of 16). One marked leaf (a
            // send) climbs, below.
            let mut d = self.dirty & u64::MAX.checked_shr(64 - n as u32).unwrap_or(0);
            let mut nodes = 0u64;
            while d != 0 {
                let i = d.trailing_zeros() as usize;
                d &= d - 1;
                self.compute_leaf(i, &paths[i]);
                nodes |= 1 << ((P + i) / 2);
            }
            while nodes > 1 {
                let node = 63 - nodes.leading_zeros() as usize;
                nodes &= !(1 << node);
                if n == P {
                    self.play::<true>(node);
                } else {
                    self.play::<false>(node);
                }
                nodes |= 1 << (node / 2);
            }
        } else {
            let mut d = self.dirty;
            while d != 0 {
                let b = d.trailing_zeros() as usize;
                d &= d - 1;
                // Paths `b`, `b + 64`, ... share the bit (beyond 64 paths).
                for i in (b..n).step_by(64) {
                    self.compute_leaf(i, &paths[i]);
                    if n == P {
                        self.climb::<true>(i);
                    } else {
                        self.climb::<false>(i);
                    }
                }
            }
        }
        self.dirty = 0;
        let w = if P.is_power_of_two() {
            self.winner(1)
        } else {
            self.first_cheapest(0, n)
        };
        if w >= start {
            return w;
        }
        // The cheapest lies before the start: the first path from the
        // start on that costs as little, if any.
        let c = self.first_cheapest(start, n);
        if self.num[c] * u64::from(self.den[w]) == self.num[w] * u64::from(self.den[c]) {
            c
        } else {
            w
        }
    }

    /// Computes the loss-detection inputs of the first `active` paths
    /// afresh.
    #[inline(never)]
    pub(crate) fn rebuild_recovery(&mut self, paths: &[PathSender; P], active: usize) {
        let n = active.min(P);
        self.agg_active = n as u16;
        self.unestimated = 0;
        self.newest = None;
        self.slowest_timeout = 0;
        self.soonest = u32::MAX;
        for (i, p) in paths.iter().enumerate().take(n) {
            let t = p.rtt.timeout_ns();
            self.timeout[i] = t;
            self.slowest_timeout = self.slowest_timeout.max(t);
            self.due[i] = own_due(p);
            self.soonest = self.soonest.min(self.due[i]);
            if t == 0 {
                self.unestimated += 1;
            }
            if p.rack_valid {
                let ts = Psn(p.rack_xmit_ts);
                self.newest = Some(self.newest.map_or(ts, |m| m.max(ts)));
            }
        }
    }

    /// Makes the loss-detection inputs those of `active` paths (they are,
    /// unless the path count changed since the sender state was set up).
    #[inline]
    pub(crate) fn sync(&mut self, paths: &[PathSender; P], active: usize) {
        if usize::from(self.agg_active) != active.min(P) {
            self.rebuild_recovery(paths, active);
        }
    }

    /// Path `i` took an RTT sample (its estimate is in `paths[i]`).
    pub(crate) fn on_rtt(&mut self, paths: &[PathSender; P], i: usize) {
        self.touch(i);
        let n = usize::from(self.agg_active);
        if i >= n {
            return;
        }
        let p = &paths[i];
        if self.timeout[i] == 0 {
            // The first estimate of this path: rare, from scratch.
            self.rebuild_recovery(paths, n);
            return;
        }
        track(
            &mut self.timeout[..n],
            &mut self.slowest_timeout,
            i,
            p.rtt.timeout_ns(),
            0,
        );
        track(
            &mut self.due[..n],
            &mut self.soonest,
            i,
            own_due(p),
            u32::MAX,
        );
    }

    /// Path `i` was seen to reorder: its reordering allowance changed.
    pub(crate) fn on_reordering(&mut self, paths: &[PathSender; P], i: usize) {
        let n = usize::from(self.agg_active);
        if i < n {
            track(
                &mut self.due[..n],
                &mut self.soonest,
                i,
                own_due(&paths[i]),
                u32::MAX,
            );
        }
    }

    /// A packet sent at `ts` was delivered on path `i`, which now holds it
    /// as its newest.
    #[inline]
    pub(crate) fn on_rack(&mut self, i: usize, ts: u32) {
        if i < usize::from(self.agg_active) {
            let ts = Psn(ts);
            self.newest = Some(self.newest.map_or(ts, |m| m.max(ts)));
        }
    }

    /// The largest timeout (`srtt + 4 rttvar`) of the first `active`
    /// paths ([`Self::sync`] first).
    #[inline]
    pub(crate) fn slowest_timeout(&self, _paths: &[PathSender; P], _active: usize) -> u32 {
        self.slowest_timeout
    }

    /// The send time of the newest packet delivered on the first `active`
    /// paths ([`Self::sync`] first).
    #[inline]
    pub(crate) fn newest_delivered(&self, _paths: &[PathSender; P], _active: usize) -> Option<Psn> {
        self.newest
    }

    /// Whether every path is known to have a round-trip estimate of its
    /// own ([`Self::sync`] first).
    #[inline]
    pub(crate) fn all_estimated(&self) -> bool {
        self.unestimated == 0
    }

    /// The shortest time after its send at which a packet on any of the
    /// first `active` paths can be declared lost ([`Self::sync`] first); a
    /// path without an estimate of its own takes `fallback`.
    pub(crate) fn soonest(
        &self,
        paths: &[PathSender; P],
        active: usize,
        fallback: (u32, u32),
    ) -> u32 {
        if self.all_estimated() {
            return self.soonest;
        }
        // Before every path has a sample: rare, by scanning.
        soonest_scan(&paths[..active], fallback)
    }
}

/// The soonest a packet on any of `paths` can be declared lost after its
/// send, by scanning them; a path without an estimate takes `fallback`.
fn soonest_scan(paths: &[PathSender], fallback: (u32, u32)) -> u32 {
    paths
        .iter()
        .map(|p| {
            if p.rtt.has_estimate() {
                own_due(p)
            } else {
                due(p, fallback.0, fallback.1)
            }
        })
        .min()
        .unwrap_or(0)
}

/// Without the index: nothing kept, every answer found by scanning.
#[cfg(not(feature = "path-index"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathIndex<const P: usize>;

#[cfg(not(feature = "path-index"))]
impl<const P: usize> PathIndex<P> {
    pub(crate) const EMPTY: PathIndex<P> = PathIndex;

    #[inline]
    pub(crate) fn touch(&mut self, _i: usize) {}

    /// The first of the cheapest paths at or after `start` (a scan).
    #[inline]
    pub(crate) fn choose(
        &mut self,
        paths: &[PathSender; P],
        active: usize,
        base: u64,
        start: usize,
    ) -> usize {
        scan(paths, active.min(P), base, start)
    }

    #[inline]
    pub(crate) fn rebuild_recovery(&mut self, _paths: &[PathSender; P], _active: usize) {}

    #[inline]
    pub(crate) fn sync(&mut self, _paths: &[PathSender; P], _active: usize) {}

    #[inline]
    pub(crate) fn on_rtt(&mut self, _paths: &[PathSender; P], _i: usize) {}

    #[inline]
    pub(crate) fn on_reordering(&mut self, _paths: &[PathSender; P], _i: usize) {}

    #[inline]
    pub(crate) fn on_rack(&mut self, _i: usize, _ts: u32) {}

    /// The largest timeout of the first `active` paths (a scan).
    pub(crate) fn slowest_timeout(&self, paths: &[PathSender; P], active: usize) -> u32 {
        paths[..active]
            .iter()
            .map(|p| p.rtt.timeout_ns())
            .max()
            .unwrap_or(0)
    }

    /// The send time of the newest packet delivered on the first `active`
    /// paths (a scan).
    pub(crate) fn newest_delivered(&self, paths: &[PathSender; P], active: usize) -> Option<Psn> {
        paths[..active]
            .iter()
            .filter(|p| p.rack_valid)
            .map(|p| Psn(p.rack_xmit_ts))
            .reduce(Psn::max)
    }

    #[inline]
    pub(crate) fn all_estimated(&self) -> bool {
        false
    }

    /// The soonest deadline of the first `active` paths (a scan).
    pub(crate) fn soonest(
        &self,
        paths: &[PathSender; P],
        active: usize,
        fallback: (u32, u32),
    ) -> u32 {
        soonest_scan(&paths[..active], fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::super::sender::SenderState;
    use super::*;
    use crate::config::Config;
    use crate::rtt::RttEstimator;
    use crate::time::Instant;

    /// The choice as a scan from the start gives it: the oracle.
    fn scan<const P: usize>(st: &SenderState<P>, n: usize, min_rtt_ns: u32, start: usize) -> usize {
        let base = u64::from(min_rtt_ns | 1);
        let (mut best, mut best_num, mut best_den) = (start, u64::MAX, 1u64);
        let mut i = start;
        for _ in 0..n {
            let p = &st.paths[i];
            let q = if p.loss_frac < ONE / 16 {
                u64::from(p.rtt.srtt_ns())
                    .saturating_sub(base)
                    .min(2 * base)
            } else {
                0
            };
            let num = (u64::from(p.in_flight) + 1) * (base + 3 * q);
            let den = u64::from(p.weight().max(1));
            if num * best_den < best_num.saturating_mul(den) {
                (best, best_num, best_den) = (i, num, den);
            }
            i = (i + 1) % n;
        }
        best
    }

    /// A small generator (xorshift64), so the test needs nothing else.
    struct Gen(u64);

    impl Gen {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random sends, deliveries, losses, echoes and RTT samples on 1 to
    /// `P` paths: the tree picks the path the scan picks, and the
    /// loss-detection inputs equal those found by scanning.
    #[test]
    fn index_matches_the_scan() {
        check::<16>(&[1, 2, 3, 4, 5, 7, 8, 9, 13, 15, 16, 16, 16, 16]);
        // Not a power of two: the root is not read.
        check::<12>(&[1, 5, 11, 12, 12]);
        // The most paths whose marked matches are replayed together.
        check::<64>(&[1, 33, 63, 64]);
        // Paths beyond 64 share their marks.
        check::<256>(&[17, 100, 256]);
    }

    fn check<const P: usize>(counts: &[usize]) {
        let config = Config::default();
        for (k, &n) in counts.iter().enumerate() {
            let seed = k as u64 + 1;
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut st = SenderState::<P>::new(
                &config,
                Instant::ZERO,
                RttEstimator::default(),
                Some(0),
                n as u16,
            );
            let mut min_rtt = 0u32;
            for _ in 0..4_000 {
                let i = g.below(n as u64) as usize;
                match g.below(8) {
                    0 | 1 => {
                        // Few distinct samples, so costs often tie.
                        let rtt = 6_000 + 1_000 * g.below(4) as u32;
                        min_rtt = if min_rtt == 0 { rtt } else { min_rtt.min(rtt) };
                        st.on_rtt_sample(i, rtt);
                    }
                    2 => {
                        let p = st.path_mut(i);
                        p.in_flight = p.in_flight.saturating_sub(1);
                        p.on_delivered();
                    }
                    3 if g.below(4) == 0 => {
                        let p = st.path_mut(i);
                        p.in_flight = p.in_flight.saturating_sub(1);
                        p.on_lost();
                    }
                    4 => {
                        let rx = g.below(4) as u16 + 1;
                        let seen = st.paths[i].echo_rx_seen;
                        let ce = st.paths[i].echo_ce_seen;
                        st.path_mut(i)
                            .on_echo(seen.wrapping_add(rx), ce.wrapping_add(g.below(2) as u16));
                    }
                    5 => {
                        let ts = g.below(1 << 20) as u32;
                        let p = &mut st.paths[i];
                        if !p.rack_valid || Psn(ts).offset_from(Psn(p.rack_xmit_ts)) > 0 {
                            p.rack_xmit_ts = ts;
                            p.rack_valid = true;
                            st.index.on_rack(i, ts);
                        }
                    }
                    6 if g.below(8) == 0 => st.note_reordering(i),
                    _ => {
                        let start = usize::from(st.next_path) % n;
                        let want = scan(&st, n, min_rtt, start);
                        let got = st.choose_path(n as u16, min_rtt);
                        assert_eq!(usize::from(got), want, "seed {seed}");
                        st.on_sent(got, false);
                    }
                }
                let paths = &st.paths[..n];
                let max = |f: fn(&PathSender) -> u32| paths.iter().map(f).max().unwrap_or(0);
                st.index.sync(&st.paths, n);
                assert_eq!(
                    st.index.slowest_timeout(&st.paths, n),
                    max(|p| p.rtt.timeout_ns())
                );
                let newest = paths
                    .iter()
                    .filter(|p| p.rack_valid)
                    .map(|p| Psn(p.rack_xmit_ts))
                    .reduce(Psn::max);
                assert_eq!(st.index.newest_delivered(&st.paths, n), newest);
                let soonest = paths
                    .iter()
                    .map(|p| due(p, p.rtt.srtt_ns(), p.rtt.rttvar_ns()))
                    .min()
                    .unwrap_or(0);
                assert_eq!(st.index.soonest(&st.paths, n, (0, 0)), soonest);
            }
        }
    }
}
