//! Ethernet / IPv4 or IPv6 / UDP encapsulation (spec 3.1), on `smoltcp::wire`.
//!
//! The UDP source port carries the logical path's entropy, so switches that
//! hash the 5-tuple spread paths over their ECMP next hops. Data packets are
//! sent ECN-capable (ECT(0)); the fabric may rewrite that to CE, which the
//! receiver reads here and echoes per path in its ACKs.
//!
//! **Checksums** (spec 3.1.5) are taken from the device, as smoltcp's
//! interface takes them: [`EncapRepr::emit_with`] and [`parse_frame_with`]
//! take a [`ChecksumCapabilities`] saying which of the IPv4 header and UDP
//! checksums software computes on transmit (`tx`) and verifies on receive
//! (`rx`); the rest the device does, or, on receive, has done for this
//! frame. [`EncapRepr::emit`] and [`parse_frame`] do everything in
//! software ([`software_checksums`]).

pub use smoltcp::phy::{Checksum, ChecksumCapabilities};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Address,
    Ipv4Packet, Ipv4Repr, Ipv6Address, Ipv6Packet, Ipv6Repr, UdpPacket,
};

use super::{Error, Result};

/// ECN codepoints of the IP header's two ECN bits (RFC 3168).
pub mod ecn {
    /// Not ECN-capable transport.
    pub const NOT_ECT: u8 = 0b00;
    /// ECN-capable transport (1).
    pub const ECT1: u8 = 0b01;
    /// ECN-capable transport (0): what MetaRoCE data packets carry.
    pub const ECT0: u8 = 0b10;
    /// Congestion experienced.
    pub const CE: u8 = 0b11;
}

/// Length of an Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of an IPv6 header without extension headers.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// Source and destination IP addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IpPair {
    V4 { src: Ipv4Address, dst: Ipv4Address },
    V6 { src: Ipv6Address, dst: Ipv6Address },
}

impl IpPair {
    /// Source address.
    pub fn src(&self) -> IpAddress {
        match *self {
            IpPair::V4 { src, .. } => IpAddress::Ipv4(src),
            IpPair::V6 { src, .. } => IpAddress::Ipv6(src),
        }
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddress {
        match *self {
            IpPair::V4 { dst, .. } => IpAddress::Ipv4(dst),
            IpPair::V6 { dst, .. } => IpAddress::Ipv6(dst),
        }
    }

    /// The same pair seen from the other end.
    pub fn reversed(&self) -> IpPair {
        match *self {
            IpPair::V4 { src, dst } => IpPair::V4 { src: dst, dst: src },
            IpPair::V6 { src, dst } => IpPair::V6 { src: dst, dst: src },
        }
    }

    fn header_len(&self) -> usize {
        match self {
            IpPair::V4 { .. } => IPV4_HEADER_LEN,
            IpPair::V6 { .. } => IPV6_HEADER_LEN,
        }
    }
}

/// The checksum of an IPv4 header without options whose checksum field
/// is zero (RFC 1071): its five 32-bit words summed and folded to 16 bits,
/// not ten 16-bit additions.
fn ipv4_header_checksum(header: &[u8; IPV4_HEADER_LEN]) -> u16 {
    let word = |i: usize| {
        u64::from(u32::from_be_bytes([
            header[i],
            header[i + 1],
            header[i + 2],
            header[i + 3],
        ]))
    };
    let sum = word(0) + word(4) + word(8) + word(12) + word(16);
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// What to put around a MetaRoCE packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EncapRepr {
    pub src_mac: EthernetAddress,
    pub dst_mac: EthernetAddress,
    pub ip: IpPair,
    /// Path entropy.
    pub src_port: u16,
    /// The peer's MetaRoCE port ([`super::DEFAULT_UDP_PORT`] by default).
    pub dst_port: u16,
    /// Differentiated services codepoint (6 bits).
    pub dscp: u8,
    /// ECN codepoint (2 bits), see [`ecn`].
    pub ecn: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
}

/// What the receiver learns from the encapsulation of a MetaRoCE frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FrameInfo {
    pub src_mac: EthernetAddress,
    pub dst_mac: EthernetAddress,
    pub ip: IpPair,
    pub src_port: u16,
    pub dst_port: u16,
    pub dscp: u8,
    pub ecn: u8,
    pub hop_limit: u8,
}

impl FrameInfo {
    /// Whether the fabric marked this frame Congestion Experienced.
    pub fn is_ce(&self) -> bool {
        self.ecn == ecn::CE
    }

