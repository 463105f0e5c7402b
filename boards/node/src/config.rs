//! The node's configuration: one line of `key=value` words that the harness
//! passes as the QEMU fw_cfg file `opt/metaroce/config`
//! (`-fw_cfg name=opt/metaroce/config,string=...`), so one image serves
//! every node. Keys:
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `node` | this node's number | 0 |
//! | `ip`, `mac` | this node's addresses | required |
//! | `peer` | `IP/MAC` of another node; repeat; order = peer index | none |
//! | `target` | peer index this node sends to (makes it a sender) | none |
//! | `expect` | number of senders this node receives from | 0 |
//! | `workload` | `mixed`, `write`, `send` or `read` | `mixed` |
//! | `size`, `count`, `depth` | bytes per message, messages, in flight | 65536, 32, 8 |
//! | `seed` | seed of the workload's data patterns only (what a run must repeat); the endpoint's secrets always come from the virtio-rng device | 1 |
//! | `streams` | connections a sender opens to its target (per core), each with its own data | 1 |
//! | `port`, `paths` | UDP port, logical paths per connection | 4795, 8 |
//! | `progress_ms`, `linger_ms` | progress line period, stay-up time after done | 500, 3000 |
//! | `role` | `workload` (the node-to-node run above), `serve` (the serve profile of `metaroce serve`, until stopped), `host` (driven by host processes through the shared-memory host interface in the ivshmem BAR, until stopped) or `bench` (the per-packet CRC counted by the PMU, then exit; needs no `ip`/`mac`) | `workload` |
//! | `gateway` | `IP/MAC` of the harness's host gateway: a static neighbour | none |
//! | `cores` | cores that run an engine (1 to 8; QEMU needs `-smp` at least this); more than 1: one endpoint and workload task per core behind core 0's frame dispatcher (`multicore`), workload role only | 1 |

use core::net::Ipv4Addr;

use heapless::Vec;

/// Most peers a node knows.
pub const MAX_PEERS: usize = 8;
/// Most connections a sender opens to its target (per core).
pub const MAX_STREAMS: usize = 16;

/// What the sender posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum WorkloadKind {
    /// WRITE, WRITE_IMM, SEND, READ in turn.
    Mixed,
    Write,
    Send,
    Read,
}

/// What the node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, defmt::Format)]
pub enum Role {
    /// The node-to-node workload (`target`, `expect`, `workload`, ...).
    Workload,
    /// The serve profile (`metaroce_app`): accept connections, hand out
    /// regions, verify, report; runs until the harness stops it.
    Serve,
    /// Measure the per-packet CRC with the PMU, print it, exit (`bench`).
    Bench,
    /// Driven by host processes through the host interface (ivshmem BAR2);
    /// runs until the harness stops it.
    Host,
}

/// Another node's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
}

/// A parsed configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node: u8,
    pub ip: Ipv4Addr,
    pub mac: [u8; 6],
    pub peers: Vec<Peer, MAX_PEERS>,
    pub target: Option<u8>,
    pub expect: u8,
    pub workload: WorkloadKind,
    pub size: u32,
    pub count: u32,
    pub depth: u32,
    pub seed: u64,
    /// Connections a sender opens to its target (per core).
    pub streams: u8,
    pub port: u16,
    pub paths: u16,
    pub progress_ms: u32,
    pub linger_ms: u32,
    pub role: Role,
    /// A host reached through the harness (a static neighbour, no ARP).
    pub gateway: Option<Peer>,
    /// Cores running an engine.
    pub cores: u8,
    /// Serve role: connections one peer address may hold at once.
    pub peer_connections: u32,
    /// The core this copy of the configuration is for (set per core by
    /// `multicore`, not a key).
    pub core: u8,
}

/// Why the configuration was rejected: the offending key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigError<'a> {
    pub key: &'a str,
}

