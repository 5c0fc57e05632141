//! Test helpers: paths to golden data and a minimal GGUF writer for hand-built files.
#![allow(dead_code)]

use std::path::PathBuf;

use kvslice_formats::{HfTokenizerFiles, Tokenizer};

pub fn golden(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(rel)
}

pub fn real_model() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let p = PathBuf::from(home).join(".cache/kvslice/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        Some(p)
    } else {
        println!("NOTICE: {} is absent; skipping the real-model checks", p.display());
        None
    }
}

/// A metadata value for the writer.
pub enum V {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
    /// Raw: type id and already-encoded value bytes.
    Raw(u32, Vec<u8>),
}

pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Write a GGUF v3 file with alignment 32. Tensor offsets are laid out in order.
pub fn build_gguf(kvs: &[(&str, V)], tensors: &[TensorSpec]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut out, k);
        match v {
            V::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            V::F32(x) => {
                out.extend(6u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            V::Bool(b) => {
                out.extend(7u32.to_le_bytes());
                out.push(*b as u8);
            }
            V::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            V::StrArr(a) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for s in a {
                    put_str(&mut out, s);
                }
            }
            V::I32Arr(a) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for x in a {
                    out.extend(x.to_le_bytes());
                }
            }
            V::Raw(t, bytes) => {
                out.extend(t.to_le_bytes());
                out.extend(bytes);
            }
        }
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.ggml_type.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset += (t.data.len() as u64).div_ceil(32) * 32;
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    let start = out.len();
    for (t, o) in tensors.iter().zip(offsets) {
        out.resize(start + o as usize, 0);
        out.extend(&t.data);
    }
    out
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn f32_tensor(name: &str, shape_rowmajor: &[usize], values: &[f32]) -> TensorSpec {
    assert_eq!(shape_rowmajor.iter().product::<usize>(), values.len());
    TensorSpec {
        name: name.to_string(),
        dims: shape_rowmajor.iter().rev().map(|&d| d as u64).collect(),
        ggml_type: 0,
        data: f32_bytes(values),
    }
}

/// The tiny HF tokenizer (tests/golden/tokenizer/tiny) with its config and chat template.
pub fn tiny_hf() -> Tokenizer {
    let dir = golden("tokenizer/tiny");
    let json = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let cfg = std::fs::read(dir.join("tokenizer_config.json")).unwrap();
    Tokenizer::from_hf(HfTokenizerFiles {
        tokenizer_json: &json,
        tokenizer_config_json: Some(&cfg),
        chat_template_jinja: None,
    })
    .unwrap()
}
