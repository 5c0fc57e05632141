//! Eviction in the runtime: prefill → statistics → policy → compaction → decode.
//!
//! A [`Compression`] is a registered policy with a budget. After the prompt's forward pass
//! (which records the statistics the policy needs, see [`observe`]), the policy's plan chooses
//! the kept positions of every (layer, KV head), and [`compress_cache`] gathers them into new,
//! smaller storage: the full cache is then dropped, so the memory is really freed. Keys are
//! stored after RoPE, so decoding continues at the original positions over ragged per-head
//! caches.
//!
//! Decode-time policies (StreamingLLM, H2O, TOVA, LaCache) keep the cache at its budget while
//! decoding: a new token takes the slot of the entry the policy evicts ([`DecodeEviction`]).
//! The other policies evict once, after the prefill, and the cache grows by the generated
//! tokens.

#[cfg(not(target_family = "wasm"))]
pub(crate) mod cascade;
pub mod observe;

use std::time::Duration;

use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor, TensorData, Transaction};
use kvslice_cache::{KvCache, KvStore, LayerKv};
use kvslice_model::Llama;
use kvslice_policy::{BudgetSpec, KvView, Ladder, LayerInput, ModelInfo, Plan, Policy, Temporal, WindowStats};

use crate::error::{Result, RuntimeError};
use crate::session::read_f32;
pub use observe::{HostLayerStats, Observations, StatsRequest};

/// How the cache behaves while decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeRule {
    /// Evict once after the prefill; the cache then grows by one entry per generated token.
    Grow,
    /// Fixed size: the oldest entry after the `sinks` first positions goes (StreamingLLM).
    Recent { sinks: usize },
    /// Fixed size: the lowest accumulated attention goes, the `recent` newest positions kept
    /// (H2O).
    Accumulated { recent: usize },
    /// Fixed size: the lowest attention of the newest query, averaged over the layer's heads,
    /// goes (TOVA).
    LastQuery,
    /// Fixed size: when full, the ladder compacts each layer again (LaCache's iterative
    /// compaction), freeing `1/8` of the slots.
    Ladder(Ladder),
    /// Fixed size at each layer's own budget (CAKE's decoding phase): the entry with the lowest
    /// indicator `mean + γ·variance` of its attention over the last `window` decode queries
    /// goes; entries younger than `window` steps are kept. Until an entry has `window`
    /// observations its indicator is the prefill's.
    Indicator { window: usize, gamma: f32 },
    /// Fixed size: the entry with the lowest exponential moving average of its attention
    /// (averaged over the layer's heads, as TOVA's) goes (InertiaKV), the attention folded in
    /// at the refresh steps only (every step, every `r` steps, or never: score-free). Entries
    /// not scored yet stay.
    Inertia(Temporal),
}

/// A policy with a budget, ready to compress a prefilled prompt.
#[derive(Debug)]
pub struct Compression {
    name: String,
    budget_text: String,
    policy: Policy,
    spec: BudgetSpec,
    cascade: bool,
}

impl Compression {
    /// The registered policy `name` with budget `budget` (`128L`, `10%`, `2048`).
    pub fn new(name: &str, budget: &str, model: &ModelInfo) -> Result<Self> {
        let policy = kvslice_policy::build(name, model).map_err(|e| RuntimeError::Options(e.to_string()))?;
        let spec: BudgetSpec =
            budget.parse().map_err(|e: kvslice_policy::PolicyError| RuntimeError::Options(e.to_string()))?;
        Ok(Compression { name: name.to_string(), budget_text: budget.to_string(), policy, spec, cascade: true })
    }

    /// The same compression done in one shot after the whole prefill, even for CAKE (whose
    /// cascade is the default): the reference its cascade is measured against.
    pub fn one_shot(mut self) -> Self {
        self.cascade = false;
        self
    }

