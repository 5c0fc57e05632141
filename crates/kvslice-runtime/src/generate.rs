//! The one generation loop. A [`Generator`] prefills a prompt (compressed or not), then yields
//! one token at a time with the text it completes; every front end (the CLI, the browser
//! facade, the evaluation, the benchmarks) drives it, and it drives the session's step
//! primitive ([`Session::step`]). The context is checked once, before any work.

use kvslice_formats::Tokenizer;
use kvslice_model::Llama;

use crate::error::{Result, RuntimeError};
use crate::evict::{Compression, CompressionReport};
use crate::host::now;
use crate::sampling::Sampler;
use crate::session::{GROW_STEP, Prefilled, Session, fits_context};

/// How many leading tokens of `prompt` (a whole conversation) `session` can reuse: the longest
/// prefix it shares with the session's history, shortened so that at least one prompt token is
/// left to feed (the next token comes from its logits) and to a point the session can go back
/// to ([`Session::can_rewind`]). 0 when the session's history is unknown or nothing is shared.
pub fn reusable_prefix(session: &Session, prompt: &[u32]) -> usize {
    let Some(history) = session.history() else { return 0 };
    let shared = history.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let k = shared.min(prompt.len().saturating_sub(1));
    // A session with decode-time eviction can only go on from where it is (k = its position).
    if k > 0 && session.can_rewind(k) { k } else { 0 }
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub prefill_seconds: f64,
    /// Of the prompt, the leading tokens a kept session already held, reused instead of fed
    /// ([`Generator::continue_with`]); `prompt_tokens` counts the ones fed.
    pub cached_tokens: usize,
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

/// What a [`Generator`] produces: how many tokens, drawn how, stopping where.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampler: Sampler,
    /// Generation stops after any of these tokens (which is still reported).
    pub stop_tokens: Vec<u32>,
}

impl GenerateOptions {
    /// Greedy decoding of up to `max_new_tokens`, stopping after any of `stop_tokens`.
    pub fn greedy(max_new_tokens: usize, stop_tokens: Vec<u32>) -> Self {
        GenerateOptions { max_new_tokens, sampler: Sampler::greedy(), stop_tokens }
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    /// 0 for the token chosen after the prompt.
    pub index: usize,
    /// The text this token completes, in whole characters (empty while a UTF-8 sequence is
    /// incomplete, for stop tokens, and without a tokenizer).
    pub text: String,
    /// One of the stop tokens: the generation ends with it.
    pub stop: bool,
}

/// Text of a growing token list, released in whole characters: a token may end inside a UTF-8
/// sequence, which decodes to U+FFFD until the next token completes it.
#[derive(Debug, Default, Clone)]
pub struct TextStream {
    tokens: Vec<u32>,
    printed: String,
}

impl TextStream {
    /// Adds `token` and returns the new text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String> {
        self.tokens.push(token);
        let text = tokenizer.decode(&self.tokens, true)?;
        if !text.ends_with('\u{FFFD}') && text.starts_with(self.printed.as_str()) {
            let new = text[self.printed.len()..].to_string();
            self.printed = text;
            return Ok(new);
        }
        Ok(String::new())
    }

    /// What the tokens decode to that was not released yet (an incomplete sequence at the end
    /// of a generation, as replacement characters).
    pub fn rest(&self, tokenizer: &Tokenizer) -> Result<String> {
        let text = tokenizer.decode(&self.tokens, true)?;
        Ok(text.strip_prefix(self.printed.as_str()).map(str::to_string).unwrap_or_default())
    }
}

/// A generation in progress: the session, the sampler, the tokens so far.
pub struct Generator<'m> {
    session: Session<'m>,
    sampler: Sampler,
    options: GenerateOptions,
    tokenizer: Option<&'m Tokenizer>,
    stream: TextStream,
    /// The token chosen by the last step and not yet reported.
    chosen: Option<u32>,
    tokens: Vec<u32>,
    done: bool,
    stats: GenerationStats,
    report: Option<CompressionReport>,
}

