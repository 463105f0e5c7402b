//! Types an application (or the platform's host interface) exchanges with a
//! transport endpoint: memory regions, work requests, completions, the
//! memory the endpoint places payload into, and what it asks to transmit.
//!
//! They are shared by the MetaRoCE engine and the RoCEv2 baseline so one
//! harness (simulator, QEMU firmware, host tool) can drive either.

use smoltcp::wire::IpAddress;

use crate::wire::MemoryTarget;

/// A peer's transport address: IP address and UDP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PeerAddr {
    pub ip: IpAddress,
    pub port: u16,
}

/// What the platform knows about a received packet besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RxMeta {
    /// Source IP address and UDP source port (the sender's path entropy).
    pub source: PeerAddr,
    /// The IP header carried Congestion Experienced.
    pub ce: bool,
}

/// Access rights of a memory region (bit set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Access(pub u8);

impl Access {
    /// The local application may post receives / READ sinks into it.
    pub const LOCAL_WRITE: Access = Access(0b001);
    /// Peers may WRITE into it.
    pub const REMOTE_WRITE: Access = Access(0b010);
    /// Peers may READ from it.
    pub const REMOTE_READ: Access = Access(0b100);
    /// Every right.
    pub const ALL: Access = Access(0b111);

    /// Whether every right in `other` is granted.
    pub const fn allows(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    #[must_use]
    pub const fn with(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

/// A memory region to register: `[base, base + len)` in the address space
/// the caller's [`Memory`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Region {
    pub base: u64,
    pub len: u64,
    pub access: Access,
    /// Protection domain: only connections in the same domain may use it.
    pub pd: u32,
}

impl Region {
    /// Whether `[addr, addr + len)` lies inside the region (overflow-safe).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_sub(self.base), addr.checked_add(len)) {
            (Some(offset), Some(_)) => offset <= self.len && len <= self.len - offset,
            _ => false,
        }
    }
}

/// A local buffer: registered key, address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LocalBuf {
    pub key: u32,
    pub addr: u64,
    pub len: u32,
}

/// The operation of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Op {
    /// Write `local` to `remote`.
    Write { remote: MemoryTarget },
    /// Write `local` to `remote`, then complete a receive at the peer with `imm`.
    WriteImm { remote: MemoryTarget, imm: u32 },
    /// Send `local` into the peer's next posted receive.
    Send,
    /// Send with immediate data.
    SendImm { imm: u32 },
    /// Read `local.len` bytes from `remote` into `local`.
    Read { remote: MemoryTarget },
}

impl Op {
    /// The opcode its completion reports.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Op::Write { .. } => Opcode::Write,
            Op::WriteImm { .. } => Opcode::WriteImm,
            Op::Send | Op::SendImm { .. } => Opcode::Send,
            Op::Read { .. } => Opcode::Read,
        }
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WorkRequest {
    /// The caller's identifier, returned in the completion.
    pub id: u64,
    pub op: Op,
    pub local: LocalBuf,
}

/// A receive-queue work request: a buffer for one incoming SEND (or the
/// completion of one WRITE_IMM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RecvRequest {
    pub id: u64,
    pub local: LocalBuf,
}

/// Handle of a connection (queue pair) within one endpoint: its slot and
/// the slot's generation. Handles are generational: once the application
/// releases a connection, its handle is refused, even after the slot holds
/// another connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConnHandle {
    pub index: u32,
    pub generation: u32,
}

impl ConnHandle {
    /// Both parts in one `u64` (generation high), for host ABIs and logs.
    pub const fn to_bits(self) -> u64 {
        (self.generation as u64) << 32 | self.index as u64
    }

    /// The inverse of [`ConnHandle::to_bits`].
    pub const fn from_bits(bits: u64) -> ConnHandle {
        ConnHandle {
            index: bits as u32,
            generation: (bits >> 32) as u32,
        }
    }
}

impl core::fmt::Display for ConnHandle {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}", self.index, self.generation)
    }
}

/// What a completion reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Opcode {
    Write,
    WriteImm,
    Send,
    Read,
    /// A receive consumed by a SEND or SEND_IMM.
    Recv,
    /// A receive consumed by a WRITE_IMM (no bytes placed in its buffer).
    RecvWriteImm,
}

/// Completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Status {
    Success,
    /// The local buffer's key, bounds or rights are wrong (checked at post).
    LocalProtection,
    /// The peer rejected the memory key.
    RemoteInvalidKey,
    /// The peer's region does not grant this access.
    RemoteAccess,
    /// The address range is outside the peer's region.
    RemoteBounds,
    /// The peer reported a protocol error.
    RemoteProtocol,
    /// The peer's posted receive is smaller than the SEND.
    ReceiveTooSmall,
    /// Retransmissions exhausted without an acknowledgment.
    RetryExceeded,
    /// The peer had no receive posted for too long.
    ReceiverNotReadyExceeded,
    /// The connection failed or closed before this request could complete.
    Flushed,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Completion {
    pub conn: ConnHandle,
    pub wr_id: u64,
    pub opcode: Opcode,
    pub status: Status,
    /// Bytes transferred (for receives: bytes placed).
    pub byte_len: u32,
    pub imm: Option<u32>,
}

/// Registered memory as the endpoint reaches it: the caller implements it
/// (DMA copies on a NIC, slices in a host program). The endpoint validates
/// every address against its registered regions before calling, so an
/// implementation may assume `[addr, addr + len)` lies in a region the
/// caller registered.
pub trait Memory {
    /// Places `data` at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]);
    /// Fills `out` from `addr`.
    fn read(&mut self, addr: u64, out: &mut [u8]);
}

/// Where a transmitted packet's payload comes from: registered memory the
/// caller gathers after the header (no staging copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PayloadRef {
    pub addr: u64,
    pub len: u32,
}

/// A packet the endpoint wants sent. Its headers are in the buffer passed to
/// `poll_transmit` (`buf[..header_len]`); the payload, if any, is gathered
/// from memory; the CRC trailer follows (see each protocol's `finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Transmit {
    /// Destination address and UDP port.
    pub peer: PeerAddr,
    /// UDP source port to use (path entropy).
    pub src_port: u16,
    /// ECN codepoint for the IP header.
    pub ecn: u8,
    /// Bytes of transport headers written into the caller's buffer.
    pub header_len: usize,
    /// Payload to gather after the headers.
    pub payload: Option<PayloadRef>,
    /// A protected packet (spec 5.3): the payload is encrypted and a tag
    /// appended before the CRC, with the keys this names (the endpoint's
    /// `finish_transmit` does it); `header_len` includes the security
    /// extension.
    pub seal: Option<SealRef>,
}

/// Which keys seal a protected transmit: a slot of the endpoint's key
/// pool and the slot's epoch when the packet was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SealRef {
    pub slot: u32,
    pub epoch: u32,
}

impl Transmit {
    /// Transport packet length: headers, payload, the tag of a protected
    /// packet and the 4-byte CRC trailer.
    #[inline]
    pub fn packet_len(&self) -> usize {
        let tag = if self.seal.is_some() {
            crate::wire::protect::TAG_LEN
        } else {
            0
        };
        self.header_len + self.payload.map_or(0, |p| p.len as usize) + tag + crate::wire::CRC_LEN
    }
}
