//! Causal attention of many queries over a cache, on the host: the CPU backend's prefill.
//!
//! Flash attention's tiling (Dao et al., arXiv 2205.14135) on the CPU: for each KV head and
//! each block of [`BLOCK_Q`] queries (the whole GQA group's rows together, so one key tile
//! serves every query head that reads it), the keys are walked in tiles of [`BLOCK_K`] with an
//! online softmax. Tiles that no query of the block can see are never touched, a partly
//! visible tile masks each row by its own visible prefix, and no `[n, len]` mask or score
//! matrix exists: the scratch is one `[group · BLOCK_Q, BLOCK_K]` tile (192 KiB for SmolLM2),
//! which stays in the L2 cache. The two products per tile run on `gemm` (the CPU backend's
//! own matrix kernel, dispatched to the machine's widest SIMD); the softmax's exponentials
//! on a polynomial that vectorises (`exp`), since the scalar `expf` would cost as much as both
//! products.
//!
//! Visibility is a prefix per query: query `i` of mask head `h` sees slots `0..cutoff`. That is
//! the cache after prefill and after order-keeping compaction; other layouts take the
//! general path in [`crate::model`].

/// Query rows per block (per query head).
pub const BLOCK_Q: usize = 64;
/// Keys per tile.
pub const BLOCK_K: usize = 256;

/// The shapes of one layer's attention.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub heads: usize,
    pub kv_heads: usize,
    /// Queries.
    pub n: usize,
    /// Cached slots (the key and value rows given).
    pub len: usize,
    pub head_dim: usize,
}

/// Which slots each query sees.
#[derive(Clone, Copy, Debug)]
pub enum Cutoffs<'a> {
    /// Every query sees all `len` slots.
    All,
    /// `cut[m * n + i]` leading slots for query `i` of mask head `m`; `mask_heads` is 1 (one
    /// prefix for every KV head) or `kv_heads`.
    Prefix { mask_heads: usize, cut: &'a [i32] },
}

/// `softmax(q kᵀ · scale) v` for every query head, each query over its visible prefix.
///
/// `q: [heads, n, d]`, `k`, `v: [kv_heads, len, d]` (row-major) → `[n, heads · d]`. Query head
/// `h` reads KV head `h / (heads / kv_heads)`. A query that sees no slot gets zeros.
/// `threads` workers share the query blocks (1: the caller's thread only).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Shape,
    cutoffs: Cutoffs<'_>,
    scale: f32,
    threads: usize,
) -> Result<Vec<f32>, String> {
    Ok(attention_impl(q, k, v, shape, cutoffs, scale, threads, false)?.0)
}

/// [`attention`], and in the same pass the attention each slot receives from these queries,
/// summed over them: `[heads, len]`, `Σ_i softmax_j(q_i k_jᵀ · scale)` over the slots query
/// `i` sees (H2O's accumulated attention; sums of successive chunks of a prompt add up to the
/// whole prompt's). Each block keeps its tiles' exponentials until its rows' maxima and sums
/// are final, then adds the normalised weights into the columns: no second product of queries
/// and keys. Workers take the blocks in a fixed interleave and their sums are added in order,
/// so the result does not depend on scheduling.
pub fn attention_with_sums(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Shape,
    cutoffs: Cutoffs<'_>,
    scale: f32,
    threads: usize,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    let (out, sums) = attention_impl(q, k, v, shape, cutoffs, scale, threads, true)?;
    Ok((out, sums.unwrap_or_default()))
}

