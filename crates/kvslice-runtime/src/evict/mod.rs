//! Eviction in the runtime: prefill → statistics → policy → compaction → decode.
//!
//! A [`Compression`] is a registered policy with a budget. After the prompt's forward pass
//! (which records the statistics the policy needs, see [`observe`]), the policy's plan chooses
//! the kept positions of every (layer, KV head), and [`compress_cache`] gathers them into new,
//! smaller storage: the full cache is then dropped, so the memory is really freed. Keys are
//! stored after RoPE, so decoding continues at the original positions over ragged per-head
//! caches. With latent keys ([`kvslice_model::Llama::latent_layouts`]) the heads of a latent
//! group share one set of entries, and each choice per head becomes one per group
//! ([`latent`]).
//!
//! Decode-time policies (StreamingLLM, H2O, TOVA, LaCache) keep the cache at its budget while
//! decoding: a new token takes the slot of the entry the policy evicts ([`DecodeEviction`]).
//! The other policies evict once, after the prefill, and the cache grows by the generated
//! tokens, unless asked to recompress every N decode steps (`every=N`, [`recompress`]).

mod attention;
#[cfg(not(target_family = "wasm"))]
pub(crate) mod cascade;
mod compress;
mod decode;
mod latent;
pub mod observe;
mod recompress;
pub(crate) mod reconstruct;

pub use compress::{Compression, CompressionReport, compress, compress_cache, renumber, value_proj_l1};
pub use decode::DecodeEviction;
pub(crate) use decode::EvictingStore;
pub use kvslice_policy::DecodeRule;
pub use observe::{HostLayerStats, Observations, StatsRequest};
pub use reconstruct::ReconstructionPrompt;
