//! The endpoint: a RoCE NIC's transport for up to `QPS` queue pairs, driven
//! sans-IO in the shape of `quinn-proto`.
//!
//! * Setup: [`RoceEndpoint::register_region`], [`RoceEndpoint::create_qp`]
//!   (both ends, with each other's QP numbers and PSNs: RoCE connects out of
//!   band).
//! * Commands: [`RoceEndpoint::post_send`], [`RoceEndpoint::post_recv`].
//! * Inputs: [`RoceEndpoint::handle_packet`] (a transport packet, BTH to
//!   ICRC, whose ICRC the caller checked) or [`RoceEndpoint::handle_frame`]
//!   (a whole Ethernet frame, ICRC checked here), and
//!   [`RoceEndpoint::handle_timeout`] at the instant
//!   [`RoceEndpoint::poll_timeout`] named.
//! * Outputs, polled after every input in this order:
//!   [`RoceEndpoint::poll_transmit`] until `None`,
//!   [`RoceEndpoint::poll_completion`] until `None`, then
//!   [`RoceEndpoint::poll_timeout`].
//! * Getters: [`RoceEndpoint::counters`], [`RoceEndpoint::qp_state`],
//!   [`RoceEndpoint::send_rate_bps`], [`RoceEndpoint::dcqcn`].
//!
//! Time only moves forward between calls.

use core::cell::Cell;

use metaroce_core::api::{
    Completion, ConnHandle, Memory, PeerAddr, RecvRequest, Region, RxMeta, Transmit, WorkRequest,
};
use metaroce_core::wire::encap::ecn;
use metaroce_core::Instant;

use crate::cc::{CongestionControl, Dcqcn};
use crate::config::{Config, QpSetup, VALID_MTUS};
use crate::psn;
use crate::qp::{Env, PostError, Qp, QpState};
use crate::regions::Regions;
use crate::stats::{EndpointCounters, QpCounters};
use crate::wire::{self, frame, Repr};

/// Buffer `poll_transmit` needs for the longest header set (BTH + RETH +
/// ImmDt).
pub const MAX_HEADER_LEN: usize = 32;

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Error {
    /// Every QP slot is taken.
    NoFreeQp,
    /// The QP number is 0, 1 (management QPs), wider than 24 bits, or in use.
    BadQpn,
    /// The MTU is not an InfiniBand path MTU.
    BadMtu,
    /// No QP has this handle.
    UnknownQp,
    /// The region table is full or the region wraps the address space.
    RegionTable,
    /// No region has this key.
    UnknownKey,
    /// Posting refused.
    Post(PostError),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::NoFreeQp => write!(f, "no free queue pair slot"),
            Error::BadQpn => write!(f, "invalid or duplicate QP number"),
            Error::BadMtu => write!(f, "MTU is not 256, 512, 1024, 2048 or 4096"),
            Error::UnknownQp => write!(f, "unknown queue pair handle"),
            Error::RegionTable => write!(f, "region table full or region invalid"),
            Error::UnknownKey => write!(f, "unknown memory key"),
            Error::Post(e) => write!(f, "post refused: {e:?}"),
        }
    }
}

impl core::error::Error for Error {}

impl From<PostError> for Error {
    fn from(e: PostError) -> Error {
        Error::Post(e)
    }
}

/// Why a received packet was dropped before reaching a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RxError {
    /// Not a valid RoCEv2 packet (or frame, or ICRC).
    Wire(wire::Error),
    /// No QP has this destination QP number.
    UnknownQp(u32),
    /// The source address is not the QP's peer.
    WrongPeer,
    /// The partition key does not match.
    BadPkey(u16),
}

