//! The Llama-family decoder as Burn modules: RMSNorm, RoPE, grouped-query attention over a
//! [`KvStore`], SwiGLU MLP, tied or separate output head, optional q/k/v biases (Qwen2).
//!
//! Batch size is one (a session decodes one sequence); every forward documents its shapes.

use burn::module::{Module, Param};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use kvslice_cache::KvStore;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::rope;

/// Scores of one attention chunk are at most this many f32 values (64 MiB: half of WebGPU's
/// default largest storage binding, so that a chunk's scores, mask and softmax fit on any
/// adapter; chunks of this size keep the matrix products large enough to run at full speed).
pub const MAX_SCORE_ELEMS: usize = 16 << 20;

/// Root-mean-square layer norm: `x / sqrt(mean(x²) + eps) * weight`.
#[derive(Module, Debug)]
pub struct RmsNorm {
    /// `[hidden]`
    pub weight: Param<Tensor<1>>,
    pub eps: f64,
}

impl RmsNorm {
    /// # Shapes
    /// `x: [n, hidden]` → `[n, hidden]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let var = x.clone().powi_scalar(2).mean_dim(1);
        let normed = x * (var + self.eps).sqrt().recip();
        normed * self.weight.val().unsqueeze::<2>()
    }
}

/// A dense projection `y = x W + b`, its weight either f32 or kept in the file's quantized
/// blocks on a wgpu device (exactly one of the two).
#[derive(Module, Debug)]
pub struct Linear {
    /// `[d_in, d_out]`
    pub weight: Option<Param<Tensor<2>>>,
    /// `[d_out]`
    pub bias: Option<Param<Tensor<1>>>,
    /// `[d_out, d_in]` in blocks (see [`kvslice_kernels::QuantMatrix`]).
    #[module(skip)]
    pub quant: Option<kvslice_kernels::QuantMatrix>,
}

/// Up to this many rows, projections on a wgpu adapter use kvslice's skinny-product kernel
/// (decode); above, Burn's tiled matmul (prefill). The default for hardware adapters; the
/// runtime sets each adapter's own with [`Llama::set_skinny_rows`].
pub const SKINNY_ROWS: usize = 4;

impl Linear {
    /// An f32 projection.
    pub fn dense(weight: Param<Tensor<2>>, bias: Option<Param<Tensor<1>>>) -> Self {
        Linear { weight: Some(weight), bias, quant: None }
    }

    /// The weight as f32 `[d_in, d_out]`: the parameter, or the quantized blocks dequantized on
    /// the device (a transient tensor, for prefill's matmul).
    pub fn weight(&self) -> Result<Tensor<2>> {
        match (&self.weight, &self.quant) {
            (Some(w), _) => Ok(w.val()),
            (None, Some(q)) => Ok(kvslice_kernels::dequantize(q, None, true)?),
            (None, None) => Err(ModelError::Config("a projection without a weight".into())),
        }
    }

    /// One row through the fused projection kernel of the weight's kind.
    fn project(&self, x: &Tensor<2>, fusion: kvslice_kernels::Fusion<'_>) -> Result<Tensor<2>> {
        let bias = self.bias.as_ref().map(|b| b.val());
        Ok(match (&self.weight, &self.quant) {
            (None, Some(q)) => kvslice_kernels::qproject(x, q, bias.as_ref(), fusion)?,
            _ => kvslice_kernels::project(x, &self.weight()?, bias.as_ref(), fusion)?,
        })
    }

    /// # Shapes
    /// `x: [n, d_in]` → `[n, d_out]`
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        // A quantized weight is only built for wgpu and its shapes were checked at load, so
        // its dequantization cannot fail here.
        let w = self.weight().expect("the projection's weight was checked at load");
        let y = x.matmul(w);
        match &self.bias {
            Some(b) => y + b.val().unsqueeze::<2>(),
            None => y,
        }
    }

    /// [`Linear::forward`], through the WGSL skinny-product kernel when `x` has at most
    /// `products.skinny_rows` rows (0 where the weights are not on wgpu), through the tiled
    /// kernel above that where `products.tiled` says so.
    ///
    /// # Shapes
    /// `x: [n, d_in]` → `[n, d_out]`
    pub fn forward_on(&self, x: Tensor<2>, products: Products) -> Tensor<2> {
        let skinny_rows = products.skinny_rows;
        if x.dims()[0] == 1
            && self.quant.is_some()
            && let Ok(y) = self.project(&x, kvslice_kernels::Fusion::default())
        {
            return y;
        }
        if x.dims()[0] <= skinny_rows && self.quant.is_none() {
            let bias = self.bias.as_ref().map(|b| b.val());
            match kvslice_kernels::linear(x.clone(), self.weight().expect("an f32 weight"), bias) {
                Ok(y) => return y,
                // The kernel validates before dispatching, so Burn's matmul can take over; the
                // reason is printed once (shapes were validated at load, so it is a device or
                // element type the kernel does not take).
                Err(e) => {
                    static FALLBACK: std::sync::Once = std::sync::Once::new();
                    FALLBACK.call_once(|| eprintln!("kvslice: projection kernel: {e}; using Burn's matmul"));
                }
            }
        }
        if products.tiled && x.dims()[0] > skinny_rows {
            let bias = self.bias.as_ref().map(|b| b.val());
            // the weight's shapes were checked at load; a refusal (a width the kernel does not
            // take) leaves the product to Burn's matmul
            if let Ok(w) = self.weight()
                && let Ok(y) = kvslice_kernels::gemm(x.clone(), w, bias)
            {
                return y;
            }
        }
        self.forward(x)
    }
}

