//! Bringing each received datagram to the engine thread that owns its
//! connection, as `metaroce_platform::shard` does for the firmware's
//! cores: a CONNECT by the hash of its source address and source
//! connection id ([`metaroce_platform::shard::connect_core`], the same on
//! both), anything else by the table index in its destination connection
//! id ([`ShardMap`]). A datagram that arrived at another thread's socket
//! crosses over a single-producer, single-consumer byte ring (one per
//! ordered pair of threads, `rtrb`), and the owner is woken through its
//! eventfd, which its `ppoll` watches beside its socket.
//!
//! Well-behaved peers send a connection's packets to the port its ACCEPT
//! named (each thread's own), so only CONNECTs and packets of peers that
//! ignore the Reply Port cross; a datagram too short to name its owner, or
//! whose id lies in no shard, stays where it arrived and that thread's
//! endpoint drops and counts it.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metaroce_core::wire::packet::field;
use metaroce_core::wire::PacketType;
use metaroce_platform::shard::{classify_packet, FrameClass, ShardMap};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use crate::HostError;

/// Bytes of each ring between two threads: about 200 datagrams of the
/// default MTU, 28 of a 9000-byte one. A full ring drops (counted), as a
/// NIC queue does; the transport recovers the packet.
pub const RING_BYTES: usize = 256 << 10;
/// Datagrams one receive call steers away at most before it returns, so
/// one engine poll stays bounded under a flood of other threads' packets.
const STEERED_PER_RECEIVE: usize = 64;
/// A record's header in a ring: length (2), source port (2), ECN (1),
/// address family (1), address (16).
const RECORD_HEADER: usize = 22;
/// Longest datagram that crosses (the longest a ring record can say).
const MAX_CROSSING: usize = u16::MAX as usize;

/// Wakes one engine thread from its `ppoll` (an eventfd).
#[derive(Debug)]
pub struct Waker(EventFd);

impl Waker {
    pub fn new() -> Result<Waker, HostError> {
        EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map(Waker)
            .map_err(|e| HostError::Io(format!("eventfd: {e}")))
    }

    /// Makes the thread's next (or current) wait return.
    pub fn wake(&self) {
        // Fails only when the counter would overflow: it is set anyway.
        let _ = self.0.write(1);
    }

    /// What the thread's `ppoll` watches.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Resets it after a wait (nothing to read is fine).
    pub fn clear(&self) {
        let _ = self.0.read();
    }
}

/// What one thread's steering did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SteerStats {
    /// CONNECTs that arrived here and went to their hash thread.
    pub connects_forwarded: u64,
    /// Other packets that arrived here for another thread's connection
    /// (a peer that ignores the Reply Port) and went there.
    pub packets_forwarded: u64,
    /// Datagrams other threads forwarded here.
    pub received_forwarded: u64,
    /// Datagrams dropped because the owner's ring was full.
    pub ring_full: u64,
}

/// One engine thread's side of the steering: its map of owners, its
/// rings to and from every other thread, and everyone's wakers.
#[derive(Debug)]
pub struct Steering {
    me: usize,
    map: ShardMap,
    /// `to[t]`: the ring into thread `t` (`None` for this thread).
    to: Vec<Option<rtrb::Producer<u8>>>,
    /// Rings from the other threads, drained in turn.
    from: Vec<rtrb::Consumer<u8>>,
    next_from: usize,
    wakers: Arc<[Waker]>,
    /// Per thread: a producer committed a record to it since it last
    /// looked, so a receive looks at the rings only then (one load of a
    /// line of its own, not one per ring, while nothing crosses).
    inbox_flags: Arc<[InboxFlag]>,
    /// This thread stopped draining its rings with records left.
    draining: bool,
    /// Bit `t`: thread `t` was given datagrams since the last wake-up.
    to_wake: u64,
    /// A datagram taken from a ring, while the engine handles it.
    scratch: Vec<u8>,
    /// Take from the rings first next time (they alternate with the
    /// socket, so neither starves the other).
    rings_first: bool,
    pub stats: SteerStats,
}

/// One thread's "records waiting" flag, alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct InboxFlag(AtomicBool);

