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

use super::sender::{PathSender, ONE};
use crate::psn::Psn;

/// The cost leaves, the tournament tree and the loss-detection inputs of
/// one sender's paths.
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
    /// Per path, the smoothed RTT and its variation.
    srtt: [u32; P],
    var: [u32; P],
    /// Per path with an estimate, the shortest time after its send at
    /// which a packet on it can be declared lost.
    due: [u32; P],
    slowest_srtt: u32,
    slowest_var: u32,
    slowest_timeout: u32,
    /// The least `due` (valid while every path has an estimate).
    soonest: u32,
    /// Active paths without a round-trip estimate.
    unestimated: u16,
    /// The send time of the newest packet delivered on any active path.
    newest: Option<Psn>,
}

/// `srtt + 4 x rttvar`, as [`crate::rtt::RttEstimator::timeout_ns`].
#[inline]
fn timeout(srtt: u32, var: u32) -> u32 {
    srtt.saturating_add(var.saturating_mul(4))
}

/// The soonest a packet on `p` can be declared lost after its send, for
/// the path's estimate `(rtt, var)` (spec 4.6.2).
#[inline]
fn due(p: &PathSender, rtt: u32, var: u32) -> u32 {
    rtt.saturating_add(p.same_path_allowance(rtt, var).max(1_000))
}

