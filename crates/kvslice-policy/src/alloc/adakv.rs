//! Ada-KV — Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation
//! for Efficient LLM Inference", 2024 (arXiv:2407.11550; reference code FFY0/AdaKV).
//!
//! Within a layer of `H_kv` KV heads, each keeping `B` tokens of which `p` are protected, the
//! `H_kv·(B − p)` free slots go where the scores are highest across *all* heads: with `c_h` the
//! number of head `h`'s candidates in the layer-wide top-`H_kv·(B − p)`, the head keeps
//! `B_h = (1 − α)·c_h + α·(B − p)` of them (a floor of `α` of the base budget for every head),
//! `α = 0.2`. Scores are per KV head (GQA groups already reduced by the scorer).
//!
//! Rounding, [`AdaMode`]: `ExactSum` (default) rounds by largest remainder so the heads sum to
//! exactly `H_kv·B`; `Original` is the reference code's `round(c_h(1−α) + ⌊α(B−p)⌋)`, which can
//! miss the sum by a few tokens; `Kvpress` is kvpress's `AdaKVPress`: every head keeps its best
//! `⌊α·B⌋` (at least 1) tokens, the rest of `H_kv·B` goes to the best remaining scores of the layer.
//! The layer budgets come from a wrapped allocator (uniform by default).

use crate::alloc::{Allocation, Allocator, LayerScores, Uniform, round_half_even};
use crate::budget::ResolvedBudget;
use crate::error::Result;
use crate::scorer::param;
use crate::select::{Protect, ranked};
use crate::stats::Scores;

/// How Ada-KV turns counts into per-head budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AdaMode {
    /// Largest-remainder rounding; budgets sum exactly.
    #[default]
    ExactSum,
    /// FFY0/AdaKV's rounding.
    Original,
    /// kvpress's safeguard-then-global-top-k variant.
    Kvpress,
}

/// Adaptive per-head budgets.
#[derive(Debug)]
pub struct AdaKv {
    alpha: f64,
    mode: AdaMode,
    layers: Box<dyn Allocator>,
}

impl Default for AdaKv {
    fn default() -> Self {
        AdaKv { alpha: 0.2, mode: AdaMode::ExactSum, layers: Box::new(Uniform) }
    }
}

impl AdaKv {
    /// `alpha ∈ [0, 1]` of each head's base budget is guaranteed; `layers` splits the budget over
    /// layers first.
    pub fn new(alpha: f64, mode: AdaMode, layers: Box<dyn Allocator>) -> Result<Self> {
        if !(0.0..=1.0).contains(&alpha) {
            return Err(param("adakv", "alpha", format!("must lie in [0, 1], got {alpha}")));
        }
        Ok(AdaKv { alpha, mode, layers })
    }

    /// Per-head budgets of one layer whose heads would each keep `per_head` (protected included).
    pub fn head_budgets(&self, scores: &Scores, per_head: usize, protect: Protect) -> Vec<usize> {
        let (heads, n) = (scores.kv_heads, scores.len);
        let p = protect.count(n);
        let per_head = per_head.min(n);
        if per_head >= n || per_head <= p {
            return vec![per_head; heads];
        }
        let cand = n - p;
        let base = per_head - p;
        // layer-wide ranking of candidates, ties to the lower head, then the lower position
        let flat: Vec<f32> = scores.data.clone();
        let is_cand = |i: usize| !protect.contains(i % n, n);
        match self.mode {
            AdaMode::ExactSum | AdaMode::Original => {
                let top = ranked(&flat, (0..heads * n).filter(|&i| is_cand(i)));
                let mut counts = vec![0usize; heads];
                for &i in top.iter().take(heads * base) {
                    counts[i as usize / n] += 1;
                }
                let extra: Vec<usize> = if self.mode == AdaMode::Original {
                    let floor = (base as f64 * self.alpha).floor();
                    counts.iter().map(|&c| round_half_even(c as f64 * (1.0 - self.alpha) + floor) as usize).collect()
                } else {
                    largest_remainder(&counts, base, self.alpha)
                };
                extra.into_iter().map(|e| e.min(cand) + p).collect()
            }
            AdaMode::Kvpress => {
                let mut safe = (per_head as f64 * self.alpha).floor() as usize;
                if self.alpha > 0.0 {
                    safe = safe.max(1);
                }
                let safe_free = safe.saturating_sub(p).min(cand);
                let mut kept = vec![p + safe_free; heads];
                let mut taken = vec![false; heads * n];
                for h in 0..heads {
                    let best = ranked(scores.row(h), (0..n).filter(|&j| !protect.contains(j, n)));
                    for &j in best.iter().take(safe_free) {
                        taken[h * n + j as usize] = true;
                    }
                }
                let remaining = heads * per_head - kept.iter().sum::<usize>();
                let rest = ranked(&flat, (0..heads * n).filter(|&i| is_cand(i) && !taken[i]));
                for &i in rest.iter().take(remaining) {
                    kept[i as usize / n] += 1;
                }
                kept
            }
        }
    }
}

/// `B_h = (1−α)·c_h + α·base` rounded by largest remainder to sum to `heads·base`.
fn largest_remainder(counts: &[usize], base: usize, alpha: f64) -> Vec<usize> {
    let raw: Vec<f64> = counts.iter().map(|&c| (1.0 - alpha) * c as f64 + alpha * base as f64).collect();
    let mut out: Vec<usize> = raw.iter().map(|r| (r + 1e-9).floor() as usize).collect();
    let target = counts.len() * base;
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by(|&a, &b| {
        let fa = raw[a] - out[a] as f64;
        let fb = raw[b] - out[b] as f64;
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let mut short = target.saturating_sub(out.iter().sum());
    for &h in order.iter().cycle().take(counts.len() * 2) {
        if short == 0 {
            break;
        }
        out[h] += 1;
        short -= 1;
    }
    out
}

impl Allocator for AdaKv {
    fn name(&self) -> &'static str {
        "adakv"
    }

    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, protect: Protect) -> Result<Allocation> {
        let outer = self.layers.allocate(layers, budget, protect)?;
        let budgets = layers
            .iter()
            .zip(&outer.budgets)
            .map(|(l, b)| {
                let per_head = b.iter().sum::<usize>() / b.len().max(1);
                self.head_budgets(l.scores, per_head, protect)
            })
            .collect();
        Ok(Allocation { budgets })
    }
}
