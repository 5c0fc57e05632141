// Projections over weights kept in their quantized blocks (GGUF Q8_0, Q4_0, Q4_1, Q4_K, Q5_K,
// Q6_K) or as 16-bit floats (F16, BF16), dequantized in registers: the file's bytes are the
// device's bytes (a 4-byte block header instead of the file's 2 or 4, Q6_K padded from 210
// to 224 bytes), never an f32 copy.
//
// Layout of `w` (u32 words read as vec4<u32> quads; crates/kvslice-kernels/src/quant.rs
// packs it at load): the weight is `w_rows` rows (output features) of `nb` blocks of 32
// values (input features). Each block's VW value words are stored in Q = ⌈VW/4⌉ quads,
// block-column-major so that adjacent rows' quads are adjacent: quad j of block `blk` of row
// `r` is quad (blk · Q + j) · w_rows + r. VW = 8 words per Q8_0 block (four signed bytes
// each, value 4i + j in byte j of word i), 4 per Q4 and Q5 block (word i holds values 4i + j
// in the low nibble of its byte j and 16 + 4i + j in the high nibble), 16 per F16/BF16 block
// (values 2i and 2i + 1 in the low and high halves of word i). Then, from word `meta_at`, the
// H header words of each block at meta_at + (blk · w_rows + r) · H (none for F16/BF16): the
// f16 scale d in the low half and, for Q4_1 and Q5_1, the f16 minimum m in the high half; for
// Q5_0 and Q5_1 a second word with value j's fifth bit in bit j. Value = d·q (Q8_0),
// d·(q − 8) (Q4_0), d·(q − 16) (Q5_0), d·q + m (Q4_1, Q5_1), the 16-bit float itself (F16,
// BF16). The K-quants' blocks are super-blocks of 256 values stored whole, VW = 36 (Q4_K), 44
// (Q5_K) or 53 (Q6_K, its last quad padded) words holding the file's bytes in order (byte
// 4i + j in byte j of word i), no separate headers; their definitions are in
// crates/kvslice-kernels/src/cpu.rs (`k_terms`).
//
// The module is compiled once per format (`KIND`, a template constant): every branch on the
// format folds away. `prm.kind` holds the same code.
//
// `project` — one row x through the weight, with project.wgsl's prologue and epilogues:
//   y_r = epilogue(Σ_k prologue(x)_k · W_rk + b_r); RMSNorm prologue (bit 1), bias (bit 0),
//   residual (bit 2), SwiGLU (bit 3: rows r and r + up_at are gate and up, y = silu(g)·u).
//   Each invocation computes ROWS adjacent output rows over every block, loading each block's
//   32 inputs once for all of them: ROWS = 1 on GPUs, where adjacent invocations read adjacent
//   quads (coalesced) and the same x (a broadcast), as project.wgsl does for f32 columns; more
//   on CPU adapters, where llvmpipe turns every load inside a loop into a loop over the SIMD
//   lanes, so that the inputs' loads, once per row, cost more than the weights'.
// `dequant` — rows of the weight as f32: output row i is weight row ids[i] (bit 4 clear) or
//   row i (bit 4 set: every row); bit 5 writes the transpose ([d_in, rows], a matmul's weight,
//   adjacent invocations taking adjacent rows). One invocation per output value, over a 2-D
//   grid of workgroups (`groups_x` wide).
//
// Rust wrapper and semantics: crates/kvslice-kernels/src/quant.rs.

