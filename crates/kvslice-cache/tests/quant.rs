//! KV quantization (KIVI's layout) against a host reference written from the paper's
//! definition: keys per channel over groups of `KEY_GROUP` slots, values per token, asymmetric,
//! steps and minimums rounded through f16 where the device stores f16. On Burn's CPU backend
//! and on wgpu (lavapipe in CI; no skipping without an adapter).

use burn::tensor::{DType, Device, DeviceKind, Tensor, TensorData};
use kvslice_cache::{CacheGeometry, KEY_GROUP, KvCache, KvDtype, KvStore, LayerKv, quantize_group, value_group};

const KV: usize = 2;
const D: usize = 16;

fn wgpu() -> Device {
    #[cfg(target_os = "linux")]
    if let Ok(d) = Device::wgpu_options().graphics_api(burn::tensor::wgpu::WgpuBackend::Vulkan).init() {
        return d;
    }
    Device::wgpu(DeviceKind::DefaultDevice)
}

fn devices() -> Vec<Device> {
    vec![Device::flex(), wgpu()]
}

/// Deterministic values in about [-3, 3], with a per-channel offset for the keys (KIVI's
/// outlier channels) when `offset`.
fn data(n: usize, seed: u64, offset: bool) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..KV * n * D)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f32 / (1u64 << 53) as f32;
            let channel = (i % D) as f32;
            (u * 6.0 - 3.0) + if offset { channel - 8.0 } else { 0.0 }
        })
        .collect()
}

fn tensor(v: &[f32], n: usize, dev: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::new(v.to_vec(), [KV, n, D]), dev)
}

fn read(t: Tensor<3>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().unwrap()
}

