//! kvslice in a web page: model bytes handed in from JavaScript, a WebGPU device opened
//! asynchronously, greedy generation streamed token by token with the compressed cache's kept
//! positions, and the kernel conformance suite.
//!
//! The JavaScript bindings (`bindings`, wasm32 only) are thin; what they call lives here,
//! target-independent, so that it is built and tested natively too: loading a model from bytes
//! ([`load_model`]), a generation driven step by step ([`generate`]) and the pieces of its
//! report ([`StreamText`], [`kept_mask`], [`KvMemory`]).

#[cfg(target_family = "wasm")]
mod bindings;

use burn::tensor::Device;
use kvslice_cache::KvCache;
use kvslice_formats::{GgufWeights, ModelConfig, Tokenizer, WeightSource};
use kvslice_runtime::{Compression, GenerateOptions, LoadedModel, Sampler, Session, StatsRequest};
use serde::Serialize;

/// Opens a GGUF model from its bytes on `device`: weights checked against the configuration,
/// tokenizer from the metadata. `max_storage_binding` is the device's largest storage buffer
/// binding (0: unknown): a model whose largest f32 tensor exceeds it is refused before the
/// upload. Bad bytes give an error (never a panic).
pub fn load_model(bytes: Vec<u8>, device: &Device, max_storage_binding: u64) -> Result<LoadedModel, String> {
    if bytes.len() < 4 || &bytes[..4] != b"GGUF" {
        return Err(format!(
            "not a GGUF file ({} bytes{}): the page loads .gguf models",
            bytes.len(),
            if bytes.len() >= 4 {
                format!(", starts with {:?}", String::from_utf8_lossy(&bytes[..4]))
            } else {
                String::new()
            }
        ));
    }
    let weights = GgufWeights::new(bytes).map_err(|e| format!("invalid GGUF model: {e}"))?;
    let needed = largest_tensor_bytes(weights.config());
    if max_storage_binding > 0 && needed > max_storage_binding {
        return Err(format!(
            "the GPU adapter's limits are too small for this model: its largest tensor takes {} MiB as f32, \
             the adapter binds at most {} MiB per storage buffer (maxStorageBufferBindingSize)",
            needed >> 20,
            max_storage_binding >> 20
        ));
    }
    let tokenizer = Tokenizer::from_gguf(weights.file()).map_err(|e| format!("tokenizer of the GGUF model: {e}"))?;
    LoadedModel::from_parts(&weights, tokenizer, device).map_err(|e| format!("uploading the model: {e}"))
}

/// Bytes of the largest f32 weight of a model: the embedding (and output head) or an MLP
/// projection.
pub fn largest_tensor_bytes(c: &ModelConfig) -> u64 {
    let elements = (c.vocab_size * c.hidden_size)
        .max(c.hidden_size * c.intermediate_size)
        .max(c.num_attention_heads * c.head_dim * c.hidden_size);
    elements as u64 * 4
}

/// Every registered eviction policy: name, paper and summary.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyInfo {
    pub name: &'static str,
    pub paper: &'static str,
    pub summary: &'static str,
}

pub fn policies() -> Vec<PolicyInfo> {
    kvslice_policy::registry().iter().map(|e| PolicyInfo { name: e.name, paper: e.paper, summary: e.summary }).collect()
}

/// Text of a growing token list, released in whole characters: a token may end inside a UTF-8
/// sequence, which decodes to U+FFFD until the next token completes it (the CLI prints the
/// same way).
#[derive(Debug, Default)]
pub struct StreamText {
    tokens: Vec<u32>,
    printed: String,
}

impl StreamText {
    /// Adds `token` and returns the new text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, String> {
        self.tokens.push(token);
        let text = tokenizer.decode(&self.tokens, true).map_err(|e| format!("decoding: {e}"))?;
        if !text.ends_with('\u{FFFD}') && text.starts_with(self.printed.as_str()) {
            let new = text[self.printed.len()..].to_string();
            self.printed = text;
            return Ok(new);
        }
        Ok(String::new())
    }

    /// The whole text so far.
    pub fn text(&self, tokenizer: &Tokenizer) -> Result<String, String> {
        tokenizer.decode(&self.tokens, true).map_err(|e| format!("decoding: {e}"))
    }
}

