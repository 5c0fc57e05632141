//! config.json parsing and safetensors folders (single and sharded, f32/f16/bf16), with
//! their error paths.

mod common;

use std::collections::HashMap;

use half::{bf16, f16};
use kvslice_formats::fs::open_model;
use kvslice_formats::{
    Architecture, FormatError, ModelConfig, RopeScaling, SafetensorsWeights, WeightSource, expected_tensors,
    safetensors_index_files,
};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// A tiny llama config as transformers 5 writes it (rope_parameters).
const LLAMA: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "attention_bias": false, "bos_token_id": 1, "eos_token_id": [2, 7], "head_dim": 4,
  "hidden_size": 8, "intermediate_size": 12, "max_position_embeddings": 128,
  "mlp_bias": false, "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 64, "rope_theta": 500000.0, "rope_type": "llama3"},
  "tie_word_embeddings": false, "vocab_size": 16
}"#;

#[test]
fn llama_config_transformers5_format() {
    let c = ModelConfig::from_hf_json(LLAMA.as_bytes()).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!((c.hidden_size, c.intermediate_size, c.num_hidden_layers), (8, 12, 2));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (2, 1, 4));
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64
        })
    );
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!((c.vocab_size, c.max_position_embeddings), (16, 128));
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(1), vec![2, 7]));
    assert!(!c.tie_word_embeddings && !c.attention_qkv_bias && !c.attention_out_bias);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.group_size(), 2);
}

#[test]
fn legacy_keys_qwen2_and_mistral() {
    let legacy = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 32,
        "vocab_size": 10, "rope_theta": 1000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
        "attention_bias": true, "tie_word_embeddings": true, "eos_token_id": 3}"#;
    let c = ModelConfig::from_hf_json(legacy.as_bytes()).unwrap();
    assert_eq!((c.num_key_value_heads, c.head_dim), (4, 16));
    assert_eq!(c.rope_theta, 1000.0);
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
    assert!(c.attention_qkv_bias && c.attention_out_bias && c.tie_word_embeddings);
    assert_eq!(c.eos_token_ids, vec![3]);

    let qwen2 = r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "vocab_size": 50, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": 4096, "use_sliding_window": false, "tie_word_embeddings": true}"#;
    let c = ModelConfig::from_hf_json(qwen2.as_bytes()).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_qkv_bias && !c.attention_out_bias);
    assert_eq!((c.rope_theta, c.rope_scaling, c.sliding_window), (10000.0, None, None));
    let names: Vec<String> = expected_tensors(&c).map(|e| e.name).collect();
    assert!(names.contains(&"model.layers.1.self_attn.k_proj.bias".to_string()));
    assert!(!names.contains(&"model.layers.1.self_attn.o_proj.bias".to_string()));
    assert!(!names.contains(&"lm_head.weight".to_string()));

    let mistral = r#"{"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 512, "vocab_size": 20, "sliding_window": 128}"#;
    let c = ModelConfig::from_hf_json(mistral.as_bytes()).unwrap();
    assert_eq!((c.architecture, c.sliding_window, c.head_dim), (Architecture::Mistral, Some(128), 16));
}

#[test]
fn config_errors() {
    let gpt = r#"{"model_type": "gpt2", "hidden_size": 8}"#;
    assert!(
        matches!(ModelConfig::from_hf_json(gpt.as_bytes()), Err(FormatError::UnknownArchitecture { name }) if name == "gpt2")
    );
    assert!(matches!(ModelConfig::from_hf_json(b"{not json"), Err(FormatError::BadConfig { .. })));
    let missing = r#"{"model_type": "llama", "hidden_size": 8}"#;
    assert!(matches!(ModelConfig::from_hf_json(missing.as_bytes()), Err(FormatError::BadConfig { .. })));
    let bad_heads = LLAMA.replace("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3");
    assert!(matches!(ModelConfig::from_hf_json(bad_heads.as_bytes()), Err(FormatError::BadConfig { .. })));
    let bad_rope = LLAMA.replace("\"llama3\"", "\"yarn\"");
    assert!(matches!(ModelConfig::from_hf_json(bad_rope.as_bytes()), Err(FormatError::BadConfig { .. })));
    let huge = LLAMA.replace("\"vocab_size\": 16", "\"vocab_size\": 1000000000000");
    assert!(matches!(ModelConfig::from_hf_json(huge.as_bytes()), Err(FormatError::BadConfig { .. })));
}

