//! Model weights from GGUF or safetensors under one canonical naming.
//!
//! Canonical names are the HF ones (`model.layers.{i}.self_attn.q_proj.weight`, ...)
//! and every 2-D weight is in HF layout `[out_features, in_features]`, row-major f32.
//! GGUF names are mapped in [`gguf_name`]; GGUF Q/K rows of llama-architecture files are
//! un-permuted ([`crate::gguf::unpermute_rope_rows`]). Both sources check every tensor the
//! configuration needs — present, and of the expected shape — when they are opened, and
//! then hand out one tensor at a time with [`WeightSource::load`].

use std::collections::HashMap;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

use crate::config::{Architecture, ModelConfig};
use crate::error::{FormatError, Result};
use crate::gguf::{GgmlType, GgufFile, unpermute_rope_rows};

/// A dense f32 tensor, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The block formats a matrix can keep on the device as stored (see [`WeightSource::load_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum BlockFormat {
    /// 32 values per 34-byte block: an f16 scale `d`, 32 signed bytes `q`; `x = d·q`.
    Q8_0,
    /// 32 values per 18-byte block: an f16 scale `d`, 16 bytes of nibbles (value `j` in the low
    /// nibble of byte `j`, value `j + 16` in its high nibble); `x = d·(q − 8)`.
    Q4_0,
    /// 32 values per 20-byte block: f16 `d` and `m`, then the nibbles as [`BlockFormat::Q4_0`];
    /// `x = d·q + m`.
    Q4_1,
    /// 32 values per 22-byte block: an f16 scale `d`, 4 bytes of fifth bits `qh` (bit `j` for
    /// value `j`), the nibbles as [`BlockFormat::Q4_0`]; `x = d·(q − 16)`.
    Q5_0,
    /// 32 values per 24-byte block: f16 `d` and `m`, then `qh` and the nibbles as
    /// [`BlockFormat::Q5_0`]; `x = d·q + m`.
    Q5_1,
    /// IEEE binary16 values, 32 (64 bytes) to a block.
    F16,
    /// bfloat16 values, 32 (64 bytes) to a block.
    BF16,
    /// 256 values per 144-byte super-block: f16 `d` and `dmin`, 6-bit scales and minimums of
    /// eight sub-blocks, 4-bit values (ggml's `block_q4_K`).
    Q4_K,
    /// 256 values per 176-byte super-block: [`BlockFormat::Q4_K`] with a fifth bit per value.
    Q5_K,
    /// 256 values per 210-byte super-block: 6-bit values, 8-bit scales of sixteen sub-blocks,
    /// f16 `d` last (ggml's `block_q6_K`).
    Q6_K,
}

impl BlockFormat {
    /// Values per block of the 32-value formats.
    pub const VALUES: usize = 32;

    /// Values per block: 256 for the K-quants' super-blocks, else 32.
    pub fn values(self) -> usize {
        match self {
            BlockFormat::Q4_K | BlockFormat::Q5_K | BlockFormat::Q6_K => 256,
            _ => Self::VALUES,
        }
    }

    /// Bytes per block in the file.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::F16 | BlockFormat::BF16 => 64,
            BlockFormat::Q4_K => 144,
            BlockFormat::Q5_K => 176,
            BlockFormat::Q6_K => 210,
        }
    }
}

/// A 2-D weight as its file stores it: `rows` rows (HF layout: output features) of `cols`
/// values each (input features, a multiple of the format's block), every row `cols / V` blocks
/// (`V` = [`BlockFormat::values`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks {
    pub format: BlockFormat,
    pub rows: usize,
    pub cols: usize,
    /// `rows · cols / V` blocks, row after row.
    pub bytes: Vec<u8>,
}

/// A canonical tensor name with the shape the configuration implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<usize>,
}

