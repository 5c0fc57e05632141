//! Kernel 5: decode attention over ragged per-head caches (`shaders/decode.wgsl`).
//!
//! One new query per query head; KV head `kh` holds `lens[kh]` valid slots of its capacity.
//! Keys are stored after RoPE, so slot order is irrelevant. The keys of each head are split
//! into partitions of 256; one workgroup scores a partition against every query head of a
//! chunk of the KV head's GQA group (up to 4 heads, so each key and value row is read once for
//! all of them), with an exact softmax over the partition, and a combine pass merges the
//! partitions (flash-decoding); with one partition and no scores asked, the
//! partition pass writes the output itself (one dispatch). When a running score is given, a third pass adds
//! each slot's weight, averaged over the GQA group of the slot's KV head, into it in place
//! (H2O accumulates it over decode steps; TOVA passes a zeroed tensor for the current step).
//! A head with length 0 outputs zeros.

use burn::tensor::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::params::DecodeParams;
use crate::shader::{DECODE_GROUP_MAX, DECODE_PART_LEN, DECODE_WG, Family, decode_variant};

/// Attention output of one new query per head.
///
/// # Shapes
/// - `query`: `[heads, head_dim]` (after RoPE)
/// - `keys`, `values`: `[kv_heads, capacity, head_dim]`
/// - `lens`: one entry per KV head, `lens[kh] ≤ capacity`
/// - `scores`: optional `[kv_heads, capacity]` f32, contiguous, updated in place:
///   `scores[kh, j] += Σ_{h in group(kh)} a_hj / g` for `j < lens[kh]`
///
/// Returns `[heads, head_dim]`. Scale `1/√head_dim`.
pub fn decode_attention(
    query: &Tensor<2>,
    keys: &Tensor<3>,
    values: &Tensor<3>,
    lens: &[u32],
    scores: Option<&mut Tensor<2>>,
) -> Result<Tensor<2>> {
    let [heads, d] = query.dims();
    let [kv_heads, cap, _] = keys.dims();
    gpu::expect_shape("keys", &keys.dims(), &[kv_heads, cap, d])?;
    gpu::expect_shape("values", &values.dims(), &[kv_heads, cap, d])?;
    gpu::check_head_dim(d)?;
    gpu::check_grouping(heads, kv_heads)?;
    if lens.len() != kv_heads {
        return Err(KernelError::PerHead { what: "lengths", expected: kv_heads, got: lens.len() });
    }
    for (h, &len) in lens.iter().enumerate() {
        if len as usize > cap {
            return Err(KernelError::LengthPastCapacity { head: h, len: len as usize, capacity: cap });
        }
    }
    if let Some(s) = scores.as_ref() {
        gpu::expect_shape("scores", &s.dims(), &[kv_heads, cap])?;
    }
    gpu::check_elements("keys", &[kv_heads, cap, d])?;
    gpu::check_elements("scratch", &[heads, cap])?;
    let max_len = lens.iter().copied().max().unwrap_or(0) as usize;
    let parts = div_ceil(max_len, DECODE_PART_LEN).max(1) as usize;
    gpu::check_elements("partials", &[heads, parts + 1, d + 2])?;
    gpu::check_groups("heads", heads)?;
    gpu::check_groups("partitions", parts)?;
    gpu::check_groups("slot workgroups", div_ceil(max_len, DECODE_WG) as usize)?;

    let q = gpu::float_input("query", query)?;
    let k = gpu::float_input("keys", keys)?;
    let v = gpu::float_input("values", values)?;
    gpu::same_device(("query", &q), ("keys", &k))?;
    gpu::same_device(("query", &q), ("values", &v))?;
    let acc = match scores.as_ref() {
        Some(s) => {
            let p = gpu::float_in_place("scores", s)?;
            gpu::same_device(("query", &q), ("scores", &p))?;
            Some(p)
        }
        None => None,
    };

    let (q, k, v) = (gpu::ready(q), gpu::ready(k), gpu::ready(v));
    let g = Gpu::new(&q);
    let part = g.empty(&[heads * parts * (d + 2) + 2 * heads], DType::F32);
    let scratch = acc.as_ref().map(|_| g.empty(&[heads, cap], DType::F32));
    let out = g.empty(&[heads, d], DType::F32);
    let scale = 1.0f32 / (d as f32).sqrt();
    // One partition and no weights: `part` writes the output and `combine` is not launched.
    let direct = parts == 1 && acc.is_none();
    let params = DecodeParams {
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        cap: cap as u32,
        head_dim: d as u32,
        scale,
        parts: parts as u32,
        part_len: DECODE_PART_LEN,
        flags: u32::from(acc.is_some()) | if direct { 2 } else { 0 },
    };
    let params = g.params(&params, lens);
    let bindings = || {
        vec![
            params.clone(),
            bind(&q),
            bind(&k),
            bind(&v),
            bind(&part),
            scratch.as_ref().map(bind).unwrap_or_else(|| g.dummy()),
            bind(&out),
            acc.as_ref().map(bind).unwrap_or_else(|| g.dummy()),
        ]
    };
    // A group of `group` query heads runs as `chunks` workgroups of `per` heads each (the last
    // one may hold fewer); keys, values and queries are read four floats at a time when the
    // head dimension allows it.
    let group = (heads / kv_heads) as u32;
    let chunks = group.div_ceil(DECODE_GROUP_MAX);
    let per = group.div_ceil(chunks);
    let lanes = if d % 4 == 0 { 4 } else { 1 };
    g.launch_variant(
        Family::Decode,
        "part",
        decode_variant(lanes, per),
        (parts as u32, kv_heads as u32 * chunks, 1),
        bindings(),
    );
    if !direct {
        g.launch(Family::Decode, "combine", (heads as u32, 1, 1), bindings());
    }
    if acc.is_some() && max_len > 0 {
        g.launch(Family::Decode, "weights", (div_ceil(max_len, DECODE_WG), kv_heads as u32, 1), bindings());
    }
    Ok(gpu::float_tensor(out))
}
