//! The engine loop: one function, [`Engine::poll`], that moves everything
//! between a frame device, a transport endpoint, DMA and the host
//! interface. The same code runs on the DPU, under QEMU and on a host.
//!
//! One poll, in order, each step bounded by [`Budget`]:
//! 1. **Admin, receive and send queues**: registrations, receive buffers and
//!    work requests from the host rings, posted to the transport. First, so
//!    that whatever the host posted before this poll precedes the packets
//!    it handles (a receive posted before a SEND arrived is there to take
//!    it, as on a NIC). The rings are shared by every connection, so a
//!    request whose connection's queue is full is parked aside (bounded,
//!    in order per connection) rather than holding up the others.
//! 2. **RX**: frames from the device ring. Ethernet/IP/UDP is parsed with
//!    `metaroce_core::wire::encap::parse_frame` (CE mark and the UDP source
//!    port, the sender's path entropy, go into [`RxMeta`]); transport
//!    packets go to [`Transport::handle_packet`] with a [`DmaMemory`] that
//!    places payload by DMA, and with the device's verdict on their CRC
//!    trailer ([`FrameDevice::receive_with_verdict`]); ARP and ICMP echo
//!    are answered by [`crate::net`].
//! 3. **Timers**: [`Transport::handle_timeout`] once its deadline passed;
//!    then **entropy**: when the transport's policy says fresh entropy is
//!    due ([`Transport::reseed_due`], spec 5.1.6), 32 bytes from the
//!    platform's source ([`Engine::set_entropy_source`]) go to
//!    [`Transport::reseed`]. The same step on every platform; only the
//!    source differs.
//! 4. **Completions** into the completion ring, then its doorbell.
//! 5. **TX**: [`Transport::poll_transmit`] until the device is full; the
//!    headers are wrapped in Ethernet/IP/UDP (`EncapRepr::emit`) directly in
//!    the TX slot, the payload is gathered from host memory by DMA behind
//!    them, and [`Transport::finish_packet`] writes the trailer, unless
//!    the device writes it ([`FrameDevice::FILLS_CRC_TRAILER`]: then
//!    [`Transport::finish_packet_without_trailer`]).
//!
//! [`Engine::poll_datagrams`] is the same loop for a [`DatagramLink`], where
//! the kernel's sockets or a simulator own Ethernet, IP and UDP: steps 1, 3
//! and 4 are the same functions, and steps 2 and 5 hand the transport
//! packet and its addressing to the link instead of wrapping it in a frame.
//!
//! The caller owns the clock and the waiting: [`PollOutcome`] says whether
//! anything happened and when the transport next needs time.

use heapless::Deque;
use metaroce_core::api::{Completion, ConnHandle, Opcode, PeerAddr, RxMeta, Transmit};
use metaroce_core::wire::{encap, CrcVerdict, EncapRepr, IpPair};
use metaroce_core::Instant;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, Icmpv4Repr, IpAddress, IpProtocol,
    Ipv4Address, Ipv4Packet,
};

use crate::device::{FrameDevice, FRAME_SLOT_LEN};
use crate::dma::{DmaCopy, DmaMemory};
use crate::doorbell::Doorbell;
use crate::entropy::{EntropySource, EntropyStep};
use crate::host::{AdminCommand, AdminResult, EnginePort, RecvQueueEntry, SendQueueEntry};
use crate::link::{DatagramLink, DatagramTarget};
use crate::net::{self, Control, NeighborCache, NetConfig};
use crate::ring::{RingConsumer, RingProducer};
use crate::transport::{opcode_of, PostError, Transport};

/// Most items each step of one poll handles, so a flood on one side cannot
/// starve the others and one call's work stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Budget {
    pub rx_frames: u32,
    pub tx_frames: u32,
    /// Per host ring (send, receive). Keep it at least the rings' depth:
    /// then everything the host posted before a poll reaches the transport
    /// before that poll's packets (a receive posted for a new connection
    /// is there when the peer's first SEND arrives), which a smaller
    /// budget would break whenever more than it is queued.
    pub work_requests: u32,
    pub completions: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            rx_frames: 32,
            tx_frames: 32,
            work_requests: 256,
            completions: 64,
        }
    }
}

