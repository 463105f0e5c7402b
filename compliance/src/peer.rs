//! The suite's side of one connection: a hand-driven MetaRoCE peer that
//! builds every packet itself (with the core's `wire` module), so it can
//! send them in any order, twice, never, or broken.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use metaroce_core::wire::encap::ecn;
use metaroce_core::wire::{
    self, AckRepr, Body, CipherSuite, CloseReason, CloseRepr, ConnectRepr, Flags, Header,
    MemoryTarget, MessageSpan, NakRepr, ReadRequestRepr, Repr, SackBits, SendRepr, TimerProfile,
    WriteImm, WriteRepr, COOKIE_LEN,
};
use metaroce_host::app::{Message, Operation};
use socket2::SockRef;

/// A packet received from the target.
#[derive(Debug, Clone)]
pub struct Rx {
    pub repr: Repr,
    pub payload: Vec<u8>,
}

/// Why a step failed: a sentence for the report.
pub type Fail = String;

/// What the target told us about the memory it gave this connection.
#[derive(Debug, Clone, Copy)]
pub struct RemoteRegion {
    pub key: u32,
    pub addr: u64,
    pub len: u64,
    pub ro_key: u32,
    pub ro_addr: u64,
    /// What another connection presents to `JOIN` this region (0: none).
    pub ticket: u64,
}

/// One connection to the target.
#[derive(Debug)]
pub struct Peer {
    sock: UdpSocket,
    pub target: SocketAddr,
    pub my_id: u32,
    pub my_token: u64,
    pub their_id: u32,
    pub their_token: u64,
    pub accept: Option<ConnectRepr>,
    /// The common header of that ACCEPT.
    pub accept_header: Option<Header>,
    /// Next PSN of our direction.
    pub next_psn: u32,
    next_msg: u32,
    next_recv_index: u32,
    /// Receive side (their direction): lowest PSN not yet received and the
    /// received ones above it.
    rx_cum: u32,
    rx_above: BTreeSet<u32>,
    /// Acknowledge their reliable packets automatically.
    pub auto_ack: bool,
    /// A PSN of theirs to treat as lost on its first transmission (neither
    /// recorded nor acknowledged unless it carries RETRANSMISSION).
    pub withhold: Option<u32>,
    /// Everything received and not yet taken, in arrival order.
    pub inbox: Vec<Rx>,
    /// The cookie of the target's RETRY, echoed in our CONNECTs (spec
    /// 4.2); all zero before one came.
    pub cookie: [u8; COOKIE_LEN],
    origin: Instant,
    /// Packet protection (spec 5.3): the key offered and, after the
    /// ACCEPT, the connection's keys; `None`: unprotected.
    pub keys: Option<crate::protect::PeerKeys>,
}

fn bad(e: impl std::fmt::Display) -> Fail {
    e.to_string()
}

