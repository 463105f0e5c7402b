//! Putting transport packets on the wire: the contiguous packet with its
//! ICRC ([`finish`]), whole Ethernet frames ([`emit_frame`],
//! [`parse_frame`]) through `metaroce_core::wire::encap`, and the IP/UDP
//! headers those frames carry ([`ip_udp_header`]) for callers that compute
//! the ICRC without building a frame (a simulator).

use metaroce_core::wire::encap::{self, EncapRepr, FrameInfo, IpPair, ETHERNET_HEADER_LEN};
use metaroce_core::wire::Error as CoreError;
use smoltcp::wire::UdpPacket;

use super::icrc::{self, IPV4_HEADER_LEN, IPV6_HEADER_LEN, MAX_IP_UDP_LEN, UDP_HEADER_LEN};
use super::{bth, pad_for, Error, Result, BTH_LEN, ICRC_LEN, UDP_PORT};

/// Length of the transport packet (BTH to ICRC) whose headers are `header`
/// (as `poll_transmit` wrote them) and whose payload is `payload_len` bytes:
/// the pad is read from the BTH.
pub fn transport_len(header: &[u8], payload_len: usize) -> usize {
    let pad = if header.len() >= BTH_LEN {
        usize::from(bth::Packet::new_unchecked(header).pad_count())
    } else {
        pad_for(payload_len)
    };
    header.len() + payload_len + pad + ICRC_LEN
}

/// Writes one contiguous transport packet into `out`: `header`, `payload`,
/// the zero pad the BTH announces and the ICRC computed over the IP and UDP
/// headers in `ip_udp` (see [`icrc::compute`]). Returns its length.
pub fn finish(out: &mut [u8], header: &[u8], payload: &[u8], ip_udp: &[u8]) -> Result<usize> {
    if header.len() < BTH_LEN {
        return Err(Error::Truncated);
    }
    let pad = usize::from(bth::Packet::new_unchecked(header).pad_count());
    if !(payload.len() + pad).is_multiple_of(4) {
        return Err(Error::BadLength);
    }
    let total = header.len() + payload.len() + pad + ICRC_LEN;
    if out.len() < total {
        return Err(Error::Truncated);
    }
    let body_end = total - ICRC_LEN;
    out[..header.len()].copy_from_slice(header);
    out[header.len()..header.len() + payload.len()].copy_from_slice(payload);
    out[header.len() + payload.len()..body_end].fill(0);
    let crc = icrc::compute(ip_udp, &[&out[..body_end]])?;
    out[body_end..total].copy_from_slice(&icrc::to_wire(crc));
    Ok(total)
}

/// IP and UDP headers as bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpUdpHeader {
    bytes: [u8; MAX_IP_UDP_LEN],
    len: usize,
}

