//! The endpoint's key pool: a slot per protected connection, with the
//! pre-shared keys and the counters (spec 5.3). Connections name their
//! slot by index; a slot's epoch changes each time it is taken, so a
//! transmit that outlived its connection never seals with another
//! connection's keys.

use super::{choose, ConnProtection, Keyring, Policy, ProtectionConfig, ProtectionStats, Refusal};
use crate::api::Transmit;
use crate::storage::list::{OptIndex, END, UNLINKED};
use crate::storage::{Backing, Slice};
use crate::wire::packet::{field, Packet, MAX_MTU};
use crate::wire::protect::TAG_LEN;
use crate::wire::{CipherSuite, ConnectRepr, PacketType};

#[cfg(feature = "aead")]
use super::session::{OpenError, Role, Session};
#[cfg(feature = "aead")]
use crate::api::SealRef;
#[cfg(feature = "aead")]
use crate::wire::protect::{SecurityRepr, SECURITY_LEN};
#[cfg(feature = "aead")]
use crate::wire::Flags;

/// What a key slot holds. Every slot is as large as a keyed one by
/// design: the slots are a fixed pool, and no allocator could box it.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "aead"), derive(Copy))]
enum SlotState {
    Free,
    /// Taken by an initiator waiting for the ACCEPT, or by an acceptor
    /// about to derive.
    Reserved,
    #[cfg(feature = "aead")]
    Keyed(Session),
}

/// One slot of the key pool.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "aead"), derive(Copy))]
pub struct KeySlot {
    state: SlotState,
    epoch: u32,
    next: u32,
}

impl KeySlot {
    /// A free slot (a `static` in firmware is built from it).
    pub const VACANT: KeySlot = KeySlot {
        state: SlotState::Free,
        epoch: 0,
        next: UNLINKED,
    };
}

/// Bytes of the buffer a protected payload is decrypted into: the largest
/// MTU with the cipher, nothing without it.
const SCRATCH_LEN: usize = if super::SUPPORTED {
    MAX_MTU as usize
} else {
    0
};

/// Where a received protected payload is decrypted before placement.
#[derive(Clone)]
pub struct Scratch([u8; SCRATCH_LEN]);

impl Scratch {
    pub const NEW: Scratch = Scratch([0; SCRATCH_LEN]);
}

impl core::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Scratch({} bytes)", SCRATCH_LEN)
    }
}

/// What the receive path does with a packet after protection's checks.
#[derive(Debug)]
pub(crate) enum Admit<'a> {
    /// Unprotected and allowed: use the payload as parsed.
    Clear,
    /// Authenticated: this is the plaintext payload.
    #[cfg_attr(not(feature = "aead"), allow(dead_code))]
    Opened(&'a [u8]),
    /// Dropped (counted).
    Drop,
}

/// The key pool, the pre-shared keys and the counters.
pub struct KeyPool<B: Backing> {
    slots: Slice<B, KeySlot>,
    free_head: u32,
    free: u32,
    pub(crate) keyring: Keyring,
    pub(crate) stats: ProtectionStats,
}

impl<B: Backing> core::fmt::Debug for KeyPool<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyPool")
            .field("capacity", &self.capacity())
            .field("free", &self.free)
            .field("keyring", &self.keyring)
            .finish()
    }
}

impl<B: Backing> KeyPool<B> {
    /// A pool over `slots`, every one free, with no keys.
    pub fn new(mut slots: Slice<B, KeySlot>) -> Self {
        let n = slots.len().min(u32::MAX as usize - 2) as u32;
        for (i, s) in slots.iter_mut().enumerate().take(n as usize) {
            *s = KeySlot::VACANT;
            s.next = if i as u32 + 1 == n { END } else { i as u32 + 1 };
        }
        KeyPool {
            slots,
            free_head: if n == 0 { END } else { 0 },
            free: n,
            keyring: Keyring::default(),
            stats: ProtectionStats::default(),
        }
    }

    /// Slots in all.
    pub fn capacity(&self) -> u32 {
        self.slots.len().min(u32::MAX as usize - 2) as u32
    }

    /// Free slots.
    pub fn available(&self) -> u32 {
        self.free
    }

    fn alloc(&mut self) -> Option<u32> {
        if self.free_head == END {
            return None;
        }
        let i = self.free_head;
        let s = &mut self.slots[i as usize];
        self.free_head = s.next;
        s.next = UNLINKED;
        s.state = SlotState::Reserved;
        s.epoch = s.epoch.wrapping_add(1);
        self.free -= 1;
        Some(i)
    }

