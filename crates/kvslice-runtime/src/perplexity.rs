//! Perplexity under compression (StreamingLLM's PG19 setting): the log-likelihood of a long
//! text decoded token by token, every token predicted from the cache the policy has left.
//!
//! The first `prefill` tokens are one forward pass over the full cache (their predictions do
//! not depend on the policy while the cache holds all of them); the cache is then compressed by
//! the policy, and every later token is fed alone, through the policy's decode-time rule
//! (StreamingLLM, H2O, TOVA, ... keep the cache at the budget; policies without one grow it, or
//! recompress with `every=N`).

use kvslice_model::Llama;

use crate::error::{Result, RuntimeError};
use crate::evict::Compression;
use crate::session::Session;

/// Negative log-likelihood of every predicted token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Perplexity {
    /// `nll[i]`: −ln p(token i+1 | what the cache kept of tokens 0..=i), in nats.
    pub nll: Vec<f64>,
    /// KV entries the cache held at the end (layers × KV heads × tokens per head).
    pub kept_entries: usize,
}

impl Perplexity {
    /// exp(mean NLL) over `range` of the predictions (all of them for `..`).
    pub fn ppl(&self, range: impl std::ops::RangeBounds<usize>) -> f64 {
        use std::ops::Bound::*;
        let start = match range.start_bound() {
            Included(&s) => s,
            Excluded(&s) => s + 1,
            Unbounded => 0,
        };
        let end = match range.end_bound() {
            Included(&e) => e + 1,
            Excluded(&e) => e,
            Unbounded => self.nll.len(),
        }
        .min(self.nll.len());
        let part = &self.nll[start.min(end)..end];
        (part.iter().sum::<f64>() / part.len().max(1) as f64).exp()
    }
}

/// −ln softmax(logits)[target], in f64.
pub fn nll(logits: &[f32], target: u32) -> Result<f64> {
    let x = *logits
        .get(target as usize)
        .ok_or_else(|| RuntimeError::Options(format!("token {target} is outside the vocabulary")))?;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    if !max.is_finite() {
        return Err(RuntimeError::NonFiniteLogits(format!("their maximum is {max}")));
    }
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    Ok(-(x as f64 - max - sum.ln()))
}

/// The NLL of `ids[1..]` under `compression` (the full cache when `None`), with the first
/// `prefill` tokens fed in one pass. `progress(done, total)` after every token.
pub async fn perplexity(
    model: &Llama,
    ids: &[u32],
    compression: Option<&Compression>,
    prefill: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Perplexity> {
    if ids.len() < 2 {
        return Err(RuntimeError::Options("perplexity needs at least two tokens".into()));
    }
    crate::session::fits_context(model, 0, ids.len(), 0)?;
    let first = prefill.clamp(1, ids.len() - 1);
    let mut out = Perplexity::default();
    // the prefill's predictions, over the full cache of its tokens
    let mut plain = Session::new(model, first)?;
    let rows: Vec<usize> = (0..first).collect();
    for (row, logits) in plain.logits_at(&ids[..first], &rows).await?.iter().enumerate() {
        out.nll.push(nll(logits, ids[row + 1])?);
    }
    let rest = ids.len() - first;
    let mut session = match compression {
        None => plain,
        Some(c) => {
            drop(plain);
            let request = c.request(model.config.num_layers);
            let prefilled = Session::prefill_for(model, &ids[..first], &request).await?;
            Session::resume(model, &prefilled, Some(c), rest).await?.0
        }
    };
    // a cache that grows (no decode-time rule) gets room for the whole text once, not a copy
    // into larger storage as it fills
    if session.eviction().is_none() {
        session.reserve(rest)?;
    }
    progress(first, ids.len() - 1);
    for i in first..ids.len() - 1 {
        let logits = session.next_logits(&ids[i..=i]).await?;
        out.nll.push(nll(&logits, ids[i + 1])?);
        progress(i + 1, ids.len() - 1);
    }
    out.kept_entries = session.cache().occupied_slots();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{prompt, tiny};

    #[test]
    fn nll_is_minus_the_log_softmax() {
        // logits (0, ln 2, ln 3): softmax (1/6, 2/6, 3/6)
        let logits = [0.0, 2f32.ln(), 3f32.ln()];
        assert!((nll(&logits, 0).unwrap() - 6f64.ln()).abs() < 1e-6);
        assert!((nll(&logits, 2).unwrap() - 2f64.ln()).abs() < 1e-6);
        assert!(nll(&logits, 3).is_err());
        assert!(matches!(nll(&[f32::NAN; 3], 0), Err(RuntimeError::NonFiniteLogits(_))));
        let p = Perplexity { nll: vec![1.0, 3.0, 5.0], kept_entries: 0 };
        assert!((p.ppl(..) - 3f64.exp()).abs() < 1e-9);
        assert!((p.ppl(1..) - 4f64.exp()).abs() < 1e-9);
    }

    #[test]
    fn token_by_token_matches_one_pass_and_a_small_cache_changes_it() {
        let model = tiny();
        let ids = prompt(60);
        // the reference: one forward pass over the whole text, every row's logits
        let mut once = Session::new(&model, ids.len()).unwrap();
        let rows: Vec<usize> = (0..ids.len() - 1).collect();
        let all = pollster::block_on(once.logits_at(&ids[..ids.len() - 1], &rows)).unwrap();
        let expected: Vec<f64> = all.iter().enumerate().map(|(i, l)| nll(l, ids[i + 1]).unwrap()).collect();
        let full = pollster::block_on(perplexity(&model, &ids, None, 8, |_, _| {})).unwrap();
        assert_eq!(full.nll.len(), 59);
        for (i, (a, b)) in full.nll.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() < 1e-4, "token {i}: {a} vs {b}");
        }
        // a budget above the text keeps everything: the same predictions
        let info = Compression::model_info(&model);
        let roomy = Compression::new("streaming-llm", "128", &info).unwrap();
        let kept = pollster::block_on(perplexity(&model, &ids, Some(&roomy), 8, |_, _| {})).unwrap();
        assert!(kept.nll.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-4));
        // 8 entries per head: the first 8 predictions are the prefill's, later ones differ
        let small = Compression::new("streaming-llm", "8", &info).unwrap();
        let mut calls = 0;
        let s = pollster::block_on(perplexity(&model, &ids, Some(&small), 8, |_, _| calls += 1)).unwrap();
        assert_eq!(calls, 1 + 51);
        assert!(s.nll[..8].iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-4));
        assert!(s.nll[9..].iter().zip(&expected[9..]).any(|(a, b)| (a - b).abs() > 1e-3));
        assert_eq!(s.kept_entries, 3 * 2 * 8);
        assert!(s.ppl(..).is_finite());
    }
}
