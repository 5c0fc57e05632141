//! WGSL kernels for KV-cache eviction, run on Burn's wgpu tensors, each with a CPU twin.
//!
//! | kernel | function | shader |
//! |---|---|---|
//! | 1. window statistics | [`window_stats`] | `shaders/window_stats.wgsl` |
//! | 2. pooling, GQA reduction | [`pool1d`], [`reduce_groups`] | `shaders/reduce.wgsl` |
//! | 3. top-k per KV head | [`top_k`] | `shaders/topk.wgsl` |
//! | 4. in-place compaction, append | [`compact_in_place`], [`append_rows`] | `shaders/compact.wgsl`, `shaders/append.wgsl` |
//! | 5. ragged decode attention | [`decode_attention`] | `shaders/decode.wgsl` |
//! | 6. skinny projection `x·W + b` | [`linear`] | `shaders/linear.wgsl` |
//!
//! Every function validates shapes, lengths, capacities and `head_dim` and returns a
//! [`KernelError`] before dispatching anything; it then only queues work on the tensors'
//! device (no host round trip). Tensors must belong to Burn's wgpu backend (`Device::wgpu`);
//! floats are f32. The CPU twins in [`cpu`] define what each kernel computes; [`shader`]
//! holds the shader table and the naga portability check; [`conformance`] runs every kernel
//! against its twin on any wgpu device, the browser's included.

mod compact;
pub mod conformance;
pub mod cpu;
mod decode;
mod error;
mod gpu;
mod linear;
mod reduce;
pub mod shader;
mod stats;
mod topk;

pub use compact::{CacheTensors, append_rows, compact_in_place, compact_in_place_host};
pub use decode::decode_attention;
pub use error::{KernelError, Result};
pub use gpu::{BufferId, buffer_id, int_buffer_id};
pub use linear::linear;
pub use reduce::{Reduce, pool1d, reduce_groups};
pub use shader::MAX_HEAD_DIM;
pub use stats::{StatsRequest, WindowStats, window_stats};
pub use topk::{Kept, Protect, kept_count, top_k};
