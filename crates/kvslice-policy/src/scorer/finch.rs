//! Finch — Corallo & Papotti, "FINCH: Prompt-guided Key-Value Cache Compression for Large
//! Language Models", TACL 2024 (doi:10.1162/tacl_a_00716); kvpress's `FinchPress`.
//!
//! SnapKV's window attention with the question as the window, each window row normalised by
//! its count of non-masked weights before the rows are averaged: query `i` of the window sits
//! at position `p_i = n − w + i` and its weights are multiplied by `p_i` (kvpress's
//! `non_zero_counts = arange(n − w, n)`), so `s_j = mean_i p_i a_ij`
//! ([`WindowStats::position_weighted`]), averaged over each GQA group, over the prefix
//! `j < n − w`; the window (the question) is always kept. No pooling.
//!
//! Finch then renumbers what it keeps: the kept keys are rotated to consecutive positions
//! ([`Scorer::rerotates_keys`], kvpress's `rerotate_keys=True`), so the cache reads as a short
//! prompt and the next token follows it directly. The window is the question's length; kvpress
//! finds it from a delimiter token between the context and the question, kvslice takes it as
//! the `window` option.
//!
//! Not ported: kvpress's optional `chunk_length` (top-k within each chunk of the prompt rather
//! than over the whole of it; off by default there).

use crate::error::{PolicyError, Result};
use crate::pool::Pooling;
use crate::scorer::{Scorer, check_window, param, pooled_prefix};
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores};

/// Finch's normalised window attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finch {
    window: usize,
    normalize: bool,
    rerotate: bool,
}

impl Finch {
    /// Finch over a window (question) of `window` tokens; `normalize`: weight each row by its
    /// position (kvpress's `normalize_scores`); `rerotate`: renumber the kept keys.
    pub fn new(window: usize, normalize: bool, rerotate: bool) -> Result<Self> {
        if window == 0 {
            return Err(param("finch", "window", "must be at least 1"));
        }
        Ok(Finch { window, normalize, rerotate })
    }
}

impl Scorer for Finch {
    fn name(&self) -> &'static str {
        "finch"
    }

    fn needs(&self) -> Needs {
        Needs { window: self.window, position_weighted: self.normalize, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: 0, recent: self.window }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        check_window(s, self.window)?;
        let table = if self.normalize {
            s.position_weighted
                .as_deref()
                .ok_or(PolicyError::MissingInput { method: "finch", input: "window statistic `position_weighted`" })?
        } else {
            &s.mean
        };
        pooled_prefix(s, table, Pooling::None, GroupReduce::Mean)
    }

    fn rerotates_keys(&self) -> bool {
        self.rerotate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{Dims, window_stats};
    use crate::select::{Protect, select_top_k};

    /// Worked by hand: one head, n = 4, window 2, d = 1, every key 0, so each causal row spreads
    /// its weight evenly over the keys it sees: the row at p = 2 gives 1/3 to keys 0, 1, 2, the
    /// row at p = 3 gives 1/4 to keys 0..3. On the prefix keys 0 and 1 the plain mean is
    /// (1/3 + 1/4)/2 = 7/24, the position-weighted one (2·1/3 + 3·1/4)/2 = 17/24.
    #[test]
    fn rows_are_weighted_by_their_position() {
        let dims = Dims { heads: 1, kv_heads: 1, len: 4, head_dim: 1 };
        let s = window_stats(dims, &[1.0; 4], &[0.0; 4], &[1.0; 4], 2).unwrap();
        let pw = s.position_weighted.as_ref().unwrap();
        for j in 0..2 {
            assert!((pw[j] - 17.0 / 24.0).abs() < 1e-6, "{pw:?}");
            assert!((s.mean[j] - 7.0 / 24.0).abs() < 1e-6);
        }
        let input = ScoreInput::new(&s, 3);
        let scores = Finch::new(2, true, true).unwrap().score(&input).unwrap();
        assert!((scores.data[0] - 17.0 / 24.0).abs() < 1e-6);
        let plain = Finch::new(2, false, true).unwrap().score(&input).unwrap();
        assert!((plain.data[1] - 7.0 / 24.0).abs() < 1e-6);
    }

    /// The position weighting can reorder keys: key 0 gets ½ from the row at p = 1 and nothing
    /// later; key 1 gets nothing from that row and ⅓ from the row at p = 2. Unnormalised key 0
    /// wins (½ > ⅓); weighted, key 1 wins (2·⅓ = ⅔ > 1·½).
    #[test]
    fn weighting_changes_the_ranking_where_rows_differ() {
        // hand-made stats: n = 4 with window 2 would hide p = 1; use a table directly
        let mut s =
            window_stats(Dims { heads: 1, kv_heads: 1, len: 4, head_dim: 1 }, &[0.0; 4], &[0.0; 4], &[1.0; 4], 2)
                .unwrap();
        // rows at p = 2, 3 (the window): key 0 gets 0.6 at p = 2 and 0 at p = 3, key 1 gets 0 and
        // 0.5: mean 0.3 vs 0.25, weighted (2·0.6)/2 = 0.6 vs (3·0.5)/2 = 0.75
        s.mean[..2].copy_from_slice(&[0.3, 0.25]);
        s.position_weighted.as_mut().unwrap()[..2].copy_from_slice(&[0.6, 0.75]);
        let input = ScoreInput::new(&s, 3);
        let keep = |normalize| {
            let f = Finch::new(2, normalize, false).unwrap();
            let sc = f.score(&input).unwrap();
            select_top_k(&sc.data[..4], 3, f.protect(3)).unwrap()
        };
        assert_eq!(keep(true), vec![1, 2, 3]);
        assert_eq!(keep(false), vec![0, 2, 3]);
        assert_eq!(Finch::new(2, true, true).unwrap().protect(3), Protect { sinks: 0, recent: 2 });
    }

    #[test]
    fn needs_and_errors() {
        let f = Finch::new(5, true, true).unwrap();
        assert!(f.needs().position_weighted);
        assert_eq!(f.needs().window, 5);
        assert!(f.rerotates_keys());
        assert!(!Finch::new(5, false, false).unwrap().needs().position_weighted);
        assert!(Finch::new(0, true, true).is_err());
        let dims = Dims { heads: 1, kv_heads: 1, len: 4, head_dim: 1 };
        let mut s = window_stats(dims, &[1.0; 4], &[0.0; 4], &[1.0; 4], 4).unwrap();
        s.position_weighted = None;
        s.window = 4;
        let err = Finch::new(4, true, true).unwrap().score(&ScoreInput::new(&s, 3)).unwrap_err();
        assert!(err.to_string().contains("position_weighted"), "{err}");
    }
}
