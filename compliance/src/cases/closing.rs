//! Closing (4.1.2): a closed connection answers every later CLOSE of its
//! peer with a CLOSE_REPLY, for as long as it is held, whichever side
//! closed and however the application handles the end; the answer repeats
//! the Reason of the CLOSE it answers.

use std::time::Duration;

use metaroce_core::wire::{Body, CloseReason, CloseRepr, Flags, Repr};

use super::{ensure, Ctx, Fail, Peer, Rx, ACK_WAIT};

/// Long enough for a serve application to have handled the close and
/// released the connection (it does so on its next loop turn).
const AFTER_RELEASE: Duration = Duration::from_millis(500);

fn close_replies(rx: &[Rx]) -> Vec<CloseReason> {
    rx.iter()
        .filter_map(|r| match r.repr.body {
            Body::Close(c) if r.repr.header.flags.contains(Flags::CLOSE_REPLY) => Some(c.reason),
            _ => None,
        })
        .collect()
}

/// Sends CLOSE with `reason` and expects exactly one CLOSE_REPLY with the
/// same reason, and no CLOSE without the flag (a reply is not a new close).
fn expect_close_reply(p: &mut Peer, reason: CloseReason, when: &str) -> Result<(), Fail> {
    p.take();
    let repr = Repr {
        header: p.header(p.next_psn, Flags::NONE),
        body: Body::Close(CloseRepr { reason }),
        payload_len: 0,
    };
    p.send(&repr, &[])?;
    p.pump(ACK_WAIT, |rx| !close_replies(rx).is_empty());
    // Anything else the CLOSE drew.
    p.pump(Duration::from_millis(100), |_| false);
    let rx = p.take();
    let replies = close_replies(&rx);
    ensure(replies.len() == 1, || {
        format!(
            "{when}: {} CLOSE_REPLY in answer to CLOSE, expected 1",
            replies.len()
        )
    })?;
    ensure(replies[0] == reason, || {
        format!(
            "{when}: CLOSE_REPLY reason {:?}, expected the CLOSE's {reason:?}",
            replies[0]
        )
    })?;
    let new_close = rx.iter().any(|r| {
        matches!(r.repr.body, Body::Close(_)) && !r.repr.header.flags.contains(Flags::CLOSE_REPLY)
    });
    ensure(!new_close, || {
        format!("{when}: a CLOSE without CLOSE_REPLY in answer to CLOSE")
    })
}

/// The peer closes normally; its CLOSE is answered, and so is each repeat
/// (as when the first CLOSE_REPLY was lost): at once, and again after the
/// target's application has had time to handle the close and release the
/// connection. A CLOSE_REPLY sent to the closed connection draws nothing.
pub(crate) fn close_answered_after_close(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut p = ctx.peer()?;
    p.connect()?;
    p.pump(Duration::from_millis(50), |_| false);
    expect_close_reply(&mut p, CloseReason::Normal, "open connection")?;
    expect_close_reply(&mut p, CloseReason::Normal, "repeated at once")?;
    std::thread::sleep(AFTER_RELEASE);
    expect_close_reply(&mut p, CloseReason::Normal, "repeated after release")?;
    expect_close_reply(&mut p, CloseReason::IdleTimeout, "another reason")?;
    // A CLOSE_REPLY is never answered.
    p.take();
    let reply = Repr {
        header: p.header(p.next_psn, Flags::CLOSE_REPLY),
        body: Body::Close(CloseRepr {
            reason: CloseReason::Normal,
        }),
        payload_len: 0,
    };
    p.send(&reply, &[])?;
    p.pump(Duration::from_millis(300), |_| false);
    let rx: Vec<Rx> = p
        .take()
        .into_iter()
        .filter(|r| !matches!(r.repr.body, Body::Keepalive))
        .collect();
    ensure(rx.is_empty(), || {
        format!(
            "a CLOSE_REPLY drew {:?}",
            rx.iter()
                .map(|r| r.repr.body.packet_type())
                .collect::<Vec<_>>()
        )
    })
}