/// `s` split at its first `sep`: what is before and what is after it.
/// Byte-wise (`sep` is ASCII): `str`'s `char` searchers are a kilobyte of
/// code for a line the harness writes in ASCII.
fn split_once(s: &str, sep: u8) -> Option<(&str, &str)> {
    let at = s.bytes().position(|b| b == sep)?;
    Some((s.get(..at)?, s.get(at + 1..)?))
}

/// Exactly `out.len()` bytes in `radix`, separated by `sep`.
fn bytes_of(mut s: &str, sep: u8, radix: u32, out: &mut [u8]) -> Option<()> {
    let last = out.len().checked_sub(1)?;
    for (i, byte) in out.iter_mut().enumerate() {
        let (part, rest) = if i < last {
            split_once(s, sep)?
        } else {
            (s, "")
        };
        *byte = number(part, radix, u8::MAX.into())? as u8;
        s = rest;
    }
    Some(())
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    bytes_of(s, b':', 16, &mut mac)?;
    Some(mac)
}

/// A dotted-quad IPv4 address (`core`'s parser also takes forms the
/// harness never writes, in a kilobyte of code).
fn parse_ipv4(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    bytes_of(s, b'.', 10, &mut octets)?;
    Some(Ipv4Addr::from(octets))
}

/// `IP/MAC`.
fn parse_peer(value: &str) -> Option<Peer> {
    let (ip, mac) = split_once(value, b'/')?;
    Some(Peer {
        ip: parse_ipv4(ip)?,
        mac: parse_mac(mac)?,
    })
}

/// A number in `radix` (10 or 16) no larger than `max`: one digit loop
/// for every key and field type (`str::parse` is a parser per integer
/// type).
fn number(value: &str, radix: u32, max: u64) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for b in value.bytes() {
        let digit = u64::from(char::from(b).to_digit(radix)?);
        n = n.checked_mul(u64::from(radix))?.checked_add(digit)?;
    }
    (n <= max).then_some(n)
}

/// The values of `role`.
const ROLES: &[(&str, Role)] = &[
    ("workload", Role::Workload),
    ("serve", Role::Serve),
    ("bench", Role::Bench),
    ("host", Role::Host),
];

/// The values of `workload`.
const WORKLOADS: &[(&str, WorkloadKind)] = &[
    ("mixed", WorkloadKind::Mixed),
    ("write", WorkloadKind::Write),
    ("send", WorkloadKind::Send),
    ("read", WorkloadKind::Read),
];

/// The value `names` gives the word `value`.
fn pick<T: Copy>(value: &str, names: &[(&str, T)]) -> Option<T> {
    names
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
}

/// The field a numeric key sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numeric {
    Node,
    Target,
    Expect,
    Size,
    Count,
    Depth,
    Seed,
    Streams,
    Port,
    Paths,
    ProgressMs,
    LingerMs,
    Cores,
    PeerConnections,
}

/// The numeric keys: the field each sets and the largest value it holds.
const NUMERIC_KEYS: [(&str, Numeric, u64); 14] = [
    ("node", Numeric::Node, u8::MAX as u64),
    ("target", Numeric::Target, u8::MAX as u64),
    ("expect", Numeric::Expect, u8::MAX as u64),
    ("size", Numeric::Size, u32::MAX as u64),
    ("count", Numeric::Count, u32::MAX as u64),
    ("depth", Numeric::Depth, u32::MAX as u64),
    ("seed", Numeric::Seed, u64::MAX),
    ("streams", Numeric::Streams, u8::MAX as u64),
    ("port", Numeric::Port, u16::MAX as u64),
    ("paths", Numeric::Paths, u16::MAX as u64),
    ("progress_ms", Numeric::ProgressMs, u32::MAX as u64),
    ("linger_ms", Numeric::LingerMs, u32::MAX as u64),
    ("cores", Numeric::Cores, u8::MAX as u64),
    (
        "peer_connections",
        Numeric::PeerConnections,
        u32::MAX as u64,
    ),
];

