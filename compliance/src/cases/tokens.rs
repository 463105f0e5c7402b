//! Address tokens (spec 4.2.5, 3.8.5): an acceptor MAY hand an initiator
//! it validated a NEW_TOKEN once the connection is Established; the
//! initiator's later CONNECT from the same address carries it in the
//! Cookie field and needs no RETRY; from another address, or in an early
//! CONNECT, it is no cookie at all.
//!
//! NEW_TOKEN is OPTIONAL: a target that sends none (the firmware, built
//! without the `tokens` feature) has every case skipped, with the reason.

use std::net::SocketAddr;
use std::time::Duration;

use metaroce_core::wire::{Body, Flags, Repr, COOKIE_LEN};

use super::{ensure, Ctx, Fail, Peer, Rx, ACK_WAIT, SILENCE};

/// Why the cases do not apply to a target that sends no NEW_TOKEN.
const NO_TOKEN: &str = "the target sent no NEW_TOKEN after the handshake (address tokens are \
                        OPTIONAL, spec 4.2.5; e.g. firmware built without the tokens feature)";

/// How long an unconfirmed connection is watched for a NEW_TOKEN it must
/// not send yet.
const UNCONFIRMED: Duration = Duration::from_millis(100);

/// How long a CONNECT's answer may take.
const ANSWER_WAIT: Duration = Duration::from_millis(300);

/// Where the other-address case sends from: a /24 no other case uses.
const OTHER_SOURCE: [u8; 4] = [127, 0, 4, 1];

fn kinds(rx: &[Rx]) -> Vec<metaroce_core::wire::PacketType> {
    rx.iter().map(|r| r.repr.body.packet_type()).collect()
}

fn new_tokens(rx: &[Rx]) -> Vec<(metaroce_core::wire::Header, [u8; COOKIE_LEN])> {
    rx.iter()
        .filter_map(|r| match r.repr.body {
            Body::NewToken(t) => Some((r.repr.header, t.token)),
            _ => None,
        })
        .collect()
}

/// A full handshake on `p` (offering `mtu`, `paths`, `window`), watching
/// for the target's NEW_TOKEN: none while the target is Accepting (before
/// our confirmation, spec 4.2.5: only once Established), then at most
/// one, addressed to us, its PSN field the target's next PSN (3.2.4), a
/// nonzero token (3.8.5; the parser checks the length, flags and that it
/// is not all zero). `None`: the target sent none.
fn handshake_for_token(
    p: &mut Peer,
    mtu: u16,
    paths: u16,
    window: u32,
) -> Result<Option<[u8; COOKIE_LEN]>, Fail> {
    p.connect_only(mtu, paths, window)?;
    // Accepting: we have not confirmed.
    p.pump(UNCONFIRMED, |_| false);
    let early = p.take();
    ensure(new_tokens(&early).is_empty(), || {
        format!(
            "a NEW_TOKEN before the handshake was confirmed (the target is not Established, \
             spec 4.2.5): {:?}",
            kinds(&early)
        )
    })?;
    p.keepalive()?;
    p.pump(ACK_WAIT, |rx| !new_tokens(rx).is_empty());
    // Anything more (a second NEW_TOKEN, a retransmission of it) comes
    // within the silence that follows.
    p.pump(SILENCE, |_| false);
    let rx = p.take();
    let tokens = new_tokens(&rx);
    ensure(tokens.len() <= 1, || {
        format!(
            "{} NEW_TOKENs on one connection, expected at most one (spec 4.2.5)",
            tokens.len()
        )
    })?;
    let Some(&(h, token)) = tokens.first() else {
        return Ok(None);
    };
    ensure(h.dst_conn == p.my_id && h.token == p.my_token, || {
        format!(
            "NEW_TOKEN addressed to id {:#x} token {:#x}, expected ours {:#x} {:#x}",
            h.dst_conn, h.token, p.my_id, p.my_token
        )
    })?;
    ensure(h.psn == p.expected_psn(), || {
        format!(
            "NEW_TOKEN's PSN field is {}, expected the target's next PSN {} (spec 3.2.4)",
            h.psn,
            p.expected_psn()
        )
    })?;
    ensure(token != [0; COOKIE_LEN], || "an all-zero token".into())?;
    Ok(Some(token))
}