struct Params {
    d_in: u32,
    // output rows computed (project) or written (dequant)
    rows: u32,
    // blocks per weight row
    nb: u32,
    // 0: Q8_0, 1: Q4_0, 2: Q4_1, 3: F16, 4: BF16, 5: Q4_K, 6: Q5_K, 7: Q6_K, 8: Q5_0, 9: Q5_1
    kind: u32,
    // bit 0: bias, 1: RMSNorm, 2: residual, 3: SwiGLU, 4: every row, 5: transpose
    flags: u32,
    // first word of the block headers
    meta_at: u32,
    // SwiGLU: row offset of the up half
    up_at: u32,
    // rows of the weight (the stride of its block-column-major layout)
    w_rows: u32,
    // workgroups along x (dequant's 2-D grid)
    groups_x: u32,
    // project: the output row (and bias and residual entry) of weight row 0 (a part of a
    // stacked matrix; 0 with SwiGLU)
    row_at: u32,
    // RMSNorm ε
    eps: f32,
    // dequant: the weight rows to write
    ids: array<u32>,
}

@group(0) @binding(0) var<storage, read_write> prm: Params;
// [d_in] as quads (d_in is a multiple of 32)
@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> gain: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> res: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const WG: u32 = {{ wg }}u;
// 0: Q8_0, 1: Q4_0, 2: Q4_1, 3: F16, 4: BF16, 5: Q4_K, 6: Q5_K, 7: Q6_K, 8: Q5_0, 9: Q5_1
const KIND: u32 = {{ kind }}u;
// Output rows per invocation of `project` (adjacent rows).
const ROWS: u32 = {{ rows }}u;

var<workgroup> partial: array<f32, WG>;

fn has(bit: u32) -> bool { return (prm.flags & bit) != 0u; }

// F16 or BF16 values.
fn is_16bit() -> bool { return KIND == 3u || KIND == 4u; }

// A K-quant's 256-value super-blocks.
fn is_k() -> bool { return KIND >= 5u && KIND <= 7u; }

// Quads of value words per block.
fn block_quads() -> u32 {
    switch KIND {
        case 0u: { return 2u; }
        case 1u, 2u, 8u, 9u: { return 1u; }
        case 5u: { return 9u; }
        case 6u: { return 11u; }
        case 7u: { return 14u; }
        default: { return 4u; }
    }
}

// Header words per block.
fn header_words() -> u32 {
    return select(1u, 2u, KIND >= 8u);
}

// The 16-bit float in the low (hi = false) or high half of `word`, as f32.
fn float16(word: u32, hi: bool) -> f32 {
    let bits = select(word & 65535u, word >> 16u, hi);
    if KIND == 4u {
        return bitcast<f32>(bits << 16u);
    }
    return half(bits);
}

// An f16 bit pattern (low 16 bits) as f32, exactly; infinities and NaNs were refused at
// upload. Decoded by hand: unpack2x16float needs a capability not every backend has.
fn half(bits: u32) -> f32 {
    let e = (bits >> 10u) & 31u;
    let m = bits & 1023u;
    var v: f32;
    if e == 0u {
        // subnormal: m · 2⁻²⁴
        v = f32(m) * 5.9604645e-8;
    } else {
        v = bitcast<f32>(((e + 112u) << 23u) | (m << 13u));
    }
    return select(v, -v, (bits & 32768u) != 0u);
}

// (d, m) of block `blk` of row `row`; Q4_0's offset of 8 folds into m = −8·d, Q5_0's of 16
// into m = −16·d.
fn header(row: u32, blk: u32) -> vec2<f32> {
    let word = any_word(prm.meta_at + (blk * prm.w_rows + row) * header_words());
    let h = vec2<f32>(half(word & 65535u), half(word >> 16u));
    if KIND == 0u {
        return vec2<f32>(h.x, 0.0);
    }
    if KIND == 1u {
        return vec2<f32>(h.x, -8.0 * h.x);
    }
    if KIND == 8u {
        return vec2<f32>(h.x, -16.0 * h.x);
    }
    return h;
}

// The fifth bits of a Q5 block (bit j: value j).
fn fifth_bits(row: u32, blk: u32) -> u32 {
    return any_word(prm.meta_at + (blk * prm.w_rows + row) * 2u + 1u);
}

// Word `i` of `w`.
fn any_word(i: u32) -> u32 {
    return w[i / 4u][i % 4u];
}

