//! Windows beyond one SACK bitvector (spec 3.5, 3.6, 4.2 - 4.5): the
//! negotiated window above 256 and its bounds, and the SACK Offset of
//! ACKs when packets arrive far beyond a gap.
//!
//! The serve profile offers a window of at least [`PROFILE_WINDOW`] PSNs
//! (compliance/README.md), so both cases apply to every target.

use std::collections::BTreeSet;
use std::time::Duration;

use metaroce_core::wire::{AckRepr, Repr};

use super::{acks, check_region, ensure, one_packet_writes, Ctx, Fail, Peer, ACK_WAIT, SLOT};

/// The least window the serve profile offers.
pub const PROFILE_WINDOW: u32 = 1024;

/// Sends `pkts` in bursts of 8 with a short pause between them, so a
/// target behind a small device queue (the QEMU gateway) is not flooded;
/// every ACK that comes back stays in the inbox.
fn send_paced(p: &mut Peer, pkts: &[&(Repr, Vec<u8>)]) -> Result<(), Fail> {
    for (i, (r, d)) in pkts.iter().enumerate() {
        p.send(r, d)?;
        if i % 8 == 7 {
            p.pump(Duration::from_millis(2), |_| false);
        }
    }
    Ok(())
}

/// Whether ACK `a` reports a received bit for a PSN not in `sent`, or
/// sets bits at or beyond `cum + window`; returns the first such PSN.
fn bogus_bit(a: &AckRepr, sent: &BTreeSet<u32>, window: u32) -> Option<u32> {
    let base = a.sack_base();
    a.sack
        .iter_set()
        .map(|i| base.wrapping_add(i as u32))
        .find(|&psn| !sent.contains(&psn) || psn.wrapping_sub(a.cumulative) >= window)
}

/// 3.8.1, 4.2, 4.3, 4.4: an offer above 256 is negotiated to the minimum,
/// and the receiver takes every PSN inside that window (`C + W − 1`, far
/// beyond one bitvector) and none at `C + W`.
pub(super) fn window_above_256(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut big = ctx.peer()?;
    let own = big.connect_only(1024, 4, 65_536)?;
    big.keepalive()?;
    big.close();
    ensure((PROFILE_WINDOW..=65_536).contains(&own.window), || {
        format!(
            "offered 65,536, ACCEPT has window {}: the serve profile offers {PROFILE_WINDOW} to 65,536",
            own.window
        )
    })?;
    const W: u32 = 300;
    let (mut v, r, mut m) = ctx.victim_window(W)?;
    let window = v.accept.map_or(0, |a| a.window);
    ensure(window == W, || {
        format!("offered {W} against {}, ACCEPT has {window}", own.window)
    })?;
    let off = 40 * SLOT as usize;
    let pk = one_packet_writes(&mut v, &r, W as usize + 1, off);
    let c = pk[0].0.header.psn;
    // C + W is outside the window: silently dropped, nothing placed.
    v.send(&pk[W as usize].0, &pk[W as usize].1)?;
    // C + W − 1 is inside: accepted, reported with a SACK block that
    // describes it and nothing else.
    let inside = &pk[W as usize - 1];
    v.send(&inside.0, &inside.1)?;
    let far = inside.0.header.psn;
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == far)
    });
    let rx = v.take();
    let sent: BTreeSet<u32> = [far].into();
    let mut answered = false;
    for (_, a) in acks(&rx) {
        ensure(a.cumulative == c, || {
            format!("cumulative {} with PSN {c} missing", a.cumulative)
        })?;
        if let Some(psn) = bogus_bit(&a, &sent, W) {
            return Err(format!(
                "SACK reports PSN {psn}, never sent or outside the window"
            ));
        }
        ensure(u32::from(a.sack_offset) <= W - 257, || {
            format!("SACK Offset {} beyond W − 257 = {}", a.sack_offset, W - 257)
        })?;
        answered |= a.echo_psn == far;
    }
    ensure(answered, || {
        format!("no ACK for PSN C + {} (inside the window)", W - 1)
    })?;
    // Fill the gap: C ends at C + W, not beyond (C + W was dropped).
    let rest: Vec<&(Repr, Vec<u8>)> = pk[..W as usize - 1].iter().collect();
    send_paced(&mut v, &rest)?;
    v.wait_acked(far, ACK_WAIT)?;
    let rx = v.take();
    let end = c.wrapping_add(W);
    ensure(
        acks(&rx)
            .iter()
            .all(|(_, a)| a.cumulative.wrapping_sub(end) as i32 <= 0),
        || format!("cumulative passed C + {W}: the packet outside the window was taken"),
    )?;
    for (i, (_, d)) in pk[..W as usize].iter().enumerate() {
        m.bytes[off + i * 100..off + i * 100 + 100].copy_from_slice(d);
    }
    let res = check_region(&mut v, &r, &m, off, (W as usize + 1) * 100);
    v.close();
    res
}

