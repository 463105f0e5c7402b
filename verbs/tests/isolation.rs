//! Bad host input and two tenants on one DPU, against the fake DPUs: every
//! bad entry gets an error completion or a counted refusal, the device
//! keeps serving the other queue set, and one tenant cannot use another's
//! regions (locally or through its connection).

mod common;

use std::time::{Duration, Instant};

use common::{dpu_addr, FakeDpus};
use metaroce_verbs::abi;
use metaroce_verbs::{
    Access, CompletionQueue, Conn, Device, Error, OpenOptions, Queue, RecvWr, Remote, SendOp,
    SendWr, Status, WorkCompletion,
};

fn wait_completion(cq: &mut CompletionQueue) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(c) = cq.poll_one() {
            return c;
        }
        assert!(Instant::now() < deadline, "no completion within 20 s");
        std::thread::sleep(Duration::from_micros(50));
    }
}

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

/// Runs `rounds` WRITEs of 4 KiB from `a` to `b` and checks each arrived.
fn good_traffic(a: &mut Device, ca: Conn, b: &mut Device, rounds: u8) {
    let mut cq = a.completion_queue().unwrap();
    let src = a.alloc(4096, 4096).unwrap();
    let dst = b.alloc(4096, 4096).unwrap();
    let ra = a.register(src, 4096, Access::ALL).unwrap();
    let rb = b.register(dst, 4096, Access::ALL).unwrap();
    for round in 0..rounds {
        let data = vec![round ^ 0x5a; 4096];
        a.write(src, &data).unwrap();
        a.queue_pair(ca)
            .post_send(&[SendWr {
                wr_id: u64::from(round),
                op: SendOp::Write(Remote {
                    addr: dst,
                    key: rb.key,
                }),
                local: ra.slice(0, 4096),
            }])
            .unwrap();
        let c = wait_completion(&mut cq);
        assert_eq!(c.status, Status::Success);
        let mut out = vec![0; 4096];
        b.read(dst, &mut out).unwrap();
        assert_eq!(out, data);
    }
}

