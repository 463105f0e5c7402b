//! Rough rates of the transport between two domains of one process (one
//! thread progressing both): RMA WRITE, READ and rendezvous messages of
//! 1 MiB. `cargo run --release -p metaroce-fabric --example loopback_rate`.

use std::sync::Arc;
use std::time::Instant;

use metaroce_core::api::Access;
use metaroce_fi::flags::{errno, ADDR_UNSPEC};
use metaroce_fi::matching::PostedRecv;
use metaroce_fi::queues::{AddressVector, CompletionQueue};
use metaroce_fi::transport::{RmaArgs, RmaOp, SendArgs, Settings, Transport};

fn side() -> (
    Transport,
    Arc<CompletionQueue>,
    Arc<CompletionQueue>,
    Arc<AddressVector>,
) {
    let mut t =
        Transport::new(Settings::from_env("127.0.0.1:0".parse().unwrap()).unwrap()).unwrap();
    let (tx, rx, av) = (Arc::default(), Arc::default(), Arc::default());
    t.bindings.tx_cq = Some(Arc::clone(&tx));
    t.bindings.rx_cq = Some(Arc::clone(&rx));
    t.bindings.av = Some(Arc::clone(&av));
    (t, tx, rx, av)
}

fn drain(a: &mut Transport, b: &mut Transport, cq: &CompletionQueue, n: usize) {
    let mut got = 0;
    while got < n {
        a.progress();
        b.progress();
        loop {
            match cq.read(16, |_, _| {}) {
                Ok(k) => got += k,
                Err(e) if e == errno::EAVAIL => panic!("error {:?}", cq.read_error()),
                Err(_) => break,
            }
        }
    }
}

fn main() {
    let (mut a, atx, _arx, aav) = side();
    let (mut b, _btx, brx, bav) = side();
    aav.insert(b.local_addr());
    bav.insert(a.local_addr());
    let len = 1 << 20;
    let src = vec![7u8; len];
    let mut dst = vec![0u8; len];
    let key = b
        .register(dst.as_mut_ptr() as u64, len as u64, Access::ALL)
        .unwrap();
    let rounds = 200;
    for (name, op) in [("write", RmaOp::Write), ("read", RmaOp::Read)] {
        let start = Instant::now();
        for i in 0..rounds {
            a.rma(RmaArgs {
                op,
                dest: 0,
                buf: src.as_ptr() as usize,
                len,
                local_key: None,
                remote_addr: dst.as_ptr() as u64,
                remote_key: key.into(),
                context: i,
                completion: true,
                inject: false,
            })
            .unwrap();
            drain(&mut a, &mut b, &atx, 1);
        }
        let s = start.elapsed().as_secs_f64();
        println!(
            "{name:8} {:8.1} MB/s  {:8.1} us per 1 MiB",
            (rounds * len) as f64 / s / 1e6,
            s * 1e6 / rounds as f64
        );
    }
    let start = Instant::now();
    for i in 0..rounds {
        b.recv(
            PostedRecv {
                iov: vec![(dst.as_mut_ptr() as usize, len)],
                context: i,
                src: ADDR_UNSPEC,
                tag: 0,
                ignore: u64::MAX,
                completion: true,
            },
            false,
        )
        .unwrap();
        let iov = [(src.as_ptr() as usize, len)];
        a.send(&SendArgs {
            dest: 0,
            iov: &iov,
            tag: None,
            data: None,
            context: i,
            completion: true,
            inject: false,
        })
        .unwrap();
        drain(&mut a, &mut b, &brx, 1);
        drain(&mut a, &mut b, &atx, 1);
    }
    let s = start.elapsed().as_secs_f64();
    println!(
        "message  {:8.1} MB/s  {:8.1} us per 1 MiB",
        (rounds * len) as f64 / s / 1e6,
        s * 1e6 / rounds as f64
    );
    println!("{:?}", a.totals());
    println!("{:?}", b.totals());
}
