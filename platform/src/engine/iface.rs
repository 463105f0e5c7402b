//! The network interface of a frame link: this node's addresses, its
//! neighbour (ARP) cache, ARP and ICMP echo, and the Ethernet/IP/UDP
//! addressing of outgoing transport packets. Like smoltcp's `iface`, it
//! classifies each received frame once and hands a transport packet on
//! with what its headers said ([`Interface::accept`]); the transport
//! never sees a frame, and a datagram link (whose owner has these layers)
//! never sees this module.

use metaroce_core::api::{PeerAddr, RxMeta, Transmit};
use metaroce_core::wire::{encap, CrcVerdict, EncapRepr, IpPair};
use metaroce_core::Instant;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv4Repr, IpAddress, IpProtocol,
    Ipv4Address, Ipv4Packet,
};

use super::EngineStats;
use crate::device::{FrameDevice, RxVerdict, FRAME_SLOT_LEN};
use crate::net::{self, Control, NeighborCache, NetConfig};
use crate::probe;

/// ICMP identifier of this node's echo requests.
const PING_IDENT: u16 = 0x4d52;
/// Bytes of echo request payload (send time plus filler).
const PING_DATA_LEN: usize = 32;
/// Least time between two ARP requests.
const ARP_RETRY_NANOS: u64 = 10_000_000;

/// The last echo reply to [`crate::Engine::send_ping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EchoResult {
    pub seq_no: u16,
    pub rtt_nanos: u64,
}

/// Why a ping was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PingError {
    /// The peer's MAC is unknown; an ARP request was sent instead.
    Unresolved,
    /// The TX ring is full.
    DeviceBusy,
}

/// Where an outgoing transport packet goes on the wire, or why it cannot.
pub(super) enum Route {
    Frame(EncapRepr),
    /// The peer's MAC is unknown (an ARP request went out).
    NoNeighbor,
    /// An IPv6 peer: no neighbour discovery here.
    Unsendable,
}

/// Addresses, neighbours, ARP and ICMP of one node. `NEIGHBORS` is the ARP
/// cache size.
#[derive(Debug)]
pub(super) struct Interface<const NEIGHBORS: usize> {
    pub(super) net: NetConfig,
    pub(super) neighbors: NeighborCache<NEIGHBORS>,
    /// DSCP of transport packets.
    pub(super) dscp: u8,
    pub(super) last_echo: Option<EchoResult>,
    last_arp_request: Option<Instant>,
    reply_buf: [u8; FRAME_SLOT_LEN],
}

impl<const NEIGHBORS: usize> Interface<NEIGHBORS> {
    pub(super) fn new(net: NetConfig) -> Self {
        Interface {
            net,
            neighbors: NeighborCache::new(),
            dscp: 0,
            last_echo: None,
            last_arp_request: None,
            reply_buf: [0; FRAME_SLOT_LEN],
        }
    }

