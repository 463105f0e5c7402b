//! The 256-bit selective acknowledgment bitvector (spec 3.6).
//!
//! Bit `i` set means PSN `cumulative_ack + 1 + sack_offset + i` has been
//! received (the ACK's SACK Offset says where the 256 PSNs start, 0 unless
//! the window exceeds 256); the PSN equal to `cumulative_ack` itself is by
//! definition missing. On the wire bit
//! `i` is byte `i / 8`, mask `0x80 >> (i % 8)` (most significant bit first, as
//! drawn in the spec's diagrams).
//!
//! Kept as four `u64` words rather than a generic bit-vector crate: the
//! engine needs shift-by-n and run-length queries on exactly 256 bits, which
//! are a few word operations here and no allocation anywhere.

/// Number of PSNs one bitvector describes.
pub const SACK_BITS: usize = 256;

/// 256 bits describing which PSNs after the cumulative ACK were received.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SackBits {
    words: [u64; 4],
}

impl core::fmt::Debug for SackBits {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "SackBits({:016x}{:016x}{:016x}{:016x})",
            self.words[3], self.words[2], self.words[1], self.words[0]
        )
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for SackBits {
    fn format(&self, f: defmt::Formatter) {
        defmt::write!(
            f,
            "SackBits({=u64:x} {=u64:x} {=u64:x} {=u64:x})",
            self.words[3],
            self.words[2],
            self.words[1],
            self.words[0]
        )
    }
}

impl SackBits {
    /// All bits clear.
    pub const EMPTY: SackBits = SackBits { words: [0; 4] };

    /// From four words, bit `i` of the vector being bit `i % 64` of word
    /// `i / 64`.
    #[inline]
    pub const fn from_words(words: [u64; 4]) -> SackBits {
        SackBits { words }
    }

    /// Whether bit `i` is set. Bits at or past 256 read as clear.
    #[inline]
    pub fn get(&self, i: usize) -> bool {
        i < SACK_BITS && self.words[i / 64] & (1u64 << (i % 64)) != 0
    }

    /// Sets bit `i`; bits at or past 256 are ignored (returns false).
    #[inline]
    pub fn set(&mut self, i: usize) -> bool {
        if i >= SACK_BITS {
            return false;
        }
        self.words[i / 64] |= 1u64 << (i % 64);
        true
    }

    /// Clears bit `i` (no-op past 256).
    #[inline]
    pub fn clear(&mut self, i: usize) {
        if i < SACK_BITS {
            self.words[i / 64] &= !(1u64 << (i % 64));
        }
    }

    /// Whether no bit is set.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.words == [0; 4]
    }

    /// Number of set bits.
    #[inline]
    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Number of consecutive set bits starting at bit 0.
    #[inline]
    pub fn leading_run(&self) -> usize {
        let mut run = 0;
        for w in self.words {
            let ones = w.trailing_ones() as usize;
            run += ones;
            if ones < 64 {
                break;
            }
        }
        run
    }

    /// Index of the highest set bit, if any.
    #[inline]
    pub fn highest(&self) -> Option<usize> {
        (0..4)
            .rev()
            .find(|&w| self.words[w] != 0)
            .map(|w| w * 64 + 63 - self.words[w].leading_zeros() as usize)
    }

    /// Moves every bit `i` to `i - n`; bits below `n` fall off. Used when the
    /// cumulative ACK advances by `n`.
    pub fn shift_down(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if n >= SACK_BITS {
            *self = Self::EMPTY;
            return;
        }
        let (word_shift, bit_shift) = (n / 64, n % 64);
        let mut out = [0u64; 4];
        for (i, slot) in out.iter_mut().enumerate() {
            let src = i + word_shift;
            if src >= 4 {
                break;
            }
            let mut v = self.words[src] >> bit_shift;
            if bit_shift != 0 && src + 1 < 4 {
                v |= self.words[src + 1] << (64 - bit_shift);
            }
            *slot = v;
        }
        self.words = out;
    }

    /// Iterates over the indices of set bits in increasing order.
    pub fn iter_set(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut rest = w;
            core::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let b = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(wi * 64 + b)
            })
        })
    }

    /// Wire form (spec 3.6 bit order). Byte `k` of a word carries bits
    /// `8k..8k+8` most significant first, which is the word's big-endian
    /// bytes with the bit order of the whole word reversed.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (chunk, w) in out.chunks_exact_mut(8).zip(self.words) {
            chunk.copy_from_slice(&w.reverse_bits().to_be_bytes());
        }
        out
    }

    /// From wire form (spec 3.6 bit order).
    pub fn from_bytes(bytes: &[u8; 32]) -> SackBits {
        let mut words = [0u64; 4];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *w = u64::from_be_bytes(b).reverse_bits();
        }
        SackBits { words }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bit_order_is_msb_first() {
        let mut s = SackBits::EMPTY;
        s.set(0);
        s.set(9);
        s.set(255);
        let b = s.to_bytes();
        assert_eq!(b[0], 0x80);
        assert_eq!(b[1], 0x40);
        assert_eq!(b[31], 0x01);
        assert_eq!(SackBits::from_bytes(&b), s);
    }

    #[test]
    fn shift_and_runs() {
        let mut s = SackBits::EMPTY;
        for i in [0, 1, 2, 5, 64, 65, 200, 255] {
            s.set(i);
        }
        assert_eq!(s.leading_run(), 3);
        assert_eq!(s.highest(), Some(255));
        s.shift_down(3);
        assert!(!s.get(0));
        assert!(s.get(2) && s.get(61) && s.get(62) && s.get(197) && s.get(252));
        assert_eq!(s.count(), 5);
        s.shift_down(70);
        assert_eq!(
            s.iter_set().collect::<heapless::Vec<_, 8>>().as_slice(),
            &[127, 182]
        );
        s.shift_down(300);
        assert!(s.is_empty());
    }

    #[test]
    fn full_run_and_out_of_range() {
        let mut s = SackBits::EMPTY;
        for i in 0..256 {
            s.set(i);
        }
        assert!(!s.set(256));
        assert!(!s.get(1000));
        assert_eq!(s.leading_run(), 256);
        s.clear(100);
        assert_eq!(s.leading_run(), 100);
    }
}
