//! Model configuration, from an HF `config.json` or from GGUF metadata.

use serde_json::Value;

use crate::error::{FormatError, Result};
use crate::gguf::{GgufFile, MetadataArray};

/// Supported decoder architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
}

impl Architecture {
    /// From an HF `model_type` / architecture class name or a GGUF `general.architecture`.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Architecture::Llama),
            "mistral" | "MistralForCausalLM" => Ok(Architecture::Mistral),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Architecture::Qwen2),
            other => Err(FormatError::UnknownArchitecture { name: other.to_string() }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3's wavelength-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: usize },
}

/// Everything the model needs to know about its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU hidden layer.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Per-head width (`hidden_size / num_attention_heads` unless given).
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    /// The output head reuses the token embedding.
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (HF configs may list several).
    pub eos_token_ids: Vec<u32>,
    /// q/k/v projections have biases (always for Qwen2; `attention_bias` for Llama).
    pub attention_qkv_bias: bool,
    /// The output projection has a bias (`attention_bias` for Llama; never for Qwen2).
    pub attention_out_bias: bool,
    /// gate/up/down projections have biases (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Sliding-window attention width, when the model uses one.
    pub sliding_window: Option<usize>,
}

fn cfg_err(reason: impl Into<String>) -> FormatError {
    FormatError::BadConfig { reason: reason.into() }
}

fn req_usize(j: &Value, key: &str) -> Result<usize> {
    opt_usize(j, key)?.ok_or_else(|| cfg_err(format!("missing {key}")))
}

fn opt_usize(j: &Value, key: &str) -> Result<Option<usize>> {
    match j.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| cfg_err(format!("{key} must be a non-negative integer, got {v}"))),
    }
}

fn opt_f64(j: &Value, key: &str) -> Result<Option<f64>> {
    match j.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| cfg_err(format!("{key} must be a number, got {v}"))),
    }
}

fn opt_bool(j: &Value, key: &str) -> Result<Option<bool>> {
    match j.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| cfg_err(format!("{key} must be a bool, got {v}"))),
    }
}

fn token_ids(j: &Value, key: &str) -> Result<Vec<u32>> {
    let one = |v: &Value| {
        v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| cfg_err(format!("{key}: bad token id {v}")))
    };
    match j.get(key) {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// RoPE scaling from an HF dict (`rope_scaling`, or transformers 5's `rope_parameters`).
fn rope_scaling_from(d: &Value) -> Result<Option<RopeScaling>> {
    let kind = d.get("rope_type").or_else(|| d.get("type")).and_then(Value::as_str).unwrap_or("default");
    let f = |key: &str| -> Result<f32> {
        opt_f64(d, key)?.map(|x| x as f32).ok_or_else(|| cfg_err(format!("rope scaling: missing {key}")))
    };
    Ok(match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear { factor: f("factor")? }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: f("factor")?,
            low_freq_factor: f("low_freq_factor")?,
            high_freq_factor: f("high_freq_factor")?,
            original_max_position_embeddings: req_usize(d, "original_max_position_embeddings")?,
        }),
        other => {
            return Err(cfg_err(format!("unsupported rope scaling type {other:?} (supported: linear, llama3)")));
        }
    })
}

