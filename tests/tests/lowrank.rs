//! Low-rank keys ([`kvslice_model::lowrank`]) on tiny seeded models, the GQA llama of
//! tests/golden/tiny (4 heads, 2 KV heads) and an MHA variant of it (4 KV heads), calibrated by
//! the runtime ([`kvslice_runtime::calibrate`]) and compared with the uncompressed model:
//! - at full rank the reconstruction is the identity, so the logits are the model's own;
//! - where the weights confine a group's keys to `r` dimensions, rank `r` loses nothing and
//!   rank `r − 1` does;
//! - CKA finds the heads whose keys span one subspace, and grouping them keeps the logits at
//!   half the key width where other groupings cannot.
//!
//! Queries and keys get seeded weights of 0.3 (the golden model's 0.02 makes attention nearly
//! uniform, where keys hardly matter). Tolerance: |Δ| ≤ 1e-4 · max(1, |logit|).

use std::collections::HashMap;

use burn::tensor::Device;
use kvslice_formats::weights::Tensor as HostTensor;
use kvslice_formats::{ModelConfig, SafetensorsWeights, WeightSource};
use kvslice_model::Llama;
use kvslice_model::load::load_llama;
use kvslice_model::lowrank::{Grouping, KeyMoments, LowRankKeys, RankSpec, Settings};
use kvslice_runtime::{Compression, CompressionReport, KvCache, Session};
use kvslice_tests::{cpu, wgpu};

/// Seeded values in [-1, 1).
fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut i = 0u64;
    move || {
        i += 1;
        (kvslice_runtime::policies::splitmix64(seed, i) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The tiny llama with its config edited and some tensors replaced.
struct Rewritten {
    inner: SafetensorsWeights<Vec<u8>>,
    config: ModelConfig,
    tensors: HashMap<String, HostTensor>,
}

impl WeightSource for Rewritten {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
    fn shape(&self, canonical: &str) -> Option<Vec<usize>> {
        match self.tensors.get(canonical) {
            Some(t) => Some(t.shape.clone()),
            None => self.inner.shape(canonical),
        }
    }
    fn load(&self, canonical: &str) -> kvslice_formats::Result<HostTensor> {
        match self.tensors.get(canonical) {
            Some(t) => Ok(HostTensor { shape: t.shape.clone(), data: t.data.clone() }),
            None => self.inner.load(canonical),
        }
    }
}

const HIDDEN: usize = 64;
const D: usize = 16;

/// `rows × HIDDEN` seeded values of size `scale`.
fn random(rows: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..rows * HIDDEN).map(|_| scale * r()).collect()
}

/// The tiny llama with `kv_heads` KV heads; each layer's q_proj seeded, and its k_proj
/// (`[kv_heads · D, HIDDEN]`) and v_proj given by `keys(layer)` / seeded.
fn model_with(kv_heads: usize, keys: impl Fn(usize) -> Vec<f32>) -> Rewritten {
    let inner = kvslice_tests::tiny_hf_weights("llama");
    let mut config = inner.config().clone();
    config.num_key_value_heads = kv_heads;
    let mut tensors = HashMap::new();
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}.self_attn");
        let heads = config.num_attention_heads;
        tensors.insert(
            format!("{p}.q_proj.weight"),
            HostTensor { shape: vec![heads * D, HIDDEN], data: random(heads * D, 0.3, 100 + l as u64) },
        );
        tensors.insert(format!("{p}.k_proj.weight"), HostTensor { shape: vec![kv_heads * D, HIDDEN], data: keys(l) });
        tensors.insert(
            format!("{p}.v_proj.weight"),
            HostTensor { shape: vec![kv_heads * D, HIDDEN], data: random(kv_heads * D, 0.3, 200 + l as u64) },
        );
    }
    Rewritten { inner, config, tensors }
}

/// k_proj rows `[kv_heads · D, HIDDEN]` of rank `rank`: `A · B` with `A` `[kv_heads · D, rank]`.
fn confined(kv_heads: usize, rank: usize, seed: u64) -> Vec<f32> {
    let (mut ra, mut rb) = (rng(seed), rng(seed + 1));
    let a: Vec<f32> = (0..kv_heads * D * rank).map(|_| ra()).collect();
    let b: Vec<f32> = (0..rank * HIDDEN).map(|_| 0.3 * rb()).collect();
    (0..kv_heads * D * HIDDEN)
        .map(|i| {
            let (row, col) = (i / HIDDEN, i % HIDDEN);
            (0..rank).map(|k| a[row * rank + k] * b[k * HIDDEN + col]).sum::<f32>() / (rank as f32).sqrt()
        })
        .collect()
}

