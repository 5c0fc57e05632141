//! Every architecture path on tiny seeded models, against HF transformers' full logits
//! (tests/golden/tiny and tests/golden/tiny-gguf, made by scripts/golden/).
//!
//! Tolerance: |Δ| < 2e-4 · max(1, |logit|) (f32 compute; goldens rounded to 6 significant digits).

use burn::tensor::Device;
use kvslice_formats::{ModelConfig, SafetensorsWeights, WeightSource};
use kvslice_model::load::load_llama;
use kvslice_runtime::Session;
use kvslice_tests::{cpu, golden_dir, golden_json, ids, wgpu};

fn hf_weights(name: &str) -> SafetensorsWeights<Vec<u8>> {
    kvslice_tests::tiny_hf_weights(name)
}

/// `|Δ| < 2e-4 · max(1, |b|)` over one row of logits; returns the worst relative difference.
fn compare(got: &[f32], want: &serde_json::Value, vocab: usize, at: &str) -> f32 {
    let want: Vec<f32> = want.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    assert_eq!(got.len(), vocab);
    let mut worst = 0f32;
    for (j, (a, b)) in got.iter().zip(&want).enumerate() {
        let d = (a - b).abs();
        worst = worst.max(d / b.abs().max(1.0));
        assert!(d < 2e-4 * b.abs().max(1.0), "{at} token {j}: {a} vs {b}");
    }
    worst
}

/// Every sequence as one prompt (every row's logits), then fed token by token: one decode
/// step per row, which on wgpu runs the fused decode kernels. Both against the same rows of
/// transformers' logits (a causal model's row `i` depends on tokens `0..=i` only).
fn check(weights: &dyn WeightSource, sequences: &serde_json::Value, device: &Device, label: &str) {
    let model = load_llama(weights, device).unwrap();
    // On wgpu, 16-bit and block-quantized matrices stay as stored: the device holds little
    // more than the file's tensors (f32 norms, a 4-byte header word per Q8_0/Q4_0 block); an
    // f32 file's tied head is a second copy of the embedding (those are not checked here).
    let file = kvslice_formats::model_file_bytes(weights).unwrap();
    let small = ["F16", "Q8_0", "Q4_0", "Q4_1", "f16"].iter().any(|t| label.contains(t));
    if kvslice_kernels::buffer_id(&model.weights.norm.weight.val()).is_some() && small {
        let on_device = model.device_bytes();
        assert!(on_device * 100 <= file * 115, "{label}: {on_device} bytes on the device for {file} in the file");
    }
    let vocab = model.config.vocab_size;
    // Prompts in passes of 3 tokens (chunked prefill), each pass over the cache the passes
    // before it filled.
    let mut chunked = load_llama(weights, device).unwrap();
    chunked.set_prefill_chunk(3);
    for seq in sequences.as_array().unwrap() {
        let tokens = ids(&seq["token_ids"]);
        let want = seq["logits"].as_array().unwrap();
        assert_eq!(want.len(), tokens.len());
        let rows: Vec<usize> = (0..tokens.len()).collect();
        let mut session = Session::new(&model, tokens.len()).unwrap();
        let got = pollster::block_on(session.logits_at(&tokens, &rows)).unwrap();
        assert_eq!(got.len(), want.len());
        let mut worst = 0f32;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            worst = worst.max(compare(g, w, vocab, &format!("{label}: len {} row {i}", tokens.len())));
        }
        let argmax: Vec<u32> = got.iter().map(|r| kvslice_runtime::sampling::argmax(r)).collect();
        assert_eq!(argmax, ids(&seq["argmax"]), "{label}: argmax");

        let mut session = Session::new(&chunked, tokens.len()).unwrap();
        let got = pollster::block_on(session.logits_at(&tokens, &rows)).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            worst = worst.max(compare(g, w, vocab, &format!("{label}: len {} row {i}, chunks of 3", tokens.len())));
        }

        let mut session = Session::new(&model, tokens.len()).unwrap();
        let mut worst_step = 0f32;
        for (i, (&t, w)) in tokens.iter().zip(want).enumerate() {
            let g = pollster::block_on(session.next_logits(&[t])).unwrap();
            worst_step = worst_step.max(compare(&g, w, vocab, &format!("{label}: decode step {i}")));
        }
        eprintln!(
            "{label}: {} tokens, worst relative Δ {worst:.1e} as a prompt, {worst_step:.1e} token by token",
            tokens.len()
        );
    }
}

