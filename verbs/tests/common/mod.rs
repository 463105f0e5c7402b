//! Two fake DPUs for the library's tests: the platform's real host
//! interface (`hostif`), engine loop and MetaRoCE endpoints, linked by an
//! in-memory Ethernet link, run on a thread over two shared-memory files,
//! exactly what the firmware runs over the ivshmem BAR. Time is virtual:
//! each round of the loop advances it by 20 us, so protocol timers do not
//! depend on how fast the machine is.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use metaroce_core::{Config, Endpoint, Instant};
use metaroce_platform::device::MemLink;
use metaroce_platform::hostif::{DeviceInfo, HostInterface};
use metaroce_platform::net::NetConfig;
use metaroce_platform::Engine;
use metaroce_verbs::SharedFile;
use smoltcp::wire::{EthernetAddress, Ipv4Address};

/// Bytes of each fake DPU's shared memory.
pub const SHM_LEN: u64 = 16 << 20;
pub const PORT: u16 = 4795;

pub fn dpu_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, i as u8 + 1)
}

pub fn dpu_addr(i: usize) -> SocketAddr {
    SocketAddr::new(dpu_ip(i).into(), PORT)
}

fn mac(i: usize) -> EthernetAddress {
    EthernetAddress([2, 0, 0, 0, 0, i as u8 + 1])
}

/// Two DPUs serving their shared-memory files until dropped.
pub struct FakeDpus {
    pub paths: [PathBuf; 2],
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeDpus {
    /// Starts the DPUs; `name` keeps concurrent tests' files apart.
    pub fn start(name: &str) -> FakeDpus {
        let dir = std::env::temp_dir();
        let paths = [0, 1].map(|i| {
            dir.join(format!(
                "metaroce-verbs-{name}-{}-{i}.shm",
                std::process::id()
            ))
        });
        let files = paths
            .clone()
            .map(|p| SharedFile::create(&p, SHM_LEN).expect("create the shared file"));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || serve(files, &stop2));
        FakeDpus {
            paths,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeDpus {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // A DPU thread's failed check fails the test (unless the test
            // already fails).
            if let Err(e) = t.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(e);
                }
            }
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

type Ep = Endpoint<metaroce_core::Heap, 4>;

fn endpoint(config: Config, seed: u64) -> Ep {
    Ep::new(
        config,
        metaroce_core::Layout::for_connections(8).heap_storage(),
        metaroce_core::rng::seed_from_u64(seed),
    )
}

fn serve(files: [SharedFile; 2], stop: &AtomicBool) {
    let link: MemLink<64> = MemLink::new();
    let (mut dev0, mut dev1) = link.ends().expect("fresh link");
    let config = Config {
        udp_port: PORT,
        mtu: 1024,
        paths: 4,
        accept_incoming: true,
        ..Config::for_emulation()
    };
    let mut endpoints = [endpoint(config, 11), endpoint(config, 22)];
    let mut engines: [Engine; 2] = [0, 1].map(|i| {
        let mut e = Engine::new(NetConfig {
            mac: mac(i),
            ip: Ipv4Address::from(dpu_ip(i).octets()),
        });
        e.add_static_neighbor(Ipv4Address::from(dpu_ip(1 - i).octets()), mac(1 - i));
        e
    });
    let mut dma = [files[0].view(), files[1].view()];
    let mut ifs = [0, 1].map(|i| {
        HostInterface::<8>::format(
            files[i].view(),
            DeviceInfo {
                node: i as u16,
                ipv4: dpu_ip(i).octets(),
                udp_port: PORT,
                queue_sets: 4,
            },
            32,
        )
        .expect("format the shared memory")
    });
    let mut now = Instant::ZERO;
    while !stop.load(Ordering::Relaxed) {
        now += Duration::from_micros(20);
        let [ep0, ep1] = &mut endpoints;
        let [en0, en1] = &mut engines;
        let [if0, if1] = &mut ifs;
        let [dma0, dma1] = &mut dma;
        let s0 = en0.stats();
        let s1 = en1.stats();
        let mut busy = if0.poll_control(now, ep0, &s0);
        busy |= if1.poll_control(now, ep1, &s1);
        busy |= en0.poll(now, ep0, &mut dev0, if0, dma0).busy;
        busy |= en1.poll(now, ep1, &mut dev1, if1, dma1).busy;
        if !busy && !if0.has_work() && !if1.has_work() {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    // The per-packet path's shape on this thread's DPUs: each received
    // frame's headers parsed at most once, each completion moved once
    // (from the transport into the set's completion queue in shared
    // memory).
    let p = metaroce_platform::probe::probes();
    assert!(p.rx_parses <= p.rx_frames, "a frame parsed twice: {p:?}");
    assert_eq!(p.completion_hops, p.completions, "{p:?}");
}
