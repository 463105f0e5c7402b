//! Registered memory of a host program: ordinary heap buffers, each at a
//! made-up base address the endpoint's regions refer to.
//!
//! An arena belongs to one engine (one thread). A server with several
//! engine threads (`serve --threads N`) lets a connection on one thread
//! `JOIN` a region another thread's connection announced: that region's
//! arena is then shared ([`Arenas::share`], [`Arenas::attach`]), its bytes
//! behind a mutex that only the threads using the region ever touch, and
//! it lives until the last of them lets it go. Every other arena stays a
//! plain buffer of its thread.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use metaroce_core::api::Memory;
use metaroce_platform::dma::{DmaCopy, DmaError};

/// Where arenas start, and the gap between consecutive ones (so an address
/// names exactly one arena, and off-by-one placement cannot land in a
/// neighbour).
const FIRST_BASE: u64 = 0x1_0000_0000;
const GUARD: u64 = 0x10_0000;
/// Address space of each engine thread's arenas (1 TiB apart), so an
/// address is unique in the whole process and a shared arena keeps its
/// address on every thread.
const THREAD_SPAN: u64 = 1 << 40;

/// The engine thread whose arenas hand out `addr`.
pub fn thread_of(addr: u64) -> usize {
    (addr.saturating_sub(FIRST_BASE) / THREAD_SPAN) as usize
}

/// The bytes of an arena that several engine threads reach (its length
/// never changes).
#[derive(Debug, Clone)]
pub struct SharedArena {
    bytes: Arc<Mutex<Vec<u8>>>,
    len: usize,
}

impl SharedArena {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        // A thread that panicked while copying left bytes, not broken
        // invariants: the data is still usable.
        f(&mut self.bytes.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[derive(Debug)]
enum Bytes {
    /// This thread's alone.
    Own(Vec<u8>),
    /// Shared; `attached` counts this thread's users of another thread's
    /// arena (0 for the arena of this thread, which `free` removes).
    Shared { arena: SharedArena, attached: u32 },
}

/// A set of byte arenas addressed by 64-bit "addresses".
#[derive(Debug, Default)]
pub struct Arenas {
    arenas: BTreeMap<u64, Bytes>,
    next_base: u64,
}

impl Arenas {
    /// Empty.
    pub fn new() -> Self {
        Self::for_thread(0)
    }

    /// Empty, handing out addresses of engine thread `thread` only.
    pub fn for_thread(thread: usize) -> Self {
        Arenas {
            arenas: BTreeMap::new(),
            next_base: FIRST_BASE + thread as u64 * THREAD_SPAN,
        }
    }

    /// Allocates `len` bytes filled with `fill`; returns its base address.
    pub fn alloc(&mut self, len: usize, fill: u8) -> u64 {
        let base = self.next_base;
        self.arenas.insert(base, Bytes::Own(vec![fill; len]));
        let len64 = len as u64;
        self.next_base = base + len64.div_ceil(GUARD) * GUARD + GUARD;
        base
    }

    /// Frees the arena at `base` (the region must be deregistered first).
    /// A shared arena's bytes live on while another thread holds them.
    pub fn free(&mut self, base: u64) {
        self.arenas.remove(&base);
    }

    /// Makes the arena at `base` shareable with other engine threads and
    /// returns its handle for them ([`Arenas::attach`]). `None` if no
    /// arena starts at `base`.
    pub fn share(&mut self, base: u64) -> Option<SharedArena> {
        let bytes = self.arenas.get_mut(&base)?;
        if let Bytes::Own(v) = bytes {
            let arena = SharedArena {
                len: v.len(),
                bytes: Arc::new(Mutex::new(std::mem::take(v))),
            };
            *bytes = Bytes::Shared { arena, attached: 0 };
        }
        match bytes {
            Bytes::Shared { arena, .. } => Some(arena.clone()),
            Bytes::Own(_) => None,
        }
    }

    /// Makes another thread's shared arena reachable here at its address
    /// (counted: each `attach` wants one [`Arenas::detach`]).
    pub fn attach(&mut self, base: u64, arena: &SharedArena) {
        match self.arenas.get_mut(&base) {
            Some(Bytes::Shared { attached, .. }) => *attached += 1,
            Some(Bytes::Own(_)) => {}
            None => {
                self.arenas.insert(
                    base,
                    Bytes::Shared {
                        arena: arena.clone(),
                        attached: 1,
                    },
                );
            }
        }
    }

    /// Undoes one [`Arenas::attach`]; the last one removes the arena here.
    pub fn detach(&mut self, base: u64) {
        if let Some(Bytes::Shared { attached, .. }) = self.arenas.get_mut(&base) {
            if *attached <= 1 {
                self.arenas.remove(&base);
            } else {
                *attached -= 1;
            }
        }
    }

    /// The arena holding `[addr, addr + len)` and the offset in it: one
    /// ordered-map lookup, however many arenas there are.
    fn locate(&self, addr: u64, len: usize) -> Option<(&Bytes, usize)> {
        let (base, bytes) = self.arenas.range(..=addr).next_back()?;
        let off = usize::try_from(addr - base).ok()?;
        let size = match bytes {
            Bytes::Own(v) => v.len(),
            Bytes::Shared { arena, .. } => arena.len,
        };
        (off.checked_add(len)? <= size).then_some((bytes, off))
    }

    /// `len` bytes at `addr`, if they lie inside one arena of this
    /// thread's own (not a shared one: see [`Arenas::with`]).
    pub fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        match self.locate(addr, len)? {
            (Bytes::Own(v), off) => Some(&v[off..off + len]),
            (Bytes::Shared { .. }, _) => None,
        }
    }

    /// Mutable `len` bytes at `addr`, as [`Arenas::slice`].
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let off = match self.locate(addr, len)? {
            (Bytes::Own(_), off) => off,
            (Bytes::Shared { .. }, _) => return None,
        };
        let (_, bytes) = self.arenas.range_mut(..=addr).next_back()?;
        match bytes {
            Bytes::Own(v) => Some(&mut v[off..off + len]),
            Bytes::Shared { .. } => None,
        }
    }