/// A decode step on wgpu is a handful of launches per layer: the normed q|k|v product, the
/// RoPE split, the cache append, the ragged attention (one pass at this depth), the output
/// product with its residual, the normed gate|up product with SwiGLU and the down product
/// with its residual; around the layers, the embedding, the final norm and the output head.
#[test]
fn a_decode_step_is_at_most_ten_dispatches_per_layer() {
    let model = load_llama(&hf_weights("llama"), &wgpu()).unwrap();
    let layers = model.config.num_layers as u64;
    let mut session = Session::new(&model, 16).unwrap();
    pollster::block_on(session.next_logits(&[1, 2, 3])).unwrap();
    let (logits, counted) = kvslice_runtime::dispatch::count(|| pollster::block_on(session.next_logits(&[4])));
    assert!(logits.unwrap().iter().all(|x| x.is_finite()));
    assert!(counted.total() <= 10 * layers + 8, "{} dispatches for {layers} layers: {counted:?}", counted.total());
    for (kernel, per_layer) in
        [("wgsl:project/project", 4), ("wgsl:step/rope", 1), ("wgsl:append/append", 1), ("wgsl:decode/part", 1)]
    {
        let got = counted.by_kernel.get(&("layer".to_string(), kernel.to_string())).copied().unwrap_or(0);
        assert_eq!(got, per_layer * layers, "{kernel}: {counted:?}");
    }
    assert_eq!(counted.in_scope("layer"), 7 * layers, "{counted:?}");
}

fn hf_case(name: &str, device: Device) {
    let golden = golden_json(&format!("tiny/{name}/golden.json"));
    check(&hf_weights(name), &golden["sequences"], &device, name);
}

fn gguf_case(file: &str, device: Device) {
    let golden = golden_json("tiny-gguf/golden.json");
    let entry = &golden["files"][file];
    let path = golden_dir().join("tiny-gguf").join(file);
    let opened = kvslice_formats::fs::open_gguf(&path).unwrap();
    // The tokenizer rebuilt from GGUF metadata gives transformers' ids.
    for (text, want) in entry["transformers_tokenizer"]["ids"].as_object().unwrap() {
        assert_eq!(opened.tokenizer.encode(text, true).unwrap(), ids(want), "{file}: tokens of {text:?}");
    }
    check(opened.weights.as_ref(), &entry["sequences"], &device, file);
}

#[test]
fn llama_with_llama3_rope_scaling() {
    hf_case("llama", cpu());
    hf_case("llama", wgpu());
}

#[test]
fn llama_tied_embeddings_f16() {
    hf_case("llama-tied-f16", cpu());
    hf_case("llama-tied-f16", wgpu());
}

#[test]
fn qwen2_biases_bf16() {
    hf_case("qwen2-bf16", cpu());
    hf_case("qwen2-bf16", wgpu());
}

#[test]
fn mistral_sharded_safetensors() {
    hf_case("mistral-sharded", cpu());
    hf_case("mistral-sharded", wgpu());
}

#[test]
fn gguf_every_supported_type() {
    for file in [
        "tiny-llama-F32.gguf",
        "tiny-llama-F16.gguf",
        "tiny-llama-Q8_0.gguf",
        "tiny-llama-Q4_0.gguf",
        "tiny-llama-Q4_1.gguf",
    ] {
        gguf_case(file, cpu());
        gguf_case(file, wgpu());
    }
}

#[test]
fn shapes_that_disagree_with_the_config_are_errors() {
    // The tiny llama's weights under a config claiming a wider MLP.
    let dir = golden_dir().join("tiny/llama");
    let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    json["intermediate_size"] = serde_json::json!(256);
    let config = ModelConfig::from_hf_json(json.to_string().as_bytes()).unwrap();
    let shards = vec![("model.safetensors".to_string(), std::fs::read(dir.join("model.safetensors")).unwrap())];
    let Err(err) = SafetensorsWeights::new(config, shards) else { panic!("shape mismatch must be refused") };
    let msg = err.to_string();
    assert!(msg.contains("mlp") && msg.contains("256"), "{msg}");
    // An unknown architecture.
    json["model_type"] = serde_json::json!("gpt_neox");
    json["architectures"] = serde_json::json!(["GPTNeoXForCausalLM"]);
    let Err(err) = ModelConfig::from_hf_json(json.to_string().as_bytes()) else {
        panic!("unknown architecture refused")
    };
    assert!(err.to_string().to_lowercase().contains("gpt"), "{err}");
}

