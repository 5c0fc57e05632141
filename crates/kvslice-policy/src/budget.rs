//! Budgets: how many KV entries each layer keeps.
//!
//! One spec, three notations (CAKE's paper uses the first):
//! - `128L` — an *average* of 128 tokens per layer, a total of `128·L` that layer-adaptive
//!   allocators (CAKE, PyramidKV) may move between layers;
//! - `10%` — a share of the prompt, also an average per layer (`⌊n·p⌋` tokens, exact decimal
//!   arithmetic, up to six decimals);
//! - `2048` — a *flat* 2048 tokens in every layer; layer-adaptive allocators keep it flat across
//!   layers (heads inside a layer may still differ under Ada-KV).
//!
//! Budgets count every kept token, the protected sinks and recent window included.

use std::fmt;
use std::str::FromStr;

use crate::error::{PolicyError, Result};

/// A parsed budget spec; resolve it against a prompt with [`BudgetSpec::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetSpec {
    /// `NL`: N tokens per layer on average (total N·L).
    AveragePerLayer(usize),
    /// `P%`: the share of the prompt kept, in parts per million (`10%` = 100 000).
    Fraction { ppm: u32 },
    /// `N`: N tokens in every layer.
    Flat(usize),
}

/// A budget resolved for one prompt length and model depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedBudget {
    /// Tokens each layer keeps on average (never more than the prompt).
    pub per_layer: usize,
    /// Number of layers.
    pub layers: usize,
    /// `per_layer · layers`: what all layers keep together.
    pub total: usize,
    /// Whether an allocator may move tokens between layers.
    pub layer_adaptive: bool,
}

const PPM: u64 = 1_000_000;

fn spec_err(spec: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::BudgetSpec { spec: spec.to_string(), reason: reason.into() }
}

fn parse_count(spec: &str, digits: &str, what: &str) -> Result<usize> {
    if digits.is_empty() {
        return Err(spec_err(spec, format!("expected a number of {what}")));
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(spec_err(spec, format!("{digits:?} is not a whole number of {what}")));
    }
    let n: usize = digits.parse().map_err(|_| spec_err(spec, format!("{digits} {what} is too large")))?;
    if n == 0 {
        return Err(spec_err(spec, format!("zero {what} keeps nothing")));
    }
    Ok(n)
}

/// Parses a percentage such as `10`, `12.5`, `0.25` (the `%` already removed) into ppm.
fn parse_percent(spec: &str, body: &str) -> Result<u32> {
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(spec_err(spec, "expected a percentage before '%'"));
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(spec_err(spec, "a percentage is digits with at most one '.'"));
    }
    if frac.len() > 4 {
        return Err(spec_err(spec, "at most four decimals in a percentage"));
    }
    let int_v: u64 =
        if int.is_empty() { 0 } else { int.parse().map_err(|_| spec_err(spec, "percentage too large"))? };
    if int_v > 100 {
        return Err(spec_err(spec, "more than 100% of the prompt"));
    }
    let mut frac_v: u64 = 0;
    for (i, b) in frac.bytes().enumerate() {
        frac_v += u64::from(b - b'0') * 10u64.pow(3 - i as u32);
    }
    // percent → ppm: p% = p·10 000 ppm.
    let ppm = int_v * 10_000 + frac_v;
    if ppm == 0 {
        return Err(spec_err(spec, "0% keeps nothing"));
    }
    if ppm > PPM {
        return Err(spec_err(spec, "more than 100% of the prompt"));
    }
    Ok(ppm as u32)
}

impl FromStr for BudgetSpec {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if t.is_empty() {
            return Err(spec_err(s, "empty budget; use e.g. 128L, 10% or 2048"));
        }
        if t.starts_with('-') {
            return Err(spec_err(s, "a budget cannot be negative"));
        }
        if let Some(body) = t.strip_suffix('%') {
            return Ok(BudgetSpec::Fraction { ppm: parse_percent(s, body.trim())? });
        }
        if let Some(body) = t.strip_suffix('L').or_else(|| t.strip_suffix('l')) {
            return Ok(BudgetSpec::AveragePerLayer(parse_count(s, body.trim(), "tokens per layer")?));
        }
        Ok(BudgetSpec::Flat(parse_count(s, t, "tokens")?))
    }
}

impl fmt::Display for BudgetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BudgetSpec::AveragePerLayer(n) => write!(f, "{n}L"),
            BudgetSpec::Flat(n) => write!(f, "{n}"),
            BudgetSpec::Fraction { ppm } => {
                let int = ppm / 10_000;
                let frac = ppm % 10_000;
                if frac == 0 {
                    write!(f, "{int}%")
                } else {
                    let digits = format!("{frac:04}");
                    write!(f, "{int}.{}%", digits.trim_end_matches('0'))
                }
            }
        }
    }
}

impl BudgetSpec {
    /// Resolves the spec for a prompt of `len` tokens and a model of `layers` layers.
    ///
    /// A budget larger than the prompt keeps the whole prompt. `protected` is the number of
    /// tokens the policy always keeps per head (sinks + recent window, capped at `len`); a
    /// budget below it is an error.
    pub fn resolve(&self, len: usize, layers: usize, protected: usize) -> Result<ResolvedBudget> {
        if layers == 0 {
            return Err(PolicyError::InvalidParameter {
                method: "budget",
                name: "layers",
                reason: "must be at least 1".into(),
            });
        }
        let (want, layer_adaptive) = match *self {
            BudgetSpec::AveragePerLayer(n) => (n, true),
            BudgetSpec::Flat(n) => (n, false),
            BudgetSpec::Fraction { ppm } => {
                let kept = (len as u128 * u128::from(ppm) / u128::from(PPM)) as usize;
                (kept, true)
            }
        };
        let per_layer = want.min(len);
        let protected = protected.min(len);
        if per_layer == 0 && len > 0 {
            return Err(spec_err(&self.to_string(), format!("keeps no token of a {len}-token prompt")));
        }
        if per_layer < protected {
            return Err(PolicyError::BudgetBelowProtected { budget: per_layer, protected });
        }
        let total = per_layer.checked_mul(layers).ok_or_else(|| spec_err(&self.to_string(), "budget overflows"))?;
        Ok(ResolvedBudget { per_layer, layers, total, layer_adaptive })
    }
}

/// Size of the observation window (the last `w` prompt queries whose attention is observed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowSize(pub usize);

/// Number of attention-sink tokens at the start of the prompt that are always kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SinkCount(pub usize);

impl FromStr for WindowSize {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(WindowSize(parse_count(s, s.trim(), "window queries")?))
    }
}

impl FromStr for SinkCount {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if t == "0" {
            return Ok(SinkCount(0));
        }
        Ok(SinkCount(parse_count(s, t, "sink tokens")?))
    }
}