/// Counters of the loop. Transport-level counters (retransmissions, CE
/// echoes, ...) belong to the transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EngineStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames handed to the transport.
    pub rx_transport: u64,
    /// Transport frames that arrived marked Congestion Experienced.
    pub rx_ce: u64,
    pub rx_arp: u64,
    pub rx_icmp: u64,
    /// Frames for another host, protocol or port.
    pub rx_not_ours: u64,
    /// Frames with a malformed Ethernet/IP/UDP/ARP/ICMP layer or checksum.
    pub rx_malformed: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_transport: u64,
    pub arp_replies: u64,
    pub arp_requests: u64,
    pub echo_replies_sent: u64,
    pub echo_replies_received: u64,
    /// Replies (ARP, ICMP) dropped because the TX ring was full.
    pub tx_reply_dropped: u64,
    /// Transport packets dropped: peer MAC unknown (an ARP request went out).
    pub tx_no_neighbor: u64,
    /// Transport packets dropped: IPv6 peer (no neighbour discovery here),
    /// too long for the device, or a header longer than the scratch buffer.
    pub tx_unsendable: u64,
    pub admin_commands: u64,
    pub posted_sends: u64,
    pub posted_recvs: u64,
    /// Posts refused for good (completed with an error status).
    pub post_errors: u64,
    /// Posts refused for now (left on the host queue).
    pub post_retries: u64,
    pub completions: u64,
    /// Polls that stopped writing completions because the ring was full.
    pub cq_full: u64,
    pub timeouts: u64,
    /// DMA copies refused (outside the DMA window).
    pub dma_faults: u64,
    /// Fresh entropy folded into the transport's generator.
    pub reseeds: u64,
    /// Reseeds the source could not serve (retried after
    /// [`crate::entropy::RETRY_NANOS`]; the generator goes on with its key).
    pub entropy_failures: u64,
}

/// What one poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollOutcome {
    /// Something moved: poll again before sleeping.
    pub busy: bool,
    /// The transport's next deadline.
    pub next_timeout: Option<Instant>,
}

/// The last echo reply to [`Engine::send_ping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct EchoResult {
    pub seq_no: u16,
    pub rtt_nanos: u64,
}

/// Why a ping was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PingError {
    /// The peer's MAC is unknown; an ARP request was sent instead.
    Unresolved,
    /// The TX ring is full.
    DeviceBusy,
}

/// Header scratch buffer for `poll_transmit`.
const HEADER_BUF_LEN: usize = 128;
/// ICMP identifier of this node's echo requests.
const PING_IDENT: u16 = 0x4d52;
/// Bytes of echo request payload (send time plus filler).
const PING_DATA_LEN: usize = 32;
/// Least time between two ARP requests.
const ARP_RETRY_NANOS: u64 = 10_000_000;

/// State of the loop for one node: addresses, neighbour cache, scratch
/// buffers and counters. `NEIGHBORS` is the ARP cache size.
#[derive(Debug)]
pub struct Engine<const NEIGHBORS: usize = 16> {
    net: NetConfig,
    neighbors: NeighborCache<NEIGHBORS>,
    budget: Budget,
    dscp: u8,
    stats: EngineStats,
    last_echo: Option<EchoResult>,
    last_arp_request: Option<Instant>,
    header_buf: [u8; HEADER_BUF_LEN],
    reply_buf: [u8; FRAME_SLOT_LEN],
    /// Requests refused for now, held aside (see [`drain_work`]).
    parked_sends: Deque<SendQueueEntry, PARKED>,
    parked_recvs: Deque<RecvQueueEntry, PARKED>,
    /// The transport's deadline as of the end of the last poll.
    deadline: Option<Instant>,
    /// Fresh entropy for the transport (none configured: never
    /// reseeded, as in simulations).
    entropy: EntropyStep,
}

impl<const NEIGHBORS: usize> Engine<NEIGHBORS> {
    pub fn new(net: NetConfig) -> Self {
        Engine {
            net,
            neighbors: NeighborCache::new(),
            budget: Budget::default(),
            dscp: 0,
            stats: EngineStats::default(),
            last_echo: None,
            last_arp_request: None,
            header_buf: [0; HEADER_BUF_LEN],
            reply_buf: [0; FRAME_SLOT_LEN],
            parked_sends: Deque::new(),
            parked_recvs: Deque::new(),
            deadline: None,
            entropy: EntropyStep::NONE,
        }
    }