    /// Gives a connection's slot back; its keys are wiped (dropped with
    /// `aes-gcm`'s zeroize). The connection is unprotected afterwards.
    pub(crate) fn release(&mut self, p: &mut ConnProtection) {
        if let Some(i) = p.slot.take() {
            let s = &mut self.slots[i as usize];
            if s.next == UNLINKED {
                s.state = SlotState::Free;
                s.next = self.free_head;
                self.free_head = i;
                self.free += 1;
            }
        }
        p.key_id = 0;
    }

    fn refuse(&mut self, r: Refusal) -> Refusal {
        self.stats.count_refusal(r);
        r
    }

    /// An initiator's offer for a new connection (spec 5.3.6): none with
    /// policy `Off`; else the configured Key ID with a slot reserved for
    /// its keys. Where that cannot be, `Allow` offers none and `Require`
    /// refuses to connect.
    pub(crate) fn offer(&mut self, config: &ProtectionConfig) -> Result<ConnProtection, Refusal> {
        if config.policy == Policy::Off {
            return Ok(ConnProtection::NONE);
        }
        let reserved = if !super::SUPPORTED {
            Err(Refusal::Unsupported)
        } else if self.keyring.get(config.key_id).is_none() {
            Err(Refusal::UnknownKeyId)
        } else {
            self.alloc().ok_or(Refusal::NoKeySlot)
        };
        match reserved {
            Ok(i) => Ok(ConnProtection {
                slot: OptIndex::some(i),
                key_id: config.key_id,
            }),
            Err(_) if config.policy == Policy::Allow => Ok(ConnProtection::NONE),
            Err(r) => Err(self.refuse(r)),
        }
    }

    /// An acceptor's answer to a CONNECT (spec 5.3.6): the protection it
    /// chose, with a slot reserved, or why it refuses (counted).
    pub(crate) fn answer(
        &mut self,
        config: &ProtectionConfig,
        c: &ConnectRepr,
    ) -> Result<ConnProtection, Refusal> {
        let key_id =
            choose(config.policy, &self.keyring, c.suite, c.key_id).map_err(|r| self.refuse(r))?;
        if key_id == 0 {
            return Ok(ConnProtection::NONE);
        }
        let i = self
            .alloc()
            .ok_or(Refusal::NoKeySlot)
            .map_err(|r| self.refuse(r))?;
        Ok(ConnProtection {
            slot: OptIndex::some(i),
            key_id,
        })
    }

    /// An initiator checks the ACCEPT against its offer (spec 5.3.6) and,
    /// when it agrees on a suite, derives the keys. A refusal is counted;
    /// the caller ends the connection.
    pub(crate) fn on_accept(
        &mut self,
        p: &mut ConnProtection,
        early: bool,
        policy: Policy,
        offer: &ConnectRepr,
        accept: &ConnectRepr,
    ) -> Result<(), Refusal> {
        match (p.key_id, accept.suite) {
            (0, CipherSuite::None) => Ok(()),
            (0, _) => Err(self.refuse(Refusal::Mismatch)),
            (_, CipherSuite::None) if policy == Policy::Require => {
                Err(self.refuse(Refusal::ProtectionRequired))
            }
            (_, CipherSuite::None) => {
                self.release(p);
                Ok(())
            }
            (k, _) if accept.key_id == k => {
                if self.install(p, true, early, offer, accept) {
                    Ok(())
                } else {
                    Err(self.refuse(Refusal::UnknownKeyId))
                }
            }
            _ => Err(self.refuse(Refusal::Mismatch)),
        }
    }

    /// Derives the keys of a connection whose slot is reserved, from the
    /// pre-shared key it names and the handshake: `connect` as the
    /// initiator sent it, `accept` as the acceptor sent it. `early`: the
    /// CONNECT was a 0-RTT one, whose initiator-to-acceptor key derives
    /// from the CONNECT alone (spec 5.3.3); an initiator that sealed with
    /// it keeps its sealing state and only learns the opening key. `false`
    /// when the key is gone or the cipher is not compiled in.
    pub(crate) fn install(
        &mut self,
        p: &ConnProtection,
        initiator: bool,
        early: bool,
        connect: &ConnectRepr,
        accept: &ConnectRepr,
    ) -> bool {
        let Some(i) = p.slot.get() else {
            return false;
        };
        #[cfg(feature = "aead")]
        {
            let Some(psk) = self.keyring.get(p.key_id) else {
                return false;
            };
            let mut keys = super::kdf::derive(psk, &super::kdf::transcript(connect, accept));
            if early {
                keys.initiator_to_acceptor = super::early::early_keys(psk, connect);
            }
            let slot = &mut self.slots[i as usize];
            if let (true, true, SlotState::Keyed(session)) = (initiator, early, &mut slot.state) {
                session.set_open_key(&keys.acceptor_to_initiator);
                return true;
            }
            let role = if initiator {
                Role::Initiator
            } else {
                Role::Acceptor
            };
            slot.state = SlotState::Keyed(Session::new(p.key_id, &keys, role));
            true
        }
        #[cfg(not(feature = "aead"))]
        {
            let _ = (i, initiator, early, connect, accept);
            false
        }
    }

