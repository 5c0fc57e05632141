//! Typed errors, raised before anything is dispatched.

/// Why a kernel call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A tensor's shape disagrees with the others or with the documented layout.
    #[error("{tensor}: expected shape {expected:?}, got {got:?}")]
    Shape {
        /// Which argument.
        tensor: &'static str,
        /// The shape the other arguments imply (`usize::MAX` marks a free dimension).
        expected: Vec<usize>,
        /// The shape received.
        got: Vec<usize>,
    },
    /// A tensor has an element type the kernel does not take.
    #[error("{tensor}: element type {got} not supported, expected {expected}")]
    DType {
        /// Which argument.
        tensor: &'static str,
        /// What the kernel takes.
        expected: &'static str,
        /// What it received.
        got: String,
    },
    /// A tensor does not live on a wgpu device (the kernels are WGSL).
    #[error("{tensor}: not a tensor of Burn's wgpu backend ({reason})")]
    Device {
        /// Which argument.
        tensor: &'static str,
        /// What was found instead.
        reason: String,
    },
    /// Two tensors live on different devices.
    #[error("{tensor}: on another device than {other}")]
    DeviceMismatch {
        /// Which argument.
        tensor: &'static str,
        /// The argument it was compared with.
        other: &'static str,
    },
    /// An in-place argument is a strided view; the kernels address rows directly.
    #[error("{tensor}: must be contiguous to be updated in place")]
    NotContiguous {
        /// Which argument.
        tensor: &'static str,
    },
    /// `head_dim` outside what the kernels were built for.
    #[error("head_dim {head_dim} not supported (1..={max})")]
    HeadDim {
        /// The head dimension received.
        head_dim: usize,
        /// The largest supported head dimension.
        max: usize,
    },
    /// Query heads are not a whole multiple of KV heads.
    #[error("{heads} query heads cannot be grouped onto {kv_heads} KV heads")]
    Grouping {
        /// Query heads.
        heads: usize,
        /// KV heads.
        kv_heads: usize,
    },
    /// A dimension that must be non-zero is zero.
    #[error("{what} must not be empty")]
    Empty {
        /// Which dimension.
        what: &'static str,
    },
    /// The observation window is empty or longer than the keys.
    #[error("observation window {window} must be in 1..={len} (the number of keys)")]
    Window {
        /// Window queries `w`.
        window: usize,
        /// Keys `n`.
        len: usize,
    },
    /// A per-head list has the wrong number of entries.
    #[error("{what}: {got} entries, expected one per KV head ({expected})")]
    PerHead {
        /// Which list.
        what: &'static str,
        /// KV heads.
        expected: usize,
        /// Entries received.
        got: usize,
    },
    /// A per-head length (or a length after an append) is past the capacity.
    #[error("head {head}: length {len} exceeds capacity {capacity}")]
    LengthPastCapacity {
        /// KV head.
        head: usize,
        /// Length asked for.
        len: usize,
        /// Slots per head.
        capacity: usize,
    },
    /// Host-given kept positions that are not strictly ascending or not below the length.
    #[error("head {head}: kept[{index}] = {position} breaks the strictly ascending order below length {len}")]
    KeptOrder {
        /// KV head.
        head: usize,
        /// Index in the kept list.
        index: usize,
        /// Offending position.
        position: u32,
        /// Length of the head.
        len: usize,
    },
    /// A size past what 32-bit shader indices address.
    #[error("{what} = {value} exceeds the 32-bit index range of the shaders")]
    TooLarge {
        /// Which quantity.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// A weight block whose f16 scale or offset (or, for F16/BF16, a value) is infinite or NaN.
    #[error("{rows} rows per invocation: the projection kernel takes {allowed:?}")]
    RowsPerInvocation { rows: u32, allowed: &'static [u32] },
    #[error("{what} needs a matrix in one block format; this one stacks several")]
    MixedFormats { what: &'static str },
    #[error("weight block {block} (row {row}) has a NaN or infinite scale or value")]
    NonFiniteBlock {
        /// Block index, row-major.
        block: usize,
        /// Matrix row holding it.
        row: usize,
    },
    /// A row index past the rows of a matrix.
    #[error("{what} {index} is past the {rows} rows")]
    RowOutOfRange {
        /// Which index.
        what: &'static str,
        /// The index.
        index: usize,
        /// Rows of the matrix.
        rows: usize,
    },
    /// A shader failed to parse, validate or translate (see [`crate::shader::check_all`]).
    #[error("shader {kernel}: {stage}: {message}")]
    Shader {
        /// Family and entry point.
        kernel: String,
        /// parse, validate, spirv, msl, hlsl or glsl.
        stage: &'static str,
        /// The compiler's message.
        message: String,
    },
}

/// Result of a kernel call.
pub type Result<T> = std::result::Result<T, KernelError>;