    /// The platform's entropy source: from now on every poll reseeds the
    /// transport from it when the transport's policy says so (step 3).
    pub fn set_entropy_source(&mut self, source: EntropySource) {
        self.entropy = EntropyStep::new(source);
    }

    /// A loop for [`Engine::poll_datagrams`] only: the link's owner has the
    /// Ethernet and IP addresses, so none are configured here.
    pub fn for_datagrams() -> Self {
        Self::new(NetConfig {
            mac: EthernetAddress([0; 6]),
            ip: Ipv4Address::UNSPECIFIED,
        })
    }

    /// Sets the per-poll budget.
    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = budget;
    }

    /// Sets the DSCP of transport packets (traffic class on the fabric).
    pub fn set_dscp(&mut self, dscp: u8) {
        self.dscp = dscp & 0x3f;
    }

    /// Adds a neighbour that is never evicted (a configured peer), so the
    /// first packets need no ARP round trip.
    pub fn add_static_neighbor(&mut self, ip: Ipv4Address, mac: EthernetAddress) {
        self.neighbors.insert_static(ip, mac);
    }

    /// The MAC address of `ip`, if known.
    pub fn neighbor(&self, ip: Ipv4Address) -> Option<EthernetAddress> {
        self.neighbors.lookup(ip)
    }

    /// This node's addresses.
    pub fn net_config(&self) -> NetConfig {
        self.net
    }

    /// The counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// The last echo reply received, if any.
    pub fn last_echo(&self) -> Option<EchoResult> {
        self.last_echo
    }

    /// Sends an ICMP echo request to `dst` carrying the send time.
    pub fn send_ping<D: FrameDevice>(
        &mut self,
        device: &mut D,
        dst: Ipv4Address,
        seq_no: u16,
        now: Instant,
    ) -> Result<(), PingError> {
        let Some(dst_mac) = self.neighbors.lookup(dst) else {
            self.request_neighbor(device, dst, now);
            return Err(PingError::Unresolved);
        };
        let mut data = [0u8; PING_DATA_LEN];
        data[..8].copy_from_slice(&now.as_nanos().to_be_bytes());
        let repr = Icmpv4Repr::EchoRequest {
            ident: PING_IDENT,
            seq_no,
            data: &data,
        };
        let len = net::emit_icmp(&mut self.reply_buf, &self.net, dst_mac, dst, &repr)
            .ok_or(PingError::DeviceBusy)?;
        self.send_reply(device, len).ok_or(PingError::DeviceBusy)
    }

    /// Sends an ARP request for `ip`, at most once per `ARP_RETRY_NANOS`.
    fn request_neighbor<D: FrameDevice>(&mut self, device: &mut D, ip: Ipv4Address, now: Instant) {
        if self.last_arp_request.is_some_and(|t| {
            now.saturating_duration_since(t).as_nanos() < u128::from(ARP_RETRY_NANOS)
        }) {
            return;
        }
        let repr = net::arp_request(&self.net, ip);
        if let Some(len) = net::emit_arp(&mut self.reply_buf, EthernetAddress::BROADCAST, &repr) {
            if self.send_reply(device, len).is_some() {
                self.stats.arp_requests += 1;
                self.last_arp_request = Some(now);
            }
        }
    }

    /// Sends `reply_buf[..len]`.
    fn send_reply<D: FrameDevice>(&mut self, device: &mut D, len: usize) -> Option<()> {
        let frame = self.reply_buf.get(..len)?;
        let sent = device.transmit(len, |slot| slot.copy_from_slice(frame));
        match sent {
            Some(()) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += len as u64;
            }
            None => self.stats.tx_reply_dropped += 1,
        }
        sent
    }

    /// One bounded round of the loop; see the module documentation.
    pub fn poll<T, D, M, const SQ: usize, const RQ: usize, const CQ: usize, const AQ: usize>(
        &mut self,
        now: Instant,
        transport: &mut T,
        device: &mut D,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
        dma: &mut M,
    ) -> PollOutcome
    where
        T: Transport,
        D: FrameDevice,
        M: DmaCopy,
    {
        let mut busy = self.take_host_work(transport, port);
        busy |= self.receive(now, transport, device, dma);
        busy |= self.timers_and_completions(now, transport, port);
        busy |= self.transmit(now, transport, device, dma);
        self.outcome(busy, transport)
    }

    /// One bounded round of the loop over a [`DatagramLink`]: the steps of
    /// [`Engine::poll`], with the link carrying transport packets instead of
    /// frames (no Ethernet, IP, ARP or ICMP here: the link's owner has them).
    pub fn poll_datagrams<
        T,
        L,
        M,
        const SQ: usize,
        const RQ: usize,
        const CQ: usize,
        const AQ: usize,
    >(
        &mut self,
        now: Instant,
        transport: &mut T,
        link: &mut L,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
        dma: &mut M,
    ) -> PollOutcome
    where
        T: Transport,
        L: DatagramLink,
        M: DmaCopy,
    {
        let mut busy = self.take_host_work(transport, port);
        busy |= self.receive_datagrams(now, transport, link, dma);
        busy |= self.timers_and_completions(now, transport, port);
        busy |= self.transmit_datagrams(now, transport, link, dma);
        self.outcome(busy, transport)
    }

    /// The transport's next deadline, asked once per poll: it is both what
    /// the caller waits for and what the next poll's timer step checks.
    fn outcome<T: Transport>(&mut self, busy: bool, transport: &T) -> PollOutcome {
        let next_timeout = transport.poll_timeout();
        self.deadline = next_timeout;
        PollOutcome { busy, next_timeout }
    }

    /// Steps 3 and 4, shared by both kinds of link.
    fn timers_and_completions<
        T: Transport,
        const SQ: usize,
        const RQ: usize,
        const CQ: usize,
        const AQ: usize,
    >(
        &mut self,
        now: Instant,
        transport: &mut T,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
    ) -> bool {
        let mut busy = false;
        if self.deadline.is_some_and(|t| t <= now) {
            transport.handle_timeout(now);
            self.stats.timeouts += 1;
            busy = true;
        }
        self.entropy.refresh(now, transport, &mut self.stats);
        busy |= self.write_completions(transport, port);
        busy
    }

    /// Step 2 over a datagram link.
    fn receive_datagrams<T: Transport, L: DatagramLink, M: DmaCopy>(
        &mut self,
        now: Instant,
        transport: &mut T,
        link: &mut L,
        dma: &mut M,
    ) -> bool {
        let mut any = false;
        for _ in 0..self.budget.rx_frames {
            let Some(()) = link.receive(|meta, packet| {
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += packet.len() as u64;
                self.stats.rx_transport += 1;
                self.stats.rx_ce += u64::from(meta.ce);
                let mut mem = DmaMemory::new(dma);
                transport.handle_packet(now, meta, packet, CrcVerdict::NotChecked, &mut mem);
                self.stats.dma_faults += u64::from(mem.faults());
            }) else {
                break;
            };
            any = true;
        }
        any
    }

    /// Step 5 over a datagram link.
    fn transmit_datagrams<T: Transport, L: DatagramLink, M: DmaCopy>(
        &mut self,
        now: Instant,
        transport: &mut T,
        link: &mut L,
        dma: &mut M,
    ) -> bool {
        let mut any = false;
        for _ in 0..self.budget.tx_frames {
            if !link.transmit_ready() {
                break;
            }
            let Some(tx) = transport.poll_transmit(now, &mut self.header_buf) else {
                break;
            };
            any = true;
            let header_len = tx.header_len;
            let len = tx.packet_len();
            if header_len > HEADER_BUF_LEN || len > link.max_packet_len() {
                self.stats.tx_unsendable += 1;
                continue;
            }
            let to = DatagramTarget {
                peer: tx.peer,
                src_port: tx.src_port,
                ecn: tx.ecn,
            };
            let header = &self.header_buf[..header_len];
            let mut mem = DmaMemory::new(dma);
            let sent = link.transmit(to, len, |packet| {
                assemble(&tx, header, &mut mem, packet);
                transport.finish_packet(&tx, None, packet);
            });
            self.stats.dma_faults += u64::from(mem.faults());
            match sent {
                Some(()) => {
                    self.stats.tx_frames += 1;
                    self.stats.tx_transport += 1;
                    self.stats.tx_bytes += len as u64;
                }
                // `transmit_ready` said yes, so only a length error is left.
                None => self.stats.tx_unsendable += 1,
            }
        }
        any
    }

    fn receive<T: Transport, D: FrameDevice, M: DmaCopy>(
        &mut self,
        now: Instant,
        transport: &mut T,
        device: &mut D,
        dma: &mut M,
    ) -> bool {
        let mut any = false;
        for _ in 0..self.budget.rx_frames {
            let Some(control) = device.receive_with_verdict(|frame, crc| {
                self.handle_frame(now, frame, crc, transport, dma)
            }) else {
                break;
            };
            any = true;
            match control {
                Control::Reply(len) => {
                    let _ = self.send_reply(device, len);
                }
                Control::EchoReply {
                    ident: PING_IDENT,
                    seq_no,
                    sent,
                } => {
                    self.stats.echo_replies_received += 1;
                    self.last_echo = Some(EchoResult {
                        seq_no,
                        rtt_nanos: sent
                            .map_or(0, |t| now.saturating_duration_since(t).as_nanos() as u64),
                    });
                }
                Control::EchoReply { .. } | Control::Consumed => {}
                Control::NotOurs => self.stats.rx_not_ours += 1,
                Control::Malformed => self.stats.rx_malformed += 1,
            }
        }
        any
    }

    /// Classifies one frame and acts on it. Returns what is left to do
    /// after the RX slot is released (send a reply, count).
    fn handle_frame<T: Transport, M: DmaCopy>(
        &mut self,
        now: Instant,
        frame: &[u8],
        crc: CrcVerdict,
        transport: &mut T,
        dma: &mut M,
    ) -> Control {
        self.stats.rx_frames += 1;
        self.stats.rx_bytes += frame.len() as u64;
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return Control::Malformed;
        };
        let dst = eth.dst_addr();
        if dst != self.net.mac && !dst.is_broadcast() {
            return Control::NotOurs;
        }
        let src_mac = eth.src_addr();
        match eth.ethertype() {
            EthernetProtocol::Arp => {
                self.stats.rx_arp += 1;
                net::handle_arp(
                    &self.net,
                    &mut self.neighbors,
                    eth.payload(),
                    now,
                    &mut self.reply_buf,
                )
            }
            EthernetProtocol::Ipv4 => {
                let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                    return Control::Malformed;
                };
                if ip.dst_addr() != self.net.ip {
                    return Control::NotOurs;
                }
                match ip.next_header() {
                    IpProtocol::Icmp => {
                        self.stats.rx_icmp += 1;
                        let control = net::handle_icmp(
                            &self.net,
                            src_mac,
                            eth.payload(),
                            &mut self.reply_buf,
                        );
                        if let Control::Reply(_) = control {
                            self.stats.echo_replies_sent += 1;
                        }
                        control
                    }
                    IpProtocol::Udp => self.deliver(now, frame, crc, transport, dma),
                    _ => Control::NotOurs,
                }
            }
            EthernetProtocol::Ipv6 => self.deliver(now, frame, crc, transport, dma),
            _ => Control::NotOurs,
        }
    }

    /// Hands a UDP frame for the transport's port to the transport, with
    /// the device's verdict on its CRC trailer.
    fn deliver<T: Transport, M: DmaCopy>(
        &mut self,
        now: Instant,
        frame: &[u8],
        crc: CrcVerdict,
        transport: &mut T,
        dma: &mut M,
    ) -> Control {
        match encap::parse_frame(frame, transport.udp_port()) {
            Ok((info, packet)) => {
                if let IpPair::V4 { src, .. } = info.ip {
                    self.neighbors.learn(src, info.src_mac, now);
                }
                let meta = RxMeta {
                    source: PeerAddr {
                        ip: info.ip.src(),
                        port: info.src_port,
                    },
                    ce: info.is_ce(),
                };
                self.stats.rx_transport += 1;
                self.stats.rx_ce += u64::from(meta.ce);
                let mut mem = DmaMemory::new(dma);
                transport.handle_packet(now, &meta, packet, crc, &mut mem);
                self.stats.dma_faults += u64::from(mem.faults());
                Control::Consumed
            }
            Err(metaroce_core::wire::Error::NotMetaRoce) => Control::NotOurs,
            Err(_) => Control::Malformed,
        }
    }

    /// Drains the admin, receive and send queues into the transport.
    fn take_host_work<
        T: Transport,
        const SQ: usize,
        const RQ: usize,
        const CQ: usize,
        const AQ: usize,
    >(
        &mut self,
        transport: &mut T,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
    ) -> bool {
        // The rings are the truth; doorbells only wake a sleeping engine.
        let _ = port.take_doorbells();
        let mut any = false;
        let mut answered = false;
        while !port.admin_result.is_full() {
            let Some(command) = port.admin.pop() else {
                break;
            };
            self.stats.admin_commands += 1;
            let (tag, result) = match command {
                AdminCommand::RegisterRegion { tag, region } => (
                    tag,
                    transport.register_region(region).map_err(|e| e.status()),
                ),
                AdminCommand::DeregisterRegion { tag, key } => (
                    tag,
                    transport
                        .deregister_region(key)
                        .map(|()| key)
                        .map_err(|e| e.status()),
                ),
            };
            let _ = port.admin_result.push(AdminResult { tag, result });
            answered = true;
        }
        let budget = self.budget.work_requests;
        let recvs = drain_work(
            &mut port.recv,
            &mut self.parked_recvs,
            &mut port.completion,
            budget,
            |e: &RecvQueueEntry| e.conn,
            |e| match transport.post_recv(e.conn, e.rr) {
                Ok(()) => Post::Taken,
                Err(err) if err.is_retryable() => Post::Later,
                Err(err) => Post::Refused(Completion {
                    conn: e.conn,
                    wr_id: e.rr.id,
                    opcode: Opcode::Recv,
                    status: err.status(),
                    byte_len: 0,
                    imm: None,
                }),
            },
        );
        let sends = drain_work(
            &mut port.send,
            &mut self.parked_sends,
            &mut port.completion,
            budget,
            |e: &SendQueueEntry| e.conn,
            |e| match transport.post_send(e.conn, e.wr) {
                Ok(()) => Post::Taken,
                Err(err) if err.is_retryable() => Post::Later,
                Err(err) => Post::Refused(Completion {
                    conn: e.conn,
                    wr_id: e.wr.id,
                    opcode: opcode_of(&e.wr.op),
                    status: err.status(),
                    byte_len: 0,
                    imm: None,
                }),
            },
        );
        self.stats.posted_recvs += u64::from(recvs.taken);
        self.stats.posted_sends += u64::from(sends.taken);
        self.stats.post_retries += u64::from(recvs.later + sends.later);
        self.stats.post_errors += u64::from(recvs.refused + sends.refused);
        answered |= recvs.refused + sends.refused > 0;
        any |= recvs.moved || sends.moved;
        if answered {
            port.bells.completion.ring();
        }
        any || answered
    }

    /// Moves completions from the transport to the completion ring.
    fn write_completions<
        T: Transport,
        const SQ: usize,
        const RQ: usize,
        const CQ: usize,
        const AQ: usize,
    >(
        &mut self,
        transport: &mut T,
        port: &mut EnginePort<'_, SQ, RQ, CQ, AQ>,
    ) -> bool {
        let mut written = 0;
        while written < self.budget.completions {
            if port.completion.is_full() {
                self.stats.cq_full += 1;
                break;
            }
            let Some(completion) = transport.poll_completion() else {
                break;
            };
            // Cannot fail: the ring had a free slot and we are its only producer.
            let _ = port.completion.push(completion);
            written += 1;
        }
        self.stats.completions += u64::from(written);
        if written > 0 {
            port.bells.completion.ring();
        }
        written > 0
    }

    /// Drains `poll_transmit` into the device.
    fn transmit<T: Transport, D: FrameDevice, M: DmaCopy>(
        &mut self,
        now: Instant,
        transport: &mut T,
        device: &mut D,
        dma: &mut M,
    ) -> bool {
        let mut any = false;
        for _ in 0..self.budget.tx_frames {
            if !device.transmit_ready() {
                break;
            }
            let Some(tx) = transport.poll_transmit(now, &mut self.header_buf) else {
                break;
            };
            any = true;
            let IpAddress::Ipv4(dst_ip) = tx.peer.ip else {
                self.stats.tx_unsendable += 1;
                continue;
            };
            let Some(dst_mac) = self.neighbors.lookup(dst_ip) else {
                self.stats.tx_no_neighbor += 1;
                self.request_neighbor(device, dst_ip, now);
                continue;
            };
            let encap = EncapRepr {
                src_mac: self.net.mac,
                dst_mac,
                ip: IpPair::V4 {
                    src: self.net.ip,
                    dst: dst_ip,
                },
                src_port: tx.src_port,
                dst_port: tx.peer.port,
                dscp: self.dscp,
                ecn: tx.ecn,
                hop_limit: 64,
            };
            let header_len = tx.header_len;
            let transport_len = tx.packet_len();
            let frame_len = encap.frame_len(transport_len);
            if header_len > HEADER_BUF_LEN || frame_len > device.max_frame_len() {
                self.stats.tx_unsendable += 1;
                continue;
            }
            let wire_len = net::padded(frame_len);
            let header = &self.header_buf[..header_len];
            let mut mem = DmaMemory::new(dma);
            let sent = device.transmit(wire_len, |slot| {
                slot[frame_len..].fill(0);
                encap.emit(slot, transport_len, |packet| {
                    assemble(&tx, header, &mut mem, packet);
                    // A constant: the branch not taken is not compiled in.
                    if D::FILLS_CRC_TRAILER {
                        transport.finish_packet_without_trailer(&tx, Some(&encap), packet);
                    } else {
                        transport.finish_packet(&tx, Some(&encap), packet);
                    }
                })
            });
            self.stats.dma_faults += u64::from(mem.faults());
            match sent {
                Some(Ok(_)) => {
                    self.stats.tx_frames += 1;
                    self.stats.tx_transport += 1;
                    self.stats.tx_bytes += wire_len as u64;
                }
                // `transmit_ready` said yes, so only a length error is left.
                Some(Err(_)) | None => self.stats.tx_unsendable += 1,
            }
        }
        any
    }
}

