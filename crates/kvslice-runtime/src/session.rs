//! A session: one sequence decoded by one model over one KV cache.
//!
//! Everything that touches the device is `async` (a browser cannot block on the GPU); native
//! callers wrap it with `pollster::block_on` at the edge.

use burn::tensor::{Int, Tensor, TensorData, Transaction};
use kvslice_cache::{CacheGeometry, KvCache};
use kvslice_model::Llama;

use crate::error::{Result, RuntimeError};
use crate::evict::observe::Recorder;
use crate::evict::{Compression, CompressionReport, DecodeEviction, EvictingStore, HostLayerStats, StatsRequest};
use crate::sampling::Sampler;

/// Timings and counts of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub prefill_seconds: f64,
    /// Tokens produced (the first comes from the prefill's last position).
    pub generated_tokens: usize,
    /// Single-token forward passes run after the prefill.
    pub decode_steps: usize,
    pub decode_seconds: f64,
}

impl GenerationStats {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(1e-9)
    }

    pub fn decode_tokens_per_second(&self) -> f64 {
        self.decode_steps as f64 / self.decode_seconds.max(1e-9)
    }
}

impl std::fmt::Display for GenerationStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "prefill: {} tokens, {:.1} tok/s; decode: {} tokens, {:.1} tok/s",
            self.prompt_tokens,
            self.prefill_tokens_per_second(),
            self.generated_tokens,
            self.decode_tokens_per_second()
        )
    }
}

/// Options of [`Session::generate`].
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampler: Sampler,
    /// Generation stops after any of these tokens (which is still reported).
    pub stop_tokens: Vec<u32>,
}

/// One sequence on one model.
pub struct Session<'m> {
    model: &'m Llama,
    cache: KvCache,
    /// Source position of the next token.
    next_position: u32,
    /// Decode-time eviction (fixed-size cache), when the compression's policy has one.
    eviction: Option<DecodeEviction>,
}

/// A prompt prefilled once with the statistics of a set of policies, ready to be compressed
/// many ways ([`Session::resume`]): the sweep's "prefill once, evaluate many".
pub struct Prefilled {
    /// The full cache of the prompt.
    pub cache: KvCache,
    /// Statistics per layer, on the host.
    pub stats: Vec<HostLayerStats>,
    /// The greedy token after the prompt (computed with the full cache).
    pub first_token: u32,
    pub prompt_tokens: usize,
    /// The forward pass, and the statistics recorded during it (included in `prefill_seconds`),
    /// then read back.
    pub prefill_seconds: f64,
    pub stats_seconds: f64,
    /// Of `prefill_seconds`, the time spent in the statistics (exact on the CPU backend, which
    /// computes as it goes; on a GPU only the queueing).
    pub stats_compute_seconds: f64,
}

impl<'m> Session<'m> {
    /// A session whose cache holds up to `capacity` tokens per KV head (at most the model's
    /// context).
    pub fn new(model: &'m Llama, capacity: usize) -> Result<Self> {
        let c = &model.config;
        let capacity = capacity.min(c.max_position_embeddings);
        let geometry = CacheGeometry { layers: c.num_layers, kv_heads: c.num_kv_heads, head_dim: c.head_dim, capacity };
        Ok(Self { model, cache: KvCache::new(geometry, model.device())?, next_position: 0, eviction: None })
    }

    /// A session over an existing cache whose next token is at source position `next_position`.
    pub fn from_cache(model: &'m Llama, cache: KvCache, next_position: u32) -> Self {
        Self { model, cache, next_position, eviction: None }
    }

    /// Decode-time eviction state, when the session keeps a fixed-size cache.
    pub fn eviction(&self) -> Option<&DecodeEviction> {
        self.eviction.as_ref()
    }

    /// Prefills `prompt` into a fresh full cache, recording `request`'s statistics, and returns
    /// everything a later compression needs.
    pub async fn prefill_for(model: &'m Llama, prompt: &[u32], request: &StatsRequest) -> Result<Prefilled> {
        Self::prefill_sampled(model, prompt, request, &mut Sampler::greedy()).await
    }