/// Value of element `i` of tensor number `k`: exactly representable in f16 and bf16.
fn value(k: usize, i: usize) -> f32 {
    ((k * 7 + i) % 23) as f32 * 0.25 - 2.5
}

fn encode(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes()).collect(),
        Dtype::BF16 => v.iter().flat_map(|x| bf16::from_f32(*x).to_bits().to_le_bytes()).collect(),
        Dtype::I32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        _ => unreachable!(),
    }
}

/// The config's tensors spread over `n_shards` files, dtypes cycling f32/f16/bf16.
/// `tweak` may change a tensor's (shape, dtype).
fn shards(
    cfg: &ModelConfig,
    n_shards: usize,
    tweak: impl Fn(&str, &mut Vec<usize>, &mut Dtype),
) -> Vec<(String, Vec<u8>)> {
    let dtypes = [Dtype::F32, Dtype::F16, Dtype::BF16];
    type Entry = (String, Vec<usize>, Dtype, Vec<u8>);
    let mut per: Vec<Vec<Entry>> = vec![vec![]; n_shards];
    for (k, e) in expected_tensors(cfg).enumerate() {
        let (mut shape, mut dtype) = (e.shape.clone(), dtypes[k % 3]);
        tweak(&e.name, &mut shape, &mut dtype);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| value(k, i)).collect();
        per[k % n_shards].push((e.name, shape, dtype, encode(dtype, &v)));
    }
    per.into_iter()
        .enumerate()
        .map(|(i, ts)| {
            let views: Vec<(String, TensorView<'_>)> =
                ts.iter().map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
            let name = if n_shards == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{n_shards:05}.safetensors", i + 1)
            };
            (name, safetensors::serialize(views, None).unwrap())
        })
        .collect()
}

#[test]
fn single_and_sharded_all_dtypes() {
    let cfg = ModelConfig::from_hf_json(LLAMA.as_bytes()).unwrap();
    for n in [1, 3] {
        let w = SafetensorsWeights::new(cfg.clone(), shards(&cfg, n, |_, _, _| {})).unwrap();
        for (k, e) in expected_tensors(&cfg).enumerate() {
            let t = w.load(&e.name).unwrap();
            assert_eq!(t.shape, e.shape, "{}", e.name);
            let want: Vec<f32> = (0..t.data.len()).map(|i| value(k, i)).collect();
            assert_eq!(t.data, want, "{}", e.name);
        }
    }
}

