//! Kernel 1: window statistics (`shaders/window_stats.wgsl`).
//!
//! For query head `h` (reading KV head `h / g`, `g = heads / kv_heads`), window query `i` at
//! prompt position `p_i = n − w + i` and key `j`, the causal softmax weight is
//! `a_ij = softmax_{j ≤ p_i}(⟨q_i, k_j⟩ / √d)` and zero for `j > p_i`. Per `(h, j)`, over the
//! `w` window queries (masked zeros included):
//! - `mean = Σ_i a_ij / w`, `variance = Σ_i (a_ij − mean)² / (w − 1)` (0 when `w = 1`; CAKE's
//!   attention shift, `torch.var`'s default), `last = a_{w−1, j}` (TOVA);
//! - on request `value_norm = mean · ‖v_j‖` and
//!   `projection = Σ_i a_ij ⟨v_j, o_i/‖o_i‖⟩ / w` with `o_i = Σ_j a_ij v_j` (AnDPro) and
//!   `jacobian = Σ_i a_ij ‖v_j − o_i‖ / w` (Jacap's `‖∂o/∂s‖` weights);
//! - per head, over the prefix `j < n − w`: `entropy = Σ_i Σ_{j<n−w} −a_ij ln(a_ij + 1e−10) / w`
//!   (CAKE's dispersion as cakekv computes it, weights not renormalised) and
//!   `column_variance = Σ_{j<n−w} variance_j` (CAKE's shift).
//!
//! Three passes, none of them holding more than a tile of scores: `rows` runs an online softmax
//! (running max and rescaled denominator) per window query and, for the projection, the output
//! direction; `cols` recomputes each query–key score and accumulates the column statistics with
//! Welford's update; `heads` reduces the prefix. Memory is `O(heads·(w·d + n))`.

use burn::tensor::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::gpu::{self, Gpu, bind, div_ceil};
use crate::params::StatsParams;
use crate::shader::{Family, STATS_WG_COLS};

/// Which optional statistics to compute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsRequest {
    /// `mean_q a_qj · ‖v_j‖`.
    pub value_norm: bool,
    /// AnDPro's `mean_q a_qj · ⟨v_j, o_q/‖o_q‖⟩` (adds the output pass to `rows`).
    pub projection: bool,
    /// Jacap's `mean_q a_qj · ‖v_j − o_q‖` (adds the output pass to `rows`).
    pub jacobian: bool,
}

/// Window statistics of one layer, on the device. Every `[heads, n]` tensor is row-major, head
/// by head, as the policy crate's `WindowStats` tables are.
#[derive(Debug, Clone)]
pub struct WindowStats {
    /// `[heads, n]` mean weight over the window queries.
    pub mean: Tensor<2>,
    /// `[heads, n]` unbiased variance over the window queries.
    pub variance: Tensor<2>,
    /// `[heads, n]` weight of the last window query.
    pub last: Tensor<2>,
    /// `[heads, n]` value-norm-weighted mean, when requested.
    pub value_norm: Option<Tensor<2>>,
    /// `[heads, n]` AnDPro projection term, when requested.
    pub projection: Option<Tensor<2>>,
    /// `[heads, n]` Jacap's Jacobian term, when requested.
    pub jacobian: Option<Tensor<2>>,
    /// `[heads]` mean prefix row entropy.
    pub entropy: Tensor<1>,
    /// `[heads]` summed prefix column variance.
    pub column_variance: Tensor<1>,
}

