//! `metaroce serve --threads N`: the sharding of the firmware's cores
//! (`metaroce_platform::shard`, `boards/qemu-virt/src/multicore.rs`) on
//! host threads. Each engine thread owns one shard of one connection
//! table (`Endpoint::new_shard`: thread `t` holds slots
//! `[t * s, (t + 1) * s)`, so a connection id names its thread), its own
//! endpoint, engine loop, memory and UDP sockets, and runs a [`Server`]
//! over them. Nothing is shared on the data path.
//!
//! ```text
//!   public port (thread 0's socket)     thread t's own port (t >= 1)
//!        |  CONNECTs, stray packets          |  its connections' packets
//!   thread 0 --- SPSC byte ring + eventfd --> thread t   (and back)
//! ```
//!
//! **Steering** ([`steer`]). Every thread's ACCEPTs name its own port in
//! the Reply Port field (spec 3.1.2, 3.8.1: the endpoint's `udp_port` is
//! the thread's), so after the handshake a peer sends that connection's
//! packets straight to the owning thread's socket. A CONNECT arrives at
//! the public port and goes to the thread chosen by the hash of its source
//! address and source connection id (`connect_core`, as on the firmware):
//! a repeated CONNECT, or one repeated with a RETRY's cookie, reaches the
//! same thread, whatever port it left from. Any other packet that reaches
//! a thread not owning its id (a peer that ignores the Reply Port) is
//! forwarded to the owner the same way, and counted.
//!
//! **Node-wide state**, all on the control path: the budgets per peer
//! address and in total and the `JOIN` tickets ([`Ledger`], a mutex taken
//! when a connection is adopted, announces, joins or ends, never per
//! packet); each thread's count of active senders (an atomic each), from
//! which every thread's fair-share hint divides the node's link among all
//! of them (`set_other_shards_senders`); a stop flag.

pub mod steer;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use metaroce_core::Shard;
use metaroce_platform::shard::{ShardMap, MAX_CORES};
use serde::Serialize;

use crate::memory::Arenas;
use crate::node::{Node, NodeConfig};
use crate::session::{Ledger, PeerBudget, Server, ServerCounters, ServerReport};
use crate::HostError;
use steer::{SteerStats, Waker};

/// Most engine threads (as many cores as a DPU's dispatcher steers to).
pub const MAX_THREADS: usize = MAX_CORES;

/// How to set up a sharded server.
#[derive(Debug, Clone)]
pub struct ShardedConfig {
    /// The node: `bind` is the public address (thread 0 receives there,
    /// the others on free ports of the same address), `connections` the
    /// whole table, split evenly; `entropy_base`, if set, is thread 0's and
    /// each further thread's run follows the previous one.
    pub node: NodeConfig,
    /// Engine threads, `1..=MAX_THREADS`.
    pub threads: usize,
    pub budget: PeerBudget,
}

/// What one engine thread did, when the server stopped.
#[derive(Debug)]
pub struct ThreadOutcome {
    pub thread: usize,
    pub server: Server,
    pub steering: SteerStats,
}

/// One thread's part of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadSummary {
    pub thread: usize,
    /// Where its connections' packets arrive.
    pub port: u16,
    /// Connections it adopted (served or refused).
    pub connections: u64,
    pub open: usize,
    pub steering: SteerStats,
}

/// A sharded server, bound and ready to run.
#[derive(Debug)]
pub struct ShardedServer {
    servers: Vec<Server>,
    ledger: Arc<Ledger>,
    wakers: Arc<[Waker]>,
    local: SocketAddr,
}

