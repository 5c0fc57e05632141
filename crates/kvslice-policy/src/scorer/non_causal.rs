//! Non-causal chunked attention — the attention half of Compactor (Chari & Van Durme,
//! "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage Scores",
//! 2025, arXiv:2507.08143); kvpress's `NonCausalAttnPress`.
//!
//! Query-agnostic: no observation window stands in for the question. The prompt is cut into
//! chunks of `chunk` tokens (256) and, inside each chunk, every query attends to every key —
//! before and after it — so a token is scored by how much its whole neighbourhood reads it, not
//! only the tokens after it. Per KV head:
//!
//! - `A_j = mean_{h in group} Σ_{i in chunk(j)} softmax_{t in chunk(j)}(⟨q_i, k_t⟩)_j`, the
//!   runtime's [`crate::WindowStats::non_causal`] table averaged over the GQA group;
//! - `s_j = A_j · ‖v_j‖₂`, then averaged over 3 neighbours (zero padding counted, as torch's
//!   `avg_pool1d(kernel_size=3, padding=1)`);
//! - the table z-normalised over every head and position together (mean, unbiased standard
//!   deviation clamped at 1e−6), so that blends with other z-scored tables are on one scale.
//!
//! As kvpress computes it, and kept so the kept sets are the same: the logits are not divided by
//! `√d`; the last chunk is padded with zero queries and zero keys that are not masked (a zero key
//! has logit 0 for every query, and each zero query spreads `1/chunk` over its chunk's keys); no
//! positions are protected. The statistic is computed on the device during the prefill
//! ([`crate::reference::non_causal_sums`] is its definition); the scoring here is f64.

use crate::error::{PolicyError, Result};
use crate::pool::Pooling;
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, NonCausalSpec, ScoreInput, Scores, reduce_groups};

/// kvpress's z-score clamp on the standard deviation.
const STD_MIN: f64 = 1e-6;

/// Chunked non-causal attention received, times the value norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonCausalAttn {
    chunk: usize,
}

impl Default for NonCausalAttn {
    fn default() -> Self {
        NonCausalAttn { chunk: 256 }
    }
}

impl NonCausalAttn {
    /// Chunks of `chunk` tokens (positive).
    pub fn new(chunk: usize) -> Result<Self> {
        if chunk == 0 {
            return Err(PolicyError::InvalidParameter {
                method: "non-causal-attn",
                name: "chunk",
                reason: "must be positive".into(),
            });
        }
        Ok(NonCausalAttn { chunk })
    }
}

/// `(x − mean) / max(std, 1e−6)` over the whole table, the standard deviation unbiased (torch's
/// `(x - x.mean()) / x.std().clamp_min(1e-6)`; a one-element table divides by 1e−6).
pub(crate) fn zscore(data: &mut [f32]) {
    let count = data.len();
    if count == 0 {
        return;
    }
    let mean = data.iter().map(|&x| f64::from(x)).sum::<f64>() / count as f64;
    let std = if count > 1 {
        let var = data.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (count - 1) as f64;
        var.sqrt().max(STD_MIN)
    } else {
        STD_MIN
    };
    data.iter_mut().for_each(|x| *x = ((f64::from(*x) - mean) / std) as f32);
}

impl Scorer for NonCausalAttn {
    fn name(&self) -> &'static str {
        "non-causal-attn"
    }

    fn needs(&self) -> Needs {
        Needs { non_causal: Some(NonCausalSpec::whole(self.chunk)), values: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect::NONE
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let sums = s
            .non_causal_for(NonCausalSpec::whole(self.chunk))
            .ok_or(PolicyError::MissingInput { method: "non-causal-attn", input: "window statistic `non_causal`" })?;
        let (kv, values) = input.values("non-causal-attn")?;
        let n = s.len;
        let mut out = reduce_groups(sums, s.heads, s.kv_heads, n, GroupReduce::Mean)?;
        for h in 0..s.kv_heads {
            let row = out.row_mut(h);
            for (j, x) in row.iter_mut().enumerate() {
                let norm = kv.row(values, h, j).iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
                *x = (f64::from(*x) * norm) as f32;
            }
            let pooled = Pooling::Avg(3).apply(row);
            row.copy_from_slice(&pooled);
        }
        zscore(&mut out.data);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{Dims, non_causal_sums};
    use crate::stats::{KvView, WindowStats};

    /// Worked by hand: one head, d = 1, n = 3, chunk 2 (padded to 4).
    /// q = [1, 0, 2], k = [0, ln 2, ln 3] (unscaled logits q_i·k_t), v = [1, 2, 1] (norms).
    /// Chunk 0 (positions 0, 1): query 0 logits [0, ln 2] → [1/3, 2/3]; query 1 logits [0, 0] →
    /// [1/2, 1/2]; column sums [5/6, 7/6]. Chunk 1 (position 2 and a zero pad): query 2 logits
    /// [2 ln 3, 0] → [9/10, 1/10]; the zero query [1/2, 1/2]; column sum of position 2: 7/5.
    #[test]
    fn hand_computed_case() {
        let (q, k) = ([1.0f32, 0.0, 2.0], [0.0f32, 2f32.ln(), 3f32.ln()]);
        let dims = Dims { heads: 1, kv_heads: 1, len: 3, head_dim: 1 };
        let sums = non_causal_sums(dims, &q, &k, 2).unwrap();
        for (got, want) in sums.iter().zip([5.0 / 6.0, 7.0 / 6.0, 7.0 / 5.0]) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{sums:?}");
        }
        let v = [1.0f32, -2.0, 1.0];
        let stats = WindowStats {
            heads: 1,
            kv_heads: 1,
            len: 3,
            window: 1,
            mean: vec![0.0; 3],
            var: vec![0.0; 3],
            last: vec![0.0; 3],
            entropy: vec![0.0],
            non_causal: vec![crate::stats::NonCausalTable { spec: NonCausalSpec::whole(2), sums }],
            ..WindowStats::default()
        };
        let kv = KvView { kv_heads: 1, len: 3, head_dim: 1, keys: None, values: Some(&v) };
        let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, 2) };
        let got = NonCausalAttn::new(2).unwrap().score(&input).unwrap();
        // A·‖v‖ = [5/6, 7/3, 7/5], then averaged over 3 with zero padding and z-scored
        let x = [5.0 / 6.0, 7.0 / 3.0, 7.0 / 5.0];
        let pooled = [(x[0] + x[1]) / 3.0, (x[0] + x[1] + x[2]) / 3.0, (x[1] + x[2]) / 3.0];
        let mean = pooled.iter().sum::<f64>() / 3.0;
        let std = (pooled.iter().map(|p| (p - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
        for (g, p) in got.data.iter().zip(pooled) {
            assert!((f64::from(*g) - (p - mean) / std).abs() < 1e-5, "{:?}", got.data);
        }
    }

    #[test]
    fn missing_statistic_and_bad_chunk_are_errors() {
        assert!(NonCausalAttn::new(0).is_err());
        let stats = WindowStats {
            heads: 1,
            kv_heads: 1,
            len: 2,
            window: 1,
            mean: vec![0.0; 2],
            var: vec![0.0; 2],
            last: vec![0.0; 2],
            entropy: vec![0.0],
            ..WindowStats::default()
        };
        let v = [1.0f32, 1.0];
        let kv = KvView { kv_heads: 1, len: 2, head_dim: 1, keys: None, values: Some(&v) };
        let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&stats, 1) };
        assert!(matches!(NonCausalAttn::default().score(&input), Err(PolicyError::MissingInput { .. })));
    }
}
