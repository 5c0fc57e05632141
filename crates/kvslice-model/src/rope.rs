//! Rotary position embeddings, HF layout (`rotate_half`: the two halves of a head are the
//! real and imaginary parts).
//!
//! Frequencies follow HF transformers' arithmetic: `inv_freq` in f32, `inv_freq * position`
//! rounded to f32, then cos/sin. Matching their rounding keeps logits at long positions within
//! the golden tolerance.

use crate::config::{LlamaConfig, RopeScaling};

/// Per-pair inverse frequencies `[head_dim / 2]`, scaling applied.
pub fn inv_freq(config: &LlamaConfig) -> Vec<f32> {
    let dim = config.head_dim;
    let base = config.rope_theta;
    let plain: Vec<f32> = (0..dim / 2)
        .map(|i| {
            let exponent = ((2 * i) as f32 / dim as f32) as f64;
            (1.0 / base.powf(exponent)) as f32
        })
        .collect();
    match config.rope_scaling {
        RopeScaling::None => plain,
        RopeScaling::Linear { factor } => plain.iter().map(|&f| (f as f64 / factor) as f32).collect(),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let old = original_max_position_embeddings as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            plain
                .iter()
                .map(|&f| {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    } else {
                        scaled as f32
                    }
                })
                .collect()
        }
    }
}

/// Cos and sin tables for the given positions, each `[positions.len(), head_dim / 2]`
/// flattened row-major.
pub fn tables(inv_freq: &[f32], positions: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for &f in inv_freq {
            let angle = (f * p as f32) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Architecture;

    fn config(scaling: RopeScaling) -> LlamaConfig {
        LlamaConfig {
            architecture: Architecture::Llama,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 1,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            vocab_size: 10,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: scaling,
            max_position_embeddings: 128,
            tie_word_embeddings: false,
            attention_bias: false,
            attention_out_bias: false,
            mlp_bias: false,
            bos_token_id: None,
            eos_token_ids: vec![],
        }
    }

    #[test]
    fn plain_frequencies_are_powers_of_theta() {
        let f = inv_freq(&config(RopeScaling::None));
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        // theta^(-2/16) = 10000^(-0.125)
        assert!((f[1] as f64 - 10000f64.powf(-0.125)).abs() < 1e-7);
        assert!((f[7] as f64 - 10000f64.powf(-14.0 / 16.0)).abs() < 1e-9);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        // original context 64, low factor 1, high factor 4: wavelengths above 64 are divided
        // by the factor, those below 16 kept, in between interpolated.
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let plain = inv_freq(&config(RopeScaling::None));
        let scaled = inv_freq(&config(s));
        for (p, q) in plain.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f64::consts::PI / *p as f64;
            if wavelen < 16.0 {
                assert_eq!(p, q);
            } else if wavelen > 64.0 {
                assert!(((*p as f64 / 8.0) - *q as f64).abs() < 1e-9);
            } else {
                let smooth = (64.0 / wavelen - 1.0) / 3.0;
                let want = (1.0 - smooth) * *p as f64 / 8.0 + smooth * *p as f64;
                assert!((want - *q as f64).abs() < 1e-7, "{want} {q}");
            }
        }
    }

    #[test]
    fn tables_hold_cos_and_sin_of_position_times_frequency() {
        let (c, s) = tables(&[1.0, 0.5], &[0, 3]);
        assert_eq!(c, vec![1.0, 1.0, 3f64.cos() as f32, 1.5f64.cos() as f32]);
        assert_eq!(s, vec![0.0, 0.0, 3f64.sin() as f32, 1.5f64.sin() as f32]);
    }
}
