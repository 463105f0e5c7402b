//! The device's side of one queue set's rings in shared memory (spec 6.4):
//! consuming the host-produced rings (send, receive, admin) through their
//! doorbell records, and producing the completion rings (completion, admin
//! completion) with phase bits. Nothing the host writes is trusted: a
//! producer index beyond the ring is counted and ignored, a consumer index
//! beyond what was produced makes the ring look full.

use metaroce_abi as abi;

use crate::shmem::{SharedMemory, ShmError};

/// Offset of a doorbell line in the doorbell page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bell {
    Sq = 0,
    Rq = 1,
    Cq = 2,
    Aq = 3,
    Acq = 4,
}

/// Where one ring lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingGeometry {
    /// Absolute offset of slot 0.
    pub base: u64,
    /// Entries (a power of two).
    pub depth: u32,
    /// Bytes per entry.
    pub entry: u32,
}

impl RingGeometry {
    pub fn slot(&self, index: u32) -> u64 {
        self.base + u64::from(index & (self.depth - 1)) * u64::from(self.entry)
    }
}

/// The device's state of a ring the host produces.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Consumed {
    /// Next index to consume (published in `DeviceIndices`).
    pub consumer: u32,
    /// The doorbell's `rings` count last seen.
    rings_seen: u32,
    /// The last out-of-range producer index counted (each counted once).
    last_bad: Option<u32>,
}

/// What a doorbell record says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Entries ready to consume.
    pub ready: u32,
    /// The producer index was beyond the ring (newly seen).
    pub bad_index: bool,
    /// Rings that brought nothing.
    pub spurious: u32,
}

impl Consumed {
    /// Reads the doorbell at `bell` of a ring of `depth`.
    #[inline]
    pub fn read(&mut self, shm: &SharedMemory<'_>, bell: u64, depth: u32) -> Reading {
        let (Ok(producer), Ok(rings)) = (shm.load_u32(bell), shm.load_u32(bell + 4)) else {
            return Reading::default();
        };
        let mut out = Reading::default();
        let fill = producer.wrapping_sub(self.consumer);
        if fill > depth {
            if self.last_bad != Some(producer) {
                self.last_bad = Some(producer);
                out.bad_index = true;
            }
        } else {
            out.ready = fill;
        }
        let rung = rings.wrapping_sub(self.rings_seen);
        if rung != 0 {
            self.rings_seen = rings;
            if out.ready == 0 {
                out.spurious = rung;
            }
        }
        out
    }
}

/// The device's state of a ring it produces (with phase bits).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Produced {
    pub producer: u32,
}

impl Produced {
    /// Free entries, from the host's consumer index at `bell`. A consumer
    /// index ahead of the producer (host garbage) reads as full.
    #[inline]
    pub fn free(&self, shm: &SharedMemory<'_>, bell: u64, depth: u32) -> u32 {
        let Ok(consumer) = shm.load_u32(bell) else {
            return 0;
        };
        let used = self.producer.wrapping_sub(consumer);
        depth.saturating_sub(used)
    }

    /// Writes an entry (its bytes) at the producer index: every byte
    /// before the last word, then the last word (which holds the phase)
    /// with Release. One copy of the code for both completion rings.
    #[inline]
    pub fn push(
        &mut self,
        shm: &SharedMemory<'_>,
        ring: &RingGeometry,
        bytes: &[u8],
        last_word: usize,
    ) -> Result<(), ShmError> {
        let slot = ring.slot(self.producer);
        let phase = abi::phase_of(self.producer, ring.depth);
        let aligned = last_word & !7;
        shm.write_words(slot, &bytes[..aligned])?;
        if aligned < last_word {
            let mut word = [0u8; 4];
            word.copy_from_slice(&bytes[aligned..aligned + 4]);
            shm.store_u32(slot + aligned as u64, u32::from_le_bytes(word))?;
        }
        let mut last = [0u8; 4];
        last.copy_from_slice(&bytes[last_word..last_word + 4]);
        last[3] = phase;
        shm.store_u32(slot + last_word as u64, u32::from_le_bytes(last))?;
        self.producer = self.producer.wrapping_add(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use zerocopy::IntoBytes;

    fn memory(words: &mut [u64]) -> SharedMemory<'_> {
        let len = words.len() * 8;
        // SAFETY: the slice outlives the view and is only used through it.
        unsafe { SharedMemory::new(words.as_mut_ptr().cast(), len) }.unwrap()
    }

    #[test]
    fn doorbells_past_the_ring_are_counted_once_and_ignored() {
        let mut words = vec![0u64; 8];
        let shm = memory(&mut words);
        let mut c = Consumed::default();
        assert_eq!(c.read(&shm, 0, 4), Reading::default());
        shm.store_u32(0, 3).unwrap();
        shm.store_u32(4, 1).unwrap();
        assert_eq!(c.read(&shm, 0, 4).ready, 3);
        shm.store_u32(0, 9).unwrap();
        let r = c.read(&shm, 0, 4);
        assert!(r.bad_index && r.ready == 0);
        assert!(
            !c.read(&shm, 0, 4).bad_index,
            "the same bad value counts once"
        );
        shm.store_u32(0, 2).unwrap();
        c.consumer = 2;
        shm.store_u32(4, 5).unwrap();
        assert_eq!(c.read(&shm, 0, 4).spurious, 4, "rings that brought nothing");
    }

    #[test]
    fn completions_carry_the_phase_of_their_pass() {
        let mut words = vec![0u64; 32];
        let shm = memory(&mut words);
        let ring = RingGeometry {
            base: 0,
            depth: 2,
            entry: 32,
        };
        let mut p = Produced::default();
        let e = abi::Cqe {
            wr_id: 5,
            opcode: abi::OP_SEND,
            ..abi::Cqe::default()
        };
        for expected in [1u8, 1, 0, 0, 1] {
            let slot = ring.slot(p.producer);
            p.push(&shm, &ring, e.as_bytes(), abi::CQE_LAST_WORD)
                .unwrap();
            let got: abi::Cqe = shm.read(slot).unwrap();
            assert_eq!(
                (got.wr_id, got.opcode, got.owner),
                (5, abi::OP_SEND, expected)
            );
        }
    }
}
