//! The host gateway: a UDP socket on the host through which ordinary UDP
//! programs (the compliance suite, `metaroce` clients) reach a firmware
//! node inside the emulated fabric.
//!
//! * Host → node: each datagram arriving at the gateway socket becomes one
//!   Ethernet/IPv4/UDP frame from the gateway's address on the emulated
//!   subnet to the node's MetaRoCE port. The UDP source port is the host
//!   peer's source port (path entropy survives), and the IP ECN bits are
//!   those the peer set (read with `IP_RECVTOS`), so CE reaches the node.
//! * Node → host: each frame to the gateway's IP becomes one datagram sent
//!   from the gateway socket to `127.0.0.1:<the frame's UDP destination
//!   port>` with the frame's ECN bits as `IP_TOS`. The node's source port
//!   (its path entropy) is not kept: the host peer sees the gateway socket.
//! * ARP requests for the gateway's IP are answered.
//!
//! Frames are wrapped and unwrapped with `metaroce_core::wire::encap`
//! (`EncapRepr::emit`, `parse_frame`); both directions pass through the
//! fabric's switch, so the run's pcap records them. IPv4 only.

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use metaroce_core::wire::encap::{parse_frame, EncapRepr, IpPair, ETHERNET_HEADER_LEN};
use metaroce_platform::net::emit_arp;
use nix::sys::socket::{
    recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrIn, SockaddrStorage,
};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
};

/// Where the gateway sits and which node it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewaySpec {
    /// The host address to bind (port 0: any free port).
    pub listen: SocketAddr,
    /// The gateway's own addresses on the emulated subnet.
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    /// The node host datagrams go to, and its MetaRoCE UDP port (0: the
    /// gateway's own port, so the port the node announces in its ACCEPT
    /// is the one host peers reach it on).
    pub node_ip: Ipv4Addr,
    pub node_mac: [u8; 6],
    pub node_port: u16,
}

/// Counters of the gateway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatewayStats {
    pub to_node: u64,
    pub to_host: u64,
    pub arp_replies: u64,
    /// Frames to the gateway that were not IPv4/UDP or ARP for it.
    pub ignored: u64,
}

/// The gateway's socket and addresses (shared by its receive thread and
/// the switch, which delivers frames to it).
#[derive(Debug)]
pub struct Gateway {
    pub spec: GatewaySpec,
    socket: UdpSocket,
    pub stats: GatewayStats,
}

/// The UDP destination port of an IPv4/UDP Ethernet frame.
fn udp_dst_port(frame: &[u8]) -> Option<u16> {
    let ip = frame.get(ETHERNET_HEADER_LEN..)?;
    if frame.get(12..14)? != [0x08, 0x00] || *ip.get(9)? != 17 {
        return None;
    }
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    let port = ip.get(ihl + 2..ihl + 4)?;
    Some(u16::from_be_bytes([port[0], port[1]]))
}

impl Gateway {
    /// Binds the gateway socket with `IP_RECVTOS`.
    pub fn bind(mut spec: GatewaySpec) -> std::io::Result<Gateway> {
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        socket.set_recv_tos_v4(true)?;
        socket.bind(&spec.listen.into())?;
        let socket: UdpSocket = socket.into();
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        if spec.node_port == 0 {
            spec.node_port = socket.local_addr()?.port();
        }
        Ok(Gateway {
            spec,
            socket,
            stats: GatewayStats::default(),
        })
    }

    /// The bound host address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// A second handle on the socket, for the receive thread.
    pub fn receiver(&self) -> std::io::Result<GatewayReceiver> {
        Ok(GatewayReceiver {
            spec: self.spec,
            socket: self.socket.try_clone()?,
        })
    }

    /// Takes a frame the switch delivered to the gateway's port; returns a
    /// frame to send back into the fabric (an ARP reply), if any.
    pub fn deliver(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        if let Some(reply) = self.arp_reply(frame) {
            self.stats.arp_replies += 1;
            return Some(reply);
        }
        let forwarded = udp_dst_port(frame)
            .and_then(|port| parse_frame(frame, port).ok())
            .filter(|(info, _)| info.ip.dst() == smoltcp::wire::IpAddress::Ipv4(self.spec.ip))
            .map(|(info, payload)| {
                let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, info.dst_port);
                self.send_to_host(payload, to, info.ecn)
            });
        match forwarded {
            Some(()) => self.stats.to_host += 1,
            None => self.stats.ignored += 1,
        }
        None
    }

    fn send_to_host(&self, payload: &[u8], to: SocketAddrV4, ecn: u8) {
        let tos = ecn & 0b11;
        let iov = [IoSlice::new(payload)];
        let dest = SockaddrIn::from(to);
        // A host peer that went away (port unreachable) is not an error of
        // the gateway; the node's transport sees a loss.
        let _ = sendmsg(
            self.socket.as_raw_fd(),
            &iov,
            &[ControlMessage::Ipv4Tos(&tos)],
            MsgFlags::empty(),
            Some(&dest),
        );
    }

    fn arp_reply(&self, frame: &[u8]) -> Option<Vec<u8>> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != EthernetProtocol::Arp {
            return None;
        }
        let repr = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).ok()?).ok()?;
        let ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } = repr
        else {
            return None;
        };
        if target_protocol_addr != self.spec.ip {
            return None;
        }
        let reply = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: EthernetAddress(self.spec.mac),
            source_protocol_addr: self.spec.ip,
            target_hardware_addr: source_hardware_addr,
            target_protocol_addr: source_protocol_addr,
        };
        let mut out = vec![0u8; 64];
        let len = emit_arp(&mut out, source_hardware_addr, &reply)?;
        out.truncate(len);
        Some(out)
    }
}

