//! Kernel 3: top-k per KV head, a different k per head (`shaders/topk.wgsl`).
//!
//! Rules, the same as the policy crate's `select_top_k`:
//! - `k ≥ len` keeps every position, `k = 0` keeps none;
//! - otherwise the protected positions (the first `sinks`, the last `recent` of the head's
//!   length) are kept and count in `k`, and the other `k − protected` go to the highest scores,
//!   ties broken by the lower position; `0 < k < protected` is an error;
//! - scores compare by the IEEE-754 total order (`f32::total_cmp`);
//! - kept positions are written sorted ascending.

use burn::tensor::{DType, Int, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind};
use crate::shader::Family;

/// Positions that are always kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Protect {
    /// The first `sinks` positions.
    pub sinks: usize,
    /// The last `recent` positions of each head's length.
    pub recent: usize,
}

impl Protect {
    /// Protected positions in a head of `len`.
    pub fn count(&self, len: usize) -> usize {
        (self.sinks.saturating_add(self.recent)).min(len)
    }
}

/// Kept positions per KV head.
#[derive(Debug, Clone)]
pub struct Kept {
    /// `[kv_heads, width]` u32: row `h` starts with `counts[h]` positions, strictly ascending,
    /// then `u32::MAX`. `width = max(1, max_h counts[h])`.
    pub positions: Tensor<2, Int>,
    /// Kept entries per head (known on the host without reading the device).
    pub counts: Vec<u32>,
}

/// How many positions a head keeps under the rules above, or the error for its budget.
pub fn kept_count(head: usize, len: usize, k: usize, protect: Protect) -> Result<usize> {
    if k >= len {
        return Ok(len);
    }
    if k == 0 {
        return Ok(0);
    }
    let protected = protect.count(len);
    if k < protected {
        return Err(KernelError::BudgetBelowProtected { head, k, protected });
    }
    Ok(k)
}

/// Selects the kept positions of every KV head.
///
/// # Shapes
/// - `scores`: `[kv_heads, capacity]` f32; head `h` scores its slots `0..lens[h]`
/// - `lens`, `k`: one entry per KV head, `lens[h] ≤ capacity`, `k[h] ≤ capacity`
///
/// Returns [`Kept`] (`[kv_heads, width]` u32 on the device, counts on the host).
pub fn top_k(scores: &Tensor<2>, lens: &[u32], k: &[u32], protect: Protect) -> Result<Kept> {
    let [kv_heads, cap] = scores.dims();
    if kv_heads == 0 {
        return Err(KernelError::Empty { what: "kv_heads" });
    }
    if lens.len() != kv_heads {
        return Err(KernelError::PerHead { what: "lengths", expected: kv_heads, got: lens.len() });
    }
    if k.len() != kv_heads {
        return Err(KernelError::PerHead { what: "k", expected: kv_heads, got: k.len() });
    }
    gpu::check_elements("scores", &[kv_heads, cap])?;
    gpu::check_groups("kv_heads", kv_heads)?;
    let mut counts = Vec::with_capacity(kv_heads);
    for h in 0..kv_heads {
        let (len, kh) = (lens[h] as usize, k[h] as usize);
        if len > cap {
            return Err(KernelError::LengthPastCapacity { head: h, len, capacity: cap });
        }
        if kh > cap {
            return Err(KernelError::KPastCapacity { head: h, k: kh, capacity: cap });
        }
        counts.push(kept_count(h, len, kh, protect)? as u32);
    }
    // Lengths never exceed the capacity, so clamping keeps the meaning and the shader's
    // 32-bit sums from overflowing.
    let sinks = protect.sinks.min(cap) as u32;
    let recent = protect.recent.min(cap) as u32;
    let width = counts.iter().copied().max().unwrap_or(0).max(1) as usize;
    gpu::check_elements("kept", &[kv_heads, width])?;

    let src = gpu::ready(gpu::float_input("scores", scores)?);
    let g = Gpu::new(&src);
    let out = g.empty(&[kv_heads, width], DType::U32);
    let mut params = vec![kv_heads as u32, cap as u32, width as u32, sinks, recent, 0, 0, 0];
    for h in 0..kv_heads {
        params.push(lens[h]);
        params.push(k[h]);
    }
    g.launch(Family::TopK, "topk", (kv_heads as u32, 1, 1), vec![g.words(&params), bind(&src), bind(&out)]);
    Ok(Kept { positions: gpu::int_tensor(out), counts })
}
