//! Replays every saved input (`corpus/<target>/`: crashes found by the fuzzers and small seeds)
//! through its target, then runs a short deterministic mutation pass per target: a seeded
//! xorshift generator bit-flips, inserts, deletes, splices and writes boundary integers into
//! the seeds (the saved ones and a few golden files of the repository). A panic in a target
//! fails the test; the input is written to the temporary directory for `cargo fuzz run`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use kvslice_fuzz::{TARGETS, Target, join};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The saved inputs of a target, sorted by name.
fn saved(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Seeds from the repository's own test data (too large or too shared to copy into the corpus).
fn golden(target: &str) -> Vec<Vec<u8>> {
    match target {
        "gguf" => vec![read("tests/golden/gguf-quant/quant.gguf"), read("tests/golden/tokenizer/tiny.gguf")],
        "gguf_tokenizer" => vec![read("tests/golden/tokenizer/tiny.gguf")],
        "hf_config" => vec![
            read("tests/golden/tiny/llama/config.json"),
            read("tests/golden/tiny/qwen2-bf16/config.json"),
            read("tests/golden/tiny/mistral-sharded/config.json"),
            read("tests/golden/tiny/mistral-sharded/model.safetensors.index.json"),
        ],
        "hf_tokenizer" => vec![join(
            &read("tests/golden/tokenizer/tiny/tokenizer.json"),
            &read("tests/golden/tokenizer/tiny/tokenizer_config.json"),
        )],
        "safetensors" => vec![join(
            &read("tests/golden/tiny/llama/config.json"),
            &read("tests/golden/gguf-quant/expected.safetensors"),
        )],
        "cases" => vec![read("tests/eval/smoke.jsonl")],
        "distill_weights" => vec![read("crates/kvslice-policy/weights/distillcache-smollm2-135m.safetensors")],
        _ => vec![],
    }
}

/// Mutants per target in the mutation pass, sized so that the whole test stays within a few
/// seconds per target in the debug profile.
fn mutants(target: &str) -> usize {
    match target {
        "budget" | "policy_spec" | "hf_config" | "cases" => 200_000,
        "gguf" | "sqlite" | "safetensors" => 40_000,
        "chat_template" => 40_000,
        "chat_encode" => 3_000,
        "gguf_tokenizer" => 2_000,
        "hf_tokenizer" => 1_000,
        "wheel" => 1_000,
        "lowrank" => 20_000,
        "distill_weights" => 2_000,
        _ => 1_000,
    }
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

const INTERESTING: [u64; 12] =
    [0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff, 1 << 32, 1 << 63, u64::MAX];

const MAX_LEN: usize = 1 << 16;

/// One to four stacked mutations of `seed` (`others` for splices).
fn mutate(rng: &mut Rng, seed: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(d.len() + 1);
        match rng.below(7) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                d.splice(at..at, bytes);
            }
            2 if !d.is_empty() => {
                let n = 1 + rng.below(16.min(d.len() - at.min(d.len() - 1)));
                let at = at.min(d.len() - 1);
                d.drain(at..(at + n).min(d.len()));
            }
            3 => {
                let other = &others[rng.below(others.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let n = 1 + rng.below((other.len() - from).min(256));
                    if rng.below(2) == 0 {
                        d.splice(at..at, other[from..from + n].iter().copied());
                    } else {
                        let end = (at + n).min(d.len());
                        d.splice(at..end, other[from..from + n].iter().copied());
                    }
                }
            }
            4 => {
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1, 2, 4, 8][rng.below(4)];
                // The value's low `width` bytes, little or big endian.
                let bytes = if rng.below(2) == 0 {
                    v.to_le_bytes()[..width].to_vec()
                } else {
                    v.to_be_bytes()[8 - width..].to_vec()
                };
                let at = at.min(d.len().saturating_sub(width));
                let end = (at + width).min(d.len());
                d.splice(at..end, bytes);
            }
            5 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = rng.next() as u8;
            }
            6 if !d.is_empty() => {
                let from = rng.below(d.len());
                let n = 1 + rng.below((d.len() - from).min(64));
                let chunk = d[from..from + n].to_vec();
                d.splice(at..at, chunk);
            }
            _ => d.push(rng.next() as u8),
        }
    }
    d.truncate(MAX_LEN);
    d
}

/// Runs `target` on `data`; on a panic, saves the input and returns where.
fn run_one(name: &str, target: Target, data: &[u8], label: &str) -> Option<String> {
    match catch_unwind(AssertUnwindSafe(|| target(data))) {
        Ok(()) => None,
        Err(_) => {
            let path = std::env::temp_dir().join(format!("kvslice-fuzz-failure-{name}-{label}"));
            let _ = std::fs::write(&path, data);
            Some(format!("{name}: {label} panicked (input saved to {})", path.display()))
        }
    }
}

