//! Inputs: received packets, CONNECTs, and timers (spec 4.2, 4.7).

use super::admission::CookieCheck;
use super::prefixes::{PrefixRefusal, Prefixes};
use super::{ConnSlot, Endpoint, StatelessBody, StatelessReply};
use crate::api::{Memory, PeerAddr, RxMeta};
use crate::config::{AcceptDomain, AddressValidation, PER_CONNECTION_DOMAINS};
use crate::conn::{ConnState, Connection, PendingEvents, RetryOutcome};
use crate::storage::Backing;
use crate::time::Instant;
use crate::wire::{self, Body, CloseReason, ConnectRepr, CrcVerdict, Flags};

use crate::conn::ReliableOutcome;
use crate::crypto::Admit;

impl<B: Backing, const P: usize> Endpoint<B, P> {
    /// Handles one received MetaRoCE packet (the UDP payload). Invalid
    /// packets are dropped and counted, or NAKed (spec 4.7); payload is
    /// placed through `mem` only after every check passed.
    #[inline]
    pub fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        bytes: &[u8],
        mem: &mut impl Memory,
    ) {
        self.handle_packet_with_verdict(now, meta, bytes, CrcVerdict::NotChecked, mem);
    }

    /// [`Endpoint::handle_packet`] for a packet whose CRC trailer a device
    /// already checked (a NIC's CRC offload, spec 3.9): `crc` stands in for
    /// the software check. `Good` skips it; `Bad` drops the packet and
    /// counts it in [`crate::stats::DropStats::bad_crc`], as a failed
    /// software check does; `NotChecked` is [`Endpoint::handle_packet`].
    pub fn handle_packet_with_verdict(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        bytes: &[u8],
        crc: CrcVerdict,
        mem: &mut impl Memory,
    ) {
        self.now = self.now.max(now);
        // Borrowed where the parse left it, not moved out of the Result
        // (a copy of the whole representation per packet).
        let parsed = wire::packet::parse_repr(bytes, crc);
        let repr = match &parsed {
            Ok(r) => r,
            Err(e) => {
                self.drops.count_wire_error(*e);
                return;
            }
        };
        let payload = repr.payload_in(bytes);
        if let Body::Connect(c) = repr.body {
            self.rx_read_depth = repr.header.path.min(255) as u8;
            let early = crate::crypto::SUPPORTED && repr.header.flags.contains(Flags::EARLY);
            self.on_connect(now, meta, &c, early);
            self.rx_read_depth = 0;
            return;
        }
        let i = if crate::crypto::SUPPORTED && repr.header.flags.contains(Flags::EARLY) {
            // Sent before the ACCEPT, with the initiator's own id and
            // token (spec 4.2.4).
            #[cfg(feature = "aead")]
            let found = self.early_slot(&meta.source.ip, &repr.header);
            #[cfg(not(feature = "aead"))]
            let found: Option<u32> = None;
            let Some(i) = found else {
                self.drops.early_unmatched += 1;
                return;
            };
            i as usize
        } else {
            let dst = repr.header.dst_conn;
            let i = self.ids.index_of(dst).unwrap_or(usize::MAX);
            let known = self
                .slots
                .get(i)
                .is_some_and(|s| s.live && !s.released && s.conn.local_id == dst);
            if !known {
                if !self.answer_late_close(i, &repr.header, &repr.body, &meta.source.ip) {
                    self.drops.unknown_connection += 1;
                }
                return;
            }
            let conn = &self.slots[i].conn;
            if conn.local_token != repr.header.token {
                self.drops.bad_token += 1;
                return;
            }
            if conn.peer.ip != meta.source.ip {
                self.drops.bad_source += 1;
                return;
            }
            i
        };
        let config = &self.config;
        let conn = &mut self.slots[i].conn;
        // Spec 5.3.5: a protected connection takes only packets that
        // authenticate (decrypted into `rx_plain`), CONNECT, ACCEPT and
        // RETRY aside.
        let keys = &mut self.res.credentials.keys;
        let payload = match keys.admit(&conn.protection, bytes, &mut self.rx_plain) {
            Admit::Clear => payload,
            Admit::Opened(plain) => plain,
            Admit::Drop => return,
        };
        if let Body::Retry(r) = &repr.body {
            // Addressed with our CONNECT's id and token, so it answers our
            // CONNECT; taken once per handshake (spec 4.2).
            let res = &mut self.res;
            match conn.on_retry(now, r, &mut res.send, &mut res.credentials, config) {
                RetryOutcome::Taken => self.refresh(i as u32, now, false),
                // Counted with the pool refusals.
                RetryOutcome::NoRoom => {}
                RetryOutcome::Ignored => self.drops.retry_ignored += 1,
                RetryOutcome::Duplicate => self.drops.retry_duplicate += 1,
            }
            return;
        }
        let outcome = conn.on_packet(now, repr, payload, meta.ce, &mut self.res, mem, config);
        #[cfg(feature = "tokens")]
        if let Body::NewToken(t) = &repr.body {
            // For this endpoint's later CONNECTs to that acceptor.
            self.remember_token(&meta.source.ip, t.token);
        }
        if outcome == Some(ReliableOutcome::Placed) {
            // The receiver's active senders, newest last (spec 4.10.4). A
            // first transmission asking for an ACK is the sender's last
            // before it goes idle (or its window is full): it counts for
            // the window's floor only, so the others' hints rise soon after
            // it finished (63-to-1 incast: 1.0145x -> 1.0090x of the wire
            // floor), yet a sender of short messages one at a time, back
            // within the floor, still counts (at once out of the count, 8
            // KiB messages one at a time: 1.0138x -> 1.145x).
            let i = i as u32;
            let f = repr.header.flags;
            let idle = f.contains(Flags::ACK_REQUEST) && !f.contains(Flags::RETRANSMISSION);
            self.slots[i as usize].set(super::table::IDLE, idle);
            let s = &mut self.slots[i as usize];
            if crate::crypto::SUPPORTED && s.half_open && !s.has(super::table::SENDING_HALF_OPEN) {
                // An early first flight (spec 4.2.4): a sender now, no
                // longer one about to start, for the hint.
                s.set(super::table::SENDING_HALF_OPEN, true);
                self.half_open_sending += 1;
                self.hint_cache.0 = Instant::FAR_FUTURE;
            }
            self.active
                .move_to_back(&mut self.slots, i, ConnSlot::active_link);
        }
        // An open connection is refreshed once for all the packets of a
        // receive batch, before anything reads what refresh files (the
        // ready and completion lists, the wheel). One whose handshake or
        // life changed is refreshed at once: refresh moves it between the
        // endpoint's counts and frees its slot.
        let s = &mut self.slots[i];
        if s.conn.state != ConnState::Established || s.released || s.half_open {
            self.refresh(i as u32, now, false);
        } else if !s.has(super::table::TOUCHED) {
            if self.touched.push(i as u32).is_ok() {
                s.set(super::table::TOUCHED, true);
            } else {
                self.refresh(i as u32, now, false);
            }
        }
    }

    /// A CONNECT (spec 4.2 step 3): a repeat of one that created a
    /// connection gets that connection's ACCEPT again; otherwise the
    /// address must be proved with a cookie (a RETRY answers, nothing is
    /// kept), the source must be within its limits, and a slot free (a
    /// CLOSE REJECTED answers otherwise). Every answer without a
    /// connection goes through the bounded stateless queue and is smaller
    /// than the CONNECT.
    fn on_connect(&mut self, now: Instant, meta: &RxMeta, c: &ConnectRepr, early: bool) {
        let config = self.config;
        // A repeated CONNECT: answer it with an ACCEPT, create nothing.
        // The connection's address was verified when it was created, and
        // the ACCEPT goes there.
        let hash = self.hash_peer(&meta.source.ip, c.src_conn, c.src_token);
        let slots = &self.slots;
        let existing = self.index.find(hash, |v| {
            let k = &slots[v as usize].conn;
            k.remote_id == c.src_conn
                && k.remote_token == c.src_token
                && k.peer.ip == meta.source.ip
        });
        if let Some(i) = existing {
            let s = &mut self.slots[i as usize];
            if !s.released {
                s.conn.on_connect(c, &config, &mut self.res.rng);
                self.refresh(i, now, false);
            }
            return;
        }
        let port = if c.reply_port != 0 {
            c.reply_port
        } else {
            config.udp_port
        };
        let peer = PeerAddr {
            ip: meta.source.ip,
            port,
        };
        if !config.accept_incoming {
            self.drops.refused += 1;
            self.reply_stateless(peer, c, StatelessBody::Close(CloseReason::Rejected));
            return;
        }
        // 0-RTT (spec 4.2.4): a valid early proof stands for the cookie.
        // Anything else in its place is no cookie at all.
        #[cfg(feature = "aead")]
        let taken = if early {
            self.check_early(now, meta, c).ok()
        } else {
            None
        };
        #[cfg(not(feature = "aead"))]
        let taken: Option<()> = None;
        // Address validation (spec 4.2, 5.1.4); always for an offer of
        // protection, whose key slot is committed with the connection.
        let required = taken.is_none()
            && (c.suite != wire::CipherSuite::None
                || match config.address_validation {
                    AddressValidation::Always => true,
                    AddressValidation::WhenLoaded { half_open } => self.half_open >= half_open,
                });
        if required {
            self.cookies
                .rotate(now, config.cookie_lifetime, &mut self.res.rng);
            let check = if early || c.cookie == [0; wire::COOKIE_LEN] {
                None
            } else if cfg!(feature = "tokens")
                && c.cookie[super::admission::FORMAT_AT] == super::admission::TOKEN_FORMAT
            {
                // An address token (spec 4.2.5): good for its address.
                #[cfg(feature = "tokens")]
                self.token_keys
                    .rotate(now, config.token_lifetime, &mut self.res.rng);
                #[cfg(feature = "tokens")]
                let token = self.token_keys.check_token(
                    now,
                    config.token_lifetime,
                    &meta.source.ip,
                    &c.cookie,
                );
                #[cfg(not(feature = "tokens"))]
                let token = CookieCheck::Invalid;
                if token == CookieCheck::Valid {
                    self.drops.token_taken += 1;
                } else {
                    self.drops.token_invalid += 1;
                }
                Some(token).filter(|t| *t == CookieCheck::Valid)
            } else {
                Some(self.cookies.check(
                    now,
                    config.cookie_lifetime,
                    &meta.source.ip,
                    meta.source.port,
                    c,
                ))
            };
            match check {
                Some(CookieCheck::Valid) => {}
                other => {
                    match other {
                        None => self.drops.connect_unverified += 1,
                        Some(CookieCheck::Expired) => self.drops.cookie_expired += 1,
                        _ => self.drops.cookie_invalid += 1,
                    }
                    if self.stateless.is_full() {
                        // No MAC for a reply that would not be sent.
                        self.drops.replies_dropped += 1;
                        return;
                    }
                    let cookie = self
                        .cookies
                        .issue(now, &meta.source.ip, meta.source.port, c);
                    self.reply_stateless(peer, c, StatelessBody::Retry(cookie));
                    return;
                }
            }
        }
        // Fair admission (spec 4.2.3): the source's prefixes within their
        // limits and shares; near a full table only a prefix below its
        // fair share gets a slot, one the heaviest prefix gives up.
        let prefixes = match self.admit_prefixes(now, &meta.source.ip) {
            Ok(p) => p,
            Err(why) => {
                match why {
                    PrefixRefusal::Rate => self.drops.refused_source_rate += 1,
                    PrefixRefusal::HalfOpen => self.drops.refused_source_half_open += 1,
                    PrefixRefusal::Share => self.drops.refused_prefix_share += 1,
                    PrefixRefusal::TableFull => self.drops.refused_prefix_table += 1,
                }
                self.reply_stateless(peer, c, StatelessBody::Close(CloseReason::Rejected));
                return;
            }
        };
        if self.free.is_empty() {
            // A slot is reclaimed: the initiator's next CONNECT takes it.
            if prefixes.is_some_and(|p| self.reclaim(now, p, false)) {
                self.drops.connect_deferred += 1;
                return;
            }
            self.drops.refused += 1;
            self.reply_stateless(peer, c, StatelessBody::Close(CloseReason::Rejected));
            return;
        }
        // Spec 5.3.6: the suite and key, or a refusal, before any state
        // (and only for a proved address: a key slot is state).
        let mut protection = match self.res.credentials.keys.answer(&config.protection, c) {
            Ok(p) => p,
            Err(why) => {
                if why == crate::crypto::Refusal::NoKeySlot
                    && prefixes.is_some_and(|p| self.reclaim(now, p, true))
                {
                    self.drops.connect_deferred += 1;
                    return;
                }
                self.reply_stateless(peer, c, StatelessBody::Close(CloseReason::Rejected));
                return;
            }
        };
        let Some((i, _, id)) = self.allocate_slot() else {
            self.res.credentials.keys.release(&mut protection);
            self.drops.refused += 1;
            self.reply_stateless(peer, c, StatelessBody::Close(CloseReason::Rejected));
            return;
        };
        if let Some(p) = prefixes {
            self.prefixes.charge(p);
        }
        self.half_open += 1;
        let slot = &mut self.slots[i as usize];
        slot.half_open = true;
        slot.prefix = prefixes.map_or(super::table::NOT_COUNTED, |p| p.narrow);
        // The next ACCEPT's grant counts this one (spec 4.10.6).
        self.hint_cache.0 = Instant::FAR_FUTURE;
        let pd = match config.accept_domain {
            AcceptDomain::Shared(pd) => pd,
            AcceptDomain::PerConnection => {
                let pd = self.next_domain;
                // Wraps within the upper half: 2^31 connections before a
                // domain number comes back.
                self.next_domain = PER_CONNECTION_DOMAINS | self.next_domain.wrapping_add(1);
                pd
            }
        };
        let mut conn = Connection::new(
            id,
            peer,
            pd,
            &config,
            &mut self.res.rng,
            now,
            ConnState::Accepting,
        );
        conn.on_connect(c, &config, &mut self.res.rng);
        conn.protection = protection;
        if taken.is_some() && protection.key_id() != 0 {
            conn.opening = crate::conn::Opening::Early;
        }
        if protection.key_id() != 0 {
            let accept = conn.connect_repr(&config);
            self.res
                .credentials
                .keys
                .install(&protection, false, conn.early(), c, &accept);
        }
        #[cfg(feature = "aead")]
        if let (Some(t), true) = (taken, conn.early()) {
            self.take_early(t);
        }
        conn.events.raise(PendingEvents::INCOMING);
        self.slots[i as usize].conn = conn;
        if self.index.insert(hash, i) {
            self.slots[i as usize].set(super::table::INDEXED, true);
        }
        self.refresh(i, now, false);
    }

    /// The prefixes of a proved source address, if they may open one more
    /// connection now (spec 4.2.3).
    fn admit_prefixes(
        &mut self,
        now: Instant,
        ip: &smoltcp::wire::IpAddress,
    ) -> Result<Option<Prefixes>, PrefixRefusal> {
        let config = &self.config;
        let Some(p) = self
            .prefixes
            .locate(ip, &config.admission, &config.source_limits, now)?
        else {
            return Ok(None);
        };
        let capacity = self.capacity() as u32;
        self.prefixes
            .check(p, now, &config.source_limits, &config.admission, capacity)?;
        Ok(Some(p))
    }

    /// The prefix holding the most (at least two more than `p`'s wide
    /// prefix) gives up one of its reclaimable connections, one holding a
    /// key slot if `key`: CLOSE (RECLAIMED) goes out, and the slot is
    /// free once the application released it (spec 4.2.3). Slots are
    /// searched from a cursor that moves on, so successive reclaims take
    /// different connections.
    fn reclaim(&mut self, now: Instant, p: Prefixes, key: bool) -> bool {
        /// Slots looked at per search.
        const STEPS: u32 = 256;
        if !cfg!(feature = "fair-admission") {
            return false;
        }
        let held = self.prefixes.entry(p.wide).total;
        let Some(w) = self.prefixes.heaviest(held + 2, now) else {
            return false;
        };
        let policy = self.config.admission;
        let capacity = self.capacity() as u32;
        for _ in 0..STEPS.min(capacity) {
            let i = self.reclaim_cursor;
            self.reclaim_cursor = if i + 1 >= capacity { 0 } else { i + 1 };
            let s = &mut self.slots[i as usize];
            let has_key = s.conn.protection.key_id() != 0;
            if s.prefix == super::table::NOT_COUNTED
                || s.released
                || (key && !has_key)
                || !s.conn.reclaimable(now, policy.idle_after)
                || !self.prefixes.is_wide_prefix_of(w, &s.conn.peer.ip, &policy)
            {
                continue;
            }
            if s.conn.state == ConnState::Accepting {
                self.drops.reclaimed_unconfirmed += 1;
            } else {
                self.drops.reclaimed_idle += 1;
            }
            s.conn.end(
                CloseReason::Reclaimed,
                &mut self.res.send,
                &mut self.res.recv,
            );
            self.refresh(i, now, false);
            return true;
        }
        false
    }

    /// Queues a reply to CONNECT `c` that needs no connection; dropped and
    /// counted when the queue is full (a flood gets no more answers than
    /// the queue holds per poll).
    fn reply_stateless(&mut self, peer: PeerAddr, c: &ConnectRepr, body: StatelessBody) {
        self.queue_stateless(peer, c.src_conn, c.src_token, body);
    }

    /// Queues a reply that needs no connection state to `peer`, addressed
    /// with `dst_conn` and `token`; counted as sent, or as dropped when the
    /// queue is full.
    pub(super) fn queue_stateless(
        &mut self,
        peer: PeerAddr,
        dst_conn: u32,
        token: u64,
        body: StatelessBody,
    ) {
        let reply = StatelessReply {
            peer,
            dst_conn,
            token,
            body,
        };
        if self.stateless.push_back(reply).is_err() {
            self.drops.replies_dropped += 1;
            return;
        }
        match body {
            StatelessBody::Retry(_) => self.drops.retries_sent += 1,
            StatelessBody::Close(_) => self.drops.rejects_sent += 1,
            StatelessBody::CloseReply(_) => {}
        }
    }

    /// Runs the timers whose deadline has passed: only the connections
    /// that are due, taken from the timing wheel.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        self.refresh_touched();
        while let Some(i) =
            self.wheel
                .pop_expired(&mut self.slots, now.as_nanos(), ConnSlot::timer_entry)
        {
            let s = &mut self.slots[i as usize];
            if !s.live {
                continue;
            }
            s.conn
                .handle_timeout(now, &mut self.res.send, &mut self.res.recv, &self.config);
            self.refresh(i, now, true);
        }
    }
}
