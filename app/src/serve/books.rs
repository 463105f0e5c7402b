//! What every peer address holds, and the tickets of announced regions: the
//! server's books ([`Books`]). The firmware keeps them in fixed arrays
//! ([`LocalBooks`]); the host tool keeps one set for all its engine threads
//! behind a mutex and implements [`Books`] over it.
//!
//! The books are the control path only: the server touches them when it
//! adopts a connection, answers an `ANNOUNCE` or a `JOIN`, and when a
//! connection ends; never per packet.

use metaroce_core::api::{ConnHandle, PeerAddr};
use metaroce_core::rng::{Rng, Seed};

use super::Memory;
use crate::Operation;

/// Why the books refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The address holds its budget of connections.
    PeerConnections,
    /// The address's announced bytes would pass its budget.
    PeerBytes,
    /// Every peer's bytes together would pass the server's budget.
    TotalBytes,
    /// The address's regions would pass its budget.
    PeerRegions,
    /// The ticket names no region.
    BadTicket,
}

/// What a joining connection gets: the region and what its announcement
/// said about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionShare {
    pub memory: Memory,
    pub op: Operation,
    pub seed: u64,
    pub size: u32,
}

/// Regions an announcement or a join books: the data region and the
/// read-only page.
pub const REGIONS_PER_GRANT: u32 = 2;

/// The server's books: budgets per peer address and in total, and the
/// tickets that let a connection `JOIN` another's region.
pub trait Books {
    /// A new connection from `peer`, within its budget.
    fn adopt(&mut self, peer: PeerAddr) -> Result<(), Refusal>;
    /// A connection from `peer` ended.
    fn release_connection(&mut self, peer: PeerAddr);
    /// Reserves an announced region of `footprint` bytes for `peer`,
    /// checked and booked at once.
    fn reserve_region(&mut self, peer: PeerAddr, footprint: u64) -> Result<(), Refusal>;
    /// Gives back a reservation.
    fn release_region(&mut self, peer: PeerAddr, footprint: u64);
    /// Publishes the region `owner` announced under a new ticket: never 0,
    /// unguessable, never one in use.
    fn publish(&mut self, owner: ConnHandle, share: RegionShare) -> u64;
    /// `JOIN`: connection `conn` from `peer` wants the region `ticket`
    /// names; booked as [`REGIONS_PER_GRANT`] regions of `peer`.
    fn join(
        &mut self,
        ticket: u64,
        conn: ConnHandle,
        peer: PeerAddr,
    ) -> Result<RegionShare, Refusal>;
    /// A joiner ended, or could not use what it joined: its regions are
    /// given back, unless the owner's end already revoked it.
    fn leave(&mut self, ticket: u64, conn: ConnHandle, peer: PeerAddr);
    /// The owner of `ticket`'s region ends: the ticket goes and every
    /// joiner's regions are given back. `revoke` is called with each joiner
    /// of this server (whose keys it drops before the memory goes);
    /// joiners elsewhere are told through their own [`Books::take_revoked`].
    fn withdraw(&mut self, ticket: u64, revoke: &mut dyn FnMut(ConnHandle));
    /// Joiners of this server whose region's owner, elsewhere, ended since
    /// the last call. Books of one server have none.
    fn take_revoked(&mut self, _revoke: &mut dyn FnMut(ConnHandle)) {}
}

/// What one peer address holds.
#[derive(Debug, Clone, Copy)]
struct PeerUsage {
    peer: PeerAddr,
    connections: u32,
    bytes: u64,
}

/// The ticket of the region connection slot `i` announced.
#[derive(Debug, Clone, Copy)]
struct TicketEntry {
    ticket: u64,
    share: RegionShare,
}

/// A connection that joined the region of `ticket`.
#[derive(Debug, Clone, Copy)]
struct JoinerEntry {
    conn: ConnHandle,
    ticket: u64,
}

/// Books of one server in fixed arrays, for a server whose memory is its
/// total budget (an announcement it has no room for is refused
/// [`Refusal::TotalBytes`]): per peer address, connections and bytes of
/// announced regions. Regions are not counted: a connection reaches one
/// region at most, so a peer's are bounded by its connections.
///
/// `CONNS` connection slots (handle indices below it), `PEERS` peer
/// addresses at once (more are refused). A ticket names its owner's slot
/// in its low 16 bits (a `JOIN` finds the region without a search) and 48
/// random bits above. The owner's end looks for its joiners in every slot:
/// a rare event, and less code than lists through them.
#[derive(Debug)]
pub struct LocalBooks<const CONNS: usize, const PEERS: usize> {
    connections_per_peer: u32,
    bytes_per_peer: u64,
    peers: [Option<PeerUsage>; PEERS],
    tickets: [Option<TicketEntry>; CONNS],
    joiners: [Option<JoinerEntry>; CONNS],
    rng: Rng,
}

const SLOT_BITS: u64 = 0xffff;

impl<const CONNS: usize, const PEERS: usize> LocalBooks<CONNS, PEERS> {
    const _FITS: () = assert!(CONNS <= 1 << 16);

