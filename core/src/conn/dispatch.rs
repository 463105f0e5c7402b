//! Where a packet of a connection goes: each received packet to the
//! handler of its type (spec 4.1.3, 4.7.1), and each transmit opportunity
//! to control packets, then ACKs, then data (spec 4.5).

use super::{
    ConnState, Connection, Credentials, FirstSender, Opening, Pending, RecvPools, Regions,
    ReliableOutcome, Resources, SendPools,
};
use crate::api::{Memory, Transmit};
use crate::config::Config;
use crate::storage::Backing;
use crate::time::{Instant, MaybeInstant};
use crate::wire::Body;

impl<const P: usize> Connection<P> {
    /// Dispatches a packet whose connection id, token and source matched.
    /// Takes every group: its handlers together touch all but the READ
    /// reservations, and each is lent only the groups it uses.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_packet<B: Backing>(
        &mut self,
        now: Instant,
        repr: &crate::wire::Repr,
        payload: &[u8],
        ce: bool,
        res: &mut Resources<B, P>,
        mem: &mut impl Memory,
        config: &Config,
    ) -> Option<ReliableOutcome> {
        self.ctrl.last_heard = now;
        // An early packet carries the initiator's own id and token: it
        // does not show that the ACCEPT arrived (spec 4.2.4).
        let early = repr.header.flags.contains(crate::wire::Flags::EARLY);
        if self.state == ConnState::Accepting && !matches!(repr.body, Body::Connect(_)) && !early {
            self.establish();
            if matches!(repr.body, Body::Keepalive) {
                // Tell the initiator its confirmation arrived (spec 4.2
                // step 5): it stops repeating it.
                self.pending.set(Pending::KEEPALIVE);
            }
        } else if self.state == ConnState::Established
            && self.ctrl.deadline.is_some()
            && !matches!(repr.body, Body::Accept(_) | Body::Connect(_))
        {
            // The acceptor is established: the confirmation got through.
            self.ctrl.deadline = MaybeInstant::NONE;
        }
        let Resources {
            send,
            recv,
            regions,
            rng,
            credentials,
            ..
        } = res;
        match &repr.body {
            Body::Accept(a) => {
                if self.state == ConnState::Connecting {
                    // Spec 5.3.6: the ACCEPT must agree with our offer;
                    // the keys derive from both (before adopt_peer
                    // changes what connect_repr would say).
                    let offer = self.connect_repr(config);
                    let policy = config.protection.policy;
                    let early = self.early();
                    if credentials
                        .keys
                        .on_accept(&mut self.protection, early, policy, &offer, a)
                        .is_err()
                    {
                        self.refuse_accept(a, send, recv);
                        return None;
                    }
                    if a.reply_port != 0 {
                        self.peer.port = a.reply_port;
                    }
                    let before = self.params;
                    self.adopt_peer(a, config, rng);
                    if crate::crypto::SUPPORTED && self.early() {
                        // The acceptor took the offer in full, or the
                        // first flight was sized for values it does not
                        // have: sent again from the start (spec 4.2.4).
                        if self.params != before {
                            self.rewind_early(send);
                        }
                        self.opening = Opening::Plain;
                    }
                    if crate::crypto::SUPPORTED && self.params.mtu != before.mtu {
                        self.resegment_unstarted(send);
                    }
                    // Its READ depth rides in the Path ID (spec 3.8.1).
                    self.send.peer_read_depth = repr.header.path.min(255) as u8;
                    if crate::config::GRANTS {
                        self.send.first_sender = FirstSender::grant(a.rate_grant_mbps());
                        // An early sender already runs: the grant replaces
                        // its first flight's line rate.
                        self.apply_grant(a.rate_grant_mbps(), send, config);
                    }
                    // Confirm at once so the acceptor is established even if
                    // we have no data to send, and repeat the confirmation
                    // on the handshake timer until the acceptor is heard
                    // from (spec 4.2 step 5).
                    self.pending.set(Pending::KEEPALIVE);
                    self.establish();
                    self.ctrl.deadline = MaybeInstant::some(now + config.handshake_timeout);
                    self.ctrl_tries = 1;
                } else if self.state == ConnState::Established {
                    // A repeated ACCEPT: our confirmation was lost.
                    self.pending.set(Pending::KEEPALIVE);
                }
                None
            }
            Body::Connect(_) | Body::Keepalive | Body::Retry(_) | Body::NewToken(_) => None,
            Body::Close(c) => {
                self.on_close(repr.header.flags, c.reason, send, recv);
                None
            }
            Body::Ack(a) => {
                if self.state.is_open() || self.state == ConnState::Error {
                    self.on_ack(now, a, send, rng, config);
                }
                None
            }
            Body::Nak(n) => {
                if self.state.is_open() {
                    self.on_nak(now, n, send, recv, config);
                }
                None
            }
            Body::Write(_) | Body::Send(_) | Body::ReadRequest(_) | Body::ReadResponse(_) => {
                Some(self.on_reliable(now, repr, payload, ce, send, recv, regions, mem, config))
            }
        }
    }

    /// The connection's next packet, if any is due: control first (they
    /// unblock everything else), then an ACK, data. NAKs go out from the
    /// endpoint's queue before any connection's packets.
    /// Whether a control packet or an ACK may go out now: what the
    /// endpoint sends before other connections' data.
    pub(crate) fn wants_control_or_ack(&self) -> bool {
        self.control_ready() || self.ack_ready()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn poll_transmit<B: Backing>(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        rate_hint_mbps: u32,
        send: &mut SendPools<B, P>,
        recv: &mut RecvPools<B>,
        regions: &Regions<B>,
        credentials: &Credentials<B>,
        config: &Config,
    ) -> Option<Transmit> {
        if self.pending.any() {
            if let Some(t) = self.poll_control(now, buf, rate_hint_mbps, credentials, config) {
                return Some(t);
            }
        }
        if self.ack_ready() {
            return self.emit_ack(now, buf, rate_hint_mbps, recv);
        }
        if !self.may_send_data() {
            return None;
        }
        self.poll_data(now, buf, send, recv, regions, config)
    }
}
