//! CAKE's eviction indicator — Qin et al., "CAKE: Cascading and Adaptive KV Cache Eviction with
//! Layer Preferences", ICLR 2025.
//!
//! `s_j = pool( mean_q a_qj + γ · var_q a_qj )` over the prefix `j < n−w` (variance unbiased, as
//! `torch.var`), average pooling of 5, averaged over each GQA group; the window is kept.
//! Defaults from cakekv: γ = 200, w = 32. The layer budgets are [`crate::alloc::Cake`]'s job.

use crate::error::Result;
use crate::pool::Pooling;
use crate::scorer::{Scorer, check_window, param, pooled_prefix};
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores};

/// Mean plus γ times variance of the window attention.
#[derive(Debug, Clone, PartialEq)]
pub struct CakeIndicator {
    window: usize,
    gamma: f32,
    pooling: Pooling,
}

impl Default for CakeIndicator {
    /// The defaults of the registry's `cake` options (γ = 200, w = 32, average pooling of 5),
    /// the one place these numbers are written.
    fn default() -> Self {
        crate::registry::default_cake_indicator()
    }
}

impl CakeIndicator {
    /// An indicator with weight `gamma ≥ 0` on the variance.
    pub fn new(window: usize, gamma: f32, pooling: Pooling) -> Result<Self> {
        if window < 2 {
            return Err(param("cake", "window", "must be at least 2 (the variance needs two queries)"));
        }
        if !(gamma.is_finite() && gamma >= 0.0) {
            return Err(param("cake", "gamma", format!("must be finite and non-negative, got {gamma}")));
        }
        pooling.validate("cake")?;
        Ok(CakeIndicator { window, gamma, pooling })
    }

    /// The observation window.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The weight γ of the variance.
    pub fn gamma(&self) -> f32 {
        self.gamma
    }
}

impl Scorer for CakeIndicator {
    fn name(&self) -> &'static str {
        "cake"
    }

    fn needs(&self) -> Needs {
        Needs { window: self.window, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: 0, recent: self.window }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        check_window(s, self.window)?;
        let g = f64::from(self.gamma);
        let table: Vec<f32> =
            s.mean.iter().zip(&s.var).map(|(&m, &v)| (f64::from(m) + g * f64::from(v)) as f32).collect();
        pooled_prefix(s, &table, self.pooling, GroupReduce::Mean)
    }
}
