//! Low-rank keys with KV heads grouped by the similarity of their keys (ReCalKV, arXiv
//! 2505.24357: heads reordered by Centered Kernel Alignment, then a grouped SVD of the key
//! projection; Palu, arXiv 2407.21118, for the grouped low-rank decomposition).
//!
//! Calibration sees a layer's pre-RoPE keys `K = X W_k (+ b)` on public-domain text, all KV
//! heads side by side (`[n, kv_heads · head_dim]`), through their second moments only
//! ([`KeyMoments`]: the sum and the Gram matrix `KᵀK`, so any amount of text costs the same
//! memory). From them:
//! - **CKA** between heads `i` and `j` (linear kernel, Kornblith et al. 2019):
//!   `‖K̄ⱼᵀ K̄ᵢ‖²_F / (‖K̄ᵢᵀ K̄ᵢ‖_F ‖K̄ⱼᵀ K̄ⱼ‖_F)` with `K̄` the keys centred over the tokens;
//! - **groups**: average-linkage agglomeration of the heads on CKA, at most `max_group` heads a
//!   group, until `⌈kv_heads / max_group⌉` groups remain (or no merge fits);
//! - **bases**: per group the leading eigenvectors `U_g` of its keys' second moment — the
//!   data-aware SVD of `K_g = X W_{k,g}`: `K_g U_g U_gᵀ` is the best rank-`r_g` approximation
//!   of the calibration keys (Eckart–Young), its squared error the sum of the dropped
//!   eigenvalues;
//! - **ranks**: a layer's rank budget goes to the groups' largest eigenvalues first (every
//!   group at least one), which minimises the layer's total squared error.
//!
//! A group's latent is `c = x W_{k,g} U_g` (`r_g` numbers per token for the whole group) and its
//! keys are `c U_gᵀ`, rotated by RoPE after the reconstruction.

use crate::error::{ModelError, Result};

pub use kvslice_formats::lowrank::{FORMAT, KeyGroup, LowRankKeys, MAX_FILE_BYTES, VERSION};

fn bad(reason: impl Into<String>) -> ModelError {
    ModelError::LowRank(reason.into())
}

/// Sum and Gram matrix of one layer's pre-RoPE keys, every KV head side by side (f64).
#[derive(Clone, Debug, PartialEq)]
pub struct KeyMoments {
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Rows added.
    pub count: u64,
    /// `[width]`, `width = kv_heads · head_dim`.
    pub sum: Vec<f64>,
    /// `[width, width]` row-major, `Σ k kᵀ`.
    pub gram: Vec<f64>,
    /// `[width]`: per KV head and RoPE pair `(j, j + d/2)`, `Σ ‖q_j‖²` over the tokens and the
    /// query heads that read the KV head (both columns of a pair hold the pair's sum).
    pub query_energy: Vec<f64>,
    /// Tokens whose queries were added.
    pub query_count: u64,
}

