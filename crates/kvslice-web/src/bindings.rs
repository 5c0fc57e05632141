//! The JavaScript API (wasm32 only). One model at a time, kept in this module; every call
//! that touches the GPU returns a promise. Errors reach JavaScript as `Error`s with the
//! message the native CLI would print.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Function, Object, Reflect, Uint8Array};
use kvslice_runtime::{Device, DeviceChoice, DeviceInfo, GraphicsApi, LoadedModel, init_device};
use wasm_bindgen::prelude::*;

use crate::{KvMemory, Request, kept_mask};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

thread_local! {
    static DEVICE: RefCell<Option<(Device, DeviceInfo)>> = const { RefCell::new(None) };
    static MODEL: RefCell<Option<Rc<LoadedModel>>> = const { RefCell::new(None) };
}

/// Panics (bugs) show in the console with their message instead of "unreachable", and free
/// the GPU memory they would otherwise leave allocated: a panic aborts the wasm instance where
/// it stands, so the model's and the session's buffers are never dropped. The WebGPU device is
/// destroyed instead (all of its buffers with it); the page must be reloaded to go on.
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        let released = kvslice_runtime::device::release_gpu_memory();
        console_error(&format!(
            "kvslice panicked: {info} ({released} GPU device(s) destroyed to free their memory; reload the page)"
        ))
    }));
}

/// Panics on purpose: the end-to-end test's way to check what a panic leaves behind.
#[wasm_bindgen(js_name = panicForTests)]
pub fn panic_for_tests() {
    panic!("panic requested by the end-to-end test");
}

fn set(obj: &Object, key: &str, value: impl Into<JsValue>) {
    // Setting a property on a plain object cannot fail.
    let _ = Reflect::set(obj, &JsValue::from_str(key), &value.into());
}

fn device() -> Result<(Device, DeviceInfo), JsError> {
    DEVICE.with(|d| d.borrow().clone()).ok_or_else(|| JsError::new("no GPU device yet: call openDevice() first"))
}

fn json(value: &impl serde::Serialize) -> Result<String, JsError> {
    serde_json::to_string(value).map_err(|e| JsError::new(&e.to_string()))
}

/// Opens the WebGPU device (with the adapter's own limits) and returns its description as
/// JSON: `{name, backend, device_type, driver, max_storage_buffer_binding_size, max_buffer_size}`.
#[wasm_bindgen(js_name = openDevice)]
pub async fn open_device() -> Result<String, JsError> {
    let (device, info) = init_device(DeviceChoice::WgpuApi(GraphicsApi::WebGpu))
        .await
        .map_err(|e| JsError::new(&format!("WebGPU device: {e}")))?;
    let out = serde_json::json!({
        "name": info.name,
        "backend": info.backend,
        "device_type": info.device_type,
        "driver": info.driver,
        "max_storage_buffer_binding_size": info.max_storage_buffer_binding_size,
        "max_buffer_size": info.max_buffer_size,
    });
    DEVICE.with(|d| *d.borrow_mut() = Some((device, info)));
    Ok(out.to_string())
}

/// Parses a GGUF model from its bytes and uploads it; returns its configuration as JSON.
/// Replaces the previous model.
#[wasm_bindgen(js_name = loadModel)]
pub fn load_model(bytes: Vec<u8>) -> Result<String, JsError> {
    let (device, info) = device()?;
    MODEL.with(|m| *m.borrow_mut() = None);
    let loaded =
        crate::load_model(bytes, &device, info.max_storage_buffer_binding_size).map_err(|e| JsError::new(&e))?;
    let c = &loaded.model.config;
    let out = serde_json::json!({
        "architecture": format!("{:?}", c.architecture),
        "layers": c.num_layers,
        "heads": c.num_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab": c.vocab_size,
        "context": c.max_position_embeddings,
        "parameters": c.num_parameters(),
    });
    MODEL.with(|m| *m.borrow_mut() = Some(Rc::new(loaded)));
    Ok(out.to_string())
}

/// The registered eviction policies as JSON: `[{name, paper, summary}]`.
#[wasm_bindgen]
pub fn policies() -> Result<String, JsError> {
    json(&crate::policies())
}

/// Greedy generation. `policy` empty keeps the whole cache; otherwise `budget` is `10%`,
/// `128L` or a flat count. `onStep` is called with every token:
/// `{index, token, text, width, rows, mask, entries, fullEntries, bytes, fullBytes,
/// storageBytes}` where `mask` is a `rows × width` `Uint8Array` (1 = kept; rows are
/// layer-major (layer, KV head) pairs); returning `false` stops. Resolves to the outcome as
/// JSON (`{prompt_tokens, tokens, text, policy, kept_entries, memory, ...}`).
#[wasm_bindgen]
pub async fn generate(
    prompt: String,
    chat: bool,
    policy: String,
    budget: String,
    max_new_tokens: usize,
    on_step: Function,
) -> Result<String, JsError> {
    let loaded = MODEL.with(|m| m.borrow().clone()).ok_or_else(|| JsError::new("no model loaded"))?;
    let compression = if policy.is_empty() { None } else { Some((policy, budget)) };
    let request = Request { prompt, chat, compression, max_new_tokens };
    let rows = loaded.model.config.num_layers * loaded.model.config.num_kv_heads;
    let mut callback_error = None;
    let outcome = crate::generate(&loaded, &request, |step| {
        let obj = Object::new();
        set(&obj, "index", step.index as u32);
        set(&obj, "token", step.token);
        set(&obj, "text", step.text.as_str());
        set(&obj, "width", step.width as u32);
        set(&obj, "rows", rows as u32);
        let mask = match step.cache {
            Some(cache) => kept_mask(cache, step.width),
            None => vec![1u8; rows * step.width],
        };
        set(&obj, "mask", Uint8Array::from(mask.as_slice()));
        let KvMemory { entries, full_entries, bytes, full_bytes, storage_bytes } = step.memory;
        set(&obj, "entries", entries as f64);
        set(&obj, "fullEntries", full_entries as f64);
        set(&obj, "bytes", bytes as f64);
        set(&obj, "fullBytes", full_bytes as f64);
        set(&obj, "storageBytes", storage_bytes as f64);
        match on_step.call1(&JsValue::NULL, &obj) {
            Ok(v) => v.as_bool() != Some(false),
            Err(e) => {
                callback_error = Some(e);
                false
            }
        }
    })
    .await
    .map_err(|e| JsError::new(&e))?;
    if let Some(e) = callback_error {
        return Err(JsError::new(&format!("onStep threw: {}", e.as_string().unwrap_or_else(|| format!("{e:?}")))));
    }
    json(&outcome)
}

/// Runs the kernel conformance suite (every WGSL kernel against its CPU twin) on the WebGPU
/// device; resolves to JSON `[{kernel, case, passed, failure, checked}]`.
#[wasm_bindgen(js_name = runConformance)]
pub async fn run_conformance() -> Result<String, JsError> {
    let (device, _) = device()?;
    let results = kvslice_runtime::conformance::run_all(&device).await;
    let out: Vec<_> = results.iter().map(|r| r.report()).collect();
    serde_json::to_string(&out).map_err(|e| JsError::new(&e.to_string()))
}