impl ShardedServer {
    /// Binds every thread's sockets and creates its shard of the table.
    pub fn bind(config: &ShardedConfig) -> Result<ShardedServer, HostError> {
        let threads = config.threads;
        if threads == 0 || threads > MAX_THREADS {
            return Err(HostError::Usage(format!(
                "--threads must be 1..={MAX_THREADS}, got {threads}"
            )));
        }
        let shard_slots = config.node.connections / threads as u32;
        if shard_slots == 0 {
            return Err(HostError::Usage(format!(
                "--connections {} leaves no connection to some of the {threads} threads",
                config.node.connections
            )));
        }
        let table = shard_slots * threads as u32;
        let map =
            ShardMap::for_table(Shard::index_bits(table), table, threads).ok_or_else(|| {
                HostError::Usage(format!(
                    "{table} connections do not split between {threads} threads"
                ))
            })?;
        let steering = steer::steering(map, threads)?;
        let wakers = steering[0].wakers();
        let ledger = Ledger::new(config.budget, threads, Some(wakers.clone()));
        // One node, one token secret: a later CONNECT of the same
        // initiator, steered by its new Source Connection ID, may reach
        // another thread than the one that issued its address token (spec
        // 4.2.5). From the seed when one is fixed (repeatable), else from
        // the operating system.
        let mut token_master = [0u8; 16];
        match config.node.seed {
            Some(s) => {
                token_master[..8].copy_from_slice(&s.to_le_bytes());
                token_master[8..].copy_from_slice(&(!s).rotate_left(17).to_le_bytes());
            }
            None => getrandom::fill(&mut token_master).map_err(|e| {
                HostError::Bind(format!("no entropy from the operating system: {e:?}"))
            })?,
        }
        // Each thread's entropy run follows the previous one (twice the
        // paths each: what `Node::bind` binds).
        let span = u32::from(config.node.paths) * 2;
        let mut servers = Vec::with_capacity(threads);
        let mut local = config.node.bind;
        for (t, steer) in steering.into_iter().enumerate() {
            let mut node_config = config.node.clone();
            node_config.connections = shard_slots;
            if t > 0 {
                node_config.bind = SocketAddr::new(local.ip(), 0);
            }
            node_config.entropy_base = match config.node.entropy_base {
                Some(base) => Some(u16::try_from(u32::from(base) + t as u32 * span).map_err(
                    |_| {
                        HostError::Usage(format!(
                            "--entropy-base {base}: {threads} threads' ports pass 65535"
                        ))
                    },
                )?),
                None => None,
            };
            // Every shard its own generator (a fixed seed stays repeatable).
            node_config.seed = config
                .node
                .seed
                .map(|s| s ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let shard = Shard::nth(t as u32, threads as u32, table);
            // Early proofs bind the port CONNECTs are sent to (spec
            // 4.2.4): thread 0's, from which they are forwarded.
            let public_port = local.port();
            let mut node = Node::bind_with(&node_config, Some(shard), Arenas::new(), |c| {
                if t > 0 {
                    c.connect_port = Some(public_port);
                }
            })?;
            if t == 0 {
                local = node.local_addr();
            }
            node.ep.share_token_secret(token_master);
            node.mem = Arenas::for_thread(t);
            node.link.steer = Some(steer);
            servers.push(Server::sharded(node, ledger.clone(), t));
        }
        Ok(ShardedServer {
            servers,
            ledger,
            wakers,
            local,
        })
    }

    /// The public address (thread 0's socket, where CONNECTs arrive).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Each thread's receive address, in thread order.
    pub fn thread_addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.node.local_addr()).collect()
    }

    /// The books the threads share.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Runs every thread until `stop` says so (each thread asks it every
    /// turn, at least every 20 ms) or `finished` returns true (it is
    /// called, from the serving thread, for each connection that ends).
    /// Returns every thread's server with its counters.
    pub fn run(
        self,
        finished: impl Fn(&ServerReport) -> bool + Sync,
        stop: impl Fn() -> bool + Sync,
    ) -> Result<Vec<ThreadOutcome>, HostError> {
        let threads = self.servers.len();
        let senders: Vec<SenderCount> = (0..threads).map(|_| SenderCount::default()).collect();
        let stopping = AtomicBool::new(false);
        let wakers = self.wakers;
        let end_all = || {
            stopping.store(true, Ordering::Relaxed);
            wakers.iter().for_each(Waker::wake);
        };
        let results: Vec<Result<ThreadOutcome, HostError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .servers
                .into_iter()
                .enumerate()
                .map(|(t, mut server)| {
                    let (senders, stopping, end_all) = (&senders, &stopping, &end_all);
                    let (finished, stop) = (&finished, &stop);
                    std::thread::Builder::new()
                        .name(format!("metaroce-engine-{t}"))
                        .spawn_scoped(scope, move || {
                            let mut printed = 0;
                            let result = loop {
                                share_senders(&mut server, t, senders);
                                if let Err(e) = server.turn(crate::session::IDLE_TURN) {
                                    break Err(e);
                                }
                                for r in &server.finished[printed..] {
                                    if finished(r) {
                                        end_all();
                                    }
                                }
                                printed = server.finished.len();
                                if stopping.load(Ordering::Relaxed) || stop() {
                                    break Ok(());
                                }
                            };
                            // One thread's end (or failure) ends them all.
                            end_all();
                            let steering = server
                                .node
                                .link
                                .steer
                                .as_ref()
                                .map(|s| s.stats)
                                .unwrap_or_default();
                            result.map(|()| ThreadOutcome {
                                thread: t,
                                server,
                                steering,
                            })
                        })
                })
                // A thread that did not start ends the others.
                .inspect(|spawned| {
                    if spawned.is_err() {
                        end_all();
                    }
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(HostError::Io("an engine thread panicked".into()))),
                    Err(e) => Err(HostError::Io(format!("cannot start a thread: {e}"))),
                })
                .collect()
        });
        results.into_iter().collect()
    }
}

