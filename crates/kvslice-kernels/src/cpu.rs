//! CPU twins: the definition of every kernel in plain Rust, on row-major host slices, with f64
//! accumulation. They materialise what the kernels avoid (full softmax rows, sorted score
//! lists, a gathered copy of the cache) so that they stay obviously correct; the property
//! tests compare each kernel against its twin.

/// Window statistics on the host; every `[heads, len]` table row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostWindowStats {
    /// `[heads, len]` mean over the window queries of `a_qj`.
    pub mean: Vec<f64>,
    /// `[heads, len]` unbiased variance over the window queries (0 when `w = 1`).
    pub variance: Vec<f64>,
    /// `[heads, len]` weights of the last query.
    pub last: Vec<f64>,
    /// `[heads, len]` `mean_q a_qj · ‖v_j‖`.
    pub value_norm: Vec<f64>,
    /// `[heads, len]` `mean_q a_qj · ⟨v_j, o_q/‖o_q‖⟩`.
    pub projection: Vec<f64>,
    /// `[heads, len]` `mean_q a_qj · ‖v_j − o_q‖`.
    pub jacobian: Vec<f64>,
    /// `[heads]` mean over window queries of `−Σ_{j<len−w} a_qj ln(a_qj + 1e−10)`.
    pub entropy: Vec<f64>,
    /// `[heads]` `Σ_{j<len−w} variance_j`.
    pub column_variance: Vec<f64>,
}

