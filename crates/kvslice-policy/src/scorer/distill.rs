//! DistillCache — a learned, distribution-aware eviction score: a small network per (layer, KV
//! head) that reads one cached entry's key and value and says how much attention the entry will
//! receive later. The design follows "Learning to Evict from Key-Value Cache" (KV Policy,
//! arXiv:2602.10238): lightweight per-head agents trained offline on pre-computed generation
//! traces from keys and values alone, their ranking judged by the future utility of what is kept
//! (the attention mass the entries receive while the text goes on). Training lives in
//! [`crate::learn`]; this file is the score the runtime computes.
//!
//! Features of entry `j` of KV head `h` in a cache of `n` entries (`F = d/2 + d + 6`):
//! - the `d/2` magnitudes `√(k_i² + k_{i+d/2}²)` of the key's RoPE pairs (`rotate_half` layout):
//!   the rotation by position leaves them unchanged, so a key's features do not depend on where
//!   it sits;
//! - the `d` components of the value (values are not rotated);
//! - six scalars: the relative position `j/(n−1)` (0 when `n = 1`), the recency
//!   `ln(n−j)/ln(n+1)`, the sink flag `[j < 4]`, the cosine of the key to the head's mean unit
//!   key (KeyDiff's anchor, 0 for a zero key), `ln(‖k_j‖/mean‖k‖)` and `ln(‖v_j‖/mean‖v‖)`
//!   (norms clamped at `1e−12`).
//!
//! The score is `s_j = Σ_k w2_k · tanh(b1_k + Σ_f W1_kf · (x_jf − μ_f) · σ⁻¹_f)` with the
//! feature means `μ` and inverse deviations `σ⁻¹` of the training traces stored beside the
//! weights. The first [`SINK_FLAG`] positions, the attention sinks, are always kept; what every
//! other entry is worth, the recent ones included, is learned.
//! In a cache already compacted (decode-time re-scoring, `every=N`), `j` is the entry's slot
//! rank among the kept entries, not its source position.
//!
//! Weights are a safetensors file (`--policy distillcache:weights=FILE`): tensors `mean`,
//! `inv_std` `[L, H_kv, F]`, `w1` `[L, H_kv, hidden, F]`, `b1` and `w2` `[L, H_kv, hidden]`, all
//! f32, and the metadata `format = kvslice-distillcache`, `version = 1`, `head_dim`. Every
//! shape, value and size is checked when the file is read.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{PolicyError, Result};
use crate::scorer::{Scorer, param};
use crate::select::Protect;
use crate::stats::{KvView, Needs, ScoreInput, Scores};

/// The scalar features after the key pairs and the value.
pub const SCALARS: usize = 6;
/// Positions flagged as sinks, and always kept: the attention sinks take most of the later
/// queries' weight whatever their content (StreamingLLM), so the networks learn to rank the
/// other entries (the training lists leave these out, [`crate::learn::TraceList::without_sinks`]).
pub const SINK_FLAG: usize = 4;
/// The `format` metadata of a weights file.
pub const FORMAT: &str = "kvslice-distillcache";
/// The `version` metadata of a weights file.
pub const VERSION: &str = "1";
/// Largest file accepted (the networks are small; a bigger file is not one of them).
pub const MAX_FILE_BYTES: usize = 64 << 20;
/// Largest hidden width accepted.
pub const MAX_HIDDEN: usize = 1024;
const NORM_EPS: f64 = 1e-12;

/// Features per entry for a head dimension `d`.
pub fn feature_count(head_dim: usize) -> usize {
    head_dim / 2 + head_dim + SCALARS
}