/// Calibration texts: seeded token ids.
fn texts() -> Vec<Vec<u32>> {
    (0..3u64)
        .map(|t| {
            let mut r = rng(900 + t);
            (0..48).map(|_| ((r() + 1.0) * 127.9) as u32).collect()
        })
        .collect()
}

fn calibrate(model: &Llama, rank: RankSpec, grouping: Grouping) -> LowRankKeys {
    let c = &model.config;
    let mut moments = vec![KeyMoments::new(c.num_kv_heads, c.head_dim); c.num_layers];
    for ids in texts() {
        pollster::block_on(kvslice_runtime::calibrate::add_key_moments(model, &ids, &mut moments)).unwrap();
    }
    kvslice_model::lowrank::calibrate(&moments, &Settings { grouping, ..Settings::new(rank, 1) }).unwrap().0
}

const PROMPT: [u32; 12] = [1, 17, 42, 99, 3, 250, 8, 64, 31, 77, 5, 120];

/// The prompt's logits at every row, then one decode step's.
fn logits(model: &Llama) -> Vec<Vec<f32>> {
    let rows: Vec<usize> = (0..PROMPT.len()).collect();
    let mut session = Session::new(model, PROMPT.len() + 1).unwrap();
    let mut out = pollster::block_on(session.logits_at(&PROMPT, &rows)).unwrap();
    out.extend(pollster::block_on(session.logits_at(&[9], &[0])).unwrap());
    out
}

/// The largest `|Δ| / max(1, |want|)`.
fn worst(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    got.iter().flatten().zip(want.iter().flatten()).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0.0, f32::max)
}

fn low_rank(weights: &Rewritten, device: &Device, rank: RankSpec, grouping: Grouping) -> (Llama, LowRankKeys) {
    let mut model = load_llama(weights, device).unwrap();
    let keys = calibrate(&model, rank, grouping);
    model.set_low_rank_keys(&keys).unwrap();
    (model, keys)
}

fn full_rank_is_the_model(device: Device) {
    for kv_heads in [2, 4] {
        let weights = model_with(kv_heads, |l| random(kv_heads * D, 0.3, 300 + l as u64));
        let want = logits(&load_llama(&weights, &device).unwrap());
        for group in [1, 2, kv_heads] {
            let (model, keys) = low_rank(&weights, &device, RankSpec::Fraction(1.0), Grouping::Cka(group));
            assert_eq!(model.low_rank_keys(), Some(&[kv_heads * D; 3][..]));
            assert!(keys.layers.iter().all(|g| g.len() == kv_heads.div_ceil(group)));
            let w = worst(&logits(&model), &want);
            assert!(w <= 1e-4, "{kv_heads} KV heads in groups of {group}: {w}");
        }
    }
}

#[test]
fn low_rank_keys_at_full_rank_give_the_models_logits_cpu() {
    full_rank_is_the_model(cpu());
}

#[test]
fn low_rank_keys_at_full_rank_give_the_models_logits_wgpu() {
    full_rank_is_the_model(wgpu());
}

/// Keys confined to 6 of the 32 dimensions of both KV heads together: one group of both at rank
/// 6 reconstructs them exactly; rank 5 does not, nor do groups of one head at 6 in all (each
/// head's keys span 6 dimensions of their own).
fn confined_keys(device: Device) {
    let weights = model_with(2, |l| confined(2, 6, 400 + l as u64));
    let want = logits(&load_llama(&weights, &device).unwrap());
    let (model, _) = low_rank(&weights, &device, RankSpec::Dims(6), Grouping::Cka(2));
    let exact = worst(&logits(&model), &want);
    assert!(exact <= 1e-4, "rank 6: {exact}");
    let (model, _) = low_rank(&weights, &device, RankSpec::Dims(5), Grouping::Cka(2));
    let short = worst(&logits(&model), &want);
    let (model, keys) = low_rank(&weights, &device, RankSpec::Dims(6), Grouping::Cka(1));
    assert_eq!(keys.layers[0].iter().map(|g| g.rank).sum::<usize>(), 6);
    let apart = worst(&logits(&model), &want);
    eprintln!("confined keys: rank 6 {exact:.2e}, rank 5 {short:.2e}, heads apart {apart:.2e}");
    assert!(short > 1e-2 && apart > 1e-2, "rank 5: {short}; heads apart: {apart}");
}