impl KeyMoments {
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        let w = kv_heads * head_dim;
        KeyMoments {
            kv_heads,
            head_dim,
            count: 0,
            sum: vec![0.0; w],
            gram: vec![0.0; w * w],
            query_energy: vec![0.0; w],
            query_count: 0,
        }
    }

    /// Adds queries `[heads, n, head_dim]` (row-major; RoPE-rotated or not, a pair's norm is
    /// the same), query head `q` reading KV head `q / (heads / kv_heads)`.
    pub fn add_queries(&mut self, queries: &[f32], heads: usize) -> Result<()> {
        let d = self.head_dim;
        if heads == 0 || !heads.is_multiple_of(self.kv_heads) || !queries.len().is_multiple_of(heads * d) {
            return Err(bad(format!("{} query values are not {heads} heads of rows of {d}", queries.len())));
        }
        if queries.iter().any(|x| !x.is_finite()) {
            return Err(bad("a calibration query is not finite"));
        }
        let (n, group, half) = (queries.len() / (heads * d), heads / self.kv_heads, d / 2);
        for (qh, head) in queries.chunks_exact(n * d).enumerate() {
            let kv = qh / group;
            for row in head.chunks_exact(d) {
                for j in 0..half {
                    let e = (row[j] as f64).powi(2) + (row[j + half] as f64).powi(2);
                    self.query_energy[kv * d + j] += e;
                    self.query_energy[kv * d + j + half] += e;
                }
            }
        }
        self.query_count += n as u64;
        Ok(())
    }

    /// Columns of a row: `kv_heads · head_dim`.
    pub fn width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Adds rows `[n, width]` (row-major); a length that is not a whole number of rows, or a
    /// value that is not finite, is an error and adds nothing.
    pub fn add(&mut self, rows: &[f32]) -> Result<()> {
        let w = self.width();
        if w == 0 || !rows.len().is_multiple_of(w) {
            return Err(bad(format!("{} values are not rows of {w} keys", rows.len())));
        }
        if rows.iter().any(|x| !x.is_finite()) {
            return Err(bad("a calibration key is not finite"));
        }
        for row in rows.chunks_exact(w) {
            let row: Vec<f64> = row.iter().map(|&x| x as f64).collect();
            for (a, &x) in row.iter().enumerate() {
                self.sum[a] += x;
                let g = &mut self.gram[a * w..(a + 1) * w];
                // upper triangle only; mirrored by `symmetrise`
                for (b, &y) in row.iter().enumerate().skip(a) {
                    g[b] += x * y;
                }
            }
        }
        for a in 0..w {
            for b in 0..a {
                self.gram[a * w + b] = self.gram[b * w + a];
            }
        }
        self.count += (rows.len() / w) as u64;
        Ok(())
    }

    /// The centred cross-products of heads `i` and `j`: `[d, d]`, `(K̄ᵢᵀ K̄ⱼ)[a][b]`.
    fn centred_block(&self, i: usize, j: usize) -> Vec<f64> {
        let (w, d, n) = (self.width(), self.head_dim, self.count.max(1) as f64);
        let mut out = vec![0.0; d * d];
        for a in 0..d {
            for b in 0..d {
                let (ra, cb) = (i * d + a, j * d + b);
                out[a * d + b] = self.gram[ra * w + cb] - self.sum[ra] * self.sum[cb] / n;
            }
        }
        out
    }

    /// Linear CKA of heads `i` and `j`'s keys, in `[0, 1]` (1 for `i == j`; 0 when a head's
    /// keys do not vary).
    pub fn cka(&self, i: usize, j: usize) -> f64 {
        let frob = |m: &[f64]| m.iter().map(|x| x * x).sum::<f64>();
        let cross = frob(&self.centred_block(i, j));
        let (ii, jj) = (frob(&self.centred_block(i, i)).sqrt(), frob(&self.centred_block(j, j)).sqrt());
        if ii == 0.0 || jj == 0.0 { 0.0 } else { (cross / (ii * jj)).clamp(0.0, 1.0) }
    }

    /// Every pair's CKA, `[kv_heads, kv_heads]` row-major.
    pub fn cka_matrix(&self) -> Vec<f64> {
        let h = self.kv_heads;
        let mut m = vec![0.0; h * h];
        for i in 0..h {
            for j in i..h {
                let c = if i == j { 1.0 } else { self.cka(i, j) };
                m[i * h + j] = c;
                m[j * h + i] = c;
            }
        }
        m
    }

    /// The uncentred second moment of `heads`' keys side by side with column `a` scaled by
    /// `scale[a]`, `[|heads|·d, |heads|·d]`.
    fn second_moment(&self, heads: &[usize], scale: &[f64]) -> Vec<f64> {
        let (w, d, n) = (self.width(), self.head_dim, self.count.max(1) as f64);
        let cols: Vec<usize> = heads.iter().flat_map(|&h| h * d..(h + 1) * d).collect();
        let m = cols.len();
        let mut out = vec![0.0; m * m];
        for (a, &ca) in cols.iter().enumerate() {
            for (b, &cb) in cols.iter().enumerate() {
                out[a * m + b] = scale[a] * self.gram[ca * w + cb] / n * scale[b];
            }
        }
        out
    }

    /// Per column of `heads`, the square root of its weight in the error: 1 for
    /// [`Weighting::Keys`]; for [`Weighting::Queries`] the mean query energy of its RoPE pair,
    /// floored at 1e-6 of the largest (a column no query reads still keeps a finite inverse).
    fn scales(&self, heads: &[usize], weighting: Weighting) -> Result<Vec<f64>> {
        let d = self.head_dim;
        let cols = heads.iter().flat_map(|&h| h * d..(h + 1) * d);
        match weighting {
            Weighting::Keys => Ok(vec![1.0; heads.len() * d]),
            Weighting::Queries => {
                if self.query_count == 0 {
                    return Err(bad("weighting by the queries needs calibration queries"));
                }
                let e: Vec<f64> = cols.map(|c| self.query_energy[c] / self.query_count as f64).collect();
                let floor = e.iter().copied().fold(0.0, f64::max) * 1e-6;
                if floor <= 0.0 {
                    return Err(bad("the calibration queries are all zero"));
                }
                Ok(e.into_iter().map(|x| x.max(floor).sqrt()).collect())
            }
        }
    }
}