/// `[n, F]` features of every entry of KV head `h`, row-major (see the module docs).
pub fn head_features(kv: &KvView<'_>, keys: &[f32], values: &[f32], h: usize) -> Vec<f32> {
    let (n, d) = (kv.len, kv.head_dim);
    let half = d / 2;
    let f = feature_count(d);
    let mut out = vec![0f32; n * f];
    if n == 0 {
        return out;
    }
    let norm = |x: &[f32]| x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
    let knorms: Vec<f64> = (0..n).map(|j| norm(kv.row(keys, h, j))).collect();
    let vnorms: Vec<f64> = (0..n).map(|j| norm(kv.row(values, h, j))).collect();
    let kmean = (knorms.iter().sum::<f64>() / n as f64).max(NORM_EPS);
    let vmean = (vnorms.iter().sum::<f64>() / n as f64).max(NORM_EPS);
    let mut anchor = vec![0f64; d];
    for (j, &nj) in knorms.iter().enumerate() {
        let scale = nj.max(NORM_EPS);
        for (a, &x) in anchor.iter_mut().zip(kv.row(keys, h, j)) {
            *a += f64::from(x) / scale;
        }
    }
    let anorm = anchor.iter().map(|a| a * a).sum::<f64>().sqrt();
    let ln_end = ((n + 1) as f64).ln();
    for j in 0..n {
        let (k, v) = (kv.row(keys, h, j), kv.row(values, h, j));
        let row = &mut out[j * f..(j + 1) * f];
        for i in 0..half {
            row[i] = (f64::from(k[i]).powi(2) + f64::from(k[i + half]).powi(2)).sqrt() as f32;
        }
        row[half..half + d].copy_from_slice(v);
        let s = &mut row[half + d..];
        s[0] = if n > 1 { (j as f64 / (n - 1) as f64) as f32 } else { 0.0 };
        s[1] = (((n - j) as f64).ln() / ln_end) as f32;
        s[2] = if j < SINK_FLAG { 1.0 } else { 0.0 };
        let dot: f64 = k.iter().zip(&anchor).map(|(&x, a)| f64::from(x) * a).sum();
        let denom = knorms[j] * anorm;
        s[3] = if denom > NORM_EPS { (dot / denom) as f32 } else { 0.0 };
        s[4] = (knorms[j].max(NORM_EPS) / kmean).ln() as f32;
        s[5] = (vnorms[j].max(NORM_EPS) / vmean).ln() as f32;
    }
    out
}

/// One head's network and feature normalisation.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadNet {
    /// `[F]` feature means of the training traces.
    pub mean: Vec<f32>,
    /// `[F]` inverse feature deviations (1 where a feature does not vary).
    pub inv_std: Vec<f32>,
    /// `[hidden, F]`.
    pub w1: Vec<f32>,
    /// `[hidden]`.
    pub b1: Vec<f32>,
    /// `[hidden]`.
    pub w2: Vec<f32>,
}

impl HeadNet {
    /// Hidden units.
    pub fn hidden(&self) -> usize {
        self.b1.len()
    }

    /// Features per entry.
    pub fn features(&self) -> usize {
        self.mean.len()
    }

    /// Writes the normalised features of `x` (`[n, F]`) into `out`.
    pub fn normalise(&self, x: &[f32], out: &mut Vec<f32>) {
        let f = self.features();
        out.clear();
        out.extend(
            x.chunks_exact(f)
                .flat_map(|row| row.iter().zip(&self.mean).zip(&self.inv_std).map(|((&v, &m), &s)| (v - m) * s)),
        );
    }

    /// The score of one normalised feature row; `hidden` receives the tanh activations.
    pub fn score_row(&self, x: &[f32], hidden: &mut [f32]) -> f32 {
        let f = self.features();
        let mut s = 0f32;
        for (k, a) in hidden.iter_mut().enumerate() {
            let w = &self.w1[k * f..(k + 1) * f];
            let z = self.b1[k] + w.iter().zip(x).map(|(a, b)| a * b).sum::<f32>();
            *a = z.tanh();
            s += self.w2[k] * *a;
        }
        s
    }

    /// Scores of the entries with features `x` (`[n, F]`, not normalised).
    pub fn score(&self, x: &[f32]) -> Vec<f32> {
        let mut xn = Vec::new();
        self.normalise(x, &mut xn);
        let mut hidden = vec![0f32; self.hidden()];
        xn.chunks_exact(self.features()).map(|row| self.score_row(row, &mut hidden)).collect()
    }

    fn check(&self, f: usize, hidden: usize) -> std::result::Result<(), String> {
        let ok = self.mean.len() == f
            && self.inv_std.len() == f
            && self.w1.len() == hidden * f
            && self.b1.len() == hidden
            && self.w2.len() == hidden;
        if !ok {
            return Err("a head's tensors do not have the declared shapes".into());
        }
        let all = [&self.mean, &self.inv_std, &self.w1, &self.b1, &self.w2];
        if all.iter().any(|t| t.iter().any(|v| !v.is_finite())) {
            return Err("a weight is not finite".into());
        }
        Ok(())
    }
}

/// The networks of every (layer, KV head) of one model geometry.
#[derive(Debug, Clone, PartialEq)]
pub struct DistillWeights {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
    /// `[L · H_kv]`, layer-major.
    pub heads: Vec<HeadNet>,
}

