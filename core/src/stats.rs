//! Counters, copyable for telemetry export (spec 4.13).

/// Per-connection counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConnStats {
    /// Reliable packets sent for the first time.
    pub packets_sent: u64,
    /// Payload bytes sent for the first time.
    pub bytes_sent: u64,
    pub retransmissions: u64,
    /// Retransmissions whose original turned out to have arrived.
    pub spurious_retransmissions: u64,
    pub packets_acked: u64,
    /// Packets declared lost (RACK or timeout).
    pub packets_lost: u64,
    pub timeouts: u64,
    /// Tail-loss probes sent (spec 4.6.5).
    pub probes: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub rnr_naks_received: u64,
    /// Reliable packets received and accepted (placed).
    pub packets_received: u64,
    /// Payload bytes placed.
    pub bytes_received: u64,
    /// Reliable packets received again (already had them): re-ACKed, not placed.
    pub duplicates_received: u64,
    /// Out-of-order packets dropped: the receive-bitmap pool had no room
    /// to record them (spec 4.14.3).
    pub reorder_refused: u64,
    /// The most PSNs this end had outstanding at once (sent and not
    /// cumulatively acknowledged, what the window of spec 4.4 bounds).
    pub max_in_flight: u64,
    /// Data packets that arrived CE-marked.
    pub ce_received: u64,
    /// Reliable packets outside the receive window: dropped.
    pub out_of_window: u64,
    /// Packets on a path id beyond the negotiated count, or otherwise
    /// impossible for the connection's state: dropped.
    pub invalid_dropped: u64,
    /// ACKs acknowledging PSNs never sent: dropped.
    pub invalid_acks: u64,
    pub path_rerolls: u64,
    pub completions: u64,
    /// Current controller rate and the last hint received, Mbit/s.
    pub rate_mbps: u32,
    pub rate_hint_mbps: u32,
}

/// Endpoint-wide counts of reliable packets a connection refused, by
/// reason (spec 4.7): answered with a NAK, or dropped silently.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RefusalStats {
    pub nak_invalid_key: u64,
    pub nak_access_denied: u64,
    pub nak_out_of_bounds: u64,
    pub nak_protocol_error: u64,
    pub nak_receiver_not_ready: u64,
    pub nak_receive_too_small: u64,
    /// Outside the negotiated window (spec 4.3): dropped.
    pub out_of_window: u64,
    /// A path id beyond the negotiated count, or a state that takes no
    /// reliable packet: dropped.
    pub invalid: u64,
}

impl RefusalStats {
    pub(crate) fn count_nak(&mut self, reason: crate::wire::NakReason) {
        use crate::wire::NakReason as R;
        match reason {
            R::InvalidKey => self.nak_invalid_key += 1,
            R::AccessDenied => self.nak_access_denied += 1,
            R::OutOfBounds => self.nak_out_of_bounds += 1,
            R::ProtocolError => self.nak_protocol_error += 1,
            R::ReceiverNotReady => self.nak_receiver_not_ready += 1,
            R::ReceiveTooSmall => self.nak_receive_too_small += 1,
        }
    }

    /// Every reason with its count.
    pub fn by_reason(&self) -> [(&'static str, u64); 8] {
        [
            ("nak_invalid_key", self.nak_invalid_key),
            ("nak_access_denied", self.nak_access_denied),
            ("nak_out_of_bounds", self.nak_out_of_bounds),
            ("nak_protocol_error", self.nak_protocol_error),
            ("nak_receiver_not_ready", self.nak_receiver_not_ready),
            ("nak_receive_too_small", self.nak_receive_too_small),
            ("out_of_window", self.out_of_window),
            ("invalid", self.invalid),
        ]
    }
}

/// Endpoint-wide drop counters by reason (spec 5.1): every packet the
/// endpoint does not accept is counted here or in [`ConnStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DropStats {
    pub truncated: u64,
    pub bad_version: u64,
    pub unknown_type: u64,
    pub bad_crc: u64,
    pub bad_length: u64,
    pub reserved_bits: u64,
    pub bad_field: u64,
    pub unknown_connection: u64,
    pub bad_token: u64,
    /// The source IP address is not the connection's peer.
    pub bad_source: u64,
    /// CONNECT refused: not accepting, or no free connection slot
    /// (answered CLOSE REJECTED).
    pub refused: u64,
    /// Packet of a type that makes no sense in the connection's state.
    pub unexpected: u64,
    /// Stateless replies (RETRY, CLOSE REJECTED) not sent: their queue was
    /// full.
    pub replies_dropped: u64,
    /// CONNECT without a cookie where one is required: no state, answered
    /// with a RETRY (spec 4.2).
    pub connect_unverified: u64,
    /// CONNECT whose cookie this endpoint did not issue for that address,
    /// port and offer: no state, answered with a RETRY.
    pub cookie_invalid: u64,
    /// CONNECT whose cookie is past its lifetime: no state, answered with
    /// a RETRY.
    pub cookie_expired: u64,
    /// Verified CONNECT refused: its source opened connections faster than
    /// its rate allows (answered CLOSE REJECTED, spec 5.1.4).
    pub refused_source_rate: u64,
    /// Verified CONNECT refused: its source holds its limit of half-open
    /// connections (answered CLOSE REJECTED).
    pub refused_source_half_open: u64,
    /// Verified CONNECT refused: its source prefix holds its share of the
    /// table, or, the table nearly full, at least its fair share (spec
    /// 4.2.3).
    pub refused_prefix_share: u64,
    /// Verified CONNECT refused: no room for its prefix in the prefix
    /// table's probe range.
    pub refused_prefix_table: u64,
    /// Verified CONNECT left unanswered while a slot is reclaimed for it:
    /// its next copy takes it.
    pub connect_deferred: u64,
    /// Connections ended with CLOSE (RECLAIMED) for a prefix holding less:
    /// unconfirmed ones, and idle established ones.
    pub reclaimed_unconfirmed: u64,
    pub reclaimed_idle: u64,
    /// RETRY not taken: not in Connecting, or an all-zero cookie (spec
    /// 4.2).
    pub retry_ignored: u64,
    /// RETRY not taken: one was already taken in this handshake. Normally
    /// the answer to the CONNECT's copy (`Config::connect_twice`), so not
    /// counted as a drop.
    pub retry_duplicate: u64,
    /// RETRYs sent (stateless replies).
    pub retries_sent: u64,
    /// CLOSE REJECTED sent without a connection (stateless replies).
    pub rejects_sent: u64,
    /// Early CONNECTs taken at once, with their first flight (spec 4.2.4).
    pub early_taken: u64,
    /// Early CONNECT whose proof does not verify (or no key, or no own
    /// address to check it with): answered with a RETRY, nothing kept.
    pub early_invalid: u64,
    /// Early CONNECT whose proof's time is outside the early window:
    /// answered with a RETRY.
    pub early_stale: u64,
    /// Early CONNECT whose proof was taken already: answered with a RETRY.
    pub early_replayed: u64,
    /// Early CONNECT with a valid proof not taken (an offer above this
    /// endpoint's maximum, or no room to remember the proof): answered
    /// with a RETRY.
    pub early_refused: u64,
    /// Early packet that names no connection taken by an early CONNECT
    /// (its CONNECT was lost, refused, or is behind it).
    pub early_unmatched: u64,
    /// Address tokens handed out (NEW_TOKEN, spec 4.2.5).
    pub tokens_issued: u64,
    /// CONNECTs whose address token this endpoint issued for their source
    /// address, within its lifetime: taken without a RETRY.
    pub token_taken: u64,
    /// CONNECT whose address token is not one this endpoint issued for
    /// that address, or is past its lifetime: answered with a RETRY.
    pub token_invalid: u64,
}

