//! Knorm — Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
//! Compression", EMNLP 2024 (arXiv:2406.11430).
//!
//! `s_j = −‖k_j‖₂` per KV head: keys with a *small* norm draw attention and are kept.
//! No window, no protected positions (as kvpress's `KnormPress`).

use crate::error::Result;
use crate::scorer::Scorer;
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// Negative key norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Knorm;

impl Scorer for Knorm {
    fn name(&self) -> &'static str {
        "knorm"
    }

    fn needs(&self) -> Needs {
        Needs { keys: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect::NONE
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let (kv, keys) = input.keys("knorm")?;
        let mut out = Scores::zeros(kv.kv_heads, kv.len);
        for h in 0..kv.kv_heads {
            for j in 0..kv.len {
                let norm = kv.row(keys, h, j).iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
                out.row_mut(h)[j] = -norm as f32;
            }
        }
        Ok(out)
    }
}