#[allow(clippy::too_many_arguments)]
fn attention_impl(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Shape,
    cutoffs: Cutoffs<'_>,
    scale: f32,
    threads: usize,
    with_sums: bool,
) -> Result<(Vec<f32>, Option<Vec<f32>>), String> {
    let Shape { heads, kv_heads, n, len, head_dim: d } = shape;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || d == 0 {
        return Err(format!("{heads} query heads over {kv_heads} KV heads of dimension {d}"));
    }
    if q.len() != heads * n * d || k.len() != kv_heads * len * d || v.len() != k.len() {
        return Err(format!("{} query, {} key and {} value values for {shape:?}", q.len(), k.len(), v.len()));
    }
    if let Cutoffs::Prefix { mask_heads, cut } = cutoffs
        && ((mask_heads != 1 && mask_heads != kv_heads) || cut.len() != mask_heads * n)
    {
        return Err(format!("{} cutoffs for {mask_heads} mask heads and {n} queries", cut.len()));
    }
    let row = heads * d;
    let mut out = vec![0f32; n * row];
    let job = Job { q, k, v, shape, cutoffs, scale };
    // Blocks in the order of most work first (the last queries see the most keys), so the
    // workers finish together.
    let blocks: Vec<(usize, &mut [f32])> = out.chunks_mut(BLOCK_Q * row).enumerate().collect();
    let threads = threads.clamp(1, blocks.len().max(1));
    if with_sums {
        let sums = job.blocks_with_sums(blocks, threads)?;
        return Ok((out, Some(sums)));
    }
    let queue = std::sync::Mutex::new(blocks);
    on_workers((0..threads).collect(), "attention", |_| {
        let mut scratch = Scratch::new(heads / kv_heads, d);
        loop {
            let next = queue.lock().map(|mut q| q.pop()).unwrap_or(None);
            let Some((b, dst)) = next else { break };
            job.block(b * BLOCK_Q, dst, &mut scratch, None);
        }
    })?;
    drop(queue);
    Ok((out, None))
}

struct Job<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    shape: Shape,
    cutoffs: Cutoffs<'a>,
    scale: f32,
}

/// One worker's buffers for a block: queries, scores and accumulators of `group · BLOCK_Q`
/// rows.
struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    acc: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    cut: Vec<usize>,
}

/// A block's tiles of exponentials, kept until its rows' maxima and sums are final
/// ([`attention_with_sums`]), and the sums they are added into.
struct Kept<'a> {
    /// `[rows, seen]`: each tile's `exp(s − m)`, zeros where a row sees nothing.
    p: Vec<f32>,
    /// `[tiles, rows]`: the running maximum `m` each tile's exponentials are shifted by.
    tile_max: Vec<f32>,
    /// `[heads, len]`.
    sums: &'a mut [f32],
}

impl Scratch {
    fn new(group: usize, d: usize) -> Self {
        let rows = group * BLOCK_Q;
        Scratch {
            q: vec![0.0; rows * d],
            scores: vec![0.0; rows * BLOCK_K],
            acc: vec![0.0; rows * d],
            max: vec![0.0; rows],
            sum: vec![0.0; rows],
            cut: vec![0; rows],
        }
    }
}