#[test]
fn bad_host_input_is_refused_and_counted_while_another_set_is_served() {
    let dpus = FakeDpus::start("badinput");
    let mut good = open_set(&dpus.paths[0], 0);
    let mut bad = open_set(&dpus.paths[0], 1);
    let mut peer = open_set(&dpus.paths[1], 0);
    peer.listen().unwrap();
    let c_good = good.connect_start(dpu_addr(1)).unwrap();
    let (c_peer, _) = peer.accept(Duration::from_secs(20)).unwrap();
    let c_bad = bad.connect(dpu_addr(1)).unwrap();
    let (c_peer2, _) = peer.accept(Duration::from_secs(20)).unwrap();
    assert_ne!(c_peer, c_peer2);
    let buf = bad.alloc(8192, 4096).unwrap();
    let mr = bad.register(buf, 8192, Access::ALL).unwrap();
    let mut bad_cq = bad.completion_queue().unwrap();

    let entry = |opcode: u8, lkey: u32, length: u32, conn: Conn| abi::SendWqe {
        wr_id: 0,
        conn_index: conn.index,
        conn_generation: conn.generation,
        opcode,
        lkey,
        length,
        laddr: buf,
        raddr: 0,
        rkey: 0,
        ..abi::SendWqe::default()
    };
    // Unknown opcode, a length past the maximum, a zero-length WRITE, an
    // unknown key, a stale generation, an address outside the window.
    let cases: [(abi::SendWqe, Status); 6] = [
        (entry(0x77, mr.key, 64, c_bad), Status::BadOpcode),
        (
            entry(abi::OP_SEND, mr.key, abi::MAX_MESSAGE + 1, c_bad),
            Status::BadLength,
        ),
        (entry(abi::OP_WRITE, mr.key, 0, c_bad), Status::BadLength),
        (
            entry(abi::OP_SEND, 0x1234_5600, 64, c_bad),
            Status::LocalProtection,
        ),
        (
            entry(
                abi::OP_SEND,
                mr.key,
                64,
                Conn {
                    generation: c_bad.generation + 7,
                    ..c_bad
                },
            ),
            Status::BadConnection,
        ),
        (
            abi::SendWqe {
                laddr: 0x40,
                ..entry(abi::OP_SEND, mr.key, 64, c_bad)
            },
            Status::BadAddress,
        ),
    ];
    for (i, (e, _)) in cases.iter().enumerate() {
        let e = abi::SendWqe {
            wr_id: i as u64,
            ..*e
        };
        bad.post_send_raw(&e).unwrap();
    }
    // The device's own refusals complete at once, the endpoint's (the
    // key) after its turn: match by id.
    let mut got: Vec<WorkCompletion> = cases.iter().map(|_| wait_completion(&mut bad_cq)).collect();
    got.sort_by_key(|c| c.wr_id);
    for (c, (_, want)) in got.iter().zip(&cases) {
        assert_eq!(c.status, *want, "case {}", c.wr_id);
    }
    // A receive with a bad length and one on another set's connection.
    bad.post_recv_raw(&abi::RecvWqe {
        wr_id: 0xbad1,
        conn_index: c_bad.index,
        conn_generation: c_bad.generation,
        lkey: mr.key,
        length: abi::MAX_MESSAGE + 1,
        laddr: buf,
    })
    .unwrap();
    bad.queue_pair(c_good)
        .post_recv(&[RecvWr {
            wr_id: 0xbad2,
            local: mr.slice(0, 64),
        }])
        .unwrap();
    assert_eq!(wait_completion(&mut bad_cq).status, Status::BadLength);
    assert_eq!(wait_completion(&mut bad_cq).status, Status::BadConnection);
    // A producer index past the ring, then a doorbell storm: counted,
    // ignored, and the set still works afterwards.
    let pi = bad.producer_index(Queue::Send);
    bad.ring_doorbell_raw(Queue::Send, pi + 1000);
    let deadline = Instant::now() + Duration::from_secs(20);
    while bad.counters().unwrap().bad_producer_index == 0 {
        assert!(Instant::now() < deadline, "the bad index was never seen");
    }
    for _ in 0..5000 {
        bad.ring_doorbell_raw(Queue::Send, pi);
    }
    // Meanwhile the other set moves data.
    good_traffic(&mut good, c_good, &mut peer, 8);
    // Admin refusals: a region in another tenant's window, an unknown
    // admin opcode, an unknown key.
    let other_window = good.info().window_addr;
    assert!(matches!(
        bad.register(other_window, 4096, Access::ALL),
        Err(Error::Refused(Status::NotPermitted))
    ));
    assert!(matches!(
        bad.command_raw(abi::AdminCmd {
            opcode: 0x55,
            ..abi::AdminCmd::default()
        }),
        Err(Error::Refused(Status::BadOpcode))
    ));
    assert!(matches!(
        bad.deregister_key(0xdead_0001),
        Err(Error::Refused(Status::BadKey))
    ));
    let counters = bad.counters().unwrap();
    assert_eq!(counters.refused_bad_opcode, 2, "one entry, one command");
    assert_eq!(counters.refused_bad_length, 3);
    assert_eq!(counters.refused_bad_connection, 2);
    assert_eq!(counters.refused_bad_address, 1);
    assert_eq!(counters.refused_not_permitted, 1);
    assert_eq!(counters.refused_invalid, 0);
    assert_eq!(counters.refused_bad_key, 1, "the unknown key");
    assert_eq!(counters.bad_producer_index, 1);
    assert!(
        counters.spurious_doorbells > 0,
        "the storm was seen: {counters:?}"
    );
    // The bad set still works once its doorbell is sane again.
    bad.ring_doorbell_raw(Queue::Send, pi);
    bad.queue_pair(c_bad)
        .post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::Write(Remote { addr: 0, key: 0 }),
            local: mr.slice(0, 64),
        }])
        .unwrap();
    // (The peer has no region at address 0: the peer refuses it, which
    // proves the entry reached the transport and back.)
    let c = wait_completion(&mut bad_cq);
    assert_eq!((c.wr_id, c.status), (9, Status::RemoteInvalidKey));
    good_traffic(&mut good, c_good, &mut peer, 2);
}

