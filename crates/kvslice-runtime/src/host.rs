//! What the runtime needs of the host around the device: reading results back, and a clock.
//! Leaf module: every other part of the runtime may use it, it uses none of them.

use burn::tensor::{Tensor, Transaction};

use crate::error::{Result, RuntimeError};

/// Reads a float tensor back to the host.
pub async fn read_f32<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    let data = Transaction::default()
        .register(t)
        .execute_async()
        .await
        .map_err(|e| RuntimeError::Readback(format!("{e:?}")))?;
    data[0].try_to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))
}

#[cfg(not(target_family = "wasm"))]
pub(crate) fn now() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
}

#[cfg(target_family = "wasm")]
pub(crate) fn now() -> f64 {
    // Timing in the browser is the page's job; the runtime reports zero durations there.
    0.0
}