/// Heads grouped by average-linkage agglomeration on `similarity` (`[heads, heads]`): the two
/// groups of highest mean pairwise similarity whose union has at most `max_group` heads merge,
/// until `⌈heads / max_group⌉` groups remain or no merge fits. Ties go to the lowest heads.
/// Each group lists its heads in ascending order; groups are ordered by their first head.
pub fn group_heads(similarity: &[f64], heads: usize, max_group: usize) -> Vec<Vec<usize>> {
    let max_group = max_group.clamp(1, heads.max(1));
    let target = heads.div_ceil(max_group);
    let mut groups: Vec<Vec<usize>> = (0..heads).map(|h| vec![h]).collect();
    while groups.len() > target {
        let mut best: Option<(f64, usize, usize)> = None;
        for a in 0..groups.len() {
            for b in a + 1..groups.len() {
                if groups[a].len() + groups[b].len() > max_group {
                    continue;
                }
                let pairs = (groups[a].len() * groups[b].len()) as f64;
                let mean = groups[a]
                    .iter()
                    .flat_map(|&i| groups[b].iter().map(move |&j| similarity[i * heads + j]))
                    .sum::<f64>()
                    / pairs;
                if best.is_none_or(|(m, _, _)| mean > m) {
                    best = Some((mean, a, b));
                }
            }
        }
        let Some((_, a, b)) = best else { break };
        let merged = groups.remove(b);
        groups[a].extend(merged);
        groups[a].sort_unstable();
    }
    groups.sort_by_key(|g| g[0]);
    groups
}

/// Eigenvalues (descending) and eigenvectors of the symmetric `[n, n]` matrix `a` (row-major)
/// by cyclic Jacobi rotations: `vectors[i * n + k]` is component `i` of the `k`-th vector.
pub fn symmetric_eigen(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut m = a.to_vec();
    let mut v = vec![0.0; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    let scale = m.iter().map(|x| x * x).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| m[i * n + j] * m[i * n + j])
            .sum();
        if off.sqrt() <= 1e-15 * scale {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = m[p * n + q];
                if apq.abs() <= 1e-300 {
                    continue;
                }
                let (app, aqq) = (m[p * n + p], m[q * n + q]);
                let theta = (aqq - app) / (2.0 * apq);
                let sign = if theta >= 0.0 { 1.0 } else { -1.0 };
                let t = sign / (theta.abs() + (theta * theta + 1.0).sqrt());
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (mkp, mkq) = (m[k * n + p], m[k * n + q]);
                    m[k * n + p] = c * mkp - s * mkq;
                    m[k * n + q] = s * mkp + c * mkq;
                }
                for k in 0..n {
                    let (mpk, mqk) = (m[p * n + k], m[q * n + k]);
                    m[p * n + k] = c * mpk - s * mqk;
                    m[q * n + k] = s * mpk + c * mqk;
                }
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| m[y * n + y].total_cmp(&m[x * n + x]).then(x.cmp(&y)));
    let values = order.iter().map(|&k| m[k * n + k]).collect();
    let mut vectors = vec![0.0; n * n];
    for (new, &old) in order.iter().enumerate() {
        for i in 0..n {
            vectors[i * n + new] = v[i * n + old];
        }
    }
    (values, vectors)
}

/// Ranks for groups with these eigenvalue spectra (each descending) summing to `total`: every
/// group gets one, then each further unit goes to the largest eigenvalue not yet kept. `total`
/// is clamped to `[groups, Σ dims]`.
pub fn allocate_ranks(spectra: &[Vec<f64>], total: usize) -> Vec<usize> {
    let dims: usize = spectra.iter().map(Vec::len).sum();
    let total = total.clamp(spectra.len(), dims);
    let mut ranks: Vec<usize> = spectra.iter().map(|s| usize::from(!s.is_empty())).collect();
    let mut used: usize = ranks.iter().sum();
    while used < total {
        let next = (0..spectra.len())
            .filter(|&g| ranks[g] < spectra[g].len())
            .max_by(|&a, &b| spectra[a][ranks[a]].total_cmp(&spectra[b][ranks[b]]).then(b.cmp(&a)));
        let Some(g) = next else { break };
        ranks[g] += 1;
        used += 1;
    }
    ranks
}

/// How many latent dimensions a layer keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RankSpec {
    /// A share of the key width `kv_heads · head_dim`, in `(0, 1]`.
    Fraction(f64),
    /// Latent dimensions per layer.
    Dims(usize),
}

