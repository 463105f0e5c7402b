//! The provider's transport, two domains in one process over loopback:
//! eager and rendezvous messages (expected and unexpected), tagged
//! matching, truncation, RMA with remote CQ data, and the errors an
//! application must see (bad key, bounds, unknown address, unreachable
//! peer). Every check is on bytes and completions, never on time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metaroce_core::api::Access;
use metaroce_fi::flags::{self, errno, ADDR_UNSPEC};
use metaroce_fi::matching::PostedRecv;
use metaroce_fi::queues::{AddressVector, CompletionQueue, CqEntry, CqError, CqItem};
use metaroce_fi::transport::{RmaArgs, RmaOp, SendArgs, Settings, Transport, EAGER_LIMIT};

struct Side {
    t: Transport,
    tx: Arc<CompletionQueue>,
    rx: Arc<CompletionQueue>,
    av: Arc<AddressVector>,
}

fn settings() -> Settings {
    let mut s = Settings::from_env("127.0.0.1:0".parse().unwrap()).expect("settings");
    s.timeout = Duration::from_secs(2);
    s
}

fn side() -> Side {
    let mut t = Transport::new(settings()).expect("bind a transport on loopback");
    let tx = Arc::new(CompletionQueue::default());
    let rx = Arc::new(CompletionQueue::default());
    let av = Arc::new(AddressVector::default());
    t.bindings.tx_cq = Some(Arc::clone(&tx));
    t.bindings.rx_cq = Some(Arc::clone(&rx));
    t.bindings.av = Some(Arc::clone(&av));
    Side { t, tx, rx, av }
}

/// Two sides, each knowing the other as fi_addr 0.
fn pair() -> (Side, Side) {
    let a = side();
    let b = side();
    assert_eq!(a.av.insert(b.t.local_addr()), 0);
    assert_eq!(b.av.insert(a.t.local_addr()), 0);
    (a, b)
}

fn take(cq: &CompletionQueue) -> Option<Result<CqEntry, CqError>> {
    let mut got = None;
    match cq.read(1, |_, e| got = Some(*e)) {
        Ok(_) => got.map(Ok),
        Err(e) if e == errno::EAVAIL => cq.read_error().map(Err),
        Err(_) => None,
    }
}

