//! CAKE's layer budgets — Qin et al., "CAKE: Cascading and Adaptive KV Cache Eviction with Layer
//! Preferences", ICLR 2025 (reference code: cakekv).
//!
//! Layer preference `P_l = H_l^(1/τ1) · V_l^(1/τ2)` from the window statistics: dispersion
//! `H_l` ([`WindowStats::dispersion`], the entropy of the window attention over the prefix) and
//! shift `V_l` ([`WindowStats::column_variance_sum`]). With `w` protected window tokens, the
//! prefix budget `T = (B − w)·L` is split `T·P_l/ΣP`, truncated, capped at `n − w` with the
//! excess spread over the other layers and the truncation remainder handed out from layer 0
//! ([`adjust_budgets`], a port of cakekv's function); each layer then keeps its share plus the
//! window, the same for every KV head. Defaults `τ1 = τ2 = 1` (cakekv's fallback; its tuned
//! values per model live in its `model2tau.json`).
//!
//! Cascading ([`CakeCascade`]): after layer `m` is prefilled, the budgets of layers `0..=m` are
//! recomputed from `P_0..P_m` with the same total `T`, and earlier layers are trimmed; peak memory
//! stays near `T` plus one layer. Budgets only shrink, and the indicator of a layer does not
//! change, so trimming a top-k set to a smaller top-k gives the same set as one eviction with the
//! final budgets (the paper's Theorem 1, tested).

use crate::alloc::{Allocation, Allocator, LayerScores, common_len};
use crate::budget::ResolvedBudget;
use crate::error::Result;
use crate::scorer::param;
use crate::select::Protect;
use crate::stats::WindowStats;

/// cakekv's `adjust_budgets`, ported: truncate `shares` to integers, cap each at `cap` and spread
/// the excess evenly over the layers below the cap (remainder to the first ones), then hand the
/// difference to `total` out the same way. Like the original it does not re-cap after spreading.
pub fn adjust_budgets(shares: &[f64], total: i64, cap: i64) -> Vec<i64> {
    let mut b: Vec<i64> = shares.iter().map(|&x| x.trunc() as i64).collect();
    let excess: i64 = b.iter().map(|&x| (x - cap).max(0)).sum();
    b.iter_mut().for_each(|x| *x = (*x).min(cap));
    let spread = |b: &mut Vec<i64>, amount: i64, valid: &[bool], sign: i64| {
        let nv = valid.iter().filter(|&&v| v).count() as i64;
        if nv == 0 {
            return;
        }
        let (per, mut rem) = (amount / nv, amount % nv);
        for (x, &v) in b.iter_mut().zip(valid) {
            if v {
                *x += sign * per;
                if rem > 0 {
                    *x += sign;
                    rem -= 1;
                }
            }
        }
    };
    if excess > 0 {
        let valid: Vec<bool> = b.iter().map(|&x| x < cap).collect();
        spread(&mut b, excess, &valid, 1);
    }
    let diff = total - b.iter().sum::<i64>();
    if diff > 0 {
        let valid: Vec<bool> = b.iter().map(|&x| x < cap).collect();
        spread(&mut b, diff, &valid, 1);
    } else if diff < 0 {
        let valid: Vec<bool> = b.iter().map(|&x| x > 1).collect();
        spread(&mut b, -diff, &valid, -1);
    }
    b
}

/// CAKE's preference-proportional layer budgets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cake {
    tau1: f64,
    tau2: f64,
}

impl Default for Cake {
    fn default() -> Self {
        Cake { tau1: 1.0, tau2: 1.0 }
    }
}

impl Cake {
    /// Temperatures `τ1, τ2 > 0`.
    pub fn new(tau1: f64, tau2: f64) -> Result<Self> {
        for (name, t) in [("tau1", tau1), ("tau2", tau2)] {
            if !(t.is_finite() && t > 0.0) {
                return Err(param("cake", name, format!("must be positive, got {t}")));
            }
        }
        Ok(Cake { tau1, tau2 })
    }

    /// `P_l = H_l^(1/τ1) · V_l^(1/τ2)`.
    pub fn preference(&self, stats: &WindowStats) -> f64 {
        stats.dispersion().powf(1.0 / self.tau1) * stats.column_variance_sum().powf(1.0 / self.tau2)
    }

    /// Prefix budgets (window excluded) for layers with preferences `prefs`, prefix total `total`
    /// and cap `cap = n − w`: [`adjust_budgets`], then each capped at `cap` and any shortfall the
    /// cap causes given to the layers below it in order (a repair the original lacks: it only
    /// matters where cakekv would hand a layer more than it has). Sums to `min(total, L·cap)`.
    pub fn prefix_budgets(&self, prefs: &[f64], total: usize, cap: usize) -> Vec<usize> {
        self.prefix_budgets_within(prefs, total, cap, &vec![cap; prefs.len()])
    }