    /// The encapsulation of a reply: addresses swapped, sent from `src_port`
    /// (the replier's path entropy) to the peer's MetaRoCE port `dst_port`
    /// (not to this frame's source port, which is the sender's entropy).
    pub fn reply(&self, src_port: u16, dst_port: u16, ecn_codepoint: u8) -> EncapRepr {
        EncapRepr {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            ip: self.ip.reversed(),
            src_port,
            dst_port,
            dscp: self.dscp,
            ecn: ecn_codepoint,
            hop_limit: 64,
        }
    }
}

/// The same [`Checksum`] for the IPv4 header and UDP, the two checksums
/// of a MetaRoCE frame.
fn ip_and_udp(checksum: Checksum) -> ChecksumCapabilities {
    let mut caps = ChecksumCapabilities::default();
    caps.ipv4 = checksum;
    caps.udp = checksum;
    caps
}

/// Every checksum computed on transmit and verified on receive in
/// software (smoltcp's default): what a device without checksum offload
/// leaves to the engine, and what [`EncapRepr::emit`] and [`parse_frame`]
/// do.
pub fn software_checksums() -> ChecksumCapabilities {
    ChecksumCapabilities::default()
}

/// The IPv4 header and UDP checksums computed on transmit but not verified
/// on receive: for a received frame whose checksums were verified already,
/// or that never left memory since its sender computed them (as Linux's
/// loopback and veth hand on their frames).
pub fn rx_verified_checksums() -> ChecksumCapabilities {
    ip_and_udp(Checksum::Tx)
}

/// Every checksum computed on transmit; on receive the IPv4 header's
/// verified, the UDP checksum not: for a frame whose UDP checksum a device
/// validated (checksum offload, Linux's `CHECKSUM_UNNECESSARY`, virtio's
/// `DATA_VALID`), which says nothing of the IP header's.
pub fn rx_udp_verified_checksums() -> ChecksumCapabilities {
    let mut caps = software_checksums();
    caps.udp = Checksum::Tx;
    caps
}

/// The IPv4 header checksum computed on transmit, the UDP checksum left
/// zero for the device to compute (a NIC's checksum offload, Linux's
/// `NETIF_F_HW_CSUM`); on receive both verified. What
/// [`EncapRepr::emit_with`] takes for a device that computes UDP
/// checksums.
pub fn udp_tx_offloaded_checksums() -> ChecksumCapabilities {
    let mut caps = software_checksums();
    caps.udp = Checksum::Rx;
    caps
}

impl EncapRepr {
    /// Bytes of Ethernet, IP and UDP headers.
    pub fn header_len(&self) -> usize {
        ETHERNET_HEADER_LEN + self.ip.header_len() + UDP_HEADER_LEN
    }

    /// Frame length for a transport packet of `transport_len` bytes (before
    /// any padding to the Ethernet minimum, which the device adds).
    pub fn frame_len(&self, transport_len: usize) -> usize {
        self.header_len() + transport_len
    }

    /// Writes a whole frame into `frame[..frame_len(transport_len)]`: headers,
    /// then `fill_transport` writes the MetaRoCE packet into the UDP payload,
    /// then the IP and UDP checksums are computed. Returns the frame length,
    /// or `Error::BadLength` if it does not fit in `frame` or in a UDP datagram.
    pub fn emit(
        &self,
        frame: &mut [u8],
        transport_len: usize,
        fill_transport: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        self.emit_with(frame, transport_len, &software_checksums(), fill_transport)
    }

