//! The transmit side: messages (eager or rendezvous request) and RMA.

use metaroce_core::api::{Access, LocalBuf, Op};
use metaroce_core::wire::MemoryTarget;

use super::{Pending, RndvSend, Transport, EAGER_LIMIT, INJECT_LIMIT, MAX_MSG};
use crate::flags::{self, errno};
use crate::queues::CqEntry;
use crate::wire::{Header, Kind, HEADER_LEN};

/// What the application asks a message send to do.
#[derive(Debug, Clone)]
pub struct SendArgs<'a> {
    pub dest: u64,
    pub iov: &'a [(usize, usize)],
    pub tag: Option<u64>,
    pub data: Option<u32>,
    pub context: usize,
    /// Report a completion.
    pub completion: bool,
    /// `fi_inject`: copy now, never report.
    pub inject: bool,
}

/// An RMA operation.
#[derive(Debug, Clone, Copy)]
pub enum RmaOp {
    Write,
    WriteData(u32),
    Read,
}

/// What the application asks an RMA operation to do.
#[derive(Debug, Clone, Copy)]
pub struct RmaArgs {
    pub op: RmaOp,
    pub dest: u64,
    pub buf: usize,
    pub len: usize,
    /// Key of the local buffer's region (from its descriptor), if any.
    pub local_key: Option<u32>,
    pub remote_addr: u64,
    pub remote_key: u64,
    pub context: usize,
    pub completion: bool,
    pub inject: bool,
}

/// The completion flags of a message.
pub(super) fn msg_flags(tagged: bool, direction: u64) -> u64 {
    direction | if tagged { flags::TAGGED } else { flags::MSG }
}

/// Reads `iov`'s bytes into one vector.
fn gather(iov: &[(usize, usize)], total: usize) -> Vec<u8> {
    let mut copy = Vec::with_capacity(total);
    for &(ptr, len) in iov {
        if len > 0 {
            // SAFETY: the application passes `len` readable bytes at
            // `ptr` (non-null, checked by the caller), valid for the call.
            copy.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) });
        }
    }
    copy
}

impl Transport {
    /// `fi_send`, `fi_tsend` and their variants.
    pub fn send(&mut self, args: &SendArgs<'_>) -> Result<(), i32> {
        let mut total = 0usize;
        for &(ptr, len) in args.iov {
            if ptr == 0 && len != 0 {
                return Err(errno::EINVAL);
            }
            total = total.checked_add(len).ok_or(errno::EMSGSIZE)?;
        }
        if total > MAX_MSG || (args.inject && total > INJECT_LIMIT) {
            return Err(errno::EMSGSIZE);
        }
        let peer = self.peer_of(args.dest)?;
        let h = self.conn_to(peer)?;
        let tagged = args.tag.is_some();
        let report = (args.completion && !args.inject).then(|| CqEntry {
            len: total,
            ..CqEntry::new(args.context, msg_flags(tagged, flags::SEND))
        });
        let mut header = Header::new(Kind::Eager);
        header.tagged = tagged;
        header.tag = args.tag.unwrap_or(0);
        header.data = args.data;
        header.len = total as u64;
        let slot = self.take_slot()?;
        if total <= EAGER_LIMIT {
            let len = self.fill_slot(slot, &header, args.iov);
            let local = LocalBuf {
                key: self.tx.key,
                addr: self.tx.addr(slot),
                len: len as u32,
            };
            return match self.post(h, Op::Send, local, Pending::Eager { slot, report }) {
                Ok(()) => {
                    self.stats.eager_sent += 1;
                    self.kick();
                    Ok(())
                }
                Err((e, _)) => {
                    self.tx.free.push(slot);
                    Err(e)
                }
            };
        }
        // Rendezvous: the receiver READs the message from its buffer (a
        // gathered copy when it is in several pieces, a staged one when
        // the engine cannot reach the application's memory).
        let gathered = (args.iov.len() != 1 || !self.direct()).then(|| gather(args.iov, total));
        let base = match &gathered {
            Some(copy) => copy.as_ptr() as u64,
            None => args.iov[0].0 as u64,
        };
        let staged = if self.direct() {
            self.stage(base, total, Access::REMOTE_READ, None)
        } else {
            self.stage(base, total, Access::REMOTE_READ, gathered.as_deref())
        };
        let staged = match staged {
            Ok(s) => s,
            Err(e) => {
                self.tx.free.push(slot);
                return Err(e);
            }
        };
        let rndv = self.next_rndv;
        self.next_rndv = self.next_rndv.wrapping_add(1).max(1);
        header.kind = Kind::Rts;
        header.rndv_id = rndv;
        header.key = staged.key;
        header.addr = staged.addr;
        let len = self.fill_slot(slot, &header, &[]);
        debug_assert_eq!(len, HEADER_LEN);
        let local = LocalBuf {
            key: self.tx.key,
            addr: self.tx.addr(slot),
            len: len as u32,
        };
        match self.post(h, Op::Send, local, Pending::Rts { slot, rndv }) {
            Ok(()) => {
                // A staged copy is the window's; a gathered one must live
                // until the READ is done.
                let keep = if staged.owned { None } else { gathered };
                self.rndv_sends.insert(
                    rndv,
                    RndvSend {
                        staged,
                        report,
                        _gather: keep,
                    },
                );
                self.stats.rndv_sent += 1;
                self.kick();
                Ok(())
            }
            Err((e, _)) => {
                self.tx.free.push(slot);
                self.unstage(Some(staged));
                Err(e)
            }
        }
    }