impl<'m> Generator<'m> {
    /// Prefills `prompt` into a new session — compressed by `compression` (with CAKE's
    /// layer-by-layer cascade where the policy cascades, natively), or the full cache — and
    /// chooses the first token. The prompt and the new tokens must fit the context: refused
    /// before any work otherwise.
    pub async fn prefill(
        model: &'m Llama,
        prompt: &[u32],
        options: GenerateOptions,
        compression: Option<&Compression>,
    ) -> Result<Self> {
        if prompt.is_empty() {
            return Err(RuntimeError::Options("empty prompt".into()));
        }
        let new = options.max_new_tokens;
        crate::session::fits_context(model, 0, prompt.len(), new)?;
        let mut sampler = options.sampler.clone();
        let t0 = now();
        let (session, token, report) = match compression {
            None => {
                let room = prompt.len().saturating_add(new.min(GROW_STEP)).min(model.config.max_position_embeddings);
                let mut session = Session::new(model, room)?;
                let token = session.step(prompt, &mut sampler).await?;
                (session, token, None)
            }
            Some(c) => {
                let (session, token, report) = compressed_prefill(model, prompt, c, new, &mut sampler).await?;
                (session, token, Some(report))
            }
        };
        let stats = GenerationStats { prompt_tokens: prompt.len(), prefill_seconds: now() - t0, ..Default::default() };
        Ok(Self::started(session, sampler, options, token, stats, report))
    }

    /// Continues after a prompt prefilled once ([`Session::prefill_for`]), over its cache
    /// compressed by `compression` (a copy of the full cache when `None`): the evaluation's
    /// "prefill once, compress many ways". Greedy: the first token is the prefill's.
    pub async fn resume(
        model: &'m Llama,
        prefilled: &Prefilled,
        compression: Option<&Compression>,
        options: GenerateOptions,
    ) -> Result<Self> {
        if !options.sampler.is_greedy() {
            return Err(RuntimeError::Options("a resumed prefill continues greedily".into()));
        }
        let t0 = now();
        let (session, report) = Session::resume(model, prefilled, compression, options.max_new_tokens).await?;
        session.check_context(0, options.max_new_tokens)?;
        let stats = GenerationStats {
            prompt_tokens: prefilled.prompt_tokens,
            prefill_seconds: prefilled.prefill_seconds + (now() - t0),
            ..Default::default()
        };
        let sampler = options.sampler.clone();
        Ok(Self::started(session, sampler, options, prefilled.first_token, stats, report))
    }

    /// Feeds `tokens` into an existing session (the next turn of a conversation over the cache
    /// it kept, compressed or not) and chooses the first token after them.
    ///
    /// A cache without room for the turn grows to fit it and the new tokens; one whose policy
    /// keeps it at a fixed size (decode-time eviction) takes the turn a token at a time through
    /// its rule and stays at that size.
    pub async fn extend(mut session: Session<'m>, tokens: &[u32], options: GenerateOptions) -> Result<Self> {
        let Some((&last, before)) = tokens.split_last() else {
            return Err(RuntimeError::Options("nothing to feed".into()));
        };
        session.check_context(tokens.len(), options.max_new_tokens)?;
        let mut sampler = options.sampler.clone();
        let t0 = now();
        let token = if session.eviction().is_some() && !session.cache().has_room(tokens.len()) {
            session.ingest(before).await?;
            session.step(&[last], &mut sampler).await?
        } else {
            session.reserve(tokens.len().saturating_add(options.max_new_tokens.min(GROW_STEP)))?;
            session.step(tokens, &mut sampler).await?
        };
        let stats = GenerationStats { prompt_tokens: tokens.len(), prefill_seconds: now() - t0, ..Default::default() };
        Ok(Self::started(session, sampler, options, token, stats, None))
    }

