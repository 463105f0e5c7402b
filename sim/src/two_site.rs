//! Two data-centre sites joined by long-haul links (a data-centre
//! interconnect, DCI), for transfers whose round trip is milliseconds
//! rather than microseconds.
//!
//! Shape, and why: each site is a leaf-spine ([`Topology::add_leaf_spine`],
//! both sites alike). Every spine of a site links to each of the site's
//! **border switches**, as a leaf would, and the long-haul links run
//! between the border switches of the two sites. That is how DCI is
//! usually built: the WAN edge is a pair (or more) of border leaves or DCI
//! routers hanging off the spine layer, deep-buffered (routers built on
//! chips with gigabytes of off-chip buffer), with the long-haul circuits
//! (DWDM wavelengths, coherent pluggables) between the border routers of
//! the two sites, several in parallel and spread over the border pair so
//! that one router or circuit failing halves the capacity rather than cuts
//! it. Spines are not joined across directly: their ports are for leaves,
//! and their shallow buffers cannot absorb a long path's bandwidth-delay
//! product. Long-haul link `j` joins border `j % borders` of site A to the
//! same border of site B, so every long-haul link is on an equal-cost path
//! and the switches' ECMP spreads flows over all of them.
//!
//! Host numbering: site A's hosts are `0..n`, site B's `n..2n`, each site's
//! leaf by leaf as in [`LeafSpine`].

use std::time::Duration;

use crate::link::{LinkConfig, LossModel};
use crate::packet::HostId;
use crate::queue::QueueConfig;
use crate::topology::{LeafSpine, LinkId, NodeId, Site, Topology};

/// Shape and links of a two-site fabric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwoSite {
    /// Each site's leaf-spine (hosts, leaves, spines, host and fabric
    /// links, and the queue of every switch but the borders).
    pub site: LeafSpine,
    /// Border switches per site.
    pub borders: usize,
    /// The link between each spine and each border switch of its site.
    pub border_link: LinkConfig,
    /// Long-haul links between the sites.
    pub long_haul_links: usize,
    /// Each long-haul link: rate, one-way delay, loss (both directions
    /// unless `reverse_loss`).
    pub long_haul: LinkConfig,
    /// Output queue of every border switch port.
    pub border_queue: QueueConfig,
}

impl Default for TwoSite {
    /// Two sites of 8 hosts (2 leaves of 4, 2 spines), 2 border switches
    /// per site, 2 long-haul links; every link 25 Gbit/s (the long-haul
    /// experiment's rate, chosen to keep a 20 ms round trip's worth of
    /// packets simulable), 1 us inside a site, 1 ms one way long haul;
    /// border buffers of one long-haul bandwidth-delay product
    /// ([`TwoSite::deep_border_queue`]).
    fn default() -> Self {
        let rate_bps = 25_000_000_000;
        let link = LinkConfig {
            rate_bps,
            ..LinkConfig::default()
        };
        let site = LeafSpine {
            leaves: 2,
            spines: 2,
            hosts_per_leaf: 4,
            host_link: link,
            fabric_link: link,
            ..LeafSpine::default()
        };
        let mut t = TwoSite {
            site,
            borders: 2,
            border_link: link,
            long_haul_links: 2,
            long_haul: LinkConfig {
                delay: Duration::from_millis(1),
                ..link
            },
            border_queue: site.queue,
        };
        t.border_queue = t.deep_border_queue();
        t
    }
}

/// Where [`TwoSite::build`] put things.
#[derive(Debug, Clone, PartialEq)]
pub struct TwoSiteLayout {
    pub topology: Topology,
    /// Site A, site B.
    pub sites: [Site; 2],
    /// Border switches of site A, of site B.
    pub borders: [Vec<NodeId>; 2],
    /// The long-haul links, in order.
    pub long_haul_links: Vec<LinkId>,
}

impl TwoSite {
    /// Builds the topology.
    pub fn build(&self) -> TwoSiteLayout {
        let mut topology = Topology::empty(self.site.queue);
        topology.pfc = self.site.pfc;
        let sites = [
            topology.add_leaf_spine(&self.site),
            topology.add_leaf_spine(&self.site),
        ];
        let borders: [Vec<NodeId>; 2] = core::array::from_fn(|s| {
            let borders: Vec<NodeId> = (0..self.borders.max(1))
                .map(|_| topology.add_switch())
                .collect();
            for &border in &borders {
                topology.set_switch_queue(border, self.border_queue);
                for &spine in &sites[s].spines {
                    topology.connect(spine, border, self.border_link);
                }
            }
            borders
        });
        let long_haul_links = (0..self.long_haul_links.max(1))
            .map(|j| {
                let b = j % borders[0].len();
                topology.connect(borders[0][b], borders[1][b], self.long_haul)
            })
            .collect();
        TwoSiteLayout {
            topology,
            sites,
            borders,
            long_haul_links,
        }
    }

    /// Hosts per site.
    pub fn hosts_per_site(&self) -> usize {
        self.site.hosts()
    }

    /// Host `i` of site `site` (0: A, 1: B).
    pub fn host(&self, site: usize, i: usize) -> HostId {
        site * self.hosts_per_site() + i
    }

    /// Propagation from a host to its site's border switch.
    pub fn in_site_delay(&self) -> Duration {
        self.site.host_link.delay + self.site.fabric_link.delay + self.border_link.delay
    }