/// Canonical name of a per-layer tensor: `layer_tensor(3, "self_attn.q_proj.weight")`.
pub fn layer_tensor(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// Per-layer canonical suffixes and their GGUF counterparts.
const LAYER_NAMES: [(&str, &str); 16] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.bias", "attn_output.bias"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
    ("mlp.gate_proj.bias", "ffn_gate.bias"),
    ("mlp.up_proj.bias", "ffn_up.bias"),
    ("mlp.down_proj.bias", "ffn_down.bias"),
];

/// The GGUF name of a canonical tensor name, or `None` if it has no GGUF counterpart.
pub fn gguf_name(canonical: &str) -> Option<String> {
    match canonical {
        EMBED_TOKENS => return Some("token_embd.weight".into()),
        FINAL_NORM => return Some("output_norm.weight".into()),
        LM_HEAD => return Some("output.weight".into()),
        _ => {}
    }
    let rest = canonical.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (_, g) = LAYER_NAMES.iter().find(|(c, _)| *c == suffix)?;
    Some(format!("blk.{layer}.{g}"))
}

/// Every tensor the configuration needs, with its HF-layout shape, in file order (embedding,
/// layer by layer, final norm, output head). Lazy: a header that claims millions of layers costs
/// nothing until a tensor is found missing (the first check stops there).
pub fn expected_tensors(cfg: &ModelConfig) -> impl Iterator<Item = ExpectedTensor> + use<> {
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let i = cfg.intermediate_size;
    let (qkv_bias, out_bias, mlp_bias) = (cfg.attention_qkv_bias, cfg.attention_out_bias, cfg.mlp_bias);
    let embed = ExpectedTensor { name: EMBED_TOKENS.into(), shape: vec![cfg.vocab_size, h] };
    let layers = (0..cfg.num_hidden_layers).flat_map(move |l| {
        let mut out = Vec::with_capacity(16);
        let mut push =
            |suffix: &str, shape: Vec<usize>| out.push(ExpectedTensor { name: layer_tensor(l, suffix), shape });
        push("input_layernorm.weight", vec![h]);
        push("self_attn.q_proj.weight", vec![q, h]);
        push("self_attn.k_proj.weight", vec![kv, h]);
        push("self_attn.v_proj.weight", vec![kv, h]);
        push("self_attn.o_proj.weight", vec![h, q]);
        if qkv_bias {
            push("self_attn.q_proj.bias", vec![q]);
            push("self_attn.k_proj.bias", vec![kv]);
            push("self_attn.v_proj.bias", vec![kv]);
        }
        if out_bias {
            push("self_attn.o_proj.bias", vec![h]);
        }
        push("post_attention_layernorm.weight", vec![h]);
        push("mlp.gate_proj.weight", vec![i, h]);
        push("mlp.up_proj.weight", vec![i, h]);
        push("mlp.down_proj.weight", vec![h, i]);
        if mlp_bias {
            push("mlp.gate_proj.bias", vec![i]);
            push("mlp.up_proj.bias", vec![i]);
            push("mlp.down_proj.bias", vec![h]);
        }
        out
    });
    let norm = ExpectedTensor { name: FINAL_NORM.into(), shape: vec![h] };
    let head =
        (!cfg.tie_word_embeddings).then(|| ExpectedTensor { name: LM_HEAD.into(), shape: vec![cfg.vocab_size, h] });
    std::iter::once(embed).chain(layers).chain(std::iter::once(norm)).chain(head)
}

/// A source of model weights under canonical names.
pub trait WeightSource {
    /// The configuration the weights were checked against.
    fn config(&self) -> &ModelConfig;
    /// Shape of a tensor (HF layout) without reading it.
    fn shape(&self, canonical: &str) -> Option<Vec<usize>>;
    /// Read and convert one tensor to f32 in HF layout.
    fn load(&self, canonical: &str) -> Result<Tensor>;
    /// The bytes one tensor takes in its file, as stored (quantized blocks included); `None`
    /// where the source has no file behind it.
    fn stored_bytes(&self, _canonical: &str) -> Option<u64> {
        None
    }
    /// One 2-D tensor's blocks as stored, rows in HF order, when the file holds it in a
    /// [`BlockFormat`] (F16 and BF16 only when its rows are whole blocks of 32); `None` for
    /// any other element type or shape (load it with [`WeightSource::load`]).
    fn load_blocks(&self, _canonical: &str) -> Result<Option<Blocks>> {
        Ok(None)
    }
}

