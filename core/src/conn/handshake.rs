//! Handshake, keep-alive and close (spec 4.1, 4.2, 4.12): the control
//! packets and the state changes they cause.

use super::{
    Blame, ConnState, Connection, Credentials, Negotiated, Opening, Pending, PendingEvents,
    RecvPools, SendPools,
};
use crate::api::{Status, Transmit};
use crate::config::Config;
use crate::rng::Rng;
use crate::storage::list::OptIndex;
use crate::storage::Backing;
use crate::time::{duration_nanos, Instant, MaybeInstant};
use crate::wire::encap::ecn;
use crate::wire::{
    Body, CloseReason, CloseRepr, ConnectRepr, Flags, Header, NewTokenRepr, Repr, RetryRepr,
    COOKIE_LEN,
};

/// What an initiator did with a RETRY (spec 4.2 step 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryOutcome {
    /// Taken: the CONNECT goes out again with its cookie.
    Taken,
    /// Not taken: no cookie slot free; a later RETRY may be.
    NoRoom,
    /// Dropped: not Connecting, or an all-zero cookie.
    Ignored,
    /// Dropped: a RETRY was already taken in this handshake (normally the
    /// answer to the CONNECT's copy).
    Duplicate,
}

/// The shortest handshake interval after a RETRY's measurement: a round
/// trip measured as nothing (two endpoints in one host) still waits a
/// little before repeating.
const MIN_HANDSHAKE_INTERVAL_NS: u64 = 1_000;

impl<const P: usize> Connection<P> {
    /// Initiator: queue the CONNECT and arm the handshake timer.
    pub(crate) fn start_connect(&mut self, now: Instant, config: &Config) {
        self.queue_connect(config);
        self.ctrl.deadline = MaybeInstant::some(now + config.handshake_timeout);
        self.ctrl_tries = 1;
    }

    /// Queues the CONNECT, twice when so configured (spec 4.2 step 2).
    fn queue_connect(&mut self, config: &Config) {
        self.pending.set(Pending::CONNECT);
        if config.connect_twice {
            self.pending.set(Pending::CONNECT_COPY);
        }
    }

    /// The control retransmission interval after `ctrl_tries`
    /// transmissions: the handshake timeout, doubled per repeat (the first
    /// transmission waits it once, the second twice as long), at most
    /// `handshake_timeout_max` (spec 4.2, 4.11).
    pub(crate) fn handshake_interval(&self, config: &Config) -> core::time::Duration {
        let doubled = config
            .handshake_timeout
            .checked_mul(1u32 << self.ctrl_tries.saturating_sub(1).min(16))
            .unwrap_or(core::time::Duration::MAX);
        doubled.min(config.handshake_timeout_max.max(config.handshake_timeout))
    }

    /// An initiator's CONNECT carries an early proof (spec 4.2.4), kept in
    /// the cookie pool where a RETRY's cookie would be; `false` when the
    /// pool has no room (the CONNECT is then a plain one).
    #[cfg(feature = "aead")]
    pub(crate) fn start_early<B: Backing>(
        &mut self,
        proof: [u8; COOKIE_LEN],
        credentials: &mut Credentials<B>,
    ) -> bool {
        let Some(i) = credentials.cookies.alloc(proof) else {
            return false;
        };
        self.cookie = OptIndex::some(i);
        self.opening = Opening::Early;
        true
    }

    /// An initiator's CONNECT carries an address token (spec 4.2.5), kept
    /// in the cookie pool; `false` when the pool has no room.
    #[cfg(feature = "tokens")]
    pub(crate) fn start_token<B: Backing>(
        &mut self,
        token: [u8; COOKIE_LEN],
        credentials: &mut Credentials<B>,
    ) -> bool {
        let Some(i) = credentials.cookies.alloc(token) else {
            return false;
        };
        self.cookie = OptIndex::some(i);
        self.opening = Opening::Token;
        true
    }

    /// Acceptor: the connection is established; `token` goes out once in
    /// a NEW_TOKEN (spec 4.2.5), kept in the cookie pool until then (none
    /// sent when the pool has no room).
    #[cfg(feature = "tokens")]
    pub(crate) fn queue_new_token<B: Backing>(
        &mut self,
        token: [u8; COOKIE_LEN],
        credentials: &mut Credentials<B>,
    ) {
        if self.cookie.is_some() {
            return;
        }
        if let Some(i) = credentials.cookies.alloc(token) {
            self.cookie = OptIndex::some(i);
            self.pending.set(Pending::NEW_TOKEN);
        }
    }

