//! The receive side: posted receives, arriving messages (eager copied
//! out, rendezvous READ into the matched buffer), peek/claim, cancel.

use metaroce_core::api::{Access, Completion, ConnHandle, LocalBuf, Op, Opcode, Status};
use metaroce_core::wire::MemoryTarget;

use super::send::msg_flags;
use super::{fi_errno_of, prov_errno_of, scatter, status_of_wire, Pending, Staged, Transport};
use crate::flags::{self, errno, ADDR_NOTAVAIL};
use crate::matching::{Arrival, Body, PostedRecv};
use crate::queues::CqEntry;
use crate::wire::{Header, Kind, HEADER_LEN};

impl Transport {
    /// `fi_recv`, `fi_trecv` and their variants.
    pub fn recv(&mut self, recv: PostedRecv, tagged: bool) -> Result<(), i32> {
        for &(ptr, len) in &recv.iov {
            if ptr == 0 && len != 0 {
                return Err(errno::EINVAL);
            }
        }
        let srcs = self.sources();
        let lookup = |c: u64| srcs.get(&c).copied().unwrap_or(ADDR_NOTAVAIL);
        let matched = if tagged {
            self.tagged.post(recv, lookup)
        } else {
            self.msgs.post(recv, lookup)
        };
        if let Some((recv, arrival)) = matched {
            self.deliver(recv, arrival, tagged);
            self.kick();
        }
        Ok(())
    }

    /// `fi_trecvmsg` with `FI_PEEK` (and `FI_CLAIM` / `FI_DISCARD`):
    /// whether a message matched; its completion (or `FI_ENOMSG`) is
    /// queued either way.
    pub fn peek(&mut self, recv: &PostedRecv, claim: bool, discard: bool) -> bool {
        self.progress();
        let srcs = self.sources();
        let lookup = |c: u64| srcs.get(&c).copied().unwrap_or(ADDR_NOTAVAIL);
        let Some(i) = self
            .tagged
            .find_unexpected(recv.src, recv.tag, recv.ignore, &lookup)
        else {
            self.report_rx_error(
                CqEntry::new(recv.context, msg_flags(true, flags::RECV)),
                errno::ENOMSG,
                0,
                0,
            );
            return false;
        };
        let a = self.tagged.unexpected(i).expect("found").clone();
        let data_flag = if a.data.is_some() {
            flags::REMOTE_CQ_DATA
        } else {
            0
        };
        let entry = CqEntry {
            len: a.body.len() as usize,
            tag: a.tag,
            data: u64::from(a.data.unwrap_or(0)),
            src: lookup(a.conn),
            ..CqEntry::new(recv.context, msg_flags(true, flags::RECV) | data_flag)
        };
        if claim || discard {
            let a = self.tagged.take_unexpected(i).expect("found");
            if discard {
                self.discard(a);
            } else {
                self.claimed.insert(recv.context, (true, a));
            }
        }
        self.report_rx(entry);
        true
    }

    /// `fi_trecvmsg` with `FI_CLAIM`: receives the message a peek claimed
    /// under `recv.context` (or discards it).
    pub fn claim(&mut self, recv: PostedRecv, discard: bool) -> Result<(), i32> {
        let (tagged, arrival) = self.claimed.remove(&recv.context).ok_or(errno::ENOMSG)?;
        if discard {
            let entry = CqEntry::new(recv.context, msg_flags(tagged, flags::RECV));
            self.discard(arrival);
            self.report_rx(entry);
        } else {
            self.deliver(recv, arrival, tagged);
        }
        self.kick();
        Ok(())
    }

    /// Drops a message nobody will receive; a rendezvous's sender is told.
    fn discard(&mut self, a: Arrival) {
        if let Body::Rts { rndv_id, .. } = a.body {
            self.send_fin(ConnHandle::from_bits(a.conn), rndv_id, 0);
        }
    }

    /// `fi_cancel`: a posted receive of `context` ends with `FI_ECANCELED`.
    pub fn cancel(&mut self, context: usize) -> bool {
        for tagged in [false, true] {
            let q = if tagged {
                &mut self.tagged
            } else {
                &mut self.msgs
            };
            if let Some(r) = q.cancel(context) {
                self.report_rx_error(
                    CqEntry::new(r.context, msg_flags(tagged, flags::RECV)),
                    errno::ECANCELED,
                    0,
                    0,
                );
                return true;
            }
        }
        false
    }

    /// A receive buffer of the provider's completed.
    pub(super) fn on_receive(&mut self, c: Completion) {
        let h = c.conn;
        let slot = c.wr_id as u32;
        if c.status != Status::Success {
            return;
        }
        let src = self.src_of(h.to_bits());
        if c.opcode == Opcode::RecvWriteImm {
            // The peer's fi_writedata: its data is reported here; the
            // receive is the provider's, so it is posted again at once.
            let entry = CqEntry {
                len: c.byte_len as usize,
                data: u64::from(c.imm.unwrap_or(0)),
                src,
                ..CqEntry::new(0, flags::RMA | flags::REMOTE_WRITE | flags::REMOTE_CQ_DATA)
            };
            self.post_ring_recv(h, slot);
            self.report_rx(entry);
            return;
        }
        let Some(conn) = self.conns.get(&h.to_bits()) else {
            return;
        };
        let len = (c.byte_len as usize).min(conn.slot_len);
        let at = conn.slot_addr(slot);
        let mut bytes = std::mem::take(&mut self.scratch);
        bytes.clear();
        bytes.resize(len, 0);
        self.backend.read(at, &mut bytes);
        // The bytes are copied out: the buffer goes back at once.
        self.post_ring_recv(h, slot);
        let parsed = Header::parse(&bytes);
        let header = match parsed {
            Ok(header) => header,
            Err(_) => {
                self.stats.malformed += 1;
                self.scratch = bytes;
                return;
            }
        };
        let body = match header.kind {
            Kind::Fin => {
                self.scratch = bytes;
                self.finish_rndv_send(header.rndv_id, status_of_wire(header.status));
                return;
            }
            Kind::Eager => Body::Eager(bytes[HEADER_LEN..].to_vec()),
            Kind::Rts => Body::Rts {
                len: header.len,
                key: header.key,
                addr: header.addr,
                rndv_id: header.rndv_id,
            },
        };
        self.scratch = bytes;
        let arrival = Arrival {
            conn: h.to_bits(),
            tag: header.tag,
            data: header.data,
            body,
        };
        let queue = if header.tagged {
            &mut self.tagged
        } else {
            &mut self.msgs
        };
        match queue.arrive(arrival, src) {
            Some((recv, arrival)) => self.deliver(recv, arrival, header.tagged),
            None => self.stats.unexpected += 1,
        }
    }

