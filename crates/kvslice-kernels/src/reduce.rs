//! Kernel 2: pooling over positions and GQA group reduction (`shaders/reduce.wgsl`).
//!
//! Pooling follows `torch.nn.functional.avg_pool1d` / `max_pool1d` at stride 1 with "same"
//! padding `kernel/2`, as SnapKV and CAKE use it: the average divides by `kernel` with the zero
//! padding counted (`count_include_pad=True`), the maximum ignores the padding.

use burn::tensor::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::shader::{Family, REDUCE_WG};

/// How values are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// Average (pooling: zero padding counted; groups: mean over the group).
    Mean,
    /// Maximum.
    Max,
}

impl Reduce {
    fn code(self) -> u32 {
        match self {
            Reduce::Mean => 0,
            Reduce::Max => 1,
        }
    }
}

/// 1-D pooling of every row over positions with an odd `kernel`, stride 1, same padding.
///
/// # Shapes
/// - `x`: `[rows, n]` f32 → `[rows, n]`
pub fn pool1d(x: &Tensor<2>, kernel: usize, how: Reduce) -> Result<Tensor<2>> {
    let [rows, n] = x.dims();
    if kernel == 0 || kernel % 2 == 0 {
        return Err(KernelError::PoolKernel { kernel });
    }
    gpu::check_elements("pool input", &[rows, n])?;
    let kernel = gpu::check_u32("pool kernel", kernel)?;
    gpu::check_groups("rows", rows)?;
    gpu::check_groups("position workgroups", div_ceil(n, REDUCE_WG) as usize)?;
    let src = gpu::ready(gpu::float_input("x", x)?);
    let g = Gpu::new(&src);
    let dst = g.empty(&[rows, n], DType::F32);
    let params = [rows as u32, n as u32, kernel, how.code()];
    g.launch(
        Family::Reduce,
        "pool",
        (div_ceil(n, REDUCE_WG), rows as u32, 1),
        vec![g.words(&params), bind(&src), bind(&dst)],
    );
    Ok(gpu::float_tensor(dst))
}

/// Reduces each GQA group of query heads to its KV head: query head `h` belongs to KV head
/// `h / (heads / kv_heads)`.
///
/// # Shapes
/// - `x`: `[heads, n]` f32 → `[kv_heads, n]`
pub fn reduce_groups(x: &Tensor<2>, kv_heads: usize, how: Reduce) -> Result<Tensor<2>> {
    let [heads, n] = x.dims();
    gpu::check_grouping(heads, kv_heads)?;
    gpu::check_elements("group input", &[heads, n])?;
    gpu::check_groups("kv_heads", kv_heads)?;
    gpu::check_groups("position workgroups", div_ceil(n, REDUCE_WG) as usize)?;
    let src = gpu::ready(gpu::float_input("x", x)?);
    let g = Gpu::new(&src);
    let dst = g.empty(&[kv_heads, n], DType::F32);
    let params = [heads as u32, n as u32, kv_heads as u32, how.code()];
    g.launch(
        Family::Reduce,
        "group",
        (div_ceil(n, REDUCE_WG), kv_heads as u32, 1),
        vec![g.words(&params), bind(&src), bind(&dst)],
    );
    Ok(gpu::float_tensor(dst))
}
