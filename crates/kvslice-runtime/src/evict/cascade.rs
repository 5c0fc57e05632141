//! CAKE's cascading prefill: each layer is compressed as soon as its attention has run, and the
//! budgets of the layers before it are recomputed and those layers trimmed (Qin et al., ICLR
//! 2025, §3.4). The full K/V of only one layer exists at a time — a scratch reused by every
//! layer — so peak KV memory stays near the total budget plus one layer, where a one-shot
//! eviction holds the whole prompt's cache first.
//!
//! The layer's window statistics are read back while the forward pass runs, so this path
//! blocks on the device and is native-only; browsers use the one-shot eviction.

use std::time::Duration;

use burn::tensor::Tensor;
use kvslice_cache::{CacheError, CacheGeometry, KvCache, KvStore, LayerKv};
use kvslice_model::Llama;
use kvslice_policy::alloc::CakeCascade;
use kvslice_policy::{LayerInput, Policy, Scores, select_heads};

use super::observe::{StatsRequest, layer_stats};
use super::{Compression, CompressionReport, DecodeEviction};
use crate::error::RuntimeError;
use crate::host::now;

/// The prefill store of a cascading compression.
pub(crate) struct CascadeStore<'p> {
    policy: &'p Policy,
    cascade: CakeCascade,
    window: usize,
    per_layer: usize,
    /// Decode room added to every compressed layer.
    room: usize,
    /// One layer's full K/V, reused by every layer.
    scratch: KvCache,
    /// Compressed layers so far, with their scores (positions `0..n`).
    done: Vec<(LayerKv, Scores)>,
    pub peak_bytes: usize,
    /// How many of each layer's last queries to keep, and those kept (`[H, t, d]`).
    tail: usize,
    pub tail_queries: Vec<Option<Tensor<3>>>,
    /// Seconds spent in statistics, selection and compaction (inside the prefill).
    pub spent: f64,
    /// The prompt's length: a layer is complete when the scratch holds this many entries.
    len: usize,
    /// The layer the scratch is filling, and the last queries of its chunks so far (after
    /// RoPE, `[H, m, d]` each: what the window and the decode-time tail read).
    filling: Option<usize>,
    pending: super::observe::ChunkQueries,
}

fn err(e: impl std::fmt::Display) -> CacheError {
    CacheError::Eviction(e.to_string())
}

impl<'p> CascadeStore<'p> {
    pub fn new(
        policy: &'p Policy,
        geometry: CacheGeometry,
        len: usize,
        per_layer: usize,
        room: usize,
        tail: usize,
        device: &burn::tensor::Device,
    ) -> crate::Result<Self> {
        let window = policy.needs().window;
        let cake =
            policy.cascade().ok_or_else(|| crate::RuntimeError::Options("the policy does not cascade".into()))?;
        let cascade = CakeCascade::new(cake, geometry.layers, len, per_layer, window)
            .map_err(|e| crate::RuntimeError::Options(e.to_string()))?;
        let scratch = KvCache::new(CacheGeometry { layers: 1, capacity: len, ..geometry }, device)?;
        Ok(CascadeStore {
            policy,
            cascade,
            window,
            per_layer,
            room,
            scratch,
            done: Vec::new(),
            peak_bytes: 0,
            tail,
            tail_queries: Vec::new(),
            spent: 0.0,
            len,
            filling: None,
            pending: Default::default(),
        })
    }

    /// The compressed cache, every layer's kept positions and their scores (`[layer][kv_head]`,
    /// in slot order).
    #[allow(clippy::type_complexity)]
    pub fn finish(self) -> crate::Result<(KvCache, Vec<Vec<Vec<u32>>>, Vec<Vec<Vec<f32>>>)> {
        let kept: Vec<Vec<Vec<u32>>> = self
            .done
            .iter()
            .map(|(l, _)| (0..l.lens().len()).map(|h| l.head_positions(h).to_vec()).collect())
            .collect();
        let scores = self
            .done
            .iter()
            .zip(&kept)
            .map(|((_, s), heads)| {
                heads.iter().enumerate().map(|(h, pos)| pos.iter().map(|&p| s.row(h)[p as usize]).collect()).collect()
            })
            .collect();
        let layers = self.done.into_iter().map(|(l, _)| l).collect();
        Ok((KvCache::from_layers(layers)?, kept, scores))
    }
}

