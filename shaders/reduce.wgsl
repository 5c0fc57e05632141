// Score reductions over positions and over GQA groups.
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/reduce.rs. Two entry points share one
// binding set:
//   pool — 1-D average or max pooling along positions, odd kernel, stride 1, "same" padding
//          kernel/2 (torch avg_pool1d with count_include_pad=True; max_pool1d, where padding
//          never wins).
//   group — reduction of each GQA group's query-head rows to its KV head (mean or max).
//
// Template values: {{ wg }} workgroup size, entry point names.

struct Params {
    // pool: number of rows; group: query heads
    rows: u32,
    // positions per row
    n: u32,
    // pool: kernel size (odd); group: KV heads
    arg: u32,
    // 0 = mean/average, 1 = max
    mode: u32,
}

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

@group(0) @binding(0) var<storage, read_write> prm: Params;
// pool: [rows, n]; group: [heads, n]
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
// pool: [rows, n]; group: [kv_heads, n]
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

const WG: u32 = {{ wg }}u;

fn touch_bindings() -> u32 {
    return arrayLength(&src) + arrayLength(&dst);
}

@compute @workgroup_size(WG)
fn {{ entry_pool }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let n = prm.n;
    let row = wid.y;
    let i = wid.x * WG + lid;
    if i >= n {
        return;
    }
    let half = prm.arg / 2u;
    let lo = select(0u, i - half, i >= half);
    let hi = min(i + half + 1u, n);
    let base = row * n;
    if prm.mode == 0u {
        var s = 0.0;
        for (var t = lo; t < hi; t++) {
            s += src[base + t];
        }
        dst[base + i] = s / f32(prm.arg);
    } else {
        var mx = src[base + lo];
        for (var t = lo + 1u; t < hi; t++) {
            mx = max(mx, src[base + t]);
        }
        dst[base + i] = mx;
    }
}

@compute @workgroup_size(WG)
fn {{ entry_group }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let n = prm.n;
    let kh = wid.y;
    let j = wid.x * WG + lid;
    if j >= n {
        return;
    }
    let g = prm.rows / prm.arg;
    let first = kh * g;
    if prm.mode == 0u {
        var s = 0.0;
        for (var t = 0u; t < g; t++) {
            s += src[(first + t) * n + j];
        }
        dst[kh * n + j] = s / f32(g);
    } else {
        var mx = src[first * n + j];
        for (var t = 1u; t < g; t++) {
            mx = max(mx, src[(first + t) * n + j]);
        }
        dst[kh * n + j] = mx;
    }
}
