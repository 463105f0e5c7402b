//! The stateless cookies of the RETRY exchange (spec 4.2.2): how a CONNECT
//! proves its source address before anything is kept for it.
//!
//! # Cookies
//!
//! A cookie is 32 bytes: the issue time (4 bytes, big-endian, in ticks of
//! 2^30 ns of the acceptor's clock plus a secret offset drawn at start, so
//! it tells its holder nothing about the acceptor's uptime), a format byte (1), 11 zero bytes and
//! a 16-byte tag, SipHash-2-4-128 keyed with a 16-byte secret over
//!
//! ```text
//! cookie[0..16] | source IP (16 bytes, IPv4 mapped to ::ffff:a.b.c.d)
//!               | UDP source port (2) | CONNECT extension bytes 0..32
//! ```
//!
//! The extension bytes are the CONNECT's Source Connection ID, Source
//! Token, MTU, Max Paths, Window, Reply Port, Timer Profile, Suite, Initial
//! PSN and Key ID exactly as on the wire, so a cookie is good for one
//! address, one port and one offer only. The secret is drawn from the
//! endpoint's generator and replaced every cookie lifetime (aligned on
//! multiples of it); a cookie issued in the previous period still
//! verifies with the previous secret, nothing older does. The tag is
//! compared in constant time.

use core::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher24};
use smoltcp::wire::IpAddress;

use crate::rng::Rng;
use crate::time::Instant;
use crate::wire::{ConnectRepr, COOKIE_LEN};

use crate::wire::ip16;

/// Ticks of the cookie clock: 2^30 ns (about 1.07 s).
const TICK_SHIFT: u32 = 30;
/// The cookie's format byte.
const COOKIE_FORMAT: u8 = 1;
/// The address token's format byte (spec 4.2.5): what tells an acceptor
/// which of its own constructions a CONNECT's Cookie field holds.
pub(crate) const TOKEN_FORMAT: u8 = 2;
/// Where the format byte is, in cookies and tokens alike.
pub(crate) const FORMAT_AT: usize = 4;

/// What a received cookie turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CookieCheck {
    Valid,
    /// Well formed, but older than the lifetime (or from the future).
    Expired,
    /// Not one this endpoint issued for this address, port and offer.
    Invalid,
}

/// The secrets of the cookie MAC: this period's and the previous one's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CookieKeys {
    /// Added to the clock's tick count (wrapping): drawn at start, never sent.
    epoch: u32,
    period: u32,
    current: [u8; 16],
    previous: Option<[u8; 16]>,
    /// Address tokens of a sharded endpoint (spec 4.2.5): the offset and
    /// every period's secret derive from this node-wide secret, so that
    /// every shard checks the tokens every other shard issued.
    #[cfg(feature = "tokens")]
    master: Option<[u8; 16]>,
}

/// The secret of `period` under `master` (label 1), or, label 0, the
/// offset: SipHash-2-4-128 keyed with `master` over the label and the
/// period, big-endian.
#[cfg(feature = "tokens")]
fn derive(master: &[u8; 16], label: u8, period: u32) -> [u8; 16] {
    let mut msg = [0u8; 5];
    msg[0] = label;
    msg[1..].copy_from_slice(&period.to_be_bytes());
    let mut h = SipHasher24::new_with_key(master);
    h.write(&msg);
    u128::from(h.finish128()).to_le_bytes()
}

/// The tag of a cookie whose first 16 bytes are `head`.
pub(crate) fn cookie_tag(
    key: &[u8; 16],
    head: &[u8],
    ip: &IpAddress,
    port: u16,
    c: &ConnectRepr,
) -> [u8; 16] {
    let mut msg = [0u8; 16 + 16 + 2 + 32];
    msg[..16].copy_from_slice(&head[..16]);
    msg[16..32].copy_from_slice(&ip16(ip));
    msg[32..34].copy_from_slice(&port.to_be_bytes());
    msg[34..].copy_from_slice(&c.offer_bytes());
    let mut h = SipHasher24::new_with_key(key);
    h.write(&msg);
    u128::from(h.finish128()).to_le_bytes()
}

/// The tag of an address token whose first 16 bytes are `head`: bound
/// to the source IP address only (spec 4.2.5), since the initiator's
/// later connections come from other ports with other offers.
#[cfg(feature = "tokens")]
fn token_tag(key: &[u8; 16], head: &[u8], ip: &IpAddress) -> [u8; 16] {
    let mut msg = [0u8; 32];
    msg[..16].copy_from_slice(&head[..16]);
    msg[16..].copy_from_slice(&ip16(ip));
    let mut h = SipHasher24::new_with_key(key);
    h.write(&msg);
    u128::from(h.finish128()).to_le_bytes()
}