    /// The cookie of the RETRY taken in this handshake, or the early proof
    /// (all zero before either). It is kept in the endpoint's cookie pool from the RETRY until
    /// the connection leaves Connecting (the endpoint gives it back then),
    /// so an idle connection pays only the index.
    fn retry_cookie<B: Backing>(&self, credentials: &Credentials<B>) -> [u8; COOKIE_LEN] {
        match self.cookie.get() {
            Some(i) if self.state == ConnState::Connecting => *credentials.cookies.get(i),
            _ => [0; COOKIE_LEN],
        }
    }

    /// Initiator: a RETRY addressed with our CONNECT's id and token (the
    /// endpoint checked both and the source). Taken once per handshake and
    /// only while Connecting: the CONNECT goes out again at once with the
    /// cookie, and the connect timeout starts again. A RETRY that finds the
    /// cookie pool empty is not taken (a later one may be: the CONNECT is
    /// repeated on the handshake timer).
    pub(crate) fn on_retry<B: Backing>(
        &mut self,
        now: Instant,
        r: &RetryRepr,
        send: &mut SendPools<B, P>,
        credentials: &mut Credentials<B>,
        config: &Config,
    ) -> RetryOutcome {
        if self.state != ConnState::Connecting || r.cookie == [0; COOKIE_LEN] {
            return RetryOutcome::Ignored;
        }
        if let (true, Some(i)) = (crate::crypto::SUPPORTED && self.early(), self.cookie.get()) {
            // The acceptor did not take the early CONNECT (spec 4.2.4): the
            // cookie replaces the proof, the CONNECT goes out as a plain
            // one, and the first flight, which it did not keep, is sent
            // again once established, under the keys of 5.3.3.
            *credentials.cookies.get_mut(i) = r.cookie;
            self.opening = Opening::Plain;
            self.rewind_early(send);
            credentials.keys.unkey(&self.protection);
        } else if let (true, Some(i)) = (
            cfg!(feature = "tokens") && self.opening == Opening::Token,
            self.cookie.get(),
        ) {
            // The acceptor did not take the token (spec 4.2.5): the cookie
            // replaces it.
            *credentials.cookies.get_mut(i) = r.cookie;
            self.opening = Opening::Plain;
        } else if self.cookie.is_some() {
            return RetryOutcome::Duplicate;
        } else {
            let Some(i) = credentials.cookies.alloc(r.cookie) else {
                credentials.cookie_refusals += 1;
                return RetryOutcome::NoRoom;
            };
            self.cookie = OptIndex::some(i);
        }
        self.ctrl.last_heard = now;
        self.queue_connect(config);
        // The RETRY proved the path works: the CONNECT with the cookie is a
        // fresh start. Its first interval is three round trips as the
        // RETRY measured them, when shorter than the configured one (spec
        // 4.2 step 4): a lost CONNECT with the cookie, or a lost ACCEPT,
        // then costs a few round trips, not 25 us sized for a path nothing
        // was known of. Only a CONNECT sent once gives an unambiguous
        // sample (Karn); its timer was armed when it was queued.
        // (Nanoseconds, not `Duration`s: this is firmware code.)
        let configured = duration_nanos(config.handshake_timeout);
        let mut first = configured;
        if self.ctrl_tries == 1 {
            if let Some(deadline) = self.ctrl.deadline.get() {
                let sent = deadline.as_nanos().saturating_sub(configured);
                first = first.min(now.as_nanos().saturating_sub(sent).saturating_mul(3));
            }
        }
        self.ctrl_tries = 1;
        self.ctrl.deadline = MaybeInstant::some(Instant::from_nanos(
            now.as_nanos() + first.max(MIN_HANDSHAKE_INTERVAL_NS),
        ));
        RetryOutcome::Taken
    }

    /// Gives the RETRY's cookie back to the pool once the connection is no
    /// longer Connecting (or is freed). Once per handshake: out of line.
    #[cold]
    #[inline(never)]
    pub(crate) fn drop_cookie<B: Backing>(&mut self, credentials: &mut Credentials<B>) {
        if let Some(i) = self.cookie.get() {
            credentials.cookies.free(i);
            self.cookie = OptIndex::NONE;
        }
    }