/// A token of the target for our address (127.0.0.1 towards a loopback
/// target), from a handshake on a fresh peer that is then closed; `None`
/// (and the case marked skipped) when the target sends none.
fn fetch_token(ctx: &mut Ctx) -> Result<Option<[u8; COOKIE_LEN]>, Fail> {
    let mut p = ctx.peer()?;
    let token = handshake_for_token(&mut p, 1024, 4, 256);
    p.close();
    let token = token?;
    if token.is_none() {
        ctx.skip(NO_TOKEN);
    }
    Ok(token)
}

/// Sends `connect` (up to three times, while nothing answers) and returns
/// what answered it.
fn answers(p: &mut Peer, connect: &Repr) -> Result<Vec<Rx>, Fail> {
    p.take();
    for _ in 0..3 {
        p.send(connect, &[])?;
        let got = p.pump(ANSWER_WAIT, |rx| {
            rx.iter()
                .any(|r| matches!(r.repr.body, Body::Accept(_) | Body::Retry(_)))
        });
        if got {
            break;
        }
    }
    // A second answer (there must be none) within the silence after it.
    p.pump(SILENCE, |_| false);
    Ok(p.take())
}

/// Spec 4.2.5, 3.8.5: after a handshake, the target's NEW_TOKEN, if any,
/// arrives only once the connection is Established, once, addressed to
/// the initiator, with its next PSN and a nonzero token; NEW_TOKEN draws
/// no ACK and the connection goes on (the confirmation's KEEPALIVE answer
/// aside, nothing but what we ask for).
pub(super) fn new_token_after_established(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    let token = handshake_for_token(&mut p, 1024, 4, 256);
    let res = match token {
        Ok(None) => {
            ctx.skip(NO_TOKEN);
            Ok(())
        }
        // NEW_TOKEN is not reliable and drew nothing from us; a later
        // KEEPALIVE of ours draws no ACK and no second NEW_TOKEN.
        Ok(Some(_)) => {
            p.keepalive()?;
            p.pump(SILENCE, |_| false);
            let rx = p.take();
            ensure(
                rx.iter()
                    .all(|r| !matches!(r.repr.body, Body::Ack(_) | Body::NewToken(_))),
                || {
                    format!(
                        "a later KEEPALIVE drew {:?}, expected no ACK and no NEW_TOKEN",
                        kinds(&rx)
                    )
                },
            )
        }
        Err(e) => Err(e),
    };
    p.close();
    res
}

/// Spec 4.2.5, 4.2 step 3.3: a first CONNECT from the same address with the
/// target's token, from another UDP port, with other ids, token and offer,
/// is answered ACCEPT with no RETRY; the handshake completes (the
/// confirming KEEPALIVE is answered, 4.2 step 6). Twice, with the same
/// token (it is not used up), from two peers: a sharded target steers
/// each by its own Source Connection ID, and every shard must take it.
pub(super) fn token_skips_the_retry(ctx: &mut Ctx) -> Result<(), Fail> {
    let Some(token) = fetch_token(ctx)? else {
        return Ok(());
    };
    for (mtu, paths, window) in [(1024, 2, 128), (512, 1, 64)] {
        let mut p = ctx.peer()?;
        p.cookie = token;
        connect_with_token(&mut p, mtu, paths, window)?;
    }
    Ok(())
}

/// A CONNECT carrying the token in `p.cookie`: ACCEPT, no RETRY, and the
/// confirmation answered.
fn connect_with_token(p: &mut Peer, mtu: u16, paths: u16, window: u32) -> Result<(), Fail> {
    let connect = p.connect_repr(mtu, paths, window);
    let rx = answers(p, &connect)?;
    ensure(
        !rx.iter().any(|r| matches!(r.repr.body, Body::Retry(_))),
        || {
            format!(
                "a CONNECT carrying the target's own token, from the address it was given to, \
                 drew a RETRY: {:?}",
                kinds(&rx)
            )
        },
    )?;
    let (h, a) = rx
        .iter()
        .find_map(|r| match r.repr.body {
            Body::Accept(a) => Some((r.repr.header, a)),
            _ => None,
        })
        .ok_or_else(|| format!("no ACCEPT for a CONNECT with a token: {:?}", kinds(&rx)))?;
    ensure(
        rx.iter()
            .filter(|r| matches!(r.repr.body, Body::Accept(_)))
            .count()
            == 1,
        || "more than one ACCEPT for one CONNECT".into(),
    )?;
    p.adopt_accept(h, a, mtu, paths, window)?;
    p.keepalive()?;
    let confirmed = p.pump(ACK_WAIT, |rx| {
        rx.iter().any(|r| matches!(r.repr.body, Body::Keepalive))
    });
    p.close();
    ensure(confirmed, || {
        "the confirming KEEPALIVE of the connection a token opened drew no KEEPALIVE \
         (spec 4.2 step 6)"
            .into()
    })
}

