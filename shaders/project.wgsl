// One row of a decode step through a projection, with what surrounds it in a Llama block fused
// in: y = epilogue(prologue(x)·W + b), one dispatch instead of one per element-wise op.
//   prologue (bit 1) — RMSNorm of x: x_k·g_k / √(mean(x²) + ε). The mean is reduced by each
//                      workgroup over the whole row (d_in values, read from storage); the
//                      products use x_k·g_k and the result is scaled by 1/√(mean + ε) once.
//   epilogue (bit 2) — residual: y = r + (x·W + b).
//            (bit 3) — SwiGLU over a gate-and-up weight ([d_in, 2·d_out], gate columns first):
//                      y = silu(x·W_g + b_g) · (x·W_u + b_u).
// One invocation per output column unit (four adjacent columns as a vec4 when d_out % 4 == 0);
// W is read in its stored [d_in, columns] row-major layout, so adjacent invocations read
// adjacent elements of a row (coalesced loads), as in linear.wgsl.
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/fused.rs.
//
// Template values: {{ wg }} workgroup size, {{ vtype }} the column type V, entry point name.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

alias V = {{ vtype }};

struct Params {
    d_in: u32,
    // output column units: d_out, or d_out / 4 for vec4
    cols: u32,
    // units per row of W: cols, or 2 · cols with SwiGLU
    w_stride: u32,
    // bit 0: bias, bit 1: RMSNorm prologue, bit 2: residual, bit 3: SwiGLU
    flags: u32,
    // RMSNorm ε
    eps: f32,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [d_in]
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// [d_in, w_stride]
@group(0) @binding(2) var<storage, read_write> w: array<V>;
// [w_stride] (bias only)
@group(0) @binding(3) var<storage, read_write> bias: array<V>;
// [d_in] RMSNorm weight (prologue only)
@group(0) @binding(4) var<storage, read_write> gain: array<f32>;
// [cols] (residual only)
@group(0) @binding(5) var<storage, read_write> res: array<V>;
// [cols]
@group(0) @binding(6) var<storage, read_write> y: array<V>;

const WG: u32 = {{ wg }}u;

var<workgroup> partial: array<f32, WG>;

fn has(bit: u32) -> bool { return (prm.flags & bit) != 0u; }

fn bias_at(unit: u32) -> V {
    if has(1u) {
        return bias[unit];
    }
    return V(0.0);
}

// 1/√(mean(x²) + ε) over the row, reduced across the workgroup (every invocation gets it).
fn inv_rms(lid: u32) -> f32 {
    let din = prm.d_in;
    var s = 0.0;
    for (var k = lid; k < din; k += WG) {
        let v = x[k];
        s += v * v;
    }
    partial[lid] = s;
    workgroupBarrier();
    // Every invocation sums the partials itself (in the same order: the same value everywhere).
    var total = 0.0;
    for (var i = 0u; i < WG; i++) {
        total += partial[i];
    }
    return 1.0 / sqrt(total / f32(din) + prm.eps);
}

fn input(k: u32, norm: bool) -> f32 {
    if norm {
        return x[k] * gain[k];
    }
    return x[k];
}

@compute @workgroup_size(WG)
fn {{ entry_project }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    // Every invocation takes part in the reduction (it holds barriers), normed or not.
    let inv = inv_rms(lid);
    let col = wid.x * WG + lid;
    let nc = prm.cols;
    if col >= nc {
        return;
    }
    let norm = has(2u);
    let scale = select(1.0, inv, norm);
    let din = prm.d_in;
    let stride = prm.w_stride;
    var wi = col;
    if has(8u) {
        var g = V(0.0);
        var u = V(0.0);
        for (var k = 0u; k < din; k++) {
            let xk = input(k, norm);
            g += xk * w[wi];
            u += xk * w[wi + nc];
            wi += stride;
        }
        g = g * scale + bias_at(col);
        u = u * scale + bias_at(col + nc);
        var gated = g / (V(1.0) + exp(-g)) * u;
        if has(4u) {
            gated += res[col];
        }
        y[col] = gated;
        return;
    }
    var acc = V(0.0);
    for (var k = 0u; k < din; k++) {
        acc += input(k, norm) * w[wi];
        wi += stride;
    }
    var out = acc * scale + bias_at(col);
    if has(4u) {
        out += res[col];
    }
    y[col] = out;
}
