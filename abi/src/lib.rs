//! # metaroce-abi
//!
//! The byte layout of MetaRoCE's host interface (specification chapter 6,
//! `docs/spec/06-host-interface.md`): the shared-memory device header, the
//! queue sets a host process claims, their doorbell records, and every
//! queue entry (send and receive work entries, completions with an owner
//! (phase) bit, admin commands and admin completions/events), with the
//! opcode, status, access, feature and event numbers. The firmware's device
//! side (`metaroce_platform::hostif`) and the host library
//! (`metaroce-verbs`) both use these types; the C header
//! `abi/include/metaroce_abi.h` is generated from them by cbindgen and a
//! test checks the committed one matches, and another that the spec's
//! layout tables match [`LAYOUTS`].
//!
//! Every type is `repr(C)`, naturally aligned and free of padding: the
//! `zerocopy` derives prove the last at compile time, and `const`
//! assertions pin every size and offset. Integers are little-endian (both
//! sides of every supported pairing are; a big-endian build is refused).
//!
//! It is **not** the protocol that moves these entries: ordering,
//! validation and the rings' state machines live with each side
//! (`metaroce_platform::hostif` for the device, `metaroce-verbs` for the
//! host). What both sides share beyond the bytes is the accessor of the
//! shared memory itself, [`shmem::SharedMemory`]: bounds-checked atomic,
//! volatile and copy accesses, the ordering rules of spec 6.4.
//!
//! `no_std`, no allocation; `unsafe` only in [`shmem`] (the crate denies
//! it elsewhere), each block with its `SAFETY:` comment.

#![no_std]
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_endian = "big")]
compile_error!("the MetaRoCE host-interface ABI is little-endian");

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

mod layout;
pub mod shmem;
pub use layout::{FieldLayout, StructLayout, LAYOUTS};

// ----- identification ---------------------------------------------------

/// `DeviceHeader::magic`: "MRHI" read as a little-endian `u32`.
pub const MAGIC: u32 = 0x4948_524d;
/// Major version: a host refuses a device whose major differs.
pub const ABI_MAJOR: u16 = 1;
/// Minor version: additions a host may ignore (reserved fields put to use,
/// new feature bits).
pub const ABI_MINOR: u16 = 1;

// ----- feature bits (DeviceHeader::features) ----------------------------

/// WRITE with immediate data.
pub const FEATURE_WRITE_IMM: u64 = 1 << 0;
/// RDMA READ.
pub const FEATURE_READ: u64 = 1 << 1;
/// SEND with immediate data.
pub const FEATURE_SEND_IMM: u64 = 1 << 2;
/// Connection events on the admin completion queue.
pub const FEATURE_EVENTS: u64 = 1 << 3;
/// One protection domain per queue set, enforced by the device.
pub const FEATURE_TENANTS: u64 = 1 << 4;
/// The QUERY_COUNTERS admin command.
pub const FEATURE_COUNTERS: u64 = 1 << 5;
/// Per-queue-set quotas (spec 6.10): the SET_QUOTA admin command, the
/// [`SetQuota`] block and `STATUS_QUOTA_EXCEEDED` (version 1.1).
pub const FEATURE_QUOTAS: u64 = 1 << 6;
/// Everything version 1.1 offers.
pub const FEATURES_V1: u64 = FEATURE_WRITE_IMM
    | FEATURE_READ
    | FEATURE_SEND_IMM
    | FEATURE_EVENTS
    | FEATURE_TENANTS
    | FEATURE_COUNTERS
    | FEATURE_QUOTAS;

// ----- device and queue-set states ---------------------------------------

/// The device has not finished formatting the shared memory.
pub const DEVICE_STATE_RESET: u32 = 0;
/// The device serves the queue sets.
pub const DEVICE_STATE_READY: u32 = 1;
/// The device stopped (fatal error); the host must not post.
pub const DEVICE_STATE_FAILED: u32 = 2;

