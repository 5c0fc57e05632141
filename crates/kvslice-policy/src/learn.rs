//! Training DistillCache's per-head networks ([`crate::scorer::distill`]) from traces.
//!
//! A *trace list* is one (text, layer, KV head): the features of the entries a cache holds after
//! a context, and each entry's future utility, the attention its KV head's query heads put on it
//! while the text goes on (summed over the following queries). The loss of a list is ListNet's
//! top-one cross-entropy (Cao et al., ICML 2007) between the utility's share `t_j = u_j / Σu`
//! and the softmax of the scores, `−Σ_j t_j ln softmax(s)_j`, here less the entropy of `t` so
//! that it reads as the divergence `L = KL(t ‖ softmax(s))` (0 when the scores put the mass where
//! the utility is; the same gradient), `∂L/∂s_j = p_j − t_j`: the
//! scores learn to put the mass where the future attention goes, which is what a budget of any
//! size keeps. The metric is the one an eviction is judged by: at a kept share `f`, the utility
//! of the `⌈f·n⌉` best-scored entries over that of the `⌈f·n⌉` most useful ones
//! ([`kept_utility`]).
//!
//! The gradients are written out (a two-layer network: `tanh` hidden units, a linear output) and
//! checked against finite differences in the tests; the optimiser is Adam (Kingma & Ba, 2015)
//! on the whole batch of a head's lists, with an L2 penalty. Initial weights are drawn from
//! SplitMix64 (seeded; Box–Muller), so a training run is reproducible bit for bit, whatever the
//! number of threads (each head is trained alone, in order, on its own lists).

use crate::error::{PolicyError, Result};
use crate::scorer::distill::{DistillWeights, HeadNet, MAX_HIDDEN, feature_count};
use crate::scorer::random::splitmix64;

/// One trace list.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceList {
    /// `[n, F]` features, not normalised.
    pub features: Vec<f32>,
    /// `[n]` future utility (non-negative, not all zero).
    pub utility: Vec<f32>,
}

impl TraceList {
    /// Entries.
    pub fn len(&self) -> usize {
        self.utility.len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.utility.is_empty()
    }

    /// The list without its first `sinks` entries (the positions DistillCache always keeps).
    pub fn without_sinks(&self, sinks: usize) -> TraceList {
        let n = self.len();
        let f = self.features.len().checked_div(n).unwrap_or(0);
        let k = sinks.min(n);
        TraceList { features: self.features[k * f..].to_vec(), utility: self.utility[k..].to_vec() }
    }
}

/// What a training run does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    pub hidden: usize,
    pub steps: usize,
    pub learning_rate: f32,
    /// L2 penalty on `w1` and `w2`.
    pub weight_decay: f32,
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig { hidden: 8, steps: 300, learning_rate: 0.01, weight_decay: 1e-4, seed: 0 }
    }
}

fn bad(name: &'static str, reason: impl Into<String>) -> PolicyError {
    PolicyError::InvalidParameter { method: "distillcache training", name, reason: reason.into() }
}

/// Checks a head's lists: the same feature count `f`, finite values, utilities non-negative
/// with a positive sum.
pub fn check_lists(lists: &[TraceList], f: usize) -> Result<()> {
    if lists.is_empty() {
        return Err(bad("lists", "no trace list to learn from"));
    }
    for (i, l) in lists.iter().enumerate() {
        if l.is_empty() || l.features.len() != l.len() * f {
            return Err(bad(
                "lists",
                format!("list {i}: {} features for {} entries of {f}", l.features.len(), l.len()),
            ));
        }
        if l.features.iter().any(|v| !v.is_finite()) || l.utility.iter().any(|&u| !u.is_finite() || u < 0.0) {
            return Err(bad("lists", format!("list {i}: a feature is not finite or a utility is negative")));
        }
        if l.utility.iter().map(|&u| f64::from(u)).sum::<f64>() <= 0.0 {
            return Err(bad("lists", format!("list {i}: no entry has any utility")));
        }
    }
    Ok(())
}

