//! Approximate leverage of the pre-RoPE keys — the geometric half of Compactor (Chari & Van
//! Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage
//! Scores", 2025, arXiv:2507.08143); kvpress's `LeverageScorePress`.
//!
//! Attention-free and query-agnostic: a key that sticks out of the span of the others (an
//! outlier of the key geometry) is kept. Per KV head, with the keys before RoPE `K ∈ ℝ^{n×d}`:
//!
//! - `X = (K − 1·mean(K)) Φ`, a right Gaussian sketch `Φ ∈ ℝ^{d×k}` with entries `N(0, 1/k)`
//!   (`k = 48`);
//! - `ℓ_j = max(0, x_jᵀ (XᵀX + εI)⁻¹ x_j)` through a Cholesky factor, `ε = 0.01` (raised ten-fold,
//!   up to four times, while the factorisation fails), as kvpress computes it;
//! - the table z-normalised over every head and position together (as kvpress does, so it blends
//!   with [`crate::scorer::non_causal`]'s scores on one scale).
//!
//! The cache holds keys after RoPE; the pre-RoPE keys are recovered exactly by rotating key `j`
//! back by its position (the rotation is orthogonal), so no extra statistic is needed. During
//! the prefill slot `j` holds position `j`.
//!
//! Differences from kvpress: torch's generator cannot be reproduced, so the sketch is drawn from
//! SplitMix64 (seeded, default 0; Box–Muller) where kvpress draws a fresh `torch.randn` per call;
//! the peer check injects kvpress's sketch ([`leverage_scores`] takes `Φ`). f64 arithmetic where
//! kvpress works in f32. No positions are protected (as the press).

use crate::error::{PolicyError, Result};
use crate::scorer::Scorer;
use crate::scorer::expected_attention::Rope;
use crate::scorer::non_causal::zscore;
use crate::scorer::random::splitmix64;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// kvpress's first jitter on the sketched Gram matrix.
const JITTER: f64 = 1e-2;
/// Cholesky attempts before giving up (kvpress's `max_tries`).
const TRIES: usize = 5;

/// Leverage of the centred, sketched pre-RoPE keys.
#[derive(Debug, Clone, PartialEq)]
pub struct LeverageScore {
    rope: Rope,
    sketch: usize,
    seed: u64,
}

impl LeverageScore {
    /// A sketch of `sketch` columns (positive) drawn with `seed`; `rope` undoes the cached keys'
    /// rotation.
    pub fn new(rope: Rope, sketch: usize, seed: u64) -> Result<Self> {
        if sketch == 0 {
            return Err(PolicyError::InvalidParameter {
                method: "leverage",
                name: "sketch",
                reason: "must be positive".into(),
            });
        }
        Ok(LeverageScore { rope, sketch, seed })
    }

    /// The rotation it undoes.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// `Φ` for `kv_heads` heads, `[H_kv, d, k]`: entries `N(0, 1/k)` by Box–Muller on SplitMix64.
    pub fn sketch_matrix(&self, kv_heads: usize, d: usize) -> Vec<f32> {
        let k = self.sketch;
        let count = kv_heads * d * k;
        let uniform = |i: u64| ((splitmix64(self.seed, i) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        (0..count)
            .map(|i| {
                let (u1, u2) = (uniform(2 * i as u64), uniform(2 * i as u64 + 1));
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (z / (k as f64).sqrt()) as f32
            })
            .collect()
    }
}

/// In-place lower Cholesky factor of the `k×k` matrix `a`; `false` when it is not positive
/// definite.
fn cholesky(a: &mut [f64], k: usize) -> bool {
    for j in 0..k {
        let mut diag = a[j * k + j];
        for t in 0..j {
            diag -= a[j * k + t] * a[j * k + t];
        }
        if !(diag > 0.0 && diag.is_finite()) {
            return false;
        }
        let diag = diag.sqrt();
        a[j * k + j] = diag;
        for i in j + 1..k {
            let mut x = a[i * k + j];
            for t in 0..j {
                x -= a[i * k + t] * a[j * k + t];
            }
            a[i * k + j] = x / diag;
        }
        for t in j + 1..k {
            a[j * k + t] = 0.0;
        }
    }
    true
}

/// Raw leverage (before z-scoring), `[H_kv, n]`, of pre-RoPE keys `[H_kv, n, d]` under the sketch
/// `phi` (`[H_kv, d, k]`).
pub fn leverage_scores(keys: &[f32], kv_heads: usize, n: usize, d: usize, phi: &[f32], k: usize) -> Result<Vec<f32>> {
    if keys.len() != kv_heads * n * d {
        return Err(PolicyError::ShapeMismatch { what: "pre-RoPE keys", expected: kv_heads * n * d, got: keys.len() });
    }
    if phi.len() != kv_heads * d * k {
        return Err(PolicyError::ShapeMismatch { what: "sketch", expected: kv_heads * d * k, got: phi.len() });
    }
    let mut out = vec![0f32; kv_heads * n];
    for h in 0..kv_heads {
        let kh = &keys[h * n * d..(h + 1) * n * d];
        let mut mean = vec![0f64; d];
        for row in kh.chunks_exact(d) {
            mean.iter_mut().zip(row).for_each(|(m, &x)| *m += f64::from(x));
        }
        mean.iter_mut().for_each(|m| *m /= n as f64);
        let ph = &phi[h * d * k..(h + 1) * d * k];
        let mut x = vec![0f64; n * k];
        for (j, row) in kh.chunks_exact(d).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                let centred = f64::from(v) - mean[c];
                for t in 0..k {
                    x[j * k + t] += centred * f64::from(ph[c * k + t]);
                }
            }
        }
        let mut gram = vec![0f64; k * k];
        for row in x.chunks_exact(k) {
            for a in 0..k {
                for b in 0..k {
                    gram[a * k + b] += row[a] * row[b];
                }
            }
        }
        let mut factor = None;
        let mut jitter = JITTER;
        for _ in 0..TRIES {
            let mut l = gram.clone();
            (0..k).for_each(|i| l[i * k + i] += jitter);
            if cholesky(&mut l, k) {
                factor = Some(l);
                break;
            }
            jitter *= 10.0;
        }
        let l = factor.ok_or(PolicyError::InvalidParameter {
            method: "leverage",
            name: "keys",
            reason: format!("the sketched Gram matrix of KV head {h} is not positive definite after {TRIES} jitters"),
        })?;
        // ℓ_j = ‖L⁻¹ x_j‖², by forward substitution
        let mut y = vec![0f64; k];
        for (j, row) in x.chunks_exact(k).enumerate() {
            for i in 0..k {
                let s: f64 = (0..i).map(|t| l[i * k + t] * y[t]).sum();
                y[i] = (row[i] - s) / l[i * k + i];
            }
            out[h * n + j] = y.iter().map(|v| v * v).sum::<f64>().max(0.0) as f32;
        }
    }
    Ok(out)
}

