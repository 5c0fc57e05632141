//! The kvslice runtime: device selection, model loading, and sessions that prefill, compress
//! and decode over the KV cache. No filesystem access or threads below the `fs` helpers, so the
//! crate builds for `wasm32-unknown-unknown`.
//!
//! Embedders need only this crate: it re-exports the model ([`Llama`], [`LoadedModel`]), the
//! policy registry ([`policies`]), the cache ([`KvCache`]) and the kernel conformance suite
//! ([`conformance`]). The one generation loop is [`Generator`], over the step primitive
//! [`Session::step`].

pub mod calibrate;
pub mod device;
pub mod error;
pub mod evict;
pub mod generate;
mod host;
pub mod limits;
pub mod loading;
#[cfg(not(target_family = "wasm"))]
pub mod paths;
pub mod perplexity;
pub mod sampling;
pub mod session;
#[cfg(test)]
mod testing;
pub mod traces;

pub use burn::tensor::Device;
#[cfg(not(target_family = "wasm"))]
pub use device::list_adapters;
pub use device::{AdapterEntry, DeviceChoice, DeviceInfo, GraphicsApi, device_info, init_device};
pub use error::{Result, RuntimeError};
pub use evict::{Compression, CompressionReport, DecodeEviction, DecodeRule, ReconstructionPrompt, StatsRequest};
pub use generate::{GenerateOptions, GenerationStats, Generator, TextStream, Token, reusable_prefix};
pub use host::read_f32;
pub use kvslice_cache::{CacheGeometry, KvCache, KvDtype, LayerKv};
pub use kvslice_formats::{ChatMessage, ModelConfig, Tokenizer};
/// Every kernel against its CPU twin on a device: the cross-vendor check.
pub use kvslice_kernels::conformance;
/// Kernel launches counted as they are submitted (`kvslice bench`'s dispatches per token).
pub use kvslice_kernels::dispatch;
pub use kvslice_model::Llama;
pub use kvslice_model::lowrank;
pub use kvslice_model::model::PREFILL_CHUNK;
pub use kvslice_model::progress;
pub use loading::LoadedModel;
pub use perplexity::{Perplexity, perplexity};
pub use sampling::Sampler;
pub use session::{Prefilled, Session};

/// The eviction policies: the registry the CLI lists and the options each declares.
pub mod policies {
    /// DistillCache's networks and their training ([`crate::traces`] records the traces).
    pub use kvslice_policy::learn;
    pub use kvslice_policy::scorer::distill;
    pub use kvslice_policy::scorer::random::splitmix64;
    pub use kvslice_policy::{
        BudgetSpec, DecodeRule, DecodeSpec, Entry, ModelInfo, OptionKind, OptionSpec, Policy, PolicySpec, build_spec,
        listing, listing_verbose, lookup, registry,
    };
}