impl KvStore for CascadeStore<'_> {
    fn append(
        &mut self,
        layer: usize,
        keys: Tensor<3>,
        values: Tensor<3>,
        positions: &[u32],
    ) -> kvslice_cache::Result<()> {
        if layer != self.done.len() {
            return Err(err(format!("layer {layer} arrived after {} compressed layers", self.done.len())));
        }
        // a layer's first chunk starts the scratch over; its later chunks append to it
        if self.filling != Some(layer) {
            self.scratch.clear();
            self.pending = Default::default();
            self.filling = Some(layer);
        }
        self.scratch.append(0, keys, values, positions)
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&LayerKv> {
        match self.done.get(layer) {
            Some((l, _)) => Ok(l),
            None => self.scratch.layer(0),
        }
    }

    fn takes_chunks(&self) -> bool {
        true
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        let t0 = now();
        let full = self.scratch.layer(0)?;
        let rotated = if rotated.dims()[1] == self.len {
            rotated.clone()
        } else {
            // a chunk: the layer is compressed once its last chunk is in; only the queries the
            // window and the tail read are kept
            self.pending.push(rotated, None, self.window.max(self.tail).max(1));
            if full.max_len() < self.len {
                self.spent += now() - t0;
                return Ok(());
            }
            std::mem::take(&mut self.pending).take().0
        };
        // the request has no query moments: the pre-RoPE queries are not read
        let _ = raw;
        let (rotated, raw) = (&rotated, &rotated);
        self.tail_queries.push(super::observe::tail_queries(rotated, self.tail));
        let (keys, values) = full.view();
        let request = StatsRequest { windows: vec![self.window], ..StatsRequest::default() };
        let stats = pollster::block_on(layer_stats(rotated, raw, &keys, &values, &request, false)).map_err(err)?;
        let ws = stats.window(self.window).ok_or_else(|| err("no window statistics"))?;
        let scores = self
            .policy
            .score_layer(&LayerInput::new(ws).at(layer), self.per_layer)
            .map_err(err)?
            .ok_or_else(|| err("not a scored policy"))?;
        let budgets = self.cascade.push(ws).to_vec();
        let protect = self.policy.protect(self.per_layer);
        let heads = full.lens().len();
        // this layer: top-k of its full K/V (slots are positions in the scratch)
        let kept = select_heads(&scores, &vec![budgets[layer]; heads], protect).map_err(err)?;
        let compressed = full.gather(&kept, budgets[layer] + self.room)?;
        self.done.push((compressed, scores));
        // earlier layers whose budget shrank: trim to the top-k of the smaller budget
        for (j, &b) in budgets.iter().enumerate().take(layer) {
            let (kv, scores) = &self.done[j];
            if kv.lens().iter().all(|&l| l <= b) {
                continue;
            }
            let kept = select_heads(scores, &vec![b; heads], protect).map_err(err)?;
            let slots: Vec<Vec<u32>> = kept
                .iter()
                .enumerate()
                .map(|(h, pos)| {
                    let held = kv.head_positions(h);
                    pos.iter()
                        .map(|p| {
                            held.binary_search(p)
                                .map(|s| s as u32)
                                .map_err(|_| err(format!("position {p} was evicted earlier")))
                        })
                        .collect::<kvslice_cache::Result<Vec<u32>>>()
                })
                .collect::<kvslice_cache::Result<_>>()?;
            let trimmed = kv.gather(&slots, b + self.room)?;
            self.done[j].0 = trimmed;
        }
        let held: usize =
            self.done.iter().map(|(l, _)| l.storage_bytes()).sum::<usize>() + self.scratch.storage_bytes();
        self.peak_bytes = self.peak_bytes.max(held);
        self.spent += now() - t0;
        Ok(())
    }
}

/// Prefills `prompt` with CAKE's cascade: returns the compressed cache (each layer at its
/// budget: CAKE's decoding phase keeps it there), the decode-time eviction state, the hidden
/// states of the prompt and the report.
pub(crate) fn prefill(
    compression: &Compression,
    model: &Llama,
    prompt: &[u32],
    max_new_tokens: usize,
) -> crate::Result<(KvCache, Option<DecodeEviction>, Tensor<2>, CompressionReport)> {
    let n = prompt.len();
    let c = &model.config;
    let protect = compression.policy().protect(n);
    let budget = compression
        .spec
        .resolve(n, c.num_layers, protect.count(n))
        .map_err(|e| RuntimeError::Options(format!("{}: {e}", compression.label())))?;
    let geometry = CacheGeometry { layers: c.num_layers, kv_heads: c.num_kv_heads, head_dim: c.head_dim, capacity: n };
    let mut store = CascadeStore::new(
        compression.policy(),
        geometry,
        n,
        budget.per_layer,
        compression.room(&compression.decode_rule(budget.per_layer), budget.per_layer, n, max_new_tokens).0,
        compression.request(c.num_layers).tail_queries,
        model.device(),
    )?;
    let positions: Vec<u32> = (0..n as u32).collect();
    let hidden = model.forward(prompt, &positions, &mut store)?;
    let (peak_bytes, spent) = (store.peak_bytes, store.spent);
    let tails = std::mem::take(&mut store.tail_queries);
    let (mut cache, kept, scores) = store.finish()?;
    let full_bytes = c.num_layers * c.num_kv_heads * n * cache.entry_bytes();
    cache.convert(compression.kv_dtype())?;
    let eviction = compression.decode_state(budget.per_layer, &cache, scores, tails, n)?;
    let report = CompressionReport {
        kept_entries: kept.iter().flatten().map(Vec::len).sum(),
        kept,
        prompt_tokens: n,
        full_bytes,
        compressed_bytes: cache.storage_bytes(),
        peak_bytes,
        plan_time: Duration::from_secs_f64(spent),
        compact_time: Duration::ZERO,
        renumbered: None,
    };
    Ok((cache, eviction, hidden, report))
}
