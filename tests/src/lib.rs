//! Shared helpers of the end-to-end tests: devices, golden data, the default model.

use std::path::PathBuf;
use std::sync::OnceLock;

use burn::tensor::Device;
use kvslice_formats::{ModelConfig, SafetensorsWeights};
use kvslice_runtime::{DeviceChoice, init_device};

/// The repository's `tests/golden` folder.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// Reads a JSON file under `tests/golden`.
pub fn golden_json(relative: &str) -> serde_json::Value {
    let path = golden_dir().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The wgpu device (lavapipe on machines without a GPU). Fails, never skips, when no adapter
/// is found: the GPU path is what the tests are for.
pub fn wgpu() -> Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let (device, info) = pollster::block_on(init_device(DeviceChoice::Wgpu))
                .unwrap_or_else(|e| panic!("wgpu adapter required for this test: {e}"));
            eprintln!("test device: {info}");
            device
        })
        .clone()
}

/// Burn's CPU backend, the reference device.
pub fn cpu() -> Device {
    pollster::block_on(init_device(DeviceChoice::Cpu)).expect("cpu device").0
}

/// The fetched default model. Fails with instructions when it is missing (`scripts/test.sh`
/// fetches it before the tests run).
pub fn default_model() -> PathBuf {
    let path = kvslice_runtime::paths::default_model_path().expect("a cache directory");
    assert!(path.is_file(), "{} missing: run `kvslice fetch` (scripts/test.sh does)", path.display());
    path
}

/// `[a, b, ...]` of a JSON array of integers.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("integer") as u32).collect()
}

/// The weights of the tiny seeded model `tests/golden/tiny/<name>` (HF safetensors folder,
/// sharded or not).
pub fn tiny_hf_weights(name: &str) -> SafetensorsWeights<Vec<u8>> {
    tiny_hf_weights_with(name, |_| {})
}

/// As [`tiny_hf_weights`], under its config changed by `edit` (a longer context, other RoPE
/// scaling).
pub fn tiny_hf_weights_with(name: &str, edit: impl FnOnce(&mut ModelConfig)) -> SafetensorsWeights<Vec<u8>> {
    let dir = golden_dir().join("tiny").join(name);
    let mut config = ModelConfig::from_hf_json(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    let index = dir.join("model.safetensors.index.json");
    let files = if index.is_file() {
        kvslice_formats::safetensors_index_files(&std::fs::read(index).unwrap()).unwrap()
    } else {
        vec!["model.safetensors".to_string()]
    };
    let shards = files
        .into_iter()
        .map(|f| {
            let b = std::fs::read(dir.join(&f)).unwrap();
            (f, b)
        })
        .collect();
    SafetensorsWeights::new(config, shards).unwrap()
}
