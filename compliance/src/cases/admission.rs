//! Fair admission (spec 4.2.3): the target's table (or its key slots),
//! filled by sources of one /24 that proved their addresses and hold
//! unconfirmed connections, or idle ones kept alive, still admits a client
//! from another /24, and the connection it gives up for it ends with CLOSE
//! (RECLAIMED); and a narrow prefix at its declared half-open limit is
//! refused with CLOSE (REJECTED) while its neighbours are not. Needs a
//! target on IPv4 loopback that sees each peer's own address (127.0.0.0/8
//! is all this host's).

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use metaroce_core::wire::{
    self, Body, CipherSuite, CloseReason, ConnectRepr, Flags, Header, Repr, TimerProfile,
};

use super::{ensure, Ctx, Fail, Peer};

/// Addresses of the filling /24 (127.0.2.10 and up, a /24 the suite's other
/// peers, on 127.0.0.1, do not share: what the fillers still hold when the
/// case ends, the next cases get back by reclaiming): one CONNECT each per
/// round, as many as a target answers in one poll without dropping
/// stateless replies (the reference's queue holds 32).
const FILLERS: u8 = 32;
/// The most connections tried: beyond any table this suite expects.
const MOST: u32 = 70_000;
/// Refusals in a row that mean the table (or every filler's share) is full.
const FULL_AFTER: u32 = 256;
/// How long the newcomer may take, on a machine the suite may share.
const SERVED_WITHIN: Duration = Duration::from_secs(2);

/// One filling connection: which socket, and the target's id and token.
struct Held {
    sock: usize,
    id: u32,
    token: u64,
}

fn header(id: u32, token: u64) -> Header {
    Header {
        flags: Flags::NONE,
        dst_conn: id,
        token,
        psn: 0,
        path: 0,
        timestamp: 0,
    }
}

/// CONNECT `i`, offering protection under Key ID `key_id` (0: none).
fn connect(i: u32, port: u16, key_id: u32, cookie: [u8; wire::COOKIE_LEN]) -> Vec<u8> {
    Peer::encode(
        &Repr {
            // Spec 3.2.4: a CONNECT carries its Initial PSN.
            header: Header {
                psn: i,
                ..header(0, 0)
            },
            body: Body::Connect(ConnectRepr {
                src_conn: 0x4000_0000 | i,
                src_token: 0xad31_0000_0000 | u64::from(i),
                mtu: 1024,
                max_paths: 1,
                window: 256,
                initial_psn: i,
                reply_port: port,
                timer_profile: TimerProfile::DataCenter,
                suite: if key_id == 0 {
                    CipherSuite::None
                } else {
                    CipherSuite::Aes256Gcm
                },
                key_id,
                cookie,
            }),
            payload_len: 0,
        },
        &[],
    )
}

fn keepalive(id: u32, token: u64) -> Vec<u8> {
    Peer::encode(
        &Repr {
            header: header(id, token),
            body: Body::Keepalive,
            payload_len: 0,
        },
        &[],
    )
}

/// What answered one of our CONNECTs (id `0x4000_0000 | i`).
enum Answer {
    Retry([u8; wire::COOKIE_LEN]),
    Accept(u32, u64),
    Refused(CloseReason),
    Nothing,
}

/// Waits briefly for the answer to CONNECT `i` on `sock`; packets for
/// other connections (KEEPALIVEs, CLOSEs) are looked at for RECLAIMED.
fn answer(sock: &UdpSocket, i: u32, reclaimed: &mut u32) -> Answer {
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_millis(30);
    while Instant::now() < deadline {
        let Ok((n, _)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Ok((r, _)) = wire::parse(&buf[..n]) else {
            continue;
        };
        if let Body::Close(c) = r.body {
            if c.reason == CloseReason::Reclaimed {
                *reclaimed += 1;
            }
        }
        if r.header.dst_conn != 0x4000_0000 | i {
            continue;
        }
        return match r.body {
            Body::Retry(x) => Answer::Retry(x.cookie),
            Body::Accept(a) => Answer::Accept(a.src_conn, a.src_token),
            Body::Close(c) => Answer::Refused(c.reason),
            _ => continue,
        };
    }
    Answer::Nothing
}

/// Everything queued on the fillers' sockets, for CLOSE (RECLAIMED).
fn drain(socks: &[UdpSocket], reclaimed: &mut u32) {
    let mut buf = [0u8; 2048];
    for s in socks {
        while let Ok((n, _)) = s.recv_from(&mut buf) {
            if let Ok((r, _)) = wire::parse(&buf[..n]) {
                if matches!(r.body, Body::Close(c) if c.reason == CloseReason::Reclaimed) {
                    *reclaimed += 1;
                }
            }
        }
    }
}

/// Spec 4.2.3, attack 1: the fillers never confirm.
pub(super) fn unconfirmed_give_way(ctx: &mut Ctx) -> Result<(), Fail> {
    new_prefix_gets_a_slot(ctx, Filler::Unconfirmed)
}

/// Spec 4.2.3, attack 2: the fillers confirm and keep their connections
/// alive with KEEPALIVEs, idle.
pub(super) fn idle_give_way(ctx: &mut Ctx) -> Result<(), Fail> {
    new_prefix_gets_a_slot(ctx, Filler::IdleKeptAlive)
}

/// Spec 4.2.3 and 5.3.6, attack 4: the fillers offer protection and never
/// confirm, so they hold key slots; a protected client still gets one.
pub(super) fn key_slots_give_way(ctx: &mut Ctx) -> Result<(), Fail> {
    if ctx.psk.is_none() {
        ctx.skip("no pre-shared key for the target (--psk-file)");
        return Ok(());
    }
    new_prefix_gets_a_slot(ctx, Filler::ProtectedUnconfirmed)
}

/// How the filling connections behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filler {
    Unconfirmed,
    IdleKeptAlive,
    ProtectedUnconfirmed,
}

