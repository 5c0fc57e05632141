//! A session: one sequence decoded by one model over one KV cache.
//!
//! Everything that touches the device is `async` (a browser cannot block on the GPU); native
//! callers wrap it with `pollster::block_on` at the edge.

use burn::tensor::{Int, Tensor, TensorData, Transaction};
use kvslice_cache::{CacheGeometry, KvCache, KvStore, LayerKv, Result as CacheResult};
use kvslice_model::Llama;

use crate::error::{Result, RuntimeError};
use crate::evict::observe::Recorder;
use crate::evict::{Compression, CompressionReport, DecodeEviction, EvictingStore, HostLayerStats, StatsRequest};
use crate::host::{now, read_f32};
use crate::sampling::Sampler;

/// Slots a growing cache is given at a time for new tokens: a prefill allocates room for up to
/// this many new tokens, and the generation loop grows the cache by at least this much when it
/// is full ([`Session::reserve`]), so a large `max_new_tokens` costs no memory until it is used.
pub const GROW_STEP: usize = 256;

/// [`Session::logits_at`] computes the logits of at most this many rows at once (`256 × vocab`
/// f32: 48 MiB for SmolLM2's vocabulary).
const LOGIT_ROWS: usize = 256;

/// One sequence on one model.
pub struct Session<'m> {
    model: &'m Llama,
    cache: KvCache,
    /// Source position of the next token.
    next_position: u32,
    /// Decode-time eviction (fixed-size cache), when the compression's policy has one.
    eviction: Option<DecodeEviction>,
    /// Why the session refuses to go on: a step failed after overwriting cache entries, which
    /// cannot be undone ([`Session::reset`] clears it).
    broken: Option<String>,
    /// The ids fed so far, in order (whatever the cache still keeps of them). Complete only when
    /// its length is the position: a session built over a cache from elsewhere starts without.
    history: Vec<u32>,
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
    /// The prompt's ids.
    pub prompt: Vec<u32>,
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
        if let Some(info) = crate::device::device_info(model.device()) {
            crate::limits::check(&crate::limits::session_buffers(c, capacity), &info)?;
        }
        Ok(Self {
            model,
            cache: KvCache::new(geometry, model.device())?,
            next_position: 0,
            eviction: None,
            broken: None,
            history: Vec::new(),
        })
    }

    /// A session over an existing cache whose next token is at source position `next_position`.
    /// Its history ([`Session::history`]) is unknown.
    pub fn from_cache(model: &'m Llama, cache: KvCache, next_position: u32) -> Self {
        Self { model, cache, next_position, eviction: None, broken: None, history: Vec::new() }
    }

    /// [`Session::from_cache`] over a cache that holds (what is kept of) `history`.
    pub(crate) fn with_history(mut self, history: &[u32]) -> Self {
        if history.len() == self.next_position as usize {
            self.history = history.to_vec();
        }
        self
    }

    /// A session over a compressed cache whose decode-time rule keeps it at its size.
    pub(crate) fn with_eviction(
        model: &'m Llama,
        cache: KvCache,
        next_position: u32,
        eviction: Option<DecodeEviction>,
    ) -> Self {
        Self { model, cache, next_position, eviction, broken: None, history: Vec::new() }
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

    pub(crate) async fn prefill_sampled(
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
        let mut recorder = Recorder::new(&mut session.cache, request, model.config.num_layers, prompt.len());
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
            prompt: prompt.to_vec(),
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
                let mut cache = crate::evict::compress_cache(&prefilled.cache, &all, max_new_tokens, 0)?;
                if let Some(layouts) = model.latent_layouts() {
                    cache.with_latent_keys(layouts)?;
                }
                Ok((Session::from_cache(model, cache, n as u32).with_history(&prefilled.prompt), None))
            }
            Some(c) => {
                let (cache, eviction, report) =
                    crate::evict::compress(c, &prefilled.stats, &prefilled.cache, model, max_new_tokens).await?;
                // a renumbered cache goes on from its own length (and has no history to rewind)
                let next = report.renumbered.unwrap_or(n as u32);
                let session = Session::with_eviction(model, cache, next, eviction).with_history(&prefilled.prompt);
                Ok((session, Some(report)))
            }
        }
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

    /// Forgets the sequence and any decode-time eviction state; the cache storage is kept
    /// (the cache then grows: a fresh sequence starts with nothing to evict). A session a failed
    /// step left unusable is usable again.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.next_position = 0;
        self.eviction = None;
        self.broken = None;
        self.history.clear();
    }

    /// Every id fed so far, in order, when the session knows them (it does unless it was built
    /// over a cache from elsewhere). With a compressed cache, some of them are no longer kept.
    pub fn history(&self) -> Option<&[u32]> {
        (self.history.len() == self.next_position as usize).then_some(&self.history[..])
    }

    /// Whether [`Session::rewind`] can go back to position `to`: the session knows its history,
    /// has no decode-time eviction state (which has rearranged or scored the slots), and in
    /// every head the entries at positions `to` and later are the last ones appended.
    pub fn can_rewind(&self, to: usize) -> bool {
        let now = self.next_position as usize;
        if to == now {
            return self.broken.is_none();
        }
        to < now
            && self.broken.is_none()
            && self.eviction.is_none()
            && self.history().is_some()
            && self.cache.layers().iter().all(|l| {
                (0..l.lens().len()).all(|h| {
                    let p = l.head_positions(h);
                    let kept = p.partition_point(|&x| (x as usize) < to);
                    p[..kept].iter().all(|&x| (x as usize) < to) && p[kept..].iter().all(|&x| (x as usize) >= to)
                })
            })
    }

    /// Forgets every token from position `to` on, as if only the first `to` had been fed: the
    /// conversation continues from a shared prefix. Refused where [`Session::can_rewind`] is not.
    pub fn rewind(&mut self, to: usize) -> Result<()> {
        if !self.can_rewind(to) {
            return Err(RuntimeError::Options(format!(
                "the session cannot go back to position {to} (it holds {} tokens{})",
                self.next_position,
                if self.eviction.is_some() { ", evicted while decoding" } else { "" }
            )));
        }
        let lens: Vec<Vec<usize>> = self
            .cache
            .layers()
            .iter()
            .map(|l| (0..l.lens().len()).map(|h| l.head_positions(h).partition_point(|&x| (x as usize) < to)).collect())
            .collect();
        self.cache.truncate(&lens)?;
        self.history.truncate(to);
        self.next_position = to as u32;
        Ok(())
    }

    /// Makes room for `n` more tokens in every head without decode-time eviction: a cache that
    /// is too small is copied into storage of the size needed (never past the model's context).
    /// The next turn of a conversation grows its cache this way; a session whose policy keeps
    /// its cache at a fixed size feeds the turn through its eviction rule instead.
    pub fn reserve(&mut self, n: usize) -> Result<()> {
        if self.cache.has_room(n) {
            return Ok(());
        }
        let context = self.model.config.max_position_embeddings;
        let need = self.cache.max_len().saturating_add(n).min(context);
        if let Some(info) = crate::device::device_info(self.model.device()) {
            crate::limits::check(&crate::limits::session_buffers(&self.model.config, need), &info)?;
        }
        let mut layers = Vec::with_capacity(self.cache.layers().len());
        for l in self.cache.layers() {
            let slots: Vec<Vec<u32>> = l.lens().iter().map(|&len| (0..len as u32).collect()).collect();
            layers.push(l.gather(&slots, need.max(l.capacity()))?);
        }
        self.cache = KvCache::from_layers(layers)?;
        Ok(())
    }

    /// Feeds `tokens` one decode step at a time (each through the decode-time eviction rule):
    /// how a fixed-size cache takes a turn of several tokens while staying at its size.
    pub async fn ingest(&mut self, tokens: &[u32]) -> Result<()> {
        for &t in tokens {
            self.usable()?;
            self.before_step(1).await?;
            self.feed(&[t])?;
            if let Err(e) = self.absorb().await {
                self.broken =
                    Some(format!("a step failed after its tokens entered the cache ({e}); reset the session"));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Refuses a session that a failed step left unusable.
    fn usable(&self) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(reason) => Err(RuntimeError::Unusable(reason.clone())),
        }
    }

    /// Refuses, before any work, `prompt` tokens followed by `new` generated ones that would
    /// not fit the model's context from the current position (the generation loop feeds all
    /// but the last generated token). The one context check of a generation.
    pub fn check_context(&self, prompt: usize, new: usize) -> Result<()> {
        fits_context(self.model, self.next_position as usize, prompt, new)
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
    ///
    /// All or nothing: when the forward pass fails part-way (at a layer after others took the
    /// tokens), the layers that appended are cut back and the position does not advance, so a
    /// retry feeds the same tokens once. A failed decode step that had already overwritten
    /// evicted entries cannot be undone: the session then refuses every further step with the
    /// reason until [`Session::reset`].
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Tensor<2>> {
        self.feed_failing_at(tokens, None)
    }

    /// [`Session::feed`]; `fail_at`: a layer whose cache write fails (the failure-path tests).
    fn feed_failing_at(&mut self, tokens: &[u32], fail_at: Option<usize>) -> Result<Tensor<2>> {
        self.usable()?;
        self.check_room(tokens.len())?;
        let start = self.next_position;
        let positions: Vec<u32> = (start..start + tokens.len() as u32).collect();
        let lens = self.cache.lens_by_layer();
        let result = match &mut self.eviction {
            Some(eviction) if tokens.len() == 1 => {
                let slots = slot_positions(&self.cache);
                let mut store = FailAt { inner: EvictingStore { cache: &mut self.cache, eviction }, layer: fail_at };
                let out = self.model.forward(tokens, &positions, &mut store);
                match out {
                    Ok(_) => eviction.after_step(),
                    Err(_) => eviction.discard_pending(),
                }
                // a step that failed before its first write changed nothing
                out.map_err(|e| (e, slot_positions(&self.cache) == slots))
            }
            _ => {
                let mut store = FailAt { inner: &mut self.cache, layer: fail_at };
                self.model.forward(tokens, &positions, &mut store).map_err(|e| (e, true))
            }
        };
        match result {
            Ok(hidden) => {
                if self.history.len() == self.next_position as usize {
                    self.history.extend_from_slice(tokens);
                }
                self.next_position += tokens.len() as u32;
                Ok(hidden)
            }
            Err((e, appended_only)) => {
                // Appends only add slots past each head's length: cutting the lengths back
                // restores the cache exactly. Overwritten (evicted) entries are gone.
                if !(appended_only && self.cache.truncate(&lens).is_ok()) {
                    self.broken =
                        Some(format!("a decode step failed after evicting cache entries ({e}); reset the session"));
                }
                Err(e.into())
            }
        }
    }

    /// The step primitive: feeds `tokens` (a prompt, a prompt chunk or the last generated
    /// token) and returns the token `sampler` draws after them. Greedy choices are made on the
    /// device (one integer read back instead of the vocabulary).
    pub async fn step(&mut self, tokens: &[u32], sampler: &mut Sampler) -> Result<u32> {
        if tokens.is_empty() {
            return Err(RuntimeError::Options("nothing to feed".into()));
        }
        self.usable()?;
        self.before_step(tokens.len()).await?;
        let hidden = self.feed(tokens)?;
        // The cache holds the tokens now: a failure past this point cannot be undone by a
        // retry (which would feed them twice).
        let after = async {
            self.absorb().await?;
            self.sample_last(hidden, sampler).await
        };
        let token = after.await;
        if let Err(e) = &token {
            self.broken = Some(format!("a step failed after its tokens entered the cache ({e}); reset the session"));
        }
        token
    }

    /// Before a decode step of `n` tokens: the recompression that is due.
    async fn before_step(&mut self, n: usize) -> Result<()> {
        if let (Some(e), 1) = (&mut self.eviction, n) {
            e.before_step(self.model, &mut self.cache).await?;
        }
        Ok(())
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
        self.before_step(tokens.len()).await?;
        let hidden = self.feed(tokens)?;
        self.absorb().await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        // the rows' logits a block at a time: a whole prompt's (`[n, vocab]`) would be
        // gigabytes at 8K tokens
        let vocab = self.model.config.vocab_size;
        let mut out = Vec::with_capacity(rows.len());
        for block in rows.chunks(LOGIT_ROWS) {
            let idx = Tensor::<1, Int>::from_data(
                TensorData::new(block.iter().map(|&r| r as i32).collect::<Vec<_>>(), [block.len()]),
                self.model.device(),
            );
            let flat = read_f32(self.model.logits(hidden.clone().select(0, idx))).await?;
            out.extend(flat.chunks(vocab).map(<[f32]>::to_vec));
        }
        Ok(out)
    }

    /// Feeds `tokens` and returns the logits of the last one.
    pub async fn next_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let last = tokens.len().saturating_sub(1);
        Ok(self.logits_at(tokens, &[last]).await?.pop().unwrap_or_default())
    }

    /// The token `sampler` draws after the last row of `hidden` (`[n, hidden]`).
    pub(crate) async fn sample_last(&self, hidden: Tensor<2>, sampler: &mut Sampler) -> Result<u32> {
        if sampler.is_greedy() {
            return self.argmax_last(hidden).await;
        }
        let n = hidden.dims()[0];
        let logits = read_f32(self.model.logits(hidden.narrow(0, n - 1, 1))).await?;
        if let Some((i, x)) = logits.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(RuntimeError::NonFiniteLogits(format!("logit {i} is {x}")));
        }
        Ok(sampler.sample(&logits))
    }

    /// The greedy token after the last row of `hidden` (`[n, hidden]`). With it comes the
    /// logits' sum, in the same read-back: an argmax over NaNs names a token all the same.
    async fn argmax_last(&self, hidden: Tensor<2>) -> Result<u32> {
        let n = hidden.dims()[0];
        let (id, sum) = {
            let _head = kvslice_kernels::dispatch::scope("head");
            let logits = self.model.logits(hidden.narrow(0, n - 1, 1)); // [1, vocab]
            (logits.clone().argmax(1).reshape([1]), logits.sum())
        };
        let data = Transaction::default()
            .register(id)
            .register(sum)
            .execute_async()
            .await
            .map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
        let v = data[0].iter::<i64>().next().ok_or_else(|| RuntimeError::Readback("empty argmax".into()))?;
        let sum = data[1].iter::<f32>().next().ok_or_else(|| RuntimeError::Readback("empty sum".into()))?;
        if !sum.is_finite() {
            return Err(RuntimeError::NonFiniteLogits(format!("their sum is {sum}")));
        }
        Ok(v as u32)
    }
}