impl Job<'_> {
    /// The blocks of `attention_with_sums`, in a fixed interleave across `threads` workers.
    fn blocks_with_sums(&self, blocks: Vec<(usize, &mut [f32])>, threads: usize) -> Result<Vec<f32>, String> {
        let Shape { heads, kv_heads, len, head_dim: d, .. } = self.shape;
        let mut lanes: Vec<Vec<(usize, &mut [f32])>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, block) in blocks.into_iter().rev().enumerate() {
            lanes[i % threads].push(block);
        }
        let parts = on_workers(lanes, "attention", |lane| {
            let mut sums = vec![0f32; heads * len];
            let mut scratch = Scratch::new(heads / kv_heads, d);
            let mut kept = Kept { p: Vec::new(), tile_max: Vec::new(), sums: &mut sums };
            for (b, dst) in lane {
                self.block(b * BLOCK_Q, dst, &mut scratch, Some(&mut kept));
            }
            sums
        })?;
        Ok(add_in_order(&parts, heads * len))
    }

    /// Queries `i0..i0 + dst.len() / row` of every head into `dst` (`[rows, heads · d]`), and
    /// with `kept` their attention added into the slots' sums.
    fn block(&self, i0: usize, dst: &mut [f32], s: &mut Scratch, mut kept: Option<&mut Kept<'_>>) {
        let Shape { heads, kv_heads, n, len, head_dim: d } = self.shape;
        let group = heads / kv_heads;
        let bq = dst.len() / (heads * d);
        let rows = group * bq;
        for h in 0..kv_heads {
            // Row r = g · bq + i: query i0 + i of query head h · group + g, pre-scaled.
            for g in 0..group {
                let head = h * group + g;
                let src = &self.q[(head * n + i0) * d..(head * n + i0 + bq) * d];
                for (o, &x) in s.q[g * bq * d..(g + 1) * bq * d].iter_mut().zip(src) {
                    *o = x * self.scale;
                }
            }
            for r in 0..rows {
                let i = i0 + r % bq;
                s.cut[r] = match self.cutoffs {
                    Cutoffs::All => len,
                    Cutoffs::Prefix { mask_heads, cut } => {
                        let m = if mask_heads == 1 { 0 } else { h };
                        (cut[m * n + i].max(0) as usize).min(len)
                    }
                };
            }
            let seen = s.cut[..rows].iter().copied().max().unwrap_or(0);
            s.max[..rows].fill(f32::NEG_INFINITY);
            s.sum[..rows].fill(0.0);
            s.acc[..rows * d].fill(0.0);
            let keys = &self.k[h * len * d..(h + 1) * len * d];
            let values = &self.v[h * len * d..(h + 1) * len * d];
            if let Some(k) = kept.as_deref_mut() {
                k.p.resize(rows * seen, 0.0);
                k.tile_max.clear();
            }
            let mut j0 = 0;
            while j0 < seen {
                let t = BLOCK_K.min(seen - j0);
                let scores = &mut s.scores[..rows * t];
                // scores[rows, t] = q[rows, d] · keys[j0..j0 + t]ᵀ
                gemm_f32(
                    Mat { data: scores, rows, cols: t, row_stride: t, col_stride: 1 },
                    false,
                    MatRef { data: &s.q[..rows * d], row_stride: d, col_stride: 1 },
                    MatRef { data: &keys[j0 * d..(j0 + t) * d], row_stride: 1, col_stride: d },
                    d,
                );
                let tile = Tile { scores, t, j0, lo: &[], cut: &s.cut[..rows], d };
                online_softmax(tile, &mut s.max[..rows], &mut s.sum[..rows], &mut s.acc[..rows * d]);
                if let Some(k) = kept.as_deref_mut() {
                    for r in 0..rows {
                        k.p[r * seen + j0..r * seen + j0 + t].copy_from_slice(&scores[r * t..(r + 1) * t]);
                    }
                    k.tile_max.extend_from_slice(&s.max[..rows]);
                }
                // acc[rows, d] += scores[rows, t] · values[j0..j0 + t]
                gemm_f32(
                    Mat { data: &mut s.acc[..rows * d], rows, cols: d, row_stride: d, col_stride: 1 },
                    true,
                    MatRef { data: scores, row_stride: t, col_stride: 1 },
                    MatRef { data: &values[j0 * d..(j0 + t) * d], row_stride: d, col_stride: 1 },
                    t,
                );
                j0 += t;
            }
            for r in 0..rows {
                let (g, i) = (r / bq, r % bq);
                let inv = if s.sum[r] > 0.0 { 1.0 / s.sum[r] } else { 0.0 };
                let o = &mut dst[i * heads * d + (h * group + g) * d..][..d];
                for (o, &a) in o.iter_mut().zip(&s.acc[r * d..(r + 1) * d]) {
                    *o = a * inv;
                }
            }
            if let Some(k) = kept.as_deref_mut() {
                // a_ij = exp(s_ij − m_tile) · exp(m_tile − m_final) / sum_final
                for r in 0..rows {
                    let g = r / bq;
                    if s.sum[r] <= 0.0 {
                        continue;
                    }
                    let inv = 1.0 / s.sum[r];
                    let col = &mut k.sums[(h * group + g) * len..][..seen];
                    let line = &k.p[r * seen..(r + 1) * seen];
                    for (tile, j0) in (0..seen).step_by(BLOCK_K).enumerate() {
                        let m = k.tile_max[tile * rows + r];
                        if m == f32::NEG_INFINITY {
                            continue;
                        }
                        let c = exp_nonpositive(m - s.max[r]) * inv;
                        let t = BLOCK_K.min(seen - j0);
                        for (o, &p) in col[j0..j0 + t].iter_mut().zip(&line[j0..j0 + t]) {
                            *o += p * c;
                        }
                    }
                }
            }
        }
    }
}

/// Which keys each prompt query sees, for [`column_sums`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Query `i` sees keys `0..=i`.
    Causal,
    /// Query `i` sees keys `i..n` (the counter-causal attention of AnDPro-style scorers).
    CounterCausal,
}

