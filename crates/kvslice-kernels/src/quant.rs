//! Weights kept in their quantized blocks on the device (`shaders/qproject.wgsl`).
//!
//! A GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K matrix, or an F16/BF16 one, is uploaded as
//! its blocks ([`QuantMatrix::upload`]): the values' bytes unchanged, each 32-value block's
//! f16 header widened to one 4-byte word (so every load is word-aligned): 36 bytes per 32
//! values for Q8_0 (34 in the file), 20 for Q4_0 (18), 20 for Q4_1 (20), 24 for Q5_0 (22)
//! and Q5_1 (24), 64 for F16 and BF16 (64); the K-quants' 256-value super-blocks whole, 144
//! bytes for Q4_K (144), 176 for Q5_K (176), 224 for Q6_K (210, padded to whole quads). The
//! value words are stored in quads of four, block-column-major (quad `j` of block `b` of every
//! row side by side; [`pack_blocks`]), so the invocations of a workgroup, one per output row,
//! read adjacent memory, and llvmpipe loads a quad at once. [`qproject`] runs one row through
//! it with [`project`](crate::project)'s prologue and epilogues, dequantizing in registers,
//! one or several output rows per invocation ([`QuantMatrix::set_rows_per_invocation`]);
//! [`dequantize`] writes rows of it as f32 (the embedding's gather, or the transposed matrix a
//! prefill's matmul takes, one layer's at a time). The shader is compiled once per format and
//! rows per invocation, so the format's branches fold away.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use crate::error::{KernelError, Result};
use crate::fused::Fusion;
use crate::gpu::{self, Gpu, bind};
use crate::params::QProjectParams;
use crate::shader::{Family, QPROJECT_ROWS, QPROJECT_WG, qproject_variant, qproject_wg};

/// Block formats [`QuantMatrix`] takes (GGUF's layouts: 32 values per block, 256 per
/// super-block for the K-quants; F16 and BF16 as 32 values of 2 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    /// f16 `d`, 32 × i8 `q`: `x = d·q` (34 bytes).
    Q8_0,
    /// f16 `d`, 16 bytes of nibbles: `x = d·(q − 8)` (18 bytes).
    Q4_0,
    /// f16 `d`, f16 `m`, 16 bytes of nibbles: `x = d·q + m` (20 bytes).
    Q4_1,
    /// f16 `d`, 4 bytes of fifth bits `qh` (bit `j` for value `j`), 16 bytes of nibbles:
    /// `x = d·(q − 16)` (22 bytes).
    Q5_0,
    /// f16 `d`, f16 `m`, then `qh` and the nibbles as Q5_0: `x = d·q + m` (24 bytes).
    Q5_1,
    /// 32 IEEE binary16 values (64 bytes), no header.
    F16,
    /// 32 bfloat16 values (64 bytes), no header.
    BF16,
    /// 256 values in 8 sub-blocks of 32 (144 bytes): f16 `d` and `dmin`, 12 bytes of 6-bit
    /// scales and minimums `(sc_j, m_j)`, 128 bytes of nibbles; `x = d·sc_j·q − dmin·m_j`.
    Q4_K,
    /// [`QuantFormat::Q4_K`] with a fifth bit per value from 32 bytes of high bits (176 bytes).
    Q5_K,
    /// 256 values in 16 sub-blocks of 16 (210 bytes): 128 bytes of low nibbles, 64 of 2-bit
    /// high parts, 16 signed 8-bit scales, f16 `d`; `x = d·sc_j·(q − 32)`.
    Q6_K,
}

impl QuantFormat {
    /// Values per block of the 32-value formats.
    pub const VALUES: usize = 32;

    /// Values per block (256 for the K-quants' super-blocks, else 32): a row's length must be
    /// a multiple of it.
    pub fn values(self) -> usize {
        if self.is_k() { 256 } else { Self::VALUES }
    }

    fn is_k(self) -> bool {
        matches!(self, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K)
    }