fn new_prefix_gets_a_slot(ctx: &mut Ctx, filler: Filler) -> Result<(), Fail> {
    if !ctx.sees_other_sources() {
        return Ok(());
    }
    let mut socks = Vec::new();
    for k in 0..FILLERS {
        let s = UdpSocket::bind(SocketAddr::from(([127, 0, 2, 10 + k], 0)))
            .map_err(|e| format!("cannot bind 127.0.2.{}: {e}", 10 + k))?;
        s.set_read_timeout(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
        socks.push(s);
    }
    let mut held: Vec<Held> = Vec::new();
    let mut reclaimed = 0u32;
    let (mut refused_in_row, mut refused) = (0u32, 0u32);
    let mut last_keepalive = Instant::now();
    let key_id = match filler {
        Filler::ProtectedUnconfirmed => ctx.psk.map_or(0, |(id, _)| id),
        _ => 0,
    };
    let confirm = filler == Filler::IdleKeptAlive;
    let mut i = 0u32;
    let ports: Vec<u16> = socks
        .iter()
        .map(|s| s.local_addr().map_or(0, |a| a.port()))
        .collect();
    // Fill: every filler proves its address, confirms, and keeps its
    // connections alive with KEEPALIVEs (idle, never silent). One CONNECT
    // per filler at a time, all fillers in one round.
    while refused_in_row < FULL_AFTER && i < MOST {
        let first = i;
        for (k, s) in socks.iter().enumerate() {
            let hello = connect(first + k as u32, ports[k], key_id, [0; 32]);
            let _ = s.send_to(&hello, ctx.target);
        }
        i += socks.len() as u32;
        let mut cookies = Vec::new();
        for (k, s) in socks.iter().enumerate() {
            if let Answer::Retry(c) = answer(s, first + k as u32, &mut reclaimed) {
                let _ = s.send_to(&connect(first + k as u32, ports[k], key_id, c), ctx.target);
                cookies.push(k);
            }
        }
        for k in cookies {
            let s = &socks[k];
            match answer(s, first + k as u32, &mut reclaimed) {
                Answer::Accept(id, token) => {
                    if confirm {
                        let _ = s.send_to(&keepalive(id, token), ctx.target);
                    }
                    held.push(Held { sock: k, id, token });
                    refused_in_row = 0;
                }
                Answer::Refused(_) => {
                    refused += 1;
                    refused_in_row += 1;
                }
                _ => {}
            }
        }
        // Well within an idle timeout of 1 s (the data-centre profile's).
        if confirm && last_keepalive.elapsed() > Duration::from_millis(250) {
            for h in &held {
                let _ = socks[h.sock].send_to(&keepalive(h.id, h.token), ctx.target);
            }
            last_keepalive = Instant::now();
        }
    }
    ensure(refused_in_row >= FULL_AFTER, || {
        format!("{i} CONNECTs from one /24 were never refused: no limit or full table reached")
    })?;
    // The newcomer, from another /24 that holds nothing.
    let start = Instant::now();
    let mut newcomer = Peer::bound(ctx.target, 0xad31, SocketAddr::from(([127, 0, 1, 10], 0)))
        .map_err(|e| format!("cannot bind 127.0.1.10: {e}"))?;
    if key_id != 0 {
        let (id, psk) = ctx.psk.ok_or("no pre-shared key")?;
        newcomer.keys = Some(crate::protect::PeerKeys::new(id, psk));
    }
    let served = newcomer.connect();
    let took = start.elapsed();
    // What the fillers heard meanwhile.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(100) {
        drain(&socks, &mut reclaimed);
    }
    newcomer.close();
    for h in &held {
        let _ = socks[h.sock].send_to(&close(h.id, h.token), ctx.target);
    }
    served.map_err(|e| {
        format!(
            "a client from an empty /24 was not served while {} connections of one /24 held the table ({refused} refused): {e}",
            held.len()
        )
    })?;
    ensure(took <= SERVED_WITHIN, || {
        format!("the client from an empty /24 waited {took:?}")
    })?;
    ensure(reclaimed >= 1, || {
        format!(
            "no filler connection ended with CLOSE (RECLAIMED) ({} held, {refused} refused)",
            held.len()
        )
    })
}

