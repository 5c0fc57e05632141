//! Latent keys on Burn's CPU backend, against keys rotated on the host: three KV heads of
//! dimension 4, heads {0, 2} sharing a latent of rank 3 and head 1 alone at rank 2.
//!
//! The keys are built from latents (`k = c Uᵀ S⁻¹`, the only keys a model with the folded
//! projector makes), rotated by RoPE on the host with `inv_freq = [1, 0.1]`, and handed to the
//! cache rotated, as the model hands them. Reads must give those rotated keys back.

use std::sync::Arc;

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_cache::{CacheError, CacheGeometry, GroupBasis, KvCache, KvDtype, KvStore, LatentLayout, RopeTable};

const D: usize = 4;
const HEADS: usize = 3;
const INV_FREQ: [f32; 2] = [1.0, 0.1];
const TABLE: usize = 16;

fn device() -> Device {
    Device::flex()
}

/// Group {0, 2}: columns e0, (e1 + e5)/√2, e6 of its 8 key columns, scales 1 but 2 at column 1
/// and 0.5 at column 5. Head 1: e0, e3, scales 1.
struct Basis {
    pair: Vec<f32>,
    pair_scale: Vec<f32>,
    one: Vec<f32>,
    one_scale: Vec<f32>,
}

fn basis() -> Basis {
    let r = std::f32::consts::FRAC_1_SQRT_2;
    let mut pair = vec![0.0; 8 * 3];
    pair[0] = 1.0; // row 0, column 0
    pair[3 + 1] = r; // row 1, column 1
    pair[5 * 3 + 1] = r; // row 5, column 1
    pair[6 * 3 + 2] = 1.0; // row 6, column 2
    let mut one = vec![0.0; 4 * 2];
    one[0] = 1.0;
    one[3 * 2 + 1] = 1.0;
    Basis { pair, pair_scale: vec![1.0, 2.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0], one, one_scale: vec![1.0; 4] }
}

