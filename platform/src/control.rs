//! The control operations a host interface asks of a transport endpoint,
//! behind one small trait: [`HostControl`].
//!
//! The data path (work requests, completions, packets, timers) goes through
//! [`crate::transport::Transport`] and the engine loop; everything else a
//! host may ask for goes through here: memory registration, connection
//! lifecycle (connect, accept, close, release) and its events, and the
//! counters a host may query. [`crate::hostif`] uses only this trait, so a
//! new endpoint API (generational handles, caller-supplied storage,
//! explicit `Incoming` events) is adopted by re-implementing it, in one
//! place, without touching the host interface.
//!
//! The implementation for the MetaRoCE [`Endpoint`] is below: its
//! generational handles, its `Incoming` events, `set_pd` for the domain
//! the host accepts a connection into, and `release`.

use metaroce_core::api::{ConnHandle, PeerAddr, Region, Status};
use metaroce_core::config::AcceptDomain;
use metaroce_core::stats::ConnStats;
use metaroce_core::wire::CloseReason;
use metaroce_core::{Backing, CommandError, ConnState, Endpoint, Event, Instant};

/// Why a control operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ControlError {
    /// A table (regions, connections) is full.
    NoResources,
    /// The range is empty or wraps around.
    BadRange,
    /// No region has this key.
    UnknownKey,
    /// No connection has this handle.
    UnknownConnection,
    /// The connection is not in a state that allows this.
    WrongState,
    /// The connection belongs to another protection domain than asked.
    WrongDomain,
}

/// A connection event, in the shape the host interface reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ControlEvent {
    /// A peer opened a connection; the host accepts or closes it.
    Incoming { conn: ConnHandle, peer: PeerAddr },
    /// A connection's handshake completed. (An endpoint that accepts by
    /// itself reports an accepted connection only this way; the host
    /// interface then treats a handle it never opened as incoming.)
    Connected(ConnHandle),
    /// A connection closed; `reason` is the wire's CLOSE reason code.
    Closed { conn: ConnHandle, reason: u8 },
    /// A connection failed; its work was flushed.
    Failed { conn: ConnHandle, status: Status },
}

/// Transport counters of one connection, as a host may query them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConnCounters {
    pub retransmissions: u64,
    pub timeouts: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub ce_received: u64,
    /// The most PSNs the connection had outstanding at once (spec 4.4).
    pub max_in_flight: u64,
}

/// The control operations of a transport endpoint (see the module docs).
pub trait HostControl {
    /// Registers a region (its `pd` set by the caller); returns its key.
    fn register_region(&mut self, region: Region) -> Result<u32, ControlError>;
    /// Deregisters the region with `key`.
    fn deregister_region(&mut self, key: u32) -> Result<(), ControlError>;
    /// Opens a connection to `peer` in protection domain `pd`.
    fn connect(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        pd: u32,
    ) -> Result<ConnHandle, ControlError>;
    /// Takes an incoming connection into protection domain `pd`.
    fn accept(&mut self, now: Instant, conn: ConnHandle, pd: u32) -> Result<(), ControlError>;
    /// Closes a connection gracefully (or refuses an incoming one).
    fn close(&mut self, now: Instant, conn: ConnHandle) -> Result<(), ControlError>;
    /// Frees a closed or failed connection's slot once it is drained.
    fn release(&mut self, conn: ConnHandle) -> Result<(), ControlError>;
    /// The next connection event.
    fn poll_event(&mut self) -> Option<ControlEvent>;
    /// The peer of a connection.
    fn peer(&self, conn: ConnHandle) -> Option<PeerAddr>;
    /// Whether the connection has ended (closed or failed).
    fn has_ended(&self, conn: ConnHandle) -> bool;
    /// The table index of a handle: the host interface keys its own
    /// per-connection state by it. Below [`HostControl::max_connections`].
    fn slot(&self, conn: ConnHandle) -> usize;
    /// A connection's transport counters.
    fn counters(&self, conn: ConnHandle) -> Option<ConnCounters>;
    /// The receiver's current fair-share rate hint, Mbit/s.
    fn rate_hint(&self, now: Instant) -> u32;
    /// The protection domain incoming connections must be accepted into,
    /// if the endpoint fixes one (`None`: any, chosen at accept).
    fn incoming_domain(&self) -> Option<u32>;
    /// Connection slots in all.
    fn max_connections(&self) -> usize;
    /// Region slots in all.
    fn max_regions(&self) -> usize;
}

