//! KV-cache eviction policies: budgets, scorers, allocators and the shared selection.
//!
//! Pure Rust, no GPU. This crate is where each method is *defined*; the WGSL kernels and the
//! runtime are tested against these CPU definitions.
//!
//! Flow for one prompt (see [`Policy::plan`]):
//! 1. the kernels produce [`WindowStats`] per layer (and K/V, query moments, … as a scorer's
//!    [`Needs`] say);
//! 2. a [`Scorer`] turns them into [`Scores`] per KV head and position;
//! 3. an [`Allocator`] splits the resolved [`BudgetSpec`] over layers and heads;
//! 4. [`select_top_k`] keeps the best positions, protected sinks and recent window included.
//!
//! A [`registry()`] entry describes a whole policy: the steps above, its options on the command
//! line (`snapkv:window=32,kernel=7`, [`build_spec`], [`Entry::options`]) and what the cache
//! does while decoding ([`DecodeSpec`], resolved at a budget by [`Policy::decode_rule`]).

pub mod alloc;
pub mod budget;
pub mod decode;
pub mod error;
pub mod ladder;
pub mod learn;
pub mod options;
pub mod pool;
pub mod reference;
pub mod registry;
pub mod scorer;
pub mod select;
pub mod stats;

pub use alloc::{AdaKv, AdaMode, Allocation, Allocator, Cake, CakeCascade, LayerScores, PyramidKv, Uniform};
pub use budget::{BudgetSpec, ResolvedBudget, SinkCount, WindowSize};
pub use decode::{DecodeRule, DecodeSpec};
pub use error::{PolicyError, Result};
pub use ladder::{Ladder, LadderPlan};
pub use options::{OptionKind, OptionSpec, Options, PolicySpec};
pub use pool::Pooling;
pub use registry::{
    Entry, LayerInput, ModelInfo, Plan, Policy, build, build_spec, listing, listing_verbose, lookup, registry,
};
pub use scorer::{
    AnDPro, Block, CakeIndicator, ChunkKv, Compactor, CounterCausal, CounterCausalPass, CriticalKv, Cur,
    ExpectedAttention, Finch, H2o, Inertia, Jacap, KeyDiff, Knorm, Kvzip, LagKv, Laziness, Leverage, LeverageScore,
    NonCausalAttn, Random, Refresh, Rope, Scorer, SimLayer, SimLayerBudget, SnapKv, Span, StreamingLlm, Temporal, Tova,
    TwinKv, TwinRepair,
};
pub use select::{Protect, select_heads, select_top_k};
pub use stats::{
    GroupReduce, KvView, Needs, NonCausalSpec, NonCausalTable, QueryMoments, ScoreInput, Scores, WindowStats,
    reduce_groups,
};
