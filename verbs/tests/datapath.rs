//! The library against two fake DPUs (the platform's real host interface,
//! engine loop and endpoints): WRITE, WRITE_IMM, SEND and READ between two
//! host processes' queue sets, every byte checked.

mod common;

use std::time::{Duration, Instant};

use common::{dpu_addr, FakeDpus};
use metaroce_verbs::{
    Access, CompletionQueue, Conn, Device, Error, Opcode, RecvWr, Remote, SendOp, SendWr, Status,
    WorkCompletion,
};

/// Polls until a completion arrives (or panics after 20 s).
pub fn wait_completion(cq: &mut CompletionQueue) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(c) = cq.poll_one() {
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
    let (mut a_cq, mut b_cq) = (a.completion_queue().unwrap(), b.completion_queue().unwrap());
    let (qa, qb) = (a.queue_pair(ca), b.queue_pair(cb));
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
    qb.post_recv(&[
        RecvWr {
            wr_id: 100,
            local: rb.slice(0, 0),
        },
        RecvWr {
            wr_id: 101,
            local: rb.slice(2 * LEN as u64, LEN as u32),
        },
    ])
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
    // One batch, one doorbell.
    qa.post_send(&wrs).unwrap();
    let mut done: Vec<WorkCompletion> = (0..4).map(|_| wait_completion(&mut a_cq)).collect();
    done.sort_by_key(|c| c.wr_id);
    for (c, op) in done
        .iter()
        .zip([Opcode::Write, Opcode::WriteImm, Opcode::Send, Opcode::Read])
    {
        assert_eq!((c.status, c.opcode, c.conn), (Status::Success, op, ca));
    }
    let mut got: Vec<WorkCompletion> = (0..2).map(|_| wait_completion(&mut b_cq)).collect();
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
    assert_eq!(counters.spurious_doorbells, 0);
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

#[test]
fn a_batch_larger_than_the_ring_posts_what_fits_and_says_where_it_stopped() {
    let dpus = FakeDpus::start("batch");
    let (mut a, ca, mut b, cb) = pair(&dpus);
    let mut cq = a.completion_queue().unwrap();
    assert!(matches!(a.completion_queue(), Err(Error::InUse)));
    let buf = a.alloc(4096, 4096).unwrap();
    let ra = a.register(buf, 4096, Access::ALL).unwrap();
    let b_buf = b.alloc(4096, 4096).unwrap();
    let rb = b.register(b_buf, 4096, Access::ALL).unwrap();
    let qp = a.queue_pair(ca);
    let free = qp.send_free() as usize;
    assert!(free > 0);
    let wrs: Vec<SendWr> = (0..free as u64 + 5)
        .map(|i| SendWr {
            wr_id: i,
            op: SendOp::Write(Remote {
                addr: b_buf,
                key: rb.key,
            }),
            local: ra.slice(0, 64),
        })
        .collect();
    let e = qp.post_send(&wrs).unwrap_err();
    assert!(e.posted > 0 && e.posted <= free, "{e}");
    assert!(matches!(e.error, Error::QueueFull));
    // Every posted request completes, once; then the rest goes.
    let mut seen = vec![false; wrs.len()];
    let mut rest = &wrs[e.posted..];
    let mut left = wrs.len();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut wc = [WorkCompletion::default(); 8];
    while left > 0 {
        let n = cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(c.status, Status::Success);
            assert!(!std::mem::replace(&mut seen[c.wr_id as usize], true));
            left -= 1;
        }
        if !rest.is_empty() {
            match qp.post_send(rest) {
                Ok(()) => rest = &[],
                Err(e) => rest = &rest[e.posted..],
            }
        }
        assert!(Instant::now() < deadline, "{left} completions missing");
        std::thread::sleep(Duration::from_micros(50));
    }
    assert!(seen.iter().all(|&s| s));
    // Dropping the completion queue gives it back.
    drop(cq);
    let mut cq = a.completion_queue().unwrap();
    assert!(cq.poll_one().is_none());
    let _ = cb;
}

#[test]
fn one_thread_posts_while_another_polls() {
    let dpus = FakeDpus::start("threads");
    let (mut a, ca, mut b, cb) = pair(&dpus);
    const N: u64 = 200;
    let buf = a.alloc(4096, 4096).unwrap();
    let ra = a.register(buf, 4096, Access::ALL).unwrap();
    let b_buf = b.alloc(4096, 4096).unwrap();
    let rb = b.register(b_buf, 4096, Access::ALL).unwrap();
    a.write(buf, &pattern(9, 4096)).unwrap();
    let (qp, mut cq) = (a.queue_pair(ca), a.completion_queue().unwrap());
    let poster = std::thread::spawn(move || {
        let mut next = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while next < N {
            let batch: Vec<SendWr> = (next..(next + 4).min(N))
                .map(|i| SendWr {
                    wr_id: i,
                    op: SendOp::Write(Remote {
                        addr: b_buf + (i % 4) * 1024,
                        key: rb.key,
                    }),
                    local: ra.slice((i % 4) * 1024, 1024),
                })
                .collect();
            match qp.post_send(&batch) {
                Ok(()) => next += batch.len() as u64,
                Err(e) => {
                    assert!(matches!(e.error, Error::QueueFull), "{e}");
                    next += e.posted as u64;
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            assert!(Instant::now() < deadline, "posting stalled at {next}");
        }
    });
    let poller = std::thread::spawn(move || {
        let mut seen = vec![false; N as usize];
        let mut wc = [WorkCompletion::default(); 16];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut left = N;
        while left > 0 {
            let n = cq.poll(&mut wc);
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success, "{c:?}");
                assert!(!std::mem::replace(&mut seen[c.wr_id as usize], true));
                left -= 1;
            }
            if n == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
            assert!(Instant::now() < deadline, "{left} completions missing");
        }
    });
    poster.join().unwrap();
    poller.join().unwrap();
    let mut out = vec![0u8; 4096];
    b.read(b_buf, &mut out).unwrap();
    assert_eq!(out, pattern(9, 4096));
    let _ = cb;
}