/// Every layer's slot positions: what a decode step's eviction changes.
fn slot_positions(cache: &KvCache) -> Vec<Vec<u32>> {
    cache.layers().iter().map(|l| l.positions().to_vec()).collect()
}

/// A store whose write at `layer` fails (none when `layer` is `None`): how the tests reach the
/// failure paths of [`Session::feed`] that a device fault would take.
struct FailAt<S> {
    inner: S,
    layer: Option<usize>,
}

impl<S: KvStore> KvStore for FailAt<S> {
    fn append(&mut self, layer: usize, keys: Tensor<3>, values: Tensor<3>, positions: &[u32]) -> CacheResult<()> {
        if self.layer == Some(layer) {
            return Err(kvslice_cache::CacheError::Kernel(format!("write to layer {layer} failed")));
        }
        self.inner.append(layer, keys, values, positions)
    }

    fn layer(&self, layer: usize) -> CacheResult<&LayerKv> {
        self.inner.layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, raw: &Tensor<3>) -> CacheResult<()> {
        self.inner.observe_queries(layer, rotated, raw)
    }

    fn takes_chunks(&self) -> bool {
        self.inner.takes_chunks()
    }

    fn wants_attention_sums(&self, layer: usize) -> bool {
        self.inner.wants_attention_sums(layer)
    }