/// The maximum `cur` of values one of which went from `old` to `new`:
/// found again by `rescan` only when its holder fell.
#[inline]
fn track_max(cur: &mut u32, old: u32, new: u32, rescan: impl FnOnce() -> u32) {
    if new >= *cur {
        *cur = new;
    } else if old == *cur {
        *cur = rescan();
    }
}

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
        srtt: [0; P],
        var: [0; P],
        due: [0; P],
        slowest_srtt: 0,
        slowest_var: 0,
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
        let base = self.base;
        let q = if p.loss_frac < ONE / 16 {
            u64::from(p.rtt.srtt_ns()).saturating_sub(base).min(base)
        } else {
            0
        };
        let delay = base + 3 * q;
        self.num[i] = (u64::from(p.in_flight) + 1) * delay;
        self.den[i] = p.weight().max(1) as u16;
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

    /// Replays the match at `node`: the left child's winner keeps it on a
    /// tie (the lower index).
    #[inline]
    fn play(&mut self, node: usize) {
        let (l, r) = (self.winner(2 * node), self.winner(2 * node + 1));
        self.tree[node] = if self.cheaper(r, l) { r } else { l } as u8;
    }

    /// Replays the matches above leaf `i`.
    #[inline]
    fn climb(&mut self, i: usize) {
        let mut node = (P + i) / 2;
        while node > 0 {
            self.play(node);
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
                self.play(node);
            }
        } else {
            let mut d = self.dirty;
            while d != 0 {
                let b = d.trailing_zeros() as usize;
                d &= d - 1;
                // Paths `b`, `b + 64`, ... share the bit.
                for i in (b..n).step_by(64) {
                    self.compute_leaf(i, &paths[i]);
                    self.climb(i);
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
    pub(crate) fn rebuild_recovery(&mut self, paths: &[PathSender; P], active: usize) {
        let n = active.min(P);
        self.agg_active = n as u16;
        self.unestimated = 0;
        self.newest = None;
        for (i, p) in paths.iter().enumerate().take(n) {
            self.srtt[i] = p.rtt.srtt_ns();
            self.var[i] = p.rtt.rttvar_ns();
            if !p.rtt.has_estimate() {
                self.unestimated += 1;
            }
            if p.rack_valid {
                let ts = Psn(p.rack_xmit_ts);
                self.newest = Some(self.newest.map_or(ts, |m| m.max(ts)));
            }
            self.due[i] = due(p, self.srtt[i], self.var[i]);
        }
        self.slowest_srtt = self.srtt[..n].iter().copied().max().unwrap_or(0);
        self.slowest_var = self.var[..n].iter().copied().max().unwrap_or(0);
        self.slowest_timeout = self.max_timeout(n);
        self.soonest = self.due[..n].iter().copied().min().unwrap_or(0);
    }

    fn max_timeout(&self, n: usize) -> u32 {
        self.srtt[..n]
            .iter()
            .zip(&self.var[..n])
            .map(|(&s, &v)| timeout(s, v))
            .max()
            .unwrap_or(0)
    }

    /// Whether the loss-detection inputs are those of `active` paths.
    #[inline]
    fn current(&self, active: usize) -> bool {
        usize::from(self.agg_active) == active.min(P) && active > 0
    }

    /// Path `i` took an RTT sample (its estimate is in `paths[i]`).
    pub(crate) fn on_rtt(&mut self, paths: &[PathSender; P], i: usize) {
        self.touch(i);
        let n = usize::from(self.agg_active);
        if i >= n {
            return;
        }
        let p = &paths[i];
        let (s, v) = (p.rtt.srtt_ns(), p.rtt.rttvar_ns());
        let (old_s, old_v) = (self.srtt[i], self.var[i]);
        self.srtt[i] = s;
        self.var[i] = v;
        if old_s == 0 {
            // The first estimate of this path: rare, from scratch.
            self.rebuild_recovery(paths, n);
            return;
        }
        let (srtt, var) = (&self.srtt[..n], &self.var[..n]);
        track_max(&mut self.slowest_srtt, old_s, s, || {
            srtt.iter().copied().max().unwrap_or(0)
        });
        track_max(&mut self.slowest_var, old_v, v, || {
            var.iter().copied().max().unwrap_or(0)
        });
        let (old_t, t) = (timeout(old_s, old_v), timeout(s, v));
        if t >= self.slowest_timeout {
            self.slowest_timeout = t;
        } else if old_t == self.slowest_timeout {
            self.slowest_timeout = self.max_timeout(n);
        }
        self.set_due(i, due(p, s, v));
    }

    /// Path `i`'s `due` changed to `d`: the soonest follows.
    #[inline]
    fn set_due(&mut self, i: usize, d: u32) {
        let old = self.due[i];
        self.due[i] = d;
        let n = usize::from(self.agg_active);
        if d <= self.soonest {
            self.soonest = d;
        } else if old == self.soonest {
            self.soonest = self.due[..n].iter().copied().min().unwrap_or(0);
        }
    }

    /// Path `i` was seen to reorder: its reordering allowance changed.
    pub(crate) fn on_reordering(&mut self, paths: &[PathSender; P], i: usize) {
        if i < usize::from(self.agg_active) {
            self.set_due(i, due(&paths[i], self.srtt[i], self.var[i]));
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

    /// The largest timeout (`srtt + 4 rttvar`) of the first `active` paths.
    pub(crate) fn slowest_timeout(&self, paths: &[PathSender; P], active: usize) -> u32 {
        if self.current(active) {
            return self.slowest_timeout;
        }
        paths[..active]
            .iter()
            .map(|p| p.rtt.timeout_ns())
            .max()
            .unwrap_or(0)
    }

    /// The largest smoothed RTT and variation of the first `active` paths.
    pub(crate) fn slowest(&self, paths: &[PathSender; P], active: usize) -> (u32, u32) {
        if self.current(active) {
            return (self.slowest_srtt, self.slowest_var);
        }
        let srtt = paths[..active].iter().map(|p| p.rtt.srtt_ns()).max();
        let var = paths[..active].iter().map(|p| p.rtt.rttvar_ns()).max();
        (srtt.unwrap_or(0), var.unwrap_or(0))
    }

    /// The send time of the newest packet delivered on the first `active`
    /// paths.
    pub(crate) fn newest_delivered(&self, paths: &[PathSender; P], active: usize) -> Option<Psn> {
        if self.current(active) {
            return self.newest;
        }
        paths[..active]
            .iter()
            .filter(|p| p.rack_valid)
            .map(|p| Psn(p.rack_xmit_ts))
            .reduce(Psn::max)
    }

    /// The shortest time after its send at which a packet on any of the
    /// first `active` paths can be declared lost; a path without an
    /// estimate of its own takes `fallback` (the slowest estimate).
    pub(crate) fn soonest(
        &self,
        paths: &[PathSender; P],
        active: usize,
        fallback: (u32, u32),
    ) -> u32 {
        if self.current(active) && self.unestimated == 0 {
            return self.soonest;
        }
        paths[..active]
            .iter()
            .map(|p| {
                let (rtt, var) = if p.rtt.has_estimate() {
                    (p.rtt.srtt_ns(), p.rtt.rttvar_ns())
                } else {
                    fallback
                };
                due(p, rtt, var)
            })
            .min()
            .unwrap_or(0)
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
                u64::from(p.rtt.srtt_ns()).saturating_sub(base).min(base)
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
                assert_eq!(
                    st.index.slowest_timeout(&st.paths, n),
                    max(|p| p.rtt.timeout_ns())
                );
                assert_eq!(
                    st.index.slowest(&st.paths, n),
                    (max(|p| p.rtt.srtt_ns()), max(|p| p.rtt.rttvar_ns()))
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
