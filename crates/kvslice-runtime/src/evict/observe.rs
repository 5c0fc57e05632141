//! Statistics gathered while the prompt is prefilled: a [`KvStore`] wrapper that reads each
//! layer's queries as the model offers them and computes, on the device, everything the
//! requested policies need — window statistics per observation window, counter-causal column
//! sums, pre-RoPE query moments — and takes the attention accumulated over all queries (H2O)
//! from the model's own attention pass ([`KvStore::offer_attention_sums`]). Results stay on
//! the device until [`Observations::read`] brings them to the host as the policy crate's types.
//!
//! On wgpu the window statistics (mean, variance, last-query weight, entropy, value-norm,
//! projection and Jacobian terms) come from the window-statistics kernel
//! (`kvslice_kernels::window_stats`, `shaders/window_stats.wgsl`), which never holds more than a
//! tile of scores. Everything else, and every statistic on other backends (or when the kernel
//! refuses its arguments), is computed with Burn tensor ops in query chunks of bounded size. The
//! definitions are those of `kvslice_policy::WindowStats` (tested against the policy crate's CPU
//! reference; the two routes are tested against each other on lavapipe).

use std::sync::Once;

use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor};
use kvslice_cache::{KvCache, KvStore, LayerKv};
use kvslice_policy::scorer::{jacap, twin};
use kvslice_policy::{Needs, NonCausalSpec, NonCausalTable, QueryMoments, WindowStats};

use crate::error::Result;
use crate::host::read_f32;

/// Score elements per attention chunk (64 Mi f32 = 256 MiB).
const MAX_CHUNK_ELEMS: usize = 64 << 20;

/// Which implementation computes the window statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The kernel on wgpu (falling back to Burn ops, with the reason printed once, if it
    /// refuses), Burn ops elsewhere.
    Auto,
    /// The window-statistics kernel; its error is returned (wgpu only).
    Kernel,
    /// Burn tensor ops, on any backend.
    BurnOps,
}

/// What to compute while prefilling.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsRequest {
    /// Observation windows (one set of window statistics each).
    pub windows: Vec<usize>,
    pub value_weighted: bool,
    pub projection: bool,
    pub accumulated: bool,
    /// Layers whose counter-causal column sums are computed.
    pub counter_causal_layers: Vec<usize>,
    /// Chunked non-causal column sums, one table per range and chunking.
    pub non_causal: Vec<NonCausalSpec>,
    /// KVzip's reconstruction scores: not recorded during the prefill but by
    /// [`crate::Prefilled::reconstruct`] after it, which the caller runs when this is set.
    pub reconstruction: bool,
    /// Pre-RoPE query moments, skipping this many leading positions.
    pub query_moments_skip: Option<usize>,
    /// Jacap's `‖∂o/∂s‖` weights per window.
    pub jacobian: bool,
    /// Jacap's weighted key leverage per window (implies `jacobian`).
    pub leverage: bool,
    /// TwinKV's best-twin similarity and position.
    pub twins: bool,
    /// Finch's position-weighted window means ([`WindowStats::position_weighted`]).
    pub position_weighted: bool,
    /// The last this many queries of each layer (after RoPE), kept on the device: the first
    /// observation window of decode-time recompression.
    pub tail_queries: usize,
}

impl StatsRequest {
    /// Adds what `needs` asks for (`layers`: the model's layer count; `cc_layers`: the layers a
    /// counter-causal scorer runs on).
    pub fn add(&mut self, needs: &Needs, cc_layers: &[usize], moments_skip: Option<usize>) {
        if needs.window > 0 && !self.windows.contains(&needs.window) {
            self.windows.push(needs.window);
        }
        self.value_weighted |= needs.value_weighted;
        self.projection |= needs.projection;
        self.accumulated |= needs.accumulated;
        self.reconstruction |= needs.reconstruction;
        if let Some(spec) = needs.non_causal.filter(|s| !self.non_causal.contains(s)) {
            self.non_causal.push(spec);
        }
        if needs.counter_causal {
            for &l in cc_layers {
                if !self.counter_causal_layers.contains(&l) {
                    self.counter_causal_layers.push(l);
                }
            }
        }
        if needs.query_moments {
            self.query_moments_skip = moments_skip.or(self.query_moments_skip);
        }
        self.jacobian |= needs.jacobian || needs.leverage;
        self.leverage |= needs.leverage;
        self.twins |= needs.twins;
        self.position_weighted |= needs.position_weighted;
        if (needs.value_weighted || needs.projection || needs.jacobian || needs.leverage) && self.windows.is_empty() {
            self.windows.push(1);
        }
    }
}