    /// Classifies one received frame and acts on it: a transport packet
    /// goes to `deliver` with its metadata and the device's CRC verdict,
    /// ARP and ICMP are answered (into the reply buffer). Returns what is
    /// left to do once the RX slot is released ([`Interface::settle`]).
    ///
    /// A transport frame's headers are parsed once
    /// (`encap::parse_frame_with`, after the Ethernet destination and
    /// type), its IPv4 header and UDP checksums verified unless the device
    /// vouched for them (`verdict.checksums`, spec 3.1.5: once per frame);
    /// only an IP frame that is not one is looked at again, as ICMP or
    /// someone else's.
    pub(super) fn accept(
        &mut self,
        now: Instant,
        frame: &[u8],
        verdict: RxVerdict,
        udp_port: u16,
        stats: &mut EngineStats,
        deliver: impl FnOnce(&mut EngineStats, &RxMeta, &[u8], CrcVerdict),
    ) -> Control {
        stats.rx_frames += 1;
        stats.rx_bytes += frame.len() as u64;
        probe::count(|p| p.rx_frames += 1);
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return Control::Malformed;
        };
        let dst = eth.dst_addr();
        if dst != self.net.mac && !dst.is_broadcast() {
            return Control::NotOurs;
        }
        let ethertype = eth.ethertype();
        if ethertype == EthernetProtocol::Arp {
            stats.rx_arp += 1;
            return net::handle_arp(
                &self.net,
                &mut self.neighbors,
                eth.payload(),
                now,
                &mut self.reply_buf,
            );
        }
        // The one parse of a transport frame's Ethernet, IP and UDP.
        let parsed = encap::parse_frame_with(frame, udp_port, &verdict.checksums.capabilities());
        probe::count(|p| p.rx_parses += 1);
        if let Ok((info, packet)) = parsed {
            if let IpPair::V4 { src, dst } = info.ip {
                if dst != self.net.ip {
                    return Control::NotOurs;
                }
                self.neighbors.learn(src, info.src_mac, now);
            }
            let meta = RxMeta {
                source: PeerAddr {
                    ip: info.ip.src(),
                    port: info.src_port,
                },
                ce: info.is_ce(),
            };
            deliver(stats, &meta, packet, verdict.crc);
            return Control::Consumed;
        }
        // Not a transport frame: ICMP, someone else's, or malformed.
        let transport_error = |parsed: Result<_, _>| match parsed {
            Err(metaroce_core::wire::Error::NotMetaRoce) => Control::NotOurs,
            _ => Control::Malformed,
        };
        match ethertype {
            EthernetProtocol::Ipv4 => {
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    return Control::Malformed;
                };
                if ip.dst_addr() != self.net.ip {
                    return Control::NotOurs;
                }
                match ip.next_header() {
                    IpProtocol::Icmp => {
                        stats.rx_icmp += 1;
                        let control = net::handle_icmp(
                            &self.net,
                            eth.src_addr(),
                            eth.payload(),
                            &mut self.reply_buf,
                        );
                        if let Control::Reply(_) = control {
                            stats.echo_replies_sent += 1;
                        }
                        control
                    }
                    IpProtocol::Udp => transport_error(parsed),
                    _ => Control::NotOurs,
                }
            }
            EthernetProtocol::Ipv6 => transport_error(parsed),
            _ => Control::NotOurs,
        }
    }

    /// What [`Interface::accept`] left to do: send its reply, note an echo
    /// reply, count.
    pub(super) fn settle<D: FrameDevice>(
        &mut self,
        control: Control,
        device: &mut D,
        now: Instant,
        stats: &mut EngineStats,
    ) {
        match control {
            Control::Reply(len) => {
                let _ = self.send_reply(device, len, stats);
            }
            Control::EchoReply {
                ident: PING_IDENT,
                seq_no,
                sent,
            } => {
                stats.echo_replies_received += 1;
                self.last_echo = Some(EchoResult {
                    seq_no,
                    rtt_nanos: sent
                        .map_or(0, |t| now.saturating_duration_since(t).as_nanos() as u64),
                });
            }
            Control::EchoReply { .. } | Control::Consumed => {}
            Control::NotOurs => stats.rx_not_ours += 1,
            Control::Malformed => stats.rx_malformed += 1,
        }
    }

    /// The Ethernet/IP/UDP addressing of `tx`; an ARP request for its peer
    /// if the peer's MAC is unknown.
    pub(super) fn route<D: FrameDevice>(
        &mut self,
        device: &mut D,
        tx: &Transmit,
        now: Instant,
        stats: &mut EngineStats,
    ) -> Route {
        let IpAddress::Ipv4(dst_ip) = tx.peer.ip else {
            return Route::Unsendable;
        };
        let Some(dst_mac) = self.neighbors.lookup(dst_ip) else {
            self.request_neighbor(device, dst_ip, now, stats);
            return Route::NoNeighbor;
        };
        Route::Frame(EncapRepr {
            src_mac: self.net.mac,
            dst_mac,
            ip: IpPair::V4 {
                src: self.net.ip,
                dst: dst_ip,
            },
            src_port: tx.src_port,
            dst_port: tx.peer.port,
            dscp: self.dscp,
            ecn: tx.ecn,
            hop_limit: 64,
        })
    }

    /// Sends an ICMP echo request to `dst` carrying the send time.
    pub(super) fn send_ping<D: FrameDevice>(
        &mut self,
        device: &mut D,
        dst: Ipv4Address,
        seq_no: u16,
        now: Instant,
        stats: &mut EngineStats,
    ) -> Result<(), PingError> {
        let Some(dst_mac) = self.neighbors.lookup(dst) else {
            self.request_neighbor(device, dst, now, stats);
            return Err(PingError::Unresolved);
        };
        let mut data = [0u8; PING_DATA_LEN];
        data[..8].copy_from_slice(&now.as_nanos().to_be_bytes());
        let repr = Icmpv4Repr::EchoRequest {
            ident: PING_IDENT,
            seq_no,
            data: &data,
        };
        let len = net::emit_icmp(&mut self.reply_buf, &self.net, dst_mac, dst, &repr)
            .ok_or(PingError::DeviceBusy)?;
        self.send_reply(device, len, stats)
            .ok_or(PingError::DeviceBusy)
    }

    /// Sends an ARP request for `ip`, at most once per `ARP_RETRY_NANOS`.
    fn request_neighbor<D: FrameDevice>(
        &mut self,
        device: &mut D,
        ip: Ipv4Address,
        now: Instant,
        stats: &mut EngineStats,
    ) {
        if self.last_arp_request.is_some_and(|t| {
            now.saturating_duration_since(t).as_nanos() < u128::from(ARP_RETRY_NANOS)
        }) {
            return;
        }
        let repr = net::arp_request(&self.net, ip);
        if let Some(len) = net::emit_arp(&mut self.reply_buf, EthernetAddress::BROADCAST, &repr) {
            if self.send_reply(device, len, stats).is_some() {
                stats.arp_requests += 1;
                self.last_arp_request = Some(now);
            }
        }
    }

    /// Sends `reply_buf[..len]`.
    fn send_reply<D: FrameDevice>(
        &mut self,
        device: &mut D,
        len: usize,
        stats: &mut EngineStats,
    ) -> Option<()> {
        let frame = self.reply_buf.get(..len)?;
        let sent = device.transmit(len, |slot| slot.copy_from_slice(frame));
        match sent {
            Some(()) => {
                stats.tx_frames += 1;
                stats.tx_bytes += len as u64;
            }
            None => stats.tx_reply_dropped += 1,
        }
        sent
    }
}