/// The kept positions of every (layer, KV head) as a `[layers·kv_heads, width]` row-major mask
/// (1 = kept), rows in layer-major order. Positions at or past `width` are ignored.
pub fn kept_mask(cache: &KvCache, width: usize) -> Vec<u8> {
    let g = cache.geometry();
    let mut mask = vec![0u8; g.layers * g.kv_heads * width];
    for (l, layer) in cache.layers().iter().enumerate() {
        for h in 0..g.kv_heads {
            let row = &mut mask[(l * g.kv_heads + h) * width..(l * g.kv_heads + h + 1) * width];
            for &p in layer.head_positions(h) {
                if let Some(cell) = row.get_mut(p as usize) {
                    *cell = 1;
                }
            }
        }
    }
    mask
}

/// K/V memory of the entries a cache holds, against the full cache of the same sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvMemory {
    /// Entries held over all layers and KV heads.
    pub entries: usize,
    /// Entries of the full cache: tokens seen × layers × KV heads.
    pub full_entries: usize,
    /// Bytes of the entries held (K and V, f32).
    pub bytes: usize,
    pub full_bytes: usize,
    /// Bytes of the cache's allocated storage (capacity included).
    pub storage_bytes: usize,
}

impl KvMemory {
    pub fn of(cache: &KvCache, tokens_seen: usize) -> Self {
        let g = cache.geometry();
        let per_entry = 2 * g.head_dim * std::mem::size_of::<f32>();
        let entries: usize =
            cache.layers().iter().map(|l| (0..g.kv_heads).map(|h| l.head_positions(h).len()).sum::<usize>()).sum();
        let full_entries = tokens_seen * g.layers * g.kv_heads;
        KvMemory {
            entries,
            full_entries,
            bytes: entries * per_entry,
            full_bytes: full_entries * per_entry,
            storage_bytes: cache.storage_bytes(),
        }
    }
}

/// What a generation asks for.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: String,
    /// Wrap the prompt in the model's chat template.
    pub chat: bool,
    /// `(policy, budget)`; `None` keeps the whole cache.
    pub compression: Option<(String, String)>,
    pub max_new_tokens: usize,
}

/// One generated token, as reported to the page.
#[derive(Debug, Clone)]
pub struct Step<'a> {
    pub index: usize,
    pub token: u32,
    /// Text this token completed.
    pub text: String,
    /// Source positions seen so far (prompt and fed tokens): the heatmap's width.
    pub width: usize,
    /// The cache after this step; `None` for the full cache (every position kept).
    pub cache: Option<&'a KvCache>,
    pub memory: KvMemory,
}

/// What a generation did.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    /// Generated text without stop tokens (as the CLI prints it).
    pub text: String,
    pub policy: Option<String>,
    pub kept_entries: Option<usize>,
    pub compressed_storage_bytes: Option<usize>,
    pub full_storage_bytes: Option<usize>,
    pub memory: KvMemory,
    pub layers: usize,
    pub kv_heads: usize,
}

