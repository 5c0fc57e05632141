//! KVzip (Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
//! 2025, arXiv:2505.23416); kvpress's `KVzipPress`.
//!
//! Query-agnostic: after the prefill the model is asked to repeat the context ("Repeat the
//! previous context exactly.", then the context again, chunk by chunk), and a context key is
//! worth the most attention any reconstruction query of its KV head's group gives it, each
//! query's softmax over the sinks, the chunk being repeated and the repetition so far
//! ([`WindowStats::reconstruction`], computed by [`crate::reference::reconstruction_scores`]).
//! The first `sinks` keys are kept (kvpress gives them the table's maximum + 1). The weights
//! are comparable across layers and heads, so the budget is spent by one ranking of every
//! entry ([`crate::alloc::Global`], kvpress's default), or of each layer's heads
//! (`layerwise`).

use crate::error::{PolicyError, Result};
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// kvpress's `n_sink`.
pub const SINKS: usize = 4;

/// Context-reconstruction attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kvzip {
    sinks: usize,
}

impl Default for Kvzip {
    fn default() -> Self {
        Kvzip { sinks: SINKS }
    }
}

impl Kvzip {
    /// Keeps the first `sinks` keys.
    pub fn new(sinks: usize) -> Self {
        Kvzip { sinks }
    }
}

impl Scorer for Kvzip {
    fn name(&self) -> &'static str {
        "kvzip"
    }

    fn needs(&self) -> Needs {
        Needs { reconstruction: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: 0 }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let table = s
            .reconstruction
            .as_ref()
            .ok_or(PolicyError::MissingInput { method: "kvzip", input: "window statistic `reconstruction`" })?;
        let n = s.len;
        let top = table.iter().copied().fold(0.0f32, f32::max);
        let mut data = table.clone();
        for h in 0..s.kv_heads {
            data[h * n..h * n + self.sinks.min(n)].fill(top + 1.0);
        }
        Ok(Scores { kv_heads: s.kv_heads, len: n, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{Dims, reconstruction_scores};
    use crate::stats::WindowStats;

    /// Worked by hand: one head, d = 1, context keys 1, 2, 0, 3 and one reconstruction token
    /// (key 0) whose query is ln 2 (so with 1/√1 the weights are ∝ 2^k). Range 2..4 with 1 sink:
    /// the softmax runs over keys 0 (sink), 2, 3 and the repetition's own key: 2^1, 2^0, 2^3, 2^0
    /// → 2/12, 1/12, 8/12, 1/12; keys 2 and 3 score 1/12 and 8/12.
    #[test]
    fn hand_computed_reconstruction() {
        let dims = Dims { heads: 1, kv_heads: 1, len: 5, head_dim: 1 };
        let k = [1.0, 2.0, 0.0, 3.0, 0.0];
        let q = [std::f32::consts::LN_2];
        let got = reconstruction_scores(dims, &q, &k, 1, 1, 2..4).unwrap();
        assert!((got[0] - 1.0 / 12.0).abs() < 1e-6 && (got[1] - 8.0 / 12.0).abs() < 1e-6, "{got:?}");
        // the first chunk has no sink before it: keys 0 and 1 over themselves and the repetition
        let got = reconstruction_scores(dims, &q, &k, 1, 4, 0..2).unwrap();
        assert!((got[0] - 2.0 / 7.0).abs() < 1e-6 && (got[1] - 4.0 / 7.0).abs() < 1e-6, "{got:?}");
        assert!(reconstruction_scores(dims, &q, &k, 1, 1, 2..5).is_err(), "the range reaches the repetition");
    }

    #[test]
    fn sinks_outrank_everything_and_the_table_is_required() {
        let n = 5;
        let mut stats = WindowStats {
            heads: 2,
            kv_heads: 1,
            len: n,
            window: 1,
            mean: vec![0.0; 2 * n],
            var: vec![0.0; 2 * n],
            last: vec![0.0; 2 * n],
            entropy: vec![0.0; 2],
            ..WindowStats::default()
        };
        assert!(matches!(Kvzip::default().score(&ScoreInput::new(&stats, 2)), Err(PolicyError::MissingInput { .. })));
        stats.reconstruction = Some(vec![0.0, 0.5, 0.25, 0.75, 0.1]);
        let got = Kvzip::new(1).score(&ScoreInput::new(&stats, 2)).unwrap();
        assert_eq!(got.data, vec![1.75, 0.5, 0.25, 0.75, 0.1]);
        stats.reconstruction = Some(vec![0.0; 3]);
        assert!(Kvzip::new(1).score(&ScoreInput::new(&stats, 2)).is_err(), "a table of the wrong shape");
    }
}
