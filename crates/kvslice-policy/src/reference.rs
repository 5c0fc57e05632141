//! Plain f64 definitions of everything the kernels compute, from raw Q/K/V. They define the
//! statistics in [`WindowStats`] and serve the tests (and the kernels' tests) as ground truth.
//! Cost is `O(H·n²·d)`: small inputs only.
//!
//! Shapes: queries `[H, n, d]` (after RoPE unless said otherwise), keys and values `[H_kv, n, d]`,
//! query head `h` reading KV head `h / (H / H_kv)`.

use crate::error::{PolicyError, Result};
use crate::scorer::Rope;
use crate::stats::{NonCausalSpec, NonCausalTable, WindowStats};

/// Shape of one layer's attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Tokens.
    pub len: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl Dims {
    fn check(&self, q: &[f32], k: &[f32], v: Option<&[f32]>) -> Result<()> {
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(PolicyError::Grouping { heads: self.heads, kv_heads: self.kv_heads });
        }
        let qn = self.heads * self.len * self.head_dim;
        let kn = self.kv_heads * self.len * self.head_dim;
        if q.len() != qn {
            return Err(PolicyError::ShapeMismatch { what: "queries", expected: qn, got: q.len() });
        }
        if k.len() != kn {
            return Err(PolicyError::ShapeMismatch { what: "keys", expected: kn, got: k.len() });
        }
        if let Some(v) = v.filter(|v| v.len() != kn) {
            return Err(PolicyError::ShapeMismatch { what: "values", expected: kn, got: v.len() });
        }
        Ok(())
    }

    fn row<'a>(&self, t: &'a [f32], head: usize, i: usize) -> &'a [f32] {
        let o = (head * self.len + i) * self.head_dim;
        &t[o..o + self.head_dim]
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}

fn softmax_over(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// Rotates pre-RoPE queries (or keys) `[heads, n, d]` to positions `0..n`.
pub fn apply_rope(x: &[f32], heads: usize, len: usize, rope: &Rope) -> Vec<f32> {
    let d = rope.head_dim();
    let mut out = x.to_vec();
    for h in 0..heads {
        for i in 0..len {
            rope.rotate(&mut out[(h * len + i) * d..(h * len + i + 1) * d], i);
        }
    }
    out
}

/// Causal softmax attention `[H, n, n]` (row = query, column = key; zero above the diagonal).
pub fn causal_attention(dims: Dims, q: &[f32], k: &[f32]) -> Result<Vec<f64>> {
    dims.check(q, k, None)?;
    let Dims { heads, kv_heads, len: n, head_dim: d } = dims;
    let g = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut a = vec![0f64; heads * n * n];
    for h in 0..heads {
        for i in 0..n {
            let qi = dims.row(q, h, i);
            let logits: Vec<f64> = (0..=i).map(|j| dot(qi, dims.row(k, h / g, j)) * scale).collect();
            let p = softmax_over(&logits);
            a[(h * n + i) * n..(h * n + i) * n + i + 1].copy_from_slice(&p);
        }
    }
    Ok(a)
}

/// Column sums of counter-causal attention (query `i` sees keys `j ≥ i`), `[H, n]`.
pub fn counter_causal_sums(dims: Dims, q: &[f32], k: &[f32]) -> Result<Vec<f32>> {
    dims.check(q, k, None)?;
    let Dims { heads, kv_heads, len: n, head_dim: d } = dims;
    let g = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f64; heads * n];
    for h in 0..heads {
        for i in 0..n {
            let qi = dims.row(q, h, i);
            let logits: Vec<f64> = (i..n).map(|j| dot(qi, dims.row(k, h / g, j)) * scale).collect();
            for (t, p) in softmax_over(&logits).into_iter().enumerate() {
                out[h * n + i + t] += p;
            }
        }
    }
    Ok(out.into_iter().map(|x| x as f32).collect())
}

/// Column sums of chunked non-causal attention, `[H, n]` (see
/// [`crate::WindowStats::non_causal`]): the sequence zero-padded to a multiple of `chunk`, each
/// of its queries (padding included) attending with unscaled logits `⟨q_i, k_j⟩` to every key of
/// its chunk (padding included), the probabilities summed over the chunk's queries.
pub fn non_causal_sums(dims: Dims, q: &[f32], k: &[f32], chunk: usize) -> Result<Vec<f32>> {
    non_causal_sums_over(dims, q, k, NonCausalSpec::whole(chunk))
}

