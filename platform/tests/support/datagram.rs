//! A deliberately minimal, **unreliable** transport for bring-up and for
//! testing the engine loop: one UDP datagram per message segment, no
//! acknowledgments, no retransmission, no congestion control. Under any
//! loss its data is incomplete and the workload's integrity check says so.
//! It exists so the platform, the firmware and the fabric harness can be
//! exercised end to end without the MetaRoCE engine; it is not MetaRoCE.
//!
//! Connections are fixed at construction: handle index `i` is `peers[i]`,
//! and a received packet belongs to the peer with its source IP address.
//! One receive queue serves every connection.
//!
//! Packet: 32-byte header (magic `MRDG`, kind, flags, address, key,
//! immediate, payload length, tag), payload, CRC-32 trailer over both.

use heapless::{Deque, Vec};
use metaroce_core::api::{
    Completion, ConnHandle, Memory, Op, Opcode, PayloadRef, PeerAddr, RecvRequest, Region, RxMeta,
    Status, Transmit, WorkRequest,
};
use metaroce_core::wire::encap::ecn;
use metaroce_core::wire::{packet::crc32, CrcVerdict, EncapRepr, CRC_LEN};
use metaroce_core::Instant;

use metaroce_platform::transport::{opcode_of, PostError, Transport};

/// Header magic.
pub const MAGIC: [u8; 4] = *b"MRDG";
/// Header length.
pub const HEADER_LEN: usize = 32;
/// Largest payload per datagram (fits a 1500-byte MTU with every header).
pub const MAX_SEGMENT: u32 = 1024;

const KIND_WRITE: u8 = 1;
const KIND_WRITE_IMM: u8 = 2;
const KIND_SEND: u8 = 3;
const KIND_SEND_IMM: u8 = 4;
const KIND_READ_REQUEST: u8 = 5;
const KIND_READ_RESPONSE: u8 = 6;
const FLAG_FIRST: u8 = 1;
const FLAG_LAST: u8 = 2;

/// Why the datagram transport refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DatagramError {
    /// A queue is full; try again later.
    Busy,
    /// The local buffer is not inside a registered region.
    BadLocalBuffer,
    /// The region table is full.
    TooManyRegions,
    /// No such connection.
    UnknownConn,
}

impl PostError for DatagramError {
    fn is_retryable(&self) -> bool {
        *self == DatagramError::Busy
    }

    fn status(&self) -> Status {
        match self {
            DatagramError::UnknownConn => Status::Flushed,
            _ => Status::LocalProtection,
        }
    }
}

/// Counters of the datagram transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DatagramStats {
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub rx_bytes_placed: u64,
    /// Malformed, bad CRC, unknown peer, bad key or bounds.
    pub rx_dropped: u64,
    /// SEND or WRITE_IMM with no receive posted.
    pub rx_no_receive: u64,
}

#[derive(Debug, Clone, Copy)]
struct Outgoing {
    conn: ConnHandle,
    wr: WorkRequest,
    offset: u32,
}

#[derive(Debug, Clone, Copy)]
struct PendingRead {
    conn: ConnHandle,
    wr: WorkRequest,
    tag: u32,
    received: u32,
}

#[derive(Debug, Clone, Copy)]
struct ReadResponse {
    conn: ConnHandle,
    source: u64,
    len: u32,
    tag: u32,
    offset: u32,
}

#[derive(Debug, Clone, Copy)]
struct Receiving {
    rr: RecvRequest,
    placed: u32,
}

/// The bring-up transport; `P` peers, queues of 32.
#[derive(Debug)]
pub struct DatagramTransport<const P: usize> {
    port: u16,
    peers: Vec<PeerAddr, P>,
    regions: Vec<Region, 16>,
    send_queue: Deque<Outgoing, 32>,
    reads: Vec<PendingRead, 16>,
    responses: Deque<ReadResponse, 16>,
    recv_queue: Deque<(ConnHandle, RecvRequest), 32>,
    receiving: Option<Receiving>,
    completions: Deque<Completion, 64>,
    next_tag: u32,
    stats: DatagramStats,
}