    /// `fi_write`, `fi_writedata`, `fi_read` and their variants.
    pub fn rma(&mut self, args: RmaArgs) -> Result<(), i32> {
        if args.buf == 0 && args.len != 0 {
            return Err(errno::EINVAL);
        }
        if args.len > MAX_MSG || (args.inject && args.len > INJECT_LIMIT) {
            return Err(errno::EMSGSIZE);
        }
        let remote_key = u32::try_from(args.remote_key).map_err(|_| errno::EINVAL)?;
        let peer = self.peer_of(args.dest)?;
        let h = self.conn_to(peer)?;
        let remote = MemoryTarget {
            key: remote_key,
            addr: args.remote_addr,
        };
        let (op, direction) = match args.op {
            RmaOp::Write => (Op::Write { remote }, flags::WRITE),
            RmaOp::WriteData(imm) => (Op::WriteImm { remote, imm }, flags::WRITE),
            RmaOp::Read => (Op::Read { remote }, flags::READ),
        };
        let report = (args.completion && !args.inject).then(|| CqEntry {
            len: args.len,
            ..CqEntry::new(args.context, flags::RMA | direction)
        });
        let read = matches!(args.op, RmaOp::Read);
        let access = if read { Access::LOCAL_WRITE } else { Access(0) };
        let (local, staged, slot) = if args.inject {
            let slot = self.take_slot()?;
            let header_less = [(args.buf, args.len)];
            // The slot holds the bytes at its start (no message header).
            let mut scratch = gather(&header_less, args.len);
            scratch.truncate(args.len);
            self.backend.write(self.tx.addr(slot), &scratch);
            let local = LocalBuf {
                key: self.tx.key,
                addr: self.tx.addr(slot),
                len: args.len as u32,
            };
            (local, None, Some(slot))
        } else if let (Some(key), true) = (args.local_key, self.direct()) {
            if !self.region_covers(key, args.buf as u64, args.len as u64) {
                return Err(errno::EINVAL);
            }
            let local = LocalBuf {
                key,
                addr: args.buf as u64,
                len: args.len as u32,
            };
            (local, None, None)
        } else {
            let fill = (!read && !self.direct()).then(|| gather(&[(args.buf, args.len)], args.len));
            let staged = self.stage(args.buf as u64, args.len, access, fill.as_deref())?;
            let local = LocalBuf {
                key: staged.key,
                addr: staged.addr,
                len: args.len as u32,
            };
            (local, Some(staged), None)
        };
        let read_into = (read && staged.is_some_and(|s| s.owned)).then_some((args.buf, args.len));
        let pending = Pending::Rma {
            report,
            staged,
            slot,
            read_into,
        };
        match self.post(h, op, local, pending) {
            Ok(()) => {
                self.kick();
                Ok(())
            }
            Err((e, _)) => {
                if let Some(slot) = slot {
                    self.tx.free.push(slot);
                }
                self.unstage(staged);
                Err(e)
            }
        }
    }
}
