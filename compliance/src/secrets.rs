//! Cases on the target's secrets (spec 5.1.6): what a peer sees of them
//! must not let it predict the ones other connections get.

use crate::cases::{ensure, Ctx};
use crate::peer::Fail;

/// Connections whose tokens are compared.
const CONNECTIONS: usize = 8;
/// Outputs of a recovered SplitMix64 state searched for a later token
/// (an endpoint draws a few values per connection besides its token).
const PREDICTIONS: usize = 4096;

/// The state-recovery attack on SplitMix64, the generator the
/// reference implementation once used: its output function is a
/// bijection, so one token gives the state, and the state only ever
/// advances by a public constant.
mod splitmix64 {
    const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
    const M1: u64 = 0xbf58_476d_1ce4_e5b9;
    const M2: u64 = 0x94d0_49bb_1331_11eb;

    fn output(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(M1);
        z = (z ^ (z >> 27)).wrapping_mul(M2);
        z ^ (z >> 31)
    }

    /// Inverse of an odd number modulo 2^64 by Newton's iteration.
    fn inverse(a: u64) -> u64 {
        (0..6).fold(a, |x, _| {
            x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)))
        })
    }

    /// Inverse of `x ^ (x >> s)`.
    fn unshift(y: u64, s: u32) -> u64 {
        (0..64 / s).fold(y, |x, _| y ^ (x >> s))
    }

    /// The generator's state behind `token`.
    pub fn state_behind(token: u64) -> u64 {
        let z = unshift(token, 31).wrapping_mul(inverse(M2));
        let z = unshift(z, 27).wrapping_mul(inverse(M1));
        unshift(z, 30)
    }

    /// The `n` outputs after the one that came from `state`.
    pub fn after(state: u64, n: usize) -> impl Iterator<Item = u64> {
        (1..=n as u64).map(move |i| output(state.wrapping_add(GOLDEN.wrapping_mul(i))))
    }

    #[cfg(test)]
    #[test]
    fn the_attack_predicts_splitmix64() {
        let mut state = 12345u64;
        let mut next = || {
            state = state.wrapping_add(GOLDEN);
            output(state)
        };
        let token = next();
        let later: Vec<u64> = (0..8).map(|_| next()).collect();
        let guess: Vec<u64> = after(state_behind(token), 8).collect();
        assert_eq!(guess, later);
    }
}

/// Tokens of several connections: nonzero, distinct, far apart in bits
/// (not a counter), and not predictable from an earlier one by recovering
/// a SplitMix64 state.
pub fn tokens_unpredictable(ctx: &mut Ctx) -> Result<(), Fail> {
    let mut tokens = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut p = ctx.peer()?;
        p.connect()?;
        tokens.push(p.their_token);
        p.close();
    }
    ensure(tokens.iter().all(|&t| t != 0), || {
        format!("a zero token: {tokens:x?}")
    })?;
    for (i, a) in tokens.iter().enumerate() {
        for b in &tokens[i + 1..] {
            ensure((a ^ b).count_ones() >= 8, || {
                format!("tokens {a:#x} and {b:#x} differ in fewer than 8 bits")
            })?;
        }
    }
    for (i, &token) in tokens.iter().enumerate() {
        let later = &tokens[i + 1..];
        let predicted = splitmix64::after(splitmix64::state_behind(token), PREDICTIONS)
            .find(|guess| later.contains(guess));
        ensure(predicted.is_none(), || {
            format!("token {token:#x} predicts a later one: the generator's state is recoverable")
        })?;
    }
    Ok(())
}
