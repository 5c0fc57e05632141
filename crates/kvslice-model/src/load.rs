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

use kvslice_formats::{BlockFormat, WeightSource};
use kvslice_kernels::{QuantFormat, QuantMatrix};

/// How weights are kept on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// On wgpu, matrices stored in GGUF Q8_0/Q4_0/Q4_1 blocks stay in them (the kernels
    /// dequantize in registers); otherwise, and on the CPU backend always, everything is f32.
    pub quantized: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { quantized: true }
    }
}

impl LoadOptions {
    /// The defaults, with `KVSLICE_DEVICE_WEIGHTS=f32` turning the quantized weights off (to
    /// compare the two on one adapter).
    pub fn from_env() -> Self {
        let f32_only = std::env::var("KVSLICE_DEVICE_WEIGHTS").is_ok_and(|v| v.eq_ignore_ascii_case("f32"));
        LoadOptions { quantized: !f32_only }
    }
}

struct Loader<'a> {
    source: &'a dyn WeightSource,
    device: &'a Device,
    /// Keep block-quantized matrices in their blocks (wgpu only).
    quantized: bool,
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

    fn linear(&mut self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        self.fused_linear(&[(prefix.to_string(), out)], inp, bias, false)
    }

    /// The parts' blocks stacked row after row on the device, when every part is stored in
    /// a block format (and quantized weights are asked for): one matrix when they share it,
    /// else, when `mixed` allows, the parts in their own formats ([`QuantMatrix::stack`]);
    /// `None` otherwise.
    fn blocks(&mut self, names: &[(String, usize)], inp: usize, mixed: bool) -> Result<Option<QuantMatrix>> {
        if !self.quantized {
            return Ok(None);
        }
        let mut all = Vec::with_capacity(names.len());
        for (name, out) in names {
            if self.source.shape(name).is_none() {
                return Err(ModelError::MissingTensor(name.clone()));
            }
            let Some(b) = self.source.load_blocks(name)? else { return Ok(None) };
            if [b.rows, b.cols] != [*out, inp] {
                return Err(ModelError::ShapeMismatch {
                    tensor: name.clone(),
                    expected: vec![*out, inp],
                    got: vec![b.rows, b.cols],
                });
            }
            all.push(b);
        }
        let Some(first) = all.first().map(|b| b.format) else { return Ok(None) };
        let one_format = all.iter().all(|b| b.format == first);
        if !one_format && !mixed {
            return Ok(None);
        }
        let what = names.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(" | ");
        let upload = |format: BlockFormat, rows: usize, bytes: &[u8]| {
            QuantMatrix::upload(quant_format(format), rows, inp, bytes, self.device)
                .map_err(|e| ModelError::Config(format!("weight `{what}`: {e}")))
        };
        if one_format {
            let rows = all.iter().map(|b| b.rows).sum();
            let bytes: Vec<u8> = all.iter().flat_map(|b| b.bytes.iter().copied()).collect();
            return upload(first, rows, &bytes).map(Some);
        }
        // Neighbours in the same format go up together: one launch per run of a format.
        let mut runs: Vec<(BlockFormat, usize, Vec<u8>)> = Vec::new();
        for b in all {
            match runs.last_mut() {
                Some((f, rows, bytes)) if *f == b.format => {
                    *rows += b.rows;
                    bytes.extend_from_slice(&b.bytes);
                }
                _ => runs.push((b.format, b.rows, b.bytes)),
            }
        }
        let parts = runs.into_iter().map(|(f, rows, bytes)| upload(f, rows, &bytes)).collect::<Result<Vec<_>>>()?;
        QuantMatrix::stack(parts).map(Some).map_err(|e| ModelError::Config(format!("weight `{what}`: {e}")))
    }

    /// Projections of the same input side by side: `parts` are `(prefix, out)`, each `[out, in]`
    /// on file; the device holds `[in, Σ out]` with the parts' columns in the given order (and
    /// their biases, when `bias`, concatenated likewise).
    /// `mixed`: the parts may keep different block formats (not for a SwiGLU pair, whose gate
    /// and up rows one invocation reads together).
    fn fused_linear(&mut self, parts: &[(String, usize)], inp: usize, bias: bool, mixed: bool) -> Result<Linear> {
        let total: usize = parts.iter().map(|(_, out)| out).sum();
        let names: Vec<(String, usize)> = parts.iter().map(|(p, out)| (format!("{p}.weight"), *out)).collect();
        let quant = self.blocks(&names, inp, mixed)?;
        let bias = if bias {
            let mut all = Vec::with_capacity(total);
            for (prefix, out) in parts {
                all.extend(self.get(&format!("{prefix}.bias"), &[*out])?.data);
            }
            Some(Param::from_tensor(Tensor::from_data(TensorData::new(all, [total]), self.device)))
        } else {
            None
        };
        if quant.is_some() {
            return Ok(Linear { weight: None, bias, quant });
        }
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
        Ok(Linear::dense(weight, bias))
    }
}