    /// A message met its receive: copy it (eager) or READ it (rendezvous).
    pub(super) fn deliver(&mut self, recv: PostedRecv, arrival: Arrival, tagged: bool) {
        let src = self.src_of(arrival.conn);
        let data_flag = if arrival.data.is_some() {
            flags::REMOTE_CQ_DATA
        } else {
            0
        };
        let flags = msg_flags(tagged, flags::RECV) | data_flag;
        let (total, key, addr, rndv_id) = match &arrival.body {
            Body::Eager(bytes) => {
                let got = scatter(bytes, &recv.iov);
                let total = bytes.len();
                self.complete_recv(&recv, &arrival, got, total, src, flags);
                return;
            }
            &Body::Rts {
                len,
                key,
                addr,
                rndv_id,
            } => (len as usize, key, addr, rndv_id),
        };
        let h = ConnHandle::from_bits(arrival.conn);
        let failed = CqEntry {
            tag: arrival.tag,
            src,
            ..CqEntry::new(recv.context, flags)
        };
        if self.conns.get(&arrival.conn).is_none_or(|c| c.dead) {
            let flushed = prov_errno_of(Status::Flushed);
            self.report_rx_error(failed, errno::ECANCELED, flushed, 0);
            return;
        }
        let want = total.min(recv.capacity());
        if want == 0 {
            self.send_fin(h, rndv_id, 0);
            self.complete_recv(&recv, &arrival, 0, total, src, flags);
            return;
        }
        // One application buffer is READ into directly (host engine);
        // several, or a DPU, through a staging buffer copied out after.
        let direct_target = match recv.iov.as_slice() {
            [(ptr, _)] if self.direct() => Some(*ptr as u64),
            _ => None,
        };
        let staged = match direct_target {
            Some(ptr) => self.stage(ptr, want, Access::LOCAL_WRITE, None),
            None => self.stage_owned(want, Access::LOCAL_WRITE, None),
        };
        let staged = match staged {
            Ok(s) => s,
            Err(e) => {
                self.send_fin(h, rndv_id, prov_errno_of(Status::Flushed) as u16);
                self.report_rx_error(failed, e, 0, 0);
                return;
            }
        };
        let local = LocalBuf {
            key: staged.key,
            addr: staged.addr,
            len: want as u32,
        };
        let op = Op::Read {
            remote: MemoryTarget { key, addr },
        };
        let pending = Pending::RndvRead {
            recv,
            arrival,
            staged,
            len: want,
            src,
            flags,
        };
        if let Err((_, p)) = self.post(h, op, local, pending) {
            // The connection's queue is full or closed: fail the receive
            // and release the sender.
            if let Pending::RndvRead { staged, .. } = p {
                self.unstage(Some(staged));
            }
            self.send_fin(h, rndv_id, prov_errno_of(Status::Flushed) as u16);
            self.report_rx_error(failed, errno::EIO, 0, 0);
        }
    }

    /// A rendezvous READ ended: copy out a staged one, tell the sender,
    /// report the receive.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rndv_read_done(
        &mut self,
        status: Status,
        recv: PostedRecv,
        arrival: Arrival,
        staged: Staged,
        len: usize,
        src: u64,
        flags: u64,
    ) {
        if status == Status::Success && staged.owned {
            self.copy_out(staged.addr, &recv.iov, len);
        }
        self.unstage(Some(staged));
        let Body::Rts {
            len: total,
            rndv_id,
            ..
        } = arrival.body
        else {
            return;
        };
        let ok = status == Status::Success;
        let code = if ok { 0 } else { prov_errno_of(status) as u16 };
        self.send_fin(ConnHandle::from_bits(arrival.conn), rndv_id, code);
        if ok {
            self.complete_recv(&recv, &arrival, len, total as usize, src, flags);
        } else {
            let entry = CqEntry {
                tag: arrival.tag,
                src,
                ..CqEntry::new(recv.context, flags)
            };
            self.report_rx_error(entry, fi_errno_of(status), prov_errno_of(status), 0);
        }
    }

    /// Reports a receive that got `len` of the message's `total` bytes.
    fn complete_recv(
        &mut self,
        recv: &PostedRecv,
        arrival: &Arrival,
        len: usize,
        total: usize,
        src: u64,
        flags: u64,
    ) {
        let entry = CqEntry {
            context: recv.context,
            flags,
            len,
            buf: recv.iov.first().map_or(0, |&(p, _)| p),
            data: u64::from(arrival.data.unwrap_or(0)),
            tag: arrival.tag,
            src,
        };
        if total > len {
            self.report_rx_error(entry, errno::ETRUNC, 0, total - len);
        } else if recv.completion || !self.bindings.rx_selective {
            self.report_rx(entry);
        }
    }
}