fn bad(reason: impl Into<String>) -> PolicyError {
    param("distillcache", "weights", reason)
}

impl DistillWeights {
    /// The network of KV head `h` of layer `l`.
    pub fn head(&self, l: usize, h: usize) -> &HeadNet {
        &self.heads[l * self.kv_heads + h]
    }

    /// Checks the shapes and values.
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 || self.kv_heads == 0 || self.hidden == 0 || self.hidden > MAX_HIDDEN {
            return Err(bad(format!(
                "{} layers, {} KV heads and {} hidden units: each must be positive (hidden at most {MAX_HIDDEN})",
                self.layers, self.kv_heads, self.hidden
            )));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(bad(format!("head dimension {} must be even and positive", self.head_dim)));
        }
        if self.heads.len() != self.layers * self.kv_heads {
            return Err(bad(format!(
                "{} networks for {} layers × {} KV heads",
                self.heads.len(),
                self.layers,
                self.kv_heads
            )));
        }
        let f = feature_count(self.head_dim);
        for (i, h) in self.heads.iter().enumerate() {
            h.check(f, self.hidden)
                .map_err(|r| bad(format!("layer {}, KV head {}: {r}", i / self.kv_heads, i % self.kv_heads)))?;
        }
        Ok(())
    }

    /// The safetensors bytes of these weights.
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let f = feature_count(self.head_dim);
        let (l, kv, hd) = (self.layers, self.kv_heads, self.hidden);
        let gather = |pick: fn(&HeadNet) -> &Vec<f32>| -> Vec<u8> {
            self.heads.iter().flat_map(|h| pick(h).iter().flat_map(|v| v.to_le_bytes())).collect()
        };
        let tensors: Vec<(&str, Vec<usize>, Vec<u8>)> = vec![
            ("mean", vec![l, kv, f], gather(|h| &h.mean)),
            ("inv_std", vec![l, kv, f], gather(|h| &h.inv_std)),
            ("w1", vec![l, kv, hd, f], gather(|h| &h.w1)),
            ("b1", vec![l, kv, hd], gather(|h| &h.b1)),
            ("w2", vec![l, kv, hd], gather(|h| &h.w2)),
        ];
        let views = tensors
            .iter()
            .map(|(name, shape, data)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .map(|v| (name.to_string(), v))
                    .map_err(|e| bad(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta: HashMap<String, String> = [
            ("format".to_string(), FORMAT.to_string()),
            ("version".to_string(), VERSION.to_string()),
            ("head_dim".to_string(), self.head_dim.to_string()),
        ]
        .into();
        safetensors::serialize(views, Some(meta)).map_err(|e| bad(e.to_string()))
    }

    /// Reads weights written by [`DistillWeights::to_safetensors`]; anything else is an error.
    pub fn from_safetensors(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(bad(format!("{} bytes: larger than any DistillCache weights ({MAX_FILE_BYTES})", bytes.len())));
        }
        let (_, header) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("not safetensors: {e}")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        if meta.get("format").map(String::as_str) != Some(FORMAT)
            || meta.get("version").map(String::as_str) != Some(VERSION)
        {
            return Err(bad(format!("not DistillCache weights (format {FORMAT} version {VERSION} expected)")));
        }
        let head_dim: usize = meta
            .get("head_dim")
            .and_then(|d| d.parse().ok())
            .filter(|&d: &usize| d > 0 && d % 2 == 0 && d <= 4096)
            .ok_or_else(|| bad("the metadata's head_dim is missing or not an even number up to 4096"))?;
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(format!("not safetensors: {e}")))?;
        let f = feature_count(head_dim);
        let read = |name: &str, rank: usize| -> Result<(Vec<usize>, Vec<f32>)> {
            let t = st.tensor(name).map_err(|_| bad(format!("tensor {name} is missing")))?;
            if t.dtype() != safetensors::Dtype::F32 || t.shape().len() != rank {
                return Err(bad(format!(
                    "tensor {name} must be f32 of rank {rank}, is {:?} {:?}",
                    t.dtype(),
                    t.shape()
                )));
            }
            let data = t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            Ok((t.shape().to_vec(), data))
        };
        let (ms, mean) = read("mean", 3)?;
        let (layers, kv_heads) = (ms[0], ms[1]);
        if ms[2] != f {
            return Err(bad(format!("{} features per entry where head_dim {head_dim} gives {f}", ms[2])));
        }
        let (ss, inv_std) = read("inv_std", 3)?;
        let (w1s, w1) = read("w1", 4)?;
        let hidden = w1s[2];
        let (b1s, b1) = read("b1", 3)?;
        let (w2s, w2) = read("w2", 3)?;
        let want = [
            (ss, vec![layers, kv_heads, f]),
            (w1s, vec![layers, kv_heads, hidden, f]),
            (b1s, vec![layers, kv_heads, hidden]),
            (w2s, vec![layers, kv_heads, hidden]),
        ];
        if want.iter().any(|(got, want)| got != want) {
            return Err(bad("the tensors' shapes do not agree with each other"));
        }
        let heads = (0..layers * kv_heads)
            .map(|i| HeadNet {
                mean: mean[i * f..(i + 1) * f].to_vec(),
                inv_std: inv_std[i * f..(i + 1) * f].to_vec(),
                w1: w1[i * hidden * f..(i + 1) * hidden * f].to_vec(),
                b1: b1[i * hidden..(i + 1) * hidden].to_vec(),
                w2: w2[i * hidden..(i + 1) * hidden].to_vec(),
            })
            .collect();
        let w = DistillWeights { layers, kv_heads, head_dim, hidden, heads };
        w.validate()?;
        Ok(w)
    }
}

