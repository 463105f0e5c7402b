//! A switch's per-port output queue: a finite FIFO in bytes with drop-tail,
//! and ECN marking on enqueue, either DCTCP-style (mark every ECN-capable
//! packet while the queue holds more than `K` bytes) or RED-style (mark with
//! a probability rising linearly from 0 at `min` to `pmax` at `max`, every
//! packet above `max`), the two schemes the DCTCP and DCQCN papers
//! configure switches with. Packets that are not ECN-capable are never
//! marked; they only meet the drop-tail limit.

use std::collections::VecDeque;

use metaroce_core::wire::encap::ecn;

use crate::packet::Packet;
use crate::rng::SimRng;

/// How a queue marks Congestion Experienced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EcnPolicy {
    /// Never marks.
    Off,
    /// DCTCP: mark when the queue (before this packet) exceeds `k_bytes`.
    Threshold { k_bytes: u64 },
    /// RED on the instantaneous queue: probability 0 at `min_bytes`,
    /// `pmax` at `max_bytes`, 1 above.
    Red {
        min_bytes: u64,
        max_bytes: u64,
        pmax: f64,
    },
}

/// An output queue's limits and marking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueConfig {
    /// Buffer per port in bytes (frame bytes on the wire); a packet that
    /// does not fit is dropped (drop-tail).
    pub capacity_bytes: u64,
    pub ecn: EcnPolicy,
}

impl Default for QueueConfig {
    /// 1 MiB per port and a DCTCP threshold of 100 KB: about 8 us of
    /// queueing at 100 Gbit/s, near one fabric round trip. Chosen for this
    /// simulator, not taken from a particular switch.
    fn default() -> Self {
        QueueConfig {
            capacity_bytes: 1 << 20,
            ecn: EcnPolicy::Threshold { k_bytes: 100_000 },
        }
    }
}

/// What happened to an offered packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Queued unchanged.
    Queued,
    /// Queued with CE set.
    Marked,
    /// Dropped: the buffer was full.
    Dropped,
}

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub enqueued: u64,
    pub marked: u64,
    pub dropped: u64,
    /// Largest occupancy seen, bytes.
    pub max_bytes: u64,
}

/// A FIFO of packets bounded in bytes.
#[derive(Debug, Clone)]
pub struct OutputQueue {
    config: QueueConfig,
    packets: VecDeque<(Packet, u64)>,
    bytes: u64,
    stats: QueueStats,
}

impl OutputQueue {
    /// An empty queue.
    pub fn new(config: QueueConfig) -> Self {
        OutputQueue {
            config,
            packets: VecDeque::new(),
            bytes: 0,
            stats: QueueStats::default(),
        }
    }

    /// Offers a packet of `wire_len` bytes; `rng` decides RED marks.
    pub fn enqueue(&mut self, mut packet: Packet, wire_len: u64, rng: &mut SimRng) -> Enqueued {
        if self.bytes + wire_len > self.config.capacity_bytes {
            self.stats.dropped += 1;
            return Enqueued::Dropped;
        }
        let mut result = Enqueued::Queued;
        let capable = packet.ecn == ecn::ECT0 || packet.ecn == ecn::ECT1;
        if capable && self.should_mark(rng) {
            packet.ecn = ecn::CE;
            self.stats.marked += 1;
            result = Enqueued::Marked;
        }
        self.bytes += wire_len;
        self.stats.enqueued += 1;
        self.stats.max_bytes = self.stats.max_bytes.max(self.bytes);
        self.packets.push_back((packet, wire_len));
        result
    }

    fn should_mark(&self, rng: &mut SimRng) -> bool {
        let q = self.bytes;
        match self.config.ecn {
            EcnPolicy::Off => false,
            EcnPolicy::Threshold { k_bytes } => q > k_bytes,
            EcnPolicy::Red {
                min_bytes,
                max_bytes,
                pmax,
            } => {
                if q <= min_bytes {
                    false
                } else if q > max_bytes {
                    true
                } else {
                    let span = max_bytes.saturating_sub(min_bytes).max(1) as f64;
                    rng.chance(pmax * (q - min_bytes) as f64 / span)
                }
            }
        }
    }