    /// Calls `f` on the `len` bytes at `addr`, in any arena (shared ones
    /// locked meanwhile); `None` if they do not lie inside one.
    pub fn with<R>(&self, addr: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match self.locate(addr, len)? {
            (Bytes::Own(v), off) => Some(f(&v[off..off + len])),
            (Bytes::Shared { arena, .. }, off) => Some(arena.with(|v| f(&v[off..off + len]))),
        }
    }

    /// Calls `f` on the `len` bytes at `addr` to change them, as
    /// [`Arenas::with`].
    pub fn with_mut<R>(
        &mut self,
        addr: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let off = self.locate(addr, len)?.1;
        let (_, bytes) = self.arenas.range_mut(..=addr).next_back()?;
        match bytes {
            Bytes::Own(v) => Some(f(&mut v[off..off + len])),
            Bytes::Shared { arena, .. } => Some(arena.with(|v| f(&mut v[off..off + len]))),
        }
    }
}

impl Memory for Arenas {
    fn write(&mut self, addr: u64, data: &[u8]) {
        // The endpoint only names addresses inside registered regions, and
        // every region lies in an arena; anything else is ignored rather
        // than trusted.
        self.with_mut(addr, data.len(), |dst| dst.copy_from_slice(data));
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        if self
            .with(addr, out.len(), |src| out.copy_from_slice(src))
            .is_none()
        {
            out.fill(0);
        }
    }
}

/// The engine loop's view: copies to and from process memory, refused
/// (and counted by the loop) outside every arena.
impl DmaCopy for Arenas {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let len = data.len();
        self.with_mut(addr, len, |dst| dst.copy_from_slice(data))
            .ok_or(DmaError::OutOfRange { addr, len })
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        let len = out.len();
        self.with(addr, len, |src| out.copy_from_slice(src))
            .ok_or(DmaError::OutOfRange { addr, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_are_disjoint_and_bounded() {
        let mut a = Arenas::new();
        let x = a.alloc(100, 1);
        let y = a.alloc(10, 2);
        assert!(y > x + 100);
        assert!(a.slice(x + 90, 11).is_none());
        assert!(a.slice(x - 1, 1).is_none(), "below the first arena");
        assert!(a.slice(x + 100, 1).is_none(), "in the guard gap");
        a.write(x + 98, &[7, 7]);
        assert_eq!(a.slice(x + 98, 2), Some(&[7u8, 7][..]));
        let mut out = [0u8; 3];
        a.read(y, &mut out);
        assert_eq!(out, [2, 2, 2]);
        a.free(x);
        assert!(a.slice(x, 1).is_none());
    }

    #[test]
    fn a_shared_arena_is_one_memory_on_two_threads_until_both_let_go() {
        let mut owner = Arenas::for_thread(0);
        let mut other = Arenas::for_thread(1);
        let base = owner.alloc(64, 0);
        let theirs = other.alloc(64, 0);
        assert_ne!(base, theirs, "threads hand out distinct addresses");
        let shared = owner.share(base).expect("an arena");
        other.attach(base, &shared);
        other.attach(base, &shared);
        other.copy_to_host(base + 8, &[9, 9]).unwrap();
        let mut out = [0u8; 2];
        owner.copy_from_host(base + 8, &mut out).unwrap();
        assert_eq!(out, [9, 9], "written on one thread, seen on the other");
        assert_eq!(owner.with(base + 8, 2, |b| b.to_vec()), Some(vec![9, 9]));
        assert!(
            owner.slice(base, 1).is_none(),
            "no bare slice of shared bytes"
        );
        owner.free(base);
        other.detach(base);
        assert!(other.with(base, 1, |_| ()).is_some(), "one attachment left");
        other.detach(base);
        assert!(other.with(base, 1, |_| ()).is_none());
        assert!(other.copy_to_host(base, &[1]).is_err());
    }
}