#[test]
fn keys_confined_to_a_subspace_survive_its_rank_cpu() {
    confined_keys(cpu());
}

#[test]
fn keys_confined_to_a_subspace_survive_its_rank_wgpu() {
    confined_keys(wgpu());
}

/// An MHA model (4 KV heads) whose heads 2 and 3 read the same directions of the input as
/// heads 0 and 1 (their k_proj rows are the others' mixed by a fixed 16 × 16 matrix, so their
/// keys are linear images of the others'): CKA pairs {0, 2} and {1, 3}, each pair's keys span 16
/// dimensions, and half the key width (32 of 64) keeps the logits; the adjacent pairs {0, 1},
/// {2, 3} span 32 each and lose them at the same rank.
#[test]
fn cka_groups_the_heads_that_share_a_subspace() {
    let device = cpu();
    let weights = paired_weights();
    let want = logits(&load_llama(&weights, &device).unwrap());
    let (model, lr) = low_rank(&weights, &device, RankSpec::Fraction(0.5), Grouping::Cka(2));
    for (l, groups) in lr.layers.iter().enumerate() {
        let heads: Vec<Vec<usize>> = groups.iter().map(|g| g.heads.clone()).collect();
        assert_eq!(heads, vec![vec![0, 2], vec![1, 3]], "layer {l}");
        assert!(groups.iter().all(|g| g.rank == 16), "layer {l}");
    }
    let w = worst(&logits(&model), &want);
    assert!(w <= 1e-3, "CKA's pairs: {w}");
    // the same rank over the adjacent pairs, as a grouping blind to the keys takes them
    let (blind, adjacent) = low_rank(&weights, &device, RankSpec::Fraction(0.5), Grouping::Adjacent(2));
    assert_eq!(adjacent.layers[0][0].heads, vec![0, 1]);
    let lost = worst(&logits(&blind), &want);
    eprintln!("half the key width: CKA's pairs {w:.2e}, adjacent pairs {lost:.2e}");
    assert!(lost > 1e-2, "adjacent pairs: {lost}");
}

/// The MHA model of [`cka_groups_the_heads_that_share_a_subspace`].
fn paired_weights() -> Rewritten {
    let mix: Vec<f32> = {
        let mut r = rng(77);
        (0..D * D).map(|i| if i / D == i % D { 1.5 } else { 0.3 * r() }).collect()
    };
    let keys = |l: usize| {
        let base = random(2 * D, 0.3, 500 + l as u64);
        let mut rows = base.clone();
        for h in 0..2 {
            for a in 0..D {
                for c in 0..HIDDEN {
                    rows.push((0..D).map(|b| mix[a * D + b] * base[(h * D + b) * HIDDEN + c]).sum());
                }
            }
        }
        rows
    };
    model_with(4, keys)
}

/// A prompt longer than the policies' observation windows, and the tokens decoded after it.
const LONG: usize = 40;
const DECODED: [u32; 3] = [9, 44, 130];

/// Prefills the long prompt, compresses it with `compression` (the whole cache when `None`),
/// and decodes [`DECODED`]: each step's logits, the session's cache and the report.
fn decode_after(
    model: &Llama,
    compression: Option<&Compression>,
) -> (Vec<Vec<f32>>, KvCache, Option<CompressionReport>) {
    let prompt: Vec<u32> = (0..LONG as u32).map(|i| i * 37 % 250 + 1).collect();
    let request = compression.map(|c| c.request(model.config.num_layers)).unwrap_or_default();
    let prefilled = pollster::block_on(Session::prefill_for(model, &prompt, &request)).unwrap();
    let (mut session, report) = pollster::block_on(Session::resume(model, &prefilled, compression, 8)).unwrap();
    let out = DECODED.iter().map(|&t| pollster::block_on(session.next_logits(&[t])).unwrap()).collect();
    (out, session.cache().clone(), report)
}

/// Every layer's latent groups ({0, 2} and {1, 3}) share their positions.
fn groups_share_positions(cache: &KvCache) {
    for (l, layer) in cache.layers().iter().enumerate() {
        assert!(layer.latent_layout().is_some(), "layer {l} stores whole keys");
        for (a, b) in [(0, 2), (1, 3)] {
            assert_eq!(layer.head_positions(a), layer.head_positions(b), "layer {l}, heads {a} and {b}");
        }
    }
}

