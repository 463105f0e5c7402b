//! Admin commands and connection events of the host interface (spec 6.6):
//! each command is checked against the set's ownership (its window, its
//! keys, its connections and their generations) before it reaches the
//! endpoint through [`HostControl`]; each event goes to the set owning
//! the connection.

use metaroce_abi as abi;
use metaroce_core::api::{Access, ConnHandle, Region};
use metaroce_core::Instant;

use super::rings::Bell;
use super::{
    convert, count_refusal, ConnEntry, HostInterface, OwnedRegion, Phase, Q_BYTES, Q_COMMANDS,
    Q_CONNS, Q_REGIONS,
};
use crate::control::{ControlError, ControlEvent, HostControl};
use crate::engine::EngineStats;

/// The ABI status of a refused control operation.
#[inline(never)]
fn status_of(e: ControlError) -> u8 {
    match e {
        ControlError::NoResources => abi::STATUS_NO_RESOURCES,
        ControlError::BadRange => abi::STATUS_BAD_LENGTH,
        ControlError::UnknownKey => abi::STATUS_BAD_KEY,
        ControlError::UnknownConnection => abi::STATUS_BAD_CONNECTION,
        ControlError::WrongState => abi::STATUS_INVALID_REQUEST,
        ControlError::WrongDomain => abi::STATUS_NOT_PERMITTED,
    }
}

/// What a command answers: a value (key) and a connection, or a status.
type Answer = Result<(u64, Option<(u32, u32)>), u8>;

