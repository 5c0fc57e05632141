//! The engine: one thread that owns the model and every session, and runs the requests.
//!
//! Requests arrive through a bounded queue (a full queue is the HTTP side's 429). Up to
//! `parallel` generations run at once, interleaved a token at a time so every stream moves;
//! the rest wait in the queue. A finished generation's session is kept with the tokens its
//! cache has seen, so a later request whose prompt extends them (the next turn of a chat, a
//! question after a document) continues over that cache, compressed or not, instead of
//! prefilling again. Kept sessions are dropped least recently used first under
//! `--max-sessions`, the KV memory limit and their idle time. A client that goes away stops its
//! generation at the next token, and its cache is freed.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use kvslice_runtime::policies::ModelInfo;
use kvslice_runtime::{
    Compression, GenerateOptions, Generator, LoadedModel, RuntimeError, Sampler, Session, reusable_prefix,
};
use tokio::sync::mpsc::UnboundedSender;

use crate::api::{ApiError, Settings};
use crate::metrics::Metrics;
use crate::stop::StopMatcher;

/// What a request asks the model to continue.
#[derive(Debug, Clone)]
pub enum Input {
    /// Chat messages `(role, text)`, rendered by the model's chat template with the assistant's
    /// turn opened.
    Chat(Vec<(String, String)>),
    /// Raw text (`/v1/completions`), tokenized with the tokenizer's own special tokens.
    Text(String),
    Tokens(Vec<u32>),
}

/// One request for the engine.
pub struct Job {
    pub input: Input,
    pub settings: Settings,
    pub events: UnboundedSender<Event>,
}

/// What the engine tells the request's handler, in order: `Started` or `Failed`, then text,
/// then `Finished` or `Failed`.
#[derive(Debug, Clone)]
pub enum Event {
    Started,
    Text(String),
    Finished(Usage),
    Failed(ApiError),
}

/// Counts and cache figures of a finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens reused from a kept session's cache.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// KV entries (one key and one value of one KV head in one layer) the cache kept, and the
    /// bytes of storage it holds.
    pub kv_entries: usize,
    pub kv_bytes: usize,
    /// `stop` (a stop token or sequence) or `length` (`max_tokens` or the context).
    pub finish_reason: &'static str,
}

/// The engine's settings (the `serve` command's flags).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Default policy and budget of requests that name none (`None`: the full cache).
    pub default_kv: Option<(String, String)>,
    pub max_sessions: usize,
    /// Bytes of KV storage the kept sessions may hold together.
    pub kv_memory: u64,
    /// Generations run at once.
    pub parallel: usize,
    /// A kept session not used for this long is dropped.
    pub session_ttl: Duration,
}

/// A session kept between requests.
struct Kept {
    kv: Option<(String, String)>,
    session: Session<'static>,
    last_used: Instant,
}

/// A generation in progress.
struct Active {
    generator: Generator<'static>,
    kv: Option<(String, String)>,
    events: UnboundedSender<Event>,
    stop: StopMatcher,
    prompt_tokens: usize,
    cached_tokens: usize,
    /// The generation failed (its handler was told).
    failed: bool,
}

pub struct Engine {
    model: &'static LoadedModel,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    kept: Vec<Kept>,
    active: Vec<Active>,
}

impl Engine {
    pub fn new(model: &'static LoadedModel, config: EngineConfig, metrics: Arc<Metrics>) -> Self {
        Engine { model, config, metrics, kept: Vec::new(), active: Vec::new() }
    }

    /// Runs until every sender of `jobs` is gone and the last generation ended.
    pub fn run(mut self, jobs: Receiver<Job>) {
        loop {
            // admit new work: wait for it when idle (waking to drop idle sessions)
            while self.active.len() < self.config.parallel.max(1) {
                let job = if self.active.is_empty() {
                    match jobs.recv_timeout(Duration::from_millis(500)) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => {
                            self.expire();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match jobs.try_recv() {
                        Ok(job) => job,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) if self.active.is_empty() => return,
                        Err(TryRecvError::Disconnected) => break,
                    }
                };
                self.metrics.queue_depth.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                // a bug in one request must not take the server down: it fails alone
                let events = job.events.clone();
                if catch_unwind(AssertUnwindSafe(|| self.start(job))).is_err() {
                    Metrics::add(&self.metrics.failed, 1);
                    let _ =
                        events.send(Event::Failed(ApiError::server("internal error while starting the generation")));
                }
                self.publish();
            }
            // one token for every generation in progress
            let mut i = 0;
            while i < self.active.len() {
                let ended = catch_unwind(AssertUnwindSafe(|| self.advance(i))).unwrap_or_else(|_| {
                    let a = &mut self.active[i];
                    Metrics::add(&self.metrics.failed, 1);
                    let _ = a.events.send(Event::Failed(ApiError::server("internal error while generating")));
                    a.failed = true;
                    true
                });
                if ended {
                    let done = self.active.swap_remove(i);
                    self.finish(done);
                } else {
                    i += 1;
                }
            }
            self.expire();
            self.publish();
        }
    }

