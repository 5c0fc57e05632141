//! Calibration of low-rank keys ([`kvslice_model::lowrank`]): every layer's pre-RoPE keys over
//! calibration texts, gathered as moments.
//!
//! Each text is prefilled into a cache of its own length; its keys, stored after RoPE, are
//! rotated back by their positions ([`Llama::shift_keys`] by `−position`: rotations of a pair
//! compose by adding angles) and added to the layer's [`KeyMoments`] as rows of every KV head
//! side by side, and the queries the cache was offered (before RoPE) to its query energy.

use burn::tensor::Tensor;
use kvslice_cache::{CacheGeometry, KvCache, KvStore, LayerKv};
use kvslice_model::Llama;
use kvslice_model::lowrank::KeyMoments;

use crate::error::{Result, RuntimeError};
use crate::host::read_f32;

/// Adds the pre-RoPE keys of `ids` (one text, positions from 0) to `moments` (one per layer).
pub async fn add_key_moments(model: &Llama, ids: &[u32], moments: &mut [KeyMoments]) -> Result<()> {
    let c = &model.config;
    let (kv_heads, d, n) = (c.num_kv_heads, c.head_dim, ids.len());
    if moments.len() != c.num_layers || moments.iter().any(|m| m.kv_heads != kv_heads || m.head_dim != d) {
        return Err(RuntimeError::Options(format!(
            "moments for {} layers do not fit the model's {} layers of {kv_heads} KV heads × {d}",
            moments.len(),
            c.num_layers
        )));
    }
    if n == 0 {
        return Err(RuntimeError::Options("an empty calibration text".into()));
    }
    let geometry = CacheGeometry { layers: c.num_layers, kv_heads, head_dim: d, capacity: n };
    let mut tap = Tap { cache: KvCache::new(geometry, model.device())?, queries: vec![Vec::new(); c.num_layers] };
    let positions: Vec<u32> = (0..n as u32).collect();
    model.forward(ids, &positions, &mut tap)?;
    let Tap { cache, queries } = tap;
    let back: Vec<i64> = (0..kv_heads).flat_map(|_| positions.iter().map(|&p| -i64::from(p))).collect();
    for (l, m) in moments.iter_mut().enumerate() {
        let (keys, _) = cache.layer(l)?.view();
        let keys = read_f32(model.shift_keys(keys, &back)?).await?;
        // [kv_heads, n, d] → rows [n, kv_heads · d]
        let mut rows = vec![0.0f32; n * kv_heads * d];
        for h in 0..kv_heads {
            for t in 0..n {
                rows[(t * kv_heads + h) * d..(t * kv_heads + h + 1) * d]
                    .copy_from_slice(&keys[(h * n + t) * d..(h * n + t + 1) * d]);
            }
        }
        m.add(&rows)?;
        for q in &queries[l] {
            m.add_queries(&read_f32(q.clone()).await?, c.num_heads)?;
        }
    }
    Ok(())
}

/// A cache that keeps the raw queries it is offered, per layer (one `[heads, n, d]` tensor per
/// pass).
struct Tap {
    cache: KvCache,
    queries: Vec<Vec<Tensor<3>>>,
}

impl KvStore for Tap {
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

    fn observe_queries(&mut self, layer: usize, _rotated: &Tensor<3>, raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        if let Some(q) = self.queries.get_mut(layer) {
            q.push(raw.clone());
        }
        Ok(())
    }

    fn takes_chunks(&self) -> bool {
        self.cache.takes_chunks()
    }
}
