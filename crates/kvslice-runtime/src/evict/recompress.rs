//! Decode-time recompression ([`DecodeRule::Recompress`], kvpress's `DecodingPress`): any
//! scored policy keeps the cache at its budget while decoding by re-scoring the whole cache and
//! compacting it back every `every` decode steps; in between the cache grows by the generated
//! tokens.
//!
//! The policy scores the cache as it would a prompt whose observation window is the last `w`
//! decoded tokens: their queries are kept per layer as they are computed (`[H, 1, d]` each, on
//! the device), the window statistics come from the same code as the prefill's (the
//! window-statistics kernel on wgpu), and each head keeps the number of entries the prefill's
//! plan gave it. The `w` newest entries are always kept, so that the recorded queries stay
//! the queries of the cache's last `w` slots, which is what makes slot order causal order for
//! the statistics.
//!
//! Policies whose scores need what decode queries cannot give are refused when the compression
//! is built ([`refusal`]): attention accumulated over all queries (H2O), counter-causal sums,
//! pre-RoPE query moments over the prompt, TwinKV's twins. Per-head budgets (Ada-KV) are
//! refused when the prefill's plan gives the heads of a layer different counts.

use std::collections::VecDeque;

use burn::tensor::Tensor;
use kvslice_cache::{KvCache, KvStore};
use kvslice_model::Llama;
use kvslice_policy::{KvView, LayerInput, Policy, Protect, select_top_k};

use super::compress::value_proj_l1;
use super::observe::{StatsRequest, decode_window_stats};
use crate::error::{Result, RuntimeError};
use crate::host::read_f32;

/// Why `policy` cannot recompress from decode queries, if it cannot.
pub(crate) fn refusal(policy: &Policy) -> Option<&'static str> {
    let needs = policy.needs();
    if needs.accumulated {
        Some("attention accumulated over every query of the prompt")
    } else if needs.counter_causal {
        Some("counter-causal attention over the whole sequence")
    } else if needs.non_causal.is_some() {
        Some("non-causal attention over the prompt's chunks")
    } else if needs.reconstruction {
        Some("the context's reconstruction")
    } else if needs.query_moments {
        Some("the moments of the prompt's queries")
    } else if needs.twins || matches!(policy, Policy::Scored { repair: Some(_), .. }) {
        Some("twin repair over prompt positions")
    } else {
        None
    }
}

/// The state of decode-time recompression over one session's cache.
#[derive(Debug)]
pub(crate) struct Recompressor {
    policy: Policy,
    every: usize,
    /// Decode queries kept per layer: the policy's observation window (at least 1).
    window: usize,
    /// `[layer][kv_head]` entries each head keeps at a compression.
    targets: Vec<Vec<usize>>,
    /// Per layer, the newest decode queries, oldest first, `[H, 1, d]` each.
    queries: Vec<VecDeque<Tensor<3>>>,
    /// Decode steps since the last compression (or the prefill's).
    since: usize,
    /// Compressions run.
    pub compressions: usize,
}

impl Recompressor {
    /// Recompression by `policy` every `every` steps over `cache` as the prefill's plan left it:
    /// each head keeps as many entries as it holds now plus `growth` (what the asked budget
    /// exceeds a shorter prompt by). `tail_queries[l]` (`[H, t, d]`), the last queries of the
    /// `prompt` tokens at layer `l`, open the observation window where the cache still holds the
    /// entries they belong to (the last `t` slots of every head hold positions `prompt−t..prompt`),
    /// so that the first compression already sees a whole window.
    pub fn new(
        policy: Policy,
        every: usize,
        cache: &KvCache,
        growth: usize,
        tail_queries: Vec<Option<Tensor<3>>>,
        prompt: usize,
    ) -> Result<Self> {
        if let Some(why) = refusal(&policy) {
            return Err(RuntimeError::Options(format!("decode-time recompression (`every`) cannot compute {why}")));
        }
        let mut targets = Vec::with_capacity(cache.layers().len());
        for (l, layer) in cache.layers().iter().enumerate() {
            let lens = layer.lens().to_vec();
            if lens.windows(2).any(|w| w[0] != w[1]) {
                return Err(RuntimeError::Options(format!(
                    "decode-time recompression (`every`) needs the same budget in every head of a layer; the plan \
                     gives layer {l}'s heads {lens:?} (a per-head allocation)"
                )));
            }
            targets.push(lens.iter().map(|&n| n + growth).collect());
        }
        let window = policy.needs().window.max(1);
        let mut queries = vec![VecDeque::with_capacity(window); targets.len()];
        for (l, tail) in tail_queries.into_iter().enumerate().take(targets.len()) {
            let Some(tail) = tail else { continue };
            let [_, t, _] = tail.dims();
            let t = t.min(window);
            let layer = cache.layer(l)?;
            let n = prompt as u32;
            let holds_tail = (0..layer.lens().len()).all(|h| {
                let held = layer.head_positions(h);
                held.len() >= t && held[held.len() - t..].iter().copied().eq(n - t as u32..n)
            });
            if holds_tail {
                let first = tail.dims()[1] - t;
                queries[l].extend((first..first + t).map(|i| tail.clone().narrow(1, i, 1)));
            }
        }
        Ok(Recompressor { policy, every: every.max(1), window, queries, targets, since: 0, compressions: 0 })
    }

