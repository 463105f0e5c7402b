//! Endpoint and queue-pair configuration, with the source of each default.

use core::time::Duration;

use metaroce_core::api::PeerAddr;

use crate::cc::{CcConfig, DEFAULT_CNP_INTERVAL};
use crate::wire::DEFAULT_PKEY;

/// Local ACK timeout of the IBA encoding: 4.096 us * 2^`exponent` (IBA
/// the `timeout` QP attribute).
pub const fn local_ack_timeout(exponent: u8) -> Duration {
    Duration::from_nanos(4096u64 << (exponent & 0x1f))
}

/// `rnr_retry` value meaning "retry forever" (IBA, as `ibv_modify_qp` documents).
pub const RNR_RETRY_INFINITE: u8 = 7;

/// Endpoint-wide settings (those a NIC has per port or per QP but that a
/// baseline run sets once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Port line rate in bits per second: DCQCN's ceiling.
    pub line_rate_bps: u64,
    /// Bytes each packet occupies on the wire besides its transport packet
    /// (Ethernet header and FCS, IP and UDP headers, preamble and
    /// inter-frame gap), used to pace at the DCQCN rate.
    pub wire_overhead_bytes: u32,
    /// Partition key sent and required.
    pub pkey: u16,
    /// Requester retry timer, fixed as in hardware (no backoff). Default
    /// exponent 14 (67 ms), perftest's default `--qp-timeout`.
    pub local_ack_timeout: Duration,
    /// Retries after a timeout or a sequence-error NAK without progress
    /// before the QP fails with "retry exceeded". Default 7, the IBA
    /// maximum, which NCCL uses (`NCCL_IB_RETRY_CNT`).
    pub retry_count: u8,
    /// RNR retries; 7 means forever. Default 7, as NCCL sets.
    pub rnr_retry: u8,
    /// RNR timer code this responder puts in its RNR NAKs. Default 12
    /// (0.64 ms), as NCCL sets `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// The responder acknowledges at least every this many request packets
    /// (and always a packet with AckReq, which the requester sets on the
    /// last packet of every message). Real NICs coalesce ACKs by
    /// implementation-specific rules; 8 is this baseline's choice.
    pub ack_coalesce: u16,
    /// READ requests a requester keeps outstanding (`max_rd_atomic`).
    pub max_rd_atomic: u8,
    /// READ requests a responder holds (`max_dest_rd_atomic`); more are
    /// NAKed as invalid requests.
    pub max_dest_rd_atomic: u8,
    /// Notification point: at most one CNP per QP per interval.
    pub cnp_interval: Duration,
    /// Reaction point congestion control.
    pub cc: CcConfig,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            line_rate_bps: 100_000_000_000,
            // Ethernet 14 + FCS 4 + IPv4 20 + UDP 8 + preamble 8 + IFG 12.
            wire_overhead_bytes: 66,
            pkey: DEFAULT_PKEY,
            local_ack_timeout: local_ack_timeout(14),
            retry_count: 7,
            rnr_retry: RNR_RETRY_INFINITE,
            min_rnr_timer: 12,
            ack_coalesce: 8,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            cnp_interval: DEFAULT_CNP_INTERVAL,
            cc: CcConfig::default(),
        }
    }
}

/// The path MTUs InfiniBand defines (payload bytes per packet).
pub const VALID_MTUS: [u16; 5] = [256, 512, 1024, 2048, 4096];

/// What the out-of-band connection setup (RDMA-CM or a harness) tells a QP.
/// Each side creates its QP with the other's numbers: A's `send_psn` is B's
/// `recv_psn` and the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpSetup {
    /// This QP's number (24 bits; the peer's packets carry it as DestQP).
    pub local_qpn: u32,
    /// The peer's IP address and RoCEv2 port (normally 4791).
    pub peer: PeerAddr,
    /// The peer QP's number.
    pub remote_qpn: u32,
    /// First PSN this QP's requester sends (`sq_psn`).
    pub send_psn: u32,
    /// First PSN this QP's responder expects (`rq_psn`).
    pub recv_psn: u32,
    /// Path MTU, one of [`VALID_MTUS`].
    pub mtu: u16,
    /// Protection domain: only regions of this domain are reachable.
    pub pd: u32,
    /// UDP source port; `None` derives one from the QP numbers in
    /// 0xC000..=0xFFFF, as RoCE NICs hash the QP for ECMP entropy.
    pub udp_src_port: Option<u16>,
}

impl QpSetup {
    /// A setup with a 4096-byte MTU, domain 0 and a derived source port.
    pub fn new(
        local_qpn: u32,
        peer: PeerAddr,
        remote_qpn: u32,
        send_psn: u32,
        recv_psn: u32,
    ) -> QpSetup {
        QpSetup {
            local_qpn,
            peer,
            remote_qpn,
            send_psn,
            recv_psn,
            mtu: 4096,
            pd: 0,
            udp_src_port: None,
        }
    }

    /// The UDP source port the QP sends from.
    pub fn src_port(&self) -> u16 {
        self.udp_src_port.unwrap_or_else(|| {
            // A fixed mix of both QP numbers (FNV-1a style), folded to 14 bits.
            let mut h: u32 = 0x811c_9dc5;
            for b in self
                .local_qpn
                .to_be_bytes()
                .iter()
                .chain(self.remote_qpn.to_be_bytes().iter())
            {
                h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
            }
            0xc000 | ((h ^ (h >> 14) ^ (h >> 28)) & 0x3fff) as u16
        })
    }
}
