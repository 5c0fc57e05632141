//! Errors of the runtime.

/// Everything a session can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("device: {0}")]
    Device(String),
    #[error("reading results back from the device failed: {0}")]
    Readback(String),
    #[error(transparent)]
    Model(#[from] kvslice_model::ModelError),
    #[error(transparent)]
    Format(#[from] kvslice_formats::FormatError),
    #[error(transparent)]
    Cache(#[from] kvslice_cache::CacheError),
    #[error("prompt of {tokens} tokens plus {new} new tokens exceeds the context of {context}")]
    ContextOverflow { tokens: usize, new: usize, context: usize },
    #[error("invalid option: {0}")]
    Options(String),
    #[error("the model's logits are not finite ({0}): its weights or settings give NaN or infinity")]
    NonFiniteLogits(String),
    #[error(
        "{what} needs a buffer of {bytes} bytes, over the {limit} of {max} bytes of the adapter `{adapter}`: \
         use a smaller context (fewer prompt or new tokens), a smaller model, or another device (--device cpu)"
    )]
    DeviceLimit { what: String, bytes: u64, limit: &'static str, max: u64, adapter: String },
    #[error("session unusable: {0}")]
    Unusable(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, RuntimeError>;
