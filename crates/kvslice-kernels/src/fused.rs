//! Fused decode step: the fused stages of one decode step (`shaders/project.wgsl`, `shaders/step.wgsl`).
//!
//! A Llama block decoding one token is, besides its attention, a handful of projections and
//! the element-wise work around them: RMSNorm before the q|k|v and gate|up projections, RoPE
//! after q|k|v, SwiGLU after gate|up, the residual add after the output and down projections.
//! Run as separate ops these are ~40 launches per layer; here each projection carries its
//! prologue and epilogue ([`project`]), and RoPE splits the q|k|v row in one launch
//! ([`rope_split`]). [`rms_norm`] is the final norm before the output head.
//!
//! One row only (`x: [1, d_in]`): prefill keeps Burn's matmul. Every function validates before
//! it queues anything and returns a [`KernelError`] otherwise.

use burn::backend::wgpu::CubeTensor;
use burn::tensor::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::params::{ProjectParams, StepParams};
use crate::shader::{Family, PROJECT_WG, STEP_WG};

/// What surrounds a [`project`]ion.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fusion<'a> {
    /// RMSNorm of `x` first: its weight `[d_in]` and ε.
    pub norm: Option<(&'a Tensor<1>, f32)>,
    /// Added to the output: `[1, d_out]`.
    pub residual: Option<&'a Tensor<2>>,
    /// The weight is gate and up side by side (`[d_in, 2·d_out]`, gate columns first, and the
    /// bias `[2·d_out]` likewise): the output is `silu(gate) · up`.
    pub swiglu: bool,
}

/// `y = epilogue(prologue(x)·W + b)` for one row (see [`Fusion`]).
///
/// # Shapes
/// - `x`: `[1, d_in]`
/// - `weight`: `[d_in, d_out]`, or `[d_in, 2·d_out]` with SwiGLU (row-major, as stored)
/// - `bias`: optional, one entry per weight column
///
/// Returns `[1, d_out]`, f32 on the weight's wgpu device. With the norm the result is
/// `(Σ_k x_k·g_k·W_kj) / √(mean(x²) + ε) + b_j`.
pub fn project(x: &Tensor<2>, weight: &Tensor<2>, bias: Option<&Tensor<1>>, fusion: Fusion<'_>) -> Result<Tensor<2>> {
    let [rows, d_in] = x.dims();
    let [_, w_cols] = weight.dims();
    gpu::expect_shape("x", &[rows, d_in], &[1, usize::MAX])?;
    gpu::expect_shape("weight", &weight.dims(), &[d_in, usize::MAX])?;
    if fusion.swiglu && w_cols % 2 != 0 {
        return Err(KernelError::Shape {
            tensor: "weight",
            expected: vec![d_in, w_cols + 1],
            got: weight.dims().to_vec(),
        });
    }
    let d_out = if fusion.swiglu { w_cols / 2 } else { w_cols };
    for (what, v) in [("d_in", d_in), ("d_out", d_out)] {
        if v == 0 {
            return Err(KernelError::Empty { what });
        }
    }
    if let Some(b) = bias {
        gpu::expect_shape("bias", &b.dims(), &[w_cols])?;
    }
    if let Some((g, _)) = fusion.norm {
        gpu::expect_shape("norm weight", &g.dims(), &[d_in])?;
    }
    if let Some(r) = fusion.residual {
        gpu::expect_shape("residual", &r.dims(), &[1, d_out])?;
    }
    gpu::check_elements("weight", &[d_in, w_cols])?;
    let (family, lanes) = if d_out % 4 == 0 { (Family::Project4, 4) } else { (Family::Project, 1) };
    let cols = d_out / lanes;
    let groups = div_ceil(cols, PROJECT_WG);
    gpu::check_groups("output column workgroups", groups as usize)?;

    let xp = gpu::float_input("x", x)?;
    let wp = gpu::float_input("weight", weight)?;
    gpu::same_device(("weight", &wp), ("x", &xp))?;
    let bp = beside("bias", bias, &wp)?;
    let gp = beside("norm weight", fusion.norm.map(|(g, _)| g), &wp)?;
    let rp = beside("residual", fusion.residual, &wp)?;

    let (xp, wp) = (gpu::ready(xp), gpu::ready(wp));
    let (bp, gp, rp) = (bp.map(gpu::ready), gp.map(gpu::ready), rp.map(gpu::ready));
    let g = Gpu::new(&wp);
    let out = g.empty(&[1, d_out], DType::F32);
    let flags = u32::from(bp.is_some())
        | if gp.is_some() { 2 } else { 0 }
        | if rp.is_some() { 4 } else { 0 }
        | if fusion.swiglu { 8 } else { 0 };
    let params = ProjectParams {
        d_in: d_in as u32,
        cols: cols as u32,
        w_stride: (w_cols / lanes) as u32,
        flags,
        eps: fusion.norm.map_or(0.0, |(_, eps)| eps),
    };
    let params = g.params(&params, &[]);
    let or_dummy = |p: &Option<CubeTensor>| p.as_ref().map(bind).unwrap_or_else(|| g.dummy());
    g.launch(
        family,
        "project",
        (groups, 1, 1),
        vec![params, bind(&xp), bind(&wp), or_dummy(&bp), or_dummy(&gp), or_dummy(&rp), bind(&out)],
    );
    Ok(gpu::float_tensor(out))
}

