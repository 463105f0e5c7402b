//! What every peer address holds on a server, kept once for the whole
//! node however many engine threads serve it (`serve --threads N`): its
//! connections, regions and bytes against [`PeerBudget`], the bytes of all
//! peers, and the tickets that let a connection `JOIN` another's region,
//! wherever each connection lives.
//!
//! It is the control path only: a server touches it when it adopts a
//! connection, answers an announcement or a join, and when a connection
//! ends; never per packet. One mutex guards it; with one thread it is
//! never contended.
//!
//! A ticket names a region. With several threads every announced region's
//! arenas are shared ([`crate::memory::SharedArena`]) and kept here by
//! address, so a connection on another thread that joins reaches the bytes
//! and gets keys of its own there. When
//! the owner ends, the joiners lose their keys before the owner's memory
//! is let go: those on the owner's thread at once, those on other threads
//! as soon as their thread's next turn takes the revocation (it is woken
//! for it); the shared bytes live until the last of them let go, so no
//! packet ever reaches freed memory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use metaroce_core::api::{ConnHandle, PeerAddr};

use super::PeerBudget;
use crate::app::serve::{self, Refusal, RegionShare, REGIONS_PER_GRANT};
use crate::memory::SharedArena;
use crate::node::socket_of;
use crate::shard::steer::Waker;

/// A region's arenas, shared between threads: its owner's thread, the
/// data region's and the read-only page's.
pub(crate) type Shared = (usize, SharedArena, SharedArena);

/// What one peer address holds.
#[derive(Debug, Clone, Copy, Default)]
struct PeerUsage {
    connections: u32,
    regions: u32,
    bytes: u64,
}

/// A connection that joined a region: its thread, handle and address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Joiner {
    thread: usize,
    conn: ConnHandle,
    peer: IpAddr,
}

#[derive(Debug)]
struct Ticket {
    share: RegionShare,
    joiners: Vec<Joiner>,
}

#[derive(Debug)]
struct Books {
    peers: HashMap<IpAddr, PeerUsage>,
    bytes_total: u64,
    tickets: HashMap<u64, Ticket>,
    /// Announced regions' shared arenas, by data address.
    arenas: HashMap<u64, Shared>,
    /// Per thread: its joiners whose region's owner ended.
    revoked: Vec<Vec<ConnHandle>>,
}

impl Books {
    fn usage(&mut self, peer: IpAddr) -> &mut PeerUsage {
        self.peers.entry(peer).or_default()
    }

    /// Forgets an address that holds nothing.
    fn tidy(&mut self, peer: IpAddr) {
        if self
            .peers
            .get(&peer)
            .is_some_and(|u| u.connections == 0 && u.regions == 0 && u.bytes == 0)
        {
            self.peers.remove(&peer);
        }
    }
}

/// The node's books (see the module documentation).
#[derive(Debug)]
pub struct Ledger {
    budget: PeerBudget,
    books: Mutex<Books>,
    /// Per thread: revocations are waiting (checked every turn without
    /// taking the lock).
    pending: Vec<AtomicBool>,
    wakers: Option<Arc<[Waker]>>,
}

impl Ledger {
    /// Books for `threads` engine threads, woken through `wakers` (one per
    /// thread) when a revocation waits for them.
    pub fn new(budget: PeerBudget, threads: usize, wakers: Option<Arc<[Waker]>>) -> Arc<Ledger> {
        let threads = threads.max(1);
        Arc::new(Ledger {
            budget,
            books: Mutex::new(Books {
                peers: HashMap::new(),
                bytes_total: 0,
                tickets: HashMap::new(),
                arenas: HashMap::new(),
                revoked: vec![Vec::new(); threads],
            }),
            pending: (0..threads).map(|_| AtomicBool::new(false)).collect(),
            wakers,
        })
    }

    pub fn budget(&self) -> PeerBudget {
        self.budget
    }

