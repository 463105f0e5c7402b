//! Spec conformance: an acceptor driven packet by packet, checked
//! against the rules an implementation built from the specification alone
//! relies on: a NAK per refused packet (3.7, 4.7), path counters that
//! include duplicates and refused packets (3.5), KEEPALIVE never
//! acknowledged (3.8.3, 4.12), the source-address check (4.7.1) and the PSN
//! field of packets without a sequence number (3.2.4).

mod common;

use std::time::Duration;

use common::*;
use metaroce_core::api::{
    Access, ConnHandle, LocalBuf, Memory, Op, PeerAddr, Region, RxMeta, WorkRequest,
};
use metaroce_core::wire::{self, Body, Flags, Header, MemoryTarget, NakReason, Repr, COOKIE_LEN};
use metaroce_core::{Config, Event, Instant};
use smoltcp::wire::{IpAddress, Ipv4Address};

const PEER_ID: u32 = 0x0102_0304;
const PEER_TOKEN: u64 = 0x5eed_5eed_0000_0001;
const PEER_PSN: u32 = 1000;

/// Memory that records every write.
#[derive(Default)]
struct Writes(Vec<(u64, usize)>);

impl Memory for Writes {
    fn write(&mut self, addr: u64, data: &[u8]) {
        self.0.push((addr, data.len()));
    }
    fn read(&mut self, _: u64, _: &mut [u8]) {}
}

fn meta(ip: [u8; 4], ce: bool) -> RxMeta {
    RxMeta {
        source: PeerAddr {
            ip: IpAddress::Ipv4(Ipv4Address::new(ip[0], ip[1], ip[2], ip[3])),
            port: 40000,
        },
        ce,
    }
}

const HOME: [u8; 4] = [10, 0, 0, 1];

/// An acceptor with one established connection from a hand-driven peer.
struct Rig {
    ep: Ep,
    now: Instant,
    buf: Vec<u8>,
    conn: ConnHandle,
    /// The acceptor's id and token, and its Initial PSN.
    id: u32,
    token: u64,
    initial: u32,
    /// The ACCEPT's header PSN field.
    accept_psn: u32,
    next_psn: u32,
    next_msg: u32,
    key: u32,
    mem: Writes,
}

fn connect(cookie: [u8; COOKIE_LEN]) -> Repr {
    Repr {
        header: Header {
            flags: Flags::NONE,
            dst_conn: 0,
            token: 0,
            psn: PEER_PSN,
            path: 0,
            timestamp: 0,
        },
        body: Body::Connect(wire::ConnectRepr {
            src_conn: PEER_ID,
            src_token: PEER_TOKEN,
            mtu: 1024,
            max_paths: 4,
            window: 256,
            initial_psn: PEER_PSN,
            reply_port: 4795,
            timer_profile: wire::TimerProfile::DataCenter,
            suite: wire::CipherSuite::None,
            key_id: 0,
            cookie,
        }),
        payload_len: 0,
    }
}

fn encode(repr: &Repr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, payload);
    buf
}

impl Rig {
    fn new() -> Rig {
        let mut ep: Ep = endpoint(Config::default(), 8, 15);
        let key = ep
            .register_region(Region {
                base: 0x10_000,
                len: 0x10_000,
                access: Access::REMOTE_WRITE.with(Access::LOCAL_WRITE),
                pd: 0,
            })
            .unwrap();
        let mut rig = Rig {
            ep,
            now: Instant::from_micros(10),
            buf: vec![0; 9300],
            conn: ConnHandle::from_bits(0),
            id: 0,
            token: 0,
            initial: 0,
            accept_psn: 0,
            next_psn: PEER_PSN,
            next_msg: 1,
            key,
            mem: Writes::default(),
        };
        let sent = rig.deliver_from(HOME, false, &encode(&connect([0; COOKIE_LEN]), &[]));
        let Body::Retry(r) = sent[0].body else {
            panic!("expected RETRY, got {sent:?}")
        };
        let sent = rig.deliver_from(HOME, false, &encode(&connect(r.cookie), &[]));
        let Body::Accept(a) = sent[0].body else {
            panic!("expected ACCEPT, got {sent:?}")
        };
        rig.id = a.src_conn;
        rig.token = a.src_token;
        rig.initial = a.initial_psn;
        rig.accept_psn = sent[0].header.psn;
        while let Some(e) = rig.ep.poll_event() {
            if let Event::Incoming { conn, .. } = e {
                rig.conn = conn;
            }
        }
        rig
    }

