//! TwinKV — Chen et al., "TwinKV: A Composable Repair Pass for KV Cache Eviction via Pairwise
//! Key Redundancy", 2026 (arXiv:2608.27128).
//!
//! A token whose key has a near-duplicate elsewhere in the context is redundant: its
//! information survives in the twin. The signal is attention-free:
//! `t_j = max_{i : |i − j| > E} cos(k_i, k_j)` over the keys of the same KV head, with an
//! exclusion window `E = 8` so that neighbours (which always look alike) do not count
//! (`WindowStats::twin`, and the arg-max `WindowStats::twin_index`). The device computes it in
//! row chunks, never holding the `n×n` similarity matrix.
//!
//! Two uses:
//! - [`TwinKv`], on its own: keep the most unique keys, `s_j = −t_j` (4 sinks and the last 32
//!   tokens kept);
//! - [`TwinRepair`], the paper's composable repair pass after any scored policy: given the
//!   policy's kept set, *orphans* (evicted tokens with no similar surviving key) are swapped
//!   in for *redundant donors* (kept, unprotected tokens whose twin is kept), the budget and the
//!   policy's scoring unchanged.
//!
//! Choices where the public description leaves details open (each tested below):
//! - keys as cached (after RoPE), which is what the repair pass sees in a KV cache;
//! - the repair reads only each token's best twin: an evicted token is covered when its best
//!   twin survives with `t ≥ τ`, and a kept token `i` with `t_i ≥ τ` covers its twin. A token
//!   whose best twin is evicted but whose second-best (also above `τ`) survives counts as an
//!   orphan — a conservative error (it may take a swap it did not need);
//! - orphans are taken in the policy's own order (highest score first): the swap brings back
//!   the tokens the policy ranked just below its cut; donors go most redundant first;
//! - a removed donor *pins* its twin (the twin can no longer be removed), so a pair of twins
//!   never loses both members; an added orphan covers its own twin;
//! - at most a quarter of the unprotected budget is swapped (`max_swap = 0.25`), and the
//!   threshold is `τ = 0.85` (the value reported for Qwen3-4B).

use crate::error::{PolicyError, Result};
use crate::scorer::{Scorer, param};
use crate::select::{Protect, ranked};
use crate::stats::{Needs, ScoreInput, Scores, WindowStats};

/// Neighbours closer than this many positions never count as twins.
pub const EXCLUSION: usize = 8;

/// Best twin `(t_j, index_j)` of every key, `[H_kv, n]` each, in f64: the definition the device
/// path is checked against. `t_j = −1` and `index_j = u32::MAX` when no key lies outside the
/// exclusion window; a zero key has cosine 0 with everything. Ties go to the lower position.
pub fn twins(keys: &[f32], kv_heads: usize, len: usize, d: usize) -> Result<(Vec<f32>, Vec<u32>)> {
    if keys.len() != kv_heads * len * d {
        return Err(PolicyError::ShapeMismatch { what: "keys", expected: kv_heads * len * d, got: keys.len() });
    }
    if let Some(index) = keys.iter().position(|k| !k.is_finite()) {
        return Err(PolicyError::NonFinite { what: "keys", index });
    }
    let mut sim = vec![-1f32; kv_heads * len];
    let mut idx = vec![u32::MAX; kv_heads * len];
    for h in 0..kv_heads {
        let key = |j: usize| &keys[(h * len + j) * d..(h * len + j + 1) * d];
        let norm: Vec<f64> =
            (0..len).map(|j| key(j).iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()).collect();
        for j in 0..len {
            let mut best = f64::NEG_INFINITY;
            let mut arg = u32::MAX;
            for i in 0..len {
                if i.abs_diff(j) <= EXCLUSION {
                    continue;
                }
                let dot: f64 = key(i).iter().zip(key(j)).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                let c = if norm[i] > 0.0 && norm[j] > 0.0 { dot / (norm[i] * norm[j]) } else { 0.0 };
                if c > best {
                    best = c;
                    arg = i as u32;
                }
            }
            if arg != u32::MAX {
                sim[h * len + j] = best as f32;
                idx[h * len + j] = arg;
            }
        }
    }
    Ok((sim, idx))
}

/// TwinKV on its own: the most unique keys are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwinKv {
    sinks: usize,
    recent: usize,
}

impl Default for TwinKv {
    fn default() -> Self {
        TwinKv { sinks: 4, recent: 32 }
    }
}

impl TwinKv {
    /// Keeps the first `sinks` and the last `recent` tokens regardless of their uniqueness.
    pub fn new(sinks: usize, recent: usize) -> Self {
        TwinKv { sinks, recent }
    }
}

impl Scorer for TwinKv {
    fn name(&self) -> &'static str {
        "twinkv"
    }

    fn needs(&self) -> Needs {
        Needs { twins: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: self.recent }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let t = input.optional("twinkv", "twin similarities", &s.twin)?;
        Ok(Scores { kv_heads: s.kv_heads, len: s.len, data: t.iter().map(|&x| -x).collect() })
    }
}