    /// What the policy needs of a model.
    pub fn model_info(model: &Llama) -> ModelInfo {
        ModelInfo { head_dim: model.config.head_dim, rope_theta: model.config.rope_theta }
    }

    /// `policy@budget`, the key of evaluation reports.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name, self.budget_text)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether the prefill compresses layer by layer (CAKE's cascade; native targets only).
    pub fn cascades(&self) -> bool {
        cfg!(not(target_family = "wasm")) && self.cascade && self.name == "cake"
    }

    /// What the prefill must record for this policy, for a model of `layers` layers.
    pub fn request(&self, layers: usize) -> StatsRequest {
        let mut r = StatsRequest::default();
        self.add_to(&mut r, layers);
        r
    }

    /// Adds this policy's needs to `request` (a sweep records the union once).
    pub fn add_to(&self, request: &mut StatsRequest, layers: usize) {
        let needs = self.policy.needs();
        let skip = self.policy.protect(usize::MAX / 2).sinks;
        request.add(&needs, &self.policy.counter_causal_layers(layers), Some(skip));
    }

    /// Extra slots per head and the least capacity of a compressed layer: room for the new
    /// tokens when the cache grows; the budget as asked (not clipped to a shorter prompt) when
    /// the cache keeps a fixed size; for CAKE, each layer's own budget plus what the asked
    /// budget exceeds the prompt by.
    pub fn room(&self, rule: &DecodeRule, per_layer: usize, prompt: usize, max_new_tokens: usize) -> (usize, usize) {
        let new = max_new_tokens.saturating_sub(1);
        let asked = match self.spec {
            BudgetSpec::Flat(b) | BudgetSpec::AveragePerLayer(b) => b,
            BudgetSpec::Fraction { .. } => per_layer,
        };
        match rule {
            DecodeRule::Grow => (new, 0),
            DecodeRule::Indicator { .. } => (asked.saturating_sub(per_layer).min(new), 0),
            _ => (0, asked.min(prompt + new).max(1)),
        }
    }

    /// The decode-time rule of this policy at a budget of `per_layer` tokens.
    pub fn decode_rule(&self, per_layer: usize) -> DecodeRule {
        let protect = self.policy.protect(per_layer);
        if let Some(t) = self.policy.temporal() {
            return DecodeRule::Inertia(t);
        }
        match (self.name.as_str(), &self.policy) {
            ("streaming-llm", _) => DecodeRule::Recent { sinks: protect.sinks },
            ("h2o", _) => DecodeRule::Accumulated { recent: protect.recent },
            ("tova", _) => DecodeRule::LastQuery,
            ("cake", _) => DecodeRule::Indicator { window: protect.recent.max(2), gamma: 200.0 },
            (_, Policy::Ladder(l)) => DecodeRule::Ladder(*l),
            _ => DecodeRule::Grow,
        }
    }