// Quad `j` of the value words of block `blk` of row `row`.
fn value_quad(row: u32, blk: u32, j: u32) -> vec4<u32> {
    return w[(blk * block_quads() + j) * prm.w_rows + row];
}

// Word `i` of the value words of block `blk` of row `row`.
fn value_word(row: u32, blk: u32, i: u32) -> u32 {
    return value_quad(row, blk, i / 4u)[i % 4u];
}

fn q8(word: u32) -> vec4<f32> {
    return vec4<f32>(
        f32(bitcast<i32>(word << 24u) >> 24u),
        f32(bitcast<i32>(word << 16u) >> 24u),
        f32(bitcast<i32>(word << 8u) >> 24u),
        f32(bitcast<i32>(word) >> 24u),
    );
}

fn lo4(word: u32) -> vec4<f32> {
    return vec4<f32>(f32(word & 15u), f32((word >> 8u) & 15u), f32((word >> 16u) & 15u), f32((word >> 24u) & 15u));
}

fn hi4(word: u32) -> vec4<f32> {
    return vec4<f32>(
        f32((word >> 4u) & 15u),
        f32((word >> 12u) & 15u),
        f32((word >> 20u) & 15u),
        f32((word >> 28u) & 15u),
    );
}

// Bits s..s+3 of `word`, one a lane.
fn bits4(word: u32, s: u32) -> vec4<f32> {
    let v = word >> s;
    return vec4<f32>(f32(v & 1u), f32((v >> 1u) & 1u), f32((v >> 2u) & 1u), f32((v >> 3u) & 1u));
}

// Bit `b` (0..7) of each byte of `word`.
fn bit1(word: u32, b: u32) -> vec4<f32> {
    let v = word >> b;
    return vec4<f32>(f32(v & 1u), f32((v >> 8u) & 1u), f32((v >> 16u) & 1u), f32((v >> 24u) & 1u));
}

// Bits b..b+1 of each byte of `word`.
fn bit2(word: u32, b: u32) -> vec4<f32> {
    let v = word >> b;
    return vec4<f32>(f32(v & 3u), f32((v >> 8u) & 3u), f32((v >> 16u) & 3u), f32((v >> 24u) & 3u));
}

// Byte `j` of the 12 scale bytes of a Q4_K/Q5_K super-block (words 1..3).
fn kbyte(s: vec3<u32>, j: u32) -> u32 {
    return (s[j / 4u] >> (8u * (j % 4u))) & 255u;
}

// (d·sc_j, dmin·m_j) of sub-block j (0..7) of a Q4_K/Q5_K super-block: 6-bit scale and
// minimum, the high two bits of sub-blocks 4..7 in the top bits of bytes 0..7.
fn kscale(dm: vec2<f32>, s: vec3<u32>, j: u32) -> vec2<f32> {
    var sc: u32;
    var m: u32;
    if j < 4u {
        sc = kbyte(s, j) & 63u;
        m = kbyte(s, j + 4u) & 63u;
    } else {
        sc = (kbyte(s, j + 4u) & 15u) | ((kbyte(s, j - 4u) >> 6u) << 4u);
        m = (kbyte(s, j + 4u) >> 4u) | ((kbyte(s, j) >> 6u) << 4u);
    }
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}

// Signed scale j (0..15) of a Q6_K super-block (words 48..51).
fn k6scale(row: u32, blk: u32, j: u32) -> f32 {
    let word = value_word(row, blk, 48u + j / 4u);
    return f32(bitcast<i32>(word << (24u - 8u * (j % 4u))) >> 24u);
}

// The header of a Q4_K/Q5_K super-block: (d, dmin) and the scale words.
fn kheader(row: u32, blk: u32) -> vec2<f32> {
    let word = value_word(row, blk, 0u);
    return vec2<f32>(half(word & 65535u), half(word >> 16u));
}