/// `QueueSetHeader::owner` of a set no host process holds.
pub const OWNER_FREE: u32 = 0;

// ----- access rights (AdminCmd::access) -----------------------------------

/// Local receives and READ sinks may be placed in the region.
pub const ACCESS_LOCAL_WRITE: u32 = 1 << 0;
/// Peers may WRITE into the region.
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// Peers may READ from the region.
pub const ACCESS_REMOTE_READ: u32 = 1 << 2;
/// Every right.
pub const ACCESS_ALL: u32 = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

// ----- send-queue and completion opcodes ----------------------------------

/// Write the local buffer to `raddr` under `rkey`.
pub const OP_WRITE: u8 = 1;
/// WRITE, then complete a receive at the peer with `imm`.
pub const OP_WRITE_IMM: u8 = 2;
/// Send the local buffer into the peer's next posted receive.
pub const OP_SEND: u8 = 3;
/// SEND with immediate data.
pub const OP_SEND_IMM: u8 = 4;
/// Read `length` bytes at `raddr` under `rkey` into the local buffer.
pub const OP_READ: u8 = 5;
/// Completion of a receive consumed by a SEND (completions only).
pub const OP_RECV: u8 = 6;
/// Completion of a receive consumed by a WRITE_IMM (completions only).
pub const OP_RECV_WRITE_IMM: u8 = 7;

/// `Cqe::flags`: `imm` is valid.
pub const CQE_FLAG_IMM: u8 = 1 << 0;

// ----- completion status (Cqe::status, AdminCqe::status) ------------------

pub const STATUS_SUCCESS: u8 = 0;
/// The local buffer's key, domain, rights or bounds are wrong.
pub const STATUS_LOCAL_PROTECTION: u8 = 1;
/// The peer rejected the memory key.
pub const STATUS_REMOTE_INVALID_KEY: u8 = 2;
/// The peer's region does not grant this access.
pub const STATUS_REMOTE_ACCESS: u8 = 3;
/// The range is outside the peer's region.
pub const STATUS_REMOTE_BOUNDS: u8 = 4;
/// The peer reported a protocol error.
pub const STATUS_REMOTE_PROTOCOL: u8 = 5;
/// The peer's posted receive is smaller than the SEND.
pub const STATUS_RECEIVE_TOO_SMALL: u8 = 6;
/// Retransmissions exhausted without an acknowledgment.
pub const STATUS_RETRY_EXCEEDED: u8 = 7;
/// The peer had no receive posted for too long.
pub const STATUS_RNR_EXCEEDED: u8 = 8;
/// The connection ended before the request completed.
pub const STATUS_FLUSHED: u8 = 9;
/// Refused by the device: unknown opcode (work entry or admin command).
pub const STATUS_BAD_OPCODE: u8 = 16;
/// Refused by the device: zero or too long a length.
pub const STATUS_BAD_LENGTH: u8 = 17;
/// Refused by the device: the connection handle is unknown, stale
/// (generation) or belongs to another queue set.
pub const STATUS_BAD_CONNECTION: u8 = 18;
/// Refused by the device: an address outside the queue set's window.
pub const STATUS_BAD_ADDRESS: u8 = 19;
/// Refused by the device: a table (regions, connections) is full.
pub const STATUS_NO_RESOURCES: u8 = 20;
/// Refused by the device: reserved flags set or arguments inconsistent.
pub const STATUS_INVALID_REQUEST: u8 = 21;
/// Refused by the device: the object belongs to another queue set, or the
/// range overlaps another tenant's memory.
pub const STATUS_NOT_PERMITTED: u8 = 22;
/// Refused by the device: the key is unknown.
pub const STATUS_BAD_KEY: u8 = 23;
/// Refused by the device: the queue set is at its quota for the resource
/// the request would take (spec 6.10; which one: [`SetQuota::refused`]).
pub const STATUS_QUOTA_EXCEEDED: u8 = 24;

