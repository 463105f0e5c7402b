//! Routing: shortest paths over the links that are up, every equal-cost
//! next hop kept as an ECMP group, each distinct group stored once.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{Node, Simulator};
use crate::packet::HostId;
use crate::topology::{NodeId, NodeKind};
use crate::transport::SimTransport;

impl<T: SimTransport> Simulator<T> {
    /// Shortest-path routes over the links that are up, every equal-cost
    /// next hop kept. Hosts do not forward.
    ///
    /// Hosts whose links that are up reach the same switches (the hosts
    /// of one leaf) have the same distance from every switch, so one
    /// breadth-first search serves them all: a switch they hang off
    /// routes to each host's own port(s), any other switch to the ports
    /// one step closer, the same group for all of them. A fabric of
    /// thousands of hosts takes one search per leaf, not per host.
    pub(super) fn compute_routes(&mut self) {
        let hosts = self.hosts.len();
        let n = self.nodes.len();
        let is_switch = |nodes: &[Node], v: NodeId| nodes[v].kind == NodeKind::Switch;
        for node in &mut self.nodes {
            node.routes = if node.kind == NodeKind::Switch {
                vec![0; hosts]
            } else {
                Vec::new()
            };
        }
        let mut groups = Groups::default();
        // Hosts by the switches their links that are up reach, in host
        // order within a set and sets in order of their switches.
        let mut by_attachment: BTreeMap<Vec<NodeId>, Vec<HostId>> = BTreeMap::new();
        for (h, host) in self.hosts.iter().enumerate() {
            let mut attached: Vec<NodeId> = self.nodes[host.node]
                .ports
                .iter()
                .filter(|p| !p.down && is_switch(&self.nodes, p.peer))
                .map(|p| p.peer)
                .collect();
            attached.sort_unstable();
            attached.dedup();
            by_attachment.entry(attached).or_default().push(h);
        }
        let mut dist = vec![u32::MAX; n];
        let mut queue = VecDeque::new();
        for (attached, members) in &by_attachment {
            // Distances from the hosts (0) over switches only.
            dist.fill(u32::MAX);
            queue.clear();
            for &s in attached {
                dist[s] = 1;
                queue.push_back(s);
            }
            while let Some(u) = queue.pop_front() {
                for p in &self.nodes[u].ports {
                    let v = p.peer;
                    if !p.down && dist[v] == u32::MAX && is_switch(&self.nodes, v) {
                        dist[v] = dist[u] + 1;
                        queue.push_back(v);
                    }
                }
            }
            for s in 0..n {
                if !is_switch(&self.nodes, s) || dist[s] == u32::MAX {
                    continue;
                }
                let ports = &self.nodes[s].ports;
                if dist[s] == 1 {
                    let direct: Vec<u32> = members
                        .iter()
                        .map(|&h| {
                            let target = self.hosts[h].node;
                            groups.intern(
                                ports
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, p)| !p.down && p.peer == target)
                                    .map(|(i, _)| i as u16),
                            )
                        })
                        .collect();
                    for (&h, group) in members.iter().zip(direct) {
                        self.nodes[s].routes[h] = group;
                    }
                } else {
                    let group = groups.intern(
                        ports
                            .iter()
                            .enumerate()
                            .filter(|(_, p)| {
                                !p.down && dist[p.peer].checked_add(1) == Some(dist[s])
                            })
                            .map(|(i, _)| i as u16),
                    );
                    let routes = &mut self.nodes[s].routes;
                    for &h in members {
                        routes[h] = group;
                    }
                }
            }
        }
        self.route_groups = groups.list;
    }
}

/// Distinct ECMP groups, each stored once; group 0 is the empty one.
struct Groups {
    list: Vec<Box<[u16]>>,
    index: HashMap<Box<[u16]>, u32>,
}

impl Default for Groups {
    fn default() -> Self {
        let empty: Box<[u16]> = Box::new([]);
        Groups {
            list: vec![empty.clone()],
            index: HashMap::from([(empty, 0)]),
        }
    }
}

impl Groups {
    /// The index of the group of `ports`, added if new.
    fn intern(&mut self, ports: impl Iterator<Item = u16>) -> u32 {
        let ports: Box<[u16]> = ports.collect();
        if let Some(&i) = self.index.get(&ports) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(ports.clone());
        self.index.insert(ports, i);
        i
    }
}
