//! The adapter's buffer limits, checked before anything is allocated: a model or a context
//! too large for the device gets an error naming the limit and the size asked for, instead of
//! a validation panic deep inside the GPU runtime (or, in the browser, a lost device).
//!
//! Every tensor lives in one storage buffer bound whole, so each must fit both
//! `max_buffer_size` and `max_storage_buffer_binding_size` (WebGPU's defaults: 256 MiB and
//! 128 MiB; native adapters offer more, and kvslice opens them with their own limits).

use kvslice_formats::{ModelConfig, expected_tensors};
use kvslice_model::LlamaConfig;
use kvslice_model::model::MAX_SCORE_ELEMS;

use crate::device::DeviceInfo;
use crate::error::{Result, RuntimeError};

/// One buffer the runtime will ask the device for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferNeed {
    /// What it holds (a tensor's name, "one layer's cached keys", ...).
    pub what: String,
    pub bytes: u64,
}

fn f32_bytes(elements: usize) -> u64 {
    (elements as u64).saturating_mul(4)
}

/// The largest weight tensor (f32 on the device), from the config alone.
pub fn weight_buffers(config: &ModelConfig) -> Vec<BufferNeed> {
    let largest = expected_tensors(config).max_by_key(|t| t.shape.iter().product::<usize>());
    largest
        .map(|t| BufferNeed {
            bytes: t.shape.iter().fold(4u64, |b, &d| b.saturating_mul(d as u64)),
            what: format!("weight `{}` {:?}", t.name, t.shape),
        })
        .into_iter()
        .collect()
}

/// The largest buffers of a session holding up to `capacity` tokens, whose prompt (at most
/// `capacity` tokens) is prefilled in one forward.
pub fn session_buffers(config: &LlamaConfig, capacity: usize) -> Vec<BufferNeed> {
    let c = capacity;
    let widest = config.intermediate_size.max(config.num_heads * config.head_dim).max(config.hidden_size);
    vec![
        BufferNeed {
            what: format!(
                "one layer's cached keys ({} KV heads × {c} tokens × {})",
                config.num_kv_heads, config.head_dim
            ),
            bytes: f32_bytes(config.num_kv_heads.saturating_mul(c).saturating_mul(config.head_dim)),
        },
        BufferNeed {
            what: format!("the activations of a {c}-token prefill ({c} × {widest})"),
            bytes: f32_bytes(c.saturating_mul(widest)),
        },
        BufferNeed {
            what: format!("one chunk of attention scores over {c} tokens"),
            bytes: f32_bytes(MAX_SCORE_ELEMS.max(config.num_heads.saturating_mul(c)).min(
                // never more than the whole score matrix
                config.num_heads.saturating_mul(c).saturating_mul(c),
            )),
        },
    ]
}

/// Refuses the first need over the adapter's limits. A CPU device (limits 0) has none.
pub fn check(needs: &[BufferNeed], info: &DeviceInfo) -> Result<()> {
    if info.kind != "wgpu" {
        return Ok(());
    }
    let limits = [
        ("max_storage_buffer_binding_size", info.max_storage_buffer_binding_size),
        ("max_buffer_size", info.max_buffer_size),
    ];
    for need in needs {
        for (limit, max) in limits {
            if need.bytes > max {
                return Err(RuntimeError::DeviceLimit {
                    what: need.what.clone(),
                    bytes: need.bytes,
                    limit,
                    max,
                    adapter: info.name.clone(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(binding: u64, buffer: u64) -> DeviceInfo {
        DeviceInfo {
            kind: "wgpu",
            name: "test adapter".into(),
            backend: "Vulkan".into(),
            device_type: "DiscreteGpu".into(),
            driver: String::new(),
            max_storage_buffer_binding_size: binding,
            max_buffer_size: buffer,
        }
    }

    /// SmolLM2-135M's shape (config.json of HuggingFaceTB/SmolLM2-135M-Instruct).
    fn smollm2() -> ModelConfig {
        ModelConfig::from_hf_json(
            br#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5,
                "rope_theta": 100000.0, "max_position_embeddings": 8192, "tie_word_embeddings": true}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_embedding_is_the_largest_weight() {
        let needs = weight_buffers(&smollm2());
        // 49,152 × 576 × 4 bytes.
        assert_eq!(needs[0].bytes, 113_246_208);
        assert!(needs[0].what.contains("embed_tokens"), "{}", needs[0].what);
        // Fits WebGPU's default 128 MiB binding, not a 64 MiB one.
        assert!(check(&needs, &adapter(128 << 20, 256 << 20)).is_ok());
        let err = check(&needs, &adapter(64 << 20, 256 << 20)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("max_storage_buffer_binding_size") && msg.contains("113246208"), "{msg}");
        assert!(msg.contains("67108864") && msg.contains("test adapter"), "{msg}");
        let err = check(&needs, &adapter(1 << 30, 100 << 20)).unwrap_err();
        assert!(err.to_string().contains("max_buffer_size"), "{err}");
        // The CPU backend has no such limits.
        let cpu = DeviceInfo { kind: "cpu", ..adapter(0, 0) };
        assert!(check(&needs, &cpu).is_ok());
    }

    #[test]
    fn a_session_at_the_full_context_fits_webgpu_defaults() {
        let config = LlamaConfig::from(&smollm2());
        let needs = session_buffers(&config, 8192);
        // Keys: 3 × 8192 × 64 × 4; activations: 8192 × 1536 × 4; scores: one 64 MiB chunk.
        let bytes: Vec<u64> = needs.iter().map(|n| n.bytes).collect();
        assert_eq!(bytes, [6_291_456, 50_331_648, 67_108_864]);
        assert!(check(&needs, &adapter(128 << 20, 256 << 20)).is_ok());
        // A 32K context does not: the prefill's activations are 32768 × 1536 × 4 = 192 MiB.
        let needs = session_buffers(&config, 32768);
        let err = check(&needs, &adapter(128 << 20, 256 << 20)).unwrap_err();
        assert!(err.to_string().contains("prefill") && err.to_string().contains("201326592"), "{err}");
        // A million tokens: one layer's keys alone are 768 MiB.
        let needs = session_buffers(&config, 1 << 20);
        let err = check(&needs, &adapter(128 << 20, 256 << 20)).unwrap_err();
        assert!(err.to_string().contains("cached keys") && err.to_string().contains("805306368"), "{err}");
        // A tiny session's scores are its whole score matrix.
        let needs = session_buffers(&config, 10);
        assert_eq!(needs[2].bytes, 9 * 10 * 10 * 4);
    }
}
