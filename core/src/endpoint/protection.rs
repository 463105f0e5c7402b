//! Packet protection at the endpoint (spec 5.3): the pre-shared keys, the
//! counters, and finishing protected packets.

use super::Endpoint;
use crate::api::{Memory, Transmit};
use crate::crypto::{KeyringError, ProtectionStats, PSK_LEN};
use crate::storage::Backing;
use crate::wire::{self, CipherSuite};

impl<B: Backing, const P: usize> Endpoint<B, P> {
    /// Installs a pre-shared key under `key_id` (nonzero), replacing one
    /// with the same id. Connections offer or accept it by that id
    /// (`Config::protection`).
    pub fn add_psk(&mut self, key_id: u32, key: &[u8; PSK_LEN]) -> Result<(), KeyringError> {
        self.res.credentials.keys.keyring.insert(key_id, key)
    }

    /// Removes a pre-shared key: new handshakes naming it are refused;
    /// connections keyed from it keep their keys. Whether it was there.
    pub fn remove_psk(&mut self, key_id: u32) -> bool {
        self.res.credentials.keys.keyring.remove(key_id)
    }

    /// Protection counters: packets sealed and opened, drops and refused
    /// handshakes by reason.
    pub fn protection_stats(&self) -> ProtectionStats {
        self.res.credentials.keys.stats
    }

    /// Key slots (in use, capacity).
    pub fn key_slots(&self) -> (u32, u32) {
        let k = &self.res.credentials.keys;
        (k.capacity() - k.available(), k.capacity())
    }

    /// A connection's suite and Key ID: what it offered while connecting,
    /// what was agreed after.
    pub fn protection(&self, h: crate::api::ConnHandle) -> Option<(CipherSuite, u32)> {
        self.connection(h)
            .map(|c| (c.protection.suite(), c.protection.key_id()))
    }

    /// Finishes a packet `poll_transmit` described, once its headers and
    /// payload are in `packet` (exactly [`Transmit::packet_len`] bytes):
    /// encrypts the payload and writes the tag of a protected packet, then
    /// the CRC trailer. Returns `false` when a protected packet could not
    /// be sealed (its connection is gone): it then carries a zero tag that
    /// no receiver accepts.
    pub fn finish_transmit(&self, t: &Transmit, packet: &mut [u8]) -> bool {
        let sealed = self.res.credentials.keys.seal(t, packet);
        if let Some(body) = packet.len().checked_sub(wire::CRC_LEN) {
            let crc = wire::packet::crc32(&[&packet[..body]]);
            packet[body..].copy_from_slice(&crc.to_be_bytes());
        }
        sealed
    }

    /// [`Endpoint::finish_transmit`] for a device that writes the CRC
    /// trailer itself (a NIC's CRC offload, spec 3.9): seals a protected
    /// packet and leaves the trailer, the last [`wire::CRC_LEN`] bytes,
    /// zero for the device to fill. Returns what `finish_transmit` does.
    pub fn seal_transmit(&self, t: &Transmit, packet: &mut [u8]) -> bool {
        let sealed = self.res.credentials.keys.seal(t, packet);
        if let Some(body) = packet.len().checked_sub(wire::CRC_LEN) {
            packet[body..].fill(0);
        }
        sealed
    }

    /// [`super::finish_packet`] for protected packets too: gathers the
    /// payload from `mem` behind the headers in `packet`, seals and writes
    /// the trailer. Returns the packet length.
    ///
    /// # Panics
    /// If `packet` is shorter than [`Transmit::packet_len`].
    pub fn finish_packet(&self, t: &Transmit, packet: &mut [u8], mem: &mut impl Memory) -> usize {
        let hl = t.header_len;
        let len = t.packet_len();
        if let Some(p) = t.payload {
            mem.read(p.addr, &mut packet[hl..hl + p.len as usize]);
        }
        self.finish_transmit(t, &mut packet[..len]);
        len
    }
}
