//! Jacap — eviction from a first-order (Jacobian) view of attention, realised as softmax-aware
//! importance weights and statistical leverage scores of the keys for subset selection.
//!
//! **Importance (query relevance × softmax sensitivity).** A head's output for query `q` is
//! `o_q = Σ_j a_qj v_j` with `a_q = softmax(s_q)`. The softmax Jacobian `∂a_i/∂s_j = a_i(δ_ij − a_j)`
//! gives the output's derivative with respect to key `j`'s logit:
//! `∂o_q/∂s_qj = a_qj (v_j − o_q)`. Its norm is large when the query attends to `j` (relevance)
//! *and* when `v_j` differs from what the head outputs anyway (sensitivity); it is also, to first
//! order, the change of `o_q` when `j` is dropped (`−a_qj/(1−a_qj)·(v_j − o_q)` exactly). The
//! weight of token `j` is its mean over the observation window and over the GQA group:
//! `w_j = mean_{h ∈ group} mean_q a^h_qj ‖v_j − o^h_q‖₂` (`WindowStats::jacobian`).
//!
//! **Structural diversity (leverage).** Keeping a subset `S` of keys spans a subspace; under a
//! linear–Gaussian view of attention the information a subset keeps grows with
//! `log det(λI + Σ_{j∈S} w_j k_j k_jᵀ)`. The marginal value of each token in that objective is
//! measured by its ridge leverage score in the weighted key matrix:
//! `ℓ_j = w_j k_jᵀ (G + λI)⁻¹ k_j`, `G = Σ_i w_i k_i k_iᵀ` over all `n` keys of the KV head.
//! Leverage lies in `[0, 1)`; a heavy token in a direction no other key covers scores near 1,
//! while `m` equally heavy near-duplicates share their direction's leverage (≈ `1/m` each).
//! That is the score: tokens are kept by `ℓ_j`, highest first; the window is kept.
//!
//! **Choices where the method's public description leaves details open** (tested below):
//! - the ridge is `λ = tr(G)/d`, the mean eigenvalue of `G`: directions with less than the mean
//!   weighted energy gain leverage, the rest are ranked mostly by importance;
//! - leverage is computed over all `n` keys, the (kept) window included, so window tokens cover
//!   their directions and their near-duplicates in the prefix lose leverage;
//! - one-shot top-k on `ℓ`, not a greedy log-det pass (greedy would need `O(B·d²)` sequential
//!   updates per head; the leverage of the full set is its first-order approximation).
//!
//! Defaults: window `w = 32`.

use crate::error::{PolicyError, Result};
use crate::scorer::{Scorer, check_window, param};
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores, reduce_groups};

/// The ridge as a multiple of `tr(G)/d`.
pub const RIDGE: f64 = 1.0;

/// Jacobian-weighted ridge leverage of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jacap {
    window: usize,
}

impl Default for Jacap {
    fn default() -> Self {
        Jacap { window: 32 }
    }
}

impl Jacap {
    /// Jacap over an observation window of `window` queries.
    pub fn new(window: usize) -> Result<Self> {
        if window == 0 {
            return Err(param("jacap", "window", "must be at least 1"));
        }
        Ok(Jacap { window })
    }
}

impl Scorer for Jacap {
    fn name(&self) -> &'static str {
        "jacap"
    }

    fn needs(&self) -> Needs {
        Needs { window: self.window, jacobian: true, leverage: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: 0, recent: self.window }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        check_window(s, self.window)?;
        let lev = input.optional("jacap", "leverage scores", &s.leverage)?;
        Ok(Scores { kv_heads: s.kv_heads, len: s.len, data: lev.to_vec() })
    }
}

/// The group-mean importance weights `[H_kv, n]` of a `[H, n]` `jacobian` table.
pub fn weights(jacobian: &[f32], heads: usize, kv_heads: usize, len: usize) -> Result<Scores> {
    reduce_groups(jacobian, heads, kv_heads, len, GroupReduce::Mean)
}