    pub(crate) fn connect_repr(&self, config: &Config) -> ConnectRepr {
        ConnectRepr {
            src_conn: self.local_id,
            src_token: self.local_token,
            mtu: self.params.mtu,
            max_paths: self.params.paths,
            window: self.params.window,
            initial_psn: self.send.initial.get(),
            reply_port: config.udp_port,
            timer_profile: config.timer_profile,
            suite: self.protection.suite(),
            key_id: self.protection.key_id(),
            // ACCEPT: zero; a CONNECT gets the RETRY's cookie when it is
            // sent (`poll_control`).
            cookie: [0; COOKIE_LEN],
        }
    }

    /// Acceptor: takes the initiator's CONNECT (new or repeated) and
    /// answers it with one ACCEPT. The acceptor never repeats ACCEPT on its
    /// own: the initiator's CONNECT retransmissions drive recovery (spec
    /// 4.2 step 5), so one CONNECT never draws more than one ACCEPT.
    pub(crate) fn on_connect(&mut self, c: &ConnectRepr, config: &Config, rng: &mut Rng) {
        if self.remote_id == 0 {
            self.adopt_peer(c, config, rng);
        }
        if matches!(self.state, ConnState::Accepting | ConnState::Established) {
            self.pending.set(Pending::ACCEPT);
        }
    }

    /// Takes the peer's id, token and first PSN from its CONNECT or ACCEPT
    /// and settles the parameters on the smaller of both offers (spec 4.2).
    pub(crate) fn adopt_peer(&mut self, c: &ConnectRepr, config: &Config, rng: &mut Rng) {
        self.remote_id = c.src_conn;
        self.remote_token = c.src_token;
        self.peer_profile = c.timer_profile;
        // The receive side starts here (it held the RETRY cookie).
        // STUB
        let paths = self.params.paths.min(c.max_paths).max(1);
        let redraw = paths != self.params.paths;
        self.params = Negotiated {
            mtu: self.params.mtu.min(c.mtu),
            paths,
            window: c.window.min(self.params.window).max(1),
        };
        if redraw {
            self.draw_all_entropy(config, rng);
        }
        self.recv.win.cum = crate::psn::Psn(c.initial_psn);
    }

    /// Initiator: the ACCEPT's protection does not meet our policy or
    /// offer (spec 5.3.6: no downgrade). The connection closes as REJECTED
    /// and one CLOSE tells the acceptor.
    pub(crate) fn refuse_accept<B: Backing>(
        &mut self,
        a: &ConnectRepr,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) {
        self.remote_id = a.src_conn;
        self.remote_token = a.src_token;
        if a.reply_port != 0 {
            self.peer.port = a.reply_port;
        }
        self.flush_work(Status::Flushed, Blame::Nobody, send, recv);
        self.state = ConnState::Closed;
        self.close_reason = CloseReason::Rejected;
        self.ctrl.deadline = MaybeInstant::NONE;
        self.pending = Pending::default();
        self.pending.set(Pending::CLOSE);
        self.events.raise(PendingEvents::CLOSED);
    }

    pub(crate) fn establish(&mut self) {
        self.state = ConnState::Established;
        self.ctrl.deadline = MaybeInstant::NONE;
        self.pending.clear(Pending::CONNECT | Pending::CONNECT_COPY);
        self.events.raise(PendingEvents::CONNECTED);
    }