impl std::str::FromStr for RankSpec {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if let Ok(d) = s.parse::<usize>() {
            return if d == 0 { Err(bad("a rank of 0 keeps no key")) } else { Ok(RankSpec::Dims(d)) };
        }
        let f = match s.strip_suffix('%') {
            Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
            None => s.parse::<f64>(),
        }
        .map_err(|_| bad(format!("rank `{s}`: a share of the key width (0.5, 50%) or a number of dimensions")))?;
        if !(f > 0.0 && f <= 1.0) {
            return Err(bad(format!("rank `{s}`: the share must lie in (0, 1]")));
        }
        Ok(RankSpec::Fraction(f))
    }
}

impl RankSpec {
    /// Dimensions for a key width of `width`, at least 1 and at most `width`.
    pub fn dims(&self, width: usize) -> usize {
        match *self {
            RankSpec::Fraction(f) => ((f * width as f64).round() as usize).clamp(1, width),
            RankSpec::Dims(d) => d.clamp(1, width),
        }
    }
}

/// How a layer's KV heads form groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// By the similarity of their keys ([`group_heads`] on CKA), at most this many a group.
    Cka(usize),
    /// Neighbours in the heads' order, this many a group (the last may hold fewer): the
    /// grouping that ignores the keys, to compare with.
    Adjacent(usize),
}

impl Grouping {
    /// The most heads a group holds.
    pub fn size(&self) -> usize {
        match *self {
            Grouping::Cka(n) | Grouping::Adjacent(n) => n,
        }
    }
}

/// What a reconstruction's error is measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weighting {
    /// The keys' own squared error: the SVD of the key projection on calibration text.
    Keys,
    /// The attention logits' expected squared error: with relative positions spread over many
    /// turns of a RoPE pair, `E[(qᵀ R e)²] ≈ Σ_j ‖q_j‖² ‖e_j‖² / 2` for a key error `e`, so each
    /// pair of key columns is weighted by the energy the queries of its KV head put in it.
    Queries,
}

/// How the latent dimensions are shared out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Every layer the same number, spent within it on its groups' largest eigenvalues.
    PerLayer,
    /// The model's total (`layers ×` a layer's share) on the largest eigenvalues of any group
    /// of any layer: with [`Weighting::Queries`] they all measure the expected squared
    /// attention logit, so this minimises the model's total error in one unit.
    Model,
}

/// Everything calibration decides with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// Latent dimensions per layer (on average, with [`Allocation::Model`]).
    pub rank: RankSpec,
    pub grouping: Grouping,
    pub weighting: Weighting,
    pub allocation: Allocation,
}

impl Settings {
    /// `rank` with groups of at most `max_group` heads by CKA, weighted by the queries, the
    /// dimensions shared out over the model.
    pub fn new(rank: RankSpec, max_group: usize) -> Self {
        Settings {
            rank,
            grouping: Grouping::Cka(max_group),
            weighting: Weighting::Queries,
            allocation: Allocation::Model,
        }
    }
}

/// What calibration found for one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerReport {
    /// `[kv_heads, kv_heads]` linear CKA.
    pub cka: Vec<f64>,
    pub groups: Vec<Vec<usize>>,
    pub ranks: Vec<usize>,
    /// Squared reconstruction error of the calibration keys over their squared norm (the
    /// dropped eigenvalues' share; both weighted as the settings say).
    pub relative_error: f64,
    /// The keys' mean squared norm, weighted likewise (what the layer's share is of).
    pub energy: f64,
}