// ----- admin opcodes (AdminCmd::opcode) ------------------------------------

/// Register `[addr, addr + len)` with `access`; the key comes back in
/// `AdminCqe::value`.
pub const ADMIN_REGISTER_REGION: u8 = 1;
/// Deregister `key`.
pub const ADMIN_DEREGISTER_REGION: u8 = 2;
/// Open a connection to `ip`:`port`; the handle comes back at once, the
/// `EVENT_CONNECTED` (or `EVENT_FAILED`) event later.
pub const ADMIN_CONNECT: u8 = 3;
/// Offer this queue set the device's incoming connections
/// (`EVENT_INCOMING`).
pub const ADMIN_LISTEN: u8 = 4;
/// Take an offered connection (after `EVENT_INCOMING`).
pub const ADMIN_ACCEPT: u8 = 5;
/// Close a connection gracefully (or refuse an offered one).
pub const ADMIN_CLOSE: u8 = 6;
/// Give a closed or failed connection's handle back.
pub const ADMIN_RELEASE: u8 = 7;
/// Write a fresh `SetCounters` snapshot (and the [`SetQuota`] block) into
/// the queue set.
pub const ADMIN_QUERY_COUNTERS: u8 = 8;
/// Set a queue set's quota ([`QuotaCmd`]); only the management set (the
/// last queue set) may (spec 6.10).
pub const ADMIN_SET_QUOTA: u8 = 9;

// ----- quotas (spec 6.10) -----------------------------------------------------

/// A [`QuotaCmd`] limit meaning "the device's default share".
pub const QUOTA_DEFAULT: u64 = u64::MAX;

// ----- admin completion kinds (AdminCqe::kind) ------------------------------

/// The answer to the admin command with `tag`.
pub const EVENT_COMMAND_DONE: u8 = 1;
/// A peer opened a connection; ACCEPT or CLOSE it.
pub const EVENT_INCOMING: u8 = 2;
/// A connection's handshake completed.
pub const EVENT_CONNECTED: u8 = 3;
/// A connection closed (`detail`: the wire's CLOSE reason code, spec 3).
pub const EVENT_CLOSED: u8 = 4;
/// A connection failed (`status` says why); its work was flushed.
pub const EVENT_FAILED: u8 = 5;

// ----- default geometry (published in the headers; hosts read those) -------

/// Bytes of the device header page.
pub const DEVICE_HEADER_PAGE: u64 = 4096;
/// Offset of queue set 0 in the default layout.
pub const DEFAULT_SET_OFFSET: u64 = 0x1000;
/// Bytes per queue set in the default layout.
pub const DEFAULT_SET_STRIDE: u64 = 0x8000;
/// Queue sets in the default layout.
pub const DEFAULT_QUEUE_SETS: u32 = 4;
/// Offset of the data area (the queue sets' windows) in the default layout.
pub const DEFAULT_DATA_OFFSET: u64 = 0x10_0000;
/// Entries per queue in the default layout.
pub const DEFAULT_SQ_DEPTH: u32 = 64;
pub const DEFAULT_RQ_DEPTH: u32 = 64;
pub const DEFAULT_CQ_DEPTH: u32 = 256;
pub const DEFAULT_AQ_DEPTH: u32 = 16;
pub const DEFAULT_ACQ_DEPTH: u32 = 64;
/// Largest message (work-entry length) the device accepts.
pub const MAX_MESSAGE: u32 = 1 << 30;

