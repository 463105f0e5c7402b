//! A scripted test transport: it sends the packets it was told to, when it
//! was told to (as fast as the NIC allows), and records what arrives. The
//! simulator's own tests and calibration runs use it to look at the fabric
//! without a protocol in the way.

use metaroce_core::api::{Completion, ConnHandle, PeerAddr, Region, RxMeta, WorkRequest};
use metaroce_core::Instant;

use crate::memory::Arena;
use crate::transport::{SimTransport, TransportCounters, TransportError, TxMeta};

/// A packet to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Send {
    /// Not before this instant.
    pub at: Instant,
    pub to: PeerAddr,
    pub src_port: u16,
    /// UDP payload bytes.
    pub len: usize,
    pub ecn: u8,
}

/// A packet that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub at: Instant,
    pub from: PeerAddr,
    pub ce: bool,
    pub len: usize,
}

/// The scripted transport.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    /// Still to send, in order.
    pub script: std::collections::VecDeque<Send>,
    pub received: Vec<Received>,
    /// When each packet actually left (entered the NIC).
    pub sent_at: Vec<Instant>,
}

impl SimTransport for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }

    fn register_region(&mut self, _region: Region) -> Result<u32, TransportError> {
        Ok(1)
    }

    fn connect_pair(
        _now: Instant,
        _a: &mut Self,
        _a_addr: PeerAddr,
        _b: &mut Self,
        _b_addr: PeerAddr,
    ) -> Result<ConnHandle, TransportError> {
        Ok(ConnHandle {
            index: 0,
            generation: 0,
        })
    }

    fn post_send(&mut self, _conn: ConnHandle, _wr: WorkRequest) -> Result<(), TransportError> {
        Err(TransportError::Refused("the probe only follows its script"))
    }

    fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RxMeta,
        _dst_port: u16,
        packet: &[u8],
        _mem: &mut Arena,
    ) {
        self.received.push(Received {
            at: now,
            from: meta.source,
            ce: meta.ce,
            len: packet.len(),
        });
    }

    fn handle_timeout(&mut self, _now: Instant, _mem: &mut Arena) {}

    fn poll_transmit(
        &mut self,
        now: Instant,
        _mem: &mut Arena,
        out: &mut Vec<u8>,
    ) -> Option<TxMeta> {
        if self.script.front()?.at > now {
            return None;
        }
        let s = self.script.pop_front()?;
        self.sent_at.push(now);
        out.clear();
        out.resize(s.len, 0);
        Some(TxMeta {
            peer: s.to,
            src_port: s.src_port,
            ecn: s.ecn,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.script.front().map(|s| s.at)
    }

    fn poll_completion(&mut self) -> Option<Completion> {
        None
    }

    fn counters(&self) -> TransportCounters {
        TransportCounters {
            packets_sent: self.sent_at.len() as u64,
            first_transmissions: self.sent_at.len() as u64,
            ..TransportCounters::default()
        }
    }
}
