//! What an endpoint reports: its connections' state and counters, pool
//! use and refusals, per-source load, and its memory per connection.

use super::{ConnSlot, Endpoint, Footprint, PoolUsage};
use crate::api::{ConnHandle, PeerAddr};
use crate::conn::{ConnState, Connection, PathSender, PoolRefusals};
use crate::path::PathStats;
use crate::stats::{ConnStats, DropStats};
use crate::storage::Backing;

impl<B: Backing, const P: usize> Endpoint<B, P> {
    /// Slots in the table.
    pub fn capacity(&self) -> usize {
        self.slots.len().min(1 << 24)
    }

    /// Connections in use (live, not yet released).
    pub fn live_connections(&self) -> u32 {
        self.live
    }

    /// Half-open connections: accepted, ACCEPT sent, the initiator not yet
    /// heard from again (spec 4.2, 5.1.4).
    pub fn half_open(&self) -> u32 {
        self.half_open
    }

    /// Half-open connections of source prefixes at their narrow length
    /// (`ip`'s address itself by default).
    pub fn half_open_from(&self, ip: &smoltcp::wire::IpAddress) -> u32 {
        self.prefixes
            .find(ip, &self.config.admission)
            .map_or(0, |p| self.prefixes.entry(p.narrow).half_open)
    }

    /// Connections held by `ip`'s prefix at its wide length (its /24 or
    /// /48 by default), and how many wide prefixes hold any.
    pub fn prefix_load(&self, ip: &smoltcp::wire::IpAddress) -> (u32, u32) {
        let held = self
            .prefixes
            .find(ip, &self.config.admission)
            .map_or(0, |p| self.prefixes.entry(p.wide).total);
        (held, self.prefixes.wide_in_use)
    }

    /// A connection, for inspection.
    pub fn connection(&self, h: ConnHandle) -> Option<&Connection<P>> {
        self.slot_of(h).ok().map(|i| &self.slots[i].conn)
    }

    /// Handles of every connection in use (O(capacity): for diagnostics,
    /// not for a per-packet path).
    pub fn handles(&self) -> impl Iterator<Item = ConnHandle> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live && !s.released)
            .map(|(i, s)| s.handle(self.ids.global(i as u32)))
    }

    /// A connection's protection domain: its regions must be registered
    /// in it.
    pub fn pd(&self, h: ConnHandle) -> Option<u32> {
        self.connection(h).map(Connection::pd)
    }

    /// A connection's peer (IP address and MetaRoCE UDP port).
    pub fn peer(&self, h: ConnHandle) -> Option<PeerAddr> {
        self.connection(h).map(Connection::peer)
    }

    /// A connection's state.
    pub fn state(&self, h: ConnHandle) -> Option<ConnState> {
        self.connection(h).map(Connection::state)
    }

    /// A connection's counters.
    pub fn stats(&self, h: ConnHandle) -> Option<ConnStats> {
        self.connection(h).map(|c| c.stats(&self.res.send))
    }

    /// One path's telemetry: live while the connection sends (its sender
    /// state holds the measurements), entropy and receive counts always.
    pub fn path_stats(&self, h: ConnHandle, path: u8) -> Option<PathStats> {
        let c = self.connection(h)?;
        if u16::from(path) >= c.params.paths {
            return None;
        }
        let p = usize::from(path);
        let sender = c
            .send
            .state
            .get()
            .map_or(PathSender::IDLE, |s| self.res.send.senders.get(s).paths[p]);
        Some(PathStats::from_parts(c.entropy[p], &sender))
    }

    /// Endpoint-wide drops by reason.
    pub fn drops(&self) -> DropStats {
        self.drops
    }

    /// Reliable packets refused by connections, by reason (NAKs by reason,
    /// out of window, invalid).
    pub fn refusals(&self) -> crate::stats::RefusalStats {
        self.res.recv.rx_refusals
    }

    /// Refusals for want of pool space, by pool.
    pub fn pool_refusals(&self) -> PoolRefusals {
        self.res.pool_refusals()
    }

    /// How full each pool is.
    pub fn pool_usage(&self) -> PoolUsage {
        let used = |total: u32, free: u32| (total - free, total);
        let (send, recv) = (&self.res.send, &self.res.recv);
        PoolUsage {
            connections: (self.live, self.capacity() as u32),
            work_entries: used(send.work.capacity(), send.work.available()),
            recv_entries: used(recv.recvs.capacity(), recv.recvs.available()),
            senders: used(send.senders.capacity(), send.senders.available()),
            inflight_records: (
                send.inflight.total_records() - send.inflight.free_records(),
                send.inflight.total_records(),
            ),
            reorder_words: (
                recv.reorder.total_words() - recv.reorder.free_words(),
                recv.reorder.total_words(),
            ),
            regions: (
                self.res.regions.len() as u32,
                self.res.regions.capacity() as u32,
            ),
        }
    }

    /// Bytes of state per connection and per pooled element.
    pub fn footprint() -> Footprint {
        use core::mem::size_of;
        let slot = size_of::<ConnSlot<P>>();
        let index_share = 2 * size_of::<u32>();
        Footprint {
            slot,
            connection: size_of::<Connection<P>>(),
            index_share,
            idle_connection: slot + index_share,
            per_path_fixed: size_of::<u16>() * 3,
            sender_state: size_of::<crate::storage::pool::PoolEntry<crate::conn::SenderState<P>>>(),
            path_telemetry: size_of::<PathSender>(),
            work_entry: size_of::<crate::storage::pool::PoolEntry<crate::conn::WorkEntry>>(),
            recv_entry: size_of::<crate::storage::pool::PoolEntry<crate::conn::RecvEntry>>(),
            inflight_record: size_of::<crate::conn::InflightRecord>()
                + size_of::<crate::storage::buddy::BuddyNode>().div_ceil(16),
            reorder_word: size_of::<u64>()
                + size_of::<crate::storage::buddy::BuddyNode>().div_ceil(16),
        }
    }
}
