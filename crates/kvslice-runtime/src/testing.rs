//! The unit tests' model: the tiny seeded decoder of `tests/golden/tiny/llama` (3 layers,
//! 2 KV heads, head dimension 16, context 512, vocabulary 256) on Burn's CPU backend.

use std::path::PathBuf;

use burn::tensor::Device;
use kvslice_formats::{ModelConfig, SafetensorsWeights};
use kvslice_model::Llama;

pub(crate) fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

pub(crate) fn tiny() -> Llama {
    let dir = golden().join("tiny/llama");
    let config = ModelConfig::from_hf_json(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let shard = ("model.safetensors".to_string(), std::fs::read(dir.join("model.safetensors")).unwrap());
    let weights = SafetensorsWeights::new(config, vec![shard]).unwrap();
    kvslice_model::load::load_llama(&weights, &Device::flex()).unwrap()
}

/// `n` token ids of the tiny vocabulary, the special ids 0..3 avoided.
pub(crate) fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 37 + 11) % 250).collect()
}
