//! The node's own small IP stack, on `smoltcp::wire`: it answers ARP and
//! ICMP echo so a node is reachable with `ping`, resolves peers' MAC
//! addresses, and sends echo requests for bring-up checks.
//!
//! smoltcp's `Interface` would also do this, but it wants every frame to go
//! through its sockets; the engine loop must hand MetaRoCE frames to the
//! transport in place, so it uses the wire `Repr`s directly and keeps its
//! own fixed-size neighbour cache.

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, Icmpv4Message, Icmpv4Packet, Icmpv4Repr, IpProtocol, Ipv4Address, Ipv4Packet,
    Ipv4Repr,
};

use metaroce_core::Instant;

use crate::device::MIN_FRAME_LEN;

/// Ethernet header length.
const ETH_LEN: usize = 14;
/// IPv4 header length without options.
const IPV4_LEN: usize = 20;

/// A node's link and network addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    pub mac: EthernetAddress,
    pub ip: Ipv4Address,
}

#[derive(Debug, Clone, Copy)]
struct Neighbor {
    ip: Ipv4Address,
    mac: EthernetAddress,
    /// Last time the entry was confirmed; `None` for static entries.
    seen: Option<Instant>,
}

/// A fixed-size IPv4 neighbour (ARP) cache with least-recently-seen
/// replacement. Static entries are never evicted.
#[derive(Debug)]
pub struct NeighborCache<const N: usize> {
    entries: [Option<Neighbor>; N],
}

impl<const N: usize> Default for NeighborCache<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> NeighborCache<N> {
    pub const fn new() -> Self {
        NeighborCache { entries: [None; N] }
    }

    /// The MAC address of `ip`, if known.
    pub fn lookup(&self, ip: Ipv4Address) -> Option<EthernetAddress> {
        self.entries
            .iter()
            .flatten()
            .find(|n| n.ip == ip)
            .map(|n| n.mac)
    }

    /// Adds an entry that is never evicted (configured peers).
    pub fn insert_static(&mut self, ip: Ipv4Address, mac: EthernetAddress) {
        self.insert(ip, mac, None);
    }

    /// Learns or refreshes `ip -> mac` at `now`.
    pub fn learn(&mut self, ip: Ipv4Address, mac: EthernetAddress, now: Instant) {
        if ip.is_unspecified() || ip.is_broadcast() || !mac.is_unicast() {
            return;
        }
        self.insert(ip, mac, Some(now));
    }

    fn insert(&mut self, ip: Ipv4Address, mac: EthernetAddress, seen: Option<Instant>) {
        if let Some(n) = self.entries.iter_mut().flatten().find(|n| n.ip == ip) {
            n.mac = mac;
            // A static entry stays static.
            n.seen = n.seen.and(seen);
            return;
        }
        let new = Some(Neighbor { ip, mac, seen });
        if let Some(free) = self.entries.iter_mut().find(|e| e.is_none()) {
            *free = new;
            return;
        }
        // Evict the least recently seen dynamic entry; if all are static,
        // the new dynamic entry is not kept.
        let victim = self
            .entries
            .iter_mut()
            .filter(|e| e.is_some_and(|n| n.seen.is_some()))
            .min_by_key(|e| e.and_then(|n| n.seen));
        if let Some(victim) = victim {
            *victim = new;
        } else if seen.is_none() {
            if let Some(last) = self.entries.last_mut() {
                *last = new;
            }
        }
    }
}

fn checksums() -> ChecksumCapabilities {
    ChecksumCapabilities::default()
}

/// Length of `len` bytes after padding to the Ethernet minimum.
pub fn padded(len: usize) -> usize {
    len.max(MIN_FRAME_LEN)
}

/// Writes an ARP frame into `out` (zero-padded to the Ethernet minimum) and
/// returns its length, or `None` if `out` is too short.
pub fn emit_arp(out: &mut [u8], eth_dst: EthernetAddress, repr: &ArpRepr) -> Option<usize> {
    let ArpRepr::EthernetIpv4 {
        source_hardware_addr,
        ..
    } = *repr
    else {
        return None;
    };
    let len = padded(ETH_LEN + repr.buffer_len());
    let out = out.get_mut(..len)?;
    out.fill(0);
    let mut eth = EthernetFrame::new_unchecked(&mut *out);
    EthernetRepr {
        src_addr: source_hardware_addr,
        dst_addr: eth_dst,
        ethertype: EthernetProtocol::Arp,
    }
    .emit(&mut eth);
    repr.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    Some(len)
}