impl NodeConfig {
    /// Sets `field` to `n`, which [`number`] kept within the field's
    /// range ([`NUMERIC_KEYS`]).
    fn set_number(&mut self, field: Numeric, n: u64) {
        match field {
            Numeric::Node => self.node = n as u8,
            Numeric::Target => self.target = Some(n as u8),
            Numeric::Expect => self.expect = n as u8,
            Numeric::Size => self.size = n as u32,
            Numeric::Count => self.count = n as u32,
            Numeric::Depth => self.depth = n as u32,
            Numeric::Seed => self.seed = n,
            Numeric::Streams => self.streams = n as u8,
            Numeric::Port => self.port = n as u16,
            Numeric::Paths => self.paths = n as u16,
            Numeric::ProgressMs => self.progress_ms = n as u32,
            Numeric::LingerMs => self.linger_ms = n as u32,
            Numeric::Cores => self.cores = n as u8,
            Numeric::PeerConnections => self.peer_connections = n as u32,
        }
    }

    /// Parses the configuration line.
    pub fn parse(text: &str) -> Result<NodeConfig, ConfigError<'_>> {
        let mut cfg = NodeConfig {
            node: 0,
            ip: Ipv4Addr::UNSPECIFIED,
            mac: [0; 6],
            peers: Vec::new(),
            target: None,
            expect: 0,
            workload: WorkloadKind::Mixed,
            size: 65536,
            count: 32,
            depth: 8,
            seed: 1,
            streams: 1,
            port: metaroce_core::wire::DEFAULT_UDP_PORT,
            paths: 8,
            progress_ms: 500,
            // A node that has everything it needs keeps answering for a while:
            // its last ACK may be lost, and the peer's retransmissions (RTO
            // 5 ms, doubling) must still find it. 300 ms was too short at
            // 20 % loss: the sender's last message timed out against a node
            // already powered off.
            linger_ms: 3000,
            role: Role::Workload,
            gateway: None,
            cores: 1,
            core: 0,
            peer_connections: 256,
        };
        let (mut have_ip, mut have_mac) = (false, false);
        for word in text.split_ascii_whitespace() {
            let Some((key, value)) = split_once(word, b'=') else {
                return Err(ConfigError { key: word });
            };
            let bad = ConfigError { key };
            match key {
                "ip" => {
                    cfg.ip = parse_ipv4(value).ok_or(bad)?;
                    have_ip = true;
                }
                "mac" => {
                    cfg.mac = parse_mac(value).ok_or(bad)?;
                    have_mac = true;
                }
                "peer" => {
                    let peer = parse_peer(value).ok_or(bad)?;
                    cfg.peers.push(peer).map_err(|_| bad)?;
                }
                "gateway" => cfg.gateway = Some(parse_peer(value).ok_or(bad)?),
                "role" => cfg.role = pick(value, ROLES).ok_or(bad)?,
                "workload" => cfg.workload = pick(value, WORKLOADS).ok_or(bad)?,
                _ => {
                    let &(_, field, max) = NUMERIC_KEYS
                        .iter()
                        .find(|(name, ..)| *name == key)
                        .ok_or(bad)?;
                    cfg.set_number(field, number(value, 10, max).ok_or(bad)?);
                }
            }
        }
        if cfg.role == Role::Bench {
            return Ok(cfg);
        }
        if !have_ip {
            return Err(ConfigError { key: "ip" });
        }
        if !have_mac {
            return Err(ConfigError { key: "mac" });
        }
        if cfg
            .target
            .is_some_and(|t| usize::from(t) >= cfg.peers.len())
        {
            return Err(ConfigError { key: "target" });
        }
        if cfg.size == 0 || cfg.count == 0 || cfg.depth == 0 {
            return Err(ConfigError { key: "size" });
        }
        if cfg.streams == 0 || usize::from(cfg.streams) > MAX_STREAMS {
            return Err(ConfigError { key: "streams" });
        }
        if cfg.cores == 0
            || usize::from(cfg.cores) > crate::hw::MAX_CORES
            || (cfg.cores > 1 && cfg.role != Role::Workload)
        {
            return Err(ConfigError { key: "cores" });
        }
        Ok(cfg)
    }
}
