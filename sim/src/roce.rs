//! [`SimTransport`] for the RoCEv2 baseline (`roce_baseline::RoceEndpoint`),
//! unmodified. Queue pairs are wired together out of band as RDMA-CM
//! would: [`SimTransport::connect_pair`] creates one on each end with the
//! other's QP number and PSNs. Packets carry a real ICRC, computed over the
//! IPv4/UDP headers the frame would have and checked on receipt, so a
//! corrupted or misdelivered packet is dropped as a NIC would drop it.

use std::cell::Cell;

use metaroce_core::api::{Completion, ConnHandle, Memory, PeerAddr, Region, RxMeta, WorkRequest};
use metaroce_core::wire::encap::IpPair;
use metaroce_core::Instant;
use roce_baseline::psn;
use roce_baseline::wire::aeth::{self, Syndrome};
use roce_baseline::wire::bth::{self, Opcode};
use roce_baseline::wire::icrc;
use roce_baseline::wire::BTH_LEN;
use roce_baseline::{finish, ip_udp_header, transport_len, Config, QpSetup, RoceEndpoint};
use smoltcp::wire::{IpAddress, Ipv4Address};

use crate::memory::Arena;
use crate::rng::SimRng;
use crate::transport::{SendProgress, SimTransport, TransportCounters, TransportError, TxMeta};

/// Queue pairs per simulated host (as for MetaRoCE: a 64-host all-to-all).
pub const QUEUE_PAIRS: usize = 128;

/// A RoCEv2 endpoint on a simulated host with up to `Q` queue pairs.
#[derive(Debug)]
pub struct Roce<const Q: usize = QUEUE_PAIRS> {
    endpoint: Box<RoceEndpoint<Q>>,
    ip: Ipv4Address,
    rng: SimRng,
    next_qpn: u32,
    qps: Vec<ConnHandle>,
    header: Vec<u8>,
    payload: Vec<u8>,
    /// Received packets whose ICRC did not match.
    pub bad_icrc: u64,
    /// Packets that could not be built (an address that is not IPv4).
    pub unsendable: u64,
    /// Each queue pair's progress, read off its packets once
    /// [`SimTransport::track_send_progress`] asked for it (each packet is
    /// then matched against every queue pair's).
    progress: Vec<WireProgress>,
    track_progress: bool,
    /// The endpoint's `poll_timeout` (a look at every queue pair) as of
    /// its last change; `None` once it changed. The simulator asks before
    /// and after every service of the host, mostly with nothing changed
    /// in between.
    timeout: Cell<Option<Option<Instant>>>,
}

/// A queue pair's sending progress as its packets show it: the highest
/// request PSN it sent and the PSN its peer acknowledged through (an ACK's
/// PSN; a NAK's PSN less one). Read off the wire so that the baseline
/// stays untouched; WRITE and SEND traffic only (READ responses are not
/// followed).
#[derive(Debug, Clone, Copy)]
struct WireProgress {
    local_qpn: u32,
    remote_qpn: u32,
    highest_sent: u32,
    acked_through: u32,
    packets_acked: u64,
    max_in_flight: u64,
}

impl WireProgress {
    fn new(local_qpn: u32, remote_qpn: u32, send_psn: u32) -> Self {
        let before = psn::sub(send_psn, 1);
        WireProgress {
            local_qpn,
            remote_qpn,
            highest_sent: before,
            acked_through: before,
            packets_acked: 0,
            max_in_flight: 0,
        }
    }

    fn in_flight(&self) -> u64 {
        psn::diff(self.highest_sent, self.acked_through).max(0) as u64
    }
}

/// Whether `op` is a request that carries a PSN of its own (WRITE, SEND).
fn is_request(op: Opcode) -> bool {
    u8::from(op) <= u8::from(Opcode::WriteOnlyImm)
}

impl<const Q: usize> Roce<Q> {
    /// An endpoint at `addr`; PSNs are drawn from `seed`.
    pub fn new(config: Config, addr: PeerAddr, seed: u64) -> Self {
        let ip = match addr.ip {
            IpAddress::Ipv4(v4) => v4,
            _ => Ipv4Address::UNSPECIFIED,
        };
        Roce {
            endpoint: Box::new(RoceEndpoint::new(config)),
            ip,
            rng: SimRng::new(seed),
            // QP numbers 0 and 1 are the management QPs.
            next_qpn: 0x100,
            qps: Vec::new(),
            header: vec![0; roce_baseline::MAX_HEADER_LEN],
            payload: Vec::new(),
            bad_icrc: 0,
            unsendable: 0,
            progress: Vec::new(),
            track_progress: false,
            timeout: Cell::new(None),
        }
    }

