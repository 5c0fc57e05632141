//! SimLayerKV (Zhang et al., "SimLayerKV: A Simple Framework for Layer-Level KV Cache
//! Reduction", 2024, arXiv:2410.13846); kvpress's `SimLayerKVPress`.
//!
//! Some layers barely look past the first few tokens and the last stretch: a layer is *lazy*
//! when its last query, averaged over the query heads, puts more than `threshold` of its
//! attention on the first `initial` keys and the `recent` keys before it,
//! `Σ_{j<initial} ā_j + Σ_{n−1−recent ≤ j < n−1} ā_j > threshold` with `ā_j = mean_h a_{n−1,j}`
//! ([`WindowStats::last`]). A lazy layer keeps only those: the first `initial` positions and the
//! last `recent − 1` (kvpress keeps `keys[:initial]` and `keys[−recent + 1:]`, its `n_last = 1`).
//! Prompts of at most `initial + recent + 1` tokens have no lazy layer (kvpress leaves them
//! uncompressed), nor has `threshold = 1`.
//!
//! kvpress keeps every entry of the other layers and has no budget. Here the budget is what all
//! layers keep together: a lazy layer keeps its window but never more than the average budget
//! (the most recent positions first, after the initial ones), and what the lazy layers leave is
//! split evenly over the others ([`SimLayerBudget`]), each at most the prompt, ranked by the
//! inner scorer ([`SimLayer`]). Under a budget of the whole prompt the kept sets are kvpress's.
//! Defaults as kvpress's, but `threshold = 0.9` (the paper's value for Llama 3; kvpress's default
//! of 1 turns the method off).

use crate::alloc::{Allocation, Allocator, LayerScores, common_len};
use crate::budget::ResolvedBudget;
use crate::error::{PolicyError, Result};
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores, WindowStats};

/// The lazy-layer test and what a lazy layer keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Laziness {
    threshold: f64,
    initial: usize,
    recent: usize,
}

impl Laziness {
    /// `threshold ∈ [0, 1]`, `recent ≥ 1`.
    pub fn new(threshold: f64, initial: usize, recent: usize) -> Result<Self> {
        if !(0.0..=1.0).contains(&threshold) {
            return Err(PolicyError::InvalidParameter {
                method: "simlayerkv",
                name: "threshold",
                reason: format!("must be in [0, 1], got {threshold}"),
            });
        }
        if recent == 0 {
            return Err(PolicyError::InvalidParameter {
                method: "simlayerkv",
                name: "recent",
                reason: "must be at least 1 (the last query's own key)".into(),
            });
        }
        Ok(Laziness { threshold, initial, recent })
    }

    /// The last query's head-averaged attention on the initial and recent keys; `None` for a
    /// prompt too short to have lazy layers.
    pub fn mass(&self, stats: &WindowStats) -> Option<f64> {
        let (h, n) = (stats.heads, stats.len);
        if n <= self.initial + self.recent + 1 || h == 0 || stats.last.len() != h * n {
            return None;
        }
        let sum: f64 = (0..h)
            .map(|head| {
                let row = &stats.last[head * n..(head + 1) * n];
                let first: f64 = row[..self.initial].iter().map(|&a| f64::from(a)).sum();
                let last: f64 = row[n - 1 - self.recent..n - 1].iter().map(|&a| f64::from(a)).sum();
                first + last
            })
            .sum();
        Some(sum / h as f64)
    }

    /// Whether the layer is lazy.
    pub fn is_lazy(&self, stats: &WindowStats) -> bool {
        self.threshold < 1.0 && self.mass(stats).is_some_and(|m| m > self.threshold)
    }

    /// How many positions a lazy layer of `n` keeps.
    pub fn window(&self, n: usize) -> usize {
        (self.initial + self.recent - 1).min(n)
    }
}

/// Scores: the inner scorer's in the other layers; in lazy layers the initial positions first,
/// then the others by recency.
#[derive(Debug)]
pub struct SimLayer {
    inner: Box<dyn Scorer>,
    lazy: Laziness,
}

impl SimLayer {
    pub fn new(inner: Box<dyn Scorer>, lazy: Laziness) -> Self {
        SimLayer { inner, lazy }
    }

    pub fn laziness(&self) -> Laziness {
        self.lazy
    }
}

impl Scorer for SimLayer {
    fn name(&self) -> &'static str {
        "simlayerkv"
    }

    fn needs(&self) -> Needs {
        let inner = self.inner.needs();
        Needs { window: inner.window.max(1), ..inner }
    }

    /// The inner scorer's, within what a lazy layer keeps: at most `initial` sinks and
    /// `recent − 1` recent positions.
    fn protect(&self, budget: usize) -> Protect {
        let p = self.inner.protect(budget);
        Protect { sinks: p.sinks.min(self.lazy.initial), recent: p.recent.min(self.lazy.recent - 1) }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        if !self.lazy.is_lazy(s) {
            return self.inner.score(input);
        }
        s.validate()?;
        let (kv, n) = (s.kv_heads, s.len);
        let row: Vec<f32> =
            (0..n).map(|j| if j < self.lazy.initial { 2.0 } else { (j + 1) as f32 / n as f32 }).collect();
        Ok(Scores { kv_heads: kv, len: n, data: row.repeat(kv) })
    }
}

/// Budgets: lazy layers their window (at most the average), the others the rest in equal shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimLayerBudget {
    lazy: Laziness,
}

impl SimLayerBudget {
    pub fn new(lazy: Laziness) -> Self {
        SimLayerBudget { lazy }
    }
}

