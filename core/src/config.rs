//! Endpoint configuration and the compile-time capacities.

use core::time::Duration;

use crate::wire::DEFAULT_UDP_PORT;

/// PSNs a sender may have outstanding beyond the cumulative ACK at most
/// (spec 4.4): what the window field of CONNECT and ACCEPT can carry.
pub const MAX_WINDOW: u32 = crate::wire::packet::MAX_WINDOW_WIRE;

/// The window `Config::default()` offers: enough for a data-centre round
/// trip (100 Gbit/s x 10 us is 31 packets of 4 KiB) many times over,
/// and exactly one SACK bitvector, so that a SACK block always starts at
/// the cumulative PSN. Long paths are configured with more (up to
/// [`MAX_WINDOW`]).
pub const DEFAULT_WINDOW: u32 = 256;

/// The window `Config::for_emulation()` offers: a 10 ms round trip at
/// 1 Gbit/s in 1 KiB packets three times over.
pub const EMULATION_WINDOW: u32 = 4096;

/// Whether this build grants and applies Rate Grants (spec 4.10.6;
/// feature `grant`, off in firmware for its code budget).
pub const GRANTS: bool = cfg!(feature = "grant");

/// Whether senders keep their paths' costs in a tournament tree and their
/// loss-detection inputs current as telemetry changes, instead of scanning
/// every path per packet (feature `path-index`, off in firmware for its
/// code budget: 1.6 KB). The paths chosen and the losses found are the
/// same either way.
pub const PATH_INDEX: bool = cfg!(feature = "path-index");

/// Which protection domain an accepted connection gets (spec 5.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AcceptDomain {
    /// Every accepted connection shares this domain (one tenant).
    Shared(u32),
    /// Each accepted connection gets a domain of its own, never used by
    /// another connection of the endpoint (isolation between peers); the
    /// application reads it with `Endpoint::pd` and registers the
    /// connection's regions in it.
    PerConnection,
}

/// First domain handed out by [`AcceptDomain::PerConnection`]: the upper
/// half of the space, so they never meet domains an application picks
/// for its own connections below it.
pub const PER_CONNECTION_DOMAINS: u32 = 0x8000_0000;

/// When an acceptor asks an initiator to prove its address before it
/// keeps any state for a CONNECT (spec 4.2, 5.1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AddressValidation {
    /// Every CONNECT without a valid cookie is answered with a RETRY and
    /// creates nothing (the default): a spoofed source never gets an
    /// ACCEPT, never holds a slot and never spends the per-source budget
    /// of the address it forges.
    Always,
    /// Only while at least `half_open` connections of the endpoint are
    /// half open (Accepting): below that, a first CONNECT is accepted
    /// directly, saving one round trip, at the price of the protections
    /// above while the endpoint is not loaded.
    WhenLoaded { half_open: u32 },
}

/// Limits per source IP address on the CONNECTs that would create a
/// connection (spec 5.1.4). Sources are counted in a fixed table of
/// buckets keyed by a secret hash of the address ([`crate::Layout`]'s
/// `sources`); addresses that collide share a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SourceLimits {
    /// Connections one source may open per second, sustained; it may open
    /// as many at once (a token bucket of this size, refilled at this
    /// rate). 0: no limit.
    pub connects_per_second: u32,
    /// Half-open (Accepting) connections one source may hold at once.
    /// 0: no limit.
    pub half_open: u32,
}

impl SourceLimits {
    /// No per-source limit.
    pub const NONE: SourceLimits = SourceLimits {
        connects_per_second: 0,
        half_open: 0,
    };
}

/// What one prefix may hold of the connection table, in 256ths of it
/// (0: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PrefixShare {
    /// Half-open (Accepting) connections.
    pub half_open: u16,
    /// Connections of any state.
    pub all: u16,
}