    /// Bytes per block as stored in a GGUF file.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::F16 | QuantFormat::BF16 => 64,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q5_K => 176,
            QuantFormat::Q6_K => 210,
        }
    }

    /// Words of values per block on the device (a K-quant super-block whole, its header
    /// included, in the file's byte order; Q6_K's 210 bytes padded to 53 words).
    fn value_words(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 8,
            QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q5_0 | QuantFormat::Q5_1 => 4,
            QuantFormat::F16 | QuantFormat::BF16 => 16,
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => self.block_bytes().div_ceil(4),
        }
    }

    /// Groups of four value words per block on the device (the last one padded).
    fn value_quads(self) -> usize {
        self.value_words().div_ceil(4)
    }

    /// Bytes of the separate header in the file (before the values); none for the formats
    /// whose blocks are stored whole.
    fn header_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => 4,
            QuantFormat::F16 | QuantFormat::BF16 => 0,
            QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => 0,
            _ => 2,
        }
    }

    /// Header words per block on the device: the scale (and minimum) word, then for Q5_0 and
    /// Q5_1 the word of fifth bits.
    fn header_words(self) -> usize {
        match self {
            QuantFormat::Q5_0 | QuantFormat::Q5_1 => 2,
            _ => usize::from(self.header_bytes() > 0),
        }
    }

    fn kind(self) -> u32 {
        match self {
            QuantFormat::Q8_0 => 0,
            QuantFormat::Q4_0 => 1,
            QuantFormat::Q4_1 => 2,
            QuantFormat::F16 => 3,
            QuantFormat::BF16 => 4,
            QuantFormat::Q4_K => 5,
            QuantFormat::Q5_K => 6,
            QuantFormat::Q6_K => 7,
            QuantFormat::Q5_0 => 8,
            QuantFormat::Q5_1 => 9,
        }
    }
}

/// A `[rows, cols]` matrix (rows: output features; cols: input features, a multiple of the
/// format's block) in its blocks on a wgpu device: one block format, or parts in different
/// formats stacked row after row ([`QuantMatrix::stack`]: a fused q|k|v whose `v` a GGUF file
/// stores in another format than `q` and `k`).
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    rows: usize,
    cols: usize,
    parts: Vec<Part>,
    /// Output rows each invocation of [`qproject`] computes ([`QuantMatrix::set_rows_per_invocation`]).
    rows_per_invocation: u32,
}

/// Rows of a [`QuantMatrix`] in one format.
#[derive(Debug, Clone)]
struct Part {
    format: QuantFormat,
    rows: usize,
    words: Tensor<1, Int>,
}

/// `true` for an f16 bit pattern that is infinite or NaN.
fn f16_non_finite(bits: u16) -> bool {
    (bits >> 10) & 0x1f == 0x1f
}

/// `true` for a bfloat16 bit pattern that is infinite or NaN.
fn bf16_non_finite(bits: u16) -> bool {
    (bits >> 7) & 0xff == 0xff
}

