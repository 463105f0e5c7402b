//! # roce-baseline
//!
//! A RoCEv2 Reliable Connection transport, written to be compared with
//! MetaRoCE on the same simulator, QEMU fabric and host harness: the wire
//! formats of the InfiniBand specification (BTH, RETH, AETH, ImmDt, the
//! ICRC of annex A17, UDP port 4791), the RC requester and responder with
//! go-back-N recovery, the retry timer and RNR retries of a hardware NIC,
//! and DCQCN congestion control. Like `metaroce-core` it is a sans-IO state
//! machine: no clock reads (time is an argument), no I/O, no allocation, no
//! `unsafe`, fixed capacities. It speaks through the same API types
//! (`metaroce_core::api`), so one harness drives either protocol.
//!
//! It is **not** a full verbs implementation: only RC, no atomics, no UD/UC,
//! no shared receive queues, no memory windows; queue pairs are wired
//! together out of band ([`RoceEndpoint::create_qp`]) as RDMA-CM would.
//! Its purpose is to be a faithful baseline, including the behaviour under
//! loss that MetaRoCE is built to beat.
//!
//! Layers:
//! * [`wire`]: header views and `Repr`s, the ICRC, frames.
//! * [`psn`]: 24-bit packet sequence number arithmetic.
//! * [`cc`]: DCQCN (reaction and notification points) and no control.
//! * [`endpoint`]: the queue pairs and the endpoint that drives them.
//!
//! "IBA" means the InfiniBand Architecture Specification Vol. 1 and
//! "annex A17" its RoCEv2 annex. Where behaviour was checked against Linux
//! rxe (`drivers/infiniband/sw/rxe`), the comment says so.

#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

pub mod cc;
pub mod config;
pub mod endpoint;
pub mod psn;
pub mod qp;
pub mod regions;
pub mod stats;
pub mod wire;

pub use cc::{Cc, CcConfig, CongestionControl, Dcqcn, DcqcnConfig};
pub use config::{Config, QpSetup};
pub use endpoint::{Error, RoceEndpoint, RxError, MAX_HEADER_LEN};
pub use qp::{PostError, QpState};
pub use stats::{EndpointCounters, QpCounters};
pub use wire::frame::{emit_frame, finish, ip_udp_header, parse_frame, transport_len};
pub use wire::UDP_PORT;
