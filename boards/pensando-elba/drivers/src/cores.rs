//! Where each core's share of the board lives: its doorbell words and
//! frame rings in the ring region, and its slice of
//! the DMA window, all from `board.toml` (`[cores]`, `[rings]`,
//! `[host_memory]`); and which MPIDR names which core. Every core runs its
//! own engine loop over its own share, so nothing is shared between cores
//! on the data path.

use crate::board;

/// One core's share (offsets from `board::RINGS_BASE`, addresses as
/// given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreLayout {
    pub rx_doorbell: usize,
    pub tx_doorbell: usize,
    pub rx_ring: usize,
    /// Bytes from the rx ring to the tx ring (what the rx ring may use).
    pub rx_ring_len: usize,
    pub tx_ring: usize,
    /// Bytes the tx ring may use (to the next core's rx ring).
    pub tx_ring_len: usize,
    /// The core's slice of the DMA window: local address, the host's
    /// address for it, and its length.
    pub host_memory_local: usize,
    pub host_memory_host: u64,
    pub host_memory_len: usize,
}

/// Bytes of the DMA window each core gets (4 KiB aligned).
pub const HOST_MEMORY_PER_CORE: usize = (board::HOST_MEMORY_SIZE / board::CORE_COUNT) & !0xfff;

/// Core `core`'s share, or `None` past `board::CORE_COUNT`.
pub const fn layout(core: usize) -> Option<CoreLayout> {
    if core >= board::CORE_COUNT {
        return None;
    }
    let rx_ring = board::RX_RING_OFFSET + core * board::CORE_RING_STRIDE;
    let tx_ring = board::TX_RING_OFFSET + core * board::CORE_RING_STRIDE;
    Some(CoreLayout {
        rx_doorbell: board::RX_DOORBELL_OFFSET + core * board::DOORBELL_STRIDE,
        tx_doorbell: board::TX_DOORBELL_OFFSET + core * board::DOORBELL_STRIDE,
        rx_ring,
        rx_ring_len: board::TX_RING_OFFSET - board::RX_RING_OFFSET,
        tx_ring,
        tx_ring_len: board::RX_RING_OFFSET + board::CORE_RING_STRIDE - board::TX_RING_OFFSET,
        host_memory_local: board::HOST_MEMORY_LOCAL_BASE + core * HOST_MEMORY_PER_CORE,
        host_memory_host: board::HOST_MEMORY_HOST_ADDRESS + (core * HOST_MEMORY_PER_CORE) as u64,
        host_memory_len: HOST_MEMORY_PER_CORE,
    })
}

/// The MPIDR affinity of core `core`: Aff1 the cluster, Aff0 the core in it.
pub const fn mpidr_of(core: usize) -> u64 {
    (((core / board::CORES_PER_CLUSTER) as u64) << 8) | (core % board::CORES_PER_CLUSTER) as u64
}

/// The core an MPIDR (affinity bits) names, if it is one of ours.
pub const fn core_of_mpidr(mpidr: u64) -> Option<usize> {
    let cluster = ((mpidr >> 8) & 0xff) as usize;
    let within = (mpidr & 0xff) as usize;
    if within >= board::CORES_PER_CLUSTER || mpidr >> 16 != 0 {
        return None;
    }
    let core = cluster * board::CORES_PER_CLUSTER + within;
    if core < board::CORE_COUNT {
        Some(core)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn core_zero_keeps_the_single_core_layout() {
        let l = layout(0).unwrap();
        assert_eq!(l.rx_doorbell, board::RX_DOORBELL_OFFSET);
        assert_eq!(l.tx_doorbell, board::TX_DOORBELL_OFFSET);
        assert_eq!(l.rx_ring, board::RX_RING_OFFSET);
        assert_eq!(l.tx_ring, board::TX_RING_OFFSET);
        assert_eq!(l.host_memory_local, board::HOST_MEMORY_LOCAL_BASE);
        assert_eq!(l.host_memory_host, board::HOST_MEMORY_HOST_ADDRESS);
        assert!(layout(board::CORE_COUNT).is_none());
    }

    #[test]
    fn every_core_has_its_own_share_inside_the_regions() {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for core in 0..board::CORE_COUNT {
            let l = layout(core).unwrap();
            spans.extend([
                (l.rx_doorbell / 64 * 64, 64),
                (l.tx_doorbell / 64 * 64, 64),
                (l.rx_ring, l.rx_ring_len),
                (l.tx_ring, l.tx_ring_len),
            ]);
            let ring_bytes =
                |slots: u32| board::RING_HEADER_BYTES + slots as usize * board::FRAME_SLOT_BYTES;
            assert!(ring_bytes(board::RX_SLOTS) <= l.rx_ring_len);
            assert!(ring_bytes(board::TX_SLOTS) <= l.tx_ring_len);
            assert!(l.tx_ring + l.tx_ring_len <= board::RINGS_SIZE);
            assert!(
                l.host_memory_local + l.host_memory_len
                    <= board::HOST_MEMORY_LOCAL_BASE + board::HOST_MEMORY_SIZE
            );
        }
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{pair:x?} overlap");
        }
    }

    #[test]
    fn mpidr_names_each_core_once() {
        for core in 0..board::CORE_COUNT {
            assert_eq!(core_of_mpidr(mpidr_of(core)), Some(core));
        }
        // Elba: 4 clusters of 4.
        assert_eq!(mpidr_of(5), 0x101);
        assert_eq!(core_of_mpidr(0x4), None, "no fifth core in a cluster");
        assert_eq!(core_of_mpidr(0x1_0000), None, "Aff2 is not used");
    }
}
