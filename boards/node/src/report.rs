//! What a workload task did: its counters, a core's `METAROCE-CORE` line
//! and the node's `METAROCE-RESULT` line, which the harness reads.

use metaroce_core::Instant;

use crate::println;

/// Transport and loop counters for the result line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub retransmits: u64,
    pub timeouts: u64,
    pub ce: u64,
    pub rate_hint_mbps: u32,
    pub tx_frames: u64,
    pub rx_frames: u64,
    /// MetaRoCE packets the engine took in and sent (per-core lines).
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Connections of the endpoint, and packets it dropped for a
    /// connection it does not have (a frame steered to the wrong core).
    pub conns: u32,
    pub misrouted: u64,
    /// The most PSNs one connection had outstanding at once (spec 4.4).
    pub max_in_flight: u64,
}

/// What a workload task did, for its result line.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    pub node: u8,
    pub role: &'static str,
    /// Connections the task opened (its streams) and accepted.
    pub streams: u32,
    pub accepted: u32,
    /// Verified payload bytes, between the first and last data event.
    pub bytes: u64,
    pub start: Instant,
    pub end: Instant,
    pub completions: u64,
    pub errors: u32,
    pub rate_hint_mbps: u32,
    pub counters: Counters,
    pub ping_rtt_us: u64,
    /// Every byte verified, every completion successful, nothing missing.
    pub ok: bool,
}

impl Report {
    fn elapsed_us(&self) -> u64 {
        self.end
            .saturating_duration_since(self.start)
            .as_micros()
            .max(1) as u64
    }

    /// Goodput in Mbit/s as whole and hundredths.
    fn goodput(&self) -> (u64, u64) {
        let us = self.elapsed_us();
        (self.bytes * 8 / us, (self.bytes * 8 % us) * 100 / us)
    }

    /// Adds another core's report to this node's.
    pub fn merge(&mut self, other: &Report) {
        self.streams += other.streams;
        self.accepted += other.accepted;
        self.bytes += other.bytes;
        self.start = self.start.min(other.start);
        self.end = self.end.max(other.end);
        self.completions += other.completions;
        self.errors += other.errors;
        self.rate_hint_mbps = match (self.rate_hint_mbps, other.rate_hint_mbps) {
            (0, h) | (h, 0) => h,
            (a, b) => a.min(b),
        };
        let (c, o) = (&mut self.counters, &other.counters);
        c.retransmits += o.retransmits;
        c.timeouts += o.timeouts;
        c.ce += o.ce;
        c.rx_packets += o.rx_packets;
        c.tx_packets += o.tx_packets;
        c.conns += o.conns;
        c.misrouted += o.misrouted;
        c.max_in_flight = c.max_in_flight.max(o.max_in_flight);
        self.ping_rtt_us = self.ping_rtt_us.max(other.ping_rtt_us);
        self.ok &= other.ok;
        self.role = match (self.role, other.role) {
            (a, b) if a == b => a,
            ("idle", b) => b,
            (a, "idle") => a,
            _ => "both",
        };
    }

    /// The node's `METAROCE-RESULT` line, which the harness reads.
    pub fn print_result(&self) {
        let (mbps, frac) = self.goodput();
        let c = &self.counters;
        println!(
            "METAROCE-RESULT node={} role={} transport=metaroce bytes={} elapsed_us={} goodput_mbps={}.{:02} completions={} errors={} retransmits={} timeouts={} ce={} max_in_flight={} rate_hint_mbps={} tx_frames={} rx_frames={} ping_rtt_us={} integrity={}",
            self.node,
            self.role,
            self.bytes,
            self.elapsed_us(),
            mbps,
            frac,
            self.completions,
            self.errors,
            c.retransmits,
            c.timeouts,
            c.ce,
            c.max_in_flight,
            self.rate_hint_mbps,
            c.tx_frames,
            c.rx_frames,
            self.ping_rtt_us,
            if self.ok { "OK" } else { "FAIL" }
        );
    }

    /// One core's `METAROCE-CORE` line: its share of the node's work and
    /// the frames and packets its engine moved.
    pub fn print_core(&self, core: usize) {
        let (mbps, frac) = self.goodput();
        let c = &self.counters;
        println!(
            "METAROCE-CORE node={} core={} role={} streams={} accepted={} bytes={} goodput_mbps={}.{:02} completions={} errors={} conns={} rx_frames={} tx_frames={} rx_packets={} tx_packets={} retransmits={} timeouts={} misrouted={} integrity={}",
            self.node,
            core,
            self.role,
            self.streams,
            self.accepted,
            self.bytes,
            mbps,
            frac,
            self.completions,
            self.errors,
            c.conns,
            c.rx_frames,
            c.tx_frames,
            c.rx_packets,
            c.tx_packets,
            c.retransmits,
            c.timeouts,
            c.misrouted,
            if self.ok { "OK" } else { "FAIL" }
        );
    }
}
