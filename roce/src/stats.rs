//! Counters of queue pairs and of the endpoint, for experiments and tests.

/// Per-queue-pair counters. Packets are counted as they are handed out by
/// `poll_transmit` or taken in by `handle_packet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct QpCounters {
    /// Every packet sent (data, ACK/NAK, CNP).
    pub packets_sent: u64,
    /// Request and READ response packets sent, retransmissions included.
    pub data_packets_sent: u64,
    /// Payload bytes of those packets.
    pub payload_bytes_sent: u64,
    /// Request packets sent again (PSN below the highest sent before).
    pub retransmitted_packets: u64,
    /// READ requests re-issued for a remaining part of a READ.
    pub read_requests_reissued: u64,
    pub acks_sent: u64,
    /// NAKs sent: PSN sequence errors.
    pub seq_naks_sent: u64,
    pub rnr_naks_sent: u64,
    /// NAKs sent for invalid requests, access and operational errors.
    pub fatal_naks_sent: u64,
    pub acks_received: u64,
    pub seq_naks_received: u64,
    /// Sequence-error NAKs ignored because a retry from that PSN was already
    /// under way.
    pub seq_naks_ignored: u64,
    pub rnr_naks_received: u64,
    pub fatal_naks_received: u64,
    /// Go-back-N restarts caused by missing READ responses (implied NAKs
    /// and out-of-sequence responses).
    pub read_gaps: u64,
    /// Retry timer expiries that restarted transmission.
    pub timeouts: u64,
    pub cnps_sent: u64,
    pub cnps_received: u64,
    /// Received data packets that carried Congestion Experienced.
    pub ecn_marked_received: u64,
    pub packets_received: u64,
    /// Requests with a PSN already executed (re-ACKed, or READ re-run).
    pub duplicates_received: u64,
    /// Requests ahead of the expected PSN, dropped.
    pub out_of_sequence_dropped: u64,
    /// READ responses and ACKs not matching anything outstanding.
    pub stale_responses: u64,
    /// ACKs or NAKs dropped because the response queue was full.
    pub responses_dropped: u64,
}

/// Endpoint-wide counters of packets that reached no queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EndpointCounters {
    /// Did not parse.
    pub malformed: u64,
    /// No queue pair has the destination QP number.
    pub unknown_qp: u64,
    /// Came from an address other than the queue pair's peer.
    pub wrong_peer: u64,
    /// Partition key mismatch.
    pub bad_pkey: u64,
    /// Failed the ICRC check (`handle_frame`).
    pub bad_icrc: u64,
}
