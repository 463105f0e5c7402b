//! The endpoint the engine loop drives.
//!
//! [`Transport`] mirrors the sans-IO API of a protocol engine (quinn-proto
//! style: `handle_*` inputs, commands, `poll_*` outputs), so the one loop in
//! [`crate::engine`] drives the MetaRoCE `Endpoint` and the RoCEv2 baseline
//! alike. Connection setup is not part of it: the board or host program that
//! owns the endpoint opens connections and hands their [`ConnHandle`]s to the
//! application.

use metaroce_core::api::{
    Completion, ConnHandle, Memory, Op, Opcode, RecvRequest, Region, RxMeta, Status, Transmit,
    WorkRequest,
};
use metaroce_core::wire::{CrcVerdict, EncapRepr};
use metaroce_core::Instant;

/// What the loop needs to know about a refused post.
pub trait PostError {
    /// The request may succeed later (a queue is full): the loop leaves it at
    /// the head of the host queue and retries on a later poll. Otherwise the
    /// loop completes it at once with [`PostError::status`].
    fn is_retryable(&self) -> bool;
    /// The completion status reported for a request refused for good.
    fn status(&self) -> Status;
}

/// A transport endpoint as the engine loop sees it.
///
/// Calling order per poll, as the loop does it: `handle_packet` for each
/// received packet, the posts from the host queues, `handle_timeout` when
/// `poll_timeout` has passed, `reseed` when `reseed_due` says so and the
/// platform has an entropy source, `poll_completion` until `None`, then
/// `poll_transmit` until `None` (or the device is full). Time never goes
/// backwards between calls.
pub trait Transport {
    /// Why a registration or a post was refused.
    type Error: PostError;

    /// Registers a memory region; returns its key.
    fn register_region(&mut self, region: Region) -> Result<u32, Self::Error>;
    /// Deregisters the region with `key`.
    fn deregister_region(&mut self, key: u32) -> Result<(), Self::Error>;
    /// Posts a send-queue work request on a connection.
    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), Self::Error>;
    /// Posts a receive buffer on a connection.
    fn post_recv(&mut self, conn: ConnHandle, rr: RecvRequest) -> Result<(), Self::Error>;
    /// Handles one received transport packet (the UDP payload, trailer
    /// included), placing payload through `mem`. `crc` is the device's
    /// verdict on the trailer ([`crate::FrameDevice::receive_with_verdict`]):
    /// `NotChecked` asks the transport to check it, `Good` to skip that,
    /// `Bad` to drop the packet as one whose check failed.
    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        packet: &[u8],
        crc: CrcVerdict,
        mem: &mut impl Memory,
    );
    /// Runs timers that are due at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// The next packet to send: its transport headers are written into
    /// `header_buf[..header_len]`, the payload (if any) is to be gathered
    /// from memory, then [`Transport::finish_packet`] writes the trailer.
    #[must_use]
    fn poll_transmit(&mut self, now: Instant, header_buf: &mut [u8]) -> Option<Transmit>;
    /// When `handle_timeout` must next be called, if ever.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The next work completion.
    fn poll_completion(&mut self) -> Option<Completion>;
    /// The UDP port this endpoint receives on.
    fn udp_port(&self) -> u16;
    /// Whether the transport's generator wants fresh entropy at `now`
    /// (spec 5.1.6). A transport without secrets never does.
    fn reseed_due(&self, _now: Instant) -> bool {
        false
    }
    /// Folds 32 bytes of fresh entropy into the transport's generator.
    fn reseed(&mut self, _now: Instant, _entropy: [u8; 32]) {}
    /// Writes the protocol's trailer into the last bytes of `packet` (the
    /// whole UDP payload of `tx`: headers, gathered payload, trailer space).
    /// `encap` is the Ethernet/IP/UDP wrapping, for trailers that cover it
    /// (RoCEv2's ICRC).
    fn finish_packet(&self, tx: &Transmit, encap: Option<&EncapRepr>, packet: &mut [u8]);
    /// [`Transport::finish_packet`] for a device that writes the trailer
    /// itself ([`crate::FrameDevice::FILLS_CRC_TRAILER`]): everything but
    /// the trailer, whose bytes are left zero.
    fn finish_packet_without_trailer(
        &self,
        tx: &Transmit,
        encap: Option<&EncapRepr>,
        packet: &mut [u8],
    );
}

/// The completion opcode reported for a send-queue operation.
pub fn opcode_of(op: &Op) -> Opcode {
    match op {
        Op::Write { .. } => Opcode::Write,
        Op::WriteImm { .. } => Opcode::WriteImm,
        Op::Send | Op::SendImm { .. } => Opcode::Send,
        Op::Read { .. } => Opcode::Read,
    }
}
