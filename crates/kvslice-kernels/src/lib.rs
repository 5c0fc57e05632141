//! WGSL kernels for KV-cache eviction, run on Burn's wgpu tensors, each with a CPU twin.
//!
//! | kernel | function | shader |
//! |---|---|---|
//! | 1. window statistics | [`window_stats`] | `shaders/window_stats.wgsl` |
//! | 2. in-place compaction, append, slot writes | [`compact_in_place_host`], [`append_rows`], [`write_rows`] | `shaders/compact.wgsl`, `shaders/append.wgsl` |
//! | 3. ragged decode attention | [`decode_attention`] | `shaders/decode.wgsl` |
//! | 4. skinny projection `x·W + b` | [`linear`] | `shaders/linear.wgsl` |
//! | 5. fused decode-step stages | [`project`], [`rope_split`], [`rms_norm`] | `shaders/project.wgsl`, `shaders/step.wgsl` |
//! | 6. projections over quantized blocks | [`qproject`], [`dequantize`] | `shaders/qproject.wgsl` |
//! | 7. tiled projection `x·W + b` (prefill) | [`gemm`] | `shaders/gemm.wgsl` |
//!
//! Every function validates shapes, lengths, capacities and `head_dim` and returns a
//! [`KernelError`] before dispatching anything; it then only queues work on the tensors'
//! device (no host round trip). Tensors must belong to Burn's wgpu backend (`Device::wgpu`);
//! floats are f32. The CPU twins in [`cpu`] define what each kernel computes; [`shader`]
//! holds the shader table and the naga portability check; [`conformance`] runs every kernel
//! against its twin on any wgpu device, the browser's included; [`dispatch`] counts the kernel
//! launches (Burn's and these) that a stretch of work submits.

mod compact;
pub mod conformance;
pub mod cpu;
mod decode;
pub mod dispatch;
mod error;
mod fused;
mod gemm;
mod gpu;
mod linear;
mod params;
mod quant;
pub mod shader;
mod stats;

pub use compact::{CacheTensors, append_rows, compact_in_place_host, write_rows};
pub use decode::decode_attention;
pub use error::{KernelError, Result};
pub use fused::{Fusion, QkvRow, project, rms_norm, rope_split};
pub use gemm::gemm;
pub use gpu::{BufferId, buffer_id, flush_interval, int_buffer_id, set_flush_interval};
pub use linear::linear;
pub use params::{Layout, layout};
pub use quant::{QuantFormat, QuantMatrix, dequantize, pack_blocks, qproject};
pub use shader::MAX_HEAD_DIM;
pub use stats::{StatsRequest, WindowStats, window_stats};