/// The device layout of `bytes` (`rows · cols / V` blocks in the file's layout, row after
/// row, `V` = [`QuantFormat::values`]), read by the kernels as `vec4<u32>` quads:
/// - the value words of every block, in quads: word `i` of block `b` of row `r` at
///   `((b·Q + i/4)·rows + r)·4 + i%4`, `Q` = ⌈VW/4⌉ quads of `VW` words (8 for Q8_0, 4 for
///   Q4 and Q5 — their nibbles —, 16 for F16/BF16, two values a word, the first in the low
///   half; for the K-quants the whole super-block, header included, 4 bytes a word in the
///   file's order, the last quad padded with zeros). Adjacent rows' quads are adjacent, so a
///   GPU's adjacent invocations read adjacent memory and llvmpipe one vector load a quad;
/// - then, from word `blocks·Q·4`, every block's header words (none for F16/BF16 and the
///   K-quants): word `h` of block `b` of row `r` at `(b·rows + r)·H + h`, the f16 scale (and,
///   for Q4_1 and Q5_1, the f16 minimum in the high half), then for Q5 the fifth bits;
/// - zeros to a whole quad.
///
/// A NaN or infinite scale, offset or (F16/BF16) value is refused.
pub fn pack_blocks(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Vec<u32>> {
    for (what, v) in [("rows", rows), ("cols", cols)] {
        if v == 0 {
            return Err(KernelError::Empty { what });
        }
    }
    let per_block = format.values();
    if !cols.is_multiple_of(per_block) {
        return Err(KernelError::Shape {
            tensor: "blocks",
            expected: vec![rows, cols.next_multiple_of(per_block)],
            got: vec![rows, cols],
        });
    }
    let blocks = rows * (cols / per_block);
    let bb = format.block_bytes();
    if bytes.len() != blocks * bb {
        return Err(KernelError::Shape { tensor: "block bytes", expected: vec![blocks * bb], got: vec![bytes.len()] });
    }
    // Every value must be addressable by the dequantization's 32-bit indices.
    gpu::check_elements("quantized values", &[rows, cols])?;
    let quads = format.value_quads();
    let hb = format.header_bytes();
    let hw = format.header_words();
    let total = (blocks * (4 * quads + hw)).next_multiple_of(4);
    gpu::check_u32("quantized words", total)?;
    let mut out = vec![0u32; total];
    let (values, headers) = out.split_at_mut(blocks * 4 * quads);
    let nb = cols / per_block;
    let at = |row: usize, blk: usize, i: usize| ((blk * quads + i / 4) * rows + row) * 4 + i % 4;
    let half = |at: usize, block: &[u8]| u16::from_le_bytes([block[at], block[at + 1]]);
    for (b, block) in bytes.chunks_exact(bb).enumerate() {
        let (row, blk) = (b / nb, b % nb);
        if format.is_k() {
            // d and dmin at the front, Q6_K's d at the end
            let scales =
                if format == QuantFormat::Q6_K { [half(208, block), 0] } else { [half(0, block), half(2, block)] };
            if scales.into_iter().any(f16_non_finite) {
                return Err(KernelError::NonFiniteBlock { block: b, row });
            }
            for (i, word) in block.chunks(4).enumerate() {
                let mut w = [0u8; 4];
                w[..word.len()].copy_from_slice(word);
                values[at(row, blk, i)] = u32::from_le_bytes(w);
            }
            continue;
        }
        if hb == 0 {
            let non_finite = if format == QuantFormat::F16 { f16_non_finite } else { bf16_non_finite };
            for (i, word) in block.chunks_exact(4).enumerate() {
                let (lo, hi) = (u16::from_le_bytes([word[0], word[1]]), u16::from_le_bytes([word[2], word[3]]));
                if non_finite(lo) || non_finite(hi) {
                    return Err(KernelError::NonFiniteBlock { block: b, row });
                }
                values[at(row, blk, i)] = u32::from(lo) | (u32::from(hi) << 16);
            }
            continue;
        }
        let d = u16::from_le_bytes([block[0], block[1]]);
        let m = if hb == 4 { u16::from_le_bytes([block[2], block[3]]) } else { 0 };
        if f16_non_finite(d) || f16_non_finite(m) {
            return Err(KernelError::NonFiniteBlock { block: b, row });
        }
        let word = |at: usize| u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        let h = (blk * rows + row) * hw;
        headers[h] = u32::from(d) | (u32::from(m) << 16);
        // Q5: the fifth bits come before the nibbles in the file
        let nibbles = if hw == 2 {
            headers[h + 1] = word(hb);
            hb + 4
        } else {
            hb
        };
        for i in 0..format.value_words() {
            values[at(row, blk, i)] = word(nibbles + 4 * i);
        }
    }
    Ok(out)
}

impl QuantMatrix {
    /// Uploads a matrix given as its file bytes (see [`pack_blocks`]) onto `device`, which
    /// must be a wgpu device.
    pub fn upload(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8], device: &Device) -> Result<Self> {
        let words = pack_blocks(format, rows, cols, bytes)?;
        let n = words.len();
        let words: Vec<i32> = bytemuck::cast_slice(&words).to_vec();
        let words = Tensor::<1, Int>::from_data(TensorData::new(words, [n]), device);
        gpu::int_input("blocks", &words)?;
        Ok(QuantMatrix { rows, cols, parts: vec![Part { format, rows, words }], rows_per_invocation: 1 })
    }

    /// The matrices' rows one after the other (each keeps its format): `[Σ rows, cols]`.
    pub fn stack(matrices: Vec<QuantMatrix>) -> Result<Self> {
        let Some((cols, rows_per_invocation)) = matrices.first().map(|m| (m.cols, m.rows_per_invocation)) else {
            return Err(KernelError::Empty { what: "matrices" });
        };
        let mut rows = 0;
        let mut parts = Vec::new();
        for m in matrices {
            if m.cols != cols {
                return Err(KernelError::Shape {
                    tensor: "stacked matrix",
                    expected: vec![m.rows, cols],
                    got: vec![m.rows, m.cols],
                });
            }
            rows += m.rows;
            parts.extend(m.parts);
        }
        gpu::check_u32("stacked rows", rows)?;
        Ok(QuantMatrix { rows, cols, parts, rows_per_invocation })
    }

    /// How many output rows each invocation of [`qproject`] computes, one of
    /// [`QPROJECT_ROWS`] (the K-quants always take one). One on GPUs, whose many invocations
    /// each take a row; more on CPU adapters (llvmpipe, SwiftShader), where every load costs a
    /// loop over the SIMD lanes and one load of the inputs then serves several rows: 4 rows
    /// make lavapipe's vocabulary head 1.9× faster than one (28.0 → 14.5 ms; 8 spill
    /// registers: 17.6 ms; docs/BENCHMARKS.md, "The quantized projection on CPU adapters").
    pub fn set_rows_per_invocation(&mut self, rows: u32) -> Result<()> {
        if !QPROJECT_ROWS.contains(&rows) {
            return Err(KernelError::RowsPerInvocation { rows, allowed: &QPROJECT_ROWS });
        }
        self.rows_per_invocation = rows;
        Ok(())
    }

    /// Output rows each invocation of [`qproject`] computes
    /// ([`QuantMatrix::set_rows_per_invocation`]; 1 unless set).
    pub fn rows_per_invocation(&self) -> u32 {
        self.rows_per_invocation
    }

    /// The format of the first rows (of every row unless [`QuantMatrix::stack`]ed from
    /// several).
    pub fn format(&self) -> QuantFormat {
        self.parts[0].format
    }

    /// The formats of its parts, top to bottom.
    pub fn formats(&self) -> Vec<QuantFormat> {
        self.parts.iter().map(|p| p.format).collect()
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes on the device.
    pub fn device_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.words.dims()[0] as u64 * 4).sum()
    }

    /// The one part of a matrix in one format.
    fn single(&self, what: &'static str) -> Result<&Part> {
        match &self.parts[..] {
            [p] => Ok(p),
            _ => Err(KernelError::MixedFormats { what }),
        }
    }
}

