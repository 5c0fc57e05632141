// The small one-row stages of a decode step:
//   rope — splits a fused q|k|v projection row into the rotated queries, the queries before
//          RoPE, the rotated keys and the values (HF's rotate_half layout: the two halves of a
//          head are the real and imaginary parts), one invocation per element;
//   norm — RMSNorm of rows, y = x·g / √(mean(x²) + ε), one workgroup per row.
//
// Rust wrappers and semantics: crates/kvslice-kernels/src/fused.rs.
//
// Template values: {{ wg }} workgroup size, entry point names.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    // norm: values per row
    width: u32,
    // norm: ε
    eps: f32,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// rope: [(heads + 2·kv_heads)·head_dim] q | k | v; norm: [rows, width]
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
// rope: [head_dim / 2] cos and sin of the position; norm: cos holds g [width]
@group(0) @binding(2) var<storage, read_write> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read_write> sin_t: array<f32>;
// rope: [heads, head_dim] rotated queries; norm: [rows, width] output
@group(0) @binding(4) var<storage, read_write> q_out: array<f32>;
// rope: [heads, head_dim] queries before RoPE
@group(0) @binding(5) var<storage, read_write> q_raw: array<f32>;
// rope: [kv_heads, head_dim] rotated keys and values
@group(0) @binding(6) var<storage, read_write> k_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_out: array<f32>;

const WG: u32 = {{ wg }}u;

var<workgroup> partial: array<f32, WG>;

// The rotated element `c` of the head starting at `base` of src.
fn rotated(base: u32, c: u32) -> f32 {
    let half = prm.head_dim / 2u;
    if c < half {
        return src[base + c] * cos_t[c] - src[base + c + half] * sin_t[c];
    }
    let i = c - half;
    return src[base + c] * cos_t[i] + src[base + i] * sin_t[i];
}

@compute @workgroup_size(WG)
fn {{ entry_rope }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let e = wid.x * WG + lid;
    let d = prm.head_dim;
    let nq = prm.heads * d;
    let nk = prm.kv_heads * d;
    if e < nq {
        let c = e % d;
        q_out[e] = rotated(e - c, c);
        q_raw[e] = src[e];
    } else if e < nq + nk {
        let c = e % d;
        k_out[e - nq] = rotated(e - c, c);
    } else if e < nq + 2u * nk {
        v_out[e - nq - nk] = src[e];
    }
}

@compute @workgroup_size(WG)
fn {{ entry_norm }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let width = prm.width;
    let base = wid.x * width;
    var s = 0.0;
    for (var k = lid; k < width; k += WG) {
        let v = src[base + k];
        s += v * v;
    }
    partial[lid] = s;
    workgroupBarrier();
    // Every invocation sums the partials itself (in the same order: the same value everywhere).
    var total = 0.0;
    for (var i = 0u; i < WG; i++) {
        total += partial[i];
    }
    let inv = 1.0 / sqrt(total / f32(width) + prm.eps);
    for (var k = lid; k < width; k += WG) {
        q_out[base + k] = src[base + k] * inv * cos_t[k];
    }
}
