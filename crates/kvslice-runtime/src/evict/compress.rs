//! Compression after the prefill: the policy's plan, the gather of the kept entries into
//! smaller storage, and what it did.

use std::time::Duration;

use burn::tensor::Tensor;
use kvslice_cache::{KvCache, KvDtype, KvStore, LayerKv};
use kvslice_model::Llama;
use kvslice_policy::{BudgetSpec, KvView, LayerInput, ModelInfo, Plan, Policy, PolicySpec, WindowStats};

use super::decode::DecodeEviction;
use super::observe::{HostLayerStats, StatsRequest};
use crate::error::{Result, RuntimeError};
use crate::host::{now, read_f32};
use kvslice_policy::DecodeRule;

/// A policy with a budget, ready to compress a prefilled prompt.
#[derive(Debug)]
pub struct Compression {
    name: String,
    budget_text: String,
    policy: Policy,
    pub(crate) spec: BudgetSpec,
    cascade: bool,
    model: ModelInfo,
    /// How the compressed cache stores its entries.
    kv_dtype: KvDtype,
    /// KVzip's reconstruction prompt, for policies that score by reconstructing the context.
    reconstruction: Option<super::ReconstructionPrompt>,
}

impl Compression {
    /// The registered policy `name` with budget `budget` (`128L`, `10%`, `2048`).
    pub fn new(name: &str, budget: &str, model: &ModelInfo) -> Result<Self> {
        let spec: PolicySpec =
            name.parse().map_err(|e: kvslice_policy::PolicyError| RuntimeError::Options(e.to_string()))?;
        let name = spec.to_string();
        let policy = kvslice_policy::build(&name, model).map_err(|e| RuntimeError::Options(e.to_string()))?;
        let spec: BudgetSpec =
            budget.parse().map_err(|e: kvslice_policy::PolicyError| RuntimeError::Options(e.to_string()))?;
        if let (DecodeRule::Recompress { .. }, Some(why)) = (policy.decode_rule(1), super::recompress::refusal(&policy))
        {
            return Err(RuntimeError::Options(format!(
                "{name}: decode-time recompression (`every`) cannot compute {why} from decode queries; leave \
                 `every` at 0 for the policy's own decode rule"
            )));
        }
        Ok(Compression {
            name,
            budget_text: budget.to_string(),
            policy,
            spec,
            cascade: true,
            model: *model,
            kv_dtype: KvDtype::F32,
            reconstruction: None,
        })
    }

    /// The tokenized prompt that asks the model to repeat its context, for the policies that
    /// score by reconstruction (`kvzip`; [`crate::LoadedModel::reconstruction_prompt`]).
    pub fn with_reconstruction(mut self, prompt: super::ReconstructionPrompt) -> Self {
        self.reconstruction = Some(prompt);
        self
    }

    pub fn reconstruction(&self) -> Option<&super::ReconstructionPrompt> {
        self.reconstruction.as_ref()
    }

    /// The same compression done in one shot after the whole prefill, even for CAKE (whose
    /// cascade is the default): the reference its cascade is measured against.
    pub fn one_shot(mut self) -> Self {
        self.cascade = false;
        self
    }

    /// The compressed cache stores its entries as `dtype` (KIVI's layout for q8 and q4): the
    /// prefill and the policy work at full precision, the kept entries are converted, the
    /// decode reads them dequantized.
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// What the policy needs of a model.
    pub fn model_info(model: &Llama) -> ModelInfo {
        ModelInfo { head_dim: model.config.head_dim, rope_theta: model.config.rope_theta }
    }

