// Window statistics: attention of the last `w` prompt queries over all `n` keys, reduced per
// key column, without materialising the w×n (let alone n×n) attention matrix.
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/stats.rs. Three entry points share
// one binding set (each touches every binding so that the automatic pipeline layout matches):
//   rows  — per query row (h, i): running max and softmax denominator (online softmax over key
//           tiles) and, on request, the output's norm ‖o‖ and direction o/‖o‖.
//   cols  — per key column (h, j): mean, unbiased variance, last-query weight, value-norm term,
//           projection term, Jacobian term and entropy contribution over the window queries.
//   heads — per head: mean row entropy over the prefix keys and summed prefix column variance.
//
// Template values: {{ wg_rows }}, {{ wg_cols }}, {{ wg_heads }} workgroup sizes,
// {{ q_tile }} queries per tile of `cols`, {{ d_max }} largest head_dim, entry point names.

struct Params {
    heads: u32,
    kv_heads: u32,
    w: u32,
    n: u32,
    d: u32,
    scale: f32,
    // bit 0: projection requested, bit 1: Jacobian term requested (either way rows computes
    // ‖o‖ and o/‖o‖, cols reads them)
    flags: u32,
    // slots per KV head in k and v (row stride); keys 0..n are used
    cap: u32,
}

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

@group(0) @binding(0) var<storage, read_write> prm_buf: Params;
// [heads, w, d] window queries (after RoPE)
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
// [kv_heads, cap, d] keys (after RoPE)
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
// [kv_heads, cap, d] values
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
// [heads, w, 4]: row max (scaled scores), softmax denominator, ‖o‖ (output only), unused
@group(0) @binding(4) var<storage, read_write> rows: array<f32>;
// [heads, w, d]: o/‖o‖ per window query (projection only)
@group(0) @binding(5) var<storage, read_write> ohat: array<f32>;
// [7, heads, n]: mean, variance, last, value-norm term, projection term, entropy term,
// Jacobian term
@group(0) @binding(6) var<storage, read_write> cols: array<f32>;
// [heads, 2]: mean prefix row entropy, summed prefix column variance
@group(0) @binding(7) var<storage, read_write> head: array<f32>;

const WG_ROWS: u32 = {{ wg_rows }}u;
const WG_COLS: u32 = {{ wg_cols }}u;
const WG_HEADS: u32 = {{ wg_heads }}u;
const QT: u32 = {{ q_tile }}u;
const DMAX: u32 = {{ d_max }}u;
const DPT: u32 = DMAX / WG_ROWS;
const ENTROPY_EPS: f32 = 1e-10;

// Parameters read through workgroup memory so that the uniformity analysis of WebGPU
// implementations (Tint) sees them as uniform: loops holding barriers depend on them.
var<workgroup> prm_shared: Params;

fn uniform_params(lid: u32) -> Params {
    if lid == 0u {
        prm_shared = prm_buf;
    }
    return workgroupUniformLoad(&prm_shared);
}

fn want_projection(prm: Params) -> bool {
    return (prm.flags & 1u) != 0u;
}

fn want_jacobian(prm: Params) -> bool {
    return (prm.flags & 2u) != 0u;
}

// The window queries' outputs o_i are needed (their norm and direction).
fn want_output(prm: Params) -> bool {
    return (prm.flags & 3u) != 0u;
}

// Absolute position of window query i; it sees keys 0..=pos.
fn query_pos(prm: Params, i: u32) -> i32 {
    return i32(prm.n) - i32(prm.w) + i32(i);
}

var<workgroup> q_row: array<f32, DMAX>;