    /// [`EncapRepr::emit`] for a device that computes some checksums
    /// itself: those `caps` does not mark `tx` are left zero, for the
    /// device to fill.
    pub fn emit_with(
        &self,
        frame: &mut [u8],
        transport_len: usize,
        caps: &ChecksumCapabilities,
        fill_transport: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        let total = self.frame_len(transport_len);
        let udp_len = UDP_HEADER_LEN + transport_len;
        if total > frame.len() || udp_len > usize::from(u16::MAX) - IPV6_HEADER_LEN {
            return Err(Error::BadLength);
        }
        let frame = &mut frame[..total];
        let ethertype = match self.ip {
            IpPair::V4 { .. } => EthernetProtocol::Ipv4,
            IpPair::V6 { .. } => EthernetProtocol::Ipv6,
        };
        let (eth, ip_bytes) = frame.split_at_mut(ETHERNET_HEADER_LEN);
        eth[..6].copy_from_slice(&self.dst_mac.0);
        eth[6..12].copy_from_slice(&self.src_mac.0);
        eth[12..].copy_from_slice(&u16::from(ethertype).to_be_bytes());
        match self.ip {
            IpPair::V4 { src: s, dst: d } => {
                // The header written whole, as smoltcp's `Ipv4Repr::emit`
                // writes it (tests compare the two), DSCP and ECN set and
                // the checksum summed once: no field-by-field
                // read-modify-write on the path every data packet takes.
                // Don't fragment: MetaRoCE sizes packets to the path MTU.
                let (header, udp_bytes) = ip_bytes.split_at_mut(IPV4_HEADER_LEN);
                let [len_hi, len_lo] = ((IPV4_HEADER_LEN + udp_len) as u16).to_be_bytes();
                let [s0, s1, s2, s3] = s.octets();
                let [d0, d1, d2, d3] = d.octets();
                let mut h = [
                    0x45,
                    ((self.dscp & 0x3f) << 2) | (self.ecn & 0b11),
                    len_hi,
                    len_lo,
                    0,
                    0,
                    0x40,
                    0,
                    self.hop_limit,
                    u8::from(IpProtocol::Udp),
                    0,
                    0,
                    s0,
                    s1,
                    s2,
                    s3,
                    d0,
                    d1,
                    d2,
                    d3,
                ];
                if caps.ipv4.tx() {
                    [h[10], h[11]] = ipv4_header_checksum(&h).to_be_bytes();
                }
                header.copy_from_slice(&h);
                self.emit_udp(udp_bytes, caps, fill_transport);
            }
            IpPair::V6 { src: s, dst: d } => {
                let mut ip = Ipv6Packet::new_unchecked(&mut *ip_bytes);
                Ipv6Repr {
                    src_addr: s,
                    dst_addr: d,
                    next_header: IpProtocol::Udp,
                    payload_len: udp_len,
                    hop_limit: self.hop_limit,
                }
                .emit(&mut ip);
                ip.set_traffic_class(((self.dscp & 0x3f) << 2) | (self.ecn & 0b11));
                self.emit_udp(ip.payload_mut(), caps, fill_transport);
            }
        }
        Ok(total)
    }

    /// Writes the UDP header and, through `fill_transport`, its payload
    /// into `udp` (exactly the datagram), then the checksum if `caps`
    /// leaves it to software: the header as one 8-byte store, as
    /// smoltcp's `UdpRepr::emit` writes it (tests compare the two).
    #[inline]
    fn emit_udp(
        &self,
        udp: &mut [u8],
        caps: &ChecksumCapabilities,
        fill_transport: impl FnOnce(&mut [u8]),
    ) {
        // `emit_with` sized the frame, so the header is there.
        let Some((header, payload)) = udp.split_first_chunk_mut::<UDP_HEADER_LEN>() else {
            return;
        };
        // `emit_with` bounds the datagram by 65,535 - 40 bytes.
        let len = (UDP_HEADER_LEN + payload.len()).min(usize::from(u16::MAX)) as u64;
        // Ports, length and a zero checksum as one big-endian word.
        *header = (u64::from(self.src_port) << 48 | u64::from(self.dst_port) << 32 | len << 16)
            .to_be_bytes();
        fill_transport(payload);
        if caps.udp.tx() {
            UdpPacket::new_unchecked(udp).fill_checksum(&self.ip.src(), &self.ip.dst());
        }
    }
}

/// Parses an Ethernet frame carrying MetaRoCE over UDP to `udp_port`,
/// verifying the IPv4 header checksum and the UDP checksum, and returns what
/// the encapsulation says plus the UDP payload (the MetaRoCE packet).
/// Ethernet padding after the IP packet is ignored.
pub fn parse_frame(frame: &[u8], udp_port: u16) -> Result<(FrameInfo, &[u8])> {
    parse_frame_with(frame, udp_port, &software_checksums())
}

