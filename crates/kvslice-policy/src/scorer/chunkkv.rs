//! ChunkKV — Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient
//! Long-Context LLM Inference", 2025 (arXiv:2502.00299); kvpress's `ChunkKVPress`.
//!
//! Wraps any scorer and keeps whole chunks of `c` consecutive tokens instead of single tokens,
//! so that kept context stays readable. As kvpress computes it:
//! 1. the inner scores `s_hj`, with the inner scorer's protected positions scored
//!    `max(s) + 1` (the largest unprotected score of the layer, over every head, plus one:
//!    kvpress's SnapKV pads its window with that value; they are otherwise ordinary tokens here);
//! 2. the prompt is cut into `⌊n/c⌋` chunks of `c` tokens and, when `c` does not divide `n`, a
//!    shorter last chunk; chunk `C` scores `S_C = mean_{j∈C} Σ_h s_hj`, the sum over KV heads
//!    averaged over the chunk's tokens (for full chunks this ranks as the sum);
//! 3. the best chunks are kept, the same for every KV head: each token of every head scores its
//!    chunk's `S_C`, and the shared selection, which breaks ties by the lower position, takes
//!    chunks whole, best first.
//!
//! A prompt shorter than one chunk is scored by the inner scorer alone, token by token (step 1),
//! as kvpress hands it to the inner press.
//!
//! Differences from kvpress: kvpress keeps `⌊m·(1 − ratio)⌋` chunks (at least one) of the `m`;
//! here the budget counts tokens, so a budget that is not a whole number of chunks also keeps the
//! first tokens of the next chunk. The two agree whenever the budget is the number of tokens of
//! the chunks kvpress keeps. Nothing is protected: the inner scorer's window only scores high.
//! Default chunk length 20 (kvpress).

use crate::error::Result;
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{Needs, ScoreInput, Scores};

/// Chunk-wise selection over another scorer's scores.
#[derive(Debug)]
pub struct ChunkKv {
    inner: Box<dyn Scorer>,
    chunk: usize,
}

impl ChunkKv {
    /// Wraps `inner` with chunks of `chunk` tokens (1 to 4096; 1 ranks tokens by their score
    /// summed over the KV heads).
    pub fn new(inner: Box<dyn Scorer>, chunk: usize) -> Result<Self> {
        if !(1..=4096).contains(&chunk) {
            return Err(param("chunkkv", "chunk", format!("must lie in 1..=4096 tokens, got {chunk}")));
        }
        Ok(ChunkKv { inner, chunk })
    }

    /// The chunk length.
    pub fn chunk(&self) -> usize {
        self.chunk
    }
}

/// The inner scores with its protected positions at the largest unprotected score plus one.
fn padded(inner: &dyn Scorer, input: &ScoreInput<'_>) -> Result<Scores> {
    let mut s = inner.score(input)?;
    let n = s.len;
    let protect = inner.protect(input.budget);
    let free = |j: &usize| !protect.contains(*j, n);
    let max = (0..s.kv_heads)
        .flat_map(|h| (0..n).filter(free).map(move |j| (h, j)))
        .map(|(h, j)| s.row(h)[j])
        .fold(f32::NEG_INFINITY, f32::max);
    let pad = if max.is_finite() { max + 1.0 } else { 1.0 };
    for h in 0..s.kv_heads {
        let row = s.row_mut(h);
        for (j, x) in row.iter_mut().enumerate() {
            if protect.contains(j, n) {
                *x = pad;
            }
        }
    }
    Ok(s)
}

impl Scorer for ChunkKv {
    fn name(&self) -> &'static str {
        "chunkkv"
    }

    fn needs(&self) -> Needs {
        self.inner.needs()
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect::NONE
    }

    fn counter_causal_layers(&self, layers: usize) -> Vec<usize> {
        self.inner.counter_causal_layers(layers)
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let s = padded(self.inner.as_ref(), input)?;
        let (heads, n, c) = (s.kv_heads, s.len, self.chunk);
        if n < c {
            return Ok(s);
        }
        let summed: Vec<f64> = (0..n).map(|j| (0..heads).map(|h| f64::from(s.row(h)[j])).sum()).collect();
        let mut chunked = vec![0f32; n];
        for (dst, src) in chunked.chunks_mut(c).zip(summed.chunks(c)) {
            let mean = src.iter().sum::<f64>() / src.len() as f64;
            dst.fill(mean as f32);
        }
        let mut out = Scores::zeros(heads, n);
        for h in 0..heads {
            out.row_mut(h).copy_from_slice(&chunked);
        }
        Ok(out)
    }
}