/// An optional input of [`project`], validated against the weight's device.
fn beside<const D: usize>(
    name: &'static str,
    t: Option<&Tensor<D>>,
    weight: &CubeTensor,
) -> Result<Option<CubeTensor>> {
    let Some(t) = t else { return Ok(None) };
    let p = gpu::float_input(name, t)?;
    gpu::same_device(("weight", weight), (name, &p))?;
    Ok(Some(p))
}

/// A q|k|v projection row split into the attention's inputs by [`rope_split`].
#[derive(Debug, Clone)]
pub struct QkvRow {
    /// `[heads, head_dim]` after RoPE.
    pub q: Tensor<2>,
    /// `[heads, head_dim]` before RoPE.
    pub q_raw: Tensor<2>,
    /// `[kv_heads, head_dim]` after RoPE.
    pub k: Tensor<2>,
    /// `[kv_heads, head_dim]`.
    pub v: Tensor<2>,
}

/// Splits one fused projection row `q | k | v` and rotates its queries and keys by the
/// position whose `cos`/`sin` (`[head_dim / 2]` each) are given, in HF's `rotate_half` layout:
/// for `i < head_dim / 2`, `out_i = x_i·cos_i − x_{i+half}·sin_i` and
/// `out_{i+half} = x_{i+half}·cos_i + x_i·sin_i`.
///
/// # Shapes
/// `qkv: [1, (heads + 2·kv_heads)·head_dim]`, `cos`, `sin`: `[head_dim / 2]`.
pub fn rope_split(
    qkv: &Tensor<2>,
    cos: &Tensor<1>,
    sin: &Tensor<1>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Result<QkvRow> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(KernelError::HeadDim { head_dim, max: crate::shader::MAX_HEAD_DIM });
    }
    gpu::check_grouping(heads, kv_heads)?;
    let width = (heads + 2 * kv_heads) * head_dim;
    gpu::expect_shape("qkv", &qkv.dims(), &[1, width])?;
    gpu::expect_shape("cos", &cos.dims(), &[head_dim / 2])?;
    gpu::expect_shape("sin", &sin.dims(), &[head_dim / 2])?;
    gpu::check_elements("qkv", &[width])?;
    let groups = div_ceil(width, STEP_WG);
    gpu::check_groups("workgroups", groups as usize)?;
    let src = gpu::float_input("qkv", qkv)?;
    let c = gpu::float_input("cos", cos)?;
    let s = gpu::float_input("sin", sin)?;
    gpu::same_device(("qkv", &src), ("cos", &c))?;
    gpu::same_device(("qkv", &src), ("sin", &s))?;
    let (src, c, s) = (gpu::ready(src), gpu::ready(c), gpu::ready(s));
    let g = Gpu::new(&src);
    let q = g.empty(&[heads, head_dim], DType::F32);
    let q_raw = g.empty(&[heads, head_dim], DType::F32);
    let k = g.empty(&[kv_heads, head_dim], DType::F32);
    let v = g.empty(&[kv_heads, head_dim], DType::F32);
    let params =
        StepParams { heads: heads as u32, kv_heads: kv_heads as u32, head_dim: head_dim as u32, width: 0, eps: 0.0 };
    let params = g.params(&params, &[]);
    g.launch(
        Family::Step,
        "rope",
        (groups, 1, 1),
        vec![params, bind(&src), bind(&c), bind(&s), bind(&q), bind(&q_raw), bind(&k), bind(&v)],
    );
    Ok(QkvRow {
        q: gpu::float_tensor(q),
        q_raw: gpu::float_tensor(q_raw),
        k: gpu::float_tensor(k),
        v: gpu::float_tensor(v),
    })
}

/// RMSNorm of every row: `y = x·g / √(mean(x²) + ε)` (one launch).
///
/// # Shapes
/// `x: [rows, width]`, `weight: [width]` → `[rows, width]`.
pub fn rms_norm(x: &Tensor<2>, weight: &Tensor<1>, eps: f32) -> Result<Tensor<2>> {
    let [rows, width] = x.dims();
    gpu::expect_shape("weight", &weight.dims(), &[width])?;
    for (what, v) in [("rows", rows), ("width", width)] {
        if v == 0 {
            return Err(KernelError::Empty { what });
        }
    }
    gpu::check_elements("x", &[rows, width])?;
    gpu::check_groups("rows", rows)?;
    let xp = gpu::float_input("x", x)?;
    let wp = gpu::float_input("weight", weight)?;
    gpu::same_device(("x", &xp), ("weight", &wp))?;
    let (xp, wp) = (gpu::ready(xp), gpu::ready(wp));
    let g = Gpu::new(&xp);
    let out = g.empty(&[rows, width], DType::F32);
    let params = StepParams { heads: 0, kv_heads: 0, head_dim: 0, width: width as u32, eps };
    let params = g.params(&params, &[]);
    g.launch(
        Family::Step,
        "norm",
        (rows as u32, 1, 1),
        vec![params, bind(&xp), bind(&wp), g.dummy(), bind(&out), g.dummy(), g.dummy(), g.dummy()],
    );
    Ok(gpu::float_tensor(out))
}
