//! 0-RTT at both ends (spec 4.2.4): the initiator's proof, the acceptor's
//! checks of it, the filter of proofs already taken, and finding the
//! connection an early packet belongs to.
//!
//! A proof is checked in this order, each failure counted and answered
//! as a CONNECT without a cookie (one RETRY, nothing kept): the endpoint
//! knows its own address and the key the CONNECT names (`early_invalid`
//! otherwise); the proof's time is within `Config::early_window` of the
//! wall clock and not before the wall clock was first set, when the
//! filter started (`early_stale`); the tag matches (`early_invalid`); the
//! offer is one the acceptor meets in full (`early_refused`); the proof
//! is not in the filter (`early_replayed`) and the filter has room for it
//! (`early_refused`). A forged or replayed proof so costs one keyed hash
//! and a filter lookup; a proof is entered in the filter only with the
//! connection it creates.

use smoltcp::wire::IpAddress;

use super::Endpoint;
use crate::api::{PeerAddr, RxMeta};
use crate::crypto::early::{make_proof, proof_matches, proof_time, ProofAddresses};
use crate::storage::Backing;
use crate::time::Instant;
use crate::wire::{ConnectRepr, Header};

/// Proofs the acceptor remembers at most (8 KiB of tags and times).
pub(crate) const FILTER_SLOTS: usize = 512;
/// Slots a tag may sit in, from its hash.
const PROBE: usize = 8;

/// The proofs an acceptor took, each until its time plus the early
/// window, after which its time alone refuses it. An open-addressed table
/// of 64-bit tag prefixes; a slot is free once its time has passed.
#[derive(Debug, Clone)]
pub(crate) struct ProofFilter {
    tags: [u64; FILTER_SLOTS],
    /// Wall clock in ms (wrapping) until which the slot's tag is kept; 0:
    /// never used.
    until_ms: [u32; FILTER_SLOTS],
}

impl ProofFilter {
    pub(crate) const NEW: ProofFilter = ProofFilter {
        tags: [0; FILTER_SLOTS],
        until_ms: [0; FILTER_SLOTS],
    };

    fn live(&self, slot: usize, now_ms: u32) -> bool {
        self.until_ms[slot] != 0 && (self.until_ms[slot].wrapping_sub(now_ms) as i32) > 0
    }

    /// Where `tag` would be entered: `Ok(slot)`, or why it cannot be.
    pub(crate) fn find(&self, tag: u64, now_ms: u32) -> Result<usize, Refusal> {
        let start = tag as usize % FILTER_SLOTS;
        let mut free = None;
        for k in 0..PROBE {
            let slot = (start + k) % FILTER_SLOTS;
            if self.live(slot, now_ms) {
                if self.tags[slot] == tag {
                    return Err(Refusal::Replayed);
                }
            } else if free.is_none() {
                free = Some(slot);
            }
        }
        free.ok_or(Refusal::Full)
    }

    pub(crate) fn enter(&mut self, slot: usize, tag: u64, until_ms: u32) {
        self.tags[slot] = tag;
        self.until_ms[slot] = until_ms.max(1);
    }
}

/// Why an early CONNECT was not taken as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No address of our own, no such key, or a tag that does not match.
    Invalid,
    /// The proof's time is outside the window.
    Stale,
    /// The offer is more than this endpoint supports.
    OfferUnmet,
    /// The proof was taken already.
    Replayed,
    /// No room in the filter's probe range.
    Full,
}

/// A proof the acceptor may take: its filter slot and tag, entered when
/// the connection is created.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    slot: usize,
    tag: u64,
    until_ms: u32,
}