    fn deliver_from(&mut self, ip: [u8; 4], ce: bool, bytes: &[u8]) -> Vec<Repr> {
        self.ep
            .handle_packet(self.now, &meta(ip, ce), bytes, &mut self.mem);
        self.drain()
    }

    fn deliver(&mut self, ce: bool, repr: &Repr, payload: &[u8]) -> Vec<Repr> {
        self.deliver_from(HOME, ce, &encode(repr, payload))
    }

    fn drain(&mut self) -> Vec<Repr> {
        let mut out = Vec::new();
        while let Some(t) = self.ep.poll_transmit(self.now, &mut self.buf) {
            let len = metaroce_core::finish_packet(&t, &mut self.buf, &mut Writes::default());
            out.push(wire::parse(&self.buf[..len]).unwrap().0);
        }
        out
    }

    fn header(&self, psn: u32, path: u16) -> Header {
        Header {
            flags: Flags::ACK_REQUEST,
            dst_conn: self.id,
            token: self.token,
            psn,
            path,
            timestamp: 0x1234,
        }
    }

    fn keepalive(&self) -> Repr {
        Repr {
            header: Header {
                flags: Flags::NONE,
                ..self.header(self.next_psn, 0)
            },
            body: Body::Keepalive,
            payload_len: 0,
        }
    }

    /// A one-packet WRITE of 64 bytes at `off` in the region.
    fn write(&mut self, off: u64, path: u16) -> Repr {
        let psn = self.next_psn;
        self.next_psn += 1;
        let msg = self.next_msg;
        self.next_msg += 1;
        Repr {
            header: self.header(psn, path),
            body: Body::Write(wire::WriteRepr {
                msg: wire::MessageSpan {
                    id: msg,
                    offset: 0,
                    len: 64,
                },
                target: MemoryTarget {
                    key: self.key,
                    addr: 0x10_000 + off,
                },
                imm: None,
            }),
            payload_len: 64,
        }
    }

    /// A one-packet SEND naming receive `recv_index`.
    fn send(&mut self, recv_index: u32, path: u16) -> Repr {
        let psn = self.next_psn;
        self.next_psn += 1;
        let msg = self.next_msg;
        self.next_msg += 1;
        Repr {
            header: self.header(psn, path),
            body: Body::Send(wire::SendRepr {
                msg: wire::MessageSpan {
                    id: msg,
                    offset: 0,
                    len: 64,
                },
                recv_index,
                imm: None,
            }),
            payload_len: 64,
        }
    }

    fn establish(&mut self) {
        let k = self.keepalive();
        let sent = self.deliver(false, &k, &[]);
        // The confirmation's answer, and the address token for the next
        // connection (spec 4.2.5).
        assert!(
            sent.iter()
                .all(|r| matches!(r.body, Body::Keepalive | Body::NewToken(_))),
            "{sent:?}"
        );
    }
}

const DATA: [u8; 64] = [0xab; 64];

fn naks(sent: &[Repr]) -> Vec<(u32, NakReason)> {
    sent.iter()
        .filter_map(|r| match r.body {
            Body::Nak(n) => Some((n.nak_psn, n.reason)),
            _ => None,
        })
        .collect()
}

