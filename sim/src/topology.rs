//! Topologies: which nodes exist (hosts and switches) and the links
//! between them. A node's ports are numbered in the order its links were
//! added. Routing is computed by the simulator from this description
//! (shortest paths, every equal-cost next hop in the ECMP group).

use crate::link::{LinkConfig, LossModel};
use crate::packet::HostId;
use crate::queue::QueueConfig;

/// Index of a node (host or switch).
pub type NodeId = usize;
/// Index of a link.
pub type LinkId = usize;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A host with one NIC port; its index among hosts.
    Host(HostId),
    /// A switch with output-queued ports.
    Switch,
}

/// A full-duplex link between two nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub a: NodeId,
    pub b: NodeId,
    pub config: LinkConfig,
}

/// A fabric description.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub nodes: Vec<NodeKind>,
    /// Node of each host, by host index.
    pub hosts: Vec<NodeId>,
    pub links: Vec<Link>,
    /// Output queue of every switch port, unless `queue_overrides` names
    /// the switch.
    pub queue: QueueConfig,
    /// Switches whose output queues differ from `queue` (deep-buffer border
    /// routers, say); see [`Topology::set_switch_queue`].
    pub queue_overrides: Vec<(NodeId, QueueConfig)>,
    /// Priority flow control on every switch, or none (a lossy fabric).
    pub pfc: Option<PfcConfig>,
}

/// Priority flow control (IEEE 802.1Qbb, one priority): a switch pauses
/// the sender on an ingress link while the bytes that came in through it
/// and still sit in its output queues exceed `xoff_bytes`, and resumes it
/// below `xon_bytes`. PAUSE and RESUME take the link's delay to arrive.
/// Hosts never pause (their receive buffers are memory). Buffers keep their
/// drop-tail limit: size them for the headroom (in-flight bytes after XOFF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcConfig {
    pub xoff_bytes: u64,
    pub xon_bytes: u64,
}

impl Default for PfcConfig {
    /// XOFF at 64 KB of an ingress port's bytes, XON two 4 KiB frames
    /// lower. Lossless only if each output buffer holds, for every ingress
    /// port, XOFF plus what is in flight while the PAUSE travels (about 2
    /// link delays at line rate plus a frame: ~33 KB at 100 Gbit/s and
    /// 1 us); see [`PfcConfig::lossless_buffer`].
    fn default() -> Self {
        PfcConfig {
            xoff_bytes: 64_000,
            xon_bytes: 64_000 - 2 * 4_142,
        }
    }
}

impl PfcConfig {
    /// Output buffer that keeps a switch with `ingress_ports` lossless on
    /// links of `rate_bps` and `delay`, with frames up to `frame` bytes.
    pub fn lossless_buffer(
        &self,
        ingress_ports: u64,
        rate_bps: u64,
        delay: std::time::Duration,
        frame: u64,
    ) -> u64 {
        let in_flight = (rate_bps as u128 * 2 * delay.as_nanos() / 8_000_000_000) as u64;
        ingress_ports * (self.xoff_bytes + in_flight + 2 * frame)
    }
}

impl Topology {
    /// No nodes yet.
    pub fn empty(queue: QueueConfig) -> Topology {
        Topology {
            nodes: Vec::new(),
            hosts: Vec::new(),
            links: Vec::new(),
            queue,
            queue_overrides: Vec::new(),
            pfc: None,
        }
    }

    /// Gives every output port of switch `node` the queue `queue`.
    pub fn set_switch_queue(&mut self, node: NodeId, queue: QueueConfig) {
        self.queue_overrides.retain(|(n, _)| *n != node);
        self.queue_overrides.push((node, queue));
    }

    /// The output queue of `node`'s ports.
    pub fn queue_of(&self, node: NodeId) -> QueueConfig {
        self.queue_overrides
            .iter()
            .find(|(n, _)| *n == node)
            .map_or(self.queue, |(_, q)| *q)
    }

    /// Adds a host; returns its host index.
    pub fn add_host(&mut self) -> HostId {
        let id = self.hosts.len();
        self.hosts.push(self.nodes.len());
        self.nodes.push(NodeKind::Host(id));
        id
    }

