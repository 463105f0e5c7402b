//! Per-tenant quotas (spec 6.10), against the fake DPUs: one tenant
//! trying to fill the device's region and connection tables (regions until
//! refused, CONNECTs to a peer that never answers, again and again) is
//! refused with `QuotaExceeded` at its share, counted by resource, while
//! the other tenant on the same device registers, connects and moves data,
//! each step answered within 100 ms; the management set (the last) sets a
//! tenant's quota, and no other set may.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{dpu_addr, FakeDpus, PORT};
use metaroce_verbs::abi;
use metaroce_verbs::{Access, Device, Error, OpenOptions, Remote, SendOp, SendWr, Status};

fn open_set(path: &std::path::Path, set: u32) -> Device {
    Device::open_with(
        path,
        OpenOptions {
            queue_set: Some(set),
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

/// The slowest any single step of the served tenant may take.
const SERVED_WITHIN: Duration = Duration::from_millis(100);

/// Runs `f`, asserting it answered within [`SERVED_WITHIN`]; returns its
/// value and how long it took.
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    let took = t.elapsed();
    assert!(
        took <= SERVED_WITHIN,
        "{what} took {took:?} while the other tenant attacked"
    );
    (v, took)
}

#[test]
fn a_tenant_filling_the_tables_is_held_at_its_share_while_the_other_is_served() {
    let dpus = FakeDpus::start("quota");
    let mut victim = open_set(&dpus.paths[0], 0);
    let mut peer = open_set(&dpus.paths[1], 0);
    peer.listen().unwrap();

    // The attacker: set 1 of the same DPU, in a thread of its own, until
    // told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let path = dpus.paths[0].clone();
    let (stop2, started2) = (stop.clone(), started.clone());
    let attacker = std::thread::spawn(move || {
        let mut a = open_set(&path, 1);
        let nowhere = SocketAddr::new(Ipv4Addr::new(198, 18, 0, 99).into(), PORT);
        let buf = a.alloc(4096, 4096).unwrap();
        let (mut regions, mut conns, mut refused) = (0u32, 0u32, 0u32);
        // Fill: 56 regions and 7 CONNECTs (what filled the tables before).
        for _ in 0..56 {
            match a.register(buf, 4096, Access::ALL) {
                Ok(_) => regions += 1,
                Err(Error::Refused(Status::QuotaExceeded)) => refused += 1,
                Err(e) => panic!("register: {e}"),
            }
        }
        for _ in 0..7 {
            match a.connect_start(nowhere) {
                Ok(_) => conns += 1,
                Err(Error::Refused(Status::QuotaExceeded)) => refused += 1,
                Err(e) => panic!("connect: {e}"),
            }
        }
        started2.store(true, Ordering::Release);
        // Keep at it while the other tenant works.
        while !stop2.load(Ordering::Relaxed) {
            for r in [
                a.register(buf, 4096, Access::ALL).map(|_| ()),
                a.connect_start(nowhere).map(|_| ()),
            ] {
                match r {
                    Ok(()) => panic!("the attacker got past its quota"),
                    Err(Error::Refused(Status::QuotaExceeded)) => refused += 1,
                    Err(e) => panic!("attacker: {e}"),
                }
            }
        }
        let quota = a.quota().unwrap();
        let counters = a.counters().unwrap();
        (regions, conns, refused, quota, counters)
    });
    while !started.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(1));
    }

    // The victim, meanwhile: register, connect, accept, write, each
    // answered within 100 ms.
    let mut slowest = Duration::ZERO;
    let src = victim.alloc(4096, 4096).unwrap();
    let dst = peer.alloc(4096, 4096).unwrap();
    let (ra, took) = timed("register", || victim.register(src, 4096, Access::ALL));
    let ra = ra.expect("the victim registers");
    slowest = slowest.max(took);
    let rb = peer.register(dst, 4096, Access::ALL).unwrap();
    let (conn, took) = timed("connect", || victim.connect_start(dpu_addr(1)));
    let conn = conn.expect("the victim connects");
    slowest = slowest.max(took);
    let (accepted, took) = timed("accept", || peer.accept(Duration::from_secs(5)));
    accepted.expect("the peer accepts");
    slowest = slowest.max(took);
    let (qp, mut cq) = (victim.queue_pair(conn), victim.completion_queue().unwrap());
    for round in 0..8u8 {
        let data = vec![round ^ 0xa5; 4096];
        victim.write(src, &data).unwrap();
        let (c, took) = timed("a WRITE", || {
            qp.post_send(&[SendWr {
                wr_id: u64::from(round),
                op: SendOp::Write(Remote {
                    addr: dst,
                    key: rb.key,
                }),
                local: ra.slice(0, 4096),
            }])
            .unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Some(c) = cq.poll_one() {
                    break c;
                }
                assert!(Instant::now() < deadline, "no completion");
                std::thread::yield_now();
            }
        });
        assert_eq!(c.status, Status::Success);
        slowest = slowest.max(took);
        let mut out = vec![0; 4096];
        peer.read(dst, &mut out).unwrap();
        assert_eq!(out, data);
    }
    stop.store(true, Ordering::Relaxed);
    let (regions, conns, refused, quota, counters) = attacker.join().unwrap();
    eprintln!(
        "attacker: {regions} regions, {conns} connections, {refused} refusals; \
         victim's slowest step {slowest:?}; quota {quota:?}"
    );

    // Two claimed sets on a device of 8 connections and 32 regions: half
    // of each table, and the refusals counted by resource.
    assert_eq!((regions, conns), (16, 4));
    assert_eq!(quota.limit.connections, 4);
    assert_eq!(quota.limit.regions, 16);
    assert_eq!(quota.used.regions, 16);
    assert_eq!(quota.used.region_bytes, 16 * 4096);
    assert_eq!(quota.used.connections, 4);
    assert_eq!(quota.used.commands, 4, "CONNECTs still opening");
    assert!(quota.refused.regions >= 40, "{quota:?}");
    assert!(
        quota.refused.connections + quota.refused.commands >= 3,
        "{quota:?}"
    );
    let by_resource = quota.refused.connections
        + quota.refused.regions
        + quota.refused.region_bytes
        + quota.refused.work_entries
        + quota.refused.commands;
    assert_eq!(counters.refused_quota, by_resource);
    assert_eq!(u64::from(refused), by_resource);
    assert_eq!(counters.refused_no_resources, 0);

    // The victim's view: its own share, its own use, nothing refused.
    let mine = victim.quota().unwrap();
    assert_eq!(mine.used.regions, 1);
    assert_eq!(mine.used.connections, 1);
    assert_eq!(mine.refused, abi::QuotaValues::default());
}

