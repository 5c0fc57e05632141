//! The kvslice runtime: device selection, model loading, and sessions that prefill and decode
//! over the KV cache. No filesystem access or threads below the `fs` helpers, so the crate
//! builds for `wasm32-unknown-unknown`.

pub mod device;
pub mod error;
pub mod evict;
pub mod loading;
#[cfg(not(target_family = "wasm"))]
pub mod paths;
pub mod sampling;
pub mod session;

pub use device::{DeviceChoice, DeviceInfo, GraphicsApi, device_info, init_device};
pub use error::{Result, RuntimeError};
pub use evict::{Compression, CompressionReport, DecodeRule, StatsRequest};
pub use loading::LoadedModel;
pub use sampling::Sampler;
pub use session::{GenerateOptions, GenerationStats, Prefilled, Session, read_f32};
