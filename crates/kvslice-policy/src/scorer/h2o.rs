//! H2O — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
//! Language Models", NeurIPS 2023 (arXiv:2306.14048).
//!
//! Heavy hitters by accumulated attention: `s_j = Σ_{q=0}^{n−1} a_qj`, averaged over each GQA
//! group, plus a recent window of `⌊recent_share · budget⌋` tokens (the paper splits the cache
//! half/half: `recent_share = 0.5`). [`H2o::kvpress`] is kvpress's `ObservedAttentionPress`:
//! the sum divided by the number of queries that see `j` (`n − j`), no recent window.

use crate::error::Result;
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores, reduce_groups};

/// Accumulated-attention heavy hitters.
#[derive(Debug, Clone, PartialEq)]
pub struct H2o {
    recent_share: f32,
    normalize: bool,
}

impl Default for H2o {
    fn default() -> Self {
        H2o { recent_share: 0.5, normalize: false }
    }
}

impl H2o {
    /// `recent_share ∈ [0, 1)` of the budget goes to the most recent tokens; `normalize` divides
    /// each column sum by the number of queries that attend to it.
    pub fn new(recent_share: f32, normalize: bool) -> Result<Self> {
        if !(0.0..1.0).contains(&recent_share) {
            return Err(param("h2o", "recent_share", format!("must lie in [0, 1), got {recent_share}")));
        }
        Ok(H2o { recent_share, normalize })
    }

    /// kvpress's `ObservedAttentionPress`: normalised sums, no recent window.
    pub fn kvpress() -> Self {
        H2o { recent_share: 0.0, normalize: true }
    }
}

impl Scorer for H2o {
    fn name(&self) -> &'static str {
        "h2o"
    }

    fn needs(&self) -> Needs {
        Needs { accumulated: true, ..Needs::default() }
    }

    fn protect(&self, budget: usize) -> Protect {
        Protect { sinks: 0, recent: (f64::from(self.recent_share) * budget as f64).floor() as usize }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let acc = input.optional("h2o", "window statistic `accumulated`", &s.accumulated)?;
        let n = s.len;
        let table: Vec<f32> = if self.normalize {
            acc.iter().enumerate().map(|(i, &a)| (f64::from(a) / (n - i % n) as f64) as f32).collect()
        } else {
            acc.to_vec()
        };
        reduce_groups(&table, s.heads, s.kv_heads, n, GroupReduce::Mean)
    }
}
