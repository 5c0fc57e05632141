//! Compactor (Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
//! Approximate Leverage Scores", 2025, arXiv:2507.08143); kvpress's `CompactorPress`.
//!
//! Query-agnostic: the blend of the two scores of this family, computed over the prompt without
//! its first `sinks` and last `recent` positions (which are kept):
//!
//! - `ℓ`: [`crate::scorer::leverage`]'s approximate leverage of the centred pre-RoPE keys of the
//!   slice (centred, sketched and z-scored over the slice alone);
//! - `a`: [`crate::scorer::non_causal`]'s chunked non-causal attention over the slice, its
//!   chunks starting at the slice's first position, times `‖v‖`, averaged over 3 neighbours
//!   (zero padding at the slice's ends) and z-scored over the slice;
//! - `s = β·ℓ + a`, with `β` the evicted fraction `1 − budget/n` (kvpress's default, the
//!   compression ratio) unless given.
//!
//! Defaults as kvpress: 8 sinks, 4 recent, chunks of 256, a sketch of 48. The protected positions
//! are kept by [`Protect`]; kvpress pads them with the table's highest score so that its top-k
//! keeps them, which here would make a wrapper such as [`crate::scorer::Span`] spread them to
//! their neighbours, so they carry the lowest score instead (the same kept set under top-k).

//! Differences from kvpress: the sketch is seeded SplitMix64 (see [`crate::scorer::leverage`]);
//! `β` comes from the layer's budget, which is kvpress's ratio up to the rounding of the kept
//! count.

use crate::error::{PolicyError, Result};
use crate::pool::Pooling;
use crate::scorer::Scorer;
use crate::scorer::expected_attention::Rope;
use crate::scorer::leverage::{LeverageScore, leverage_scores};
use crate::scorer::non_causal::zscore;
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, NonCausalSpec, ScoreInput, Scores, reduce_groups};

/// kvpress's `CompactorPress` defaults.
pub const SINKS: usize = 8;
pub const RECENT: usize = 4;
pub const CHUNK: usize = 256;
pub const SKETCH: usize = 48;

/// Leverage and non-causal attention, blended.
#[derive(Debug, Clone, PartialEq)]
pub struct Compactor {
    leverage: LeverageScore,
    sketch: usize,
    chunk: usize,
    sinks: usize,
    recent: usize,
    /// `β`; `None`: the evicted fraction.
    blend: Option<f64>,
}

impl Compactor {
    /// kvpress's defaults, the sketch seeded with `seed`.
    pub fn new(rope: Rope, seed: u64) -> Result<Self> {
        Compactor::with(rope, SKETCH, seed, CHUNK, SINKS, RECENT, None)
    }

    /// Every parameter: `sketch` and `chunk` positive, `blend` finite and non-negative.
    pub fn with(
        rope: Rope,
        sketch: usize,
        seed: u64,
        chunk: usize,
        sinks: usize,
        recent: usize,
        blend: Option<f64>,
    ) -> Result<Self> {
        if chunk == 0 {
            return Err(PolicyError::InvalidParameter {
                method: "compactor",
                name: "chunk",
                reason: "must be positive".into(),
            });
        }
        if let Some(b) = blend
            && !(b.is_finite() && b >= 0.0)
        {
            return Err(PolicyError::InvalidParameter {
                method: "compactor",
                name: "blend",
                reason: format!("must be a finite weight ≥ 0, got {b}"),
            });
        }
        let leverage = LeverageScore::new(rope, sketch, seed)?;
        Ok(Compactor { leverage, sketch, chunk, sinks, recent, blend })
    }

    /// The non-causal table this scorer reads.
    pub fn spec(&self) -> NonCausalSpec {
        NonCausalSpec { chunk: self.chunk, start: self.sinks, end: self.recent }
    }

    /// The leverage half.
    pub fn leverage(&self) -> &LeverageScore {
        &self.leverage
    }