    /// Adds a switch; returns its node.
    pub fn add_switch(&mut self) -> NodeId {
        self.nodes.push(NodeKind::Switch);
        self.nodes.len() - 1
    }

    /// Links two nodes; returns the link.
    pub fn connect(&mut self, a: NodeId, b: NodeId, config: LinkConfig) -> LinkId {
        self.links.push(Link { a, b, config });
        self.links.len() - 1
    }

    /// Two hosts joined by one link, no switch.
    pub fn back_to_back(link: LinkConfig) -> Topology {
        let mut t = Topology::empty(QueueConfig::default());
        let a = t.add_host();
        let b = t.add_host();
        let (na, nb) = (t.hosts[a], t.hosts[b]);
        t.connect(na, nb, link);
        t
    }

    /// A two-tier leaf-spine fabric.
    pub fn leaf_spine(spec: &LeafSpine) -> Topology {
        let mut t = Topology::empty(spec.queue);
        t.pfc = spec.pfc;
        t.add_leaf_spine(spec);
        t
    }

    /// Adds a leaf-spine fabric (`spec`'s shape and links; its queue and
    /// PFC settings are the topology's) to this topology, so that several
    /// sites can share one. Spines first, then leaves, then the fabric
    /// links leaf-major, then the hosts leaf by leaf: on an empty topology
    /// node and link ids are those [`LeafSpine`] computes.
    pub fn add_leaf_spine(&mut self, spec: &LeafSpine) -> Site {
        let first_host = self.hosts.len();
        let first_fabric_link = self.links.len();
        let spines: Vec<NodeId> = (0..spec.spines).map(|_| self.add_switch()).collect();
        let leaves: Vec<NodeId> = (0..spec.leaves).map(|_| self.add_switch()).collect();
        // Fabric links first, leaf-major: link id = leaf * spines + spine.
        for &leaf in &leaves {
            for &spine in &spines {
                self.connect(leaf, spine, spec.fabric_link);
            }
        }
        for &leaf in &leaves {
            for _ in 0..spec.hosts_per_leaf {
                let h = self.add_host();
                let node = self.hosts[h];
                self.connect(node, leaf, spec.host_link);
            }
        }
        Site {
            spines,
            leaves,
            hosts: first_host..self.hosts.len(),
            first_fabric_link,
        }
    }

    /// Sets the loss model of every link.
    pub fn set_loss(&mut self, loss: LossModel) {
        for l in &mut self.links {
            l.config.loss = loss;
            l.config.reverse_loss = None;
        }
    }

    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }
}

/// Where [`Topology::add_leaf_spine`] put a fabric's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub spines: Vec<NodeId>,
    pub leaves: Vec<NodeId>,
    /// Its hosts, leaf by leaf.
    pub hosts: std::ops::Range<HostId>,
    /// Link id of (leaf 0, spine 0); (leaf, spine) is `leaf * spines + spine`
    /// further.
    pub first_fabric_link: LinkId,
}

/// Shape of a leaf-spine fabric. Hosts are numbered leaf by leaf: hosts
/// `0..hosts_per_leaf` hang off leaf 0, and so on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeafSpine {
    pub leaves: usize,
    pub spines: usize,
    pub hosts_per_leaf: usize,
    pub host_link: LinkConfig,
    pub fabric_link: LinkConfig,
    pub queue: QueueConfig,
    pub pfc: Option<PfcConfig>,
}

impl Default for LeafSpine {
    /// 64 hosts: 8 leaves of 8 hosts, 8 spines (non-blocking), 100 Gbit/s
    /// links of 1 us each, so a cross-leaf path is 4 hops and about 4 us.
    fn default() -> Self {
        LeafSpine {
            leaves: 8,
            spines: 8,
            hosts_per_leaf: 8,
            host_link: LinkConfig::default(),
            fabric_link: LinkConfig::default(),
            queue: QueueConfig::default(),
            pfc: None,
        }
    }
}