/// Spec 4.2.5, 5.1.4: the token presented from another source address
/// (127.0.4.1) is no cookie: one RETRY and no ACCEPT, and nothing is kept
/// (the same CONNECT again draws a RETRY again, not a duplicate's ACCEPT);
/// the handshake then completes with that RETRY's cookie.
pub(super) fn token_from_another_address(ctx: &mut Ctx) -> Result<(), Fail> {
    if !ctx.sees_other_sources() {
        return Ok(());
    }
    let Some(token) = fetch_token(ctx)? else {
        return Ok(());
    };
    let mut p = match Peer::bound(ctx.target, 0x70c3, SocketAddr::from((OTHER_SOURCE, 0))) {
        Ok(p) => p,
        Err(e) => {
            ctx.skip(&format!("cannot bind 127.0.4.1: {e}"));
            return Ok(());
        }
    };
    p.cookie = token;
    let connect = p.connect_repr(1024, 4, 256);
    let mut cookie = [0; COOKIE_LEN];
    for attempt in ["first", "repeated"] {
        let rx = answers(&mut p, &connect)?;
        ensure(
            !rx.iter().any(|r| matches!(r.repr.body, Body::Accept(_))),
            || {
                format!(
                    "the {attempt} CONNECT with a token given to 127.0.0.1, sent from \
                     127.0.4.1, was accepted: {:?}",
                    kinds(&rx)
                )
            },
        )?;
        let retries = rx
            .iter()
            .filter(|r| matches!(r.repr.body, Body::Retry(_)))
            .count();
        ensure(retries == 1, || {
            format!(
                "{retries} RETRYs to the {attempt} CONNECT with another address's token, \
                 expected 1: {:?}",
                kinds(&rx)
            )
        })?;
        cookie = p
            .retry_in(&rx)
            .ok_or("the RETRY is not addressed with the CONNECT's id and token")?;
        ensure(cookie != token, || "the RETRY handed the token back".into())?;
    }
    // The cookie replaces the token (4.2 step 4): the address proves
    // itself and the handshake completes.
    p.cookie = cookie;
    p.connect()?;
    p.close();
    Ok(())
}

/// Spec 4.2.5, 4.2.4: a token in an early CONNECT's Cookie field is not a
/// proof (an early CONNECT's Cookie field is never checked as a cookie or
/// a token): one RETRY per copy, no ACCEPT.
pub(super) fn token_in_early_connect(ctx: &mut Ctx) -> Result<(), Fail> {
    if ctx.psk.is_none() {
        ctx.skip(
            "the target holds no pre-shared key: no packet protection, so no early CONNECT \
             (spec 4.2.4)",
        );
        return Ok(());
    }
    let Some(token) = fetch_token(ctx)? else {
        return Ok(());
    };
    let mut p = ctx.protected_peer()?;
    let mut repr = p.connect_repr(1024, 4, 256);
    let Body::Connect(mut offer) = repr.body else {
        return Err("no CONNECT".into());
    };
    offer.cookie = token;
    repr.body = Body::Connect(offer);
    repr.header.flags = Flags::EARLY;
    let rx = answers(&mut p, &repr)?;
    ensure(
        !rx.iter().any(|r| matches!(r.repr.body, Body::Accept(_))),
        || {
            format!(
                "an early CONNECT carrying a token instead of a proof was accepted: {:?}",
                kinds(&rx)
            )
        },
    )?;
    ensure(
        rx.iter().any(|r| matches!(r.repr.body, Body::Retry(_))),
        || {
            format!(
                "an early CONNECT carrying a token drew no RETRY: {:?}",
                kinds(&rx)
            )
        },
    )
}
