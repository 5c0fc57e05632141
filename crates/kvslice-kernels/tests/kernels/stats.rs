//! Kernel 1 against its twin (random shapes) and a hand-computed case.
//!
//! Tolerances (f32 kernel vs f64 twin; `atol` is relative to the array's largest magnitude,
//! see `common::assert_close`): mean, last, value-norm and projection terms rtol 1e-4,
//! atol 1e-5; Jacobian term rtol 1e-3, atol 1e-5 (of the value-norm terms' magnitude where
//! every distance is 0); variance rtol 1e-3, atol 1e-5; per-head entropy and column variance rtol 1e-4,
//! atol 1e-5.

use kvslice_kernels::{StatsRequest, cpu, window_stats};
use proptest::prelude::*;

use crate::common::{Rng, assert_close, device, f3, read};

#[allow(clippy::too_many_arguments)]
fn run_case(kv_heads: usize, group: usize, d: usize, n: usize, extra_cap: usize, w: usize, amplitude: f32, seed: u64) {
    let dev = device();
    let heads = kv_heads * group;
    let cap = n + extra_cap;
    let mut rng = Rng::new(seed);
    let q = rng.vec(heads * w * d, amplitude);
    let k = rng.vec(kv_heads * cap * d, amplitude);
    let v = rng.vec(kv_heads * cap * d, 1.0);
    let want = cpu::window_stats(&q, &k, &v, heads, kv_heads, w, cap, n, d);

    let request = StatsRequest { value_norm: true, projection: true, jacobian: true };
    let got = window_stats(
        &f3(q, [heads, w, d], &dev),
        &f3(k, [kv_heads, cap, d], &dev),
        &f3(v, [kv_heads, cap, d], &dev),
        n,
        request,
    )
    .expect("valid shapes");
    let tag = format!("kv_heads {kv_heads} g {group} d {d} n {n} cap {cap} w {w}");
    assert_eq!(got.mean.dims(), [heads, n]);
    assert_close(&format!("mean ({tag})"), &read(got.mean), &want.mean, 1e-4, 1e-5);
    assert_close(&format!("variance ({tag})"), &read(got.variance), &want.variance, 1e-3, 1e-5);
    assert_close(&format!("last ({tag})"), &read(got.last), &want.last, 1e-4, 1e-5);
    assert_close(&format!("value_norm ({tag})"), &read(got.value_norm.unwrap()), &want.value_norm, 1e-4, 1e-5);
    assert_close(&format!("projection ({tag})"), &read(got.projection.unwrap()), &want.projection, 1e-4, 1e-5);
    // ‖v_j − o_i‖ is 0 when a query sees one key: the floor is then the value norms' scale
    let floor = want.value_norm.iter().fold(0f64, |m, x| m.max(x.abs())) * 1e-5;
    for (i, (&g, &w)) in read(got.jacobian.unwrap()).iter().zip(&want.jacobian).enumerate() {
        let bound = 1e-3 * w.abs() + floor.max(1e-5 * want.jacobian.iter().fold(0f64, |m, x| m.max(x.abs())));
        assert!((f64::from(g) - w).abs() <= bound, "jacobian ({tag})[{i}]: got {g}, want {w}, bound {bound:e}");
    }
    assert_close(&format!("entropy ({tag})"), &read(got.entropy), &want.entropy, 1e-4, 1e-5);
    assert_close(&format!("column_variance ({tag})"), &read(got.column_variance), &want.column_variance, 1e-4, 1e-5);
}

proptest! {
    #![proptest_config(crate::common::gpu_config(14))]

    #[test]
    fn matches_twin_on_random_shapes(
        kv_heads in 1usize..=2,
        group in prop::sample::select(vec![1usize, 3, 4, 8]),
        d in prop::sample::select(vec![64usize, 128, 24, 7]),
        n in 1usize..300,
        extra_cap in 0usize..5,
        w_frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let w = 1 + ((n.min(40) - 1) as f64 * w_frac) as usize;
        run_case(kv_heads, group, d, n, extra_cap, w, 1.0, seed);
    }
}

#[test]
fn long_sequence_and_sharp_scores() {
    // n not a multiple of any workgroup, w past the query tile, scores spread over ±9.
    run_case(2, 4, 128, 2085, 3, 33, 3.0, 7);
    run_case(1, 3, 64, 4099, 0, 32, 1.0, 11);
}

#[test]
fn single_key_single_query() {
    run_case(1, 1, 64, 1, 0, 1, 1.0, 3);
    run_case(2, 8, 128, 1, 2, 1, 1.0, 4);
}

#[test]
fn hand_computed_uniform_scores() {
    // q = 0 makes every visible weight uniform. n = 3, w = 2: query 0 (position 1) sees keys 0,1
    // with 1/2 each; query 1 (position 2) sees keys 0,1,2 with 1/3 each.
    let dev = device();
    let q = f3(vec![0.0, 0.0], [1, 2, 1], &dev);
    let k = f3(vec![0.3, -0.7, 0.1], [1, 3, 1], &dev);
    let v = f3(vec![1.0, 2.0, 3.0], [1, 3, 1], &dev);
    let s = window_stats(&q, &k, &v, 3, StatsRequest { value_norm: true, projection: true, jacobian: true }).unwrap();
    let third = 1.0 / 3.0;
    let mean = [(0.5 + third) / 2.0, (0.5 + third) / 2.0, third / 2.0];
    // unbiased over two queries: (a0 − a1)² / 2
    let var = [(0.5 - third) * (0.5 - third) / 2.0, (0.5 - third) * (0.5 - third) / 2.0, third * third / 2.0];
    assert_close("mean", &read(s.mean), &mean, 1e-5, 1e-6);
    assert_close("variance", &read(s.variance), &var, 1e-4, 1e-6);
    assert_close("last", &read(s.last), &[third, third, third], 1e-5, 1e-6);
    // ‖v_j‖ = 1, 2, 3
    assert_close("value_norm", &read(s.value_norm.unwrap()), &[mean[0], 2.0 * mean[1], 3.0 * mean[2]], 1e-5, 1e-6);
    // o_0 = 1.5, o_1 = 2: both directions +1, so the projection is mean_q a_qj v_j as well
    assert_close("projection", &read(s.projection.unwrap()), &[mean[0], 2.0 * mean[1], 3.0 * mean[2]], 1e-5, 1e-6);
    // prefix = key 0 only
    let h = |a: f64| -a * (a + 1e-10).ln();
    assert_close("entropy", &read(s.entropy), &[(h(0.5) + h(third)) / 2.0], 1e-5, 1e-6);
    assert_close("column_variance", &read(s.column_variance), &[var[0]], 1e-4, 1e-6);
}

#[test]
fn optional_terms_absent_unless_requested() {
    let dev = device();
    let mut rng = Rng::new(5);
    let q = f3(rng.vec(2 * 4 * 64, 1.0), [2, 4, 64], &dev);
    let k = f3(rng.vec(2 * 70 * 64, 1.0), [2, 70, 64], &dev);
    let v = f3(rng.vec(2 * 70 * 64, 1.0), [2, 70, 64], &dev);
    let s = window_stats(&q, &k, &v, 70, StatsRequest::default()).unwrap();
    assert!(s.value_norm.is_none() && s.projection.is_none());
    // Each window query's weights sum to one, so the mean weights of a head sum to one too.
    let mean = read(s.mean);
    for h in 0..2 {
        let total: f64 = mean[h * 70..(h + 1) * 70].iter().map(|&x| f64::from(x)).sum();
        assert!((total - 1.0).abs() < 1e-4, "head {h}: Σ mean = {total}");
    }
}
