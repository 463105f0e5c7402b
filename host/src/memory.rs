//! Registered memory of a host program: ordinary heap buffers, each at a
//! made-up base address the endpoint's regions refer to.

use metaroce_core::api::Memory;
use metaroce_platform::dma::{DmaCopy, DmaError};

/// Where arenas start, and the gap between consecutive ones (so an address
/// names exactly one arena, and off-by-one placement cannot land in a
/// neighbour).
const FIRST_BASE: u64 = 0x1_0000_0000;
const GUARD: u64 = 0x10_0000;

/// A set of byte arenas addressed by 64-bit "addresses".
#[derive(Debug, Default)]
pub struct Arenas {
    arenas: Vec<(u64, Vec<u8>)>,
    next_base: u64,
}

impl Arenas {
    /// Empty.
    pub fn new() -> Self {
        Arenas {
            arenas: Vec::new(),
            next_base: FIRST_BASE,
        }
    }

    /// Allocates `len` bytes filled with `fill`; returns its base address.
    pub fn alloc(&mut self, len: usize, fill: u8) -> u64 {
        let base = self.next_base;
        self.arenas.push((base, vec![fill; len]));
        let len64 = len as u64;
        self.next_base = base + len64.div_ceil(GUARD) * GUARD + GUARD;
        base
    }

    /// Frees the arena at `base` (the region must be deregistered first).
    pub fn free(&mut self, base: u64) {
        self.arenas.retain(|(b, _)| *b != base);
    }

    fn locate(&self, addr: u64, len: usize) -> Option<(usize, usize)> {
        self.arenas
            .iter()
            .enumerate()
            .find_map(|(i, (base, bytes))| {
                let off = usize::try_from(addr.checked_sub(*base)?).ok()?;
                (off.checked_add(len)? <= bytes.len()).then_some((i, off))
            })
    }

    /// `len` bytes at `addr`, if they lie inside one arena.
    pub fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (i, off) = self.locate(addr, len)?;
        Some(&self.arenas[i].1[off..off + len])
    }

    /// Mutable `len` bytes at `addr`, if they lie inside one arena.
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let (i, off) = self.locate(addr, len)?;
        Some(&mut self.arenas[i].1[off..off + len])
    }
}

impl Memory for Arenas {
    fn write(&mut self, addr: u64, data: &[u8]) {
        // The endpoint only names addresses inside registered regions, and
        // every region lies in an arena; anything else is ignored rather
        // than trusted.
        if let Some(dst) = self.slice_mut(addr, data.len()) {
            dst.copy_from_slice(data);
        }
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) {
        match self.slice(addr, out.len()) {
            Some(src) => out.copy_from_slice(src),
            None => out.fill(0),
        }
    }
}

/// The engine loop's view: copies to and from process memory, refused
/// (and counted by the loop) outside every arena.
impl DmaCopy for Arenas {
    fn copy_to_host(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let len = data.len();
        let dst = self
            .slice_mut(addr, len)
            .ok_or(DmaError::OutOfRange { addr, len })?;
        dst.copy_from_slice(data);
        Ok(())
    }

    fn copy_from_host(&mut self, addr: u64, out: &mut [u8]) -> Result<(), DmaError> {
        let len = out.len();
        let src = self
            .slice(addr, len)
            .ok_or(DmaError::OutOfRange { addr, len })?;
        out.copy_from_slice(src);
        Ok(())
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
        a.write(x + 98, &[7, 7]);
        assert_eq!(a.slice(x + 98, 2), Some(&[7u8, 7][..]));
        let mut out = [0u8; 3];
        a.read(y, &mut out);
        assert_eq!(out, [2, 2, 2]);
        a.free(x);
        assert!(a.slice(x, 1).is_none());
    }
}
