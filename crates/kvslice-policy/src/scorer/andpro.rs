//! AnDPro — Geng et al., "Accurate KV Cache Eviction via Anchor Direction Projection for
//! Efficient LLM Inference", NeurIPS 2025.
//!
//! The anchor direction of query `q` is its pre-eviction output `o_q = Σ_j a_qj v_j`; a token is
//! worth what it contributes along it:
//! `s_j = pool( mean_{q ∈ window} a_qj · ⟨v_j, o_q / ‖o_q‖⟩ )` over the prefix, averaged over each
//! GQA group; the window is kept. Scores may be negative (a value pointing against the output).
//! Window and pooling follow the SnapKV pipeline the method is evaluated in (w = 32, average
//! pooling of 5); the paper publishes no reference code.

use crate::error::Result;
use crate::pool::Pooling;
use crate::scorer::{Scorer, check_window, param, pooled_prefix};
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores};

/// Projection of values onto the anchor direction.
#[derive(Debug, Clone, PartialEq)]
pub struct AnDPro {
    window: usize,
    pooling: Pooling,
}

impl Default for AnDPro {
    fn default() -> Self {
        AnDPro { window: 32, pooling: Pooling::Avg(5) }
    }
}

impl AnDPro {
    /// An AnDPro scorer.
    pub fn new(window: usize, pooling: Pooling) -> Result<Self> {
        if window == 0 {
            return Err(param("andpro", "window", "must be at least 1"));
        }
        pooling.validate("andpro")?;
        Ok(AnDPro { window, pooling })
    }
}

impl Scorer for AnDPro {
    fn name(&self) -> &'static str {
        "andpro"
    }

    fn needs(&self) -> Needs {
        Needs { window: self.window, projection: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: 0, recent: self.window }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        check_window(s, self.window)?;
        let table = input.optional("andpro", "window statistic `projection`", &s.projection)?;
        pooled_prefix(s, table, self.pooling, GroupReduce::Mean)
    }
}
