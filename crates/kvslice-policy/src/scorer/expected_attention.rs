//! ExpectedAttention — Devoto et al., "Expected Attention: KV Cache Compression by Estimating
//! Attention from Future Queries Distribution", 2025 (kvpress's `ExpectedAttentionPress`).
//!
//! Model the future queries as Gaussian: mean `μ` and covariance `Σ` of the layer's pre-RoPE
//! queries (positions `n_sink..n`). Average the RoPE rotation over the next `F` positions,
//! `R̄ = mean_{t=n}^{n+F−1} R_t`, and rotate: `μ̄ = R̄ μ`, `Σ̄ = R̄ Σ R̄ᵀ`. The expected
//! exponentiated logit of key `k_j` (after RoPE) is `exp(⟨μ̄, k_j⟩/√d + k_jᵀ Σ̄ k_j / (2d))`, so
//!
//! `p_j = mean_{h in group} softmax_{j ≥ n_sink}( ⟨μ̄_h, k_j⟩/√d + k_jᵀ Σ̄_h k_j/(2d) )` and
//! `s_j = (p_j + ε)·‖v_j‖₂` (with `use_vnorm`; `s_j = p_j` without); the `n_sink` first tokens
//! are kept. Defaults from kvpress 0.5.5: `F = 512`, `n_sink = 4`, covariance on,
//! value norm on, `ε = 0`.

use crate::error::{PolicyError, Result};
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// Rotary position embedding frequencies (`rotate_half` layout: pairs `(i, i + d/2)`).
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    inv_freq: Vec<f64>,
}

impl Rope {
    /// Llama's RoPE: `θ_i = base^(−2i/d)`, `i < d/2`.
    pub fn llama(base: f64, head_dim: usize) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(param("rope", "head_dim", format!("must be even and positive, got {head_dim}")));
        }
        if !(base.is_finite() && base > 1.0) {
            return Err(param("rope", "base", format!("must be finite and above 1, got {base}")));
        }
        Ok(Rope { inv_freq: (0..head_dim / 2).map(|i| base.powf(-((2 * i) as f64) / head_dim as f64)).collect() })
    }

    /// Explicit inverse frequencies (for scaled RoPE variants), `d/2` of them.
    pub fn from_inv_freq(inv_freq: Vec<f64>) -> Result<Self> {
        if inv_freq.is_empty() || inv_freq.iter().any(|f| !f.is_finite()) {
            return Err(param("rope", "inv_freq", "must be non-empty and finite"));
        }
        Ok(Rope { inv_freq })
    }

    /// Head dimension `d`.
    pub fn head_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// The inverse frequencies.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }

    /// Rotates `x` (length `d`) in place to position `pos`.
    pub fn rotate(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            let (a, b) = (f64::from(x[i]), f64::from(x[i + half]));
            x[i] = (a * c - b * s) as f32;
            x[i + half] = (b * c + a * s) as f32;
        }
    }

    /// Rotates `x` (length `d`) in place back from position `pos` (the inverse of
    /// [`Rope::rotate`]).
    pub fn unrotate(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            let (a, b) = (f64::from(x[i]), f64::from(x[i + half]));
            x[i] = (a * c + b * s) as f32;
            x[i + half] = (b * c - a * s) as f32;
        }
    }

    /// `R̄ = mean_{t ∈ [start, start+count)} R_t`, `[d, d]` row-major (`R_t x` rotates `x` to `t`).
    pub fn mean_rotation(&self, start: usize, count: usize) -> Vec<f64> {
        let half = self.inv_freq.len();
        let d = 2 * half;
        let mut r = vec![0f64; d * d];
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (mut cs, mut sn) = (0f64, 0f64);
            for t in start..start + count {
                let (s, c) = (t as f64 * f).sin_cos();
                cs += c;
                sn += s;
            }
            let (cs, sn) = (cs / count as f64, sn / count as f64);
            r[i * d + i] = cs;
            r[(i + half) * d + i + half] = cs;
            r[i * d + i + half] = -sn;
            r[(i + half) * d + i] = sn;
        }
        r
    }
}

/// Expected attention of future queries, times the value norm.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedAttention {
    rope: Rope,
    n_future_positions: usize,
    n_sink: usize,
    use_covariance: bool,
    use_vnorm: bool,
    epsilon: f32,
}

impl ExpectedAttention {
    /// kvpress's defaults with the model's RoPE.
    pub fn new(rope: Rope) -> Self {
        ExpectedAttention {
            rope,
            n_future_positions: 512,
            n_sink: 4,
            use_covariance: true,
            use_vnorm: true,
            epsilon: 0.0,
        }
    }