fn acks(sent: &[Repr]) -> Vec<wire::AckRepr> {
    sent.iter()
        .filter_map(|r| match r.body {
            Body::Ack(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// Item 3: a burst of refused packets handled before one poll gets one NAK
/// per packet, with its PSN; `naks_sent` counts what went out; beyond the
/// endpoint's NAK queue the rest is counted as a pool refusal.
#[test]
fn each_refused_packet_gets_its_own_nak_and_naks_sent_counts_the_wire() {
    let mut rig = Rig::new();
    rig.establish();
    // No receive is posted: every SEND is RECEIVER_NOT_READY.
    let burst: Vec<Repr> = (0..20).map(|_| rig.send(0, 1)).collect();
    for r in &burst {
        rig.ep
            .handle_packet(rig.now, &meta(HOME, false), &encode(r, &DATA), &mut rig.mem);
    }
    let sent = rig.drain();
    let got = naks(&sent);
    let want: Vec<(u32, NakReason)> = burst
        .iter()
        .map(|r| (r.header.psn, NakReason::ReceiverNotReady))
        .collect();
    assert_eq!(got, want);
    assert_eq!(rig.ep.stats(rig.conn).unwrap().naks_sent, 20);
    assert_eq!(rig.ep.pool_refusals().naks, 0);
    // More than the queue holds in one batch: the overflow is counted, and
    // naks_sent still counts only what went out.
    let queue = metaroce_core::conn::NAK_QUEUE;
    let burst: Vec<Repr> = (0..queue + 5).map(|_| rig.send(0, 1)).collect();
    for r in &burst {
        rig.ep
            .handle_packet(rig.now, &meta(HOME, false), &encode(r, &DATA), &mut rig.mem);
    }
    let got = naks(&rig.drain());
    assert_eq!(got.len(), queue);
    assert_eq!(rig.ep.stats(rig.conn).unwrap().naks_sent, 20 + queue as u64);
    assert_eq!(rig.ep.pool_refusals().naks, 5);
    assert!(rig.mem.0.is_empty(), "a refused packet was placed");
}

/// Item 4: duplicates and refused packets count in Path RX Count and,
/// CE-marked, in Path CE Count.
#[test]
fn path_counters_include_duplicates_and_refused_packets() {
    let mut rig = Rig::new();
    rig.establish();
    let w = rig.write(0, 2);
    let a = acks(&rig.deliver(false, &w, &DATA));
    assert_eq!((a[0].path_rx_count, a[0].path_ce_count), (1, 0));
    // CE: the duplicate, two refused SENDs, then a new WRITE.
    rig.deliver(true, &w, &DATA);
    for _ in 0..2 {
        let s = rig.send(0, 2);
        let sent = rig.deliver(true, &s, &DATA);
        assert_eq!(naks(&sent).len(), 1);
    }
    let w2 = rig.write(64, 2);
    let a = acks(&rig.deliver(true, &w2, &DATA));
    let a = a.iter().find(|a| a.echo_psn == w2.header.psn).unwrap();
    assert_eq!(a.echo_path, 2);
    assert_eq!((a.path_rx_count, a.path_ce_count), (5, 4));
}

/// Item 5: a KEEPALIVE is never acknowledged, before data or after, and
/// nothing answers it later either (no ACK that echoes nothing).
#[test]
fn a_keepalive_draws_no_ack() {
    let mut rig = Rig::new();
    rig.establish();
    let k = rig.keepalive();
    assert!(rig.deliver(false, &k, &[]).is_empty());
    let w = rig.write(0, 0);
    assert_eq!(acks(&rig.deliver(false, &w, &DATA)).len(), 1);
    let k = rig.keepalive();
    assert!(acks(&rig.deliver(false, &k, &[])).is_empty());
    for _ in 0..20 {
        rig.now += Duration::from_millis(1);
        rig.ep.handle_timeout(rig.now);
        let sent = rig.drain();
        assert!(acks(&sent).is_empty(), "{sent:?}");
    }
}

/// Item 5 (4.5): an ACK that echoes nothing (Echo PSN, Timestamp and Path
/// 0, before this end sent any data) gives no round-trip sample; an echo
/// of a PSN this end sent does.
#[test]
fn an_ack_echoing_no_sent_psn_gives_no_rtt_sample() {
    let mut rig = Rig::new();
    rig.establish();
    let ack = |rig: &Rig, echo_psn: u32, echo_timestamp: u32| Repr {
        header: Header {
            flags: Flags::NONE,
            ..rig.header(rig.next_psn, 0)
        },
        body: Body::Ack(wire::AckRepr {
            cumulative: rig.initial,
            echo_psn,
            echo_timestamp,
            echo_path: 0,
            path_rx_count: 0,
            path_ce_count: 0,
            rate_hint_mbps: 0,
            sack_offset: 0,
            sack: wire::SackBits::default(),
        }),
        payload_len: 0,
    };
    let a = ack(&rig, 0, 0);
    rig.deliver(false, &a, &[]);
    let srtt = |rig: &Rig| rig.ep.connection(rig.conn).unwrap().srtt_ns();
    assert_eq!(srtt(&rig), 0, "a sample from an ACK that echoes nothing");
    let wr = WorkRequest {
        id: 1,
        op: Op::Send,
        local: LocalBuf {
            key: rig.key,
            addr: 0x10_000,
            len: 64,
        },
    };
    rig.ep.post_send(rig.conn, wr).unwrap();
    let sent = rig.drain();
    let data = sent
        .iter()
        .find(|r| matches!(r.body, Body::Send(_)))
        .expect("the SEND");
    let (psn, ts) = (data.header.psn, data.header.timestamp);
    rig.now += Duration::from_micros(30);
    let a = ack(&rig, psn, ts);
    rig.deliver(false, &a, &[]);
    assert_eq!(srtt(&rig), 30_000);
}

/// Item 6: a valid packet from another address than the handshake's is
/// dropped silently, counted as `bad_source`, and not placed; from the
/// handshake's address the same packet is taken.
#[test]
fn a_packet_from_another_source_address_is_dropped_silently() {
    let mut rig = Rig::new();
    rig.establish();
    let w = rig.write(0, 0);
    let sent = rig.deliver_from([10, 0, 0, 2], false, &encode(&w, &DATA));
    assert!(sent.is_empty(), "{sent:?}");
    assert_eq!(rig.ep.drops().bad_source, 1);
    assert!(rig.mem.0.is_empty());
    let a = acks(&rig.deliver(false, &w, &DATA));
    assert_eq!(a[0].cumulative, w.header.psn + 1);
    assert_eq!(rig.mem.0.len(), 1);
}

/// Item 7: ACCEPT carries the Initial PSN in its PSN field; ACK, NAK and
/// KEEPALIVE carry the next PSN the acceptor will send.
#[test]
fn the_psn_field_follows_spec_3_2_4() {
    let mut rig = Rig::new();
    assert_eq!(rig.accept_psn, rig.initial);
    let k = rig.keepalive();
    let sent = rig.deliver(false, &k, &[]);
    assert!(sent.iter().all(|r| r.header.psn == rig.initial), "{sent:?}");
    let w = rig.write(0, 0);
    let s = rig.send(0, 0);
    let mut sent = rig.deliver(false, &w, &DATA);
    sent.extend(rig.deliver(false, &s, &DATA));
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent.iter().all(|r| r.header.psn == rig.initial), "{sent:?}");
    // The acceptor sends a message (its next PSN moves on, its una too
    // once acknowledged); a repeated CONNECT still gets an ACCEPT with the
    // Initial PSN in the PSN field and the extension.
    let wr = WorkRequest {
        id: 1,
        op: Op::Send,
        local: LocalBuf {
            key: rig.key,
            addr: 0x10_000,
            len: 64,
        },
    };
    rig.ep.post_send(rig.conn, wr).unwrap();
    let sent = rig.drain();
    let data: Vec<&Repr> = sent
        .iter()
        .filter(|r| matches!(r.body, Body::Send(_)))
        .collect();
    assert_eq!(data.len(), 1, "{sent:?}");
    assert_eq!(data[0].header.psn, rig.initial);
    let ack = Repr {
        header: Header {
            flags: Flags::NONE,
            ..rig.header(rig.next_psn, 0)
        },
        body: Body::Ack(wire::AckRepr {
            cumulative: rig.initial + 1,
            echo_psn: rig.initial,
            echo_timestamp: data[0].header.timestamp,
            echo_path: 0,
            path_rx_count: 1,
            path_ce_count: 0,
            rate_hint_mbps: 0,
            sack_offset: 0,
            sack: wire::SackBits::default(),
        }),
        payload_len: 0,
    };
    rig.deliver(false, &ack, &[]);
    // A refused packet now: its NAK carries the next PSN, initial + 1.
    let s = rig.send(0, 0);
    let sent = rig.deliver(false, &s, &DATA);
    assert_eq!(naks(&sent).len(), 1);
    assert!(
        sent.iter().all(|r| r.header.psn == rig.initial + 1),
        "{sent:?}"
    );
    let sent = rig.deliver(false, &connect([0; COOKIE_LEN]), &[]);
    let accept = sent
        .iter()
        .find_map(|r| match r.body {
            Body::Accept(a) => Some((r.header.psn, a.initial_psn)),
            _ => None,
        })
        .expect("a repeated CONNECT gets the ACCEPT again");
    assert_eq!(accept, (rig.initial, rig.initial));
}