/// Twin of [`crate::window_stats`].
///
/// `q`: `[heads, w, d]`; `k`, `v`: `[kv_heads, cap, d]` of which the first `len` rows of each
/// head are used; query `i` sits at position `len − w + i` and sees keys `0..=len − w + i`;
/// scale `1/√d`.
#[allow(clippy::too_many_arguments)]
pub fn window_stats(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    kv_heads: usize,
    w: usize,
    cap: usize,
    len: usize,
    d: usize,
) -> HostWindowStats {
    let g = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let hn = heads * len;
    let mut out = HostWindowStats {
        mean: vec![0.0; hn],
        variance: vec![0.0; hn],
        last: vec![0.0; hn],
        value_norm: vec![0.0; hn],
        projection: vec![0.0; hn],
        jacobian: vec![0.0; hn],
        entropy: vec![0.0; heads],
        column_variance: vec![0.0; heads],
    };
    let row = |t: &[f32], kh: usize, j: usize| -> Vec<f64> {
        t[(kh * cap + j) * d..(kh * cap + j + 1) * d].iter().map(|&x| f64::from(x)).collect()
    };
    for h in 0..heads {
        let kh = h / g;
        let keys: Vec<Vec<f64>> = (0..len).map(|j| row(k, kh, j)).collect();
        let vals: Vec<Vec<f64>> = (0..len).map(|j| row(v, kh, j)).collect();
        // a[i][j], zero where masked
        let mut a = vec![vec![0.0f64; len]; w];
        let mut dir = vec![vec![0.0f64; d]; w];
        let mut outs = vec![vec![0.0f64; d]; w];
        for i in 0..w {
            let qi: Vec<f64> = q[(h * w + i) * d..(h * w + i + 1) * d].iter().map(|&x| f64::from(x)).collect();
            let visible = len - w + i + 1;
            let s: Vec<f64> = (0..visible).map(|j| dot(&qi, &keys[j]) * scale).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for j in 0..visible {
                a[i][j] = (s[j] - m).exp() / z;
            }
            let mut o = vec![0.0; d];
            for j in 0..visible {
                for c in 0..d {
                    o[c] += a[i][j] * vals[j][c];
                }
            }
            let norm = dot(&o, &o).sqrt();
            if norm > 0.0 {
                dir[i] = o.iter().map(|x| x / norm).collect();
            }
            outs[i] = o;
        }
        let prefix = len - w;
        for j in 0..len {
            let col: Vec<f64> = (0..w).map(|i| a[i][j]).collect();
            let mean = col.iter().sum::<f64>() / w as f64;
            let var =
                if w > 1 { col.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (w - 1) as f64 } else { 0.0 };
            let vnorm = dot(&vals[j], &vals[j]).sqrt();
            let proj = (0..w).map(|i| a[i][j] * dot(&vals[j], &dir[i])).sum::<f64>() / w as f64;
            let idx = h * len + j;
            out.mean[idx] = mean;
            out.variance[idx] = var;
            out.last[idx] = col[w - 1];
            out.value_norm[idx] = mean * vnorm;
            out.projection[idx] = proj;
            out.jacobian[idx] = (0..w)
                .map(|i| {
                    let dist = vals[j].iter().zip(&outs[i]).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
                    a[i][j] * dist
                })
                .sum::<f64>()
                / w as f64;
            if j < prefix {
                out.column_variance[h] += var;
                out.entropy[h] -= col.iter().map(|&x| x * (x + 1e-10).ln()).sum::<f64>();
            }
        }
        out.entropy[h] /= w as f64;
    }
    out
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Twin of [`crate::compact_in_place_host`] for one head: `rows` is `[cap, width]` (width = head_dim
/// for K/V, 1 for positions); returns the head after slot `t` received row `kept[t]`, the slots
/// past `kept.len()` unchanged.
pub fn compact<T: Copy>(rows: &[T], width: usize, kept: &[u32]) -> Vec<T> {
    let mut out = rows.to_vec();
    for (t, &src) in kept.iter().enumerate() {
        let src = src as usize;
        out[t * width..(t + 1) * width].copy_from_slice(&rows[src * width..(src + 1) * width]);
    }
    out
}

/// Twin of [`crate::decode_attention`]: `q` `[heads, d]`, `k`/`v` `[kv_heads, cap, d]`, head
/// `kh` holding `lens[kh]` slots. Returns the output `[heads, d]` and the per-slot weights
/// `[kv_heads, cap]` averaged over each GQA group (zero past the length).
#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    kv_heads: usize,
    cap: usize,
    d: usize,
    lens: &[u32],
) -> (Vec<f64>, Vec<f64>) {
    let g = heads / kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; heads * d];
    let mut weights = vec![0.0; kv_heads * cap];
    for h in 0..heads {
        let kh = h / g;
        let len = lens[kh] as usize;
        if len == 0 {
            continue;
        }
        let qh: Vec<f64> = q[h * d..(h + 1) * d].iter().map(|&x| f64::from(x)).collect();
        let s: Vec<f64> = (0..len)
            .map(|j| {
                let kr = &k[(kh * cap + j) * d..(kh * cap + j + 1) * d];
                qh.iter().zip(kr).map(|(a, &b)| a * f64::from(b)).sum::<f64>() * scale
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for j in 0..len {
            let a = (s[j] - m).exp() / z;
            weights[kh * cap + j] += a / g as f64;
            for c in 0..d {
                out[h * d + c] += a * f64::from(v[(kh * cap + j) * d + c]);
            }
        }
    }
    (out, weights)
}

// ---- Kernel 4: skinny projection ----

/// Twin of [`crate::linear`]: `y = x·W + b` with f64 accumulation.
///
/// `x`: `[n, d_in]`, `w`: `[d_in, d_out]`, `bias`: `[d_out]`, all row-major; returns
/// `[n, d_out]`.
pub fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>, n: usize, d_in: usize, d_out: usize) -> Vec<f64> {
    let mut y = vec![0.0f64; n * d_out];
    for r in 0..n {
        let row = &mut y[r * d_out..(r + 1) * d_out];
        if let Some(b) = bias {
            for (o, &bj) in row.iter_mut().zip(b) {
                *o = f64::from(bj);
            }
        }
        for k in 0..d_in {
            let xk = f64::from(x[r * d_in + k]);
            for (o, &wkj) in row.iter_mut().zip(&w[k * d_out..(k + 1) * d_out]) {
                *o += xk * f64::from(wkj);
            }
        }
    }
    y
}

// ---- Kernel 5: fused decode-step stages ----

/// RMSNorm of one row with f64 accumulation: `x_k·g_k / √(mean(x²) + ε)`.
fn rms_row(x: &[f32], g: &[f32], eps: f32) -> Vec<f64> {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let inv = 1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt();
    x.iter().zip(g).map(|(&v, &gk)| f64::from(v) * f64::from(gk) * inv).collect()
}

/// Twin of [`crate::project`] for one row: `y = epilogue(prologue(x)·W + b)`.
///
/// `x`: `[d_in]`; `w`: `[d_in, d_out]`, or `[d_in, 2·d_out]` with `swiglu` (gate columns
/// first); `bias`: one entry per weight column; `norm`: the RMSNorm weight `[d_in]` and ε;
/// `residual`: `[d_out]`. Returns `[d_out]`.
pub fn project(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    norm: Option<(&[f32], f32)>,
    residual: Option<&[f32]>,
    swiglu: bool,
    d_out: usize,
) -> Vec<f64> {
    let d_in = x.len();
    let cols = if swiglu { 2 * d_out } else { d_out };
    let xin: Vec<f64> = match norm {
        Some((g, eps)) => rms_row(x, g, eps),
        None => x.iter().map(|&v| f64::from(v)).collect(),
    };
    let mut z: Vec<f64> = match bias {
        Some(b) => b.iter().map(|&v| f64::from(v)).collect(),
        None => vec![0.0; cols],
    };
    for k in 0..d_in {
        for (o, &wkj) in z.iter_mut().zip(&w[k * cols..(k + 1) * cols]) {
            *o += xin[k] * f64::from(wkj);
        }
    }
    let mut y: Vec<f64> =
        if swiglu { (0..d_out).map(|j| z[j] / (1.0 + (-z[j]).exp()) * z[j + d_out]).collect() } else { z };
    if let Some(r) = residual {
        for (o, &rj) in y.iter_mut().zip(r) {
            *o += f64::from(rj);
        }
    }
    y
}

/// The outputs of [`rope_split`], f64, row-major: `q` and `q_raw` `[heads, d]`, `k` and `v`
/// `[kv_heads, d]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostQkv {
    pub q: Vec<f64>,
    pub q_raw: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
}