impl<const CONNS: usize> HostInterface<'_, CONNS> {
    /// Takes up to the admin budget of set `i`'s commands, while its admin
    /// completion queue has room for the answers.
    pub(super) fn serve_admin<C: HostControl>(
        &mut self,
        i: usize,
        now: Instant,
        control: &mut C,
        engine: &EngineStats,
    ) -> bool {
        let shm = self.shm;
        let Some(set) = self.sets.get_mut(i) else {
            return false;
        };
        let reading = set.aq.read(&shm, set.bell(Bell::Aq), abi::DEFAULT_AQ_DEPTH);
        set.counters.bad_producer_index += u64::from(reading.bad_index);
        set.counters.spurious_doorbells += u64::from(reading.spurious);
        let ring = set.aq_ring();
        let mut moved = false;
        for _ in 0..reading.ready.min(super::ADMIN_BUDGET) {
            let set = &mut self.sets[i];
            if !set.pending_acqes.is_empty() || set.acq_free(&shm) == 0 {
                break;
            }
            let Ok(cmd) = shm.read::<abi::AdminCmd>(ring.slot(set.aq.consumer)) else {
                self.stats.shm_faults += 1;
                break;
            };
            set.counters.admin_commands += 1;
            self.stats.admin_commands += 1;
            let answer = self.execute(i, now, &cmd, control, engine);
            let set = &mut self.sets[i];
            let mut acqe = abi::AdminCqe {
                tag: cmd.tag,
                kind: abi::EVENT_COMMAND_DONE,
                opcode: cmd.opcode,
                ..abi::AdminCqe::default()
            };
            match answer {
                Ok((value, conn)) => {
                    acqe.value = value;
                    if let Some((index, generation)) = conn {
                        acqe.conn_index = index;
                        acqe.conn_generation = generation;
                    }
                }
                Err(status) => {
                    count_refusal(&mut set.counters, status);
                    self.stats.refused += 1;
                    acqe.status = status;
                    acqe.conn_index = cmd.conn_index;
                    acqe.conn_generation = cmd.conn_generation;
                }
            }
            set.answer(&shm, acqe);
            set.aq.consumer = set.aq.consumer.wrapping_add(1);
            moved = true;
        }
        moved
    }

    /// Carries out one command for set `i`.
    #[inline(never)]
    fn execute<C: HostControl>(
        &mut self,
        i: usize,
        now: Instant,
        cmd: &abi::AdminCmd,
        control: &mut C,
        engine: &EngineStats,
    ) -> Answer {
        if cmd.flags != 0 {
            return Err(abi::STATUS_INVALID_REQUEST);
        }
        let set_index = i as u8;
        let pd = self.sets[i].pd;
        match cmd.opcode {
            abi::ADMIN_REGISTER_REGION => self.register(i, cmd, control),
            abi::ADMIN_DEREGISTER_REGION => {
                let at = self
                    .regions
                    .iter()
                    .position(|r| r.key == cmd.key)
                    .ok_or(abi::STATUS_BAD_KEY)?;
                if self.regions[at].set != set_index {
                    return Err(abi::STATUS_NOT_PERMITTED);
                }
                control.deregister_region(cmd.key).map_err(status_of)?;
                self.regions.swap_remove(at);
                Ok((0, None))
            }
            abi::ADMIN_CONNECT => {
                self.take(i, 1 << Q_CONNS | 1 << Q_COMMANDS, 0)?;
                let peer = convert::peer_addr(&cmd.ip, cmd.port);
                let h = control.connect(now, peer, pd).map_err(status_of)?;
                let id = self.adopt(control, h, set_index, Phase::Opening);
                match id {
                    Some(id) => Ok((0, Some(id))),
                    None => {
                        let _ = control.close(now, h);
                        Err(abi::STATUS_NO_RESOURCES)
                    }
                }
            }
            abi::ADMIN_LISTEN => {
                if control.incoming_domain().is_some_and(|d| d != pd)
                    || self.listener.is_some_and(|l| l != set_index)
                {
                    return Err(abi::STATUS_NOT_PERMITTED);
                }
                self.listener = Some(set_index);
                Ok((0, None))
            }
            abi::ADMIN_ACCEPT => {
                let (slot, e) = self.owned(i, cmd)?;
                if e.phase != Phase::Offered {
                    return Err(abi::STATUS_INVALID_REQUEST);
                }
                control.accept(now, e.handle, pd).map_err(status_of)?;
                self.set_phase(slot, Phase::Open);
                Ok((0, Some((slot as u32, e.generation))))
            }
            abi::ADMIN_CLOSE => {
                let (slot, e) = self.owned(i, cmd)?;
                if e.phase == Phase::Ended {
                    return Err(abi::STATUS_INVALID_REQUEST);
                }
                control.close(now, e.handle).map_err(status_of)?;
                Ok((0, Some((slot as u32, e.generation))))
            }
            abi::ADMIN_RELEASE => {
                let (slot, e) = self.owned(i, cmd)?;
                if e.phase != Phase::Ended && !control.has_ended(e.handle) {
                    return Err(abi::STATUS_INVALID_REQUEST);
                }
                control.release(e.handle).map_err(status_of)?;
                self.forget(slot);
                Ok((0, Some((slot as u32, e.generation))))
            }
            abi::ADMIN_QUERY_COUNTERS => {
                self.write_counters(i, now, control, engine);
                Ok((0, None))
            }
            abi::ADMIN_SET_QUOTA => {
                // Only the management set (the last) sets quotas.
                if i + 1 != self.sets.len() {
                    return Err(abi::STATUS_NOT_PERMITTED);
                }
                // The slot as `abi::QuotaCmd`: the set in bytes 12..16, the
                // limits in words 2..7.
                let words: [u64; 8] = zerocopy::transmute!(*cmd);
                let set = self
                    .sets
                    .get_mut((words[1] >> 32) as usize)
                    .ok_or(abi::STATUS_INVALID_REQUEST)?;
                set.limit[..super::QUOTAS].copy_from_slice(&words[2..7]);
                Ok((0, None))
            }
            _ => Err(abi::STATUS_BAD_OPCODE),
        }
    }

    fn register<C: HostControl>(
        &mut self,
        i: usize,
        cmd: &abi::AdminCmd,
        control: &mut C,
    ) -> Answer {
        if cmd.access & !abi::ACCESS_ALL != 0 {
            return Err(abi::STATUS_INVALID_REQUEST);
        }
        if cmd.len == 0 {
            return Err(abi::STATUS_BAD_LENGTH);
        }
        let set = &self.sets[i];
        let pd = set.pd;
        if !set.in_window(cmd.addr, cmd.len) {
            // Outside this tenant's window: another tenant's memory, the
            // queues, or nothing at all.
            return Err(abi::STATUS_NOT_PERMITTED);
        }
        self.take(i, 1 << Q_REGIONS | 1 << Q_BYTES, cmd.len)?;
        if self.regions.is_full() {
            return Err(abi::STATUS_NO_RESOURCES);
        }
        let region = Region {
            base: cmd.addr,
            len: cmd.len,
            access: Access(cmd.access as u8),
            pd,
        };
        let key = control.register_region(region).map_err(status_of)?;
        let _ = self.regions.push(OwnedRegion {
            key,
            set: i as u8,
            len: cmd.len,
        });
        Ok((u64::from(key), None))
    }

    /// The connection a command names, if set `i` holds it at that
    /// generation.
    #[inline(never)]
    fn owned(&self, i: usize, cmd: &abi::AdminCmd) -> Result<(usize, ConnEntry), u8> {
        let slot = cmd.conn_index as usize;
        match self.conns.get(slot).copied().flatten() {
            Some(e) if usize::from(e.set) == i && e.generation == cmd.conn_generation => {
                Ok((slot, e))
            }
            _ => Err(abi::STATUS_BAD_CONNECTION),
        }
    }

    fn set_phase(&mut self, slot: usize, phase: Phase) {
        if let Some(Some(e)) = self.conns.get_mut(slot) {
            e.phase = phase;
        }
    }

    /// Records a new connection for set `set` with a fresh generation;
    /// `None` if its slot is beyond the table.
    #[inline(never)]
    fn adopt<C: HostControl>(
        &mut self,
        control: &C,
        handle: ConnHandle,
        set: u8,
        phase: Phase,
    ) -> Option<(u32, u32)> {
        let slot = control.slot(handle);
        let generation = self.generations.get_mut(slot)?;
        *generation = generation.wrapping_add(1);
        let generation = *generation;
        self.forget(slot);
        self.conns[slot] = Some(ConnEntry {
            handle,
            set,
            generation,
            phase,
            outstanding: 0,
        });
        Some((slot as u32, generation))
    }

    /// Routes the endpoint's connection events to the owning sets.
    pub(super) fn route_events<C: HostControl>(&mut self, now: Instant, control: &mut C) -> bool {
        let mut any = false;
        while let Some(event) = control.poll_event() {
            any = true;
            match event {
                ControlEvent::Incoming { conn, .. } => self.offer(now, control, conn),
                ControlEvent::Connected(conn) => {
                    let slot = control.slot(conn);
                    match self.conns.get(slot).copied().flatten() {
                        Some(e) if e.handle == conn && e.phase == Phase::Opening => {
                            self.set_phase(slot, Phase::Open);
                            self.notify(slot, abi::EVENT_CONNECTED, 0, 0);
                        }
                        // An accepted connection (offered on its `Incoming`
                        // event) completing its handshake: nothing to tell.
                        _ => {}
                    }
                }
                ControlEvent::Closed { conn, reason } => {
                    self.end(control, conn, abi::EVENT_CLOSED, 0, u32::from(reason))
                }
                ControlEvent::Failed { conn, status } => {
                    self.end(control, conn, abi::EVENT_FAILED, convert::status(status), 0)
                }
            }
        }
        any
    }

    /// Offers an incoming connection to the listening set, or closes it.
    #[inline(never)]
    fn offer<C: HostControl>(&mut self, now: Instant, control: &mut C, conn: ConnHandle) {
        let Some(listener) = self.listener else {
            self.stats.unclaimed_incoming += 1;
            let _ = control.close(now, conn);
            return;
        };
        let l = usize::from(listener);
        if let Err(status) = self.take(l, 1 << Q_CONNS, 0) {
            count_refusal(&mut self.sets[l].counters, status);
            self.stats.unclaimed_incoming += 1;
            let _ = control.close(now, conn);
            return;
        }
        let Some((slot, generation)) = self.adopt(control, conn, listener, Phase::Offered) else {
            self.stats.unclaimed_incoming += 1;
            let _ = control.close(now, conn);
            return;
        };
        let peer = control.peer(conn);
        let set = &mut self.sets[usize::from(listener)];
        set.answer(
            &self.shm,
            abi::AdminCqe {
                conn_index: slot,
                conn_generation: generation,
                ip: peer.map_or([0; 16], |p| convert::ip_bytes(&p.ip)),
                port: peer.map_or(0, |p| p.port),
                kind: abi::EVENT_INCOMING,
                ..abi::AdminCqe::default()
            },
        );
    }

    /// Marks a connection ended and tells its set.
    #[inline(never)]
    fn end<C: HostControl>(
        &mut self,
        control: &C,
        conn: ConnHandle,
        kind: u8,
        status: u8,
        detail: u32,
    ) {
        let slot = control.slot(conn);
        match self.conns.get(slot).copied().flatten() {
            Some(e) if e.handle == conn && e.phase != Phase::Ended => {
                self.set_phase(slot, Phase::Ended);
                self.notify(slot, kind, status, detail);
            }
            _ => {}
        }
    }

    /// Sends a connection event to the set owning `slot`.
    #[inline(never)]
    fn notify(&mut self, slot: usize, kind: u8, status: u8, detail: u32) {
        let Some(e) = self.conns.get(slot).copied().flatten() else {
            return;
        };
        let Some(set) = self.sets.get_mut(usize::from(e.set)) else {
            return;
        };
        set.answer(
            &self.shm,
            abi::AdminCqe {
                conn_index: slot as u32,
                conn_generation: e.generation,
                detail,
                kind,
                status,
                ..abi::AdminCqe::default()
            },
        );
    }

    /// Writes set `i`'s counters, its connections' transport counters and
    /// the device's into the set's counter block.
    fn write_counters<C: HostControl>(
        &mut self,
        i: usize,
        now: Instant,
        control: &C,
        engine: &EngineStats,
    ) {
        let mut c = self.sets[i].counters;
        c.transport_retransmissions = 0;
        c.transport_timeouts = 0;
        c.transport_packets_sent = 0;
        c.transport_packets_received = 0;
        c.transport_bytes_sent = 0;
        c.transport_bytes_received = 0;
        c.transport_ce_received = 0;
        c.transport_max_in_flight = 0;
        for e in self
            .conns
            .iter()
            .flatten()
            .filter(|e| usize::from(e.set) == i)
        {
            if let Some(t) = control.counters(e.handle) {
                c.transport_retransmissions += t.retransmissions;
                c.transport_timeouts += t.timeouts;
                c.transport_packets_sent += t.packets_sent;
                c.transport_packets_received += t.packets_received;
                c.transport_bytes_sent += t.bytes_sent;
                c.transport_bytes_received += t.bytes_received;
                c.transport_ce_received += t.ce_received;
                c.transport_max_in_flight = c.transport_max_in_flight.max(t.max_in_flight);
            }
        }
        c.device_rx_frames = engine.rx_frames;
        c.device_tx_frames = engine.tx_frames;
        c.device_dma_faults = engine.dma_faults;
        c.device_rate_hint_mbps = u64::from(control.rate_hint(now));
        let quota = self.set_quota(i).unwrap_or_default();
        let set = &mut self.sets[i];
        set.counters = c;
        let base = set.base;
        if self
            .shm
            .write(base + u64::from(abi::SET_COUNTERS), &c)
            .is_err()
            || self
                .shm
                .write(base + u64::from(abi::SET_QUOTA), &quota)
                .is_err()
        {
            self.stats.shm_faults += 1;
        }
    }
}
