//! Model file formats with no GPU dependency: GGUF (with dequantization), safetensors
//! folders, model configurations and tokenizers.
//!
//! The core API parses from bytes (`&[u8]`, `Vec<u8>`, or anything `AsRef<[u8]>`) so it
//! works on wasm32; [`fs`] adds thin file-system helpers on native targets.
//!
//! - [`gguf::GgufFile`]: a validated GGUF header over its bytes; tensors dequantized to
//!   f32 one at a time.
//! - [`ModelConfig`]: from `config.json` or GGUF metadata.
//! - [`WeightSource`]: canonical (HF) tensor names in HF layout, implemented by
//!   [`GgufWeights`] and [`SafetensorsWeights`], both checked against the config.
//! - [`Tokenizer`]: from `tokenizer.json` or rebuilt from GGUF metadata, with a ChatML
//!   chat-template renderer.

pub mod chat;
pub mod config;
mod error;
pub mod gguf;
pub mod lowrank;
pub mod tokenizer;
pub mod weights;

#[cfg(not(target_arch = "wasm32"))]
pub mod fs;

pub use chat::{ChatMessage, ChatSegment, ChatTemplate, SegmentKind};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use error::{FormatError, Result};
pub use tokenizer::{GgufPreTokenizer, HfTokenizerFiles, Tokenizer};
pub use weights::{
    BlockFormat, Blocks, EMBED_TOKENS, ExpectedTensor, FINAL_NORM, GgufWeights, LM_HEAD, SafetensorsWeights, Tensor,
    WeightSource, expected_tensors, gguf_name, layer_tensor, model_file_bytes, safetensors_index_files,
};