    /// Keeps the query of the token being decoded at `layer` (`[H, 1, d]`, after RoPE).
    pub fn record(&mut self, layer: usize, rotated: &Tensor<3>) {
        if let Some(q) = self.queries.get_mut(layer) {
            if q.len() == self.window {
                q.pop_front();
            }
            q.push_back(rotated.clone());
        }
    }

    /// One decode step completed.
    pub fn stepped(&mut self) {
        self.since += 1;
    }

    /// Whether the next decode step must first compress the cache back to the budget.
    pub fn due(&self) -> bool {
        self.since >= self.every
    }

    /// Re-scores every layer and compacts it to its budget in place; returns the entries
    /// evicted. A layer is changed only by its own successful compaction: after an error, the
    /// layers already compressed stay so and the next step tries again.
    pub async fn compress(&mut self, model: &Llama, cache: &mut KvCache) -> Result<usize> {
        let mut evicted = 0;
        for l in 0..self.targets.len() {
            evicted += self.compress_layer(model, cache, l).await?;
        }
        self.since = 0;
        self.compressions += 1;
        Ok(evicted)
    }

    async fn compress_layer(&self, model: &Llama, cache: &mut KvCache, l: usize) -> Result<usize> {
        let layer = cache.layer(l)?;
        let n = layer.max_len();
        let targets = &self.targets[l];
        let most = targets.iter().copied().max().unwrap_or(0);
        let least = targets.iter().copied().min().unwrap_or(0);
        if n <= most {
            return Ok(0);
        }
        let kept: Vec<Vec<u32>> = if least == 0 {
            // a layer the plan emptied keeps nothing: nothing to score
            targets.iter().map(|_| Vec::new()).collect()
        } else {
            let protect = self.policy.protect(most);
            let sinks = protect.sinks.min(least - 1);
            let recorded = &self.queries[l];
            let w = self.window.min(recorded.len()).min(least - sinks);
            if w == 0 {
                return Err(RuntimeError::Options(format!("layer {l}: no decode query recorded to recompress with")));
            }
            let qw = Tensor::cat(recorded.iter().skip(recorded.len() - w).cloned().collect(), 1);
            let needs = self.policy.needs();
            let value_tables = needs.value_weighted || needs.projection || needs.jacobian || needs.leverage;
            let request = StatsRequest {
                windows: if needs.window > 0 || value_tables { vec![w] } else { Vec::new() },
                value_weighted: needs.value_weighted,
                projection: needs.projection,
                jacobian: needs.jacobian || needs.leverage,
                leverage: needs.leverage,
                position_weighted: needs.position_weighted,
                ..StatsRequest::default()
            };
            let stats = decode_window_stats(qw, layer, &request).await?;
            let window = stats.window(0).ok_or_else(|| RuntimeError::Options(format!("layer {l}: no statistics")))?;
            let (k, v) = layer.view();
            let keys = if needs.keys { Some(read_f32(k).await?) } else { None };
            let values = if needs.values { Some(read_f32(v.clone()).await?) } else { None };
            let proj_l1 = if needs.value_proj_l1 { Some(read_f32(value_proj_l1(model, l, v)).await?) } else { None };
            let g = cache.geometry();
            let input = LayerInput {
                stats: window,
                kv: (needs.keys || needs.values).then_some(KvView {
                    kv_heads: g.kv_heads,
                    len: n,
                    head_dim: g.head_dim,
                    keys: keys.as_deref(),
                    values: values.as_deref(),
                }),
                query_moments: None,
                value_proj_l1: proj_l1.as_deref(),
                layer: l,
            };
            let mut scores = self
                .policy
                .score_layer(&input, most)
                .map_err(|e| RuntimeError::Options(format!("layer {l}: {e}")))?
                .ok_or_else(|| RuntimeError::Options("decode-time recompression needs a scored policy".into()))?;
            if let Some(layout) = layer.latent_layout() {
                let groups: Vec<Vec<usize>> = layout.groups().iter().map(|g| g.heads().to_vec()).collect();
                scores.pool_groups(&groups);
            }
            let mut kept: Vec<Vec<u32>> = targets
                .iter()
                .enumerate()
                .map(|(h, &k)| {
                    let recent = protect.recent.max(w).min(k - sinks);
                    select_top_k(scores.row(h), k, Protect { sinks, recent })
                        .map_err(|e| RuntimeError::Options(format!("layer {l}, head {h}: {e}")))
                })
                .collect::<Result<_>>()?;
            if let Some(layout) = layer.latent_layout() {
                super::latent::align_kept(&mut kept, layout, |h, s| {
                    scores.row(h).get(s as usize).copied().unwrap_or(0.0)
                });
            }
            kept
        };
        let evicted = kept.iter().map(|k| n - k.len()).sum();
        cache.layer_mut(l)?.compact(&kept)?;
        Ok(evicted)
    }
}

#[cfg(test)]
mod tests {
    //! The refusals, from the policies' declared needs.
    use kvslice_policy::ModelInfo;

    use super::*;

    fn policy(name: &str) -> Policy {
        kvslice_policy::build(name, &ModelInfo { head_dim: 64, rope_theta: 10000.0 }).unwrap()
    }

    #[test]
    fn window_scorers_recompress_and_whole_sequence_scorers_are_refused() {
        for ok in ["snapkv", "tova", "knorm", "pyramidkv", "cake", "jacap"] {
            assert_eq!(refusal(&policy(ok)), None, "{ok}");
        }
        assert!(refusal(&policy("h2o")).unwrap().contains("accumulated"));
        assert!(refusal(&policy("twinkv")).is_some());
    }
}
