//! UDP sockets of one endpoint: the socket it receives on, and one socket
//! per path-entropy value bound to consecutive ports, so the core's path
//! entropy (the UDP source port) is what appears on the wire. ECN: every
//! datagram carries its codepoint in an `IP_TOS` / `IPV6_TCLASS` control
//! message; received ones report theirs through `IP_RECVTOS` /
//! `IPV6_RECVTCLASS`.

use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::socket::{
    recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, SockaddrLike, SockaddrStorage,
};
use nix::sys::time::TimeSpec;
use socket2::{Domain, Protocol, Socket, Type};

use crate::HostError;

/// Kernel buffer sizes asked for (the kernel may cap them).
const RECV_BUFFER: usize = 8 << 20;
const SEND_BUFFER: usize = 4 << 20;

/// A received datagram's metadata.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    /// ECN codepoint of the IP header (low two bits of TOS / traffic class).
    pub ecn: u8,
}

/// The sockets of one endpoint.
#[derive(Debug)]
pub struct Sockets {
    main: Socket,
    local: SocketAddr,
    /// `paths[i]` is bound to port `entropy_base + i`.
    paths: Vec<Socket>,
    entropy_base: u16,
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

impl Sockets {
    /// Binds the receive socket to `bind` and `span` entropy sockets to
    /// consecutive ports starting at `entropy_base` (or, if `None`, the
    /// first free run above the receive port).
    pub fn bind(bind: SocketAddr, entropy_base: Option<u16>, span: u16) -> Result<Self, HostError> {
        let main = udp_socket(bind).map_err(|e| bind_error(bind, &e))?;
        let local = main
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| HostError::Bind(format!("{bind}: no local address")))?;
        let setup = |s: &Socket| -> std::io::Result<()> {
            let _ = s.set_recv_buffer_size(RECV_BUFFER);
            let _ = s.set_send_buffer_size(SEND_BUFFER);
            if local.is_ipv4() {
                s.set_recv_tos_v4(true)
            } else {
                s.set_recv_tclass_v6(true)
            }
        };
        setup(&main).map_err(|e| HostError::Io(format!("socket options: {e}")))?;
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
                for p in &paths {
                    let _ = p.set_send_buffer_size(SEND_BUFFER);
                }
                return Ok(Sockets {
                    main,
                    local,
                    paths,
                    entropy_base: base,
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

    /// Sends `data` to `to` from entropy port `src_port` (or the receive
    /// socket if that port is not ours) with ECN codepoint `ecn`.
    pub fn send(&self, src_port: u16, to: SocketAddr, ecn: u8, data: &[u8]) -> Result<(), Errno> {
        let socket = match self.index_of(src_port) {
            Some(i) => &self.paths[i],
            None => &self.main,
        };
        let fd = socket.as_raw_fd();
        let iov = [IoSlice::new(data)];
        let dest = SockaddrStorage::from(to);
        let tos = ecn & 0b11;
        let tclass = i32::from(tos);
        let cmsg = if to.is_ipv4() {
            ControlMessage::Ipv4Tos(&tos)
        } else {
            ControlMessage::Ipv6TClass(&tclass)
        };
        loop {
            match sendmsg(fd, &iov, &[cmsg], MsgFlags::empty(), Some(&dest)) {
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e),
                Ok(_) => return Ok(()),
            }
        }
    }

    /// Receives one datagram into `buf` without waiting; `Ok(None)` when
    /// none is queued.
    pub fn try_recv(&self, buf: &mut [u8]) -> Result<Option<Received>, Errno> {
        let fd = self.main.as_raw_fd();
        let mut cmsg_space = nix::cmsg_space!(i32, i32);
        let mut iov = [IoSliceMut::new(buf)];
        let msg = loop {
            match recvmsg::<SockaddrStorage>(
                fd,
                &mut iov,
                Some(&mut cmsg_space),
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(m) => break m,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(None),
                // An ICMP error for an earlier send (port unreachable):
                // reported, the socket stays usable.
                Err(e) => return Err(e),
            }
        };
        let mut ecn = 0;
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                match c {
                    ControlMessageOwned::Ipv4Tos(t) => ecn = t & 0b11,
                    ControlMessageOwned::Ipv6TClass(t) => ecn = (t & 0b11) as u8,
                    _ => {}
                }
            }
        }
        let from = msg.address.as_ref().and_then(sockaddr_to_std);
        let len = msg.bytes;
        let Some(from) = from else {
            return Ok(Some(Received {
                len: 0,
                from: self.local,
                ecn,
            }));
        };
        Ok(Some(Received { len, from, ecn }))
    }

    /// Waits until a datagram is queued or `timeout` passed.
    pub fn wait(&self, timeout: Duration) {
        let mut fds = [PollFd::new(self.main.as_fd(), PollFlags::POLLIN)];
        let ts = TimeSpec::from_duration(timeout);
        let _ = nix::poll::ppoll(&mut fds, Some(ts), None);
    }
}

fn sockaddr_to_std(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::new(IpAddr::V4(v4.ip()), v4.port()));
    }
    if let Some(v6) = a.as_sockaddr_in6() {
        let ip = v6.ip();
        // A dual-stack peer may appear as ::ffff:a.b.c.d.
        let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
        return Some(SocketAddr::new(ip, v6.port()));
    }
    let _ = a.family();
    None
}