/// The CKA-paired MHA model at half the key width, its cache holding latents (16 per pair of
/// heads for each token, against 2 × 16 key elements) beside the values:
/// - the whole cache: the key bytes are half the whole keys' (counted from the storage), and
///   the logits of three decode steps those of the same model caching whole keys;
/// - SnapKV at 50% (one set per pair, aligned from the per-head choice): the logits those of
///   whole keys over the same kept entries;
/// - H2O at 20 entries (decode-time eviction): every step writes one slot per pair.
fn latent_storage(device: Device) {
    let weights = paired_weights();
    let (mut model, _) = low_rank(&weights, &device, RankSpec::Fraction(0.5), Grouping::Cka(2));
    let layers = model.config.num_layers;
    let tokens = LONG + DECODED.len();
    let (latent, cache, _) = decode_after(&model, None);
    groups_share_positions(&cache);
    // per token and layer: 2 latents of 16 and 4 values of 16, in f32
    assert_eq!(cache.occupied_bytes(), layers * tokens * (2 * 16 + 4 * D) * 4);
    model.set_latent_storage(false);
    let (whole, whole_cache, _) = decode_after(&model, None);
    assert!(whole_cache.layers().iter().all(|l| l.latent_layout().is_none()));
    assert_eq!(whole_cache.occupied_bytes(), layers * tokens * (4 * D + 4 * D) * 4);
    let w = worst(&latent, &whole);
    assert!(w <= 1e-4, "whole cache, latent against whole keys: {w}");

    model.set_latent_storage(true);
    let info = Compression::model_info(&model);
    let snapkv = Compression::new("snapkv:window=8", "50%", &info).unwrap();
    let (latent, cache, report) = decode_after(&model, Some(&snapkv));
    groups_share_positions(&cache);
    let report = report.unwrap();
    for (l, kept) in report.kept.iter().enumerate() {
        assert_eq!(kept[0], kept[2], "layer {l}");
        assert_eq!(kept[1], kept[3], "layer {l}");
    }
    assert_eq!(report.compressed_bytes, cache.storage_bytes());
    // whole keys over the same entries
    let prompt: Vec<u32> = (0..LONG as u32).map(|i| i * 37 % 250 + 1).collect();
    let prefilled = pollster::block_on(Session::prefill_for(&model, &prompt, &snapkv.request(layers))).unwrap();
    let same = kvslice_runtime::evict::compress_cache(&prefilled.cache, &report.kept, 8, 0).unwrap();
    let mut session = Session::from_cache(&model, same, LONG as u32);
    let whole: Vec<Vec<f32>> =
        DECODED.iter().map(|&t| pollster::block_on(session.next_logits(&[t])).unwrap()).collect();
    let w = worst(&latent, &whole);
    assert!(w <= 1e-4, "SnapKV at 50%, latent against whole keys: {w}");

    let h2o = Compression::new("h2o", "20", &info).unwrap();
    let (_, cache, _) = decode_after(&model, Some(&h2o));
    groups_share_positions(&cache);
    assert!(cache.layers().iter().all(|l| l.lens().iter().all(|&n| n == 20)));
}

#[test]
fn latent_keys_halve_the_key_bytes_and_keep_the_logits_cpu() {
    latent_storage(cpu());
}

#[test]
fn latent_keys_halve_the_key_bytes_and_keep_the_logits_wgpu() {
    latent_storage(wgpu());
}

#[test]
fn keys_of_another_geometry_are_refused() {
    let device = cpu();
    let gqa = model_with(2, |l| random(2 * D, 0.3, 600 + l as u64));
    let mha = model_with(4, |l| random(4 * D, 0.3, 600 + l as u64));
    let (_, keys) = low_rank(&gqa, &device, RankSpec::Fraction(0.5), Grouping::Cka(2));
    let mut model = load_llama(&mha, &device).unwrap();
    let err = model.set_low_rank_keys(&keys).unwrap_err().to_string();
    assert!(err.contains("KV heads"), "{err}");
    assert_eq!(model.low_rank_keys(), None);
    let mut twice = load_llama(&gqa, &device).unwrap();
    twice.set_low_rank_keys(&keys).unwrap();
    assert!(twice.set_low_rank_keys(&keys).is_err());
}
