//! Skinny projection `y = x·W + b` for decoding (`shaders/linear.wgsl`).
//!
//! One invocation per output column (four adjacent columns as a `vec4` when `d_out % 4 == 0`),
//! one or four rows of `x` per invocation, `W` read in its stored `[d_in, d_out]` row-major
//! layout. Built for few rows (decode steps, `n ≤ 8`); it stays correct for any `n`, but Burn's
//! tiled matmul wins once `n` grows: on lavapipe the kernel is faster up to about 40 rows and
//! slower from 64 (`docs/BENCHMARKS.md`, "Linear kernel"), so prefill should use the matmul.

use burn::backend::wgpu::CubeTensor;
use burn::tensor::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::params::LinearParams;
use crate::shader::{Family, LINEAR_WG};

/// Rows of `x` from which one invocation handles four rows (reading each `W` element once for
/// them) instead of one.
const FOUR_ROWS_FROM: usize = 3;

/// `y = x·W + b`.
///
/// # Shapes
/// - `x`: `[n, d_in]`
/// - `weight`: `[d_in, d_out]` (row-major, as the model stores it, not transposed)
/// - `bias`: optional `[d_out]`
///
/// Returns `[n, d_out]`. All f32 on one wgpu device. Views (transposes, slices) are accepted:
/// the kernel reads contiguous row-major buffers, so a strided input is first copied into one
/// on the device (a no-op for plain tensors). Shapes are checked before anything is queued:
/// every dimension must be non-zero, `d_out` at most `65535 · 64` (`· 4` when `d_out % 4 == 0`)
/// and every tensor within 32-bit indices.
pub fn linear(x: Tensor<2>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Result<Tensor<2>> {
    let [n, d_in] = x.dims();
    let [_, d_out] = weight.dims();
    check_product(&x, &weight, bias.as_ref())?;
    let (family, lanes) = if d_out % 4 == 0 { (Family::Linear4, 4) } else { (Family::Linear, 1) };
    let cols = d_out / lanes;
    let col_groups = div_ceil(cols, LINEAR_WG);
    gpu::check_groups("output column workgroups", col_groups as usize)?;
    let (entry, rows_per) = if n >= FOUR_ROWS_FROM { ("four", 4) } else { ("one", 1) };
    let blocks = n.div_ceil(rows_per);
    let groups_y = blocks.min(65_535);
    let groups_z = blocks.div_ceil(groups_y);
    gpu::check_groups("row workgroups", groups_z)?;

    let (xp, wp, bp) = product_inputs(&x, &weight, bias.as_ref())?;
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
        family,
        entry,
        (col_groups, groups_y as u32, groups_z as u32),
        vec![params, bind(&xp), bind(&wp), bp.as_ref().map(bind).unwrap_or_else(|| g.dummy()), bind(&out)],
    );
    Ok(gpu::float_tensor(out))
}

/// The checks of `y = x·W + b` shared by the projection kernels ([`linear`],
/// [`crate::gemm`]): `W` is `[d_in, d_out]` for `x: [n, d_in]`, `b` is `[d_out]`, no
/// dimension is zero and every tensor stays within 32-bit indices.
pub(crate) fn check_product(x: &Tensor<2>, weight: &Tensor<2>, bias: Option<&Tensor<1>>) -> Result<()> {
    let [n, d_in] = x.dims();
    let [_, d_out] = weight.dims();
    gpu::expect_shape("weight", &weight.dims(), &[d_in, usize::MAX])?;
    if let Some(b) = bias {
        gpu::expect_shape("bias", &b.dims(), &[d_out])?;
    }
    for (what, v) in [("rows of x", n), ("d_in", d_in), ("d_out", d_out)] {
        if v == 0 {
            return Err(KernelError::Empty { what });
        }
    }
    gpu::check_elements("x", &[n, d_in])?;
    gpu::check_elements("weight", &[d_in, d_out])?;
    gpu::check_elements("output", &[n, d_out])
}

/// The operands of a projection kernel as contiguous f32 buffers on one wgpu device.
pub(crate) fn product_inputs(
    x: &Tensor<2>,
    weight: &Tensor<2>,
    bias: Option<&Tensor<1>>,
) -> Result<(CubeTensor, CubeTensor, Option<CubeTensor>)> {
    let xp = gpu::float_input("x", x)?;
    let wp = gpu::float_input("weight", weight)?;
    gpu::same_device(("x", &xp), ("weight", &wp))?;
    let bp = match bias {
        Some(b) => {
            let p = gpu::float_input("bias", b)?;
            gpu::same_device(("x", &xp), ("bias", &p))?;
            Some(p)
        }
        None => None,
    };
    Ok((gpu::ready(xp), gpu::ready(wp), bp.map(gpu::ready)))
}
