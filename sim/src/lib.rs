//! # metaroce-sim
//!
//! A deterministic discrete-event simulator of a data-centre fabric, for
//! comparing MetaRoCE with RoCEv2 under the same topology, workload and
//! impairments. Hosts have a NIC that serialises at line rate; switches
//! have per-port output queues with finite buffers (drop-tail) and ECN
//! marking (DCTCP threshold or RED); ECMP hashes the 5-tuple including the
//! UDP source port; links have a rate, a propagation delay, random or
//! bursty (Gilbert-Elliott) loss, and can fail at a given time; switches
//! can run PFC. Topologies: two hosts back to back, and leaf-spine fabrics
//! (64 hosts by default). Time is virtual ([`metaroce_core::Instant`]);
//! the same seed gives the same run.
//!
//! It is **not** a model of any particular switch or NIC (no shared
//! buffer, no per-priority PFC, no header parsing in the fabric), and it
//! is std code without async or a wall clock inside a run (runs with large
//! endpoints go to a thread with a bigger stack, one run at a time).
//!
//! Layers:
//! * [`event`], [`rng`]: the event heap and the seeded random streams.
//! * [`packet`], [`link`], [`queue`], [`ecmp`]: the fabric's parts.
//! * [`topology`]: nodes and links; [`network`]: the event loop.
//! * [`transport`]: the [`SimTransport`] trait hosts run, with adapters
//!   for MetaRoCE ([`metaroce`], behind the platform layer's engine loop)
//!   and the RoCEv2 baseline ([`roce`]), and a
//!   scripted [`probe`] for fabric tests.
//! * [`memory`]: a host's byte arena, stored or synthetic; [`workload`]: flows of RDMA WRITEs
//!   with completion times and integrity checks; [`stream`]: long flows
//!   in bounded memory, with goodput sampled over time.
//! * [`two_site`]: two leaf-spine sites joined by long-haul links;
//!   [`topology::FatTree`]: three tiers (pods, leaves, spines, cores).
//! * [`experiments`]: the fabric experiments as functions returning rows;
//!   [`long_haul`]: the two-site experiment, with its own tables and options;
//!   [`scale`]: clusters of thousands of hosts, MetaRoCE alone, with
//!   flows of a pattern or from a file ([`flow_file`]);
//!   [`plot`]: SVG charts. The `metaroce-sim` binary (`cargo xtask sim`)
//!   prints, writes CSV and plots.

pub mod ecmp;
pub mod event;
pub mod experiments;
pub mod flow_file;
pub mod link;
pub mod long_haul;
pub mod memory;
pub mod metaroce;
pub mod network;
pub mod packet;
pub mod plot;
pub mod probe;
pub mod queue;
pub mod rng;
pub mod roce;
pub mod scale;
pub mod stream;
pub mod topology;
pub mod transport;
pub mod two_site;
pub mod workload;

pub use link::{LinkConfig, LossModel};
pub use network::{SimConfig, Simulator, Step};
pub use packet::{HostId, Packet};
pub use queue::{EcnPolicy, QueueConfig};
pub use topology::{FatTree, LeafSpine, PfcConfig, Topology};
pub use transport::{SendProgress, SimTransport, TransportCounters, TransportError, TxMeta};
pub use workload::{Flow, FlowResult, FlowStatus, HostMemory, Report, WorkloadConfig};