/// The name of the built-in weights (`weights=smollm2-135m`): trained for SmolLM2-135M by
/// `kvslice train-policy` (the command and its figures are in docs/BENCHMARKS.md).
pub const BUILTIN: &str = "smollm2-135m";
const BUILTIN_BYTES: &[u8] = include_bytes!("../../weights/distillcache-smollm2-135m.safetensors");

/// The learned score.
#[derive(Clone)]
pub struct DistillCache {
    weights: Arc<DistillWeights>,
    /// Where the weights came from (the built-in name or the file's path).
    source: String,
    /// The most recent entries always kept (beside the sinks).
    recent: usize,
}

impl std::fmt::Debug for DistillCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = &self.weights;
        f.debug_struct("DistillCache")
            .field("weights", &self.source)
            .field("layers", &w.layers)
            .field("kv_heads", &w.kv_heads)
            .field("head_dim", &w.head_dim)
            .field("hidden", &w.hidden)
            .field("recent", &self.recent)
            .finish()
    }
}

impl DistillCache {
    /// A scorer with these (validated) weights.
    pub fn new(weights: DistillWeights) -> Result<Self> {
        weights.validate()?;
        Ok(DistillCache { weights: Arc::new(weights), source: "given".into(), recent: 0 })
    }

    /// The built-in weights ([`BUILTIN`]) or a weights file (read up to [`MAX_FILE_BYTES`]).
    pub fn load(source: &str) -> Result<Self> {
        let weights = if source == BUILTIN {
            DistillWeights::from_safetensors(BUILTIN_BYTES)?
        } else {
            use std::io::Read;
            let file = std::fs::File::open(source).map_err(|e| bad(format!("{source}: {e}")))?;
            let mut bytes = Vec::new();
            file.take(MAX_FILE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| bad(format!("{source}: {e}")))?;
            DistillWeights::from_safetensors(&bytes).map_err(|e| match e {
                PolicyError::InvalidParameter { reason, .. } => bad(format!("{source}: {reason}")),
                other => other,
            })?
        };
        Ok(DistillCache { weights: Arc::new(weights), source: source.to_string(), recent: 0 })
    }

    /// The same scores with the `recent` newest entries always kept: the local context a
    /// decode step reads most, which a score of each entry alone can rank below older ones.
    pub fn with_recent(mut self, recent: usize) -> Self {
        self.recent = recent;
        self
    }

    /// The weights it scores with.
    pub fn weights(&self) -> &DistillWeights {
        &self.weights
    }
}