/// Twin of [`crate::rope_split`]: splits `q | k | v` (`[(heads + 2·kv_heads)·d]`) and rotates
/// `q` and `k` by `cos`, `sin` (`[d / 2]`) in the `rotate_half` layout.
pub fn rope_split(qkv: &[f32], cos: &[f32], sin: &[f32], heads: usize, kv_heads: usize, d: usize) -> HostQkv {
    let half = d / 2;
    let rotate = |row: &[f32]| -> Vec<f64> {
        let mut out = vec![0.0f64; row.len()];
        for (head, o) in row.chunks(d).zip(out.chunks_mut(d)) {
            for i in 0..half {
                let (a, b) = (f64::from(head[i]), f64::from(head[i + half]));
                let (c, s) = (f64::from(cos[i]), f64::from(sin[i]));
                o[i] = a * c - b * s;
                o[i + half] = b * c + a * s;
            }
        }
        out
    };
    let (nq, nk) = (heads * d, kv_heads * d);
    let wide = |s: &[f32]| s.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    HostQkv {
        q: rotate(&qkv[..nq]),
        q_raw: wide(&qkv[..nq]),
        k: rotate(&qkv[nq..nq + nk]),
        v: wide(&qkv[nq + nk..nq + 2 * nk]),
    }
}

/// Twin of [`crate::rms_norm`]: `x` `[rows, g.len()]` → same shape.
pub fn rms_norm(x: &[f32], g: &[f32], eps: f32) -> Vec<f64> {
    x.chunks(g.len()).flat_map(|row| rms_row(row, g, eps)).collect()
}

// ---- Kernel 6: projections over quantized blocks ----

