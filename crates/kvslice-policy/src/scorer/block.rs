//! Block-wise compression — the prefill of KeyDiff (Park et al., arXiv:2504.15364), which
//! evicts while the prompt is read block by block; kvpress's `BlockPress`.
//!
//! Wraps a scorer that reads only the cached keys and values. With a per-head budget `k`, the
//! first `k` tokens are kept, then, block by block (`[k, k + B)`, `[k + B, k + 2B)`, …, the last
//! one possibly shorter), the kept tokens and the block are scored *together and alone* by the
//! inner scorer, as if they were the whole cache, and the best `k` of them stay kept (the inner
//! scorer's protected positions first, counted on that cache: its sinks, and its newest tokens,
//! which are those of the block). Each KV head does this on its own tokens.
//!
//! As a score: a token evicted at block `r` (from 0) scores `r`, one kept to the end scores the
//! number of blocks, so the shared selection at the same budget `k` keeps exactly the final set
//! (the uniform allocator gives every head that budget). At a smaller budget the final set's
//! ties go by the lower position.
//!
//! Differences from kvpress: kvpress runs the inner press on the gathered hidden states too
//! (for presses that recompute queries); the inner scorers here read keys and values only, so
//! the wrapper refuses others. kvpress leaves each block's survivors in the order of their
//! scores (top-k's order), and the next block's cache in that order; here the cache stays in
//! position order, as it is stored. The two agree for inner scorers that do not read positions
//! (KeyDiff, Knorm); for those that do (CurDKV's local windows, LagKV's partitions, the sinks
//! and recent tokens of any scorer) the position order is the one meant. Ties among the inner scores are cut by the lower position
//! (torch's top-k leaves them unspecified). Default block of 128 tokens (kvpress).

use crate::error::{PolicyError, Result};
use crate::scorer::{Scorer, param};
use crate::select::{Protect, select_top_k};
use crate::stats::{KvView, Needs, ScoreInput, Scores, WindowStats};

/// Block-wise iterative compression with another scorer.
#[derive(Debug)]
pub struct Block {
    inner: Box<dyn Scorer>,
    block: usize,
}

impl Block {
    /// Wraps `inner`, which must read only keys and values, with blocks of `block` tokens (1 to
    /// 65536).
    pub fn new(inner: Box<dyn Scorer>, block: usize) -> Result<Self> {
        if !(1..=65536).contains(&block) {
            return Err(param("block", "block", format!("must lie in 1..=65536 tokens, got {block}")));
        }
        let needs = inner.needs();
        let kv_only = Needs { keys: needs.keys, values: needs.values, ..Needs::default() };
        if needs != kv_only || !(needs.keys || needs.values) {
            return Err(param(
                "block",
                "inner",
                format!("must read keys or values and nothing else; {} does not", inner.name()),
            ));
        }
        Ok(Block { inner, block })
    }

    /// The block length.
    pub fn block(&self) -> usize {
        self.block
    }
}

/// Rows `idx[h]` of every head `h` of `t` (`[H_kv, n, d]`), as `[H_kv, m, d]`.
fn gather(kv: &KvView<'_>, t: &[f32], idx: &[Vec<usize>]) -> Vec<f32> {
    let mut out = Vec::with_capacity(idx.iter().map(Vec::len).sum::<usize>() * kv.head_dim);
    for (h, rows) in idx.iter().enumerate() {
        for &j in rows {
            out.extend_from_slice(kv.row(t, h, j));
        }
    }
    out
}

impl Scorer for Block {
    fn name(&self) -> &'static str {
        "block"
    }

    fn needs(&self) -> Needs {
        self.inner.needs()
    }

    fn protect(&self, budget: usize) -> Protect {
        self.inner.protect(budget)
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let needs = self.inner.needs();
        let keys = if needs.keys { Some(input.keys("block")?.1) } else { None };
        let values = if needs.values { Some(input.values("block")?.1) } else { None };
        let (n, k, heads) = (s.len, input.budget, s.kv_heads);
        if k == 0 || k >= n {
            return self.inner.score(input);
        }
        let kv = input.kv.ok_or(PolicyError::MissingInput { method: "block", input: "keys or values" })?;
        let protect = self.inner.protect(k);
        let mut kept: Vec<Vec<usize>> = vec![(0..k).collect(); heads];
        let mut out = Scores::zeros(heads, n);
        let starts: Vec<usize> = (k..n).step_by(self.block).collect();
        for (round, &start) in starts.iter().enumerate() {
            let end = (start + self.block).min(n);
            let cur: Vec<Vec<usize>> = kept.iter().map(|kh| kh.iter().copied().chain(start..end).collect()).collect();
            let m = k + end - start;
            let sub_keys = keys.map(|t| gather(&kv, t, &cur));
            let sub_values = values.map(|t| gather(&kv, t, &cur));
            let view = KvView {
                kv_heads: heads,
                len: m,
                head_dim: kv.head_dim,
                keys: sub_keys.as_deref(),
                values: sub_values.as_deref(),
            };
            let stats = WindowStats {
                heads: s.heads,
                kv_heads: heads,
                len: m,
                window: 1,
                mean: vec![0.0; s.heads * m],
                var: vec![0.0; s.heads * m],
                last: vec![0.0; s.heads * m],
                entropy: vec![0.0; s.heads],
                ..WindowStats::default()
            };
            let sub = ScoreInput {
                stats: &stats,
                kv: Some(view),
                query_moments: None,
                value_proj_l1: None,
                budget: k,
                layer: input.layer,
            };
            let scores = self.inner.score(&sub)?;
            for h in 0..heads {
                let keep = select_top_k(scores.row(h), k, protect)?;
                let mut next = Vec::with_capacity(k);
                let mut keep = keep.iter().map(|&i| i as usize).peekable();
                for (i, &j) in cur[h].iter().enumerate() {
                    if keep.peek() == Some(&i) {
                        keep.next();
                        next.push(j);
                    } else {
                        out.row_mut(h)[j] = round as f32;
                    }
                }
                kept[h] = next;
            }
        }
        for (h, kh) in kept.iter().enumerate() {
            for &j in kh {
                out.row_mut(h)[j] = starts.len() as f32;
            }
        }
        Ok(out)
    }
}