/// A RoCEv2 endpoint with room for `QPS` queue pairs.
#[derive(Debug)]
pub struct RoceEndpoint<const QPS: usize> {
    config: Config,
    regions: Regions,
    qps: [Option<Qp>; QPS],
    next_tx: usize,
    next_cq: usize,
    now: Instant,
    counters: EndpointCounters,
    /// Per slot, what the QP's `poll_timeout` said after the QP last
    /// changed (`None` for an empty slot), so that
    /// [`RoceEndpoint::poll_timeout`] need not visit every QP's state
    /// (a simulator asks after every event; see there why it stays exact).
    deadlines: [Option<Instant>; QPS],
    /// Per slot, the QP's number (0 for an empty slot: 0 and 1 are the
    /// management QPs): a packet's QP is found in one small array.
    qpns: [u32; QPS],
    /// Per slot, whether the QP's completion queue holds a completion.
    has_completions: [bool; QPS],
    /// Per slot, whether the QP may have a packet to send
    /// (`Qp::may_transmit`): the round robin skips the others unvisited.
    may_transmit: [bool; QPS],
    /// Slots whose `has_completions` is set: with none, `poll_completion`
    /// (which a simulator calls after every event, mostly to hear there
    /// is nothing) answers without visiting the slots.
    completion_slots: usize,
    /// Slots whose `may_transmit` is set, likewise for `poll_transmit`.
    transmit_slots: usize,
    /// The earliest of `deadlines` (`None`: no slot has one), kept as they
    /// change: while it is later than `now`, so is every kept deadline,
    /// and it is `poll_timeout`'s answer without a look at every slot.
    /// When the slot that held it moves later, it is looked for again,
    /// once, by the next `poll_timeout` (`earliest_stale` until then).
    earliest: Cell<Option<Instant>>,
    earliest_stale: Cell<bool>,
}

/// The earlier of two deadlines, `None` being none (never).
#[inline]
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

impl<const QPS: usize> RoceEndpoint<QPS> {
    pub fn new(config: Config) -> Self {
        RoceEndpoint {
            config,
            regions: Regions::new(),
            qps: core::array::from_fn(|_| None),
            next_tx: 0,
            next_cq: 0,
            now: Instant::ZERO,
            counters: EndpointCounters::default(),
            deadlines: [None; QPS],
            qpns: [0; QPS],
            has_completions: [false; QPS],
            may_transmit: [false; QPS],
            completion_slots: 0,
            transmit_slots: 0,
            earliest: Cell::new(None),
            earliest_stale: Cell::new(false),
        }
    }

    /// Re-reads slot `slot`'s deadline and completion flag after its QP
    /// may have changed. Every change to a QP goes through a method of
    /// this endpoint that calls this for the QP it touched.
    fn refresh(&mut self, slot: usize) {
        let (deadline, completions, transmit) = match &self.qps[slot] {
            Some(q) => (
                q.poll_timeout(self.now),
                q.has_completions(),
                q.may_transmit(),
            ),
            None => (None, false, false),
        };
        let old = core::mem::replace(&mut self.deadlines[slot], deadline);
        if !self.earliest_stale.get() {
            let earliest = self.earliest.get();
            if earlier(deadline, earliest) == deadline {
                self.earliest.set(deadline);
            } else if old == earliest && deadline != old {
                // The earliest deadline moved later: the next
                // `poll_timeout` looks for the new one.
                self.earliest_stale.set(true);
            }
        }
        self.completion_slots = self.completion_slots + usize::from(completions)
            - usize::from(self.has_completions[slot]);
        self.transmit_slots =
            self.transmit_slots + usize::from(transmit) - usize::from(self.may_transmit[slot]);
        self.has_completions[slot] = completions;
        self.may_transmit[slot] = transmit;
    }

    /// Bytes this endpoint occupies (all state is inline; nothing else is
    /// allocated).
    pub const fn memory_bytes() -> usize {
        core::mem::size_of::<Self>()
    }