/// [`parse_frame`], verifying only the checksums `caps` marks `rx`
/// (spec 3.1.5: a receiver verifies each frame's checksums once; a device
/// or an earlier stage that did vouches for the frame with
/// [`rx_verified_checksums`]). Every other check of spec 3.1.6 is made.
pub fn parse_frame_with<'a>(
    frame: &'a [u8],
    udp_port: u16,
    caps: &ChecksumCapabilities,
) -> Result<(FrameInfo, &'a [u8])> {
    // Ethernet II at fixed offsets: destination, source, EtherType.
    let (eth, ip_bytes) = frame
        .split_first_chunk::<ETHERNET_HEADER_LEN>()
        .ok_or(Error::Truncated)?;
    let [dst_mac @ .., _, _, _, _, _, _, _, _] = *eth;
    let [_, _, _, _, _, _, src_mac @ .., t0, t1] = *eth;
    let ethertype = EthernetProtocol::from(u16::from_be_bytes([t0, t1]));
    let (ip, dscp, ecn_bits, hop_limit, udp_bytes) = match ethertype {
        EthernetProtocol::Ipv4 => {
            parse_plain_ipv4(ip_bytes, caps).unwrap_or_else(|| parse_ipv4(ip_bytes, caps))?
        }
        EthernetProtocol::Ipv6 => {
            let ip = Ipv6Packet::new_checked(ip_bytes).map_err(|_| Error::Encapsulation)?;
            let repr = Ipv6Repr::parse(&ip).map_err(|_| Error::Encapsulation)?;
            if repr.next_header != IpProtocol::Udp {
                return Err(Error::NotMetaRoce);
            }
            let end = IPV6_HEADER_LEN + repr.payload_len;
            let tc = ip.traffic_class();
            let pair = IpPair::V6 {
                src: repr.src_addr,
                dst: repr.dst_addr,
            };
            (
                pair,
                tc >> 2,
                tc & 0b11,
                repr.hop_limit,
                &ip_bytes[IPV6_HEADER_LEN..end],
            )
        }
        _ => return Err(Error::NotMetaRoce),
    };
    let (src_port, dst_port, payload) = parse_udp(udp_bytes, &ip, caps)?;
    if dst_port != udp_port {
        return Err(Error::NotMetaRoce);
    }
    let info = FrameInfo {
        src_mac: EthernetAddress(src_mac),
        dst_mac: EthernetAddress(dst_mac),
        ip,
        src_port,
        dst_port,
        dscp,
        ecn: ecn_bits,
        hop_limit,
    };
    Ok((info, payload))
}

/// A UDP datagram (`udp`, the IP payload) read at fixed offsets: its
/// ports and payload, refused as smoltcp's `UdpRepr::parse` refuses it
/// (short, a length field out of range, destination port zero, a bad
/// checksum where `caps` asks for it; tests compare the two), and over
/// IPv6 also with a zero checksum: smoltcp takes zero as "none" for both
/// families, invalid over IPv6 (RFC 8200 section 8.1, spec 3.1.5).
#[inline]
fn parse_udp<'a>(
    udp: &'a [u8],
    ip: &IpPair,
    caps: &ChecksumCapabilities,
) -> Result<(u16, u16, &'a [u8])> {
    let (h, _) = udp
        .split_first_chunk::<UDP_HEADER_LEN>()
        .ok_or(Error::Encapsulation)?;
    let [sp0, sp1, dp0, dp1, l0, l1, c0, c1] = *h;
    let len = usize::from(u16::from_be_bytes([l0, l1]));
    let dst_port = u16::from_be_bytes([dp0, dp1]);
    if len < UDP_HEADER_LEN || len > udp.len() || dst_port == 0 {
        return Err(Error::Encapsulation);
    }
    if matches!(ip, IpPair::V6 { .. }) && c0 == 0 && c1 == 0 {
        return Err(Error::Encapsulation);
    }
    // smoltcp's check passes a zero checksum.
    if caps.udp.rx() && !UdpPacket::new_unchecked(&udp[..len]).verify_checksum(&ip.src(), &ip.dst())
    {
        return Err(Error::Encapsulation);
    }
    Ok((
        u16::from_be_bytes([sp0, sp1]),
        dst_port,
        &udp[UDP_HEADER_LEN..len],
    ))
}

/// What a frame's IP header tells: the address pair, DSCP, ECN, hop
/// limit, and the IP payload (the UDP datagram, padding cut).
type IpParsed<'a> = (IpPair, u8, u8, u8, &'a [u8]);

