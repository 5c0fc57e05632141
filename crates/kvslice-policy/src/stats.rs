//! Inputs of the scorers: window statistics (what the GPU kernels produce per layer), raw K/V
//! views, query moments, and the per-KV-head score table that scorers return.
//!
//! Notation used in every doc comment of this crate: a layer has `H` query heads and `H_kv` KV
//! heads (`H = g·H_kv`, GQA group `g`; query head `h` reads KV head `h / g`), a prompt of `n`
//! tokens, an observation window of the last `w` queries `q ∈ [n−w, n)`, and causal softmax
//! weights `a_qj = softmax_j(⟨q, k_j⟩/√d)` over `j ≤ q` (zero for `j > q`). The *prefix* is
//! `j ∈ [0, n−w)`, the keys before the window.

use crate::error::{PolicyError, Result};

/// Per-layer window statistics. Every `[H, n]` table is row-major, head by head.
///
/// The kernels fill the required fields and may leave the optional ones `None` when no
/// registered scorer asks for them (see [`Needs`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WindowStats {
    /// Query heads `H`.
    pub heads: usize,
    /// KV heads `H_kv`; `heads % kv_heads == 0`.
    pub kv_heads: usize,
    /// Prompt length `n` (number of keys).
    pub len: usize,
    /// Observation window `w`, `1 ≤ w ≤ n`.
    pub window: usize,
    /// `[H, n]`: `mean_q a_qj` over the `w` window queries.
    pub mean: Vec<f32>,
    /// `[H, n]`: the unbiased variance `Σ_q (a_qj − mean_j)² / (w − 1)` over the window queries
    /// (CAKE's attention shift; `torch.var` default). Zero when `w = 1`.
    pub var: Vec<f32>,
    /// `[H, n]`: `a_{n−1, j}`, the weights of the last query (TOVA).
    pub last: Vec<f32>,
    /// `[H]`: mean over window queries of `−Σ_{j<n−w} a_qj · ln(a_qj + 1e−10)`, the row entropy
    /// restricted to the prefix keys, weights *not* renormalised (CAKE's dispersion, as cakekv
    /// computes it).
    pub entropy: Vec<f32>,
    /// `[H, n]`, optional: `mean_q a_qj · ‖v_j‖₂`.
    pub value_weighted: Option<Vec<f32>>,
    /// `[H, n]`, optional: `mean_q a_qj · ⟨v_j, o_q/‖o_q‖⟩` with `o_q = Σ_j a_qj v_j`, the
    /// pre-eviction output (AnDPro's anchor direction).
    pub projection: Option<Vec<f32>>,
    /// `[H, n]`, optional: `Σ_{q=0}^{n−1} a_qj`, attention accumulated over *all* prompt queries
    /// (H2O's heavy-hitter statistic; the decode kernel keeps adding to it).
    pub accumulated: Option<Vec<f32>>,
    /// `[H, n]`, optional: `Σ_{i ≤ j} c_ij`, the column sums of counter-causal attention
    /// `c_ij = softmax_{j ≥ i}(⟨q_i, k_j⟩/√d)` (each query sees itself and the later keys).
    pub counter_causal: Option<Vec<f32>>,
    /// The column sums of chunked non-causal attention ([`crate::scorer::non_causal`]), one
    /// `[H, n]` table per [`NonCausalSpec`] asked for: the positions of the spec's range cut
    /// into chunks of `chunk` tokens from its start, the last one zero-padded, each query
    /// attending to every key of its chunk with unscaled logits `⟨q_i, k_j⟩`, summed over the
    /// chunk's queries (padding rows included); zero outside the range.
    pub non_causal: Vec<NonCausalTable>,
    /// `[H, n]`, optional: `mean_q a_qj · ‖v_j − o_q‖₂`, the norm of the attention output's
    /// derivative with respect to key `j`'s logit, `∂o_q/∂s_qj = a_qj (v_j − o_q)`, averaged over
    /// the window queries (Jacap's softmax-aware importance weight).
    pub jacobian: Option<Vec<f32>>,
    /// `[H_kv, n]`, optional: ridge leverage of the keys weighted by the group-mean `jacobian`
    /// weights, `ℓ_j = w_j k_jᵀ (Kᵀ W K + λ I)⁻¹ k_j` with `λ = tr(Kᵀ W K) / d` (see
    /// [`crate::scorer::jacap`]).
    pub leverage: Option<Vec<f32>>,
    /// `[H_kv, n]`, optional: each key's highest cosine similarity to another key of its KV head
    /// farther than [`crate::scorer::twin::EXCLUSION`] positions away (TwinKV's redundancy);
    /// `−1` when there is none.
    pub twin: Option<Vec<f32>>,
    /// `[H_kv, n]`, optional: the position of that most similar key (`u32::MAX` when none).
    pub twin_index: Option<Vec<u32>>,
    /// `[H_kv, n]`, optional: KVzip's importance from context reconstruction
    /// ([`crate::scorer::kvzip`], [`crate::reference::reconstruction_scores`]): the highest
    /// weight any reconstruction query of the KV head's group puts on the key; zero for the
    /// positions no reconstruction covers.
    pub reconstruction: Option<Vec<f32>>,
    /// `[H, n]`, optional: `mean_q p_q · a_qj` over the window queries, each query's weights
    /// multiplied by its position `p_q = n − w + i` (the number of keys before it: Finch's
    /// normalisation of a row by its count of non-masked weights, [`crate::scorer::finch`]).
    pub position_weighted: Option<Vec<f32>>,
}