    /// Blends the two halves over the slice `range` of a `[H_kv, n]` table: `lev` and `att` are
    /// `[H_kv, m]` (`m = range.len()`), already z-scored; protected positions get the minimum.
    pub fn blend(
        lev: &[f32],
        att: &[f32],
        beta: f64,
        kv_heads: usize,
        n: usize,
        range: std::ops::Range<usize>,
    ) -> Scores {
        let m = range.len();
        let mixed: Vec<f32> = lev.iter().zip(att).map(|(&l, &a)| (beta * f64::from(l) + f64::from(a)) as f32).collect();
        let low = mixed.iter().copied().fold(f32::INFINITY, f32::min);
        // an empty slice: nothing to rank
        let pad = if low.is_finite() { low } else { 0.0 };
        let mut data = vec![pad; kv_heads * n];
        for h in 0..kv_heads {
            data[h * n + range.start..h * n + range.end].copy_from_slice(&mixed[h * m..(h + 1) * m]);
        }
        Scores { kv_heads, len: n, data }
    }
}

impl Scorer for Compactor {
    fn name(&self) -> &'static str {
        "compactor"
    }

    fn needs(&self) -> Needs {
        Needs { non_causal: Some(self.spec()), keys: true, values: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: self.recent }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let d = input.kv.map_or(0, |kv| kv.head_dim);
        let kv_heads = input.kv.map_or(0, |kv| kv.kv_heads);
        self.score_with(input, &self.leverage.sketch_matrix(kv_heads, d))
    }
}