    /// Engine threads the books serve.
    pub fn threads(&self) -> usize {
        self.pending.len()
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every update below is complete before the guard drops: a thread
        // that panicked while holding it left consistent books.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new connection from `peer`, within its budget.
    pub(crate) fn adopt(&self, peer: IpAddr) -> Result<(), Refusal> {
        let mut books = self.books();
        let usage = books.usage(peer);
        if usage.connections >= self.budget.connections_per_peer {
            books.tidy(peer);
            return Err(Refusal::PeerConnections);
        }
        usage.connections += 1;
        Ok(())
    }

    /// A connection from `peer` ended.
    pub(crate) fn release_connection(&self, peer: IpAddr) {
        let mut books = self.books();
        let usage = books.usage(peer);
        usage.connections = usage.connections.saturating_sub(1);
        books.tidy(peer);
    }

    /// Reserves an announced region of `footprint` bytes for `peer`, checked and booked at once so that
    /// threads announcing together cannot pass the budget between them.
    pub(crate) fn reserve_region(&self, peer: IpAddr, footprint: u64) -> Result<(), Refusal> {
        let mut books = self.books();
        let total = books.bytes_total;
        let usage = books.usage(peer);
        let refusal = if usage.bytes + footprint > self.budget.bytes_per_peer {
            Some(Refusal::PeerBytes)
        } else if total + footprint > self.budget.bytes_total {
            Some(Refusal::TotalBytes)
        } else if usage.regions + REGIONS_PER_GRANT > self.budget.regions_per_peer {
            Some(Refusal::PeerRegions)
        } else {
            None
        };
        if let Some(r) = refusal {
            books.tidy(peer);
            return Err(r);
        }
        usage.bytes += footprint;
        usage.regions += REGIONS_PER_GRANT;
        books.bytes_total += footprint;
        Ok(())
    }

    /// Gives back a reservation (the region could not be set up, or its
    /// connection ended).
    pub(crate) fn release_region(&self, peer: IpAddr, footprint: u64) {
        let mut books = self.books();
        books.bytes_total = books.bytes_total.saturating_sub(footprint);
        let usage = books.usage(peer);
        usage.bytes = usage.bytes.saturating_sub(footprint);
        usage.regions = usage.regions.saturating_sub(REGIONS_PER_GRANT);
        books.tidy(peer);
    }

    /// Publishes an announced region under a new random ticket (a
    /// capability: unguessable, never 0, never one in use).
    pub(crate) fn publish(&self, share: RegionShare) -> u64 {
        let mut books = self.books();
        let ticket = loop {
            let mut b = [0u8; 8];
            if getrandom::fill(&mut b).is_err() {
                continue;
            }
            let t = u64::from_le_bytes(b);
            if t != 0 && !books.tickets.contains_key(&t) {
                break t;
            }
        };
        books.tickets.insert(
            ticket,
            Ticket {
                share,
                joiners: Vec::new(),
            },
        );
        ticket
    }

    /// `JOIN`: connection `conn` of thread `thread`, from `peer`, wants
    /// the region `ticket` names; booked as two regions of `peer`.
    pub(crate) fn join(
        &self,
        ticket: u64,
        thread: usize,
        conn: ConnHandle,
        peer: IpAddr,
    ) -> Result<RegionShare, Refusal> {
        let mut books = self.books();
        if !books.tickets.contains_key(&ticket) {
            return Err(Refusal::BadTicket);
        }
        let usage = books.usage(peer);
        if usage.regions + REGIONS_PER_GRANT > self.budget.regions_per_peer {
            books.tidy(peer);
            return Err(Refusal::PeerRegions);
        }
        usage.regions += REGIONS_PER_GRANT;
        let entry = books.tickets.get_mut(&ticket).expect("checked above");
        entry.joiners.push(Joiner { thread, conn, peer });
        Ok(entry.share)
    }

    /// A joiner ended, or could not use what it joined: its regions are
    /// given back, unless the owner's end already revoked it.
    pub(crate) fn leave(&self, ticket: u64, thread: usize, conn: ConnHandle, peer: IpAddr) {
        let mut books = self.books();
        let Some(entry) = books.tickets.get_mut(&ticket) else {
            return;
        };
        let before = entry.joiners.len();
        entry
            .joiners
            .retain(|j| !(j.thread == thread && j.conn == conn));
        if entry.joiners.len() < before {
            let usage = books.usage(peer);
            usage.regions = usage.regions.saturating_sub(REGIONS_PER_GRANT);
            books.tidy(peer);
        }
    }

    /// The owner of `ticket`'s region ends: the ticket goes, every
    /// joiner's regions are given back, and the joiners on other threads
    /// are told (their threads woken). Returns the joiners of `thread`
    /// (the caller's own), whose keys it drops itself.
    pub(crate) fn withdraw(&self, ticket: u64, thread: usize) -> Vec<ConnHandle> {
        let mut books = self.books();
        let Some(entry) = books.tickets.remove(&ticket) else {
            return Vec::new();
        };
        let mut local = Vec::new();
        let mut woken = 0u64;
        for j in entry.joiners {
            let usage = books.usage(j.peer);
            usage.regions = usage.regions.saturating_sub(REGIONS_PER_GRANT);
            books.tidy(j.peer);
            if j.thread == thread {
                local.push(j.conn);
            } else if let Some(list) = books.revoked.get_mut(j.thread) {
                list.push(j.conn);
                woken |= 1 << j.thread.min(63);
            }
        }
        drop(books);
        while woken != 0 {
            let t = woken.trailing_zeros() as usize;
            woken &= woken - 1;
            if let Some(flag) = self.pending.get(t) {
                flag.store(true, Ordering::Release);
            }
            if let Some(w) = self.wakers.as_ref().and_then(|w| w.get(t)) {
                w.wake();
            }
        }
        local
    }

    /// Joiners of `thread` whose region's owner ended since the last call
    /// (one atomic load when there are none).
    pub(crate) fn take_revoked(&self, thread: usize) -> Vec<ConnHandle> {
        let Some(flag) = self.pending.get(thread) else {
            return Vec::new();
        };
        if !flag.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        self.books()
            .revoked
            .get_mut(thread)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Keeps an announced region's shared arenas for joiners elsewhere.
    pub(crate) fn share_arenas(&self, base: u64, shared: Shared) {
        self.books().arenas.insert(base, shared);
    }

    /// The shared arenas of the region at `base`.
    pub(crate) fn arenas(&self, base: u64) -> Option<Shared> {
        self.books().arenas.get(&base).cloned()
    }

    /// The region at `base` is freed: joiners keep the bytes they hold.
    pub(crate) fn forget_arenas(&self, base: u64) {
        self.books().arenas.remove(&base);
    }

    /// Peer addresses holding anything, and the bytes of all (for tests).
    pub fn holdings(&self) -> (usize, u64) {
        let books = self.books();
        (books.peers.len(), books.bytes_total)
    }
}

/// The ledger as the books of one engine thread's server.
#[derive(Debug)]
pub(crate) struct ThreadBooks {
    pub ledger: Arc<Ledger>,
    pub thread: usize,
}

fn ip(peer: PeerAddr) -> IpAddr {
    socket_of(peer).ip()
}

impl serve::Books for ThreadBooks {
    fn adopt(&mut self, peer: PeerAddr) -> Result<(), Refusal> {
        self.ledger.adopt(ip(peer))
    }

    fn release_connection(&mut self, peer: PeerAddr) {
        self.ledger.release_connection(ip(peer));
    }

    fn reserve_region(&mut self, peer: PeerAddr, footprint: u64) -> Result<(), Refusal> {
        self.ledger.reserve_region(ip(peer), footprint)
    }

    fn release_region(&mut self, peer: PeerAddr, footprint: u64) {
        self.ledger.release_region(ip(peer), footprint);
    }

    fn publish(&mut self, _owner: ConnHandle, share: RegionShare) -> u64 {
        self.ledger.publish(share)
    }

    fn join(
        &mut self,
        ticket: u64,
        conn: ConnHandle,
        peer: PeerAddr,
    ) -> Result<RegionShare, Refusal> {
        self.ledger.join(ticket, self.thread, conn, ip(peer))
    }

    fn leave(&mut self, ticket: u64, conn: ConnHandle, peer: PeerAddr) {
        self.ledger.leave(ticket, self.thread, conn, ip(peer));
    }

    fn withdraw(&mut self, ticket: u64, revoke: &mut dyn FnMut(ConnHandle)) {
        self.ledger
            .withdraw(ticket, self.thread)
            .into_iter()
            .for_each(revoke);
    }

    fn take_revoked(&mut self, revoke: &mut dyn FnMut(ConnHandle)) {
        self.ledger
            .take_revoked(self.thread)
            .into_iter()
            .for_each(revoke);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share() -> RegionShare {
        RegionShare {
            memory: serve::Memory {
                base: 1 << 32,
                len: 64,
                ro_base: 2 << 32,
            },
            op: crate::app::Operation::Write,
            seed: 1,
            size: 8,
        }
    }

    fn h(index: u32) -> ConnHandle {
        ConnHandle {
            index,
            generation: 1,
        }
    }

    #[test]
    fn budgets_hold_across_threads_and_everything_comes_back() {
        let budget = PeerBudget {
            connections_per_peer: 2,
            bytes_per_peer: 100,
            bytes_total: 150,
            regions_per_peer: 6,
        };
        let ledger = Ledger::new(budget, 2, None);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(ledger.adopt(a), Ok(()));
        assert_eq!(ledger.adopt(a), Ok(()));
        assert_eq!(ledger.adopt(a), Err(Refusal::PeerConnections));
        assert_eq!(ledger.reserve_region(a, 80), Ok(()));
        assert_eq!(ledger.reserve_region(a, 30), Err(Refusal::PeerBytes));
        assert_eq!(ledger.reserve_region(b, 80), Err(Refusal::TotalBytes));
        assert_eq!(ledger.reserve_region(b, 60), Ok(()));
        let ticket = ledger.publish(share());
        // b joins twice from thread 1: its third region pair is refused.
        assert!(ledger.join(ticket, 1, h(20), b).is_ok());
        assert!(ledger.join(ticket, 1, h(21), b).is_ok());
        assert_eq!(
            ledger.join(ticket, 0, h(3), b).map(|_| ()),
            Err(Refusal::PeerRegions)
        );
        assert_eq!(
            ledger.join(ticket ^ 1, 0, h(3), a).map(|_| ()),
            Err(Refusal::BadTicket)
        );
        assert!(ledger.join(ticket, 0, h(2), a).is_ok());
        ledger.leave(ticket, 1, h(21), b);
        // The owner ends: its own thread's joiner comes back to it, the
        // other thread's is queued for that thread.
        assert_eq!(ledger.withdraw(ticket, 0), vec![h(2)]);
        assert_eq!(ledger.take_revoked(1), vec![h(20)]);
        assert!(ledger.take_revoked(1).is_empty());
        ledger.leave(ticket, 1, h(20), b); // after the revocation: no-op
        ledger.release_region(a, 80);
        ledger.release_region(b, 60);
        ledger.release_connection(a);
        ledger.release_connection(a);
        assert_eq!(ledger.holdings(), (0, 0), "nothing left booked");
    }
}
