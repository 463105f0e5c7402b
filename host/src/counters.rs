//! Every refusal an endpoint counted, by reason, as a human line and as
//! JSON: packets dropped before any connection saw them, reliable packets
//! a connection refused, and posts the pools refused (spec 4.13).

use metaroce_core::{Backing, Endpoint};
use serde_json::{Map, Value};

/// `(group, reason, count)` for every counter of the endpoint.
fn all<B: Backing, const P: usize>(ep: &Endpoint<B, P>) -> Vec<(&'static str, &'static str, u64)> {
    let mut v = Vec::new();
    v.extend(ep.drops().by_reason().map(|(r, n)| ("dropped", r, n)));
    v.extend(ep.refusals().by_reason().map(|(r, n)| ("refused", r, n)));
    v.extend(
        ep.pool_refusals()
            .by_pool()
            .map(|(r, n)| ("pool_full", r, n)),
    );
    v
}

/// Every counter of several endpoints (the engine threads of one node),
/// summed by reason.
fn summed<B: Backing, const P: usize>(
    eps: &[&Endpoint<B, P>],
) -> Vec<(&'static str, &'static str, u64)> {
    let mut total = eps.first().map(|ep| all(*ep)).unwrap_or_default();
    for ep in eps.iter().skip(1) {
        for (sum, (_, _, n)) in total.iter_mut().zip(all(*ep)) {
            sum.2 += n;
        }
    }
    total
}

/// `{"dropped": {...}, "refused": {...}, "pool_full": {...}}`, every reason.
pub fn json<B: Backing, const P: usize>(ep: &Endpoint<B, P>) -> Value {
    json_of(all(ep))
}

/// [`json`] of several endpoints' counters added up.
pub fn json_sum<B: Backing, const P: usize>(eps: &[&Endpoint<B, P>]) -> Value {
    json_of(summed(eps))
}

/// [`line`] of several endpoints' counters added up.
pub fn line_sum<B: Backing, const P: usize>(eps: &[&Endpoint<B, P>]) -> String {
    line_of(summed(eps))
}

fn json_of(rows: Vec<(&'static str, &'static str, u64)>) -> Value {
    let mut groups: Map<String, Value> = Map::new();
    for (group, reason, n) in rows {
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
pub fn line<B: Backing, const P: usize>(ep: &Endpoint<B, P>) -> String {
    line_of(all(ep))
}

fn line_of(rows: Vec<(&'static str, &'static str, u64)>) -> String {
    let mut out = String::new();
    let mut group = "";
    for (g, reason, n) in rows.into_iter().filter(|&(_, _, n)| n > 0) {
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

    #[test]
    fn a_fresh_endpoint_has_clean_counters() {
        let ep: Endpoint<metaroce_core::Heap, 4> = Endpoint::new(
            Config::default(),
            Layout::for_connections(4).heap_storage(),
            metaroce_core::rng::seed_from_u64(1),
        );
        assert_eq!(line(&ep), "none");
        let j = json(&ep);
        assert_eq!(j["dropped"]["bad_crc"], 0);
        assert_eq!(j["refused"]["nak_invalid_key"], 0);
        assert_eq!(j["pool_full"]["senders"], 0);
    }
}
