//! LagKV — Liang et al., "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens
//! Are Important", 2025 (arXiv:2504.04704); kvpress's `LagKVPress`.
//!
//! Attention-free, from the cached keys and values of each KV head. After `sinks` initial
//! tokens the prompt is cut into partitions of `lag` tokens; each partition is scored against
//! the next one (its *lag* reference). For a token `t` of partition `P` and the reference `R`
//! (the partition after `P`), per channel `c`:
//! `x̂_tc = (x_tc − min_{r∈R} x_rc) / (max_{r∈R} x_rc − min_{r∈R} x_rc)`, then
//! `σ_t = std_c x̂_tc` (unbiased, torch's default) and `p_t = softmax_{t∈P} σ_t`. The score
//! averages keys and values, `u_t = (p_t^K + p_t^V) / 2`, and, by default, is replaced by its
//! rank inside the partition, `rank_P(u_t) / lag` (0 for the lowest), so that every partition
//! keeps the same share; `cross = true` keeps `u_t` itself (kvpress's `cross_scoring`).
//!
//! The last full partition and the `(n − sinks) mod lag` tokens after it have no reference: as
//! in kvpress they rank above every scored token, and the `sinks` first tokens are protected.
//! A prompt shorter than `sinks + 2·lag` has nothing to score: the tokens after the sinks rank
//! by position, `(j − sinks)/(n − sinks)`, newest first (kvpress's fallback).
//!
//! Differences from kvpress, only where kvpress's outcome is unspecified: kvpress scores the
//! sinks and the unscored tail all 1 and leaves the order among them to torch's `top-k`; here
//! the sinks are protected and the tail ranks newest first, `1 + r/T` for its `r`-th of `T`
//! tokens, so a budget too small for the whole tail keeps its newest tokens. A channel constant
//! over the reference (`max = min`, a division by zero and NaN scores in kvpress) contributes 0.
//! Equal ranks (the same rank in several partitions) are cut, as every tie here, by the lower
//! position. Computed in f64. Defaults from kvpress: `sinks = 4`, `lag = 128`.

use crate::error::Result;
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{KvView, Needs, ScoreInput, Scores};

/// Lag-relative scores of keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagKv {
    sinks: usize,
    lag: usize,
    cross: bool,
}

impl Default for LagKv {
    fn default() -> Self {
        LagKv { sinks: 4, lag: 128, cross: false }
    }
}

impl LagKv {
    /// `sinks` initial tokens kept, partitions of `lag` tokens (1 to 65536), in-partition ranks
    /// unless `cross`.
    pub fn new(sinks: usize, lag: usize, cross: bool) -> Result<Self> {
        if !(1..=65536).contains(&lag) {
            return Err(param("lagkv", "lag", format!("must lie in 1..=65536 tokens, got {lag}")));
        }
        Ok(LagKv { sinks, lag, cross })
    }
}

/// `p_t` of the `lag` tokens of `tokens` (rows of `t` from position `start`) against the `lag`
/// tokens after them: softmax over the partition of the std of the min-max normalised channels.
fn lag_scores(kv: &KvView<'_>, t: &[f32], h: usize, start: usize, lag: usize) -> Vec<f64> {
    let d = kv.head_dim;
    let mut lo = vec![f64::INFINITY; d];
    let mut hi = vec![f64::NEG_INFINITY; d];
    for r in start + lag..start + 2 * lag {
        for (c, &x) in kv.row(t, h, r).iter().enumerate() {
            lo[c] = lo[c].min(f64::from(x));
            hi[c] = hi[c].max(f64::from(x));
        }
    }
    let sigma: Vec<f64> = (start..start + lag)
        .map(|j| {
            let y: Vec<f64> = kv
                .row(t, h, j)
                .iter()
                .enumerate()
                .map(|(c, &x)| if hi[c] > lo[c] { (f64::from(x) - lo[c]) / (hi[c] - lo[c]) } else { 0.0 })
                .collect();
            let mean = y.iter().sum::<f64>() / d as f64;
            // torch's std with d = 1 divides by zero: NaN, which the softmax spreads; 0 here
            if d < 2 { 0.0 } else { (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (d - 1) as f64).sqrt() }
        })
        .collect();
    let m = sigma.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = sigma.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

impl Scorer for LagKv {
    fn name(&self) -> &'static str {
        "lagkv"
    }

    fn needs(&self) -> Needs {
        Needs { keys: true, values: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: 0 }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let (kv, keys) = input.keys("lagkv")?;
        let (_, values) = input.values("lagkv")?;
        let (n, sinks, lag) = (kv.len, self.sinks, self.lag);
        let mut out = Scores::zeros(kv.kv_heads, n);
        if n < sinks + 2 * lag {
            for h in 0..kv.kv_heads {
                for (j, x) in out.row_mut(h).iter_mut().enumerate().skip(sinks) {
                    *x = ((j - sinks) as f64 / (n - sinks) as f64) as f32;
                }
            }
            return Ok(out);
        }
        let parts = (n - sinks) / lag;
        let tail_start = sinks + (parts - 1) * lag;
        let tail = n - tail_start;
        for h in 0..kv.kv_heads {
            let row = out.row_mut(h);
            for p in 0..parts - 1 {
                let start = sinks + p * lag;
                let pk = lag_scores(&kv, keys, h, start, lag);
                let pv = lag_scores(&kv, values, h, start, lag);
                let u: Vec<f64> = pk.iter().zip(&pv).map(|(a, b)| (a + b) / 2.0).collect();
                if self.cross {
                    for (t, &x) in u.iter().enumerate() {
                        row[start + t] = x as f32;
                    }
                } else {
                    // rank inside the partition; equal values by position, as a stable sort
                    let mut order: Vec<usize> = (0..lag).collect();
                    order.sort_by(|&a, &b| u[a].total_cmp(&u[b]));
                    for (rank, &t) in order.iter().enumerate() {
                        row[start + t] = (rank as f64 / lag as f64) as f32;
                    }
                }
            }
            for r in 0..tail {
                row[tail_start + r] = (1.0 + r as f64 / tail as f64) as f32;
            }
        }
        Ok(out)
    }
}
