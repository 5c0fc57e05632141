//! Llama-family decoders (Llama, Mistral, Qwen2, SmolLM2) as Burn modules, generic over the
//! device: wgpu (WGSL on Vulkan, Metal, DX12, GL, WebGPU) or Burn's CPU backend.
//!
//! Weights come from [`kvslice_formats`] (HF folders, GGUF) through [`load`]; the model reads
//! and writes keys/values through [`kvslice_cache::KvStore`] and knows nothing of eviction.

pub mod config;
pub mod error;
#[cfg(not(target_family = "wasm"))]
pub mod flash;
pub mod load;
pub mod lowrank;
pub mod model;
pub mod progress;
pub mod rope;
#[cfg(not(target_family = "wasm"))]
pub mod window;

pub use config::{Architecture, LlamaConfig, RopeScaling};
pub use error::{ModelError, Result};
pub use model::Llama;