    /// An early initiator's sealing key, before any ACCEPT (spec 5.3.3):
    /// the connection can send its first flight. Until the ACCEPT it opens
    /// nothing: its opening key is the early key inverted, which no
    /// acceptor seals with. `false` when the key is gone.
    #[cfg(feature = "aead")]
    pub(crate) fn install_early(&mut self, p: &ConnProtection, connect: &ConnectRepr) -> bool {
        let (Some(i), Some(psk)) = (p.slot.get(), self.keyring.get(p.key_id)) else {
            return false;
        };
        let tx = super::early::early_keys(psk, connect);
        let mut unused = tx.clone();
        unused.key.iter_mut().for_each(|b| *b = !*b);
        let keys = super::kdf::KeyMaterial {
            initiator_to_acceptor: tx,
            acceptor_to_initiator: unused,
        };
        self.slots[i as usize].state =
            SlotState::Keyed(Session::new(p.key_id, &keys, Role::Initiator));
        true
    }

    /// An early initiator whose CONNECT drew a RETRY: its early keys are
    /// wiped and the slot is reserved again, for the keys of 5.3.3.
    pub(crate) fn unkey(&mut self, p: &ConnProtection) {
        if let Some(i) = p.slot.get() {
            self.slots[i as usize].state = SlotState::Reserved;
        }
    }

    /// The job key `key_id`, for early proofs (spec 4.2.4).
    #[cfg(feature = "aead")]
    pub(crate) fn psk(&self, key_id: u32) -> Option<&[u8; super::PSK_LEN]> {
        self.keyring.get(key_id)
    }

    /// Whether the connection holds its keys (every packet but CONNECT,
    /// ACCEPT and RETRY must then be protected).
    pub(crate) fn is_keyed(&self, p: &ConnProtection) -> bool {
        #[cfg(feature = "aead")]
        {
            p.slot.get().is_some_and(|i| {
                matches!(
                    self.slots.get(i as usize).map(|s| &s.state),
                    Some(SlotState::Keyed(_))
                )
            })
        }
        #[cfg(not(feature = "aead"))]
        {
            let _ = p;
            false
        }
    }

    /// Sender side, after the connection wrote a packet's headers into
    /// `buf`: on a keyed connection, sets PROTECTED, appends the security
    /// extension with the next IV and marks the transmit for sealing
    /// ([`KeyPool::seal`]). `None`: the packet cannot be sent (the IV
    /// space ran out, or `buf` has no room).
    #[inline]
    pub(crate) fn protect(
        &mut self,
        p: &ConnProtection,
        buf: &mut [u8],
        t: Transmit,
    ) -> Option<Transmit> {
        // The unkeyed case (every packet of a connection without
        // protection) decided at the call site, without passing the
        // transmit through a call.
        if !self.is_keyed(p) {
            return Some(t);
        }
        self.protect_keyed(p, buf, t)
    }

    fn protect_keyed(
        &mut self,
        p: &ConnProtection,
        buf: &mut [u8],
        t: Transmit,
    ) -> Option<Transmit> {
        if !PacketType::from(buf[field::TYPE]).allows_protection() {
            return Some(t);
        }
        #[cfg(feature = "aead")]
        {
            let hl = t.header_len;
            let i = p.slot.get()?;
            let slot = &mut self.slots[i as usize];
            let SlotState::Keyed(session) = &mut slot.state else {
                return Some(t);
            };
            if buf.len() < hl + SECURITY_LEN {
                return None;
            }
            let Some(iv) = session.next_iv() else {
                self.stats.iv_exhausted += 1;
                return None;
            };
            let flags = crate::wire::read_u16(buf, field::FLAGS) | Flags::PROTECTED.0;
            crate::wire::write_u16(buf, field::FLAGS, flags);
            SecurityRepr {
                key_id: session.key_id(),
                iv,
            }
            .emit(&mut buf[hl..hl + SECURITY_LEN]);
            self.stats.sealed += 1;
            Some(Transmit {
                header_len: hl + SECURITY_LEN,
                seal: Some(SealRef {
                    slot: i,
                    epoch: slot.epoch,
                }),
                ..t
            })
        }
        #[cfg(not(feature = "aead"))]
        {
            let _ = (p, buf);
            Some(t)
        }
    }