/// Device tensors of one window.
#[derive(Debug, Clone)]
struct WindowTensors {
    window: usize,
    /// `[H, n]` each.
    mean: Tensor<2>,
    var: Tensor<2>,
    last: Tensor<2>,
    /// `[H]`.
    entropy: Tensor<1>,
    value_weighted: Option<Tensor<2>>,
    projection: Option<Tensor<2>>,
    /// `[H, n]` and `[H_kv, n]`.
    jacobian: Option<Tensor<2>>,
    leverage: Option<Tensor<2>>,
    /// `[H, n]`.
    position_weighted: Option<Tensor<2>>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct LayerTensors {
    windows: Vec<WindowTensors>,
    accumulated: Option<Tensor<2>>,
    counter_causal: Option<Tensor<2>>,
    /// `[H, n]` per range and chunking.
    non_causal: Vec<(NonCausalSpec, Tensor<2>)>,
    /// `[H, d]`, `[H, d, d]`.
    moments: Option<(Tensor<2>, Tensor<3>)>,
    /// `[H_kv, n]` best-twin similarity and its position (as f32).
    twins: Option<(Tensor<2>, Tensor<2>)>,
    /// `[H, t, d]`: the last `t` queries after RoPE ([`StatsRequest::tail_queries`]).
    tail_queries: Option<Tensor<3>>,
}

/// Statistics of every layer, on the device.
#[derive(Debug, Clone)]
pub struct Observations {
    layers: Vec<LayerTensors>,
    /// Seconds spent queueing (on the CPU backend: computing) the statistics during the prefill.
    pub compute_seconds: f64,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    len: usize,
}

/// Statistics of one layer, on the host.
#[derive(Debug, Clone)]
pub struct HostLayerStats {
    /// One entry per requested window (the optional tables filled as requested).
    pub windows: Vec<WindowStats>,
    pub moments: Option<QueryMoments>,
    /// `[H, t, d]`, left on the device: the prompt's last queries after RoPE, when requested
    /// ([`StatsRequest::tail_queries`]).
    pub tail_queries: Option<Tensor<3>>,
}

impl HostLayerStats {
    /// The window statistics of observation window `w` (the first set when `w == 0`).
    pub fn window(&self, w: usize) -> Option<&WindowStats> {
        if w == 0 {
            return self.windows.first();
        }
        self.windows.iter().find(|s| s.window == w)
    }
}

impl Observations {
    /// Reads everything back to the host.
    pub async fn read(&self) -> Result<Vec<HostLayerStats>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (twin, twin_index) = match &layer.twins {
                Some((sim, index)) => {
                    let sim = read_f32(sim.clone()).await?;
                    let index = read_f32(index.clone()).await?;
                    // similarities below −1 mark keys without any candidate outside the exclusion
                    let none: Vec<bool> = sim.iter().map(|&x| x < -1.5).collect();
                    let sim = sim.iter().zip(&none).map(|(&x, &n)| if n { -1.0 } else { x }).collect();
                    let index = index.iter().zip(&none).map(|(&i, &n)| if n { u32::MAX } else { i as u32 }).collect();
                    (Some(sim), Some(index))
                }
                None => (None, None),
            };
            let accumulated = match &layer.accumulated {
                Some(t) => Some(read_f32(t.clone()).await?),
                None => None,
            };
            let counter_causal = match &layer.counter_causal {
                Some(t) => Some(read_f32(t.clone()).await?),
                None => None,
            };
            let mut non_causal = Vec::with_capacity(layer.non_causal.len());
            for (spec, t) in &layer.non_causal {
                non_causal.push(NonCausalTable { spec: *spec, sums: read_f32(t.clone()).await? });
            }
            let mut windows = Vec::with_capacity(layer.windows.len().max(1));
            for w in &layer.windows {
                let opt = async |t: &Option<Tensor<2>>| -> Result<Option<Vec<f32>>> {
                    match t {
                        Some(t) => Ok(Some(read_f32(t.clone()).await?)),
                        None => Ok(None),
                    }
                };
                windows.push(WindowStats {
                    heads: self.heads,
                    kv_heads: self.kv_heads,
                    len: self.len,
                    window: w.window,
                    mean: read_f32(w.mean.clone()).await?,
                    var: read_f32(w.var.clone()).await?,
                    last: read_f32(w.last.clone()).await?,
                    entropy: read_f32(w.entropy.clone()).await?,
                    value_weighted: opt(&w.value_weighted).await?,
                    projection: opt(&w.projection).await?,
                    accumulated: accumulated.clone(),
                    counter_causal: counter_causal.clone(),
                    non_causal: non_causal.clone(),
                    jacobian: opt(&w.jacobian).await?,
                    leverage: opt(&w.leverage).await?,
                    position_weighted: opt(&w.position_weighted).await?,
                    twin: twin.clone(),
                    twin_index: twin_index.clone(),
                    reconstruction: None,
                });
            }
            if windows.is_empty() {
                // Position rules and table-free scorers still read the shapes.
                let hn = self.heads * self.len;
                windows.push(WindowStats {
                    heads: self.heads,
                    kv_heads: self.kv_heads,
                    len: self.len,
                    window: 1,
                    mean: vec![0.0; hn],
                    var: vec![0.0; hn],
                    last: vec![0.0; hn],
                    entropy: vec![0.0; self.heads],
                    value_weighted: None,
                    projection: None,
                    accumulated,
                    counter_causal,
                    non_causal,
                    twin,
                    twin_index,
                    ..WindowStats::default()
                });
            }
            let moments = match &layer.moments {
                Some((mean, cov)) => Some(QueryMoments {
                    heads: self.heads,
                    head_dim: self.head_dim,
                    mean: read_f32(mean.clone()).await?,
                    cov: read_f32(cov.clone()).await?,
                }),
                None => None,
            };
            out.push(HostLayerStats { windows, moments, tail_queries: layer.tail_queries.clone() });
        }
        Ok(out)
    }

    /// Prompt length the statistics cover.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A [`KvStore`] that prefills into `cache` and computes the requested statistics of each layer