/// The rings and wakers of `threads` engine threads: one [`Steering`]
/// each, in thread order.
pub fn steering(map: ShardMap, threads: usize) -> Result<Vec<Steering>, HostError> {
    if threads > 64 {
        return Err(HostError::Usage(format!(
            "--threads must be 1..=64, got {threads}"
        )));
    }
    let wakers: Arc<[Waker]> = (0..threads)
        .map(|_| Waker::new())
        .collect::<Result<Vec<_>, _>>()?
        .into();
    let inbox_flags: Arc<[InboxFlag]> = (0..threads).map(|_| InboxFlag::default()).collect();
    let mut to: Vec<Vec<Option<rtrb::Producer<u8>>>> = (0..threads)
        .map(|_| (0..threads).map(|_| None).collect())
        .collect();
    let mut from: Vec<Vec<rtrb::Consumer<u8>>> = (0..threads).map(|_| Vec::new()).collect();
    for (source, outs) in to.iter_mut().enumerate() {
        for (target, out) in outs.iter_mut().enumerate() {
            if source != target {
                let (producer, consumer) = rtrb::RingBuffer::new(RING_BYTES);
                *out = Some(producer);
                from[target].push(consumer);
            }
        }
    }
    Ok(to
        .into_iter()
        .zip(from)
        .enumerate()
        .map(|(me, (to, from))| Steering {
            me,
            map,
            to,
            from,
            next_from: 0,
            wakers: wakers.clone(),
            inbox_flags: inbox_flags.clone(),
            draining: false,
            to_wake: 0,
            scratch: vec![0; RECORD_HEADER + MAX_CROSSING],
            rings_first: false,
            stats: SteerStats::default(),
        })
        .collect())
}

/// Whether `packet` from `from` belongs to `me`, and if not, to whom.
fn owner(map: &ShardMap, threads: usize, from: SocketAddr, packet: &[u8]) -> Option<usize> {
    let (v4, v6);
    let ip: &[u8] = match from.ip() {
        IpAddr::V4(a) => {
            v4 = a.octets();
            &v4
        }
        IpAddr::V6(a) => {
            v6 = a.octets();
            &v6
        }
    };
    match classify_packet(packet, ip, threads)? {
        FrameClass::Connect { core } => Some(core),
        FrameClass::Connection { dst_conn } => map.owner(dst_conn),
        FrameClass::Reply | FrameClass::Control => None,
    }
}

impl Steering {
    /// This thread's index.
    pub fn thread(&self) -> usize {
        self.me
    }

    /// Engine threads in all.
    pub fn threads(&self) -> usize {
        self.to.len()
    }

    /// This thread's waker (for the control path: budgets, revocations).
    pub fn waker(&self, thread: usize) -> Option<&Waker> {
        self.wakers.get(thread)
    }

    /// Every thread's wakers.
    pub fn wakers(&self) -> Arc<[Waker]> {
        self.wakers.clone()
    }

    /// Whether the rings hold datagrams for this thread.
    pub fn has_forwarded(&self) -> bool {
        self.draining || self.inbox_flags[self.me].0.load(Ordering::Acquire)
    }

    /// The next datagram another thread forwarded here: its source, ECN
    /// codepoint and bytes.
    pub fn take_forwarded(&mut self) -> Option<(SocketAddr, u8, &[u8])> {
        // Cleared before the rings are read: a record committed after the
        // read sets it again.
        if !self.draining && !self.inbox_flags[self.me].0.swap(false, Ordering::Acquire) {
            return None;
        }
        self.draining = true;
        let rings = self.from.len();
        for k in 0..rings {
            let i = (self.next_from + k) % rings;
            let ring = &mut self.from[i];
            // Peeked, not consumed: the whole record is popped below.
            let Ok(header) = ring.read_chunk(RECORD_HEADER) else {
                continue;
            };
            let mut head = [0u8; RECORD_HEADER];
            let (a, b) = header.as_slices();
            head[..a.len()].copy_from_slice(a);
            head[a.len()..].copy_from_slice(b);
            let len = usize::from(u16::from_be_bytes([head[0], head[1]]));
            let record = &mut self.scratch[..RECORD_HEADER + len];
            // The producer commits a record whole, so its bytes are there.
            if ring.pop_entire_slice(record).is_err() {
                continue;
            }
            self.next_from = (i + 1) % rings;
            self.stats.received_forwarded += 1;
            let port = u16::from_be_bytes([head[2], head[3]]);
            let ecn = head[4];
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&head[6..22]);
            let ip = if head[5] == 4 {
                IpAddr::from([octets[0], octets[1], octets[2], octets[3]])
            } else {
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            let bytes = &self.scratch[RECORD_HEADER..RECORD_HEADER + len];
            return Some((SocketAddr::new(ip, port), ecn, bytes));
        }
        self.draining = false;
        None
    }

