//! Decode-time attention weights for the eviction rules that rank cached entries by the
//! attention the newest query gives them (H2O, TOVA, CAKE's decode phase, InertiaKV).

use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor, TensorData};
use kvslice_cache::LayerKv;

/// Attention of one query per head over every slot, `[kv_heads, capacity]`: averaged over each
/// GQA group, or over all heads of the layer when `all_heads` (TOVA), zero on free slots.
pub(crate) fn slot_attention(q: &Tensor<3>, kv: &LayerKv, all_heads: bool) -> Tensor<2> {
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