/// Builds one transport packet in place, but its trailer: the headers
/// `poll_transmit` wrote, the payload gathered from host memory by DMA
/// behind them. The transport's `finish_packet*` finishes it.
fn assemble<M: DmaCopy>(
    tx: &Transmit,
    header: &[u8],
    mem: &mut DmaMemory<'_, M>,
    packet: &mut [u8],
) {
    let header_len = header.len();
    packet[..header_len].copy_from_slice(header);
    if let Some(payload) = tx.payload {
        let end = header_len + payload.len as usize;
        metaroce_core::api::Memory::read(mem, payload.addr, &mut packet[header_len..end]);
    }
}

/// Requests per queue that the loop holds aside while their connection's
/// own queue is full.
const PARKED: usize = 16;

/// What the transport did with one request.
enum Post {
    Taken,
    /// Refused for now (the connection's queue is full): retry later.
    Later,
    /// Refused for good: this error completion goes to the host.
    Refused(Completion),
}

/// Counts of one [`drain_work`] call.
#[derive(Default)]
struct Drained {
    taken: u32,
    later: u32,
    refused: u32,
    /// Anything left the ring or the parked list.
    moved: bool,
}

/// Connections refused "for now" in this pass, so their later requests
/// queue behind the refused one instead of overtaking it.
struct Blocked(heapless::Vec<ConnHandle, PARKED>);