    /// Runs the policy on a prefilled prompt: `stats` from [`Observations::read`], `cache` the
    /// full cache (read when the policy needs keys or values), `model` for the output projection
    /// (CriticalKV's value norms).
    pub async fn plan(&self, stats: &[HostLayerStats], cache: &KvCache, model: &Llama) -> Result<Plan> {
        let needs = self.policy.needs();
        let layers = stats.len();
        let cc_layers = self.policy.counter_causal_layers(layers);
        let shared_cc = if cc_layers.len() == 1 && layers > 1 {
            stats[cc_layers[0]].window(0).and_then(|w| w.counter_causal.clone())
        } else {
            None
        };
        let mut window_stats: Vec<WindowStats> = Vec::with_capacity(layers);
        for (l, s) in stats.iter().enumerate() {
            let mut w = s
                .window(needs.window)
                .ok_or_else(|| RuntimeError::Options(format!("layer {l}: window {} not recorded", needs.window)))?
                .clone();
            if let Some(cc) = &shared_cc {
                w.counter_causal = Some(cc.clone());
            }
            window_stats.push(w);
        }
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut proj_l1 = Vec::new();
        for l in 0..layers {
            let layer = cache.layer(l)?;
            let (k, v) = layer.view();
            keys.push(if needs.keys { Some(read_f32(k).await?) } else { None });
            values.push(if needs.values { Some(read_f32(v.clone()).await?) } else { None });
            proj_l1.push(if needs.value_proj_l1 { Some(read_f32(value_proj_l1(model, l, v)).await?) } else { None });
        }
        let g = cache.geometry();
        let inputs: Vec<LayerInput<'_>> = (0..layers)
            .map(|l| {
                let n = window_stats[l].len;
                LayerInput {
                    stats: &window_stats[l],
                    kv: (needs.keys || needs.values).then(|| KvView {
                        kv_heads: g.kv_heads,
                        len: n,
                        head_dim: g.head_dim,
                        keys: keys[l].as_deref(),
                        values: values[l].as_deref(),
                    }),
                    query_moments: stats[l].moments.as_ref(),
                    value_proj_l1: proj_l1[l].as_deref(),
                }
            })
            .collect();
        self.policy.plan(&inputs, &self.spec).map_err(|e| RuntimeError::Options(format!("{}: {e}", self.label())))
    }

    /// Initial per-slot decode scores of the kept entries (`[layer][kv_head][slot]`), for the
    /// decode rules that rank by scores.
    fn initial_scores(&self, stats: &[HostLayerStats], plan: &Plan) -> Result<Vec<Vec<Vec<f32>>>> {
        let needs = self.policy.needs();
        let mut out = Vec::with_capacity(plan.kept.len());
        for (l, kept) in plan.kept.iter().enumerate() {
            let w = stats[l].window(needs.window).ok_or_else(|| RuntimeError::Options("missing statistics".into()))?;
            let input = LayerInput::new(w);
            let scores = self
                .policy
                .score_layer(&input, plan.budget.per_layer)
                .map_err(|e| RuntimeError::Options(e.to_string()))?;
            out.push(
                kept.iter()
                    .enumerate()
                    .map(|(h, pos)| match &scores {
                        Some(s) => pos.iter().map(|&p| s.row(h)[p as usize]).collect(),
                        None => vec![0.0; pos.len()],
                    })
                    .collect(),
            );
        }
        Ok(out)
    }
}

/// `[H, n]`: `‖v_j W_o^h‖₁`, each value after its query head's slice of the output projection.
pub fn value_proj_l1(model: &Llama, layer: usize, values: Tensor<3>) -> Tensor<2> {
    let attn = &model.weights.layers[layer].self_attn;
    let (heads, d) = (attn.num_heads, attn.head_dim);
    let [kv_heads, n, _] = values.dims();
    let group = heads / kv_heads;
    let w = attn.o_proj.weight.val(); // [heads·d, hidden]
    let hidden = w.dims()[1];
    let w = w.reshape([heads, d, hidden]);
    let v = values.unsqueeze_dim::<4>(1).expand([kv_heads, group, n, d]).reshape([heads, n, d]);
    v.matmul(w).abs().sum_dim(2).reshape([heads, n])
}

/// What one compression did.
#[derive(Debug, Clone, Default)]
pub struct CompressionReport {
    /// `[layer][kv_head]` kept source positions.
    pub kept: Vec<Vec<Vec<u32>>>,
    pub prompt_tokens: usize,
    /// Entries kept over all layers and heads.
    pub kept_entries: usize,
    /// K/V bytes of the full prompt and of the compressed cache's storage.
    pub full_bytes: usize,
    pub compressed_bytes: usize,
    /// The most K/V storage held at once while prefilling and compressing.
    pub peak_bytes: usize,
    /// Reading statistics back and planning; gathering the kept entries.
    pub plan_time: Duration,
    pub compact_time: Duration,
}