fn replay_and_mutate(name: &str) {
    let target = TARGETS.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no target {name}")).1;
    let saved = saved(name);
    assert!(!saved.is_empty(), "corpus/{name}/ holds no input");
    let mut failures = Vec::new();
    for (file, data) in &saved {
        failures.extend(run_one(name, target, data, file));
    }
    let mut seeds: Vec<Vec<u8>> = saved.into_iter().map(|(_, d)| d).filter(|d| d.len() <= MAX_LEN).collect();
    seeds.extend(golden(name));
    for seed in &seeds {
        failures.extend(run_one(name, target, seed, "golden"));
    }
    let seed_value =
        name.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let mut rng = Rng(seed_value);
    for i in 0..mutants(name) {
        let seed = &seeds[rng.below(seeds.len())];
        let data = mutate(&mut rng, seed, &seeds);
        failures.extend(run_one(name, target, &data, &format!("mutant-{i}")));
        if failures.len() > 5 {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                replay_and_mutate(stringify!($name));
            }
        )*

        #[test]
        fn every_target_is_replayed() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in TARGETS {
                assert!(tested.contains(name), "target {name} has no replay test");
            }
        }
    };
}

targets!(
    gguf,
    gguf_tokenizer,
    chat_template,
    chat_encode,
    hf_config,
    safetensors,
    hf_tokenizer,
    budget,
    policy_spec,
    cases,
    sqlite,
    wheel,
    lowrank,
    distill_weights
);

/// The hand-built seeds reach the parsers' deep ends: a fuzzer mutating them explores the code
/// after the header checks, not only the early errors.
#[test]
fn seeds_are_valid_inputs() {
    use kvslice_formats::gguf::GgufFile;
    use kvslice_formats::{GgufWeights, ModelConfig, SafetensorsWeights, Tokenizer, WeightSource};
    let corpus = |rel: &str| std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(rel)).unwrap();
    let w = GgufWeights::new(corpus("gguf/seed-tiny-llama-f32")).unwrap();
    assert_eq!(w.load("model.layers.0.mlp.up_proj.weight").unwrap().shape, vec![16, 8]);
    for seed in ["smollm", "llama-bpe", "qwen2"] {
        let file = GgufFile::parse(corpus(&format!("gguf_tokenizer/seed-{seed}"))).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        assert!(!tok.encode("hello world 12", false).unwrap().is_empty(), "{seed}");
    }
    let smollm = GgufFile::parse(corpus("gguf_tokenizer/seed-smollm")).unwrap();
    Tokenizer::from_gguf(&smollm).unwrap().encode_chat(&[kvslice_formats::ChatMessage::user("hello")], true).unwrap();
    let seed = corpus("safetensors/seed-f32");
    let (config, shard) = kvslice_fuzz::split(&seed);
    let config = ModelConfig::from_hf_json(config).unwrap();
    SafetensorsWeights::new(config, vec![("model.safetensors".to_string(), shard)]).unwrap();
    let seed = corpus("hf_tokenizer/seed-small");
    let (json, cfg) = kvslice_fuzz::split(&seed);
    let files = kvslice_formats::HfTokenizerFiles {
        tokenizer_json: json,
        tokenizer_config_json: Some(cfg),
        chat_template_jinja: None,
    };
    let tok = Tokenizer::from_hf(files).unwrap();
    assert!(tok.chat_template_source().is_some() && tok.bos_token_id().is_some());
    let model = kvslice_policy::ModelInfo { head_dim: 64, rope_theta: 10000.0 };
    let refused: Vec<String> = saved("policy_spec")
        .into_iter()
        .filter_map(|(file, seed)| {
            let spec = String::from_utf8_lossy(&seed[1..]).into_owned();
            kvslice_policy::build_spec(&spec, &model).err().map(|e| format!("{file}: {e}"))
        })
        .collect();
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    let bible = corpus("sqlite/seed-bible");
    let db = kvslice_eval::sqlite::Database::new(&bible).unwrap();
    assert!(!db.rows("Bible").unwrap().is_empty());
    let keys = kvslice_formats::lowrank::LowRankKeys::from_safetensors(&corpus("lowrank/seed-two-layers")).unwrap();
    assert_eq!((keys.latent_width(0), keys.latent_width(1)), (2, 3));
    let bent = kvslice_formats::lowrank::LowRankKeys::from_safetensors(&corpus("lowrank/seed-not-orthonormal"));
    assert!(bent.unwrap_err().to_string().contains("orthonormal"));
    let one = corpus("distill_weights/seed-one-head");
    let weights = kvslice_policy::scorer::distill::DistillWeights::from_safetensors(&one).unwrap();
    assert_eq!((weights.layers, weights.kv_heads, weights.head_dim), (1, 1, 64));
}
