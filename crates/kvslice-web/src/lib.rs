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

use kvslice_formats::{GgufWeights, ModelConfig, Tokenizer, WeightSource};
use kvslice_runtime::{Compression, Device, GenerateOptions, Generator, KvCache, LoadedModel, policies};
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

/// Bytes of the largest weight of a model as uploaded (f32): the embedding (and output head) or an MLP
/// projection.
pub fn largest_tensor_bytes(c: &ModelConfig) -> u64 {
    let elements = (c.vocab_size * c.hidden_size)
        .max(c.hidden_size * c.intermediate_size)
        .max(c.num_attention_heads * c.head_dim * c.hidden_size);
    elements as u64 * std::mem::size_of::<f32>() as u64
}

/// Every registered eviction policy: name, paper and summary.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyInfo {
    pub name: &'static str,
    pub paper: &'static str,
    pub summary: &'static str,
}

pub fn policies() -> Vec<PolicyInfo> {
    policies::registry().iter().map(|e| PolicyInfo { name: e.name, paper: e.paper, summary: e.summary }).collect()
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
    /// Bytes of the entries held (K and V, at the cache's element type).
    pub bytes: usize,
    pub full_bytes: usize,
    /// Bytes of the cache's allocated storage (capacity included).
    pub storage_bytes: usize,
}

impl KvMemory {
    pub fn of(cache: &KvCache, tokens_seen: usize) -> Self {
        let g = cache.geometry();
        let per_entry = cache.entry_bytes();
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
/// cache compressed, then one token is decoded at a time by the runtime's [`Generator`].
/// `on_step` gets every token with the cache it left; it returns `false` to stop. CAKE runs
/// one-shot here (its layer-by-layer cascade is native-only).
pub async fn generate(
    loaded: &LoadedModel,
    request: &Request,
    mut on_step: impl FnMut(Step<'_>) -> bool,
) -> Result<Outcome, String> {
    let model = &loaded.model;
    let ids = loaded.encode_prompt(&request.prompt, request.chat).map_err(|e| e.to_string())?;
    if request.max_new_tokens == 0 {
        return Err("ask for at least one new token".into());
    }
    let compression = match &request.compression {
        Some((policy, budget)) => Some(
            Compression::new(policy, budget, &Compression::model_info(model))
                .map_err(|e| e.to_string())?
                .one_shot()
                .with_reconstruction(loaded.reconstruction_prompt().map_err(|e| e.to_string())?),
        ),
        None => None,
    };
    let options = GenerateOptions::greedy(request.max_new_tokens, loaded.stop_tokens());
    let mut generator = Generator::prefill(model, &ids, options, compression.as_ref())
        .await
        .map_err(|e| e.to_string())?
        .with_tokenizer(&loaded.tokenizer);
    while let Some(token) = generator.next().await.map_err(|e| e.to_string())? {
        let session = generator.session();
        // Source positions seen once this token is fed: the prompt and those before it.
        let width = ids.len() + token.index;
        let memory = KvMemory::of(session.cache(), width);
        // The full cache keeps every position seen: the page fills the mask itself.
        let cache = compression.as_ref().map(|_| session.cache());
        if !on_step(Step { index: token.index, token: token.id, text: token.text, width, cache, memory }) {
            generator.stop();
        }
    }
    let (layers, kv_heads) = (model.config.num_layers, model.config.num_kv_heads);
    let report = generator.report();
    let text = loaded.decode(&generator.output()).map_err(|e| e.to_string())?;
    let session = generator.session();
    Ok(Outcome {
        prompt_tokens: ids.len(),
        tokens: generator.tokens().to_vec(),
        text,
        policy: compression.as_ref().map(Compression::label),
        kept_entries: report.map(|r| r.kept_entries),
        compressed_storage_bytes: report.map(|r| r.compressed_bytes),
        full_storage_bytes: report.map(|r| r.full_bytes),
        memory: KvMemory::of(session.cache(), session.position() as usize),
        layers,
        kv_heads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        let dev = burn::tensor::Device::flex();
        let err = load_model(b"hello world".to_vec(), &dev, 0).err().expect("not a model");
        assert!(err.contains("not a GGUF file"), "{err}");
        assert!(load_model(Vec::new(), &dev, 0).err().expect("empty").contains("0 bytes"));
        // a GGUF magic followed by garbage: the parser's error, not a panic
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&[3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 2]);
        let err = load_model(bytes, &dev, 0).err().expect("truncated");
        assert!(err.starts_with("invalid GGUF model"), "{err}");
    }

    /// What JavaScript can pass as `max_new_tokens` (-1 arrives as 4294967295 in wasm32's
    /// usize; 2^53 - 1 natively): an error that names the context, never an overflow panic or
    /// a generation that runs until the cache is full.
    #[test]
    fn absurd_token_counts_are_errors() {
        let dev = burn::tensor::Device::flex();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/tiny-gguf/tiny-llama-F32.gguf");
        let loaded = load_model(std::fs::read(path).unwrap(), &dev, 0).unwrap();
        for max_new_tokens in [u32::MAX as usize, (1 << 53) - 1, usize::MAX] {
            let request = Request { prompt: "hello".into(), chat: false, compression: None, max_new_tokens };
            let err = block_on(generate(&loaded, &request, |_| true)).expect_err("refused");
            assert!(err.contains("exceeds the context of 512"), "{max_new_tokens}: {err}");
        }
        let request = Request { prompt: "hello".into(), chat: false, compression: None, max_new_tokens: 0 };
        assert!(block_on(generate(&loaded, &request, |_| true)).is_err());
    }

    /// The CPU backend's futures are ready when first polled.
    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(v) = future.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    #[test]
    fn policies_are_the_registry() {
        let p = policies();
        assert_eq!(p.len(), policies::registry().len());
        assert!(p.iter().any(|e| e.name == "streaming-llm"));
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("\"name\":\"h2o\""));
    }
}