    /// All parameters.
    pub fn with(
        rope: Rope,
        n_future_positions: usize,
        n_sink: usize,
        use_covariance: bool,
        use_vnorm: bool,
        epsilon: f32,
    ) -> Result<Self> {
        if n_future_positions == 0 {
            return Err(param("expected-attention", "n_future_positions", "must be at least 1"));
        }
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(param(
                "expected-attention",
                "epsilon",
                format!("must be finite and non-negative, got {epsilon}"),
            ));
        }
        Ok(ExpectedAttention { rope, n_future_positions, n_sink, use_covariance, use_vnorm, epsilon })
    }

    /// Tokens at the start that are always kept, and skipped by the query statistics.
    pub fn n_sink(&self) -> usize {
        self.n_sink
    }
}

impl Scorer for ExpectedAttention {
    fn name(&self) -> &'static str {
        "expected-attention"
    }

    fn needs(&self) -> Needs {
        Needs { keys: true, values: self.use_vnorm, query_moments: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.n_sink, recent: 0 }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        const M: &str = "expected-attention";
        let (kv, keys) = input.keys(M)?;
        let qm = input.query_moments.ok_or(PolicyError::MissingInput { method: M, input: "query moments" })?;
        qm.validate()?;
        let d = kv.head_dim;
        if qm.head_dim != d || self.rope.head_dim() != d {
            return Err(PolicyError::ShapeMismatch {
                what: "head_dim of query moments / RoPE",
                expected: d,
                got: qm.head_dim,
            });
        }
        let heads = qm.heads;
        if heads % kv.kv_heads != 0 {
            return Err(PolicyError::Grouping { heads, kv_heads: kv.kv_heads });
        }
        let n = kv.len;
        if n <= self.n_sink {
            return Err(PolicyError::Window { window: self.n_sink, len: n, reason: "needs more tokens than sinks" });
        }
        let g = heads / kv.kv_heads;
        let r = self.rope.mean_rotation(n, self.n_future_positions);
        let sqrt_d = (d as f64).sqrt();
        let mut out = Scores::zeros(kv.kv_heads, n);
        for h in 0..heads {
            // μ̄ = R̄ μ, Σ̄ = R̄ Σ R̄ᵀ
            let mu: Vec<f64> =
                (0..d).map(|a| (0..d).map(|b| r[a * d + b] * f64::from(qm.mean[h * d + b])).sum()).collect();
            let cov = if self.use_covariance {
                let c = |a: usize, b: usize| f64::from(qm.cov[(h * d + a) * d + b]);
                let mut rc = vec![0f64; d * d];
                for a in 0..d {
                    for b in 0..d {
                        rc[a * d + b] = (0..d).map(|t| r[a * d + t] * c(t, b)).sum();
                    }
                }
                let mut out = vec![0f64; d * d];
                for a in 0..d {
                    for b in 0..d {
                        out[a * d + b] = (0..d).map(|t| rc[a * d + t] * r[b * d + t]).sum();
                    }
                }
                Some(out)
            } else {
                None
            };
            let kh = h / g;
            let logits: Vec<f64> = (self.n_sink..n)
                .map(|j| {
                    let k: Vec<f64> = kv.row(keys, kh, j).iter().map(|&x| f64::from(x)).collect();
                    let mut l = mu.iter().zip(&k).map(|(a, b)| a * b).sum::<f64>() / sqrt_d;
                    if let Some(c) = &cov {
                        let mut quad = 0f64;
                        for a in 0..d {
                            quad += k[a] * (0..d).map(|b| c[a * d + b] * k[b]).sum::<f64>();
                        }
                        l += quad / d as f64 / 2.0;
                    }
                    l
                })
                .collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|l| (l - max).exp()).sum();
            let row = out.row_mut(kh);
            for (i, l) in logits.iter().enumerate() {
                row[self.n_sink + i] += (((l - max).exp() / z) / g as f64) as f32;
            }
        }
        if self.use_vnorm {
            let (kv, values) = input.values(M)?;
            for kh in 0..kv.kv_heads {
                for j in self.n_sink..n {
                    let norm = kv.row(values, kh, j).iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
                    let v = &mut out.row_mut(kh)[j];
                    *v = ((f64::from(*v) + f64::from(self.epsilon)) * norm) as f32;
                }
            }
        }
        Ok(out)
    }
}