/// from the queries the model offers.
///
/// It takes chunks: a layer's queries arrive chunk by chunk (every chunk of a layer before the
/// next layer, [`KvStore::takes_chunks`]), and the layer's statistics are computed once its
/// last chunk is in, from the queries kept meanwhile, exactly as from one pass. Only what the
/// request reads is kept: every query of the layer where the column sums or the non-causal
/// tables need them, the pre-RoPE queries for the moments, otherwise the last ones the windows
/// and the decode-time tail read.
pub(crate) struct Recorder<'c> {
    pub cache: &'c mut KvCache,
    pub request: &'c StatsRequest,
    pub layers: Vec<LayerTensors>,
    pub heads: usize,
    /// The prompt's length: a layer is complete when its cache holds this many entries.
    pub len: usize,
    pub compute_seconds: f64,
    /// The current layer's queries, chunk by chunk.
    pending: ChunkQueries,
    /// The attention the model's pass gave each slot of the current layer so far, summed over
    /// its queries (`[H, slots]`; H2O's accumulated attention), and that layer.
    sums: Option<(usize, Tensor<2>)>,
}

impl<'c> Recorder<'c> {
    /// A recorder of a prompt of `len` tokens prefilled into the empty `cache`.
    pub fn new(cache: &'c mut KvCache, request: &'c StatsRequest, layers: usize, len: usize) -> Self {
        Recorder {
            cache,
            request,
            layers: vec![LayerTensors::default(); layers],
            heads: 0,
            len,
            compute_seconds: 0.0,
            pending: ChunkQueries::default(),
            sums: None,
        }
    }

    pub fn finish(self) -> Observations {
        let g = self.cache.geometry();
        Observations {
            layers: self.layers,
            compute_seconds: self.compute_seconds,
            heads: self.heads,
            kv_heads: g.kv_heads,
            head_dim: g.head_dim,
            len: self.len,
        }
    }

    /// How many of a layer's last queries after RoPE its statistics read (all: `usize::MAX`).
    fn rotated_rows(&self, layer: usize) -> usize {
        let r = self.request;
        // (the accumulated attention comes from the model's own pass: no queries for it)
        if !r.non_causal.is_empty() || r.counter_causal_layers.contains(&layer) {
            return usize::MAX;
        }
        r.windows.iter().copied().max().unwrap_or(0).max(r.tail_queries).max(1)
    }
}

impl KvStore for Recorder<'_> {
    fn append(
        &mut self,
        layer: usize,
        keys: Tensor<3>,
        values: Tensor<3>,
        positions: &[u32],
    ) -> kvslice_cache::Result<()> {
        self.cache.append(layer, keys, values, positions)
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        let t0 = crate::host::now();
        let stored = self.cache.layer(layer)?;
        let n = stored.max_len();
        let [heads, m, _] = rotated.dims();
        self.heads = heads;
        let (rotated, raw) = if m == n && n == self.len {
            (rotated.clone(), raw.clone())
        } else {
            // a chunk: kept until the layer's last one is in
            let keep = self.rotated_rows(layer);
            let moments = self.request.query_moments_skip.is_some();
            if n == m {
                // the layer's first chunk
                self.pending = ChunkQueries::default();
            }
            self.pending.push(rotated, moments.then_some(raw), keep);
            if self.pending.seen() != n {
                return Err(kvslice_cache::CacheError::Eviction(format!(
                    "layer {layer}: {} queries for {n} cached entries (chunks out of order?)",
                    self.pending.seen()
                )));
            }
            if n < self.len {
                self.compute_seconds += crate::host::now() - t0;
                return Ok(());
            }
            let (rotated, kept_raw) = std::mem::take(&mut self.pending).take();
            // (without the moments the pre-RoPE queries are not read: the last chunk's stand in)
            let raw = kept_raw.unwrap_or_else(|| raw.clone());
            (rotated, raw)
        };
        if n != self.len {
            return Err(kvslice_cache::CacheError::Eviction(format!(
                "layer {layer} holds {n} entries, the prompt has {}",
                self.len
            )));
        }
        let stored = self.cache.layer(layer)?;
        let (keys, values) = stored.view();
        let storage = stored.storage().filter(|_| stored.lens().iter().all(|&l| l == n));
        let counter_causal = self.request.counter_causal_layers.contains(&layer);
        let kv = Kv { keys: &keys, values: &values, storage };
        let accumulated = match self.sums.take() {
            Some((l, sums)) if l == layer && sums.dims() == [heads, n] => Some(sums),
            _ if self.request.accumulated => {
                return Err(kvslice_cache::CacheError::Eviction(format!(
                    "layer {layer}: the attention's pass gave no accumulated attention"
                )));
            }
            _ => None,
        };
        // the automatic route falls back to Burn ops instead of failing
        self.layers[layer] = compute(&rotated, &raw, kv, self.request, counter_causal, Route::Auto, accumulated)
            .map_err(|e| kvslice_cache::CacheError::Kernel(e.to_string()))?;
        self.compute_seconds += crate::host::now() - t0;
        Ok(())
    }

    fn takes_chunks(&self) -> bool {
        true
    }

    fn wants_attention_sums(&self, _layer: usize) -> bool {
        self.request.accumulated
    }

    fn offer_attention_sums(&mut self, layer: usize, sums: Tensor<2>) -> kvslice_cache::Result<()> {
        // a chunk's sums cover the slots filled so far: the earlier chunks' sums, over fewer
        // slots, are padded with zeros and added
        self.sums = Some(match self.sums.take() {
            Some((l, before)) if l == layer => {
                let [heads, slots] = sums.dims();
                let had = before.dims()[1];
                if had > slots {
                    return Err(kvslice_cache::CacheError::Eviction(format!(
                        "layer {layer}: attention sums over {slots} slots after {had}"
                    )));
                }
                let before = if had < slots {
                    Tensor::cat(vec![before, Tensor::zeros([heads, slots - had], &sums.device())], 1)
                } else {
                    before
                };
                (layer, before + sums)
            }
            _ => (layer, sums),
        });
        Ok(())
    }
}