/// Window statistics of the last `w` prompt queries over the first `n` keys of each KV head.
///
/// # Shapes
/// - `queries`: `[heads, w, head_dim]`, the queries of prompt positions `n − w .. n`, after RoPE
/// - `keys`, `values`: `[kv_heads, capacity, head_dim]`, keys after RoPE; slots `0..n` are used
/// - `n`: number of keys, `w ≤ n ≤ capacity`
///
/// All tensors f32 on one wgpu device; `heads` a multiple of `kv_heads`;
/// `1 ≤ head_dim ≤` [`crate::MAX_HEAD_DIM`]. The outputs are `[heads, n]` and `[heads]` (see
/// [`WindowStats`]). Everything stays on the device.
pub fn window_stats(
    queries: &Tensor<3>,
    keys: &Tensor<3>,
    values: &Tensor<3>,
    n: usize,
    request: StatsRequest,
) -> Result<WindowStats> {
    let [heads, w, d] = queries.dims();
    let [kv_heads, cap, dk] = keys.dims();
    gpu::expect_shape("keys", &keys.dims(), &[usize::MAX, usize::MAX, d])?;
    gpu::expect_shape("values", &values.dims(), &[kv_heads, cap, dk])?;
    gpu::check_head_dim(d)?;
    gpu::check_grouping(heads, kv_heads)?;
    if n > cap {
        return Err(KernelError::LengthPastCapacity { head: 0, len: n, capacity: cap });
    }
    if w == 0 || w > n {
        return Err(KernelError::Window { window: w, len: n });
    }
    gpu::check_elements("queries", &[heads, w, d])?;
    gpu::check_elements("keys", &[kv_heads, cap, d])?;
    gpu::check_elements("statistics", &[7, heads, n])?;
    gpu::check_groups("window queries", w)?;
    gpu::check_groups("heads", heads)?;
    gpu::check_groups("key workgroups", div_ceil(n, STATS_WG_COLS) as usize)?;

    let q = gpu::float_input("queries", queries)?;
    let k = gpu::float_input("keys", keys)?;
    let v = gpu::float_input("values", values)?;
    gpu::same_device(("queries", &q), ("keys", &k))?;
    gpu::same_device(("queries", &q), ("values", &v))?;
    let (q, k, v) = (gpu::ready(q), gpu::ready(k), gpu::ready(v));

    let g = Gpu::new(&q);
    let output = request.projection || request.jacobian;
    let rows = g.empty(&[heads, w, 4], DType::F32);
    let ohat = output.then(|| g.empty(&[heads, w, d], DType::F32));
    let cols = g.empty(&[7, heads, n], DType::F32);
    let head = g.empty(&[heads, 2], DType::F32);
    let scale = 1.0f32 / (d as f32).sqrt();
    let params = StatsParams {
        heads: heads as u32,
        kv_heads: kv_heads as u32,
        w: w as u32,
        n: n as u32,
        d: d as u32,
        scale,
        flags: u32::from(request.projection) | (u32::from(request.jacobian) << 1),
        cap: cap as u32,
    };
    let params = g.params(&params, &[]);
    let bindings = || {
        vec![
            params.clone(),
            bind(&q),
            bind(&k),
            bind(&v),
            bind(&rows),
            ohat.as_ref().map(bind).unwrap_or_else(|| g.dummy()),
            bind(&cols),
            bind(&head),
        ]
    };
    g.launch(Family::WindowStats, "rows", (w as u32, heads as u32, 1), bindings());
    g.launch(Family::WindowStats, "cols", (div_ceil(n, STATS_WG_COLS), heads as u32, 1), bindings());
    g.launch(Family::WindowStats, "heads", (heads as u32, 1, 1), bindings());

    let cols: Tensor<3> = gpu::float_tensor(cols);
    let plane = |p: usize| cols.clone().slice([p..p + 1, 0..heads, 0..n]).reshape([heads, n]);
    let head: Tensor<2> = gpu::float_tensor(head);
    let head_col = |c: usize| head.clone().slice([0..heads, c..c + 1]).reshape([heads]);
    Ok(WindowStats {
        mean: plane(0),
        variance: plane(1),
        last: plane(2),
        value_norm: request.value_norm.then(|| plane(3)),
        projection: request.projection.then(|| plane(4)),
        jacobian: request.jacobian.then(|| plane(6)),
        entropy: head_col(0),
        column_variance: head_col(1),
    })
}