/// Fair admission (spec 4.2.3): sources are counted by prefix at two
/// lengths, each prefix holds at most its configured share of the table,
/// and when the table is full a prefix holding less gets a slot that the
/// prefix holding the most gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AdmissionPolicy {
    /// Narrow and wide prefix lengths of IPv4 sources.
    pub v4_prefixes: (u8, u8),
    /// Narrow and wide prefix lengths of IPv6 sources.
    pub v6_prefixes: (u8, u8),
    /// The most one narrow prefix may hold.
    pub narrow: PrefixShare,
    /// The most one wide prefix may hold.
    pub wide: PrefixShare,
    /// A connection with no data sent or received for this long (or none
    /// ever) is idle: it may be reclaimed for another prefix.
    pub idle_after: Duration,
}

impl Default for AdmissionPolicy {
    fn default() -> AdmissionPolicy {
        AdmissionPolicy {
            v4_prefixes: (32, 24),
            v6_prefixes: (64, 48),
            // One host may rightly hold most of a table (a client with many
            // processes), and a cluster's hosts often share one /24 (63 of
            // them starting an incast at once): a prefix is limited by what
            // it gives up when others wait, not by a share, unless one is
            // configured.
            narrow: PrefixShare {
                half_open: 0,
                all: 0,
            },
            wide: PrefixShare {
                half_open: 0,
                all: 0,
            },
            idle_after: Duration::from_secs(1),
        }
    }
}

/// Timer values a timer profile stands for (spec 4.11): what a peer may
/// assume of an endpoint that announces the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileTimers {
    /// Silence after which the endpoint closes a connection.
    pub idle_timeout: Duration,
    /// How long it keeps retransmitting without progress, and keeps
    /// repeating CONNECT, before it gives up.
    pub ride_through: Duration,
    /// Silence towards the peer after which it sends a KEEPALIVE.
    pub keepalive_interval: Duration,
}

/// The timers of a profile (spec 4.11 table).
pub const fn profile_timers(p: crate::wire::TimerProfile) -> ProfileTimers {
    match p {
        crate::wire::TimerProfile::DataCenter => ProfileTimers {
            idle_timeout: Duration::from_secs(1),
            ride_through: Duration::from_secs(1),
            keepalive_interval: Duration::from_millis(100),
        },
        crate::wire::TimerProfile::Emulation => ProfileTimers {
            idle_timeout: Duration::from_secs(10),
            ride_through: Duration::from_secs(10),
            keepalive_interval: Duration::from_millis(500),
        },
    }
}

/// Which congestion controller a connection runs (spec 4.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CcAlgorithm {
    /// ECN-driven AIMD with DCTCP's marked-fraction estimate, capped by the
    /// receiver's fair-share hint.
    EcnAimd,
    /// Line rate, only the receiver hint and the window limit sending
    /// (for experiments that isolate loss recovery).
    Fixed,
}