/// A lifetime in ticks (at least one).
fn lifetime_ticks(lifetime: core::time::Duration) -> u32 {
    ((lifetime.as_nanos() >> TICK_SHIFT) as u32).max(1)
}

impl CookieKeys {
    pub(crate) fn new(rng: &mut Rng) -> CookieKeys {
        let mut current = [0u8; 16];
        rng.fill(&mut current);
        CookieKeys {
            epoch: rng.next_u32(),
            period: 0,
            current,
            previous: None,
            #[cfg(feature = "tokens")]
            master: None,
        }
    }

    /// Keys whose offset and secrets derive from `master`: every endpoint
    /// given the same one (the shards of one node) issues and takes the
    /// same values.
    #[cfg(feature = "tokens")]
    pub(crate) fn derived(master: [u8; 16]) -> CookieKeys {
        let e = derive(&master, 0, 0);
        CookieKeys {
            epoch: u32::from_be_bytes([e[0], e[1], e[2], e[3]]),
            period: 0,
            current: derive(&master, 1, 0),
            previous: Some(derive(&master, 1, u32::MAX)),
            master: Some(master),
        }
    }

    /// The cookie clock: ticks since start plus the secret epoch.
    fn tick(&self, now: Instant) -> u32 {
        ((now.as_nanos() >> TICK_SHIFT) as u32).wrapping_add(self.epoch)
    }

    /// Replaces the secret when a new period has begun.
    pub(crate) fn rotate(&mut self, now: Instant, lifetime: core::time::Duration, rng: &mut Rng) {
        let period = self.tick(now) / lifetime_ticks(lifetime);
        if period == self.period {
            return;
        }
        #[cfg(feature = "tokens")]
        if let Some(m) = &self.master {
            self.current = derive(m, 1, period);
            self.previous = Some(derive(m, 1, period.wrapping_sub(1)));
            self.period = period;
            return;
        }
        self.previous = (period == self.period.wrapping_add(1)).then_some(self.current);
        rng.fill(&mut self.current);
        self.period = period;
    }

    /// A cookie for a CONNECT `c` from `ip`, UDP source port `port`.
    pub(crate) fn issue(
        &self,
        now: Instant,
        ip: &IpAddress,
        port: u16,
        c: &ConnectRepr,
    ) -> [u8; COOKIE_LEN] {
        let mut cookie = [0u8; COOKIE_LEN];
        cookie[..4].copy_from_slice(&self.tick(now).to_be_bytes());
        cookie[4] = COOKIE_FORMAT;
        let tag = cookie_tag(&self.current, &cookie, ip, port, c);
        cookie[16..].copy_from_slice(&tag);
        cookie
    }

    /// An address token for `ip` (spec 4.2.5): the cookie's layout with
    /// format 2, its tag over the first 16 bytes and the address alone.
    /// These keys must not be the cookies': a token is good for longer.
    #[cfg(feature = "tokens")]
    pub(crate) fn issue_token(&self, now: Instant, ip: &IpAddress) -> [u8; COOKIE_LEN] {
        let mut token = [0u8; COOKIE_LEN];
        token[..4].copy_from_slice(&self.tick(now).to_be_bytes());
        token[FORMAT_AT] = TOKEN_FORMAT;
        let tag = token_tag(&self.current, &token, ip);
        token[16..].copy_from_slice(&tag);
        token
    }

    /// Checks the address token a CONNECT from `ip` carries.
    #[cfg(feature = "tokens")]
    pub(crate) fn check_token(
        &self,
        now: Instant,
        lifetime: core::time::Duration,
        ip: &IpAddress,
        token: &[u8; COOKIE_LEN],
    ) -> CookieCheck {
        self.check_with(now, lifetime, token, TOKEN_FORMAT, |key| {
            token_tag(key, token, ip)
        })
    }

    /// Checks the cookie a CONNECT carries.
    pub(crate) fn check(
        &self,
        now: Instant,
        lifetime: core::time::Duration,
        ip: &IpAddress,
        port: u16,
        c: &ConnectRepr,
    ) -> CookieCheck {
        self.check_with(now, lifetime, &c.cookie, COOKIE_FORMAT, |key| {
            cookie_tag(key, &c.cookie, ip, port, c)
        })
    }