    /// The application closes (spec 4.1.2).
    pub(crate) fn close<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        config: &Config,
    ) {
        match self.state {
            ConnState::Established | ConnState::Accepting => {
                self.state = ConnState::Closing;
                self.close_reason = CloseReason::Normal;
                self.maybe_send_close(now, send, config);
            }
            ConnState::Error => {
                self.state = ConnState::Closing;
                self.close_reason = CloseReason::Error;
                self.maybe_send_close(now, send, config);
            }
            ConnState::Connecting => {
                self.flush_work(Status::Flushed, Blame::Nobody, send, recv);
                self.state = ConnState::Closed;
                self.pending = Pending::default();
                self.ctrl.deadline = MaybeInstant::NONE;
                self.events.raise(PendingEvents::CLOSED);
            }
            ConnState::Closing | ConnState::Closed => {}
        }
    }

    /// Sends CLOSE once every send-queue entry is done (spec 4.1.2).
    pub(crate) fn maybe_send_close<B: Backing>(
        &mut self,
        now: Instant,
        send: &SendPools<B, P>,
        config: &Config,
    ) {
        if self.state == ConnState::Closing
            && !self.pending.has(Pending::CLOSE)
            && self.ctrl.deadline.is_none()
            && self.all_entries_done(send)
        {
            self.pending.set(Pending::CLOSE);
            self.ctrl.deadline = MaybeInstant::some(now + config.handshake_timeout);
            self.ctrl_tries = 1;
        }
    }

    pub(crate) fn on_close<B: Backing>(
        &mut self,
        flags: Flags,
        reason: CloseReason,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
    ) {
        let reply = flags.contains(Flags::CLOSE_REPLY);
        if !reply {
            // The reply repeats the reason of the CLOSE it answers (spec
            // 3.8.2), in Closed too.
            self.pending.set(Pending::CLOSE_REPLY);
            self.close_reason = reason;
        }
        if self.state == ConnState::Closed {
            return;
        }
        self.flush_work(Status::Flushed, Blame::Nobody, send, recv);
        self.state = ConnState::Closed;
        self.ctrl.deadline = MaybeInstant::NONE;
        self.pending.clear(Pending::CLOSE);
        self.close_reason = reason;
        self.events.raise(PendingEvents::CLOSED);
    }

    /// The control timer fired: resend with backoff, or give up. An
    /// initiator repeats CONNECT until `connect_timeout` has passed since
    /// it connected or took a RETRY (spec 4.2 step 2); CLOSE and the
    /// initiator's confirmation go out `handshake_retries` times.
    pub(crate) fn on_ctrl_timeout<B: Backing>(
        &mut self,
        now: Instant,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        config: &Config,
    ) {
        if self.state == ConnState::Connecting {
            let give_up = self.ctrl.last_heard + config.connect_timeout;
            if now >= give_up {
                self.ctrl.deadline = MaybeInstant::NONE;
                self.pending = Pending::default();
                self.fail(Status::RetryExceeded, Blame::Front, send, recv);
                return;
            }
            self.ctrl_tries = self.ctrl_tries.saturating_add(1);
            let next = (now + self.handshake_interval(config)).min(give_up);
            self.ctrl.deadline = MaybeInstant::some(next);
            self.queue_connect(config);
            return;
        }
        if self.ctrl_tries >= config.handshake_retries {
            self.ctrl.deadline = MaybeInstant::NONE;
            match self.state {
                // Confirmations exhausted: keep-alives take over.
                ConnState::Established => {}
                ConnState::Closing => {
                    self.flush_work(Status::Flushed, Blame::Nobody, send, recv);
                    self.state = ConnState::Closed;
                    self.pending.clear(Pending::CLOSE);
                    self.events.raise(PendingEvents::CLOSED);
                }
                _ => {
                    self.pending = Pending::default();
                    self.fail(Status::RetryExceeded, Blame::Front, send, recv);
                }
            }
            return;
        }
        self.ctrl_tries += 1;
        self.ctrl.deadline = MaybeInstant::some(now + self.handshake_interval(config));
        match self.state {
            ConnState::Closing => self.pending.set(Pending::CLOSE),
            // The initiator's confirmation, until the acceptor is heard from.
            ConnState::Established => self.pending.set(Pending::KEEPALIVE),
            _ => self.ctrl.deadline = MaybeInstant::NONE,
        }
    }

    pub(crate) fn header(&self, now: Instant, psn: u32, path: u8, flags: Flags) -> Header {
        // Before the ACCEPT, an early initiator's packets (its CONNECT and
        // its first flight) carry EARLY, and data its own id and token:
        // the acceptor finds the connection by them (spec 4.2.4).
        if crate::crypto::SUPPORTED && self.early() && self.remote_id == 0 {
            return Header {
                flags: flags.with(Flags::EARLY),
                dst_conn: self.local_id,
                token: self.local_token,
                psn,
                path: u16::from(path),
                timestamp: now.wire_timestamp(),
            };
        }
        Header {
            flags,
            dst_conn: self.remote_id,
            token: self.remote_token,
            psn,
            path: u16::from(path),
            timestamp: now.wire_timestamp(),
        }
    }

    /// Writes `repr`'s headers into `buf` and describes the packet.
    pub(crate) fn transmit(
        &mut self,
        now: Instant,
        repr: &Repr,
        buf: &mut [u8],
        path: u8,
        ecn_codepoint: u8,
        payload: Option<crate::api::PayloadRef>,
    ) -> Option<Transmit> {
        if buf.len() < repr.header_len() {
            return None;
        }
        repr.emit_header(buf);
        self.ctrl.last_sent = now;
        Some(Transmit {
            peer: self.peer,
            src_port: self.entropy[usize::from(path) % P],
            ecn: ecn_codepoint,
            header_len: repr.header_len(),
            payload,
            seal: None,
        })
    }

    /// Whether a control packet is waiting and can be addressed.
    pub(crate) fn control_ready(&self) -> bool {
        let p = self.pending;
        p.has(Pending::CONNECT) || (p.any() && self.remote_id != 0)
    }

    /// The next control packet, if one is pending. `grant_mbps`: the
    /// share an ACCEPT grants (spec 4.10.6), the endpoint's fair-share
    /// hint, which counts half-open connections.
    pub(crate) fn poll_control<B: Backing>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        grant_mbps: u32,
        credentials: &Credentials<B>,
        config: &Config,
    ) -> Option<Transmit> {
        let pending = self.pending;
        // Spec 3.2.4: CONNECT and ACCEPT carry the Initial PSN in their PSN
        // field, CLOSE and KEEPALIVE (like ACK and NAK) the next PSN.
        let next_psn = self.send.nxt.get();
        let initial = self.send.initial.get();
        let (bit, header, body) = if pending.has(Pending::CONNECT) {
            let mut h = self.header(now, initial, 0, Flags::NONE);
            h.dst_conn = 0;
            h.token = 0;
            // The READ depth rides in the Path ID (spec 3.8.1).
            h.path = u16::from(self.send.read_depth);
            let c = ConnectRepr {
                cookie: self.retry_cookie(credentials),
                ..self.connect_repr(config)
            };
            (Pending::CONNECT, h, Body::Connect(c))
        } else if pending.has(Pending::ACCEPT) {
            let mut h = self.header(now, initial, 0, Flags::NONE);
            h.path = u16::from(self.send.read_depth);
            let mut a = self.connect_repr(config);
            if crate::config::GRANTS {
                a.set_rate_grant_mbps(grant_mbps);
            }
            (Pending::ACCEPT, h, Body::Accept(a))
        } else if pending.has(Pending::CLOSE_REPLY) {
            let h = self.header(now, next_psn, 0, Flags::CLOSE_REPLY);
            let reason = self.close_reason;
            (Pending::CLOSE_REPLY, h, Body::Close(CloseRepr { reason }))
        } else if pending.has(Pending::CLOSE) {
            let h = self.header(now, next_psn, 0, Flags::NONE);
            let reason = self.close_reason;
            (Pending::CLOSE, h, Body::Close(CloseRepr { reason }))
        } else if pending.has(Pending::KEEPALIVE) {
            let h = self.header(now, next_psn, 0, Flags::NONE);
            (Pending::KEEPALIVE, h, Body::Keepalive)
        } else if cfg!(feature = "tokens") && pending.has(Pending::NEW_TOKEN) {
            let h = self.header(now, next_psn, 0, Flags::NONE);
            let token = match self.cookie.get() {
                Some(i) => *credentials.cookies.get(i),
                None => [0; COOKIE_LEN],
            };
            (
                Pending::NEW_TOKEN,
                h,
                Body::NewToken(NewTokenRepr { token }),
            )
        } else {
            return None;
        };
        // A CONNECT with its copy still to go stays queued (spec 4.2 step 2).
        self.pending.clear(
            if pending.has(Pending::CONNECT_COPY) && bit == Pending::CONNECT {
                Pending::CONNECT_COPY
            } else {
                bit
            },
        );
        if self.remote_id == 0 && bit != Pending::CONNECT {
            // Nobody to address yet.
            return None;
        }
        let repr = Repr {
            header,
            body,
            payload_len: 0,
        };
        self.transmit(now, &repr, buf, 0, ecn::NOT_ECT, None)
    }
}
