//! # metaroce-host
//!
//! MetaRoCE on a Linux host: the unmodified `metaroce-core` endpoint over
//! real UDP sockets (IPv4 and IPv6), with ordinary process buffers as
//! registered memory, and the `metaroce` command-line tool built on it.
//!
//! Path entropy appears on the wire as distinct UDP source ports: each
//! node binds one socket per entropy value (consecutive ports) and the
//! core's `entropy_base`/`entropy_span` are set to that run. Data packets
//! leave with ECT(0) and CE is read from arriving ones (`IP_TOS` /
//! `IPV6_TCLASS` control messages, [`io`]).
//!
//! The data path runs through `metaroce-platform`'s engine loop, the same
//! code as on the DPU and under QEMU (`Engine::poll_datagrams`): the
//! program posts into the host queues, the loop feeds the core packets,
//! time and work, places payload through `DmaCopy` on the process's
//! buffers and sends through the sockets as a `DatagramLink` ([`node`]).
//! Only Ethernet, IP, UDP and ARP belong to the kernel here instead of the
//! loop.
//!
//! It is **not** a kernel-bypass or zero-copy data path: every datagram is
//! one `sendmsg`/`recvmsg`, and the timers suit round trips of
//! milliseconds (loopback, network namespaces), not a data-centre fabric.

pub mod counters;
pub mod io;
pub mod memory;
pub mod node;
pub mod pcap;
pub mod protection;
pub mod session;
pub mod shard;

/// The application protocol of `serve` (its own `no_std` crate, shared
/// with the firmware's serve role).
pub use metaroce_app as app;

pub use memory::Arenas;
pub use node::{Node, NodeConfig};

/// Why a host operation failed. Each maps to one documented exit code of
/// the `metaroce` tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// Bad command-line value (address, size, paths).
    Usage(String),
    /// A socket could not be bound (port in use, address not local).
    Bind(String),
    /// The peer did not answer the handshake, or refused it.
    Unreachable(String),
    /// The transfer stalled or the connection failed.
    Transfer(String),
    /// Data arrived but differs from what was sent.
    Integrity(String),
    /// A file could not be written.
    Io(String),
}

impl HostError {
    /// The process exit code for this error (documented in the tool's help).
    pub fn exit_code(&self) -> u8 {
        match self {
            HostError::Integrity(_) => 1,
            HostError::Usage(_) => 2,
            HostError::Bind(_) => 3,
            HostError::Unreachable(_) => 4,
            HostError::Transfer(_) => 5,
            HostError::Io(_) => 6,
        }
    }
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Usage(m) => write!(f, "usage: {m}"),
            HostError::Bind(m) => write!(f, "cannot bind {m}"),
            HostError::Unreachable(m) => write!(f, "peer unreachable: {m}"),
            HostError::Transfer(m) => write!(f, "transfer failed: {m}"),
            HostError::Integrity(m) => write!(f, "integrity check failed: {m}"),
            HostError::Io(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for HostError {}
