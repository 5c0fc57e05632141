// Decode attention over ragged per-head caches: one new query per query head, KV head kh holds
// len_kh valid slots out of its capacity. Split over key partitions (flash-decoding):
//   part    — per (partition, KV head, chunk of its query heads): the scores of the partition's
//             keys against every query of the chunk (each key row is read once for the whole
//             GQA chunk), their max, exponentials and sum, and the unnormalised output; scaled
//             scores kept when weights are asked.
//   combine — per query head: merges the partitions into the output and the head's max and
//             denominator (skipped when one partition holds every key and no weights are
//             asked: `part` then writes the output).
//   weights — per (KV head, slot): the softmax weight averaged over the GQA group, added into
//             the per-slot running score (in place).
//
// A partition is scored whole (PART_LEN keys, several per invocation) into workgroup memory, so
// its softmax is exact in two passes with a handful of barriers, not an online softmax per tile.
// The value pass gives each invocation one unit of V (a column, or four adjacent ones) and a
// share of the keys; the shares are summed through workgroup memory at the end.
//
// Compiled per variant: V is f32 or vec4<f32> (head_dim % 4 == 0: keys, values and queries read
// four components per load) and GC query heads per workgroup (1 to 4; a group of g heads is run
// as ceil(g / GC) chunks).
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/decode.rs.
//
// Template values: {{ wg }} workgroup size, {{ d_max }} largest head_dim, {{ part_len }} keys per
// partition, {{ lanes }} components of V, {{ vtype }} V, {{ vdot }} the dot product of two Vs
// `a` and `b`, {{ group }} GC, {{ upt }} units of V per invocation at most, entry point names.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

alias V = {{ vtype }};

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
@group(0) @binding(1) var<storage, read_write> q: array<V>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(2) var<storage, read_write> k: array<V>;
// [kv_heads, capacity, head_dim]
@group(0) @binding(3) var<storage, read_write> v: array<V>;
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
const PL: u32 = {{ part_len }}u;
const LANES: u32 = {{ lanes }}u;
const GC: u32 = {{ group }}u;
const UPT: u32 = {{ upt }}u;
// units of V in a query row of workgroup memory
const DU: u32 = DMAX / LANES;
// keys per invocation in the score pass
const KPT: u32 = PL / WG;

fn heads() -> u32 { return prm.heads; }
fn kv_heads() -> u32 { return prm.kv_heads; }
fn cap() -> u32 { return prm.cap; }
fn head_dim() -> u32 { return prm.head_dim; }
fn scale() -> f32 { return prm.scale; }
fn parts() -> u32 { return prm.parts; }
fn want_weights() -> bool { return (prm.flags & 1u) != 0u; }
// bit 1: the part pass writes the output itself (one partition, no weights)
fn direct() -> bool { return (prm.flags & 2u) != 0u; }
fn kv_len(kh: u32) -> u32 { return prm.lens[kh]; }

fn vdot(a: V, b: V) -> f32 { return {{ vdot }}; }

// the queries of the chunk, GC rows of DU units
var<workgroup> q_rows: array<V, GC * DU>;
// the partition's scaled scores, then their exponentials: GC rows of PL
var<workgroup> s_part: array<f32, GC * PL>;
// per-invocation partial maxima and sums, GC rows of WG
var<workgroup> red: array<f32, GC * WG>;
// per head of the chunk: max, sum
var<workgroup> stat: array<f32, 2 * GC>;
// per-invocation partial outputs, GC rows of WG
var<workgroup> red_v: array<V, GC * WG>;