/// The range and chunking of one chunked non-causal attention table: positions
/// `[start, n − end)` (clamped as kvpress's `CompactorPress` clamps them: `start' = min(start,
/// n)`, `end' = min(end, n − start')`), cut into chunks of `chunk` tokens from `start'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NonCausalSpec {
    /// Tokens per chunk (positive).
    pub chunk: usize,
    /// Leading positions left out.
    pub start: usize,
    /// Trailing positions left out.
    pub end: usize,
}

impl NonCausalSpec {
    /// Chunks of `chunk` over the whole prompt (kvpress's `NonCausalAttnPress`).
    pub const fn whole(chunk: usize) -> Self {
        NonCausalSpec { chunk, start: 0, end: 0 }
    }

    /// The range `[start', n − end')` it covers in a prompt of `n` tokens.
    pub fn range(&self, n: usize) -> std::ops::Range<usize> {
        let start = self.start.min(n);
        let end = self.end.min(n - start);
        start..n - end
    }
}

/// One chunked non-causal attention table, `[H, n]`, and what it was computed over.
#[derive(Debug, Clone, PartialEq)]
pub struct NonCausalTable {
    pub spec: NonCausalSpec,
    pub sums: Vec<f32>,
}

impl WindowStats {
    /// The non-causal table computed for `spec`, if the runtime computed it.
    pub fn non_causal_for(&self, spec: NonCausalSpec) -> Option<&[f32]> {
        self.non_causal.iter().find(|t| t.spec == spec).map(|t| t.sums.as_slice())
    }
}

/// Which inputs a scorer needs, so the runtime asks the kernels only for those.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs {
    /// Observation window the statistics must be computed over (0 = none needed).
    pub window: usize,
    /// `WindowStats::value_weighted`.
    pub value_weighted: bool,
    /// `WindowStats::projection`.
    pub projection: bool,
    /// `WindowStats::accumulated`.
    pub accumulated: bool,
    /// `WindowStats::counter_causal`.
    pub counter_causal: bool,
    /// A `WindowStats::non_causal` table of this range and chunk.
    pub non_causal: Option<NonCausalSpec>,
    /// The cached keys.
    pub keys: bool,
    /// The cached values.
    pub values: bool,
    /// Mean and covariance of the pre-RoPE queries ([`QueryMoments`]).
    pub query_moments: bool,
    /// `‖W_o^h v_j‖₁` per query head ([`ScoreInput::value_proj_l1`]).
    pub value_proj_l1: bool,
    /// `WindowStats::jacobian`.
    pub jacobian: bool,
    /// `WindowStats::leverage` (implies `jacobian`).
    pub leverage: bool,
    /// `WindowStats::twin` and `WindowStats::twin_index`.
    pub twins: bool,
    /// `WindowStats::reconstruction` (a reconstruction pass after the prefill).
    pub reconstruction: bool,
    /// `WindowStats::position_weighted`.
    pub position_weighted: bool,
}

impl Needs {
    /// The union of two sets of needs (the larger window wins).
    pub fn union(self, o: Needs) -> Needs {
        Needs {
            window: self.window.max(o.window),
            value_weighted: self.value_weighted || o.value_weighted,
            projection: self.projection || o.projection,
            accumulated: self.accumulated || o.accumulated,
            counter_causal: self.counter_causal || o.counter_causal,
            // no scorer combines two tables; the first one asked for wins
            non_causal: self.non_causal.or(o.non_causal),
            keys: self.keys || o.keys,
            values: self.values || o.values,
            query_moments: self.query_moments || o.query_moments,
            value_proj_l1: self.value_proj_l1 || o.value_proj_l1,
            jacobian: self.jacobian || o.jacobian,
            leverage: self.leverage || o.leverage,
            twins: self.twins || o.twins,
            reconstruction: self.reconstruction || o.reconstruction,
            position_weighted: self.position_weighted || o.position_weighted,
        }
    }
}