    /// Bytes of one queue pair's state.
    pub const fn qp_memory_bytes() -> usize {
        core::mem::size_of::<Option<Qp>>()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    // ---- Setup -------------------------------------------------------------

    /// Registers memory; the key returned serves as lkey and rkey.
    pub fn register_region(&mut self, region: Region) -> Result<u32, Error> {
        self.regions.register(region).ok_or(Error::RegionTable)
    }

    pub fn deregister_region(&mut self, key: u32) -> Result<(), Error> {
        if self.regions.deregister(key) {
            Ok(())
        } else {
            Err(Error::UnknownKey)
        }
    }

    /// Creates a queue pair in the ready-to-send state, wired to the peer
    /// QP the setup names.
    pub fn create_qp(&mut self, setup: QpSetup) -> Result<ConnHandle, Error> {
        if !VALID_MTUS.contains(&setup.mtu) {
            return Err(Error::BadMtu);
        }
        if setup.local_qpn < 2
            || setup.local_qpn > psn::MASK
            || setup.remote_qpn > psn::MASK
            || self.find_qpn(setup.local_qpn).is_some()
        {
            return Err(Error::BadQpn);
        }
        let slot = self
            .qps
            .iter()
            .position(Option::is_none)
            .ok_or(Error::NoFreeQp)?;
        let handle = ConnHandle {
            index: u32::try_from(slot).map_err(|_| Error::NoFreeQp)?,
            generation: 0,
        };
        self.qps[slot] = Some(Qp::new(handle, setup, &self.config));
        self.qpns[slot] = setup.local_qpn;
        self.refresh(slot);
        Ok(handle)
    }

    /// Removes a queue pair; completions not yet polled are lost.
    pub fn destroy_qp(&mut self, qp: ConnHandle) -> Result<(), Error> {
        let slot = qp.index as usize;
        let taken = self.qps.get_mut(slot).ok_or(Error::UnknownQp)?.take();
        self.qpns[slot] = 0;
        self.refresh(slot);
        if taken.is_some() {
            Ok(())
        } else {
            Err(Error::UnknownQp)
        }
    }

    fn find_qpn(&self, qpn: u32) -> Option<usize> {
        if qpn < 2 {
            return None;
        }
        self.qpns.iter().position(|&q| q == qpn)
    }

    fn qp(&self, qp: ConnHandle) -> Option<&Qp> {
        self.qps.get(qp.index as usize).and_then(Option::as_ref)
    }

    // ---- Commands ------------------------------------------------------------

    /// Queues a send-queue work request. The local buffer is checked now
    /// (key, domain, bounds, and local write for READ); a bad one is refused
    /// with `Post(LocalProtection)` rather than completed in error.
    pub fn post_send(&mut self, qp: ConnHandle, wr: WorkRequest) -> Result<(), Error> {
        let regions = &self.regions;
        let q = self
            .qps
            .get_mut(qp.index as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::UnknownQp)?;
        let posted = q.post_send(wr, regions).map_err(Error::from);
        self.refresh(qp.index as usize);
        posted
    }

    /// Queues a receive buffer for one incoming SEND or WRITE with immediate.
    pub fn post_recv(&mut self, qp: ConnHandle, rr: RecvRequest) -> Result<(), Error> {
        let regions = &self.regions;
        let q = self
            .qps
            .get_mut(qp.index as usize)
            .and_then(Option::as_mut)
            .ok_or(Error::UnknownQp)?;
        let posted = q.post_recv(rr, regions).map_err(Error::from);
        self.refresh(qp.index as usize);
        posted
    }

    // ---- Inputs --------------------------------------------------------------

    /// Takes in one transport packet (the UDP payload: BTH through ICRC).
    /// The ICRC is not checked here: the caller that has the IP header does
    /// it ([`wire::icrc::verify`]), or uses [`RoceEndpoint::handle_frame`].
    /// Payload is placed through `mem` only inside registered regions the
    /// packet's key, rights and bounds allow.
    ///
    /// Drops are counted ([`RoceEndpoint::endpoint_counters`]);
    /// [`RoceEndpoint::try_handle_packet`] also says why.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        bytes: &[u8],
        mem: &mut impl Memory,
    ) {
        let _ = self.try_handle_packet(now, meta, bytes, mem);
    }

