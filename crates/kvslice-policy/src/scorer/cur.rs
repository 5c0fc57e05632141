//! CurDKV — Sengupta, Chaudhary & Chakraborty, "Value-Guided KV Compression for LLMs via
//! Approximated CUR Decomposition", NeurIPS 2025 (arXiv:2509.15038); kvpress's `CURPress`.
//!
//! Attention-free, from the cached keys and values of each KV head. The leverage of a token is
//! approximated by its squared norm, `κ_j = ‖k_j‖²` and `ν_j = ‖v_j‖²`; with the local
//! approximation (the default) each is divided by its sum over the window of `w` consecutive
//! positions holding it (`[0, w)`, `[w, 2w)`, …, the last one possibly shorter). The score
//! combines them (`kv_product`: `κ_j·ν_j`, the default; `kv_avg`: `(κ_j + ν_j)/2`; `key`: `κ_j`;
//! `value`: `ν_j`) and is normalised to sum to 1 over the head. The first `sinks` tokens are
//! kept (kvpress scores them 1, above every normalised score).
//!
//! Differences from kvpress: its `use_random_leverage` (a random Gaussian projection of keys
//! and values before the norms, drawn by torch's generator) is not offered; a window, or a
//! head, whose norms are all zero divides 0 by 0 (NaN scores) in kvpress and scores 0 here.
//! Keys as cached (after RoPE, which leaves norms unchanged). Computed in f64. Defaults from
//! kvpress: `sinks = 4`, `kv_product`, local windows of 16.

use crate::error::Result;
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{KvView, Needs, ScoreInput, Scores};

/// How key and value leverages combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leverage {
    /// `κ_j` only.
    Key,
    /// `ν_j` only.
    Value,
    /// `(κ_j + ν_j) / 2`.
    KvAvg,
    /// `κ_j · ν_j`.
    KvProduct,
}

/// Approximate CUR leverage of keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cur {
    sinks: usize,
    leverage: Leverage,
    /// Local window length; `None`: the raw squared norms.
    local: Option<usize>,
}

impl Default for Cur {
    fn default() -> Self {
        Cur { sinks: 4, leverage: Leverage::KvProduct, local: Some(16) }
    }
}

impl Cur {
    /// `sinks` initial tokens kept; norms normalised over windows of `local` positions (1 to
    /// 65536) when given.
    pub fn new(sinks: usize, leverage: Leverage, local: Option<usize>) -> Result<Self> {
        if let Some(w) = local
            && !(1..=65536).contains(&w)
        {
            return Err(param("cur", "local_window", format!("must lie in 1..=65536 tokens, got {w}")));
        }
        Ok(Cur { sinks, leverage, local })
    }
}

/// Squared norms of head `h`'s rows of `t`, divided by their window sums when `local` is set.
fn leverages(kv: &KvView<'_>, t: &[f32], h: usize, local: Option<usize>) -> Vec<f64> {
    let mut sq: Vec<f64> = (0..kv.len).map(|j| kv.row(t, h, j).iter().map(|&x| f64::from(x).powi(2)).sum()).collect();
    if let Some(w) = local {
        for window in sq.chunks_mut(w) {
            let sum: f64 = window.iter().sum();
            window.iter_mut().for_each(|x| *x = if sum > 0.0 { *x / sum } else { 0.0 });
        }
    }
    sq
}

impl Scorer for Cur {
    fn name(&self) -> &'static str {
        "cur"
    }

    fn needs(&self) -> Needs {
        let keys = self.leverage != Leverage::Value;
        let values = self.leverage != Leverage::Key;
        Needs { keys, values, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: 0 }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let needs = self.needs();
        let keys = if needs.keys { Some(input.keys("cur")?) } else { None };
        let values = if needs.values { Some(input.values("cur")?) } else { None };
        let Some((kv, _)) = keys.or(values) else { return Ok(Scores::zeros(input.stats.kv_heads, input.stats.len)) };
        let mut out = Scores::zeros(kv.kv_heads, kv.len);
        for h in 0..kv.kv_heads {
            let k = keys.map(|(kv, t)| leverages(&kv, t, h, self.local));
            let v = values.map(|(kv, t)| leverages(&kv, t, h, self.local));
            let s: Vec<f64> = match (k, v) {
                (Some(k), Some(v)) if self.leverage == Leverage::KvAvg => {
                    k.iter().zip(&v).map(|(a, b)| (a + b) / 2.0).collect()
                }
                (Some(k), Some(v)) => k.iter().zip(&v).map(|(a, b)| a * b).collect(),
                (Some(s), None) | (None, Some(s)) => s,
                (None, None) => vec![0.0; kv.len],
            };
            let total: f64 = s.iter().sum();
            let row = out.row_mut(h);
            for (o, x) in row.iter_mut().zip(&s) {
                *o = if total > 0.0 { (x / total) as f32 } else { 0.0 };
            }
        }
        Ok(out)
    }
}