    fn model_info(&self) -> ModelInfo {
        Compression::model_info(&self.model.model)
    }

    /// Tokenizes and checks a job, then prefills it or continues a kept session.
    fn start(&mut self, job: Job) {
        if job.events.is_closed() {
            Metrics::add(&self.metrics.cancelled, 1);
            return;
        }
        match self.begin(&job) {
            Ok(active) => {
                let _ = job.events.send(Event::Started);
                self.active.push(active);
            }
            Err(e) => {
                let counter = if e.status == 400 { &self.metrics.bad_requests } else { &self.metrics.failed };
                Metrics::add(counter, 1);
                let _ = job.events.send(Event::Failed(e));
            }
        }
    }

    fn begin(&mut self, job: &Job) -> Result<Active, ApiError> {
        let model = self.model;
        let tokenizer = &model.tokenizer;
        let invalid = |e: kvslice_runtime::RuntimeError| ApiError::invalid(e.to_string(), None);
        let prompt = match &job.input {
            Input::Chat(messages) => {
                let messages: Vec<_> =
                    messages.iter().map(|(r, t)| kvslice_runtime::ChatMessage::new(r.clone(), t.clone())).collect();
                tokenizer.encode_chat(&messages, true).map_err(|e| invalid(e.into()))?
            }
            Input::Text(text) => tokenizer.encode(text, true).map_err(|e| invalid(e.into()))?,
            Input::Tokens(ids) => {
                let vocab = model.model.config.vocab_size;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(ApiError::invalid(
                        format!("token {bad} is outside the vocabulary of {vocab}"),
                        Some("prompt"),
                    ));
                }
                ids.clone()
            }
        };
        if prompt.is_empty() {
            return Err(ApiError::invalid("the prompt encodes to no tokens", Some("messages")));
        }
        let context = model.model.config.max_position_embeddings;
        if prompt.len() >= context {
            return Err(ApiError::invalid(
                format!("the prompt is {} tokens, the model's context {context}: no room to generate", prompt.len()),
                Some("messages"),
            ));
        }
        let s = &job.settings;
        let max_new = match s.max_tokens {
            Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1", Some("max_tokens"))),
            Some(m) => m,
            None => context - prompt.len(),
        };
        if prompt.len().saturating_add(max_new - 1) > context {
            return Err(ApiError::invalid(
                format!(
                    "the prompt's {} tokens plus max_tokens {max_new} exceed the model's context of {context}",
                    prompt.len()
                ),
                Some("max_tokens"),
            ));
        }
        let kv = s.kv.clone().unwrap_or_else(|| self.config.default_kv.clone());
        let compression = match &kv {
            None => None,
            Some((policy, budget)) => Some(
                Compression::new(policy, budget, &self.model_info())
                    .map_err(|e| ApiError::invalid(e.to_string(), Some("kv_policy")))?
                    .with_reconstruction(model.reconstruction_prompt().map_err(invalid)?),
            ),
        };
        let sampler = Sampler::new(s.temperature, s.top_p, s.seed).map_err(|e| ApiError::invalid(e, None))?;
        let options = GenerateOptions { max_new_tokens: max_new, sampler, stop_tokens: model.stop_tokens() };