/// The mean ListNet loss (as the divergence `KL(t ‖ p)`) of `net` over `lists`.
pub fn loss(net: &HeadNet, lists: &[TraceList]) -> f64 {
    lists.iter().map(|l| list_loss(&net.score(&l.features), &l.utility).0).sum::<f64>() / lists.len().max(1) as f64
}

/// A list's loss and `∂L/∂s`.
fn list_loss(scores: &[f32], utility: &[f32]) -> (f64, Vec<f32>) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = scores.iter().map(|&s| f64::from(s - max).exp()).sum();
    let total: f64 = utility.iter().map(|&u| f64::from(u)).sum();
    let mut loss = 0f64;
    let grad = scores
        .iter()
        .zip(utility)
        .map(|(&s, &u)| {
            let log_p = f64::from(s - max) - z.ln();
            let t = f64::from(u) / total;
            if t > 0.0 {
                loss += t * (t.ln() - log_p);
            }
            (log_p.exp() - t) as f32
        })
        .collect();
    (loss, grad)
}

/// The loss over `lists` and its gradient with respect to `w1`, `b1` and `w2` (the L2 penalty
/// not included).
pub fn gradient(net: &HeadNet, lists: &[TraceList]) -> (f64, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (f, hd) = (net.features(), net.hidden());
    let (mut gw1, mut gb1, mut gw2) = (vec![0f32; hd * f], vec![0f32; hd], vec![0f32; hd]);
    let mut total = 0f64;
    let scale = 1.0 / lists.len().max(1) as f32;
    let (mut xn, mut hidden) = (Vec::new(), vec![0f32; hd]);
    let mut acts = Vec::new();
    for l in lists {
        net.normalise(&l.features, &mut xn);
        acts.clear();
        let scores: Vec<f32> = xn
            .chunks_exact(f)
            .map(|row| {
                let s = net.score_row(row, &mut hidden);
                acts.extend_from_slice(&hidden);
                s
            })
            .collect();
        let (loss, ds) = list_loss(&scores, &l.utility);
        total += loss;
        for (j, &g) in ds.iter().enumerate() {
            let g = g * scale;
            let a = &acts[j * hd..(j + 1) * hd];
            let x = &xn[j * f..(j + 1) * f];
            for k in 0..hd {
                gw2[k] += g * a[k];
                let dz = g * net.w2[k] * (1.0 - a[k] * a[k]);
                gb1[k] += dz;
                for (w, &xi) in gw1[k * f..(k + 1) * f].iter_mut().zip(x) {
                    *w += dz * xi;
                }
            }
        }
    }
    (total * f64::from(scale), gw1, gb1, gw2)
}

