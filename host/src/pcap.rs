//! `--pcap FILE`: every datagram sent and received, wrapped in synthetic
//! Ethernet/IP/UDP headers (the kernel builds the real ones) so Wireshark
//! and tshark open the file like a capture. ECN and ports are the real ones.

use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use metaroce_core::wire::{EncapRepr, IpPair};
use pcap_file::pcap::{PcapPacket, PcapWriter};
use smoltcp::wire::EthernetAddress;

use crate::HostError;

/// Made-up MAC addresses: 02:.. is locally administered.
const MAC_LOCAL: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 1]);
const MAC_PEER: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 2]);

/// Writes a classic pcap file (Ethernet link type).
#[derive(Debug)]
pub struct PcapRecorder {
    // Unbuffered: every packet reaches the file at once, so a capture is
    // complete up to the last packet even if the process is killed.
    writer: PcapWriter<File>,
    frame: Vec<u8>,
    /// Datagrams that could not be framed (mixed address families).
    pub skipped: u64,
}

impl PcapRecorder {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, HostError> {
        let file = File::create(path)
            .map_err(|e| HostError::Io(format!("cannot create {}: {e}", path.display())))?;
        let writer = PcapWriter::new(file)
            .map_err(|e| HostError::Io(format!("cannot write {}: {e}", path.display())))?;
        Ok(PcapRecorder {
            writer,
            frame: vec![0; 70_000],
            skipped: 0,
        })
    }

    /// Records one datagram from `src` to `dst` with IP ECN codepoint `ecn`.
    /// `outgoing` picks which synthetic MAC is the source.
    pub fn record(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ecn: u8,
        payload: &[u8],
        outgoing: bool,
    ) {
        let ip = match (src, dst) {
            (SocketAddr::V4(s), SocketAddr::V4(d)) => IpPair::V4 {
                src: *s.ip(),
                dst: *d.ip(),
            },
            (SocketAddr::V6(s), SocketAddr::V6(d)) => IpPair::V6 {
                src: *s.ip(),
                dst: *d.ip(),
            },
            _ => {
                self.skipped += 1;
                return;
            }
        };
        let (src_mac, dst_mac) = if outgoing {
            (MAC_LOCAL, MAC_PEER)
        } else {
            (MAC_PEER, MAC_LOCAL)
        };
        let encap = EncapRepr {
            src_mac,
            dst_mac,
            ip,
            src_port: src.port(),
            dst_port: dst.port(),
            dscp: 0,
            ecn,
            hop_limit: 64,
        };
        let Ok(len) = encap.emit(&mut self.frame, payload.len(), |t| {
            t.copy_from_slice(payload);
        }) else {
            self.skipped += 1;
            return;
        };
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let packet = PcapPacket::new(ts, len as u32, &self.frame[..len]);
        if self.writer.write_packet(&packet).is_err() {
            self.skipped += 1;
        }
    }

    /// Flushes buffered packets to the file and closes it.
    pub fn finish(self) -> Result<(), HostError> {
        use std::io::Write;
        self.writer
            .into_writer()
            .flush()
            .map_err(|e| HostError::Io(format!("cannot write the pcap file: {e}")))
    }
}
