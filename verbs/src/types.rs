//! The library's vocabulary: handles, work requests, completions, events,
//! statuses and errors, as safe Rust types over the ABI's numbers.

use std::fmt;
use std::net::SocketAddr;

use metaroce_abi as abi;

/// A connection: the device's slot index and its generation (a handle
/// kept after its connection was released is refused as stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conn {
    pub index: u32,
    pub generation: u32,
}

/// A registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryRegion {
    /// The key peers name in WRITE and READ, and the host in local buffers.
    pub key: u32,
    /// I/O address of the first byte.
    pub addr: u64,
    pub len: u64,
}

impl MemoryRegion {
    /// A local buffer of `len` bytes at `offset` into this region.
    pub fn slice(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            len,
            key: self.key,
        }
    }
}

/// Access rights of a region: a bit set over `metaroce_abi::ACCESS_*`
/// (in C, a plain `metaroce_access_flags` integer of `MR_ACCESS_*` bits).
/// Combine with `|`.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No right beyond local reads (the device's sends and WRITE sources).
    pub const NONE: Access = Access(0);
    pub const LOCAL_WRITE: Access = Access(abi::ACCESS_LOCAL_WRITE);
    pub const REMOTE_WRITE: Access = Access(abi::ACCESS_REMOTE_WRITE);
    pub const REMOTE_READ: Access = Access(abi::ACCESS_REMOTE_READ);
    pub const ALL: Access = Access(abi::ACCESS_ALL);

    /// The rights of the ABI bits `bits` (unknown bits are passed on: the
    /// device refuses them).
    pub const fn from_bits(bits: u32) -> Access {
        Access(bits)
    }

    /// The ABI bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every right of `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A local buffer: I/O address, length, key ("scatter-gather element").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
}

/// A remote buffer: the peer's I/O address and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Remote {
    pub addr: u64,
    pub key: u32,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    Write(Remote),
    WriteImm(Remote, u32),
    Send,
    SendImm(u32),
    Read(Remote),
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub local: Sge,
}

impl SendWr {
    /// The ABI entry for connection `conn`.
    pub(crate) fn entry(&self, conn: Conn) -> abi::SendWqe {
        let (opcode, remote, imm) = match self.op {
            SendOp::Write(r) => (abi::OP_WRITE, Some(r), 0),
            SendOp::WriteImm(r, imm) => (abi::OP_WRITE_IMM, Some(r), imm),
            SendOp::Send => (abi::OP_SEND, None, 0),
            SendOp::SendImm(imm) => (abi::OP_SEND_IMM, None, imm),
            SendOp::Read(r) => (abi::OP_READ, Some(r), 0),
        };
        abi::SendWqe {
            wr_id: self.wr_id,
            conn_index: conn.index,
            conn_generation: conn.generation,
            opcode,
            imm,
            lkey: self.local.key,
            length: self.local.len,
            laddr: self.local.addr,
            raddr: remote.map_or(0, |r| r.addr),
            rkey: remote.map_or(0, |r| r.key),
            ..abi::SendWqe::default()
        }
    }
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvWr {
    pub wr_id: u64,
    pub local: Sge,
}

impl RecvWr {
    /// The ABI entry for connection `conn`.
    pub(crate) fn entry(&self, conn: Conn) -> abi::RecvWqe {
        abi::RecvWqe {
            wr_id: self.wr_id,
            conn_index: conn.index,
            conn_generation: conn.generation,
            lkey: self.local.key,
            length: self.local.len,
            laddr: self.local.addr,
        }
    }
}

/// What a completion reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Opcode {
    Write,
    WriteImm,
    Send,
    Read,
    /// A receive consumed by a SEND.
    Recv,
    /// A receive consumed by a WRITE_IMM.
    RecvWriteImm,
    Unknown(u8),
}

impl Opcode {
    pub fn from_code(code: u8) -> Opcode {
        match code {
            abi::OP_WRITE => Opcode::Write,
            abi::OP_WRITE_IMM => Opcode::WriteImm,
            abi::OP_SEND | abi::OP_SEND_IMM => Opcode::Send,
            abi::OP_READ => Opcode::Read,
            abi::OP_RECV => Opcode::Recv,
            abi::OP_RECV_WRITE_IMM => Opcode::RecvWriteImm,
            other => Opcode::Unknown(other),
        }
    }