/// Endpoint configuration. `Default` gives values for a 100 Gbit/s data
/// centre fabric with round trips of about 10 microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// UDP port this endpoint receives on.
    pub udp_port: u16,
    /// Which timer defaults these are, announced in CONNECT and ACCEPT
    /// (spec 4.11).
    pub timer_profile: crate::wire::TimerProfile,
    /// Whether CONNECTs are accepted.
    pub accept_incoming: bool,
    /// When a CONNECT must carry a cookie (spec 4.2, 5.1.4).
    pub address_validation: AddressValidation,
    /// How long a cookie this endpoint issued is accepted; its cookie key
    /// is replaced every lifetime (the previous key still verifies), so
    /// nothing older verifies at all (spec 4.2).
    pub cookie_lifetime: Duration,
    /// Per-source limits on verified CONNECTs (spec 5.1.4).
    pub source_limits: SourceLimits,
    /// Per-prefix shares of the connection table, and reclaiming (spec
    /// 4.2.3).
    pub admission: AdmissionPolicy,
    /// Protection domain of accepted connections.
    pub accept_domain: AcceptDomain,
    /// Largest payload per packet offered in the handshake.
    pub mtu: u16,
    /// Logical paths per connection offered (at most the endpoint's `P`).
    pub paths: u16,
    /// Window offered, in PSNs (1 to [`MAX_WINDOW`]); the connection uses
    /// the smaller of both ends' offers.
    pub window: u32,
    /// Link rate in Mbit/s: the sender's starting and maximum rate, and what
    /// the receiver divides among its active senders.
    pub link_rate_mbps: u32,
    /// Send a fair-share hint in ACKs.
    pub rate_hints: bool,
    /// A sender counts as active at the receiver if it delivered data within
    /// this interval, or within four fair-share packet intervals of the
    /// senders counted when that is longer (spec 4.10.4).
    pub active_sender_window: Duration,
    /// Congestion controller.
    pub cc: CcAlgorithm,
    /// Additive increase per round trip, Mbit/s.
    pub cc_additive_increase_mbps: u32,
    /// Lowest rate the controller goes to, Mbit/s.
    pub cc_min_rate_mbps: u32,
    /// DCTCP gain g for the marked-fraction average, as 1/2^shift.
    pub cc_alpha_shift: u8,
    /// Bytes of new data a connection may have in flight before anything
    /// was acknowledged (the start-up window); every delivered packet then
    /// adds its size, so it doubles per round trip up to `window`. It
    /// bounds the first round trip of many senders starting together
    /// (incast), before the receiver's rate hint reaches them (spec
    /// 4.10.5). 0 turns it off.
    pub initial_window_bytes: u32,
    /// The round trip `initial_window_bytes` is sized for. On a path whose
    /// minimum round trip is k times longer, every acknowledged byte adds k
    /// bytes to the start-up window instead of one, so a long path reaches
    /// its (k times larger) bandwidth-delay product in as many round trips
    /// as a data-centre path (spec 4.10.6). A sender the ACCEPT granted a
    /// share starts with a window of the share over this round trip
    /// instead of `initial_window_bytes`.
    pub initial_window_rtt: Duration,
    /// ACK after this many unacknowledged reliable packets.
    pub ack_every: u8,
    /// ... or after this delay, whichever comes first.
    pub ack_delay: Duration,
    /// Initial retransmission timeout (before any RTT sample).
    pub rto_initial: Duration,
    /// Lower and upper bounds of the retransmission timeout.
    pub rto_min: Duration,
    /// See `rto_min`.
    pub rto_max: Duration,
    /// How long a connection keeps retransmitting without progress (no
    /// new data acknowledged) before it fails with RetryExceeded: the
    /// longest outage it rides through (spec 4.6.4). The connection uses
    /// the larger of this and the peer's profile's (spec 4.11).
    pub ride_through: Duration,
    /// Wait after a RECEIVER_NOT_READY NAK before retrying.
    pub rnr_delay: Duration,
    /// RNR retries per message before it fails.
    pub rnr_retry_limit: u8,
    /// Handshake retransmission interval (doubles per retry).
    pub handshake_timeout: Duration,
    /// The longest the interval doubles to.
    pub handshake_timeout_max: Duration,
    /// Send every CONNECT twice, back to back (spec 4.2 step 2): on a lossy
    /// fabric a lost CONNECT costs a whole handshake interval, a second
    /// copy costs 96 bytes.
    pub connect_twice: bool,
    /// How long an initiator repeats CONNECT before it gives up (counted
    /// from the connect, and again from a RETRY).
    pub connect_timeout: Duration,
    /// Transmissions of CLOSE, and of the initiator's confirmation, before
    /// giving up on an answer.
    pub handshake_retries: u8,
    /// Send a KEEPALIVE after this much silence towards the peer.
    pub keepalive_interval: Duration,
    /// Close the connection after this much silence from the peer (the
    /// connection uses the larger of this and the peer's profile's).
    pub idle_timeout: Duration,
    /// User work requests one connection may have queued (its share of the
    /// endpoint's work-entry pool).
    pub send_queue_limit: u16,
    /// Receives one connection may have posted.
    pub recv_queue_limit: u16,
    /// A peer's READ_REQUESTs one connection answers at once; more are
    /// refused with RECEIVER_NOT_READY and retried by the peer.
    pub read_jobs_limit: u16,
    /// READ-response jobs across the endpoint, so peers' requests cannot
    /// take every work entry from the local application.
    pub read_jobs_endpoint_limit: u32,
    /// How long an idle sender keeps its pooled state (telemetry, rate)
    /// before giving it back.
    pub sender_linger: Duration,
    /// Re-draw a path's entropy when it is persistently worse than its peers.
    pub path_reroll: bool,
    /// Packets sent per path between two path evaluations.
    pub path_epoch_packets: u16,
    /// Range from which path entropy (UDP source ports) is drawn.
    pub entropy_base: u16,
    /// See `entropy_base`: number of values.
    pub entropy_span: u16,
    /// Packet protection policy and the Key ID offered (spec 5.3); the
    /// pre-shared keys are installed with `Endpoint::add_psk`.
    pub protection: crate::crypto::ProtectionConfig,
    #[cfg(feature = "aead")]
    /// 0-RTT with a job key (spec 4.2.4): a protected initiator's CONNECT
    /// carries a proof made with its pre-shared key and its first flight
    /// of data leaves with it; an acceptor takes such a CONNECT without
    /// the cookie round trip. Both need `local_ip` and a wall clock
    /// (`Endpoint::set_wall_clock`).
    pub early_data: bool,
    #[cfg(feature = "aead")]
    /// How far an early proof's time may be from this endpoint's wall
    /// clock, either way; the acceptor remembers each proof it took for
    /// as long (spec 4.2.4).
    pub early_window: Duration,
    #[cfg(feature = "aead")]
    /// This endpoint's own IP address, as its peers address it: early
    /// proofs bind both ends' addresses. `None`: no 0-RTT either way.
    pub local_ip: Option<smoltcp::wire::IpAddress>,
    #[cfg(feature = "tokens")]
    /// How long an address token this endpoint hands out (NEW_TOKEN, spec
    /// 4.2.5) lets its holder skip the RETRY; its secret is replaced
    /// every lifetime. Zero: no tokens handed out.
    pub token_lifetime: Duration,
    #[cfg(feature = "aead")]
    /// The UDP port peers send their CONNECTs to, where it is not
    /// `udp_port`: a shard of a sharded endpoint receives them forwarded
    /// from the endpoint's public port. Early proofs bind the port the
    /// CONNECT was sent to (spec 4.2.4). `None`: `udp_port`.
    pub connect_port: Option<u16>,
}