/// An IPv4 header of the usual shape (no options, not a fragment, UDP),
/// read at fixed offsets; `None` for any other shape, which
/// [`parse_ipv4`] judges. For that shape both accept and refuse the
/// same frames (a test compares them).
#[inline]
fn parse_plain_ipv4<'a>(
    ip_bytes: &'a [u8],
    caps: &ChecksumCapabilities,
) -> Option<Result<IpParsed<'a>>> {
    let (h, _) = ip_bytes.split_first_chunk::<IPV4_HEADER_LEN>()?;
    // Version 4 and a 20-byte header; DF alone or no flag, offset zero;
    // UDP.
    if h[0] != 0x45 || h[6] & !0x40 != 0 || h[7] != 0 || h[9] != u8::from(IpProtocol::Udp) {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if total < IPV4_HEADER_LEN || total > ip_bytes.len() {
        return Some(Err(Error::Encapsulation));
    }
    if caps.ipv4.rx() && ipv4_header_checksum(h) != 0 {
        return Some(Err(Error::Encapsulation));
    }
    let [_, _, _, _, _, _, _, _, _, _, _, _, s0, s1, s2, s3, d0, d1, d2, d3] = *h;
    let pair = IpPair::V4 {
        src: Ipv4Address::new(s0, s1, s2, s3),
        dst: Ipv4Address::new(d0, d1, d2, d3),
    };
    Some(Ok((
        pair,
        h[1] >> 2,
        h[1] & 0b11,
        h[8],
        &ip_bytes[IPV4_HEADER_LEN..total],
    )))
}

/// Any IPv4 header, judged by smoltcp.
fn parse_ipv4<'a>(ip_bytes: &'a [u8], caps: &ChecksumCapabilities) -> Result<IpParsed<'a>> {
    let ip = Ipv4Packet::new_checked(ip_bytes).map_err(|_| Error::Encapsulation)?;
    let repr = Ipv4Repr::parse(&ip, caps).map_err(|_| Error::Encapsulation)?;
    if repr.next_header != IpProtocol::Udp {
        return Err(Error::NotMetaRoce);
    }
    let hl = usize::from(ip.header_len());
    let end = usize::from(ip.total_len());
    let pair = IpPair::V4 {
        src: repr.src_addr,
        dst: repr.dst_addr,
    };
    Ok((
        pair,
        ip.dscp(),
        ip.ecn(),
        repr.hop_limit,
        &ip_bytes[hl..end],
    ))
}