/// Gathers the kept positions of `plan` from `full` into a new cache with room for `extra`
/// more tokens per head (at least `min_capacity` slots per head).
pub fn compress_cache(full: &KvCache, kept: &[Vec<Vec<u32>>], extra: usize, min_capacity: usize) -> Result<KvCache> {
    let mut layers: Vec<LayerKv> = Vec::with_capacity(kept.len());
    for (l, heads) in kept.iter().enumerate() {
        let layer = full.layer(l)?;
        let slots: Vec<Vec<u32>> =
            heads.iter().enumerate().map(|(h, pos)| slots_of(layer.head_positions(h), pos)).collect::<Result<_>>()?;
        let most = heads.iter().map(Vec::len).max().unwrap_or(0);
        let capacity = (most + extra).max(min_capacity).max(1);
        layers.push(layer.gather(&slots, capacity)?);
    }
    Ok(KvCache::from_layers(layers)?)
}

/// Slots holding `positions` (sorted) in a head whose slots hold `slot_positions`.
fn slots_of(slot_positions: &[u32], positions: &[u32]) -> Result<Vec<u32>> {
    let sorted = slot_positions.windows(2).all(|w| w[0] < w[1]);
    positions
        .iter()
        .map(|&p| {
            let found = if sorted {
                slot_positions.binary_search(&p).ok()
            } else {
                slot_positions.iter().position(|&s| s == p)
            };
            found
                .map(|s| s as u32)
                .ok_or_else(|| RuntimeError::Options(format!("kept position {p} is not in the cache")))
        })
        .collect()
}

/// Decode-time eviction state of a session whose cache stays at a fixed size.
#[derive(Debug)]
pub struct DecodeEviction {
    rule: DecodeRule,
    /// `[layer][kv_head][slot]` scores (accumulated or last attention).
    scores: Vec<Vec<Vec<f32>>>,
    /// Attention of the newest query per layer, `[kv_heads, capacity]`, not yet read back.
    pending: Vec<Option<Tensor<2>>>,
    /// LaCache's ladder cursor per layer, in slot order.
    cursors: Vec<usize>,
    /// CAKE: per `[layer][kv_head]`, the last `window` attention values of every slot
    /// (`slot * window + step % window`) and how many each slot has.
    history: Vec<Vec<(Vec<f32>, Vec<usize>)>>,
    steps: usize,
    /// Per layer, the used slots of each head when its pending attention was taken.
    lens: Vec<Vec<usize>>,
    /// Decode steps begun (counted at layer 0's query), for refresh schedules.
    ticks: usize,
    /// Entries evicted so far.
    pub evicted: usize,
}

impl DecodeEviction {
    pub(crate) fn new(rule: DecodeRule, cache: &KvCache, mut scores: Vec<Vec<Vec<f32>>>) -> Self {
        let g = cache.geometry();
        for (l, layer) in scores.iter_mut().enumerate() {
            if let Ok(kv) = cache.layer(l) {
                for s in layer.iter_mut() {
                    s.resize(kv.capacity(), 0.0);
                }
            }
        }
        if scores.len() != g.layers {
            scores = (0..g.layers)
                .map(|l| vec![vec![0.0; cache.layer(l).map(LayerKv::capacity).unwrap_or(0)]; g.kv_heads])
                .collect();
        }
        let sinks = match &rule {
            DecodeRule::Ladder(l) => l.sinks(),
            _ => 0,
        };
        let history = match &rule {
            DecodeRule::Indicator { window, .. } => (0..g.layers)
                .map(|l| {
                    let cap = cache.layer(l).map(LayerKv::capacity).unwrap_or(0);
                    vec![(vec![0.0; cap * window], vec![0; cap]); g.kv_heads]
                })
                .collect(),
            _ => Vec::new(),
        };
        DecodeEviction {
            rule,
            scores,
            pending: vec![None; g.layers],
            cursors: vec![sinks; g.layers],
            history,
            steps: 0,
            lens: vec![Vec::new(); g.layers],
            ticks: 0,
            evicted: 0,
        }
    }