/// [`non_causal_sums`] over `spec`'s range only: the range's positions are a sequence of their
/// own, chunked from its first position; positions outside it are zero.
pub fn non_causal_sums_over(dims: Dims, q: &[f32], k: &[f32], spec: NonCausalSpec) -> Result<Vec<f32>> {
    dims.check(q, k, None)?;
    let chunk = spec.chunk;
    if chunk == 0 {
        return Err(PolicyError::InvalidParameter {
            method: "non-causal-attn",
            name: "chunk",
            reason: "must be positive".into(),
        });
    }
    let Dims { heads, kv_heads, len: n, head_dim: d } = dims;
    let range = spec.range(n);
    let g = heads / kv_heads;
    let zero = vec![0f32; d];
    let mut out = vec![0f64; heads * n];
    for h in 0..heads {
        for start in range.clone().step_by(chunk) {
            let row = |i: usize| if i < range.end { dims.row(q, h, i) } else { &zero[..] };
            let key = |j: usize| if j < range.end { dims.row(k, h / g, j) } else { &zero[..] };
            for i in start..start + chunk {
                let logits: Vec<f64> = (start..start + chunk).map(|j| dot(row(i), key(j))).collect();
                for (t, p) in softmax_over(&logits).into_iter().enumerate() {
                    if start + t < range.end {
                        out[h * n + start + t] += p;
                    }
                }
            }
        }
    }
    Ok(out.into_iter().map(|x| x as f32).collect())
}

/// The chunk [`window_stats`] fills [`WindowStats::non_causal`] with (kvpress's default).
pub const NON_CAUSAL_CHUNK: usize = 256;

/// All window statistics of one layer over the last `window` queries, optional fields included
/// (Jacap's leverage and TwinKV's twins too; the non-causal sums over chunks of
/// [`NON_CAUSAL_CHUNK`]).
pub fn window_stats(dims: Dims, q: &[f32], k: &[f32], v: &[f32], window: usize) -> Result<WindowStats> {
    dims.check(q, k, Some(v))?;
    let Dims { heads, kv_heads, len: n, head_dim: d } = dims;
    if window == 0 || window > n {
        return Err(PolicyError::Window { window, len: n, reason: "need 1 ≤ w ≤ n" });
    }
    let g = heads / kv_heads;
    let att = causal_attention(dims, q, k)?;
    let w = window;
    let prefix = n - w;
    let mut s = WindowStats {
        heads,
        kv_heads,
        len: n,
        window: w,
        mean: vec![0.0; heads * n],
        var: vec![0.0; heads * n],
        last: vec![0.0; heads * n],
        entropy: vec![0.0; heads],
        value_weighted: Some(vec![0.0; heads * n]),
        projection: Some(vec![0.0; heads * n]),
        accumulated: Some(vec![0.0; heads * n]),
        counter_causal: Some(counter_causal_sums(dims, q, k)?),
        non_causal: vec![NonCausalTable {
            spec: NonCausalSpec::whole(NON_CAUSAL_CHUNK),
            sums: non_causal_sums(dims, q, k, NON_CAUSAL_CHUNK)?,
        }],
        jacobian: Some(vec![0.0; heads * n]),
        position_weighted: Some(vec![0.0; heads * n]),
        ..WindowStats::default()
    };
    let vnorm: Vec<f64> =
        (0..kv_heads * n).map(|r| dot(&v[r * d..(r + 1) * d], &v[r * d..(r + 1) * d]).sqrt()).collect();
    for h in 0..heads {
        let kh = h / g;
        let a = |i: usize, j: usize| att[(h * n + i) * n + j];
        let mut ent = 0f64;
        let mut proj = vec![0f64; n];
        let mut jac = vec![0f64; n];
        for i in n - w..n {
            ent -= (0..prefix).map(|j| a(i, j) * (a(i, j) + 1e-10).ln()).sum::<f64>();
            // o_i = Σ_j a_ij v_j, then the projection of each v_j on o_i/‖o_i‖
            let mut o = vec![0f64; d];
            for j in 0..=i {
                for (t, x) in o.iter_mut().enumerate() {
                    *x += a(i, j) * f64::from(v[(kh * n + j) * d + t]);
                }
            }
            let on = o.iter().map(|x| x * x).sum::<f64>().sqrt();
            for j in 0..=i {
                let vj = &v[(kh * n + j) * d..(kh * n + j + 1) * d];
                let p: f64 = vj.iter().zip(&o).map(|(&x, y)| f64::from(x) * y).sum::<f64>() / on.max(f64::MIN_POSITIVE);
                proj[j] += a(i, j) * p;
                let dev: f64 = vj.iter().zip(&o).map(|(&x, y)| (f64::from(x) - y).powi(2)).sum::<f64>().sqrt();
                jac[j] += a(i, j) * dev;
            }
        }
        s.entropy[h] = (ent / w as f64) as f32;
        for j in 0..n {
            let col: Vec<f64> = (n - w..n).map(|i| a(i, j)).collect();
            let mean = col.iter().sum::<f64>() / w as f64;
            let weighted = col.iter().zip(n - w..n).map(|(x, p)| x * p as f64).sum::<f64>() / w as f64;
            let var = if w > 1 { col.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (w - 1) as f64 } else { 0.0 };
            let acc: f64 = (0..n).map(|i| a(i, j)).sum();
            s.mean[h * n + j] = mean as f32;
            s.var[h * n + j] = var as f32;
            s.last[h * n + j] = a(n - 1, j) as f32;
            if let Some(t) = s.value_weighted.as_mut() {
                t[h * n + j] = (mean * vnorm[kh * n + j]) as f32;
            }
            if let Some(t) = s.projection.as_mut() {
                t[h * n + j] = (proj[j] / w as f64) as f32;
            }
            if let Some(t) = s.accumulated.as_mut() {
                t[h * n + j] = acc as f32;
            }
            if let Some(t) = s.jacobian.as_mut() {
                t[h * n + j] = (jac[j] / w as f64) as f32;
            }
            if let Some(t) = s.position_weighted.as_mut() {
                t[h * n + j] = weighted as f32;
            }
        }
    }
    let jac = s.jacobian.as_deref().unwrap_or_default();
    let w = crate::scorer::jacap::weights(jac, heads, kv_heads, n)?;
    s.leverage = Some(crate::scorer::jacap::ridge_leverage(k, &w.data, kv_heads, n, d)?);
    let (twin, twin_index) = crate::scorer::twin::twins(k, kv_heads, n, d)?;
    s.twin = Some(twin);
    s.twin_index = Some(twin_index);
    Ok(s)
}