    /// Continues a kept session with `prompt`, the whole conversation so far (its earlier turns
    /// and the new one): the longest prefix the session can reuse ([`reusable_prefix`]) is kept
    /// and only the rest is fed. Returns the generator and the number of prompt tokens reused
    /// (also in [`GenerationStats::cached_tokens`]). Check [`reusable_prefix`] first: a session
    /// that can reuse nothing is refused, and consumed.
    pub async fn continue_with(
        mut session: Session<'m>,
        prompt: &[u32],
        options: GenerateOptions,
    ) -> Result<(Self, usize)> {
        let reused = reusable_prefix(&session, prompt);
        if reused == 0 {
            return Err(RuntimeError::Options("the session holds no prefix of the prompt to reuse".into()));
        }
        fits_context(session.model(), reused, prompt.len() - reused, options.max_new_tokens)?;
        session.rewind(reused)?;
        let mut g = Self::extend(session, &prompt[reused..], options).await?;
        g.stats.cached_tokens = reused;
        Ok((g, reused))
    }

    fn started(
        session: Session<'m>,
        sampler: Sampler,
        options: GenerateOptions,
        first: u32,
        stats: GenerationStats,
        report: Option<CompressionReport>,
    ) -> Self {
        let done = options.max_new_tokens == 0;
        Generator {
            session,
            sampler,
            options,
            tokenizer: None,
            stream: TextStream::default(),
            chosen: Some(first),
            tokens: Vec::new(),
            done,
            stats,
            report,
        }
    }

    /// Reports each token's text too ([`Token::text`]).
    pub fn with_tokenizer(mut self, tokenizer: &'m Tokenizer) -> Self {
        self.tokenizer = Some(tokenizer);
        self
    }

    /// The next token, or `None` once a stop token or `max_new_tokens` ended the generation.
    /// The token before it is fed only now, so a caller that stops early pays for no step it
    /// does not use.
    pub async fn next(&mut self) -> Result<Option<Token>> {
        if self.done {
            return Ok(None);
        }
        let id = match self.chosen.take() {
            Some(id) => id,
            None => {
                let last = *self.tokens.last().ok_or_else(|| RuntimeError::Options("no token to continue".into()))?;
                let t0 = now();
                if self.session.eviction().is_none() && !self.session.cache().has_room(1) {
                    // a growing cache that is full: room for the rest, a step at a time
                    let left = self.options.max_new_tokens.saturating_sub(self.tokens.len());
                    let more = GROW_STEP.max(self.session.cache().max_len() / 2).min(left.max(1));
                    self.session.reserve(more)?;
                }
                let id = self.session.step(&[last], &mut self.sampler).await?;
                self.stats.decode_seconds += now() - t0;
                self.stats.decode_steps += 1;
                id
            }
        };
        let index = self.tokens.len();
        self.tokens.push(id);
        self.stats.generated_tokens = self.tokens.len();
        let stop = self.options.stop_tokens.contains(&id);
        let text = match (stop, self.tokenizer) {
            (false, Some(t)) => self.stream.push(t, id)?,
            _ => String::new(),
        };
        self.done = stop || self.tokens.len() >= self.options.max_new_tokens;
        Ok(Some(Token { id, index, text, stop }))
    }

    /// Runs to the end; returns every token (stop token included).
    pub async fn run(&mut self) -> Result<&[u32]> {
        while self.next().await?.is_some() {}
        Ok(&self.tokens)
    }

    /// Ends the generation early: [`Generator::next`] returns `None` from now on.
    pub fn stop(&mut self) {
        self.done = true;
    }

    /// The tokens so far, stop token included.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The tokens so far without stop tokens.
    pub fn output(&self) -> Vec<u32> {
        self.tokens.iter().copied().filter(|t| !self.options.stop_tokens.contains(t)).collect()
    }

    /// Text not released by [`Token::text`] yet (an incomplete UTF-8 sequence at the end).
    pub fn rest(&self) -> Result<String> {
        match self.tokenizer {
            Some(t) => self.stream.rest(t),
            None => Ok(String::new()),
        }
    }

    pub fn stats(&self) -> &GenerationStats {
        &self.stats
    }

    /// What the compression after the prefill did, when there was one.
    pub fn report(&self) -> Option<&CompressionReport> {
        self.report.as_ref()
    }

