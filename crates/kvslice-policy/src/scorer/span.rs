//! Whole spans around salient tokens — kvslice's own extension for retrieval.
//!
//! Window-attention scorers (SnapKV and its kin) rank the tokens the question *matches*: in
//! "the special magic number for X is 4170023" the question attends to "magic number for X",
//! much less to the digits after it, and at small budgets the value is lost while its key
//! phrase is kept. `Span` wraps any scorer and gives each token the best score among the
//! `after` tokens before it and the `before` tokens after it:
//! `s'_j = max_{j − after ≤ i ≤ j + before} s_i` (within the sequence). A salient token thus
//! carries the span that follows it (its continuation, e.g. the value after a key) and a little
//! of what precedes it. Selection then keeps whole spans, best first; the top-k order inside a
//! span of equal scores is by position, so spans are not cut at their start.
//!
//! The wrapped scorer's needs and protected positions are unchanged. Defaults: `after = 12`,
//! `before = 2` (a 7-digit value plus punctuation fits behind a key phrase of a few tokens).

use crate::error::Result;
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// Span dilation of another scorer's scores.
#[derive(Debug)]
pub struct Span {
    inner: Box<dyn Scorer>,
    before: usize,
    after: usize,
}

impl Span {
    /// Wraps `inner` with the defaults (`after = 12`, `before = 2`).
    pub fn new(inner: Box<dyn Scorer>) -> Self {
        Span { inner, before: 2, after: 12 }
    }

    /// Explicit reach: each token takes the best score of the `after` tokens before it and the
    /// `before` tokens after it. At most 4096 each.
    pub fn with(inner: Box<dyn Scorer>, before: usize, after: usize) -> Result<Self> {
        for (name, v) in [("before", before), ("after", after)] {
            if v > 4096 {
                return Err(param("span", name, format!("at most 4096 tokens, got {v}")));
            }
        }
        Ok(Span { inner, before, after })
    }
}

/// `out[j] = max(row[j − after ..= j + before])`, clipped to the row, in O(n) per row with a
/// monotone deque.
pub fn dilate(row: &[f32], before: usize, after: usize) -> Vec<f32> {
    let n = row.len();
    let mut out = Vec::with_capacity(n);
    let mut deque: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut next = 0; // next index to push
    for j in 0..n {
        let hi = (j + before).min(n.saturating_sub(1));
        while next <= hi {
            while deque.back().is_some_and(|&b| row[b] <= row[next]) {
                deque.pop_back();
            }
            deque.push_back(next);
            next += 1;
        }
        let lo = j.saturating_sub(after);
        while deque.front().is_some_and(|&f| f < lo) {
            deque.pop_front();
        }
        out.push(deque.front().map_or(f32::NEG_INFINITY, |&f| row[f]));
    }
    out
}

impl Scorer for Span {
    fn name(&self) -> &'static str {
        "span"
    }

    fn needs(&self) -> Needs {
        self.inner.needs()
    }

    fn protect(&self, budget: usize) -> Protect {
        self.inner.protect(budget)
    }

    fn counter_causal_layers(&self, layers: usize) -> Vec<usize> {
        self.inner.counter_causal_layers(layers)
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let mut s = self.inner.score(input)?;
        for h in 0..s.kv_heads {
            let row = dilate(s.row(h), self.before, self.after);
            s.row_mut(h).copy_from_slice(&row);
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::dilate;

    #[test]
    fn dilation_by_hand() {
        let row = [0.0, 5.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        // after = 2: 5 covers positions 1..=3, 1 covers 5..=7
        assert_eq!(dilate(&row, 0, 2), vec![0.0, 5.0, 5.0, 5.0, 0.0, 1.0, 1.0, 1.0]);
        // before = 1 as well: 5 reaches back to 0, 1 back to 4
        assert_eq!(dilate(&row, 1, 2), vec![5.0, 5.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(dilate(&row, 0, 0), row.to_vec());
        assert_eq!(dilate(&[], 3, 3), Vec::<f32>::new());
        // reach past both ends
        assert_eq!(dilate(&[2.0, -1.0, 3.0], 9, 9), vec![3.0, 3.0, 3.0]);
    }
}