const DC: ProfileTimers = profile_timers(crate::wire::TimerProfile::DataCenter);
const EMULATION: ProfileTimers = profile_timers(crate::wire::TimerProfile::Emulation);

impl Default for Config {
    fn default() -> Config {
        Config {
            udp_port: DEFAULT_UDP_PORT,
            timer_profile: crate::wire::TimerProfile::DataCenter,
            accept_incoming: true,
            address_validation: AddressValidation::Always,
            cookie_lifetime: Duration::from_secs(30),
            source_limits: SourceLimits {
                connects_per_second: 4096,
                half_open: 1024,
            },
            admission: AdmissionPolicy::default(),
            accept_domain: AcceptDomain::Shared(0),
            mtu: 4096,
            paths: 16,
            window: DEFAULT_WINDOW,
            link_rate_mbps: 100_000,
            rate_hints: true,
            active_sender_window: Duration::from_micros(20),
            cc: CcAlgorithm::EcnAimd,
            cc_additive_increase_mbps: 2_000,
            cc_min_rate_mbps: 100,
            cc_alpha_shift: 4,
            // Four 4 KiB packets: 63 senders' first round trip (1008 KiB)
            // fits one 1 MiB switch output buffer.
            initial_window_bytes: 16 * 1024,
            // About a data-centre round trip at 100 Gbit/s (the simulator's
            // leaf-spine: 8 to 12 us), so data-centre paths grow as before.
            initial_window_rtt: Duration::from_micros(20),
            ack_every: 4,
            ack_delay: Duration::from_micros(2),
            rto_initial: Duration::from_micros(500),
            rto_min: Duration::from_micros(100),
            rto_max: Duration::from_millis(50),
            ride_through: DC.ride_through,
            rnr_delay: Duration::from_micros(50),
            rnr_retry_limit: 7,
            // A few data-centre round trips (an unloaded one is under 10
            // us): a lost CONNECT or ACCEPT (10 % loss loses one in five
            // handshakes) costs one interval, doubled per loss. With 200
            // us those intervals were the 64-host all-to-all's tail at 10
            // % loss (p99 2.8 ms against p50 0.33 ms).
            handshake_timeout: Duration::from_micros(25),
            handshake_timeout_max: Duration::from_millis(10),
            connect_twice: true,
            connect_timeout: DC.ride_through,
            handshake_retries: 8,
            keepalive_interval: DC.keepalive_interval,
            idle_timeout: DC.idle_timeout,
            send_queue_limit: 64,
            recv_queue_limit: 64,
            read_jobs_limit: 16,
            read_jobs_endpoint_limit: 1024,
            sender_linger: Duration::from_millis(1),
            path_reroll: true,
            path_epoch_packets: 64,
            entropy_base: 49152,
            entropy_span: 16384,
            protection: crate::crypto::ProtectionConfig {
                policy: crate::crypto::Policy::Off,
                key_id: 0,
            },
            #[cfg(feature = "aead")]
            early_data: true,
            // Hosts of one job keep their clocks within milliseconds
            // (NTP; PTP within microseconds).
            #[cfg(feature = "aead")]
            early_window: Duration::from_secs(1),
            #[cfg(feature = "aead")]
            local_ip: None,
            // Reconnections within a job (after a failure, a new
            // communicator) skip the cookie round trip for an hour.
            #[cfg(feature = "tokens")]
            token_lifetime: Duration::from_secs(3600),
            #[cfg(feature = "aead")]
            connect_port: None,
        }
    }
}