    pub fn rule(&self) -> &DecodeRule {
        &self.rule
    }

    fn tracks_attention(&self) -> bool {
        match self.rule {
            DecodeRule::Accumulated { .. } | DecodeRule::LastQuery | DecodeRule::Indicator { .. } => true,
            DecodeRule::Inertia(t) => t.refresh.at(self.ticks),
            _ => false,
        }
    }

    /// Decode steps whose attention was folded into the scores.
    pub fn refreshes(&self) -> usize {
        self.steps
    }

    /// Reads the pending attention back and folds it into the scores.
    pub(crate) async fn absorb(&mut self) -> Result<()> {
        // every layer's attention in one read-back (one device sync per decode step)
        let mut layers = Vec::new();
        let mut tx = Transaction::default();
        for l in 0..self.pending.len() {
            if let Some(t) = self.pending[l].take() {
                layers.push((l, t.dims()));
                tx = tx.register(t);
            }
        }
        if layers.is_empty() {
            return Ok(());
        }
        let data = tx.execute_async().await.map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
        for ((l, [kv_heads, cap]), d) in layers.into_iter().zip(data) {
            let a = d.try_to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
            for h in 0..kv_heads {
                let row = &a[h * cap..(h + 1) * cap];
                let s = &mut self.scores[l][h];
                match self.rule {
                    DecodeRule::Accumulated { .. } => s.iter_mut().zip(row).for_each(|(x, &y)| *x += y),
                    DecodeRule::Indicator { window, gamma } => {
                        let (ring, counts) = &mut self.history[l][h];
                        for (slot, &a) in row.iter().enumerate().take(counts.len()) {
                            ring[slot * window + self.steps % window] = a;
                            counts[slot] += 1;
                            if counts[slot] >= window {
                                let vals = &ring[slot * window..(slot + 1) * window];
                                let mean = vals.iter().map(|&x| f64::from(x)).sum::<f64>() / window as f64;
                                let var = vals.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>()
                                    / (window - 1) as f64;
                                s[slot] = (mean + f64::from(gamma) * var) as f32;
                            }
                        }
                    }
                    DecodeRule::Inertia(t) => {
                        // free slots carry no score
                        let len = s.len().min(row.len());
                        let mut step = row[..len].to_vec();
                        let used = self.lens.get(l).and_then(|x| x.get(h)).copied().unwrap_or(len);
                        step.iter_mut().skip(used).for_each(|x| *x = f32::NAN);
                        t.fold(&mut s[..len], &step);
                    }
                    _ => s.copy_from_slice(row),
                }
            }
        }
        self.steps += 1;
        Ok(())
    }

    /// The slot each head of `layer` writes the token at `position` into.
    fn choose_slots(&mut self, layer: usize, kv: &LayerKv, position: u32) -> Vec<usize> {
        let cap = kv.capacity();
        (0..kv.lens().len())
            .map(|h| {
                let len = kv.lens()[h];
                if len < cap {
                    return len;
                }
                let pos = kv.head_positions(h);
                let victim = match self.rule {
                    DecodeRule::Recent { sinks } => {
                        (0..len).filter(|&s| pos[s] as usize >= sinks).min_by_key(|&s| pos[s]).unwrap_or(len - 1)
                    }
                    DecodeRule::Accumulated { recent } | DecodeRule::Indicator { window: recent, .. } => {
                        let newest = position.saturating_sub(recent as u32);
                        let scores = &self.scores[layer][h];
                        (0..len)
                            .filter(|&s| pos[s] < newest)
                            .min_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(pos[a].cmp(&pos[b])))
                            .unwrap_or_else(|| (0..len).min_by_key(|&s| pos[s]).unwrap_or(0))
                    }
                    DecodeRule::Inertia(_) => Temporal::victim(&self.scores[layer][h][..len], &pos[..len])
                        .unwrap_or_else(|| (0..len).min_by_key(|&s| pos[s]).unwrap_or(0)),
                    _ => {
                        let scores = &self.scores[layer][h];
                        (0..len).min_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(pos[a].cmp(&pos[b]))).unwrap_or(0)
                    }
                };
                self.evicted += 1;
                victim
            })
            .collect()
    }
}