/// The attention each key receives, summed over every query of a prompt:
/// `Σ_i softmax_j(q_i k_jᵀ · scale)` over the keys query `i` sees (`direction`), per query head.
///
/// `q: [heads, n, d]`, `k: [kv_heads, n, d]` (query `i` and key `i` at position `i`) →
/// `[heads, n]`. Two passes over the same tiles as [`attention`]: the rows' maxima and sums,
/// then their normalised exponentials added into the columns; no `[n, n]` matrix. Workers take
/// the query blocks in a fixed interleave and their sums are added in order, so the result
/// does not depend on scheduling.
pub fn column_sums(
    q: &[f32],
    k: &[f32],
    shape: Shape,
    direction: Direction,
    scale: f32,
    threads: usize,
) -> Result<Vec<f32>, String> {
    let Shape { heads, kv_heads, n, len, head_dim: d } = shape;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || d == 0 || len != n {
        return Err(format!(
            "column sums of {heads} query heads over {kv_heads} KV heads of dimension {d}, {n} queries over {len} keys"
        ));
    }
    if q.len() != heads * n * d || k.len() != kv_heads * n * d {
        return Err(format!("{} query and {} key values for {shape:?}", q.len(), k.len()));
    }
    let blocks = n.div_ceil(BLOCK_Q);
    let threads = threads.clamp(1, blocks.max(1));
    let job = Job { q, k, v: k, shape, cutoffs: Cutoffs::All, scale };
    let parts = on_workers((0..threads).collect(), "column-sum", |w| {
        let mut sums = vec![0f32; heads * n];
        let mut scratch = Scratch::new(heads / kv_heads, d);
        for b in (w..blocks).step_by(threads) {
            job.column_block(b * BLOCK_Q, direction, &mut sums, &mut scratch);
        }
        sums
    })?;
    Ok(add_in_order(&parts, heads * n))
}

impl Job<'_> {
    /// Adds the attention of queries `i0..i0 + BLOCK_Q` (every head) into `sums` (`[heads, n]`).
    fn column_block(&self, i0: usize, direction: Direction, sums: &mut [f32], s: &mut Scratch) {
        let Shape { heads, kv_heads, n, head_dim: d, .. } = self.shape;
        let group = heads / kv_heads;
        let bq = BLOCK_Q.min(n - i0);
        let rows = group * bq;
        let mut lo = vec![0usize; rows];
        for (r, (lo, cut)) in lo.iter_mut().zip(&mut s.cut[..rows]).enumerate() {
            let i = i0 + r % bq;
            (*lo, *cut) = match direction {
                Direction::Causal => (0, i + 1),
                Direction::CounterCausal => (i, n),
            };
        }
        let (first, end) = (lo.iter().copied().min().unwrap_or(0), s.cut[..rows].iter().copied().max().unwrap_or(0));
        let first = first / BLOCK_K * BLOCK_K;
        for h in 0..kv_heads {
            for g in 0..group {
                let head = h * group + g;
                let src = &self.q[(head * n + i0) * d..(head * n + i0 + bq) * d];
                for (o, &x) in s.q[g * bq * d..(g + 1) * bq * d].iter_mut().zip(src) {
                    *o = x * self.scale;
                }
            }
            let keys = &self.k[h * n * d..(h + 1) * n * d];
            s.max[..rows].fill(f32::NEG_INFINITY);
            s.sum[..rows].fill(0.0);
            for pass in 0..2 {
                let mut j0 = first;
                while j0 < end {
                    let t = BLOCK_K.min(end - j0);
                    let scores = &mut s.scores[..rows * t];
                    gemm_f32(
                        Mat { data: scores, rows, cols: t, row_stride: t, col_stride: 1 },
                        false,
                        MatRef { data: &s.q[..rows * d], row_stride: d, col_stride: 1 },
                        MatRef { data: &keys[j0 * d..(j0 + t) * d], row_stride: 1, col_stride: d },
                        d,
                    );
                    let tile = Tile { scores, t, j0, lo: &lo, cut: &s.cut[..rows], d: 0 };
                    if pass == 0 {
                        online_softmax(tile, &mut s.max[..rows], &mut s.sum[..rows], &mut []);
                    } else {
                        let dst = |g: usize| (h * group + g) * n + j0;
                        normalized_into_columns(tile, &s.max[..rows], &s.sum[..rows], bq, sums, &dst);
                    }
                    j0 += t;
                }
            }
        }
    }
}