impl Compactor {
    /// [`Scorer::score`] under a given sketch `phi` (`[H_kv, d, sketch]`, entries already
    /// scaled) in place of the seeded one: the peer check hands it kvpress's draws.
    pub fn score_with(&self, input: &ScoreInput<'_>, phi: &[f32]) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let (kv, keys) = input.keys("compactor")?;
        let (_, values) = input.values("compactor")?;
        let (n, d, hk) = (kv.len, kv.head_dim, kv.kv_heads);
        let rope = self.leverage.rope();
        if rope.head_dim() != d {
            return Err(PolicyError::ShapeMismatch { what: "RoPE head dimension", expected: d, got: rope.head_dim() });
        }
        let range = self.spec().range(n);
        let m = range.len();
        let sums = s.non_causal_for(self.spec()).ok_or(PolicyError::MissingInput {
            method: "compactor",
            input: "window statistic `non_causal` over the slice",
        })?;
        // the slice's pre-RoPE keys, [H_kv, m, d]
        let mut pre = Vec::with_capacity(hk * m * d);
        for h in 0..hk {
            for j in range.clone() {
                let mut row = kv.row(keys, h, j).to_vec();
                rope.unrotate(&mut row, j);
                pre.extend_from_slice(&row);
            }
        }
        let mut lev = if m == 0 { Vec::new() } else { leverage_scores(&pre, hk, m, d, phi, self.sketch)? };
        zscore(&mut lev);
        // the attention half over the slice
        let table = reduce_groups(sums, s.heads, s.kv_heads, n, GroupReduce::Mean)?;
        let mut att = Vec::with_capacity(hk * m);
        for h in 0..hk {
            let row: Vec<f32> = range
                .clone()
                .map(|j| {
                    let norm = kv.row(values, h, j).iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
                    (f64::from(table.row(h)[j]) * norm) as f32
                })
                .collect();
            att.extend(Pooling::Avg(3).apply(&row));
        }
        zscore(&mut att);
        let beta = self.blend.unwrap_or_else(|| if n == 0 { 0.0 } else { 1.0 - input.budget.min(n) as f64 / n as f64 });
        Ok(Compactor::blend(&lev, &att, beta, hk, n, range))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{Dims, non_causal_sums, non_causal_sums_over};
    use crate::stats::{KvView, NonCausalTable, WindowStats};

    /// The slice's non-causal table is the whole-prompt table of the slice alone, placed at the
    /// slice's positions (hand check: kvpress slices the hidden states, keys and RoPE angles).
    #[test]
    fn the_slice_is_a_prompt_of_its_own() {
        let dims = Dims { heads: 2, kv_heads: 1, len: 11, head_dim: 2 };
        let q: Vec<f32> = (0..2 * 11 * 2).map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0).collect();
        let k: Vec<f32> = (0..11 * 2).map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0).collect();
        let spec = NonCausalSpec { chunk: 3, start: 2, end: 1 };
        let got = non_causal_sums_over(dims, &q, &k, spec).unwrap();
        // positions 2..10 as a prompt of 8
        let slice = |x: &[f32], rows: usize, per: usize| -> Vec<f32> {
            (0..rows).flat_map(|h| x[(h * 11 + 2) * per..(h * 11 + 10) * per].to_vec()).collect()
        };
        let sub = Dims { len: 8, ..dims };
        let want = non_causal_sums(sub, &slice(&q, 2, 2), &slice(&k, 1, 2), 3).unwrap();
        for h in 0..2 {
            for j in 0..11 {
                let w = if (2..10).contains(&j) { want[h * 8 + j - 2] } else { 0.0 };
                assert!((got[h * 11 + j] - w).abs() < 1e-6, "head {h} pos {j}: {got:?}");
            }
        }
        // clamping as kvpress: a prompt shorter than the sinks is all sinks
        assert_eq!(NonCausalSpec { chunk: 4, start: 8, end: 4 }.range(5), 5..5);
        assert_eq!(NonCausalSpec { chunk: 4, start: 8, end: 4 }.range(10), 8..8);
        assert_eq!(NonCausalSpec { chunk: 4, start: 8, end: 4 }.range(20), 8..16);
    }

    /// Worked by hand: blend weight 0.5, one KV head, z-scored halves over a slice of 3.
    #[test]
    fn hand_computed_blend() {
        let got = Compactor::blend(&[1.0, 0.0, -1.0], &[-1.0, 1.0, 0.0], 0.5, 1, 5, 1..4);
        assert_eq!(got.data, vec![-0.5, -0.5, 1.0, -0.5, -0.5]);
    }

    #[test]
    fn missing_table_and_bad_parameters_are_errors() {
        let rope = Rope::llama(10_000.0, 2).unwrap();
        assert!(Compactor::with(rope.clone(), 48, 0, 0, 8, 4, None).is_err());
        assert!(Compactor::with(rope.clone(), 0, 0, 256, 8, 4, None).is_err());
        assert!(Compactor::with(rope.clone(), 48, 0, 256, 8, 4, Some(f64::NAN)).is_err());
        let c = Compactor::with(rope, 2, 0, 2, 1, 1, None).unwrap();
        let n = 6;
        let keys: Vec<f32> = (0..n * 2).map(|i| (i as f32 * 0.37).sin()).collect();
        let values = vec![1.0f32; n * 2];
        let mut stats = WindowStats {
            heads: 1,
            kv_heads: 1,
            len: n,
            window: 1,
            mean: vec![0.0; n],
            var: vec![0.0; n],
            last: vec![0.0; n],
            entropy: vec![0.0],
            ..WindowStats::default()
        };
        let kv = KvView { kv_heads: 1, len: n, head_dim: 2, keys: Some(&keys), values: Some(&values) };
        let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, 3) };
        assert!(matches!(c.score(&input), Err(PolicyError::MissingInput { .. })));
        // the whole-prompt table is not the slice's
        stats.non_causal = vec![NonCausalTable { spec: NonCausalSpec::whole(2), sums: vec![1.0; n] }];
        let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, 3) };
        assert!(matches!(c.score(&input), Err(PolicyError::MissingInput { .. })));
        stats.non_causal = vec![NonCausalTable { spec: c.spec(), sums: vec![1.0; n] }];
        let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, 3) };
        let got = c.score(&input).unwrap();
        // the protected ends carry the table's minimum
        let low = got.data.iter().copied().fold(f32::INFINITY, f32::min);
        assert_eq!((got.data[0], got.data[n - 1]), (low, low));
    }
}
