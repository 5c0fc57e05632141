//! 1-D pooling over positions, with the semantics of `torch.nn.functional.avg_pool1d` /
//! `max_pool1d` at stride 1 and "same" padding `k/2` (what SnapKV, CAKE and kvpress use).

use crate::error::{PolicyError, Result};

/// Pooling of scores over neighbouring positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// No pooling.
    None,
    /// Average over an odd kernel; the zero padding counts in the divisor
    /// (`count_include_pad=True`), so `out_i = Σ_{|t−i| ≤ k/2, 0 ≤ t < n} x_t / k`.
    Avg(usize),
    /// Maximum over an odd kernel; padding never wins (`out_i = max_{|t−i| ≤ k/2, 0 ≤ t < n} x_t`).
    Max(usize),
}

impl Pooling {
    /// Checks that the kernel is odd and positive.
    pub fn validate(&self, method: &'static str) -> Result<()> {
        match *self {
            Pooling::None => Ok(()),
            Pooling::Avg(k) | Pooling::Max(k) if k == 0 || k % 2 == 0 => Err(PolicyError::InvalidParameter {
                method,
                name: "kernel_size",
                reason: format!("must be odd and positive, got {k}"),
            }),
            _ => Ok(()),
        }
    }

    /// Pools `x` into a new vector of the same length.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len();
        match *self {
            Pooling::None => x.to_vec(),
            Pooling::Avg(k) => {
                let p = k / 2;
                (0..n)
                    .map(|i| {
                        let lo = i.saturating_sub(p);
                        let hi = (i + p + 1).min(n);
                        (x[lo..hi].iter().map(|&v| f64::from(v)).sum::<f64>() / k as f64) as f32
                    })
                    .collect()
            }
            Pooling::Max(k) => {
                let p = k / 2;
                (0..n)
                    .map(|i| {
                        let lo = i.saturating_sub(p);
                        let hi = (i + p + 1).min(n);
                        x[lo..hi].iter().copied().fold(f32::NEG_INFINITY, f32::max)
                    })
                    .collect()
            }
        }
    }
}