impl Peer {
    /// A fresh socket towards `target`; `seed` makes ids and tokens distinct.
    pub fn new(target: SocketAddr, seed: u32) -> Result<Peer, Fail> {
        let local: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().map_err(bad)?
        } else {
            "[::]:0".parse().map_err(bad)?
        };
        Peer::bound(target, seed, local)
    }

    /// [`Peer::new`] sending from `local` (an address of this host).
    pub fn bound(target: SocketAddr, seed: u32, local: SocketAddr) -> Result<Peer, Fail> {
        let sock = UdpSocket::bind(local).map_err(bad)?;
        let mix = seed.wrapping_mul(0x9e37_79b9) ^ std::process::id().rotate_left(13);
        Ok(Peer {
            sock,
            target,
            my_id: (mix | 1) & 0x7fff_ffff | 0x100,
            my_token: u64::from(mix) << 32 | 0x5eed_0001,
            their_id: 0,
            their_token: 0,
            accept: None,
            accept_header: None,
            next_psn: mix.wrapping_mul(7) & 0x00ff_ffff,
            next_msg: 0,
            next_recv_index: 0,
            rx_cum: 0,
            rx_above: BTreeSet::new(),
            auto_ack: true,
            withhold: None,
            inbox: Vec::new(),
            cookie: [0; COOKIE_LEN],
            origin: Instant::now(),
            keys: None,
        })
    }

    /// The UDP port our socket sends from and receives on.
    pub fn local_port(&self) -> u16 {
        self.sock.local_addr().map_or(0, |a| a.port())
    }

    /// Our timestamp clock (ns, low 32 bits on the wire).
    pub fn timestamp(&self) -> u32 {
        self.origin.elapsed().as_nanos() as u32
    }

    /// A header for the connection.
    pub fn header(&self, psn: u32, flags: Flags) -> Header {
        Header {
            flags,
            dst_conn: self.their_id,
            token: self.their_token,
            psn,
            path: 0,
            timestamp: self.timestamp(),
        }
    }

    /// Encodes a packet, CRC included.
    pub fn encode(repr: &Repr, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, payload);
        buf
    }

    /// Sends a packet: protected first on a keyed connection (spec 5.3).
    fn send_packet_bytes(&self, bytes: &[u8]) -> Result<(), Fail> {
        match &self.keys {
            Some(k) => self.send_raw(&k.seal(bytes), false),
            None => self.send_raw(bytes, false),
        }
    }

    /// Sends bytes already sealed (or deliberately not), as they are.
    pub fn send_sealed(&self, bytes: &[u8]) -> Result<(), Fail> {
        self.send_raw(bytes, false)
    }

    /// Sends raw bytes, with CE in the IP header if `ce`.
    pub fn send_raw(&self, bytes: &[u8], ce: bool) -> Result<(), Fail> {
        let code = if ce { ecn::CE } else { ecn::ECT0 };
        let sock = SockRef::from(&self.sock);
        let _ = if self.target.is_ipv4() {
            sock.set_tos_v4(u32::from(code))
        } else {
            sock.set_tclass_v6(u32::from(code))
        };
        self.sock.send_to(bytes, self.target).map_err(bad)?;
        Ok(())
    }

    /// Sends a packet.
    pub fn send(&self, repr: &Repr, payload: &[u8]) -> Result<(), Fail> {
        self.send_packet_bytes(&Self::encode(repr, payload))
    }

    /// Receives for up to `timeout`, handling their data (auto-ACK) and
    /// appending everything to the inbox. Returns when `done` holds for the
    /// inbox or the time is up; the result says whether `done` held.
    pub fn pump(&mut self, timeout: Duration, mut done: impl FnMut(&[Rx]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65_536];
        loop {
            if done(&self.inbox) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let _ = self
                .sock
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))));
            let Ok((n, _from)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            self.receive(&buf[..n]);
        }
    }

    /// One received datagram: opened (when protected), acknowledged
    /// (auto-ACK) and appended to the inbox.
    fn receive(&mut self, bytes: &[u8]) {
        let rx = match self.keys.as_mut() {
            Some(k) => match k.open(bytes) {
                Some(rx) => rx,
                None => return,
            },
            None => {
                let Ok((repr, payload)) = wire::parse(bytes) else {
                    return;
                };
                Rx {
                    repr,
                    payload: payload.to_vec(),
                }
            }
        };
        if self.auto_ack && rx.repr.body.packet_type().is_reliable() {
            self.receive_reliable(&rx);
        }
        self.inbox.push(rx);
    }

    /// Keys the connection from the CONNECT `connect` we sent and the
    /// target's ACCEPT, then opens the protected packets that arrived
    /// before it was taken.
    pub fn key_from_accept(&mut self, connect: &ConnectRepr, accept: &ConnectRepr) {
        let Some(k) = self.keys.as_mut() else {
            return;
        };
        k.on_accept(connect, accept);
        for bytes in k.take_held() {
            self.receive(&bytes);
        }
    }

    fn receive_reliable(&mut self, rx: &Rx) {
        let psn = rx.repr.header.psn;
        if self.withhold == Some(psn) && !rx.repr.header.flags.contains(Flags::RETRANSMISSION) {
            return;
        }
        if psn.wrapping_sub(self.rx_cum) < 1 << 31 {
            self.rx_above.insert(psn);
            while self.rx_above.remove(&self.rx_cum) {
                self.rx_cum = self.rx_cum.wrapping_add(1);
            }
        }
        let _ = self.send_ack(&rx.repr.header);
    }

    /// Acknowledges their direction: cumulative and SACK as we have it.
    pub fn send_ack(&self, echo: &Header) -> Result<(), Fail> {
        let mut sack = SackBits::default();
        for &p in &self.rx_above {
            let i = p.wrapping_sub(self.rx_cum).wrapping_sub(1) as usize;
            if i < 256 {
                sack.set(i);
            }
        }
        self.send_ack_with(echo, self.rx_cum, sack)
    }

    /// Sends an ACK with the given cumulative PSN and SACK bits.
    pub fn send_ack_with(
        &self,
        echo: &Header,
        cumulative: u32,
        sack: SackBits,
    ) -> Result<(), Fail> {
        let repr = Repr {
            header: self.header(self.next_psn, Flags::NONE),
            body: Body::Ack(AckRepr {
                cumulative,
                echo_psn: echo.psn,
                echo_timestamp: echo.timestamp,
                echo_path: echo.path,
                path_rx_count: 0,
                path_ce_count: 0,
                rate_hint_mbps: 0,
                sack_offset: 0,
                sack,
            }),
            payload_len: 0,
        };
        self.send(&repr, &[])
    }

    /// The next PSN expected from the target (everything before it was
    /// received).
    pub fn expected_psn(&self) -> u32 {
        self.rx_cum
    }

    /// Removes and returns the inbox.
    pub fn take(&mut self) -> Vec<Rx> {
        std::mem::take(&mut self.inbox)
    }

    /// The CONNECT we send.
    pub fn connect_repr(&self, mtu: u16, paths: u16, window: u32) -> Repr {
        Repr {
            header: Header {
                flags: Flags::NONE,
                dst_conn: 0,
                token: 0,
                // Spec 3.2.4: a CONNECT carries its Initial PSN.
                psn: self.next_psn,
                path: 0,
                timestamp: self.timestamp(),
            },
            body: Body::Connect(ConnectRepr {
                src_conn: self.my_id,
                src_token: self.my_token,
                mtu,
                max_paths: paths,
                window,
                initial_psn: self.next_psn,
                reply_port: self.local_port(),
                timer_profile: TimerProfile::DataCenter,
                suite: if self.keys.is_some() {
                    CipherSuite::Aes256Gcm
                } else {
                    CipherSuite::None
                },
                key_id: self.keys.as_ref().map_or(0, |k| k.key_id),
                cookie: self.cookie,
            }),
            payload_len: 0,
        }
    }

    /// The cookie of a RETRY in `rx` addressed with our CONNECT's id and
    /// token.
    pub fn retry_in(&self, rx: &[Rx]) -> Option<[u8; COOKIE_LEN]> {
        rx.iter().find_map(|r| match r.repr.body {
            Body::Retry(x)
                if r.repr.header.dst_conn == self.my_id && r.repr.header.token == self.my_token =>
            {
                Some(x.cookie)
            }
            _ => None,
        })
    }

    /// Sends CONNECT and waits for the ACCEPT (without confirming). A
    /// RETRY is answered at once with the CONNECT carrying its cookie, as
    /// an initiator does (spec 4.2); one RETRY per handshake.
    pub fn connect_only(&mut self, mtu: u16, paths: u16, window: u32) -> Result<ConnectRepr, Fail> {
        let mut accepted = false;
        for _ in 0..6 {
            let repr = self.connect_repr(mtu, paths, window);
            self.send(&repr, &[])?;
            let took_cookie = self.cookie != [0; COOKIE_LEN];
            let (id, token) = (self.my_id, self.my_token);
            let got = self.pump(Duration::from_millis(300), |rx| {
                rx.iter().any(|r| {
                    matches!(r.repr.body, Body::Accept(_))
                        || (!took_cookie
                            && matches!(r.repr.body, Body::Retry(_))
                            && r.repr.header.dst_conn == id
                            && r.repr.header.token == token)
                })
            });
            if self
                .inbox
                .iter()
                .any(|r| matches!(r.repr.body, Body::Accept(_)))
            {
                accepted = true;
                break;
            }
            if got && !took_cookie {
                if let Some(cookie) = self.retry_in(&self.inbox) {
                    self.cookie = cookie;
                    self.inbox
                        .retain(|r| !matches!(r.repr.body, Body::Retry(_)));
                }
            }
        }
        let inbox = self.take();
        if !accepted {
            return Err(if self.cookie == [0; COOKIE_LEN] {
                "neither RETRY nor ACCEPT in answer to CONNECT".into()
            } else {
                "no ACCEPT in answer to the CONNECT with the RETRY's cookie".into()
            });
        }
        let accept = inbox
            .iter()
            .find_map(|r| match r.repr.body {
                Body::Accept(a) => Some((r.repr.header, a)),
                _ => None,
            })
            .ok_or("no ACCEPT in answer to CONNECT")?;
        let (h, a) = accept;
        self.adopt_accept(h, a, mtu, paths, window)?;
        Ok(a)
    }

    /// Takes the ACCEPT `a` (header `h`) of our CONNECT offering `mtu`,
    /// `paths` and `window`: the target's id, token and Initial PSN, and
    /// the keys of a protected offer. Fails if it is not addressed with
    /// our id and token.
    pub fn adopt_accept(
        &mut self,
        h: Header,
        a: ConnectRepr,
        mtu: u16,
        paths: u16,
        window: u32,
    ) -> Result<(), Fail> {
        if h.dst_conn != self.my_id || h.token != self.my_token {
            return Err(format!(
                "ACCEPT addressed to id {:#x} token {:#x}, expected {:#x} {:#x}",
                h.dst_conn, h.token, self.my_id, self.my_token
            ));
        }
        self.their_id = a.src_conn;
        self.their_token = a.src_token;
        self.rx_cum = a.initial_psn;
        self.accept = Some(a);
        self.accept_header = Some(h);
        let repr = self.connect_repr(mtu, paths, window);
        if let Body::Connect(c) = repr.body {
            self.key_from_accept(&c, &a);
        }
        Ok(())
    }

    /// Full handshake: CONNECT, ACCEPT, then a KEEPALIVE to confirm.
    pub fn connect(&mut self) -> Result<ConnectRepr, Fail> {
        self.connect_with(1024, 4, 256)
    }

    /// [`Peer::connect`] offering a window of `window` PSNs.
    pub fn connect_window(&mut self, window: u32) -> Result<ConnectRepr, Fail> {
        self.connect_with(1024, 4, window)
    }

    /// [`Peer::connect`] offering `mtu`, `paths` and `window`.
    pub fn connect_with(&mut self, mtu: u16, paths: u16, window: u32) -> Result<ConnectRepr, Fail> {
        let a = self.connect_only(mtu, paths, window)?;
        self.keepalive()?;
        Ok(a)
    }

    /// Sends a KEEPALIVE.
    pub fn keepalive(&self) -> Result<(), Fail> {
        let repr = Repr {
            header: self.header(self.next_psn, Flags::NONE),
            body: Body::Keepalive,
            payload_len: 0,
        };
        self.send(&repr, &[])
    }

    /// Sends CLOSE (normal) and waits briefly for the reply.
    pub fn close(&mut self) {
        let repr = Repr {
            header: self.header(self.next_psn, Flags::NONE),
            body: Body::Close(CloseRepr {
                reason: CloseReason::Normal,
            }),
            payload_len: 0,
        };
        let _ = self.send(&repr, &[]);
        self.pump(Duration::from_millis(200), |rx| {
            rx.iter().any(|r| matches!(r.repr.body, Body::Close(_)))
        });
        self.take();
    }

    /// Negotiated MTU.
    pub fn mtu(&self) -> usize {
        self.accept.map_or(1024, |a| usize::from(a.mtu))
    }

    /// Takes the next message id.
    pub fn next_message(&mut self) -> u32 {
        let m = self.next_msg;
        self.next_msg = self.next_msg.wrapping_add(1);
        m
    }

    /// Starts our direction again from `psn`, message and receive index 0
    /// (an early initiator whose first flight was not taken, spec 4.2.4).
    pub fn rewind(&mut self, psn: u32) {
        self.next_psn = psn;
        self.next_msg = 0;
        self.next_recv_index = 0;
    }

    /// Takes the next PSN.
    pub fn take_psn(&mut self) -> u32 {
        let p = self.next_psn;
        self.next_psn = self.next_psn.wrapping_add(1);
        p
    }

    /// The packets of a WRITE (or WRITE_IMM with `imm`) of `data` to
    /// `target`, with fresh PSNs, MTU-sized, the last one asking for an ACK.
    pub fn write_packets(
        &mut self,
        target: MemoryTarget,
        data: &[u8],
        imm: Option<u32>,
    ) -> Vec<(Repr, Vec<u8>)> {
        let msg = self.next_message();
        let imm = imm.map(|imm| {
            let recv_index = self.next_recv_index;
            self.next_recv_index = self.next_recv_index.wrapping_add(1);
            WriteImm { imm, recv_index }
        });
        let mtu = self.mtu();
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![&[][..]]
        } else {
            data.chunks(mtu).collect()
        };
        let n = chunks.len();
        let mut out = Vec::new();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let offset = (i * mtu) as u32;
            let flags = if i + 1 == n {
                Flags::ACK_REQUEST
            } else {
                Flags::NONE
            };
            let psn = self.take_psn();
            let repr = Repr {
                header: self.header(psn, flags),
                body: Body::Write(WriteRepr {
                    msg: MessageSpan {
                        id: msg,
                        offset,
                        len: data.len() as u32,
                    },
                    target: MemoryTarget {
                        key: target.key,
                        addr: target.addr + u64::from(offset),
                    },
                    imm,
                }),
                payload_len: chunk.len() as u16,
            };
            out.push((repr, chunk.to_vec()));
        }
        out
    }

    /// A one-packet SEND of `data` (which must fit the MTU).
    pub fn send_packet(&mut self, data: &[u8]) -> (Repr, Vec<u8>) {
        let msg = self.next_message();
        let recv_index = self.next_recv_index;
        self.next_recv_index = self.next_recv_index.wrapping_add(1);
        let psn = self.take_psn();
        let repr = Repr {
            header: self.header(psn, Flags::ACK_REQUEST),
            body: Body::Send(SendRepr {
                msg: MessageSpan {
                    id: msg,
                    offset: 0,
                    len: data.len() as u32,
                },
                recv_index,
                imm: None,
            }),
            payload_len: data.len() as u16,
        };
        (repr, data.to_vec())
    }

    /// A READ_REQUEST for `len` bytes at `source`.
    pub fn read_request(&mut self, source: MemoryTarget, len: u32) -> Repr {
        let msg = self.next_message();
        let psn = self.take_psn();
        Repr {
            header: self.header(psn, Flags::ACK_REQUEST),
            body: Body::ReadRequest(ReadRequestRepr {
                msg_id: msg,
                len,
                source,
                sink: MemoryTarget {
                    key: 0x5151,
                    addr: 0x1000,
                },
            }),
            payload_len: 0,
        }
    }

    /// Waits for an ACK (or NAK) whose cumulative PSN reaches `psn`.
    pub fn wait_acked(&mut self, psn: u32, timeout: Duration) -> Result<(), Fail> {
        let target = psn.wrapping_add(1);
        let ok = self.pump(timeout, |rx| {
            rx.iter().any(|r| match r.repr.body {
                Body::Ack(a) => target.wrapping_sub(a.cumulative) as i32 <= 0,
                _ => false,
            })
        });
        if ok {
            Ok(())
        } else {
            Err(format!("PSN {psn} not acknowledged within {timeout:?}"))
        }
    }

    /// Reads `len` bytes at `source` through a READ_REQUEST; the target's
    /// READ_RESPONSEs are acknowledged as they come.
    pub fn read(&mut self, source: MemoryTarget, len: u32) -> Result<Vec<u8>, Fail> {
        let req = self.read_request(source, len);
        let msg_id = match req.body {
            Body::ReadRequest(r) => r.msg_id,
            _ => 0,
        };
        self.send(&req, &[])?;
        let mut out = vec![0u8; len as usize];
        let mut covered = 0usize;
        let mut seen = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while covered < len as usize || (len == 0 && seen.is_empty()) {
            if Instant::now() > deadline {
                return Err(format!("READ of {len} B: only {covered} B arrived"));
            }
            self.pump(Duration::from_millis(100), |rx| !rx.is_empty());
            for r in self.take() {
                match r.repr.body {
                    Body::ReadResponse(rr) if rr.msg.id == msg_id => {
                        let off = rr.msg.offset as usize;
                        if seen.insert(off) && off + r.payload.len() <= out.len() {
                            out[off..off + r.payload.len()].copy_from_slice(&r.payload);
                            covered += r.payload.len();
                        }
                        if len == 0 {
                            seen.insert(0);
                        }
                    }
                    Body::Nak(n) => {
                        return Err(format!("READ answered with NAK {:?}", n.reason));
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// Opens the connection and asks the serve profile for a region:
    /// announce (SEND) with `seed`, answer (SEND from the target) parsed.
    pub fn open_with_region(&mut self, seed: u64, size: u32) -> Result<RemoteRegion, Fail> {
        self.open_with_region_window(seed, size, 256)
    }

    /// [`Peer::open_with_region`] on a connection offering `window` PSNs.
    pub fn open_with_region_window(
        &mut self,
        seed: u64,
        size: u32,
        window: u32,
    ) -> Result<RemoteRegion, Fail> {
        self.connect_window(window)?;
        let announce = Message::Announce {
            op: Operation::Read,
            seed,
            size,
        };
        self.request_region(&announce)
    }

    /// Connects and `JOIN`s the region `ticket` names: keys for it that
    /// work on this connection (the serve profile gives each connection a
    /// domain of its own).
    pub fn join(&mut self, ticket: u64) -> Result<RemoteRegion, Fail> {
        self.connect()?;
        self.request_region(&Message::Join { ticket })
    }

    /// [`Peer::join`] on a connection offering `mtu` and `window`.
    pub fn join_with(&mut self, ticket: u64, mtu: u16, window: u32) -> Result<RemoteRegion, Fail> {
        self.connect_with(mtu, 4, window)?;
        self.request_region(&Message::Join { ticket })
    }

    /// Sends an `ANNOUNCE` or `JOIN` and waits for the `REGION` answer.
    pub fn request_region(&mut self, request: &Message) -> Result<RemoteRegion, Fail> {
        let request = request.encode();
        let (repr, payload) = self.send_packet(&request);
        self.send(&repr, &payload)?;
        let got = self.pump(Duration::from_secs(2), |rx| {
            rx.iter().any(|r| matches!(r.repr.body, Body::Send(_)))
        });
        if !got {
            return Err("no answer (SEND) to the announcement".into());
        }
        let inbox = self.take();
        let answer = inbox
            .iter()
            .find(|r| matches!(r.repr.body, Body::Send(_)))
            .ok_or("no SEND")?;
        match Message::decode(&answer.payload) {
            Some(Message::Region {
                status: 0,
                key,
                addr,
                len,
                ro_key,
                ro_addr,
                ticket,
                ..
            }) => Ok(RemoteRegion {
                key,
                addr,
                len,
                ro_key,
                ro_addr,
                ticket,
            }),
            other => Err(format!(
                "unexpected answer to the region request: {other:?}"
            )),
        }
    }

    /// Whether any NAK arrived, and the first one.
    pub fn first_nak(rx: &[Rx]) -> Option<NakRepr> {
        rx.iter().find_map(|r| match r.repr.body {
            Body::Nak(n) => Some(n),
            _ => None,
        })
    }
}