/// Groups, bases and ranks from every layer's moments (see the module docs): groups as
/// `grouping` forms them, `rank` latent dimensions per layer.
pub fn calibrate(moments: &[KeyMoments], settings: &Settings) -> Result<(LowRankKeys, Vec<LayerReport>)> {
    let Settings { rank, grouping, weighting, allocation } = *settings;
    let first = moments.first().ok_or_else(|| bad("no layers to calibrate"))?;
    let (kv_heads, d) = (first.kv_heads, first.head_dim);
    if kv_heads == 0 || d == 0 {
        return Err(bad("a layer without keys"));
    }
    if moments.iter().any(|m| m.kv_heads != kv_heads || m.head_dim != d || m.count == 0) {
        return Err(bad("every layer needs calibration keys of one shape"));
    }
    if grouping.size() == 0 {
        return Err(bad("a group holds at least one head"));
    }
    // per layer: CKA, groups, scales, and each group's eigen-decomposition
    let mut found = Vec::with_capacity(moments.len());
    for m in moments {
        let cka = m.cka_matrix();
        let groups = match grouping {
            Grouping::Cka(size) => group_heads(&cka, kv_heads, size),
            Grouping::Adjacent(size) => (0..kv_heads).collect::<Vec<_>>().chunks(size).map(<[usize]>::to_vec).collect(),
        };
        let scales = groups.iter().map(|g| m.scales(g, weighting)).collect::<Result<Vec<_>>>()?;
        let eig: Vec<(Vec<f64>, Vec<f64>)> = groups
            .iter()
            .zip(&scales)
            .map(|(g, scale)| {
                let (values, vectors) = symmetric_eigen(&m.second_moment(g, scale), g.len() * d);
                (values.into_iter().map(|x| x.max(0.0)).collect(), vectors)
            })
            .collect();
        found.push((cka, groups, scales, eig));
    }
    let per_layer = rank.dims(kv_heads * d);
    let ranks: Vec<Vec<usize>> = match allocation {
        Allocation::PerLayer => found
            .iter()
            .map(|(_, _, _, eig)| allocate_ranks(&eig.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>(), per_layer))
            .collect(),
        Allocation::Model => {
            let spectra: Vec<Vec<f64>> =
                found.iter().flat_map(|(_, _, _, eig)| eig.iter().map(|(v, _)| v.clone())).collect();
            let mut flat = allocate_ranks(&spectra, per_layer * moments.len()).into_iter();
            found.iter().map(|(_, groups, _, _)| flat.by_ref().take(groups.len()).collect()).collect()
        }
    };
    let mut layers = Vec::with_capacity(moments.len());
    let mut reports = Vec::with_capacity(moments.len());
    for ((cka, groups, scales, eig), ranks) in found.into_iter().zip(ranks) {
        let energy: f64 = eig.iter().flat_map(|(v, _)| v).sum();
        let kept: f64 = eig.iter().zip(&ranks).map(|((v, _), &r)| v[..r].iter().sum::<f64>()).sum();
        let relative_error = if energy > 0.0 { ((energy - kept) / energy).max(0.0) } else { 0.0 };
        let layer = groups
            .iter()
            .zip(&eig)
            .zip(&ranks)
            .zip(&scales)
            .map(|(((g, (_, vectors)), &r), scale)| {
                let n = g.len() * d;
                let basis = (0..n).flat_map(|i| (0..r).map(move |k| vectors[i * n + k] as f32)).collect();
                let scale = scale.iter().map(|&x| x as f32).collect();
                KeyGroup { heads: g.clone(), rank: r, basis, scale }
            })
            .collect();
        layers.push(layer);
        reports.push(LayerReport { cka, groups, ranks, relative_error, energy });
    }
    let keys = LowRankKeys { kv_heads, head_dim: d, layers };
    keys.validate()?;
    Ok((keys, reports))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded generator of values in [-1, 1).
    fn rng(seed: u64) -> impl FnMut() -> f64 {
        let mut s = seed;
        move || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        }
    }

    /// `n` rows of `heads · d` keys: head 2 is head 0 rotated and scaled, the others random,
    /// every column scaled by a decaying spectrum and shifted by an offset.
    fn keys(n: usize, heads: usize, d: usize, seed: u64) -> Vec<f32> {
        let mut r = rng(seed);
        let mut out = vec![0.0f32; n * heads * d];
        for t in 0..n {
            for h in 0..heads {
                for c in 0..d {
                    let scale = 1.0 / (1.0 + c as f64);
                    out[(t * heads + h) * d + c] = (r() * scale + 0.1 * h as f64) as f32;
                }
            }
            if heads > 2 {
                for c in 0..d {
                    let src = out[t * heads * d + (c + 1) % d];
                    out[(t * heads + 2) * d + c] = 3.0 * src + 0.01 * r() as f32;
                }
            }
        }
        out
    }

    /// Moments of `rows`, with queries of two query heads per KV head whose energy falls with
    /// the column (as RoPE's low-frequency pairs draw most of it in trained models).
    fn moments(rows: &[f32], heads: usize, d: usize) -> KeyMoments {
        let mut m = KeyMoments::new(heads, d);
        m.add(rows).unwrap();
        let n = rows.len() / (heads * d);
        let mut r = rng(55);
        let q: Vec<f32> = (0..2 * heads * n * d).map(|i| (r() * 4.0 / (1.0 + (i % d) as f64)) as f32).collect();
        m.add_queries(&q, 2 * heads).unwrap();
        m
    }

    /// The queries' weights of every column, as [`KeyMoments::scales`] squares them.
    fn weights(m: &KeyMoments) -> Vec<f64> {
        let heads: Vec<usize> = (0..m.kv_heads).collect();
        m.scales(&heads, Weighting::Queries).unwrap().iter().map(|s| s * s).collect()
    }

    #[test]
    fn cka_is_the_direct_kernel_alignment() {
        let (n, heads, d) = (40, 3, 4);
        let rows = keys(n, heads, d, 1);
        let m = moments(&rows, heads, d);
        // HSIC with explicit n×n kernels and the centring matrix H = I − 11ᵀ/n
        let gram = |h: usize| {
            let mut k = vec![0.0f64; n * n];
            for a in 0..n {
                for b in 0..n {
                    k[a * n + b] = (0..d)
                        .map(|c| rows[(a * heads + h) * d + c] as f64 * rows[(b * heads + h) * d + c] as f64)
                        .sum();
                }
            }
            k
        };
        let centre = |k: &[f64]| {
            let mut out = vec![0.0; n * n];
            let row: Vec<f64> = (0..n).map(|a| k[a * n..(a + 1) * n].iter().sum::<f64>() / n as f64).collect();
            let all = row.iter().sum::<f64>() / n as f64;
            for a in 0..n {
                for b in 0..n {
                    out[a * n + b] = k[a * n + b] - row[a] - row[b] + all;
                }
            }
            out
        };
        let hsic = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            let (ki, kj) = (centre(&gram(i)), centre(&gram(j)));
            let direct = hsic(&ki, &kj) / (hsic(&ki, &ki) * hsic(&kj, &kj)).sqrt();
            assert!((m.cka(i, j) - direct).abs() < 1e-9, "heads {i},{j}: {} vs {direct}", m.cka(i, j));
        }
        // head 2 is a linear image of head 0: their alignment is far above the random pair's
        assert!(m.cka(0, 2) > 0.5 && m.cka(0, 1) < 0.3, "{} {}", m.cka(0, 2), m.cka(0, 1));
        assert_eq!(m.cka_matrix()[4], 1.0);
    }

    #[test]
    fn moments_refuse_ragged_or_broken_rows() {
        let mut m = KeyMoments::new(2, 2);
        assert!(m.add(&[1.0; 5]).is_err());
        assert!(m.add(&[1.0, f32::NAN, 0.0, 0.0]).is_err());
        assert_eq!(m.count, 0);
        m.add(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!((m.count, m.gram[1], m.gram[4], m.sum[3]), (1, 2.0, 2.0, 4.0));
    }

    #[test]
    fn eigen_decomposition_reconstructs_its_matrix() {
        let (values, vectors) = symmetric_eigen(&[2.0, 1.0, 1.0, 2.0], 2);
        assert!((values[0] - 3.0).abs() < 1e-12 && (values[1] - 1.0).abs() < 1e-12, "{values:?}");
        assert!((vectors[0].abs() - 0.5f64.sqrt()).abs() < 1e-12);
        let n = 12;
        let mut r = rng(7);
        let b: Vec<f64> = (0..n * n).map(|_| r()).collect();
        let a: Vec<f64> = (0..n * n).map(|i| (0..n).map(|k| b[(i / n) * n + k] * b[(i % n) * n + k]).sum()).collect();
        let (values, v) = symmetric_eigen(&a, n);
        assert!(values.windows(2).all(|w| w[0] >= w[1]));
        for i in 0..n {
            for j in 0..n {
                let back: f64 = (0..n).map(|k| v[i * n + k] * values[k] * v[j * n + k]).sum();
                assert!((back - a[i * n + j]).abs() < 1e-9);
                let dot: f64 = (0..n).map(|k| v[k * n + i] * v[k * n + j]).sum();
                assert!((dot - f64::from(u8::from(i == j))).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn heads_group_by_similarity_within_the_size_limit() {
        // 0~2 and 1~3 alike
        #[rustfmt::skip]
        let s = [
            1.0, 0.1, 0.9, 0.2,
            0.1, 1.0, 0.3, 0.8,
            0.9, 0.3, 1.0, 0.1,
            0.2, 0.8, 0.1, 1.0,
        ];
        assert_eq!(group_heads(&s, 4, 2), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(group_heads(&s, 4, 1), vec![vec![0], vec![1], vec![2], vec![3]]);
        assert_eq!(group_heads(&s, 4, 4), vec![vec![0, 1, 2, 3]]);
        // three heads in groups of two: the closest pair, and the third alone
        let s3 = [1.0, 0.2, 0.7, 0.2, 1.0, 0.1, 0.7, 0.1, 1.0];
        assert_eq!(group_heads(&s3, 3, 2), vec![vec![0, 2], vec![1]]);
    }

    #[test]
    fn ranks_go_to_the_largest_eigenvalues() {
        let spectra = vec![vec![10.0, 1.0, 0.5], vec![5.0, 4.0, 3.0]];
        assert_eq!(allocate_ranks(&spectra, 2), vec![1, 1]);
        assert_eq!(allocate_ranks(&spectra, 4), vec![1, 3]);
        assert_eq!(allocate_ranks(&spectra, 5), vec![2, 3]);
        assert_eq!(allocate_ranks(&spectra, 99), vec![3, 3]);
        assert_eq!(allocate_ranks(&spectra, 0), vec![1, 1]);
    }

    #[test]
    fn the_model_allocation_spends_the_total_on_the_largest_eigenvalues() {
        let (heads, d) = (2, 4);
        // layer 1's keys ten times layer 0's: its eigenvalues are a hundred times larger
        let small = keys(40, heads, d, 31);
        let large: Vec<f32> = small.iter().map(|x| 10.0 * x).collect();
        let layers = [moments(&small, heads, d), moments(&large, heads, d)];
        let settings = |allocation| Settings { allocation, ..keys_only(RankSpec::Dims(4), Grouping::Cka(1)) };
        let (per_layer, _) = calibrate(&layers, &settings(Allocation::PerLayer)).unwrap();
        assert_eq!((per_layer.latent_width(0), per_layer.latent_width(1)), (4, 4));
        let (model, reports) = calibrate(&layers, &settings(Allocation::Model)).unwrap();
        assert_eq!(model.latent_width(0) + model.latent_width(1), 8);
        // every group keeps one; the rest go to layer 1, whose every eigenvalue is larger
        assert_eq!(model.latent_width(0), 2);
        assert!((reports[1].energy / reports[0].energy - 100.0).abs() < 1e-6);
    }

    #[test]
    fn rank_specs_parse_or_say_why_not() {
        assert_eq!("0.5".parse::<RankSpec>().unwrap(), RankSpec::Fraction(0.5));
        assert_eq!("25%".parse::<RankSpec>().unwrap(), RankSpec::Fraction(0.25));
        assert_eq!("96".parse::<RankSpec>().unwrap(), RankSpec::Dims(96));
        assert_eq!(RankSpec::Fraction(0.5).dims(192), 96);
        assert_eq!(RankSpec::Dims(500).dims(192), 192);
        for bad in ["0", "1.5", "-0.2", "half", "0%"] {
            assert!(bad.parse::<RankSpec>().is_err(), "{bad}");
        }
    }

    /// The keys' own error, one layer's dimensions within it.
    fn keys_only(rank: RankSpec, grouping: Grouping) -> Settings {
        Settings { rank, grouping, weighting: Weighting::Keys, allocation: Allocation::PerLayer }
    }

    /// `‖K − K P‖²_F / ‖K‖²_F` over the rows.
    fn direct_error(rows: &[f32], p: &[f32], w: usize) -> f64 {
        weighted_error(rows, p, w, &vec![1.0; w])
    }

    /// `Σ_b weight_b (K − K P)²_b / Σ_b weight_b K²_b` over the rows.
    fn weighted_error(rows: &[f32], p: &[f32], w: usize, weight: &[f64]) -> f64 {
        let (mut err, mut all) = (0.0f64, 0.0f64);
        for row in rows.chunks_exact(w) {
            for b in 0..w {
                let back: f64 = (0..w).map(|a| row[a] as f64 * p[a * w + b] as f64).sum();
                err += weight[b] * (row[b] as f64 - back).powi(2);
                all += weight[b] * (row[b] as f64).powi(2);
            }
        }
        err / all
    }

    #[test]
    fn query_weighted_bases_minimise_the_weighted_error() {
        let (n, heads, d) = (64, 3, 8);
        let w = heads * d;
        let rows = keys(n, heads, d, 21);
        let m = moments(&rows, heads, d);
        let weight = weights(&m);
        // the pair's energy in both of its columns
        assert_eq!(m.query_energy[1], m.query_energy[1 + d / 2]);
        for r in [3, 8, 16] {
            let spec = RankSpec::Dims(r);
            let one = |weighting| {
                calibrate(std::slice::from_ref(&m), &Settings { weighting, ..keys_only(spec, Grouping::Cka(heads)) })
            };
            let (by_queries, reports) = one(Weighting::Queries).unwrap();
            let (by_keys, _) = one(Weighting::Keys).unwrap();
            let direct = weighted_error(&rows, &by_queries.projector(0).unwrap(), w, &weight);
            assert!(
                (direct - reports[0].relative_error).abs() < 1e-5,
                "rank {r}: {direct} vs {}",
                reports[0].relative_error
            );
            let other = weighted_error(&rows, &by_keys.projector(0).unwrap(), w, &weight);
            assert!(direct <= other + 1e-9, "rank {r}: {direct} above the keys' basis {other}");
        }
        let mut none = KeyMoments::new(heads, d);
        none.add(&rows).unwrap();
        assert!(calibrate(&[none], &Settings::new(RankSpec::Dims(4), 1)).is_err());
        assert!(m.clone().add_queries(&[1.0; 10], 2).is_err());
    }

    #[test]
    fn reconstruction_error_is_the_rank_bound() {
        let (n, heads, d) = (64, 3, 8);
        let w = heads * d;
        let rows = keys(n, heads, d, 3);
        let m = moments(&rows, heads, d);
        // the singular values of K from the eigenvalues of the row Gram K Kᵀ (n × n): an
        // independent route to Eckart–Young's bound Σ_{i>r} σᵢ² for one group of all heads
        let row_gram: Vec<f64> = (0..n * n)
            .map(|i| (0..w).map(|c| rows[(i / n) * w + c] as f64 * rows[(i % n) * w + c] as f64).sum())
            .collect();
        let (sigma2, _) = symmetric_eigen(&row_gram, n);
        let total: f64 = sigma2.iter().map(|s| s.max(0.0)).sum();
        for r in [1, 5, 12, 23] {
            let (lr, reports) =
                calibrate(std::slice::from_ref(&m), &keys_only(RankSpec::Dims(r), Grouping::Cka(heads))).unwrap();
            assert_eq!(lr.latent_width(0), r);
            let bound = sigma2[r..].iter().map(|s| s.max(0.0)).sum::<f64>() / total;
            let direct = direct_error(&rows, &lr.projector(0).unwrap(), w);
            assert!((direct - bound).abs() < 1e-5, "rank {r}: {direct} vs the bound {bound}");
            assert!((reports[0].relative_error - bound).abs() < 1e-6);
        }
        // groups of one head cannot beat the bound of the whole layer, and reach it at full rank
        for r in [6, 12] {
            let (lr, reports) =
                calibrate(std::slice::from_ref(&m), &keys_only(RankSpec::Dims(r), Grouping::Cka(1))).unwrap();
            assert_eq!(reports[0].groups, vec![vec![0], vec![1], vec![2]]);
            let bound = sigma2[r..].iter().map(|s| s.max(0.0)).sum::<f64>() / total;
            let direct = direct_error(&rows, &lr.projector(0).unwrap(), w);
            assert!(direct >= bound - 1e-9 && (direct - reports[0].relative_error).abs() < 1e-5);
        }
        let (full, _) = calibrate(&[m], &keys_only(RankSpec::Fraction(1.0), Grouping::Cka(2))).unwrap();
        let p = full.projector(0).unwrap();
        for a in 0..w {
            for b in 0..w {
                assert!((p[a * w + b] - f32::from(u8::from(a == b))).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn files_round_trip_and_foreign_files_are_refused() {
        let (heads, d) = (3, 4);
        let layers: Vec<KeyMoments> = (0..2).map(|l| moments(&keys(30, heads, d, 10 + l), heads, d)).collect();
        let (lr, _) = calibrate(&layers, &Settings::new(RankSpec::Fraction(0.5), 2)).unwrap();
        let bytes = lr.to_safetensors().unwrap();
        assert_eq!(LowRankKeys::from_safetensors(&bytes).unwrap(), lr);
        assert!(LowRankKeys::from_safetensors(b"not a file").is_err());
        assert!(LowRankKeys::from_safetensors(&bytes[..bytes.len() - 4]).is_err());
        let data = [0u8; 4];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &data).unwrap();
        let other = safetensors::serialize(vec![("x".to_string(), view)], None).unwrap();
        assert!(LowRankKeys::from_safetensors(&other).is_err());
        // a basis that is not orthonormal, a head twice, a head left out
        let mut broken = lr.clone();
        broken.layers[0][0].basis[0] *= 2.0;
        assert!(broken.to_safetensors().is_err());
        let mut twice = lr.clone();
        twice.layers[1][1].heads = twice.layers[1][0].heads.clone();
        assert!(twice.validate().is_err());
        let mut missing = lr.clone();
        missing.layers[0].pop();
        assert!(missing.validate().is_err());
        let mut zero = lr;
        zero.layers[0][0].scale[0] = 0.0;
        assert!(zero.validate().is_err());
    }
}
