// Decode attention over ragged per-head caches: one new query per query head, KV head kh holds
// len_kh valid slots out of its capacity. Split over key partitions (flash-decoding):
//   part    — per (query head, partition): running max, denominator and unnormalised output
//             of its keys (online softmax over tiles); scaled scores kept when weights are asked.
//   combine — per query head: merges the partitions into the output and the head's max and
//             denominator (skipped when one partition holds every key and no weights are
//             asked: `part` then writes the output).
//   weights — per (KV head, slot): the softmax weight averaged over the GQA group, added into
//             the per-slot running score (in place).
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/decode.rs.
//
// Template values: {{ wg }} workgroup size, {{ d_max }} largest head_dim, entry point names.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

struct Params {
    heads: u32,
    kv_heads: u32,
    // slots per KV head
    cap: u32,
    head_dim: u32,
    // 1/√head_dim
    scale: f32,
    // key partitions per head
    parts: u32,
    // keys per partition
    part_len: u32,
    // bit 0: weights asked; bit 1: one partition, written out by `part` (no combine)
    flags: u32,
    // per KV head kh: its valid slots len_kh
    lens: array<u32>,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [heads, head_dim]
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(2) var<storage, read_write> k: array<f32>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
// [heads, partitions, head_dim + 2] partial (max, denominator, output), then [heads, 2] (max,
// denominator) of each head
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
// [heads, capacity] scaled scores (weights only)
@group(0) @binding(5) var<storage, read_write> scratch: array<f32>;
// [heads, head_dim] attention output
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
// [kv_heads, capacity] running score (weights only)
@group(0) @binding(7) var<storage, read_write> acc_score: array<f32>;

const WG: u32 = {{ wg }}u;
const DMAX: u32 = {{ d_max }}u;
const DPT: u32 = DMAX / WG;

fn heads() -> u32 { return prm.heads; }
fn kv_heads() -> u32 { return prm.kv_heads; }
fn cap() -> u32 { return prm.cap; }
fn head_dim() -> u32 { return prm.head_dim; }
fn scale() -> f32 { return prm.scale; }
fn parts() -> u32 { return prm.parts; }
fn part_len() -> u32 { return prm.part_len; }
fn want_weights() -> bool { return (prm.flags & 1u) != 0u; }
// bit 1: the part pass writes the output itself (one partition, no weights)
fn direct() -> bool { return (prm.flags & 2u) != 0u; }
fn kv_len(kh: u32) -> u32 { return prm.lens[kh]; }

// The partition bounds control loops that hold barriers; reading them through workgroup memory
// lets WebGPU's uniformity analysis (Tint) see them as uniform.
var<workgroup> bounds_shared: vec2<u32>;

var<workgroup> q_row: array<f32, DMAX>;

@compute @workgroup_size(WG)
fn {{ entry_part }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let p = wid.x;
    let h = wid.y;
    let d = head_dim();
    let kh = h / (heads() / kv_heads());
    let len = kv_len(kh);
    let kbase = kh * cap() * d;

    for (var c = lid; c < DMAX; c += WG) {
        var x = 0.0;
        if c < d {
            x = q[h * d + c];
        }
        q_row[c] = x;
    }
    workgroupBarrier();

    if lid == 0u {
        let first = p * part_len();
        bounds_shared = vec2<u32>(first, min(first + part_len(), len));
    }
    let bounds = workgroupUniformLoad(&bounds_shared);
    let start = bounds.x;
    let end = bounds.y;
    var m = 0.0;
    var l = 0.0;
    var acc: array<f32, DPT>;
    for (var r = 0u; r < DPT; r++) {
        acc[r] = 0.0;
    }

    for (var t0 = start; t0 < end; t0 += WG) {
        let j = t0 + lid;
        let valid = j < end;
        var s = 0.0;
        if valid {
            let kr = kbase + j * d;
            for (var c = 0u; c < d; c++) {
                s += q_row[c] * k[kr + c];
            }
            s *= scale();
            if want_weights() {
                scratch[h * cap() + j] = s;
            }
        }
        s_tile[lid] = s;
        workgroupBarrier();

        let cnt = min(WG, end - t0);
        let step = online_max(m, tile_max(cnt), t0 == start);
        let m_new = step.x;
        let alpha = step.y;
        var pj = 0.0;
        if valid {
            pj = exp(s - m_new);
        }
        p_tile[lid] = pj;
        workgroupBarrier();

        l = l * alpha + tile_sum(cnt);
        m = m_new;
        for (var r = 0u; r < DPT; r++) {
            let c = lid + r * WG;
            if c < d {
                var a = acc[r] * alpha;
                for (var t = 0u; t < cnt; t++) {
                    a += p_tile[t] * v[kbase + (t0 + t) * d + c];
                }
                acc[r] = a;
            }
        }
        workgroupBarrier();
    }

    // One partition and no weights asked: the partial is the answer (combine is skipped; its
    // arithmetic would give the same bits: exp(0) = 1 and den = l).
    if direct() {
        for (var r = 0u; r < DPT; r++) {
            let c = lid + r * WG;
            if c < d {
                var o = 0.0;
                if l > 0.0 {
                    o = acc[r] / l;
                }
                out[h * d + c] = o;
            }
        }
        return;
    }
    let base = (h * parts() + p) * (d + 2u);
    if lid == 0u {
        part[base] = m;
        part[base + 1u] = l;
    }
    for (var r = 0u; r < DPT; r++) {
        let c = lid + r * WG;
        if c < d {
            part[base + 2u + c] = acc[r];
        }
    }
}

@compute @workgroup_size(WG)
fn {{ entry_combine }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let h = wid.x;
    let d = head_dim();
    let np = parts();
    let stride = d + 2u;
    let first = h * np * stride;

    var mx = 0.0;
    var seen = false;
    for (var p = 0u; p < np; p++) {
        let b = first + p * stride;
        if part[b + 1u] > 0.0 {
            if seen {
                mx = max(mx, part[b]);
            } else {
                mx = part[b];
                seen = true;
            }
        }
    }
    var den = 0.0;
    for (var p = 0u; p < np; p++) {
        let b = first + p * stride;
        let lp = part[b + 1u];
        if lp > 0.0 {
            den += lp * exp(part[b] - mx);
        }
    }
    for (var c = lid; c < d; c += WG) {
        var o = 0.0;
        for (var p = 0u; p < np; p++) {
            let b = first + p * stride;
            if part[b + 1u] > 0.0 {
                o += part[b + 2u + c] * exp(part[b] - mx);
            }
        }
        if den > 0.0 {
            o = o / den;
        }
        out[h * d + c] = o;
    }
    if lid == 0u {
        let tail = heads() * np * stride + 2u * h;
        part[tail] = mx;
        part[tail + 1u] = den;
    }
}

@compute @workgroup_size(WG)
fn {{ entry_weights }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let kh = wid.y;
    let j = wid.x * WG + lid;
    if j >= kv_len(kh) {
        return;
    }
    let g = heads() / kv_heads();
    let tail = heads() * parts() * (head_dim() + 2u);
    var sum = 0.0;
    for (var t = 0u; t < g; t++) {
        let h = kh * g + t;
        let mx = part[tail + 2u * h];
        let den = part[tail + 2u * h + 1u];
        sum += exp(scratch[h * cap() + j] - mx) / den;
    }
    acc_score[kh * cap() + j] += sum / f32(g);
}
