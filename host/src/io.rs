//! UDP sockets of one endpoint: the socket it receives on, and one socket
//! per path-entropy value bound to consecutive ports, so the core's path
//! entropy (the UDP source port) is what appears on the wire.
//!
//! Datagrams move in batches through `quinn-udp` (the UDP layer of the
//! quinn QUIC stack), never one per system call:
//!
//! * **Receive**: one `recvmmsg` fills up to [`quinn_udp::BATCH_SIZE`]
//!   buffers, and with UDP GRO each buffer holds up to 64 datagrams of one
//!   sender glued together (`stride` bytes apart). [`Sockets::next_received`]
//!   hands them out one by one.
//! * **Transmit**: [`Sockets::stage`] writes each packet straight into the
//!   staging buffer of the socket it leaves from. Packets of one socket to
//!   one destination with one ECN codepoint and one size (the last may be
//!   shorter) stay together and leave as a single UDP GSO `sendmsg` of up
//!   to 64 datagrams and 64 KiB, when the next packet does not fit the run
//!   or at [`Sockets::flush`], which the node calls after every engine poll.
//!   Runs of different sockets may leave in another order than they were
//!   staged: they are different paths, which MetaRoCE expects to reorder.
//! * **ECN**: `quinn-udp` sets each send's codepoint in an `IP_TOS` /
//!   `IPV6_TCLASS` control message and reads each received buffer's.
//!
//! `quinn-udp` also turns on `IP_PMTUDISC_PROBE`/`IPV6_DONTFRAG`: the
//! kernel never fragments, so `--mtu` must fit the link (a datagram that
//! does not is refused, counted as a send error, and the core sees a loss).
//!
//! Socket buffers: 8 MiB to receive and 4 MiB to send per socket, with
//! `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` where the process may (root), since
//! the kernel otherwise caps them at `net.core.rmem_max`/`wmem_max`
//! (212,992 bytes by default), which loopback overruns in microseconds.
//! [`Sockets::buffer_sizes`] tells what the kernel granted.

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeSpec;
use quinn_udp::{EcnCodepoint, RecvMeta, Transmit, UdpSockRef, UdpSocketState, BATCH_SIZE};
use socket2::{Domain, Protocol, Socket, Type};

use crate::HostError;

/// Kernel buffer sizes asked for.
const RECV_BUFFER: usize = 8 << 20;
const SEND_BUFFER: usize = 4 << 20;
/// Bytes of one receive buffer: the largest GRO train the kernel builds
/// (64 KiB) or the largest datagram.
const RX_SLOT: usize = 65_536;
/// Most payload bytes of one GSO send: an IPv4 packet's 65,535 bytes less
/// the IP and UDP headers (the kernel refuses more).
const GSO_MAX_BYTES: usize = 65_507;
/// Most datagrams in one GSO send (the kernel's `UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGMENTS: usize = 64;
/// How long a send waits for room in a full socket buffer before the
/// packet counts as refused.
const SEND_WAIT: Duration = Duration::from_millis(20);

/// A received datagram's metadata.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    /// ECN codepoint of the IP header (low two bits of TOS / traffic class).
    pub ecn: u8,
}

/// Socket-side counters of batching (the rest is counted by the node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// `sendmsg` calls that carried datagrams.
    pub send_calls: u64,
    /// Datagrams those calls carried.
    pub sent: u64,
    /// Datagrams the kernel refused (buffer still full, unreachable, too
    /// long): the core sees them as losses and recovers.
    pub refused: u64,
    /// `recvmmsg` calls that returned datagrams.
    pub recv_calls: u64,
    /// Receive calls that failed (an ICMP error for an earlier send).
    pub recv_errors: u64,
}

/// Receive and send buffer sizes the kernel granted, in bytes (Linux
/// reports twice what it accounts for payload).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferSizes {
    pub receive: usize,
    pub send: usize,
}

/// One bound socket and its `quinn-udp` state.
#[derive(Debug)]
struct UdpSocket {
    socket: Socket,
    state: UdpSocketState,
}

/// Packets waiting to leave one socket as one GSO send.
#[derive(Debug, Default)]
struct Staged {
    bytes: Vec<u8>,
    destination: Option<SocketAddr>,
    ecn: u8,
    /// Size of every datagram but possibly the last.
    segment: usize,
    segments: usize,
}

