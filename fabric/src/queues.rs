//! The objects the transport reports into and resolves through, shared with
//! the application's threads: completion queues and address vectors.
//!
//! Lock order: a thread holding the transport may take a queue's or an
//! address vector's lock; nothing holding one of those takes the
//! transport's.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use crate::flags::{errno, ADDR_NOTAVAIL};

/// A successful completion, in the richest of libfabric's formats
/// (`fi_cq_tagged_entry`, plus the source for `fi_cq_readfrom`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    pub context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    /// Source address (`fi_addr_t`), `FI_ADDR_NOTAVAIL` when unknown.
    pub src: u64,
}

impl CqEntry {
    /// An entry for `context` with `flags` and nothing else.
    pub fn new(context: usize, flags: u64) -> CqEntry {
        CqEntry {
            context,
            flags,
            len: 0,
            buf: 0,
            data: 0,
            tag: 0,
            src: ADDR_NOTAVAIL,
        }
    }
}

/// A failed operation (`fi_cq_err_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqError {
    pub entry: CqEntry,
    /// Positive `FI_E*` number.
    pub err: i32,
    /// The MetaRoCE completion status that caused it (see the guide), 0 if
    /// the provider itself failed the operation.
    pub prov_errno: i32,
    /// Bytes that did not fit (truncation).
    pub olen: usize,
}

/// One item of a completion queue, in the order the operations ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqItem {
    Done(CqEntry),
    Failed(CqError),
}

/// A completion queue's contents.
#[derive(Debug, Default)]
pub struct CompletionQueue {
    items: Mutex<VecDeque<CqItem>>,
    ready: Condvar,
}

impl CompletionQueue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<CqItem>> {
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends an item and wakes a waiting reader.
    pub fn push(&self, item: CqItem) {
        self.lock().push_back(item);
        self.ready.notify_all();
    }

    /// Takes up to `max` successful entries from the head. `Err(EAVAIL)`
    /// when the head is an error (read it with [`CompletionQueue::read_error`]),
    /// `Err(EAGAIN)` when the queue is empty.
    pub fn read(&self, max: usize, mut out: impl FnMut(usize, &CqEntry)) -> Result<usize, i32> {
        let mut items = self.lock();
        let mut n = 0;
        while n < max {
            match items.front() {
                Some(CqItem::Done(entry)) => {
                    out(n, entry);
                    items.pop_front();
                    n += 1;
                }
                Some(CqItem::Failed(_)) if n == 0 => return Err(errno::EAVAIL),
                _ => break,
            }
        }
        if n == 0 {
            Err(errno::EAGAIN)
        } else {
            Ok(n)
        }
    }

    /// Takes the error at the head, if there is one.
    pub fn read_error(&self) -> Option<CqError> {
        let mut items = self.lock();
        match items.front() {
            Some(CqItem::Failed(e)) => {
                let e = *e;
                items.pop_front();
                Some(e)
            }
            _ => None,
        }
    }

    /// Whether anything is queued.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Waits up to `timeout` for an item (another thread's progress
    /// pushes it).
    pub fn wait(&self, timeout: Duration) {
        let items = self.lock();
        if items.is_empty() {
            let _ = self
                .ready
                .wait_timeout(items, timeout)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Wakes waiting readers without an item (`fi_cq_signal`).
    pub fn signal(&self) {
        self.ready.notify_all();
    }
}

/// An address vector: `fi_addr_t` values are indices into its table, for
/// `FI_AV_TABLE` and `FI_AV_MAP` alike.
#[derive(Debug, Default)]
pub struct AddressVector {
    table: RwLock<AvTable>,
}

#[derive(Debug, Default)]
struct AvTable {
    entries: Vec<Option<SocketAddr>>,
    index: HashMap<SocketAddr, u64>,
}

impl AddressVector {
    /// Inserts `addr`; returns its `fi_addr_t`.
    pub fn insert(&self, addr: SocketAddr) -> u64 {
        let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let i = t.entries.len() as u64;
        t.entries.push(Some(addr));
        t.index.entry(addr).or_insert(i);
        i
    }

    /// Removes the entry `fi_addr`; `false` if there is none.
    pub fn remove(&self, fi_addr: u64) -> bool {
        let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = usize::try_from(fi_addr)
            .ok()
            .and_then(|i| t.entries.get_mut(i))
        else {
            return false;
        };
        let Some(addr) = slot.take() else {
            return false;
        };
        if t.index.get(&addr) == Some(&fi_addr) {
            t.index.remove(&addr);
            // Another entry may hold the same address.
            if let Some(i) = t.entries.iter().position(|e| *e == Some(addr)) {
                t.index.insert(addr, i as u64);
            }
        }
        true
    }

    /// The address of `fi_addr`.
    pub fn lookup(&self, fi_addr: u64) -> Option<SocketAddr> {
        let t = self.table.read().unwrap_or_else(PoisonError::into_inner);
        usize::try_from(fi_addr)
            .ok()
            .and_then(|i| t.entries.get(i).copied().flatten())
    }

    /// The `fi_addr_t` of `addr`, `FI_ADDR_NOTAVAIL` if it was never
    /// inserted.
    pub fn reverse(&self, addr: SocketAddr) -> u64 {
        let t = self.table.read().unwrap_or_else(PoisonError::into_inner);
        t.index.get(&addr).copied().unwrap_or(ADDR_NOTAVAIL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_stop_a_read_until_taken() {
        let cq = CompletionQueue::default();
        cq.push(CqItem::Done(CqEntry::new(1, 0)));
        cq.push(CqItem::Failed(CqError {
            entry: CqEntry::new(2, 0),
            err: errno::ETRUNC,
            prov_errno: 0,
            olen: 3,
        }));
        cq.push(CqItem::Done(CqEntry::new(3, 0)));
        let mut seen = Vec::new();
        assert_eq!(cq.read(8, |_, e| seen.push(e.context)), Ok(1));
        assert_eq!(cq.read(8, |_, e| seen.push(e.context)), Err(errno::EAVAIL));
        assert_eq!(cq.read_error().map(|e| e.entry.context), Some(2));
        assert_eq!(cq.read(8, |_, e| seen.push(e.context)), Ok(1));
        assert_eq!(cq.read(8, |_, _| {}), Err(errno::EAGAIN));
        assert_eq!(seen, [1, 3]);
    }

    #[test]
    fn addresses_resolve_both_ways() {
        let av = AddressVector::default();
        let a: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:6000".parse().unwrap();
        let fa = av.insert(a);
        let fb = av.insert(b);
        assert_eq!(av.lookup(fb), Some(b));
        assert_eq!(av.reverse(a), fa);
        assert!(av.remove(fa));
        assert!(!av.remove(fa));
        assert_eq!(av.lookup(fa), None);
        assert_eq!(av.reverse(a), ADDR_NOTAVAIL);
        assert_eq!(av.lookup(99), None);
    }
}