impl<B: Backing, const P: usize> Endpoint<B, P> {
    /// Initiator: the proof of a new connection's CONNECT, if 0-RTT is on,
    /// the connection is keyed and the endpoint knows its own address.
    pub(super) fn early_proof(
        &self,
        now: Instant,
        peer: PeerAddr,
        src_port: u16,
        c: &ConnectRepr,
    ) -> Option<[u8; crate::wire::COOKIE_LEN]> {
        let config = &self.config;
        let local = config.local_ip?;
        if !config.early_data || c.key_id == 0 {
            return None;
        }
        let psk = self.res.credentials.keys.psk(c.key_id)?;
        let at = ProofAddresses {
            initiator: local,
            initiator_port: src_port,
            acceptor: peer.ip,
            acceptor_port: peer.port,
        };
        Some(make_proof(psk, self.wall_ns(now), &at, c))
    }

    /// Acceptor: whether the early proof of CONNECT `c` from `meta` may be
    /// taken (spec 4.2.4), counted when not.
    pub(super) fn check_early(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        c: &ConnectRepr,
    ) -> Result<Taken, Refusal> {
        let r = self.check_early_inner(now, meta, c);
        if let Err(why) = r {
            let d = &mut self.drops;
            match why {
                Refusal::Invalid => d.early_invalid += 1,
                Refusal::Stale => d.early_stale += 1,
                Refusal::Replayed => d.early_replayed += 1,
                Refusal::OfferUnmet | Refusal::Full => d.early_refused += 1,
            }
        }
        r
    }

    fn check_early_inner(
        &self,
        now: Instant,
        meta: &RxMeta,
        c: &ConnectRepr,
    ) -> Result<Taken, Refusal> {
        let config = &self.config;
        // An endpoint that protects nothing would not key the connection
        // the proof asks for (spec 4.2.4 step 1, 5.3.6).
        let protects = config.protection.policy != crate::crypto::Policy::Off;
        let (Some(local), true, true) = (config.local_ip, config.early_data, protects) else {
            return Err(Refusal::Invalid);
        };
        let psk = self
            .res
            .credentials
            .keys
            .psk(c.key_id)
            .ok_or(Refusal::Invalid)?;
        let wall = self.wall_ns(now);
        let window = config.early_window.as_nanos() as u64;
        let time = proof_time(&c.cookie);
        // Older than the filter (a restart emptied it): it may have been
        // taken before.
        if wall.abs_diff(time) > window || time < self.early_since_ns {
            return Err(Refusal::Stale);
        }
        let at = ProofAddresses {
            initiator: meta.source.ip,
            initiator_port: meta.source.port,
            acceptor: local,
            acceptor_port: config.connect_port.unwrap_or(config.udp_port),
        };
        if !proof_matches(psk, &at, c) {
            return Err(Refusal::Invalid);
        }
        if c.mtu > config.mtu || c.max_paths > config.paths || c.window > config.window {
            return Err(Refusal::OfferUnmet);
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&c.cookie[16..24]);
        let tag = u64::from_le_bytes(t);
        let now_ms = (wall / 1_000_000) as u32;
        let until_ms = ((time.saturating_add(window)) / 1_000_000) as u32;
        let slot = self.early_filter.find(tag, now_ms)?;
        Ok(Taken {
            slot,
            tag,
            until_ms: until_ms.wrapping_add(1),
        })
    }

    /// The proof's connection was created: the proof is remembered.
    pub(super) fn take_early(&mut self, t: Taken) {
        self.drops.early_taken += 1;
        self.early_filter.enter(t.slot, t.tag, t.until_ms);
    }

    /// Acceptor: the connection an early packet belongs to, found by the
    /// initiator's id and token and its source address, as a repeated
    /// CONNECT is (spec 4.2.4); only one created by an early CONNECT.
    pub(super) fn early_slot(&self, ip: &IpAddress, h: &Header) -> Option<u32> {
        let hash = self.hash_peer(ip, h.dst_conn, h.token);
        let slots = &self.slots;
        let i = self.index.find(hash, |v| {
            let k = &slots[v as usize].conn;
            k.remote_id == h.dst_conn && k.remote_token == h.token && k.peer.ip == *ip
        })?;
        let s = &self.slots[i as usize];
        (s.live && !s.released && s.conn.early()).then_some(i)
    }
}