/// The reference dequantization of `n` sealed slots per head (`[KV, n, D]` row-major).
fn reference(keys: &[f32], values: &[f32], n: usize, bits: u32, half: bool) -> (Vec<f32>, Vec<f32>) {
    let mut k = vec![0.0; keys.len()];
    for h in 0..KV {
        for g in (0..n).step_by(KEY_GROUP) {
            let end = (g + KEY_GROUP).min(n);
            for c in 0..D {
                let at = |s: usize| (h * n + s) * D + c;
                let group: Vec<f32> = (g..end).map(|s| keys[at(s)]).collect();
                let (codes, step, lo) = quantize_group(&group, bits, half);
                for (s, code) in (g..end).zip(codes) {
                    k[at(s)] = lo + code as f32 * step;
                }
            }
        }
    }
    let vg = value_group(D);
    let mut v = vec![0.0; values.len()];
    for (row, chunk) in values.chunks(vg).enumerate() {
        let (codes, step, lo) = quantize_group(chunk, bits, half);
        for (i, code) in codes.into_iter().enumerate() {
            v[row * vg + i] = lo + code as f32 * step;
        }
    }
    (k, v)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn filled(n: usize, capacity: usize, dev: &Device) -> (KvCache, Vec<f32>, Vec<f32>) {
    let g = CacheGeometry { layers: 1, kv_heads: KV, head_dim: D, capacity };
    let mut cache = KvCache::new(g, dev).unwrap();
    let (k, v) = (data(n, 1, true), data(n, 2, false));
    let positions: Vec<u32> = (0..n as u32).collect();
    cache.append(0, tensor(&k, n, dev), tensor(&v, n, dev), &positions).unwrap();
    (cache, k, v)
}

#[test]
fn hand_computed_groups() {
    // 4 bits over [0, 15]: step 1, codes are the values
    let (codes, step, lo) = quantize_group(&[0.0, 1.0, 2.0, 3.0, 15.0], 4, false);
    assert_eq!((codes, step, lo), (vec![0, 1, 2, 3, 15], 1.0, 0.0));
    // [-1, 2] at 8 bits: step 3/255; 0.5 is 1.5/step = 127.5 steps above -1 → 128 (half away)
    let (codes, step, lo) = quantize_group(&[-1.0, 2.0, 0.5], 8, false);
    assert_eq!((codes, lo), (vec![0, 255, 128], -1.0));
    assert!((step - 3.0 / 255.0).abs() < 1e-7);
    // a constant group: step 0, every code 0, the value is the minimum
    assert_eq!(quantize_group(&[4.0, 4.0], 4, true), (vec![0, 0], 0.0, 4.0));
}

#[test]
fn conversion_matches_the_reference_and_its_bytes() {
    for dev in devices() {
        let half = dev.supports_dtype(DType::F16);
        let n = 100; // one full key group and a partial one
        for (dtype, bits) in [(KvDtype::Q8, 8), (KvDtype::Q4, 4)] {
            let (mut cache, k, v) = filled(n, 110, &dev);
            cache.convert(dtype).unwrap();
            assert_eq!(cache.dtype(), dtype);
            let layer = cache.layer(0).unwrap();
            assert!(layer.storage().is_none());
            let (qk, qv) = layer.view();
            let (rk, rv) = reference(&k, &v, n, bits, half);
            let (got_k, got_v) = (read(qk), read(qv));
            assert!(max_diff(&got_k, &rk) < 1e-4, "{dtype} keys on {dev:?}: {}", max_diff(&got_k, &rk));
            assert!(max_diff(&got_v, &rv) < 1e-4, "{dtype} values on {dev:?}: {}", max_diff(&got_v, &rv));
            // the error is within half a step of the widest group (keys span about 6, values 6)
            let bound = 6.5 / ((1 << bits) - 1) as f32 * 0.5 + 0.01;
            assert!(max_diff(&got_k, &k) < bound && max_diff(&got_v, &v) < bound);

            // Real element sizes: i32 words of codes, steps and minimums in f16 or f32.
            let scale = if half { 2 } else { 4 };
            let words = 2 * KV * 110 * D * bits as usize / 32 * 4;
            let k_scales = 2 * KV * 110usize.div_ceil(KEY_GROUP) * D * scale;
            let v_scales = 2 * KV * 110 * (D / value_group(D)) * scale;
            assert_eq!(layer.storage_bytes(), words + k_scales + v_scales);
            assert!(layer.storage_bytes() * (32 / bits as usize) / 2 < 2 * KV * 110 * D * 4);
        }
    }
}

#[test]
fn appends_wait_at_full_precision_until_their_group_fills() {
    for dev in devices() {
        let n = 100;
        let (mut cache, _, _) = filled(n, 140, &dev);
        cache.convert(KvDtype::Q4).unwrap();
        let before = read(cache.layer(0).unwrap().view().0);
        let (nk, nv) = (data(40, 3, true), data(40, 4, false));
        let row = |x: &[f32], t: usize| -> Vec<f32> {
            (0..KV).flat_map(|h| x[(h * 40 + t) * D..(h * 40 + t + 1) * D].to_vec()).collect()
        };
        for t in 0..40 {
            let one = |x: &[f32]| Tensor::from_data(TensorData::new(row(x, t), [KV, 1, D]), &dev);
            cache.append(0, one(&nk), one(&nv), &[(n + t) as u32]).unwrap();
            let (k, v) = cache.layer(0).unwrap().view();
            let (k, v) = (read(k), read(v));
            let len = n + t + 1;
            let at = |h: usize, s: usize| (h * len + s) * D;
            for h in 0..KV {
                // the first key group is untouched by later seals (requantization is exact)
                let first = &k[at(h, 0)..at(h, KEY_GROUP)];
                assert!(max_diff(first, &before[h * n * D..h * n * D + KEY_GROUP * D]) < 1e-5);
                let newest = &k[at(h, len - 1)..at(h, len)];
                if len != 2 * KEY_GROUP {
                    // until its group completes a new row is held at full precision
                    assert_eq!(newest, &row(&nk, t)[h * D..(h + 1) * D], "slot {}", len - 1);
                    assert_eq!(&v[at(h, len - 1)..at(h, len)], &row(&nv, t)[h * D..(h + 1) * D]);
                }
            }
            if len == 2 * KEY_GROUP {
                // the group 64..128 sealed: its rows are quantized now, within half a step
                for h in 0..KV {
                    let got = &k[at(h, 100)..at(h, 101)];
                    let want = &row(&nk, 0)[h * D..(h + 1) * D];
                    assert!(max_diff(got, want) < 8.0 / 15.0 * 0.5 + 0.01);
                    assert_ne!(got, want);
                }
            }
        }
    }
}

#[test]
fn gathers_truncation_and_f16_keep_the_entries() {
    for dev in devices() {
        let n = 100;
        let (mut cache, k, _) = filled(n, 100, &dev);
        let full = read(cache.layer(0).unwrap().view().0);
        cache.convert(KvDtype::Q8).unwrap();
        let quantized = read(cache.layer(0).unwrap().view().0);
        // gather slots 10..90 of head 0 and 0..50 of head 1
        let layer: &LayerKv = cache.layer(0).unwrap();
        let kept = vec![(10..90).collect::<Vec<u32>>(), (0..50).collect()];
        let small = layer.gather(&kept, 96).unwrap();
        assert_eq!((small.dtype(), small.lens()), (KvDtype::Q8, &[80usize, 50][..]));
        assert_eq!(small.head_positions(0)[0], 10);
        let got = read(small.view().0);
        let step = 6.5 / 255.0;
        for (i, s) in (10..90).enumerate() {
            let (g, w) = (&got[i * D..(i + 1) * D], &quantized[s * D..(s + 1) * D]);
            assert!(max_diff(g, w) < step * 0.5 + 1e-4, "slot {s}");
        }
        // truncation below a sealed slot keeps the rest
        let mut cut = KvCache::from_layers(vec![small]).unwrap();
        cut.truncate(&[vec![30, 20]]).unwrap();
        assert_eq!(cut.layer(0).unwrap().lens(), &[30, 20]);
        let got = read(cut.layer(0).unwrap().view().0);
        assert!(max_diff(&got[..D], &k[10 * D..11 * D]) < step + 1e-4);

        // f16: the values rounded to f16, read back as f32
        if dev.supports_dtype(DType::F16) {
            let (mut cache, _, _) = filled(n, 100, &dev);
            cache.convert(KvDtype::F16).unwrap();
            let layer = cache.layer(0).unwrap();
            assert_eq!((layer.dtype(), layer.storage_bytes()), (KvDtype::F16, 2 * KV * 100 * D * 2));
            let want: Vec<f32> = full.iter().map(|&x| burn::tensor::f16::from_f32(x).to_f32()).collect();
            assert_eq!(read(layer.view().0), want);
        }
    }
}

#[test]
fn bad_geometry_and_names_are_errors() {
    assert_eq!("q4".parse::<KvDtype>().unwrap(), KvDtype::Q4);
    let bad = "q3".parse::<KvDtype>().unwrap_err().to_string();
    assert!(bad.contains("`q3`") && bad.contains("f32, f16, q8, q4"), "{bad}");
    let dev = Device::flex();
    let g = CacheGeometry { layers: 1, kv_heads: 1, head_dim: 6, capacity: 4 };
    let mut cache = KvCache::new(g, &dev).unwrap();
    // 6 channels do not fill words of eight 4-bit codes; the cache is left as it was
    let err = cache.convert(KvDtype::Q4).unwrap_err().to_string();
    assert!(err.contains("head dimension of 6"), "{err}");
    assert_eq!(cache.dtype(), KvDtype::F32);
}