    /// The baseline, for inspection.
    pub fn endpoint(&self) -> &RoceEndpoint<Q> {
        &self.endpoint
    }

    fn take_qpn(&mut self) -> u32 {
        let q = self.next_qpn;
        self.next_qpn += 1;
        q
    }

    /// Notes a request this endpoint sends (`header` starts with its BTH).
    fn note_sent(&mut self, header: &[u8]) {
        let Ok(b) = bth::Packet::new_checked(header) else {
            return;
        };
        if !is_request(b.opcode()) {
            return;
        }
        let (qpn, sent) = (b.dest_qp(), b.psn());
        if let Some(p) = self.progress.iter_mut().find(|p| p.remote_qpn == qpn) {
            if psn::lt(p.highest_sent, sent) {
                p.highest_sent = sent;
            }
            p.max_in_flight = p.max_in_flight.max(p.in_flight());
        }
    }

    /// Notes an ACK or NAK this endpoint received.
    fn note_received(&mut self, packet: &[u8]) {
        let Ok(b) = bth::Packet::new_checked(packet) else {
            return;
        };
        if b.opcode() != Opcode::Acknowledge {
            return;
        }
        let Some(syndrome) = packet
            .get(BTH_LEN..)
            .and_then(|rest| aeth::Packet::new_checked(rest).ok())
            .and_then(|a| Syndrome::from_byte(a.syndrome_byte()).ok())
        else {
            return;
        };
        let through = match syndrome {
            Syndrome::Ack { .. } => b.psn(),
            // A NAK names the PSN expected next: everything before arrived.
            _ => psn::sub(b.psn(), 1),
        };
        let qpn = b.dest_qp();
        if let Some(p) = self.progress.iter_mut().find(|p| p.local_qpn == qpn) {
            if psn::lt(p.acked_through, through) && psn::le(through, p.highest_sent) {
                p.packets_acked += psn::diff(through, p.acked_through) as u64;
                p.acked_through = through;
            }
        }
    }

    fn ip_pair(&self, peer: IpAddress) -> Option<IpPair> {
        match peer {
            IpAddress::Ipv4(dst) => Some(IpPair::V4 { src: self.ip, dst }),
            _ => None,
        }
    }
}

fn roce_error(e: roce_baseline::Error) -> TransportError {
    use roce_baseline::Error as E;
    match e {
        E::NoFreeQp => TransportError::Refused("no free queue pair"),
        E::BadQpn => TransportError::Refused("bad QP number"),
        E::BadMtu => TransportError::Refused("bad MTU"),
        E::UnknownQp => TransportError::Refused("unknown queue pair"),
        E::RegionTable => TransportError::Refused("region table"),
        E::UnknownKey => TransportError::Refused("unknown key"),
        E::Post(roce_baseline::PostError::QueueFull) => TransportError::Retry,
        E::Post(_) => TransportError::Refused("post refused"),
    }
}