    /// Encrypts the payload of a protected transmit in place and writes
    /// its tag: `packet` is the whole packet (headers, gathered payload,
    /// tag and CRC space). A transmit whose connection's slot was taken
    /// again since gets a zero tag, which no receiver accepts. `false`
    /// when nothing was sealed that should have been.
    pub fn seal(&self, t: &Transmit, packet: &mut [u8]) -> bool {
        let Some(r) = t.seal else {
            return true;
        };
        let payload_len = t.payload.map_or(0, |p| p.len as usize);
        #[cfg(feature = "aead")]
        if let Some(KeySlot {
            state: SlotState::Keyed(session),
            epoch,
            ..
        }) = self.slots.get(r.slot as usize)
        {
            if *epoch == r.epoch && session.seal(packet, t.header_len, payload_len) {
                return true;
            }
        }
        let _ = r;
        let start = t.header_len + payload_len;
        if let Some(tag) = packet.get_mut(start..start + TAG_LEN) {
            tag.fill(0);
        }
        false
    }

    /// Receive side, for a packet that parsed and matched its connection:
    /// what protection lets through (spec 5.3.5). Every drop is counted.
    pub(crate) fn admit<'o>(
        &mut self,
        p: &ConnProtection,
        bytes: &[u8],
        out: &'o mut Scratch,
    ) -> Admit<'o> {
        let packet = Packet::new_unchecked(bytes);
        let keyed = self.is_keyed(p);
        match (packet.is_protected(), keyed) {
            (false, false) => Admit::Clear,
            (false, true) if !packet.packet_type().allows_protection() => Admit::Clear,
            (false, true) => {
                self.stats.unprotected += 1;
                Admit::Drop
            }
            (true, false) => {
                self.stats.unexpected_protected += 1;
                Admit::Drop
            }
            (true, true) => self.open(p, bytes, out),
        }
    }

    #[cfg(feature = "aead")]
    fn open<'o>(&mut self, p: &ConnProtection, bytes: &[u8], out: &'o mut Scratch) -> Admit<'o> {
        let (Some(i), Some(sealed)) = (p.slot.get(), crate::wire::protect::Sealed::split(bytes))
        else {
            self.stats.auth_failed += 1;
            return Admit::Drop;
        };
        let SlotState::Keyed(session) = &mut self.slots[i as usize].state else {
            self.stats.unexpected_protected += 1;
            return Admit::Drop;
        };
        match session.open(&sealed, &mut out.0) {
            Ok(()) => {
                self.stats.opened += 1;
                Admit::Opened(&out.0[..sealed.ciphertext.len()])
            }
            Err(e) => {
                let s = &mut self.stats;
                match e {
                    OpenError::WrongKeyId => s.wrong_key_id += 1,
                    OpenError::Replay(super::replay::Replay::Duplicate) => s.replayed += 1,
                    OpenError::Replay(super::replay::Replay::TooOld) => s.too_old += 1,
                    OpenError::Auth => s.auth_failed += 1,
                    OpenError::Oversized => s.oversized += 1,
                    OpenError::IvOutOfRange => s.iv_out_of_range += 1,
                }
                Admit::Drop
            }
        }
    }

    #[cfg(not(feature = "aead"))]
    fn open<'o>(&mut self, _: &ConnProtection, _: &[u8], _: &'o mut Scratch) -> Admit<'o> {
        self.stats.unexpected_protected += 1;
        Admit::Drop
    }
}

#[cfg(all(test, feature = "aead"))]
mod tests {
    use super::*;

    #[test]
    fn a_key_slot_fits_its_budget() {
        // Two AES-256 key schedules and GHASH keys, the IV counter and the
        // replay window (spec 5.3.7); the connection itself holds 8 bytes.
        let bytes = core::mem::size_of::<KeySlot>();
        std::println!("key slot: {bytes} bytes");
        assert!(bytes <= 4096, "{bytes}");
        assert_eq!(core::mem::size_of::<ConnProtection>(), 8);
    }
}
