//! What the server refused and why, and what it saw (docs/counters.md, "The
//! server"): `metaroce serve --json` prints them under these names.

/// The server's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections the endpoint accepted and handed to the server.
    pub connections: u64,
    /// Connections closed at once: their address has its budget of
    /// connections.
    pub refused_peer_connections: u64,
    /// Connections closed at once: no room for their control buffers.
    pub refused_no_buffers: u64,
    /// Announcements refused: size out of range.
    pub refused_bad_size: u64,
    /// Announcements or joins refused with `REGION_OVER_BUDGET`: the sum
    /// of the four reasons below.
    pub refused_over_budget: u64,
    /// ... because the peer address's bytes would pass its budget.
    pub refused_peer_bytes: u64,
    /// ... because every peer's bytes together would pass the server's
    /// (or its memory has no room).
    pub refused_total_bytes: u64,
    /// ... because the peer address's regions would pass its budget.
    pub refused_peer_regions: u64,
    /// ... because the endpoint's region table is full.
    pub refused_no_keys: u64,
    /// Joins whose ticket named no region.
    pub refused_bad_ticket: u64,
    /// Announcements or joins on a connection that already has a region.
    pub refused_second_announce: u64,
    /// Joins granted.
    pub joins: u64,
    /// Connections that ended closed (by either side, for any reason).
    pub closed: u64,
    /// ... of which closed because the peer went silent for the idle
    /// timeout (a client that stopped answering).
    pub idle_timeouts: u64,
    /// Connections that failed: retries exhausted, or an error.
    pub failed: u64,
}

impl Counters {
    /// Every counter with its name, in the order of docs/counters.md.
    pub fn fields(&self) -> [(&'static str, u64); 15] {
        [
            ("connections", self.connections),
            ("refused_peer_connections", self.refused_peer_connections),
            ("refused_no_buffers", self.refused_no_buffers),
            ("refused_bad_size", self.refused_bad_size),
            ("refused_second_announce", self.refused_second_announce),
            ("refused_bad_ticket", self.refused_bad_ticket),
            ("refused_over_budget", self.refused_over_budget),
            ("refused_peer_bytes", self.refused_peer_bytes),
            ("refused_total_bytes", self.refused_total_bytes),
            ("refused_peer_regions", self.refused_peer_regions),
            ("refused_no_keys", self.refused_no_keys),
            ("joins", self.joins),
            ("closed", self.closed),
            ("idle_timeouts", self.idle_timeouts),
            ("failed", self.failed),
        ]
    }

    /// Adds `other`'s counts (the engine threads of one server).
    pub fn add(&mut self, other: &Counters) {
        // Named field by field: a counter added to the struct fails to
        // compile here until it is summed too.
        let Counters {
            connections,
            refused_peer_connections,
            refused_no_buffers,
            refused_bad_size,
            refused_over_budget,
            refused_peer_bytes,
            refused_total_bytes,
            refused_peer_regions,
            refused_no_keys,
            refused_bad_ticket,
            refused_second_announce,
            joins,
            closed,
            idle_timeouts,
            failed,
        } = *other;
        self.connections += connections;
        self.refused_peer_connections += refused_peer_connections;
        self.refused_no_buffers += refused_no_buffers;
        self.refused_bad_size += refused_bad_size;
        self.refused_over_budget += refused_over_budget;
        self.refused_peer_bytes += refused_peer_bytes;
        self.refused_total_bytes += refused_total_bytes;
        self.refused_peer_regions += refused_peer_regions;
        self.refused_no_keys += refused_no_keys;
        self.refused_bad_ticket += refused_bad_ticket;
        self.refused_second_announce += refused_second_announce;
        self.joins += joins;
        self.closed += closed;
        self.idle_timeouts += idle_timeouts;
        self.failed += failed;
    }
}