    /// The ABI number (`metaroce_abi::OP_*`; `SEND_IMM` completes as
    /// `SEND`).
    pub fn code(self) -> u8 {
        match self {
            Opcode::Write => abi::OP_WRITE,
            Opcode::WriteImm => abi::OP_WRITE_IMM,
            Opcode::Send => abi::OP_SEND,
            Opcode::Read => abi::OP_READ,
            Opcode::Recv => abi::OP_RECV,
            Opcode::RecvWriteImm => abi::OP_RECV_WRITE_IMM,
            Opcode::Unknown(code) => code,
        }
    }
}

/// A completion or refusal status (`metaroce_abi::STATUS_*`, spec 6.7):
/// the one status type of the library, in completions, events and
/// refusals ([`Error::Refused`]), and, through [`Status::code`], the C
/// API's `MR_STATUS_*` numbers. New codes may come with new ABI minors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    Success,
    LocalProtection,
    RemoteInvalidKey,
    RemoteAccess,
    RemoteBounds,
    RemoteProtocol,
    ReceiveTooSmall,
    RetryExceeded,
    RnrExceeded,
    Flushed,
    BadOpcode,
    BadLength,
    BadConnection,
    BadAddress,
    NoResources,
    InvalidRequest,
    NotPermitted,
    BadKey,
    /// The queue set is at its quota (spec 6.10): which resource is in
    /// [`crate::Device::quota`]'s `refused`.
    QuotaExceeded,
    Unknown(u8),
}

impl Status {
    pub fn from_code(code: u8) -> Status {
        match code {
            abi::STATUS_SUCCESS => Status::Success,
            abi::STATUS_LOCAL_PROTECTION => Status::LocalProtection,
            abi::STATUS_REMOTE_INVALID_KEY => Status::RemoteInvalidKey,
            abi::STATUS_REMOTE_ACCESS => Status::RemoteAccess,
            abi::STATUS_REMOTE_BOUNDS => Status::RemoteBounds,
            abi::STATUS_REMOTE_PROTOCOL => Status::RemoteProtocol,
            abi::STATUS_RECEIVE_TOO_SMALL => Status::ReceiveTooSmall,
            abi::STATUS_RETRY_EXCEEDED => Status::RetryExceeded,
            abi::STATUS_RNR_EXCEEDED => Status::RnrExceeded,
            abi::STATUS_FLUSHED => Status::Flushed,
            abi::STATUS_BAD_OPCODE => Status::BadOpcode,
            abi::STATUS_BAD_LENGTH => Status::BadLength,
            abi::STATUS_BAD_CONNECTION => Status::BadConnection,
            abi::STATUS_BAD_ADDRESS => Status::BadAddress,
            abi::STATUS_NO_RESOURCES => Status::NoResources,
            abi::STATUS_INVALID_REQUEST => Status::InvalidRequest,
            abi::STATUS_NOT_PERMITTED => Status::NotPermitted,
            abi::STATUS_BAD_KEY => Status::BadKey,
            abi::STATUS_QUOTA_EXCEEDED => Status::QuotaExceeded,
            other => Status::Unknown(other),
        }
    }

    /// The ABI number (`metaroce_abi::STATUS_*`): the inverse of
    /// [`Status::from_code`].
    pub fn code(self) -> u8 {
        match self {
            Status::Success => abi::STATUS_SUCCESS,
            Status::LocalProtection => abi::STATUS_LOCAL_PROTECTION,
            Status::RemoteInvalidKey => abi::STATUS_REMOTE_INVALID_KEY,
            Status::RemoteAccess => abi::STATUS_REMOTE_ACCESS,
            Status::RemoteBounds => abi::STATUS_REMOTE_BOUNDS,
            Status::RemoteProtocol => abi::STATUS_REMOTE_PROTOCOL,
            Status::ReceiveTooSmall => abi::STATUS_RECEIVE_TOO_SMALL,
            Status::RetryExceeded => abi::STATUS_RETRY_EXCEEDED,
            Status::RnrExceeded => abi::STATUS_RNR_EXCEEDED,
            Status::Flushed => abi::STATUS_FLUSHED,
            Status::BadOpcode => abi::STATUS_BAD_OPCODE,
            Status::BadLength => abi::STATUS_BAD_LENGTH,
            Status::BadConnection => abi::STATUS_BAD_CONNECTION,
            Status::BadAddress => abi::STATUS_BAD_ADDRESS,
            Status::NoResources => abi::STATUS_NO_RESOURCES,
            Status::InvalidRequest => abi::STATUS_INVALID_REQUEST,
            Status::NotPermitted => abi::STATUS_NOT_PERMITTED,
            Status::BadKey => abi::STATUS_BAD_KEY,
            Status::QuotaExceeded => abi::STATUS_QUOTA_EXCEEDED,
            Status::Unknown(code) => code,
        }
    }