/// Pass two of [`column_sums`]: each visible score becomes `exp(s - max) / sum` and is added
/// into its key's column, `sums[dst(g) + j]` for the rows of query head `g` (rows `g · bq..`).
fn normalized_into_columns(
    tile: Tile<'_>,
    max: &[f32],
    sum: &[f32],
    bq: usize,
    sums: &mut [f32],
    dst: &dyn Fn(usize) -> usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: as in `online_softmax`.
        #[allow(unsafe_code)]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return unsafe { normalized_into_columns_avx512(tile, max, sum, bq, sums, dst) };
        } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return unsafe { normalized_into_columns_avx2(tile, max, sum, bq, sums, dst) };
        }
    }
    normalized_into_columns_any(tile, max, sum, bq, sums, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn normalized_into_columns_avx512(
    tile: Tile<'_>,
    max: &[f32],
    sum: &[f32],
    bq: usize,
    sums: &mut [f32],
    dst: &dyn Fn(usize) -> usize,
) {
    normalized_into_columns_any(tile, max, sum, bq, sums, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn normalized_into_columns_avx2(
    tile: Tile<'_>,
    max: &[f32],
    sum: &[f32],
    bq: usize,
    sums: &mut [f32],
    dst: &dyn Fn(usize) -> usize,
) {
    normalized_into_columns_any(tile, max, sum, bq, sums, dst)
}

#[inline(always)]
fn normalized_into_columns_any(
    tile: Tile<'_>,
    max: &[f32],
    sum: &[f32],
    bq: usize,
    sums: &mut [f32],
    dst: &dyn Fn(usize) -> usize,
) {
    let t = tile.t;
    for r in 0..tile.cut.len() {
        let (a, b) = tile.visible(r);
        if a == b || sum[r] <= 0.0 {
            continue;
        }
        let (m, inv) = (max[r], 1.0 / sum[r]);
        let at = dst(r / bq);
        let line = &tile.scores[r * t + a..r * t + b];
        for (c, &x) in sums[at + a..at + b].iter_mut().zip(line) {
            *c += exp_nonpositive(x - m) * inv;
        }
    }
}

/// One tile of scores, `[cut.len(), t]`, for keys `j0..j0 + t`.
struct Tile<'a> {
    scores: &'a mut [f32],
    t: usize,
    j0: usize,
    /// Each row sees slots `lo[r]..cut[r]` (`lo` empty: from 0).
    lo: &'a [usize],
    cut: &'a [usize],
    d: usize,
}

impl Tile<'_> {
    /// Row `r`'s visible columns of the tile.
    #[inline(always)]
    fn visible(&self, r: usize) -> (usize, usize) {
        let lo = self.lo.get(r).copied().unwrap_or(0);
        let a = lo.saturating_sub(self.j0).min(self.t);
        let b = self.cut[r].saturating_sub(self.j0).min(self.t);
        (a, b.max(a))
    }
}

/// The online-softmax update of a tile: each row's scores become `exp(s - max)` over its
/// visible part (0 past it), its running maximum, sum and accumulator `[rows, d]` rescaled to
/// the new maximum. On the widest SIMD the machine has (the arithmetic is the same in each).
fn online_softmax(tile: Tile<'_>, max: &mut [f32], sum: &mut [f32], acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: each target-feature function is called only where the CPU reports its
        // features; their bodies are safe code.
        #[allow(unsafe_code)]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return unsafe { online_softmax_avx512(tile, max, sum, acc) };
        } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return unsafe { online_softmax_avx2(tile, max, sum, acc) };
        }
    }
    online_softmax_any(tile, max, sum, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn online_softmax_avx512(tile: Tile<'_>, max: &mut [f32], sum: &mut [f32], acc: &mut [f32]) {
    online_softmax_any(tile, max, sum, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn online_softmax_avx2(tile: Tile<'_>, max: &mut [f32], sum: &mut [f32], acc: &mut [f32]) {
    online_softmax_any(tile, max, sum, acc)
}

#[inline(always)]
fn online_softmax_any(tile: Tile<'_>, max_: &mut [f32], sum: &mut [f32], acc: &mut [f32]) {
    let (t, d) = (tile.t, tile.d);
    for r in 0..tile.cut.len() {
        let (a, b) = tile.visible(r);
        let line = &mut tile.scores[r * t..(r + 1) * t];
        line[..a].fill(0.0);
        line[b..].fill(0.0);
        if a == b {
            continue;
        }
        let line = &mut line[a..b];
        let old = max_[r];
        let new = old.max(max(line));
        let tile_sum = exp_shifted(line, new);
        if old != f32::NEG_INFINITY && old != new {
            let c = exp_nonpositive(old - new);
            acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= c);
            sum[r] *= c;
        }
        sum[r] += tile_sum;
        max_[r] = new;
    }
}

/// `work` over each of `inputs` on a worker of its own (the caller's thread when there is one
/// input), the results in the order of the inputs: a panicking worker is an error naming
/// `what`, not a panic of the caller.
pub(crate) fn on_workers<I: Send, T: Send>(
    inputs: Vec<I>,
    what: &str,
    work: impl Fn(I) -> T + Sync,
) -> Result<Vec<T>, String> {
    if inputs.len() <= 1 {
        return Ok(inputs.into_iter().map(work).collect());
    }
    let work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> = inputs.into_iter().map(|input| s.spawn(move || work(input))).collect();
        handles.into_iter().map(|h| h.join().map_err(|_| format!("a {what} worker panicked"))).collect()
    })
}

