//! KVzip's context reconstruction (Kim et al. 2025, arXiv:2505.23416; kvpress's `KVzipPress`):
//! after the prefill the model is fed an instruction to repeat the context, then the context
//! itself, one chunk at a time, each time into a copy of the prompt's full cache. The attention
//! the chunk's reconstruction queries give each of its keys (their softmax over the sinks, the
//! chunk and the repetition so far; the maximum over the queries and the KV head's query group)
//! is the key's importance, [`kvslice_policy::WindowStats::reconstruction`]. The copies are
//! dropped: the prompt's cache is left as it was. Costs about one more prefill of the context.

use std::ops::Range;

use burn::tensor::activation::softmax;
use burn::tensor::{Tensor, TensorData};
use kvslice_cache::{KvCache, KvStore, LayerKv};
use kvslice_model::Llama;

use crate::error::{Result, RuntimeError};
use crate::host::read_f32;
use crate::session::Prefilled;

/// kvpress's instruction for the first chunk.
pub const FIRST: &str = "\n\nRepeat the previous context exactly.";
/// kvpress's instruction for the later chunks (followed by the previous chunk's last tokens).
pub const NEXT: &str = "\n\nRepeat the part of the previous context exactly, starting with";
/// The turn change of a model without a chat template.
pub const SUFFIX: &str = "\n";
/// kvpress's defaults: chunks of 2048, 4 sinks, 8 tokens of the previous chunk.
pub const CHUNK: usize = 2048;
pub const SINKS: usize = 4;
pub const OVERLAP: usize = 8;

/// The reconstruction prompt, tokenized (without special tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconstructionPrompt {
    /// [`FIRST`].
    pub first: Vec<u32>,
    /// [`NEXT`].
    pub next: Vec<u32>,
    /// [`SUFFIX`], or a chat template's change to the assistant's turn.
    pub suffix: Vec<u32>,
    /// Context tokens per reconstruction pass.
    pub chunk: usize,
    /// Leading keys every pass's softmax includes (once past them).
    pub sinks: usize,
}

impl ReconstructionPrompt {
    /// The tokens fed to reconstruct `range` of `prompt`, after the chunk `previous`.
    fn tokens(&self, prompt: &[u32], range: Range<usize>, previous: Option<Range<usize>>) -> Vec<u32> {
        let mut t = match previous {
            None => self.first.clone(),
            Some(p) => {
                let mut t = self.next.clone();
                t.extend_from_slice(&prompt[p.end - OVERLAP.min(p.len())..p.end]);
                t
            }
        };
        t.extend_from_slice(&self.suffix);
        t.extend_from_slice(&prompt[range]);
        t
    }
}

impl Prefilled {
    /// Scores the keys of `context` (positions of the prompt; the rest, such as a chat template's
    /// prefix, score zero) by reconstructing it, and stores the table in every window's
    /// statistics.
    pub async fn reconstruct(
        &mut self,
        model: &Llama,
        prompt: &ReconstructionPrompt,
        context: Range<usize>,
    ) -> Result<()> {
        let n = self.prompt_tokens;
        if context.start >= context.end || context.end > n {
            return Err(RuntimeError::Options(format!(
                "reconstruction range {context:?} outside a prompt of {n} tokens"
            )));
        }
        if prompt.chunk == 0 {
            return Err(RuntimeError::Options("reconstruction chunks must hold at least one token".into()));
        }
        let layers = model.config.num_layers;
        let kv_heads = model.config.num_kv_heads;
        let mut tables = vec![vec![0f32; kv_heads * n]; layers];
        let all: Vec<Vec<Vec<u32>>> = (0..layers).map(|_| vec![(0..n as u32).collect(); kv_heads]).collect();
        let mut previous = None;
        let mut start = context.start;
        while start < context.end {
            let end = (start + prompt.chunk).min(context.end);
            let tokens = prompt.tokens(&self.prompt, start..end, previous.clone());
            let r = tokens.len();
            crate::session::fits_context(model, n, r, 0)?;
            let cache = crate::evict::compress_cache(&self.cache, &all, r, 0)?;
            let mut store =
                Scoring { cache, n, range: start..end, sinks: prompt.sinks.min(start), out: vec![None; layers] };
            let positions: Vec<u32> = (n as u32..(n + r) as u32).collect();
            model.forward(&tokens, &positions, &mut store)?;
            let m = end - start;
            for (l, table) in tables.iter_mut().enumerate() {
                let t = store.out[l]
                    .take()
                    .ok_or_else(|| RuntimeError::Options(format!("layer {l} offered no queries")))?;
                let host = read_f32(t).await?;
                for h in 0..kv_heads {
                    table[h * n + start..h * n + end].copy_from_slice(&host[h * m..(h + 1) * m]);
                }
            }
            previous = Some(start..end);
            start = end;
        }
        for (stats, table) in self.stats.iter_mut().zip(tables) {
            for w in &mut stats.windows {
                w.reconstruction = Some(table.clone());
            }
        }
        Ok(())
    }
}