/// The gateway's receive side: host datagrams in, frames out.
#[derive(Debug)]
pub struct GatewayReceiver {
    spec: GatewaySpec,
    socket: UdpSocket,
}

impl GatewayReceiver {
    /// Waits up to the socket's read timeout for one host datagram and
    /// returns it as a frame towards the node.
    pub fn next_frame(&self, buf: &mut [u8]) -> Option<Vec<u8>> {
        let mut cmsg = nix::cmsg_space!(i32, i32);
        let (n, tos, from) = {
            let mut iov = [IoSliceMut::new(buf)];
            let msg = recvmsg::<SockaddrStorage>(
                self.socket.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            )
            .ok()?;
            let mut tos = 0u8;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::Ipv4Tos(t) = c {
                        tos = t;
                    }
                }
            }
            let from = msg
                .address
                .and_then(|a| a.as_sockaddr_in().map(|s| s.port()))?;
            (msg.bytes, tos, from)
        };
        self.frame(&buf[..n], from, tos)
    }

    /// The frame carrying `payload` from host port `src_port` with `tos`.
    pub fn frame(&self, payload: &[u8], src_port: u16, tos: u8) -> Option<Vec<u8>> {
        let repr = EncapRepr {
            src_mac: EthernetAddress(self.spec.mac),
            dst_mac: EthernetAddress(self.spec.node_mac),
            ip: IpPair::V4 {
                src: self.spec.ip,
                dst: self.spec.node_ip,
            },
            src_port,
            dst_port: self.spec.node_port,
            dscp: tos >> 2,
            ecn: tos & 0b11,
            hop_limit: 64,
        };
        let mut frame = vec![0u8; repr.frame_len(payload.len())];
        let len = repr
            .emit(&mut frame, payload.len(), |dst| {
                dst.copy_from_slice(payload)
            })
            .ok()?;
        frame.truncate(len);
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metaroce_core::wire::encap::ecn;

    fn spec() -> GatewaySpec {
        GatewaySpec {
            listen: "127.0.0.1:0".parse().unwrap(),
            ip: Ipv4Addr::new(198, 18, 0, 254),
            mac: [2, 0, 0, 0, 0, 0xfe],
            node_ip: Ipv4Addr::new(198, 18, 0, 1),
            node_mac: [2, 0, 0, 0, 0, 1],
            node_port: 4795,
        }
    }

    /// A host datagram becomes a frame the node parses (ports, CE), and a
    /// frame from the node to the gateway comes out as a datagram to the
    /// host port it names.
    #[test]
    fn wraps_and_unwraps() {
        let mut gw = Gateway::bind(spec()).unwrap();
        let rx = gw.receiver().unwrap();
        let frame = rx.frame(b"hello", 40000, ecn::CE).unwrap();
        let (info, payload) = parse_frame(&frame, 4795).unwrap();
        assert_eq!(payload, b"hello");
        assert_eq!(info.src_port, 40000);
        assert!(info.is_ce());

        let host = UdpSocket::bind("127.0.0.1:0").unwrap();
        host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let host_port = host.local_addr().unwrap().port();
        let back = info.reply(50000, host_port, ecn::ECT0);
        let mut out = vec![0u8; back.frame_len(3)];
        back.emit(&mut out, 3, |d| d.copy_from_slice(b"abc"))
            .unwrap();
        assert_eq!(gw.deliver(&out), None);
        let mut buf = [0u8; 64];
        let (n, from) = host.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"abc");
        assert_eq!(from, gw.local_addr().unwrap());
        assert_eq!(gw.stats.to_host, 1);

        // The host's datagram, with the TOS it set, arrives as a frame.
        let sock = socket2::SockRef::from(&host);
        sock.set_tos_v4(u32::from(ecn::CE)).unwrap();
        host.send_to(b"xyz", gw.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 2048];
        let frame = rx.next_frame(&mut buf).unwrap();
        let (info, payload) = parse_frame(&frame, 4795).unwrap();
        assert_eq!(payload, b"xyz");
        assert_eq!(info.src_port, host_port);
        assert!(info.is_ce());
    }

    #[test]
    fn answers_arp_for_its_address_only() {
        let gw = Gateway::bind(spec()).unwrap();
        let node = EthernetAddress([2, 0, 0, 0, 0, 1]);
        let ask = |target: Ipv4Addr| {
            let req = ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Request,
                source_hardware_addr: node,
                source_protocol_addr: Ipv4Addr::new(198, 18, 0, 1),
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: target,
            };
            let mut f = vec![0u8; 64];
            let n = emit_arp(&mut f, EthernetAddress::BROADCAST, &req).unwrap();
            f.truncate(n);
            f
        };
        let reply = gw.arp_reply(&ask(Ipv4Addr::new(198, 18, 0, 254))).unwrap();
        let eth = EthernetFrame::new_checked(&reply[..]).unwrap();
        assert_eq!(eth.dst_addr(), node);
        let repr = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
        assert!(matches!(
            repr,
            ArpRepr::EthernetIpv4 {
                operation: ArpOperation::Reply,
                source_hardware_addr: EthernetAddress([2, 0, 0, 0, 0, 0xfe]),
                ..
            }
        ));
        assert!(gw.arp_reply(&ask(Ipv4Addr::new(198, 18, 0, 9))).is_none());
    }
}