impl Allocator for SimLayerBudget {
    fn name(&self) -> &'static str {
        "simlayerkv"
    }

    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, protect: Protect) -> Result<Allocation> {
        let n = common_len(layers, budget)?;
        let average = budget.per_layer.min(n);
        let lazy: Vec<bool> = layers.iter().map(|l| self.lazy.is_lazy(l.stats)).collect();
        let small = self.lazy.window(n).min(average).max(protect.count(n)).min(n);
        let busy = lazy.iter().filter(|&&z| !z).count();
        let mut per: Vec<usize> = lazy.iter().map(|&z| if z { small } else { average }).collect();
        if budget.layer_adaptive && busy > 0 {
            // what the lazy layers leave, in equal shares (the first layers take the remainder),
            // each layer at most the prompt
            let mut left = (average * layers.len()).saturating_sub(small * (layers.len() - busy));
            let mut open: Vec<usize> = (0..layers.len()).filter(|&l| !lazy[l]).collect();
            per.iter_mut().zip(&lazy).filter(|(_, z)| !**z).for_each(|(b, _)| *b = 0);
            while left > 0 && !open.is_empty() {
                let (share, extra) = (left / open.len(), left % open.len());
                let mut given = 0;
                for (i, &l) in open.iter().enumerate() {
                    let want = share + usize::from(i < extra);
                    let take = want.min(n - per[l]);
                    per[l] += take;
                    given += take;
                }
                left -= given;
                open.retain(|&l| per[l] < n);
                if given == 0 {
                    break;
                }
            }
        }
        Ok(Allocation { budgets: layers.iter().zip(per).map(|(l, b)| vec![b; l.scores.kv_heads]).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head, `n` keys, the last query's weights `last`.
    fn stats(last: Vec<f32>) -> WindowStats {
        let n = last.len();
        WindowStats {
            heads: 1,
            kv_heads: 1,
            len: n,
            window: 1,
            mean: last.clone(),
            var: vec![0.0; n],
            last,
            entropy: vec![0.0],
            ..WindowStats::default()
        }
    }

    /// Worked by hand: 10 keys, 2 initial, 3 recent (keys 6, 7, 8; the last query's own key 9
    /// is not counted): mass = 0.1 + 0.2 + 0.05 + 0.05 + 0.1 = 0.5.
    #[test]
    fn hand_computed_mass() {
        let s = stats(vec![0.1, 0.2, 0.0, 0.1, 0.1, 0.1, 0.05, 0.05, 0.1, 0.2]);
        let lazy = Laziness::new(0.45, 2, 3).unwrap();
        assert!((lazy.mass(&s).unwrap() - 0.5).abs() < 1e-6);
        assert!(lazy.is_lazy(&s));
        assert!(!Laziness::new(0.55, 2, 3).unwrap().is_lazy(&s));
        assert!(!Laziness::new(1.0, 2, 3).unwrap().is_lazy(&s), "threshold 1 turns it off");
        // 2 + 7 + 1 = 10 keys: too short
        assert_eq!(Laziness::new(0.0, 2, 7).unwrap().mass(&s), None);
        assert_eq!(lazy.window(10), 4);
        assert!(Laziness::new(1.5, 2, 3).is_err() && Laziness::new(0.5, 2, 0).is_err());
    }

    /// Two lazy layers of four under an average of 6 of 20: they keep their window of 4 (2
    /// initial + 2 recent), and the 4 they leave go to the busy layers, 8 each.
    #[test]
    fn lazy_layers_give_their_budget_away() {
        let n = 20;
        let mut peaked = vec![0.0f32; n];
        peaked[0] = 0.9; // on a sink: lazy
        peaked[n - 1] = 0.1;
        let flat = vec![1.0 / n as f32; n];
        let layers = [stats(peaked.clone()), stats(flat.clone()), stats(peaked), stats(flat)];
        let lazy = Laziness::new(0.5, 2, 3).unwrap();
        let scorer = SimLayer::new(Box::new(crate::scorer::Knorm), lazy);
        let scores: Vec<Scores> = layers
            .iter()
            .map(|s| {
                let keys: Vec<f32> = (0..n).map(|j| (j % 7) as f32).collect();
                let kv = crate::stats::KvView { kv_heads: 1, len: n, head_dim: 1, keys: Some(&keys), values: None };
                scorer.score(&ScoreInput { kv: Some(kv), ..ScoreInput::new(s, 6) }).unwrap()
            })
            .collect();
        let ls: Vec<LayerScores<'_>> =
            layers.iter().zip(&scores).map(|(stats, scores)| LayerScores { stats, scores }).collect();
        let budget = ResolvedBudget { per_layer: 6, layers: 4, total: 24, layer_adaptive: true };
        let protect = scorer.protect(6);
        let alloc = SimLayerBudget::new(lazy).allocate(&ls, &budget, protect).unwrap();
        assert_eq!(alloc.budgets, vec![vec![4], vec![8], vec![4], vec![8]]);
        let kept = alloc.select(&ls, protect).unwrap();
        // lazy: the 2 initial and the last 2
        assert_eq!(kept[0][0], vec![0, 1, 18, 19]);
        // busy: knorm keeps the lowest key norms (key value 0 at 0, 7, 14; then 1 at 1, 8, 15; then 2 at 2, 9)
        assert_eq!(kept[1][0], vec![0, 1, 2, 7, 8, 9, 14, 15]);
        // without layer adaptivity every layer keeps at most the average
        let fixed = ResolvedBudget { layer_adaptive: false, ..budget };
        let alloc = SimLayerBudget::new(lazy).allocate(&ls, &fixed, protect).unwrap();
        assert_eq!(alloc.budgets, vec![vec![4], vec![6], vec![4], vec![6]]);
    }
}