fn kscales(row: u32, blk: u32) -> vec3<u32> {
    return vec3<u32>(value_word(row, blk, 1u), value_word(row, blk, 2u), value_word(row, blk, 3u));
}

// prologue(x) at k..k+3 (the norm's gain applied; its 1/rms is applied once, to the sum).
fn xin(k: u32, norm: bool) -> vec4<f32> {
    let v = x[k / 4u];
    if norm {
        return v * gain[k / 4u];
    }
    return v;
}

// Σ_j xin_j · value_j over K-quant super-block `blk` of weight row `row`.
fn kblock_dot(row: u32, blk: u32, norm: bool) -> f32 {
    let k0 = blk * 256u;
    let one = vec4<f32>(1.0);
    var acc = 0.0;
    if KIND == 7u {
        // Q6_K: two halves of 128 values; in each, word i of the 32 low-nibble bytes gives
        // values 4i.. (low nibbles) and 64 + 4i.. (high), word i of the next 32 values 32 + 4i..
        // and 96 + 4i.., their high bits in word i of the half's 32 qh bytes.
        for (var n = 0u; n < 2u; n++) {
            for (var i = 0u; i < 8u; i++) {
                let wa = value_word(row, blk, 16u * n + i);
                let wb = value_word(row, blk, 16u * n + 8u + i);
                let wh = value_word(row, blk, 32u + 8u * n + i);
                let base = k0 + 128u * n + 4u * i;
                let sj = 8u * n + i / 4u;
                let off = vec4<f32>(32.0);
                acc += k6scale(row, blk, sj) * dot(xin(base, norm), lo4(wa) + 16.0 * bit2(wh, 0u) - off);
                acc += k6scale(row, blk, sj + 2u) * dot(xin(base + 32u, norm), lo4(wb) + 16.0 * bit2(wh, 2u) - off);
                acc += k6scale(row, blk, sj + 4u) * dot(xin(base + 64u, norm), hi4(wa) + 16.0 * bit2(wh, 4u) - off);
                acc += k6scale(row, blk, sj + 6u) * dot(xin(base + 96u, norm), hi4(wb) + 16.0 * bit2(wh, 6u) - off);
            }
        }
        return half(value_word(row, blk, 52u) & 65535u) * acc;
    }
    // Q4_K / Q5_K: four chunks of 64 values, word i of a chunk's 32 nibble bytes giving
    // values 4i.. (low nibbles, sub-block 2c) and 32 + 4i.. (high, sub-block 2c + 1).
    let dm = kheader(row, blk);
    let sw = kscales(row, blk);
    let q5 = KIND == 6u;
    let qs_at = select(4u, 12u, q5);
    for (var c = 0u; c < 4u; c++) {
        var dl = vec4<f32>(0.0);
        var dh = vec4<f32>(0.0);
        var sl = vec4<f32>(0.0);
        var sh = vec4<f32>(0.0);
        for (var i = 0u; i < 8u; i++) {
            let word = value_word(row, blk, qs_at + 8u * c + i);
            let xl = xin(k0 + 64u * c + 4u * i, norm);
            let xh = xin(k0 + 64u * c + 32u + 4u * i, norm);
            var ql = lo4(word);
            var qh = hi4(word);
            if q5 {
                let hw = value_word(row, blk, 4u + i);
                ql += 16.0 * bit1(hw, 2u * c);
                qh += 16.0 * bit1(hw, 2u * c + 1u);
            }
            dl += xl * ql;
            dh += xh * qh;
            sl += xl;
            sh += xh;
        }
        let a = kscale(dm, sw, 2u * c);
        let b = kscale(dm, sw, 2u * c + 1u);
        acc += a.x * dot(dl, one) - a.y * dot(sl, one) + b.x * dot(dh, one) - b.y * dot(sh, one);
    }
    return acc;
}