/// Which kernels a projection runs on (see [`Linear::forward_on`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Products {
    /// Up to this many rows, the skinny-product kernel (0: never; off wgpu).
    pub skinny_rows: usize,
    /// Above them, the tiled kernel instead of Burn's matmul (wgpu only).
    pub tiled: bool,
}

/// Grouped-query self-attention.
#[derive(Module, Debug)]
pub struct Attention {
    /// The query, key and value projections side by side, `[hidden, (heads + 2·kv_heads)·d]`
    /// (queries first, then keys, then values; the biases likewise): one product per step.
    pub qkv_proj: Linear,
    pub o_proj: Linear,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp {
    /// The gate and up projections side by side, `[hidden, 2·intermediate]` (gate columns
    /// first; the biases likewise).
    pub gate_up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    /// # Shapes
    /// `x: [n, hidden]` → `[n, hidden]`
    pub fn forward(&self, x: Tensor<2>, products: Products) -> Tensor<2> {
        let both = self.gate_up_proj.forward_on(x, products);
        let inter = both.dims()[1] / 2;
        let gate = silu(both.clone().narrow(1, 0, inter));
        self.down_proj.forward_on(gate * both.narrow(1, inter, inter), products)
    }
}

/// One pre-norm decoder block.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    pub input_layernorm: RmsNorm,
    pub self_attn: Attention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: Mlp,
}

/// The decoder's weights.
#[derive(Module, Debug)]
pub struct LlamaWeights {
    /// `[vocab, hidden]` (f32; `None` when the table is kept quantized in `embed_quant`)
    pub embed_tokens: Option<Param<Tensor<2>>>,
    /// The table in its quantized blocks on a wgpu device (for a tied model also the output
    /// head's weight: one copy on the device).
    #[module(skip)]
    pub embed_quant: Option<kvslice_kernels::QuantMatrix>,
    pub layers: Vec<DecoderLayer>,
    pub norm: RmsNorm,
    /// `[hidden, vocab]`; for tied models a transposed copy of the embedding, or with a
    /// quantized embedding the same blocks.
    pub lm_head: Linear,
}

/// Positions and RoPE tables for one forward call.
struct Rotary {
    /// `[1, n, head_dim / 2]` each, broadcast over heads (or one table per head).
    cos: Tensor<3>,
    sin: Tensor<3>,
}

impl Rotary {
    /// # Shapes
    /// `x: [heads, n, head_dim]` → `[heads, n, head_dim]`
    fn apply(&self, x: Tensor<3>) -> Tensor<3> {
        let [_, _, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().narrow(2, 0, half);
        let x2 = x.narrow(2, half, half);
        let out1 = x1.clone() * self.cos.clone() - x2.clone() * self.sin.clone();
        let out2 = x2 * self.cos.clone() + x1 * self.sin.clone();
        Tensor::cat(vec![out1, out2], 2)
    }
}

/// A Llama-family decoder on one device.
#[derive(Debug)]
pub struct Llama {
    pub config: LlamaConfig,
    pub weights: LlamaWeights,
    inv_freq: Vec<f32>,
    device: Device,
    /// The weights live on wgpu: kvslice's own WGSL kernels can run on them.
    kernels: bool,
    /// Projections of up to this many rows use the skinny-product kernel (0 off wgpu).
    skinny_rows: usize,
    /// Decode steps (one row) run each layer as kvslice's fused kernels (wgpu only).
    fused_decode: bool,
    /// Projections of more than `skinny_rows` rows run on the tiled kernel (wgpu only).
    tiled_products: bool,
    /// Prompts run in passes of at most this many tokens where the cache takes chunks (0:
    /// one pass).
    prefill_chunk: usize,
    /// Per layer, the latent dimensions of the low-rank keys folded in
    /// ([`Llama::set_low_rank_keys`]).
    low_rank_keys: Option<Vec<usize>>,
    /// Per layer, how a cache stores those keys as their latents.
    latent_layouts: Option<Vec<kvslice_cache::LatentLayout>>,
    /// Whether caches built for this model store the low-rank keys as latents.
    latent_storage: bool,
}

/// The default [`Llama::set_prefill_chunk`]: activations stay bounded by 512 rows whatever the
/// prompt's length, and the products stay large enough to run at full speed.
pub const PREFILL_CHUNK: usize = 512;

impl Llama {
    /// Wraps loaded weights. The config must be valid (see [`LlamaConfig::validate`]).
    pub fn new(config: LlamaConfig, weights: LlamaWeights, device: Device) -> Result<Self> {
        config.validate()?;
        if weights.layers.len() != config.num_layers {
            return Err(ModelError::Config(format!(
                "{} layers loaded, config says {}",
                weights.layers.len(),
                config.num_layers
            )));
        }
        let inv_freq = rope::inv_freq(&config);
        let kernels = kvslice_kernels::buffer_id(&weights.norm.weight.val()).is_some();
        let skinny_rows = if kernels { SKINNY_ROWS } else { 0 };
        let fused_decode = kernels;
        // off by default: on lavapipe the tiled kernel runs 3× slower than Burn's matmul
        // (docs/BENCHMARKS.md, "A tiled WGSL GEMM")
        let tiled_products = kernels && std::env::var("KVSLICE_TILED_PRODUCTS").is_ok_and(|v| v == "on");
        let prefill_chunk = PREFILL_CHUNK;
        Ok(Self {
            config,
            weights,
            inv_freq,
            device,
            kernels,
            skinny_rows,
            fused_decode,
            tiled_products,
            prefill_chunk,
            low_rank_keys: None,
            latent_layouts: None,
            latent_storage: true,
        })
    }

