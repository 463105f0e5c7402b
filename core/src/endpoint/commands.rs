//! The application's commands on connections: open, close, release,
//! post work and receives (spec 4.1, 4.8, 4.14).

use super::{CommandError, Endpoint};
use crate::api::{Access, ConnHandle, Op, PeerAddr, RecvRequest, WorkRequest};
use crate::conn::{ConnState, Connection};
use crate::storage::Backing;
use crate::time::Instant;
use crate::wire::CloseReason;

impl<B: Backing, const P: usize> Endpoint<B, P> {
    pub(super) fn slot_of(&self, h: ConnHandle) -> Result<usize, CommandError> {
        let i = h.index.wrapping_sub(self.ids.first) as usize;
        match self.slots.get(i) {
            Some(s) if s.live && !s.released && s.generation == h.generation => Ok(i),
            _ => Err(CommandError::UnknownConnection),
        }
    }

    /// Opens a connection to `peer` in protection domain `pd`. Work may be
    /// posted at once; it goes out when the handshake completes.
    pub fn connect(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        pd: u32,
    ) -> Result<ConnHandle, CommandError> {
        self.now = self.now.max(now);
        if self.free.is_empty() {
            return Err(CommandError::NoFreeConnection);
        }
        let protection = self
            .res
            .credentials
            .keys
            .offer(&self.config.protection)
            .map_err(CommandError::Protection)?;
        let (i, handle, id) = self.allocate_slot().ok_or(CommandError::NoFreeConnection)?;
        let mut conn = Connection::new(
            id,
            peer,
            pd,
            &self.config,
            &mut self.res.rng,
            now,
            ConnState::Connecting,
        );
        conn.protection = protection;
        // 0-RTT (spec 4.2.4): a keyed CONNECT with a proof, and its early
        // keys so the first flight can leave with it.
        #[cfg(feature = "aead")]
        let offer = conn.connect_repr(&self.config);
        #[cfg(feature = "aead")]
        if let Some(proof) = self.early_proof(now, peer, conn.entropy[0], &offer) {
            if self.res.credentials.keys.install_early(&protection, &offer) {
                conn.start_early(proof, &mut self.res.credentials);
            }
        }
        // Without 0-RTT, a token from an earlier connection to this
        // acceptor skips the RETRY (spec 4.2.5).
        #[cfg(feature = "tokens")]
        if !conn.early() {
            if let Some(token) = self.token_for(&peer.ip) {
                conn.start_token(token, &mut self.res.credentials);
            }
        }
        conn.start_connect(now, &self.config);
        self.slots[i as usize].conn = conn;
        self.refresh(i, now, false);
        Ok(handle)
    }

    /// Closes a connection gracefully: once its sends are acknowledged a
    /// CLOSE goes out; the peer's reply (or a timeout) ends it.
    pub fn close(&mut self, now: Instant, h: ConnHandle) -> Result<(), CommandError> {
        self.close_with(now, h, CloseReason::Normal)
    }

    /// [`Endpoint::close`] with the reason the CLOSE carries: `Rejected`
    /// when the application refuses a connection it was offered (over a
    /// budget), `Error` after a failure.
    pub fn close_with(
        &mut self,
        now: Instant,
        h: ConnHandle,
        reason: CloseReason,
    ) -> Result<(), CommandError> {
        self.now = self.now.max(now);
        let i = self.slot_of(h)?;
        let config = &self.config;
        let res = &mut self.res;
        self.slots[i]
            .conn
            .close(now, &mut res.send, &mut res.recv, config);
        if self.slots[i].conn.state == ConnState::Closing {
            self.slots[i].conn.close_reason = reason;
        }
        self.refresh(i as u32, now, false);
        Ok(())
    }

    /// Gives a closed or failed connection's slot back once its completions
    /// were polled. Its handle is stale from now on.
    pub fn release(&mut self, h: ConnHandle) -> Result<(), CommandError> {
        let i = self.slot_of(h)?;
        let conn = &mut self.slots[i].conn;
        if !conn.state.is_terminal() {
            return Err(CommandError::NotClosed);
        }
        if conn.has_completion(&self.res.send, &self.res.recv) {
            return Err(CommandError::NotDrained);
        }
        self.slots[i].released = true;
        self.slots[i].conn.events = Default::default();
        let now = self.now;
        self.refresh(i as u32, now, false);
        Ok(())
    }

    /// Moves a connection into protection domain `pd` (the application
    /// chooses the domain of a connection it accepted), before any work is
    /// posted on it: its regions are then those registered in `pd`.
    pub fn set_pd(&mut self, h: ConnHandle, pd: u32) -> Result<(), CommandError> {
        let i = self.slot_of(h)?;
        let conn = &mut self.slots[i].conn;
        if !conn.send.queue.is_empty() || !conn.recv.queue.is_empty() {
            return Err(CommandError::NotOpen);
        }
        conn.pd = pd;
        Ok(())
    }

    /// Posts a send-queue work request (WRITE, WRITE_IMM, SEND, SEND_IMM, READ).
    pub fn post_send(&mut self, h: ConnHandle, wr: WorkRequest) -> Result<(), CommandError> {
        let i = self.slot_of(h)?;
        let rights = match wr.op {
            Op::Read { .. } => Access::LOCAL_WRITE,
            _ => Access(0),
        };
        let pd = self.slots[i].conn.pd;
        self.res
            .regions
            .check(
                wr.local.key,
                pd,
                wr.local.addr,
                u64::from(wr.local.len),
                rights,
            )
            .map_err(CommandError::LocalProtection)?;
        let config = &self.config;
        let conn = &mut self.slots[i].conn;
        if !conn.can_post() {
            return Err(CommandError::NotOpen);
        }
        // Behind data that already waits to go, a new entry changes
        // neither what the connection may send nor when: no refresh.
        let queued_behind =
            conn.state == ConnState::Established && conn.first_unsent(&self.res.send).is_some();
        conn.post_send(wr, &mut self.res.send, config)
            .map_err(|_| CommandError::QueueFull)?;
        if !queued_behind {
            let now = self.now;
            self.refresh(i as u32, now, false);
        }
        Ok(())
    }

    /// Posts a receive buffer.
    pub fn post_recv(&mut self, h: ConnHandle, req: RecvRequest) -> Result<(), CommandError> {
        let i = self.slot_of(h)?;
        let pd = self.slots[i].conn.pd;
        self.res
            .regions
            .check(
                req.local.key,
                pd,
                req.local.addr,
                u64::from(req.local.len),
                Access::LOCAL_WRITE,
            )
            .map_err(CommandError::LocalProtection)?;
        let config = &self.config;
        let conn = &mut self.slots[i].conn;
        if !conn.can_post() {
            return Err(CommandError::NotOpen);
        }
        conn.post_recv(req, &mut self.res.recv, config)
            .map_err(|_| CommandError::QueueFull)
    }
}
