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
//! Each engine thread's server reaches it as its [`serve::Books`]
//! ([`ThreadBooks`]). A ticket names a region. With several threads every
//! announced region's arenas are shared ([`crate::memory::SharedArena`])
//! and kept here by address, so a connection on another thread that joins
//! reaches the bytes and gets keys of its own there. When the owner ends,
//! the joiners lose their keys before the owner's memory is let go: those on the owner's thread at once, those on other threads
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
struct Accounts {
    peers: HashMap<IpAddr, PeerUsage>,
    bytes_total: u64,
    tickets: HashMap<u64, Ticket>,
    /// Announced regions' shared arenas, by data address.
    arenas: HashMap<u64, Shared>,
    /// Per thread: its joiners whose region's owner ended.
    revoked: Vec<Vec<ConnHandle>>,
}

impl Accounts {
    fn usage(&mut self, peer: IpAddr) -> &mut PeerUsage {
        self.peers.entry(peer).or_default()
    }

    /// Takes `connections`, `regions` and `bytes` off `peer`, and forgets
    /// an address that holds nothing.
    fn give_back(&mut self, peer: IpAddr, connections: u32, regions: u32, bytes: u64) {
        let u = self.usage(peer);
        u.connections = u.connections.saturating_sub(connections);
        u.regions = u.regions.saturating_sub(regions);
        u.bytes = u.bytes.saturating_sub(bytes);
        if u.connections == 0 && u.regions == 0 && u.bytes == 0 {
            self.peers.remove(&peer);
        }
    }
}

