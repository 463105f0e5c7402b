//! The READ depth (3.8.1, 4.8.6, 4.14.3): the target states in its ACCEPT
//! (Path ID field) how many READs it serves at once, and serves that many
//! sent back to back, every one of them, without RECEIVER_NOT_READY.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use metaroce_core::wire::{Body, MemoryTarget, NakReason};

use super::{ensure, Ctx, Fail, ACK_WAIT, SLOT};

/// Bytes each READ asks for: small, so the depth's worth fits any window.
const READ_LEN: u32 = 512;

/// The target states a READ depth, and `depth` READs sent at once are all
/// answered with the right bytes and no NAK.
pub(crate) fn read_depth_stated_and_served(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, m) = ctx.victim()?;
    let depth = v.accept_header.map_or(0, |h| h.path);
    ensure(depth != 0, || {
        "the ACCEPT states no READ Depth (its Path ID field is 0)".into()
    })?;
    let n = u32::from(depth).min(64);
    let mut want = BTreeMap::new();
    let mut reqs = Vec::new();
    for k in 0..n {
        let off = (k % 64) as usize * SLOT as usize + 7 * k as usize % 256;
        let req = v.read_request(
            MemoryTarget {
                key: r.key,
                addr: r.addr + off as u64,
            },
            READ_LEN,
        );
        if let Body::ReadRequest(q) = req.body {
            want.insert(q.msg_id, (off, 0usize, vec![0u8; READ_LEN as usize]));
        }
        reqs.push(req);
    }
    for req in &reqs {
        v.send(req, &[])?;
    }
    let deadline = Instant::now() + ACK_WAIT;
    let mut naks = Vec::new();
    while want.values().any(|w| w.1 < READ_LEN as usize) && Instant::now() < deadline {
        v.pump(Duration::from_millis(50), |rx| !rx.is_empty());
        for x in v.take() {
            match x.repr.body {
                Body::ReadResponse(rr) => {
                    if let Some(w) = want.get_mut(&rr.msg.id) {
                        let o = rr.msg.offset as usize;
                        if o + x.payload.len() <= w.2.len() {
                            w.2[o..o + x.payload.len()].copy_from_slice(&x.payload);
                            w.1 += x.payload.len();
                        }
                    }
                }
                Body::Nak(k) => naks.push(k.reason),
                _ => {}
            }
        }
    }
    let rnr = naks
        .iter()
        .filter(|&&k| k == NakReason::ReceiverNotReady)
        .count();
    ensure(naks.is_empty(), || {
        format!(
            "{n} READs within the stated depth {depth} drew {} NAKs ({rnr} RECEIVER_NOT_READY)",
            naks.len()
        )
    })?;
    for (id, (off, got, bytes)) in &want {
        ensure(*got >= READ_LEN as usize, || {
            format!("READ {id}: {got} of {READ_LEN} bytes answered")
        })?;
        ensure(*bytes == m.bytes[*off..*off + READ_LEN as usize], || {
            format!("READ {id} at offset {off}: wrong bytes")
        })?;
    }
    v.close();
    Ok(())
}