fn check_len(what: &'static str, v: &[f32], expected: usize) -> Result<()> {
    if v.len() != expected {
        return Err(PolicyError::ShapeMismatch { what, expected, got: v.len() });
    }
    if let Some(index) = v.iter().position(|x| !x.is_finite()) {
        return Err(PolicyError::NonFinite { what, index });
    }
    Ok(())
}

impl WindowStats {
    /// GQA group size `g = H / H_kv`.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads.max(1)
    }

    /// Number of prefix keys `n − w`.
    pub fn prefix_len(&self) -> usize {
        self.len - self.window.min(self.len)
    }

    /// Checks every shape and that all values are finite.
    pub fn validate(&self) -> Result<()> {
        if self.kv_heads == 0 || self.heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(PolicyError::Grouping { heads: self.heads, kv_heads: self.kv_heads });
        }
        if self.window == 0 || self.window > self.len {
            return Err(PolicyError::Window { window: self.window, len: self.len, reason: "need 1 ≤ w ≤ n" });
        }
        let hn = self.heads * self.len;
        check_len("mean", &self.mean, hn)?;
        check_len("var", &self.var, hn)?;
        check_len("last", &self.last, hn)?;
        check_len("entropy", &self.entropy, self.heads)?;
        for (what, opt) in [
            ("value_weighted", &self.value_weighted),
            ("projection", &self.projection),
            ("accumulated", &self.accumulated),
            ("counter_causal", &self.counter_causal),
            ("jacobian", &self.jacobian),
            ("position_weighted", &self.position_weighted),
        ] {
            if let Some(v) = opt {
                check_len(what, v, hn)?;
            }
        }
        for t in &self.non_causal {
            check_len("non_causal", &t.sums, hn)?;
        }
        let kn = self.kv_heads * self.len;
        for (what, opt) in
            [("leverage", &self.leverage), ("twin", &self.twin), ("reconstruction", &self.reconstruction)]
        {
            if let Some(v) = opt {
                check_len(what, v, kn)?;
            }
        }
        if let Some(t) = &self.twin_index {
            if t.len() != kn {
                return Err(PolicyError::ShapeMismatch { what: "twin_index", expected: kn, got: t.len() });
            }
            if let Some(index) = t.iter().position(|&i| i != u32::MAX && i as usize >= self.len) {
                return Err(PolicyError::ShapeMismatch {
                    what: "twin_index entry (a position)",
                    expected: self.len,
                    got: t[index] as usize,
                });
            }
        }
        Ok(())
    }

    /// CAKE's dispersion `H_l = Σ_h Σ_{q in window} entropy_q = w · Σ_h entropy[h]`.
    pub fn dispersion(&self) -> f64 {
        self.window as f64 * self.entropy.iter().map(|&e| f64::from(e)).sum::<f64>()
    }

    /// CAKE's shift `V_l = Σ_h Σ_{j<n−w} var[h][j]`, the summed column variance over the prefix.
    pub fn column_variance_sum(&self) -> f64 {
        let p = self.prefix_len();
        (0..self.heads)
            .map(|h| self.var[h * self.len..h * self.len + p].iter().map(|&v| f64::from(v)).sum::<f64>())
            .sum()
    }
}

/// A borrowed view of one layer's cached keys and values, `[H_kv, n, d]` each (keys after RoPE).
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    /// KV heads.
    pub kv_heads: usize,
    /// Tokens.
    pub len: usize,
    /// Head dimension `d`.
    pub head_dim: usize,
    /// `[H_kv, n, d]`, `None` when not provided.
    pub keys: Option<&'a [f32]>,
    /// `[H_kv, n, d]`, `None` when not provided.
    pub values: Option<&'a [f32]>,
}

impl<'a> KvView<'a> {
    /// Checks the shapes of whatever is present.
    pub fn validate(&self) -> Result<()> {
        let expected = self.kv_heads * self.len * self.head_dim;
        if let Some(k) = self.keys {
            check_len("keys", k, expected)?;
        }
        if let Some(v) = self.values {
            check_len("values", v, expected)?;
        }
        Ok(())
    }