    /// Two-way propagation delay between hosts of different sites.
    pub fn round_trip(&self) -> Duration {
        2 * (2 * self.in_site_delay() + self.long_haul.delay)
    }

    /// Sets the long-haul one-way delay so that a round trip between the
    /// sites takes `rtt` of propagation; where the two sites' own links
    /// already take more, the long-haul delay is 0 and the round trip is
    /// theirs ([`TwoSite::round_trip`] says what it is).
    pub fn set_round_trip(&mut self, rtt: Duration) {
        self.long_haul.delay = (rtt / 2).saturating_sub(2 * self.in_site_delay());
    }

    /// Random loss on every long-haul link, both directions.
    pub fn set_long_haul_loss(&mut self, loss: f64) {
        self.long_haul.loss = if loss > 0.0 {
            LossModel::Random(loss)
        } else {
            LossModel::None
        };
        self.long_haul.reverse_loss = None;
    }

    /// Bytes one long-haul link carries in a round trip between the sites.
    pub fn long_haul_bdp_bytes(&self) -> u64 {
        (u128::from(self.long_haul.rate_bps) * self.round_trip().as_nanos() / 8_000_000_000) as u64
    }

    /// The border switches' queue for the current round trip: the site's
    /// queue (same ECN marking) with a drop-tail limit of one long-haul
    /// bandwidth-delay product, and never less than the site's buffer.
    /// Why one BDP: a flow that overshoots the long-haul link's rate (a
    /// window released at once, a start-up that doubles past the rate) by
    /// up to a round trip's worth of bytes must be buffered, not dropped,
    /// while its reaction (ECN, one round trip later) takes effect; losing
    /// it to drop-tail costs a long flow a whole round trip of recovery or
    /// more (the classic one-BDP buffer rule for a single AIMD flow).
    /// Deep-buffer DCI routers hold that much: at 25 Gbit/s and 20 ms it is
    /// 62.5 MB, tens of milliseconds per port as such routers provide.
    pub fn deep_border_queue(&self) -> QueueConfig {
        QueueConfig {
            capacity_bytes: self
                .long_haul_bdp_bytes()
                .max(self.site.queue.capacity_bytes),
            ..self.site.queue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{SimConfig, Simulator};
    use crate::probe::Probe;
    use crate::topology::NodeKind;

    #[test]
    fn two_sites_share_one_topology_through_their_borders() {
        let spec = TwoSite {
            long_haul_links: 4,
            ..TwoSite::default()
        };
        let l = spec.build();
        let t = &l.topology;
        assert_eq!(t.host_count(), 16);
        assert_eq!(l.sites[0].hosts, 0..8);
        assert_eq!(l.sites[1].hosts, 8..16);
        assert_eq!(spec.host(1, 3), 11);
        // 2 x (2 spines + 2 leaves) + 2 x 2 borders.
        let switches = t.nodes.iter().filter(|k| **k == NodeKind::Switch).count();
        assert_eq!(switches, 12);
        // Per site: 4 leaf-spine + 8 host + 4 spine-border links; plus 4.
        assert_eq!(t.links.len(), 2 * 16 + 4);
        // Long-haul link j joins border j % 2 of each site.
        for (j, &id) in l.long_haul_links.iter().enumerate() {
            let link = &t.links[id];
            assert_eq!((link.a, link.b), (l.borders[0][j % 2], l.borders[1][j % 2]));
            assert_eq!(link.config.delay, Duration::from_millis(1));
        }
        assert_eq!(t.queue_of(l.borders[1][0]), spec.border_queue);
        assert_eq!(t.queue_of(l.sites[0].spines[0]), spec.site.queue);
        // 3 us to the border each side plus 1 ms, both ways.
        assert_eq!(spec.round_trip(), Duration::from_micros(2 * (6 + 1000)));
    }

    #[test]
    fn round_trip_is_set_by_the_long_haul_delay() {
        let mut spec = TwoSite::default();
        spec.set_round_trip(Duration::from_millis(10));
        assert_eq!(spec.round_trip(), Duration::from_millis(10));
        assert_eq!(spec.long_haul.delay, Duration::from_micros(4_994));
        // Shorter than the sites' own links: long haul 0, 12 us.
        spec.set_round_trip(Duration::from_micros(10));
        assert_eq!(spec.long_haul.delay, Duration::ZERO);
        assert_eq!(spec.round_trip(), Duration::from_micros(12));
        spec.set_round_trip(Duration::from_millis(20));
        assert_eq!(spec.long_haul_bdp_bytes(), 62_500_000);
        assert_eq!(spec.deep_border_queue().capacity_bytes, 62_500_000);
    }

    #[test]
    fn ecmp_reaches_the_other_site_over_every_long_haul_link() {
        let spec = TwoSite {
            long_haul_links: 4,
            ..TwoSite::default()
        };
        let l = spec.build();
        let sim = Simulator::new(&l.topology, SimConfig::default(), |_, _, _| {
            Probe::default()
        });
        let dst = spec.host(1, 0);
        // A border of site A has two parallel long-haul links to its
        // counterpart: both are next hops towards site B.
        let group = sim.route(l.borders[0][0], dst);
        assert_eq!(group.len(), 2, "{group:?}");
        // A spine of site A reaches site B through both borders.
        assert_eq!(sim.route(l.sites[0].spines[0], dst).len(), 2);
        // A leaf of site A: through both spines.
        assert_eq!(sim.route(l.sites[0].leaves[0], dst).len(), 2);
    }
}