impl ModelConfig {
    /// Parse an HF `config.json`.
    pub fn from_hf_json(bytes: &[u8]) -> Result<Self> {
        let j: Value = serde_json::from_slice(bytes).map_err(|e| cfg_err(e.to_string()))?;
        if !j.is_object() {
            return Err(cfg_err("not a JSON object"));
        }
        let arch_name = match j.get("model_type").and_then(Value::as_str) {
            Some(m) => m.to_string(),
            None => j
                .get("architectures")
                .and_then(|a| a.get(0))
                .and_then(Value::as_str)
                .ok_or_else(|| cfg_err("missing model_type and architectures"))?
                .to_string(),
        };
        let architecture = Architecture::from_name(&arch_name)?;
        let hidden_size = req_usize(&j, "hidden_size")?;
        let num_attention_heads = req_usize(&j, "num_attention_heads")?;
        let num_key_value_heads = opt_usize(&j, "num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(cfg_err(format!(
                "num_attention_heads {num_attention_heads} is not a positive multiple of num_key_value_heads {num_key_value_heads}"
            )));
        }
        let head_dim = match opt_usize(&j, "head_dim")? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(cfg_err("hidden_size is not a multiple of num_attention_heads and head_dim is absent"));
            }
        };
        let rope_params = j.get("rope_parameters").filter(|v| v.is_object());
        let rope_theta = opt_f64(&j, "rope_theta")?
            .or(rope_params.map(|p| opt_f64(p, "rope_theta")).transpose()?.flatten())
            .unwrap_or(10000.0) as f32;
        let rope_scaling = match (j.get("rope_scaling").filter(|v| v.is_object()), rope_params) {
            (Some(s), _) => rope_scaling_from(s)?,
            (None, Some(p)) => rope_scaling_from(p)?,
            (None, None) => None,
        };
        let attention_bias = opt_bool(&j, "attention_bias")?.unwrap_or(false);
        let (attention_qkv_bias, attention_out_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let sliding_window = match architecture {
            Architecture::Qwen2 if !opt_bool(&j, "use_sliding_window")?.unwrap_or(false) => None,
            _ => opt_usize(&j, "sliding_window")?,
        };
        let cfg = ModelConfig {
            architecture,
            hidden_size,
            intermediate_size: req_usize(&j, "intermediate_size")?,
            num_hidden_layers: req_usize(&j, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: opt_f64(&j, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: req_usize(&j, "max_position_embeddings")?,
            vocab_size: req_usize(&j, "vocab_size")?,
            tie_word_embeddings: opt_bool(&j, "tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: token_ids(&j, "bos_token_id")?.first().copied(),
            eos_token_ids: token_ids(&j, "eos_token_id")?,
            attention_qkv_bias,
            attention_out_bias,
            mlp_bias: opt_bool(&j, "mlp_bias")?.unwrap_or(false),
            sliding_window,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Derive the configuration from GGUF metadata (`{arch}.*` keys) and tensor shapes.
    ///
    /// The vocabulary size comes from `{arch}.vocab_size`, else the token list, else
    /// `token_embd.weight`; embeddings are tied when `output.weight` is absent; q/k/v
    /// biases are present when `blk.0.attn_q.bias` is.
    pub fn from_gguf<B: AsRef<[u8]>>(gguf: &GgufFile<B>) -> Result<Self> {
        let arch_name = gguf.get_str("general.architecture")?;
        let architecture = match arch_name {
            "llama" | "mistral" | "qwen2" => Architecture::from_name(arch_name)?,
            other => {
                return Err(FormatError::UnknownArchitecture { name: other.to_string() });
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            let full = key(k);
            let v = gguf.get_u64(&full)?.ok_or(FormatError::MissingKey { key: full.clone() })?;
            usize::try_from(v).map_err(|_| FormatError::BadMetadata { key: full, reason: format!("{v} is too large") })
        };
        let opt =
            |k: &str| -> Result<Option<usize>> { Ok(gguf.get_u64(&key(k))?.and_then(|v| usize::try_from(v).ok())) };
        let hidden_size = req("embedding_length")?;
        let num_attention_heads = req("attention.head_count")?;
        let num_key_value_heads = opt("attention.head_count_kv")?.unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(FormatError::BadMetadata {
                key: key("attention.head_count_kv"),
                reason: format!(
                    "{num_attention_heads} heads is not a positive multiple of {num_key_value_heads} kv heads"
                ),
            });
        }
        let head_dim = match opt("attention.key_length")?.or(opt("rope.dimension_count")?) {
            Some(d) => d,
            None => hidden_size / num_attention_heads,
        };
        let vocab_size = match opt("vocab_size")? {
            Some(v) => v,
            None => match gguf.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
                Some(a) => MetadataArray::len(a),
                None => gguf
                    .tensor_info("token_embd.weight")
                    .map(|t| t.shape()[0])
                    .ok_or_else(|| FormatError::MissingKey { key: key("vocab_size") })?,
            },
        };
        let rope_scaling = match gguf.get(&key("rope.scaling.type")) {
            None => None,
            Some(v) => {
                let kind = v.as_str().ok_or_else(|| FormatError::BadMetadata {
                    key: key("rope.scaling.type"),
                    reason: "expected a string".into(),
                })?;
                let factor = gguf.get_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0) as f32;
                match kind {
                    "none" => None,
                    "linear" => Some(RopeScaling::Linear { factor }),
                    other => {
                        return Err(FormatError::BadMetadata {
                            key: key("rope.scaling.type"),
                            reason: format!("unsupported rope scaling {other:?} (supported: none, linear)"),
                        });
                    }
                }
            }
        };
        if gguf.tensor_info("rope_freqs.weight").is_some() {
            return Err(FormatError::BadMetadata {
                key: "rope_freqs.weight".into(),
                reason: "per-frequency RoPE factors (Llama 3 scaling in GGUF) are not supported".into(),
            });
        }
        let cfg = ModelConfig {
            architecture,
            hidden_size,
            intermediate_size: req("feed_forward_length")?,
            num_hidden_layers: req("block_count")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: gguf.get_f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32,
            rope_theta: gguf.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32,
            rope_scaling,
            max_position_embeddings: req("context_length")?,
            vocab_size,
            tie_word_embeddings: gguf.tensor_info("output.weight").is_none(),
            bos_token_id: gguf.get_u64("tokenizer.ggml.bos_token_id")?.and_then(|v| u32::try_from(v).ok()),
            eos_token_ids: gguf
                .get_u64("tokenizer.ggml.eos_token_id")?
                .and_then(|v| u32::try_from(v).ok())
                .into_iter()
                .collect(),
            attention_qkv_bias: gguf.tensor_info("blk.0.attn_q.bias").is_some(),
            attention_out_bias: gguf.tensor_info("blk.0.attn_output.bias").is_some(),
            mlp_bias: false,
            sliding_window: opt("attention.sliding_window")?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let dims = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in dims {
            // Bounded so that products of a few of them cannot overflow.
            if v == 0 || v > 1 << 24 {
                return Err(cfg_err(format!("{name} = {v} is out of range")));
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(cfg_err(format!("head_dim {} is odd; RoPE needs pairs", self.head_dim)));
        }
        if self.num_attention_heads > 4096 {
            return Err(cfg_err(format!("num_attention_heads = {} is out of range", self.num_attention_heads)));
        }
        Ok(())
    }

    /// Number of query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}
