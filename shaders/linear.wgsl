// Skinny projection y = x·W + b for few rows of x (decoding).
//   one  — each invocation computes one output column (one V of columns) for one row of x.
//   four — each invocation computes one output column for four rows of x (W read once for all).
// Adjacent invocations read adjacent elements of a row of W: GPUs coalesce the loads, and
// llvmpipe (lavapipe) turns them into vector loads. The rows of x are read straight from storage
// at an address shared by the whole workgroup (a broadcast; no workgroup memory, no barrier).
//
// V is f32, or vec4<f32> when d_out % 4 == 0 (then W, b and y are addressed as vec4, four
// adjacent columns per invocation).
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/linear.rs.
//
// Template values: {{ wg }} workgroup size, {{ vtype }} the column type V, entry point names.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

alias V = {{ vtype }};

struct Params {
    // rows of x
    n: u32,
    d_in: u32,
    // column units: d_out, or d_out / 4 for vec4
    cols: u32,
    // bit 0: bias given
    flags: u32,
    // workgroups along y (row block = wid.z * groups_y + wid.y)
    groups_y: u32,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [n, d_in]
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// [d_in, d_out]
@group(0) @binding(2) var<storage, read_write> w: array<V>;
// [d_out] (bias given only)
@group(0) @binding(3) var<storage, read_write> bias: array<V>;
// [n, d_out]
@group(0) @binding(4) var<storage, read_write> y: array<V>;

const WG: u32 = {{ wg }}u;

fn rows() -> u32 { return prm.n; }
fn d_in() -> u32 { return prm.d_in; }
fn cols() -> u32 { return prm.cols; }
fn has_bias() -> bool { return (prm.flags & 1u) != 0u; }
fn groups_y() -> u32 { return prm.groups_y; }

fn bias_at(col: u32) -> V {
    if has_bias() {
        return bias[col];
    }
    return V(0.0);
}

@compute @workgroup_size(WG)
fn {{ entry_one }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let col = wid.x * WG + lid;
    let row = wid.z * groups_y() + wid.y;
    let nc = cols();
    if col >= nc || row >= rows() {
        return;
    }
    let din = d_in();
    let xb = row * din;
    var acc = V(0.0);
    var wi = col;
    for (var k = 0u; k < din; k++) {
        acc += x[xb + k] * w[wi];
        wi += nc;
    }
    y[row * nc + col] = acc + bias_at(col);
}

@compute @workgroup_size(WG)
fn {{ entry_four }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let col = wid.x * WG + lid;
    let row0 = (wid.z * groups_y() + wid.y) * 4u;
    let nc = cols();
    let n = rows();
    if col >= nc || row0 >= n {
        return;
    }
    let din = d_in();
    // Rows past n read the last row again (in bounds) and are not stored.
    let last = n - 1u;
    let x0 = row0 * din;
    let x1 = min(row0 + 1u, last) * din;
    let x2 = min(row0 + 2u, last) * din;
    let x3 = min(row0 + 3u, last) * din;
    var a0 = V(0.0);
    var a1 = V(0.0);
    var a2 = V(0.0);
    var a3 = V(0.0);
    var wi = col;
    for (var k = 0u; k < din; k++) {
        let wk = w[wi];
        a0 += x[x0 + k] * wk;
        a1 += x[x1 + k] * wk;
        a2 += x[x2 + k] * wk;
        a3 += x[x3 + k] * wk;
        wi += nc;
    }
    let b = bias_at(col);
    y[row0 * nc + col] = a0 + b;
    if row0 + 1u < n {
        y[(row0 + 1u) * nc + col] = a1 + b;
    }
    if row0 + 2u < n {
        y[(row0 + 2u) * nc + col] = a2 + b;
    }
    if row0 + 3u < n {
        y[(row0 + 3u) * nc + col] = a3 + b;
    }
}