    fn offer_attention_sums(&mut self, layer: usize, sums: Tensor<2>) -> CacheResult<()> {
        self.inner.offer_attention_sums(layer, sums)
    }
}

/// Whether `prompt` tokens after `used` ones, then `new` generated ones (all but the last fed),
/// fit `model`'s context.
pub(crate) fn fits_context(model: &Llama, used: usize, prompt: usize, new: usize) -> Result<()> {
    let context = model.config.max_position_embeddings;
    let fed = used.checked_add(prompt).and_then(|x| x.checked_add(new.saturating_sub(1)));
    match fed {
        Some(total) if total <= context => Ok(()),
        _ => Err(RuntimeError::ContextOverflow { tokens: used.saturating_add(prompt), new, context }),
    }
}

#[cfg(test)]
mod tests {
    //! A step that fails part-way through the layers leaves the session as it was (or, where
    //! it cannot, refuses to go on); the reference is a session that never failed.
    use kvslice_policy::DecodeRule;

    use super::*;
    use crate::testing::{prompt, tiny};

    fn lens(session: &Session) -> Vec<Vec<usize>> {
        session.cache().lens_by_layer()
    }

    #[test]
    fn a_forward_that_fails_at_a_later_layer_leaves_the_session_unchanged() {
        let model = tiny();
        let ids = prompt(12);
        let mut failed = Session::new(&model, 32).unwrap();
        failed.feed(&ids[..10]).unwrap();
        let before = lens(&failed);
        // layers 0 and 1 append the two tokens, layer 2 fails
        assert!(failed.feed_failing_at(&ids[10..], Some(2)).is_err());
        assert_eq!(failed.position(), 10);
        assert_eq!(lens(&failed), before);
        // the retry feeds them once: the same logits as a session that never failed
        let retried = pollster::block_on(failed.next_logits(&ids[10..])).unwrap();
        let mut clean = Session::new(&model, 32).unwrap();
        let expected = pollster::block_on(clean.next_logits(&ids)).unwrap();
        assert_eq!(failed.position(), 12);
        assert_eq!(lens(&failed), vec![vec![12, 12]; 3]);
        let worst = retried.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "logits differ by {worst}");
    }

    #[test]
    fn a_decode_step_that_fails_after_evicting_refuses_to_go_on_until_reset() {
        let model = tiny();
        let ids = prompt(9);
        let mut session = Session::new(&model, 8).unwrap();
        session.feed(&ids[..8]).unwrap();
        session.eviction = DecodeEviction::new(DecodeRule::Recent { sinks: 1 }, session.cache(), Vec::new());
        assert!(session.eviction.is_some());
        // layers 0 and 1 overwrite their oldest entry after the sink, layer 2 fails: the
        // evicted entries are gone, so the session cannot be put back
        assert!(session.feed_failing_at(&ids[8..], Some(2)).is_err());
        assert_eq!(session.position(), 8);
        for attempt in [session.feed(&ids[8..]).err(), pollster::block_on(session.next_logits(&ids[8..])).err()] {
            match attempt {
                Some(RuntimeError::Unusable(reason)) => assert!(reason.contains("reset"), "{reason}"),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        let mut sampler = Sampler::greedy();
        assert!(matches!(pollster::block_on(session.step(&ids[8..], &mut sampler)), Err(RuntimeError::Unusable(_))));
        session.reset();
        session.feed(&ids[..4]).unwrap();
        assert_eq!(session.position(), 4);
    }

    #[test]
    fn a_decode_step_that_fails_before_any_write_is_retried_cleanly() {
        let model = tiny();
        let ids = prompt(9);
        let mut session = Session::new(&model, 8).unwrap();
        session.feed(&ids[..8]).unwrap();
        session.eviction = DecodeEviction::new(DecodeRule::Recent { sinks: 1 }, session.cache(), Vec::new());
        let positions = session.cache().layer(0).unwrap().positions().to_vec();
        assert!(session.feed_failing_at(&ids[8..], Some(0)).is_err());
        // nothing was written: the session goes on
        assert_eq!(session.cache().layer(0).unwrap().positions(), &positions[..]);
        session.feed(&ids[8..]).unwrap();
        assert_eq!(session.position(), 9);
        // StreamingLLM with one sink: position 1 made room for position 8
        assert_eq!(session.cache().layer(2).unwrap().head_positions(0), &[0, 8, 2, 3, 4, 5, 6, 7]);
    }
}