/// What one repair did to one head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RepairCount {
    /// Evicted tokens without a surviving twin before the repair.
    pub orphans: usize,
    /// Kept, unprotected tokens whose twin is kept, before the repair.
    pub donors: usize,
    /// Swaps made.
    pub swaps: usize,
}

/// The repair pass after a policy's selection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwinRepair {
    threshold: f32,
    max_swap: f32,
}

impl Default for TwinRepair {
    fn default() -> Self {
        TwinRepair { threshold: 0.85, max_swap: 0.25 }
    }
}

impl TwinRepair {
    /// Similarity threshold `τ ∈ (−1, 1]` and the largest swapped share of the unprotected
    /// budget, in `[0, 1]`.
    pub fn new(threshold: f32, max_swap: f32) -> Result<Self> {
        if !(threshold > -1.0 && threshold <= 1.0) {
            return Err(param("twinkv", "threshold", format!("must lie in (−1, 1], got {threshold}")));
        }
        if !(0.0..=1.0).contains(&max_swap) {
            return Err(param("twinkv", "max_swap", format!("must lie in [0, 1], got {max_swap}")));
        }
        Ok(TwinRepair { threshold, max_swap })
    }

    /// What the repair needs on top of the policy's own inputs.
    pub fn needs(&self) -> Needs {
        Needs { twins: true, ..Needs::default() }
    }