impl Staged {
    /// Whether a `len`-byte datagram to `to` with `ecn` can join the run.
    fn takes(&self, to: SocketAddr, ecn: u8, len: usize, max_segments: usize) -> bool {
        self.segments == 0
            || (self.destination == Some(to)
                && self.ecn == ecn
                // Every datagram but the last is `segment` long: a shorter
                // one ends the run.
                && self.bytes.len() == self.segment * self.segments
                && len <= self.segment
                && self.segments < max_segments
                && self.bytes.len() + len <= GSO_MAX_BYTES)
    }
}

/// Datagrams received by the last `recvmmsg`, not yet handed out.
#[derive(Debug)]
struct RxBatch {
    bufs: Vec<u8>,
    meta: [RecvMeta; BATCH_SIZE],
    /// Buffers filled by the last call.
    filled: usize,
    /// Next buffer, and the next datagram's offset in it.
    slot: usize,
    offset: usize,
}

/// The sockets of one endpoint.
#[derive(Debug)]
pub struct Sockets {
    main: UdpSocket,
    local: SocketAddr,
    /// `paths[i]` is bound to port `entropy_base + i`.
    paths: Vec<UdpSocket>,
    entropy_base: u16,
    /// `staged[0]` for the main socket, `staged[1 + i]` for `paths[i]`.
    staged: Vec<Staged>,
    rx: RxBatch,
    stats: BatchStats,
    buffers: BufferSizes,
}

fn udp_socket(addr: SocketAddr) -> Result<Socket, std::io::Error> {
    let domain = Domain::for_address(addr);
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&addr.into())?;
    Ok(s)
}

/// Wraps a bound socket: `quinn-udp` options (ECN and packet-info control
/// messages, GRO, no fragmentation) and large buffers.
fn batched(socket: Socket, recv_buffer: usize) -> std::io::Result<UdpSocket> {
    let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
    // quinn-udp 0.6 also asks for kernel receive timestamps, which this
    // program does not use; their control message, with GRO's, the packet
    // info and the TOS byte, overflows its 96-byte control buffer, and the
    // TOS (the ECN codepoint, last in the kernel's order) is cut off from
    // every GRO batch. Without timestamps all three fit.
    setsockopt(&socket, sockopt::ReceiveTimestampns, &false)?;
    // Forced sizes pass `net.core.[rw]mem_max` (needs CAP_NET_ADMIN);
    // otherwise the kernel caps the plain request.
    if recv_buffer > 0 && setsockopt(&socket, sockopt::RcvBufForce, &recv_buffer).is_err() {
        let _ = socket.set_recv_buffer_size(recv_buffer);
    }
    if setsockopt(&socket, sockopt::SndBufForce, &SEND_BUFFER).is_err() {
        let _ = socket.set_send_buffer_size(SEND_BUFFER);
    }
    Ok(UdpSocket { socket, state })
}

fn bind_error(addr: SocketAddr, e: &std::io::Error) -> HostError {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => HostError::Bind(format!("{addr}: port already in use")),
        std::io::ErrorKind::AddrNotAvailable => {
            HostError::Bind(format!("{addr}: no local interface has this address"))
        }
        std::io::ErrorKind::PermissionDenied => {
            HostError::Bind(format!("{addr}: permission denied"))
        }
        _ => HostError::Bind(format!("{addr}: {e}")),
    }
}