impl<const Q: usize> SimTransport for Roce<Q> {
    fn name(&self) -> &'static str {
        "RoCEv2"
    }

    fn register_region(&mut self, region: Region) -> Result<u32, TransportError> {
        self.timeout.set(None);
        self.endpoint.register_region(region).map_err(roce_error)
    }

    fn connect_pair(
        _now: Instant,
        a: &mut Self,
        a_addr: PeerAddr,
        b: &mut Self,
        b_addr: PeerAddr,
    ) -> Result<ConnHandle, TransportError> {
        a.timeout.set(None);
        b.timeout.set(None);
        let (qpn_a, qpn_b) = (a.take_qpn(), b.take_qpn());
        let psn_a = (a.rng.next_u64() & 0xff_ffff) as u32;
        let psn_b = (b.rng.next_u64() & 0xff_ffff) as u32;
        let port = roce_baseline::UDP_PORT;
        let to_b = PeerAddr { port, ..b_addr };
        let to_a = PeerAddr { port, ..a_addr };
        let ha = a
            .endpoint
            .create_qp(QpSetup::new(qpn_a, to_b, qpn_b, psn_a, psn_b))
            .map_err(roce_error)?;
        let hb = b
            .endpoint
            .create_qp(QpSetup::new(qpn_b, to_a, qpn_a, psn_b, psn_a))
            .map_err(roce_error)?;
        a.qps.push(ha);
        b.qps.push(hb);
        a.progress.push(WireProgress::new(qpn_a, qpn_b, psn_a));
        b.progress.push(WireProgress::new(qpn_b, qpn_a, psn_b));
        Ok(ha)
    }

    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), TransportError> {
        self.timeout.set(None);
        self.endpoint.post_send(conn, wr).map_err(roce_error)
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        dst_port: u16,
        packet: &[u8],
        mem: &mut Arena,
    ) {
        let ok = match meta.source.ip {
            IpAddress::Ipv4(src) => {
                let ip = IpPair::V4 { src, dst: self.ip };
                ip_udp_header(&ip, meta.source.port, dst_port, packet.len())
                    .is_ok_and(|h| icrc::verify(h.as_bytes(), packet).is_ok())
            }
            _ => false,
        };
        if !ok {
            self.bad_icrc += 1;
            return;
        }
        if self.track_progress {
            self.note_received(packet);
        }
        self.timeout.set(None);
        self.endpoint.handle_packet(now, meta, packet, mem);
    }

    fn handle_timeout(&mut self, now: Instant, _mem: &mut Arena) {
        self.timeout.set(None);
        self.endpoint.handle_timeout(now);
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut Arena,
        out: &mut Vec<u8>,
    ) -> Option<TxMeta> {
        self.timeout.set(None);
        let t = self.endpoint.poll_transmit(now, &mut self.header)?;
        if self.track_progress {
            let header = core::mem::take(&mut self.header);
            self.note_sent(&header[..t.header_len]);
            self.header = header;
        }
        let header = &self.header[..t.header_len];
        let plen = t.payload.map_or(0, |p| p.len as usize);
        // The payload straight from memory when it lies inside the arena;
        // otherwise through `Memory::read`, which counts the stray access
        // and reads zeros.
        let payload = match t.payload.map(|p| mem.get(p.addr, plen)) {
            None => &[][..],
            Some(Some(bytes)) => bytes,
            Some(None) => {
                self.payload.clear();
                self.payload.resize(plen, 0);
                if let Some(p) = t.payload {
                    mem.read(p.addr, &mut self.payload);
                }
                &self.payload[..]
            }
        };
        let total = transport_len(header, plen);
        // Not zeroed first: a build that succeeds writes every byte
        // (headers, payload, pad, ICRC), so the buffer, a recycled
        // packet's, is only cut or grown to `total`. One that fails is
        // redone on zeroes, leaving what it always left.
        out.resize(total, 0);
        let build = |out: &mut [u8]| {
            self.ip_pair(t.peer.ip)
                .and_then(|ip| ip_udp_header(&ip, t.src_port, t.peer.port, total).ok())
                .and_then(|h| finish(out, header, payload, h.as_bytes()).ok())
        };
        let mut built = build(out);
        if built.is_none() {
            out.fill(0);
            built = build(out);
        }
        if built.is_none() {
            // Sent anyway (the engine counted it), with a zero ICRC the
            // receiver drops.
            self.unsendable += 1;
        }
        Some(TxMeta {
            peer: t.peer,
            src_port: t.src_port,
            ecn: t.ecn,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if let Some(kept) = self.timeout.get() {
            return kept;
        }
        let next = self.endpoint.poll_timeout();
        self.timeout.set(Some(next));
        next
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        self.timeout.set(None);
        self.endpoint.poll_completion()
    }

    fn counters(&self) -> TransportCounters {
        let mut c = TransportCounters::default();
        for &h in &self.qps {
            let Some(q) = self.endpoint.counters(h) else {
                continue;
            };
            c += TransportCounters {
                packets_sent: q.packets_sent,
                first_transmissions: q.data_packets_sent.saturating_sub(q.retransmitted_packets),
                retransmissions: q.retransmitted_packets,
                // Go-back-N cannot tell; not counted.
                spurious_retransmissions: 0,
                timeouts: q.timeouts,
                probes: 0,
                naks_sent: q.seq_naks_sent + q.rnr_naks_sent + q.fatal_naks_sent,
                discarded: q.duplicates_received + q.out_of_sequence_dropped + q.stale_responses,
                ce_received: q.ecn_marked_received,
            };
        }
        let e = self.endpoint.endpoint_counters();
        c.discarded += e.malformed + e.unknown_qp + e.wrong_peer + e.bad_pkey + self.bad_icrc;
        c
    }

    fn track_send_progress(&mut self) {
        self.track_progress = true;
    }

    fn send_progress(&self) -> Option<SendProgress> {
        if !self.track_progress {
            return None;
        }
        Some(SendProgress {
            packets_acked: self.progress.iter().map(|p| p.packets_acked).sum(),
            max_in_flight: self
                .progress
                .iter()
                .map(|p| p.max_in_flight)
                .max()
                .unwrap_or(0),
        })
    }
}