impl IpUdpHeader {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The IP and UDP headers [`emit_frame`] writes around a transport packet
/// of `transport_len` bytes, as far as the ICRC sees them (fields it masks
/// are zero here): IPv4 with identification 0 and Don't Fragment (what
/// `smoltcp` emits), or IPv6. A simulator that never builds frames uses this
/// to compute and check ICRCs consistently on both ends.
pub fn ip_udp_header(
    ip: &IpPair,
    src_port: u16,
    dst_port: u16,
    transport_len: usize,
) -> Result<IpUdpHeader> {
    let udp_len = UDP_HEADER_LEN + transport_len;
    let mut h = IpUdpHeader {
        bytes: [0; MAX_IP_UDP_LEN],
        len: 0,
    };
    let b = &mut h.bytes;
    let udp_start = match ip {
        IpPair::V4 { src, dst } => {
            let total = u16::try_from(IPV4_HEADER_LEN + udp_len).map_err(|_| Error::BadLength)?;
            b[0] = 0x45;
            b[2..4].copy_from_slice(&total.to_be_bytes());
            b[6] = 0x40; // Don't Fragment
            b[8] = 64;
            b[9] = 17; // UDP
            b[12..16].copy_from_slice(&src.octets());
            b[16..20].copy_from_slice(&dst.octets());
            IPV4_HEADER_LEN
        }
        IpPair::V6 { src, dst } => {
            let payload = u16::try_from(udp_len).map_err(|_| Error::BadLength)?;
            b[0] = 0x60;
            b[4..6].copy_from_slice(&payload.to_be_bytes());
            b[6] = 17; // UDP
            b[7] = 64;
            b[8..24].copy_from_slice(&src.octets());
            b[24..40].copy_from_slice(&dst.octets());
            IPV6_HEADER_LEN
        }
    };
    let udp = &mut b[udp_start..udp_start + UDP_HEADER_LEN];
    udp[0..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    h.len = udp_start + UDP_HEADER_LEN;
    Ok(h)
}

fn from_core(e: CoreError) -> Error {
    match e {
        CoreError::NotMetaRoce => Error::NotRoce,
        CoreError::Truncated => Error::Truncated,
        _ => Error::Encapsulation,
    }
}

/// Writes a whole Ethernet frame: the encapsulation in `encap` (its
/// `dst_port` should be [`UDP_PORT`]), `header`, `payload`, pad and ICRC;
/// the UDP checksum covers the finished packet. Returns the frame length.
pub fn emit_frame(
    frame: &mut [u8],
    encap: &EncapRepr,
    header: &[u8],
    payload: &[u8],
) -> Result<usize> {
    if header.len() < BTH_LEN {
        return Err(Error::Truncated);
    }
    let pad = usize::from(bth::Packet::new_unchecked(header).pad_count());
    if !(payload.len() + pad).is_multiple_of(4) {
        return Err(Error::BadLength);
    }
    let len = header.len() + payload.len() + pad + ICRC_LEN;
    let total = encap
        .emit(frame, len, |t| {
            t[..header.len()].copy_from_slice(header);
            t[header.len()..header.len() + payload.len()].copy_from_slice(payload);
            t[header.len() + payload.len()..].fill(0);
        })
        .map_err(from_core)?;
    let ip = &mut frame[ETHERNET_HEADER_LEN..total];
    let hl = icrc::ip_udp_len(ip)?;
    let body_end = ip.len() - ICRC_LEN;
    let (ip_udp, transport) = ip.split_at_mut(hl);
    let crc = icrc::compute(ip_udp, &[&transport[..body_end - hl]])?;
    transport[body_end - hl..].copy_from_slice(&icrc::to_wire(crc));
    let mut udp = UdpPacket::new_unchecked(&mut ip[hl - UDP_HEADER_LEN..]);
    udp.fill_checksum(&encap.ip.src(), &encap.ip.dst());
    Ok(total)
}

/// Parses an Ethernet frame carrying RoCEv2 (UDP destination port
/// [`UDP_PORT`]): checks the IP and UDP layers and the ICRC, and returns
/// what the encapsulation says plus the transport packet (BTH to ICRC).
pub fn parse_frame(frame: &[u8]) -> Result<(FrameInfo, &[u8])> {
    let (info, transport) = encap::parse_frame(frame, UDP_PORT).map_err(from_core)?;
    let ip = frame.get(ETHERNET_HEADER_LEN..).ok_or(Error::Truncated)?;
    let hl = icrc::ip_udp_len(ip)?;
    icrc::verify(&ip[..hl], transport)?;
    Ok((info, transport))
}

#[cfg(test)]
mod tests {
    use super::*;
    use metaroce_core::wire::encap::ecn;
    use smoltcp::wire::{EthernetAddress, Ipv4Address, Ipv6Address};

    fn encap(ip: IpPair) -> EncapRepr {
        EncapRepr {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ip,
            src_port: 0xc123,
            dst_port: UDP_PORT,
            dscp: 26,
            ecn: ecn::ECT0,
            hop_limit: 64,
        }
    }

    // SEND Only to QP 0x11, PSN 5, AckReq, pad 1 for a 3-byte payload.
    const HEADER: [u8; 12] = [0x04, 0x10, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 5];

    #[test]
    fn frames_round_trip_and_match_the_synthesized_headers() {
        let pairs = [
            IpPair::V4 {
                src: Ipv4Address::new(10, 0, 0, 1),
                dst: Ipv4Address::new(10, 0, 0, 2),
            },
            IpPair::V6 {
                src: Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
                dst: Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
            },
        ];
        for ip in pairs {
            let e = encap(ip);
            let mut frame = [0u8; 128];
            let n = emit_frame(&mut frame, &e, &HEADER, b"abc").unwrap();
            let (info, transport) = parse_frame(&frame[..n]).unwrap();
            assert_eq!(info.src_port, 0xc123);
            assert_eq!(info.ecn, ecn::ECT0);
            assert_eq!(transport.len(), 12 + 3 + 1 + 4);
            assert_eq!(&transport[12..15], b"abc");
            // The same transport packet, finished against synthesized headers.
            let h = ip_udp_header(&ip, 0xc123, UDP_PORT, transport.len()).unwrap();
            let mut out = [0u8; 64];
            let m = finish(&mut out, &HEADER, b"abc", h.as_bytes()).unwrap();
            assert_eq!(&out[..m], transport);
            // A switch marking CE keeps the ICRC valid.
            assert!(encap::mark_ce(&mut frame[..n]));
            assert!(parse_frame(&frame[..n]).is_ok());
            // A flipped payload bit does not (UDP checksum fixed up to isolate the ICRC).
            let hl = ETHERNET_HEADER_LEN + icrc::ip_udp_len(&frame[ETHERNET_HEADER_LEN..]).unwrap();
            frame[hl + 12] ^= 1;
            UdpPacket::new_unchecked(&mut frame[hl - UDP_HEADER_LEN..n])
                .fill_checksum(&ip.src(), &ip.dst());
            assert_eq!(parse_frame(&frame[..n]).err(), Some(Error::BadIcrc));
        }
    }

    #[test]
    fn finish_checks_lengths() {
        let ip = IpPair::V4 {
            src: Ipv4Address::new(10, 0, 0, 1),
            dst: Ipv4Address::new(10, 0, 0, 2),
        };
        let h = ip_udp_header(&ip, 1, UDP_PORT, 20).unwrap();
        let mut out = [0u8; 19];
        assert_eq!(
            finish(&mut out, &HEADER, b"abc", h.as_bytes()),
            Err(Error::Truncated)
        );
        let mut out = [0u8; 64];
        assert_eq!(
            finish(&mut out, &HEADER, b"ab", h.as_bytes()),
            Err(Error::BadLength)
        );
        assert_eq!(transport_len(&HEADER, 3), 20);
    }
}