impl Part {
    /// Launch parameters over this part of a matrix of `cols` columns: `rows` rows computed,
    /// written from output row `row_at`.
    fn params(&self, cols: usize, launch: Launch) -> QProjectParams {
        let nb = cols / self.format.values();
        QProjectParams {
            d_in: cols as u32,
            rows: launch.rows as u32,
            nb: nb as u32,
            kind: self.format.kind(),
            flags: launch.flags,
            meta_at: (self.rows * nb * 4 * self.format.value_quads()) as u32,
            up_at: launch.up_at as u32,
            w_rows: self.rows as u32,
            groups_x: launch.groups_x,
            row_at: launch.row_at as u32,
            eps: launch.eps,
        }
    }
}

/// What one launch over a [`Part`] computes.
#[derive(Debug, Clone, Copy, Default)]
struct Launch {
    rows: usize,
    flags: u32,
    up_at: usize,
    groups_x: u32,
    row_at: usize,
    eps: f32,
}

/// A 2-D grid of at most 65,535 workgroups along x for `groups` workgroups.
fn grid(groups: usize) -> Result<(u32, u32)> {
    let x = groups.clamp(1, 65_535);
    let y = groups.div_ceil(x);
    gpu::check_groups("workgroup rows", y)?;
    Ok((x as u32, y as u32))
}