    pub fn session(&self) -> &Session<'m> {
        &self.session
    }

    /// The session, for more decoding or the next turn ([`Generator::extend`]). Its cache holds
    /// every reported token but the last, which is not fed yet.
    pub fn into_session(self) -> Session<'m> {
        self.session
    }
}

/// Prefill with the statistics `compression` needs, compression, and the first token.
async fn compressed_prefill<'m>(
    model: &'m Llama,
    prompt: &[u32],
    compression: &Compression,
    max_new_tokens: usize,
    sampler: &mut Sampler,
) -> Result<(Session<'m>, u32, CompressionReport)> {
    // (a prompt shorter than the observation window is kept whole by the one-shot path)
    #[cfg(not(target_family = "wasm"))]
    // (latent keys share their slots within a group: the one-shot plan aligns the groups)
    if compression.cascades() && model.latent_layouts().is_none() && prompt.len() >= compression.policy().needs().window
    {
        let (cache, eviction, hidden, report) =
            crate::evict::cascade::prefill(compression, model, prompt, max_new_tokens)?;
        let session = Session::with_eviction(model, cache, prompt.len() as u32, eviction).with_history(prompt);
        let token = session.sample_last(hidden, sampler).await?;
        return Ok((session, token, report));
    }
    let request = compression.request(model.config.num_layers);
    let mut prefilled = Session::prefill_sampled(model, prompt, &request, sampler).await?;
    if request.reconstruction {
        let rp = compression.reconstruction().ok_or_else(|| {
            RuntimeError::Options(format!(
                "{} scores by reconstructing the context: give the compression its reconstruction prompt \
                 (Compression::with_reconstruction)",
                compression.name()
            ))
        })?;
        prefilled.reconstruct(model, rp, 0..prompt.len()).await?;
    }
    let (session, report) = Session::resume(model, &prefilled, Some(compression), max_new_tokens).await?;
    Ok((session, prefilled.first_token, report.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    //! The loop against recomputation: every greedy token must be the argmax of the logits of
    //! the whole sequence so far fed to a fresh session (no cache reuse), on the tiny seeded
    //! model of `tests/golden/tiny/llama`.
    use kvslice_formats::HfTokenizerFiles;

    use super::*;
    use crate::testing::{golden, prompt, tiny};

    /// The greedy token after `sequence`, from its full recomputation.
    fn recomputed(model: &Llama, sequence: &[u32]) -> u32 {
        let mut session = Session::new(model, sequence.len()).unwrap();
        let logits = pollster::block_on(session.next_logits(sequence)).unwrap();
        let best = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        logits.iter().position(|&x| x == best).unwrap() as u32
    }

    fn generator<'m>(model: &'m Llama, ids: &[u32], new: usize, stop: Vec<u32>) -> Result<Generator<'m>> {
        pollster::block_on(Generator::prefill(model, ids, GenerateOptions::greedy(new, stop), None))
    }

    #[test]
    fn greedy_tokens_match_recomputing_the_whole_sequence() {
        let model = tiny();
        let ids = prompt(20);
        let mut g = generator(&model, &ids, 6, Vec::new()).unwrap();
        let mut sequence = ids.clone();
        let mut count = 0;
        while let Some(token) = pollster::block_on(g.next()).unwrap() {
            assert_eq!(token.id, recomputed(&model, &sequence), "token {}", token.index);
            assert_eq!(token.index, count);
            assert!(!token.stop);
            assert!(token.text.is_empty(), "no tokenizer, no text");
            sequence.push(token.id);
            count += 1;
        }
        assert_eq!(count, 6);
        let stats = g.stats();
        assert_eq!((stats.prompt_tokens, stats.generated_tokens, stats.decode_steps), (20, 6, 5));
        // the last token is reported, not fed: the cache holds the prompt and five tokens
        assert_eq!(g.session().position(), 25);
        assert!(pollster::block_on(g.next()).unwrap().is_none());
    }

    #[test]
    fn a_stop_token_ends_the_generation_and_is_reported() {
        let model = tiny();
        let ids = prompt(12);
        let all =
            pollster::block_on(async { generator(&model, &ids, 5, Vec::new())?.run().await.map(<[u32]>::to_vec) })
                .unwrap();
        let stop = all[2];
        let first = all.iter().position(|&t| t == stop).unwrap();
        let mut g = generator(&model, &ids, 5, vec![stop]).unwrap();
        let mut last = None;
        while let Some(t) = pollster::block_on(g.next()).unwrap() {
            last = Some(t);
        }
        let last = last.unwrap();
        assert!(last.stop);
        assert_eq!(last.index, first);
        assert_eq!(g.tokens(), &all[..=first]);
        assert_eq!(g.output(), &all[..first]);
    }

    #[test]
    fn the_context_is_checked_before_any_work() {
        let model = tiny();
        // 500 + 20 new > 512 (the last new token is never fed: 500 + 13 = 513 does not fit)
        for new in [20, 14, usize::MAX] {
            match generator(&model, &prompt(500), new, Vec::new()) {
                Err(RuntimeError::ContextOverflow { context: 512, .. }) => {}
                other => panic!("{new} new tokens: {:?}", other.err()),
            }
        }
        assert!(generator(&model, &prompt(500), 13, Vec::new()).is_ok());
        assert!(matches!(generator(&model, &[], 4, Vec::new()), Err(RuntimeError::Options(_))));
        // nothing asked: the prompt is prefilled, no token reported
        let mut g = generator(&model, &prompt(8), 0, Vec::new()).unwrap();
        assert!(pollster::block_on(g.next()).unwrap().is_none());
        assert_eq!(g.session().position(), 8);
    }

    #[test]
    fn a_conversation_continues_over_the_kept_cache() {
        let model = tiny();
        let ids = prompt(16);
        // a session with room for the whole conversation (a prefill's own session has room for
        // its prompt and new tokens only)
        let session = Session::new(&model, 64).unwrap();
        let mut first =
            pollster::block_on(Generator::extend(session, &ids, GenerateOptions::greedy(3, Vec::new()))).unwrap();
        let said = pollster::block_on(first.run()).unwrap().to_vec();
        let session = first.into_session();
        // the next turn: the last reply token (not fed yet) and the user's new tokens
        let turn = [said[2], 40, 41, 42];
        let mut next =
            pollster::block_on(Generator::extend(session, &turn, GenerateOptions::greedy(2, Vec::new()))).unwrap();
        let mut sequence: Vec<u32> = ids.iter().chain(&said).chain(&turn[1..]).copied().collect();
        while let Some(t) = pollster::block_on(next.next()).unwrap() {
            assert_eq!(t.id, recomputed(&model, &sequence));
            sequence.push(t.id);
        }
        assert_eq!(next.tokens().len(), 2);
        let overflow = Generator::extend(next.into_session(), &[1; 600], GenerateOptions::greedy(1, Vec::new()));
        assert!(matches!(pollster::block_on(overflow), Err(RuntimeError::ContextOverflow { .. })));
    }

    #[test]
    fn a_conversation_reuses_the_prefix_it_shares_with_the_kept_cache() {
        let model = tiny();
        let ids = prompt(20);
        let mut g = generator(&model, &ids, 4, Vec::new()).unwrap();
        let said = pollster::block_on(g.run()).unwrap().to_vec();
        let session = g.into_session();
        // the cache saw the prompt and every reply token but the last
        let seen: Vec<u32> = ids.iter().chain(&said[..3]).copied().collect();
        assert_eq!(session.history(), Some(&seen[..]));
        // the next turn extends it: everything seen is reused
        let turn: Vec<u32> = ids.iter().chain(&said).chain(&[40, 41]).copied().collect();
        assert_eq!(reusable_prefix(&session, &turn), 23);
        let check = |g: &mut Generator, mut sequence: Vec<u32>| {
            while let Some(t) = pollster::block_on(g.next()).unwrap() {
                assert_eq!(t.id, recomputed(&model, &sequence), "token {}", t.index);
                sequence.push(t.id);
            }
        };
        let (mut next, reused) =
            pollster::block_on(Generator::continue_with(session, &turn, GenerateOptions::greedy(3, Vec::new())))
                .unwrap();
        assert_eq!((reused, next.stats().cached_tokens, next.stats().prompt_tokens), (23, 23, 3));
        check(&mut next, turn.clone());
        // a prompt that leaves the conversation at token 10 goes back there
        let session = next.into_session();
        let other: Vec<u32> = ids[..10].iter().chain(&[7, 8, 9]).copied().collect();
        assert_eq!(reusable_prefix(&session, &other), 10);
        let (mut next, reused) =
            pollster::block_on(Generator::continue_with(session, &other, GenerateOptions::greedy(3, Vec::new())))
                .unwrap();
        assert_eq!(reused, 10);
        assert_eq!(next.session().cache().lens_by_layer(), vec![vec![13, 13]; 3]);
        check(&mut next, other.clone());
        // the same prompt again: all but its last token reused, which is fed for the logits
        let session = next.into_session();
        assert_eq!(reusable_prefix(&session, &other), 12);
        assert_eq!(reusable_prefix(&session, &[99, 98]), 0);
    }

    #[test]
    fn a_growing_cache_grows_and_a_fixed_size_cache_takes_a_turn_through_its_rule() {
        let model = tiny();
        let ids = prompt(30);
        // room for the prompt and GROW_STEP new tokens; 300 more come in the next turn
        let mut g = generator(&model, &ids, 1, Vec::new()).unwrap();
        let first = pollster::block_on(g.run()).unwrap().to_vec();
        let capacity = g.session().cache().geometry().capacity;
        let long: Vec<u32> = ids.iter().chain(&first).copied().chain(prompt(300)).collect();
        let (mut next, _) = pollster::block_on(Generator::continue_with(
            g.into_session(),
            &long,
            GenerateOptions::greedy(2, Vec::new()),
        ))
        .unwrap();
        assert!(next.session().cache().geometry().capacity > capacity);
        let t = pollster::block_on(next.next()).unwrap().unwrap();
        assert_eq!(t.id, recomputed(&model, &long));

        // StreamingLLM at 16 entries per head: the turn's 10 tokens go through its rule
        let c = Compression::new("streaming-llm", "16", &Compression::model_info(&model)).unwrap();
        let options = GenerateOptions::greedy(2, Vec::new());
        let mut g = pollster::block_on(Generator::prefill(&model, &ids, options.clone(), Some(&c))).unwrap();
        let said = pollster::block_on(g.run()).unwrap().to_vec();
        let turn: Vec<u32> = ids.iter().chain(&said).copied().chain(prompt(10)).collect();
        let session = g.into_session();
        assert_eq!(reusable_prefix(&session, &turn), 31, "a fixed-size cache goes on from where it is");
        let (next, _) = pollster::block_on(Generator::continue_with(session, &turn, options)).unwrap();
        let cache = next.session().cache();
        assert_eq!((cache.geometry().capacity, cache.lens_by_layer()), (16, vec![vec![16, 16]; 3]));
        // the newest entries are the turn's last tokens (its very last is the one just fed)
        let newest = *cache.layers()[0].head_positions(0).iter().max().unwrap();
        assert_eq!(newest as usize, turn.len() - 1);
        // going back into it is refused
        assert_eq!(reusable_prefix(next.session(), &turn[..20]), 0);
    }

    #[test]
    fn text_is_released_in_whole_characters() {
        let json = std::fs::read(golden().join("tokenizer/tiny/tokenizer.json")).unwrap();
        let tokenizer = Tokenizer::from_hf(HfTokenizerFiles {
            tokenizer_json: &json,
            tokenizer_config_json: None,
            chat_template_jinja: None,
        })
        .unwrap();
        // byte-level vocabulary: "a" = 81, byte 0xC3 ("Ã") = 144, byte 0xA9 ("©") = 119; "é" is
        // 0xC3 0xA9
        let mut s = TextStream::default();
        assert_eq!(s.push(&tokenizer, 81).unwrap(), "a");
        assert_eq!(s.push(&tokenizer, 144).unwrap(), "");
        assert_eq!(s.rest(&tokenizer).unwrap(), "\u{FFFD}");
        assert_eq!(s.push(&tokenizer, 119).unwrap(), "é");
        assert_eq!(s.rest(&tokenizer).unwrap(), "");
        assert_eq!(s.push(&tokenizer, 81).unwrap(), "a");
    }

    /// A quantized cache decodes exactly as an f32 cache holding its dequantized entries (the
    /// reference), step after step, while new tokens wait in the residual; on the steps that
    /// seal a group the two differ by that group's quantization only. q8 stays close to the f32
    /// compressed cache throughout.
    #[test]
    fn quantized_caches_decode_as_their_dequantized_entries() {
        use kvslice_cache::{KEY_GROUP, KvDtype};
        let model = tiny();
        let info = Compression::model_info(&model);
        let ids = prompt(150);
        let max = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        for dtype in [KvDtype::Q8, KvDtype::Q4] {
            let plain = Compression::new("snapkv", "100", &info).unwrap();
            let c = Compression::new("snapkv", "100", &info).unwrap().with_kv_dtype(dtype);
            assert_eq!(c.label(), format!("snapkv+{dtype}@100"));
            let prefilled = pollster::block_on(Session::prefill_for(&model, &ids, &c.request(3))).unwrap();
            let (mut q, report) = pollster::block_on(Session::resume(&model, &prefilled, Some(&c), 40)).unwrap();
            let (mut f, plain_report) =
                pollster::block_on(Session::resume(&model, &prefilled, Some(&plain), 40)).unwrap();
            let (qb, fb) = (report.unwrap().compressed_bytes, plain_report.unwrap().compressed_bytes);
            assert!(qb * 3 < fb, "{dtype}: {qb} bytes against {fb}");
            assert_eq!(q.cache().dtype(), dtype);
            for (t, &token) in prompt(39).iter().enumerate() {
                let pos = q.position();
                let mut reference = Session::from_cache(&model, q.cache().clone(), pos);
                reference.cache_mut().convert(KvDtype::F32).unwrap();
                let seals = q.cache().layers()[0].lens().iter().any(|&l| (l + 1) % KEY_GROUP == 0);
                let got = pollster::block_on(q.next_logits(&[token])).unwrap();
                let want = pollster::block_on(reference.next_logits(&[token])).unwrap();
                let plain = pollster::block_on(f.next_logits(&[token])).unwrap();
                if !seals {
                    assert!(max(&got, &want) < 1e-4, "{dtype} step {t}: {}", max(&got, &want));
                }
                if dtype == KvDtype::Q8 {
                    assert!(max(&got, &plain) < 0.05, "q8 step {t} against f32: {}", max(&got, &plain));
                }
            }
        }
        // Decode-time eviction overwrites sealed slots (their group is requantized): StreamingLLM
        // at 70 entries, past two groups' worth of new tokens, stays at its size and close to f32.
        let plain = Compression::new("streaming-llm", "70", &info).unwrap();
        let q8 = Compression::new("streaming-llm", "70", &info).unwrap().with_kv_dtype(KvDtype::Q8);
        let run = |c: &Compression| {
            let mut g =
                pollster::block_on(Generator::prefill(&model, &ids, GenerateOptions::greedy(1, Vec::new()), Some(c)))
                    .unwrap();
            pollster::block_on(g.run()).unwrap();
            let mut session = g.into_session();
            let mut logits = Vec::new();
            for &token in &prompt(140) {
                logits = pollster::block_on(session.next_logits(&[token])).unwrap();
            }
            (session.cache().lens_by_layer(), session.cache().dtype(), logits)
        };
        let (lens, dtype, got) = run(&q8);
        let (_, _, want) = run(&plain);
        assert_eq!((lens, dtype), (vec![vec![70, 70]; 3], KvDtype::Q8));
        assert!(max(&got, &want) < 0.05, "streaming-llm q8 against f32: {}", max(&got, &want));
    }
}
