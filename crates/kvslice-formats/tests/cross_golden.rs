//! The tiny models transformers wrote (tests/golden/tiny/, tests/golden/tiny-gguf/,
//! scripts/golden/): every folder opens against its config, and the GGUF copies of the
//! tiny llama — written with convert_hf_to_gguf's Q/K permutation — load back to the
//! folder's tensors.

mod common;

use common::golden;
use kvslice_formats::fs::{open_model, open_weights};
use kvslice_formats::{Architecture, FormatError, expected_tensors};

#[test]
fn transformers_tiny_folders_open() {
    let cases = [
        ("tiny/llama", Architecture::Llama, false, false),
        ("tiny/llama-tied-f16", Architecture::Llama, true, false),
        ("tiny/mistral-sharded", Architecture::Mistral, false, false),
        ("tiny/qwen2-bf16", Architecture::Qwen2, false, true),
    ];
    for (dir, arch, tied, bias) in cases {
        let w = open_weights(&golden(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        let c = w.config();
        assert_eq!(c.architecture, arch, "{dir}");
        assert_eq!(c.tie_word_embeddings, tied, "{dir}");
        assert_eq!(c.attention_qkv_bias, bias, "{dir}");
        for e in expected_tensors(c) {
            let t = w.load(&e.name).unwrap();
            assert_eq!(t.shape, e.shape);
            assert!(t.data.iter().all(|x| x.is_finite()), "{dir}: {}", e.name);
        }
    }
    // These folders have no tokenizer: opening the whole model names the missing file.
    match open_model(&golden("tiny/llama")) {
        Err(FormatError::MissingFiles { files }) => {
            assert_eq!(files.len(), 1);
            assert!(files[0].ends_with("tokenizer.json"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tiny_llama_gguf_loads_back_to_the_folder_weights() {
    let hf = open_weights(&golden("tiny/llama")).unwrap();
    // (file, max |diff| allowed relative to the tensor's max |value|)
    for (file, tol) in [("tiny-llama-F32.gguf", 0.0f32), ("tiny-llama-F16.gguf", 1e-3), ("tiny-llama-Q8_0.gguf", 1e-2)]
    {
        let g = open_weights(&golden(&format!("tiny-gguf/{file}"))).unwrap();
        let (gc, hc) = (g.config(), hf.config());
        assert_eq!(
            (gc.hidden_size, gc.num_hidden_layers, gc.num_attention_heads, gc.num_key_value_heads, gc.head_dim),
            (hc.hidden_size, hc.num_hidden_layers, hc.num_attention_heads, hc.num_key_value_heads, hc.head_dim)
        );
        assert_eq!(
            (gc.vocab_size, gc.intermediate_size, gc.tie_word_embeddings),
            (hc.vocab_size, hc.intermediate_size, false)
        );
        for e in expected_tensors(hc) {
            let (a, b) = (g.load(&e.name).unwrap(), hf.load(&e.name).unwrap());
            assert_eq!(a.shape, b.shape, "{file}: {}", e.name);
            let scale = b.data.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = a.data.iter().zip(&b.data).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff <= tol * scale, "{file}: {} differs by {diff} (scale {scale})", e.name);
        }
    }
}
