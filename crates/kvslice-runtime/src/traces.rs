//! Traces for DistillCache's training ([`kvslice_policy::learn`]): what a cache holds after a
//! context, and the attention each of its entries receives while the text goes on.
//!
//! For a text of `T` tokens and a context of `c < T`, the text is prefilled twice with the
//! accumulated attention recorded (H2O's statistic, `acc_T[h, j] = Σ_{q<T} a_qj`): once whole,
//! once only its first `c` tokens. Causality makes the first `c` queries' weights the same in
//! both, so `acc_T − acc_c` is the attention the later queries `q ∈ [c, T)` put on entry
//! `j < c`, which is what the entry is worth to the rest of the text (teacher-forced decoding
//! with the full cache). A KV head's utility sums it over the query heads of its group. The
//! features are those [`kvslice_policy::scorer::distill::head_features`] computes at run time,
//! from the context's own cache.

use kvslice_cache::KvStore;
use kvslice_model::Llama;
use kvslice_policy::KvView;
use kvslice_policy::learn::TraceList;
use kvslice_policy::scorer::distill::head_features;

use crate::error::{Result, RuntimeError};
use crate::evict::StatsRequest;
use crate::host::read_f32;
use crate::session::Session;

/// `[layer][kv_head]` trace lists of `ids` with a context of `context` tokens (see the module
/// docs).
pub async fn record(model: &Llama, ids: &[u32], context: usize) -> Result<Vec<Vec<TraceList>>> {
    if context == 0 || context >= ids.len() {
        return Err(RuntimeError::Options(format!(
            "a trace needs a context of 1 to {} tokens for a text of {}, got {context}",
            ids.len().saturating_sub(1),
            ids.len()
        )));
    }
    let request = StatsRequest { windows: vec![1], accumulated: true, ..StatsRequest::default() };
    let whole = Session::prefill_for(model, ids, &request).await?;
    let head = Session::prefill_for(model, &ids[..context], &request).await?;
    let c = &model.config;
    let (heads, kv_heads, d, t) = (c.num_heads, c.num_kv_heads, c.head_dim, ids.len());
    let group = heads / kv_heads;
    let mut out = Vec::with_capacity(c.num_layers);
    for l in 0..c.num_layers {
        let accumulated = |s: &crate::session::Prefilled| {
            s.stats[l]
                .window(0)
                .and_then(|w| w.accumulated.clone())
                .ok_or_else(|| RuntimeError::Options(format!("layer {l}: the accumulated attention was not recorded")))
        };
        let (all, before) = (accumulated(&whole)?, accumulated(&head)?);
        let (k, v) = head.cache.layer(l)?.view();
        let (keys, values) = (read_f32(k).await?, read_f32(v).await?);
        let kv = KvView { kv_heads, len: context, head_dim: d, keys: Some(&keys), values: Some(&values) };
        let lists = (0..kv_heads)
            .map(|h| {
                let utility = (0..context)
                    .map(|j| {
                        (h * group..(h + 1) * group)
                            .map(|qh| (all[qh * t + j] - before[qh * context + j]).max(0.0))
                            .sum::<f32>()
                    })
                    .collect();
                TraceList { features: head_features(&kv, &keys, &values, h), utility }
            })
            .collect();
        out.push(lists);
    }
    Ok(out)
}