impl LeafSpine {
    /// A non-blocking fabric for about `hosts` hosts: leaves of
    /// `hosts_per_leaf`, as many spines as hosts per leaf.
    pub fn with_hosts(hosts: usize, hosts_per_leaf: usize) -> LeafSpine {
        let per = hosts_per_leaf.max(1);
        LeafSpine {
            leaves: hosts.div_ceil(per).max(1),
            spines: per,
            hosts_per_leaf: per,
            ..LeafSpine::default()
        }
    }

    /// Hosts in the fabric.
    pub fn hosts(&self) -> usize {
        self.leaves * self.hosts_per_leaf
    }

    /// The link between `leaf` and `spine` (both counted from 0).
    pub fn fabric_link(&self, leaf: usize, spine: usize) -> LinkId {
        leaf * self.spines + spine
    }

    /// The leaf a host hangs off.
    pub fn leaf_of(&self, host: HostId) -> usize {
        host / self.hosts_per_leaf.max(1)
    }
}

/// Shape of a three-tier fat tree (Clos): `pods` pods, each of
/// `leaves_per_pod` leaves with `hosts_per_leaf` hosts and
/// `spines_per_pod` aggregation (spine) switches, every leaf linked to
/// every spine of its pod; core switches in `spines_per_pod` planes of
/// `cores_per_plane`, spine `i` of every pod linked to every core of
/// plane `i`. Hosts are numbered leaf by leaf, pod by pod.
///
/// Oversubscription at the leaf is `hosts_per_leaf x host rate` over
/// `spines_per_pod x leaf_link rate`; at the spine, `leaves_per_pod x
/// leaf_link rate` over `cores_per_plane x core_link rate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FatTree {
    pub pods: usize,
    pub leaves_per_pod: usize,
    pub hosts_per_leaf: usize,
    pub spines_per_pod: usize,
    pub cores_per_plane: usize,
    /// Host to leaf.
    pub host_link: LinkConfig,
    /// Leaf to spine.
    pub leaf_link: LinkConfig,
    /// Spine to core.
    pub core_link: LinkConfig,
    pub queue: QueueConfig,
    pub pfc: Option<PfcConfig>,
}

impl FatTree {
    /// A fat tree of at least `hosts` hosts with leaves of
    /// `hosts_per_leaf`, as many leaves per pod as hosts per leaf, and
    /// every tier oversubscribed `oversubscription` to 1 (1: non-blocking;
    /// uplinks are rounded up, so never more than asked): `hosts_per_leaf
    /// / oversubscription` spines per pod and `leaves_per_pod /
    /// oversubscription` cores per plane, every link at the host link's
    /// rate. 8,192 hosts in leaves of 16 and 1:1 make the classic k = 32
    /// fat tree: 32 pods of 16 leaves and 16 spines, 256 cores.
    pub fn with_hosts(hosts: usize, hosts_per_leaf: usize, oversubscription: f64) -> FatTree {
        let per = hosts_per_leaf.max(1);
        let ratio = if oversubscription.is_finite() && oversubscription >= 1.0 {
            oversubscription
        } else {
            1.0
        };
        let uplinks = |down: usize| ((down as f64 / ratio).ceil() as usize).max(1);
        let leaves_per_pod = per;
        FatTree {
            pods: hosts.div_ceil(per * leaves_per_pod).max(1),
            leaves_per_pod,
            hosts_per_leaf: per,
            spines_per_pod: uplinks(per),
            cores_per_plane: uplinks(leaves_per_pod),
            host_link: LinkConfig::default(),
            leaf_link: LinkConfig::default(),
            core_link: LinkConfig::default(),
            queue: QueueConfig::default(),
            pfc: None,
        }
    }

    /// Hosts in the fabric.
    pub fn hosts(&self) -> usize {
        self.pods * self.leaves_per_pod * self.hosts_per_leaf
    }

    /// Switches in the fabric.
    pub fn switches(&self) -> usize {
        self.pods * (self.leaves_per_pod + self.spines_per_pod)
            + self.spines_per_pod * self.cores_per_plane
    }

    /// The leaf's oversubscription: what its hosts can send over what
    /// its uplinks carry.
    pub fn leaf_oversubscription(&self) -> f64 {
        (self.hosts_per_leaf as f64 * self.host_link.rate_bps as f64)
            / (self.spines_per_pod as f64 * self.leaf_link.rate_bps as f64).max(1.0)
    }