/// One layer's queries as its chunks arrive (after RoPE, and before it where asked for), keeping
/// of the rotated ones only the chunks that hold the last `keep` rows (all of them while the
/// pre-RoPE queries are kept: the moments read every query).
#[derive(Default)]
pub(crate) struct ChunkQueries {
    rotated: Vec<Tensor<3>>,
    raw: Vec<Tensor<3>>,
    seen: usize,
}

impl ChunkQueries {
    /// Adds a chunk (`[H, m, d]` each), then drops the chunks no longer among the last `keep`
    /// rows.
    pub fn push(&mut self, rotated: &Tensor<3>, raw: Option<&Tensor<3>>, keep: usize) {
        self.seen += rotated.dims()[1];
        self.rotated.push(rotated.clone());
        self.raw.extend(raw.cloned());
        while self.raw.is_empty()
            && self.rotated.len() > 1
            && self.rotated[1..].iter().map(|q| q.dims()[1]).sum::<usize>() >= keep
        {
            self.rotated.remove(0);
        }
    }

    /// Queries pushed so far, those dropped included.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// The kept queries, joined: `[H, rows, d]` after RoPE, and before it when kept.
    pub fn take(self) -> (Tensor<3>, Option<Tensor<3>>) {
        let raw = (!self.raw.is_empty()).then(|| Tensor::cat(self.raw, 1));
        (Tensor::cat(self.rotated, 1), raw)
    }
}

/// One layer's cached keys and values: `[kv_heads, n, d]` each, and, when slots `0..n` of every
/// head hold exactly them, the whole storage `[kv_heads, capacity, d]` (what the kernel reads
/// without a copy).
#[derive(Clone, Copy)]
struct Kv<'a> {
    keys: &'a Tensor<3>,
    values: &'a Tensor<3>,
    storage: Option<(&'a Tensor<3>, &'a Tensor<3>)>,
}