@compute @workgroup_size(WG_ROWS)
fn {{ entry_rows }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let prm = uniform_params(lid);
    let i = wid.x;
    let h = wid.y;
    let d = prm.d;
    let n = prm.n;
    let w = prm.w;
    let kvh = h / (prm.heads / prm.kv_heads);
    let qbase = (h * w + i) * d;
    let kbase = kvh * prm.cap * d;

    for (var c = lid; c < DMAX; c += WG_ROWS) {
        var x = 0.0;
        if c < d {
            x = q[qbase + c];
        }
        q_row[c] = x;
    }
    workgroupBarrier();

    let n_vis = u32(max(query_pos(prm, i) + 1, 0));
    var m = 0.0;
    var l = 0.0;
    var acc: array<f32, DPT>;
    for (var r = 0u; r < DPT; r++) {
        acc[r] = 0.0;
    }

    for (var t0 = 0u; t0 < n_vis; t0 += WG_ROWS) {
        let j = t0 + lid;
        let valid = j < n_vis;
        var s = 0.0;
        if valid {
            let kr = kbase + j * d;
            for (var c = 0u; c < d; c++) {
                s += q_row[c] * k[kr + c];
            }
            s *= prm.scale;
        }
        s_tile[lid] = s;
        workgroupBarrier();

        let cnt = min(WG_ROWS, n_vis - t0);
        let step = online_max(m, tile_max(cnt), t0 == 0u);
        let m_new = step.x;
        let alpha = step.y;
        var p = 0.0;
        if valid {
            p = exp(s - m_new);
        }
        p_tile[lid] = p;
        workgroupBarrier();

        l = l * alpha + tile_sum(cnt);
        m = m_new;

        if want_output(prm) {
            for (var r = 0u; r < DPT; r++) {
                let c = lid + r * WG_ROWS;
                if c < d {
                    var a = acc[r] * alpha;
                    for (var t = 0u; t < cnt; t++) {
                        a += p_tile[t] * v[kbase + (t0 + t) * d + c];
                    }
                    acc[r] = a;
                }
            }
        }
        workgroupBarrier();
    }

    let rbase = (h * w + i) * 4u;
    if lid == 0u {
        rows[rbase] = m;
        rows[rbase + 1u] = l;
    }

    if want_output(prm) {
        // ‖o‖ over the head dimension, reduced through the score tile.
        var part = 0.0;
        for (var r = 0u; r < DPT; r++) {
            let c = lid + r * WG_ROWS;
            if c < d && l > 0.0 {
                let o = acc[r] / l;
                part += o * o;
            }
        }
        s_tile[lid] = part;
        workgroupBarrier();
        var total = 0.0;
        for (var t = 0u; t < WG_ROWS; t++) {
            total += s_tile[t];
        }
        var inv = 0.0;
        if total > 0.0 {
            inv = 1.0 / (sqrt(total) * l);
        }
        if lid == 0u {
            rows[rbase + 2u] = sqrt(total);
        }
        for (var r = 0u; r < DPT; r++) {
            let c = lid + r * WG_ROWS;
            if c < d {
                ohat[qbase + c] = acc[r] * inv;
            }
        }
    }
}

var<workgroup> q_tile_sh: array<f32, QT * DMAX>;
var<workgroup> o_tile_sh: array<f32, QT * DMAX>;
var<workgroup> m_tile_sh: array<f32, QT>;
var<workgroup> l_tile_sh: array<f32, QT>;
var<workgroup> n_tile_sh: array<f32, QT>;