    async fn prefill_sampled(
        model: &'m Llama,
        prompt: &[u32],
        request: &StatsRequest,
        sampler: &mut Sampler,
    ) -> Result<Prefilled> {
        if prompt.is_empty() {
            return Err(RuntimeError::Options("empty prompt".into()));
        }
        let mut session = Session::new(model, prompt.len())?;
        session.check_room(prompt.len())?;
        let t0 = now();
        let positions: Vec<u32> = (0..prompt.len() as u32).collect();
        let mut recorder = Recorder::new(&mut session.cache, request, model.config.num_layers);
        let hidden = model.forward(prompt, &positions, &mut recorder)?;
        let observations = recorder.finish();
        let stats_compute_seconds = observations.compute_seconds;
        let first_token = session.sample_last(hidden, sampler).await?;
        let t1 = now();
        let stats = observations.read().await?;
        let t2 = now();
        Ok(Prefilled {
            cache: session.cache,
            stats,
            first_token,
            prompt_tokens: prompt.len(),
            prefill_seconds: t1 - t0,
            stats_seconds: t2 - t1,
            stats_compute_seconds,
        })
    }

    /// A session continuing after `prefilled`'s prompt, over its cache compressed by
    /// `compression` (the full cache, copied on write, when `None`), with room for
    /// `max_new_tokens`. The prefilled cache is left as it is.
    pub async fn resume(
        model: &'m Llama,
        prefilled: &Prefilled,
        compression: Option<&Compression>,
        max_new_tokens: usize,
    ) -> Result<(Session<'m>, Option<CompressionReport>)> {
        let n = prefilled.prompt_tokens;
        match compression {
            None => {
                let all: Vec<Vec<Vec<u32>>> = (0..model.config.num_layers)
                    .map(|_| vec![(0..n as u32).collect(); model.config.num_kv_heads])
                    .collect();
                let cache = crate::evict::compress_cache(&prefilled.cache, &all, max_new_tokens, 0)?;
                Ok((Session::from_cache(model, cache, n as u32), None))
            }
            Some(c) => {
                let (cache, eviction, report) =
                    crate::evict::compress(c, &prefilled.stats, &prefilled.cache, model, max_new_tokens).await?;
                let mut session = Session::from_cache(model, cache, n as u32);
                session.eviction = eviction;
                Ok((session, Some(report)))
            }
        }
    }