/// The tiny llama's weights under its own config with other RoPE scaling.
fn with_rope_scaling(scaling: kvslice_formats::RopeScaling) -> SafetensorsWeights<Vec<u8>> {
    kvslice_tests::tiny_hf_weights_with("llama", |c| c.rope_scaling = Some(scaling))
}

#[test]
fn rope_scaling_that_gives_nan_is_refused() {
    use kvslice_formats::RopeScaling;
    let llama3 = |factor: f32, low: f32, high: f32, original: usize| RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: original,
    };
    let bad = [
        (llama3(0.0, 1.0, 4.0, 64), "factor"),
        (llama3(-2.0, 1.0, 4.0, 64), "factor"),
        (llama3(f32::NAN, 1.0, 4.0, 64), "factor"),
        (llama3(f32::INFINITY, 1.0, 4.0, 64), "factor"),
        (llama3(8.0, 0.0, 4.0, 64), "low_freq_factor"),
        (llama3(8.0, 2.0, 2.0, 64), "high_freq_factor"),
        (llama3(8.0, 4.0, 1.0, 64), "high_freq_factor"),
        (llama3(8.0, 1.0, 4.0, 0), "original_max_position_embeddings"),
        (RopeScaling::Linear { factor: 0.0 }, "factor"),
        (RopeScaling::Linear { factor: f32::NAN }, "factor"),
    ];
    for (scaling, field) in bad {
        let label = format!("{scaling:?}");
        match load_llama(&with_rope_scaling(scaling), &cpu()) {
            Err(kvslice_model::ModelError::Config(msg)) => {
                assert!(msg.contains(&format!("rope_scaling.{field}")), "{label}: {msg}")
            }
            Err(e) => panic!("{label}: {e}"),
            Ok(_) => panic!("{label} accepted"),
        }
    }
    // The golden config's own factors (8, 1, 4, 64) and a plain linear factor load.
    assert!(load_llama(&with_rope_scaling(llama3(8.0, 1.0, 4.0, 64)), &cpu()).is_ok());
    assert!(load_llama(&with_rope_scaling(RopeScaling::Linear { factor: 2.0 }), &cpu()).is_ok());
}

/// Weights with one element replaced as they are read.
struct Tampered<'a> {
    inner: &'a dyn WeightSource,
    tensor: &'static str,
    elements: std::ops::Range<usize>,
    value: f32,
}

impl WeightSource for Tampered<'_> {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn shape(&self, canonical: &str) -> Option<Vec<usize>> {
        self.inner.shape(canonical)
    }
    fn load(&self, canonical: &str) -> kvslice_formats::Result<kvslice_formats::weights::Tensor> {
        let mut t = self.inner.load(canonical)?;
        if canonical == self.tensor {
            t.data[self.elements.clone()].fill(self.value);
        }
        Ok(t)
    }
}

#[test]
fn non_finite_weights_are_refused() {
    let weights = hf_weights("llama");
    for (tensor, index, value) in [
        ("model.layers.1.mlp.down_proj.weight", 5, f32::NAN),
        ("model.embed_tokens.weight", 300, f32::INFINITY),
        ("lm_head.weight", 0, f32::NEG_INFINITY),
    ] {
        let tampered = Tampered { inner: &weights, tensor, elements: index..index + 1, value };
        match load_llama(&tampered, &cpu()) {
            Err(kvslice_model::ModelError::NonFinite { tensor: t, index: i, value: v }) => {
                assert_eq!((t.as_str(), i), (tensor, index));
                assert!(v.is_nan() == value.is_nan() && (v.is_nan() || v == value), "{v}");
            }
            Err(e) => panic!("{tensor}: {e}"),
            Ok(_) => panic!("{tensor}: {value} accepted"),
        }
    }
}