/// `‖v_j · W_o^h‖₁` per query head, `[H, n]` (CriticalKV). `w_o` is the output projection's
/// weight as stored by PyTorch's `Linear`: `[hidden, H·d]`; head `h`'s slice is columns
/// `h·d..(h+1)·d`.
pub fn value_proj_l1(dims: Dims, v: &[f32], w_o: &[f32], hidden: usize) -> Result<Vec<f32>> {
    let Dims { heads, kv_heads, len: n, head_dim: d } = dims;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(PolicyError::Grouping { heads, kv_heads });
    }
    if w_o.len() != hidden * heads * d {
        return Err(PolicyError::ShapeMismatch {
            what: "output projection",
            expected: hidden * heads * d,
            got: w_o.len(),
        });
    }
    if v.len() != kv_heads * n * d {
        return Err(PolicyError::ShapeMismatch { what: "values", expected: kv_heads * n * d, got: v.len() });
    }
    let g = heads / kv_heads;
    let mut out = vec![0f32; heads * n];
    for h in 0..heads {
        for j in 0..n {
            let vj = &v[((h / g) * n + j) * d..((h / g) * n + j + 1) * d];
            let mut l1 = 0f64;
            for o in 0..hidden {
                let row = &w_o[o * heads * d + h * d..o * heads * d + (h + 1) * d];
                l1 += dot(vj, row).abs();
            }
            out[h * n + j] = l1 as f32;
        }
    }
    Ok(out)
}

/// KVzip's context-reconstruction importance (Kim et al. 2025, arXiv:2505.23416; kvpress's
/// `KVzipPress.score_kvzip`) of the context keys in `range`. `k` holds the cache after the `r`
/// reconstruction tokens were appended to the `n` context keys (`[H_kv, n + r, d]`, `dims.len`
/// is `n + r`), and `q` their queries (`[H, r, d]`, after RoPE). Each query's softmax
/// (logits scaled by `1/√d`) runs over the first `min(sinks, range.start)` keys, the keys of
/// `range`, and the reconstruction keys up to its own; key `j ∈ range` scores the highest
/// weight on it over the `r` queries and the query heads of its KV head. Returns
/// `[H_kv, range.len()]`.
pub fn reconstruction_scores(
    dims: Dims,
    q: &[f32],
    k: &[f32],
    reconstruction: usize,
    sinks: usize,
    range: std::ops::Range<usize>,
) -> Result<Vec<f32>> {
    let Dims { heads, kv_heads, len: total, head_dim: d } = dims;
    let r = reconstruction;
    if r == 0 || r > total || range.end > total - r || range.start > range.end {
        return Err(PolicyError::InvalidParameter {
            method: "kvzip",
            name: "range",
            reason: format!("{range:?} and {r} reconstruction tokens do not fit {total} cached keys"),
        });
    }
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(PolicyError::Grouping { heads, kv_heads });
    }
    if k.len() != kv_heads * total * d {
        return Err(PolicyError::ShapeMismatch { what: "keys", expected: kv_heads * total * d, got: k.len() });
    }
    if q.len() != heads * r * d {
        return Err(PolicyError::ShapeMismatch {
            what: "reconstruction queries",
            expected: heads * r * d,
            got: q.len(),
        });
    }
    let n = total - r;
    let g = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let sink = sinks.min(range.start);
    let m = range.len();
    let mut out = vec![0f64; kv_heads * m];
    for h in 0..heads {
        let kh = h / g;
        for i in 0..r {
            let qi = &q[(h * r + i) * d..(h * r + i + 1) * d];
            let cols: Vec<usize> = (0..sink).chain(range.clone()).chain(n..=n + i).collect();
            let logits: Vec<f64> = cols.iter().map(|&j| dot(qi, dims.row(k, kh, j)) * scale).collect();
            let p = softmax_over(&logits);
            for (c, &w) in p[sink..sink + m].iter().enumerate() {
                let o = &mut out[kh * m + c];
                *o = o.max(w);
            }
        }
    }
    Ok(out.into_iter().map(|x| x as f32).collect())
}
