//! The engine loop: one function, [`Engine::poll`], that moves everything
//! between a link, a transport endpoint, DMA and the host queues. The
//! same code runs on the DPU, under QEMU and on a host.
//!
//! It is three objects with one concern each, in the shape of smoltcp's
//! interface and sockets:
//! - `iface`: the node's network interface on a frame device: addresses,
//!   neighbour (ARP) cache, ARP and ICMP echo, and the Ethernet/IP/UDP
//!   addressing of transport packets;
//! - `pump`: the host-queue pump: admin, receive and send queues into the
//!   transport, and the transport's completions into the host's completion
//!   queue (the one place they are drained), over a [`HostSide`]: the
//!   firmware's in-memory rings or the shared-memory host interface itself,
//!   so each work entry and each completion passes one queue;
//! - `driver`: receive and transmit, written once over one link
//!   abstraction (`PacketLink`) that a frame device with its interface
//!   and a [`DatagramLink`] both are.
//!
//! One poll, in order, each step bounded by [`Budget`]:
//! 1. **Admin, receive and send queues**: registrations, receive buffers and
//!    work requests from the host rings, posted to the transport. First, so
//!    that whatever the host posted before this poll precedes the packets
//!    it handles (a receive posted before a SEND arrived is there to take
//!    it, as on a NIC). The rings are shared by every connection, so a
//!    request whose connection's queue is full is parked aside (bounded,
//!    in order per connection) rather than holding up the others.
//! 2. **RX**: transport packets from the link. On a frame device,
//!    Ethernet/IP/UDP is parsed once, by
//!    `metaroce_core::wire::encap::parse_frame_with` (CE mark and the UDP source
//!    port, the sender's path entropy, go into [`RxMeta`](metaroce_core::api::RxMeta)),
//!    which verifies the IPv4 header and UDP checksums unless the device
//!    vouched for them ([`FrameDevice::receive_with_verdict`]: checksum
//!    offload, or a frame that never left memory);
//!    ARP and ICMP echo are answered by the interface. Each transport
//!    packet goes to [`Transport::handle_packet`] with a
//!    [`DmaMemory`](crate::dma::DmaMemory) that places payload by DMA, and
//!    with the device's verdict on its CRC trailer.
//! 3. **Timers**: [`Transport::handle_timeout`] once its deadline passed;
//!    then **entropy**: when the transport's policy says fresh entropy is
//!    due ([`Transport::reseed_due`], spec 5.1.6), 32 bytes from the
//!    platform's source ([`Engine::set_entropy_source`]) go to
//!    [`Transport::reseed`]. The same step on every platform; only the
//!    source differs.
//! 4. **Completions** into the host's completion queue (converted once,
//!    into the ABI's entry when the host side is shared memory), then its
//!    doorbell.
//! 5. **TX**: [`Transport::poll_transmit`] until the link is full; the
//!    headers are written directly in the link's buffer (on a frame
//!    device, wrapped in Ethernet/IP/UDP by `EncapRepr::emit`), the
//!    payload is gathered from host memory by DMA behind them, and
//!    [`Transport::finish_packet`] writes the trailer, unless the device
//!    writes it ([`FrameDevice::FILLS_CRC_TRAILER`]: then
//!    [`Transport::finish_packet_without_trailer`]).
//!
//! [`Engine::poll_datagrams`] is the same round over a [`DatagramLink`],
//! where the kernel's sockets or a simulator own Ethernet, IP and UDP: the
//! link hands over transport packets and their addressing, and no
//! interface is involved.
//!
//! The caller owns the clock and the waiting: [`PollOutcome`] says whether
//! anything happened and when the transport next needs time.

use metaroce_core::Instant;
use smoltcp::wire::{EthernetAddress, Ipv4Address};

use crate::device::FrameDevice;
use crate::dma::DmaCopy;
use crate::entropy::{EntropySource, EntropyStep};
use crate::host::HostSide;
use crate::link::DatagramLink;
use crate::net::NetConfig;
use crate::transport::Transport;

mod driver;
mod iface;
mod pump;

use driver::{Datagrams, Frames, HEADER_BUF_LEN};
use iface::Interface;
pub use iface::{EchoResult, PingError};
use pump::HostPump;

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

/// State of the loop for one node: its network interface (addresses,
/// neighbour cache, ARP and ICMP) and the state of its rounds (host-queue
/// pump, budget, counters, scratch, deadline, entropy). `NEIGHBORS` is
/// the ARP cache size.
#[derive(Debug)]
pub struct Engine<const NEIGHBORS: usize = 16> {
    iface: Interface<NEIGHBORS>,
    rounds: Rounds,
}

/// What a round uses beside its link (which may borrow the interface).
#[derive(Debug)]
struct Rounds {
    pump: HostPump,
    budget: Budget,
    stats: EngineStats,
    header_buf: [u8; HEADER_BUF_LEN],
    /// The transport's deadline as of the end of the last poll.
    deadline: Option<Instant>,
    /// Fresh entropy for the transport (none configured: never
    /// reseeded, as in simulations).
    entropy: EntropyStep,
}