    /// [`Cake::prefix_budgets`] with a cap per layer (`caps[l] ≤ cap`), which the cascade uses
    /// to keep budgets from growing between stages; sums to `min(total, Σ caps)`.
    pub fn prefix_budgets_within(&self, prefs: &[f64], total: usize, cap: usize, caps: &[usize]) -> Vec<usize> {
        let l = prefs.len();
        let sum: f64 = prefs.iter().sum();
        let shares: Vec<f64> = if sum > 0.0 && sum.is_finite() && prefs.iter().all(|p| p.is_finite() && *p >= 0.0) {
            prefs.iter().map(|p| p / sum * total as f64).collect()
        } else {
            vec![total as f64 / l as f64; l]
        };
        let mut b: Vec<usize> = adjust_budgets(&shares, total as i64, cap as i64)
            .into_iter()
            .zip(caps)
            .map(|(x, &c)| x.clamp(0, c as i64) as usize)
            .collect();
        let target = total.min(caps.iter().sum());
        let mut short = target.saturating_sub(b.iter().sum());
        while short > 0 {
            let mut moved = false;
            for (x, &c) in b.iter_mut().zip(caps) {
                if short > 0 && *x < c {
                    *x += 1;
                    short -= 1;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        b
    }
}

impl Allocator for Cake {
    fn name(&self) -> &'static str {
        "cake"
    }

    fn cascade(&self) -> Option<Cake> {
        Some(*self)
    }

    fn allocate(&self, layers: &[LayerScores<'_>], budget: &ResolvedBudget, protect: Protect) -> Result<Allocation> {
        let n = common_len(layers, budget)?;
        let w = protect.count(n);
        let per_layer = budget.per_layer.min(n);
        let budgets = if budget.layer_adaptive {
            let prefs: Vec<f64> = layers.iter().map(|l| self.preference(l.stats)).collect();
            let total = (per_layer - w.min(per_layer)) * layers.len();
            self.prefix_budgets(&prefs, total, n - w).into_iter().map(|b| b + w).collect()
        } else {
            vec![per_layer; layers.len()]
        };
        Ok(Allocation { budgets: layers.iter().zip(budgets).map(|(l, b)| vec![b; l.scores.kv_heads]).collect() })
    }
}

/// CAKE's cascading budgets, stage by stage, as the runtime calls them during prefill.
#[derive(Debug, Clone, PartialEq)]
pub struct CakeCascade {
    cake: Cake,
    layers: usize,
    len: usize,
    window: usize,
    total: usize,
    prefs: Vec<f64>,
    budgets: Vec<usize>,
}

impl CakeCascade {
    /// A cascade for `layers` layers of a `len`-token prompt, average budget `per_layer`
    /// (window included) and `window` protected tokens.
    pub fn new(cake: Cake, layers: usize, len: usize, per_layer: usize, window: usize) -> Result<Self> {
        let per_layer = per_layer.min(len);
        let window = window.min(len);
        if per_layer < window {
            return Err(crate::error::PolicyError::BudgetBelowProtected { budget: per_layer, protected: window });
        }
        Ok(CakeCascade {
            cake,
            layers,
            len,
            window,
            total: (per_layer - window) * layers,
            prefs: Vec::new(),
            budgets: Vec::new(),
        })
    }

    /// Adds the next layer's statistics and returns the kept-token budgets (window included) of
    /// layers `0..=m`. A layer's budget never grows from one stage to the next: the proportional
    /// shares shrink as layers arrive, and where integer rounding would hand a layer one token
    /// more than it kept at the previous stage, that token goes to the layers that still have
    /// room, so the stage still spends the whole total (cakekv instead loses it).
    pub fn push(&mut self, stats: &WindowStats) -> &[usize] {
        self.push_preference(self.cake.preference(stats))
    }

    /// Same as [`CakeCascade::push`] with the preference already computed.
    pub fn push_preference(&mut self, pref: f64) -> &[usize] {
        self.prefs.push(pref);
        let w = self.window;
        let cap = self.len - w;
        // earlier layers may not grow back: their current budget caps them
        let caps: Vec<usize> = self.budgets.iter().map(|b| b - w).chain(std::iter::once(cap)).collect();
        let stage = self.cake.prefix_budgets_within(&self.prefs, self.total, cap, &caps);
        self.budgets = stage.into_iter().map(|b| b + w).collect();
        &self.budgets
    }

    /// Layers pushed so far.
    pub fn stages(&self) -> usize {
        self.prefs.len()
    }

    /// Whether every layer has been pushed.
    pub fn done(&self) -> bool {
        self.prefs.len() == self.layers
    }
}