@compute @workgroup_size(WG)
fn {{ entry_part }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let p = wid.x;
    let d = head_dim();
    let du = d / LANES;
    let g = heads() / kv_heads();
    // the grid's y holds kv_heads × chunks workgroups
    let chunks = groups.y / kv_heads();
    let kh = wid.y / chunks;
    // first query head of the chunk, and how many of its GC heads exist
    let h0 = kh * g + (wid.y % chunks) * GC;
    let nh = min(GC, kh * g + g - h0);
    let len = kv_len(kh);
    let start = p * PL;
    let end = max(start, min(start + PL, len));
    let cnt = end - start;
    let kbase = kh * cap() * du;

    for (var i = lid; i < GC * DU; i += WG) {
        let hc = i / DU;
        let c = i % DU;
        var x = V(0.0);
        if hc < nh && c < du {
            x = q[(h0 + hc) * du + c];
        }
        q_rows[i] = x;
    }
    workgroupBarrier();

    // scores: invocation lid takes keys lid, lid + WG, ... of the partition
    var mx: array<f32, GC>;
    for (var hc = 0u; hc < GC; hc++) {
        mx[hc] = -3.0e38;
    }
    for (var i = 0u; i < KPT; i++) {
        let t = lid + i * WG;
        if t < cnt {
            let j = start + t;
            let kr = kbase + j * du;
            var s: array<f32, GC>;
            for (var hc = 0u; hc < GC; hc++) {
                s[hc] = 0.0;
            }
            for (var c = 0u; c < du; c++) {
                let kv = k[kr + c];
                for (var hc = 0u; hc < GC; hc++) {
                    s[hc] += vdot(q_rows[hc * DU + c], kv);
                }
            }
            for (var hc = 0u; hc < GC; hc++) {
                let x = s[hc] * scale();
                s_part[hc * PL + t] = x;
                mx[hc] = max(mx[hc], x);
                if want_weights() && hc < nh {
                    scratch[(h0 + hc) * cap() + j] = x;
                }
            }
        }
    }
    for (var hc = 0u; hc < GC; hc++) {
        red[hc * WG + lid] = mx[hc];
    }
    workgroupBarrier();
    if lid < GC {
        var m = red[lid * WG];
        for (var t = 1u; t < WG; t++) {
            m = max(m, red[lid * WG + t]);
        }
        stat[2u * lid] = m;
    }
    workgroupBarrier();

    // exponentials in place, and their sums
    var sm: array<f32, GC>;
    for (var hc = 0u; hc < GC; hc++) {
        sm[hc] = 0.0;
    }
    for (var i = 0u; i < KPT; i++) {
        let t = lid + i * WG;
        if t < cnt {
            for (var hc = 0u; hc < GC; hc++) {
                let e = exp(s_part[hc * PL + t] - stat[2u * hc]);
                s_part[hc * PL + t] = e;
                sm[hc] += e;
            }
        }
    }
    for (var hc = 0u; hc < GC; hc++) {
        red[hc * WG + lid] = sm[hc];
    }
    workgroupBarrier();
    if lid < GC {
        var l = 0.0;
        for (var t = 0u; t < WG; t++) {
            l += red[lid * WG + t];
        }
        stat[2u * lid + 1u] = l;
    }

    // values: invocation (share, unit) sums its share of the keys into units unit, unit + cw, ...
    let cw = min(du, WG);
    let shares = WG / cw;
    let share = lid / cw;
    let unit = lid % cw;
    var acc: array<V, GC * UPT>;
    for (var i = 0u; i < GC * UPT; i++) {
        acc[i] = V(0.0);
    }
    if share < shares {
        for (var t = share; t < cnt; t += shares) {
            let vr = kbase + (start + t) * du;
            for (var r = 0u; r < UPT; r++) {
                let c = unit + r * cw;
                if c < du {
                    let x = v[vr + c];
                    for (var hc = 0u; hc < GC; hc++) {
                        acc[hc * UPT + r] += s_part[hc * PL + t] * x;
                    }
                }
            }
        }
    }
    // UPT > 1 only when du > WG: then there is one share and nothing to sum
    for (var hc = 0u; hc < GC; hc++) {
        red_v[hc * WG + lid] = acc[hc * UPT];
    }
    workgroupBarrier();
    if share != 0u {
        return;
    }
    for (var hc = 0u; hc < nh; hc++) {
        let h = h0 + hc;
        let l = stat[2u * hc + 1u];
        for (var r = 0u; r < UPT; r++) {
            let c = unit + r * cw;
            if c >= du {
                continue;
            }
            var o = acc[hc * UPT + r];
            for (var sh = 1u; sh < shares; sh++) {
                o += red_v[hc * WG + sh * cw + unit];
            }
            if direct() {
                // One partition and no weights asked: the partial is the answer (combine is
                // skipped; its arithmetic would give the same bits: exp(0) = 1 and den = l).
                var y = V(0.0);
                if l > 0.0 {
                    y = o / l;
                }
                store_out(h * d + c * LANES, y);
            } else {
                store_part((h * parts() + p) * (d + 2u) + 2u + c * LANES, o);
            }
        }
        if !direct() && unit == 0u {
            let base = (h * parts() + p) * (d + 2u);
            part[base] = stat[2u * hc];
            part[base + 1u] = l;
        }
    }
}

fn store_out(at: u32, y: V) {
    for (var i = 0u; i < LANES; i++) {
        out[at + i] = lane(y, i);
    }
}

fn store_part(at: u32, y: V) {
    for (var i = 0u; i < LANES; i++) {
        part[at + i] = lane(y, i);
    }
}

fn lane(y: V, i: u32) -> f32 { return {{ lane }}; }

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
