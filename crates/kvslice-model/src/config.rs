//! The model's configuration: every field a Llama-family decoder needs, nothing about files.

use crate::error::{ModelError, Result};

/// Architecture family. They share one decoder; the differences are data (biases, scaling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (HF `rope_type: linear`).
    Linear { factor: f64 },
    /// Llama 3.1's wavelength-dependent scaling (HF `rope_type: llama3`).
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

/// Configuration of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP's hidden layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads per layer.
    pub num_heads: usize,
    /// Key/value heads per layer (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Dimension of one head (usually `hidden_size / num_heads`).
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Longest sequence the model was trained for.
    pub max_position_embeddings: usize,
    /// Output head shares the token embedding.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
    /// The output projection carries a bias.
    pub attention_out_bias: bool,
    /// The MLP projections carry biases.
    pub mlp_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl LlamaConfig {
    /// Query heads sharing one KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Rejects configurations no decoder can run, before any allocation.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(ModelError::Config(msg));
        let dims = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in dims {
            if v == 0 {
                return bad(format!("{name} is 0"));
            }
            if v > 1 << 24 {
                return bad(format!("{name} = {v} is implausibly large"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return bad(format!("rms_norm_eps {} out of range", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return bad(format!("rope_theta {} out of range", self.rope_theta));
        }
        self.validate_rope_scaling()
    }

    /// Scaling factors that would divide by zero, flip or NaN the frequencies are refused (HF
    /// transformers only warns about some of them, then computes NaN logits).
    fn validate_rope_scaling(&self) -> Result<()> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ModelError::Config(format!("rope_scaling.{name} = {v} must be a finite number > 0")))
            }
        };
        match self.rope_scaling {
            RopeScaling::None => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(ModelError::Config(format!(
                        "rope_scaling.high_freq_factor {high_freq_factor} must exceed low_freq_factor \
                         {low_freq_factor} (the smoothing between them divides by their difference)"
                    )));
                }
                if original_max_position_embeddings == 0 {
                    return Err(ModelError::Config("rope_scaling.original_max_position_embeddings is 0".into()));
                }
                Ok(())
            }
        }
    }

    /// Parameters of the model (for reports).
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let d = self.head_dim;
        let attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2;
        let mlp = 3 * h * self.intermediate_size;
        let emb = self.vocab_size * h * if self.tie_word_embeddings { 1 } else { 2 };
        emb + self.num_layers * (attn + mlp + 2 * h) + h
    }
}

impl From<&kvslice_formats::ModelConfig> for LlamaConfig {
    fn from(c: &kvslice_formats::ModelConfig) -> Self {
        use kvslice_formats::{Architecture as A, RopeScaling as R};
        Self {
            architecture: match c.architecture {
                A::Llama => Architecture::Llama,
                A::Mistral => Architecture::Mistral,
                A::Qwen2 => Architecture::Qwen2,
            },
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps as f64,
            rope_theta: c.rope_theta as f64,
            rope_scaling: match c.rope_scaling {
                None => RopeScaling::None,
                Some(R::Linear { factor }) => RopeScaling::Linear { factor: factor as f64 },
                Some(R::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
                    RopeScaling::Llama3 {
                        factor: factor as f64,
                        low_freq_factor: low_freq_factor as f64,
                        high_freq_factor: high_freq_factor as f64,
                        original_max_position_embeddings,
                    }
                }
            },
            max_position_embeddings: c.max_position_embeddings,
            tie_word_embeddings: c.tie_word_embeddings,
            attention_bias: c.attention_qkv_bias,
            attention_out_bias: c.attention_out_bias,
            mlp_bias: c.mlp_bias,
            bos_token_id: c.bos_token_id,
            eos_token_ids: c.eos_token_ids.clone(),
        }
    }
}
