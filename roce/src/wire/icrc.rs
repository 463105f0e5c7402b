//! The invariant CRC of RoCEv2 (InfiniBand annex A17, "ICRC").
//!
//! CRC-32 (the IEEE 802.3 polynomial, reflected, initial value all ones,
//! final complement: exactly what `crc32fast` and zlib compute) over:
//!
//! 1. eight bytes of 0xFF, standing for the LRH that RoCEv2 does not carry;
//! 2. the IP header with every field a router may change set to ones:
//!    IPv4 type of service (DSCP and ECN), TTL and header checksum; IPv6
//!    traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to ones;
//! 4. the BTH with its byte 4 (FECN, BECN and reserved bits; "resv8a") set
//!    to ones;
//! 5. the rest of the transport headers, the payload and the pad.
//!
//! The result goes on the wire least significant byte first, as the
//! Ethernet FCS does. A capture from a ConnectX-4 Lx (a CNP, vector
//! `cnp_connectx4lx` in `compliance/vectors/roce/`) confirms both the
//! masking and the byte order.

use smoltcp::wire::{IpProtocol, Ipv4Packet, Ipv6Packet, UdpPacket};

use super::{Error, Result, BTH_LEN, ICRC_LEN};

/// IPv4 header length RoCEv2 uses (no options).
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 header length (no extension headers).
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// The longest IP plus UDP header the ICRC covers.
pub const MAX_IP_UDP_LEN: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN;

/// The masked IP and UDP headers, as the CRC sees them.
struct Masked {
    bytes: [u8; MAX_IP_UDP_LEN],
    len: usize,
}

/// Length of the IP plus UDP header at the start of `ip_udp`, by the IP
/// version nibble. IPv4 with options is refused: RoCEv2 never sends them and
/// the annex defines the ICRC for the 20-byte header.
pub fn ip_udp_len(ip_udp: &[u8]) -> Result<usize> {
    let first = *ip_udp.first().ok_or(Error::Truncated)?;
    let len = match first >> 4 {
        4 if first & 0x0f == 5 => IPV4_HEADER_LEN + UDP_HEADER_LEN,
        6 => IPV6_HEADER_LEN + UDP_HEADER_LEN,
        _ => return Err(Error::Encapsulation),
    };
    if ip_udp.len() < len {
        return Err(Error::Truncated);
    }
    Ok(len)
}

fn mask(ip_udp: &[u8]) -> Result<Masked> {
    let len = ip_udp_len(ip_udp)?;
    let mut m = Masked {
        bytes: [0; MAX_IP_UDP_LEN],
        len,
    };
    let b = &mut m.bytes[..len];
    b.copy_from_slice(&ip_udp[..len]);
    let udp_start = if b[0] >> 4 == 4 {
        b[1] = 0xff; // type of service: DSCP and ECN
        b[8] = 0xff; // TTL
        b[10..12].fill(0xff); // header checksum
        IPV4_HEADER_LEN
    } else {
        b[0] |= 0x0f; // traffic class, high nibble
        b[1..4].fill(0xff); // traffic class, low nibble, and flow label
        b[7] = 0xff; // hop limit
        IPV6_HEADER_LEN
    };
    b[udp_start + 6..udp_start + 8].fill(0xff); // UDP checksum
    Ok(m)
}

/// Computes the ICRC of a transport packet given the IP and UDP headers it
/// travels in (`ip_udp`: an IPv4 header without options or an IPv6 header,
/// then the UDP header; checksum values do not matter, they are masked).
/// `transport` is the packet from BTH up to (not including) the ICRC, in
/// pieces so a header and a payload in different memory need no copy; the
/// first piece must hold at least the BTH.
pub fn compute(ip_udp: &[u8], transport: &[&[u8]]) -> Result<u32> {
    let masked = mask(ip_udp)?;
    let first = transport.first().copied().unwrap_or(&[]);
    if first.len() < BTH_LEN {
        return Err(Error::Truncated);
    }
    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(&first[..BTH_LEN]);
    bth[4] = 0xff; // FECN, BECN, reserved
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&masked.bytes[..masked.len]);
    h.update(&bth);
    h.update(&first[BTH_LEN..]);
    for part in &transport[1..] {
        h.update(part);
    }
    Ok(h.finalize())
}

/// The ICRC's four wire bytes.
pub const fn to_wire(crc: u32) -> [u8; ICRC_LEN] {
    crc.to_le_bytes()
}

