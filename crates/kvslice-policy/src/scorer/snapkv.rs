//! SnapKV — Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024
//! (arXiv:2404.14469).
//!
//! `s_j = pool( mean_{q ∈ window} a_qj )` over the prefix `j < n−w`, pooled per query head and
//! averaged over each GQA group; the `w` window positions are always kept.
//!
//! Defaults follow kvpress (`SnapKVPress`: w = 64, average pooling of 5);
//! [`SnapKv::original`] is the paper's code (w = 32, max pooling of 7; its sum over the window
//! ranks like the mean).

use crate::error::Result;
use crate::pool::Pooling;
use crate::scorer::{Scorer, check_window, param, pooled_prefix};
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores};

/// SnapKV's window-attention score.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapKv {
    window: usize,
    pooling: Pooling,
    reduce: GroupReduce,
}

impl Default for SnapKv {
    fn default() -> Self {
        SnapKv { window: 64, pooling: Pooling::Avg(5), reduce: GroupReduce::Mean }
    }
}

impl SnapKv {
    /// A SnapKV scorer over a window of `window` queries.
    pub fn new(window: usize, pooling: Pooling, reduce: GroupReduce) -> Result<Self> {
        if window == 0 {
            return Err(param("snapkv", "window", "must be at least 1"));
        }
        pooling.validate("snapkv")?;
        Ok(SnapKv { window, pooling, reduce })
    }

    /// The paper's settings: w = 32, max pooling of 7.
    pub fn original() -> Self {
        SnapKv { window: 32, pooling: Pooling::Max(7), reduce: GroupReduce::Mean }
    }

    /// The observation window.
    pub fn window(&self) -> usize {
        self.window
    }
}

impl Scorer for SnapKv {
    fn name(&self) -> &'static str {
        "snapkv"
    }

    fn needs(&self) -> Needs {
        Needs { window: self.window, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: 0, recent: self.window }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        check_window(input.stats, self.window)?;
        pooled_prefix(input.stats, &input.stats.mean, self.pooling, self.reduce)
    }
}
