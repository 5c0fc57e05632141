//! What a policy does while decoding, once the prompt has been compressed.
//!
//! A policy declares a [`DecodeSpec`], independent of the budget; [`crate::Policy::decode_rule`]
//! resolves it at a per-layer budget into the [`DecodeRule`] the runtime runs (the protected
//! positions of some rules depend on the budget, as H2O's recent share does).

use crate::ladder::Ladder;
use crate::scorer::Temporal;

/// How the cache behaves while decoding, resolved at a per-layer budget.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeRule {
    /// Evict once after the prefill; the cache then grows by one entry per generated token.
    Grow,
    /// Fixed size: the oldest entry after the `sinks` first positions goes (StreamingLLM).
    Recent {
        /// Initial positions never evicted.
        sinks: usize,
    },
    /// Fixed size: the lowest accumulated attention goes, the `recent` newest positions kept
    /// (H2O).
    Accumulated {
        /// Newest positions never evicted.
        recent: usize,
    },
    /// Fixed size: the lowest attention of the newest query, averaged over the layer's heads,
    /// goes (TOVA).
    LastQuery,
    /// Fixed size: when full, the ladder compacts each layer again (LaCache's iterative
    /// compaction).
    Ladder(Ladder),
    /// Fixed size at each layer's own budget (CAKE's decoding phase): the lowest indicator
    /// `mean + gamma·variance` of an entry's attention over the last `window` decode queries
    /// goes.
    Indicator {
        /// Decode queries the indicator is computed over.
        window: usize,
        /// Weight of the variance.
        gamma: f32,
    },
    /// Fixed size: the lowest exponential moving average of the attention goes (InertiaKV).
    Inertia(Temporal),
    /// Fixed size: every `every` decode steps the policy's own scorer re-scores the whole cache
    /// and compresses it back to the budget (kvpress's `DecodingPress`); the cache grows in
    /// between.
    Recompress {
        /// Decode steps between two compressions (at least 1).
        every: usize,
    },
}

/// A policy's declared decode behaviour, independent of the budget.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeSpec {
    /// See [`DecodeRule::Grow`].
    Grow,
    /// See [`DecodeRule::Recent`]; the sinks are the policy's protected sinks.
    Recent,
    /// See [`DecodeRule::Accumulated`]; the recent window is the policy's protected one.
    Accumulated,
    /// See [`DecodeRule::LastQuery`].
    LastQuery,
    /// See [`DecodeRule::Indicator`]; the window is the policy's protected recent window (at
    /// least 2).
    Indicator {
        /// Weight of the variance.
        gamma: f32,
    },
    /// See [`DecodeRule::Inertia`].
    Inertia(Temporal),
    /// See [`DecodeRule::Recompress`].
    Recompress {
        /// Decode steps between two compressions (at least 1).
        every: usize,
    },
    /// See [`DecodeRule::Ladder`]: LaCache's ladder, which declares itself this way.
    Ladder(Ladder),
}
