//! The library against two fake DPUs (the platform's real host interface,
//! engine loop and endpoints): WRITE, WRITE_IMM, SEND and READ between two
//! host processes' queue sets, every byte checked.

mod common;

use std::time::{Duration, Instant};

use common::{dpu_addr, FakeDpus};
use metaroce_verbs::{
    Access, Conn, Device, Opcode, RecvWr, Remote, SendOp, SendWr, Status, WorkCompletion,
};

/// Polls until a completion arrives (or panics after 20 s).
pub fn wait_completion(dev: &mut Device) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(c) = dev.poll_cq() {
            return c;
        }
        assert!(Instant::now() < deadline, "no completion within 20 s");
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Connects queue set 0 of DPU 0 to queue set 0 of DPU 1.
fn pair(dpus: &FakeDpus) -> (Device, Conn, Device, Conn) {
    let mut a = Device::open(&dpus.paths[0]).unwrap();
    let mut b = Device::open(&dpus.paths[1]).unwrap();
    b.listen().unwrap();
    let ca = a.connect_start(dpu_addr(1)).unwrap();
    let (cb, peer) = b.accept(Duration::from_secs(20)).unwrap();
    assert_eq!(peer.ip(), std::net::IpAddr::from(common::dpu_ip(0)));
    (a, ca, b, cb)
}

#[test]
fn write_write_imm_send_and_read_move_every_byte() {
    let dpus = FakeDpus::start("datapath");
    let (mut a, ca, mut b, cb) = pair(&dpus);
    const LEN: usize = 8192;
    let a_buf = a.alloc(4 * LEN as u64, 4096).unwrap();
    let b_buf = b.alloc(4 * LEN as u64, 4096).unwrap();
    let ra = a.register(a_buf, 4 * LEN as u64, Access::ALL).unwrap();
    let rb = b.register(b_buf, 4 * LEN as u64, Access::ALL).unwrap();
    // WRITE a[0] -> b[0], WRITE_IMM a[1] -> b[1], SEND a[2] -> b[2],
    // READ b[3] -> a[3].
    for i in 0..3u8 {
        a.write(a_buf + u64::from(i) * LEN as u64, &pattern(i, LEN))
            .unwrap();
    }
    b.write(b_buf + 3 * LEN as u64, &pattern(3, LEN)).unwrap();
    // Receives are consumed in order: the WRITE_IMM's first, then the SEND's.
    b.post_recv(
        cb,
        &RecvWr {
            wr_id: 100,
            local: rb.slice(0, 0),
        },
    )
    .unwrap();
    b.post_recv(
        cb,
        &RecvWr {
            wr_id: 101,
            local: rb.slice(2 * LEN as u64, LEN as u32),
        },
    )
    .unwrap();
    let remote = |i: u64| Remote {
        addr: b_buf + i * LEN as u64,
        key: rb.key,
    };
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::Write(remote(0)),
            local: ra.slice(0, LEN as u32),
        },
        SendWr {
            wr_id: 2,
            op: SendOp::WriteImm(remote(1), 0xfeed),
            local: ra.slice(LEN as u64, LEN as u32),
        },
        SendWr {
            wr_id: 3,
            op: SendOp::Send,
            local: ra.slice(2 * LEN as u64, LEN as u32),
        },
        SendWr {
            wr_id: 4,
            op: SendOp::Read(remote(3)),
            local: ra.slice(3 * LEN as u64, LEN as u32),
        },
    ];
    for wr in &wrs {
        a.post_send(ca, wr).unwrap();
    }
    let mut done: Vec<WorkCompletion> = (0..4).map(|_| wait_completion(&mut a)).collect();
    done.sort_by_key(|c| c.wr_id);
    for (c, op) in done
        .iter()
        .zip([Opcode::Write, Opcode::WriteImm, Opcode::Send, Opcode::Read])
    {
        assert_eq!((c.status, c.opcode, c.conn), (Status::Success, op, ca));
    }
    let mut got: Vec<WorkCompletion> = (0..2).map(|_| wait_completion(&mut b)).collect();
    got.sort_by_key(|c| c.wr_id);
    assert_eq!(
        (got[1].opcode, got[1].byte_len, got[1].status),
        (Opcode::Recv, LEN as u32, Status::Success)
    );
    assert_eq!(
        (got[0].opcode, got[0].imm),
        (Opcode::RecvWriteImm, Some(0xfeed))
    );
    let mut out = vec![0u8; LEN];
    for i in 0..3u8 {
        b.read(b_buf + u64::from(i) * LEN as u64, &mut out).unwrap();
        assert_eq!(out, pattern(i, LEN), "buffer {i} at the receiver");
    }
    a.read(a_buf + 3 * LEN as u64, &mut out).unwrap();
    assert_eq!(out, pattern(3, LEN), "READ result");
    let counters = a.counters().unwrap();
    assert_eq!(counters.posted_sends, 4);
    assert!(counters.transport_bytes_sent >= 3 * LEN as u64);
    // A graceful close reaches both sides; the handle is then released
    // and refused as stale.
    a.close(ca).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(metaroce_verbs::Event::Closed { conn, .. }) = a.poll_event() {
            assert_eq!(conn, ca);
            break;
        }
        assert!(Instant::now() < deadline, "no close event");
        std::thread::sleep(Duration::from_micros(100));
    }
    a.release(ca).unwrap();
    assert!(a.release(ca).is_err(), "a released handle is stale");
}
