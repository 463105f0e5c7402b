//! [`Transport`] for the MetaRoCE [`Endpoint`], so the engine loop drives
//! it. (It lives here because the trait is the platform's and the endpoint
//! is the core's: Rust's orphan rule puts the impl in the trait's crate.)
//!
//! Connection setup (`Endpoint::connect`, `Endpoint::poll_event`) stays with
//! the owner of the endpoint (the board or host program).

use metaroce_core::api::{
    Completion, ConnHandle, Memory, RecvRequest, Region, RxMeta, Status, Transmit, WorkRequest,
};
use metaroce_core::wire::{CrcVerdict, EncapRepr};
use metaroce_core::{Backing, CommandError, Endpoint, Instant};

use crate::transport::{PostError, Transport};

impl PostError for CommandError {
    fn is_retryable(&self) -> bool {
        matches!(self, CommandError::QueueFull)
    }

    fn status(&self) -> Status {
        match self {
            CommandError::UnknownConnection
            | CommandError::NotOpen
            | CommandError::NotClosed
            | CommandError::NotDrained => Status::Flushed,
            CommandError::NoFreeConnection
            | CommandError::QueueFull
            | CommandError::LocalProtection(_)
            | CommandError::Region(_)
            | CommandError::BadLength
            | CommandError::Protection(_) => Status::LocalProtection,
        }
    }
}

impl<B: Backing, const P: usize> Transport for Endpoint<B, P> {
    type Error = CommandError;

    fn register_region(&mut self, region: Region) -> Result<u32, CommandError> {
        Endpoint::register_region(self, region)
    }

    fn deregister_region(&mut self, key: u32) -> Result<(), CommandError> {
        Endpoint::deregister_region(self, key).map(|_| ())
    }

    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), CommandError> {
        Endpoint::post_send(self, conn, wr)
    }

    fn post_recv(&mut self, conn: ConnHandle, rr: RecvRequest) -> Result<(), CommandError> {
        Endpoint::post_recv(self, conn, rr)
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        packet: &[u8],
        crc: CrcVerdict,
        mem: &mut impl Memory,
    ) {
        Endpoint::handle_packet_with_verdict(self, now, meta, packet, crc, mem);
    }

    fn handle_timeout(&mut self, now: Instant) {
        Endpoint::handle_timeout(self, now);
    }

    fn poll_transmit(&mut self, now: Instant, header_buf: &mut [u8]) -> Option<Transmit> {
        Endpoint::poll_transmit(self, now, header_buf)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Endpoint::poll_timeout(self)
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        Endpoint::poll_completion(self)
    }

    fn udp_port(&self) -> u16 {
        self.config().udp_port
    }

    fn reseed_due(&self, now: Instant) -> bool {
        Endpoint::reseed_due(self, now)
    }

    fn reseed(&mut self, now: Instant, entropy: [u8; 32]) {
        Endpoint::reseed(self, now, entropy);
    }

    fn finish_packet(&self, tx: &Transmit, _encap: Option<&EncapRepr>, packet: &mut [u8]) {
        // Seals a protected packet (spec 5.3), then writes the CRC.
        Endpoint::finish_transmit(self, tx, packet);
    }

    fn finish_packet_without_trailer(
        &self,
        tx: &Transmit,
        _encap: Option<&EncapRepr>,
        packet: &mut [u8],
    ) {
        Endpoint::seal_transmit(self, tx, packet);
    }
}
