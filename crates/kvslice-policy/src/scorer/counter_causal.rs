//! Counter-causal scoring: how much the *earlier* tokens would attend to a token if they could
//! look forward.
//!
//! A model pass over the cached K/V with the counter-causal mask (query `i` sees keys `j ≥ i`)
//! gives `c_ij = softmax_{j ≥ i}(⟨q_i, k_j⟩/√d)`; the score of key `j` is the mean over the
//! `j + 1` queries that see it, `s_j = Σ_{i ≤ j} c_ij / (j + 1)`, averaged over each GQA group.
//! Tokens that summarise or answer the earlier context score high, which causal attention cannot
//! tell (it only sees backwards). The first `sinks` and the last `window` tokens are kept.
//!
//! The runtime produces the column sums through [`CounterCausalPass`] (one extra attention pass
//! per layer, or — the fast variant — on the last layer only, its scores shared by all layers:
//! [`CounterCausal::last_layer_only`]). [`crate::reference::counter_causal_sums`] is the CPU
//! definition of that pass.

use crate::error::Result;
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{GroupReduce, Needs, ScoreInput, Scores, reduce_groups};

/// The pass the runtime runs to fill [`crate::WindowStats::counter_causal`].
pub trait CounterCausalPass {
    /// Attention of layer `layer` under the counter-causal mask over its cached K/V, queries
    /// from the same positions; returns the column sums `[H, n]`.
    fn column_sums(&mut self, layer: usize) -> Result<Vec<f32>>;
}

/// Counter-causal attention received, per querying token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterCausal {
    sinks: usize,
    window: usize,
    last_layer_only: bool,
}

impl Default for CounterCausal {
    fn default() -> Self {
        CounterCausal { sinks: 4, window: 32, last_layer_only: false }
    }
}

impl CounterCausal {
    /// Explicit protection and pass placement.
    pub fn new(sinks: usize, window: usize, last_layer_only: bool) -> Self {
        CounterCausal { sinks, window, last_layer_only }
    }

    /// The fast variant: one pass on the last layer, its scores used for every layer.
    pub fn last_layer_only(&self) -> bool {
        self.last_layer_only
    }

    /// The layers whose pass the runtime must run for a model of `layers` layers.
    pub fn layers_to_run(&self, layers: usize) -> Vec<usize> {
        if self.last_layer_only { layers.checked_sub(1).into_iter().collect() } else { (0..layers).collect() }
    }
}

impl Scorer for CounterCausal {
    fn name(&self) -> &'static str {
        "counter-causal"
    }

    fn counter_causal_layers(&self, layers: usize) -> Vec<usize> {
        self.layers_to_run(layers)
    }

    fn needs(&self) -> Needs {
        Needs { counter_causal: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: self.window }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        s.validate()?;
        let sums = input.optional("counter-causal", "window statistic `counter_causal`", &s.counter_causal)?;
        let n = s.len;
        let table: Vec<f32> =
            sums.iter().enumerate().map(|(i, &c)| (f64::from(c) / (i % n + 1) as f64) as f32).collect();
        reduce_groups(&table, s.heads, s.kv_heads, n, GroupReduce::Mean)
    }
}