    /// Takes a datagram that arrived at this thread's socket: `false` if
    /// it is this thread's to handle, `true` if it went to (or, the ring
    /// being full, was dropped on the way to) its owner.
    pub fn steer_away(&mut self, from: SocketAddr, ecn: u8, packet: &[u8]) -> bool {
        let threads = self.to.len();
        let Some(target) = owner(&self.map, threads, from, packet).filter(|&t| t != self.me) else {
            return false;
        };
        let Some(Some(ring)) = self.to.get_mut(target) else {
            return false;
        };
        if packet.len() > MAX_CROSSING {
            return false;
        }
        let mut head = [0u8; RECORD_HEADER];
        head[0..2].copy_from_slice(&(packet.len() as u16).to_be_bytes());
        head[2..4].copy_from_slice(&from.port().to_be_bytes());
        head[4] = ecn;
        match from.ip() {
            IpAddr::V4(a) => {
                head[5] = 4;
                head[6..10].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                head[5] = 6;
                head[6..22].copy_from_slice(&a.octets());
            }
        }
        let Ok(mut chunk) = ring.write_chunk(RECORD_HEADER + packet.len()) else {
            self.stats.ring_full += 1;
            return true;
        };
        let (a, b) = chunk.as_mut_slices();
        let mut record = head.iter().chain(packet).copied();
        for slot in a.iter_mut().chain(b.iter_mut()) {
            *slot = record.next().unwrap_or(0);
        }
        chunk.commit_all();
        if let Some(flag) = self.inbox_flags.get(target) {
            flag.0.store(true, Ordering::Release);
        }
        let is_connect = packet.get(field::TYPE).copied().map(PacketType::from);
        if is_connect == Some(PacketType::Connect) {
            self.stats.connects_forwarded += 1;
        } else {
            self.stats.packets_forwarded += 1;
        }
        self.to_wake |= 1 << target;
        true
    }

    /// Wakes the threads given datagrams since the last call (one
    /// eventfd write each, after a whole engine poll rather than per
    /// datagram).
    pub fn wake_receivers(&mut self) {
        while self.to_wake != 0 {
            let t = self.to_wake.trailing_zeros() as usize;
            self.to_wake &= self.to_wake - 1;
            if let Some(w) = self.wakers.get(t) {
                w.wake();
            }
        }
    }

    /// Whether the next receive should look at the rings before the
    /// socket (flips every call).
    pub(crate) fn rings_first(&mut self) -> bool {
        self.rings_first = !self.rings_first;
        self.rings_first
    }

    /// Most datagrams one receive call steers away before it returns.
    pub(crate) fn steered_per_receive(&self) -> usize {
        STEERED_PER_RECEIVE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metaroce_core::wire::{Body, ConnectRepr, Flags, Header, Repr, COOKIE_LEN};
    use metaroce_platform::shard::connect_core;

    fn header(dst_conn: u32) -> Header {
        Header {
            flags: Flags::NONE,
            dst_conn,
            token: u64::from(dst_conn != 0) * 7,
            psn: 1,
            path: 0,
            timestamp: 0,
        }
    }

    fn encode(repr: &Repr) -> Vec<u8> {
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut b, &[]);
        b
    }

    fn keepalive(dst_conn: u32) -> Vec<u8> {
        encode(&Repr {
            header: header(dst_conn),
            body: Body::Keepalive,
            payload_len: 0,
        })
    }

    fn connect(src_conn: u32) -> Vec<u8> {
        connect_with_cookie(src_conn, [0; COOKIE_LEN])
    }

    fn connect_with_cookie(src_conn: u32, cookie: [u8; COOKIE_LEN]) -> Vec<u8> {
        encode(&Repr {
            header: header(0),
            body: Body::Connect(ConnectRepr {
                src_conn,
                src_token: 9,
                mtu: 1024,
                max_paths: 4,
                window: 256,
                reply_port: 0,
                initial_psn: 0,
                timer_profile: Default::default(),
                suite: Default::default(),
                key_id: 0,
                cookie,
            }),
            payload_len: 0,
        })
    }

