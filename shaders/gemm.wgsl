// Register-tiled projection y = x·W + b for many rows of x (prefill).
//
// Each workgroup computes a tile of BM = 4·WG_Y rows × BN = 4·WG_X columns of y. Per step of
// BK = 16 along d_in, the workgroup stages the x tile (transposed, [BK][BM + 1]) and the W tile
// ([BK][BN / 4] as vec4) in workgroup memory, every invocation loading its share once; then
// each invocation accumulates 4 rows × 4 adjacent columns (one vec4 per row) in registers, so
// every staged x value serves 4 columns and every staged W vec4 serves 4 rows. The rows of an
// invocation are ty, ty + WG_Y, ty + 2·WG_Y, ty + 3·WG_Y: adjacent invocations (tx) store
// adjacent vec4s of one row of y.
//
// Requires d_out % 4 == 0 (W, b and y addressed as vec4). Rows past n and steps past d_in
// are staged as zeros and not stored.
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/gemm.rs.
//
// Template values: {{ wg_x }} × {{ wg_y }} invocations per workgroup (one dimension), {{ bk }} the step along d_in,
// entry point names.

// Every buffer is declared read_write, inputs included (see linear.wgsl).

struct Params {
    // rows of x
    n: u32,
    d_in: u32,
    // vec4 columns of W and y: d_out / 4
    cols: u32,
    // bit 0: bias given
    flags: u32,
    // workgroups along y (row tile = wid.z * groups_y + wid.y)
    groups_y: u32,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [n, d_in]
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// [d_in, d_out]
@group(0) @binding(2) var<storage, read_write> w: array<vec4<f32>>;
// [d_out] (bias given only)
@group(0) @binding(3) var<storage, read_write> bias: array<vec4<f32>>;
// [n, d_out]
@group(0) @binding(4) var<storage, read_write> y: array<vec4<f32>>;

const WG_X: u32 = {{ wg_x }}u;
const WG_Y: u32 = {{ wg_y }}u;
const BK: u32 = {{ bk }}u;
const BM: u32 = 4u * WG_Y;
const THREADS: u32 = WG_X * WG_Y;

// Row stride of the x tile: one more than BM, so that the invocations staging one row's BK
// values write to different banks of workgroup memory.
const XS: u32 = BM + 1u;
// x tile, transposed: xs[k * XS + r]
var<workgroup> xs: array<f32, BK * XS>;
// W tile: ws[k * WG_X + c]
var<workgroup> ws: array<vec4<f32>, BK * WG_X>;

@compute @workgroup_size(THREADS)
fn {{ entry_gemm }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    _ = touch_bindings();
    let n = prm.n;
    let din = prm.d_in;
    let nc = prm.cols;
    let row0 = (wid.z * prm.groups_y + wid.y) * BM;
    let col0 = wid.x * WG_X;
    // the invocation's vec4 column within the tile, and its first row
    let tx = li % WG_X;
    let ty = li / WG_X;
    let col = col0 + tx;

    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);

    // Every invocation runs every step (the barriers are uniform); out-of-range rows and
    // columns compute on zeros and are not stored.
    for (var k0 = 0u; k0 < din; k0 += BK) {
        // x tile: BK·BM values, THREADS at a time; consecutive invocations read consecutive k
        // of one row (contiguous in x)
        for (var e = li; e < BK * BM; e += THREADS) {
            let r = e / BK;
            let k = e % BK;
            var v = 0.0;
            if row0 + r < n && k0 + k < din {
                v = x[(row0 + r) * din + k0 + k];
            }
            xs[k * XS + r] = v;
        }
        // W tile: BK·WG_X vec4s; consecutive invocations read consecutive columns of one row
        for (var e = li; e < BK * WG_X; e += THREADS) {
            let k = e / WG_X;
            let c = e % WG_X;
            var v = vec4<f32>(0.0);
            if k0 + k < din && col0 + c < nc {
                v = w[(k0 + k) * nc + col0 + c];
            }
            ws[k * WG_X + c] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let wv = ws[k * WG_X + tx];
            let xb = k * XS + ty;
            a0 += xs[xb] * wv;
            a1 += xs[xb + WG_Y] * wv;
            a2 += xs[xb + 2u * WG_Y] * wv;
            a3 += xs[xb + 3u * WG_Y] * wv;
        }
        workgroupBarrier();
    }

    if col >= nc {
        return;
    }
    var b = vec4<f32>(0.0);
    if (prm.flags & 1u) != 0u {
        b = bias[col];
    }
    let r = row0 + ty;
    if r < n {
        y[r * nc + col] = a0 + b;
    }
    if r + WG_Y < n {
        y[(r + WG_Y) * nc + col] = a1 + b;
    }
    if r + 2u * WG_Y < n {
        y[(r + 2u * WG_Y) * nc + col] = a2 + b;
    }
    if r + 3u * WG_Y < n {
        y[(r + 3u * WG_Y) * nc + col] = a3 + b;
    }
}
