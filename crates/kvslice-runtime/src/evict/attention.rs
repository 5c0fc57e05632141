//! Decode-time attention weights for the eviction rules that rank cached entries by the
//! attention the newest query gives them (H2O, TOVA, CAKE's decode phase, InertiaKV).
//!
//! On wgpu the weights come from the weights pass of the ragged decode-attention kernel
//! (`kvslice_kernels::decode_attention`, one softmax per head over that head's own slots, never
//! a `[heads, capacity]` score tensor built from Burn ops); elsewhere, and if the kernel
//! refuses its arguments, from Burn ops (`softmax(QKᵀ/√d)` masked to each head's length). The
//! two agree within f32 rounding (tested on lavapipe).

use std::sync::Once;

use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor, TensorData};
use kvslice_cache::LayerKv;

/// Attention of one query per head over every slot, `[kv_heads, capacity]`: averaged over each
/// GQA group, or over all heads of the layer when `all_heads` (TOVA), zero on free slots.
pub(crate) fn slot_attention(q: &Tensor<3>, kv: &LayerKv, all_heads: bool) -> Tensor<2> {
    if kvslice_kernels::buffer_id(q).is_some() {
        match kernel_slot_attention(q, kv, all_heads) {
            Ok(a) => return a,
            Err(e) => {
                static FALLBACK: Once = Once::new();
                FALLBACK.call_once(|| eprintln!("kvslice: decode attention-weights kernel: {e}; using Burn ops"));
            }
        }
    }
    burn_slot_attention(q, kv, all_heads)
}

/// [`slot_attention`] through the decode kernel's weights pass (wgpu tensors only).
pub(crate) fn kernel_slot_attention(
    q: &Tensor<3>,
    kv: &LayerKv,
    all_heads: bool,
) -> kvslice_kernels::Result<Tensor<2>> {
    let [heads, _, d] = q.dims();
    let (keys, values) = kv.storage().ok_or_else(|| kvslice_kernels::KernelError::DType {
        tensor: "cache",
        expected: "f32 storage",
        got: kv.dtype().to_string(),
    })?;
    let [kv_heads, cap, _] = keys.dims();
    let lens: Vec<u32> = kv.lens().iter().map(|&l| l as u32).collect();
    let mut weights = Tensor::<2>::zeros([kv_heads, cap], &q.device());
    let q1 = q.clone().reshape([heads, d]);
    kvslice_kernels::decode_attention(&q1, keys, values, &lens, Some(&mut weights))?;
    Ok(if all_heads { weights.mean_dim(0).expand([kv_heads, cap]) } else { weights })
}

/// [`slot_attention`] from Burn ops, on any backend.
pub(crate) fn burn_slot_attention(q: &Tensor<3>, kv: &LayerKv, all_heads: bool) -> Tensor<2> {
    let [heads, _, d] = q.dims();
    let (keys, _) = kv.dense();
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

#[cfg(test)]
mod tests {
    //! The kernel route against the Burn-op route on the same wgpu tensors, and against the
    //! Burn-op route on the CPU backend (lavapipe in CI; no skipping without an adapter).

    use burn::tensor::{Device, Tensor, TensorData};
    use kvslice_cache::{CacheGeometry, KvCache, KvStore};

    use super::*;

    fn values(len: usize, seed: u32, amplitude: f32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(40_503)) >> 8;
                ((x % 2001) as f32 / 1000.0 - 1.0) * amplitude
            })
            .collect()
    }

    /// A layer with ragged per-head lengths (uniform prefill, then per-head slot writes), and
    /// the query, on `device`.
    fn layer(device: &Device, kv_heads: usize, heads: usize, d: usize, cap: usize) -> (KvCache, Tensor<3>) {
        let geometry = CacheGeometry { layers: 1, kv_heads, head_dim: d, capacity: cap };
        let mut cache = KvCache::new(geometry, device).unwrap();
        let n = cap - 7;
        let k = Tensor::<1>::from_data(TensorData::new(values(kv_heads * n * d, 1, 2.0), [kv_heads * n * d]), device);
        let v = Tensor::<1>::from_data(TensorData::new(values(kv_heads * n * d, 2, 1.0), [kv_heads * n * d]), device);
        let positions: Vec<u32> = (0..n as u32).collect();
        cache.append(0, k.reshape([kv_heads, n, d]), v.reshape([kv_heads, n, d]), &positions).unwrap();
        // ragged: head h gains h extra tokens
        for extra in 0..kv_heads.saturating_sub(1) {
            let slots: Vec<usize> = (0..kv_heads).map(|h| if h > extra { n + extra } else { extra }).collect();
            let row = |seed| {
                Tensor::<1>::from_data(TensorData::new(values(kv_heads * d, seed, 1.5), [kv_heads * d]), device)
                    .reshape([kv_heads, 1, d])
            };
            let layer = cache.layer_mut(0).unwrap();
            let position = (n + extra) as u32;
            // heads at or below `extra` overwrite an occupied slot instead
            layer.write_slots(&slots, row(10 + extra as u32), row(20 + extra as u32), position).unwrap();
        }
        let q = Tensor::<1>::from_data(TensorData::new(values(heads * d, 3, 3.0), [heads * d]), device)
            .reshape([heads, 1, d]);
        (cache, q)
    }

    fn read(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    fn assert_close(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "{what}: an all-zero reference proves nothing");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * scale + 1e-4 * w.abs(), "{what}[{i}]: {g} vs {w}");
        }
    }

    #[test]
    fn kernel_weights_match_burn_ops() {
        let wgpu = pollster::block_on(crate::init_device(crate::DeviceChoice::Wgpu)).expect("a wgpu adapter").0;
        let cpu = Device::flex();
        for (kv_heads, heads, d, cap) in [(2usize, 8usize, 64usize, 600usize), (4, 4, 32, 70), (1, 3, 128, 1030)] {
            let (cache, q) = layer(&wgpu, kv_heads, heads, d, cap);
            let (cpu_cache, cpu_q) = layer(&cpu, kv_heads, heads, d, cap);
            let kv = cache.layer(0).unwrap();
            assert!(kv.lens().iter().any(|&l| l != kv.lens()[0]) || kv_heads == 1, "ragged lengths");
            for all_heads in [false, true] {
                let what = format!("kv_heads {kv_heads} heads {heads} d {d} cap {cap} all_heads {all_heads}");
                let kernel = read(kernel_slot_attention(&q, kv, all_heads).expect("kernel route"));
                let burn = read(burn_slot_attention(&q, kv, all_heads));
                let reference = read(burn_slot_attention(&cpu_q, cpu_cache.layer(0).unwrap(), all_heads));
                assert_close(&format!("{what}: kernel vs Burn on wgpu"), &kernel, &burn);
                assert_close(&format!("{what}: kernel vs Burn on CPU"), &kernel, &reference);
                // free slots are zero, and each head's weights sum to 1 (group mean of softmaxes)
                for (h, &len) in kv.lens().iter().enumerate() {
                    let row = &kernel[h * cap..(h + 1) * cap];
                    if !all_heads {
                        assert!(row[len..].iter().all(|&x| x == 0.0), "{what}: free slots of head {h}");
                        let sum: f32 = row.iter().sum();
                        assert!((sum - 1.0).abs() < 1e-4, "{what}: head {h} sums to {sum}");
                    }
                }
                // the dispatching entry point takes the kernel route on wgpu
                assert_eq!(read(slot_attention(&q, kv, all_heads)), kernel, "{what}: dispatch");
            }
        }
    }
}