/// Ridge leverage `ℓ_j = w_j k_jᵀ (G + λI)⁻¹ k_j`, `G = Σ_i w_i k_i k_iᵀ`, `λ = RIDGE·tr(G)/d`,
/// per KV head: `keys` `[H_kv, n, d]`, `weights` `[H_kv, n]` (non-negative) → `[H_kv, n]`.
/// Computed in f64 with a Cholesky factorisation (the definition the device path is checked
/// against). A head whose weights are all zero has zero leverage.
pub fn ridge_leverage(keys: &[f32], weights: &[f32], kv_heads: usize, len: usize, d: usize) -> Result<Vec<f32>> {
    if keys.len() != kv_heads * len * d {
        return Err(PolicyError::ShapeMismatch { what: "keys", expected: kv_heads * len * d, got: keys.len() });
    }
    if weights.len() != kv_heads * len {
        return Err(PolicyError::ShapeMismatch { what: "weights", expected: kv_heads * len, got: weights.len() });
    }
    if let Some(index) = weights.iter().position(|w| !w.is_finite() || *w < 0.0) {
        return Err(PolicyError::NonFinite { what: "leverage weights (finite, ≥ 0)", index });
    }
    if let Some(index) = keys.iter().position(|k| !k.is_finite()) {
        return Err(PolicyError::NonFinite { what: "keys", index });
    }
    let mut out = vec![0f32; kv_heads * len];
    for h in 0..kv_heads {
        let key = |j: usize| &keys[(h * len + j) * d..(h * len + j + 1) * d];
        let w = &weights[h * len..(h + 1) * len];
        let mut g = vec![0f64; d * d];
        for (j, &wj) in w.iter().enumerate() {
            let wj = f64::from(wj);
            if wj == 0.0 {
                continue;
            }
            let k = key(j);
            for a in 0..d {
                let ka = wj * f64::from(k[a]);
                for b in 0..=a {
                    g[a * d + b] += ka * f64::from(k[b]);
                }
            }
        }
        let trace: f64 = (0..d).map(|a| g[a * d + a]).sum();
        if trace <= 0.0 {
            continue;
        }
        let lambda = RIDGE * trace / d as f64;
        for a in 0..d {
            g[a * d + a] += lambda;
        }
        let l = cholesky_lower(&g, d);
        for j in 0..len {
            // ℓ = w kᵀ M⁻¹ k = w ‖L⁻¹ k‖²
            let y = forward_solve(&l, d, key(j));
            out[h * len + j] = (f64::from(w[j]) * y.iter().map(|x| x * x).sum::<f64>()) as f32;
        }
    }
    Ok(out)
}

/// Lower Cholesky factor of an SPD matrix whose lower triangle is filled (`[d, d]`).
fn cholesky_lower(m: &[f64], d: usize) -> Vec<f64> {
    let mut l = vec![0f64; d * d];
    for i in 0..d {
        for j in 0..=i {
            let s: f64 = (0..j).map(|t| l[i * d + t] * l[j * d + t]).sum();
            if i == j {
                l[i * d + i] = (m[i * d + i] - s).max(f64::MIN_POSITIVE).sqrt();
            } else {
                l[i * d + j] = (m[i * d + j] - s) / l[j * d + j];
            }
        }
    }
    l
}

fn forward_solve(l: &[f64], d: usize, b: &[f32]) -> Vec<f64> {
    let mut y = vec![0f64; d];
    for i in 0..d {
        let s: f64 = (0..i).map(|t| l[i * d + t] * y[t]).sum();
        y[i] = (f64::from(b[i]) - s) / l[i * d + i];
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leverage_by_hand() {
        // d = 2, keys e1, e1, e2 with weights 1, 1, 1: G = diag(2, 1), tr = 3, λ = 1.5,
        // M = diag(3.5, 2.5): ℓ = 1/3.5, 1/3.5, 1/2.5 — the unique direction wins, the twins
        // share theirs.
        let keys = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
        let l = ridge_leverage(&keys, &[1.0, 1.0, 1.0], 1, 3, 2).unwrap();
        let want = [1.0 / 3.5, 1.0 / 3.5, 1.0 / 2.5];
        for (a, b) in l.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{l:?}");
        }
        // weights scale importance: w = (4, 0, 1): G = diag(4, 1), λ = 2.5, M = diag(6.5, 3.5):
        // ℓ = 4/6.5, 0, 1/3.5
        let l = ridge_leverage(&keys, &[4.0, 0.0, 1.0], 1, 3, 2).unwrap();
        let want = [4.0 / 6.5, 0.0, 1.0 / 3.5];
        for (a, b) in l.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{l:?}");
        }
        // a non-axis case: k = (1, 1), (1, −1), w = 1, 1: G = 2I, λ = 2, M = 4I: ℓ = 2/4 each
        let l = ridge_leverage(&[1.0, 1.0, 1.0, -1.0], &[1.0, 1.0], 1, 2, 2).unwrap();
        assert!(l.iter().all(|&x| (x - 0.5).abs() < 1e-6), "{l:?}");
        // all-zero weights: zero leverage, no error
        assert_eq!(ridge_leverage(&keys, &[0.0; 3], 1, 3, 2).unwrap(), vec![0.0; 3]);
        assert!(ridge_leverage(&keys, &[1.0, -1.0, 0.0], 1, 3, 2).is_err());
        assert!(ridge_leverage(&keys, &[1.0; 2], 1, 3, 2).is_err());
    }

    #[test]
    fn leverage_sums_to_the_effective_dimension() {
        // Σ ℓ = tr(G (G + λI)⁻¹) = Σ_i σ_i/(σ_i + λ); for G = diag(2, 1), λ = 1.5: 2/3.5 + 1/2.5
        let keys = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
        let l = ridge_leverage(&keys, &[1.0; 3], 1, 3, 2).unwrap();
        let sum: f64 = l.iter().map(|&x| f64::from(x)).sum();
        assert!((sum - (2.0 / 3.5 + 1.0 / 2.5)).abs() < 1e-6);
    }
}