    /// [`RoceEndpoint::handle_packet`], returning why a packet was dropped.
    pub fn try_handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        bytes: &[u8],
        mem: &mut impl Memory,
    ) -> Result<(), RxError> {
        self.advance(now);
        let (repr, payload) = match Repr::parse(bytes) {
            Ok(r) => r,
            Err(e) => {
                self.counters.malformed += 1;
                return Err(RxError::Wire(e));
            }
        };
        let Some(slot) = self.find_qpn(repr.bth.dest_qp) else {
            self.counters.unknown_qp += 1;
            return Err(RxError::UnknownQp(repr.bth.dest_qp));
        };
        if repr.bth.pkey != self.config.pkey {
            self.counters.bad_pkey += 1;
            return Err(RxError::BadPkey(repr.bth.pkey));
        }
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(RxError::UnknownQp(repr.bth.dest_qp));
        };
        if qp.setup().peer.ip != meta.source.ip {
            self.counters.wrong_peer += 1;
            return Err(RxError::WrongPeer);
        }
        let env = Env {
            cfg: &self.config,
            regions: &self.regions,
        };
        qp.on_packet(now, &repr, payload, meta.ce, env, mem);
        self.refresh(slot);
        Ok(())
    }

    /// Takes in a whole Ethernet frame: checks the IP and UDP layers and the
    /// ICRC, then handles the transport packet.
    pub fn handle_frame(&mut self, now: Instant, frame_bytes: &[u8], mem: &mut impl Memory) {
        let _ = self.try_handle_frame(now, frame_bytes, mem);
    }

    /// [`RoceEndpoint::handle_frame`], returning why a frame was dropped.
    pub fn try_handle_frame(
        &mut self,
        now: Instant,
        frame_bytes: &[u8],
        mem: &mut impl Memory,
    ) -> Result<(), RxError> {
        let (info, transport) = match frame::parse_frame(frame_bytes) {
            Ok(r) => r,
            Err(e) => {
                if e == wire::Error::BadIcrc {
                    self.counters.bad_icrc += 1;
                } else {
                    self.counters.malformed += 1;
                }
                return Err(RxError::Wire(e));
            }
        };
        let meta = RxMeta {
            source: PeerAddr {
                ip: info.ip.src(),
                port: info.src_port,
            },
            ce: info.is_ce(),
        };
        self.try_handle_packet(now, &meta, transport, mem)
    }

    /// Runs the timers due at `now`: retry timeouts, the end of RNR waits,
    /// DCQCN's rate timers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
        for slot in 0..QPS {
            // A QP whose kept deadline is later (or none) has no timer
            // due (its deadline is the earliest of them): nothing to run.
            if self.deadlines[slot].is_none_or(|t| t > now) {
                continue;
            }
            if let Some(qp) = self.qps[slot].as_mut() {
                qp.handle_timeout(now);
            }
            self.refresh(slot);
        }
    }

    fn advance(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    // ---- Outputs -------------------------------------------------------------

    /// The next packet to send, queue pairs served round robin. Its headers
    /// are written to `buf[..header_len]` (`buf` needs [`MAX_HEADER_LEN`]
    /// bytes, else nothing is sent); the payload is to be gathered from the
    /// sender's memory, then the pad the BTH announces and the ICRC appended
    /// ([`frame::finish`], [`frame::emit_frame`]; the whole length is
    /// [`frame::transport_len`]). A QP whose DCQCN rate holds it back sends
    /// nothing before its next-send time, which `poll_timeout` includes.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.advance(now);
        debug_assert!(self.kept_flags_match());
        if buf.len() < MAX_HEADER_LEN || QPS == 0 || self.transmit_slots == 0 {
            return None;
        }
        for i in 0..QPS {
            let slot = (self.next_tx + i) % QPS;
            if !self.may_transmit[slot] {
                continue;
            }
            let Some(qp) = self.qps[slot].as_mut() else {
                continue;
            };
            // A QP with nothing to send is left as it was: no refresh.
            let Some(out) = qp.poll_transmit(now, &self.config) else {
                continue;
            };
            let (peer, src_port) = (qp.setup().peer, qp.src_port());
            self.refresh(slot);
            out.repr.emit_header(buf);
            self.next_tx = (slot + 1) % QPS;
            return Some(Transmit {
                peer,
                src_port,
                // Everything ECN-capable, as ConnectX sends (its CNPs too).
                ecn: ecn::ECT0,
                header_len: out.repr.header_len(),
                payload: out.payload,
                seal: None,
            });
        }
        None
    }

    /// The next work completion, queue pairs served round robin.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        debug_assert!(self.kept_flags_match());
        if self.completion_slots == 0 {
            return None;
        }
        for i in 0..QPS {
            let slot = (self.next_cq + i) % QPS;
            if !self.has_completions[slot] {
                continue;
            }
            if let Some(c) = self.qps[slot].as_mut().and_then(Qp::pop_completion) {
                self.refresh(slot);
                self.next_cq = (slot + 1) % QPS;
                return Some(c);
            }
        }
        None
    }

    /// When `handle_timeout` (or, for a paced QP, `poll_transmit`) next has
    /// work.
    ///
    /// From the per-QP deadlines kept since each QP last changed. A QP's
    /// answer depends on time only through its pacing deadline, which
    /// counts while still in the future: a kept deadline later than now is
    /// still the QP's answer, and a QP whose kept deadline has passed is
    /// asked again. So this equals asking every QP.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.earliest_stale.replace(false) {
            let earliest = self.deadlines.iter().fold(None, |m, &d| earlier(m, d));
            self.earliest.set(earliest);
        }
        let earliest = self.earliest.get();
        debug_assert_eq!(
            earliest,
            self.deadlines.iter().fold(None, |m, &d| earlier(m, d))
        );
        if earliest.is_none_or(|t| t > self.now) {
            debug_assert_eq!(earliest, self.poll_timeout_by_scan());
            return earliest;
        }
        let next = self
            .deadlines
            .iter()
            .enumerate()
            .filter_map(|(slot, &kept)| match kept {
                Some(t) if t <= self.now => self.qps[slot]
                    .as_ref()
                    .and_then(|q| q.poll_timeout(self.now)),
                kept => kept,
            })
            .min();
        debug_assert_eq!(next, self.poll_timeout_by_scan());
        next
    }

    /// `poll_timeout` the direct way, asking every QP: what the kept
    /// deadlines must give (checked in debug builds, so every test that
    /// runs an endpoint checks it).
    /// Whether the kept QP numbers and flags say what the QPs say
    /// (checked in debug builds, like `poll_timeout_by_scan`).
    fn kept_flags_match(&self) -> bool {
        let count = |flags: &[bool]| flags.iter().filter(|&&f| f).count();
        self.completion_slots == count(&self.has_completions)
            && self.transmit_slots == count(&self.may_transmit)
            && self.qps.iter().enumerate().all(|(slot, q)| match q {
                Some(q) => {
                    self.qpns[slot] == q.setup().local_qpn
                        && self.has_completions[slot] == q.has_completions()
                        && self.may_transmit[slot] == q.may_transmit()
                }
                None => {
                    self.qpns[slot] == 0 && !self.has_completions[slot] && !self.may_transmit[slot]
                }
            })
    }

    fn poll_timeout_by_scan(&self) -> Option<Instant> {
        self.qps
            .iter()
            .flatten()
            .filter_map(|q| q.poll_timeout(self.now))
            .min()
    }

    // ---- Getters ---------------------------------------------------------------

    pub fn counters(&self, qp: ConnHandle) -> Option<QpCounters> {
        self.qp(qp).map(|q| *q.counters())
    }

    pub fn endpoint_counters(&self) -> EndpointCounters {
        self.counters
    }

    pub fn qp_state(&self, qp: ConnHandle) -> Option<QpState> {
        self.qp(qp).map(Qp::state)
    }

    /// The QP's current sending rate (bits per second).
    pub fn send_rate_bps(&self, qp: ConnHandle) -> Option<u64> {
        self.qp(qp).map(|q| q.cc().rate_bps())
    }

    /// The QP's DCQCN reaction point, when DCQCN is configured.
    pub fn dcqcn(&self, qp: ConnHandle) -> Option<&Dcqcn> {
        self.qp(qp).and_then(|q| q.cc().dcqcn())
    }

    /// The setup a QP was created with.
    pub fn qp_setup(&self, qp: ConnHandle) -> Option<&QpSetup> {
        self.qp(qp).map(Qp::setup)
    }
}
