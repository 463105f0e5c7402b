//! What the server needs of its platform ([`ServeHost`]), the values it
//! passes across (memory, registrations, reports), and its settings.

use core::time::Duration;

use metaroce_core::api::{Access, ConnHandle, PeerAddr, Status};
use metaroce_core::wire::CloseReason;

#[cfg(doc)]
use super::Server;
#[cfg(doc)]
use crate::{check_pattern, fill_pattern};
use crate::{Message, Operation, READ_ONLY_LEN};

/// Memory of an announced region: the data region (`len` bytes, zeroed or
/// filled with the pattern) and its read-only page ([`READ_ONLY_LEN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub base: u64,
    pub len: u64,
    pub ro_base: u64,
}

impl Memory {
    /// Bytes it counts against the budgets.
    pub fn footprint(&self) -> u64 {
        self.len + u64::from(READ_ONLY_LEN)
    }
}

/// Which of a connection's two keys a registration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Data = 0,
    ReadOnly = 1,
}

/// What became of a registration the server asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Registered: the key.
    Key(u32),
    /// Asked for; the host reports it later through [`Server::registered`].
    Pending,
    /// No room (the endpoint's region table, or the host's queue, is full).
    Refused,
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Closed(CloseReason),
    Failed(Status),
}

/// What the server saw of a connection that ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub conn: ConnHandle,
    pub peer: PeerAddr,
    pub op: Option<Operation>,
    pub size: u32,
    /// WRITE_IMM messages received and checked against the pattern.
    pub verified: u64,
    /// Messages whose bytes differed from the pattern.
    pub corrupt: u64,
    pub bytes: u64,
    pub end: End,
}

/// What the server needs of its platform: the host tool over its endpoint
/// and heap, or the firmware over its host-interface rings and memory
/// window. Posting and registering may refuse for want of room; the server
/// tries again on a later [`Server::poll`].
pub trait ServeHost {
    /// Takes in a new connection: its protection domain of its own and its
    /// control buffers. `false`: no room for them (the connection is
    /// refused).
    fn open(&mut self, conn: ConnHandle) -> bool;
    /// Closes a connection the server will not serve, with `REJECTED`.
    fn reject(&mut self, conn: ConnHandle);
    /// Posts receive `slot` (a [`crate::CONTROL_LEN`]-byte control buffer,
    /// work-request id `slot`); `false`: no room now.
    fn post_recv(&mut self, conn: ConnHandle, slot: u32) -> bool;
    /// The message `len` bytes long that arrived in receive `slot`.
    fn received(&mut self, conn: ConnHandle, slot: u32, len: u32) -> Option<Message>;
    /// Sends control message number `seq` of the connection; `false`: no
    /// room now.
    fn post_send(&mut self, conn: ConnHandle, seq: u32, message: &[u8]) -> bool;
    /// Memory for a region of `len` bytes, zeroed, and a read-only page.
    fn allocate(&mut self, conn: ConnHandle, len: u64) -> Option<Memory>;
    /// Frees what [`ServeHost::allocate`] gave (its keys are gone).
    fn free(&mut self, memory: &Memory);
    /// A connection joins `memory`, which may live elsewhere (another
    /// engine thread's): make it reachable here.
    fn attach(&mut self, _memory: &Memory) {}
    /// Undoes one [`ServeHost::attach`].
    fn detach(&mut self, _memory: &Memory) {}
    /// Registers `len` bytes at `base` with `access` in the connection's
    /// protection domain.
    fn register(
        &mut self,
        conn: ConnHandle,
        kind: KeyKind,
        base: u64,
        len: u64,
        access: Access,
    ) -> Registration;
    fn deregister(&mut self, key: u32);
    /// Whether the `len` bytes at `addr` are `pattern(seed, index)`
    /// ([`check_pattern`]); `None` if they are not memory.
    fn check_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64) -> Option<bool>;
    /// Fills the `len` bytes at `addr`, if they are memory, with
    /// `pattern(seed, index)` ([`fill_pattern`]).
    fn fill_pattern(&mut self, addr: u64, len: usize, seed: u64, index: u64);
    /// A connection ended: what it did (its control buffers may go now).
    fn finished(&mut self, report: &Finished);
    /// Releases an ended connection's handle; `false`: not yet (its last
    /// completions are still to be taken).
    fn release(&mut self, conn: ConnHandle) -> bool;
}

/// The server's settings.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Largest message size an `ANNOUNCE` may ask for.
    pub max_message: u32,
    /// Receives kept posted per connection (at most 32).
    pub recv_slots: u32,
    /// How long a failed connection stays (answering later packets with
    /// its fatal NAK, spec 4.7.2) before its slot is released; released at
    /// once when the table is 90 % full.
    pub failed_linger: Duration,
}