    /// Removes the packet at the head, with its wire length.
    pub fn dequeue(&mut self) -> Option<(Packet, u64)> {
        let (p, len) = self.packets.pop_front()?;
        self.bytes -= len;
        Some((p, len))
    }

    /// Bytes queued.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Packets queued.
    pub fn len(&self) -> usize {
        self.packets.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(ecn: u8) -> Packet {
        Packet {
            src: 0,
            dst: 1,
            src_port: 49152,
            dst_port: 4795,
            ecn,
            bytes: Vec::new(),
        }
    }

    #[test]
    fn drop_tail_at_capacity() {
        let mut rng = SimRng::new(1);
        let mut q = OutputQueue::new(QueueConfig {
            capacity_bytes: 10_000,
            ecn: EcnPolicy::Off,
        });
        for _ in 0..2 {
            assert_eq!(q.enqueue(pkt(ecn::ECT0), 4_000, &mut rng), Enqueued::Queued);
        }
        // 8000 + 4000 > 10000: the third is dropped, a smaller one still fits.
        assert_eq!(
            q.enqueue(pkt(ecn::ECT0), 4_000, &mut rng),
            Enqueued::Dropped
        );
        assert_eq!(q.enqueue(pkt(ecn::ECT0), 2_000, &mut rng), Enqueued::Queued);
        assert_eq!(q.bytes(), 10_000);
        assert_eq!(q.enqueue(pkt(ecn::ECT0), 1, &mut rng), Enqueued::Dropped);
        assert_eq!(q.dequeue().map(|(_, l)| l), Some(4_000));
        assert_eq!(q.bytes(), 6_000);
        assert_eq!(q.enqueue(pkt(ecn::ECT0), 4_000, &mut rng), Enqueued::Queued);
        let s = q.stats();
        assert_eq!((s.enqueued, s.dropped, s.max_bytes), (4, 2, 10_000));
    }

    #[test]
    fn threshold_marks_only_above_k_and_only_ect() {
        let mut rng = SimRng::new(1);
        let mut q = OutputQueue::new(QueueConfig {
            capacity_bytes: 1 << 20,
            ecn: EcnPolicy::Threshold { k_bytes: 8_000 },
        });
        // Queue before each offer: 0, 4000, 8000 (not above K), 12000 (above).
        let got: Vec<Enqueued> = (0..4)
            .map(|_| q.enqueue(pkt(ecn::ECT0), 4_000, &mut rng))
            .collect();
        assert_eq!(
            got,
            [
                Enqueued::Queued,
                Enqueued::Queued,
                Enqueued::Queued,
                Enqueued::Marked
            ]
        );
        assert_eq!(
            q.enqueue(pkt(ecn::NOT_ECT), 4_000, &mut rng),
            Enqueued::Queued
        );
        let marks: Vec<u8> = core::iter::from_fn(|| q.dequeue().map(|(p, _)| p.ecn)).collect();
        assert_eq!(
            marks,
            [ecn::ECT0, ecn::ECT0, ecn::ECT0, ecn::CE, ecn::NOT_ECT]
        );
        assert_eq!(q.stats().marked, 1);
    }

    #[test]
    fn red_probability_rises_between_min_and_max() {
        let config = QueueConfig {
            capacity_bytes: 1 << 30,
            ecn: EcnPolicy::Red {
                min_bytes: 10_000,
                max_bytes: 110_000,
                pmax: 0.2,
            },
        };
        let mut rng = SimRng::new(9);
        // Fraction marked when offered at a fixed occupancy.
        let mut fraction_at = |occupancy: u64| {
            let mut q = OutputQueue::new(config);
            if occupancy > 0 {
                q.enqueue(pkt(ecn::NOT_ECT), occupancy, &mut rng);
            }
            let marked = (0..4_000)
                .filter(|_| {
                    let r = q.enqueue(pkt(ecn::ECT0), 0, &mut rng);
                    r == Enqueued::Marked
                })
                .count();
            marked as f64 / 4_000.0
        };
        assert_eq!(fraction_at(5_000), 0.0);
        let mid = fraction_at(60_000);
        assert!((0.08..0.12).contains(&mid), "{mid}");
        assert_eq!(fraction_at(200_000), 1.0);
    }
}