    /// Makes every layer's keys the reconstruction of their low-rank latents: the key
    /// projection `W_k` (and its bias) becomes `W_k P` with `P` the layer's projection onto its
    /// groups' subspaces ([`LowRankKeys::projector`]), so each key is `(x W_{k,g} U_g) U_gᵀ`
    /// and RoPE rotates the reconstruction, as the latent method computes it. A projection kept
    /// in quantized blocks becomes f32. The keys must fit this model's geometry; nothing
    /// changes on an error.
    ///
    /// [`LowRankKeys::projector`]: crate::lowrank::LowRankKeys::projector
    pub fn set_low_rank_keys(&mut self, keys: &crate::lowrank::LowRankKeys) -> Result<()> {
        let c = &self.config;
        keys.validate()?;
        if keys.layers.len() != c.num_layers || keys.kv_heads != c.num_kv_heads || keys.head_dim != c.head_dim {
            return Err(ModelError::LowRank(format!(
                "made for {} layers of {} KV heads × {}, the model has {} × {} × {}",
                keys.layers.len(),
                keys.kv_heads,
                keys.head_dim,
                c.num_layers,
                c.num_kv_heads,
                c.head_dim
            )));
        }
        if self.low_rank_keys.is_some() {
            return Err(ModelError::LowRank("the model's keys are low-rank already".into()));
        }
        let positions: Vec<u32> = (0..c.max_position_embeddings.max(1) as u32).collect();
        let (cos, sin) = rope::tables(&self.inv_freq, &positions);
        let table = std::sync::Arc::new(kvslice_cache::RopeTable::new(cos, sin, c.head_dim / 2, &self.device)?);
        let layouts = keys
            .layers
            .iter()
            .map(|groups| {
                let groups: Vec<_> = groups
                    .iter()
                    .map(|g| kvslice_cache::GroupBasis {
                        heads: &g.heads,
                        rank: g.rank,
                        basis: &g.basis,
                        scale: &g.scale,
                    })
                    .collect();
                kvslice_cache::LatentLayout::new(c.num_kv_heads, c.head_dim, &groups, table.clone(), &self.device)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let mut folded = Vec::with_capacity(c.num_layers);
        for (l, layer) in self.weights.layers.iter().enumerate() {
            let p = keys.projector(l)?;
            let p = Tensor::<1>::from_data(TensorData::new(p, [kv * kv]), &self.device).reshape([kv, kv]);
            let proj = &layer.self_attn.qkv_proj;
            let w = proj.weight()?;
            let wk = w.clone().narrow(1, q, kv).matmul(p.clone());
            let weight = Tensor::cat(vec![w.clone().narrow(1, 0, q), wk, w.narrow(1, q + kv, kv)], 1);
            let bias = proj.bias.as_ref().map(|b| {
                let b = b.val();
                let bk = b.clone().narrow(0, q, kv).reshape([1, kv]).matmul(p).reshape([kv]);
                Param::from_tensor(Tensor::cat(vec![b.clone().narrow(0, 0, q), bk, b.narrow(0, q + kv, kv)], 0))
            });
            folded.push(Linear::dense(Param::from_tensor(weight), bias));
        }
        for (layer, proj) in self.weights.layers.iter_mut().zip(folded) {
            layer.self_attn.qkv_proj = proj;
        }
        self.low_rank_keys = Some((0..c.num_layers).map(|l| keys.latent_width(l)).collect());
        self.latent_layouts = Some(layouts);
        Ok(())
    }

    /// Per layer, how the runtime's caches store the low-rank keys as their latents (the key
    /// bytes of a token become its latent width's): `None` without low-rank keys or with
    /// [`Llama::set_latent_storage`] off, when caches hold the rebuilt keys whole.
    pub fn latent_layouts(&self) -> Option<&[kvslice_cache::LatentLayout]> {
        self.latent_layouts.as_deref().filter(|_| self.latent_storage)
    }

    /// Whether caches store low-rank keys as latents (the default) or whole.
    pub fn set_latent_storage(&mut self, on: bool) {
        self.latent_storage = on;
    }

    /// Per layer, the latent dimensions a token's keys span when low-rank keys are set (against
    /// `num_kv_heads · head_dim` without).
    pub fn low_rank_keys(&self) -> Option<&[usize]> {
        self.low_rank_keys.as_deref()
    }

    /// Prompts of more than `tokens` tokens run as passes of `tokens` (0: one pass), each
    /// attending to the cache the passes before it filled: the same function, with activation
    /// memory bounded by the chunk instead of the prompt. The passes go layer by layer (every
    /// chunk through a layer before the next layer starts), where the cache takes chunks
    /// ([`KvStore::takes_chunks`]).
    pub fn set_prefill_chunk(&mut self, tokens: usize) {
        self.prefill_chunk = tokens;
    }

    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    /// Whether one-row forwards (decode steps) run on the fused kernels
    /// ([`kvslice_kernels::project`] and the stages beside it) or as Burn ops; on by default
    /// on wgpu, and without effect elsewhere. The two compute the same function (the fused
    /// kernels sum in another order).
    pub fn set_fused_decode(&mut self, on: bool) {
        self.fused_decode = on && self.kernels;
    }

    /// Whether projections of more rows than the skinny-product kernel takes (prompts) run on
    /// kvslice's tiled kernel ([`kvslice_kernels::gemm`]) or on Burn's matmul; without effect
    /// off wgpu. Off by default (Burn's matmul is faster on lavapipe, the one adapter measured);
    /// `KVSLICE_TILED_PRODUCTS=on` turns it on at load, to measure it on others. The two
    /// compute the same function (summed in another order).
    pub fn set_tiled_products(&mut self, on: bool) {
        self.tiled_products = on && self.kernels;
    }

    /// The kernels the projections run on.
    fn products(&self) -> Products {
        Products { skinny_rows: self.skinny_rows, tiled: self.tiled_products }
    }

    /// Projections of up to `rows` rows (at least 1: decode steps) run through the
    /// skinny-product kernel, larger ones through Burn's matmul. Where the kernel wins depends
    /// on the adapter (see `DeviceInfo::skinny_rows` in the runtime). No effect off wgpu.
    pub fn set_skinny_rows(&mut self, rows: usize) {
        if self.kernels {
            self.skinny_rows = rows.max(1);
        }
    }

    /// How many output rows each invocation of the quantized projection kernel computes, for
    /// every matrix kept in its blocks ([`kvslice_kernels::QuantMatrix::set_rows_per_invocation`]:
    /// 1 on GPUs, more on CPU adapters).
    pub fn set_projection_rows(&mut self, rows: u32) -> Result<()> {
        let w = &mut self.weights;
        let mut quant: Vec<&mut kvslice_kernels::QuantMatrix> = w.embed_quant.iter_mut().collect();
        quant.extend(w.lm_head.quant.as_mut());
        for l in &mut w.layers {
            let (a, m) = (&mut l.self_attn, &mut l.mlp);
            for p in [&mut a.qkv_proj, &mut a.o_proj, &mut m.gate_up_proj, &mut m.down_proj] {
                quant.extend(p.quant.as_mut());
            }
        }
        for q in quant {
            q.set_rows_per_invocation(rows)?;
        }
        Ok(())
    }

    /// Rows per invocation of the quantized projections ([`Llama::set_projection_rows`]): those
    /// of the q|k|v projection of the first layer, `None` when it is not kept in its blocks.
    pub fn projection_rows(&self) -> Option<u32> {
        let layer = self.weights.layers.first()?;
        layer.self_attn.qkv_proj.quant.as_ref().map(kvslice_kernels::QuantMatrix::rows_per_invocation)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bytes the weights take on the device: every f32 parameter at its element size (a
    /// tied model's f32 output head is a second, transposed copy of the embedding) and every
    /// quantized matrix at its real size (a tied head shares the embedding's blocks).
    pub fn device_bytes(&self) -> u64 {
        let element = self.weights.norm.weight.val().dtype().size() as u64;
        let w = &self.weights;
        let mut quant: Vec<&kvslice_kernels::QuantMatrix> = w.embed_quant.iter().collect();
        for l in &w.layers {
            let (a, m) = (&l.self_attn, &l.mlp);
            for p in [&a.qkv_proj, &a.o_proj, &m.gate_up_proj, &m.down_proj] {
                quant.extend(p.quant.as_ref());
            }
        }
        let shared = self.config.tie_word_embeddings && w.embed_quant.is_some();
        if !shared {
            quant.extend(w.lm_head.quant.as_ref());
        }
        w.num_params() as u64 * element + quant.iter().map(|q| q.device_bytes()).sum::<u64>()
    }

    /// Runs `tokens` (at source `positions`) through the decoder, appending their keys and
    /// values to `cache`, and returns the final-normed hidden states.
    ///
    /// Each query attends to the cached slots whose source position is not after its own
    /// (and, for heads of different lengths, only to that head's occupied slots).
    ///
    /// # Shapes
    /// `tokens: [n]`, `positions: [n]` → `[n, hidden]`
    pub fn forward(&self, tokens: &[u32], positions: &[u32], cache: &mut impl KvStore) -> Result<Tensor<2>> {
        let n = tokens.len();
        if n == 0 || positions.len() != n {
            return Err(ModelError::Input(format!("{n} tokens with {} positions", positions.len())));
        }
        let chunk = self.prefill_chunk;
        if chunk > 0 && n > chunk && cache.takes_chunks() {
            return self.forward_chunked(tokens, positions, chunk, cache);
        }
        let (x, rotary) = self.embed(tokens, positions)?;
        if n == 1 && self.fused_decode {
            return self.decode_fused(x, positions, cache);
        }
        let mut x = x;
        for (index, layer) in self.weights.layers.iter().enumerate() {
            x = self.layer_forward(index, layer, x, &rotary, positions, cache)?;
            if n > 1 {
                let layers = self.weights.layers.len();
                crate::progress::layer_done(crate::progress::LayerDone { layer: index, layers, tokens: n });
            }
        }
        let _head = kvslice_kernels::dispatch::scope("head");
        Ok(self.weights.norm.forward(x))
    }

    /// [`Llama::forward`] in passes of `chunk` tokens, layer by layer: every chunk goes through
    /// layer 0 (each attending to the entries the chunks before it appended), then every chunk
    /// through layer 1, and so on. Activations are bounded by the chunk; what crosses a layer
    /// is the prompt's hidden states (`[n, hidden]`, a fraction of one layer's K/V). A store
    /// thus sees each layer's queries complete before the next layer starts, which is what
    /// lets statistics recorders and CAKE's cascade take chunks. Every token is checked before
    /// the first entry is written.
    fn forward_chunked(
        &self,
        tokens: &[u32],
        positions: &[u32],
        chunk: usize,
        cache: &mut impl KvStore,
    ) -> Result<Tensor<2>> {
        let n = tokens.len();
        let mut parts = Vec::with_capacity(n.div_ceil(chunk));
        for (t, p) in tokens.chunks(chunk).zip(positions.chunks(chunk)) {
            let (x, rotary) = self.embed(t, p)?;
            parts.push((Some(x), rotary, p));
        }
        let layers = self.weights.layers.len();
        for (index, layer) in self.weights.layers.iter().enumerate() {
            for (x, rotary, p) in &mut parts {
                let input = x.take().ok_or_else(|| ModelError::Input("a chunk lost its hidden states".into()))?;
                *x = Some(self.layer_forward(index, layer, input, rotary, p, cache)?);
            }
            crate::progress::layer_done(crate::progress::LayerDone { layer: index, layers, tokens: n });
        }
        let _head = kvslice_kernels::dispatch::scope("head");
        let hidden = parts.into_iter().filter_map(|(x, _, _)| x).collect::<Vec<_>>();
        Ok(self.weights.norm.forward(Tensor::cat(hidden, 0)))
    }

    /// The embeddings of `tokens` (`[n, hidden]`) and the RoPE tables of their `positions`;
    /// a token outside the vocabulary is an error.
    fn embed(&self, tokens: &[u32], positions: &[u32]) -> Result<(Tensor<2>, Rotary)> {
        let n = tokens.len();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(ModelError::Input(format!(
                "token id {bad} outside the vocabulary ({})",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::<1, Int>::from_data(
            TensorData::new(tokens.iter().map(|&t| t as i32).collect::<Vec<_>>(), [n]),
            &self.device,
        );
        let _embed = kvslice_kernels::dispatch::scope("embed");
        let x = match (&self.weights.embed_tokens, &self.weights.embed_quant) {
            (Some(table), _) => table.val().select(0, ids),
            (None, Some(q)) => kvslice_kernels::dequantize(q, Some(tokens), false)?,
            (None, None) => return Err(ModelError::Config("no embedding table".into())),
        };
        let half = self.config.head_dim / 2;
        let (cos, sin) = rope::tables(&self.inv_freq, positions);
        let rotary = Rotary {
            cos: Tensor::<1>::from_data(TensorData::new(cos, [n * half]), &self.device).reshape([1, n, half]),
            sin: Tensor::<1>::from_data(TensorData::new(sin, [n * half]), &self.device).reshape([1, n, half]),
        };
        Ok((x, rotary))
    }

    /// One decoder layer over the rows `x` (`[n, hidden]`) at `positions`.
    fn layer_forward(
        &self,
        index: usize,
        layer: &DecoderLayer,
        x: Tensor<2>,
        rotary: &Rotary,
        positions: &[u32],
        cache: &mut impl KvStore,
    ) -> Result<Tensor<2>> {
        let _layer = kvslice_kernels::dispatch::scope("layer");
        let h = layer.input_layernorm.forward(x.clone());
        let attn = self.attention(index, &layer.self_attn, h, rotary, positions, cache)?;
        let x = x + attn;
        let h = layer.post_attention_layernorm.forward(x.clone());
        Ok(x + layer.mlp.forward(h, self.products()))
    }

    /// One decode row through every layer, each a handful of launches: the normed q|k|v
    /// product, RoPE splitting it, the cache append, the ragged decode attention, the output
    /// product with its residual, the normed gate|up product with SwiGLU, the down product with
    /// its residual; then the final norm.
    ///
    /// # Shapes
    /// `x: [1, hidden]`, `positions: [1]` → `[1, hidden]`
    fn decode_fused(&self, mut x: Tensor<2>, positions: &[u32], cache: &mut impl KvStore) -> Result<Tensor<2>> {
        use kvslice_kernels::{Fusion, rms_norm, rope_split};
        let (cos, sin) = rope::tables(&self.inv_freq, positions);
        let half = cos.len();
        let cos = Tensor::<1>::from_data(TensorData::new(cos, [half]), &self.device);
        let sin = Tensor::<1>::from_data(TensorData::new(sin, [half]), &self.device);
        for (index, layer) in self.weights.layers.iter().enumerate() {
            let _layer = kvslice_kernels::dispatch::scope("layer");
            let attn = &layer.self_attn;
            let (heads, kv_heads, d) = (attn.num_heads, attn.num_kv_heads, attn.head_dim);
            let norm = &layer.input_layernorm;
            let (g, eps) = (norm.weight.val(), norm.eps as f32);
            let qkv_fusion = Fusion { norm: Some((&g, eps)), ..Default::default() };
            let qkv = attn.qkv_proj.project(&x, qkv_fusion)?;
            let row = rope_split(&qkv, &cos, &sin, heads, kv_heads, d)?;
            let (q, q_raw) = (row.q.reshape([heads, 1, d]), row.q_raw.reshape([heads, 1, d]));
            cache.append(index, row.k.reshape([kv_heads, 1, d]), row.v.reshape([kv_heads, 1, d]), positions)?;
            let out = self.attend(index, attn, q.clone(), positions, cache)?;
            cache.observe_queries(index, &q, &q_raw)?;
            let o_fusion = Fusion { residual: Some(&x), ..Default::default() };
            x = attn.o_proj.project(&out, o_fusion)?;

            let norm = &layer.post_attention_layernorm;
            let (g, eps) = (norm.weight.val(), norm.eps as f32);
            let (gate_up, down) = (&layer.mlp.gate_up_proj, &layer.mlp.down_proj);
            let mlp_fusion = Fusion { norm: Some((&g, eps)), swiglu: true, ..Default::default() };
            let inner = gate_up.project(&x, mlp_fusion)?;
            let down_fusion = Fusion { residual: Some(&x), ..Default::default() };
            x = down.project(&inner, down_fusion)?;
        }
        let _head = kvslice_kernels::dispatch::scope("head");
        let norm = &self.weights.norm;
        Ok(rms_norm(&x, &norm.weight.val(), norm.eps as f32)?)
    }

    /// Moves cached keys to other positions: each row of `keys` (already rotated for its source
    /// position) is rotated by `shift` more positions, the same rotation RoPE applies (rotations
    /// of one pair compose by adding angles), its angles `inv_freq · shift` in f32 as HF
    /// transformers computes them. Keys renumbered after eviction read as if computed at their
    /// new positions.
    ///
    /// # Shapes
    /// `keys: [kv_heads, n, head_dim]`, `shift: [kv_heads · n]` → `[kv_heads, n, head_dim]`
    pub fn shift_keys(&self, keys: Tensor<3>, shift: &[i64]) -> Result<Tensor<3>> {
        let [kv_heads, n, d] = keys.dims();
        if d != self.config.head_dim || shift.len() != kv_heads * n {
            return Err(ModelError::Input(format!(
                "{} shifts for keys of shape [{kv_heads}, {n}, {d}] (head_dim {})",
                shift.len(),
                self.config.head_dim
            )));
        }
        let half = d / 2;
        let mut cos = Vec::with_capacity(shift.len() * half);
        let mut sin = Vec::with_capacity(shift.len() * half);
        for &s in shift {
            for &f in &self.inv_freq {
                let angle = (f * s as f32) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let table = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [kv_heads * n * half]), &keys.device());
        let rotary =
            Rotary { cos: table(cos).reshape([kv_heads, n, half]), sin: table(sin).reshape([kv_heads, n, half]) };
        Ok(rotary.apply(keys))
    }

    /// Output logits of the given hidden rows.
    ///
    /// # Shapes
    /// `hidden: [n, hidden]` → `[n, vocab]`
    pub fn logits(&self, hidden: Tensor<2>) -> Tensor<2> {
        let _head = kvslice_kernels::dispatch::scope("head");
        let head = &self.weights.lm_head;
        let rows = hidden.dims()[0];
        if rows > 1 && head.quant.is_some() {
            // Prefill's logits: each row through the quantized head rather than a
            // transient f32 copy of it (the vocabulary is the largest matrix).
            let out: Vec<Tensor<2>> = (0..rows)
                .map(|r| head.forward_on(hidden.clone().narrow(0, r, 1), Products { skinny_rows: 1, tiled: false }))
                .collect();
            return Tensor::cat(out, 0);
        }
        head.forward_on(hidden, self.products())
    }

    /// # Shapes
    /// `x: [n, hidden]` → `[n, hidden]`
    fn attention(
        &self,
        layer: usize,
        attn: &Attention,
        x: Tensor<2>,
        rotary: &Rotary,
        positions: &[u32],
        cache: &mut impl KvStore,
    ) -> Result<Tensor<2>> {
        let [n, _] = x.dims();
        let (heads, kv_heads, d) = (attn.num_heads, attn.num_kv_heads, attn.head_dim);
        // [n, (heads + 2·kv_heads)·d] → [heads | kv_heads, n, d]
        let qkv = attn.qkv_proj.forward_on(x, self.products());
        let split = |from: usize, h: usize| qkv.clone().narrow(1, from * d, h * d).reshape([n, h, d]).swap_dims(0, 1);
        let q_raw = split(0, heads);
        let q = rotary.apply(q_raw.clone());
        let k = rotary.apply(split(heads, kv_heads));
        let v = split(heads + kv_heads, kv_heads);
        cache.append(layer, k, v, positions)?;
        let want_sums = cache.wants_attention_sums(layer);
        let (out, sums) = self.attend_with(layer, attn, q.clone(), positions, cache, want_sums)?;
        if let Some(sums) = sums {
            cache.offer_attention_sums(layer, sums)?;
        }
        let out = attn.o_proj.forward_on(out, self.products());
        cache.observe_queries(layer, &q, &q_raw)?;
        Ok(out)
    }

    /// The attention of queries at `positions` over `layer`'s cache (their own entries already
    /// appended), before the output projection.
    ///
    /// # Shapes
    /// `q: [heads, n, d]` (rotated) → `[n, heads · d]`
    fn attend(
        &self,
        layer: usize,
        attn: &Attention,
        q: Tensor<3>,
        positions: &[u32],
        cache: &impl KvStore,
    ) -> Result<Tensor<2>> {
        Ok(self.attend_with(layer, attn, q, positions, cache, false)?.0)
    }

    /// [`Llama::attend`], and with `want_sums` the attention each slot received, summed over
    /// the queries (`[heads, slots]`; see [`KvStore::wants_attention_sums`]), from the same pass.
    fn attend_with(
        &self,
        layer: usize,
        attn: &Attention,
        q: Tensor<3>,
        positions: &[u32],
        cache: &impl KvStore,
        want_sums: bool,
    ) -> Result<(Tensor<2>, Option<Tensor<2>>)> {
        let [_, n, _] = q.dims();
        let (heads, kv_heads, d) = (attn.num_heads, attn.num_kv_heads, attn.head_dim);
        let group = heads / kv_heads;
        let stored = cache.layer(layer)?;
        if self.kernels && n == 1 && !want_sums {
            let qp = positions[0];
            let lens: Vec<u32> = stored.lens().iter().map(|&l| l as u32).collect();
            let all_visible = (0..kv_heads).all(|h| stored.head_positions(h).iter().all(|&p| p <= qp));
            if let (true, Some((keys, values))) = (all_visible, stored.storage()) {
                // One query per head over each head's own length: the ragged decode kernel.
                let q1 = q.clone().reshape([heads, d]);
                if let Ok(out) = kvslice_kernels::decode_attention(&q1, keys, values, &lens, None) {
                    return Ok((out.reshape([1, heads * d]), None));
                }
            }
        }
        let visibility = Visibility::of(stored, positions);
        #[cfg(not(target_family = "wasm"))]
        if !self.kernels
            && n >= HOST_ATTENTION_ROWS
            && host_attention_on()
            && let Some((out, sums)) = host_attention(&q, stored, &visibility, group, want_sums)?
        {
            let out =
                Tensor::<1>::from_data(TensorData::new(out, [n * heads * d]), &self.device).reshape([n, heads * d]);
            let len = stored.max_len();
            let sums = sums
                .map(|s| Tensor::<1>::from_data(TensorData::new(s, [heads * len]), &self.device).reshape([heads, len]));
            return Ok((out, sums));
        }
        let (keys, values) = stored.view();
        let len = stored.max_len();
        let mut sums = want_sums.then(|| Tensor::<2>::zeros([heads, len], &self.device));

        let scale = 1.0 / (d as f64).sqrt();
        let keys_t = keys.swap_dims(1, 2); // [kv_heads, d, len]
        // Queries are taken in chunks of rows whose scores (and mask) fit in MAX_SCORE_ELEMS.
        let rows_per_chunk = (MAX_SCORE_ELEMS / (heads * len).max(1)).clamp(1, n);
        let mut outputs = Vec::with_capacity(n.div_ceil(rows_per_chunk));
        // [heads, n, d] → [kv_heads, group, n, d]: head h reads KV head h / group.
        let q = q.reshape([kv_heads, group, n, d]);
        let mut start = 0;
        while start < n {
            let rows = rows_per_chunk.min(n - start);
            // Slots past `seen` are hidden from every query of the chunk (the causal future of
            // a prefill chunk): their scores are not computed.
            let (seen, mask) = visibility.chunk(start, rows, &self.device);
            let qc = q.clone().narrow(2, start, rows).reshape([kv_heads, group * rows, d]);
            let (kc, vc) = if seen < len {
                (keys_t.clone().narrow(2, 0, seen), values.clone().narrow(1, 0, seen))
            } else {
                (keys_t.clone(), values.clone())
            };
            let scores = qc.matmul(kc).mul_scalar(scale).reshape([kv_heads, group, rows, seen]);
            let scores = match mask {
                None => scores,
                // [kv_heads | 1, rows, seen]
                Some(m) => scores + m.unsqueeze_dim::<4>(1),
            };
            let probs = softmax(scores, 3).reshape([kv_heads, group * rows, seen]);
            if let Some(total) = sums.as_mut() {
                let s = probs.clone().reshape([heads, rows, seen]).sum_dim(1).reshape([heads, seen]);
                let s = if seen < len {
                    Tensor::cat(vec![s, Tensor::zeros([heads, len - seen], &self.device)], 1)
                } else {
                    s
                };
                *total = total.clone() + s;
            }
            let out = probs.matmul(vc).reshape([heads, rows, d]);
            outputs.push(out);
            start += rows;
        }
        let out = if outputs.len() == 1 { outputs.pop().unwrap() } else { Tensor::cat(outputs, 1) };
        Ok((out.swap_dims(0, 1).reshape([n, heads * d]), sums))
    }
}

/// From this many queries on, the CPU backend's attention runs as [`crate::flash`]'s tiled
/// kernel (decode steps keep Burn's ops, which read the cache where it lies).
pub const HOST_ATTENTION_ROWS: usize = 16;

/// Workers for [`crate::flash`]: `KVSLICE_THREADS` when set to a positive number, else every
/// core the process may use.
#[cfg(not(target_family = "wasm"))]
pub fn host_threads() -> usize {
    std::env::var("KVSLICE_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|t| t.get()).unwrap_or(1))
}

/// Whether the host routes are on (the tiled attention here, the window statistics and column
/// sums of the runtime's recorder): `KVSLICE_HOST_ATTENTION=off` keeps Burn's ops (the
/// comparison of docs/BENCHMARKS.md).
#[cfg(not(target_family = "wasm"))]
pub fn host_attention_on() -> bool {
    std::env::var("KVSLICE_HOST_ATTENTION").map_or(true, |v| v != "off")
}

/// The host attention's output (`[n · heads · d]`) and the slots' attention sums
/// (`[heads · len]`) when asked for.
#[cfg(not(target_family = "wasm"))]
type HostAttention = (Vec<f32>, Option<Vec<f32>>);

/// The attention of `q` (`[heads, n, d]`, rotated) over `stored` on the host, `[n · heads · d]`
/// (query-major), with `want_sums` the attention each slot received (`[heads · len]`), or
/// `None` when the visibility is not a prefix per query.
#[cfg(not(target_family = "wasm"))]
fn host_attention(
    q: &Tensor<3>,
    stored: &kvslice_cache::LayerKv,
    visibility: &Visibility<'_>,
    group: usize,
    want_sums: bool,
) -> Result<Option<HostAttention>> {
    use crate::flash::{Cutoffs, Shape, attention, attention_with_sums};
    let cutoffs = match visibility {
        Visibility::All { .. } => Cutoffs::All,
        Visibility::Prefix { mask_heads, cutoffs, .. } => Cutoffs::Prefix { mask_heads: *mask_heads, cut: cutoffs },
        Visibility::Slots { .. } => return Ok(None),
    };
    let [heads, n, d] = q.dims();
    let read = |t: Tensor<3>| {
        t.into_data().convert::<f32>().try_into_vec::<f32>().map_err(|e| ModelError::Input(format!("read-back: {e:?}")))
    };
    let (keys, values) = stored.view();
    let len = stored.max_len();
    let shape = Shape { heads, kv_heads: heads / group, n, len, head_dim: d };
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let (q, k, v) = (read(q.clone())?, read(keys)?, read(values)?);
    let threads = host_threads();
    let out = if want_sums {
        attention_with_sums(&q, &k, &v, shape, cutoffs, scale, threads).map(|(o, s)| (o, Some(s)))
    } else {
        attention(&q, &k, &v, shape, cutoffs, scale, threads).map(|o| (o, None))
    };
    out.map(Some).map_err(ModelError::Input)
}

/// Which cached slots the queries at `positions` see: slot `s` of head `h` is visible when it
/// is occupied and its source position is not after the query's. Masks are built one chunk of
/// query rows at a time, never for the whole `[n, len]` at once.
enum Visibility<'a> {
    /// Every query sees every slot `0..len` of every head.
    All { len: usize },
    /// Each query sees a prefix of the slots (every head's slots in ascending source order:
    /// true after prefill and after order-keeping compaction): `cutoffs[h * n + i]` slots for
    /// query `i` in mask head `h`.
    Prefix { mask_heads: usize, n: usize, len: usize, cutoffs: Vec<i32> },
    /// Anything else: per-slot visibility, built on the host.
    Slots { heads: Vec<&'a [u32]>, positions: &'a [u32], len: usize },
}

impl<'a> Visibility<'a> {
    fn of(layer: &'a kvslice_cache::LayerKv, positions: &'a [u32]) -> Self {
        let n = positions.len();
        let len = layer.max_len();
        let lens = layer.lens();
        let uniform = lens.iter().all(|&l| l == len);
        let heads: Vec<&[u32]> = (0..lens.len()).map(|h| layer.head_positions(h)).collect();
        let min_query = positions.iter().copied().min().unwrap_or(0);
        if uniform && heads.iter().all(|p| p.iter().all(|&s| s <= min_query)) {
            return Visibility::All { len };
        }
        // One mask shared by every head when their slots hold the same positions.
        let shared = uniform && heads.iter().all(|p| *p == heads[0]);
        let heads = if shared { heads[..1].to_vec() } else { heads };
        if heads.iter().all(|p| p.windows(2).all(|w| w[0] < w[1])) {
            let mut cutoffs = Vec::with_capacity(heads.len() * n);
            for slots in &heads {
                cutoffs.extend(positions.iter().map(|&qp| slots.partition_point(|&sp| sp <= qp) as i32));
            }
            return Visibility::Prefix { mask_heads: heads.len(), n, len, cutoffs };
        }
        Visibility::Slots { heads, positions, len }
    }

    /// For query rows `start..start + rows`: how many leading slots any of them sees, and the
    /// additive mask over those slots (`[kv_heads | 1, rows, seen]`, 0 where visible and -inf
    /// where not), `None` when every row sees all of them.
    fn chunk(&self, start: usize, rows: usize, device: &Device) -> (usize, Option<Tensor<3>>) {
        match self {
            Visibility::All { len } => (*len, None),
            Visibility::Prefix { mask_heads, n, len, cutoffs } => {
                let chunk: Vec<i32> = (0..*mask_heads)
                    .flat_map(|h| cutoffs[h * n + start..h * n + start + rows].iter().copied())
                    .collect();
                // At least one slot: a query always sees its own entry, and softmax over
                // nothing would be NaN rather than an error.
                let seen = (chunk.iter().copied().max().unwrap_or(0).max(1) as usize).min(*len);
                if chunk.iter().all(|&c| c as usize >= seen) {
                    return (seen, None);
                }
                let cut = Tensor::<1, Int>::from_data(TensorData::new(chunk, [mask_heads * rows]), device).reshape([
                    *mask_heads,
                    rows,
                    1,
                ]);
                let cols = Tensor::<1, Int>::arange(0..seen as i64, device).reshape([1, 1, seen]);
                let shape = [*mask_heads, rows, seen];
                let hidden = cols.expand(shape).greater_equal(cut.expand(shape));
                (seen, Some(Tensor::<3>::zeros(shape, device).mask_fill(hidden, f32::NEG_INFINITY)))
            }
            Visibility::Slots { heads, positions, len } => {
                let mut mask = vec![f32::NEG_INFINITY; heads.len() * rows * len];
                for (h, slots) in heads.iter().enumerate() {
                    for (i, &qp) in positions[start..start + rows].iter().enumerate() {
                        let row = &mut mask[(h * rows + i) * len..(h * rows + i + 1) * len];
                        for (s, &sp) in slots.iter().enumerate() {
                            if sp <= qp {
                                row[s] = 0.0;
                            }
                        }
                    }
                }
                let shape = [heads.len(), rows, *len];
                (
                    *len,
                    Some(
                        Tensor::<1>::from_data(TensorData::new(mask, [heads.len() * rows * len]), device)
                            .reshape(shape),
                    ),
                )
            }
        }
    }
}
