//! The crate's one error type.

/// Everything that can go wrong in budgets, scorers, allocators and selection.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A budget, window or sink spec that does not parse or makes no sense.
    #[error("invalid budget spec {spec:?}: {reason}")]
    BudgetSpec { spec: String, reason: String },
    /// A budget that cannot hold the tokens that are always kept.
    #[error("budget of {budget} tokens is below the {protected} protected tokens (sinks + recent window)")]
    BudgetBelowProtected { budget: usize, protected: usize },
    /// Two sizes that must agree do not.
    #[error("shape mismatch for {what}: expected {expected}, got {got}")]
    ShapeMismatch { what: &'static str, expected: usize, got: usize },
    /// A method was called without an input it needs.
    #[error("{method} needs {input}, which was not provided")]
    MissingInput { method: &'static str, input: &'static str },
    /// A parameter outside its domain, caught at construction.
    #[error("{method}: parameter {name} {reason}")]
    InvalidParameter { method: &'static str, name: &'static str, reason: String },
    /// Query heads that do not split evenly into KV groups.
    #[error("{heads} query heads cannot be grouped onto {kv_heads} KV heads")]
    Grouping { heads: usize, kv_heads: usize },
    /// An observation window longer than the prompt or of the wrong size for the method.
    #[error("observation window of {window} does not fit {len} tokens ({reason})")]
    Window { window: usize, len: usize, reason: &'static str },
    /// A statistic that is NaN or infinite where a finite value is required.
    #[error("non-finite value in {what} at index {index}")]
    NonFinite { what: &'static str, index: usize },
    /// A policy name that is not in the registry.
    #[error("unknown policy {name:?}; known policies: {known}")]
    UnknownPolicy { name: String, known: String },
    /// An option the policy does not declare.
    #[error("unknown option {option:?} for {policy}; its options: {options}")]
    UnknownOption {
        /// The policy.
        policy: String,
        /// The option as given.
        option: String,
        /// Every option of the policy, `name=default (range)`, comma-separated.
        options: String,
    },
    /// An option that is malformed, given twice, or whose value does not parse or lies outside
    /// its range.
    #[error("invalid option {option:?} for {policy}: {reason}; its options: {options}")]
    InvalidOption {
        /// The policy.
        policy: String,
        /// The option as given (`key=value`, or the malformed text).
        option: String,
        /// What is wrong with it.
        reason: String,
        /// Every option of the policy, `name=default (range)`, comma-separated.
        options: String,
    },
}

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, PolicyError>;