/// An ARP request for `target` from `us`.
pub fn arp_request(us: &NetConfig, target: Ipv4Address) -> ArpRepr {
    ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: us.mac,
        source_protocol_addr: us.ip,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    }
}

/// Writes an IPv4/ICMP echo request or reply into `out` and returns its
/// length; `None` if `out` is too short or `icmp` is another message. The
/// node sends no other (it answers pings and pings its peers), and
/// smoltcp's emitter for every message is 0.7 KB of firmware code.
#[inline]
pub fn emit_icmp(
    out: &mut [u8],
    us: &NetConfig,
    dst_mac: EthernetAddress,
    dst_ip: Ipv4Address,
    icmp: &Icmpv4Repr,
) -> Option<usize> {
    let (message, ident, seq_no, data) = match *icmp {
        Icmpv4Repr::EchoRequest {
            ident,
            seq_no,
            data,
        } => (Icmpv4Message::EchoRequest, ident, seq_no, data),
        Icmpv4Repr::EchoReply {
            ident,
            seq_no,
            data,
        } => (Icmpv4Message::EchoReply, ident, seq_no, data),
        _ => return None,
    };
    let caps = checksums();
    let icmp_len = icmp.buffer_len();
    let len = padded(ETH_LEN + IPV4_LEN + icmp_len);
    let out = out.get_mut(..len)?;
    out.fill(0);
    let mut eth = EthernetFrame::new_unchecked(&mut *out);
    EthernetRepr {
        src_addr: us.mac,
        dst_addr: dst_mac,
        ethertype: EthernetProtocol::Ipv4,
    }
    .emit(&mut eth);
    let mut ip = Ipv4Packet::new_unchecked(eth.payload_mut());
    Ipv4Repr {
        src_addr: us.ip,
        dst_addr: dst_ip,
        next_header: IpProtocol::Icmp,
        payload_len: icmp_len,
        hop_limit: 64,
    }
    .emit(&mut ip, &caps);
    let mut packet = Icmpv4Packet::new_unchecked(&mut ip.payload_mut()[..icmp_len]);
    // What `Icmpv4Repr::emit` writes for an echo: the checksum last, over
    // the whole message (the buffer was zeroed).
    packet.set_msg_type(message);
    packet.set_msg_code(0);
    packet.set_echo_ident(ident);
    packet.set_echo_seq_no(seq_no);
    packet.data_mut().copy_from_slice(data);
    packet.fill_checksum();
    Some(len)
}

/// What a received non-transport frame asks of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// A reply of this length is in the reply buffer.
    Reply(usize),
    /// An echo reply to our own request arrived.
    EchoReply {
        ident: u16,
        seq_no: u16,
        sent: Option<Instant>,
    },
    /// Handled, nothing to send (ARP reply learned, unknown ICMP, ...).
    Consumed,
    /// Not addressed to this node.
    NotOurs,
    /// Malformed.
    Malformed,
}

/// Handles an ARP packet (`payload` of an Ethernet frame): learns the
/// sender if the packet targets us, and writes a reply to a request for our
/// address into `reply`.
pub fn handle_arp<const N: usize>(
    us: &NetConfig,
    cache: &mut NeighborCache<N>,
    payload: &[u8],
    now: Instant,
    reply: &mut [u8],
) -> Control {
    let Ok(packet) = ArpPacket::new_checked(payload) else {
        return Control::Malformed;
    };
    let Ok(repr) = ArpRepr::parse(&packet) else {
        return Control::Malformed;
    };
    let ArpRepr::EthernetIpv4 {
        operation,
        source_hardware_addr,
        source_protocol_addr,
        target_protocol_addr,
        ..
    } = repr
    else {
        return Control::Malformed;
    };
    if target_protocol_addr != us.ip {
        return Control::NotOurs;
    }
    cache.learn(source_protocol_addr, source_hardware_addr, now);
    if operation != ArpOperation::Request {
        return Control::Consumed;
    }
    let answer = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: us.mac,
        source_protocol_addr: us.ip,
        target_hardware_addr: source_hardware_addr,
        target_protocol_addr: source_protocol_addr,
    };
    match emit_arp(reply, source_hardware_addr, &answer) {
        Some(len) => Control::Reply(len),
        None => Control::Malformed,
    }
}

