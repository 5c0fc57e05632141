//! The one place where kept positions are chosen: top-k per KV head with protected positions.
//!
//! Rules (shared by every scorer and allocator, and mirrored by the top-k kernel):
//! - the first `sinks` and the last `recent` positions are always kept and count in `k`;
//! - the other `k − protected` slots go to the highest scores, ties broken by the lower position;
//! - `k ≥ n` keeps everything, `k = 0` keeps nothing, `0 < k < protected` is an error;
//! - kept positions are returned sorted ascending.

use std::cmp::Ordering;

use crate::error::{PolicyError, Result};
use crate::stats::Scores;

/// Positions a policy always keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Protect {
    /// The first `sinks` positions (attention sinks).
    pub sinks: usize,
    /// The last `recent` positions (the observation window / recent tokens).
    pub recent: usize,
}

impl Protect {
    /// No protected positions.
    pub const NONE: Protect = Protect { sinks: 0, recent: 0 };

    /// How many distinct positions are protected in a sequence of `len`.
    pub fn count(&self, len: usize) -> usize {
        (self.sinks + self.recent).min(len)
    }

    /// Whether position `j` of a sequence of `len` is protected.
    pub fn contains(&self, j: usize, len: usize) -> bool {
        j < self.sinks || j + self.recent >= len
    }
}

/// Orders candidates best first: higher score, then lower position.
fn better(scores: &[f32], a: u32, b: u32) -> Ordering {
    scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b))
}

/// Keeps `k` positions of one head's `scores` (length `n`); returns them sorted ascending.
pub fn select_top_k(scores: &[f32], k: usize, protect: Protect) -> Result<Vec<u32>> {
    let n = scores.len();
    if let Some(index) = scores.iter().position(|s| s.is_nan()) {
        return Err(PolicyError::NonFinite { what: "scores", index });
    }
    if k >= n {
        return Ok((0..n as u32).collect());
    }
    if k == 0 {
        return Ok(Vec::new());
    }
    let protected = protect.count(n);
    if k < protected {
        return Err(PolicyError::BudgetBelowProtected { budget: k, protected });
    }
    let mut candidates: Vec<u32> = (0..n as u32).filter(|&j| !protect.contains(j as usize, n)).collect();
    let extra = k - protected;
    if extra < candidates.len() && extra > 0 {
        candidates.select_nth_unstable_by(extra - 1, |&a, &b| better(scores, a, b));
    }
    candidates.truncate(extra);
    candidates.extend((0..n as u32).filter(|&j| protect.contains(j as usize, n)));
    candidates.sort_unstable();
    Ok(candidates)
}

/// Keeps `budgets[h]` positions of every KV head `h` of `scores`.
pub fn select_heads(scores: &Scores, budgets: &[usize], protect: Protect) -> Result<Vec<Vec<u32>>> {
    if budgets.len() != scores.kv_heads {
        return Err(PolicyError::ShapeMismatch {
            what: "per-head budgets",
            expected: scores.kv_heads,
            got: budgets.len(),
        });
    }
    (0..scores.kv_heads).map(|h| select_top_k(scores.row(h), budgets[h], protect)).collect()
}

/// The best `k` of `candidates` (positions into `scores`), best first, ties to the lower position.
pub(crate) fn ranked(scores: &[f32], candidates: impl Iterator<Item = usize>) -> Vec<u32> {
    let mut c: Vec<u32> = candidates.map(|j| j as u32).collect();
    c.sort_unstable_by(|&a, &b| better(scores, a, b));
    c
}