/// Offsets inside a queue set in the default layout.
pub const SET_DOORBELLS: u32 = 0x100;
pub const SET_INDICES: u32 = 0x280;
pub const SET_COUNTERS: u32 = 0x300;
pub const SET_SQ: u32 = 0x400;
pub const SET_RQ: u32 = SET_SQ + DEFAULT_SQ_DEPTH * 64;
pub const SET_CQ: u32 = SET_RQ + DEFAULT_RQ_DEPTH * 32;
pub const SET_AQ: u32 = SET_CQ + DEFAULT_CQ_DEPTH * 32;
pub const SET_ACQ: u32 = SET_AQ + DEFAULT_ACQ_DEPTH * 64;
/// The [`SetQuota`] block (on QUERY_COUNTERS), after the rings.
pub const SET_QUOTA: u32 = SET_ACQ + DEFAULT_ACQ_DEPTH * 64;
/// First byte after the default queue set's rings and blocks.
pub const SET_END: u32 = SET_QUOTA + 256;

const _: () = assert!(SET_END as u64 <= DEFAULT_SET_STRIDE);
const _: () = assert!(
    DEFAULT_SET_OFFSET + DEFAULT_SET_STRIDE * DEFAULT_QUEUE_SETS as u64 <= DEFAULT_DATA_OFFSET
);

// ----- the structures --------------------------------------------------------

/// The first bytes of the shared memory: what the device is and where
/// everything lies. Written by the device while formatting, `state` last
/// (Release); the host reads `state` (Acquire) before anything else.
/// `heartbeat` is incremented by the device while it runs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DeviceHeader {
    /// [`MAGIC`].
    pub magic: u32,
    pub abi_major: u16,
    pub abi_minor: u16,
    /// `FEATURE_*` bits the device offers.
    pub features: u64,
    /// `DEVICE_STATE_*`.
    pub state: u32,
    /// Number of queue sets.
    pub queue_sets: u32,
    /// Bytes of shared memory in all.
    pub shm_len: u64,
    /// Offset of queue set 0.
    pub set_offset: u64,
    /// Bytes from one queue set to the next.
    pub set_stride: u64,
    /// Offset (= I/O address) and length of the data area.
    pub data_offset: u64,
    pub data_len: u64,
    /// Incremented by the device while it serves.
    pub heartbeat: u64,
    /// The node's IPv4 address and MetaRoCE UDP port (informational).
    pub ipv4: [u8; 4],
    pub udp_port: u16,
    /// The node's number in its harness (informational).
    pub node: u16,
    /// Largest work-entry length.
    pub max_message: u32,
    /// Regions and connections the device holds in all.
    pub max_regions: u32,
    pub max_connections: u32,
    pub reserved0: u32,
    pub reserved: [u64; 20],
}

/// The first bytes of a queue set. The device writes everything but
/// `owner` while formatting; a host process claims the set by changing
/// `owner` from [`OWNER_FREE`] to its process id with a compare-and-swap,
/// and must then read the rest.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct QueueSetHeader {
    /// [`OWNER_FREE`] or the owning host process's id.
    pub owner: u32,
    /// Reserved (0).
    pub state: u32,
    /// This set's number.
    pub index: u32,
    /// The protection domain the device gives every region and connection
    /// of this set.
    pub pd: u32,
    /// The set's data window: I/O addresses its regions must lie in.
    pub window_offset: u64,
    pub window_len: u64,
    /// Offsets (from the set's first byte) and depths of the rings.
    pub sq_offset: u32,
    pub sq_depth: u32,
    pub rq_offset: u32,
    pub rq_depth: u32,
    pub cq_offset: u32,
    pub cq_depth: u32,
    pub aq_offset: u32,
    pub aq_depth: u32,
    pub acq_offset: u32,
    pub acq_depth: u32,
    /// Offset of the [`DoorbellPage`] (host-written).
    pub doorbell_offset: u32,
    /// Offset of the [`DeviceIndices`] (device-written).
    pub indices_offset: u32,
    /// Offset of the [`SetCounters`] (device-written).
    pub counters_offset: u32,
    /// Offset of the [`SetQuota`] block (device-written; version 1.1).
    pub quota_offset: u32,
    pub reserved: [u64; 21],
}

/// A doorbell record: the host writes the ring's new producer index
/// (`index`, free-running, Release) and then increments `rings`. For the
/// completion queues `index` is the host's consumer index instead.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Doorbell {
    pub index: u32,
    pub rings: u32,
}