/// The session's cache with decode-time eviction in front of it.
pub(crate) struct EvictingStore<'c> {
    pub cache: &'c mut KvCache,
    pub eviction: &'c mut DecodeEviction,
}

impl EvictingStore<'_> {
    /// LaCache: compacts a full layer along the ladder before the new token comes in.
    fn ladder_compact(&mut self, layer: usize, ladder: Ladder) -> kvslice_cache::Result<()> {
        let layers = self.cache.geometry().layers;
        let kv = self.cache.layer(layer)?;
        let cap = kv.capacity();
        if kv.lens().iter().all(|&l| l < cap) {
            return Ok(());
        }
        let free = (cap / 8).max(1);
        let mut slots = Vec::with_capacity(kv.lens().len());
        for h in 0..kv.lens().len() {
            // Slots in source order: the ladder works on the sequence as cached.
            let pos = kv.head_positions(h);
            let mut order: Vec<u32> = (0..pos.len() as u32).collect();
            order.sort_by_key(|&s| pos[s as usize]);
            let plan =
                ladder.compact(layers, order.len(), order.len().saturating_sub(free), self.eviction.cursors[layer]);
            let keep: Vec<u32> = plan.kept[layer].iter().map(|&i| order[i as usize]).collect();
            if h == 0 {
                self.eviction.cursors[layer] = plan.cursor.min(cap.saturating_sub(free + 1));
            }
            self.eviction.evicted += order.len() - keep.len();
            slots.push(keep);
        }
        // slots are in source order here (the ladder appends, never reuses slots), so the
        // kept lists are ascending: the in-place compaction kernel applies on wgpu
        for list in &mut slots {
            list.sort_unstable();
        }
        self.cache.layer_mut(layer)?.compact(&slots)
    }
}

impl KvStore for EvictingStore<'_> {
    fn append(
        &mut self,
        layer: usize,
        keys: Tensor<3>,
        values: Tensor<3>,
        positions: &[u32],
    ) -> kvslice_cache::Result<()> {
        if positions.len() != 1 {
            return self.cache.append(layer, keys, values, positions);
        }
        if let DecodeRule::Ladder(ladder) = self.eviction.rule {
            self.ladder_compact(layer, ladder)?;
            return self.cache.append(layer, keys, values, positions);
        }
        let kv = self.cache.layer(layer)?;
        let slots = self.eviction.choose_slots(layer, kv, positions[0]);
        let fresh = if matches!(self.eviction.rule, DecodeRule::Inertia(_)) { f32::NAN } else { 0.0 };
        for (h, &s) in slots.iter().enumerate() {
            if let Some(x) = self.eviction.scores.get_mut(layer).and_then(|l| l.get_mut(h)).and_then(|r| r.get_mut(s)) {
                *x = fresh;
            }
            if let Some((_, counts)) = self.eviction.history.get_mut(layer).and_then(|l| l.get_mut(h)) {
                counts[s] = 0;
            }
        }
        self.cache.layer_mut(layer)?.write_slots(&slots, keys, values, positions[0])
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, _raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        if rotated.dims()[1] != 1 {
            return Ok(());
        }
        if layer == 0 {
            self.eviction.ticks += 1;
        }
        if !self.eviction.tracks_attention() {
            return Ok(());
        }
        let kv = self.cache.layer(layer)?;
        if let Some(l) = self.eviction.lens.get_mut(layer) {
            *l = kv.lens().to_vec();
        }
        self.eviction.pending[layer] = Some(slot_attention(
            rotated,
            kv,
            matches!(self.eviction.rule, DecodeRule::LastQuery | DecodeRule::Inertia(_)),
        ));
        Ok(())
    }
}