    /// `policy@budget` (`policy+q4@budget` with a KV dtype other than f32), the key of
    /// evaluation reports.
    pub fn label(&self) -> String {
        match self.kv_dtype {
            KvDtype::F32 => format!("{}@{}", self.name, self.budget_text),
            d => format!("{}+{d}@{}", self.name, self.budget_text),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether the prefill compresses layer by layer (CAKE's cascade; native targets only).
    pub fn cascades(&self) -> bool {
        cfg!(not(target_family = "wasm")) && self.cascade && self.policy.cascade().is_some()
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
        if let DecodeRule::Recompress { .. } = self.policy.decode_rule(1) {
            // the prompt's last queries open recompression's first observation window
            request.tail_queries = request.tail_queries.max(needs.window.max(1));
        }
    }

    /// Extra slots per head and the least capacity of a compressed layer: room for the new
    /// tokens when the cache grows; the budget as asked (not clipped to a shorter prompt) when
    /// the cache keeps a fixed size; for CAKE, each layer's own budget plus what the asked
    /// budget exceeds the prompt by.
    pub fn room(&self, rule: &DecodeRule, per_layer: usize, prompt: usize, max_new_tokens: usize) -> (usize, usize) {
        let new = max_new_tokens.saturating_sub(1);
        let asked = self.asked(per_layer);
        match rule {
            // a long generation grows the cache as it goes (`Generator::next`)
            DecodeRule::Grow => (new.min(crate::session::GROW_STEP), 0),
            DecodeRule::Indicator { .. } => (asked.saturating_sub(per_layer).min(new), 0),
            // grows to the asked budget, then by up to `every` tokens between two compressions
            DecodeRule::Recompress { every } => ((asked.saturating_sub(per_layer) + every).min(new), 0),
            _ => (0, asked.min(prompt + new).max(1)),
        }
    }

    /// The budget asked per layer, which may exceed the `per_layer` a shorter prompt resolved
    /// it to.
    fn asked(&self, per_layer: usize) -> usize {
        match self.spec {
            BudgetSpec::Flat(b) | BudgetSpec::AveragePerLayer(b) => b.max(per_layer),
            BudgetSpec::Fraction { .. } => per_layer,
        }
    }

    /// The decode-time rule the policy declares, at a budget of `per_layer` tokens.
    pub fn decode_rule(&self, per_layer: usize) -> DecodeRule {
        self.policy.decode_rule(per_layer)
    }

    /// The decode-time eviction over `cache` just compressed at `per_layer` tokens per layer:
    /// `None` for a cache that grows; rules that rank by scores start from `scores`;
    /// recompression's first observation window starts from the last queries of the `prompt`
    /// tokens, `tail_queries` (`[layer]`, `[H, t, d]` each, where recorded).
    pub(crate) fn decode_state(
        &self,
        per_layer: usize,
        cache: &KvCache,
        scores: Vec<Vec<Vec<f32>>>,
        tail_queries: Vec<Option<Tensor<3>>>,
        prompt: usize,
    ) -> Result<Option<DecodeEviction>> {
        let rule = self.decode_rule(per_layer);
        if let DecodeRule::Recompress { every } = rule {
            // the runtime's own copy of the policy, built from the same canonical options
            let policy =
                kvslice_policy::build(&self.name, &self.model).map_err(|e| RuntimeError::Options(e.to_string()))?;
            let sinks = policy.protect(per_layer).sinks;
            let growth = self.asked(per_layer) - per_layer;
            let recompressor = super::recompress::Recompressor::new(policy, every, cache, growth, tail_queries, prompt)
                .map_err(|e| RuntimeError::Options(format!("{}: {e}", self.label())))?;
            return Ok(Some(DecodeEviction::recompressing(rule, recompressor, cache, sinks)));
        }
        Ok(DecodeEviction::new(rule, cache, scores))
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
                    layer: l,
                }
            })
            .collect();
        // latent keys: the heads of a group share slots, so they rank them together
        let groups: Option<Vec<Vec<Vec<usize>>>> = model
            .latent_layouts()
            .map(|ls| ls.iter().map(|l| l.groups().iter().map(|g| g.heads().to_vec()).collect()).collect());
        self.policy
            .plan_grouped(&inputs, &self.spec, groups.as_deref())
            .map_err(|e| RuntimeError::Options(format!("{}: {e}", self.label())))
    }