fn quant_format(format: BlockFormat) -> QuantFormat {
    match format {
        BlockFormat::Q8_0 => QuantFormat::Q8_0,
        BlockFormat::Q4_0 => QuantFormat::Q4_0,
        BlockFormat::Q4_1 => QuantFormat::Q4_1,
        BlockFormat::Q5_0 => QuantFormat::Q5_0,
        BlockFormat::Q5_1 => QuantFormat::Q5_1,
        BlockFormat::F16 => QuantFormat::F16,
        BlockFormat::BF16 => QuantFormat::BF16,
        BlockFormat::Q4_K => QuantFormat::Q4_K,
        BlockFormat::Q5_K => QuantFormat::Q5_K,
        BlockFormat::Q6_K => QuantFormat::Q6_K,
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

/// Loads every weight of the decoder described by `source`'s config onto `device`, with
/// [`LoadOptions::from_env`].
pub fn load_llama(source: &dyn WeightSource, device: &Device) -> Result<Llama> {
    load_llama_with(source, device, LoadOptions::from_env())
}

/// [`load_llama`] with explicit options.
pub fn load_llama_with(source: &dyn WeightSource, device: &Device, options: LoadOptions) -> Result<Llama> {
    let config = LlamaConfig::from(source.config());
    config.validate()?;
    let c = &config;
    let (h, d) = (c.hidden_size, c.head_dim);
    let on_wgpu = kvslice_kernels::buffer_id(&Tensor::<1>::zeros([1], device)).is_some();
    let mut l = Loader { source, device, quantized: options.quantized && on_wgpu };

    let embed_name = "model.embed_tokens.weight".to_string();
    let embed_quant = l.blocks(&[(embed_name.clone(), c.vocab_size)], h, false)?;
    let (embed_tokens, lm_head) = match (&embed_quant, c.tie_word_embeddings) {
        (Some(q), true) => (None, Linear { weight: None, bias: None, quant: Some(q.clone()) }),
        (Some(_), false) => {
            let head = l.fused_linear(&[("lm_head".to_string(), c.vocab_size)], h, false, false)?;
            (None, head)
        }
        (None, tied) => {
            let embed = l.get(&embed_name, &[c.vocab_size, h])?;
            let head = if tied {
                Linear::dense(
                    Param::from_tensor(Tensor::from_data(
                        TensorData::new(transpose(&embed.data, c.vocab_size, h), [h, c.vocab_size]),
                        device,
                    )),
                    None,
                )
            } else {
                l.fused_linear(&[("lm_head".to_string(), c.vocab_size)], h, false, false)?
            };
            let table = Param::from_tensor(Tensor::from_data(TensorData::new(embed.data, [c.vocab_size, h]), device));
            (Some(table), head)
        }
    };

    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let p = format!("model.layers.{i}");
        let (q, kv) = (c.num_heads * d, c.num_kv_heads * d);
        let qkv = [("q_proj", q), ("k_proj", kv), ("v_proj", kv)].map(|(n, out)| (format!("{p}.self_attn.{n}"), out));
        let self_attn = Attention {
            qkv_proj: l.fused_linear(&qkv, h, c.attention_bias, true)?,
            o_proj: l.linear(&format!("{p}.self_attn.o_proj"), h, c.num_heads * d, c.attention_out_bias)?,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: d,
        };
        let gate_up = ["gate_proj", "up_proj"].map(|n| (format!("{p}.mlp.{n}"), c.intermediate_size));
        let mlp = Mlp {
            gate_up_proj: l.fused_linear(&gate_up, h, c.mlp_bias, false)?,
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
    let weights = LlamaWeights { embed_tokens, embed_quant, layers, norm, lm_head };
    Llama::new(config, weights, device.clone())
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_moves_rows_to_columns() {
        assert_eq!(super::transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }
}
