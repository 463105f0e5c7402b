//! [`SimTransport`] for the MetaRoCE engine (`metaroce_core::Endpoint`),
//! unmodified: the adapter only moves bytes, time and memory in and out in
//! the order the endpoint's documentation gives.

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, Region, RxMeta, WorkRequest};
use metaroce_core::{finish_packet, CommandError, Config, Endpoint, Event, Instant};

use crate::memory::Arena;
use crate::transport::TxMeta;
use crate::transport::{SimTransport, TransportCounters, TransportError};

/// Connections per simulated host: enough for a 64-host all-to-all
/// (63 outgoing and 63 incoming).
pub const CONNECTIONS: usize = 128;
/// Paths per connection (the engine's default offer is 16).
pub const PATHS: usize = 16;

/// Largest header `poll_transmit` writes plus room: the payload and
/// trailer follow it.
const HEADER_ROOM: usize = 128;

/// Connection events the adapter saw (the simulator has no application
/// that waits for them: work is posted at once and queued by the engine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub connected: u64,
    pub closed: u64,
    pub failed: u64,
}

/// A MetaRoCE endpoint on a simulated host, with up to `C` connections of
/// up to `P` paths (the engine's capacities; an endpoint takes about
/// 8 KB per connection, so small runs use a small `C`).
#[derive(Debug)]
pub struct MetaRoce<const C: usize = CONNECTIONS, const P: usize = PATHS> {
    endpoint: Box<Endpoint<C, P>>,
    /// What the adapter saw of connection events.
    pub events: EventCounts,
}

impl<const C: usize, const P: usize> MetaRoce<C, P> {
    /// An endpoint with `config`, its randomness drawn from `seed`.
    pub fn new(config: Config, seed: u64) -> Self {
        MetaRoce {
            endpoint: Box::new(Endpoint::new(config, seed)),
            events: EventCounts::default(),
        }
    }

    /// The engine, for inspection.
    pub fn endpoint(&self) -> &Endpoint<C, P> {
        &self.endpoint
    }

    fn drain_events(&mut self) {
        while let Some(e) = self.endpoint.poll_event() {
            match e {
                Event::Connected(_) => self.events.connected += 1,
                Event::Closed(..) => self.events.closed += 1,
                _ => self.events.failed += 1,
            }
        }
    }
}

fn command_error(e: CommandError) -> TransportError {
    match e {
        CommandError::QueueFull => TransportError::Retry,
        CommandError::NoFreeConnection => TransportError::Refused("no free connection"),
        CommandError::UnknownConnection => TransportError::Refused("unknown connection"),
        CommandError::NotOpen => TransportError::Refused("connection not open"),
        CommandError::LocalProtection(_) => TransportError::Refused("local protection"),
        CommandError::Region(_) => TransportError::Refused("region"),
        CommandError::BadLength => TransportError::Refused("bad length"),
    }
}

impl<const C: usize, const P: usize> SimTransport for MetaRoce<C, P> {
    fn name(&self) -> &'static str {
        "MetaRoCE"
    }

    fn register_region(&mut self, region: Region) -> Result<u32, TransportError> {
        self.endpoint.register_region(region).map_err(command_error)
    }

    fn connect_pair(
        now: Instant,
        a: &mut Self,
        _a_addr: PeerAddr,
        _b: &mut Self,
        b_addr: PeerAddr,
    ) -> Result<ConnHandle, TransportError> {
        // The peer accepts on its own (`Config::accept_incoming`).
        a.endpoint.connect(now, b_addr, 0).map_err(command_error)
    }

    fn post_send(&mut self, conn: ConnHandle, wr: WorkRequest) -> Result<(), TransportError> {
        self.endpoint.post_send(conn, wr).map_err(command_error)
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        _dst_port: u16,
        packet: &[u8],
        mem: &mut Arena,
    ) {
        self.endpoint.handle_packet(now, meta, packet, mem);
        self.drain_events();
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.endpoint.handle_timeout(now);
        self.drain_events();
    }

    fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut Arena,
        out: &mut Vec<u8>,
    ) -> Option<TxMeta> {
        let max = usize::from(self.endpoint.config().mtu) + HEADER_ROOM;
        out.clear();
        out.resize(max, 0);
        let t = self.endpoint.poll_transmit(now, out)?;
        if t.packet_len() > out.len() {
            out.resize(t.packet_len(), 0);
        }
        let len = finish_packet(&t, out, mem);
        out.truncate(len);
        self.drain_events();
        Some(TxMeta {
            peer: t.peer,
            src_port: t.src_port,
            ecn: t.ecn,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.endpoint.poll_timeout()
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        self.endpoint.poll_completion()
    }

    fn counters(&self) -> TransportCounters {
        let mut c = TransportCounters::default();
        for h in self.endpoint.handles() {
            let Some(s) = self.endpoint.stats(h) else {
                continue;
            };
            c += TransportCounters {
                packets_sent: s.packets_sent + s.retransmissions + s.acks_sent + s.naks_sent,
                first_transmissions: s.packets_sent,
                retransmissions: s.retransmissions,
                spurious_retransmissions: s.spurious_retransmissions,
                timeouts: s.timeouts,
                naks_sent: s.naks_sent,
                discarded: s.duplicates_received + s.out_of_window + s.invalid_dropped,
                ce_received: s.ce_received,
            };
        }
        c.discarded += self.endpoint.drops().total();
        c
    }
}