#[test]
fn two_tenants_on_one_dpu_cannot_use_each_others_regions() {
    let dpus = FakeDpus::start("tenants");
    let mut alice = open_set(&dpus.paths[0], 0);
    let mut bob = open_set(&dpus.paths[0], 1);
    assert_ne!(
        alice.info().pd,
        bob.info().pd,
        "separate protection domains"
    );
    let mut peer = open_set(&dpus.paths[1], 0);
    peer.listen().unwrap();
    let c_alice = alice.connect_start(dpu_addr(1)).unwrap();
    let (p_alice, _) = peer.accept(Duration::from_secs(20)).unwrap();
    let c_bob = bob.connect_start(dpu_addr(1)).unwrap();
    let (p_bob, _) = peer.accept(Duration::from_secs(20)).unwrap();
    let a_buf = alice.alloc(4096, 4096).unwrap();
    let a_mr = alice.register(a_buf, 4096, Access::ALL).unwrap();
    alice.write(a_buf, &[0xa1; 4096]).unwrap();
    let b_buf = bob.alloc(4096, 4096).unwrap();
    let b_mr = bob.register(b_buf, 4096, Access::ALL).unwrap();
    let p_buf = peer.alloc(4096, 4096).unwrap();
    let p_mr = peer.register(p_buf, 4096, Access::ALL).unwrap();
    let (mut bob_cq, mut peer_cq) = (
        bob.completion_queue().unwrap(),
        peer.completion_queue().unwrap(),
    );

    // Bob names Alice's key for his local buffer: refused by the domain.
    bob.queue_pair(c_bob)
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Write(Remote {
                addr: p_buf,
                key: p_mr.key,
            }),
            local: metaroce_verbs::Sge {
                addr: b_buf,
                len: 64,
                key: a_mr.key,
            },
        }])
        .unwrap();
    assert_eq!(wait_completion(&mut bob_cq).status, Status::LocalProtection);
    // Bob cannot deregister Alice's region, nor register inside her window.
    assert!(matches!(
        bob.deregister_key(a_mr.key),
        Err(Error::Refused(Status::NotPermitted))
    ));
    assert!(matches!(
        bob.register(a_buf, 4096, Access::ALL),
        Err(Error::Refused(Status::NotPermitted))
    ));
    // The peer reaches Bob's region through Bob's connection and Alice's
    // through Alice's...
    peer.queue_pair(p_bob)
        .post_send(&[SendWr {
            wr_id: 4,
            op: SendOp::Write(Remote {
                addr: b_buf,
                key: b_mr.key,
            }),
            local: p_mr.slice(0, 64),
        }])
        .unwrap();
    assert_eq!(wait_completion(&mut peer_cq).status, Status::Success);
    peer.queue_pair(p_alice)
        .post_send(&[SendWr {
            wr_id: 3,
            op: SendOp::Read(Remote {
                addr: a_buf,
                key: a_mr.key,
            }),
            local: p_mr.slice(0, 64),
        }])
        .unwrap();
    assert_eq!(wait_completion(&mut peer_cq).status, Status::Success);
    let mut out = [0u8; 64];
    peer.read(p_buf, &mut out).unwrap();
    assert_eq!(out, [0xa1; 64]);
    // ... but not Alice's memory through Bob's connection (which, as any
    // RDMA connection after a remote access error, then fails).
    peer.queue_pair(p_bob)
        .post_send(&[SendWr {
            wr_id: 2,
            op: SendOp::Read(Remote {
                addr: a_buf,
                key: a_mr.key,
            }),
            local: p_mr.slice(0, 64),
        }])
        .unwrap();
    assert_eq!(
        wait_completion(&mut peer_cq).status,
        Status::RemoteInvalidKey
    );
    // Alice's memory was never written by anyone but Alice.
    let mut mine = vec![0u8; 4096];
    alice.read(a_buf, &mut mine).unwrap();
    assert!(mine.iter().all(|&b| b == 0xa1));
    // Only the set in the endpoint's accept domain may listen today.
    assert!(matches!(
        bob.listen(),
        Err(Error::Refused(Status::NotPermitted))
    ));
    let _ = c_alice;
}