/// CONNECT copies the half-open limit case sends before it takes silence
/// for an answer.
const COPIES: u32 = 4;

/// First CONNECT number of the half-open limit case (its own range of
/// Source Connection IDs).
const LIMIT_BASE: u32 = 0x0020_0000;

/// Spec 4.2.3 (1) and 4.2 step 4: a narrow prefix (/32) holding its
/// declared limit of half-open connections has its next CONNECT refused
/// with CLOSE (REJECTED); another /32 of the same /24 is served meanwhile;
/// once the held ones are confirmed they no longer count, and the /32 is
/// served again.
pub(super) fn half_open_limit_per_prefix(ctx: &mut Ctx) -> Result<(), Fail> {
    let Some(limit) = ctx.half_open_limit else {
        ctx.skip("the target's half-open limit per /32 is not declared (--half-open-limit)");
        return Ok(());
    };
    if !ctx.sees_other_sources() {
        return Ok(());
    }
    let bind = |last: u8| -> Result<UdpSocket, Fail> {
        let s = UdpSocket::bind(SocketAddr::from(([127, 0, 3, last], 0)))
            .map_err(|e| format!("cannot bind 127.0.3.{last}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_millis(5)))
            .map_err(|e| e.to_string())?;
        Ok(s)
    };
    let heavy = bind(10)?;
    let port = heavy.local_addr().map_err(|e| e.to_string())?.port();
    let mut held: Vec<(u32, u64)> = Vec::new();
    let mut unrelated_reclaims = 0;
    let mut next = LIMIT_BASE;
    // Opens one connection from `sock`, proving the address: its answer.
    // A CONNECT that found the table full may be dropped while a slot is
    // reclaimed for it (4.2 step 5): its next copies take the slot.
    let mut open = |sock: &UdpSocket, port: u16| -> Answer {
        let i = next;
        next += 1;
        let mut cookie = [0; wire::COOKIE_LEN];
        let mut last = Answer::Nothing;
        for _ in 0..COPIES {
            let _ = sock.send_to(&connect(i, port, 0, cookie), ctx.target);
            last = answer(sock, i, &mut unrelated_reclaims);
            match last {
                Answer::Retry(c) => cookie = c,
                Answer::Nothing => {}
                _ => break,
            }
        }
        last
    };
    // Fill the /32 with unconfirmed connections until it is refused.
    let refusal = loop {
        match open(&heavy, port) {
            Answer::Accept(id, token) => held.push((id, token)),
            Answer::Refused(reason) => break Some(reason),
            Answer::Retry(_) | Answer::Nothing => break None,
        }
        if held.len() > limit as usize {
            break None;
        }
    };
    let result = (|| {
        ensure(!held.is_empty(), || {
            "a /32 holding nothing was refused its first connection".to_string()
        })?;
        ensure(held.len() <= limit as usize, || {
            format!(
                "one /32 held {} unconfirmed connections, past its declared limit of {limit}",
                held.len()
            )
        })?;
        ensure(refusal == Some(CloseReason::Rejected), || {
            format!(
                "the CONNECT past {} unconfirmed connections of one /32 was answered {} instead of CLOSE (REJECTED)",
                held.len(),
                match refusal {
                    Some(r) => format!("CLOSE ({r:?})"),
                    None => "with no ACCEPT or CLOSE".to_string(),
                }
            )
        })?;
        // A neighbour in the same /24 holds nothing of its own.
        let neighbour = bind(11)?;
        let neighbour_port = neighbour.local_addr().map_err(|e| e.to_string())?.port();
        match open(&neighbour, neighbour_port) {
            Answer::Accept(id, token) => {
                let _ = neighbour.send_to(&close(id, token), ctx.target);
            }
            _ => {
                return Err(format!(
                    "127.0.3.11 was not served while 127.0.3.10 held its {} half-open connections",
                    held.len()
                ))
            }
        }
        // Confirmed connections are no longer half open.
        for &(id, token) in &held {
            let _ = heavy.send_to(&keepalive(id, token), ctx.target);
        }
        std::thread::sleep(Duration::from_millis(50));
        match open(&heavy, port) {
            Answer::Accept(id, token) => {
                held.push((id, token));
                Ok(())
            }
            _ => Err(format!(
                "once its {} connections were confirmed, 127.0.3.10 was still refused",
                held.len()
            )),
        }
    })();
    for &(id, token) in &held {
        let _ = heavy.send_to(&close(id, token), ctx.target);
    }
    result
}

fn close(id: u32, token: u64) -> Vec<u8> {
    Peer::encode(
        &Repr {
            header: header(id, token),
            body: Body::Close(wire::CloseRepr {
                reason: CloseReason::Normal,
            }),
            payload_len: 0,
        },
        &[],
    )
}