/// Progresses both sides until `cq` of `who` yields an item (10 s bound).
fn wait(
    a: &mut Side,
    b: &mut Side,
    who: impl Fn(&Side, &Side) -> Arc<CompletionQueue>,
) -> Result<CqEntry, CqError> {
    let start = Instant::now();
    loop {
        if let Some(item) = take(&who(a, b)) {
            return item;
        }
        a.t.progress();
        b.t.progress();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no completion within 10 s"
        );
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn send(s: &mut Side, buf: &[u8], tag: Option<u64>, data: Option<u32>, context: usize) {
    let iov = [(buf.as_ptr() as usize, buf.len())];
    s.t.send(&SendArgs {
        dest: 0,
        iov: &iov,
        tag,
        data,
        context,
        completion: true,
        inject: false,
    })
    .expect("send posts");
}

fn recv(s: &mut Side, buf: &mut [u8], tagged: Option<(u64, u64)>, context: usize) {
    let (tag, ignore) = tagged.unwrap_or((0, u64::MAX));
    s.t.recv(
        PostedRecv {
            iov: vec![(buf.as_mut_ptr() as usize, buf.len())],
            context,
            src: ADDR_UNSPEC,
            tag,
            ignore,
            completion: true,
        },
        tagged.is_some(),
    )
    .expect("recv posts");
}

#[test]
fn messages_eager_and_rendezvous_expected_and_unexpected() {
    let (mut a, mut b) = pair();
    for (i, len) in [0usize, 1, 100, EAGER_LIMIT, EAGER_LIMIT + 1, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        let mut got = vec![0u8; len];
        // Expected: the receive is posted first.
        recv(&mut b, &mut got, None, 10 + i);
        send(&mut a, &data, None, Some(i as u32), 20 + i);
        let r = wait(&mut a, &mut b, |_, b| b.rx.clone()).expect("receive completes");
        assert_eq!((r.context, r.len), (10 + i, len), "receive of {len} B");
        assert_eq!(r.data, i as u64);
        assert!(r.flags & flags::REMOTE_CQ_DATA != 0 && r.flags & flags::RECV != 0);
        assert_eq!(
            r.src, 0,
            "the source is resolved through the address vector"
        );
        let s = wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("send completes");
        assert_eq!(s.context, 20 + i);
        assert!(got == data, "bytes of the {len} B message");
        // Unexpected: the message arrives first, is held, then matched.
        let mut got = vec![0u8; len];
        send(&mut a, &data, None, None, 30 + i);
        for _ in 0..200 {
            a.t.progress();
            b.t.progress();
        }
        recv(&mut b, &mut got, None, 40 + i);
        let r = wait(&mut a, &mut b, |_, b| b.rx.clone()).expect("unexpected message received");
        assert_eq!((r.context, r.len), (40 + i, len));
        wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("send completes");
        assert!(got == data, "bytes of the unexpected {len} B message");
    }
    assert_eq!(b.t.unexpected_len(), 0);
}

#[test]
fn tagged_receives_match_by_tag_in_order() {
    let (mut a, mut b) = pair();
    let big = EAGER_LIMIT * 3;
    let msgs: Vec<(u64, Vec<u8>)> = (0..6u64)
        .map(|i| {
            (
                0x100 + (i % 3),
                pattern(if i % 2 == 0 { 64 } else { big }, i as u8),
            )
        })
        .collect();
    for (i, (tag, data)) in msgs.iter().enumerate() {
        send(&mut a, data, Some(*tag), None, i);
    }
    // Receives in reverse tag order; each takes the oldest of its tag.
    let mut bufs: Vec<Vec<u8>> = (0..6).map(|_| vec![0u8; big]).collect();
    let order = [2usize, 5, 1, 4, 0, 3];
    for (k, &i) in order.iter().enumerate() {
        let tag = msgs[i].0;
        let buf = &mut bufs[k];
        recv(&mut b, buf, Some((tag, 0)), 100 + k);
    }
    let mut seen = 0;
    while seen < 6 {
        let r = wait(&mut a, &mut b, |_, b| b.rx.clone()).expect("tagged receive");
        let k = r.context - 100;
        let i = order[k];
        assert_eq!(r.tag, msgs[i].0);
        assert_eq!(r.len, msgs[i].1.len());
        assert!(
            bufs[k][..r.len] == msgs[i].1[..],
            "message {i} in receive {k}"
        );
        seen += 1;
    }
    for _ in 0..6 {
        wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("send completes");
    }
}

#[test]
fn a_message_longer_than_its_receive_is_truncated() {
    let (mut a, mut b) = pair();
    for len in [1000usize, 200_000] {
        let data = pattern(len, 7);
        let mut got = vec![0u8; 100];
        recv(&mut b, &mut got, Some((5, 0)), 1);
        send(&mut a, &data, Some(5), None, 2);
        let e = wait(&mut a, &mut b, |_, b| b.rx.clone()).expect_err("truncated");
        assert_eq!(e.err, errno::ETRUNC);
        assert_eq!(e.olen, len - 100);
        assert!(got[..] == data[..100]);
        wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("the sender still completes");
    }
}

#[test]
fn rma_write_read_and_write_with_data() {
    let (mut a, mut b) = pair();
    let len = 300_000;
    let mut target = vec![0u8; len];
    let key =
        b.t.register(target.as_mut_ptr() as u64, len as u64, Access::ALL)
            .expect("register");
    let data = pattern(len, 3);
    let rma = |op, buf: usize, len: usize, addr: u64, key: u64, context: usize| RmaArgs {
        op,
        dest: 0,
        buf,
        len,
        local_key: None,
        remote_addr: addr,
        remote_key: key,
        context,
        completion: true,
        inject: false,
    };
    let base = target.as_ptr() as u64;
    a.t.rma(rma(
        RmaOp::Write,
        data.as_ptr() as usize,
        len,
        base,
        key.into(),
        1,
    ))
    .expect("write posts");
    let w = wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("write completes");
    assert_eq!(w.flags, flags::RMA | flags::WRITE);
    assert!(target == data);
    let mut back = vec![0u8; 5000];
    a.t.rma(rma(
        RmaOp::Read,
        back.as_mut_ptr() as usize,
        5000,
        base + 1000,
        key.into(),
        2,
    ))
    .expect("read posts");
    wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("read completes");
    assert!(back[..] == data[1000..6000]);
    a.t.rma(rma(
        RmaOp::WriteData(0xfeed),
        data.as_ptr() as usize,
        64,
        base,
        key.into(),
        3,
    ))
    .expect("writedata posts");
    wait(&mut a, &mut b, |a, _| a.tx.clone()).expect("writedata completes");
    let r = wait(&mut a, &mut b, |_, b| b.rx.clone()).expect("remote CQ data reported");
    assert_eq!(r.data, 0xfeed);
    assert!(r.flags & flags::REMOTE_CQ_DATA != 0 && r.flags & flags::REMOTE_WRITE != 0);
    // A wrong key and a range past the region fail at the initiator.
    a.t.rma(rma(
        RmaOp::Write,
        data.as_ptr() as usize,
        64,
        base,
        u64::from(key ^ 0x5a5a),
        4,
    ))
    .expect("posts");
    let e = wait(&mut a, &mut b, |a, _| a.tx.clone()).expect_err("bad key");
    assert!(e.err != 0 && e.entry.context == 4, "{e:?}");
    a.t.rma(rma(
        RmaOp::Write,
        data.as_ptr() as usize,
        64,
        base + len as u64 - 10,
        key.into(),
        5,
    ))
    .expect("posts");
    let e = wait(&mut a, &mut b, |a, _| a.tx.clone()).expect_err("past the region");
    assert!(e.err != 0 && e.entry.context == 5, "{e:?}");
    assert!(
        target[..] == data[..],
        "nothing written by the failed operations"
    );
}

#[test]
fn unknown_addresses_and_unreachable_peers_are_errors() {
    let mut a = side();
    let buf = [1u8; 8];
    let iov = [(buf.as_ptr() as usize, 8)];
    let args = |dest| SendArgs {
        dest,
        iov: &iov,
        tag: None,
        data: None,
        context: 9,
        completion: true,
        inject: false,
    };
    assert_eq!(a.t.send(&args(3)), Err(errno::EINVAL), "never inserted");
    // A port nobody listens on.
    let dead: SocketAddr = "127.0.0.1:9".parse().unwrap();
    assert_eq!(a.av.insert(dead), 0);
    a.t.send(&args(0)).expect("posts while connecting");
    let start = Instant::now();
    let e = loop {
        if let Some(item) = take(&a.tx) {
            break item.expect_err("the peer never answers");
        }
        a.t.progress();
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no error within 15 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(e.entry.context, 9);
    assert!(e.err != 0);
    let _ = CqItem::Done(CqEntry::new(0, 0));
}