/// Marks an IP frame Congestion Experienced if it is ECN-capable, as a
/// switch does above its marking threshold, fixing the IPv4 header checksum.
/// Returns whether the frame was marked. The UDP checksum does not cover the
/// ECN bits, so it stays valid.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let Ok(mut eth) = EthernetFrame::new_checked(&mut *frame) else {
        return false;
    };
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let Ok(mut ip) = Ipv4Packet::new_checked(eth.payload_mut()) else {
                return false;
            };
            if ip.ecn() == ecn::NOT_ECT {
                return false;
            }
            ip.set_ecn(ecn::CE);
            ip.fill_checksum();
            true
        }
        EthernetProtocol::Ipv6 => {
            let Ok(mut ip) = Ipv6Packet::new_checked(eth.payload_mut()) else {
                return false;
            };
            let tc = ip.traffic_class();
            if tc & 0b11 == ecn::NOT_ECT {
                return false;
            }
            ip.set_traffic_class(tc | ecn::CE);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::{EthernetRepr, UdpRepr};
    use std::vec;
    use std::vec::Vec;

    fn v4() -> EncapRepr {
        EncapRepr {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ip: IpPair::V4 {
                src: Ipv4Address::new(10, 0, 0, 1),
                dst: Ipv4Address::new(10, 0, 0, 2),
            },
            src_port: 0xc123,
            dst_port: super::super::DEFAULT_UDP_PORT,
            dscp: 26,
            ecn: ecn::ECT0,
            hop_limit: 64,
        }
    }

    fn v6() -> EncapRepr {
        EncapRepr {
            ip: IpPair::V6 {
                src: Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                dst: Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
            },
            ..v4()
        }
    }

    fn frame(e: &EncapRepr, caps: &ChecksumCapabilities) -> ([u8; 256], usize) {
        let mut out = [0xa5u8; 256];
        let payload: [u8; 77] = core::array::from_fn(|i| i as u8 ^ 0x5a);
        let n = e
            .emit_with(&mut out, payload.len(), caps, |p| {
                p.copy_from_slice(&payload)
            })
            .unwrap();
        (out, n)
    }

    const UDP_CHECKSUM_V4: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + 6;
    const IP_CHECKSUM: usize = ETHERNET_HEADER_LEN + 10;

    /// `emit` is `emit_with` in software, and a device that verifies
    /// received checksums still has them computed on transmit.
    #[test]
    fn emit_computes_what_the_capabilities_leave_to_software() {
        for e in [v4(), v6()] {
            let (software, n) = frame(&e, &software_checksums());
            let mut plain = [0xa5u8; 256];
            let payload: [u8; 77] = core::array::from_fn(|i| i as u8 ^ 0x5a);
            assert_eq!(
                e.emit(&mut plain, 77, |p| p.copy_from_slice(&payload)),
                Ok(n)
            );
            assert_eq!(software[..n], plain[..n]);
            let (rx_verified, m) = frame(&e, &rx_verified_checksums());
            assert_eq!(software[..n], rx_verified[..m]);
            assert!(parse_frame(&software[..n], e.dst_port).is_ok());
        }
        // A device that computes them on transmit: left zero for it.
        let (offloaded, n) = frame(&v4(), &ip_and_udp(Checksum::Rx));
        assert_eq!(offloaded[IP_CHECKSUM..IP_CHECKSUM + 2], [0, 0]);
        assert_eq!(offloaded[UDP_CHECKSUM_V4..UDP_CHECKSUM_V4 + 2], [0, 0]);
        let (software, _) = frame(&v4(), &software_checksums());
        assert_ne!(software[UDP_CHECKSUM_V4..UDP_CHECKSUM_V4 + 2], [0, 0]);
        assert_eq!(
            parse_frame(&offloaded[..n], v4().dst_port),
            Err(Error::Encapsulation)
        );
    }

    /// With the UDP checksum left to the device, the frame differs from
    /// the software one only in that field, which the device's checksum
    /// fills back to the same bytes.
    #[test]
    fn a_udp_checksum_left_to_the_device_is_the_only_difference() {
        for e in [v4(), v6()] {
            let (software, n) = frame(&e, &software_checksums());
            let (mut offloaded, m) = frame(&e, &udp_tx_offloaded_checksums());
            assert_eq!(n, m);
            let at = ETHERNET_HEADER_LEN + e.ip.header_len() + 6;
            assert_eq!(offloaded[at..at + 2], [0, 0]);
            assert_eq!(
                offloaded[..at],
                software[..at],
                "IP header checksum computed"
            );
            assert_eq!(offloaded[at + 2..n], software[at + 2..n]);
            // The device's part.
            let (src, dst) = (e.ip.src(), e.ip.dst());
            UdpPacket::new_unchecked(&mut offloaded[at - 6..n]).fill_checksum(&src, &dst);
            assert_eq!(offloaded[..n], software[..n]);
        }
    }

    /// A corrupted checksum fails the software check and passes where the
    /// frame was vouched for; every other check stays.
    #[test]
    fn parse_verifies_only_what_the_capabilities_ask() {
        let e = v4();
        let (good, n) = frame(&e, &software_checksums());
        for at in [UDP_CHECKSUM_V4, IP_CHECKSUM] {
            let mut bad = good;
            bad[at] ^= 0x40;
            let bad = &bad[..n];
            assert_eq!(parse_frame(bad, e.dst_port), Err(Error::Encapsulation));
            assert_eq!(
                parse_frame_with(bad, e.dst_port, &software_checksums()),
                Err(Error::Encapsulation)
            );
            let (info, packet) =
                parse_frame_with(bad, e.dst_port, &rx_verified_checksums()).unwrap();
            assert_eq!((info, packet), parse_frame(&good[..n], e.dst_port).unwrap());
        }
        // A device that validated the UDP checksum only: the IPv4
        // header's is still verified.
        let udp_only = rx_udp_verified_checksums();
        let mut bad = good;
        bad[UDP_CHECKSUM_V4] ^= 0x40;
        assert!(parse_frame_with(&bad[..n], e.dst_port, &udp_only).is_ok());
        let mut bad = good;
        bad[IP_CHECKSUM] ^= 0x40;
        assert_eq!(
            parse_frame_with(&bad[..n], e.dst_port, &udp_only),
            Err(Error::Encapsulation)
        );
        // A payload byte: the UDP checksum no longer matches.
        let mut bad = good;
        bad[n - 1] ^= 1;
        assert_eq!(
            parse_frame(&bad[..n], e.dst_port),
            Err(Error::Encapsulation)
        );
        assert!(parse_frame_with(&bad[..n], e.dst_port, &rx_verified_checksums()).is_ok());
        // The port and the other headers are still checked.
        assert_eq!(
            parse_frame_with(&good[..n], e.dst_port + 1, &rx_verified_checksums()),
            Err(Error::NotMetaRoce)
        );
        let mut fragment = good;
        fragment[ETHERNET_HEADER_LEN + 6] |= 0x20;
        assert_eq!(
            parse_frame_with(&fragment[..n], e.dst_port, &rx_verified_checksums()),
            Err(Error::Encapsulation)
        );
        // Over IPv6 a zero UDP checksum is invalid whoever vouches.
        let e = v6();
        let (mut zero, n) = frame(&e, &software_checksums());
        let at = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + 6;
        zero[at..at + 2].fill(0);
        assert_eq!(
            parse_frame_with(&zero[..n], e.dst_port, &rx_verified_checksums()),
            Err(Error::Encapsulation)
        );
    }

    /// The frame as smoltcp's emitters write it: what `emit_with`'s
    /// header written whole must equal.
    fn smoltcp_frame(e: &EncapRepr, caps: &ChecksumCapabilities, payload: &[u8]) -> Vec<u8> {
        let udp_len = UDP_HEADER_LEN + payload.len();
        let mut out = vec![0u8; e.frame_len(payload.len())];
        let mut eth = EthernetFrame::new_unchecked(&mut out[..]);
        EthernetRepr {
            src_addr: e.src_mac,
            dst_addr: e.dst_mac,
            ethertype: EthernetProtocol::Ipv4,
        }
        .emit(&mut eth);
        let IpPair::V4 { src, dst } = e.ip else {
            unreachable!("an IPv4 pair")
        };
        let mut ip = Ipv4Packet::new_unchecked(eth.payload_mut());
        Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Udp,
            payload_len: udp_len,
            hop_limit: e.hop_limit,
        }
        .emit(&mut ip, &ip_and_udp(Checksum::None));
        ip.set_dscp(e.dscp & 0x3f);
        ip.set_ecn(e.ecn & 0b11);
        if caps.ipv4.tx() {
            ip.fill_checksum();
        }
        let mut udp = UdpPacket::new_unchecked(ip.payload_mut());
        UdpRepr {
            src_port: e.src_port,
            dst_port: e.dst_port,
        }
        .emit(
            &mut udp,
            &e.ip.src(),
            &e.ip.dst(),
            payload.len(),
            |p| p.copy_from_slice(payload),
            caps,
        );
        out
    }

    /// The UDP datagram's verdict as smoltcp gives it, with the IPv6 rule
    /// `parse_udp` adds: what the fixed-offset read must equal.
    fn smoltcp_udp<'a>(
        udp: &'a [u8],
        ip: &IpPair,
        caps: &ChecksumCapabilities,
    ) -> Result<(u16, u16, &'a [u8])> {
        let packet = UdpPacket::new_checked(udp).map_err(|_| Error::Encapsulation)?;
        let repr = UdpRepr::parse(&packet, &ip.src(), &ip.dst(), caps)
            .map_err(|_| Error::Encapsulation)?;
        if matches!(ip, IpPair::V6 { .. }) && packet.checksum() == 0 {
            return Err(Error::Encapsulation);
        }
        Ok((repr.src_port, repr.dst_port, packet.payload()))
    }

    /// The UDP header's edges, field by field and together (lengths
    /// around the header's and the buffer's, port zero, checksums zero,
    /// right and wrong, datagrams cut short), read as smoltcp reads them.
    #[test]
    fn udp_edges_are_read_as_smoltcp_reads_them() {
        let payload = [0x11u8, 0x22, 0x33, 0x44, 0x55];
        for e in [v4(), v6()] {
            let mut out = vec![0u8; e.frame_len(payload.len())];
            e.emit(&mut out, payload.len(), |p| p.copy_from_slice(&payload))
                .unwrap();
            let good = out[e.header_len() - UDP_HEADER_LEN..].to_vec();
            let n = good.len() as u16;
            let sum = u16::from_be_bytes([good[6], good[7]]);
            for len in [0, 1, 7, 8, 9, n - 1, n, n + 1, u16::MAX] {
                for dst_port in [0, e.dst_port] {
                    for checksum in [0, sum, sum ^ 1] {
                        for cut in 0..=good.len() {
                            let mut udp = good.clone();
                            udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
                            udp[4..6].copy_from_slice(&len.to_be_bytes());
                            udp[6..8].copy_from_slice(&checksum.to_be_bytes());
                            udp.truncate(good.len() - cut);
                            for which in 0..4 {
                                let caps = any_caps(which);
                                assert_eq!(
                                    parse_udp(&udp, &e.ip, &caps),
                                    smoltcp_udp(&udp, &e.ip, &caps),
                                    "{udp:?} caps {which}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    fn any_caps(which: u8) -> ChecksumCapabilities {
        match which % 4 {
            0 => software_checksums(),
            1 => rx_verified_checksums(),
            2 => udp_tx_offloaded_checksums(),
            _ => ip_and_udp(Checksum::None),
        }
    }

    proptest::proptest! {
        /// An IPv4 frame's headers, written whole, are smoltcp's bytes.
        #[test]
        fn ipv4_headers_written_whole_are_smoltcps(
            src in proptest::prelude::any::<[u8; 4]>(),
            dst in proptest::prelude::any::<[u8; 4]>(),
            ports in proptest::prelude::any::<(u16, u16)>(),
            dscp in proptest::prelude::any::<u8>(),
            ecn_bits in proptest::prelude::any::<u8>(),
            hop_limit in proptest::prelude::any::<u8>(),
            which in proptest::prelude::any::<u8>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let e = EncapRepr {
                ip: IpPair::V4 { src: Ipv4Address::from(src), dst: Ipv4Address::from(dst) },
                src_port: ports.0,
                dst_port: ports.1,
                dscp,
                ecn: ecn_bits,
                hop_limit,
                ..v4()
            };
            let caps = any_caps(which);
            let mut out = vec![0xa5u8; e.frame_len(payload.len())];
            let n = e.emit_with(&mut out, payload.len(), &caps, |p| p.copy_from_slice(&payload)).unwrap();
            proptest::prop_assert_eq!(n, out.len());
            proptest::prop_assert_eq!(out, smoltcp_frame(&e, &caps, &payload));
        }

        /// The fixed-offset read of a usual IPv4 header accepts and
        /// refuses what smoltcp's parse does, whatever its bytes: headers
        /// of any shape, truncated, with wrong lengths or checksums.
        #[test]
        fn the_usual_ipv4_header_is_read_as_smoltcp_reads_it(
            good in proptest::prelude::any::<bool>(),
            flips in proptest::collection::vec((0usize..24, proptest::prelude::any::<u8>()), 0..4),
            cut in 0usize..64,
            which in proptest::prelude::any::<u8>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            let caps = any_caps(which);
            let mut bytes = smoltcp_frame(&v4(), &software_checksums(), &payload)
                [ETHERNET_HEADER_LEN..]
                .to_vec();
            if !good {
                for (at, x) in &flips {
                    if let Some(b) = bytes.get_mut(*at) {
                        *b ^= x;
                    }
                }
            }
            bytes.truncate(bytes.len().saturating_sub(cut % 8 * (cut / 8)));
            let reference = parse_ipv4(&bytes, &caps);
            let fast = parse_plain_ipv4(&bytes, &caps).unwrap_or_else(|| parse_ipv4(&bytes, &caps));
            proptest::prop_assert_eq!(fast, reference);
        }

        /// The fixed-offset read of a UDP datagram accepts and refuses
        /// what smoltcp's parse does over either family: mutated ports,
        /// lengths and checksums, truncated datagrams, trailing bytes.
        #[test]
        fn udp_is_read_as_smoltcp_reads_it(
            over_v6 in proptest::prelude::any::<bool>(),
            good in proptest::prelude::any::<bool>(),
            flips in proptest::collection::vec((0usize..12, proptest::prelude::any::<u8>()), 0..3),
            cut in 0usize..16,
            trailing in 0usize..4,
            which in proptest::prelude::any::<u8>(),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            let e = if over_v6 { v6() } else { v4() };
            let caps = any_caps(which);
            let mut out = vec![0u8; e.frame_len(payload.len())];
            e.emit(&mut out, payload.len(), |p| p.copy_from_slice(&payload)).unwrap();
            let mut udp = out[e.header_len() - UDP_HEADER_LEN..].to_vec();
            if !good {
                for (at, x) in &flips {
                    if let Some(b) = udp.get_mut(*at) {
                        *b ^= x;
                    }
                }
            }
            udp.extend(core::iter::repeat_n(0x5a, trailing));
            udp.truncate(udp.len().saturating_sub(cut));
            proptest::prop_assert_eq!(parse_udp(&udp, &e.ip, &caps), smoltcp_udp(&udp, &e.ip, &caps));
        }
    }
}