    /// The checks of 4.2.2 for a value of `format` whose tag under a key
    /// is `tag(key)`: its age, its format and zero bytes, the key of its
    /// period, and the tag compared in constant time.
    fn check_with(
        &self,
        now: Instant,
        lifetime: core::time::Duration,
        value: &[u8; COOKIE_LEN],
        format: u8,
        tag: impl Fn(&[u8; 16]) -> [u8; 16],
    ) -> CookieCheck {
        let issued = u32::from_be_bytes([value[0], value[1], value[2], value[3]]);
        let lifetime = lifetime_ticks(lifetime);
        // A value from the future wraps to a huge age.
        if self.tick(now).wrapping_sub(issued) > lifetime {
            return CookieCheck::Expired;
        }
        if value[FORMAT_AT] != format || value[5..16].iter().any(|&b| b != 0) {
            return CookieCheck::Invalid;
        }
        let period = issued / lifetime;
        let key = if period == self.period {
            Some(&self.current)
        } else if period.wrapping_add(1) == self.period {
            self.previous.as_ref()
        } else {
            None
        };
        let Some(key) = key else {
            return CookieCheck::Invalid;
        };
        let diff = tag(key)
            .iter()
            .zip(&value[16..])
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 {
            CookieCheck::Valid
        } else {
            CookieCheck::Invalid
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CipherSuite, TimerProfile};
    use core::time::Duration;
    use smoltcp::wire::{Ipv4Address, Ipv6Address};

    #[test]
    fn siphash_2_4_128_matches_the_reference_vector() {
        // vectors_sip128[0] of the SipHash reference implementation: key
        // 00 01 .. 0f, empty message.
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let h = SipHasher24::new_with_key(&key);
        assert_eq!(
            u128::from(h.finish128()).to_le_bytes(),
            [
                0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55,
                0x02, 0x93
            ]
        );
    }

    fn offer() -> ConnectRepr {
        ConnectRepr {
            src_conn: 0x0102_0304,
            src_token: 0x1122_3344_5566_7788,
            mtu: 1024,
            max_paths: 4,
            window: 256,
            initial_psn: 77,
            reply_port: 4795,
            timer_profile: TimerProfile::Emulation,
            suite: CipherSuite::None,
            key_id: 0,
            cookie: [0; COOKIE_LEN],
        }
    }

    #[test]
    fn the_cookie_construction_matches_an_independent_computation() {
        // Spec 4.2.2's example, computed with a separate SipHash-2-4-128
        // implementation (Python, from the reference C code): key 00..0f,
        // issued at tick 5, from 10.0.0.1 port 50000, the offer below.
        let keys = CookieKeys {
            epoch: 0,
            period: 0,
            current: core::array::from_fn(|i| i as u8),
            previous: None,
            master: None,
        };
        let ip = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1));
        let cookie = keys.issue(Instant::from_nanos(5 << 30), &ip, 50_000, &offer());
        let want = [
            0x00, 0x00, 0x00, 0x05, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x2f, 0x0b, 0x17, 0x07, 0x79, 0xb1, 0x67, 0x5c, 0x15, 0x7b, 0x62, 0xf5,
            0xd0, 0x17, 0xc0, 0x67,
        ];
        assert_eq!(cookie, want);
    }

    #[test]
    fn the_token_construction_matches_an_independent_computation() {
        // Spec 4.2.5's example, computed with the same separate
        // SipHash-2-4-128 implementation as the cookie's (Python, from the
        // reference C code; it reproduces 4.2.2's example): token secret
        // 00..0f, offset 0, issued at tick 5, for 10.0.0.1 (any port, any
        // offer), and for 2001:db8::1.
        let keys = CookieKeys {
            epoch: 0,
            period: 0,
            current: core::array::from_fn(|i| i as u8),
            previous: None,
            master: None,
        };
        let now = Instant::from_nanos(5 << 30);
        let ip = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1));
        let token = keys.issue_token(now, &ip);
        let want = [
            0x00, 0x00, 0x00, 0x05, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0xd3, 0xb6, 0xd0, 0x71, 0x3d, 0x04, 0x24, 0x28, 0x81, 0x8e, 0x29, 0x62,
            0xcb, 0x98, 0x63, 0xd5,
        ];
        assert_eq!(token, want);
        let v6 = IpAddress::Ipv6(Ipv6Address::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
        let token6 = keys.issue_token(now, &v6);
        assert_eq!(
            token6[16..],
            [
                0x0f, 0x71, 0x74, 0xaf, 0xa7, 0x7e, 0xe8, 0xc5, 0x32, 0xc7, 0xbf, 0x57, 0x84, 0x87,
                0xfd, 0x2f,
            ]
        );
        let life = Duration::from_secs(3600);
        assert_eq!(keys.check_token(now, life, &ip, &token), CookieCheck::Valid);
        assert_eq!(
            keys.check_token(now, life, &v6, &token),
            CookieCheck::Invalid
        );
    }

    #[test]
    fn shards_with_one_master_take_each_others_tokens() {
        let life = Duration::from_secs(3600);
        let ip = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1));
        let (mut r1, mut r2) = (
            Rng::new(crate::rng::seed_from_u64(1)),
            Rng::new(crate::rng::seed_from_u64(2)),
        );
        let (mut a, mut b) = (CookieKeys::derived([7; 16]), CookieKeys::derived([7; 16]));
        // Another node's master: its tokens are not these.
        let mut c = CookieKeys::derived([8; 16]);
        for hours in [0u64, 1, 5] {
            let now = Instant::from_nanos((hours * 3600 + 10) << 30);
            a.rotate(now, life, &mut r1);
            let token = a.issue_token(now, &ip);
            let later = now + Duration::from_secs(1800);
            b.rotate(later, life, &mut r2);
            c.rotate(later, life, &mut r2);
            assert_eq!(b.check_token(later, life, &ip, &token), CookieCheck::Valid);
            assert_ne!(c.check_token(later, life, &ip, &token), CookieCheck::Valid);
        }
    }

    #[test]
    fn a_cookie_is_good_for_its_address_port_and_offer_only_and_expires() {
        let mut rng = Rng::new(crate::rng::seed_from_u64(3));
        let life = Duration::from_secs(30);
        let mut keys = CookieKeys::new(&mut rng);
        let ip = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1));
        let now = Instant::from_nanos(5 << 30);
        keys.rotate(now, life, &mut rng);
        let mut c = offer();
        c.cookie = keys.issue(now, &ip, 50_000, &c);
        assert_ne!(c.cookie, [0; COOKIE_LEN], "never all zero");
        assert_eq!(keys.check(now, life, &ip, 50_000, &c), CookieCheck::Valid);
        let other_ip = IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 2));
        assert_eq!(
            keys.check(now, life, &other_ip, 50_000, &c),
            CookieCheck::Invalid
        );
        let v6 = IpAddress::Ipv6(Ipv6Address::LOCALHOST);
        assert_eq!(keys.check(now, life, &v6, 50_000, &c), CookieCheck::Invalid);
        assert_eq!(
            keys.check(now, life, &ip, 50_001, &c),
            CookieCheck::Invalid,
            "another source port"
        );
        for edit in [
            |c: &mut ConnectRepr| c.reply_port += 1,
            |c: &mut ConnectRepr| c.src_token ^= 1,
            |c: &mut ConnectRepr| c.window = 16,
            |c: &mut ConnectRepr| c.initial_psn += 1,
            |c: &mut ConnectRepr| c.timer_profile = TimerProfile::DataCenter,
            |c: &mut ConnectRepr| c.cookie[20] ^= 0x80,
            |c: &mut ConnectRepr| c.cookie[7] = 1,
        ] {
            let mut d = c;
            edit(&mut d);
            assert_eq!(keys.check(now, life, &ip, 50_000, &d), CookieCheck::Invalid);
        }
        // Rotation keeps the previous period's key ...
        let later = now + Duration::from_secs(25);
        keys.rotate(later, life, &mut rng);
        assert_eq!(keys.check(later, life, &ip, 50_000, &c), CookieCheck::Valid);
        // ... but the lifetime ends it, and the key after two periods.
        let late = now + Duration::from_secs(40);
        keys.rotate(late, life, &mut rng);
        assert_eq!(
            keys.check(late, life, &ip, 50_000, &c),
            CookieCheck::Expired
        );
        let mut old = c;
        old.cookie[..4].copy_from_slice(&(keys.tick(late) - 2).to_be_bytes());
        assert_eq!(
            keys.check(late, life, &ip, 50_000, &old),
            CookieCheck::Invalid,
            "a fresh time on an old tag"
        );
        let mut future = c;
        future.cookie[..4].copy_from_slice(&(keys.tick(late) + 1).to_be_bytes());
        assert_eq!(
            keys.check(late, life, &ip, 50_000, &future),
            CookieCheck::Expired
        );
    }
}