/// Everything `request` asks of one layer, queued on the device.
/// `accumulated`: H2O's accumulated attention where the model's pass gave it (computed here
/// from `rotated`, every query of the prompt, otherwise).
fn compute(
    rotated: &Tensor<3>,
    raw: &Tensor<3>,
    kv: Kv<'_>,
    request: &StatsRequest,
    counter_causal: bool,
    route: Route,
    accumulated: Option<Tensor<2>>,
) -> std::result::Result<LayerTensors, kvslice_kernels::KernelError> {
    let keys = kv.keys;
    let n = keys.dims()[1];
    let rows = rotated.dims()[1];
    let windows = request
        .windows
        .iter()
        .map(|&w| {
            let w = w.min(rows);
            window_tensors_via(route, rotated.clone().narrow(1, rows - w, w), n, kv, request)
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok(LayerTensors {
        windows,
        accumulated: accumulated.or_else(|| request.accumulated.then(|| column_sums(rotated, keys, Direction::Causal))),
        counter_causal: counter_causal.then(|| column_sums(rotated, keys, Direction::CounterCausal)),
        non_causal: request.non_causal.iter().map(|&spec| (spec, non_causal_sums(rotated, keys, spec))).collect(),
        moments: request.query_moments_skip.filter(|&s| s < n).map(|skip| moments(raw, skip)),
        twins: request.twins.then(|| twins(keys)),
        tail_queries: tail_queries(rotated, request.tail_queries),
    })
}

/// `[H, t, d]`: the last `t` (at most all) of `rotated`'s queries; `None` for `t == 0`.
pub(crate) fn tail_queries(rotated: &Tensor<3>, t: usize) -> Option<Tensor<3>> {
    let n = rotated.dims()[1];
    let t = t.min(n);
    (t > 0).then(|| rotated.clone().narrow(1, n - t, t))
}

/// The window statistics of the window queries `qw` (`[H, w, d]`, the queries of the last `w`
/// of `n` keys) through `route`.
fn window_tensors_via(
    route: Route,
    qw: Tensor<3>,
    n: usize,
    kv: Kv<'_>,
    request: &StatsRequest,
) -> std::result::Result<WindowTensors, kvslice_kernels::KernelError> {
    match route {
        Route::BurnOps => return Ok(window_tensors(qw, kv.keys, kv.values, n, request)),
        Route::Kernel => return kernel_window_tensors(qw, kv, n, request),
        Route::Auto => {}
    }
    #[cfg(not(target_family = "wasm"))]
    if let Some(t) = host_window_tensors(&qw, kv, request) {
        return Ok(t);
    }
    if kvslice_kernels::buffer_id(&qw).is_some() {
        match kernel_window_tensors(qw.clone(), kv, n, request) {
            Ok(t) => return Ok(t),
            Err(e) => {
                static FALLBACK: Once = Once::new();
                FALLBACK.call_once(|| eprintln!("kvslice: window-statistics kernel: {e}; using Burn ops"));
            }
        }
    }
    Ok(window_tensors(qw, kv.keys, kv.values, n, request))
}

/// [`window_tensors`] from the window-statistics kernel: no `[H, w, n]` tensor is built.
fn kernel_window_tensors(
    qw: Tensor<3>,
    kv: Kv<'_>,
    n: usize,
    request: &StatsRequest,
) -> std::result::Result<WindowTensors, kvslice_kernels::KernelError> {
    let w = qw.dims()[1];
    let (keys, values) = kv.storage.unwrap_or((kv.keys, kv.values));
    let jacobian = request.jacobian || request.leverage;
    let want =
        kvslice_kernels::StatsRequest { value_norm: request.value_weighted, projection: request.projection, jacobian };
    // the kernel has no position-weighted table: Burn ops add it (one `[H, w, n]` pass)
    let position_weighted = request.position_weighted.then(|| {
        let a = softmax(scores(qw.clone(), kv.keys) + mask(n - w, w, n, Direction::Causal, &qw.device()), 2);
        weight_by_position(a, n)
    });
    let s = kvslice_kernels::window_stats(&qw, keys, values, n, want)?;
    let leverage = s.jacobian.as_ref().filter(|_| request.leverage).map(|j| leverage(kv.keys, j));
    Ok(WindowTensors {
        window: w,
        mean: s.mean,
        var: s.variance,
        last: s.last,
        entropy: s.entropy,
        value_weighted: s.value_norm,
        projection: s.projection,
        jacobian: s.jacobian,
        leverage,
        position_weighted,
    })
}

/// [`window_tensors`] on the CPU backend: kvslice-model's host window statistics (one
/// `[w, n]` score matrix per head at a time, `gemm` and a vectorised `exp`, every core). `None`
/// on other devices or when the host routes are off (the other routes then answer).
#[cfg(not(target_family = "wasm"))]
fn host_window_tensors(qw: &Tensor<3>, kv: Kv<'_>, request: &StatsRequest) -> Option<WindowTensors> {
    use kvslice_model::{flash, window};
    if kvslice_kernels::buffer_id(qw).is_some() || !kvslice_model::model::host_attention_on() {
        return None;
    }
    let [heads, w, d] = qw.dims();
    let [kv_heads, len, _] = kv.keys.dims();
    let (qh, kh, vh) = (host_values(qw)?, host_values(kv.keys)?, host_values(kv.values)?);
    let shape = flash::Shape { heads, kv_heads, n: w, len, head_dim: d };
    let want = window::Want {
        value_norm: request.value_weighted,
        projection: request.projection,
        jacobian: request.jacobian || request.leverage,
        position_weighted: request.position_weighted,
    };
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let s = window::window_stats(&qh, &kh, &vh, shape, want, scale, kvslice_model::model::host_threads()).ok()?;
    let device = qw.device();
    let table = |x: Vec<f32>| {
        Tensor::<1>::from_data(burn::tensor::TensorData::new(x, [heads * len]), &device).reshape([heads, len])
    };
    let jacobian = s.jacobian.map(table);
    let leverage = jacobian.as_ref().filter(|_| request.leverage).map(|j| leverage(kv.keys, j));
    Some(WindowTensors {
        window: w,
        mean: table(s.mean),
        var: table(s.var),
        last: table(s.last),
        entropy: Tensor::<1>::from_data(burn::tensor::TensorData::new(s.entropy, [heads]), &device),
        value_weighted: s.value_norm.map(table),
        projection: s.projection.map(table),
        jacobian,
        leverage,
        position_weighted: s.position_weighted.map(table),
    })
}

/// A tensor's values on the host, row-major.
#[cfg(not(target_family = "wasm"))]
fn host_values(t: &Tensor<3>) -> Option<Vec<f32>> {
    t.clone().into_data().convert::<f32>().try_into_vec::<f32>().ok()
}

/// `[heads, m, d]` queries against `[kv_heads, n, d]` keys → `[heads, m, n]` scaled scores.
fn scores(q: Tensor<3>, keys: &Tensor<3>) -> Tensor<3> {
    let [heads, m, d] = q.dims();
    let [kv_heads, n, _] = keys.dims();
    let group = heads / kv_heads;
    let s = q.reshape([kv_heads, group * m, d]).matmul(keys.clone().swap_dims(1, 2));
    s.mul_scalar(1.0 / (d as f64).sqrt()).reshape([heads, m, n])
}

/// Keys `[kv_heads, n, d]` read per query head: `[heads, n, d]`.
fn per_query_head(t: &Tensor<3>, heads: usize) -> Tensor<3> {
    let [kv_heads, n, d] = t.dims();
    let group = heads / kv_heads;
    t.clone().unsqueeze_dim::<4>(1).expand([kv_heads, group, n, d]).reshape([heads, n, d])
}

/// Additive mask `[1, m, n]`: query `i` (at position `first + i`) sees key `j` when
/// `j <= first + i` (causal) or `j >= first + i` (counter-causal).
fn mask(first: usize, m: usize, n: usize, direction: Direction, device: &burn::tensor::Device) -> Tensor<3> {
    let rows = Tensor::<1, Int>::arange(first as i64..(first + m) as i64, device).reshape([1, m, 1]).expand([1, m, n]);
    let cols = Tensor::<1, Int>::arange(0..n as i64, device).reshape([1, 1, n]).expand([1, m, n]);
    let hidden = match direction {
        Direction::Causal => cols.greater(rows),
        Direction::CounterCausal => cols.lower(rows),
    };
    Tensor::<3>::zeros([1, m, n], device).mask_fill(hidden, f32::NEG_INFINITY)
}

#[derive(Clone, Copy)]
enum Direction {
    Causal,
    CounterCausal,
}

fn window_tensors(
    qw: Tensor<3>,
    keys: &Tensor<3>,
    values: &Tensor<3>,
    n: usize,
    request: &StatsRequest,
) -> WindowTensors {
    let (value_weighted, projection) = (request.value_weighted, request.projection);
    let jacobian = request.jacobian || request.leverage;
    let [heads, w, _] = qw.dims();
    let device = qw.device();
    let first = n - w;
    let a = softmax(scores(qw, keys) + mask(first, w, n, Direction::Causal, &device), 2); // [H, w, n]
    let mean3 = a.clone().mean_dim(1); // [H, 1, n]
    let var = if w > 1 {
        (a.clone() - mean3.clone()).powi_scalar(2).sum_dim(1).div_scalar((w - 1) as f64).reshape([heads, n])
    } else {
        Tensor::zeros([heads, n], &device)
    };
    let last = a.clone().narrow(1, w - 1, 1).reshape([heads, n]);
    let entropy = if first > 0 {
        let p = a.clone().narrow(2, 0, first);
        let e = (p.clone() * (p + 1e-10).log()).neg().sum_dim(2); // [H, w, 1]
        e.mean_dim(1).reshape([heads])
    } else {
        Tensor::zeros([heads], &device)
    };
    let mean = mean3.reshape([heads, n]);
    let position_weighted = request.position_weighted.then(|| weight_by_position(a.clone(), n));
    let vh = (value_weighted || projection || jacobian).then(|| per_query_head(values, heads)); // [H, n, d]
    let jac = vh.as_ref().filter(|_| jacobian).map(|v| {
        // ‖v_j − o_q‖² = ‖v_j‖² − 2⟨v_j, o_q⟩ + ‖o_q‖², without a [H, w, n, d] tensor
        let o = a.clone().matmul(v.clone()); // [H, w, d]
        let vn = v.clone().powi_scalar(2).sum_dim(2).swap_dims(1, 2); // [H, 1, n]
        let on = o.clone().powi_scalar(2).sum_dim(2); // [H, w, 1]
        let vo = o.matmul(v.clone().swap_dims(1, 2)); // [H, w, n]
        let dev = (vn - vo.mul_scalar(2.0) + on).clamp_min(0.0).sqrt();
        (a.clone() * dev).mean_dim(1).reshape([heads, n])
    });
    let leverage = jac.as_ref().filter(|_| request.leverage).map(|j| leverage(keys, j));
    let value_weighted = vh.as_ref().filter(|_| value_weighted).map(|v| {
        let norm = v.clone().powi_scalar(2).sum_dim(2).sqrt().reshape([heads, n]);
        mean.clone() * norm
    });
    let projection = vh.filter(|_| projection).map(|v| {
        let o = a.clone().matmul(v.clone()); // [H, w, d]
        let dir = o.clone() / o.powi_scalar(2).sum_dim(2).sqrt().clamp_min(1e-30);
        let m = dir.matmul(v.swap_dims(1, 2)); // [H, w, n]: ⟨v_j, ô_i⟩
        (a.clone() * m).mean_dim(1).reshape([heads, n])
    });
    WindowTensors {
        window: w,
        mean,
        var,
        last,
        entropy,
        value_weighted,
        projection,
        jacobian: jac,
        leverage,
        position_weighted,
    }
}

/// `[H, n]`: `mean_i p_i a_ij` of window attention `a` (`[H, w, n]`, the queries of the last `w`
/// of `n` positions), each row weighted by its query's position `p_i = n − w + i`.
fn weight_by_position(a: Tensor<3>, n: usize) -> Tensor<2> {
    let [heads, w, _] = a.dims();
    let p = Tensor::<1, Int>::arange((n - w) as i64..n as i64, &a.device()).float().reshape([1, w, 1]);
    (a * p).mean_dim(1).reshape([heads, n])
}

/// Jacap's ridge leverage `[H_kv, n]`: `ℓ_j = w_j k_jᵀ (G + λI)⁻¹ k_j` with `G = Kᵀ diag(w) K`,
/// `λ = tr(G)/d`, `w` the group-mean `jacobian` weights. The `d×d` inverse is a Newton–Schulz
/// iteration on the device (`X ← X(2I − MX)` from `X₀ = 2I/(λ + tr M)`): `M`'s eigenvalues lie
/// in `[λ, tr M]` with `tr M = 2dλ`, so `‖I − X₀M‖ ≤ (2d−1)/(2d+1)` and 14 quadratically
/// converging steps reach f32 precision for any `d ≤ 256`, with no read-back.
fn leverage(keys: &Tensor<3>, jacobian: &Tensor<2>) -> Tensor<2> {
    let [kv_heads, n, d] = keys.dims();
    let heads = jacobian.dims()[0];
    let group = heads / kv_heads;
    let device = keys.device();
    let w = jacobian.clone().reshape([kv_heads, group, n]).mean_dim(1); // [kv, 1, n]
    let wk = keys.clone() * w.clone().swap_dims(1, 2); // [kv, n, d]
    let g = wk.swap_dims(1, 2).matmul(keys.clone()); // [kv, d, d]
    let eye = Tensor::<2>::eye(d, &device).unsqueeze_dim::<3>(0).expand([kv_heads, d, d]);
    let trace = (g.clone() * eye.clone()).sum_dim(2).sum_dim(1); // [kv, 1, 1]
    let lambda = trace.div_scalar(d as f64).clamp_min(1e-12).mul_scalar(jacap::RIDGE);
    let m = g + eye.clone() * lambda.clone();
    let trace_m = lambda.clone().mul_scalar(2.0 * d as f64);
    let mut x = eye.clone() * (lambda + trace_m).recip().mul_scalar(2.0);
    for _ in 0..14 {
        let mx = m.clone().matmul(x.clone());
        x = x.matmul(eye.clone().mul_scalar(2.0) - mx);
    }
    let kx = keys.clone().matmul(x); // [kv, n, d]
    let quad = (kx * keys.clone()).sum_dim(2).reshape([kv_heads, n]);
    quad * w.reshape([kv_heads, n])
}

/// TwinKV's best twin of every key, `[H_kv, n]` similarity and position (as f32): the highest
/// cosine similarity to a key of the same head more than `EXCLUSION` positions away, in row
/// chunks (never the `n×n` matrix at once). `−2` marks a key with no candidate.
fn twins(keys: &Tensor<3>) -> (Tensor<2>, Tensor<2>) {
    let [kv_heads, n, _] = keys.dims();
    let device = keys.device();
    let unit = keys.clone() / keys.clone().powi_scalar(2).sum_dim(2).sqrt().clamp_min(1e-30);
    let rows = (MAX_CHUNK_ELEMS / (kv_heads * n).max(1)).clamp(1, n);
    let (mut sims, mut idxs) = (Vec::new(), Vec::new());
    let mut start = 0;
    while start < n {
        let m = rows.min(n - start);
        let sim = unit.clone().narrow(1, start, m).matmul(unit.clone().swap_dims(1, 2)); // [kv, m, n]
        let r =
            Tensor::<1, Int>::arange(start as i64..(start + m) as i64, &device).reshape([1, m, 1]).expand([1, m, n]);
        let c = Tensor::<1, Int>::arange(0..n as i64, &device).reshape([1, 1, n]).expand([1, m, n]);
        let near = (r - c).abs().lower_equal_elem(twin::EXCLUSION as i64).expand([kv_heads, m, n]);
        let sim = sim.mask_fill(near, -2.0);
        let (best, arg) = sim.max_dim_with_indices(2);
        sims.push(best.reshape([kv_heads, m]));
        idxs.push(arg.float().reshape([kv_heads, m]));
        start += m;
    }
    (Tensor::cat(sims, 1), Tensor::cat(idxs, 1))
}

/// `[H, n]` column sums of the attention of every query (causal: `Σ_{i ≥ j} a_ij`;
/// counter-causal: `Σ_{i ≤ j} c_ij`), in chunks of queries.
fn column_sums(q: &Tensor<3>, keys: &Tensor<3>, direction: Direction) -> Tensor<2> {
    let [heads, n, _] = q.dims();
    let device = q.device();
    #[cfg(not(target_family = "wasm"))]
    if let Some(sums) = host_column_sums(q, keys, direction) {
        return sums;
    }
    let rows = (MAX_CHUNK_ELEMS / (heads * n).max(1)).clamp(1, n);
    let mut total = Tensor::<2>::zeros([heads, n], &device);
    let mut start = 0;
    while start < n {
        let m = rows.min(n - start);
        let qc = q.clone().narrow(1, start, m);
        let a = softmax(scores(qc, keys) + mask(start, m, n, direction, &device), 2);
        total = total + a.sum_dim(1).reshape([heads, n]);
        start += m;
    }
    total
}

/// [`column_sums`] on the CPU backend: kvslice-model's tiled two-pass kernel (no mask, no
/// score matrix, every core). `None` on other devices, or when the shapes are not a prompt's
/// (the tensor route then answers).
#[cfg(not(target_family = "wasm"))]
fn host_column_sums(q: &Tensor<3>, keys: &Tensor<3>, direction: Direction) -> Option<Tensor<2>> {
    use kvslice_model::flash;
    if kvslice_kernels::buffer_id(q).is_some() || !kvslice_model::model::host_attention_on() {
        return None;
    }
    let [heads, n, d] = q.dims();
    let [kv_heads, len, _] = keys.dims();
    let (qh, kh) = (host_values(q)?, host_values(keys)?);
    let shape = flash::Shape { heads, kv_heads, n, len, head_dim: d };
    let direction = match direction {
        Direction::Causal => flash::Direction::Causal,
        Direction::CounterCausal => flash::Direction::CounterCausal,
    };
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let sums = flash::column_sums(&qh, &kh, shape, direction, scale, kvslice_model::model::host_threads()).ok()?;
    Some(Tensor::<1>::from_data(burn::tensor::TensorData::new(sums, [heads * n]), &q.device()).reshape([heads, n]))
}

/// Column sums `[H, n]` of chunked non-causal attention ([`WindowStats::non_causal`]): in each
/// chunk of `chunk` positions every query attends to every key of the chunk with unscaled
/// logits. The last chunk's zero padding is accounted for without being built: each real query's
/// softmax has `pad` more zero logits in its denominator, and each of the `pad` zero queries
/// gives `1/chunk` to every key of the chunk. One chunk at a time, its queries in blocks, so no
/// tensor holds more than about `MAX_CHUNK_ELEMS` scores whatever the chunk size. Only `spec`'s
/// range is chunked (from its first position); the positions outside it are zero.
fn non_causal_sums(q: &Tensor<3>, keys: &Tensor<3>, spec: NonCausalSpec) -> Tensor<2> {
    let [heads, n, _] = q.dims();
    let chunk = spec.chunk;
    let range = spec.range(n);
    if chunk == 0 || range.is_empty() {
        return Tensor::<2>::zeros([heads, n], &q.device());
    }
    let k = per_query_head(keys, heads);
    let mut parts = Vec::with_capacity(range.len().div_ceil(chunk) + 2);
    if range.start > 0 {
        parts.push(Tensor::<2>::zeros([heads, range.start], &q.device()));
    }
    let mut start = range.start;
    while start < range.end {
        let m = chunk.min(range.end - start);
        let pad = chunk - m;
        let kc = k.clone().narrow(1, start, m).swap_dims(1, 2); // [H, d, m]
        // each query's softmax is its own: queries in blocks of `[H, rows, m]` at most
        let rows = (MAX_CHUNK_ELEMS / (heads * m).max(1)).clamp(1, m);
        let mut sums = Tensor::<2>::zeros([heads, m], &q.device());
        let mut first = 0;
        while first < m {
            let r = rows.min(m - first);
            let logits = q.clone().narrow(1, start + first, r).matmul(kc.clone()); // [H, r, m]
            let a = if pad == 0 {
                softmax(logits, 2)
            } else {
                // the padding's zero logits take part in the maximum and the denominator
                let top = logits.clone().max_dim(2).clamp_min(0.0); // [H, r, 1]
                let e = (logits - top.clone()).exp();
                let denom = e.clone().sum_dim(2) + top.neg().exp().mul_scalar(pad as f64);
                e / denom
            };
            sums = sums + a.sum_dim(1).reshape([heads, m]);
            first += r;
        }
        parts.push(if pad == 0 { sums } else { sums.add_scalar(pad as f64 / chunk as f64) });
        start += m;
    }
    if range.end < n {
        parts.push(Tensor::<2>::zeros([heads, n - range.end], &q.device()));
    }
    Tensor::cat(parts, 1)
}

/// Mean `[H, d]` and population covariance `[H, d, d]` of the pre-RoPE queries after `skip`.
fn moments(raw: &Tensor<3>, skip: usize) -> (Tensor<2>, Tensor<3>) {
    let [heads, n, d] = raw.dims();
    let x = raw.clone().narrow(1, skip, n - skip);
    let mean = x.clone().mean_dim(1); // [H, 1, d]
    let c = x - mean.clone();
    let cov = c.clone().swap_dims(1, 2).matmul(c).div_scalar((n - skip) as f64);
    (mean.reshape([heads, d]), cov)
}

/// Window statistics of decode queries over a layer's compacted cache, for decode-time
/// recompression: `qw` (`[H, w, d]`, after RoPE) are the queries of the tokens in the last `w`
/// slots of every head, in order, and every head of `layer` holds the same number `n` of entries
/// in ascending position order, so that slot order is causal order: query `i` sees slots
/// `0..=n−w+i`. The statistics are those of a prompt of `n` tokens whose window is the last
/// `w` (only the window tables `request` asks for; no accumulated, counter-causal, moment or
/// twin tables).
pub(crate) async fn decode_window_stats(
    qw: Tensor<3>,
    layer: &LayerKv,
    request: &StatsRequest,
) -> Result<HostLayerStats> {
    let [heads, w, d] = qw.dims();
    let n = layer.max_len();
    if layer.lens().iter().any(|&l| l != n) || w == 0 || w > n {
        return Err(crate::error::RuntimeError::Options(format!(
            "decode statistics need {w} queries over heads of one length (lengths {:?})",
            layer.lens()
        )));
    }
    let (keys, values) = layer.view();
    let kv = Kv { keys: &keys, values: &values, storage: layer.storage() };
    let windows = request
        .windows
        .iter()
        .map(|_| window_tensors_via(Route::Auto, qw.clone(), n, kv, request))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| crate::error::RuntimeError::Device(format!("window-statistics kernel: {e}")))?;
    let obs = Observations {
        layers: vec![LayerTensors { windows, ..LayerTensors::default() }],
        compute_seconds: 0.0,
        heads,
        kv_heads: layer.lens().len(),
        head_dim: d,
        len: n,
    };
    Ok(obs.read().await?.remove(0))
}

/// The statistics the recorder computes for one layer, from that layer's queries (`[heads, n,
/// d]`, after RoPE and before) and its cached keys and values (`[kv_heads, n, d]`), read back.
/// `counter_causal` asks for the counter-causal column sums.
pub async fn layer_stats(
    rotated: &Tensor<3>,
    raw: &Tensor<3>,
    keys: &Tensor<3>,
    values: &Tensor<3>,
    request: &StatsRequest,
    counter_causal: bool,
) -> Result<HostLayerStats> {
    layer_stats_via(Route::Auto, rotated, raw, keys, values, request, counter_causal).await
}

/// [`layer_stats`] with the window statistics computed through `route` (to compare the kernel
/// with Burn ops); [`Route::Kernel`] returns the kernel's error instead of falling back.
#[allow(clippy::too_many_arguments)]
pub async fn layer_stats_via(
    route: Route,
    rotated: &Tensor<3>,
    raw: &Tensor<3>,
    keys: &Tensor<3>,
    values: &Tensor<3>,
    request: &StatsRequest,
    counter_causal: bool,
) -> Result<HostLayerStats> {
    let [heads, _, d] = rotated.dims();
    let kv = Kv { keys, values, storage: None };
    let layer = compute(rotated, raw, kv, request, counter_causal, route, None)
        .map_err(|e| crate::error::RuntimeError::Device(format!("window-statistics kernel: {e}")))?;
    let obs = Observations {
        layers: vec![layer],
        compute_seconds: 0.0,
        heads,
        kv_heads: keys.dims()[0],
        head_dim: d,
        len: keys.dims()[1],
    };
    Ok(obs.read().await?.remove(0))
}