/// Greedy generation: the prompt is prefilled (with the statistics the policy needs), the
/// cache compressed, then one token is decoded at a time. `on_step` gets every token with the
/// cache it left; it returns `false` to stop. `now` is the caller's clock, called at the
/// prefill's start and end so that the page can time the phases.
///
/// With a policy this is what `Session::generate_compressed` does (prefill, compression,
/// decode), step by step so that the cache can be shown between tokens; CAKE runs one-shot
/// here (its layer-by-layer cascade is native-only). Without one it is `Session::generate`.
pub async fn generate(
    loaded: &LoadedModel,
    request: &Request,
    mut on_step: impl FnMut(Step<'_>) -> bool,
) -> Result<Outcome, String> {
    let model = &loaded.model;
    let ids = loaded.encode_prompt(&request.prompt, request.chat).map_err(|e| e.to_string())?;
    let stop = loaded.stop_tokens();
    let max_new = request.max_new_tokens;
    if max_new == 0 {
        return Err("ask for at least one new token".into());
    }
    let context = model.config.max_position_embeddings;
    if ids.len() + max_new.saturating_sub(1) > context {
        return Err(format!(
            "the prompt ({} tokens) and {max_new} new tokens do not fit the model's context of {context}",
            ids.len()
        ));
    }
    let mut stream = StreamText::default();
    let mut tokens = Vec::new();
    let mut stream_error = None;
    let (layers, kv_heads) = (model.config.num_layers, model.config.num_kv_heads);
    let mut report_fields = (None, None, None, None);
    let memory;
    match &request.compression {
        None => {
            // `generate` borrows the cache while it calls back; the full cache's kept set is every
            // position seen, so the step reports no cache and the page fills the mask.
            let mut session = Session::new(model, ids.len() + max_new).map_err(|e| e.to_string())?;
            let options =
                GenerateOptions { max_new_tokens: max_new, sampler: Sampler::greedy(), stop_tokens: stop.clone() };
            let prompt_len = ids.len();
            let per_entry = 2 * model.config.head_dim * std::mem::size_of::<f32>();
            let on_token = |token: u32| {
                let index = tokens.len();
                tokens.push(token);
                let text = if stop.contains(&token) {
                    String::new()
                } else {
                    match stream.push(&loaded.tokenizer, token) {
                        Ok(t) => t,
                        Err(e) => {
                            stream_error = Some(e);
                            return false;
                        }
                    }
                };
                // Tokens in the cache once this one is fed: the prompt and those before it.
                let width = prompt_len + index;
                let entries = width * layers * kv_heads;
                let memory = KvMemory {
                    entries,
                    full_entries: entries,
                    bytes: entries * per_entry,
                    full_bytes: entries * per_entry,
                    storage_bytes: (prompt_len + max_new) * layers * kv_heads * per_entry,
                };
                on_step(Step { index, token, text, width, cache: None, memory }) && !stop.contains(&token)
            };
            session.generate(&ids, &options, on_token).await.map_err(|e| e.to_string())?;
            memory = KvMemory::of(session.cache(), session.position() as usize);
        }
        Some((policy, budget)) => {
            let compression = Compression::new(policy, budget, &Compression::model_info(model))
                .map_err(|e| e.to_string())?
                .one_shot();
            let request_stats: StatsRequest = compression.request(layers);
            let prefilled = Session::prefill_for(model, &ids, &request_stats).await.map_err(|e| e.to_string())?;
            let (mut session, report) =
                Session::resume(model, &prefilled, Some(&compression), max_new).await.map_err(|e| e.to_string())?;
            if let Some(r) = &report {
                report_fields =
                    (Some(compression.label()), Some(r.kept_entries), Some(r.compressed_bytes), Some(r.full_bytes));
            }
            let mut token = prefilled.first_token;
            loop {
                let index = tokens.len();
                tokens.push(token);
                let is_stop = stop.contains(&token);
                let text = if is_stop { String::new() } else { stream.push(&loaded.tokenizer, token)? };
                let width = session.position() as usize;
                let memory = KvMemory::of(session.cache(), width);
                let go_on = on_step(Step { index, token, text, width, cache: Some(session.cache()), memory });
                if !go_on || is_stop || tokens.len() >= max_new {
                    break;
                }
                // Feeds `token` and returns it with the greedy token after it.
                let pair = session.continue_greedy(token, 2, &stop).await.map_err(|e| e.to_string())?;
                token = *pair.get(1).ok_or("decoding stopped early")?;
            }
            memory = KvMemory::of(session.cache(), session.position() as usize);
        }
    }
    if let Some(e) = stream_error {
        return Err(e);
    }
    let kept: Vec<u32> = tokens.iter().copied().filter(|t| !stop.contains(t)).collect();
    let text = loaded.decode(&kept).map_err(|e| e.to_string())?;
    let (policy, kept_entries, compressed_storage_bytes, full_storage_bytes) = report_fields;
    Ok(Outcome {
        prompt_tokens: ids.len(),
        tokens,
        text,
        policy,
        kept_entries,
        compressed_storage_bytes,
        full_storage_bytes,
        memory,
        layers,
        kv_heads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let dev = Device::flex();
        let err = load_model(b"hello world".to_vec(), &dev, 0).err().expect("not a model");
        assert!(err.contains("not a GGUF file"), "{err}");
        assert!(load_model(Vec::new(), &dev, 0).err().expect("empty").contains("0 bytes"));
        // a GGUF magic followed by garbage: the parser's error, not a panic
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&[3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 2]);
        let err = load_model(bytes, &dev, 0).err().expect("truncated");
        assert!(err.starts_with("invalid GGUF model"), "{err}");
    }

    #[test]
    fn policies_are_the_registry() {
        let p = policies();
        assert_eq!(p.len(), kvslice_policy::registry().len());
        assert!(p.iter().any(|e| e.name == "streaming-llm"));
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("\"name\":\"h2o\""));
    }
}