/// One doorbell record on its own 64-byte line.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DoorbellLine {
    pub bell: Doorbell,
    pub reserved: [u64; 7],
}

/// The host-written doorbell records of a queue set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DoorbellPage {
    /// Send queue: producer index.
    pub sq: DoorbellLine,
    /// Receive queue: producer index.
    pub rq: DoorbellLine,
    /// Completion queue: the host's consumer index.
    pub cq: DoorbellLine,
    /// Admin queue: producer index.
    pub aq: DoorbellLine,
    /// Admin completion queue: the host's consumer index.
    pub acq: DoorbellLine,
}

/// The device's consumer indices of the host-produced rings (free-running,
/// Release): slots before them may be reused by the host.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DeviceIndices {
    pub sq_consumer: u32,
    pub rq_consumer: u32,
    pub aq_consumer: u32,
    pub reserved0: u32,
    pub reserved: [u64; 6],
}

/// A queue set's counters, written by the device on QUERY_COUNTERS
/// (before that command's completion). `transport_*` sum the set's
/// connections; `device_*` are the whole device's.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct SetCounters {
    pub posted_sends: u64,
    pub posted_recvs: u64,
    pub completions: u64,
    pub admin_commands: u64,
    pub events: u64,
    /// Work entries and commands refused by reason (error completions).
    pub refused_bad_opcode: u64,
    pub refused_bad_length: u64,
    pub refused_bad_connection: u64,
    pub refused_bad_address: u64,
    pub refused_not_permitted: u64,
    pub refused_invalid: u64,
    /// Doorbell records whose index was beyond the ring (ignored).
    pub bad_producer_index: u64,
    /// Doorbell rings that brought no new entry.
    pub spurious_doorbells: u64,
    /// Completions dropped because the completion queue stayed full.
    pub cq_overflow: u64,
    /// Events dropped because the admin completion queue stayed full.
    pub events_lost: u64,
    pub transport_retransmissions: u64,
    pub transport_timeouts: u64,
    pub transport_packets_sent: u64,
    pub transport_packets_received: u64,
    pub transport_bytes_sent: u64,
    pub transport_bytes_received: u64,
    pub transport_ce_received: u64,
    pub device_rx_frames: u64,
    pub device_tx_frames: u64,
    pub device_dma_faults: u64,
    pub device_rate_hint_mbps: u64,
    /// The most PSNs one of the set's connections had outstanding at once
    /// (sent, not cumulatively acknowledged; spec 4.4).
    pub transport_max_in_flight: u64,
    /// Refused by reason, continued (version 1.1): a full table, an
    /// unknown key, the set's quota (the sum of [`SetQuota::refused`]).
    pub refused_no_resources: u64,
    pub refused_bad_key: u64,
    pub refused_quota: u64,
    pub reserved: [u64; 2],
}

/// One value per quota resource (spec 6.10), in the order the device
/// checks them: a queue set's limits, what it holds, or its refusals.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct QuotaValues {
    /// Connections the set holds in any state (opening, offered, open,
    /// ended until RELEASE).
    pub connections: u64,
    /// Registered regions.
    pub regions: u64,
    /// Bytes of those regions, summed.
    pub region_bytes: u64,
    /// Work entries posted to the transport whose completion has not come
    /// back yet.
    pub work_entries: u64,
    /// Admin commands still outstanding: CONNECTs whose `CONNECTED` or
    /// `FAILED` event has not come.
    pub commands: u64,
    pub reserved: [u64; 3],
}

impl QuotaValues {
    /// Every limit at [`QUOTA_DEFAULT`]: the device's default share.
    pub const DEFAULTS: QuotaValues = QuotaValues {
        connections: QUOTA_DEFAULT,
        regions: QUOTA_DEFAULT,
        region_bytes: QUOTA_DEFAULT,
        work_entries: QUOTA_DEFAULT,
        commands: QUOTA_DEFAULT,
        reserved: [0; 3],
    };
}