#[test]
fn only_the_management_set_sets_quotas() {
    let dpus = FakeDpus::start("quota-admin");
    let mut tenant = open_set(&dpus.paths[0], 0);
    let mut admin = open_set(&dpus.paths[0], 3);
    let limits = abi::QuotaValues {
        connections: abi::QUOTA_DEFAULT,
        regions: 2,
        region_bytes: 8192 + 4096,
        work_entries: abi::QUOTA_DEFAULT,
        commands: abi::QUOTA_DEFAULT,
        reserved: [0; 3],
    };
    assert!(matches!(
        tenant.set_quota(0, &limits),
        Err(Error::Refused(Status::NotPermitted))
    ));
    assert!(matches!(
        admin.set_quota(9, &limits),
        Err(Error::Refused(Status::InvalidRequest))
    ));
    admin.set_quota(0, &limits).unwrap();
    let buf = tenant.alloc(16384, 4096).unwrap();
    tenant.register(buf, 8192, Access::ALL).unwrap();
    // The bytes limit, then the regions limit.
    assert!(matches!(
        tenant.register(buf, 8192, Access::ALL),
        Err(Error::Refused(Status::QuotaExceeded))
    ));
    let r = tenant.register(buf, 4096, Access::ALL).unwrap();
    assert!(matches!(
        tenant.register(buf, 1, Access::ALL),
        Err(Error::Refused(Status::QuotaExceeded))
    ));
    let q = tenant.quota().unwrap();
    assert_eq!(q.limit.regions, 2);
    assert_eq!(q.limit.region_bytes, 12288);
    assert_eq!(q.limit.connections, 4, "the default: half of 8");
    assert_eq!(q.limit.work_entries, u64::from(abi::DEFAULT_CQ_DEPTH));
    assert_eq!(q.used.regions, 2);
    assert_eq!(q.used.region_bytes, 12288);
    assert_eq!((q.refused.region_bytes, q.refused.regions), (1, 1));
    // What deregistering gives back can be taken again; back to the
    // default, the limit is the share again.
    tenant.deregister(r).unwrap();
    tenant.register(buf, 4096, Access::ALL).unwrap();
    admin
        .set_quota(
            0,
            &abi::QuotaValues {
                connections: abi::QUOTA_DEFAULT,
                regions: abi::QUOTA_DEFAULT,
                region_bytes: abi::QUOTA_DEFAULT,
                work_entries: abi::QUOTA_DEFAULT,
                commands: abi::QUOTA_DEFAULT,
                reserved: [0; 3],
            },
        )
        .unwrap();
    let q = tenant.quota().unwrap();
    assert_eq!(q.limit.regions, 16);
    assert_eq!(q.limit.region_bytes, tenant.info().window_len);
    assert_eq!(tenant.counters().unwrap().refused_quota, 2);
}