/// 3.5, 3.6, 4.5: with a window above 256 and a gap at C, ACKs for
/// packets more than 256 beyond C carry a SACK Offset; every bit is
/// exact (nothing reported that was not sent), and the ACK for the newest
/// arrival reports it and the 255 PSNs before it (the SHOULD of 4.5).
/// Filling the gap moves C past all of them with Offset 0.
pub(super) fn sack_offset_newest(ctx: &mut Ctx) -> Result<(), Fail> {
    let (mut v, r, mut m) = ctx.victim_window(4096)?;
    let window = v.accept.map_or(0, |a| a.window);
    ensure(window >= PROFILE_WINDOW, || {
        format!("ACCEPT window {window}: the serve profile offers at least {PROFILE_WINDOW}")
    })?;
    const N: usize = 600;
    let off = 20 * SLOT as usize;
    let pk = one_packet_writes(&mut v, &r, N, off);
    let c = pk[0].0.header.psn;
    let later: Vec<&(Repr, Vec<u8>)> = pk[1..].iter().collect();
    send_paced(&mut v, &later)?;
    let last = pk[N - 1].0.header.psn;
    v.pump(ACK_WAIT, |rx| {
        acks(rx).iter().any(|(_, a)| a.echo_psn == last)
    });
    let rx = v.take();
    let sent: BTreeSet<u32> = pk[1..].iter().map(|(r, _)| r.header.psn).collect();
    let mut with_offset = 0;
    for (_, a) in acks(&rx) {
        ensure(a.cumulative == c, || {
            format!("cumulative {} with PSN {c} missing", a.cumulative)
        })?;
        if let Some(psn) = bogus_bit(&a, &sent, window) {
            return Err(format!("SACK reports PSN {psn}, which was never sent"));
        }
        with_offset += usize::from(a.sack_offset != 0);
    }
    let newest = acks(&rx)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.echo_psn == last)
        .ok_or("no ACK for the newest packet")?;
    ensure(with_offset > 0 && newest.sack_offset != 0, || {
        format!(
            "{with_offset} ACKs with a SACK Offset; the one for PSN C + {} has {}",
            N - 1,
            newest.sack_offset
        )
    })?;
    // The newest arrival and the 255 PSNs before it (all sent in order on
    // one path) are in its block, reported received.
    let base = newest.sack_base();
    for psn in (0..256).map(|i| last.wrapping_sub(i)) {
        let bit = psn.wrapping_sub(base);
        ensure(bit < 256 && newest.sack.get(bit as usize), || {
            format!(
                "ACK for PSN {last} (Offset {}) does not report PSN {psn} as received",
                newest.sack_offset
            )
        })?;
    }
    // The gap filled: C jumps past everything, nothing left to report.
    v.send(&pk[0].0, &pk[0].1)?;
    v.wait_acked(last, ACK_WAIT)?;
    let rx = v.take();
    let done = acks(&rx)
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.cumulative == last.wrapping_add(1))
        .ok_or("no ACK with the cumulative PSN past the newest")?;
    ensure(done.sack_offset == 0 && done.sack.is_empty(), || {
        format!(
            "nothing beyond C, yet Offset {} and {} bits",
            done.sack_offset,
            done.sack.count()
        )
    })?;
    for (i, (_, d)) in pk.iter().enumerate() {
        m.bytes[off + i * 100..off + i * 100 + 100].copy_from_slice(d);
    }
    let res = check_region(&mut v, &r, &m, off, N * 100);
    v.close();
    res
}