/// An IEEE binary16 bit pattern as f64 (subnormals included; infinities and NaN as such).
pub fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        0x1f if frac == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Twin of [`crate::dequantize`] with every row, not transposed: the `[rows, cols]` matrix of
/// GGUF blocks `bytes` (row after row) as f64, from the block layouts' definitions: Q8_0 is
/// `d: f16, q: [i8; 32]` with `x = d·q`; Q4_0 is `d: f16, qs: [u8; 16]` with
/// `x_j = d·((qs_j & 15) − 8)` and `x_{j+16} = d·((qs_j >> 4) − 8)`; Q4_1 is
/// `d: f16, m: f16, qs: [u8; 16]` with `x_j = d·(qs_j & 15) + m`, `x_{j+16} = d·(qs_j >> 4) + m`;
/// Q5_0 and Q5_1 are Q4_0 and Q4_1 with `qh: u32` before `qs`, bit `j` of it adding 16 to
/// value `j`'s nibble, and Q5_0's offset 16 instead of 8; F16 and BF16 are the values themselves (a bfloat16 is the top half of an f32); the
/// K-quants as [`k_terms`] gives them.
///
/// # Panics
/// When `bytes` is not `rows · cols / V` whole blocks.
pub fn dequantize(format: crate::QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Vec<f64> {
    use crate::QuantFormat::{BF16, F16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0};
    let bb = format.block_bytes();
    assert_eq!(bytes.len(), rows * cols / format.values() * bb, "whole blocks");
    let halves = bytes.chunks_exact(2).map(|h| u16::from_le_bytes([h[0], h[1]]));
    match format {
        F16 => return halves.map(f16_to_f64).collect(),
        BF16 => return halves.map(|h| f64::from(f32::from_bits(u32::from(h) << 16))).collect(),
        Q4_K | Q5_K | Q6_K => return k_terms(format, bytes).into_iter().map(|(a, m)| a - m).collect(),
        _ => {}
    }
    let mut out = Vec::with_capacity(rows * cols);
    for block in bytes.chunks_exact(bb) {
        let d = f16_to_f64(u16::from_le_bytes([block[0], block[1]]));
        match format {
            Q8_0 => out.extend(block[2..].iter().map(|&q| d * f64::from(q as i8))),
            Q4_0 | Q4_1 => {
                let (m, qs) = match format {
                    Q4_1 => (f16_to_f64(u16::from_le_bytes([block[2], block[3]])), &block[4..]),
                    _ => (-8.0 * d, &block[2..]),
                };
                out.extend(qs.iter().map(|&q| d * f64::from(q & 15) + m));
                out.extend(qs.iter().map(|&q| d * f64::from(q >> 4) + m));
            }
            Q5_0 | Q5_1 => {
                let (m, at) = match format {
                    Q5_1 => (f16_to_f64(u16::from_le_bytes([block[2], block[3]])), 4),
                    _ => (-16.0 * d, 2),
                };
                let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
                let qs = &block[at + 4..];
                for j in 0..32 {
                    let nibble = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
                    let q = u32::from(nibble) + 16 * ((qh >> j) & 1);
                    out.push(d * f64::from(q) + m);
                }
            }
            F16 | BF16 | Q4_K | Q5_K | Q6_K => unreachable!("returned above"),
        }
    }
    out
}

/// The two terms of every value of K-quant super-blocks, `x = a − m`, from ggml's
/// definitions (256 values a block, in order):
/// - Q4_K `{d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}`: value `64c + l` (`l < 32`)
///   is `d·sc_{2c}·(qs[32c + l] & 15) − dmin·m_{2c}`, value `64c + 32 + l` the same with the
///   high nibble and sub-block `2c + 1`; `(sc_j, m_j)` are 6-bit: for `j < 4` the low 6 bits
///   of `scales[j]` and `scales[j + 4]`, else `scales[j + 4] & 15 | (scales[j − 4] >> 6) << 4`
///   and `scales[j + 4] >> 4 | (scales[j] >> 6) << 4`;
/// - Q5_K `{d, dmin, scales, qh: [u8; 32], qs: [u8; 128]}`: Q4_K's values plus 16 where bit
///   `2c` (low nibbles) or `2c + 1` (high nibbles) of `qh[l]` is set;
/// - Q6_K `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}`: in each half `n` of 128
///   values, value `128n + 32p + l` (`p < 4`, `l < 32`) is `d·scales[8n + l/16 + 2p]·(q − 32)`
///   with `q` = the low (`p < 2`) or high nibble of `ql[64n + l + 32(p mod 2)]`, plus
///   `((qh[32n + l] >> 2p) & 3) << 4`; `m = 0`.
pub fn k_terms(format: crate::QuantFormat, bytes: &[u8]) -> Vec<(f64, f64)> {
    use crate::QuantFormat::{Q4_K, Q5_K, Q6_K};
    let half = |b: &[u8], at: usize| f16_to_f64(u16::from_le_bytes([b[at], b[at + 1]]));
    let mut out = Vec::with_capacity(bytes.len() / format.block_bytes() * 256);
    for b in bytes.chunks_exact(format.block_bytes()) {
        match format {
            Q4_K | Q5_K => {
                let (d, dmin, sc) = (half(b, 0), half(b, 2), &b[4..16]);
                let scale_min = |j: usize| -> (f64, f64) {
                    let (s, m) = if j < 4 {
                        (sc[j] & 63, sc[j + 4] & 63)
                    } else {
                        ((sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
                    };
                    (f64::from(s), f64::from(m))
                };
                let (qh, qs) = if format == Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
                for c in 0..4 {
                    for hi in 0..2 {
                        let (s, m) = scale_min(2 * c + hi);
                        for l in 0..32 {
                            let byte = qs[32 * c + l];
                            let mut q = if hi == 0 { byte & 15 } else { byte >> 4 };
                            if let Some(qh) = qh {
                                q += 16 * ((qh[l] >> (2 * c + hi)) & 1);
                            }
                            out.push((d * s * f64::from(q), dmin * m));
                        }
                    }
                }
            }
            Q6_K => {
                let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], half(b, 208));
                for n in 0..2 {
                    for p in 0..4 {
                        for l in 0..32 {
                            let byte = ql[64 * n + l + 32 * (p % 2)];
                            let low = if p < 2 { byte & 15 } else { byte >> 4 };
                            let q = i32::from(low | (((qh[32 * n + l] >> (2 * p)) & 3) << 4)) - 32;
                            let s = f64::from(sc[8 * n + l / 16 + 2 * p] as i8);
                            out.push((d * s * f64::from(q), 0.0));
                        }
                    }
                }
            }
            _ => panic!("{format:?} is not a K-quant"),
        }
    }
    out
}