impl From<CommandError> for ControlError {
    fn from(e: CommandError) -> Self {
        match e {
            // No key slot or key for the protection the policy requires.
            CommandError::NoFreeConnection | CommandError::Protection(_) => {
                ControlError::NoResources
            }
            CommandError::UnknownConnection => ControlError::UnknownConnection,
            CommandError::NotOpen
            | CommandError::QueueFull
            | CommandError::BadLength
            | CommandError::NotClosed
            | CommandError::NotDrained => ControlError::WrongState,
            CommandError::LocalProtection(_) => ControlError::WrongDomain,
            CommandError::Region(metaroce_core::memory::RegionError::Full) => {
                ControlError::NoResources
            }
            CommandError::Region(metaroce_core::memory::RegionError::BadRange) => {
                ControlError::BadRange
            }
            CommandError::Region(metaroce_core::memory::RegionError::UnknownKey) => {
                ControlError::UnknownKey
            }
        }
    }
}

fn close_code(reason: CloseReason) -> u8 {
    reason.code()
}

impl<B: Backing, const P: usize> HostControl for Endpoint<B, P> {
    fn register_region(&mut self, region: Region) -> Result<u32, ControlError> {
        Ok(Endpoint::register_region(self, region)?)
    }

    fn deregister_region(&mut self, key: u32) -> Result<(), ControlError> {
        Endpoint::deregister_region(self, key)?;
        Ok(())
    }

    fn connect(
        &mut self,
        now: Instant,
        peer: PeerAddr,
        pd: u32,
    ) -> Result<ConnHandle, ControlError> {
        Ok(Endpoint::connect(self, now, peer, pd)?)
    }

    /// The endpoint accepted the connection already (`Incoming`); the host
    /// chooses its domain: one shared domain must match, otherwise the
    /// connection moves into `pd`.
    fn accept(&mut self, _now: Instant, conn: ConnHandle, pd: u32) -> Result<(), ControlError> {
        match self.state(conn).ok_or(ControlError::UnknownConnection)? {
            ConnState::Accepting | ConnState::Established => {}
            _ => return Err(ControlError::WrongState),
        }
        match self.config().accept_domain {
            AcceptDomain::Shared(shared) if shared != pd => Err(ControlError::WrongDomain),
            AcceptDomain::Shared(_) => Ok(()),
            AcceptDomain::PerConnection => Ok(self.set_pd(conn, pd)?),
        }
    }

    fn close(&mut self, now: Instant, conn: ConnHandle) -> Result<(), ControlError> {
        Ok(Endpoint::close(self, now, conn)?)
    }

    fn release(&mut self, conn: ConnHandle) -> Result<(), ControlError> {
        Ok(Endpoint::release(self, conn)?)
    }

    fn poll_event(&mut self) -> Option<ControlEvent> {
        Some(match Endpoint::poll_event(self)? {
            Event::Incoming { conn, peer } => ControlEvent::Incoming { conn, peer },
            Event::Connected(conn) => ControlEvent::Connected(conn),
            Event::Closed { conn, reason } => ControlEvent::Closed {
                conn,
                reason: close_code(reason),
            },
            Event::Failed { conn, status } => ControlEvent::Failed { conn, status },
        })
    }

    fn peer(&self, conn: ConnHandle) -> Option<PeerAddr> {
        Endpoint::peer(self, conn)
    }

    fn has_ended(&self, conn: ConnHandle) -> bool {
        self.state(conn).is_none_or(ConnState::is_terminal)
    }

    fn slot(&self, conn: ConnHandle) -> usize {
        conn.index as usize
    }

    fn counters(&self, conn: ConnHandle) -> Option<ConnCounters> {
        let s: ConnStats = self.stats(conn)?;
        Some(ConnCounters {
            retransmissions: s.retransmissions,
            timeouts: s.timeouts,
            packets_sent: s.packets_sent,
            packets_received: s.packets_received,
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            ce_received: s.ce_received,
            max_in_flight: s.max_in_flight,
        })
    }

    fn rate_hint(&self, _now: Instant) -> u32 {
        self.last_rate_hint()
    }

    fn incoming_domain(&self) -> Option<u32> {
        match self.config().accept_domain {
            AcceptDomain::Shared(pd) => Some(pd),
            AcceptDomain::PerConnection => None,
        }
    }

    fn max_connections(&self) -> usize {
        self.capacity()
    }

    fn max_regions(&self) -> usize {
        self.regions().capacity()
    }
}