/// One thread's count of active senders, alone on its cache line so the
/// threads' updates do not bounce one line between their cores.
#[derive(Debug, Default)]
#[repr(align(64))]
struct SenderCount(AtomicU32);

/// The node-wide fair share: this thread's active senders out, the other
/// threads' in (an atomic per thread, read once a turn).
fn share_senders(server: &mut Server, me: usize, senders: &[SenderCount]) {
    let now = server.node.now();
    let mine = server.node.ep.active_senders(now);
    // Written only when it changed: readers' copies of the line stay valid.
    if senders[me].0.load(Ordering::Relaxed) != mine {
        senders[me].0.store(mine, Ordering::Relaxed);
    }
    let others: u32 = senders
        .iter()
        .enumerate()
        .filter(|&(t, _)| t != me)
        .map(|(_, n)| n.0.load(Ordering::Relaxed))
        .sum();
    server.node.ep.set_other_shards_senders(others);
}

/// Each thread's part of the summary.
pub fn thread_summaries(outcomes: &[ThreadOutcome]) -> Vec<ThreadSummary> {
    outcomes
        .iter()
        .map(|o| ThreadSummary {
            thread: o.thread,
            port: o.server.node.local_addr().port(),
            connections: o.server.counters().connections,
            open: o.server.open_connections(),
            steering: o.steering,
        })
        .collect()
}

/// Every thread's server counters, added up.
pub fn total_counters(outcomes: &[ThreadOutcome]) -> ServerCounters {
    let mut total = ServerCounters::default();
    for o in outcomes {
        total.add(&o.server.counters());
    }
    total
}

/// Every thread's steering counters, added up.
pub fn total_steering(outcomes: &[ThreadOutcome]) -> SteerStats {
    let mut total = SteerStats::default();
    for o in outcomes {
        let SteerStats {
            connects_forwarded,
            packets_forwarded,
            received_forwarded,
            ring_full,
        } = o.steering;
        total.connects_forwarded += connects_forwarded;
        total.packets_forwarded += packets_forwarded;
        total.received_forwarded += received_forwarded;
        total.ring_full += ring_full;
    }
    total
}

/// Every thread's endpoint.
pub fn nodes(outcomes: &[ThreadOutcome]) -> Vec<&crate::node::Node> {
    outcomes.iter().map(|o| &o.server.node).collect()
}