// The 32 inputs of block `blk` (after the RMSNorm gain when `norm`), as eight quads: quad i
// holds inputs 4i..4i+3.
fn block_x(blk: u32, norm: bool) -> array<vec4<f32>, 8> {
    var xs: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        xs[i] = xin(blk * 32u + 4u * i, norm);
    }
    return xs;
}

// Σ_j x_j · value_j over 32-value block `blk` of weight row `row`, its inputs `xs`
// (block_x) and their sum `xsum` given: one row's share of work, the inputs loaded once for
// every row an invocation computes.
fn block_dot(row: u32, blk: u32, xs: array<vec4<f32>, 8>, xsum: f32) -> f32 {
    var dq = vec4<f32>(0.0);
    if is_16bit() {
        for (var j = 0u; j < 4u; j++) {
            let q = value_quad(row, blk, j);
            for (var i = 0u; i < 4u; i += 2u) {
                let wv = vec4<f32>(float16(q[i], false), float16(q[i], true), float16(q[i + 1u], false), float16(q[i + 1u], true));
                dq += xs[2u * j + i / 2u] * wv;
            }
        }
        return dot(dq, vec4<f32>(1.0));
    }
    let hd = header(row, blk);
    if KIND == 0u {
        for (var j = 0u; j < 2u; j++) {
            let q = value_quad(row, blk, j);
            for (var i = 0u; i < 4u; i++) {
                dq += xs[4u * j + i] * q8(q[i]);
            }
        }
    } else {
        // Q4 and Q5: one quad of nibbles; Q5's fifth bits from its second header word
        let q5 = KIND >= 8u;
        var qh = 0u;
        if q5 {
            qh = fifth_bits(row, blk);
        }
        let q = value_quad(row, blk, 0u);
        for (var i = 0u; i < 4u; i++) {
            var lo = lo4(q[i]);
            var hi = hi4(q[i]);
            if q5 {
                lo += 16.0 * bits4(qh, 4u * i);
                hi += 16.0 * bits4(qh, 16u + 4u * i);
            }
            dq += xs[i] * lo + xs[4u + i] * hi;
        }
    }
    return hd.x * dot(dq, vec4<f32>(1.0)) + hd.y * xsum;
}

// 1/√(mean(x²) + ε) over the row, reduced across the workgroup (every invocation gets it).
fn inv_rms(lid: u32) -> f32 {
    let din = prm.d_in;
    var s = 0.0;
    for (var k = lid; k < din / 4u; k += WG) {
        let v = x[k];
        s += dot(v, v);
    }
    partial[lid] = s;
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG; i++) {
        total += partial[i];
    }
    return 1.0 / sqrt(total / f32(din) + prm.eps);
}

@compute @workgroup_size(WG)
fn {{ entry_project }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    // Every invocation takes part in the reduction (it holds barriers), normed or not.
    let inv = inv_rms(lid);
    // Rows first..first + ROWS - 1; past the last row an invocation reads the last row again
    // and stores nothing (no early exit: every invocation runs the same loop).
    let first = ((wid.y * prm.groups_x + wid.x) * WG + lid) * ROWS;
    let last = prm.rows - 1u;
    let norm = has(2u);
    let glu = has(8u);
    var acc: array<f32, ROWS>;
    var up: array<f32, ROWS>;
    for (var blk = 0u; blk < prm.nb; blk++) {
        if is_k() {
            for (var r = 0u; r < ROWS; r++) {
                let row = min(first + r, last);
                acc[r] += kblock_dot(row, blk, norm);
                if glu {
                    up[r] += kblock_dot(row + prm.up_at, blk, norm);
                }
            }
        } else {
            let xs = block_x(blk, norm);
            let xsum = dot(xs[0] + xs[1] + xs[2] + xs[3] + xs[4] + xs[5] + xs[6] + xs[7], vec4<f32>(1.0));
            for (var r = 0u; r < ROWS; r++) {
                let row = min(first + r, last);
                acc[r] += block_dot(row, blk, xs, xsum);
                if glu {
                    up[r] += block_dot(row + prm.up_at, blk, xs, xsum);
                }
            }
        }
    }
    let scale = select(1.0, inv, norm);
    for (var r = 0u; r < ROWS; r++) {
        let row = first + r;
        if row > last {
            break;
        }
        if glu {
            var g = acc[r] * scale;
            var u = up[r] * scale;
            if has(1u) {
                g += bias[row];
                u += bias[row + prm.up_at];
            }
            var gated = g / (1.0 + exp(-g)) * u;
            if has(4u) {
                gated += res[row];
            }
            y[row] = gated;
        } else {
            let at = prm.row_at + row;
            var out = acc[r] * scale;
            if has(1u) {
                out += bias[at];
            }
            if has(4u) {
                out += res[at];
            }
            y[at] = out;
        }
    }
}

