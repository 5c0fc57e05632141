//! GGUF reader against gguf-py's output, hand-built files and the real model.

mod common;

use common::*;
use kvslice_formats::gguf::{GgmlType, GgufFile, MetadataArray, MetadataValue, unpermute_rope_rows};
use kvslice_formats::{Architecture, FormatError, GgufWeights, ModelConfig, WeightSource};

fn quant_bytes() -> Vec<u8> {
    std::fs::read(golden("gguf-quant/quant.gguf")).unwrap()
}

/// f32 tensors from a safetensors file (written by safetensors.numpy).
fn expected_tensors(path: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(golden(path)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            let data = view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            (name, view.shape().to_vec(), data)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn golden_metadata_of_every_type() {
    let f = GgufFile::parse(quant_bytes()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    let g = |k: &str| f.get(k).unwrap().clone();
    assert_eq!(g("general.architecture"), MetadataValue::String("llama".into()));
    assert_eq!(g("test.string"), MetadataValue::String("héllo ✓".into()));
    assert_eq!(g("test.u8"), MetadataValue::U8(200));
    assert_eq!(g("test.i8"), MetadataValue::I8(-5));
    assert_eq!(g("test.u16"), MetadataValue::U16(60000));
    assert_eq!(g("test.i16"), MetadataValue::I16(-30000));
    assert_eq!(g("test.u32"), MetadataValue::U32(4_000_000_000));
    assert_eq!(g("test.i32"), MetadataValue::I32(-2_000_000_000));
    assert_eq!(g("test.f32"), MetadataValue::F32(1.5));
    assert_eq!(g("test.bool"), MetadataValue::Bool(true));
    assert_eq!(g("test.u64"), MetadataValue::U64((1u64 << 63) + 7));
    assert_eq!(g("test.i64"), MetadataValue::I64(-(1i64 << 62)));
    assert_eq!(g("test.f64"), MetadataValue::F64(-2.25));
    // gguf-py writes Python ints in arrays as i32.
    assert_eq!(g("test.arr_i32"), MetadataValue::Array(MetadataArray::I32(vec![1, -2, 3])));
    assert_eq!(
        g("test.arr_str"),
        MetadataValue::Array(MetadataArray::String(vec!["a".into(), "bc".into(), "".into()]))
    );
}

#[test]
fn golden_tensor_infos() {
    let f = GgufFile::parse(quant_bytes()).unwrap();
    let infos: Vec<(&str, GgmlType, Vec<usize>)> =
        f.tensors().iter().map(|t| (t.name.as_str(), t.ggml_type, t.shape())).collect();
    // Shapes as the script wrote them (numpy order); data offsets as gguf-py's reader
    // reports them (absolute).
    assert_eq!(
        infos,
        vec![
            ("t_f32", GgmlType::F32, vec![3, 7]),
            ("t_f16", GgmlType::F16, vec![4, 33]),
            ("t_bf16", GgmlType::BF16, vec![5, 40]),
            ("t_q8_0", GgmlType::Q8_0, vec![6, 64]),
            ("t_q4_0", GgmlType::Q4_0, vec![4, 96]),
            ("t_q4_1", GgmlType::Q4_1, vec![5, 64]),
            ("t_q4_1_1d", GgmlType::Q4_1, vec![128]),
            ("t_q8_0_3d", GgmlType::Q8_0, vec![2, 3, 32]),
            ("t_q5_0", GgmlType::Q5_0, vec![2, 32]),
            ("t_q4_k", GgmlType::Q4_K, vec![2, 512]),
            ("t_q5_k", GgmlType::Q5_K, vec![3, 256]),
            ("t_q6_k", GgmlType::Q6_K, vec![2, 256]),
            ("t_q5_1", GgmlType::Q5_1, vec![3, 64]),
            ("t_q5_0_b", GgmlType::Q5_0, vec![4, 96]),
            ("t_q2_k", GgmlType::Q2_K, vec![1, 256]),
        ]
    );
    let abs: Vec<u64> = f.tensors().iter().map(|t| f.data_start() + t.offset).collect();
    assert_eq!(abs, [1184, 1280, 1568, 1984, 2400, 2624, 2848, 2944, 3168, 3232, 3808, 4352, 4800, 4960, 5248]);
    let sizes: Vec<u64> = f.tensors().iter().map(|t| t.n_bytes).collect();
    assert_eq!(sizes, [84, 264, 400, 408, 216, 200, 80, 204, 44, 576, 528, 420, 144, 264, 84]);
}

#[test]
fn dequantize_matches_gguf_py_exactly() {
    let f = GgufFile::parse(quant_bytes()).unwrap();
    let expected = expected_tensors("gguf-quant/expected.safetensors");
    assert_eq!(expected.len(), 14);
    for (name, shape, want) in expected {
        let info = f.tensor_info(&name).unwrap();
        assert_eq!(info.shape(), shape, "{name}");
        let got = f.tensor_f32(&name).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} vs {w}");
        }
    }
    // The zero block and the constant block survive quantization as the script made them.
    let q41 = f.tensor_f32("t_q4_1").unwrap();
    assert!(q41[32..64].iter().all(|&x| x == 0.0));
    assert!(q41.iter().any(|&x| x < 0.0));
}

#[test]
fn unsupported_type_names_tensor_and_type() {
    let f = GgufFile::parse(quant_bytes()).unwrap();
    match f.tensor_f32("t_q2_k") {
        Err(e @ FormatError::UnsupportedGgmlType { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("t_q2_k") && msg.contains("Q2_K"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(f.tensor_f32("nope"), Err(FormatError::MissingTensor { .. })));
}

#[test]
fn version_2_reads_the_same_and_others_are_rejected() {
    let mut b = quant_bytes();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::parse(&b[..]).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensor_f32("t_q8_0").unwrap(), GgufFile::parse(quant_bytes()).unwrap().tensor_f32("t_q8_0").unwrap());
    for v in [1u32, 4, 0x0300_0000] {
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(GgufFile::parse(&b[..]), Err(FormatError::UnsupportedVersion { version }) if version == v));
    }
}

#[test]
fn unpermute_hand_built_cases() {
    // convert_hf_to_gguf's permute(w, n_head) maps HF rows, per head of size 4,
    // [r0 r1 r2 r3] to [r0 r2 r1 r3]; of size 6, [r0..r5] to [r0 r3 r1 r4 r2 r5].
    // Rows are 2 columns wide: row r = [10r, 10r + 1].
    let row = |r: usize| [10.0 * r as f32, 10.0 * r as f32 + 1.0];
    let rows = |order: &[usize]| order.iter().flat_map(|&r| row(r)).collect::<Vec<f32>>();

    let gguf = rows(&[0, 2, 1, 3, 4, 6, 5, 7]);
    assert_eq!(unpermute_rope_rows(&gguf, 2, 2).unwrap(), rows(&[0, 1, 2, 3, 4, 5, 6, 7]));

    let gguf = rows(&[0, 3, 1, 4, 2, 5]);
    assert_eq!(unpermute_rope_rows(&gguf, 1, 2).unwrap(), rows(&[0, 1, 2, 3, 4, 5]));

    // A bias (one column), two heads of 6.
    let gguf: Vec<f32> = [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11].iter().map(|&r| r as f32).collect();
    let hf: Vec<f32> = (0..12).map(|r| r as f32).collect();
    assert_eq!(unpermute_rope_rows(&gguf, 2, 1).unwrap(), hf);

    assert!(unpermute_rope_rows(&[0.0; 6], 2, 1).is_err(), "odd head size");
    assert!(unpermute_rope_rows(&[0.0; 6], 0, 1).is_err());
}

/// A 1-layer llama with 2 query heads and 1 KV head of width 6.
fn tiny_llama(extra: &[(&str, V)], drop: &str, k_rows: usize) -> Vec<u8> {
    let (h, hd, nh, nkv, ffn, vocab) = (12usize, 6usize, 2usize, 1usize, 16usize, 10usize);
    let mut kvs: Vec<(&str, V)> = vec![
        ("general.architecture", V::Str("llama".into())),
        ("llama.block_count", V::U32(1)),
        ("llama.context_length", V::U32(64)),
        ("llama.embedding_length", V::U32(h as u32)),
        ("llama.feed_forward_length", V::U32(ffn as u32)),
        ("llama.attention.head_count", V::U32(nh as u32)),
        ("llama.attention.head_count_kv", V::U32(nkv as u32)),
        ("llama.rope.freq_base", V::F32(500.0)),
        ("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5)),
        ("tokenizer.ggml.bos_token_id", V::U32(1)),
        ("tokenizer.ggml.eos_token_id", V::U32(2)),
        ("tokenizer.ggml.tokens", V::StrArr((0..vocab).map(|i| format!("t{i}")).collect())),
    ];
    for (k, v) in extra {
        let v = match v {
            V::U32(x) => V::U32(*x),
            V::F32(x) => V::F32(*x),
            V::Str(s) => V::Str(s.clone()),
            _ => unreachable!(),
        };
        kvs.push((k, v));
    }
    // Row r of every matrix holds the value r + 0.5 * column / cols.
    let mat = |name: &str, rows: usize, cols: usize| {
        let v: Vec<f32> = (0..rows * cols).map(|i| (i / cols) as f32 + 0.5 * (i % cols) as f32 / cols as f32).collect();
        f32_tensor(name, &[rows, cols], &v)
    };
    let vec1 = |name: &str, n: usize| f32_tensor(name, &[n], &vec![1.0; n]);
    let tensors: Vec<TensorSpec> = vec![
        mat("token_embd.weight", vocab, h),
        vec1("blk.0.attn_norm.weight", h),
        mat("blk.0.attn_q.weight", nh * hd, h),
        mat("blk.0.attn_k.weight", k_rows, h),
        mat("blk.0.attn_v.weight", nkv * hd, h),
        mat("blk.0.attn_output.weight", h, nh * hd),
        vec1("blk.0.ffn_norm.weight", h),
        mat("blk.0.ffn_gate.weight", ffn, h),
        mat("blk.0.ffn_up.weight", ffn, h),
        mat("blk.0.ffn_down.weight", h, ffn),
        vec1("output_norm.weight", h),
    ]
    .into_iter()
    .filter(|t| t.name != drop)
    .collect();
    build_gguf(&kvs, &tensors)
}

#[test]
fn hand_built_llama_config_and_unpermuted_weights() {
    let w = GgufWeights::new(tiny_llama(&[], "", 6)).unwrap();
    let c = w.config();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (12, 1, 2, 1, 6)
    );
    assert_eq!((c.intermediate_size, c.vocab_size, c.max_position_embeddings), (16, 10, 64));
    assert_eq!(c.rope_theta, 500.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tie_word_embeddings);
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(1), vec![2]));
    assert!(!c.attention_qkv_bias);

    // q: two heads of 6. GGUF row 2j + t holds HF row 3t + j within a head, so HF row i
    // is GGUF row [0 2 4 1 3 5 | 6 8 10 7 9 11][i]; every GGUF row starts with its own
    // row number.
    let q = w.load("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.shape, vec![12, 12]);
    let firsts: Vec<f32> = (0..12).map(|r| q.data[r * 12]).collect();
    assert_eq!(firsts, [0., 2., 4., 1., 3., 5., 6., 8., 10., 7., 9., 11.]);
    assert_eq!(q.data[13], 2.0 + 0.5 / 12.0);
    let k = w.load("model.layers.0.self_attn.k_proj.weight").unwrap();
    let firsts: Vec<f32> = (0..6).map(|r| k.data[r * 12]).collect();
    assert_eq!(firsts, [0., 2., 4., 1., 3., 5.]);
    // v and o are not permuted; o is [hidden, heads * head_dim].
    let v = w.load("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!((0..6).map(|r| v.data[r * 12]).collect::<Vec<_>>(), [0., 1., 2., 3., 4., 5.]);
    let down = w.load("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(down.shape, vec![12, 16]);
    assert!(matches!(w.load("lm_head.weight"), Err(FormatError::MissingTensor { .. })));
}

#[test]
fn hand_built_qwen2_is_not_unpermuted_and_reads_rope_scaling() {
    let mut b = tiny_llama(
        &[("llama.rope.scaling.type", V::Str("linear".into())), ("llama.rope.scaling.factor", V::F32(4.0))],
        "",
        6,
    );
    // Same length names: every "llama" (architecture and key prefixes) becomes "qwen2".
    while let Some(p) = b.windows(5).position(|w| w == b"llama") {
        b[p..p + 5].copy_from_slice(b"qwen2");
    }
    let w = GgufWeights::new(b).unwrap();
    assert_eq!(w.config().architecture, Architecture::Qwen2);
    assert_eq!(w.config().rope_scaling, Some(kvslice_formats::RopeScaling::Linear { factor: 4.0 }));
    let q = w.load("model.layers.0.self_attn.q_proj.weight").unwrap();
    let firsts: Vec<f32> = (0..12).map(|r| q.data[r * 12]).collect();
    assert_eq!(firsts, (0..12).map(|r| r as f32).collect::<Vec<_>>());
}

#[test]
fn hand_built_llama_errors() {
    match GgufWeights::new(tiny_llama(&[], "", 12)) {
        Err(FormatError::ShapeMismatch { tensor, expected, got }) => {
            assert_eq!(tensor, "model.layers.0.self_attn.k_proj.weight");
            assert_eq!(expected, vec![6, 12]);
            assert_eq!(got, vec![12, 12]);
        }
        other => panic!("{other:?}"),
    }
    match GgufWeights::new(tiny_llama(&[], "blk.0.ffn_up.weight", 6)) {
        Err(FormatError::MissingTensor { tensor }) => {
            assert_eq!(tensor, "model.layers.0.mlp.up_proj.weight")
        }
        other => panic!("{other:?}"),
    }
    // A header claiming 2^24 layers over a 1-layer file: the first missing tensor is reported
    // (before, the full list of 150 M expected tensors was built first: 15–20 GB).
    let mut b = tiny_llama(&[], "", 6);
    let key = b"llama.block_count";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4; // after the value type
    b[at..at + 4].copy_from_slice(&(1u32 << 24).to_le_bytes());
    match GgufWeights::new(b) {
        Err(FormatError::MissingTensor { tensor }) => assert_eq!(tensor, "model.layers.1.input_layernorm.weight"),
        other => panic!("{other:?}"),
    }
    let mut b = tiny_llama(&[], "", 6);
    let pos = b.windows(5).position(|w| w == b"llama").unwrap();
    b[pos..pos + 5].copy_from_slice(b"gptj_");
    match GgufWeights::new(b) {
        Err(FormatError::UnknownArchitecture { name }) => assert_eq!(name, "gptj_"),
        other => panic!("{other:?}"),
    }
}

/// The real model file: configuration, and weights equal to transformers' loading of
/// the same GGUF (dequantized and un-permuted by transformers).
#[test]
fn real_smollm2_config_and_weights() {
    let Some(path) = real_model() else { return };
    let w = GgufWeights::new(std::fs::read(&path).unwrap()).unwrap();
    let c: &ModelConfig = w.config();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.num_hidden_layers, 30);
    assert_eq!(c.num_attention_heads, 9);
    assert_eq!(c.num_key_value_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.vocab_size, 49152);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!((c.rms_norm_eps - 1e-5).abs() < 1e-9);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);

    for (name, shape, want) in expected_tensors("gguf-quant/smollm2_slices.safetensors") {
        let t = w.load(&name).unwrap();
        let cols = t.shape.get(1).copied().unwrap_or(t.shape[0]);
        let (rows, take) = if t.shape.len() == 2 { (shape[0], shape[1]) } else { (1, shape[0]) };
        let mut max_diff = 0f32;
        for r in 0..rows {
            for j in 0..take {
                let g = if t.shape.len() == 2 { t.data[r * cols + j] } else { t.data[j] };
                max_diff = max_diff.max((g - want[r * take + j]).abs());
            }
        }
        // transformers dequantizes with numpy in f32 too: equal up to rounding order.
        assert!(max_diff <= 1e-6, "{name}: max |diff| {max_diff}");
    }
}
