//! Every refusal and drop a node counted, by reason, as a human line and
//! as JSON: packets the endpoint dropped before any connection saw them
//! (`dropped`), reliable packets a connection refused (`refused`), posts
//! the pools refused (`pool_full`, spec 4.13), what the engine loop
//! refused (`engine`) and what the sockets refused (`socket`). The list of
//! reasons and what each means is in `docs/counters.md`.

use metaroce_core::{Backing, Endpoint};
use metaroce_platform::EngineStats;
use serde_json::{Map, Value};

use crate::node::{IoStats, Node};

/// `(group, reason, count)` for every counter of the endpoint.
fn endpoint_counters<B: Backing, const P: usize>(
    ep: &Endpoint<B, P>,
) -> Vec<(&'static str, &'static str, u64)> {
    let mut v = Vec::new();
    v.extend(ep.drops().by_reason().map(|(r, n)| ("dropped", r, n)));
    v.extend(ep.refusals().by_reason().map(|(r, n)| ("refused", r, n)));
    v.extend(
        ep.pool_refusals()
            .by_pool()
            .map(|(r, n)| ("pool_full", r, n)),
    );
    // Packet protection's drops and refused handshakes (spec 5.3.5,
    // 5.3.6); packets sealed and opened are not refusals.
    v.extend(
        ep.protection_stats()
            .by_reason()
            .into_iter()
            .filter(|(r, _)| !matches!(*r, "sealed" | "opened"))
            .map(|(r, n)| ("protection", r, n)),
    );
    v
}

/// The engine loop's and the sockets' refusals.
fn io_counters(engine: &EngineStats, io: &IoStats) -> [(&'static str, &'static str, u64); 5] {
    [
        ("engine", "dma_fault", engine.dma_faults),
        ("engine", "post_error", engine.post_errors),
        ("engine", "entropy_failure", engine.entropy_failures),
        ("socket", "send_refused", io.tx_errors),
        ("socket", "icmp_error", io.rx_errors),
    ]
}

/// Every counter of the node, by group and reason.
fn all(node: &Node) -> Vec<(&'static str, &'static str, u64)> {
    let mut v = endpoint_counters(&*node.ep);
    v.extend(io_counters(&node.engine_stats(), &node.io()));
    v
}

/// Every counter of several nodes (the engine threads of one node),
/// summed by reason.
fn summed(nodes: &[&Node]) -> Vec<(&'static str, &'static str, u64)> {
    let mut total = nodes.first().map(|n| all(n)).unwrap_or_default();
    for n in nodes.iter().skip(1) {
        for (sum, (_, _, count)) in total.iter_mut().zip(all(n)) {
            sum.2 += count;
        }
    }
    total
}

/// [`json`] of several nodes' counters added up.
pub fn json_sum(nodes: &[&Node]) -> Value {
    groups_json(summed(nodes))
}

/// [`line`] of several nodes' counters added up.
pub fn line_sum(nodes: &[&Node]) -> String {
    groups_line(summed(nodes))
}

/// `{"dropped": {...}, "refused": {...}, "pool_full": {...}, "engine":
/// {...}, "socket": {...}}`, every reason, zeros included.
pub fn json(node: &Node) -> Value {
    groups_json(all(node))
}

fn groups_json(counters: Vec<(&'static str, &'static str, u64)>) -> Value {
    let mut groups: Map<String, Value> = Map::new();
    for (group, reason, n) in counters {
        groups
            .entry(group)
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
            .map(|m| m.insert(reason.into(), Value::from(n)));
    }
    Value::Object(groups)
}

/// The reasons that counted anything, e.g. `dropped: bad_crc 3,
/// unknown_connection 2; refused: nak_invalid_key 1`; `none` when clean.
pub fn line(node: &Node) -> String {
    groups_line(all(node))
}

fn groups_line(counters: Vec<(&'static str, &'static str, u64)>) -> String {
    let mut out = String::new();
    let mut group = "";
    for (g, reason, n) in counters.into_iter().filter(|&(_, _, n)| n > 0) {
        if g != group {
            if !out.is_empty() {
                out.push_str("; ");
            }
            out.push_str(g);
            out.push(':');
            group = g;
        } else {
            out.push(',');
        }
        out.push_str(&format!(" {reason} {n}"));
    }
    if out.is_empty() {
        out.push_str("none");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use metaroce_core::{Config, Layout};

    fn counters_of(
        ep: &Endpoint<metaroce_core::Heap, 4>,
        engine: &EngineStats,
        io: &IoStats,
    ) -> Vec<(&'static str, &'static str, u64)> {
        let mut v = endpoint_counters(ep);
        v.extend(io_counters(engine, io));
        v
    }

    #[test]
    fn a_fresh_endpoint_has_clean_counters_and_every_group_shows() {
        let ep: Endpoint<metaroce_core::Heap, 4> = Endpoint::new(
            Config::default(),
            Layout::for_connections(4).heap_storage(),
            metaroce_core::rng::seed_from_u64(1),
        );
        let (engine, io) = (EngineStats::default(), IoStats::default());
        assert_eq!(groups_line(counters_of(&ep, &engine, &io)), "none");
        let j = groups_json(counters_of(&ep, &engine, &io));
        for (group, reason) in [
            ("dropped", "bad_crc"),
            ("dropped", "unknown_connection"),
            ("dropped", "bad_token"),
            ("refused", "out_of_window"),
            ("refused", "nak_invalid_key"),
            ("pool_full", "senders"),
            ("engine", "dma_fault"),
            ("engine", "entropy_failure"),
            ("socket", "send_refused"),
        ] {
            assert_eq!(j[group][reason], 0, "{group}.{reason}");
        }
    }

    #[test]
    fn the_line_lists_the_reasons_that_counted_by_group() {
        let ep: Endpoint<metaroce_core::Heap, 4> = Endpoint::new(
            Config::default(),
            Layout::for_connections(4).heap_storage(),
            metaroce_core::rng::seed_from_u64(1),
        );
        let engine = EngineStats {
            dma_faults: 2,
            ..EngineStats::default()
        };
        let io = IoStats {
            tx_errors: 3,
            rx_errors: 1,
            ..IoStats::default()
        };
        assert_eq!(
            groups_line(counters_of(&ep, &engine, &io)),
            "engine: dma_fault 2; socket: send_refused 3, icmp_error 1"
        );
    }
}