/// The bytes the tensors of `source`'s model take in their files (what [`expected_tensors`]
/// names, each once); `None` if any of them has no stored size.
pub fn model_file_bytes(source: &dyn WeightSource) -> Option<u64> {
    expected_tensors(source.config()).map(|e| source.stored_bytes(&e.name)).sum()
}

fn check_all(cfg: &ModelConfig, shape_of: impl Fn(&str) -> Option<Vec<usize>>) -> Result<()> {
    for e in expected_tensors(cfg) {
        match shape_of(&e.name) {
            None => return Err(FormatError::MissingTensor { tensor: e.name }),
            Some(got) if got != e.shape => {
                return Err(FormatError::ShapeMismatch { tensor: e.name, expected: e.shape, got });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Weights in a GGUF file, dequantized tensor by tensor.
#[derive(Debug)]
pub struct GgufWeights<B: AsRef<[u8]>> {
    file: GgufFile<B>,
    config: ModelConfig,
}

impl<B: AsRef<[u8]>> GgufWeights<B> {
    /// Parse a GGUF file, derive its configuration and check every tensor's shape.
    pub fn new(bytes: B) -> Result<Self> {
        Self::from_file(GgufFile::parse(bytes)?)
    }

    /// Use an already parsed file.
    pub fn from_file(file: GgufFile<B>) -> Result<Self> {
        let config = ModelConfig::from_gguf(&file)?;
        let w = GgufWeights { file, config };
        check_all(&w.config, |n| w.shape(n))?;
        // The types are checked now so that a loader fails before it starts.
        for e in expected_tensors(&w.config) {
            let info = w
                .file
                .tensor_info(&gguf_name(&e.name).expect("expected tensors all map to GGUF"))
                .expect("checked above");
            if !info.ggml_type.is_supported() {
                return Err(FormatError::UnsupportedGgmlType {
                    tensor: info.name.clone(),
                    type_name: info.ggml_type.name(),
                });
            }
        }
        Ok(w)
    }

    pub fn file(&self) -> &GgufFile<B> {
        &self.file
    }

    /// Give the parsed file back (for building the tokenizer from its metadata).
    pub fn into_file(self) -> GgufFile<B> {
        self.file
    }
}

impl<B: AsRef<[u8]>> WeightSource for GgufWeights<B> {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn shape(&self, canonical: &str) -> Option<Vec<usize>> {
        self.file.tensor_info(&gguf_name(canonical)?).map(|t| t.shape())
    }

    fn stored_bytes(&self, canonical: &str) -> Option<u64> {
        self.file.tensor_info(&gguf_name(canonical)?).map(|t| t.n_bytes)
    }

    fn load_blocks(&self, canonical: &str) -> Result<Option<Blocks>> {
        let Some(info) = gguf_name(canonical).and_then(|name| self.file.tensor_info(&name)) else {
            return Err(FormatError::MissingTensor { tensor: canonical.to_string() });
        };
        let format = match info.ggml_type {
            GgmlType::Q8_0 => BlockFormat::Q8_0,
            GgmlType::Q4_0 => BlockFormat::Q4_0,
            GgmlType::Q4_1 => BlockFormat::Q4_1,
            GgmlType::Q5_0 => BlockFormat::Q5_0,
            GgmlType::Q5_1 => BlockFormat::Q5_1,
            GgmlType::F16 => BlockFormat::F16,
            GgmlType::BF16 => BlockFormat::BF16,
            GgmlType::Q4_K => BlockFormat::Q4_K,
            GgmlType::Q5_K => BlockFormat::Q5_K,
            GgmlType::Q6_K => BlockFormat::Q6_K,
            _ => return Ok(None),
        };
        let shape = info.shape();
        let [rows, cols] = shape[..] else { return Ok(None) };
        if matches!(format, BlockFormat::F16 | BlockFormat::BF16) && !cols.is_multiple_of(BlockFormat::VALUES) {
            return Ok(None);
        }
        let row_bytes = cols / format.values() * format.block_bytes();
        let raw = self.file.tensor_bytes(info);
        if !cols.is_multiple_of(format.values()) || raw.len() != rows * row_bytes {
            return Err(FormatError::ShapeMismatch {
                tensor: canonical.to_string(),
                expected: vec![rows * row_bytes],
                got: vec![raw.len()],
            });
        }
        let mut bytes = raw.to_vec();
        if let Some(n_head) = self.rope_heads(canonical) {
            // Rows move whole, so the un-permutation works on the blocks as it does on values.
            let order = unpermute_rope_rows(&(0..rows).map(|r| r as f32).collect::<Vec<_>>(), n_head, 1)?;
            for (hf_row, &from) in order.iter().enumerate() {
                let from = from as usize;
                bytes[hf_row * row_bytes..(hf_row + 1) * row_bytes]
                    .copy_from_slice(&raw[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
        Ok(Some(Blocks { format, rows, cols, bytes }))
    }

    fn load(&self, canonical: &str) -> Result<Tensor> {
        let name = gguf_name(canonical).ok_or_else(|| FormatError::MissingTensor { tensor: canonical.to_string() })?;
        let info =
            self.file.tensor_info(&name).ok_or_else(|| FormatError::MissingTensor { tensor: canonical.to_string() })?;
        let shape = info.shape();
        let mut data = self.file.tensor_f32(&name)?;
        if let Some(n_head) = self.rope_heads(canonical) {
            let cols = if shape.len() == 2 { shape[1] } else { 1 };
            data = unpermute_rope_rows(&data, n_head, cols)?;
        }
        Ok(Tensor { shape, data })
    }
}

impl<B: AsRef<[u8]>> GgufWeights<B> {
    /// The head count whose rows the file permuted, for a Q or K weight or bias: llama.cpp
    /// permutes Q/K rows of llama-architecture models for its RoPE layout
    /// (convert_hf_to_gguf.py, LlamaModel.modify_tensors); Qwen2 files are not permuted.
    fn rope_heads(&self, canonical: &str) -> Option<usize> {
        if !matches!(self.config.architecture, Architecture::Llama | Architecture::Mistral) {
            return None;
        }
        if canonical.ends_with("self_attn.q_proj.weight") || canonical.ends_with("self_attn.q_proj.bias") {
            Some(self.config.num_attention_heads)
        } else if canonical.ends_with("self_attn.k_proj.weight") || canonical.ends_with("self_attn.k_proj.bias") {
            Some(self.config.num_key_value_heads)
        } else {
            None
        }
    }
}

struct StEntry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// Weights in one or more safetensors files (a single `model.safetensors` or the shards
/// listed in `model.safetensors.index.json`).
pub struct SafetensorsWeights<B: AsRef<[u8]>> {
    config: ModelConfig,
    shards: Vec<(String, B)>,
    entries: HashMap<String, StEntry>,
}

impl<B: AsRef<[u8]>> std::fmt::Debug for SafetensorsWeights<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsWeights")
            .field("config", &self.config)
            .field("shards", &self.shards.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("tensors", &self.entries.len())
            .finish()
    }
}

/// The shard file names listed in a `model.safetensors.index.json`, sorted, unique.
pub fn safetensors_index_files(index_json: &[u8]) -> Result<Vec<String>> {
    let bad = |reason: String| FormatError::BadIndex { reason };
    let j: serde_json::Value = serde_json::from_slice(index_json).map_err(|e| bad(e.to_string()))?;
    let map = j.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no weight_map object".into()))?;
    let mut files = Vec::new();
    for (tensor, file) in map {
        let f = file.as_str().ok_or_else(|| bad(format!("{tensor}: file name is not a string")))?;
        if f.is_empty() || f.contains('/') || f.contains('\\') || f == ".." {
            return Err(bad(format!("{tensor}: file name {f:?} is not a plain file name")));
        }
        files.push(f.to_string());
    }
    files.sort();
    files.dedup();
    Ok(files)
}

impl<B: AsRef<[u8]>> SafetensorsWeights<B> {
    /// Index the tensors of every shard (`(file name, bytes)`) and check them against
    /// `config`. Only headers are parsed here.
    pub fn new(config: ModelConfig, shards: Vec<(String, B)>) -> Result<Self> {
        let mut entries = HashMap::new();
        for (i, (file, bytes)) in shards.iter().enumerate() {
            let (n, meta) = SafeTensors::read_metadata(bytes.as_ref())
                .map_err(|e| FormatError::BadSafetensors { file: file.clone(), reason: e.to_string() })?;
            let data_start = 8 + n;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                let entry = StEntry {
                    shard: i,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + s,
                    end: data_start + e,
                };
                if entries.insert(name.clone(), entry).is_some() {
                    return Err(FormatError::DuplicateTensor { tensor: name });
                }
            }
        }
        let w = SafetensorsWeights { config, shards, entries };
        check_all(&w.config, |n| w.shape(n))?;
        for e in expected_tensors(&w.config) {
            let dtype = w.entries[&e.name].dtype;
            if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                return Err(FormatError::UnsupportedDtype { tensor: e.name, dtype: format!("{dtype:?}") });
            }
        }
        Ok(w)
    }

    /// Names of all tensors in the files (canonical HF names).
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }
}

impl<B: AsRef<[u8]>> WeightSource for SafetensorsWeights<B> {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn shape(&self, canonical: &str) -> Option<Vec<usize>> {
        self.entries.get(canonical).map(|e| e.shape.clone())
    }

    fn stored_bytes(&self, canonical: &str) -> Option<u64> {
        self.entries.get(canonical).map(|e| (e.end - e.start) as u64)
    }

    fn load_blocks(&self, canonical: &str) -> Result<Option<Blocks>> {
        let e =
            self.entries.get(canonical).ok_or_else(|| FormatError::MissingTensor { tensor: canonical.to_string() })?;
        let format = match e.dtype {
            Dtype::F16 => BlockFormat::F16,
            Dtype::BF16 => BlockFormat::BF16,
            _ => return Ok(None),
        };
        let [rows, cols] = e.shape[..] else { return Ok(None) };
        if !cols.is_multiple_of(BlockFormat::VALUES) {
            return Ok(None);
        }
        // In bounds and of the shape's length: read_metadata checked both.
        let bytes = self.shards[e.shard].1.as_ref()[e.start..e.end].to_vec();
        Ok(Some(Blocks { format, rows, cols, bytes }))
    }

    fn load(&self, canonical: &str) -> Result<Tensor> {
        let e =
            self.entries.get(canonical).ok_or_else(|| FormatError::MissingTensor { tensor: canonical.to_string() })?;
        // In bounds: read_metadata checked the offsets against the buffer.
        let raw = &self.shards[e.shard].1.as_ref()[e.start..e.end];
        let data: Vec<f32> = match e.dtype {
            Dtype::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::F16 => {
                raw.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            }
            Dtype::BF16 => {
                raw.chunks_exact(2).map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect()
            }
            other => {
                return Err(FormatError::UnsupportedDtype {
                    tensor: canonical.to_string(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(Tensor { shape: e.shape.clone(), data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names() {
        assert_eq!(gguf_name("model.layers.12.self_attn.k_proj.weight").as_deref(), Some("blk.12.attn_k.weight"));
        assert_eq!(gguf_name("model.layers.0.mlp.down_proj.weight").as_deref(), Some("blk.0.ffn_down.weight"));
        assert_eq!(
            gguf_name("model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(gguf_name(LM_HEAD).as_deref(), Some("output.weight"));
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(gguf_name("model.layers.1.unknown"), None);
    }
}