    /// Empty books: at most `connections_per_peer` connections and
    /// `bytes_per_peer` bytes of regions per peer address; `seed` keys
    /// the tickets' generator.
    pub fn new(connections_per_peer: u32, bytes_per_peer: u64, seed: Seed) -> Self {
        let () = Self::_FITS;
        LocalBooks {
            connections_per_peer,
            bytes_per_peer,
            peers: [None; PEERS],
            tickets: [None; CONNS],
            joiners: [None; CONNS],
            rng: Rng::new(seed),
        }
    }

    /// Peer addresses holding anything, and the bytes of all.
    pub fn holdings(&self) -> (usize, u64) {
        let held = self.peers.iter().flatten();
        (held.clone().count(), held.map(|u| u.bytes).sum())
    }

    /// The usage of `peer`: found, or made in a free entry (`None` when
    /// every entry is taken).
    fn usage(&mut self, peer: PeerAddr) -> Option<&mut PeerUsage> {
        let at = self
            .peers
            .iter()
            .position(|u| u.is_some_and(|u| u.peer.ip == peer.ip))
            .or_else(|| self.peers.iter().position(Option::is_none))?;
        Some(self.peers[at].get_or_insert(PeerUsage {
            peer,
            connections: 0,
            bytes: 0,
        }))
    }

    /// Takes `connections` and `bytes` off `peer`'s usage, and forgets an
    /// address that holds nothing. (One function for every change: the
    /// firmware's code budget.)
    fn give_back(&mut self, peer: PeerAddr, connections: u32, bytes: u64) {
        for entry in self.peers.iter_mut() {
            let Some(u) = entry.as_mut().filter(|u| u.peer.ip == peer.ip) else {
                continue;
            };
            u.connections = u.connections.saturating_sub(connections);
            u.bytes = u.bytes.saturating_sub(bytes);
            if u.connections == 0 && u.bytes == 0 {
                *entry = None;
            }
            return;
        }
    }
}

impl<const CONNS: usize, const PEERS: usize> Books for LocalBooks<CONNS, PEERS> {
    fn adopt(&mut self, peer: PeerAddr) -> Result<(), Refusal> {
        let limit = self.connections_per_peer;
        let within = self
            .usage(peer)
            .filter(|u| u.connections < limit)
            .map(|u| u.connections += 1)
            .is_some();
        if within {
            Ok(())
        } else {
            self.give_back(peer, 0, 0);
            Err(Refusal::PeerConnections)
        }
    }

    fn release_connection(&mut self, peer: PeerAddr) {
        self.give_back(peer, 1, 0);
    }

    fn reserve_region(&mut self, peer: PeerAddr, footprint: u64) -> Result<(), Refusal> {
        let limit = self.bytes_per_peer;
        match self.usage(peer) {
            Some(u) if u.bytes + footprint <= limit => {
                u.bytes += footprint;
                Ok(())
            }
            _ => Err(Refusal::PeerBytes),
        }
    }

    fn release_region(&mut self, peer: PeerAddr, footprint: u64) {
        self.give_back(peer, 0, footprint);
    }

    fn publish(&mut self, owner: ConnHandle, share: RegionShare) -> u64 {
        let slot = u64::from(owner.index) & SLOT_BITS;
        let ticket = loop {
            let t = (self.rng.next_u64() & !SLOT_BITS) | slot;
            if t > SLOT_BITS {
                break t;
            }
        };
        if let Some(entry) = self.tickets.get_mut(slot as usize) {
            *entry = Some(TicketEntry { ticket, share });
        }
        ticket
    }

    fn join(
        &mut self,
        ticket: u64,
        conn: ConnHandle,
        _peer: PeerAddr,
    ) -> Result<RegionShare, Refusal> {
        let owner = (ticket & SLOT_BITS) as usize;
        let (Some(Some(t)), Some(joiner)) = (
            self.tickets.get(owner),
            self.joiners.get_mut(conn.index as usize),
        ) else {
            return Err(Refusal::BadTicket);
        };
        if ticket <= SLOT_BITS || t.ticket != ticket {
            return Err(Refusal::BadTicket);
        }
        *joiner = Some(JoinerEntry { conn, ticket });
        Ok(t.share)
    }

    fn leave(&mut self, ticket: u64, conn: ConnHandle, _peer: PeerAddr) {
        if let Some(entry) = self.joiners.get_mut(conn.index as usize) {
            if entry.is_some_and(|e| e.ticket == ticket && e.conn == conn) {
                *entry = None;
            }
        }
    }

    fn withdraw(&mut self, ticket: u64, revoke: &mut dyn FnMut(ConnHandle)) {
        let owner = (ticket & SLOT_BITS) as usize;
        match self.tickets.get_mut(owner) {
            Some(entry) if entry.is_some_and(|t| t.ticket == ticket) => *entry = None,
            _ => return,
        }
        for entry in self.joiners.iter_mut() {
            if let Some(e) = entry.filter(|e| e.ticket == ticket) {
                *entry = None;
                revoke(e.conn);
            }
        }
    }
}