/// Handles an IPv4 packet carrying ICMP (`ip_bytes` is the Ethernet
/// payload, already checked to be IPv4 to us): answers echo requests,
/// reports echo replies.
pub fn handle_icmp(
    us: &NetConfig,
    src_mac: EthernetAddress,
    ip_bytes: &[u8],
    reply: &mut [u8],
) -> Control {
    let caps = checksums();
    let Ok(ip) = Ipv4Packet::new_checked(ip_bytes) else {
        return Control::Malformed;
    };
    let Ok(ip_repr) = Ipv4Repr::parse(&ip, &caps) else {
        return Control::Malformed;
    };
    let Ok(icmp) = Icmpv4Packet::new_checked(ip.payload()) else {
        return Control::Malformed;
    };
    let Ok(repr) = Icmpv4Repr::parse(&icmp, &caps) else {
        return Control::Malformed;
    };
    match repr {
        Icmpv4Repr::EchoRequest {
            ident,
            seq_no,
            data,
        } => {
            let answer = Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            };
            match emit_icmp(reply, us, src_mac, ip_repr.src_addr, &answer) {
                Some(len) => Control::Reply(len),
                None => Control::Malformed,
            }
        }
        Icmpv4Repr::EchoReply {
            ident,
            seq_no,
            data,
        } => {
            // Our requests carry their send time in the first 8 bytes.
            let sent = data
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(|b| Instant::from_nanos(u64::from_be_bytes(b)));
            Control::EchoReply {
                ident,
                seq_no,
                sent,
            }
        }
        _ => Control::Consumed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Ipv4Address {
        Ipv4Address::new(198, 18, 0, last)
    }

    fn mac(last: u8) -> EthernetAddress {
        EthernetAddress([0x02, 0, 0, 0, 0, last])
    }

    #[test]
    fn cache_evicts_least_recent_dynamic_entry() {
        let mut cache: NeighborCache<3> = NeighborCache::new();
        cache.insert_static(ip(1), mac(1));
        cache.learn(ip(2), mac(2), Instant::from_micros(1));
        cache.learn(ip(3), mac(3), Instant::from_micros(2));
        cache.learn(ip(2), mac(2), Instant::from_micros(3));
        cache.learn(ip(4), mac(4), Instant::from_micros(4));
        assert_eq!(cache.lookup(ip(1)), Some(mac(1)));
        assert_eq!(cache.lookup(ip(2)), Some(mac(2)));
        assert_eq!(cache.lookup(ip(3)), None);
        assert_eq!(cache.lookup(ip(4)), Some(mac(4)));
        cache.learn(ip(5), EthernetAddress::BROADCAST, Instant::from_micros(5));
        assert_eq!(cache.lookup(ip(5)), None);
    }

    /// `emit_icmp` writes an echo byte for byte as smoltcp's emitter does,
    /// and refuses any other message.
    #[test]
    fn icmp_echoes_match_smoltcp_and_nothing_else_is_sent() {
        let us = NetConfig {
            mac: mac(1),
            ip: ip(1),
        };
        let data: [u8; 13] = core::array::from_fn(|i| i as u8 * 7);
        for icmp in [
            Icmpv4Repr::EchoRequest {
                ident: 0x1234,
                seq_no: 7,
                data: &data,
            },
            Icmpv4Repr::EchoReply {
                ident: 0xfedc,
                seq_no: 0x8001,
                data: &data[..0],
            },
        ] {
            let mut ours = [0xa5u8; 128];
            let len = emit_icmp(&mut ours, &us, mac(2), ip(2), &icmp).unwrap();
            let mut theirs = ours;
            let at = ETH_LEN + IPV4_LEN;
            theirs[at..len].fill(0);
            let mut packet = Icmpv4Packet::new_unchecked(&mut theirs[at..at + icmp.buffer_len()]);
            icmp.emit(&mut packet, &checksums());
            assert_eq!(ours[..len], theirs[..len]);
        }
        let unreachable = Icmpv4Repr::DstUnreachable {
            reason: smoltcp::wire::Icmpv4DstUnreachable::PortUnreachable,
            header: Ipv4Repr {
                src_addr: ip(2),
                dst_addr: ip(1),
                next_header: IpProtocol::Udp,
                payload_len: 8,
                hop_limit: 64,
            },
            data: &data[..8],
        };
        let mut out = [0u8; 128];
        assert_eq!(emit_icmp(&mut out, &us, mac(2), ip(2), &unreachable), None);
    }
}