impl<const NEIGHBORS: usize> Engine<NEIGHBORS> {
    pub fn new(net: NetConfig) -> Self {
        Engine {
            iface: Interface::new(net),
            rounds: Rounds {
                pump: HostPump::new(),
                budget: Budget::default(),
                stats: EngineStats::default(),
                header_buf: [0; HEADER_BUF_LEN],
                deadline: None,
                entropy: EntropyStep::NONE,
            },
        }
    }

    /// The platform's entropy source: from now on every poll reseeds the
    /// transport from it when the transport's policy says so (step 3).
    pub fn set_entropy_source(&mut self, source: EntropySource) {
        self.rounds.entropy = EntropyStep::new(source);
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
        self.rounds.budget = budget;
    }

    /// Sets the DSCP of transport packets (traffic class on the fabric).
    pub fn set_dscp(&mut self, dscp: u8) {
        self.iface.dscp = dscp & 0x3f;
    }

    /// Adds a neighbour that is never evicted (a configured peer), so the
    /// first packets need no ARP round trip.
    pub fn add_static_neighbor(&mut self, ip: Ipv4Address, mac: EthernetAddress) {
        self.iface.neighbors.insert_static(ip, mac);
    }

    /// The MAC address of `ip`, if known.
    pub fn neighbor(&self, ip: Ipv4Address) -> Option<EthernetAddress> {
        self.iface.neighbors.lookup(ip)
    }

    /// This node's addresses.
    pub fn net_config(&self) -> NetConfig {
        self.iface.net
    }

    /// The counters so far.
    pub fn stats(&self) -> EngineStats {
        self.rounds.stats
    }

    /// The last echo reply received, if any.
    pub fn last_echo(&self) -> Option<EchoResult> {
        self.iface.last_echo
    }

    /// Sends an ICMP echo request to `dst` carrying the send time.
    pub fn send_ping<D: FrameDevice>(
        &mut self,
        device: &mut D,
        dst: Ipv4Address,
        seq_no: u16,
        now: Instant,
    ) -> Result<(), PingError> {
        self.iface
            .send_ping(device, dst, seq_no, now, &mut self.rounds.stats)
    }

    /// One bounded round of the loop; see the module documentation.
    #[inline]
    pub fn poll<T, D, M>(
        &mut self,
        now: Instant,
        transport: &mut T,
        device: &mut D,
        host: &mut dyn HostSide,
        dma: &mut M,
    ) -> PollOutcome
    where
        T: Transport,
        D: FrameDevice,
        M: DmaCopy,
    {
        let mut link = Frames {
            device,
            iface: &mut self.iface,
        };
        self.rounds.round(now, transport, &mut link, host, dma)
    }

    /// One bounded round of the loop over a [`DatagramLink`]: the steps of
    /// [`Engine::poll`], with the link carrying transport packets instead of
    /// frames (no Ethernet, IP, ARP or ICMP here: the link's owner has them).
    #[inline]
    pub fn poll_datagrams<T, L, M>(
        &mut self,
        now: Instant,
        transport: &mut T,
        link: &mut L,
        host: &mut dyn HostSide,
        dma: &mut M,
    ) -> PollOutcome
    where
        T: Transport,
        L: DatagramLink,
        M: DmaCopy,
    {
        self.rounds
            .round(now, transport, &mut Datagrams(link), host, dma)
    }
}

impl Rounds {
    /// The five steps over any link (see the module documentation).
    fn round<T, L, M>(
        &mut self,
        now: Instant,
        transport: &mut T,
        link: &mut L,
        host: &mut dyn HostSide,
        dma: &mut M,
    ) -> PollOutcome
    where
        T: Transport,
        L: driver::PacketLink,
        M: DmaCopy,
    {
        let budget = self.budget;
        let stats = &mut self.stats;
        let mut busy = self.pump.take(transport, host, budget.work_requests, stats);
        busy |= driver::receive(link, now, budget.rx_frames, stats, transport, dma);
        if self.deadline.is_some_and(|t| t <= now) {
            transport.handle_timeout(now);
            stats.timeouts += 1;
            busy = true;
        }
        self.entropy.refresh(now, transport, stats);
        busy |= self
            .pump
            .complete(transport, host, budget.completions, stats);
        busy |= driver::transmit(
            link,
            now,
            budget.tx_frames,
            &mut self.header_buf,
            stats,
            transport,
            dma,
        );
        // The transport's next deadline, asked once per poll: it is both
        // what the caller waits for and what the next poll's timer step
        // checks.
        let next_timeout = transport.poll_timeout();
        self.deadline = next_timeout;
        PollOutcome { busy, next_timeout }
    }
}