/// [`project`](crate::project) over a quantized weight: `y = epilogue(prologue(x)·Wᵀ + b)`
/// for one row, `W` being `weight`'s `[rows, d_in]` (with SwiGLU the gate rows, then as many
/// up rows).
///
/// # Shapes
/// `x: [1, d_in]`, `bias`: one entry per weight row, residual `[1, d_out]` → `[1, d_out]`.
pub fn qproject(
    x: &Tensor<2>,
    weight: &QuantMatrix,
    bias: Option<&Tensor<1>>,
    fusion: Fusion<'_>,
) -> Result<Tensor<2>> {
    let d_in = weight.cols;
    gpu::expect_shape("x", &x.dims(), &[1, d_in])?;
    if fusion.swiglu && !weight.rows.is_multiple_of(2) {
        return Err(KernelError::Shape {
            tensor: "weight",
            expected: vec![weight.rows + 1, d_in],
            got: vec![weight.rows, d_in],
        });
    }
    if fusion.swiglu {
        weight.single("a SwiGLU projection (gate and up rows side by side)")?;
    }
    let d_out = if fusion.swiglu { weight.rows / 2 } else { weight.rows };
    if let Some(b) = bias {
        gpu::expect_shape("bias", &b.dims(), &[weight.rows])?;
    }
    if let Some((g, _)) = fusion.norm {
        gpu::expect_shape("norm weight", &g.dims(), &[d_in])?;
    }
    if let Some(r) = fusion.residual {
        gpu::expect_shape("residual", &r.dims(), &[1, d_out])?;
    }
    let xp = gpu::float_input("x", x)?;
    let mut wps = Vec::with_capacity(weight.parts.len());
    for part in &weight.parts {
        let wp = gpu::int_input("blocks", &part.words)?;
        gpu::same_device(("blocks", &wp), ("x", &xp))?;
        wps.push(gpu::ready(wp));
    }
    let opt = |name: &'static str, t: Option<&Tensor<1>>| -> Result<Option<_>> {
        let Some(t) = t else { return Ok(None) };
        let p = gpu::float_input(name, t)?;
        gpu::same_device(("x", &xp), (name, &p))?;
        Ok(Some(p))
    };
    let bp = opt("bias", bias)?;
    let gp = opt("norm weight", fusion.norm.map(|(g, _)| g))?;
    let rp = match fusion.residual {
        Some(r) => {
            let p = gpu::float_input("residual", r)?;
            gpu::same_device(("x", &xp), ("residual", &p))?;
            Some(p)
        }
        None => None,
    };

    let xp = gpu::ready(xp);
    let (bp, gp, rp) = (bp.map(gpu::ready), gp.map(gpu::ready), rp.map(gpu::ready));
    let g = Gpu::new(&xp);
    let out = g.empty(&[1, d_out], DType::F32);
    let flags = u32::from(bp.is_some())
        | if gp.is_some() { 2 } else { 0 }
        | if rp.is_some() { 4 } else { 0 }
        | if fusion.swiglu { 8 } else { 0 };
    let eps = fusion.norm.map_or(0.0, |(_, eps)| eps);
    let or_dummy = |p: &Option<burn::backend::wgpu::CubeTensor>| p.as_ref().map(bind).unwrap_or_else(|| g.dummy());
    // One launch per part, each writing its rows of the output.
    let mut row_at = 0;
    for (part, wp) in weight.parts.iter().zip(&wps) {
        let rows = if fusion.swiglu { d_out } else { part.rows };
        let per = if part.format.is_k() { 1 } else { weight.rows_per_invocation };
        let (gx, gy) = grid(rows.div_ceil(qproject_wg(per) as usize * per as usize))?;
        let launch = Launch { rows, flags, up_at: d_out, groups_x: gx, row_at, eps };
        let params = g.params(&part.params(d_in, launch), &[]);
        g.launch_variant(
            Family::QProject,
            "project",
            qproject_variant(part.format.kind(), per),
            (gx, gy, 1),
            vec![params, bind(&xp), bind(wp), or_dummy(&bp), or_dummy(&gp), or_dummy(&rp), bind(&out)],
        );
        row_at += part.rows;
    }
    Ok(gpu::float_tensor(out))
}

/// Rows of a quantized matrix as f32: weight rows `ids` as `[ids.len(), cols]` (an embedding
/// lookup), or with `ids = None` every row, transposed when `transpose` (`[cols, rows]`: the
/// `[d_in, d_out]` weight of a matmul).
pub fn dequantize(weight: &QuantMatrix, ids: Option<&[u32]>, transpose: bool) -> Result<Tensor<2>> {
    if let Some(ids) = ids {
        if ids.is_empty() {
            return Err(KernelError::Empty { what: "row ids" });
        }
        if let Some(&bad) = ids.iter().find(|&&r| r as usize >= weight.rows) {
            return Err(KernelError::RowOutOfRange { what: "row id", index: bad as usize, rows: weight.rows });
        }
    }
    if weight.parts.len() > 1 {
        if ids.is_some() {
            weight.single("a gather of rows")?;
        }
        // Each part's rows, then side by side (the transpose) or one after the other.
        let mut all = Vec::with_capacity(weight.parts.len());
        for part in &weight.parts {
            let one = QuantMatrix { parts: vec![part.clone()], rows: part.rows, ..weight.clone() };
            all.push(dequantize(&one, None, transpose)?);
        }
        return Ok(Tensor::cat(all, if transpose { 1 } else { 0 }));
    }
    let part = &weight.parts[0];
    let n = ids.map_or(weight.rows, <[u32]>::len);
    gpu::check_elements("output", &[n, weight.cols])?;
    let (gx, gy) = grid((n * weight.cols).div_ceil(QPROJECT_WG as usize))?;
    let wp = gpu::ready(gpu::int_input("blocks", &part.words)?);
    let g = Gpu::new(&wp);
    let shape = if transpose { [weight.cols, n] } else { [n, weight.cols] };
    let out = g.empty(&shape, DType::F32);
    let flags = if ids.is_none() { 16 } else { 0 } | if transpose { 32 } else { 0 };
    let params = part.params(weight.cols, Launch { rows: n, flags, groups_x: gx, ..Launch::default() });
    let params = g.params(&params, ids.unwrap_or(&[]));
    g.launch_variant(
        Family::QProject,
        "dequant",
        qproject_variant(part.format.kind(), 1),
        (gx, gy, 1),
        vec![params, g.dummy(), bind(&wp), g.dummy(), g.dummy(), g.dummy(), bind(&out)],
    );
    Ok(gpu::float_tensor(out))
}