    /// Row `j` of head `h` of `t` (`[H_kv, n, d]`).
    pub fn row(&self, t: &'a [f32], h: usize, j: usize) -> &'a [f32] {
        let o = (h * self.len + j) * self.head_dim;
        &t[o..o + self.head_dim]
    }
}

/// Mean and covariance of the pre-RoPE queries of a layer (ExpectedAttention's input).
///
/// `mean`: `[H, d]`; `cov`: `[H, d, d]`, the biased covariance `Σ_i (q_i−μ)(q_i−μ)ᵀ / m` over
/// the `m` queries used. Both are sums the prefill pass can accumulate without storing queries.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryMoments {
    /// Query heads.
    pub heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// `[H, d]`.
    pub mean: Vec<f32>,
    /// `[H, d, d]`.
    pub cov: Vec<f32>,
}

impl QueryMoments {
    /// Moments of `queries` (`[H, m, d]`, pre-RoPE), skipping the first `skip` positions.
    pub fn from_queries(queries: &[f32], heads: usize, len: usize, head_dim: usize, skip: usize) -> Result<Self> {
        check_len("queries", queries, heads * len * head_dim)?;
        if skip >= len {
            return Err(PolicyError::Window { window: skip, len, reason: "no query left after the skipped sinks" });
        }
        let d = head_dim;
        let m = (len - skip) as f64;
        let mut mean = vec![0f32; heads * d];
        let mut cov = vec![0f32; heads * d * d];
        for h in 0..heads {
            let row = |i: usize| &queries[(h * len + i) * d..(h * len + i + 1) * d];
            let mut mu = vec![0f64; d];
            for i in skip..len {
                for (a, &x) in mu.iter_mut().zip(row(i)) {
                    *a += f64::from(x);
                }
            }
            mu.iter_mut().for_each(|a| *a /= m);
            let mut c = vec![0f64; d * d];
            for i in skip..len {
                let r = row(i);
                for a in 0..d {
                    let da = f64::from(r[a]) - mu[a];
                    for b in 0..d {
                        c[a * d + b] += da * (f64::from(r[b]) - mu[b]);
                    }
                }
            }
            for a in 0..d {
                mean[h * d + a] = mu[a] as f32;
                for b in 0..d {
                    cov[(h * d + a) * d + b] = (c[a * d + b] / m) as f32;
                }
            }
        }
        Ok(QueryMoments { heads, head_dim, mean, cov })
    }

    /// Checks the shapes.
    pub fn validate(&self) -> Result<()> {
        check_len("query mean", &self.mean, self.heads * self.head_dim)?;
        check_len("query covariance", &self.cov, self.heads * self.head_dim * self.head_dim)
    }
}

/// Everything a scorer may read for one layer.
#[derive(Debug, Clone, Copy)]
pub struct ScoreInput<'a> {
    /// The layer's window statistics.
    pub stats: &'a WindowStats,
    /// Cached keys/values, when the scorer needs them.
    pub kv: Option<KvView<'a>>,
    /// Pre-RoPE query moments, when the scorer needs them.
    pub query_moments: Option<&'a QueryMoments>,
    /// `[H, n]`: `‖v_j · W_o^h‖₁`, the L1 norm of each value after the head's slice of the output
    /// projection (CriticalKV), when the scorer needs it.
    pub value_proj_l1: Option<&'a [f32]>,
    /// Tokens each KV head of this layer will keep (scorers whose ranking depends on it, such as
    /// CriticalKV's two stages, read it; the others ignore it).
    pub budget: usize,
    /// The layer's index in the model (scorers with per-layer parameters, DistillCache, read it).
    pub layer: usize,
}

impl<'a> ScoreInput<'a> {
    /// An input with window statistics only, for layer 0.
    pub fn new(stats: &'a WindowStats, budget: usize) -> Self {
        ScoreInput { stats, kv: None, query_moments: None, value_proj_l1: None, budget, layer: 0 }
    }

    pub(crate) fn keys(&self, method: &'static str) -> Result<(KvView<'a>, &'a [f32])> {
        let kv = self.kv.ok_or(PolicyError::MissingInput { method, input: "keys" })?;
        let k = kv.keys.ok_or(PolicyError::MissingInput { method, input: "keys" })?;
        self.check_kv(&kv)?;
        Ok((kv, k))
    }

    pub(crate) fn values(&self, method: &'static str) -> Result<(KvView<'a>, &'a [f32])> {
        let kv = self.kv.ok_or(PolicyError::MissingInput { method, input: "values" })?;
        let v = kv.values.ok_or(PolicyError::MissingInput { method, input: "values" })?;
        self.check_kv(&kv)?;
        Ok((kv, v))
    }

