//! The host library's first program (`docs/guide/host-library.md`).
//!
//! ```text
//! guide DPU0.shm DPU0_IP:PORT DPU1.shm DPU1_IP:PORT
//! ```
//!
//! It opens the host interface of two DPUs, connects DPU 0 to DPU 1,
//! registers a buffer on each, WRITEs a message with an immediate value
//! from 0 into 1's buffer, and checks what arrived. The arguments are
//! what the QEMU harness hands a program it runs (`metaroce-qemu --exec`);
//! `verbs/tests/guide.rs` runs the same code against two fake DPUs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use metaroce_verbs::{
    Access, CompletionQueue, Device, Error, Opcode, RecvWr, Remote, SendOp, SendWr, WorkCompletion,
};

/// Any failure of the example, as a message.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What DPU 0 writes into DPU 1's memory.
pub const MESSAGE: &[u8] = b"hello over MetaRoCE";

/// Connects DPU 0 (`shm0`) to DPU 1 (`shm1`, reachable at `addr1`),
/// WRITEs [`MESSAGE`] with immediate value 7 and returns the bytes DPU 1
/// received.
pub fn run(shm0: &str, shm1: &str, addr1: SocketAddr) -> Result<Vec<u8>> {
    // Claim a queue set on each DPU, and take its completion queue (it
    // could be polled on another thread).
    let mut a = Device::open(shm0)?;
    let mut b = Device::open(shm1)?;
    let (mut a_cq, mut b_cq) = (a.completion_queue()?, b.completion_queue()?);

    // DPU 1 listens, DPU 0 connects, DPU 1 takes the new connection.
    b.listen()?;
    let ca = a.connect(addr1)?;
    let (cb, _peer) = b.accept(Duration::from_secs(20))?;

    // A buffer on each side, carved out of the queue set's window and
    // registered. DPU 1's may be written by its peer.
    let len = MESSAGE.len() as u64;
    let src = a.alloc(4096, 4096)?;
    let dst = b.alloc(4096, 4096)?;
    let src_mr = a.register(src, 4096, Access::LOCAL_WRITE)?;
    let dst_mr = b.register(dst, 4096, Access::ALL)?;
    a.write(src, MESSAGE)?;

    // A queue pair posts on one connection: lists of work requests, one
    // doorbell per list. A WRITE with an immediate value consumes one
    // receive at the target: post it first (no buffer needed, the data
    // goes where the WRITE says).
    let (qa, qb) = (a.queue_pair(ca), b.queue_pair(cb));
    qb.post_recv(&[RecvWr {
        wr_id: 10,
        local: dst_mr.slice(0, 0),
    }])?;

    // The target's address and key would travel in a SEND in a real
    // program; here both ends are in one process.
    let target = Remote {
        addr: dst_mr.addr,
        key: dst_mr.key,
    };
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::WriteImm(target, 7),
        local: src_mr.slice(0, len as u32),
    }])?;

    // Each side gets one completion: the sender's says the WRITE is
    // acknowledged, the target's that the data is in place.
    let sent = wait(&mut a_cq)?;
    let received = wait(&mut b_cq)?;
    if !sent.status.is_success() {
        return Err(format!("the WRITE failed: {:?}", sent.status).into());
    }
    if (received.opcode, received.imm) != (Opcode::RecvWriteImm, Some(7)) {
        return Err(format!("unexpected completion at DPU 1: {received:?}").into());
    }

    let mut got = vec![0u8; MESSAGE.len()];
    b.read(dst, &mut got)?;
    a.close(ca)?;
    Ok(got)
}

/// Polls `cq` until an entry arrives (20 s at most).
fn wait(cq: &mut CompletionQueue) -> std::result::Result<WorkCompletion, Error> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(c) = cq.poll_one() {
            return Ok(c);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

#[allow(dead_code)] // the test includes this file for `run` alone
fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [shm0, _addr0, shm1, addr1] = args.as_slice() else {
        eprintln!("usage: guide DPU0.shm IP0:PORT DPU1.shm IP1:PORT");
        return std::process::ExitCode::from(2);
    };
    let Ok(addr1) = addr1.parse() else {
        eprintln!("bad address {addr1}");
        return std::process::ExitCode::from(2);
    };
    match run(shm0, shm1, addr1) {
        Ok(got) if got == MESSAGE => {
            println!("DPU 1 received {:?}", String::from_utf8_lossy(&got));
            std::process::ExitCode::SUCCESS
        }
        Ok(got) => {
            eprintln!("DPU 1 received {got:?}, not the message");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("guide: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