impl Scorer for DistillCache {
    fn name(&self) -> &'static str {
        "distillcache"
    }

    fn needs(&self) -> Needs {
        Needs { keys: true, values: true, ..Needs::default() }
    }

    fn protect(&self, _budget: usize) -> Protect {
        Protect { sinks: SINK_FLAG, recent: self.recent }
    }

    fn score(&self, input: &ScoreInput<'_>) -> Result<Scores> {
        let (kv, keys) = input.keys("distillcache")?;
        let (_, values) = input.values("distillcache")?;
        let w = &*self.weights;
        if input.layer >= w.layers || kv.kv_heads != w.kv_heads || kv.head_dim != w.head_dim {
            return Err(bad(format!(
                "trained for {} layers × {} KV heads of dimension {}; asked for layer {} of a model with {} KV heads of dimension {}",
                w.layers, w.kv_heads, w.head_dim, input.layer, kv.kv_heads, kv.head_dim
            )));
        }
        let mut out = Scores::zeros(kv.kv_heads, kv.len);
        for h in 0..kv.kv_heads {
            let x = head_features(&kv, keys, values, h);
            out.row_mut(h).copy_from_slice(&w.head(input.layer, h).score(&x));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::WindowStats;

    fn view<'a>(n: usize, d: usize, k: &'a [f32], v: &'a [f32]) -> KvView<'a> {
        KvView { kv_heads: 1, len: n, head_dim: d, keys: Some(k), values: Some(v) }
    }

    #[test]
    fn features_by_hand() {
        // d = 2: one RoPE pair; keys (3, 4) and (0, 0) and (1, 0); values (1, 0), (0, 2), (0, 0)
        let k = [3.0, 4.0, 0.0, 0.0, 1.0, 0.0];
        let v = [1.0, 0.0, 0.0, 2.0, 0.0, 0.0];
        let x = head_features(&view(3, 2, &k, &v), &k, &v, 0);
        assert_eq!(feature_count(2), 9);
        let row = |j: usize| &x[j * 9..(j + 1) * 9];
        // pair magnitudes, values
        assert_eq!(&row(0)[..3], &[5.0, 1.0, 0.0]);
        assert_eq!(&row(1)[..3], &[0.0, 0.0, 2.0]);
        // positions 0, 1/2, 1; recency ln(3)/ln(4), ln(2)/ln(4), 0; all three sinks
        assert_eq!(row(0)[3], 0.0);
        assert_eq!(row(1)[3], 0.5);
        assert_eq!(row(2)[3], 1.0);
        assert!((row(0)[4] - (3f32.ln() / 4f32.ln())).abs() < 1e-6);
        assert!((row(1)[4] - 0.5).abs() < 1e-6);
        assert_eq!(row(2)[4], 0.0);
        assert!((0..3).all(|j| row(j)[5] == 1.0));
        // anchor = (0.6, 0.8) + 0 + (1, 0) = (1.6, 0.8); cos with (3,4) = (4.8+3.2)/(5·√3.2)
        let anorm = (1.6f64 * 1.6 + 0.64).sqrt();
        assert!((f64::from(row(0)[6]) - 8.0 / (5.0 * anorm)).abs() < 1e-6);
        assert_eq!(row(1)[6], 0.0, "a zero key has no direction");
        assert!((f64::from(row(2)[6]) - 1.6 / anorm).abs() < 1e-6);
        // key norms 5, 0, 1 (mean 2); value norms 1, 2, 0 (mean 1)
        assert!((row(0)[7] - (2.5f32).ln()).abs() < 1e-6);
        assert!((row(2)[7] - (0.5f32).ln()).abs() < 1e-6);
        assert!((row(1)[8] - 2f32.ln()).abs() < 1e-6);
        assert!((f64::from(row(2)[8]) - 1e-12f64.ln()).abs() < 1e-3);
    }

    #[test]
    fn a_recent_window_is_kept_whatever_the_networks_score() {
        let info = crate::ModelInfo { head_dim: 64, rope_theta: 10000.0 };
        let policy = crate::build("distillcache:recent=16", &info).unwrap();
        assert_eq!(policy.protect(100), Protect { sinks: SINK_FLAG, recent: 16 });
        assert_eq!(crate::build("distillcache", &info).unwrap().protect(100).recent, 0);
        // scores that fall with the position: without the window the oldest 24 would stay
        let scores: Vec<f32> = (0..64).map(|j| -(j as f32)).collect();
        let kept = crate::select_top_k(&scores, 24, policy.protect(24)).unwrap();
        assert_eq!(kept, (0..8).chain(48..64).collect::<Vec<u32>>());
        assert!(crate::build("distillcache:recent=-1", &info).is_err());
    }

    #[test]
    fn rotating_a_key_leaves_its_features() {
        let d = 4;
        let k = [1.0, 2.0, 3.0, -1.0, 0.5, 0.5, -2.0, 1.0];
        let v = [1.0; 8];
        let mut r = k;
        // rotate entry 1's pairs (0, 2) and (1, 3) by different angles
        for (i, angle) in [(0usize, 0.7f32), (1, -2.1)] {
            let (a, b) = (k[4 + i], k[4 + i + 2]);
            r[4 + i] = a * angle.cos() - b * angle.sin();
            r[4 + i + 2] = a * angle.sin() + b * angle.cos();
        }
        let x = head_features(&view(2, d, &k, &v), &k, &v, 0);
        let y = head_features(&view(2, d, &r, &v), &r, &v, 0);
        let f = feature_count(d);
        for i in 0..d / 2 {
            assert!((x[f + i] - y[f + i]).abs() < 1e-6);
        }
    }

    fn tiny_net(f: usize) -> HeadNet {
        HeadNet {
            mean: vec![1.0; f],
            inv_std: vec![0.5; f],
            w1: (0..2 * f)
                .map(|i| {
                    if i == 0 {
                        1.0
                    } else if i == f + 1 {
                        -2.0
                    } else {
                        0.0
                    }
                })
                .collect(),
            b1: vec![0.25, 0.0],
            w2: vec![2.0, 1.0],
        }
    }

    #[test]
    fn the_network_by_hand() {
        let net = tiny_net(3);
        // x = (3, 1, 7): normalised (1, 0, 3); z = (0.25 + 1, −2·0) → 2·tanh(1.25) + tanh(0)
        let s = net.score(&[3.0, 1.0, 7.0]);
        assert!((s[0] - 2.0 * 1.25f32.tanh()).abs() < 1e-6);
        // x = (1, 2, 0): normalised (0, 0.5, −0.5); z = (0.25, −1)
        let s = net.score(&[1.0, 2.0, 0.0]);
        assert!((s[0] - (2.0 * 0.25f32.tanh() + (-1f32).tanh())).abs() < 1e-6);
    }

    fn weights(hidden: usize) -> DistillWeights {
        let d = 2;
        let f = feature_count(d);
        let heads = (0..2)
            .map(|i| HeadNet {
                mean: (0..f).map(|j| (i * f + j) as f32 * 0.1).collect(),
                inv_std: vec![1.0 + i as f32; f],
                w1: (0..hidden * f).map(|j| (j as f32 * 0.37).sin()).collect(),
                b1: (0..hidden).map(|j| j as f32 * 0.01).collect(),
                w2: (0..hidden).map(|j| 1.0 - j as f32).collect(),
            })
            .collect();
        DistillWeights { layers: 2, kv_heads: 1, head_dim: d, hidden, heads }
    }

    #[test]
    fn weights_survive_the_file_and_bad_files_are_errors() {
        let w = weights(3);
        let bytes = w.to_safetensors().unwrap();
        assert_eq!(DistillWeights::from_safetensors(&bytes).unwrap(), w);
        assert!(DistillWeights::from_safetensors(b"not a file").is_err());
        assert!(DistillWeights::from_safetensors(&bytes[..bytes.len() - 4]).is_err());
        // a file of another kind
        let data = [0u8; 4];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &data).unwrap();
        let other = safetensors::serialize(vec![("x".to_string(), view)], None).unwrap();
        assert!(DistillWeights::from_safetensors(&other).is_err());
        // a weight that is not finite
        let mut nan = w.clone();
        nan.heads[1].w2[0] = f32::NAN;
        assert!(nan.to_safetensors().is_err());
        assert!(DistillCache::new(nan).is_err());
    }

    #[test]
    fn the_scorer_runs_each_layers_networks_and_refuses_other_geometries() {
        let w = weights(2);
        let scorer = DistillCache::new(w.clone()).unwrap();
        let k = [1.0, 2.0, -1.0, 0.5, 0.0, 3.0];
        let v = [0.5, 0.5, 2.0, -1.0, 1.0, 1.0];
        let kv = view(3, 2, &k, &v);
        let stats = WindowStats { heads: 1, kv_heads: 1, len: 3, window: 1, ..WindowStats::default() };
        let x = head_features(&kv, &k, &v, 0);
        for layer in 0..2 {
            let input = ScoreInput { kv: Some(kv), layer, ..ScoreInput::new(&stats, 2) };
            let got = scorer.score(&input).unwrap();
            assert_eq!(got.row(0), w.head(layer, 0).score(&x).as_slice());
        }
        assert_ne!(w.head(0, 0).score(&x), w.head(1, 0).score(&x));
        let input = ScoreInput { kv: Some(kv), layer: 2, ..ScoreInput::new(&stats, 2) };
        assert!(scorer.score(&input).is_err(), "a layer the weights do not have");
        let keys_only = KvView { values: None, ..kv };
        assert!(matches!(
            scorer.score(&ScoreInput { kv: Some(keys_only), ..ScoreInput::new(&stats, 2) }),
            Err(PolicyError::MissingInput { .. })
        ));
    }
}