    /// The spine's oversubscription: what its leaves can send over what
    /// its core uplinks carry.
    pub fn spine_oversubscription(&self) -> f64 {
        (self.leaves_per_pod as f64 * self.leaf_link.rate_bps as f64)
            / (self.cores_per_plane as f64 * self.core_link.rate_bps as f64).max(1.0)
    }
}

impl Topology {
    /// A three-tier fat tree. Cores first (plane by plane), then each pod's
    /// spines and leaves, then the spine-core links, the leaf-spine links
    /// and the hosts, leaf by leaf.
    pub fn fat_tree(spec: &FatTree) -> Topology {
        let mut t = Topology::empty(spec.queue);
        t.pfc = spec.pfc;
        let cores: Vec<Vec<NodeId>> = (0..spec.spines_per_pod)
            .map(|_| (0..spec.cores_per_plane).map(|_| t.add_switch()).collect())
            .collect();
        let mut pods = Vec::with_capacity(spec.pods);
        for _ in 0..spec.pods {
            let spines: Vec<NodeId> = (0..spec.spines_per_pod).map(|_| t.add_switch()).collect();
            let leaves: Vec<NodeId> = (0..spec.leaves_per_pod).map(|_| t.add_switch()).collect();
            pods.push((spines, leaves));
        }
        for (spines, _) in &pods {
            for (plane, &spine) in spines.iter().enumerate() {
                for &core in &cores[plane] {
                    t.connect(spine, core, spec.core_link);
                }
            }
        }
        for (spines, leaves) in &pods {
            for &leaf in leaves {
                for &spine in spines {
                    t.connect(leaf, spine, spec.leaf_link);
                }
            }
        }
        for (_, leaves) in &pods {
            for &leaf in leaves {
                for _ in 0..spec.hosts_per_leaf {
                    let h = t.add_host();
                    let node = t.hosts[h];
                    t.connect(node, leaf, spec.host_link);
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_leaf_spine_has_64_hosts() {
        let spec = LeafSpine::default();
        let t = Topology::leaf_spine(&spec);
        assert_eq!(t.host_count(), 64);
        assert_eq!(t.nodes.len(), 64 + 16);
        assert_eq!(t.links.len(), 64 + 64);
        let l = &t.links[spec.fabric_link(3, 5)];
        assert_eq!((l.a, l.b), (8 + 3, 5));
        assert_eq!(LeafSpine::with_hosts(128, 16).hosts(), 128);
    }

    #[test]
    fn lossless_buffer_covers_xoff_and_flight_per_ingress() {
        let pfc = PfcConfig::default();
        // 100 Gbit/s, 1 us: 25 000 bytes in flight over a PAUSE round trip.
        let b = pfc.lossless_buffer(
            16,
            100_000_000_000,
            std::time::Duration::from_micros(1),
            4_142,
        );
        assert_eq!(b, 16 * (64_000 + 25_000 + 2 * 4_142));
    }

    #[test]
    fn fat_tree_has_the_shape_asked_for() {
        let k32 = FatTree::with_hosts(8192, 16, 1.0);
        assert_eq!(
            (k32.pods, k32.spines_per_pod, k32.cores_per_plane),
            (32, 16, 16)
        );
        assert_eq!((k32.hosts(), k32.switches()), (8192, 32 * 32 + 256));
        assert_eq!(k32.leaf_oversubscription(), 1.0);
        let thin = FatTree::with_hosts(1000, 8, 2.0);
        assert_eq!(
            (thin.pods, thin.spines_per_pod, thin.cores_per_plane),
            (16, 4, 4)
        );
        assert_eq!(thin.leaf_oversubscription(), 2.0);
        assert_eq!(thin.spine_oversubscription(), 2.0);
        let t = Topology::fat_tree(&thin);
        assert_eq!(t.host_count(), 1024);
        assert_eq!(t.nodes.len(), 1024 + thin.switches());
        // Core links, leaf links, host links.
        assert_eq!(t.links.len(), 16 * 4 * 4 + 16 * 8 * 4 + 1024);
    }
}