/// A queue set's quota, written by the device next to its counters on
/// QUERY_COUNTERS (at `QueueSetHeader::quota_offset`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct SetQuota {
    /// The limits in force (defaults resolved to numbers).
    pub limit: QuotaValues,
    /// What the set holds now.
    pub used: QuotaValues,
    /// Requests refused with `STATUS_QUOTA_EXCEEDED`, by resource.
    pub refused: QuotaValues,
    pub reserved: [u64; 8],
}

/// The SET_QUOTA admin command: an [`AdminCmd`] slot read with this
/// layout when `opcode` is `ADMIN_SET_QUOTA`. Each limit is a number or
/// [`QUOTA_DEFAULT`]; a limit below what the set holds takes nothing back,
/// it refuses more.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct QuotaCmd {
    /// As in [`AdminCmd`].
    pub tag: u64,
    /// `ADMIN_SET_QUOTA`.
    pub opcode: u8,
    /// Reserved (0).
    pub flags: u8,
    pub reserved0: u16,
    /// The queue set whose quota is set.
    pub set: u32,
    /// The limits, as in [`QuotaValues`].
    pub connections: u64,
    pub regions: u64,
    pub region_bytes: u64,
    pub work_entries: u64,
    pub commands: u64,
    pub reserved1: u64,
}

/// A send-queue work entry (64 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct SendWqe {
    /// The host's identifier, returned in the completion.
    pub wr_id: u64,
    pub conn_index: u32,
    pub conn_generation: u32,
    /// `OP_WRITE` ... `OP_READ`.
    pub opcode: u8,
    /// Reserved (0).
    pub flags: u8,
    pub reserved0: u16,
    /// Immediate data (`OP_WRITE_IMM`, `OP_SEND_IMM`).
    pub imm: u32,
    /// Local buffer: key, length, I/O address.
    pub lkey: u32,
    pub length: u32,
    pub laddr: u64,
    /// Remote buffer (`OP_WRITE*`, `OP_READ`): I/O address in the peer's
    /// space, and its key.
    pub raddr: u64,
    pub rkey: u32,
    pub reserved1: u32,
    pub reserved2: u64,
}

/// A receive-queue work entry (32 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RecvWqe {
    pub wr_id: u64,
    pub conn_index: u32,
    pub conn_generation: u32,
    pub lkey: u32,
    pub length: u32,
    pub laddr: u64,
}

/// A completion entry (32 bytes). The device writes bytes 0..28, then the
/// last word (opcode, status, flags, owner) with one Release store; the
/// host loads that word with Acquire and owns the entry when `owner`
/// equals its current phase.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Cqe {
    pub wr_id: u64,
    pub conn_index: u32,
    pub conn_generation: u32,
    /// Bytes transferred (receives: bytes placed).
    pub byte_len: u32,
    /// Immediate data when `flags & CQE_FLAG_IMM`.
    pub imm: u32,
    pub reserved: u32,
    /// `OP_*`.
    pub opcode: u8,
    /// `STATUS_*`.
    pub status: u8,
    /// `CQE_FLAG_*`.
    pub flags: u8,
    /// Phase: 1 on the device's first pass over the ring, 0 on the second,
    /// and so on.
    pub owner: u8,
}

/// An admin command (64 bytes). Which fields count depends on `opcode`
/// (spec 6.6); the others must be zero.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct AdminCmd {
    /// The host's identifier, returned in the answer.
    pub tag: u64,
    /// `ADMIN_*`.
    pub opcode: u8,
    /// Reserved (0).
    pub flags: u8,
    pub reserved0: u16,
    /// REGISTER: `ACCESS_*` bits.
    pub access: u32,
    /// ACCEPT, CLOSE, RELEASE, QUERY_COUNTERS (optional): the connection.
    pub conn_index: u32,
    pub conn_generation: u32,
    /// REGISTER: the region's I/O address and length.
    pub addr: u64,
    pub len: u64,
    /// DEREGISTER: the key.
    pub key: u32,
    /// CONNECT: the peer's UDP port and IP address (IPv4-mapped IPv6).
    pub port: u16,
    pub reserved1: u16,
    pub ip: [u8; 16],
}