// Value k of K-quant weight row `row`.
fn kvalue(row: u32, k: u32) -> f32 {
    let blk = k / 256u;
    let j = k % 256u;
    if KIND == 7u {
        let n = j / 128u;
        let p = (j % 128u) / 32u;
        let l = j % 32u;
        let byte = 64u * n + l + 32u * (p % 2u);
        let lw = value_word(row, blk, byte / 4u) >> (8u * (byte % 4u) + select(0u, 4u, p >= 2u));
        let hb = 32u * n + l;
        let hw = value_word(row, blk, 32u + hb / 4u) >> (8u * (hb % 4u) + 2u * p);
        let q = f32((lw & 15u) | ((hw & 3u) << 4u)) - 32.0;
        let d = half(value_word(row, blk, 52u) & 65535u);
        return d * k6scale(row, blk, 8u * n + l / 16u + 2u * p) * q;
    }
    let c = j / 64u;
    let hi = (j % 64u) / 32u;
    let l = j % 32u;
    let q5 = KIND == 6u;
    let qs_at = select(4u, 12u, q5);
    var q = (value_word(row, blk, qs_at + 8u * c + l / 4u) >> (8u * (l % 4u) + 4u * hi)) & 15u;
    if q5 {
        q += 16u * ((value_word(row, blk, 4u + l / 4u) >> (8u * (l % 4u) + 2u * c + hi)) & 1u);
    }
    let sm = kscale(kheader(row, blk), kscales(row, blk), 2u * c + hi);
    return sm.x * f32(q) - sm.y;
}

@compute @workgroup_size(WG)
fn {{ entry_dequant }}(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    _ = touch_bindings();
    let e = (wid.y * prm.groups_x + wid.x) * WG + lid;
    let din = prm.d_in;
    let n = prm.rows;
    if e >= n * din {
        return;
    }
    // output [n, d_in] (e = i · d_in + k) or its transpose [d_in, n] (e = k · n + i)
    var i = e / din;
    var k = e % din;
    if has(32u) {
        i = e % n;
        k = e / n;
    }
    let row = select(prm.ids[i], i, has(16u));
    if is_k() {
        y[e] = kvalue(row, k);
        return;
    }
    let blk = k / 32u;
    let j = k % 32u;
    if is_16bit() {
        y[e] = float16(value_word(row, blk, j / 2u), j % 2u == 1u);
        return;
    }
    let hd = header(row, blk);
    var q: f32;
    if KIND == 0u {
        let word = value_word(row, blk, j / 4u);
        q = f32(bitcast<i32>(word << (24u - 8u * (j % 4u))) >> 24u);
    } else {
        let word = value_word(row, blk, (j % 16u) / 4u);
        let shift = 8u * (j % 4u) + select(0u, 4u, j >= 16u);
        var qi = (word >> shift) & 15u;
        if KIND >= 8u {
            qi += 16u * ((fifth_bits(row, blk) >> j) & 1u);
        }
        q = f32(qi);
    }
    y[e] = hd.x * q + hd.y;
}