/// A final norm of 3e38 (finite) overflows the logits to infinities and NaN: greedy and
/// sampled steps return an error instead of a token (an argmax over NaN names token 0), and
/// the session, whose cache took the token, refuses further steps.
fn non_finite_logits(device: Device) {
    use kvslice_runtime::{RuntimeError, Sampler};
    let weights = hf_weights("llama");
    let tampered = Tampered { inner: &weights, tensor: "model.norm.weight", elements: 0..64, value: 3e38 };
    let model = load_llama(&tampered, &device).unwrap();
    for mut sampler in [Sampler::greedy(), Sampler::new(0.8, 0.95, 7).unwrap()] {
        let mut session = Session::new(&model, 8).unwrap();
        match pollster::block_on(session.step(&[1, 17, 42, 99], &mut sampler)) {
            Err(RuntimeError::NonFiniteLogits(msg)) => eprintln!("greedy {}: {msg}", sampler.is_greedy()),
            other => panic!("greedy {}: {other:?}", sampler.is_greedy()),
        }
        let again = pollster::block_on(session.step(&[5], &mut sampler));
        assert!(matches!(again, Err(RuntimeError::Unusable(_))), "{again:?}");
    }
}

#[test]
fn non_finite_logits_are_errors_cpu() {
    non_finite_logits(cpu());
}

#[test]
fn non_finite_logits_are_errors_wgpu() {
    non_finite_logits(wgpu());
}

/// A prompt of 8,192 tokens (SmolLM2's whole context) through the tiny llama with its context
/// raised to match, on wgpu and on the CPU backend: the attention takes its queries in chunks
/// and builds each chunk's mask alone (a whole `[8192, 8192]` f32 mask is 256 MiB, twice
/// WebGPU's default largest storage binding). The two devices give the same logits.
#[test]
fn a_prompt_of_the_whole_context_on_wgpu_matches_the_cpu() {
    let weights = kvslice_tests::tiny_hf_weights_with("llama", |c| c.max_position_embeddings = 8192);
    let n = 8192;
    let tokens: Vec<u32> = (0..n).map(|i| 3 + ((i * 7919 + 13) % 250) as u32).collect();
    let rows = [0, 1, 777, 1500, 4095, n - 2, n - 1];
    let logits = |device: &Device, tokens: &[u32], rows: &[usize]| {
        let model = load_llama(&weights, device).unwrap();
        let mut session = Session::new(&model, tokens.len()).unwrap();
        pollster::block_on(session.logits_at(tokens, rows)).unwrap()
    };
    let (on_cpu, on_wgpu) = (logits(&cpu(), &tokens, &rows), logits(&wgpu(), &tokens, &rows));
    // Causality: rows 777 and 1500, whose queries the 8K prompt takes in its second and third
    // chunks of 512, equal the last rows of their own prefixes (taken as one chunk each).
    for (i, r) in [(2, 777), (3, 1500)] {
        let alone = logits(&cpu(), &tokens[..=r], &[r]).pop().unwrap();
        for (x, y) in alone.iter().zip(&on_cpu[i]) {
            assert!((x - y).abs() < 1e-4 * x.abs().max(1.0), "row {r}: prefix {x} vs whole prompt {y}");
        }
    }
    let mut worst = 0f32;
    for (r, (a, b)) in rows.iter().zip(on_cpu.iter().zip(&on_wgpu)) {
        assert!(a.iter().chain(b).all(|x| x.is_finite()), "row {r}");
        for (x, y) in a.iter().zip(b) {
            let d = (x - y).abs() / x.abs().max(1.0);
            worst = worst.max(d);
            assert!(d < 1e-3, "row {r}: cpu {x} vs wgpu {y}");
        }
    }
    eprintln!("{n}-token prompt: worst relative difference cpu vs wgpu {worst:.1e}");
}

/// The tiled projection kernel in the model: a prompt of 300 tokens (a chunk of 256 and one
/// of 44) on wgpu with every projection of more than the skinny kernel's rows through
/// `kvslice_kernels::gemm` gives the CPU backend's logits.
#[test]
fn tiled_products_on_wgpu_match_the_cpu() {
    let weights = kvslice_tests::tiny_hf_weights("llama");
    let tokens: Vec<u32> = (0..300).map(|i| 3 + ((i * 131 + 7) % 250) as u32).collect();
    let rows = [0, 100, 255, 256, 299];
    let logits = |device: &Device, tiled: bool| {
        let mut model = load_llama(&weights, device).unwrap();
        model.set_tiled_products(tiled);
        model.set_prefill_chunk(256);
        let mut session = Session::new(&model, tokens.len()).unwrap();
        kvslice_kernels::dispatch::count(|| pollster::block_on(session.logits_at(&tokens, &rows)).unwrap())
    };
    let ((want, _), (got, launches)) = (logits(&cpu(), false), logits(&wgpu(), true));
    // q|k|v, o, gate|up and down of 3 layers, for each of the 2 chunks
    let gemms = launches.by_kernel.get(&("layer".to_string(), "wgsl:gemm/gemm".to_string())).copied();
    assert_eq!(gemms, Some(4 * 3 * 2), "{launches:?}");
    for (r, (a, b)) in rows.iter().zip(want.iter().zip(&got)) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() / x.abs().max(1.0) < 1e-3, "row {r}: cpu {x} vs tiled wgpu {y}");
        }
    }
}