    /// With latent keys ([`Llama::latent_layouts`]), makes the heads of every latent group keep
    /// one set ([`super::latent::align_kept`]), ranked by the policy's scores where it has them.
    fn align_to_groups(&self, plan: &mut Plan, stats: &[HostLayerStats], layouts: &[kvslice_cache::LatentLayout]) {
        let needs = self.policy.needs();
        for (l, (kept, layout)) in plan.kept.iter_mut().zip(layouts).enumerate() {
            let aligned = layout.groups().iter().all(|g| g.heads().iter().all(|&h| kept[h] == kept[g.heads()[0]]));
            if aligned {
                continue;
            }
            let scores = stats[l]
                .window(needs.window)
                .and_then(|w| self.policy.score_layer(&LayerInput::new(w).at(l), plan.budget.per_layer).ok())
                .flatten();
            super::latent::align_kept(kept, layout, |h, x| {
                scores.as_ref().and_then(|s| s.row(h).get(x as usize).copied()).unwrap_or(0.0)
            });
            plan.budgets[l] = kept.iter().map(Vec::len).collect();
        }
    }

    /// Initial per-slot decode scores of the kept entries (`[layer][kv_head][slot]`), for the
    /// decode rules that rank by scores.
    pub(crate) fn initial_scores(&self, stats: &[HostLayerStats], plan: &Plan) -> Result<Vec<Vec<Vec<f32>>>> {
        let needs = self.policy.needs();
        let mut out = Vec::with_capacity(plan.kept.len());
        for (l, kept) in plan.kept.iter().enumerate() {
            let w = stats[l].window(needs.window).ok_or_else(|| RuntimeError::Options("missing statistics".into()))?;
            let input = LayerInput::new(w).at(l);
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
    let w = attn.o_proj.weight().expect("the weight was checked at load"); // [heads·d, hidden]
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
    /// For policies that renumber what they keep (Finch): the position of the next token, the
    /// kept entries having moved to the positions just before it.
    pub renumbered: Option<u32>,
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

/// Builds a compressed cache from a prefilled one and, for decode-time rules, the eviction
/// state: the policy's plan, the gather into smaller storage, the report.
pub async fn compress(
    compression: &Compression,
    stats: &[HostLayerStats],
    full: &KvCache,
    model: &Llama,
    max_new_tokens: usize,
) -> Result<(KvCache, Option<DecodeEviction>, CompressionReport)> {
    if full.max_len() < compression.policy().needs().window {
        return keep_whole(full, max_new_tokens, compression.kv_dtype, model);
    }
    let t0 = now();
    let mut plan = compression.plan(stats, full, model).await?;
    if let Some(layouts) = model.latent_layouts() {
        compression.align_to_groups(&mut plan, stats, layouts);
    }
    let t1 = now();
    let rule = compression.decode_rule(plan.budget.per_layer);
    let (extra, min_capacity) = compression.room(&rule, plan.budget.per_layer, full.max_len(), max_new_tokens);
    let mut cache = compress_cache(full, &plan.kept, extra, min_capacity)?;
    let renumbered = if compression.policy().rerotates_keys() { Some(renumber(&mut cache, model)?) } else { None };
    cache.convert(compression.kv_dtype)?;
    if let Some(layouts) = model.latent_layouts() {
        cache.with_latent_keys(layouts)?;
    }
    cache_sync(&cache)?;
    let t2 = now();
    let scores =
        if super::decode::starts_from_scores(&rule) { compression.initial_scores(stats, &plan)? } else { Vec::new() };
    let tails = stats.iter().map(|s| s.tail_queries.clone()).collect();
    let eviction = compression.decode_state(plan.budget.per_layer, &cache, scores, tails, full.max_len())?;
    let g = full.geometry();
    let prompt_tokens = full.max_len();
    let report = CompressionReport {
        kept_entries: plan.kept.iter().flatten().map(Vec::len).sum(),
        kept: plan.kept,
        prompt_tokens,
        full_bytes: g.layers * g.kv_heads * prompt_tokens * full.entry_bytes(),
        compressed_bytes: cache.storage_bytes(),
        peak_bytes: full.storage_bytes() + cache.storage_bytes(),
        plan_time: Duration::from_secs_f64(t1 - t0),
        compact_time: Duration::from_secs_f64(t2 - t1),
        renumbered,
    };
    Ok((cache, eviction, report))
}

/// Renumbers a compressed cache as if its entries were a prompt of their own (kvpress's
/// `KeyRerotationPress`, Finch's `rerotate_keys`): with `N` the most entries any head keeps, the
/// `s`-th of a head's `len` entries (in source order) moves to position `N − len + s`, its key
/// rotated by the difference, so that every head's entries end just before position `N`, the
/// next token's. Heads that keep the same number (a uniform budget) read positions `0..N`, as
/// kvpress's. Returns `N`. The cache must store f32 (before [`KvCache::convert`]).
pub fn renumber(cache: &mut KvCache, model: &Llama) -> Result<u32> {
    let next = cache.max_len();
    for l in 0..cache.geometry().layers {
        let layer = cache.layer_mut(l)?;
        let (capacity, lens) = (layer.capacity(), layer.lens().to_vec());
        let mut shift = vec![0i64; lens.len() * capacity];
        let mut positions = Vec::with_capacity(lens.len());
        for (h, &len) in lens.iter().enumerate() {
            let new: Vec<u32> = (0..len).map(|s| (next - len + s) as u32).collect();
            for (s, (&old, &p)) in layer.head_positions(h).iter().zip(&new).enumerate() {
                shift[h * capacity + s] = p as i64 - old as i64;
            }
            positions.push(new);
        }
        let (keys, _) =
            layer.storage_mut().ok_or_else(|| RuntimeError::Options("renumbering needs the cache in f32".into()))?;
        *keys = model.shift_keys(keys.clone(), &shift)?;
        layer.set_metadata(lens, positions)?;
    }
    Ok(next as u32)
}

/// A prompt shorter than the policy's observation window is all window, which the policy always
/// keeps: the whole cache, copied with room for the new tokens, growing while decoding.
fn keep_whole(
    full: &KvCache,
    max_new_tokens: usize,
    dtype: KvDtype,
    model: &Llama,
) -> Result<(KvCache, Option<DecodeEviction>, CompressionReport)> {
    let g = full.geometry();
    let n = full.max_len();
    let kept: Vec<Vec<Vec<u32>>> = (0..g.layers).map(|_| vec![(0..n as u32).collect(); g.kv_heads]).collect();
    let t0 = now();
    let mut cache = compress_cache(full, &kept, max_new_tokens, 0)?;
    cache.convert(dtype)?;
    if let Some(layouts) = model.latent_layouts() {
        cache.with_latent_keys(layouts)?;
    }
    let report = CompressionReport {
        kept_entries: g.layers * g.kv_heads * n,
        kept,
        prompt_tokens: n,
        full_bytes: g.layers * g.kv_heads * n * full.entry_bytes(),
        compressed_bytes: cache.storage_bytes(),
        peak_bytes: full.storage_bytes() + cache.storage_bytes(),
        plan_time: Duration::ZERO,
        compact_time: Duration::from_secs_f64(now() - t0),
        renumbered: None,
    };
    Ok((cache, None, report))
}

/// Waits for the queued work on the cache's device, so that the phases are timed apart. Not in
/// the browser: it cannot block on the GPU (a blocking sync never returns there), and its
/// `now()` reports zero durations anyway.
fn cache_sync(cache: &KvCache) -> Result<()> {
    #[cfg(not(target_family = "wasm"))]
    if let Ok(l) = cache.layer(0) {
        l.device().sync().map_err(|e| RuntimeError::Device(format!("{e:?}")))?;
    }
    #[cfg(target_family = "wasm")]
    let _ = cache;
    Ok(())
}