/// The node's books (see the module documentation).
#[derive(Debug)]
pub struct Ledger {
    budget: PeerBudget,
    accounts: Mutex<Accounts>,
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
            accounts: Mutex::new(Accounts {
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

    fn accounts(&self) -> MutexGuard<'_, Accounts> {
        // Every update below is complete before the guard drops: a thread
        // that panicked while holding it left consistent books.
        self.accounts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the threads in `threads` (a bit each) for their revocations.
    fn wake(&self, mut threads: u64) {
        while threads != 0 {
            let t = threads.trailing_zeros() as usize;
            threads &= threads - 1;
            if let Some(flag) = self.pending.get(t) {
                flag.store(true, Ordering::Release);
            }
            if let Some(w) = self.wakers.as_ref().and_then(|w| w.get(t)) {
                w.wake();
            }
        }
    }

    /// Keeps an announced region's shared arenas for joiners elsewhere.
    pub(crate) fn share_arenas(&self, base: u64, shared: Shared) {
        self.accounts().arenas.insert(base, shared);
    }

    /// The shared arenas of the region at `base`.
    pub(crate) fn arenas(&self, base: u64) -> Option<Shared> {
        self.accounts().arenas.get(&base).cloned()
    }

    /// The region at `base` is freed: joiners keep the bytes they hold.
    pub(crate) fn forget_arenas(&self, base: u64) {
        self.accounts().arenas.remove(&base);
    }

    /// Peer addresses holding anything, and the bytes of all (for tests).
    pub fn holdings(&self) -> (usize, u64) {
        let a = self.accounts();
        (a.peers.len(), a.bytes_total)
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
        let mut a = self.ledger.accounts();
        let usage = a.usage(ip(peer));
        if usage.connections >= self.ledger.budget.connections_per_peer {
            a.give_back(ip(peer), 0, 0, 0);
            return Err(Refusal::PeerConnections);
        }
        usage.connections += 1;
        Ok(())
    }

    fn release_connection(&mut self, peer: PeerAddr) {
        self.ledger.accounts().give_back(ip(peer), 1, 0, 0);
    }

    /// Checked and booked at once, so that threads announcing together
    /// cannot pass the budget between them.
    fn reserve_region(&mut self, peer: PeerAddr, footprint: u64) -> Result<(), Refusal> {
        let budget = self.ledger.budget;
        let mut a = self.ledger.accounts();
        let total = a.bytes_total;
        let usage = a.usage(ip(peer));
        let refusal = if usage.bytes + footprint > budget.bytes_per_peer {
            Refusal::PeerBytes
        } else if total + footprint > budget.bytes_total {
            Refusal::TotalBytes
        } else if usage.regions + REGIONS_PER_GRANT > budget.regions_per_peer {
            Refusal::PeerRegions
        } else {
            usage.bytes += footprint;
            usage.regions += REGIONS_PER_GRANT;
            a.bytes_total += footprint;
            return Ok(());
        };
        a.give_back(ip(peer), 0, 0, 0);
        Err(refusal)
    }

    fn release_region(&mut self, peer: PeerAddr, footprint: u64) {
        let mut a = self.ledger.accounts();
        a.bytes_total = a.bytes_total.saturating_sub(footprint);
        a.give_back(ip(peer), 0, REGIONS_PER_GRANT, footprint);
    }

    /// A new random ticket (a capability: unguessable, never 0, never one
    /// in use).
    fn publish(&mut self, _owner: ConnHandle, share: RegionShare) -> u64 {
        let mut a = self.ledger.accounts();
        let ticket = loop {
            let mut b = [0u8; 8];
            if getrandom::fill(&mut b).is_err() {
                continue;
            }
            let t = u64::from_le_bytes(b);
            if t != 0 && !a.tickets.contains_key(&t) {
                break t;
            }
        };
        let joiners = Vec::new();
        a.tickets.insert(ticket, Ticket { share, joiners });
        ticket
    }

    fn join(
        &mut self,
        ticket: u64,
        conn: ConnHandle,
        peer: PeerAddr,
    ) -> Result<RegionShare, Refusal> {
        let peer = ip(peer);
        let mut a = self.ledger.accounts();
        if !a.tickets.contains_key(&ticket) {
            return Err(Refusal::BadTicket);
        }
        let usage = a.usage(peer);
        if usage.regions + REGIONS_PER_GRANT > self.ledger.budget.regions_per_peer {
            a.give_back(peer, 0, 0, 0);
            return Err(Refusal::PeerRegions);
        }
        usage.regions += REGIONS_PER_GRANT;
        let entry = a.tickets.get_mut(&ticket).expect("checked above");
        let thread = self.thread;
        entry.joiners.push(Joiner { thread, conn, peer });
        Ok(entry.share)
    }

    fn leave(&mut self, ticket: u64, conn: ConnHandle, peer: PeerAddr) {
        let mut a = self.ledger.accounts();
        let Some(entry) = a.tickets.get_mut(&ticket) else {
            return;
        };
        let before = entry.joiners.len();
        let thread = self.thread;
        entry
            .joiners
            .retain(|j| !(j.thread == thread && j.conn == conn));
        if entry.joiners.len() < before {
            a.give_back(ip(peer), 0, REGIONS_PER_GRANT, 0);
        }
    }

    /// The joiners on other threads are queued for their threads, which
    /// are woken.
    fn withdraw(&mut self, ticket: u64, revoke: &mut dyn FnMut(ConnHandle)) {
        let mut a = self.ledger.accounts();
        let Some(entry) = a.tickets.remove(&ticket) else {
            return;
        };
        let mut local = Vec::new();
        let mut woken = 0u64;
        for j in entry.joiners {
            a.give_back(j.peer, 0, REGIONS_PER_GRANT, 0);
            if j.thread == self.thread {
                local.push(j.conn);
            } else if let Some(list) = a.revoked.get_mut(j.thread) {
                list.push(j.conn);
                woken |= 1 << j.thread.min(63);
            }
        }
        drop(a);
        self.ledger.wake(woken);
        local.into_iter().for_each(revoke);
    }

    /// One atomic load when there are none.
    fn take_revoked(&mut self, revoke: &mut dyn FnMut(ConnHandle)) {
        let Some(flag) = self.ledger.pending.get(self.thread) else {
            return;
        };
        if flag.swap(false, Ordering::Acquire) {
            let mut a = self.ledger.accounts();
            let list = a.revoked.get_mut(self.thread).map(std::mem::take);
            drop(a);
            list.unwrap_or_default().into_iter().for_each(revoke);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::serve::Books;

    fn h(index: u32) -> ConnHandle {
        let generation = 1;
        ConnHandle { index, generation }
    }

    fn peer(host: u8) -> PeerAddr {
        let ip = std::net::Ipv4Addr::new(10, 0, 0, host).into();
        PeerAddr { ip, port: 1 }
    }

    fn revoked(books: &mut ThreadBooks, ticket: Option<u64>) -> Vec<ConnHandle> {
        let mut list = Vec::new();
        match ticket {
            Some(t) => books.withdraw(t, &mut |c| list.push(c)),
            None => books.take_revoked(&mut |c| list.push(c)),
        }
        list
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
        let books = |thread| ThreadBooks {
            ledger: ledger.clone(),
            thread,
        };
        let (mut t0, mut t1, a, b) = (books(0), books(1), peer(1), peer(2));
        assert_eq!(t0.adopt(a), Ok(()));
        assert_eq!(t1.adopt(a), Ok(()));
        assert_eq!(t0.adopt(a), Err(Refusal::PeerConnections));
        assert_eq!(t0.reserve_region(a, 80), Ok(()));
        assert_eq!(t1.reserve_region(a, 30), Err(Refusal::PeerBytes));
        assert_eq!(t1.reserve_region(b, 80), Err(Refusal::TotalBytes));
        assert_eq!(t1.reserve_region(b, 60), Ok(()));
        let memory = serve::Memory {
            base: 1 << 32,
            len: 64,
            ro_base: 2 << 32,
        };
        let (op, seed, size) = (crate::app::Operation::Write, 1, 8);
        let ticket = t0.publish(
            h(0),
            RegionShare {
                memory,
                op,
                seed,
                size,
            },
        );
        // b joins twice from thread 1: its third region pair is refused.
        assert!(t1.join(ticket, h(20), b).is_ok());
        assert!(t1.join(ticket, h(21), b).is_ok());
        assert_eq!(t0.join(ticket, h(3), b), Err(Refusal::PeerRegions));
        assert_eq!(t0.join(ticket ^ 1, h(3), a), Err(Refusal::BadTicket));
        assert!(t0.join(ticket, h(2), a).is_ok());
        t1.leave(ticket, h(21), b);
        // The owner ends: its own thread's joiner comes back to it, the
        // other thread's is queued for that thread.
        assert_eq!(revoked(&mut t0, Some(ticket)), vec![h(2)]);
        assert_eq!(revoked(&mut t1, None), vec![h(20)]);
        assert!(revoked(&mut t1, None).is_empty());
        t1.leave(ticket, h(20), b); // after the revocation: no-op
        t0.release_region(a, 80);
        t1.release_region(b, 60);
        t0.release_connection(a);
        t1.release_connection(a);
        assert_eq!(ledger.holdings(), (0, 0), "nothing left booked");
    }
}
