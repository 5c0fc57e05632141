//! The WGSL kernels on the paths they serve, against the Burn-op routes they replace: window
//! statistics in the prefill recorder, and the cache's appends and slot writes. Each kernel
//! route runs on the wgpu device (lavapipe in CI; no skipping without an adapter) and is
//! compared with the Burn-op route on the same device and on the CPU backend.
//! (The decode-time attention weights are tested beside their dispatch, in
//! `src/evict/attention.rs`.)

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_cache::{CacheGeometry, KvCache, KvStore};
use kvslice_runtime::StatsRequest;
use kvslice_runtime::evict::observe::{HostLayerStats, Route, layer_stats_via};

fn wgpu() -> Device {
    pollster::block_on(kvslice_runtime::init_device(kvslice_runtime::DeviceChoice::Wgpu)).expect("a wgpu adapter").0
}

/// Deterministic values in `[-amplitude, amplitude]`.
fn values(seed: u64, len: usize, amplitude: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amplitude
        })
        .collect()
}

fn tensor3(data: &[f32], shape: [usize; 3], device: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

fn read3(t: &Tensor<3>) -> Vec<f32> {
    t.clone().into_data().try_to_vec::<f32>().unwrap()
}

/// `|got − want| ≤ atol·max|want| + rtol·|want|`, and a reference that is not all zeros.
fn close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: an all-zero reference proves nothing");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= atol * scale + rtol * w.abs(), "{what}[{i}]: {g} vs {w} (scale {scale})");
    }
}

struct Case {
    heads: usize,
    kv_heads: usize,
    n: usize,
    d: usize,
}

fn stats(route: Route, case: &Case, device: &Device, request: &StatsRequest) -> HostLayerStats {
    let Case { heads, kv_heads, n, d } = *case;
    // Larger queries make the attention peaked, as in real models.
    let q = values(1, heads * n * d, 3.0);
    let raw = values(4, heads * n * d, 1.0);
    let k = values(2, kv_heads * n * d, 1.0);
    let v = values(3, kv_heads * n * d, 1.0);
    pollster::block_on(layer_stats_via(
        route,
        &tensor3(&q, [heads, n, d], device),
        &tensor3(&raw, [heads, n, d], device),
        &tensor3(&k, [kv_heads, n, d], device),
        &tensor3(&v, [kv_heads, n, d], device),
        request,
        false,
    ))
    .unwrap_or_else(|e| panic!("{route:?}: {e}"))
}

/// Tolerances: f32 on both sides, different summation orders (online softmax and Welford in
/// the kernel, two-pass in Burn). Weights and their means: rtol 1e-4, atol 1e-5 of the array's
/// magnitude; variance, Jacobian (a difference of squares under a root) and leverage (a
/// Newton–Schulz inverse of a Gram matrix built from the Jacobian): rtol 1e-3, atol 1e-4.
fn compare(tag: &str, got: &HostLayerStats, want: &HostLayerStats) {
    assert_eq!(got.windows.len(), want.windows.len(), "{tag}: windows");
    for (g, w) in got.windows.iter().zip(&want.windows) {
        let tag = format!("{tag}, window {}", w.window);
        assert_eq!(g.window, w.window, "{tag}");
        close(&format!("{tag}: mean"), &g.mean, &w.mean, 1e-4, 1e-5);
        close(&format!("{tag}: last"), &g.last, &w.last, 1e-4, 1e-5);
        if w.window > 1 {
            close(&format!("{tag}: var"), &g.var, &w.var, 1e-3, 1e-4);
            close(&format!("{tag}: entropy"), &g.entropy, &w.entropy, 1e-4, 1e-5);
        } else {
            assert!(g.var.iter().all(|&x| x == 0.0), "{tag}: var of one query");
        }
        let opt = |name: &str, a: &Option<Vec<f32>>, b: &Option<Vec<f32>>, rtol, atol| {
            let (a, b) = (a.as_ref().expect(name), b.as_ref().expect(name));
            close(&format!("{tag}: {name}"), a, b, rtol, atol);
        };
        opt("value_weighted", &g.value_weighted, &w.value_weighted, 1e-4, 1e-5);
        opt("projection", &g.projection, &w.projection, 1e-4, 1e-5);
        opt("jacobian", &g.jacobian, &w.jacobian, 1e-3, 1e-4);
        opt("leverage", &g.leverage, &w.leverage, 1e-3, 1e-4);
        opt("accumulated", &g.accumulated, &w.accumulated, 1e-4, 1e-5);
        opt("position_weighted", &g.position_weighted, &w.position_weighted, 1e-3, 1e-4);
    }
}