/// The element-wise sum of equal-length `parts`, added in their order (so that the result does
/// not depend on which worker finished first).
fn add_in_order(parts: &[Vec<f32>], len: usize) -> Vec<f32> {
    let mut total = vec![0f32; len];
    for part in parts {
        for (t, &x) in total.iter_mut().zip(part) {
            *t += x;
        }
    }
    total
}

/// The largest value (lane-wise, so that it vectorises).
#[inline(always)]
pub(crate) fn max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            if x > *l {
                *l = x;
            }
        }
    }
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    lanes.iter().copied().fold(tail, f32::max)
}

/// `xs[i] ← exp(xs[i] - shift)` for values at most `shift`; returns their sum.
#[inline(always)]
pub(crate) fn exp_shifted(xs: &mut [f32], shift: f32) -> f32 {
    for x in xs.iter_mut() {
        *x = exp_nonpositive(*x - shift);
    }
    let mut lanes = [0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    chunks.remainder().iter().sum::<f32>() + lanes.iter().sum::<f32>()
}

/// `e^x` for `x ≤ 0` to within 2 ulp-scale relative error (3e-7), 0 below e^-87: `x = n ln 2 + r`
/// with `|r| ≤ ln 2 / 2`, `e^r` by its degree-7 Taylor polynomial (remainder below 4e-9),
/// `2^n` built in the exponent bits. Straight-line f32 arithmetic, so loops over it vectorise.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for |n| < 2^10
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // adding 1.5 · 2^23 rounds to an integer in the mantissa
    const ROUND: f32 = 12_582_912.0;
    let x = if x > -87.0 { x } else { -87.0 };
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // n ∈ [-126, 0] sits in the low mantissa bits of `shifted` (whose bits are
    // ROUND's plus n): 2^n from them with integer arithmetic only, which vectorises where a
    // float-to-int conversion would not
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    p * two_n
}

/// A matrix written through strides, bounds-checked against its slice.
pub(crate) struct Mat<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

/// A matrix read through strides (its shape comes from the product).
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

/// Whether the last element of a `rows × cols` strided matrix lies inside `len` values.
fn fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * row_stride + (cols - 1) * col_stride < len
}