    #[test]
    fn datagrams_reach_their_owner_with_their_source() {
        // 4 threads, 16 slots each.
        let map = ShardMap::new(8, 16, 4).unwrap();
        let mut s = steering(map, 4).unwrap();
        let from: SocketAddr = "198.18.0.7:40001".parse().unwrap();
        // Thread 0's own connection (slot 3) stays.
        assert!(!s[0].steer_away(from, 0, &keepalive(0xab00_0003)));
        // Thread 2's (slot 35) goes there, with its source and ECN.
        let k = keepalive(0xab00_0023);
        assert!(s[0].steer_away(from, 0b11, &k));
        assert_eq!(s[0].stats.packets_forwarded, 1);
        assert!(s[2].has_forwarded());
        assert!(!s[1].has_forwarded());
        let (src, ecn, bytes) = s[2].take_forwarded().expect("forwarded");
        assert_eq!((src, ecn, bytes), (from, 0b11, &k[..]));
        assert!(s[2].take_forwarded().is_none());
        assert_eq!(s[2].stats.received_forwarded, 1);
        // A CONNECT goes to its hash thread, wherever it arrived.
        let c = connect(0x1234_5678);
        let hashed = connect_core(&[198, 18, 0, 7], 0x1234_5678, 4);
        for (arrival, thread) in s.iter_mut().enumerate() {
            let away = thread.steer_away(from, 0, &c);
            assert_eq!(away, arrival != hashed);
        }
        // An IPv6 source crosses whole.
        let v6: SocketAddr = "[2001:db8::5]:7".parse().unwrap();
        assert!(s[1].steer_away(v6, 0, &keepalive(0x0000_0003)));
        let (src, _, _) = s[0].take_forwarded().expect("from thread 1");
        assert_eq!(src, v6);
        // Too short to name an owner, or an id in no shard: stays.
        assert!(!s[3].steer_away(from, 0, &k[..10]));
        assert!(!s[3].steer_away(from, 0, &keepalive(0x0000_00ff)));
    }

    /// Whatever the acceptor answered a CONNECT with (an ACCEPT that got
    /// lost, or a RETRY), the initiator's next CONNECT, from any source
    /// port and with the RETRY's cookie, reaches the thread that saw the
    /// first: the hash takes the address and the source connection id,
    /// which a RETRY does not change, and not the port (path entropy).
    #[test]
    fn a_connect_repeated_after_a_retry_reaches_the_same_thread() {
        let map = ShardMap::new(8, 16, 4).unwrap();
        for id in [0x0000_0101u32, 0x7f00_0042, 0xdead_beef, 0x1234_5678] {
            let mut s = steering(map, 4).unwrap();
            let first: SocketAddr = "198.18.0.9:40000".parse().unwrap();
            let again: SocketAddr = "198.18.0.9:51234".parse().unwrap();
            let owner = |s: &mut Vec<Steering>, from, packet: &[u8]| {
                (0..4)
                    .find(|&t| !s[t].steer_away(from, 0, packet))
                    .expect("some thread keeps it")
            };
            let a = owner(&mut s, first, &connect(id));
            let b = owner(&mut s, again, &connect_with_cookie(id, [0xc5; COOKIE_LEN]));
            assert_eq!(a, b, "id {id:#x}");
        }
    }

    #[test]
    fn a_full_ring_drops_and_counts_and_records_never_tear() {
        let map = ShardMap::new(8, 16, 2).unwrap();
        let mut s = steering(map, 2).unwrap();
        let from: SocketAddr = "10.0.0.1:9".parse().unwrap();
        let big = {
            let mut k = keepalive(0x0000_0011);
            k.resize(9000, 0x5a);
            k
        };
        for _ in 0..1000 {
            assert!(s[0].steer_away(from, 0, &big));
            if s[0].stats.ring_full > 0 {
                break;
            }
        }
        let taken = std::iter::from_fn(|| s[1].take_forwarded().map(|(_, _, b)| b.to_vec()))
            .inspect(|b| assert_eq!(b, &big))
            .count();
        assert_eq!(taken as u64, s[0].stats.packets_forwarded);
        assert_eq!(s[0].stats.ring_full, 1);
        assert!(taken >= RING_BYTES / 9100 - 1);
    }

    #[test]
    fn wakers_wake_the_threads_given_datagrams() {
        let map = ShardMap::new(8, 16, 2).unwrap();
        let mut s = steering(map, 2).unwrap();
        let from: SocketAddr = "10.0.0.1:9".parse().unwrap();
        assert!(s[0].steer_away(from, 0, &keepalive(0x0000_0011)));
        s[0].wake_receivers();
        let wakers = s[1].wakers();
        let mut fds = [nix::poll::PollFd::new(
            wakers[1].fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap();
        assert_eq!(ready, 1);
        wakers[1].clear();
        let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap();
        assert_eq!(ready, 0);
    }
}