    fn check_kv(&self, kv: &KvView<'_>) -> Result<()> {
        kv.validate()?;
        if kv.kv_heads != self.stats.kv_heads {
            return Err(PolicyError::ShapeMismatch {
                what: "KV heads",
                expected: self.stats.kv_heads,
                got: kv.kv_heads,
            });
        }
        if kv.len != self.stats.len {
            return Err(PolicyError::ShapeMismatch { what: "KV length", expected: self.stats.len, got: kv.len });
        }
        Ok(())
    }

    pub(crate) fn optional(
        &self,
        method: &'static str,
        input: &'static str,
        v: &'a Option<Vec<f32>>,
    ) -> Result<&'a [f32]> {
        v.as_deref().ok_or(PolicyError::MissingInput { method, input })
    }
}

/// Scores per KV head and position, `[H_kv, n]` row-major. Higher means more worth keeping.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    /// KV heads.
    pub kv_heads: usize,
    /// Positions.
    pub len: usize,
    /// `[H_kv, n]`.
    pub data: Vec<f32>,
}

impl Scores {
    /// Zero scores.
    pub fn zeros(kv_heads: usize, len: usize) -> Self {
        Scores { kv_heads, len, data: vec![0.0; kv_heads * len] }
    }

    /// The scores of KV head `h`.
    pub fn row(&self, h: usize) -> &[f32] {
        &self.data[h * self.len..(h + 1) * self.len]
    }

    /// The scores of KV head `h`, mutable.
    pub fn row_mut(&mut self, h: usize) -> &mut [f32] {
        &mut self.data[h * self.len..(h + 1) * self.len]
    }

    /// Gives every head of each group (`groups`: disjoint lists of heads; heads in none stay
    /// as they are) the mean of the group's rows, so that a selection per head keeps one set
    /// per group: heads that share their cache slots (latent keys) rank them together.
    pub fn pool_groups(&mut self, groups: &[Vec<usize>]) {
        let heads = self.kv_heads;
        for g in groups.iter().filter(|g| g.len() > 1 && g.iter().all(|&h| h < heads)) {
            let mut mean = vec![0.0f32; self.len];
            for &h in g {
                for (m, &x) in mean.iter_mut().zip(self.row(h)) {
                    *m += x;
                }
            }
            let k = g.len() as f32;
            mean.iter_mut().for_each(|m| *m /= k);
            for &h in g {
                self.row_mut(h).copy_from_slice(&mean);
            }
        }
    }
}

/// How a GQA group's query heads are reduced to their KV head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupReduce {
    /// Mean over the group (SnapKV, CAKE, kvpress).
    Mean,
    /// Maximum over the group.
    Max,
}

/// Reduces a `[H, n]` table to `[H_kv, n]` over the GQA groups.
pub fn reduce_groups(table: &[f32], heads: usize, kv_heads: usize, len: usize, how: GroupReduce) -> Result<Scores> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(PolicyError::Grouping { heads, kv_heads });
    }
    check_len("per-head table", table, heads * len)?;
    let g = heads / kv_heads;
    let mut out = Scores::zeros(kv_heads, len);
    for kh in 0..kv_heads {
        let row = out.row_mut(kh);
        for j in 0..len {
            let vals = (0..g).map(|i| f64::from(table[(kh * g + i) * len + j]));
            row[j] = match how {
                GroupReduce::Mean => (vals.sum::<f64>() / g as f64) as f32,
                GroupReduce::Max => vals.fold(f64::NEG_INFINITY, f64::max) as f32,
            };
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::{Protect, select_top_k};

    /// Heads 0 and 2 pooled: each takes the mean of both rows; head 1 is untouched. The pooled
    /// top 2 is one set for both heads where their own top 2 differ.
    #[test]
    fn pooled_heads_rank_their_entries_together() {
        let mut s = Scores { kv_heads: 3, len: 5, data: vec![0.0; 15] };
        s.row_mut(0).copy_from_slice(&[9.0, 1.0, 0.0, 2.0, 0.0]);
        s.row_mut(1).copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        s.row_mut(2).copy_from_slice(&[0.0, 3.0, 1.0, 8.0, 0.0]);
        let none = Protect { sinks: 0, recent: 0 };
        assert_eq!(select_top_k(s.row(0), 2, none).unwrap(), vec![0, 3]);
        assert_eq!(select_top_k(s.row(2), 2, none).unwrap(), vec![1, 3]);
        s.pool_groups(&[vec![0, 2]]);
        assert_eq!(s.row(0), &[4.5, 2.0, 0.5, 5.0, 0.0]);
        assert_eq!(s.row(2), s.row(0));
        assert_eq!(s.row(1), &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(select_top_k(s.row(2), 2, none).unwrap(), vec![0, 3]);
    }
}
