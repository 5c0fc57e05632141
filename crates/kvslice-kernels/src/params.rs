//! Parameter blocks: one `#[repr(C)]` plain-data struct per kernel, mirrored member for member
//! by the `Params` struct of its shader. Per-head lists follow the block as the WGSL struct's
//! runtime-sized last member. The naga check ([`crate::shader::check_all`]) compares every
//! member offset and the size against [`layout`], so the two cannot drift apart.

use bytemuck::{Pod, Zeroable};

use crate::shader::Family;

/// `append.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct AppendParams {
    pub kv_heads: u32,
    pub cap: u32,
    pub head_dim: u32,
    pub t: u32,
    /// Bit 0: write source positions.
    pub flags: u32,
}

/// `window_stats.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct StatsParams {
    pub heads: u32,
    pub kv_heads: u32,
    pub w: u32,
    pub n: u32,
    pub d: u32,
    /// `1/√d`.
    pub scale: f32,
    /// Bit 0: projection, bit 1: Jacobian term (either way `rows` computes `‖o‖`, `o/‖o‖`).
    pub flags: u32,
    /// Slots per KV head (row stride of keys and values).
    pub cap: u32,
}

/// `decode.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct DecodeParams {
    pub heads: u32,
    pub kv_heads: u32,
    pub cap: u32,
    pub head_dim: u32,
    /// `1/√head_dim`.
    pub scale: f32,
    /// Key partitions per head.
    pub parts: u32,
    /// Keys per partition.
    pub part_len: u32,
    /// Bit 0: weights asked; bit 1: one partition, written out by the partition pass.
    pub flags: u32,
}

/// `compact.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct CompactParams {
    pub kv_heads: u32,
    pub cap: u32,
    pub head_dim: u32,
    /// Row stride of the kept table.
    pub kept_stride: u32,
    pub rows_per_chunk: u32,
}

/// `linear.wgsl` (both column types).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct LinearParams {
    /// Rows of x.
    pub n: u32,
    pub d_in: u32,
    /// Column units: `d_out`, or `d_out / 4` for `vec4`.
    pub cols: u32,
    /// Bit 0: bias given.
    pub flags: u32,
    /// Workgroups along y.
    pub groups_y: u32,
}

/// `project.wgsl` (both column types).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct ProjectParams {
    pub d_in: u32,
    /// Output column units: `d_out`, or `d_out / 4` for `vec4`.
    pub cols: u32,
    /// Units per row of the weight: `cols`, or `2 · cols` with SwiGLU.
    pub w_stride: u32,
    /// Bit 0: bias, bit 1: RMSNorm prologue, bit 2: residual, bit 3: SwiGLU.
    pub flags: u32,
    /// RMSNorm ε.
    pub eps: f32,
}

/// `step.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct StepParams {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// `norm`: values per row.
    pub width: u32,
    /// `norm`: ε.
    pub eps: f32,
}

/// `qproject.wgsl` (both entries).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct QProjectParams {
    pub d_in: u32,
    /// Output rows computed (`project`) or written (`dequant`).
    pub rows: u32,
    /// Blocks per weight row.
    pub nb: u32,
    /// 0: Q8_0, 1: Q4_0, 2: Q4_1, 3: F16, 4: BF16, 5: Q4_K, 6: Q5_K, 7: Q6_K, 8: Q5_0, 9: Q5_1.
    pub kind: u32,
    /// Bit 0: bias, 1: RMSNorm, 2: residual, 3: SwiGLU, 4: every row, 5: transpose.
    pub flags: u32,
    /// First word of the block headers.
    pub meta_at: u32,
    /// SwiGLU: row offset of the up half.
    pub up_at: u32,
    /// Rows of the weight (its layout's stride).
    pub w_rows: u32,
    /// Workgroups along x.
    pub groups_x: u32,
    /// Output row of the first row computed (a part of a stacked matrix).
    pub row_at: u32,
    /// RMSNorm ε.
    pub eps: f32,
}

/// The Rust side of a shader's `Params` struct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// `size_of` the block (for a struct with a per-head tail: the tail's offset).
    pub size: usize,
    /// Members in declaration order with their byte offsets.
    pub members: Vec<(&'static str, usize)>,
    /// Name of the runtime-sized last member, if the block has one.
    pub tail: Option<&'static str>,
}

macro_rules! layout_of {
    ($ty:ty { $($field:ident),* $(,)? } $(, tail $tail:literal)?) => {
        Layout {
            size: std::mem::size_of::<$ty>(),
            members: vec![$((stringify!($field), std::mem::offset_of!($ty, $field))),*],
            tail: None $(.or(Some($tail)))?,
        }
    };
}

/// The parameter block of `family`, as Rust lays it out (every family has one).
pub fn layout(family: Family) -> Option<Layout> {
    Some(match family {
        Family::Append => layout_of!(AppendParams { kv_heads, cap, head_dim, t, flags }, tail "start"),
        Family::WindowStats => layout_of!(StatsParams { heads, kv_heads, w, n, d, scale, flags, cap }),
        Family::Decode => layout_of!(
            DecodeParams { heads, kv_heads, cap, head_dim, scale, parts, part_len, flags },
            tail "lens"
        ),
        Family::Compact => {
            layout_of!(CompactParams { kv_heads, cap, head_dim, kept_stride, rows_per_chunk }, tail "counts")
        }
        Family::Linear | Family::Linear4 | Family::Gemm => layout_of!(LinearParams { n, d_in, cols, flags, groups_y }),
        Family::Project | Family::Project4 => layout_of!(ProjectParams { d_in, cols, w_stride, flags, eps }),
        Family::Step => layout_of!(StepParams { heads, kv_heads, head_dim, width, eps }),
        Family::QProject => layout_of!(
            QProjectParams { d_in, rows, nb, kind, flags, meta_at, up_at, w_rows, groups_x, row_at, eps },
            tail "ids"
        ),
    })
}
