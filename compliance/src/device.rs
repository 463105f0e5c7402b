//! Host-interface cases (spec chapter 6): the suite plays host processes
//! of a device through its shared memory, with the reference host library
//! (`metaroce-verbs`), and checks the per-tenant quotas of 6.10. A target
//! is two devices that reach each other: each one's shared-memory file and
//! its MetaRoCE address (`SHM0 ADDR0 SHM1 ADDR1`, what the QEMU harness's
//! `--exec` passes).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metaroce_verbs::abi::QuotaValues;
use metaroce_verbs::{Access, Device, Error, OpenOptions, Remote, SendOp, SendWr, Status};

use crate::cases::{ensure, Case};
use crate::peer::Fail;

/// One device of the target: its shared memory and its address.
#[derive(Debug, Clone)]
pub struct DeviceTarget {
    pub shm: PathBuf,
    pub addr: SocketAddr,
}

/// Shared by the host-interface cases of one run.
#[derive(Debug)]
pub struct DeviceCtx {
    pub devices: [DeviceTarget; 2],
    /// Why the case that just ran did not apply; taken by the report.
    pub skipped: Option<String>,
}

/// The host-interface cases.
pub static DEVICE_CASES: &[Case<DeviceCtx>] = &[
    Case {
        name: "quota: a tenant at its share is refused, the other served",
        section: "6.10, 6.7",
        run: tenant_held_at_its_share,
        attempts: 1,
    },
    Case {
        name: "quota: only the management set sets one, and it holds",
        section: "6.10",
        run: only_management_sets_quotas,
        attempts: 1,
    },
];

/// The slowest a command of the served tenant may be answered.
const SERVED_WITHIN: Duration = Duration::from_millis(100);
/// Requests the attacking tenant makes before it must have been refused.
const MOST_TRIES: u64 = 4096;
/// Bytes per region the attacker registers.
const REGION: u64 = 4096;

fn open_set(path: &PathBuf, set: u32) -> Result<Device, Fail> {
    Device::open_with(
        path,
        OpenOptions {
            queue_set: Some(set),
            ..OpenOptions::default()
        },
    )
    .map_err(|e| format!("cannot claim queue set {set} of {}: {e}", path.display()))
}

/// Why a device with `sets` queue sets cannot run a case that needs two
/// tenants besides the management set (the last, 6.10).
fn too_few_sets(sets: u32) -> Option<String> {
    (sets < 3).then(|| {
        format!("the device has {sets} queue sets: two tenants and the management set need 3")
    })
}

fn refused_total(q: &QuotaValues) -> u64 {
    q.connections + q.regions + q.region_bytes + q.work_entries + q.commands
}

/// A place no device answers: the target's own /24, host 250.
fn nowhere(near: SocketAddr) -> SocketAddr {
    match near.ip() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            SocketAddr::new(Ipv4Addr::new(a, b, c, 250).into(), near.port())
        }
        IpAddr::V6(_) => SocketAddr::new(Ipv4Addr::new(198, 18, 0, 250).into(), near.port()),
    }
}