impl DropStats {
    /// Every reason with its count, for summaries and telemetry export.
    pub fn by_reason(&self) -> [(&'static str, u64); 36] {
        [
            ("truncated", self.truncated),
            ("bad_version", self.bad_version),
            ("unknown_type", self.unknown_type),
            ("bad_crc", self.bad_crc),
            ("bad_length", self.bad_length),
            ("reserved_bits", self.reserved_bits),
            ("bad_field", self.bad_field),
            ("unknown_connection", self.unknown_connection),
            ("bad_token", self.bad_token),
            ("bad_source", self.bad_source),
            ("refused", self.refused),
            ("unexpected", self.unexpected),
            ("replies_dropped", self.replies_dropped),
            ("connect_unverified", self.connect_unverified),
            ("cookie_invalid", self.cookie_invalid),
            ("cookie_expired", self.cookie_expired),
            ("refused_source_rate", self.refused_source_rate),
            ("refused_source_half_open", self.refused_source_half_open),
            ("refused_prefix_share", self.refused_prefix_share),
            ("refused_prefix_table", self.refused_prefix_table),
            ("connect_deferred", self.connect_deferred),
            ("reclaimed_unconfirmed", self.reclaimed_unconfirmed),
            ("reclaimed_idle", self.reclaimed_idle),
            ("retry_ignored", self.retry_ignored),
            ("retry_duplicate", self.retry_duplicate),
            ("retries_sent", self.retries_sent),
            ("rejects_sent", self.rejects_sent),
            ("early_taken", self.early_taken),
            ("early_invalid", self.early_invalid),
            ("early_stale", self.early_stale),
            ("early_replayed", self.early_replayed),
            ("early_refused", self.early_refused),
            ("early_unmatched", self.early_unmatched),
            ("tokens_issued", self.tokens_issued),
            ("token_taken", self.token_taken),
            ("token_invalid", self.token_invalid),
        ]
    }

    /// Packets dropped, every reason summed. Not counted: the stateless
    /// replies sent or not sent (they are not drops), and
    /// `connect_unverified`, a first CONNECT answered with a RETRY: the
    /// handshake's normal first step, and `retry_duplicate`, the RETRY
    /// answering the CONNECT's copy.
    pub fn total(&self) -> u64 {
        self.truncated
            + self.bad_version
            + self.unknown_type
            + self.bad_crc
            + self.bad_length
            + self.reserved_bits
            + self.bad_field
            + self.unknown_connection
            + self.bad_token
            + self.bad_source
            + self.refused
            + self.unexpected
            + self.cookie_invalid
            + self.cookie_expired
            + self.refused_source_rate
            + self.refused_source_half_open
            + self.refused_prefix_share
            + self.refused_prefix_table
            + self.retry_ignored
            + self.early_invalid
            + self.early_stale
            + self.early_replayed
            + self.early_unmatched
            + self.token_invalid
    }

    pub(crate) fn count_wire_error(&mut self, e: crate::wire::Error) {
        use crate::wire::Error as E;
        match e {
            E::Truncated => self.truncated += 1,
            E::BadVersion(_) => self.bad_version += 1,
            E::UnknownType(_) => self.unknown_type += 1,
            E::BadCrc => self.bad_crc += 1,
            E::BadLength => self.bad_length += 1,
            E::Reserved => self.reserved_bits += 1,
            E::BadField => self.bad_field += 1,
            E::NotMetaRoce | E::Encapsulation => self.truncated += 1,
        }
    }
}
