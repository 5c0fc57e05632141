//! One ranking over every layer and KV head: the budget goes to the best-scored entries wherever
//! they are, so layers and heads keep different amounts (KVzip's selection, kvpress's
//! `KVzipPress` with `layerwise=False`). `across_layers = false`, or a budget that fixes each
//! layer's size, ranks each layer's heads together instead (`layerwise=True`).
//!
//! Scores must be comparable across the ranked group (KVzip's are attention weights). Protected
//! positions are kept in every head and count against the budget; ties go to the lower layer,
//! head and position.

use crate::alloc::{Allocation, Allocator, LayerScores, common_len};
use crate::budget::ResolvedBudget;
use crate::error::{PolicyError, Result};
use crate::select::Protect;

/// Budgets from a single top-k over layers (or within each layer) and heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Global {
    across_layers: bool,
}

impl Global {
    /// One ranking over all layers when `across_layers`, else one per layer.
    pub fn new(across_layers: bool) -> Self {
        Global { across_layers }
    }
}

impl Allocator for Global {
    fn name(&self) -> &'static str {
        "global"
    }

    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, protect: Protect) -> Result<Allocation> {
        let n = common_len(layers, budget)?;
        let per = budget.per_layer.min(n);
        let protected = protect.count(n);
        let mut budgets: Vec<Vec<usize>> = layers.iter().map(|l| vec![protected; l.scores.kv_heads]).collect();
        let groups: Vec<Vec<usize>> = if self.across_layers && budget.layer_adaptive {
            vec![(0..layers.len()).collect()]
        } else {
            (0..layers.len()).map(|l| vec![l]).collect()
        };
        for group in groups {
            let heads: usize = group.iter().map(|&l| layers[l].scores.kv_heads).sum();
            let want = per * heads;
            let need = want
                .checked_sub(protected * heads)
                .ok_or(PolicyError::BudgetBelowProtected { budget: per, protected })?;
            // (layer, head, position) of every unprotected entry
            let mut entries: Vec<(usize, usize, usize)> = Vec::new();
            for &l in &group {
                for h in 0..layers[l].scores.kv_heads {
                    entries.extend((0..n).filter(|&j| !protect.contains(j, n)).map(|j| (l, h, j)));
                }
            }
            let score = |&(l, h, j): &(usize, usize, usize)| layers[l].scores.row(h)[j];
            if let Some(index) = entries.iter().position(|e| score(e).is_nan()) {
                return Err(PolicyError::NonFinite { what: "scores", index });
            }
            let better =
                |a: &(usize, usize, usize), b: &(usize, usize, usize)| score(b).total_cmp(&score(a)).then(a.cmp(b));
            if need < entries.len() && need > 0 {
                entries.select_nth_unstable_by(need - 1, better);
            }
            entries.truncate(need);
            for (l, h, _) in entries {
                budgets[l][h] += 1;
            }
        }
        Ok(Allocation { budgets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Scores, WindowStats};

    fn stats(n: usize) -> WindowStats {
        WindowStats {
            heads: 2,
            kv_heads: 2,
            len: n,
            window: 1,
            mean: vec![0.0; 2 * n],
            var: vec![0.0; 2 * n],
            last: vec![0.0; 2 * n],
            entropy: vec![0.0; 2],
            ..WindowStats::default()
        }
    }

    /// Worked by hand: 2 layers × 2 heads × 4 positions, 2 per head on average (8 entries),
    /// position 0 protected. The 4 protected entries leave 4: the best unprotected scores are
    /// 0.9 (layer 0 head 1), 0.8 and 0.7 (layer 1 head 0) and 0.6 (layer 1 head 1).
    #[test]
    fn hand_computed_global_budgets() {
        let s = stats(4);
        let a = Scores { kv_heads: 2, len: 4, data: vec![9.0, 0.1, 0.2, 0.3, 9.0, 0.9, 0.0, 0.1] };
        let b = Scores { kv_heads: 2, len: 4, data: vec![9.0, 0.8, 0.7, 0.0, 9.0, 0.0, 0.6, 0.5] };
        let layers = [LayerScores { stats: &s, scores: &a }, LayerScores { stats: &s, scores: &b }];
        let budget = ResolvedBudget { per_layer: 2, layers: 2, total: 4, layer_adaptive: true };
        let protect = Protect { sinks: 1, recent: 0 };
        let alloc = Global::new(true).allocate(&layers, &budget, protect).unwrap();
        assert_eq!(alloc.budgets, vec![vec![1, 2], vec![3, 2]]);
        assert_eq!(
            alloc.select(&layers, protect).unwrap(),
            vec![vec![vec![0], vec![0, 1]], vec![vec![0, 1, 2], vec![0, 2]]]
        );
        // per layer: layer 0 ranks 0.9 then 0.3 (head 0); layer 1 ranks 0.8 then 0.7 (head 0)
        let alloc = Global::new(false).allocate(&layers, &budget, protect).unwrap();
        assert_eq!(alloc.budgets, vec![vec![2, 2], vec![3, 1]]);
        // a flat budget fixes each layer's size: ranked per layer too
        let flat = ResolvedBudget { layer_adaptive: false, ..budget };
        assert_eq!(Global::new(true).allocate(&layers, &flat, protect).unwrap().budgets, vec![vec![2, 2], vec![3, 1]]);
        assert!(Global::new(true).allocate(&layers, &ResolvedBudget { per_layer: 0, ..budget }, protect).is_err());
    }
}