/// Attention of one query per head over every slot, `[kv_heads, capacity]`: averaged over each
/// GQA group, or over all heads of the layer when `all_heads` (TOVA), zero on free slots.
fn slot_attention(q: &Tensor<3>, kv: &LayerKv, all_heads: bool) -> Tensor<2> {
    let [heads, _, d] = q.dims();
    let (keys, _) = kv.storage();
    let [kv_heads, cap, _] = keys.dims();
    let group = heads / kv_heads;
    let device = q.device();
    let s = q.clone().reshape([kv_heads, group, d]).matmul(keys.clone().swap_dims(1, 2)); // [kv, g, cap]
    let s = s.mul_scalar(1.0 / (d as f64).sqrt());
    let cut: Vec<i32> = kv.lens().iter().map(|&l| l as i32).collect();
    let cut = Tensor::<1, Int>::from_data(TensorData::new(cut, [kv_heads]), &device).reshape([kv_heads, 1, 1]);
    let cols = Tensor::<1, Int>::arange(0..cap as i64, &device).reshape([1, 1, cap]);
    let hidden = cols.expand([kv_heads, group, cap]).greater_equal(cut.expand([kv_heads, group, cap]));
    let a = softmax(s.mask_fill(hidden, f32::NEG_INFINITY), 2);
    let per_kv = a.mean_dim(1).reshape([kv_heads, cap]);
    if all_heads { per_kv.mean_dim(0).expand([kv_heads, cap]) } else { per_kv }
}

/// Builds a compressed cache from a prefilled one and, for decode-time rules, the eviction
/// state: the policy's plan, the gather into smaller storage, the report.
pub async fn compress(
    compression: &Compression,
    stats: &[HostLayerStats],
    full: &KvCache,
    model: &Llama,
    max_new_tokens: usize,
) -> Result<(KvCache, Option<DecodeEviction>, CompressionReport)> {
    let t0 = now();
    let plan = compression.plan(stats, full, model).await?;
    let t1 = now();
    let rule = compression.decode_rule(plan.budget.per_layer);
    let (extra, min_capacity) = compression.room(&rule, plan.budget.per_layer, full.max_len(), max_new_tokens);
    let cache = compress_cache(full, &plan.kept, extra, min_capacity)?;
    cache_sync(&cache)?;
    let t2 = now();
    let eviction = match rule {
        DecodeRule::Grow => None,
        DecodeRule::Recent { .. } | DecodeRule::Ladder(_) => Some(DecodeEviction::new(rule, &cache, Vec::new())),
        _ => Some(DecodeEviction::new(rule, &cache, compression.initial_scores(stats, &plan)?)),
    };
    let g = full.geometry();
    let prompt_tokens = full.max_len();
    let report = CompressionReport {
        kept_entries: plan.kept.iter().flatten().map(Vec::len).sum(),
        kept: plan.kept,
        prompt_tokens,
        full_bytes: 2 * g.layers * g.kv_heads * prompt_tokens * g.head_dim * 4,
        compressed_bytes: cache.storage_bytes(),
        peak_bytes: full.storage_bytes() + cache.storage_bytes(),
        plan_time: Duration::from_secs_f64(t1 - t0),
        compact_time: Duration::from_secs_f64(t2 - t1),
    };
    Ok((cache, eviction, report))
}

/// Waits for the queued work on the cache's device, so that the phases are timed apart. Not in
/// the browser: it cannot block on the GPU (a blocking sync never returns there), and its
/// `now()` reports zero durations anyway.
fn cache_sync(cache: &KvCache) -> Result<()> {
    #[cfg(not(target_family = "wasm"))]
    if let Ok(l) = cache.layer(0) {
        l.storage().0.device().sync().map_err(|e| RuntimeError::Device(format!("{e:?}")))?;
    }
    #[cfg(target_family = "wasm")]
    let _ = cache;
    Ok(())
}

use crate::session::now;