/// `dst ← (accumulate ? dst : 0) + lhs · rhs`, `lhs: [dst.rows, inner]`, `rhs: [inner, dst.cols]`.
///
/// # Panics
/// When a matrix does not fit its slice (a bug in the caller, never input-dependent).
pub(crate) fn gemm_f32(dst: Mat<'_>, accumulate: bool, lhs: MatRef<'_>, rhs: MatRef<'_>, inner: usize) {
    let (m, n) = (dst.rows, dst.cols);
    assert!(
        fits(dst.data.len(), m, n, dst.row_stride, dst.col_stride)
            && fits(lhs.data.len(), m, inner, lhs.row_stride, lhs.col_stride)
            && fits(rhs.data.len(), inner, n, rhs.row_stride, rhs.col_stride),
        "a strided matrix outside its slice"
    );
    if m == 0 || n == 0 {
        return;
    }
    if inner == 0 {
        if !accumulate {
            dst.data.fill(0.0);
        }
        return;
    }
    // SAFETY: the three pointers come from live slices (the destination exclusively borrowed,
    // so it aliases neither operand), and `fits` checked that every element the strides reach,
    // up to `(rows - 1) · row_stride + (cols - 1) · col_stride`, lies inside its slice.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            inner,
            dst.data.as_mut_ptr(),
            dst.col_stride as isize,
            dst.row_stride as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A seeded value in [-1, 1).
    pub(crate) fn noise(seed: u64, i: usize) -> f32 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 31;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 29;
        (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// The definition, in f64: for each head and query, softmax over the visible keys.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        s: Shape,
        cut: &dyn Fn(usize, usize) -> usize,
        scale: f64,
    ) -> Vec<f64> {
        let Shape { heads, kv_heads, n, len, head_dim: d } = s;
        let group = heads / kv_heads;
        let mut out = vec![0f64; n * heads * d];
        for h in 0..heads {
            let kh = h / group;
            for i in 0..n {
                let seen = cut(kh, i);
                if seen == 0 {
                    continue;
                }
                let scores: Vec<f64> = (0..seen)
                    .map(|j| {
                        (0..d).map(|c| q[(h * n + i) * d + c] as f64 * k[(kh * len + j) * d + c] as f64).sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    out[i * heads * d + h * d + c] =
                        (0..seen).map(|j| e[j] * v[(kh * len + j) * d + c] as f64).sum::<f64>() / z;
                }
            }
        }
        out
    }

    fn data(s: Shape, seed: u64, spread: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let q = (0..s.heads * s.n * s.head_dim).map(|i| spread * noise(seed, i)).collect();
        let k = (0..s.kv_heads * s.len * s.head_dim).map(|i| spread * noise(seed + 1, i)).collect();
        let v = (0..s.kv_heads * s.len * s.head_dim).map(|i| noise(seed + 2, i)).collect();
        (q, k, v)
    }

    fn worst(a: &[f32], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max)
    }

    #[test]
    fn exp_matches_the_library_exponential() {
        let mut worst = 0f64;
        for i in 0..200_000 {
            let x = -90.0 * i as f32 / 200_000.0;
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            if x >= -87.0 {
                worst = worst.max((got - want).abs() / want);
            } else {
                assert!(got < 1e-37, "e^{x} = {got}");
            }
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    #[test]
    fn causal_prefill_matches_the_definition() {
        // A prompt over an empty cache: query i sees slots 0..=i. Sizes cross block and tile
        // edges (BLOCK_Q 64, BLOCK_K 256), GQA groups of 3, and one thread against two.
        for &(n, spread) in &[(1usize, 1.0f32), (70, 1.0), (300, 4.0), (600, 8.0)] {
            let s = Shape { heads: 6, kv_heads: 2, n, len: n, head_dim: 16 };
            let (q, k, v) = data(s, n as u64, spread);
            let cut: Vec<i32> = (1..=n as i32).collect();
            let scale = 1.0 / 4.0;
            let want = reference(&q, &k, &v, s, &|_, i| i + 1, scale as f64);
            for threads in [1, 2] {
                let cutoffs = Cutoffs::Prefix { mask_heads: 1, cut: &cut };
                let got = attention(&q, &k, &v, s, cutoffs, scale, threads).unwrap();
                let e = worst(&got, &want);
                assert!(e < 2e-5, "n {n}, spread {spread}, {threads} threads: max |Δ| {e}");
            }
        }
    }

    #[test]
    fn ragged_prefixes_per_head_and_full_visibility() {
        // A chunk of 90 queries after 200 cached slots, each KV head its own prefix (as after
        // compaction: head 1 kept fewer slots), and one query that sees nothing.
        let s = Shape { heads: 4, kv_heads: 2, n: 90, len: 290, head_dim: 8 };
        let (q, k, v) = data(s, 7, 2.0);
        let prefix = |h: usize, i: usize| if h == 1 && i == 5 { 0 } else { (200 - 60 * h + i + 1).min(s.len) };
        let cut: Vec<i32> = (0..2).flat_map(|h| (0..s.n).map(move |i| prefix(h, i) as i32)).collect();
        let got = attention(&q, &k, &v, s, Cutoffs::Prefix { mask_heads: 2, cut: &cut }, 0.3, 1).unwrap();
        let want = reference(&q, &k, &v, s, &prefix, 0.3);
        assert!(worst(&got, &want) < 2e-5, "max |Δ| {}", worst(&got, &want));
        let row = &got[5 * 32 + 16..5 * 32 + 32];
        assert!(row.iter().all(|&x| x == 0.0), "a query that sees nothing: {row:?}");

        let got = attention(&q, &k, &v, s, Cutoffs::All, 0.3, 2).unwrap();
        let want = reference(&q, &k, &v, s, &|_, _| s.len, 0.3);
        assert!(worst(&got, &want) < 2e-5, "max |Δ| {}", worst(&got, &want));
    }

    #[test]
    fn attention_sums_come_with_the_attention() {
        // A chunk of queries after cached slots (the later chunks of a prompt) and a prompt
        // from the start; the tiles kept per block span several key tiles (BLOCK_K 256), and
        // each KV head has its own prefix in the first case.
        for &(n, len, spread) in &[(90usize, 600usize, 4.0f32), (300, 300, 8.0), (1, 1, 1.0)] {
            let s = Shape { heads: 6, kv_heads: 2, n, len, head_dim: 16 };
            let (q, k, v) = data(s, 90 + n as u64, spread);
            let prefix = |h: usize, i: usize| (len - n + i + 1 - 7 * h * usize::from(len > n)).min(len);
            let cut: Vec<i32> = (0..2).flat_map(|h| (0..n).map(move |i| prefix(h, i) as i32)).collect();
            let cutoffs = Cutoffs::Prefix { mask_heads: 2, cut: &cut };
            let mut want = vec![0f64; s.heads * len];
            for h in 0..s.heads {
                let kh = h / 3;
                for i in 0..n {
                    let seen = prefix(kh, i);
                    let scores: Vec<f64> = (0..seen)
                        .map(|j| {
                            (0..16)
                                .map(|c| q[(h * n + i) * 16 + c] as f64 * k[(kh * len + j) * 16 + c] as f64)
                                .sum::<f64>()
                                * 0.25
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                    for (j, x) in scores.iter().enumerate() {
                        want[h * len + j] += (x - m).exp() / z;
                    }
                }
            }
            let alone = attention(&q, &k, &v, s, cutoffs, 0.25, 1).unwrap();
            for threads in [1, 2, 3] {
                let (out, sums) = attention_with_sums(&q, &k, &v, s, cutoffs, 0.25, threads).unwrap();
                assert_eq!(out, alone, "n {n}, {threads} threads: the attention itself");
                let e = sums.iter().zip(&want).map(|(&x, &y)| (x as f64 - y).abs() / y.max(1.0)).fold(0.0, f64::max);
                assert!(e < 2e-5, "n {n}, len {len}, {threads} threads: max relative |Δ| {e}");
            }
        }
    }

    #[test]
    fn column_sums_match_the_definition_both_ways() {
        for &(n, spread) in &[(5usize, 1.0f32), (130, 3.0), (333, 8.0)] {
            let s = Shape { heads: 6, kv_heads: 2, n, len: n, head_dim: 16 };
            let (q, k, _) = data(s, 40 + n as u64, spread);
            for direction in [Direction::Causal, Direction::CounterCausal] {
                // the definition, in f64
                let mut want = vec![0f64; s.heads * n];
                for h in 0..s.heads {
                    let kh = h / 3;
                    for i in 0..n {
                        let seen = match direction {
                            Direction::Causal => 0..i + 1,
                            Direction::CounterCausal => i..n,
                        };
                        let scores: Vec<f64> = seen
                            .clone()
                            .map(|j| {
                                (0..16)
                                    .map(|c| q[(h * n + i) * 16 + c] as f64 * k[(kh * n + j) * 16 + c] as f64)
                                    .sum::<f64>()
                                    * 0.25
                            })
                            .collect();
                        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                        for (j, x) in seen.zip(&scores) {
                            want[h * n + j] += (x - m).exp() / z;
                        }
                    }
                }
                let one = column_sums(&q, &k, s, direction, 0.25, 1).unwrap();
                let two = column_sums(&q, &k, s, direction, 0.25, 2).unwrap();
                for (got, label) in [(&one, "1 thread"), (&two, "2 threads")] {
                    let e = got.iter().zip(&want).map(|(&x, &y)| (x as f64 - y).abs() / y.max(1.0)).fold(0.0, f64::max);
                    assert!(e < 2e-5, "n {n}, {direction:?}, {label}: max relative |Δ| {e}");
                }
                // every query's attention sums to one
                let total: f32 = one.iter().sum();
                assert!((total - (s.heads * n) as f32).abs() < 1e-3 * (s.heads * n) as f32, "{total}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let s = Shape { heads: 3, kv_heads: 2, n: 1, len: 1, head_dim: 4 };
        assert!(attention(&[0.0; 12], &[0.0; 8], &[0.0; 8], s, Cutoffs::All, 1.0, 1).is_err());
        let s = Shape { heads: 2, kv_heads: 1, n: 2, len: 3, head_dim: 4 };
        assert!(attention(&[0.0; 16], &[0.0; 11], &[0.0; 12], s, Cutoffs::All, 1.0, 1).is_err());
        let cut = [1, 2, 3];
        let cutoffs = Cutoffs::Prefix { mask_heads: 1, cut: &cut };
        assert!(attention(&[0.0; 16], &[0.0; 12], &[0.0; 12], s, cutoffs, 1.0, 1).is_err());
    }
}
