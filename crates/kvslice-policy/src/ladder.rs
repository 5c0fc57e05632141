//! LaCache's ladder — Shi et al., "LaCache: Ladder-Shaped KV Caching for Efficient Long-Context
//! Modeling of Large Language Models", ICML 2025 (arXiv:2507.14204). Positions only: no scores.
//!
//! Each layer keeps a different, overlapping slice of the old tokens, so that together the
//! layers cover more of the context than any one of them holds. With `L` layers, span `S` and
//! overlap `O` (reference defaults `S = 16`, `O = 0`, 4 sinks), old tokens are taken in *units*
//! of `U = 1 + ⌈(L − S)/(S − O)⌉` consecutive positions, of which every layer keeps
//! `A = min(⌈S/(S − O)⌉, U)`: layer `i` keeps offsets `i mod (U − A + 1) … + A − 1` of each
//! unit — a ladder whose rungs shift by one token per layer, each token held by about `S` layers.
//!
//! One compaction of a cache of `n` tokens to a budget `C`, with the ladder cursor at `c`
//! (initially the sinks): `⌈(n − C)/(U − A)⌉` units starting at `c` are laddered; everything
//! before `c` and after the last unit is kept; the cursor moves to the end of the laddered
//! tokens. When the units do not fit before the end of the cache, the part that fits is
//! laddered and the cursor starts over at the sinks, compacting the already-laddered tokens
//! again (iterative compaction; the reference code's "startover", here applied as a repeated
//! pass). When the ladder cannot shrink the cache (`U = A`, e.g. `L ≤ S`), the oldest non-sink
//! tokens are dropped, as StreamingLLM does.

use crate::error::Result;
use crate::scorer::param;

/// Ladder parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ladder {
    span: usize,
    overlap: usize,
    sinks: usize,
}

impl Default for Ladder {
    fn default() -> Self {
        Ladder { span: 16, overlap: 0, sinks: 4 }
    }
}

/// Result of one compaction: kept positions per layer (sorted) and the new cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LadderPlan {
    /// `[L]` kept positions of each layer (same count in every layer).
    pub kept: Vec<Vec<u32>>,
    /// The cursor for the next compaction (positions in the compacted cache).
    pub cursor: usize,
}

impl Ladder {
    /// A ladder with span `S ≥ 1`, overlap `O < S` and `sinks` kept tokens.
    pub fn new(span: usize, overlap: usize, sinks: usize) -> Result<Self> {
        if span == 0 {
            return Err(param("lacache", "span", "must be at least 1"));
        }
        if overlap >= span {
            return Err(param("lacache", "overlap", format!("must be smaller than the span {span}, got {overlap}")));
        }
        Ok(Ladder { span, overlap, sinks })
    }

    /// Tokens always kept at the start.
    pub fn sinks(&self) -> usize {
        self.sinks
    }

    /// `(U, A)`: unit length and tokens kept per unit for `layers` layers.
    pub fn unit(&self, layers: usize) -> (usize, usize) {
        let step = self.span - self.overlap;
        let u = if layers > self.span { 1 + (layers - self.span).div_ceil(step) } else { 1 };
        let a = self.span.div_ceil(step).min(u);
        (u, a)
    }

    /// Offsets of layer `layer` inside a unit.
    fn offsets(&self, layer: usize, u: usize, a: usize) -> std::ops::Range<usize> {
        let start = layer % (u - a + 1);
        start..start + a
    }

    /// Compacts a cache of `len` tokens to at most `budget` per layer, ladder cursor `cursor`.
    pub fn compact(&self, layers: usize, len: usize, budget: usize, cursor: usize) -> LadderPlan {
        let identity: Vec<Vec<u32>> = vec![(0..len as u32).collect(); layers];
        self.compact_from(identity, len, budget, cursor.max(self.sinks.min(len)))
    }

    fn compact_from(&self, current: Vec<Vec<u32>>, len: usize, budget: usize, cursor: usize) -> LadderPlan {
        let layers = current.len();
        if len <= budget {
            return LadderPlan { kept: current, cursor };
        }
        let (u, a) = self.unit(layers);
        let sinks = self.sinks.min(len);
        let excess = len - budget;
        if u == a {
            // No ladder possible: drop the oldest tokens after the sinks.
            let keep: Vec<usize> = (0..sinks).chain(sinks + excess.min(len - sinks)..len).collect();
            let kept = current.iter().map(|c| keep.iter().map(|&j| c[j]).collect()).collect();
            return LadderPlan { kept, cursor: sinks };
        }
        let r = u - a;
        let want = excess.div_ceil(r);
        let fit = (len.saturating_sub(cursor)) / u;
        let units = want.min(fit);
        if units == 0 {
            if cursor > sinks {
                return self.compact_from(current, len, budget, sinks);
            }
            let keep: Vec<usize> = (0..sinks).chain(sinks + excess.min(len - sinks)..len).collect();
            let kept = current.iter().map(|c| keep.iter().map(|&j| c[j]).collect()).collect();
            return LadderPlan { kept, cursor: sinks };
        }
        let end = cursor + units * u;
        let kept: Vec<Vec<u32>> = current
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let offs = self.offsets(i, u, a);
                let mut k: Vec<u32> = c[..cursor].to_vec();
                for unit in 0..units {
                    for o in offs.clone() {
                        k.push(c[cursor + unit * u + o]);
                    }
                }
                k.extend_from_slice(&c[end..len]);
                k
            })
            .collect();
        let new_len = len - units * r;
        let new_cursor = cursor + units * a;
        if units < want {
            // Start over at the sinks and ladder the laddered tokens again.
            return self.compact_from(kept, new_len, budget, sinks);
        }
        LadderPlan { kept, cursor: new_cursor }
    }
}