/// A standard normal draw: number `i` of the Box–Muller pairs on SplitMix64 seeded with `seed`.
fn normal(seed: u64, i: u64) -> f32 {
    let u = |k: u64| ((splitmix64(seed, k) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (u1, u2) = (u(2 * i), u(2 * i + 1));
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// The normalisation of `lists`' features: means and inverse deviations (1 for a constant
/// feature), in f64.
fn normalisation(lists: &[TraceList], f: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut sum, mut sq, mut count) = (vec![0f64; f], vec![0f64; f], 0f64);
    for l in lists {
        for row in l.features.chunks_exact(f) {
            for (i, &v) in row.iter().enumerate() {
                sum[i] += f64::from(v);
                sq[i] += f64::from(v) * f64::from(v);
            }
            count += 1.0;
        }
    }
    let mean: Vec<f64> = sum.iter().map(|s| s / count).collect();
    let inv_std = sq
        .iter()
        .zip(&mean)
        .map(|(s, m)| {
            let var = (s / count - m * m).max(0.0);
            if var > 1e-12 { (1.0 / var.sqrt()) as f32 } else { 1.0 }
        })
        .collect();
    (mean.iter().map(|&m| m as f32).collect(), inv_std)
}

/// A head's network with seeded initial weights (`w1 ~ N(0, 1/F)`, `w2 ~ N(0, 1/hidden)`,
/// `b1 = 0`) and the normalisation of its lists.
pub fn init(lists: &[TraceList], f: usize, hidden: usize, seed: u64) -> HeadNet {
    let (mean, inv_std) = normalisation(lists, f);
    let s1 = 1.0 / (f as f32).sqrt();
    let s2 = 1.0 / (hidden as f32).sqrt();
    HeadNet {
        mean,
        inv_std,
        w1: (0..hidden * f).map(|i| normal(seed, i as u64) * s1).collect(),
        b1: vec![0.0; hidden],
        w2: (0..hidden).map(|i| normal(seed, (hidden * f + i) as u64) * s2).collect(),
    }
}

/// Trains one head's network on its lists; returns it and the loss after each step.
pub fn train_head(lists: &[TraceList], f: usize, config: &TrainConfig, seed: u64) -> Result<(HeadNet, Vec<f64>)> {
    check_lists(lists, f)?;
    if config.hidden == 0 || config.hidden > MAX_HIDDEN {
        return Err(bad("hidden", format!("{} hidden units: must be in 1..={MAX_HIDDEN}", config.hidden)));
    }
    let decay_ok = config.weight_decay.is_finite() && config.weight_decay >= 0.0;
    if !(config.learning_rate.is_finite() && config.learning_rate > 0.0 && decay_ok) {
        return Err(bad("learning_rate", "the learning rate must be positive and the weight decay non-negative"));
    }
    let mut net = init(lists, f, config.hidden, seed);
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
    let sizes = [net.w1.len(), net.b1.len(), net.w2.len()];
    let mut m: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut v = m.clone();
    let mut losses = Vec::with_capacity(config.steps);
    for step in 1..=config.steps {
        let (loss, gw1, gb1, gw2) = gradient(&net, lists);
        losses.push(loss);
        let (c1, c2) = (1.0 - b1.powi(step as i32), 1.0 - b2.powi(step as i32));
        let params: [(&mut Vec<f32>, Vec<f32>, bool); 3] =
            [(&mut net.w1, gw1, true), (&mut net.b1, gb1, false), (&mut net.w2, gw2, true)];
        for (i, (p, g, decay)) in params.into_iter().enumerate() {
            for (j, (w, mut gj)) in p.iter_mut().zip(g).enumerate() {
                if decay {
                    gj += config.weight_decay * *w;
                }
                m[i][j] = b1 * m[i][j] + (1.0 - b1) * gj;
                v[i][j] = b2 * v[i][j] + (1.0 - b2) * gj * gj;
                *w -= config.learning_rate * (m[i][j] / c1) / ((v[i][j] / c2).sqrt() + eps);
            }
        }
    }
    Ok((net, losses))
}

/// Trains every head: `lists[l][h]` are the lists of KV head `h` of layer `l`; heads are trained
/// on up to `threads` threads (the result does not depend on it). Head `i = l·H_kv + h` draws
/// its initial weights with seed `config.seed + i`.
pub fn train(
    lists: &[Vec<Vec<TraceList>>],
    head_dim: usize,
    config: &TrainConfig,
    threads: usize,
) -> Result<DistillWeights> {
    let layers = lists.len();
    let kv_heads = lists.first().map_or(0, Vec::len);
    if layers == 0 || kv_heads == 0 || lists.iter().any(|l| l.len() != kv_heads) {
        return Err(bad("lists", "every layer needs the same positive number of KV heads"));
    }
    let f = feature_count(head_dim);
    let jobs: Vec<&Vec<TraceList>> = lists.iter().flatten().collect();
    let mut results: Vec<Option<Result<HeadNet>>> = (0..jobs.len()).map(|_| None).collect();
    let threads = threads.clamp(1, jobs.len());
    let chunk = jobs.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (c, out) in results.chunks_mut(chunk).enumerate() {
            let jobs = &jobs;
            s.spawn(move || {
                for (k, slot) in out.iter_mut().enumerate() {
                    let i = c * chunk + k;
                    *slot = Some(train_head(jobs[i], f, config, config.seed.wrapping_add(i as u64)).map(|(n, _)| n));
                }
            });
        }
    });
    let heads = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|| Err(bad("threads", format!("head {i} was not trained")))))
        .collect::<Result<Vec<_>>>()?;
    let w = DistillWeights { layers, kv_heads, head_dim, hidden: config.hidden, heads };
    w.validate()?;
    Ok(w)
}

