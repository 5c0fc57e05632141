//! Next-token choice: greedy, or temperature with nucleus (top-p) sampling from a seeded
//! generator (deterministic across platforms).

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1.0 keeps all).
    pub top_p: f32,
    state: u64,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::greedy()
    }
}

impl Sampler {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_p: 1.0, state: 0 }
    }

    /// Temperature sampling; `temperature` must be finite and ≥ 0, `top_p` in (0, 1].
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Result<Self, String> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(format!("temperature {temperature} must be a finite number ≥ 0"));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(format!("top-p {top_p} must be in (0, 1]"));
        }
        Ok(Self { temperature, top_p, state: seed })
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    fn next_f64(&mut self) -> f64 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks a token from `logits` (`[vocab]`). Greedy ties go to the lower id.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() || logits.len() <= 1 {
            return argmax(logits);
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let t = self.temperature as f64;
        let mut probs: Vec<(u32, f64)> =
            logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l as f64 - max) / t).exp())).collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut kept = 0.0;
        let mut cut = probs.len();
        for (i, p) in probs.iter().enumerate() {
            kept += p.1 / total;
            if kept >= self.top_p as f64 {
                cut = i + 1;
                break;
            }
        }
        probs.truncate(cut);
        let mass: f64 = probs.iter().map(|p| p.1).sum();
        let mut r = self.next_f64() * mass;
        for &(id, p) in &probs {
            if r < p {
                return id;
            }
            r -= p;
        }
        probs.last().map(|p| p.0).unwrap_or(0)
    }
}

/// Index of the largest value; the lowest index among equals; NaN never wins.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_the_lower_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // softmax of [10, 9, 0, 0] at T=1: ~[0.731, 0.269, 3e-5, 3e-5]; top-p 0.5 keeps only id 0.
        let mut s = Sampler::new(1.0, 0.5, 7).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[10.0, 9.0, 0.0, 0.0]), 0);
        }
        // top-p 0.9 keeps ids 0 and 1, never 2 or 3; both appear over many draws.
        let mut s = Sampler::new(1.0, 0.9, 7).unwrap();
        let draws: Vec<u32> = (0..400).map(|_| s.sample(&[10.0, 9.0, 0.0, 0.0])).collect();
        assert!(draws.iter().all(|&d| d < 2));
        let ones = draws.iter().filter(|&&d| d == 1).count() as f64 / 400.0;
        assert!((ones - 0.269).abs() < 0.08, "{ones}");
    }

    #[test]
    fn invalid_settings_are_rejected() {
        assert!(Sampler::new(-1.0, 1.0, 0).is_err());
        assert!(Sampler::new(1.0, 0.0, 0).is_err());
        assert!(Sampler::new(f32::NAN, 1.0, 0).is_err());
    }
}