    /// Prefills `prompt`, compresses the cache with `compression` and decodes, calling
    /// `on_token` with each new token (`false` stops). The prompt must fit the context with the
    /// new tokens; it is refused before any work otherwise. Returns the session (for more
    /// decoding), the tokens, the timings and what the compression did.
    pub async fn generate_compressed(
        model: &'m Llama,
        prompt: &[u32],
        options: &GenerateOptions,
        compression: &Compression,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Session<'m>, Vec<u32>, GenerationStats, CompressionReport)> {
        let context = model.config.max_position_embeddings;
        let new = options.max_new_tokens.saturating_sub(1);
        if prompt.len() + new > context {
            return Err(RuntimeError::ContextOverflow { tokens: prompt.len(), new, context });
        }
        let mut sampler = options.sampler.clone();
        let t0 = now();
        #[cfg(not(target_family = "wasm"))]
        let cascaded = if compression.cascades() {
            let (cache, eviction, hidden, report) =
                crate::evict::cascade::prefill(compression, model, prompt, options.max_new_tokens)?;
            let mut session = Session::from_cache(model, cache, prompt.len() as u32);
            session.eviction = Some(eviction);
            let token = session.sample_last(hidden, &mut sampler).await?;
            Some((session, report, token))
        } else {
            None
        };
        #[cfg(target_family = "wasm")]
        let cascaded: Option<(Session<'m>, CompressionReport, u32)> = None;
        let (mut session, report, token) = match cascaded {
            Some(done) => done,
            None => {
                let request = compression.request(model.config.num_layers);
                let prefilled = Self::prefill_sampled(model, prompt, &request, &mut sampler).await?;
                let (session, report) =
                    Self::resume(model, &prefilled, Some(compression), options.max_new_tokens).await?;
                (session, report.unwrap_or_default(), prefilled.first_token)
            }
        };
        let mut stats =
            GenerationStats { prompt_tokens: prompt.len(), prefill_seconds: now() - t0, ..Default::default() };
        let out = session.decode_from(token, options, &mut sampler, &mut stats, on_token).await?;
        Ok((session, out, stats, report))
    }

    /// Greedy decoding after a prefill whose next token is `first`: returns up to
    /// `max_new_tokens` tokens, `first` included, stopping after any of `stop`.
    pub async fn continue_greedy(&mut self, first: u32, max_new_tokens: usize, stop: &[u32]) -> Result<Vec<u32>> {
        let options = GenerateOptions { max_new_tokens, sampler: Sampler::greedy(), stop_tokens: stop.to_vec() };
        let mut stats = GenerationStats::default();
        self.decode_from(first, &options, &mut Sampler::greedy(), &mut stats, |_| true).await
    }

    pub fn model(&self) -> &Llama {
        self.model
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    pub fn cache_mut(&mut self) -> &mut KvCache {
        &mut self.cache
    }

    /// Tokens seen so far (the next token's source position).
    pub fn position(&self) -> u32 {
        self.next_position
    }

    /// Forgets the sequence; the cache storage is kept.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.next_position = 0;
    }

    fn check_room(&self, n: usize) -> Result<()> {
        let capacity = self.cache.geometry().capacity;
        let context = self.model.config.max_position_embeddings;
        let used = self.next_position as usize;
        let evicts = self.eviction.is_some() && n == 1;
        if used + n > context || (!evicts && !self.cache.has_room(n)) {
            return Err(RuntimeError::ContextOverflow { tokens: used, new: n, context: context.min(capacity) });
        }
        Ok(())
    }

    /// Feeds `tokens` and returns the hidden states `[n, hidden]` (device-resident).
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Tensor<2>> {
        self.check_room(tokens.len())?;
        let start = self.next_position;
        let positions: Vec<u32> = (start..start + tokens.len() as u32).collect();
        let hidden = match &mut self.eviction {
            Some(eviction) if tokens.len() == 1 => {
                let mut store = EvictingStore { cache: &mut self.cache, eviction };
                self.model.forward(tokens, &positions, &mut store)?
            }
            _ => self.model.forward(tokens, &positions, &mut self.cache)?,
        };
        self.next_position += tokens.len() as u32;
        Ok(hidden)
    }

    /// Folds the last step's attention into the decode-time eviction scores.
    async fn absorb(&mut self) -> Result<()> {
        if let Some(e) = &mut self.eviction {
            e.absorb().await?;
        }
        Ok(())
    }

    /// Feeds `tokens` and returns the logits of the rows in `rows` (indices into `tokens`),
    /// each `[vocab]`.
    pub async fn logits_at(&mut self, tokens: &[u32], rows: &[usize]) -> Result<Vec<Vec<f32>>> {
        if let Some(&bad) = rows.iter().find(|&&r| r >= tokens.len()) {
            return Err(RuntimeError::Options(format!("row {bad} outside {} tokens", tokens.len())));
        }
        let hidden = self.feed(tokens)?;
        self.absorb().await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let idx = Tensor::<1, Int>::from_data(
            TensorData::new(rows.iter().map(|&r| r as i32).collect::<Vec<_>>(), [rows.len()]),
            self.model.device(),
        );
        let logits = self.model.logits(hidden.select(0, idx));
        let vocab = self.model.config.vocab_size;
        let flat = read_f32(logits).await?;
        Ok(flat.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Feeds `tokens` and returns the logits of the last one.
    pub async fn next_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let last = tokens.len().saturating_sub(1);
        Ok(self.logits_at(tokens, &[last]).await?.pop().unwrap_or_default())
    }

    /// Feeds `tokens` and returns the greedy next token, choosing on the device (one integer
    /// read back instead of the vocabulary).
    async fn next_greedy(&mut self, tokens: &[u32]) -> Result<u32> {
        let hidden = self.feed(tokens)?;
        self.absorb().await?;
        self.argmax_last(hidden).await
    }

    /// The token `sampler` draws after the last row of `hidden` (`[n, hidden]`).
    async fn sample_last(&self, hidden: Tensor<2>, sampler: &mut Sampler) -> Result<u32> {
        if sampler.is_greedy() {
            return self.argmax_last(hidden).await;
        }
        let n = hidden.dims()[0];
        let logits = read_f32(self.model.logits(hidden.narrow(0, n - 1, 1))).await?;
        Ok(sampler.sample(&logits))
    }

    /// The greedy token after the last row of `hidden` (`[n, hidden]`).
    async fn argmax_last(&self, hidden: Tensor<2>) -> Result<u32> {
        let n = hidden.dims()[0];
        let logits = self.model.logits(hidden.narrow(0, n - 1, 1)); // [1, vocab]
        let id = logits.argmax(1).reshape([1]);
        let data = Transaction::default()
            .register(id)
            .execute_async()
            .await
            .map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
        let v = data[0].iter::<i64>().next().ok_or_else(|| RuntimeError::Readback("empty argmax".into()))?;
        Ok(v as u32)
    }

    async fn next_token(&mut self, tokens: &[u32], sampler: &mut Sampler) -> Result<u32> {
        if sampler.is_greedy() {
            self.next_greedy(tokens).await
        } else {
            let logits = self.next_logits(tokens).await?;
            Ok(sampler.sample(&logits))
        }
    }

    /// Prefills `prompt` and decodes up to `max_new_tokens`, calling `on_token` with each new
    /// token as soon as it is known; `on_token` returns `false` to stop early.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenerationStats)> {
        if prompt.is_empty() {
            return Err(RuntimeError::Options("empty prompt".into()));
        }
        self.check_room(prompt.len() + options.max_new_tokens.saturating_sub(1))?;
        let mut sampler = options.sampler.clone();
        let mut stats = GenerationStats { prompt_tokens: prompt.len(), ..Default::default() };
        let mut out = Vec::new();
        if options.max_new_tokens == 0 {
            let t0 = now();
            self.feed(prompt)?;
            self.model.device().sync().map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
            stats.prefill_seconds = now() - t0;
            return Ok((out, stats));
        }
        let t0 = now();
        let token = self.next_token(prompt, &mut sampler).await?;
        stats.prefill_seconds = now() - t0;
        out = self.decode_from(token, options, &mut sampler, &mut stats, on_token).await?;
        Ok((out, stats))
    }

    /// Decodes after the token `first` (already chosen from the prefill): reports each token to
    /// `on_token`, stops at a stop token, at `max_new_tokens` or when `on_token` says so, and
    /// fills the decode fields of `stats`.
    async fn decode_from(
        &mut self,
        first: u32,
        options: &GenerateOptions,
        sampler: &mut Sampler,
        stats: &mut GenerationStats,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let t1 = now();
        let mut out = Vec::new();
        let mut token = first;
        while options.max_new_tokens > 0 {
            out.push(token);
            let go_on = on_token(token);
            if !go_on || options.stop_tokens.contains(&token) || out.len() >= options.max_new_tokens {
                break;
            }
            token = self.next_token(&[token], sampler).await?;
        }
        stats.generated_tokens = out.len();
        stats.decode_steps = out.len().saturating_sub(1);
        stats.decode_seconds = now() - t1;
        Ok(out)
    }
}

/// Reads a float tensor back to the host.
pub async fn read_f32<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    let data = Transaction::default()
        .register(t)
        .execute_async()
        .await
        .map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
    data[0].try_to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))
}

#[cfg(not(target_family = "wasm"))]
pub(crate) fn now() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

#[cfg(target_family = "wasm")]
pub(crate) fn now() -> f64 {
    // Timing in the browser is the page's job; the runtime reports zero durations there.
    0.0
}