/// At a kept share `fraction` of the `n` entries: the utility of the `k = ⌈fraction·n⌉`
/// best-scored entries over the utility of the `k` most useful ones (1 is the oracle's ranking;
/// ties in the scores go to the earlier entry).
pub fn kept_utility(scores: &[f32], utility: &[f32], fraction: f64) -> f64 {
    let n = scores.len();
    let k = ((fraction * n as f64).ceil() as usize).clamp(1, n.max(1));
    let top = |key: &[f32]| -> f64 {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
        idx[..k.min(n)].iter().map(|&j| f64::from(utility[j])).sum()
    };
    let best = top(utility);
    if best > 0.0 { top(scores) / best } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lists over `d = 2` whose utility is known: the entry's value norm, squared.
    fn lists(count: usize, n: usize, seed: u64) -> Vec<TraceList> {
        let d = 2;
        (0..count)
            .map(|c| {
                let keys: Vec<f32> = (0..n * d).map(|i| normal(seed + c as u64, i as u64)).collect();
                let values: Vec<f32> = (0..n * d).map(|i| normal(seed + 100 + c as u64, i as u64)).collect();
                let kv =
                    crate::stats::KvView { kv_heads: 1, len: n, head_dim: d, keys: Some(&keys), values: Some(&values) };
                let features = crate::scorer::distill::head_features(&kv, &keys, &values, 0);
                let utility = values.chunks_exact(d).map(|v| v[0] * v[0] + v[1] * v[1]).collect();
                TraceList { features, utility }
            })
            .collect()
    }

    #[test]
    fn the_gradient_is_the_loss_s_derivative() {
        let f = feature_count(2);
        let l = lists(3, 20, 7);
        let mut net = init(&l, f, 4, 3);
        net.b1 = vec![0.1, -0.2, 0.3, 0.05];
        let (_, gw1, gb1, gw2) = gradient(&net, &l);
        let h = 1e-3f32;
        let numeric = |net: &HeadNet, set: &dyn Fn(&mut HeadNet, f32)| {
            let (mut a, mut b) = (net.clone(), net.clone());
            set(&mut a, h);
            set(&mut b, -h);
            ((loss(&a, &l) - loss(&b, &l)) / (2.0 * f64::from(h))) as f32
        };
        for i in [0usize, 5, 17, 4 * f - 1] {
            let g = numeric(&net, &|n: &mut HeadNet, e| n.w1[i] += e);
            assert!((g - gw1[i]).abs() < 2e-3 + 0.02 * g.abs(), "w1[{i}]: {g} against {}", gw1[i]);
        }
        for k in 0..4 {
            let g = numeric(&net, &|n: &mut HeadNet, e| n.b1[k] += e);
            assert!((g - gb1[k]).abs() < 2e-3 + 0.02 * g.abs(), "b1[{k}]: {g} against {}", gb1[k]);
            let g = numeric(&net, &|n: &mut HeadNet, e| n.w2[k] += e);
            assert!((g - gw2[k]).abs() < 2e-3 + 0.02 * g.abs(), "w2[{k}]: {g} against {}", gw2[k]);
        }
    }

    #[test]
    fn training_learns_a_known_utility_and_lowers_held_back_loss() {
        let f = feature_count(2);
        let (train_lists, held) = (lists(12, 64, 11), lists(4, 64, 51));
        let config = TrainConfig { hidden: 8, steps: 200, learning_rate: 0.03, ..TrainConfig::default() };
        let before = init(&train_lists, f, config.hidden, 5);
        let (net, losses) = train_head(&train_lists, f, &config, 5).unwrap();
        assert!(losses.last().unwrap() < &(losses[0] * 0.5), "the training loss falls: {losses:?}");
        let (l0, l1) = (loss(&before, &held), loss(&net, &held));
        assert!(l1 < l0 * 0.5, "held-back loss {l0} → {l1}");
        // the utility is the value's squared norm: at 10% and 25% kept, nearly all of it stays
        for fraction in [0.1, 0.25] {
            let mean: f64 =
                held.iter().map(|l| kept_utility(&net.score(&l.features), &l.utility, fraction)).sum::<f64>() / 4.0;
            assert!(mean > 0.9, "kept utility at {fraction}: {mean}");
            let untrained: f64 =
                held.iter().map(|l| kept_utility(&before.score(&l.features), &l.utility, fraction)).sum::<f64>() / 4.0;
            assert!(untrained < mean, "{untrained} untrained against {mean}");
        }
    }

    #[test]
    fn training_is_reproducible_and_independent_of_threads() {
        let l = lists(3, 16, 1);
        let heads = vec![vec![l.clone(), lists(3, 16, 2)], vec![lists(3, 16, 3), l]];
        let config = TrainConfig { steps: 20, ..TrainConfig::default() };
        let one = train(&heads, 2, &config, 1).unwrap();
        let three = train(&heads, 2, &config, 3).unwrap();
        assert_eq!(one, three);
        assert_ne!(one.head(0, 0), one.head(1, 1), "heads draw their own initial weights");
    }

    #[test]
    fn leaving_the_sinks_out() {
        let l = TraceList { features: (0..12).map(|i| i as f32).collect(), utility: vec![9.0, 1.0, 2.0, 3.0] };
        let w = l.without_sinks(1);
        assert_eq!((w.features, w.utility), ((3..12).map(|i| i as f32).collect(), vec![1.0, 2.0, 3.0]));
        assert!(l.without_sinks(9).is_empty());
    }

    #[test]
    fn kept_utility_by_hand() {
        let u = [4.0, 1.0, 0.0, 3.0];
        assert_eq!(kept_utility(&[1.0, 2.0, 3.0, 4.0], &u, 0.5), 3.0 / 7.0);
        assert_eq!(kept_utility(&[9.0, 0.0, 0.0, 8.0], &u, 0.5), 1.0);
        // ⌈0.1·4⌉ = 1 entry: the second-best scored is not kept
        assert_eq!(kept_utility(&[0.0, 5.0, 0.0, 4.0], &u, 0.1), 1.0 / 4.0);
    }

    #[test]
    fn bad_lists_and_settings_are_errors() {
        let f = feature_count(2);
        let good = lists(1, 4, 0);
        let config = TrainConfig::default();
        assert!(train_head(&[], f, &config, 0).is_err());
        let mut negative = good.clone();
        negative[0].utility[0] = -1.0;
        assert!(train_head(&negative, f, &config, 0).is_err());
        let mut zero = good.clone();
        zero[0].utility.iter_mut().for_each(|u| *u = 0.0);
        assert!(train_head(&zero, f, &config, 0).is_err());
        let mut short = good.clone();
        short[0].features.pop();
        assert!(train_head(&short, f, &config, 0).is_err());
        assert!(train_head(&good, f, &TrainConfig { hidden: 0, ..config }, 0).is_err());
        assert!(train_head(&good, f, &TrainConfig { learning_rate: f32::NAN, ..config }, 0).is_err());
        assert!(train(&[vec![good.clone()], vec![]], 2, &config, 1).is_err());
    }
}
