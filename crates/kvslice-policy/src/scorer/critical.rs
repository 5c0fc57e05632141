//! CriticalKV-style value-norm weighting — Feng et al., "Identify Critical KV Cache in LLM
//! Inference from an Output Perturbation Perspective", 2025 (arXiv:2502.03805); kvpress's
//! `CriticalKVPress`.
//!
//! Wraps any scorer `s`. With a per-head budget `B`:
//! 1. stage one keeps `B₁ = ⌊B · first_stage_ratio⌋` (at least 1) tokens by `s` alone — the
//!    inner scorer's protected positions first, then its best scores;
//! 2. every other token is ranked by `(s_j + ε) · mean_{h in group} ‖v_j W_o^h‖₁`, the L1 norm
//!    of the value after the head's slice of the output projection.
//!
//! Stage-one tokens get `+∞` so that the shared selection keeps them first. Defaults from
//! kvpress: `ε = 1e−4`, `first_stage_ratio = 0.5`. Deliberate difference: when `B₁` is smaller
//! than the inner scorer's protected set, all protected tokens stay kept (kvpress breaks the tie
//! among them arbitrarily and may drop some).

use crate::error::{PolicyError, Result};
use crate::scorer::{Scorer, param};
use crate::select::{Protect, ranked};
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores, reduce_groups};

/// Two-stage selection with output-projected value norms.
#[derive(Debug)]
pub struct CriticalKv {
    inner: Box<dyn Scorer>,
    epsilon: f32,
    first_stage_ratio: f32,
}

impl CriticalKv {
    /// Wraps `inner` with kvpress's defaults.
    pub fn new(inner: Box<dyn Scorer>) -> Self {
        CriticalKv { inner, epsilon: 1e-4, first_stage_ratio: 0.5 }
    }

    /// All parameters.
    pub fn with(inner: Box<dyn Scorer>, epsilon: f32, first_stage_ratio: f32) -> Result<Self> {
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(param("critical", "epsilon", format!("must be finite and non-negative, got {epsilon}")));
        }
        if !(0.0..=1.0).contains(&first_stage_ratio) {
            return Err(param("critical", "first_stage_ratio", format!("must lie in [0, 1], got {first_stage_ratio}")));
        }
        Ok(CriticalKv { inner, epsilon, first_stage_ratio })
    }

    /// Stage-one size for a budget.
    pub fn first_stage_budget(&self, budget: usize) -> usize {
        let b = (budget as f64 * f64::from(self.first_stage_ratio)).floor() as usize;
        if self.first_stage_ratio > 0.0 && budget > 0 { b.max(1) } else { b }
    }
}

impl Scorer for CriticalKv {
    fn name(&self) -> &'static str {
        "critical"
    }

    fn needs(&self) -> Needs {
        self.inner.needs().union(Needs { value_proj_l1: true, ..Needs::default() })
    }

    fn protect(&self, budget: usize) -> Protect {
        self.inner.protect(budget)
    }

    fn counter_causal_layers(&self, layers: usize) -> Vec<usize> {
        self.inner.counter_causal_layers(layers)
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        let base = self.inner.score(input)?;
        let proj = input
            .value_proj_l1
            .ok_or(PolicyError::MissingInput {
                method: "critical", input: "value_proj_l1 (‖v·W_o‖₁ per head)"
            })?;
        let proj = reduce_groups(proj, s.heads, s.kv_heads, s.len, GroupReduce::Mean)?;
        let n = base.len;
        let protect = self.inner.protect(input.budget);
        let b1 = self.first_stage_budget(input.budget);
        let eps = f64::from(self.epsilon);
        let mut out = Scores::zeros(base.kv_heads, n);
        for h in 0..base.kv_heads {
            let row = base.row(h);
            let first = ranked(row, (0..n).filter(|&j| !protect.contains(j, n)));
            let free = b1.saturating_sub(protect.count(n));
            let o = out.row_mut(h);
            for j in 0..n {
                o[j] = ((f64::from(row[j]) + eps) * f64::from(proj.row(h)[j])) as f32;
                if protect.contains(j, n) {
                    o[j] = f32::INFINITY;
                }
            }
            for &j in first.iter().take(free) {
                o[j as usize] = f32::INFINITY;
            }
        }
        Ok(out)
    }
}
