//! The uniform split: every layer and KV head keeps `budget.per_layer` tokens.

use crate::alloc::{Allocation, Allocator, LayerScores, common_len};
use crate::budget::ResolvedBudget;
use crate::error::Result;
use crate::select::Protect;

/// Same budget everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Uniform;

impl Allocator for Uniform {
    fn name(&self) -> &'static str {
        "uniform"
    }

    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, _protect: Protect) -> Result<Allocation> {
        let n = common_len(layers, budget)?;
        let b = budget.per_layer.min(n);
        Ok(Allocation { budgets: layers.iter().map(|l| vec![b; l.scores.kv_heads]).collect() })
    }
}