impl Scorer for LeverageScore {
    fn name(&self) -> &'static str {
        "leverage"
    }

    fn needs(&self) -> Needs {
        Needs { keys: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect::NONE
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let (kv, keys) = input.keys("leverage")?;
        let (n, d) = (kv.len, kv.head_dim);
        if self.rope.head_dim() != d {
            return Err(PolicyError::ShapeMismatch {
                what: "RoPE head dimension",
                expected: d,
                got: self.rope.head_dim(),
            });
        }
        let mut pre = keys.to_vec();
        for (r, row) in pre.chunks_exact_mut(d).enumerate() {
            self.rope.unrotate(row, r % n);
        }
        let phi = self.sketch_matrix(kv.kv_heads, d);
        let mut data = leverage_scores(&pre, kv.kv_heads, n, d, &phi, self.sketch)?;
        zscore(&mut data);
        Ok(Scores { kv_heads: kv.kv_heads, len: n, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exact leverage when the sketch is the identity and the jitter negligible: two centred
    /// keys in 1-D, `x = ±1`, `XᵀX = 2`, `ℓ = 1/(2 + 0.01)` each; three keys `[0, 1, 2]` centred
    /// to `[−1, 0, 1]`: `ℓ = [1, 0, 1]/2.01`.
    #[test]
    fn hand_computed_leverage() {
        let got = leverage_scores(&[3.0, 5.0], 1, 2, 1, &[1.0], 1).unwrap();
        for g in got {
            assert!((f64::from(g) - 1.0 / 2.01).abs() < 1e-7);
        }
        let got = leverage_scores(&[0.0, 1.0, 2.0], 1, 3, 1, &[1.0], 1).unwrap();
        for (g, w) in got.iter().zip([1.0 / 2.01, 0.0, 1.0 / 2.01]) {
            assert!((f64::from(*g) - w).abs() < 1e-7, "{got:?}");
        }
        // 2-D: the outlier has the largest leverage
        let keys = [1.0, 0.0, 0.9, 0.1, 1.1, -0.1, 1.0, 0.05, -3.0, 2.0];
        let got = leverage_scores(&keys, 1, 5, 2, &[1.0, 0.0, 0.0, 1.0], 2).unwrap();
        let top = (0..5).max_by(|&a, &b| got[a].total_cmp(&got[b])).unwrap();
        assert_eq!(top, 4, "{got:?}");
    }

    #[test]
    fn the_sketch_is_seeded_gaussian_and_rope_is_undone() {
        let rope = Rope::llama(10_000.0, 4).unwrap();
        let a = LeverageScore::new(rope.clone(), 48, 7).unwrap();
        let phi = a.sketch_matrix(2, 64);
        assert_eq!(phi, LeverageScore::new(rope.clone(), 48, 7).unwrap().sketch_matrix(2, 64));
        assert_ne!(phi, LeverageScore::new(rope.clone(), 48, 8).unwrap().sketch_matrix(2, 64));
        // variance 1/k
        let var = phi.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / phi.len() as f64;
        assert!((var * 48.0 - 1.0).abs() < 0.05, "{var}");
        let mut x = [0.3f32, -1.2, 0.7, 2.0];
        let orig = x;
        rope.rotate(&mut x, 37);
        rope.unrotate(&mut x, 37);
        assert!(x.iter().zip(orig).all(|(a, b)| (a - b).abs() < 1e-6));
        assert!(LeverageScore::new(rope, 0, 0).is_err());
    }
}