/// The ICRC value of four wire bytes.
pub const fn from_wire(bytes: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// Verifies the ICRC of a transport packet (`transport`: BTH through ICRC)
/// carried in `ip_udp`.
pub fn verify(ip_udp: &[u8], transport: &[u8]) -> Result<()> {
    if transport.len() < BTH_LEN + ICRC_LEN {
        return Err(Error::Truncated);
    }
    let (body, trailer) = transport.split_at(transport.len() - ICRC_LEN);
    let mut wire = [0u8; ICRC_LEN];
    wire.copy_from_slice(trailer);
    if compute(ip_udp, &[body])? == from_wire(wire) {
        Ok(())
    } else {
        Err(Error::BadIcrc)
    }
}

/// Verifies the ICRC of a whole IP packet (IP header, UDP header, transport
/// packet with ICRC), using the IP and UDP length fields to find its end
/// (trailing Ethernet padding is ignored). Returns the transport packet.
pub fn verify_ip_packet(ip: &[u8]) -> Result<&[u8]> {
    let hl = ip_udp_len(ip)?;
    let ip_end = match ip[0] >> 4 {
        4 => {
            let p = Ipv4Packet::new_checked(ip).map_err(|_| Error::Encapsulation)?;
            if p.next_header() != IpProtocol::Udp {
                return Err(Error::NotRoce);
            }
            usize::from(p.total_len())
        }
        _ => {
            let p = Ipv6Packet::new_checked(ip).map_err(|_| Error::Encapsulation)?;
            if p.next_header() != IpProtocol::Udp {
                return Err(Error::NotRoce);
            }
            IPV6_HEADER_LEN + usize::from(p.payload_len())
        }
    };
    if ip_end > ip.len() || ip_end < hl {
        return Err(Error::Encapsulation);
    }
    let udp_start = hl - UDP_HEADER_LEN;
    let udp = UdpPacket::new_checked(&ip[udp_start..ip_end]).map_err(|_| Error::Encapsulation)?;
    let udp_end = udp_start + usize::from(udp.len());
    if udp_end > ip_end || udp.len() < UDP_HEADER_LEN as u16 {
        return Err(Error::Encapsulation);
    }
    let transport = &ip[hl..udp_end];
    verify(&ip[..hl], transport)?;
    Ok(transport)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CNP captured on a ConnectX-4 Lx (Ethernet header removed): the
    /// vector of scapy's `test/contrib/roce.uts`, "RoCE CNP captured on
    /// ConnectX-4 Lx". Only the packet bytes are taken from it.
    const CX4_CNP: [u8; 60] = [
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00,
        0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
    ];

    #[test]
    fn hardware_cnp() {
        let transport = verify_ip_packet(&CX4_CNP).unwrap();
        assert_eq!(transport.len(), 32);
        assert_eq!(
            compute(&CX4_CNP[..28], &[&transport[..28]]).unwrap(),
            0x2a00_fd82
        );
        // Variant fields do not change it; invariant ones do.
        let mut v = CX4_CNP;
        v[1] = 0x03; // ECN CE
        v[8] = 0x01; // TTL
        v[10] = 0; // IP checksum
        v[26] = 0x12; // UDP checksum
        v[32] = 0x80; // FECN instead of BECN
        assert!(verify_ip_packet(&v).is_ok());
        v[21] = 1; // UDP source port
        assert_eq!(verify_ip_packet(&v).err(), Some(Error::BadIcrc));
    }

    #[test]
    fn split_transport_equals_contiguous() {
        let transport = &CX4_CNP[28..56];
        let whole = compute(&CX4_CNP[..28], &[transport]).unwrap();
        let split = compute(&CX4_CNP[..28], &[&transport[..13], &transport[13..]]).unwrap();
        assert_eq!(whole, split);
        assert_eq!(
            compute(&CX4_CNP[..28], &[&transport[..11]]).err(),
            Some(Error::Truncated)
        );
    }

    #[test]
    fn rejects_ip_options_and_other_versions() {
        let mut v = CX4_CNP;
        v[0] = 0x46;
        assert_eq!(ip_udp_len(&v).err(), Some(Error::Encapsulation));
        v[0] = 0x55;
        assert_eq!(ip_udp_len(&v).err(), Some(Error::Encapsulation));
        assert_eq!(ip_udp_len(&[]).err(), Some(Error::Truncated));
        assert_eq!(ip_udp_len(&CX4_CNP[..27]).err(), Some(Error::Truncated));
    }
}
