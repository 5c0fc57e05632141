//! Allocators: how a total budget is split over layers and KV heads. They wrap any scorer:
//! each reads the per-layer statistics and the scorer's scores, and returns per-(layer, KV
//! head) budgets that the shared [`crate::select`] turns into kept positions.

use std::fmt::Debug;

use crate::budget::ResolvedBudget;
use crate::error::{PolicyError, Result};
use crate::select::{Protect, select_heads};
use crate::stats::{Scores, WindowStats};

pub mod adakv;
pub mod cake;
pub mod global;
pub mod pyramid;
pub mod uniform;

pub use adakv::{AdaKv, AdaMode};
pub use cake::{Cake, CakeCascade, adjust_budgets};
pub use global::Global;
pub use pyramid::PyramidKv;
pub use uniform::Uniform;

/// One layer as an allocator sees it.
#[derive(Debug, Clone, Copy)]
pub struct LayerScores<'a> {
    /// The layer's window statistics.
    pub stats: &'a WindowStats,
    /// The scorer's scores for the layer, `[H_kv, n]`.
    pub scores: &'a Scores,
}

/// Budgets per layer and KV head, counting protected tokens: `budgets[layer][kv_head]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// `[L][H_kv]` kept tokens.
    pub budgets: Vec<Vec<usize>>,
}

impl Allocation {
    /// Sum over all layers and heads.
    pub fn total(&self) -> usize {
        self.budgets.iter().flatten().sum()
    }

    /// The kept positions `[L][H_kv]` (sorted) under these budgets.
    pub fn select(&self, layers: &[LayerScores<'_>], protect: Protect) -> Result<Vec<Vec<Vec<u32>>>> {
        if layers.len() != self.budgets.len() {
            return Err(PolicyError::ShapeMismatch { what: "layers", expected: self.budgets.len(), got: layers.len() });
        }
        layers.iter().zip(&self.budgets).map(|(l, b)| select_heads(l.scores, b, protect)).collect()
    }
}

/// Splits a resolved budget over layers and heads.
pub trait Allocator: Debug + Send + Sync {
    /// Short name.
    fn name(&self) -> &'static str;
    /// Budgets for every layer and KV head. `budget.per_layer` counts tokens per KV head.
    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, protect: Protect) -> Result<Allocation>;
    /// CAKE's parameters when this allocator is CAKE's, whose layer-by-layer cascade
    /// ([`CakeCascade`]) the runtime runs during the prefill; `None` (the default) otherwise.
    fn cascade(&self) -> Option<Cake> {
        None
    }
}

/// Checks that all layers share one prompt length and returns it with the layer count.
pub(crate) fn common_len(layers: &[LayerScores<'_>], budget: &ResolvedBudget) -> Result<usize> {
    if layers.len() != budget.layers {
        return Err(PolicyError::ShapeMismatch {
            what: "layers in the budget",
            expected: budget.layers,
            got: layers.len(),
        });
    }
    let n = layers.first().map_or(0, |l| l.scores.len);
    for l in layers {
        if l.scores.len != n {
            return Err(PolicyError::ShapeMismatch {
                what: "prompt length across layers",
                expected: n,
                got: l.scores.len,
            });
        }
        if l.stats.len != n {
            return Err(PolicyError::ShapeMismatch { what: "statistics length", expected: n, got: l.stats.len });
        }
    }
    Ok(n)
}

/// Rounds half to even, as Python's `round` and `torch.round` do.
pub(crate) fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 { r - x.signum() } else { r }
}
