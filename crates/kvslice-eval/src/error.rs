//! One error type for the crate.

use thiserror::Error;

/// Everything that can go wrong while reading cases, fetching the corpus, generating, reporting
/// or plotting.
#[derive(Debug, Error)]
pub enum EvalError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cases file, line {line}: {reason}")]
    CaseLine { line: usize, reason: String },
    #[error("cases file, line {line}: duplicate id {id:?} (first on line {first_line})")]
    DuplicateId { line: usize, id: String, first_line: usize },
    #[error("cases file has no cases")]
    NoCases,
    #[error("`{command}` failed: {reason}")]
    Command { command: String, reason: String },
    #[error("{what}: sha256 {got}, expected {expected}")]
    Checksum { what: String, expected: String, got: String },
    #[error("{archive}: {reason}")]
    Archive { archive: String, reason: String },
    #[error("{archive}: no member {member}")]
    MissingMember { archive: String, member: String },
    #[error("SQLite database: {reason}")]
    Sqlite { reason: String },
    #[error("corpus: {reason}")]
    Corpus { reason: String },
    #[error("unknown case kind {name:?}; known: {known}")]
    UnknownKind { name: String, known: String },
    #[error("invalid case spec: {reason}")]
    Spec { reason: String },
    #[error("a {kind} prompt needs at least {needed} tokens without any haystack; asked for {tokens}")]
    TooFewTokens { kind: String, tokens: usize, needed: usize },
    #[error("the corpus has {verses} verses; a {tokens}-token haystack needs more")]
    CorpusTooSmall { verses: usize, tokens: usize },
    #[error("report: {reason}")]
    Report { reason: String },
    #[error("plot {path}: {reason}")]
    Plot { path: String, reason: String },
    #[error(
        "no TrueType font for plot text; tried {tried} (on Debian: apt-get install fonts-dejavu-core, or set KVSLICE_FONT)"
    )]
    NoFont { tried: String },
    #[error(transparent)]
    Format(#[from] kvslice_formats::FormatError),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Result with [`EvalError`].
pub type Result<T, E = EvalError> = std::result::Result<T, E>;

/// An I/O error with the path it concerns.
pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
    move |source| EvalError::Io { path: path.display().to_string(), source }
}

#[cfg(test)]
mod tests {
    /// Command-line parsers (clap) need errors that cross threads.
    #[test]
    fn errors_are_send_and_sync() {
        fn check<T: Send + Sync + std::error::Error + 'static>() {}
        check::<super::EvalError>();
    }
}