/// A copy of the full cache taking the reconstruction tokens, scoring as they attend.
struct Scoring {
    cache: KvCache,
    n: usize,
    range: Range<usize>,
    sinks: usize,
    /// `[H_kv, m]` per layer.
    out: Vec<Option<Tensor<2>>>,
}

impl KvStore for Scoring {
    fn append(
        &mut self,
        layer: usize,
        keys: Tensor<3>,
        values: Tensor<3>,
        positions: &[u32],
    ) -> kvslice_cache::Result<()> {
        self.cache.append(layer, keys, values, positions)
    }

    fn layer(&self, layer: usize) -> kvslice_cache::Result<&LayerKv> {
        self.cache.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, _raw: &Tensor<3>) -> kvslice_cache::Result<()> {
        let (keys, _) = self.cache.layer(layer)?.view();
        self.out[layer] = Some(reconstruction_attention(rotated, &keys, self.n, self.sinks, self.range.clone()));
        Ok(())
    }
}

/// At most this many scores per block of queries.
const MAX_BLOCK_ELEMS: usize = 32 << 20;

/// `[H_kv, m]`: the highest weight the `r` queries `q` (`[H, r, d]`, after RoPE, the last `r`
/// of the `n + r` cached `keys`, `[H_kv, n + r, d]`) give each key of `range`, their softmax over
/// the first `sinks` keys, `range` and the repetition up to themselves.
pub(crate) fn reconstruction_attention(
    q: &Tensor<3>,
    keys: &Tensor<3>,
    n: usize,
    sinks: usize,
    range: Range<usize>,
) -> Tensor<2> {
    let [heads, r, d] = q.dims();
    let [kv_heads, _, _] = keys.dims();
    let group = heads / kv_heads;
    let m = range.len();
    let device = q.device();
    let mut parts = Vec::with_capacity(3);
    if sinks > 0 {
        parts.push(keys.clone().narrow(1, 0, sinks));
    }
    parts.push(keys.clone().narrow(1, range.start, m));
    parts.push(keys.clone().narrow(1, n, r));
    let sub = Tensor::cat(parts, 1); // [H_kv, c, d]
    let c = sinks + m + r;
    let k = sub.unsqueeze_dim::<4>(1).expand([kv_heads, group, c, d]).reshape([heads, c, d]).swap_dims(1, 2);
    let rows = (MAX_BLOCK_ELEMS / (heads * c).max(1)).clamp(1, r);
    let mut best = Tensor::<2>::zeros([heads, m], &device);
    let mut first = 0;
    while first < r {
        let rr = rows.min(r - first);
        let logits = q.clone().narrow(1, first, rr).matmul(k.clone()).mul_scalar(1.0 / (d as f64).sqrt());
        // query `first + i` sees the repetition's keys up to its own
        let mut mask = vec![0f32; rr * c];
        for i in 0..rr {
            mask[i * c + sinks + m + first + i + 1..(i + 1) * c].fill(f32::NEG_INFINITY);
        }
        let mask = Tensor::<3>::from_data(TensorData::new(mask, [1, rr, c]), &device);
        let a = softmax(logits + mask, 2).narrow(2, sinks, m); // [H, rr, m]
        best = best.max_pair(a.max_dim(1).reshape([heads, m]));
        first += rr;
    }
    best.reshape([kv_heads, group, m]).max_dim(1).reshape([kv_heads, m])
}
