//! TOVA — Oren et al., "Transformers are Multi-State RNNs", 2024 (arXiv:2401.06104).
//!
//! `s_j = mean_{h ∈ all query heads} a^h_{n−1, j}`: the last query's attention averaged over
//! *all* heads of the layer (not per group), the same score for every KV head; the last token is
//! kept (as kvpress's `TOVAPress` does).

use crate::error::Result;
use crate::scorer::{Scorer, check_window};
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// The last query's head-averaged attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tova;

impl Scorer for Tova {
    fn name(&self) -> &'static str {
        "tova"
    }

    fn needs(&self) -> Needs {
        Needs { window: 1, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: 0, recent: 1 }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        check_window(s, 1)?;
        let n = s.len;
        let row: Vec<f32> = (0..n)
            .map(|j| ((0..s.heads).map(|h| f64::from(s.last[h * n + j])).sum::<f64>() / s.heads as f64) as f32)
            .collect();
        let mut out = Scores::zeros(s.kv_heads, n);
        for kh in 0..s.kv_heads {
            out.row_mut(kh).copy_from_slice(&row);
        }
        Ok(out)
    }
}