@compute @workgroup_size(WG_COLS)
fn {{ entry_cols }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let prm = uniform_params(lid);
    let h = wid.y;
    let j = wid.x * WG_COLS + lid;
    let d = prm.d;
    let n = prm.n;
    let w = prm.w;
    let kvh = h / (prm.heads / prm.kv_heads);
    let in_range = j < n;
    let jc = min(j, n - 1u);
    let krow = (kvh * prm.cap + jc) * d;
    let proj = want_output(prm);
    let jac = want_jacobian(prm);

    // ‖v_j‖²
    var vn = 0.0;
    if in_range {
        for (var c = 0u; c < d; c++) {
            let x = v[krow + c];
            vn += x * x;
        }
    }

    // Welford over the window queries (masked weights are zeros and count).
    var cnt = 0.0;
    var mean = 0.0;
    var m2 = 0.0;
    var last = 0.0;
    var proj_sum = 0.0;
    var ent_sum = 0.0;
    var jac_sum = 0.0;

    for (var i0 = 0u; i0 < w; i0 += QT) {
        for (var e = lid; e < QT * DMAX; e += WG_COLS) {
            let qi = e / DMAX;
            let c = e % DMAX;
            let i = i0 + qi;
            var qv = 0.0;
            var ov = 0.0;
            if i < w && c < d {
                qv = q[(h * w + i) * d + c];
                if proj {
                    ov = ohat[(h * w + i) * d + c];
                }
            }
            q_tile_sh[e] = qv;
            o_tile_sh[e] = ov;
        }
        if lid < QT {
            let i = i0 + lid;
            var rm = 0.0;
            var rl = 0.0;
            var rn = 0.0;
            if i < w {
                rm = rows[(h * w + i) * 4u];
                rl = rows[(h * w + i) * 4u + 1u];
                if proj {
                    rn = rows[(h * w + i) * 4u + 2u];
                }
            }
            m_tile_sh[lid] = rm;
            l_tile_sh[lid] = rl;
            n_tile_sh[lid] = rn;
        }
        workgroupBarrier();

        if in_range {
            var sc: array<f32, QT>;
            var pc: array<f32, QT>;
            var dc: array<f32, QT>;
            for (var t = 0u; t < QT; t++) {
                sc[t] = 0.0;
                pc[t] = 0.0;
                dc[t] = 0.0;
            }
            for (var c = 0u; c < d; c++) {
                let kc = k[krow + c];
                for (var t = 0u; t < QT; t++) {
                    sc[t] += q_tile_sh[t * DMAX + c] * kc;
                }
                if proj {
                    let vc = v[krow + c];
                    for (var t = 0u; t < QT; t++) {
                        pc[t] += o_tile_sh[t * DMAX + c] * vc;
                    }
                    if jac {
                        // ‖v_j − o_i‖² summed directly (no cancellation), o_i = ‖o_i‖ · ô_i
                        for (var t = 0u; t < QT; t++) {
                            let diff = vc - o_tile_sh[t * DMAX + c] * n_tile_sh[t];
                            dc[t] += diff * diff;
                        }
                    }
                }
            }
            for (var t = 0u; t < QT; t++) {
                let i = i0 + t;
                if i < w {
                    var a = 0.0;
                    if i32(j) <= query_pos(prm, i) {
                        a = exp(sc[t] * prm.scale - m_tile_sh[t]) / l_tile_sh[t];
                    }
                    cnt += 1.0;
                    let delta = a - mean;
                    mean += delta / cnt;
                    m2 += delta * (a - mean);
                    if i == w - 1u {
                        last = a;
                    }
                    proj_sum += a * pc[t];
                    ent_sum -= a * log(a + ENTROPY_EPS);
                    if jac {
                        jac_sum += a * sqrt(dc[t]);
                    }
                }
            }
        }
        workgroupBarrier();
    }

    if in_range {
        let plane = prm.heads * n;
        let idx = h * n + j;
        var var_ = 0.0;
        if w > 1u {
            var_ = m2 / f32(w - 1u);
        }
        cols[idx] = mean;
        cols[plane + idx] = var_;
        cols[2u * plane + idx] = last;
        cols[3u * plane + idx] = mean * sqrt(vn);
        cols[4u * plane + idx] = proj_sum / f32(w);
        cols[5u * plane + idx] = ent_sum;
        cols[6u * plane + idx] = jac_sum / f32(w);
    }
}

var<workgroup> red_a: array<f32, WG_HEADS>;
var<workgroup> red_b: array<f32, WG_HEADS>;

@compute @workgroup_size(WG_HEADS)
fn {{ entry_heads }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let prm = uniform_params(lid);
    let h = wid.x;
    let n = prm.n;
    let prefix = n - prm.w;
    let plane = prm.heads * n;
    var ent = 0.0;
    var cv = 0.0;
    for (var j = lid; j < prefix; j += WG_HEADS) {
        cv += cols[plane + h * n + j];
        ent += cols[5u * plane + h * n + j];
    }
    red_a[lid] = ent;
    red_b[lid] = cv;
    workgroupBarrier();
    for (var stride = WG_HEADS / 2u; stride > 0u; stride /= 2u) {
        if lid < stride {
            red_a[lid] += red_a[lid + stride];
            red_b[lid] += red_b[lid + stride];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        head[h * 2u] = red_a[0] / f32(prm.w);
        head[h * 2u + 1u] = red_b[0];
    }
}
