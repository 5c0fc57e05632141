// Top-k per KV head with a different k per head, protected sinks and recent positions, kept
// positions written sorted ascending.
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/topk.rs. One workgroup per KV head:
// a four-pass radix select (8 bits per pass, workgroup-atomic histograms) finds the score of
// the last kept candidate and how many candidates tied with it are needed; a final ordered pass
// writes the kept positions with two workgroup prefix sums per chunk of positions (ties go to
// the lower position because equal candidates are taken in position order).
//
// Scores are ordered by the IEEE-754 total order (the order of Rust's f32::total_cmp).
//
// Template values: {{ wg }} workgroup size (a power of two), entry point name.

// Every buffer is declared read_write, inputs included: Burn's memory pool sub-allocates small
// tensors from shared wgpu buffers, and wgpu refuses one buffer bound read-only and read-write
// in the same dispatch.

// [0] kv_heads, [1] row stride of scores, [2] row stride of out, [3] sinks, [4] recent,
// [5..8] unused, then per head h: [8 + 2h] length, [9 + 2h] k.
@group(0) @binding(0) var<storage, read_write> prm: array<u32>;
// [kv_heads, stride] scores
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
// [kv_heads, out_stride] kept positions, ascending, then 0xffffffff
@group(0) @binding(2) var<storage, read_write> kept: array<u32>;

const WG: u32 = {{ wg }}u;
const NONE: u32 = 0xffffffffu;

struct HeadParams {
    stride: u32,
    out_stride: u32,
    sinks: u32,
    recent: u32,
    len: u32,
    k: u32,
}

// Read through workgroup memory so that WebGPU's uniformity analysis (Tint) sees the values
// that control barrier-holding loops as uniform.
var<workgroup> head_shared: HeadParams;
var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> scan_a: array<u32, WG>;
var<workgroup> sel_prefix: u32;
var<workgroup> sel_need: u32;
var<workgroup> eq_before: u32;
var<workgroup> kept_before: u32;

// Monotone map from the total order of f32 to the order of u32.
fn sort_key(s: f32) -> u32 {
    let b = bitcast<u32>(s);
    if (b & 0x80000000u) != 0u {
        return ~b;
    }
    return b | 0x80000000u;
}

// Inclusive prefix sum of scan_a (Hillis–Steele); every invocation must call it.
fn inclusive_scan(lid: u32) {
    for (var off = 1u; off < WG; off *= 2u) {
        workgroupBarrier();
        var add = 0u;
        if lid >= off {
            add = scan_a[lid - off];
        }
        workgroupBarrier();
        scan_a[lid] += add;
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn {{ entry_topk }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = arrayLength(&scores) + arrayLength(&kept);
    let h = wid.x;
    if lid == 0u {
        head_shared = HeadParams(prm[1], prm[2], prm[3], prm[4], prm[8u + 2u * h], prm[9u + 2u * h]);
    }
    let hp = workgroupUniformLoad(&head_shared);
    let stride = hp.stride;
    let out_stride = hp.out_stride;
    let sinks = hp.sinks;
    let recent = hp.recent;
    let len = hp.len;
    let kq = hp.k;
    let srow = h * stride;
    let orow = h * out_stride;

    let keep_all = kq >= len;
    let protected_count = min(sinks + recent, len);
    // Candidates still to pick after the protected positions (0 when k = 0 or k ≥ len).
    var extra = 0u;
    if !keep_all && kq > protected_count {
        extra = kq - protected_count;
    }

    if lid == 0u {
        sel_prefix = NONE;
        sel_need = 0u;
        eq_before = 0u;
        kept_before = 0u;
    }

    if extra > 0u {
        var prefix = 0u;
        var need = extra;
        for (var round = 0u; round < 4u; round++) {
            let shift = 24u - 8u * round;
            // bits of the key already fixed by earlier passes
            var mask = 0u;
            if round > 0u {
                mask = 0xffffffffu << (32u - 8u * round);
            }
            for (var b = lid; b < 256u; b += WG) {
                atomicStore(&hist[b], 0u);
            }
            workgroupBarrier();
            for (var j = lid; j < len; j += WG) {
                let prot = j < sinks || j + recent >= len;
                let key = sort_key(scores[srow + j]);
                if !prot && (key & mask) == prefix {
                    atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
                }
            }
            workgroupBarrier();
            if lid == 0u {
                var above = 0u;
                var b = 255i;
                loop {
                    let c = atomicLoad(&hist[u32(b)]);
                    if above + c >= need || b == 0i {
                        break;
                    }
                    above += c;
                    b -= 1i;
                }
                sel_prefix = prefix | (u32(b) << shift);
                sel_need = need - above;
            }
            workgroupBarrier();
            prefix = sel_prefix;
            need = sel_need;
            workgroupBarrier();
        }
    }
    workgroupBarrier();
    // Key of the last kept candidate and how many candidates equal to it are kept.
    let threshold = workgroupUniformLoad(&sel_prefix);
    let need_eq = workgroupUniformLoad(&sel_need);

    for (var base = 0u; base < len; base += WG) {
        let j = base + lid;
        var gt = false;
        var eq = false;
        if j < len {
            let prot = j < sinks || j + recent >= len;
            if keep_all || (kq > 0u && prot) {
                gt = true;
            } else if extra > 0u {
                let key = sort_key(scores[srow + j]);
                gt = key > threshold;
                eq = key == threshold;
            }
        }
        // rank of this position among the tied candidates
        scan_a[lid] = select(0u, 1u, eq);
        inclusive_scan(lid);
        let eq_rank = eq_before + scan_a[lid] - select(0u, 1u, eq);
        let eq_total = scan_a[WG - 1u];
        let keep = gt || (eq && eq_rank < need_eq);
        workgroupBarrier();
        scan_a[lid] = select(0u, 1u, keep);
        inclusive_scan(lid);
        if keep {
            kept[orow + kept_before + scan_a[lid] - 1u] = j;
        }
        let keep_total = scan_a[WG - 1u];
        workgroupBarrier();
        if lid == 0u {
            eq_before += eq_total;
            kept_before += keep_total;
        }
        workgroupBarrier();
    }

    let count = workgroupUniformLoad(&kept_before);
    for (var t = count + lid; t < out_stride; t += WG) {
        kept[orow + t] = NONE;
    }
}
