//! Register-tiled projection `y = x·W + b` for prefill (`shaders/gemm.wgsl`).
//!
//! Each workgroup stages a `[BK, 64]` tile of `x` (transposed) and a `[BK, 64]` tile of `W` in
//! workgroup memory per step along `d_in` and accumulates a `64 × 64` tile of `y`, four rows
//! by four adjacent columns (one `vec4` per row) per invocation: every staged value is read
//! from storage once per tile instead of once per output. Built for many rows (prompts);
//! [`crate::linear`] is the kernel for few.

use burn::tensor::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::params::LinearParams;
use crate::shader::{Family, GEMM_WG_X, GEMM_WG_Y};

/// `y = x·W + b`, through the tiled kernel.
///
/// # Shapes
/// - `x`: `[n, d_in]`
/// - `weight`: `[d_in, d_out]` (row-major, as the model stores it, not transposed)
/// - `bias`: optional `[d_out]`
///
/// Returns `[n, d_out]`. All f32 on one wgpu device; views are copied into contiguous buffers
/// first (a no-op for plain tensors). Checked before anything is queued: every dimension
/// non-zero, `d_out` a multiple of 4 (the kernel addresses `W`, `b` and `y` as `vec4`), the
/// workgroup counts within a dispatch and every tensor within 32-bit indices.
pub fn gemm(x: Tensor<2>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Result<Tensor<2>> {
    let [n, d_in] = x.dims();
    let [_, d_out] = weight.dims();
    crate::linear::check_product(&x, &weight, bias.as_ref())?;
    if !d_out.is_multiple_of(4) {
        return Err(KernelError::Shape {
            tensor: "weight",
            expected: vec![d_in, d_out.next_multiple_of(4)],
            got: vec![d_in, d_out],
        });
    }

    let cols = d_out / 4;
    let col_groups = div_ceil(cols, GEMM_WG_X);
    gpu::check_groups("output column workgroups", col_groups as usize)?;
    let tiles = n.div_ceil(4 * GEMM_WG_Y as usize);
    let groups_y = tiles.min(65_535);
    let groups_z = tiles.div_ceil(groups_y);
    gpu::check_groups("row workgroups", groups_z)?;

    let (xp, wp, bp) = crate::linear::product_inputs(&x, &weight, bias.as_ref())?;
    let g = Gpu::new(&xp);
    let out = g.empty(&[n, d_out], DType::F32);
    let params = LinearParams {
        n: n as u32,
        d_in: d_in as u32,
        cols: cols as u32,
        flags: u32::from(bp.is_some()),
        groups_y: groups_y as u32,
    };
    let params = g.params(&params, &[]);
    g.launch(
        Family::Gemm,
        "gemm",
        (col_groups, groups_y as u32, groups_z as u32),
        vec![params, bind(&xp), bind(&wp), bp.as_ref().map(bind).unwrap_or_else(|| g.dummy()), bind(&out)],
    );
    Ok(gpu::float_tensor(out))
}