    /// Repairs the sorted `kept` positions of KV head `head` chosen from `scores` (that head's
    /// row) with `protect`; returns the new kept set (same size, sorted) and what it did.
    pub fn repair_head(
        &self,
        stats: &WindowStats,
        head: usize,
        scores: &[f32],
        kept: &[u32],
        protect: Protect,
    ) -> Result<(Vec<u32>, RepairCount)> {
        let n = stats.len;
        let twin = stats.twin.as_deref().ok_or(PolicyError::MissingInput { method: "twinkv", input: "twin" })?;
        let index =
            stats.twin_index.as_deref().ok_or(PolicyError::MissingInput { method: "twinkv", input: "twin_index" })?;
        if twin.len() != stats.kv_heads * n || index.len() != stats.kv_heads * n || head >= stats.kv_heads {
            return Err(PolicyError::ShapeMismatch {
                what: "twin tables",
                expected: stats.kv_heads * n,
                got: twin.len(),
            });
        }
        if scores.len() != n {
            return Err(PolicyError::ShapeMismatch { what: "scores", expected: n, got: scores.len() });
        }
        let t = &twin[head * n..(head + 1) * n];
        let ix = &index[head * n..(head + 1) * n];
        let tau = self.threshold;
        let mut retained = vec![false; n];
        for &p in kept {
            let p = p as usize;
            if p >= n {
                return Err(PolicyError::ShapeMismatch { what: "kept position", expected: n, got: p });
            }
            retained[p] = true;
        }
        let has_twin = |j: usize| t[j] >= tau && (ix[j] as usize) < n;
        let mut covered = vec![false; n];
        for j in 0..n {
            if has_twin(j) {
                let i = ix[j] as usize;
                if retained[i] {
                    covered[j] = true;
                }
                if retained[j] {
                    covered[i] = true;
                }
            }
        }
        let orphans = ranked(scores, (0..n).filter(|&j| !retained[j] && !covered[j]));
        let donors = ranked(
            t,
            (0..n).filter(|&j| retained[j] && !protect.contains(j, n) && has_twin(j) && retained[ix[j] as usize]),
        );
        let mut count = RepairCount { orphans: orphans.len(), donors: donors.len(), swaps: 0 };
        let free = kept.len().saturating_sub(protect.count(n).min(kept.len()));
        let limit = (free as f64 * f64::from(self.max_swap)).floor() as usize;
        let mut pinned = vec![false; n];
        let mut next = donors.iter();
        'orphans: for &o in &orphans {
            if count.swaps >= limit {
                break;
            }
            let o = o as usize;
            if retained[o] || (has_twin(o) && retained[ix[o] as usize]) {
                continue; // covered by an earlier swap
            }
            let donor = loop {
                let Some(&d) = next.next() else { break 'orphans };
                let d = d as usize;
                if retained[d] && !pinned[d] && retained[ix[d] as usize] {
                    break d;
                }
            };
            retained[donor] = false;
            pinned[ix[donor] as usize] = true;
            retained[o] = true;
            pinned[o] = true;
            count.swaps += 1;
        }
        Ok(((0..n as u32).filter(|&j| retained[j as usize]).collect(), count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_twins(n: usize, twin: Vec<f32>, index: Vec<u32>) -> WindowStats {
        WindowStats {
            heads: 1,
            kv_heads: 1,
            len: n,
            window: 1,
            mean: vec![0.0; n],
            var: vec![0.0; n],
            last: vec![0.0; n],
            entropy: vec![0.0],
            twin: Some(twin),
            twin_index: Some(index),
            ..WindowStats::default()
        }
    }

    #[test]
    fn twins_by_hand() {
        // 12 keys in d = 2: key 0 = (1, 0), key 10 = (2, 0) (its twin, 10 apart), key 11 =
        // (0, 1), the rest (1, 1)/√2-ish. Exclusion 8: key 0 sees keys 9..=11 only.
        let mut keys = vec![0f32; 24];
        for j in 0..12 {
            let (a, b) = match j {
                0 => (1.0, 0.0),
                10 => (2.0, 0.0),
                11 => (0.0, 1.0),
                _ => (1.0, 1.0),
            };
            keys[2 * j] = a;
            keys[2 * j + 1] = b;
        }
        let (t, ix) = twins(&keys, 1, 12, 2).unwrap();
        assert!((t[0] - 1.0).abs() < 1e-6 && ix[0] == 10, "{t:?} {ix:?}");
        assert!((t[10] - 1.0).abs() < 1e-6 && ix[10] == 0);
        // key 11 = e2 sees 0..=2 only: cos(e2, e1) = 0 at 0, cos(e2, (1,1)) = 1/√2 at 1 and 2;
        // the tie goes to position 1
        assert!((t[11] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6 && ix[11] == 1);
        // key 5 has nothing outside [−3, 13]: no twin
        assert_eq!((t[5], ix[5]), (-1.0, u32::MAX));
        assert!(twins(&keys[..23], 1, 12, 2).is_err());
    }

    #[test]
    fn repair_swaps_orphans_for_donors() {
        // n = 10, kept {0, 1, 2, 3} with 0 protected (1 sink). Tokens 1 and 2 are twins of each
        // other (t = 0.9); 3 is unique; evicted 5 (score 0.8) and 6 (0.7) are orphans; evicted 7
        // is a twin of kept 3 (covered); evicted 8 is a twin of evicted 9 (both orphans).
        let n = 10;
        let mut t = vec![0.1f32; n];
        let mut ix = vec![0u32; n];
        for (a, b, s) in [(1, 2, 0.9), (2, 1, 0.9), (7, 3, 0.95), (3, 7, 0.95), (8, 9, 0.99), (9, 8, 0.99)] {
            t[a] = s;
            ix[a] = b;
        }
        let stats = with_twins(n, t, ix);
        let scores = [9.0, 5.0, 5.0, 5.0, 0.0, 0.8, 0.7, 0.1, 0.6, 0.5];
        let kept = [0, 1, 2, 3];
        let protect = Protect { sinks: 1, recent: 0 };
        // max_swap 1: 3 free slots, donors 1, 2, 3 (3's twin 7 is evicted: not a donor; 1 and
        // 2 have t = 0.9, 1 goes first). Removing 1 pins 2, so 2 is never removed: one swap,
        // the best orphan 5 comes in.
        let r = TwinRepair::new(0.85, 1.0).unwrap();
        let (k, c) = r.repair_head(&stats, 0, &scores, &kept, protect).unwrap();
        assert_eq!(k, vec![0, 2, 3, 5]);
        assert_eq!(c, RepairCount { orphans: 5, donors: 2, swaps: 1 });
        // threshold above every similarity: nobody has a twin, no donors, no swap
        let r = TwinRepair::new(0.999, 1.0).unwrap();
        assert_eq!(r.repair_head(&stats, 0, &scores, &kept, protect).unwrap().0, kept.to_vec());
        // max_swap 0.25 of 3 free slots: no swap
        let r = TwinRepair::default();
        assert_eq!(r.repair_head(&stats, 0, &scores, &kept, protect).unwrap().1.swaps, 0);
    }

    #[test]
    fn an_added_orphan_covers_its_twin() {
        // kept {0, 1, 2, 3, 4, 5}, none protected; donors 0↔1 and 2↔3 and 4↔5 pairs (t = 0.9);
        // orphans by score: 8 (twin of 9, t = 0.99), 9, 7, 6. Adding 8 covers 9, so the second
        // swap brings 7 and the third 6.
        let n = 10;
        let mut t = vec![0.0f32; n];
        let mut ix = vec![u32::MAX; n];
        for (a, b, s) in [
            (0, 1, 0.9),
            (1, 0, 0.9),
            (2, 3, 0.92),
            (3, 2, 0.92),
            (4, 5, 0.91),
            (5, 4, 0.91),
            (8, 9, 0.99),
            (9, 8, 0.99),
        ] {
            t[a] = s;
            ix[a] = b;
        }
        let stats = with_twins(n, t, ix);
        let scores = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.3, 0.9, 0.8];
        let r = TwinRepair::new(0.85, 1.0).unwrap();
        let (k, c) = r.repair_head(&stats, 0, &scores, &[0, 1, 2, 3, 4, 5], Protect::NONE).unwrap();
        // donors most redundant first: 2 (pins 3), 3 is pinned, 4 (pins 5), 5 is pinned, 0
        // (pins 1): every pair keeps one member
        assert_eq!(k, vec![1, 3, 5, 6, 7, 8]);
        assert_eq!(c.swaps, 3);
        assert!(TwinRepair::new(1.5, 0.2).is_err() && TwinRepair::new(0.5, -0.1).is_err());
    }
}