#[test]
fn window_statistics_kernel_matches_burn_ops() {
    let request = StatsRequest {
        windows: vec![1, 8, 40],
        value_weighted: true,
        projection: true,
        accumulated: true,
        jacobian: true,
        leverage: true,
        position_weighted: true,
        ..StatsRequest::default()
    };
    let cpu = Device::flex();
    for case in [Case { heads: 8, kv_heads: 2, n: 150, d: 64 }, Case { heads: 3, kv_heads: 3, n: 70, d: 128 }] {
        let tag = format!("heads {} kv_heads {} n {} d {}", case.heads, case.kv_heads, case.n, case.d);
        let kernel = stats(Route::Kernel, &case, &wgpu(), &request);
        let burn = stats(Route::BurnOps, &case, &wgpu(), &request);
        let reference = stats(Route::BurnOps, &case, &cpu, &request);
        compare(&format!("{tag}: kernel vs Burn on wgpu"), &kernel, &burn);
        compare(&format!("{tag}: kernel vs Burn on CPU"), &kernel, &reference);
        // the automatic route takes the kernel on wgpu: bit-identical to the forced kernel
        let auto = stats(Route::Auto, &case, &wgpu(), &request);
        for (a, k) in auto.windows.iter().zip(&kernel.windows) {
            assert_eq!((&a.mean, &a.var, &a.jacobian), (&k.mean, &k.var, &k.jacobian), "{tag}: automatic route");
        }
    }
}

#[test]
fn window_statistics_kernel_refuses_the_cpu_backend() {
    let request = StatsRequest { windows: vec![4], ..StatsRequest::default() };
    let case = Case { heads: 2, kv_heads: 1, n: 9, d: 8 };
    let [h, n, d] = [case.heads, case.n, case.d];
    let t = tensor3(&values(1, h * n * d, 1.0), [h, n, d], &Device::flex());
    let k = tensor3(&values(2, n * d, 1.0), [1, n, d], &Device::flex());
    let got = pollster::block_on(layer_stats_via(Route::Kernel, &t, &t, &k, &k, &request, false));
    assert!(got.is_err(), "the kernel route must not run on the CPU backend");
}

/// Keys and values of a layer's whole storage, read back.
type Snapshot = (Vec<f32>, Vec<f32>);

/// A cache of one layer, filled by a uniform prefill and then ragged per-head slot writes (new
/// slots and overwrites), on `device`; returns the cache and its storage read back after each
/// step.
fn fill(device: &Device, kv_heads: usize, d: usize, cap: usize) -> (KvCache, Vec<Snapshot>) {
    let geometry = CacheGeometry { layers: 1, kv_heads, head_dim: d, capacity: cap };
    let mut cache = KvCache::new(geometry, device).unwrap();
    let mut steps = Vec::new();
    let snapshot = |cache: &KvCache| {
        let (k, v) = cache.layer(0).unwrap().storage().unwrap();
        (read3(k), read3(v))
    };
    let n = cap / 2;
    let positions: Vec<u32> = (0..n as u32).collect();
    let k = tensor3(&values(10, kv_heads * n * d, 1.0), [kv_heads, n, d], device);
    let v = tensor3(&values(11, kv_heads * n * d, 1.0), [kv_heads, n, d], device);
    cache.append(0, k, v, &positions).unwrap();
    steps.push(snapshot(&cache));
    for step in 0..6usize {
        let position = (n + step) as u32;
        let layer = cache.layer_mut(0).unwrap();
        // head h: a new slot in its first h + 1 steps, then overwrites of slot (3·step + h)
        let slots: Vec<usize> =
            (0..kv_heads).map(|h| if step <= h { layer.lens()[h] } else { (3 * step + h) % layer.lens()[h] }).collect();
        let k = tensor3(&values(20 + step as u64, kv_heads * d, 2.0), [kv_heads, 1, d], device);
        let v = tensor3(&values(40 + step as u64, kv_heads * d, 2.0), [kv_heads, 1, d], device);
        layer.write_slots(&slots, k, v, position).unwrap();
        steps.push(snapshot(&cache));
    }
    // ragged append: heads of different lengths each append at their own end
    let lens = cache.layer(0).unwrap().lens().to_vec();
    assert!(lens.iter().any(|&l| l != lens[0]), "the lengths are ragged before the append");
    let k = tensor3(&values(60, kv_heads * 3 * d, 1.0), [kv_heads, 3, d], device);
    let v = tensor3(&values(61, kv_heads * 3 * d, 1.0), [kv_heads, 3, d], device);
    cache.append(0, k, v, &[1000, 1001, 1002]).unwrap();
    steps.push(snapshot(&cache));
    (cache, steps)
}