impl<const P: usize> DatagramTransport<P> {
    /// An endpoint on UDP `port` with connection `i` to `peers[i]` (extra
    /// peers beyond `P` are ignored).
    pub fn new(port: u16, peers: &[PeerAddr]) -> Self {
        let mut list = Vec::new();
        for p in peers.iter().take(P) {
            let _ = list.push(*p);
        }
        DatagramTransport {
            port,
            peers: list,
            regions: Vec::new(),
            send_queue: Deque::new(),
            reads: Vec::new(),
            responses: Deque::new(),
            recv_queue: Deque::new(),
            receiving: None,
            completions: Deque::new(),
            next_tag: 1,
            stats: DatagramStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> DatagramStats {
        self.stats
    }

    fn region(&self, key: u32) -> Option<&Region> {
        let index = usize::try_from(key.checked_sub(1)?).ok()?;
        self.regions.get(index)
    }

    fn local_ok(&self, key: u32, addr: u64, len: u32) -> bool {
        self.region(key)
            .is_some_and(|r| r.contains(addr, u64::from(len)))
    }

    fn remote_ok(&self, key: u32, addr: u64, len: u32, access: metaroce_core::api::Access) -> bool {
        self.region(key)
            .is_some_and(|r| r.access.allows(access) && r.contains(addr, u64::from(len)))
    }

    fn complete(
        &mut self,
        conn: ConnHandle,
        wr_id: u64,
        opcode: Opcode,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        let _ = self.completions.push_back(Completion {
            conn,
            wr_id,
            opcode,
            status: Status::Success,
            byte_len,
            imm,
        });
    }

    fn conn_of(&self, source: &PeerAddr) -> Option<ConnHandle> {
        let i = self.peers.iter().position(|p| p.ip == source.ip)?;
        Some(ConnHandle {
            index: u32::try_from(i).ok()?,
            generation: 0,
        })
    }

    fn peer(&self, conn: ConnHandle) -> Option<PeerAddr> {
        self.peers.get(conn.index as usize).copied()
    }

    /// Consumes the next receive for `conn`'s SEND or WRITE_IMM.
    fn take_receive(&mut self) -> Option<RecvRequest> {
        self.recv_queue.pop_front().map(|(_, rr)| rr)
    }

    fn handle(
        &mut self,
        conn: ConnHandle,
        header: &[u8],
        payload: &[u8],
        mem: &mut impl Memory,
    ) -> Option<()> {
        let kind = header[4];
        let flags = header[5];
        let addr = u64::from_be_bytes(header[8..16].try_into().ok()?);
        let key = u32::from_be_bytes(header[16..20].try_into().ok()?);
        let imm = u32::from_be_bytes(header[20..24].try_into().ok()?);
        let len = u32::from_be_bytes(header[24..28].try_into().ok()?);
        let tag = u32::from_be_bytes(header[28..32].try_into().ok()?);
        let plen = u32::try_from(payload.len()).ok()?;
        match kind {
            KIND_WRITE | KIND_WRITE_IMM => {
                if !self.remote_ok(key, addr, plen, metaroce_core::api::Access::REMOTE_WRITE) {
                    return None;
                }
                mem.write(addr, payload);
                self.stats.rx_bytes_placed += u64::from(plen);
                if kind == KIND_WRITE_IMM && flags & FLAG_LAST != 0 {
                    let Some(rr) = self.take_receive() else {
                        self.stats.rx_no_receive += 1;
                        return Some(());
                    };
                    // `tag` carries the message length.
                    self.complete(conn, rr.id, Opcode::RecvWriteImm, tag, Some(imm));
                }
            }
            KIND_SEND | KIND_SEND_IMM => {
                if flags & FLAG_FIRST != 0 {
                    self.receiving = self.take_receive().map(|rr| Receiving { rr, placed: 0 });
                    if self.receiving.is_none() {
                        self.stats.rx_no_receive += 1;
                    }
                }
                let recv = self.receiving.as_mut()?;
                let end = addr.checked_add(u64::from(plen))?;
                if end > u64::from(recv.rr.local.len) {
                    return None;
                }
                mem.write(recv.rr.local.addr + addr, payload);
                recv.placed += plen;
                self.stats.rx_bytes_placed += u64::from(plen);
                if flags & FLAG_LAST != 0 {
                    let done = self.receiving.take()?;
                    let imm = (kind == KIND_SEND_IMM).then_some(imm);
                    self.complete(conn, done.rr.id, Opcode::Recv, done.placed, imm);
                }
            }
            KIND_READ_REQUEST => {
                if !self.remote_ok(key, addr, len, metaroce_core::api::Access::REMOTE_READ) {
                    return None;
                }
                self.responses
                    .push_back(ReadResponse {
                        conn,
                        source: addr,
                        len,
                        tag,
                        offset: 0,
                    })
                    .ok()?;
            }
            KIND_READ_RESPONSE => {
                let i = self
                    .reads
                    .iter()
                    .position(|r| r.tag == tag && r.conn == conn)?;
                let read = self.reads[i];
                if addr.checked_add(u64::from(plen))? > u64::from(read.wr.local.len) {
                    return None;
                }
                mem.write(read.wr.local.addr + addr, payload);
                self.stats.rx_bytes_placed += u64::from(plen);
                self.reads[i].received += plen;
                if self.reads[i].received >= read.wr.local.len {
                    self.reads.swap_remove(i);
                    self.complete(conn, read.wr.id, Opcode::Read, read.wr.local.len, None);
                }
            }
            _ => return None,
        }
        Some(())
    }
}

#[allow(clippy::too_many_arguments)]
fn write_header(
    buf: &mut [u8],
    kind: u8,
    flags: u8,
    addr: u64,
    key: u32,
    imm: u32,
    len: u32,
    tag: u32,
) {
    buf[..4].copy_from_slice(&MAGIC);
    buf[4] = kind;
    buf[5] = flags;
    buf[6..8].fill(0);
    buf[8..16].copy_from_slice(&addr.to_be_bytes());
    buf[16..20].copy_from_slice(&key.to_be_bytes());
    buf[20..24].copy_from_slice(&imm.to_be_bytes());
    buf[24..28].copy_from_slice(&len.to_be_bytes());
    buf[28..32].copy_from_slice(&tag.to_be_bytes());
}

impl<const P: usize> Transport for DatagramTransport<P> {
    type Error = DatagramError;

    fn register_region(&mut self, region: Region) -> Result<u32, DatagramError> {
        self.regions
            .push(region)
            .map_err(|_| DatagramError::TooManyRegions)?;
        u32::try_from(self.regions.len()).map_err(|_| DatagramError::TooManyRegions)
    }

    /// Regions of this stand-in are never deregistered: refused.
    fn deregister_region(&mut self, _key: u32) -> Result<(), DatagramError> {
        Err(DatagramError::BadLocalBuffer)
    }

    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), DatagramError> {
        if self.peer(conn).is_none() {
            return Err(DatagramError::UnknownConn);
        }
        if !self.local_ok(wr.local.key, wr.local.addr, wr.local.len) {
            return Err(DatagramError::BadLocalBuffer);
        }
        self.send_queue
            .push_back(Outgoing {
                conn,
                wr,
                offset: 0,
            })
            .map_err(|_| DatagramError::Busy)
    }

    fn post_recv(&mut self, conn: ConnHandle, rr: RecvRequest) -> Result<(), DatagramError> {
        if self.peer(conn).is_none() {
            return Err(DatagramError::UnknownConn);
        }
        if !self.local_ok(rr.local.key, rr.local.addr, rr.local.len) {
            return Err(DatagramError::BadLocalBuffer);
        }
        self.recv_queue
            .push_back((conn, rr))
            .map_err(|_| DatagramError::Busy)
    }

    fn handle_packet(
        &mut self,
        _now: Instant,
        meta: &RxMeta,
        packet: &[u8],
        crc: CrcVerdict,
        mem: &mut impl Memory,
    ) {
        self.stats.rx_packets += 1;
        let ok = (|| {
            let body_len = packet.len().checked_sub(CRC_LEN)?;
            if body_len < HEADER_LEN || packet[..4] != MAGIC {
                return None;
            }
            let (body, trailer) = packet.split_at(body_len);
            let crc_ok = match crc {
                CrcVerdict::NotChecked => crc32(&[body]).to_be_bytes() == trailer,
                CrcVerdict::Good => true,
                CrcVerdict::Bad => false,
            };
            if !crc_ok {
                return None;
            }
            let conn = self.conn_of(&meta.source)?;
            let (header, payload) = body.split_at(HEADER_LEN);
            let declared =
                usize::try_from(u32::from_be_bytes(header[24..28].try_into().ok()?)).ok()?;
            if header[4] != KIND_READ_REQUEST && declared != payload.len() {
                return None;
            }
            self.handle(conn, header, payload, mem)
        })();
        if ok.is_none() {
            self.stats.rx_dropped += 1;
        }
    }

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_transmit(&mut self, _now: Instant, header_buf: &mut [u8]) -> Option<Transmit> {
        if header_buf.len() < HEADER_LEN {
            return None;
        }
        let (conn, payload) = if let Some(resp) = self.responses.front_mut() {
            let chunk = (resp.len - resp.offset).min(MAX_SEGMENT);
            let last = resp.offset + chunk >= resp.len;
            write_header(
                header_buf,
                KIND_READ_RESPONSE,
                if last { FLAG_LAST } else { 0 },
                u64::from(resp.offset),
                0,
                0,
                chunk,
                resp.tag,
            );
            let payload = PayloadRef {
                addr: resp.source + u64::from(resp.offset),
                len: chunk,
            };
            let conn = resp.conn;
            resp.offset += chunk;
            if last {
                self.responses.pop_front();
            }
            (conn, Some(payload))
        } else {
            let out = self.send_queue.front_mut()?;
            let (conn, wr) = (out.conn, out.wr);
            if let Op::Read { remote } = wr.op {
                if self.reads.is_full() {
                    return None;
                }
                let tag = self.next_tag;
                self.next_tag = self.next_tag.wrapping_add(1).max(1);
                write_header(
                    header_buf,
                    KIND_READ_REQUEST,
                    FLAG_FIRST | FLAG_LAST,
                    remote.addr,
                    remote.key,
                    0,
                    wr.local.len,
                    tag,
                );
                self.send_queue.pop_front();
                let _ = self.reads.push(PendingRead {
                    conn,
                    wr,
                    tag,
                    received: 0,
                });
                (conn, None)
            } else {
                let chunk = (wr.local.len - out.offset).min(MAX_SEGMENT);
                let first = out.offset == 0;
                let last = out.offset + chunk >= wr.local.len;
                let flags = if first { FLAG_FIRST } else { 0 } | if last { FLAG_LAST } else { 0 };
                let offset = u64::from(out.offset);
                let (kind, addr, key, imm) = match wr.op {
                    Op::Write { remote } => (KIND_WRITE, remote.addr + offset, remote.key, 0),
                    Op::WriteImm { remote, imm } => {
                        (KIND_WRITE_IMM, remote.addr + offset, remote.key, imm)
                    }
                    Op::Send => (KIND_SEND, offset, 0, 0),
                    Op::SendImm { imm } => (KIND_SEND_IMM, offset, 0, imm),
                    Op::Read { .. } => return None,
                };
                write_header(header_buf, kind, flags, addr, key, imm, chunk, wr.local.len);
                let payload = PayloadRef {
                    addr: wr.local.addr + offset,
                    len: chunk,
                };
                out.offset += chunk;
                if last {
                    self.send_queue.pop_front();
                    self.complete(conn, wr.id, opcode_of(&wr.op), wr.local.len, None);
                }
                (conn, Some(payload))
            }
        };
        let peer = self.peer(conn)?;
        self.stats.tx_packets += 1;
        Some(Transmit {
            peer: PeerAddr {
                ip: peer.ip,
                port: peer.port,
            },
            // Spread over 16 source ports, as multipath entropy would.
            src_port: 49152 + (self.stats.tx_packets % 16) as u16,
            ecn: ecn::ECT0,
            header_len: HEADER_LEN,
            payload: payload.filter(|p| p.len > 0),
            seal: None,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    fn udp_port(&self) -> u16 {
        self.port
    }

    fn finish_packet(&self, _tx: &Transmit, _encap: Option<&EncapRepr>, packet: &mut [u8]) {
        let Some(body_len) = packet.len().checked_sub(CRC_LEN) else {
            return;
        };
        let crc = crc32(&[&packet[..body_len]]);
        packet[body_len..].copy_from_slice(&crc.to_be_bytes());
    }

    fn finish_packet_without_trailer(
        &self,
        _tx: &Transmit,
        _encap: Option<&EncapRepr>,
        packet: &mut [u8],
    ) {
        // The trailer is all there is to finish.
        if let Some(body_len) = packet.len().checked_sub(CRC_LEN) {
            packet[body_len..].fill(0);
        }
    }
}