        // the kept session of the same policy that shares the longest prefix with the prompt,
        // when it reuses at least half of what it holds (a session that shares only a system
        // prompt stays for its own conversation)
        let best = self
            .kept
            .iter()
            .enumerate()
            .filter(|(_, k)| k.kv == kv)
            .map(|(i, k)| (i, reusable_prefix(&k.session, &prompt), k.session.position() as usize))
            .filter(|&(_, reused, held)| reused > 0 && 2 * reused >= held)
            .max_by_key(|&(_, reused, _)| reused);
        let prefill = |options| {
            pollster::block_on(Generator::prefill(&model.model, &prompt, options, compression.as_ref())).map(|g| (g, 0))
        };
        let started = match best {
            Some((i, _, _)) => {
                let kept = self.kept.swap_remove(i);
                // a kept cache that cannot take the turn: prefill from scratch
                pollster::block_on(Generator::continue_with(kept.session, &prompt, options.clone()))
                    .or_else(|_| prefill(options))
            }
            None => prefill(options),
        };
        let (generator, cached) = started.map_err(|e| match e {
            RuntimeError::ContextOverflow { .. } | RuntimeError::Options(_) => ApiError::invalid(e.to_string(), None),
            e => ApiError::server(e.to_string()),
        })?;
        let stats = *generator.stats();
        Metrics::add(&self.metrics.prompt_tokens, prompt.len() as u64);
        Metrics::add(&self.metrics.cached_tokens, cached as u64);
        Metrics::add(&self.metrics.prefill_tokens, stats.prompt_tokens as u64);
        Metrics::add(&self.metrics.prefill_micros, (stats.prefill_seconds * 1e6) as u64);
        Ok(Active {
            generator: generator.with_tokenizer(tokenizer),
            kv,
            events: job.events.clone(),
            stop: StopMatcher::new(s.stop.clone()),
            prompt_tokens: prompt.len(),
            cached_tokens: cached,
            failed: false,
        })
    }

    /// Produces the next token of generation `i`; true when it has ended (finished, failed or
    /// abandoned by its client).
    fn advance(&mut self, i: usize) -> bool {
        let a = &mut self.active[i];
        if a.events.is_closed() {
            a.generator.stop();
            return true;
        }
        match pollster::block_on(a.generator.next()) {
            Ok(Some(token)) => {
                let (text, found) = a.stop.push(&token.text);
                if !text.is_empty() {
                    let _ = a.events.send(Event::Text(text));
                }
                if found {
                    a.generator.stop();
                    return true;
                }
                false
            }
            Ok(None) => true,
            Err(e) => {
                Metrics::add(&self.metrics.failed, 1);
                let _ = a.events.send(Event::Failed(ApiError::server(e.to_string())));
                a.failed = true;
                true
            }
        }
    }

    /// Reports a generation's end and keeps its session (unless its client is gone).
    fn finish(&mut self, mut a: Active) {
        let stats = *a.generator.stats();
        Metrics::add(&self.metrics.decode_tokens, stats.decode_steps as u64);
        Metrics::add(&self.metrics.decode_micros, (stats.decode_seconds * 1e6) as u64);
        if a.failed {
            return;
        }
        if a.events.is_closed() {
            // the client went away: its cache is freed now
            Metrics::add(&self.metrics.cancelled, 1);
            return;
        }
        let stopped = a.generator.tokens().last().is_some_and(|t| self.model.stop_tokens().contains(t));
        let found_stop_sequence = a.stop.found();
        let mut rest = String::new();
        if !found_stop_sequence {
            rest = a.generator.rest().unwrap_or_default();
            let (text, found) = a.stop.push(&rest);
            rest = if found { text } else { text + &a.stop.finish() };
        }
        if !rest.is_empty() {
            let _ = a.events.send(Event::Text(rest));
        }
        let completion = a.generator.output().len();
        Metrics::add(&self.metrics.completion_tokens, completion as u64);
        let session = a.generator.into_session();
        let usage = Usage {
            prompt_tokens: a.prompt_tokens,
            cached_tokens: a.cached_tokens,
            completion_tokens: completion,
            kv_entries: session.cache().occupied_slots(),
            kv_bytes: session.cache().storage_bytes(),
            finish_reason: if stopped || a.stop.found() { "stop" } else { "length" },
        };
        let _ = a.events.send(Event::Finished(usage));
        self.keep(Kept { kv: a.kv, session, last_used: Instant::now() });
    }

    fn keep(&mut self, kept: Kept) {
        if self.config.max_sessions == 0 || kept.session.history().is_none() {
            return;
        }
        self.kept.push(kept);
        // least recently used first, until both limits hold
        while self.kept.len() > self.config.max_sessions || self.kept_bytes() > self.config.kv_memory {
            let Some(oldest) = self.kept.iter().enumerate().min_by_key(|(_, k)| k.last_used).map(|(i, _)| i) else {
                break;
            };
            self.kept.swap_remove(oldest);
            Metrics::add(&self.metrics.sessions_evicted, 1);
        }
    }

    fn kept_bytes(&self) -> u64 {
        self.kept.iter().map(|k| k.session.cache().storage_bytes() as u64).sum()
    }

    /// Drops kept sessions idle for longer than the TTL.
    fn expire(&mut self) {
        let ttl = self.config.session_ttl;
        let before = self.kept.len();
        self.kept.retain(|k| k.last_used.elapsed() < ttl);
        Metrics::add(&self.metrics.sessions_evicted, (before - self.kept.len()) as u64);
        self.publish();
    }

    /// Updates the gauges.
    fn publish(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let active: u64 = self.active.iter().map(|a| a.generator.session().cache().storage_bytes() as u64).sum();
        self.metrics.kv_bytes_held.store(active + self.kept_bytes(), Relaxed);
        self.metrics.sessions_held.store((self.kept.len() + self.active.len()) as u64, Relaxed);
        self.metrics.active.store(self.active.len() as u64, Relaxed);
    }
}