/// A GGUF whose fused projections mix block formats, as the files people download do (a
/// Q4_K_M file stores `v` in Q6_K or Q8_0 beside Q4_K or Q5_0 `q` and `k`): the tiny llama's
/// `v` from its Q8_0 file, every other tensor from its Q4_0 file.
struct MixedFormats {
    base: kvslice_formats::GgufWeights<Vec<u8>>,
    v: kvslice_formats::GgufWeights<Vec<u8>>,
}

impl MixedFormats {
    fn pick(&self, canonical: &str) -> &dyn WeightSource {
        if canonical.ends_with("v_proj.weight") { &self.v } else { &self.base }
    }
}

impl WeightSource for MixedFormats {
    fn config(&self) -> &ModelConfig {
        self.base.config()
    }
    fn shape(&self, canonical: &str) -> Option<Vec<usize>> {
        self.pick(canonical).shape(canonical)
    }
    fn load(&self, canonical: &str) -> kvslice_formats::Result<kvslice_formats::Tensor> {
        self.pick(canonical).load(canonical)
    }
    fn stored_bytes(&self, canonical: &str) -> Option<u64> {
        self.pick(canonical).stored_bytes(canonical)
    }
    fn load_blocks(&self, canonical: &str) -> kvslice_formats::Result<Option<kvslice_formats::Blocks>> {
        self.pick(canonical).load_blocks(canonical)
    }
}

/// On wgpu the mixed q|k|v stays in its two formats (one launch each into the same output)
/// instead of loading as f32. The reference is the CPU backend on the same weights, which
/// dequantizes both files exactly as gguf-py does (tests/gguf.rs) and which the golden tests
/// above check against transformers for each file alone; the tolerance is theirs.
#[test]
fn mixed_block_formats_stay_on_the_device() {
    use kvslice_kernels::QuantFormat;
    let read = |file: &str| {
        kvslice_formats::GgufWeights::new(std::fs::read(golden_dir().join("tiny-gguf").join(file)).unwrap()).unwrap()
    };
    let source = MixedFormats { base: read("tiny-llama-Q4_0.gguf"), v: read("tiny-llama-Q8_0.gguf") };
    let on_gpu = load_llama(&source, &wgpu()).unwrap();
    let reference = load_llama(&source, &cpu()).unwrap();
    for layer in &on_gpu.weights.layers {
        let qkv = layer.self_attn.qkv_proj.quant.as_ref().expect("q|k|v kept in blocks");
        assert_eq!(qkv.formats(), [QuantFormat::Q4_0, QuantFormat::Q8_0]);
        assert!(layer.self_attn.qkv_proj.weight.is_none());
    }
    let file = kvslice_formats::model_file_bytes(&source).unwrap();
    assert!(
        on_gpu.device_bytes() * 100 <= file * 115,
        "{} device bytes for {file} in the files",
        on_gpu.device_bytes()
    );

    let golden = golden_json("tiny-gguf/golden.json");
    let tokens = ids(&golden["files"]["tiny-llama-Q4_0.gguf"]["sequences"][0]["token_ids"]);
    let rows: Vec<usize> = (0..tokens.len()).collect();
    let want = pollster::block_on(Session::new(&reference, tokens.len()).unwrap().logits_at(&tokens, &rows)).unwrap();
    let got = pollster::block_on(Session::new(&on_gpu, tokens.len()).unwrap().logits_at(&tokens, &rows)).unwrap();
    let mut session = Session::new(&on_gpu, tokens.len()).unwrap();
    let vocab = on_gpu.config.vocab_size;
    for (i, (t, w)) in tokens.iter().zip(&want).enumerate() {
        let w = serde_json::json!(w);
        compare(&got[i], &w, vocab, &format!("mixed: prompt row {i}"));
        let step = pollster::block_on(session.next_logits(&[*t])).unwrap();
        compare(&step, &w, vocab, &format!("mixed: decode step {i}"));
    }
}
