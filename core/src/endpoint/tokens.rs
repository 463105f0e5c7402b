//! Address tokens (spec 4.2.5), in the spirit of QUIC's NEW_TOKEN: an
//! acceptor hands an initiator whose address it validated a token; that
//! initiator's later CONNECTs to it from the same address carry the
//! token in their Cookie field and skip the RETRY's round trip. The
//! acceptor keeps nothing per token (it checks its tag, as a cookie's);
//! the initiator keeps the newest token of each acceptor it talked to in
//! a small table of fixed size.

use smoltcp::wire::IpAddress;

use super::Endpoint;
use crate::storage::Backing;
use crate::time::Instant;
use crate::wire::{ip16, COOKIE_LEN};

/// Acceptors whose tokens an initiator keeps at most.
pub(crate) const TOKEN_CACHE_SLOTS: usize = 64;

/// The newest token of each acceptor, direct-mapped by a hash of its
/// address: a newer acceptor may push an older one's out.
#[derive(Debug, Clone)]
pub(crate) struct TokenCache {
    addresses: [[u8; 16]; TOKEN_CACHE_SLOTS],
    tokens: [[u8; COOKIE_LEN]; TOKEN_CACHE_SLOTS],
}

impl TokenCache {
    pub(crate) const NEW: TokenCache = TokenCache {
        addresses: [[0; 16]; TOKEN_CACHE_SLOTS],
        tokens: [[0; COOKIE_LEN]; TOKEN_CACHE_SLOTS],
    };

    fn slot(ip: &[u8; 16]) -> usize {
        // FNV-1a: the table is the initiator's own, filled only with
        // tokens from acceptors it connected to.
        let h = ip.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        (h as usize) % TOKEN_CACHE_SLOTS
    }

    fn store(&mut self, ip: &IpAddress, token: [u8; COOKIE_LEN]) {
        let a = ip16(ip);
        let i = Self::slot(&a);
        self.addresses[i] = a;
        self.tokens[i] = token;
    }

    fn get(&self, ip: &IpAddress) -> Option<[u8; COOKIE_LEN]> {
        let a = ip16(ip);
        let i = Self::slot(&a);
        (self.addresses[i] == a && self.tokens[i] != [0; COOKIE_LEN]).then_some(self.tokens[i])
    }
}

impl<B: Backing, const P: usize> Endpoint<B, P> {
    /// Acceptor: connection `i` left Accepting for Established, so its
    /// initiator receives at its address: it gets a token for it.
    pub(super) fn issue_token(&mut self, i: u32, now: Instant) {
        let config = &self.config;
        if config.token_lifetime.is_zero() || !config.accept_incoming {
            return;
        }
        self.token_keys
            .rotate(now, config.token_lifetime, &mut self.res.rng);
        let s = &mut self.slots[i as usize];
        let token = self.token_keys.issue_token(now, &s.conn.peer.ip);
        s.conn.queue_new_token(token, &mut self.res.credentials);
        self.drops.tokens_issued += 1;
    }

    /// The shards of one node (`Endpoint::new_shard`) take each other's
    /// address tokens (spec 4.2.5): a later CONNECT of the same initiator
    /// is steered by its new Source Connection ID, so often to another
    /// shard than the one that issued its token. Give every shard the same
    /// `master` secret (at least 128 bits from a secure generator, spec
    /// 5.1.2): the tokens' offset and every period's secret derive from
    /// it. Without it, each endpoint draws its own.
    pub fn share_token_secret(&mut self, master: [u8; 16]) {
        self.token_keys = super::admission::CookieKeys::derived(master);
    }

    /// Initiator: a NEW_TOKEN from the acceptor at `ip`.
    pub(super) fn remember_token(&mut self, ip: &IpAddress, token: [u8; COOKIE_LEN]) {
        self.token_cache.store(ip, token);
    }

    /// Initiator: the token to present to the acceptor at `ip`, if one.
    pub(super) fn token_for(&self, ip: &IpAddress) -> Option<[u8; COOKIE_LEN]> {
        self.token_cache.get(ip)
    }
}