/// A dual-stack peer may appear as `::ffff:a.b.c.d`.
fn unmapped(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

impl Sockets {
    /// Binds the receive socket to `bind` and `span` entropy sockets to
    /// consecutive ports starting at `entropy_base` (or, if `None`, the
    /// first free run above the receive port).
    pub fn bind(bind: SocketAddr, entropy_base: Option<u16>, span: u16) -> Result<Self, HostError> {
        let socket = udp_socket(bind).map_err(|e| bind_error(bind, &e))?;
        let local = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| HostError::Bind(format!("{bind}: no local address")))?;
        let options = |e: std::io::Error| HostError::Io(format!("socket options: {e}"));
        let main = batched(socket, RECV_BUFFER).map_err(options)?;
        // Received datagrams are taken without waiting (`wait` blocks);
        // sends that find the buffer full wait in `send_staged`.
        main.socket.set_nonblocking(true).map_err(options)?;
        let candidates: Vec<u16> = match entropy_base {
            Some(b) => vec![b],
            None => {
                // Runs above the receive port, then spread over the
                // dynamic range: the first run whose ports are all free.
                let start = u32::from(local.port()) + 1;
                (0..64u32)
                    .map(|k| start + k * u32::from(span))
                    .chain((0..64u32).map(|k| 20_000 + k * 617))
                    .filter(|&b| b + u32::from(span) < 65_536)
                    .map(|b| b as u16)
                    .collect()
            }
        };
        let mut last_err = None;
        for base in candidates {
            let mut paths = Vec::with_capacity(usize::from(span));
            for i in 0..span {
                let addr = SocketAddr::new(local.ip(), base + i);
                match udp_socket(addr) {
                    Ok(s) => paths.push(s),
                    Err(e) => {
                        last_err = Some(bind_error(addr, &e));
                        break;
                    }
                }
            }
            if paths.len() == usize::from(span) {
                // Path sockets only send (the peer answers the main port).
                let paths = paths
                    .into_iter()
                    .map(|s| batched(s, 0))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(options)?;
                let buffers = BufferSizes {
                    receive: main.socket.recv_buffer_size().unwrap_or(0),
                    send: main.socket.send_buffer_size().unwrap_or(0),
                };
                let staged = (0..=paths.len()).map(|_| Staged::default()).collect();
                return Ok(Sockets {
                    main,
                    local,
                    paths,
                    entropy_base: base,
                    staged,
                    rx: RxBatch {
                        bufs: vec![0; BATCH_SIZE * RX_SLOT],
                        meta: [RecvMeta::default(); BATCH_SIZE],
                        filled: 0,
                        slot: 0,
                        offset: 0,
                    },
                    stats: BatchStats::default(),
                    buffers,
                });
            }
        }
        Err(last_err.unwrap_or_else(|| HostError::Bind("no free entropy ports".into())))
    }

    /// The address datagrams arrive on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// First entropy port.
    pub fn entropy_base(&self) -> u16 {
        self.entropy_base
    }

    /// Number of entropy ports.
    pub fn entropy_span(&self) -> u16 {
        self.paths.len() as u16
    }

    /// Batching counters.
    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// What the kernel granted for the receive socket's buffers.
    pub fn buffer_sizes(&self) -> BufferSizes {
        self.buffers
    }

    /// The local address a datagram from `src_port` leaves from.
    pub fn source_of(&self, src_port: u16) -> SocketAddr {
        let port = if self.index_of(src_port).is_some() {
            src_port
        } else {
            self.local.port()
        };
        SocketAddr::new(self.local.ip(), port)
    }

    fn index_of(&self, src_port: u16) -> Option<usize> {
        let i = usize::from(src_port.checked_sub(self.entropy_base)?);
        (i < self.paths.len()).then_some(i)
    }

    fn socket(&self, staged_index: usize) -> &UdpSocket {
        match staged_index {
            0 => &self.main,
            i => &self.paths[i - 1],
        }
    }

    /// A `len`-byte buffer in the staging area of the socket of entropy
    /// port `src_port` (the receive socket if that port is not ours), for
    /// a datagram to `to` with ECN codepoint `ecn`; it leaves at the next
    /// [`Sockets::flush`] at the latest. `None` if `len` is too long.
    pub fn stage(
        &mut self,
        src_port: u16,
        to: SocketAddr,
        ecn: u8,
        len: usize,
    ) -> Option<&mut [u8]> {
        if len == 0 || len > GSO_MAX_BYTES {
            return None;
        }
        let index = self.index_of(src_port).map_or(0, |i| i + 1);
        let ecn = ecn & 0b11;
        let max_segments = self
            .socket(index)
            .state
            .max_gso_segments()
            .min(GSO_MAX_SEGMENTS);
        if !self.staged[index].takes(to, ecn, len, max_segments) {
            self.send_staged(index);
        }
        let run = &mut self.staged[index];
        if run.segments == 0 {
            run.destination = Some(to);
            run.ecn = ecn;
            run.segment = len;
        }
        run.segments += 1;
        let start = run.bytes.len();
        run.bytes.resize(start + len, 0);
        Some(&mut run.bytes[start..])
    }

    /// Sends every staged datagram.
    pub fn flush(&mut self) {
        for index in 0..self.staged.len() {
            if self.staged[index].segments > 0 {
                self.send_staged(index);
            }
        }
    }

    /// Sends the run staged for one socket: one GSO `sendmsg`, waiting up
    /// to [`SEND_WAIT`] for room if the buffer is full. If the kernel
    /// refuses segmentation offload (`quinn-udp` then turns it off for the
    /// socket), the datagrams go one by one.
    fn send_staged(&mut self, index: usize) {
        let run = std::mem::take(&mut self.staged[index]);
        let Some(destination) = run.destination else {
            return;
        };
        let socket = self.socket(index);
        let ecn = EcnCodepoint::from_bits(run.ecn);
        let send = |contents: &[u8], segment_size: Option<usize>| {
            let transmit = Transmit {
                destination,
                ecn,
                contents,
                segment_size,
                src_ip: None,
            };
            let sock = UdpSockRef::from(&socket.socket);
            match socket.state.try_send(sock, &transmit) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut fds = [PollFd::new(socket.socket.as_fd(), PollFlags::POLLOUT)];
                    let _ =
                        nix::poll::ppoll(&mut fds, Some(TimeSpec::from_duration(SEND_WAIT)), None);
                    socket
                        .state
                        .try_send(UdpSockRef::from(&socket.socket), &transmit)
                }
                other => other,
            }
        };
        let segment_size = (run.segments > 1).then_some(run.segment);
        let mut calls = 1;
        let mut refused = 0;
        if send(&run.bytes, segment_size).is_err() {
            if run.segments > 1 && socket.state.max_gso_segments() == 1 {
                calls = 0;
                for datagram in run.bytes.chunks(run.segment) {
                    calls += 1;
                    refused += u64::from(send(datagram, None).is_err());
                }
            } else {
                refused = run.segments as u64;
            }
        }
        self.stats.send_calls += calls;
        self.stats.sent += run.segments as u64 - refused;
        self.stats.refused += refused;
        // Keep the allocation for the next run.
        let mut bytes = run.bytes;
        bytes.clear();
        self.staged[index].bytes = bytes;
    }

    /// The next received datagram, without waiting: from the last batch,
    /// or a new `recvmmsg` when it is used up. `None` when none is queued.
    pub fn next_received(&mut self) -> Option<(Received, &[u8])> {
        loop {
            if self.rx.slot < self.rx.filled {
                let slot = self.rx.slot;
                let meta = self.rx.meta[slot];
                // Without GRO a buffer holds one datagram (stride = len).
                let stride = if meta.stride == 0 {
                    meta.len
                } else {
                    meta.stride
                };
                let start = self.rx.offset;
                let len = stride.min(meta.len.saturating_sub(start));
                if start + len >= meta.len {
                    self.rx.slot += 1;
                    self.rx.offset = 0;
                } else {
                    self.rx.offset += len;
                }
                if len == 0 {
                    continue;
                }
                let base = slot * RX_SLOT;
                let bytes = &self.rx.bufs[base + start..base + start + len];
                let received = Received {
                    len,
                    from: unmapped(meta.addr),
                    ecn: meta.ecn.map_or(0, |e| e as u8),
                };
                return Some((received, bytes));
            }
            if !self.receive_batch() {
                return None;
            }
        }
    }

    /// One `recvmmsg`; false when nothing was queued.
    fn receive_batch(&mut self) -> bool {
        self.rx.filled = 0;
        self.rx.slot = 0;
        self.rx.offset = 0;
        let mut slices: Vec<IoSliceMut<'_>> = self
            .rx
            .bufs
            .chunks_mut(RX_SLOT)
            .map(IoSliceMut::new)
            .collect();
        loop {
            let sock = UdpSockRef::from(&self.main.socket);
            match self.main.state.recv(sock, &mut slices, &mut self.rx.meta) {
                Ok(n) => {
                    self.rx.filled = n;
                    self.stats.recv_calls += 1;
                    return n > 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                // An ICMP error for an earlier send (port unreachable):
                // counted, the socket stays usable.
                Err(_) => self.stats.recv_errors += 1,
            }
        }
    }

    /// Whether datagrams taken by the last `recvmmsg` are still unread.
    pub fn has_buffered(&self) -> bool {
        self.rx.slot < self.rx.filled
    }

    /// The receive socket's descriptor (to poll it from elsewhere).
    pub fn receive_fd(&self) -> BorrowedFd<'_> {
        self.main.socket.as_fd()
    }

    /// Waits until a datagram is queued, `also` (an eventfd another
    /// thread writes to wake this one) is readable, or `timeout` passed.
    pub fn wait(&self, timeout: Duration, also: Option<BorrowedFd<'_>>) {
        if self.rx.slot < self.rx.filled {
            return;
        }
        let socket = PollFd::new(self.main.socket.as_fd(), PollFlags::POLLIN);
        let ts = TimeSpec::from_duration(timeout);
        match also {
            Some(fd) => {
                let mut fds = [socket, PollFd::new(fd, PollFlags::POLLIN)];
                let _ = nix::poll::ppoll(&mut fds, Some(ts), None);
            }
            None => {
                let _ = nix::poll::ppoll(&mut [socket], Some(ts), None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn localhost_pair() -> (Sockets, Sockets) {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let a = Sockets::bind(any, None, 4).expect("bind a");
        let b = Sockets::bind(any, None, 4).expect("bind b");
        (a, b)
    }

    fn drain(s: &mut Sockets, want: usize) -> Vec<(Received, Vec<u8>)> {
        let mut got = Vec::new();
        for _ in 0..200 {
            while let Some((r, bytes)) = s.next_received() {
                got.push((r, bytes.to_vec()));
            }
            if got.len() >= want {
                break;
            }
            s.wait(Duration::from_millis(10), None);
        }
        got
    }

    #[test]
    fn a_run_of_datagrams_leaves_in_one_call_and_arrives_whole() {
        let (mut a, mut b) = localhost_pair();
        let to = b.local_addr();
        let port = a.entropy_base() + 1;
        // 20 datagrams of 1000 bytes and a shorter last one, one path.
        for i in 0..21u8 {
            let len = if i == 20 { 300 } else { 1000 };
            let buf = a.stage(port, to, 0b10, len).expect("stage");
            buf.fill(i);
        }
        a.flush();
        let stats = a.stats();
        assert_eq!(stats.sent, 21);
        assert_eq!(stats.refused, 0);
        // One GSO send, unless the kernel refused offload (then 21).
        assert!(stats.send_calls == 1 || stats.send_calls == 21, "{stats:?}");
        let got = drain(&mut b, 21);
        assert_eq!(got.len(), 21);
        for (i, (r, bytes)) in got.iter().enumerate() {
            assert_eq!(r.from, SocketAddr::new(to.ip(), port));
            assert_eq!(r.ecn, 0b10, "ECT(0) arrives");
            assert_eq!(bytes.len(), if i == 20 { 300 } else { 1000 });
            assert!(bytes.iter().all(|&x| x == i as u8), "datagram {i} intact");
        }
        assert!(b.stats().recv_calls < 21, "received in batches");
    }

    #[test]
    fn runs_split_on_destination_ecn_size_and_socket() {
        let (mut a, mut b) = localhost_pair();
        let to = b.local_addr();
        let p0 = a.entropy_base();
        let p1 = p0 + 1;
        let plan: [(u16, u8, usize); 6] = [
            (p0, 0b10, 500),
            (p1, 0b10, 500),
            (p0, 0b11, 500),
            (p0, 0b11, 600),
            (p1, 0b10, 500),
            (9, 0b00, 100),
        ];
        for (i, (port, ecn, len)) in plan.iter().enumerate() {
            a.stage(*port, to, *ecn, *len).expect("stage").fill(i as u8);
        }
        a.flush();
        let got = drain(&mut b, plan.len());
        assert_eq!(got.len(), plan.len());
        let mut seen: Vec<u8> = got.iter().map(|(_, bytes)| bytes[0]).collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
        for (r, bytes) in &got {
            let (port, ecn, len) = plan[usize::from(bytes[0])];
            assert_eq!(bytes.len(), len);
            assert_eq!(r.ecn, ecn);
            let expected = if port == 9 {
                a.local_addr().port()
            } else {
                port
            };
            assert_eq!(r.from.port(), expected);
        }
    }

    #[test]
    fn the_kernel_grants_large_buffers_or_says_so() {
        let (a, _) = localhost_pair();
        let sizes = a.buffer_sizes();
        assert!(sizes.receive > 0 && sizes.send > 0, "{sizes:?}");
    }

    #[test]
    fn oversized_and_empty_datagrams_are_refused_at_staging() {
        let (mut a, b) = localhost_pair();
        let to = b.local_addr();
        assert!(a.stage(a.entropy_base(), to, 0, 0).is_none());
        assert!(a
            .stage(a.entropy_base(), to, 0, GSO_MAX_BYTES + 1)
            .is_none());
    }
}
