//! KeyDiff — Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
//! Inference in Resource-Constrained Environments", 2025 (arXiv:2504.15364); kvpress's
//! `KeyDiffPress`.
//!
//! Attention-free: keys that look like every other key carry little, distinctive keys are kept.
//! Per KV head, the anchor is the mean of the unit keys, `a = mean_j k_j/‖k_j‖₂`, and
//! `s_j = −cos(k_j, a)`. No window, no protected positions (as kvpress's press).
//!
//! As kvpress computes it: `F.normalize` (a zero key stays zero) then `F.cosine_similarity`
//! with each norm clamped at `ε = 1e−8`, so a zero key, or a zero anchor, scores 0. Keys as
//! cached (after RoPE), one score per KV head: no GQA reduction is involved. The paper's
//! block-wise prefill (compress after each block of the prompt) is kvpress's `BlockPress`
//! around this press, here [`crate::scorer::Block`] (`keydiff-block`); `keydiff` is the one-shot
//! scorer on the whole prompt. Computed in f64.

use crate::error::Result;
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// torch's `cosine_similarity` clamp on each norm.
const COS_EPS: f64 = 1e-8;
/// torch's `F.normalize` clamp on the norm.
const NORMALIZE_EPS: f64 = 1e-12;

/// Negative cosine similarity of each key to its head's mean unit key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyDiff;

fn norm(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt()
}

impl Scorer for KeyDiff {
    fn name(&self) -> &'static str {
        "keydiff"
    }

    fn needs(&self) -> Needs {
        Needs { keys: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect::NONE
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let (kv, keys) = input.keys("keydiff")?;
        let (n, d) = (kv.len, kv.head_dim);
        let mut out = Scores::zeros(kv.kv_heads, n);
        if n == 0 {
            return Ok(out);
        }
        for h in 0..kv.kv_heads {
            let norms: Vec<f64> = (0..n).map(|j| norm(kv.row(keys, h, j))).collect();
            let mut anchor = vec![0f64; d];
            for (j, &nj) in norms.iter().enumerate() {
                let scale = nj.max(NORMALIZE_EPS);
                for (a, &x) in anchor.iter_mut().zip(kv.row(keys, h, j)) {
                    *a += f64::from(x) / scale;
                }
            }
            anchor.iter_mut().for_each(|a| *a /= n as f64);
            let anorm = anchor.iter().map(|a| a * a).sum::<f64>().sqrt().max(COS_EPS);
            let row = out.row_mut(h);
            for j in 0..n {
                let dot: f64 = kv.row(keys, h, j).iter().zip(&anchor).map(|(&x, a)| f64::from(x) * a).sum();
                row[j] = (-dot / (norms[j].max(COS_EPS) * anorm)) as f32;
            }
        }
        Ok(out)
    }
}
