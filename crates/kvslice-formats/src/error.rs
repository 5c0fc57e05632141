//! One error type for every format in this crate.

use thiserror::Error;

/// Result alias used throughout the crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading model files.
///
/// Every variant carries enough context (tensor name, offset, file) for a one-line
/// message in the CLI. Parsing never panics on bad input and validates sizes before it
/// allocates.
#[derive(Debug, Error)]
pub enum FormatError {
    /// A low-rank keys file that is not one, or whose groups and bases do not fit together.
    #[error("low-rank keys: {0}")]
    LowRank(String),

    /// The input ended before a field could be read.
    #[error("unexpected end of data at byte {offset} while reading {what} (needed {needed} bytes, {available} left)")]
    Truncated { what: &'static str, offset: u64, needed: u64, available: u64 },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },

    /// A GGUF version this reader does not understand (only 2 and 3, little endian).
    #[error("unsupported GGUF version {version} (supported: 2 and 3, little endian)")]
    UnsupportedVersion { version: u32 },

    /// A count or length that cannot fit in the remaining bytes.
    #[error("{what} claims {claimed} items at byte {offset}, but at most {max} fit in the remaining data")]
    CountTooLarge { what: &'static str, claimed: u64, max: u64, offset: u64 },

    /// A metadata value type id that GGUF does not define.
    #[error("unknown GGUF metadata value type {type_id} for key {key:?}")]
    UnknownValueType { key: String, type_id: u32 },

    /// Arrays of arrays nested deeper than the reader accepts.
    #[error("metadata key {key:?}: arrays nested deeper than {max_depth} levels")]
    NestingTooDeep { key: String, max_depth: usize },

    /// A string that is not valid UTF-8.
    #[error("invalid UTF-8 in {what} at byte {offset}")]
    InvalidUtf8 { what: &'static str, offset: u64 },

    /// A metadata key that appears twice.
    #[error("duplicate GGUF metadata key {key:?}")]
    DuplicateKey { key: String },

    /// A tensor name that appears twice.
    #[error("duplicate tensor name {tensor:?}")]
    DuplicateTensor { tensor: String },

    /// `general.alignment` is not a non-zero power of two.
    #[error("invalid GGUF alignment {alignment}: must be a non-zero power of two")]
    BadAlignment { alignment: u64 },

    /// A tensor with an unusable number of dimensions.
    #[error("tensor {tensor:?}: {n_dims} dimensions (supported: 1 to {max})")]
    BadDimCount { tensor: String, n_dims: u32, max: usize },

    /// The dimensions multiply to more than the address space, or a dimension is zero.
    #[error("tensor {tensor:?}: invalid shape {dims:?} (zero dimension or element count overflows)")]
    BadShape { tensor: String, dims: Vec<u64> },

    /// A ggml type id that this reader does not know at all.
    #[error("tensor {tensor:?}: unknown ggml type id {type_id}")]
    UnknownGgmlType { tensor: String, type_id: u32 },

    /// A known ggml type that cannot be dequantized by this crate.
    #[error(
        "tensor {tensor:?}: ggml type {type_name} is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
    )]
    UnsupportedGgmlType { tensor: String, type_name: &'static str },

    /// The row length is not a multiple of the quantization block size.
    #[error("tensor {tensor:?}: row length {row} is not a multiple of the {type_name} block size {block}")]
    BadRowLength { tensor: String, type_name: &'static str, row: u64, block: u64 },

    /// A tensor's data does not lie inside the file (or is misaligned).
    #[error("tensor {tensor:?}: data [{start}, {end}) is outside the data section of {len} bytes or misaligned")]
    DataOutOfBounds { tensor: String, start: u64, end: u64, len: u64 },

    /// Two tensors' data ranges overlap.
    #[error("tensors {first:?} and {second:?} share data (from offset {at} of the data section)")]
    TensorsOverlap { first: String, second: String, at: u64 },

    /// A metadata key the caller needed is absent.
    #[error("missing metadata key {key:?}")]
    MissingKey { key: String },

    /// A metadata value has the wrong type or an unusable value.
    #[error("metadata key {key:?}: {reason}")]
    BadMetadata { key: String, reason: String },

    /// A tensor the model needs is absent from the files.
    #[error("missing tensor {tensor:?}")]
    MissingTensor { tensor: String },

    /// A tensor's shape disagrees with the model configuration.
    #[error("tensor {tensor:?}: shape {got:?} does not match the configuration, expected {expected:?}")]
    ShapeMismatch { tensor: String, expected: Vec<usize>, got: Vec<usize> },

    /// The architecture is not one of llama, mistral, qwen2.
    #[error("unsupported architecture {name:?} (supported: llama, mistral, qwen2)")]
    UnknownArchitecture { name: String },

    /// config.json is not valid JSON or misses required fields.
    #[error("invalid config.json: {reason}")]
    BadConfig { reason: String },

    /// A safetensors file that the safetensors crate rejects (bad header length, JSON, offsets).
    #[error("invalid safetensors file {file:?}: {reason}")]
    BadSafetensors { file: String, reason: String },

    /// A safetensors dtype other than F32, F16, BF16.
    #[error("tensor {tensor:?}: dtype {dtype} is not supported (supported: F32, F16, BF16)")]
    UnsupportedDtype { tensor: String, dtype: String },

    /// model.safetensors.index.json is invalid.
    #[error("invalid safetensors index: {reason}")]
    BadIndex { reason: String },

    /// Files the model needs are absent.
    #[error("missing files: {}", files.join(", "))]
    MissingFiles { files: Vec<String> },

    /// An I/O error while reading a file (native convenience functions only).
    #[error("cannot read {path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// The tokenizer could not be built or used.
    #[error("tokenizer: {reason}")]
    Tokenizer { reason: String },

    /// A GGUF tokenizer whose model or pre-tokenizer this crate cannot rebuild.
    #[error("unsupported GGUF tokenizer: {what} = {value:?}")]
    UnsupportedTokenizer { what: &'static str, value: String },

    /// No chat template is available.
    #[error("the model has no chat template")]
    NoChatTemplate,

    /// A chat template this crate cannot render.
    #[error("unsupported chat template (only ChatML-style templates are rendered): {reason}")]
    UnsupportedChatTemplate { reason: String },
}
