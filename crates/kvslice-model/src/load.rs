//! Building the decoder from host tensors named as in HF checkpoints
//! (`model.layers.{i}.self_attn.q_proj.weight`, layout `[out, in]`).
//!
//! Weight-name knowledge lives here and in `kvslice_formats`' GGUF name map; nothing else in
//! the model names a tensor. Weights are uploaded one at a time (the projections a decode step
//! runs as one product, q|k|v and gate|up, as one tensor each), so the host never holds more
//! than one such tensor beside the file's own bytes.

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::model::{Attention, DecoderLayer, Linear, Llama, LlamaWeights, Mlp, RmsNorm};

use kvslice_formats::WeightSource;

struct Loader<'a> {
    source: &'a dyn WeightSource,
    device: &'a Device,
}

impl Loader<'_> {
    fn get(&mut self, name: &str, expected: &[usize]) -> Result<kvslice_formats::Tensor> {
        if self.source.shape(name).is_none() {
            return Err(ModelError::MissingTensor(name.to_string()));
        }
        let t = self.source.load(name)?;
        if t.shape != expected {
            return Err(ModelError::ShapeMismatch {
                tensor: name.to_string(),
                expected: expected.to_vec(),
                got: t.shape,
            });
        }
        if t.data.len() != expected.iter().product::<usize>() {
            return Err(ModelError::ShapeMismatch {
                tensor: name.to_string(),
                expected: expected.to_vec(),
                got: vec![t.data.len()],
            });
        }
        // NaN or infinite weights (an f16 NaN, a NaN block scale) would turn every logit NaN.
        if let Some(index) = t.data.iter().position(|x| !x.is_finite()) {
            return Err(ModelError::NonFinite { tensor: name.to_string(), index, value: t.data[index] });
        }
        Ok(t)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Param<Tensor<1>>> {
        let t = self.get(name, &[len])?;
        Ok(Param::from_tensor(Tensor::from_data(TensorData::new(t.data, [len]), self.device)))
    }

    /// `[out, in]` on file → `[in, out]` on the device.
    fn matrix_t(&mut self, name: &str, out: usize, inp: usize) -> Result<Param<Tensor<2>>> {
        let t = self.get(name, &[out, inp])?;
        Ok(Param::from_tensor(Tensor::from_data(
            TensorData::new(transpose(&t.data, out, inp), [inp, out]),
            self.device,
        )))
    }

    fn linear(&mut self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        let weight = self.matrix_t(&format!("{prefix}.weight"), out, inp)?;
        let bias = if bias { Some(self.vector(&format!("{prefix}.bias"), out)?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// Projections of the same input side by side: `parts` are `(prefix, out)`, each `[out, in]`
    /// on file; the device holds `[in, Σ out]` with the parts' columns in the given order (and
    /// their biases, when `bias`, concatenated likewise).
    fn fused_linear(&mut self, parts: &[(String, usize)], inp: usize, bias: bool) -> Result<Linear> {
        let total: usize = parts.iter().map(|(_, out)| out).sum();
        // Stacking `[out_i, in]` rows gives `[Σ out, in]`, whose transpose is the fused weight.
        let mut rows = Vec::with_capacity(total * inp);
        for (prefix, out) in parts {
            rows.extend(self.get(&format!("{prefix}.weight"), &[*out, inp])?.data);
        }
        let weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(transpose(&rows, total, inp), [inp, total]),
            self.device,
        ));
        drop(rows);
        let bias = if bias {
            let mut all = Vec::with_capacity(total);
            for (prefix, out) in parts {
                all.extend(self.get(&format!("{prefix}.bias"), &[*out])?.data);
            }
            Some(Param::from_tensor(Tensor::from_data(TensorData::new(all, [total]), self.device)))
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// Loads every weight of the decoder described by `source`'s config onto `device`.
pub fn load_llama(source: &dyn WeightSource, device: &Device) -> Result<Llama> {
    let config = LlamaConfig::from(source.config());
    config.validate()?;
    let c = &config;
    let (h, d) = (c.hidden_size, c.head_dim);
    let mut l = Loader { source, device };

    let embed = l.get("model.embed_tokens.weight", &[c.vocab_size, h])?;
    let lm_head = if c.tie_word_embeddings {
        transpose(&embed.data, c.vocab_size, h)
    } else {
        let head = l.get("lm_head.weight", &[c.vocab_size, h])?;
        transpose(&head.data, c.vocab_size, h)
    };
    let embed_tokens = Param::from_tensor(Tensor::from_data(TensorData::new(embed.data, [c.vocab_size, h]), device));
    let lm_head = Param::from_tensor(Tensor::from_data(TensorData::new(lm_head, [h, c.vocab_size]), device));

    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let p = format!("model.layers.{i}");
        let (q, kv) = (c.num_heads * d, c.num_kv_heads * d);
        let qkv = [("q_proj", q), ("k_proj", kv), ("v_proj", kv)].map(|(n, out)| (format!("{p}.self_attn.{n}"), out));
        let self_attn = Attention {
            qkv_proj: l.fused_linear(&qkv, h, c.attention_bias)?,
            o_proj: l.linear(&format!("{p}.self_attn.o_proj"), h, c.num_heads * d, c.attention_out_bias)?,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: d,
        };
        let gate_up = ["gate_proj", "up_proj"].map(|n| (format!("{p}.mlp.{n}"), c.intermediate_size));
        let mlp = Mlp {
            gate_up_proj: l.fused_linear(&gate_up, h, c.mlp_bias)?,
            down_proj: l.linear(&format!("{p}.mlp.down_proj"), h, c.intermediate_size, c.mlp_bias)?,
        };
        layers.push(DecoderLayer {
            input_layernorm: RmsNorm {
                weight: l.vector(&format!("{p}.input_layernorm.weight"), h)?,
                eps: c.rms_norm_eps,
            },
            self_attn,
            post_attention_layernorm: RmsNorm {
                weight: l.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                eps: c.rms_norm_eps,
            },
            mlp,
        });
    }
    let norm = RmsNorm { weight: l.vector("model.norm.weight", h)?, eps: c.rms_norm_eps };
    let weights = LlamaWeights { embed_tokens, layers, norm, lm_head };
    Llama::new(config, weights, device.clone())
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_moves_rows_to_columns() {
        assert_eq!(super::transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
