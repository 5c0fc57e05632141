//! StreamingLLM — Xiao et al., "Efficient Streaming Language Models with Attention Sinks",
//! ICLR 2024 (arXiv:2309.17453).
//!
//! Keep the first `sinks` tokens and the most recent ones: `s_j = j` (recency), with the sinks
//! protected. Default `sinks = 4` (paper and kvpress).

use crate::error::Result;
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// Attention sinks plus a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamingLlm {
    sinks: usize,
}

impl Default for StreamingLlm {
    fn default() -> Self {
        StreamingLlm { sinks: 4 }
    }
}

impl StreamingLlm {
    /// Keeps `sinks` initial tokens (0 allowed: a pure sliding window).
    pub fn new(sinks: usize) -> Self {
        StreamingLlm { sinks }
    }
}

impl Scorer for StreamingLlm {
    fn name(&self) -> &'static str {
        "streaming-llm"
    }

    fn needs(&self) -> Needs {
        Needs::default()
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: self.sinks, recent: 0 }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = input.stats;
        let mut out = Scores::zeros(s.kv_heads.max(1), s.len);
        for h in 0..out.kv_heads {
            for (j, v) in out.row_mut(h).iter_mut().enumerate() {
                *v = j as f32;
            }
        }
        Ok(out)
    }
}