fn layout(dev: &Device) -> LatentLayout {
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for p in 0..TABLE {
        for f in INV_FREQ {
            let angle = (f * p as f32) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let table = Arc::new(RopeTable::new(cos, sin, D / 2, dev).unwrap());
    let b = basis();
    let groups = [
        GroupBasis { heads: &[0, 2], rank: 3, basis: &b.pair, scale: &b.pair_scale },
        GroupBasis { heads: &[1], rank: 2, basis: &b.one, scale: &b.one_scale },
    ];
    LatentLayout::new(HEADS, D, &groups, table, dev).unwrap()
}

/// Pre-RoPE keys of one token, `[HEADS][D]`, from seeded latents: `c Uᵀ S⁻¹` per group.
fn raw_key(token: usize) -> [[f32; D]; HEADS] {
    let b = basis();
    let c: Vec<f32> = (0..5).map(|j| ((token * 7 + j * 3) % 11) as f32 / 5.0 - 1.0).collect();
    let mut k = [[0.0; D]; HEADS];
    for a in 0..8 {
        let v: f32 = (0..3).map(|j| c[j] * b.pair[a * 3 + j]).sum::<f32>() / b.pair_scale[a];
        let head = if a < D { 0 } else { 2 };
        k[head][a % D] = v;
    }
    for (a, x) in k[1].iter_mut().enumerate() {
        *x = (0..2).map(|j| c[3 + j] * b.one[a * 2 + j]).sum::<f32>() / b.one_scale[a];
    }
    k
}

/// RoPE on the host, `rotate_half` layout.
fn rotated(k: [f32; D], position: u32) -> [f32; D] {
    let mut out = [0.0; D];
    for (i, f) in INV_FREQ.iter().enumerate() {
        let angle = (f * position as f32) as f64;
        let (c, s) = (angle.cos() as f32, angle.sin() as f32);
        out[i] = k[i] * c - k[i + 2] * s;
        out[i + 2] = k[i + 2] * c + k[i] * s;
    }
    out
}

/// Tokens `tokens` at `positions`: rotated keys and values `[HEADS, n, D]`.
fn rows(tokens: &[usize], positions: &[u32], dev: &Device) -> (Tensor<3>, Tensor<3>) {
    let n = tokens.len();
    let mut k = Vec::new();
    let mut v = Vec::new();
    for h in 0..HEADS {
        for (&t, &p) in tokens.iter().zip(positions) {
            k.extend(rotated(raw_key(t)[h], p));
            v.extend((0..D).map(|i| (100 * t + 10 * h + i) as f32));
        }
    }
    let t = |x: Vec<f32>| Tensor::<3>::from_data(TensorData::new(x, [HEADS, n, D]), dev);
    (t(k), t(v))
}

fn host(t: Tensor<3>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Every head's slots hold `(token, position)` in order.
fn assert_holds(cache: &KvCache, want: &[Vec<(usize, u32)>]) {
    let layer = cache.layer(0).unwrap();
    let (k, v) = layer.view();
    let (k, v) = (host(k), host(v));
    let n = layer.max_len();
    for (h, slots) in want.iter().enumerate() {
        assert_eq!(layer.lens()[h], slots.len(), "head {h}");
        for (s, &(t, p)) in slots.iter().enumerate() {
            assert_eq!(layer.head_positions(h)[s], p, "head {h} slot {s}");
            let at = (h * n + s) * D;
            let want_k = rotated(raw_key(t)[h], p);
            for i in 0..D {
                assert!((k[at + i] - want_k[i]).abs() <= 1e-5, "head {h} slot {s}: {:?} vs {want_k:?}", &k[at..at + D]);
                assert_eq!(v[at + i], (100 * t + 10 * h + i) as f32, "head {h} slot {s} value");
            }
        }
    }
}

fn filled(dev: &Device) -> KvCache {
    let mut cache = KvCache::new(CacheGeometry { layers: 1, kv_heads: HEADS, head_dim: D, capacity: 8 }, dev).unwrap();
    let positions = [0, 1, 2, 5, 9];
    let (k, v) = rows(&[0, 1, 2, 3, 4], &positions, dev);
    cache.append(0, k, v, &positions).unwrap();
    cache.with_latent_keys(&[layout(dev)]).unwrap();
    cache
}

#[test]
fn latent_keys_read_back_the_rotated_keys_in_their_latent_bytes() {
    let dev = device();
    let mut dense = KvCache::new(CacheGeometry { layers: 1, kv_heads: HEADS, head_dim: D, capacity: 8 }, &dev).unwrap();
    let dense_bytes = dense.storage_bytes();
    assert_eq!(dense_bytes, HEADS * 8 * 2 * D * 4);
    let cache = filled(&dev);
    let slots: Vec<(usize, u32)> = [0, 1, 2, 3, 4].into_iter().zip([0, 1, 2, 5, 9]).collect();
    assert_holds(&cache, &[slots.clone(), slots.clone(), slots]);
    // per slot: latents of 3 + 2 and values of 3 × 4, in f32
    assert_eq!(cache.storage_bytes(), 8 * (5 + HEADS * D) * 4);
    assert_eq!(cache.occupied_bytes(), 5 * (5 + HEADS * D) * 4);
    assert!(cache.layer(0).unwrap().storage().is_none());
    // the dense cache, appended the same way, holds the same keys
    let positions = [0, 1, 2, 5, 9];
    let (k, v) = rows(&[0, 1, 2, 3, 4], &positions, &dev);
    dense.append(0, k, v, &positions).unwrap();
    let (a, b) = (host(dense.layer(0).unwrap().view().0), host(cache.layer(0).unwrap().view().0));
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-5));
}

#[test]
fn appends_and_slot_writes_encode_new_tokens() {
    let dev = device();
    let mut cache = filled(&dev);
    let (k, v) = rows(&[5], &[11], &dev);
    cache.append(0, k, v, &[11]).unwrap();
    // slot 2 of the pair and slot 4 of head 1 take token 6 at position 12
    let (k, v) = rows(&[6], &[12], &dev);
    cache.layer_mut(0).unwrap().write_slots(&[2, 4, 2], k, v, 12).unwrap();
    let pair = vec![(0, 0), (1, 1), (6, 12), (3, 5), (4, 9), (5, 11)];
    let one = vec![(0, 0), (1, 1), (2, 2), (3, 5), (6, 12), (5, 11)];
    assert_holds(&cache, &[pair.clone(), one, pair]);
    // the heads of a group write one slot
    let (k, v) = rows(&[7], &[13], &dev);
    let err = cache.layer_mut(0).unwrap().write_slots(&[1, 4, 3], k, v, 13).unwrap_err();
    assert!(matches!(err, CacheError::BadKeep { head: 0, .. }), "{err}");
    // a position past the rotation table is refused before anything changes
    let (k, v) = rows(&[7], &[1], &dev);
    let err = cache.append(0, k, v, &[TABLE as u32]).unwrap_err();
    assert!(err.to_string().contains("rotation table"), "{err}");
    assert_eq!(cache.layer(0).unwrap().lens(), &[6, 6, 6]);
}

#[test]
fn gathers_keep_one_set_per_group() {
    let dev = device();
    let cache = filled(&dev);
    let layer = cache.layer(0).unwrap();
    let small = layer.gather(&[vec![0, 3], vec![1], vec![0, 3]], 4).unwrap();
    let kept = KvCache::from_layers(vec![small]).unwrap();
    assert_eq!(kept.storage_bytes(), 4 * (5 + HEADS * D) * 4);
    assert_holds(&kept, &[vec![(0, 0), (3, 5)], vec![(1, 1)], vec![(0, 0), (3, 5)]]);
    let err = layer.gather(&[vec![0, 3], vec![1], vec![0, 2]], 4).unwrap_err();
    assert!(matches!(err, CacheError::BadKeep { head: 2, .. }), "{err}");
    let mut compacted = cache.clone();
    compacted.layer_mut(0).unwrap().compact(&[vec![1, 4], vec![0, 2, 3], vec![1, 4]]).unwrap();
    assert_holds(&compacted, &[vec![(1, 1), (4, 9)], vec![(0, 0), (2, 2), (3, 5)], vec![(1, 1), (4, 9)]]);
    // a truncation that would split a group is refused
    assert!(compacted.truncate(&[vec![1, 3, 2]]).is_err());
}

#[test]
fn what_latent_keys_cannot_hold_is_refused() {
    let dev = device();
    let cache = filled(&dev);
    let err = cache.layer(0).unwrap().converted(KvDtype::Q8).unwrap_err();
    assert!(matches!(err, CacheError::Dtype(_)), "{err}");
    // a dense layer whose grouped heads keep different entries cannot share latents
    let mut dense = KvCache::new(CacheGeometry { layers: 1, kv_heads: HEADS, head_dim: D, capacity: 8 }, &dev).unwrap();
    let (k, v) = rows(&[0, 1, 2], &[0, 1, 2], &dev);
    dense.append(0, k, v, &[0, 1, 2]).unwrap();
    let ragged = dense.layer(0).unwrap().gather(&[vec![0, 1], vec![0, 1], vec![0, 2]], 8).unwrap();
    let err = ragged.with_latent_keys(&layout(&dev)).unwrap_err();
    assert!(matches!(err, CacheError::BadKeep { head: 2, .. }), "{err}");
    // a layout of another geometry
    let mut other = KvCache::new(CacheGeometry { layers: 1, kv_heads: 2, head_dim: D, capacity: 8 }, &dev).unwrap();
    assert!(other.with_latent_keys(&[layout(&dev)]).is_err());
}
