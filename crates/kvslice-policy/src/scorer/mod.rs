//! Scorers: one method per file. A scorer turns one layer's inputs into a score per
//! (KV head, position); the shared [`crate::select`] keeps the best ones under a budget.

use std::fmt::Debug;

use crate::error::{PolicyError, Result};
use crate::pool::Pooling;
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores, WindowStats, reduce_groups};

pub mod andpro;
pub mod block;
pub mod cake;
pub mod chunkkv;
pub mod compactor;
pub mod counter_causal;
pub mod critical;
pub mod cur;
pub mod distill;
pub mod expected_attention;
pub mod finch;
pub mod h2o;
pub mod inertia;
pub mod jacap;
pub mod keydiff;
pub mod knorm;
pub mod kvzip;
pub mod lagkv;
pub mod leverage;
pub mod non_causal;
pub mod random;
pub mod simlayer;
pub mod snapkv;
pub mod span;
pub mod streaming;
pub mod tova;
pub mod twin;

pub use andpro::AnDPro;
pub use block::Block;
pub use cake::CakeIndicator;
pub use chunkkv::ChunkKv;
pub use compactor::Compactor;
pub use counter_causal::{CounterCausal, CounterCausalPass};
pub use critical::CriticalKv;
pub use cur::{Cur, Leverage};
pub use distill::DistillCache;
pub use expected_attention::{ExpectedAttention, Rope};
pub use finch::Finch;
pub use h2o::H2o;
pub use inertia::{Inertia, Refresh, Temporal};
pub use jacap::Jacap;
pub use keydiff::KeyDiff;
pub use knorm::Knorm;
pub use kvzip::Kvzip;
pub use lagkv::LagKv;
pub use leverage::LeverageScore;
pub use non_causal::NonCausalAttn;
pub use random::Random;
pub use simlayer::{Laziness, SimLayer, SimLayerBudget};
pub use snapkv::SnapKv;
pub use span::Span;
pub use streaming::StreamingLlm;
pub use tova::Tova;
pub use twin::{TwinKv, TwinRepair};

/// A KV-cache importance score. Implementations validate their parameters at construction and
/// define `score` on the CPU; the GPU path must agree with it.
pub trait Scorer: Debug + Send + Sync {
    /// Short name (the registry's key for the bare scorer).
    fn name(&self) -> &'static str;
    /// The inputs `score` reads.
    fn needs(&self) -> Needs;
    /// The positions always kept when each KV head keeps `budget` tokens.
    fn protect(&self, budget: usize) -> Protect;
    /// Scores `[H_kv, n]`; higher is kept first. Scores at protected positions are not used.
    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores>;
    /// For scorers that need [`Needs::counter_causal`]: the layers whose counter-causal pass the
    /// runtime runs, of a model of `layers` layers; every layer by default. When this is one
    /// layer only, the runtime hands that layer's column sums to every layer.
    fn counter_causal_layers(&self, layers: usize) -> Vec<usize> {
        (0..layers).collect()
    }
    /// For decode-time policies that aggregate scores over decode steps (InertiaKV): the
    /// temporal rule. `None` (the default) for prefill-time scorers.
    fn temporal(&self) -> Option<Temporal> {
        None
    }
    /// Whether the kept keys are rotated to consecutive positions after the selection (Finch,
    /// kvpress's key rerotation): each head's kept keys then sit at the positions just before
    /// the next token's, which follows the longest head directly. `false` by default.
    fn rerotates_keys(&self) -> bool {
        false
    }
}

/// Checks the statistics and that they were computed over the window this scorer expects.
pub(crate) fn check_window(stats: &WindowStats, window: usize) -> Result<()> {
    stats.validate()?;
    if stats.window != window {
        return Err(PolicyError::Window {
            window,
            len: stats.len,
            reason: "statistics were computed over another window than the method's",
        });
    }
    Ok(())
}

/// The SnapKV-style pipeline shared by window-statistic scorers: per query head, pool the
/// `table` over the prefix `[0, n−w)` only, then reduce each GQA group to its KV head.
/// Window positions (always protected) score 0.
pub(crate) fn pooled_prefix(
    stats: &WindowStats,
    table: &[f32],
    pooling: Pooling,
    reduce: GroupReduce,
) -> Result<Scores> {
    let n = stats.len;
    let p = stats.prefix_len();
    let mut pooled = vec![0f32; stats.heads * n];
    for h in 0..stats.heads {
        let row = pooling.apply(&table[h * n..h * n + p]);
        pooled[h * n..h * n + p].copy_from_slice(&row);
    }
    reduce_groups(&pooled, stats.heads, stats.kv_heads, n, reduce)
}

pub(crate) fn param(method: &'static str, name: &'static str, reason: impl Into<String>) -> PolicyError {
    PolicyError::InvalidParameter { method, name, reason: reason.into() }
}
