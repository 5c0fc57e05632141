//! Kernel 5 against its twin. Tolerances: output rtol 1e-4, atol 1e-5; weights rtol 1e-4,
//! atol 1e-6 (relative to the array's largest magnitude).

use kvslice_kernels::{cpu, decode_attention};
use proptest::prelude::*;

use crate::common::{Rng, assert_close, device, f2, f3, read};

fn run_case(kv_heads: usize, group: usize, d: usize, cap: usize, lens: &[u32], amplitude: f32, seed: u64) {
    let dev = device();
    let heads = kv_heads * group;
    let mut rng = Rng::new(seed);
    let q = rng.vec(heads * d, amplitude);
    let k = rng.vec(kv_heads * cap * d, amplitude);
    let v = rng.vec(kv_heads * cap * d, 1.0);
    let base: Vec<f32> = (0..kv_heads * cap).map(|_| rng.unit().abs()).collect();
    let (want_out, want_w) = cpu::decode_attention(&q, &k, &v, heads, kv_heads, cap, d, lens);

    let (qt, kt, vt) = (f2(q, [heads, d], &dev), f3(k, [kv_heads, cap, d], &dev), f3(v, [kv_heads, cap, d], &dev));
    let mut scores = f2(base.clone(), [kv_heads, cap], &dev);
    let tag = format!("kv_heads {kv_heads} g {group} d {d} cap {cap} lens {lens:?}");
    let out = decode_attention(&qt, &kt, &vt, lens, Some(&mut scores)).expect("valid shapes");
    assert_close(&format!("output ({tag})"), &read(out), &want_out, 1e-4, 1e-5);
    // a second step adds the same weights again
    let out2 = decode_attention(&qt, &kt, &vt, lens, Some(&mut scores)).expect("valid shapes");
    assert_close(&format!("output, step 2 ({tag})"), &read(out2), &want_out, 1e-4, 1e-5);
    let want_scores: Vec<f64> = base.iter().zip(&want_w).map(|(&b, &w)| f64::from(b) + 2.0 * w).collect();
    let got_scores = read(scores);
    // The weights land on f32 running scores of up to 1: two roundings there, plus reading
    // the sum back as `score − base`, cost up to 3 half-ulps of the score on top of the
    // weights' own tolerance (a missing or doubled weight is ~1e-4, far above that).
    let scale = want_w.iter().fold(0.0f64, |m, w| m.max(2.0 * w.abs()));
    for (i, ((&g, &b), &w)) in got_scores.iter().zip(&base).zip(&want_w).enumerate() {
        let (got_added, want_added) = (f64::from(g) - f64::from(b), 2.0 * w);
        let rounding = 1.5 * f64::from(f32::EPSILON) * f64::from(g.abs().max(b.abs()));
        let bound = 1e-4 * want_added.abs() + 1e-6 * scale + rounding;
        assert!(
            (got_added - want_added).abs() <= bound,
            "added weights ({tag})[{i}]: got {got_added:e} on a score of {b}, want {want_added:e}, bound {bound:e}"
        );
    }
    assert_close(&format!("scores ({tag})"), &got_scores, &want_scores, 1e-5, 1e-6);
}

proptest! {
    #![proptest_config(crate::common::gpu_config(16))]

    #[test]
    fn matches_twin_on_ragged_caches(
        kv_heads in 1usize..4,
        // groups of 5, 7 and 8 run as two workgroups of 3+2, 4+3 and 4+4 query heads
        group in prop::sample::select(vec![1usize, 2, 3, 4, 5, 7, 8]),
        // 13 and 66 take the one-float path (66: two columns per invocation)
        d in prop::sample::select(vec![64usize, 128, 13, 66]),
        cap in 1usize..1300,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed ^ 2);
        let lens: Vec<u32> = (0..kv_heads)
            .map(|_| match rng.below(4) { 0 => cap as u32, 1 => 0, _ => rng.below(cap + 1) as u32 })
            .collect();
        run_case(kv_heads, group, d, cap, &lens, 1.0, seed);
    }
}

#[test]
fn long_and_sharp() {
    run_case(2, 4, 128, 5000, &[4999, 1], 3.0, 17);
    run_case(3, 3, 64, 2049, &[2049, 512, 513], 1.0, 18);
    run_case(2, 7, 66, 1000, &[257, 1000], 2.0, 19);
}

#[test]
fn without_scores_output_only() {
    let dev = device();
    let mut rng = Rng::new(1);
    let (heads, d, cap) = (4, 64, 100);
    let q = rng.vec(heads * d, 1.0);
    let k = rng.vec(2 * cap * d, 1.0);
    let v = rng.vec(2 * cap * d, 1.0);
    let lens = [77, 100];
    let (want, _) = cpu::decode_attention(&q, &k, &v, heads, 2, cap, d, &lens);
    let out =
        decode_attention(&f2(q, [heads, d], &dev), &f3(k, [2, cap, d], &dev), &f3(v, [2, cap, d], &dev), &lens, None)
            .unwrap();
    assert_close("output", &read(out), &want, 1e-4, 1e-5);
}

#[test]
fn single_slot_returns_its_value() {
    // One slot: the weight is exactly 1 and the output is that slot's value row.
    let dev = device();
    let v: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
    let out = decode_attention(
        &f2(vec![0.5; 64], [1, 64], &dev),
        &f3(vec![0.1; 64 * 3], [1, 3, 64], &dev),
        &f3([v.clone(), vec![9.0; 128]].concat(), [1, 3, 64], &dev),
        &[1],
        None,
    )
    .unwrap();
    let want: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
    assert_close("output", &read(out), &want, 1e-6, 1e-7);
}