#[test]
fn cache_row_writes_match_burn_ops_bit_for_bit() {
    for (kv_heads, d, cap) in [(4usize, 64usize, 40usize), (2, 128, 33), (3, 200, 20)] {
        let (gpu_cache, gpu_steps) = fill(&wgpu(), kv_heads, d, cap);
        let (cpu_cache, cpu_steps) = fill(&Device::flex(), kv_heads, d, cap);
        assert_eq!(gpu_cache.layer(0).unwrap().lens(), cpu_cache.layer(0).unwrap().lens());
        assert_eq!(gpu_cache.layer(0).unwrap().positions(), cpu_cache.layer(0).unwrap().positions());
        for (step, (g, c)) in gpu_steps.iter().zip(&cpu_steps).enumerate() {
            // data moves as raw words: the same bits
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&g.0), bits(&c.0), "keys after step {step} (kv_heads {kv_heads}, d {d})");
            assert_eq!(bits(&g.1), bits(&c.1), "values after step {step} (kv_heads {kv_heads}, d {d})");
        }
    }
}

/// A one-layer wgpu cache (2 KV heads of 64, 16 slots) holding 4 rows, and a maker of more rows.
fn four_rows_cached() -> (KvCache, impl Fn(u64, usize) -> Tensor<3>) {
    let device = wgpu();
    let (kv_heads, d, cap) = (2usize, 64usize, 16usize);
    let geometry = CacheGeometry { layers: 1, kv_heads, head_dim: d, capacity: cap };
    let mut cache = KvCache::new(geometry, &device).unwrap();
    let rows = move |seed, n| tensor3(&values(seed, kv_heads * n * d, 1.0), [kv_heads, n, d], &device);
    cache.append(0, rows(1, 4), rows(2, 4), &[0, 1, 2, 3]).unwrap();
    (cache, rows)
}

#[test]
fn cache_row_writes_stay_in_place_and_leave_clones_alone() {
    let (mut cache, rows) = four_rows_cached();
    let before = kvslice_kernels::buffer_id(cache.layer(0).unwrap().storage().unwrap().0).unwrap();
    cache.layer_mut(0).unwrap().write_slots(&[4, 1], rows(3, 1), rows(4, 1), 4).unwrap();
    let after = kvslice_kernels::buffer_id(cache.layer(0).unwrap().storage().unwrap().0).unwrap();
    assert_eq!(before, after, "an unshared cache is written in place");

    let snapshot = cache.clone();
    let kept = read3(snapshot.layer(0).unwrap().storage().unwrap().0);
    cache.append(0, rows(5, 2), rows(6, 2), &[5, 6]).unwrap();
    assert_eq!(read3(snapshot.layer(0).unwrap().storage().unwrap().0), kept, "the clone keeps its contents");
    assert_ne!(read3(cache.layer(0).unwrap().storage().unwrap().0), kept, "the cache took the rows");
}

#[test]
fn dispatches_are_counted_as_they_are_submitted() {
    use kvslice_runtime::dispatch::{self, OTHER};
    let (mut cache, rows) = four_rows_cached();
    // an append into an unshared cache is one launch of the append shader (the rows and
    // positions are uploads, not dispatches)
    let (k, v) = (rows(3, 2), rows(4, 2));
    let ((), counted) = dispatch::count(|| cache.append(0, k, v, &[4, 5]).unwrap());
    let want = [((OTHER.to_string(), "wgsl:append/append".to_string()), 1)];
    assert_eq!(counted.by_kernel, want.into_iter().collect());
    // one element-wise sum is one Burn kernel, counted in the scope that issued it; a count
    // inside another adds to both
    let (a, b) = (rows(5, 3), rows(6, 3));
    let ((sum, inner), outer) = dispatch::count(|| {
        let _layer = dispatch::scope("layer");
        dispatch::count(|| a.clone() + b.clone())
    });
    assert_eq!((inner.total(), inner.in_scope("layer")), (1, 1), "{inner:?}");
    assert_eq!(outer, inner);
    let name = &inner.by_kernel.keys().next().unwrap().1;
    assert!(name.contains("Binop"), "{name}");
    let want: Vec<f32> = read3(&a).iter().zip(read3(&b)).map(|(x, y)| x + y).collect();
    assert_eq!(read3(&sum), want);
    // the CPU backend launches nothing
    let cpu = Device::flex();
    let x = tensor3(&values(7, 8, 1.0), [2, 2, 2], &cpu);
    let (_, counted) = dispatch::count(|| x.clone() + x.clone());
    assert_eq!(counted.total(), 0);
}
