//! The packet model: a transport packet (the UDP payload, trailer
//! included) with the fields the fabric looks at: source and destination
//! host, UDP ports (the ECMP hash includes the source port, which is how
//! transports choose paths) and the IP header's ECN codepoint. The
//! Ethernet, IP and UDP headers are not materialised; their bytes count
//! only towards serialisation time ([`FrameOverhead`]).

/// Index of a host in the topology.
pub type HostId = usize;

/// A packet in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: HostId,
    pub dst: HostId,
    pub src_port: u16,
    pub dst_port: u16,
    /// ECN codepoint (`metaroce_core::wire::encap::ecn`).
    pub ecn: u8,
    /// The transport packet (UDP payload).
    pub bytes: Vec<u8>,
}

/// Bytes a frame occupies on the wire beyond its UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameOverhead {
    /// Ethernet header, IP header, UDP header and FCS.
    pub headers: u32,
    /// Preamble, start-of-frame delimiter and inter-frame gap: they occupy
    /// the line but are not stored in switch buffers.
    pub gap: u32,
}

impl FrameOverhead {
    /// IPv4: Ethernet 14 + IPv4 20 + UDP 8 + FCS 4; preamble 7 + SFD 1 +
    /// inter-frame gap 12 (IEEE 802.3).
    pub const IPV4: FrameOverhead = FrameOverhead {
        headers: 14 + 20 + 8 + 4,
        gap: 8 + 12,
    };

    /// Frame bytes (what a buffer stores) of a `payload`-byte UDP payload.
    pub fn frame_len(self, payload: usize) -> u64 {
        payload as u64 + u64::from(self.headers)
    }

    /// Bytes of line time: frame plus preamble and gap.
    pub fn line_len(self, payload: usize) -> u64 {
        self.frame_len(payload) + u64::from(self.gap)
    }
}

impl Default for FrameOverhead {
    fn default() -> Self {
        FrameOverhead::IPV4
    }
}