#[test]
fn safetensors_errors() {
    let cfg = ModelConfig::from_hf_json(LLAMA.as_bytes()).unwrap();
    let r = SafetensorsWeights::new(
        cfg.clone(),
        shards(&cfg, 1, |n, s, _| {
            if n == "model.layers.1.mlp.up_proj.weight" {
                *s = vec![8, 12];
            }
        }),
    );
    match r {
        Err(FormatError::ShapeMismatch { tensor, expected, got }) => {
            assert_eq!(tensor, "model.layers.1.mlp.up_proj.weight");
            assert_eq!((expected, got), (vec![12, 8], vec![8, 12]));
        }
        other => panic!("{other:?}"),
    }
    let r = SafetensorsWeights::new(
        cfg.clone(),
        shards(&cfg, 1, |n, _, d| {
            if n == "model.norm.weight" {
                *d = Dtype::I32;
            }
        }),
    );
    assert!(
        matches!(r, Err(FormatError::UnsupportedDtype { tensor, dtype }) if tensor == "model.norm.weight" && dtype == "I32")
    );

    let mut s = shards(&cfg, 3, |_, _, _| {});
    s.remove(1);
    assert!(matches!(SafetensorsWeights::new(cfg.clone(), s), Err(FormatError::MissingTensor { .. })));

    let good = shards(&cfg, 1, |_, _, _| {}).remove(0).1;
    let bad = |bytes: Vec<u8>| SafetensorsWeights::new(cfg.clone(), vec![("x.safetensors".into(), bytes)]);
    // Absurd header length.
    let mut b = good.clone();
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(bad(b), Err(FormatError::BadSafetensors { file, .. }) if file == "x.safetensors"));
    let mut b = good.clone();
    b[..8].copy_from_slice(&((good.len() as u64) * 4).to_le_bytes());
    assert!(matches!(bad(b), Err(FormatError::BadSafetensors { .. })));
    // Header JSON invalid.
    let mut b = good.clone();
    b[8] = b'[';
    assert!(matches!(bad(b), Err(FormatError::BadSafetensors { .. })));
    // Truncated at many points.
    for cut in (0..good.len()).step_by(7) {
        assert!(matches!(bad(good[..cut].to_vec()), Err(FormatError::BadSafetensors { .. })), "cut {cut}");
    }
    // Duplicate tensors across shards.
    let one = shards(&cfg, 1, |_, _, _| {}).remove(0);
    let r = SafetensorsWeights::new(cfg.clone(), vec![one.clone(), ("b.safetensors".into(), one.1)]);
    assert!(matches!(r, Err(FormatError::DuplicateTensor { .. })));
}

#[test]
fn index_files() {
    let idx = br#"{"metadata": {"total_size": 10}, "weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}"#;
    assert_eq!(safetensors_index_files(idx).unwrap(), ["m-1.safetensors", "m-2.safetensors"]);
    assert!(matches!(safetensors_index_files(b"{}"), Err(FormatError::BadIndex { .. })));
    assert!(matches!(safetensors_index_files(br#"{"weight_map": {"a": "../x"}}"#), Err(FormatError::BadIndex { .. })));
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kvslice-formats-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn hf_folder_on_disk() {
    let cfg = ModelConfig::from_hf_json(LLAMA.as_bytes()).unwrap();
    let dir = temp_dir("folder");
    // Nothing there: every missing file is named.
    match open_model(&dir) {
        Err(FormatError::MissingFiles { files }) => {
            let all = files.join(" ");
            assert!(
                all.contains("config.json") && all.contains("tokenizer.json") && all.contains("model.safetensors"),
                "{all}"
            );
        }
        other => panic!("{other:?}"),
    }
    std::fs::write(dir.join("config.json"), LLAMA).unwrap();
    let tiny = common::golden("tokenizer/tiny");
    std::fs::copy(tiny.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    std::fs::copy(tiny.join("tokenizer_config.json"), dir.join("tokenizer_config.json")).unwrap();
    let sh = shards(&cfg, 2, |_, _, _| {});
    let mut map = HashMap::new();
    for (name, bytes) in &sh {
        let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
        for t in st.names() {
            map.insert(t.to_string(), name.clone());
        }
    }
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::json!({"weight_map": map}).to_string())
        .unwrap();
    std::fs::write(dir.join(&sh[0].0), &sh[0].1).unwrap();
    match open_model(&dir) {
        Err(FormatError::MissingFiles { files }) => {
            assert_eq!(files, [dir.join(&sh[1].0).display().to_string()])
        }
        other => panic!("{other:?}"),
    }
    std::fs::write(dir.join(&sh[1].0), &sh[1].1).unwrap();
    let m = open_model(&dir).unwrap();
    assert_eq!(m.config().num_hidden_layers, 2);
    assert_eq!(m.weights.load("lm_head.weight").unwrap().shape, vec![16, 8]);
    assert_eq!(m.tokenizer.eos_token_id(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
