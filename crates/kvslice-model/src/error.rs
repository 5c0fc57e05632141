//! Errors of the model crate.

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("weight `{tensor}` has shape {got:?}, the config implies {expected:?}")]
    ShapeMismatch { tensor: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("weight `{tensor}` holds {value} at element {index}: the file is corrupt")]
    NonFinite { tensor: String, index: usize, value: f32 },
    #[error("weight `{0}` is missing")]
    MissingTensor(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("prompt of {tokens} tokens does not fit the context of {context}")]
    ContextOverflow { tokens: usize, context: usize },
    /// A low-rank keys file or its calibration ([`crate::lowrank`]).
    #[error("low-rank keys: {0}")]
    LowRank(String),
    #[error(transparent)]
    Format(#[from] kvslice_formats::FormatError),
    #[error(transparent)]
    Cache(#[from] kvslice_cache::CacheError),
    /// A fused decode kernel refused its arguments (they are validated before anything runs).
    #[error("decode kernel: {0}")]
    Kernel(#[from] kvslice_kernels::KernelError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