impl Blocked {
    fn contains(&self, conn: ConnHandle) -> bool {
        self.0.contains(&conn)
    }

    fn insert(&mut self, conn: ConnHandle) {
        if !self.contains(conn) {
            // At most one entry per parked request, and those are bounded
            // by the same capacity.
            let _ = self.0.push(conn);
        }
    }
}

/// Moves requests from a shared host ring into the transport. The host
/// has one send and one receive ring for every connection, so a request
/// the transport refuses for now (its connection's queue is full) must
/// not hold up the other connections behind it: it is parked (bounded),
/// with its connection's later requests behind it in order, and retried
/// first on the next poll. Only when the parked list is full does the
/// ring wait. Each request refused for good becomes an error completion.
fn drain_work<E: Copy, R: RingConsumer<E>, C: RingProducer<Completion>, const N: usize>(
    ring: &mut R,
    parked: &mut Deque<E, N>,
    completions: &mut C,
    budget: u32,
    conn_of: impl Fn(&E) -> ConnHandle,
    mut post: impl FnMut(&E) -> Post,
) -> Drained {
    let mut out = Drained::default();
    let mut blocked = Blocked(heapless::Vec::new());
    let mut attempt = |entry: &E, blocked: &mut Blocked, out: &mut Drained, completions: &mut C| {
        if blocked.contains(conn_of(entry)) {
            return false;
        }
        match post(entry) {
            Post::Taken => out.taken += 1,
            Post::Later => {
                out.later += 1;
                blocked.insert(conn_of(entry));
                return false;
            }
            Post::Refused(c) => {
                out.refused += 1;
                // `completions` had room: checked before every attempt.
                let _ = completions.push(c);
            }
        }
        true
    };
    // Parked requests first: they are older than anything on the ring.
    for _ in 0..parked.len() {
        if completions.is_full() {
            return out;
        }
        let Some(entry) = parked.pop_front() else {
            break;
        };
        if attempt(&entry, &mut blocked, &mut out, completions) {
            out.moved = true;
        } else {
            // Same capacity it was just taken from.
            let _ = parked.push_back(entry);
        }
    }
    let mut budget = budget;
    while budget > 0 && !completions.is_full() {
        let Some(entry) = ring.peek() else { break };
        budget -= 1;
        // Parked list full: the ring waits (back-pressure).
        if !attempt(&entry, &mut blocked, &mut out, completions) && parked.push_back(entry).is_err()
        {
            break;
        }
        let _ = ring.pop();
        out.moved = true;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::SpscRing;
    use core::cell::Cell;
    use std::vec::Vec;

    type Item = (ConnHandle, u32);

    fn conn(index: u32) -> ConnHandle {
        ConnHandle {
            index,
            generation: 1,
        }
    }

    fn error(conn: ConnHandle, id: u32) -> Completion {
        Completion {
            conn,
            wr_id: u64::from(id),
            opcode: Opcode::Send,
            status: metaroce_core::api::Status::LocalProtection,
            byte_len: 0,
            imm: None,
        }
    }

    #[test]
    fn a_full_connection_does_not_hold_up_the_others_and_keeps_its_order() {
        let ring: SpscRing<Item, 16> = SpscRing::new();
        let done: SpscRing<Completion, 16> = SpscRing::new();
        let (mut host, mut work) = ring.split().unwrap();
        let (mut cq, mut cq_host) = done.split().unwrap();
        let (a, b) = (conn(0), conn(1));
        for item in [(a, 1), (a, 2), (b, 3), (a, 4), (b, 5), (b, 6)] {
            host.push(item).unwrap();
        }
        let mut parked: Deque<Item, 4> = Deque::new();
        let a_full = Cell::new(true);
        let taken = core::cell::RefCell::new(Vec::new());
        let post = |e: &Item| {
            if e.0 == a && a_full.get() {
                Post::Later
            } else if e.1 == 6 {
                Post::Refused(error(e.0, e.1))
            } else {
                taken.borrow_mut().push(e.1);
                Post::Taken
            }
        };
        let d = drain_work(&mut work, &mut parked, &mut cq, 32, |e| e.0, post);
        assert_eq!(*taken.borrow(), [3, 5], "b's requests went past a's");
        assert_eq!((d.taken, d.refused), (2, 1));
        assert_eq!(cq_host.pop().map(|c| c.wr_id), Some(6));
        assert_eq!(parked.iter().map(|e| e.1).collect::<Vec<_>>(), [1, 2, 4]);
        // a's queue drains: its parked requests go first, in order.
        a_full.set(false);
        host.push((a, 7)).unwrap();
        let post = |e: &Item| {
            taken.borrow_mut().push(e.1);
            Post::Taken
        };
        drain_work(&mut work, &mut parked, &mut cq, 32, |e| e.0, post);
        assert_eq!(*taken.borrow(), [3, 5, 1, 2, 4, 7]);
        assert!(parked.is_empty() && work.is_empty());
    }

    #[test]
    fn the_ring_waits_when_the_parked_list_is_full() {
        let ring: SpscRing<Item, 16> = SpscRing::new();
        let done: SpscRing<Completion, 16> = SpscRing::new();
        let (mut host, mut work) = ring.split().unwrap();
        let (mut cq, _) = done.split().unwrap();
        for id in 0..6 {
            host.push((conn(0), id)).unwrap();
        }
        let mut parked: Deque<Item, 4> = Deque::new();
        let d = drain_work(
            &mut work,
            &mut parked,
            &mut cq,
            32,
            |e| e.0,
            |_| Post::Later,
        );
        assert_eq!(parked.len(), 4);
        assert_eq!(work.len(), 2, "nothing dropped: the rest stays on the ring");
        assert_eq!(
            d.later, 1,
            "only the first was tried; the rest queued behind it"
        );
    }
}
