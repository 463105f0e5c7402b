//! What the transport reports: MetaRoCE completion statuses as libfabric
//! errors (`err`, `prov_errno`) and the provider's own counters.

use metaroce_core::api::Status;
use metaroce_core::CommandError;

use crate::flags::errno;

/// Counters of the provider's own decisions (printed at close with
/// `FI_METAROCE_STATS`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub eager_sent: u64,
    pub rndv_sent: u64,
    pub unexpected: u64,
    pub malformed: u64,
    pub connections_opened: u64,
    pub connections_accepted: u64,
    pub connections_failed: u64,
    /// Of the MetaRoCE connections (closed and open; host engine only):
    /// reliable packets sent, retransmitted, declared lost, timeouts,
    /// receiver-not-ready NAKs received, duplicates received.
    pub packets_sent: u64,
    pub retransmissions: u64,
    pub packets_lost: u64,
    pub timeouts: u64,
    pub rnr_naks: u64,
    pub duplicates: u64,
}

impl Stats {
    pub(super) fn add_connection(&mut self, c: &metaroce_core::stats::ConnStats) {
        self.packets_sent += c.packets_sent;
        self.retransmissions += c.retransmissions;
        self.packets_lost += c.packets_lost;
        self.timeouts += c.timeouts;
        self.rnr_naks += c.rnr_naks_received;
        self.duplicates += c.duplicates_received;
    }
}

/// The libfabric error of a MetaRoCE completion status.
pub fn fi_errno_of(status: Status) -> i32 {
    match status {
        Status::Success => 0,
        Status::LocalProtection => errno::EINVAL,
        Status::RemoteInvalidKey => errno::EKEYREJECTED,
        Status::RemoteAccess => errno::EACCES,
        Status::RemoteBounds => errno::EINVAL,
        Status::RemoteProtocol => errno::EREMOTEIO,
        Status::ReceiveTooSmall => errno::ETRUNC,
        Status::RetryExceeded => errno::ETIMEDOUT,
        Status::ReceiverNotReadyExceeded => errno::ENORX,
        Status::Flushed => errno::ECANCELED,
    }
}

/// `prov_errno` of a status: its number in spec chapter 6's completion
/// status table.
pub fn prov_errno_of(status: Status) -> i32 {
    match status {
        Status::Success => 0,
        Status::LocalProtection => 1,
        Status::RemoteInvalidKey => 2,
        Status::RemoteAccess => 3,
        Status::RemoteBounds => 4,
        Status::RemoteProtocol => 5,
        Status::ReceiveTooSmall => 6,
        Status::RetryExceeded => 7,
        Status::ReceiverNotReadyExceeded => 8,
        Status::Flushed => 9,
    }
}

pub(super) fn status_of_wire(code: u16) -> Status {
    match code {
        0 => Status::Success,
        1 => Status::LocalProtection,
        2 => Status::RemoteInvalidKey,
        3 => Status::RemoteAccess,
        4 => Status::RemoteBounds,
        5 => Status::RemoteProtocol,
        6 => Status::ReceiveTooSmall,
        7 => Status::RetryExceeded,
        8 => Status::ReceiverNotReadyExceeded,
        _ => Status::Flushed,
    }
}

pub(super) fn command_errno(e: CommandError) -> i32 {
    match e {
        CommandError::QueueFull => errno::EAGAIN,
        CommandError::NotOpen => errno::EIO,
        _ => errno::EINVAL,
    }
}
