//! ECMP: a switch picks one of several equal-cost output ports by hashing
//! the packet's 5-tuple (source and destination IP, protocol, source and
//! destination UDP port) with a per-switch salt, so one flow keeps one path
//! and transports spread over paths by varying the UDP source port.

use crate::rng::mix;

/// The fields an ECMP hash covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FiveTuple {
    pub src_ip: u32,
    pub dst_ip: u32,
    pub protocol: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// IP protocol number of UDP.
pub const UDP: u8 = 17;

impl FiveTuple {
    /// The 64-bit hash with `salt` (each switch its own, against
    /// polarisation: the same choice at every stage).
    pub fn hash(&self, salt: u64) -> u64 {
        let a = (u64::from(self.src_ip) << 32) | u64::from(self.dst_ip);
        let b = (u64::from(self.protocol) << 32)
            | (u64::from(self.src_port) << 16)
            | u64::from(self.dst_port);
        mix(mix(a ^ salt) ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

/// Index in `0..n` of the member chosen for `tuple` (0 when `n` is 0).
pub fn select(tuple: &FiveTuple, salt: u64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let n = n as u64;
    let h = tuple.hash(salt);
    // The same remainder; a mask where the group is a power of two (a
    // division per packet and switch otherwise).
    (if n.is_power_of_two() {
        h & (n - 1)
    } else {
        h % n
    }) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src_port: u16) -> FiveTuple {
        FiveTuple {
            src_ip: 0x0a00_0001,
            dst_ip: 0x0a00_0002,
            protocol: UDP,
            src_port,
            dst_port: 4795,
        }
    }

    #[test]
    fn stable_for_one_tuple() {
        let first = select(&tuple(50_000), 3, 8);
        assert!((0..100).all(|_| select(&tuple(50_000), 3, 8) == first));
    }

    #[test]
    fn distinct_source_ports_spread_evenly() {
        let mut counts = [0u32; 8];
        for port in 49_152..49_152 + 8_000u16 {
            counts[select(&tuple(port), 3, 8)] += 1;
        }
        // 1000 expected per member; allow a few standard deviations.
        assert!(
            counts.iter().all(|&c| (880..1_120).contains(&c)),
            "{counts:?}"
        );
        // 16 ports, as one MetaRoCE connection uses, reach most of 8 members.
        let used: std::collections::BTreeSet<usize> = (49_152..49_168u16)
            .map(|p| select(&tuple(p), 3, 8))
            .collect();
        assert!(used.len() >= 6, "{used:?}");
    }

    #[test]
    fn salt_changes_the_choice() {
        let differ = (49_152..49_252u16)
            .filter(|&p| select(&tuple(p), 1, 8) != select(&tuple(p), 2, 8))
            .count();
        assert!(differ > 70, "{differ}");
    }
}