impl Config {
    /// Settings for slow, emulated links (QEMU, host loopback): round trips
    /// of milliseconds, so every timer is scaled up.
    pub fn for_emulation() -> Config {
        Config {
            timer_profile: crate::wire::TimerProfile::Emulation,
            // Standard 1500-byte Ethernet frames: 1024 B of payload fits
            // with the 94 bytes of MetaRoCE/UDP/IP headers and CRC.
            mtu: 1024,
            link_rate_mbps: 1_000,
            active_sender_window: Duration::from_millis(20),
            ack_delay: Duration::from_micros(200),
            rto_initial: Duration::from_millis(20),
            rto_min: Duration::from_millis(5),
            rto_max: Duration::from_millis(500),
            rnr_delay: Duration::from_millis(2),
            handshake_timeout: Duration::from_millis(50),
            // A burst of losses at connect time costs a CONNECT every
            // 200 ms at worst, not ever-longer silences.
            handshake_timeout_max: Duration::from_millis(200),
            connect_twice: true,
            connect_timeout: EMULATION.ride_through,
            ride_through: EMULATION.ride_through,
            keepalive_interval: EMULATION.keepalive_interval,
            idle_timeout: EMULATION.idle_timeout,
            sender_linger: Duration::from_millis(200),
            cc_additive_increase_mbps: 20,
            cc_min_rate_mbps: 10,
            // A few milliseconds at 1 Gbit/s of 1 KiB packets is already
            // more than 256 in flight (10 ms: 1,220): emulated links and
            // the internet paths a host endpoint crosses need the long
            // window (spec 4.4).
            window: EMULATION_WINDOW,
            // Emulated round trips are milliseconds: one more like them
            // grows as a data-centre one does, a long-haul one faster.
            initial_window_rtt: Duration::from_millis(2),
            ..Config::default()
        }
    }
}
