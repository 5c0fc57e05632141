//! PyramidKV — Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
//! Information Funneling", 2024 (arXiv:2406.02069).
//!
//! Lower layers keep more. With an average budget `B` per layer, protected window `w`, prompt
//! `n` and `L` layers, kvpress's `PyramidKVPress.get_layer_budget` (which always honours the
//! average, unlike KVCache-Factory's integer version):
//! `min = B/β`, `max = 2B − min`; if `max ≥ n − w` then `max = n − w`, `min = 2B − max`;
//! if not `n ≥ max ≥ min ≥ w` every layer keeps `B`; otherwise layer `l` keeps
//! `round(max − l·(max − min)/(L − 1))` (round half to even). Default `β = 20`.
//! The rounded budgets sum to `L·B` within `L/2`.

use crate::alloc::{Allocation, Allocator, LayerScores, common_len, round_half_even};
use crate::budget::ResolvedBudget;
use crate::error::Result;
use crate::scorer::param;
use crate::select::Protect;

/// Linearly decreasing layer budgets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PyramidKv {
    beta: f64,
}

impl Default for PyramidKv {
    fn default() -> Self {
        PyramidKv { beta: 20.0 }
    }
}

impl PyramidKv {
    /// A pyramid of steepness `beta ≥ 1`.
    pub fn new(beta: f64) -> Result<Self> {
        if !(beta.is_finite() && beta >= 1.0) {
            return Err(param("pyramidkv", "beta", format!("must be at least 1, got {beta}")));
        }
        Ok(PyramidKv { beta })
    }

    /// The per-layer budgets for `layers` layers, prompt `len`, average `per_layer`, window `window`.
    pub fn layer_budgets(&self, layers: usize, len: usize, per_layer: usize, window: usize) -> Vec<usize> {
        let b = per_layer as f64;
        let (n, w) = (len as f64, window as f64);
        let mut min = b / self.beta;
        let mut max = 2.0 * b - min;
        if max >= n - w {
            max = n - w;
            min = 2.0 * b - max;
        }
        if !(n >= max && max >= min && min >= w) {
            return vec![per_layer.max(1).min(len); layers];
        }
        let steps = if layers > 1 { (max - min) / (layers - 1) as f64 } else { 0.0 };
        (0..layers).map(|l| (round_half_even(max - l as f64 * steps) as usize).min(len)).collect()
    }
}

impl Allocator for PyramidKv {
    fn name(&self) -> &'static str {
        "pyramidkv"
    }

    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, protect: Protect) -> Result<Allocation> {
        let n = common_len(layers, budget)?;
        let per = if budget.layer_adaptive {
            self.layer_budgets(layers.len(), n, budget.per_layer, protect.count(n))
        } else {
            vec![budget.per_layer.min(n); layers.len()]
        };
        Ok(Allocation { budgets: layers.iter().zip(per).map(|(l, b)| vec![b; l.scores.kv_heads]).collect() })
    }
}