/// 6.10: set 1 of device 0 fills its share of the region table and the
/// connection table (CONNECTs to an address that never answers) and keeps
/// trying; every refusal is `QUOTA_EXCEEDED`, at the limits its quota
/// reports, and counted by resource; meanwhile set 0 of the same device
/// registers, connects to device 1 and moves a WRITE, each command
/// answered within 100 ms.
fn tenant_held_at_its_share(ctx: &mut DeviceCtx) -> Result<(), Fail> {
    let [d0, d1] = ctx.devices.clone();
    let mut attacker = open_set(&d0.shm, 1)?;
    if let Some(why) = too_few_sets(attacker.info().queue_sets) {
        ctx.skipped = Some(why);
        return Ok(());
    }
    let mut victim = open_set(&d0.shm, 0)?;
    let mut peer = open_set(&d1.shm, 0)?;
    peer.listen().map_err(|e| format!("listen: {e}"))?;
    let start = attacker
        .quota()
        .map_err(|e| format!("the device reports no quota (6.10): {e}"))?;

    // Fill: regions until refused, then CONNECTs until refused.
    let buf = attacker.alloc(REGION, 4096).map_err(|e| e.to_string())?;
    let room_regions = (start.limit.regions.saturating_sub(start.used.regions)).min(
        start
            .limit
            .region_bytes
            .saturating_sub(start.used.region_bytes)
            / REGION,
    );
    let mut regions = 0u64;
    let first_refusal = loop {
        if regions > MOST_TRIES {
            return Err(format!(
                "{regions} regions registered: no quota stopped set 1"
            ));
        }
        match attacker.register(buf, REGION, Access::ALL) {
            Ok(_) => regions += 1,
            Err(e) => break e,
        }
    };
    ensure(
        matches!(first_refusal, Error::Refused(Status::QuotaExceeded)),
        || {
            format!("set 1's region past {regions} was refused with {first_refusal} instead of QUOTA_EXCEEDED")
        },
    )?;
    ensure(regions == room_regions, || {
        format!(
            "set 1 registered {regions} regions of {REGION} B; its quota (limit {} regions, {} B) left room for {room_regions}",
            start.limit.regions, start.limit.region_bytes
        )
    })?;
    let unreachable = nowhere(d0.addr);
    let room_conns = start
        .limit
        .connections
        .saturating_sub(start.used.connections)
        .min(start.limit.commands.saturating_sub(start.used.commands));
    let mut conns = 0u64;
    let refusal = loop {
        if conns > MOST_TRIES {
            return Err(format!("{conns} CONNECTs taken: no quota stopped set 1"));
        }
        match attacker.connect_start(unreachable) {
            Ok(_) => conns += 1,
            Err(e) => break e,
        }
    };
    ensure(
        matches!(refusal, Error::Refused(Status::QuotaExceeded)),
        || {
            format!(
                "set 1's CONNECT past {conns} was refused with {refusal} instead of QUOTA_EXCEEDED"
            )
        },
    )?;
    ensure(conns <= room_conns, || {
        format!("set 1 opened {conns} connections; its quota left room for {room_conns}")
    })?;

    // Keep at it while the other tenant works.
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let hammer = std::thread::spawn(move || {
        let mut refused = 2u64;
        let mut got_past = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            for r in [
                attacker.register(buf, REGION, Access::ALL).map(|_| ()),
                attacker.connect_start(unreachable).map(|_| ()),
            ] {
                match r {
                    Err(Error::Refused(Status::QuotaExceeded)) => refused += 1,
                    _ => got_past += 1,
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let quota = attacker.quota();
        let counters = attacker.counters();
        (refused, got_past, quota, counters)
    });
    let served = serve_the_other(&mut victim, &mut peer, d1.addr);
    stop.store(true, Ordering::Relaxed);
    let (refused, got_past, quota, counters) = hammer
        .join()
        .map_err(|_| "the attacking tenant's thread panicked".to_string())?;
    let slowest = served?;
    ensure(got_past == 0, || {
        format!("set 1 got {got_past} requests past its quota")
    })?;
    let quota = quota.map_err(|e| format!("quota query: {e}"))?;
    let counters = counters.map_err(|e| format!("counter query: {e}"))?;
    let by_resource = refused_total(&quota.refused) - refused_total(&start.refused);
    ensure(by_resource == refused, || {
        format!(
            "set 1 saw {refused} QUOTA_EXCEEDED refusals; its quota counts {by_resource} by resource ({:?})",
            quota.refused
        )
    })?;
    ensure(
        counters.refused_quota == refused_total(&quota.refused),
        || {
            format!(
                "the counters say {} quota refusals, the quota by resource {}",
                counters.refused_quota,
                refused_total(&quota.refused)
            )
        },
    )?;
    let mine = victim.quota().map_err(|e| format!("quota query: {e}"))?;
    ensure(refused_total(&mine.refused) == 0, || {
        format!("set 0 was refused for set 1's use: {:?}", mine.refused)
    })?;
    ensure(slowest <= SERVED_WITHIN, || {
        format!("set 0's slowest command took {slowest:?} while set 1 attacked")
    })
}

/// Register, connect, accept and one WRITE checked in the peer's memory;
/// the slowest command's answer time.
fn serve_the_other(
    victim: &mut Device,
    peer: &mut Device,
    peer_addr: SocketAddr,
) -> Result<Duration, Fail> {
    let mut slowest = Duration::ZERO;
    let mut timed = |what: &str, f: &mut dyn FnMut() -> Result<(), Error>| {
        let t = Instant::now();
        let r = f();
        slowest = slowest.max(t.elapsed());
        r.map_err(|e| format!("set 0's {what} while set 1 attacked: {e}"))
    };
    let src = victim.alloc(4096, 4096).map_err(|e| e.to_string())?;
    let dst = peer.alloc(4096, 4096).map_err(|e| e.to_string())?;
    let mut local = None;
    timed("register", &mut || {
        local = Some(victim.register(src, 4096, Access::ALL)?);
        Ok(())
    })?;
    let local = local.ok_or("no region")?;
    let remote = peer
        .register(dst, 4096, Access::ALL)
        .map_err(|e| format!("the peer's register: {e}"))?;
    let mut conn = None;
    timed("connect", &mut || {
        conn = Some(victim.connect_start(peer_addr)?);
        Ok(())
    })?;
    let conn = conn.ok_or("no connection")?;
    peer.accept(Duration::from_secs(10))
        .map_err(|e| format!("device 1 did not see set 0's connection: {e}"))?;
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    victim.write(src, &data).map_err(|e| e.to_string())?;
    let mut cq = victim
        .completion_queue()
        .map_err(|e| format!("set 0's completion queue: {e}"))?;
    victim
        .queue_pair(conn)
        .post_send(&[SendWr {
            wr_id: 0x5e7,
            op: SendOp::Write(Remote {
                addr: dst,
                key: remote.key,
            }),
            local: local.slice(0, 4096),
        }])
        .map_err(|e| format!("set 0's post: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        if let Some(c) = cq.poll_one() {
            break c;
        }
        if Instant::now() > deadline {
            return Err("set 0's WRITE did not complete within 10 s".into());
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    ensure(c.status == Status::Success, || {
        format!("set 0's WRITE completed {:?}", c.status)
    })?;
    let mut out = vec![0; 4096];
    peer.read(dst, &mut out).map_err(|e| e.to_string())?;
    ensure(out == data, || {
        "the WRITE's bytes differ at device 1".into()
    })?;
    Ok(slowest)
}

/// 6.10: a tenant's SET_QUOTA is refused NOT_PERMITTED; the management
/// set's (the last) is taken, and holds: a tenant limited to one region
/// more than it holds registers one and is refused the next with
/// QUOTA_EXCEEDED; back to the default, it registers again.
fn only_management_sets_quotas(ctx: &mut DeviceCtx) -> Result<(), Fail> {
    let path = ctx.devices[1].shm.clone();
    let mut tenant = open_set(&path, 1)?;
    let sets = tenant.info().queue_sets;
    if let Some(why) = too_few_sets(sets) {
        ctx.skipped = Some(why);
        return Ok(());
    }
    let mut admin = open_set(&path, sets - 1)?;
    let held = tenant.quota().map_err(|e| format!("quota query: {e}"))?;
    let limits = QuotaValues {
        regions: held.used.regions + 1,
        ..QuotaValues::DEFAULTS
    };
    let refused = tenant.set_quota(1, &limits);
    ensure(
        matches!(refused, Err(Error::Refused(Status::NotPermitted))),
        || format!("a tenant's SET_QUOTA was answered {refused:?} instead of NOT_PERMITTED"),
    )?;
    admin
        .set_quota(1, &limits)
        .map_err(|e| format!("the management set's SET_QUOTA: {e}"))?;
    let buf = tenant.alloc(REGION, 4096).map_err(|e| e.to_string())?;
    let first = tenant.register(buf, REGION, Access::ALL);
    let second = tenant.register(buf, REGION, Access::ALL);
    let restored = admin.set_quota(1, &QuotaValues::DEFAULTS);
    ensure(first.is_ok(), || {
        format!("the one region the quota left room for was refused: {first:?}")
    })?;
    ensure(
        matches!(second, Err(Error::Refused(Status::QuotaExceeded))),
        || format!("the region past the quota was answered {second:?} instead of QUOTA_EXCEEDED"),
    )?;
    restored.map_err(|e| format!("the management set's SET_QUOTA back to the default: {e}"))?;
    tenant
        .register(buf, REGION, Access::ALL)
        .map(|_| ())
        .map_err(|e| format!("back to the default quota, a register was refused: {e}"))
}
