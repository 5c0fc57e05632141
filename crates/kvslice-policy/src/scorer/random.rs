//! Random eviction — the baseline of kvpress's `RandomPress` (no paper: every compression
//! method should beat it).
//!
//! Each (KV head `h`, position `j`) scores a uniform number in `[0, 1)`, drawn from a seeded
//! counter-based generator: `s_hj = ⌊x / 2⁴⁰⌋ / 2²⁴` with `x` the output number
//! `i = h·2³² + j` of SplitMix64 seeded with `seed` (Steele, Lea & Flood, "Fast Splittable
//! Pseudorandom Number Generators", OOPSLA 2014), `x = mix(seed + (i + 1)·γ)`. The kept set is
//! thus a uniform sample of the unprotected positions, reproducible for a seed, and a token's
//! score does not depend on the prompt's length (re-scoring a grown cache keeps its draws).
//!
//! Differences from kvpress: torch's generator cannot be reproduced, so the draws differ (no
//! peer check); kvpress draws fresh numbers when no seed is given, here the seed is always set
//! (default 0). As with kvpress's seeded press, every layer draws the same numbers (the score
//! depends on the seed, the KV head and the position only). kvpress protects nothing; the
//! `sinks` first and `recent` last positions can be kept as with the other scorers (default 0).

use crate::error::Result;
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// SplitMix64's increment (the golden-ratio constant).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
pub fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Output number `i` (from 0) of SplitMix64 seeded with `seed`.
pub fn splitmix64(seed: u64, i: u64) -> u64 {
    splitmix64_mix(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// Uniform random scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Random {
    seed: u64,
    sinks: usize,
    recent: usize,
}

impl Random {
    /// Draws with `seed`, keeping the first `sinks` and the last `recent` positions.
    pub fn new(seed: u64, sinks: usize, recent: usize) -> Self {
        Random { seed, sinks, recent }
    }

    /// The score of KV head `h` at position `j`, in `[0, 1)` (a multiple of 2⁻²⁴).
    pub fn draw(&self, h: usize, j: usize) -> f32 {
        let i = ((h as u64) << 32).wrapping_add(j as u64);
        (splitmix64(self.seed, i) >> 40) as f32 / (1u32 << 24) as f32
    }
}

impl Scorer for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn needs(&self) -> Needs {
        Needs::default()
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: self.recent }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let mut out = Scores::zeros(s.kv_heads, s.len);
        for h in 0..s.kv_heads {
            for (j, x) in out.row_mut(h).iter_mut().enumerate() {
                *x = self.draw(h, j);
            }
        }
        Ok(out)
    }
}
