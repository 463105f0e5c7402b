//! Fuzz target: `encap::parse_frame`, then `wire::parse` on the UDP payload,
//! must never panic on arbitrary bytes; neither may `encap::mark_ce`.
//!
//! The first input byte selects a mode so the fuzzer gets past checksums:
//! with bit 0 set, the IPv4 header checksum and the UDP checksum of the rest
//! of the input are recomputed before parsing, so mutations reach the checks
//! behind them. Whatever parses is re-encapsulated with `EncapRepr::emit`
//! and must parse back to the same frame info and payload.

#![no_main]

use libfuzzer_sys::fuzz_target;
use metaroce_core::wire::{self, encap, EncapRepr, DEFAULT_UDP_PORT};
use smoltcp::wire::{EthernetFrame, EthernetProtocol, Ipv4Packet, Ipv6Packet, UdpPacket};

/// Recomputes the IPv4 header and UDP checksums where the headers are long
/// enough to hold them; leaves anything else as it is.
fn fix_checksums(frame: &mut [u8]) {
    let Ok(mut eth) = EthernetFrame::new_checked(&mut *frame) else {
        return;
    };
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let Ok(mut ip) = Ipv4Packet::new_checked(eth.payload_mut()) else {
                return;
            };
            ip.fill_checksum();
            let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
            if let Ok(mut udp) = UdpPacket::new_checked(ip.payload_mut()) {
                udp.fill_checksum(&src, &dst);
            }
        }
        EthernetProtocol::Ipv6 => {
            let Ok(mut ip) = Ipv6Packet::new_checked(eth.payload_mut()) else {
                return;
            };
            let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
            if let Ok(mut udp) = UdpPacket::new_checked(ip.payload_mut()) {
                udp.fill_checksum(&src, &dst);
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut frame = rest.to_vec();
    if mode & 1 != 0 {
        fix_checksums(&mut frame);
    }
    if let Ok((info, transport)) = encap::parse_frame(&frame, DEFAULT_UDP_PORT) {
        if let Ok((repr, payload)) = wire::parse(transport) {
            let mut again = vec![0xa5u8; repr.buffer_len()];
            repr.emit(&mut again, payload);
            assert_eq!(again.as_slice(), transport, "re-emit of {repr:?} differs");
        }
        let e = EncapRepr {
            src_mac: info.src_mac,
            dst_mac: info.dst_mac,
            ip: info.ip,
            src_port: info.src_port,
            dst_port: info.dst_port,
            dscp: info.dscp,
            ecn: info.ecn,
            hop_limit: info.hop_limit,
        };
        let mut out = vec![0u8; e.frame_len(transport.len())];
        let n = e
            .emit(&mut out, transport.len(), |p| p.copy_from_slice(transport))
            .expect("a parsed frame fits when emitted again");
        let (info2, transport2) =
            encap::parse_frame(&out[..n], DEFAULT_UDP_PORT).expect("re-emitted frame parses");
        assert_eq!(info2, info);
        assert_eq!(transport2, transport);
    }
    let marked = encap::mark_ce(&mut frame);
    if marked {
        if let Ok((info, _)) = encap::parse_frame(&frame, DEFAULT_UDP_PORT) {
            assert!(info.is_ce());
        }
    }
});