    pub fn is_success(self) -> bool {
        self == Status::Success
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub conn: Conn,
    pub opcode: Opcode,
    pub status: Status,
    /// Bytes transferred (receives: bytes placed).
    pub byte_len: u32,
    pub imm: Option<u32>,
}

impl Default for WorkCompletion {
    /// A placeholder for arrays [`crate::CompletionQueue::poll`] fills.
    fn default() -> Self {
        WorkCompletion {
            wr_id: 0,
            conn: Conn {
                index: 0,
                generation: 0,
            },
            opcode: Opcode::Unknown(0),
            status: Status::Success,
            byte_len: 0,
            imm: None,
        }
    }
}

impl WorkCompletion {
    pub(crate) fn from_entry(e: &abi::Cqe) -> WorkCompletion {
        WorkCompletion {
            wr_id: e.wr_id,
            conn: Conn {
                index: e.conn_index,
                generation: e.conn_generation,
            },
            opcode: Opcode::from_code(e.opcode),
            status: Status::from_code(e.status),
            byte_len: e.byte_len,
            imm: (e.flags & abi::CQE_FLAG_IMM != 0).then_some(e.imm),
        }
    }
}

/// A connection event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A peer opened a connection to this (listening) queue set.
    Incoming {
        conn: Conn,
        peer: SocketAddr,
    },
    Connected(Conn),
    /// `reason` is the CLOSE reason code of the wire (spec 3).
    Closed {
        conn: Conn,
        reason: u32,
    },
    Failed {
        conn: Conn,
        status: Status,
    },
}

/// Why a library call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be opened or mapped.
    Io(std::io::Error),
    /// The memory is not a MetaRoCE device (magic or size wrong).
    NotADevice,
    /// The device speaks another major ABI version.
    Version { major: u16, minor: u16 },
    /// The device did not become ready in time.
    NotReady,
    /// The device reported a fatal error.
    DeviceFailed,
    /// Every queue set is claimed (or the one asked for is).
    NoFreeQueueSet,
    /// The device's layout is inconsistent (a bug or corruption).
    BadLayout(&'static str),
    /// The ring (or the completion queue's room) is full: poll, then retry.
    QueueFull,
    /// The range is outside this queue set's window.
    OutOfWindow { addr: u64, len: u64 },
    /// The device refused the command.
    Refused(Status),
    /// The device did not answer in time.
    Timeout,
    /// The connection failed or closed before it was up.
    ConnectionFailed(Status),
    /// The queue set's completion queue is already handed out
    /// ([`crate::Device::completion_queue`]): one consumer at a time.
    InUse,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "shared-memory file: {e}"),
            Error::NotADevice => write!(f, "not a MetaRoCE host interface (bad magic or size)"),
            Error::Version { major, minor } => write!(
                f,
                "device ABI {major}.{minor}, this library speaks {}.{}",
                abi::ABI_MAJOR,
                abi::ABI_MINOR
            ),
            Error::NotReady => write!(f, "the device did not become ready"),
            Error::DeviceFailed => write!(f, "the device reported a fatal error"),
            Error::NoFreeQueueSet => write!(f, "no free queue set"),
            Error::BadLayout(what) => write!(f, "inconsistent device layout: {what}"),
            Error::QueueFull => write!(f, "queue full: poll completions and retry"),
            Error::OutOfWindow { addr, len } => write!(
                f,
                "{len} bytes at {addr:#x} are outside this queue set's memory window"
            ),
            Error::Refused(s) => write!(f, "refused by the device: {s:?}"),
            Error::Timeout => write!(f, "the device did not answer in time"),
            Error::ConnectionFailed(s) => write!(f, "connection failed: {s:?}"),
            Error::InUse => write!(f, "the completion queue is already in use"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Why a batch of work requests was not posted whole (`ibv_post_send`'s
/// `bad_wr`): the first `posted` requests were posted (under one
/// doorbell), the one at index `posted` was not, for `error`, and none
/// after it.
#[derive(Debug)]
pub struct PostError {
    /// How many requests of the batch were posted: the index of the first
    /// that was not.
    pub posted: usize,
    /// Why that one was not: [`Error::QueueFull`] when the ring or the
    /// completion queue's room ran out (poll, then post the rest).
    pub error: Error,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "work request {} not posted ({} were): {}",
            self.posted, self.posted, self.error
        )
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<PostError> for Error {
    /// The error of the first request not posted (for callers that post
    /// one request at a time).
    fn from(e: PostError) -> Self {
        e.error
    }
}
