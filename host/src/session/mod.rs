//! What `metaroce serve` and `metaroce bench|write|read` do over a
//! [`Node`](crate::node::Node): the server side that verifies what it
//! receives ([`server`]), and the client that moves data and summarises it
//! ([`client`]), speaking the application protocol of [`crate::app`]; and
//! the checks of a server's capacity (`hold`) and of its robustness
//! against misbehaving clients (`crowd`).

mod client;
mod crowd;
mod hold;
mod ledger;
mod server;

pub use client::{run_client, ClientOptions, PathRow, Progress, Summary};
pub use crowd::{Crowd, CrowdOptions, CrowdReport, Sources};
pub use hold::{run_hold, HoldOptions, HoldSummary};
pub use ledger::Ledger;
pub use server::{counters_json, PeerBudget, Server, ServerCounters, ServerReport};

use std::time::Duration;

use metaroce_core::api::{
    Access, Completion, ConnHandle, LocalBuf, Op, RecvRequest, Region, WorkRequest,
};
use metaroce_core::CommandError;

use crate::app::{Message, CONTROL_LEN};
use crate::node::Node;
use crate::HostError;

/// Receive buffers each side keeps posted for control messages and
/// WRITE_IMM completions.
pub(crate) const RECV_SLOTS: u32 = 32;
/// Control-message send buffers (rotating).
pub(crate) const SEND_SLOTS: u32 = 4;
/// Receives a server keeps posted per connection ([`RECV_SLOTS`]): size
/// the receive pool by it.
pub const SERVER_RECEIVES: u32 = RECV_SLOTS;
/// Work-request ids at or above this are control sends.
pub(crate) const CONTROL_WR: u64 = 1 << 62;
/// Turn length when idle: how often stop conditions are checked.
pub(crate) const IDLE_TURN: Duration = Duration::from_millis(20);

/// A connection's control buffers: `RECV_SLOTS` receive slots then
/// `SEND_SLOTS` send slots of [`CONTROL_LEN`] bytes each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Control {
    base: u64,
    key: u32,
    next_send: u32,
}

impl Control {
    /// Buffers for connection `h`, registered in its protection domain.
    pub(crate) fn new(node: &mut Node, h: ConnHandle) -> Result<Control, HostError> {
        let len = (RECV_SLOTS + SEND_SLOTS) * CONTROL_LEN;
        let pd = node.ep.pd(h).unwrap_or(0);
        let base = node.mem.alloc(len as usize, 0);
        let key = match node.ep.register_region(Region {
            base,
            len: u64::from(len),
            access: Access::LOCAL_WRITE,
            pd,
        }) {
            Ok(key) => key,
            Err(e) => {
                node.mem.free(base);
                return Err(HostError::Transfer(format!(
                    "cannot register buffers: {e:?}"
                )));
            }
        };
        Ok(Control {
            base,
            key,
            next_send: 0,
        })
    }

    /// The key of its buffers.
    pub(crate) fn key(&self) -> u32 {
        self.key
    }

    /// Where its buffers start.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    pub(crate) fn recv_buf(&self, slot: u32) -> LocalBuf {
        LocalBuf {
            key: self.key,
            addr: self.base + u64::from(slot * CONTROL_LEN),
            len: CONTROL_LEN,
        }
    }

    pub(crate) fn post_recvs(&self, node: &mut Node, h: ConnHandle) -> Result<(), CommandError> {
        for slot in 0..RECV_SLOTS {
            self.post_recv(node, h, slot)?;
        }
        Ok(())
    }

    /// Posts receive `slot`; a full ring is emptied into the core first
    /// (a burst of new connections posts more than the ring holds).
    pub(crate) fn post_recv(
        &self,
        node: &mut Node,
        h: ConnHandle,
        slot: u32,
    ) -> Result<(), CommandError> {
        let rr = RecvRequest {
            id: u64::from(slot),
            local: self.recv_buf(slot),
        };
        match node.post_recv(h, rr) {
            Err(CommandError::QueueFull) => {
                node.flush();
                node.post_recv(h, rr)
            }
            r => r,
        }
    }

    pub(crate) fn received(&self, node: &Node, c: &Completion) -> Option<Message> {
        let slot = u32::try_from(c.wr_id).ok().filter(|s| *s < RECV_SLOTS)?;
        let buf = self.recv_buf(slot);
        let bytes = node
            .mem
            .slice(buf.addr, c.byte_len.min(CONTROL_LEN) as usize)?;
        Message::decode(bytes)
    }

    pub(crate) fn send(
        &mut self,
        node: &mut Node,
        h: ConnHandle,
        m: &Message,
    ) -> Result<(), CommandError> {
        let seq = self.next_send;
        self.next_send += 1;
        self.send_numbered(node, h, seq, &m.encode())
    }

    /// Sends `bytes` as control message number `seq` of the connection
    /// (its send slot rotates with `seq`); a full queue is emptied into the
    /// core first.
    pub(crate) fn send_numbered(
        &self,
        node: &mut Node,
        h: ConnHandle,
        seq: u32,
        bytes: &[u8],
    ) -> Result<(), CommandError> {
        let slot = RECV_SLOTS + seq % SEND_SLOTS;
        let addr = self.base + u64::from(slot * CONTROL_LEN);
        if let Some(dst) = node.mem.slice_mut(addr, bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        let wr = WorkRequest {
            id: CONTROL_WR + u64::from(seq) + 1,
            op: Op::Send,
            local: LocalBuf {
                key: self.key,
                addr,
                len: bytes.len() as u32,
            },
        };
        let posted = match node.post_send(h, wr) {
            Err(CommandError::QueueFull) => {
                node.flush();
                node.post_send(h, wr)
            }
            r => r,
        };
        node.flush();
        posted
    }
}