/// An admin completion or event (64 bytes); published like [`Cqe`]: the
/// last word (kind, status, opcode, owner) is stored last with Release.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct AdminCqe {
    /// The command's tag (`EVENT_COMMAND_DONE`), else 0.
    pub tag: u64,
    /// The connection (CONNECT's answer and every connection event).
    pub conn_index: u32,
    pub conn_generation: u32,
    /// REGISTER: the key.
    pub value: u64,
    /// `EVENT_INCOMING`: the peer's IP address (IPv4-mapped IPv6) and port.
    pub ip: [u8; 16],
    pub port: u16,
    pub reserved0: u16,
    /// `EVENT_CLOSED`: the reason.
    pub detail: u32,
    pub reserved1: [u32; 3],
    /// `EVENT_*`.
    pub kind: u8,
    /// `STATUS_*`.
    pub status: u8,
    /// `EVENT_COMMAND_DONE`: the command's opcode.
    pub opcode: u8,
    /// Phase, as in [`Cqe`].
    pub owner: u8,
}

/// Byte offset of the last word of a [`Cqe`], stored last.
pub const CQE_LAST_WORD: usize = 28;
/// Byte offset of the last word of an [`AdminCqe`], stored last.
pub const ADMIN_CQE_LAST_WORD: usize = 60;

/// The phase a completion written at free-running index `index` of a ring
/// of `depth` entries carries: 1 on the first pass, 0 on the second, ...
pub const fn phase_of(index: u32, depth: u32) -> u8 {
    (((index / depth) & 1) ^ 1) as u8
}

/// An IPv4 address as the ABI carries it (IPv4-mapped IPv6).
pub const fn ipv4_mapped(a: [u8; 4]) -> [u8; 16] {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ]
}

/// The IPv4 address inside an IPv4-mapped IPv6 address.
pub fn ipv4_of_mapped(ip: &[u8; 16]) -> Option<[u8; 4]> {
    (ip[..10] == [0; 10] && ip[10..12] == [0xff, 0xff]).then(|| [ip[12], ip[13], ip[14], ip[15]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_flip_each_pass() {
        assert_eq!(phase_of(0, 4), 1);
        assert_eq!(phase_of(3, 4), 1);
        assert_eq!(phase_of(4, 4), 0);
        assert_eq!(phase_of(8, 4), 1);
        // Free-running indices wrap at 2^32, a multiple of every depth.
        assert_eq!(phase_of(u32::MAX, 4), 0);
        assert_eq!(phase_of(0, 4), 1);
    }

    #[test]
    fn ipv4_mapping_round_trips() {
        let m = ipv4_mapped([198, 18, 0, 1]);
        assert_eq!(ipv4_of_mapped(&m), Some([198, 18, 0, 1]));
        assert_eq!(ipv4_of_mapped(&[1; 16]), None);
    }

    #[test]
    fn magic_spells_mrhi() {
        assert_eq!(MAGIC.to_le_bytes(), *b"MRHI");
    }

    #[test]
    fn entries_round_trip_through_bytes() {
        let wqe = SendWqe {
            wr_id: 7,
            opcode: OP_READ,
            length: 4096,
            laddr: 0x10_0000,
            ..SendWqe::default()
        };
        let bytes = wqe.as_bytes();
        assert_eq!(bytes.len(), 64);
        assert_eq!(bytes[16], OP_READ);
        assert_eq!(SendWqe::read_from_bytes(bytes).unwrap(), wqe);
    }
}
