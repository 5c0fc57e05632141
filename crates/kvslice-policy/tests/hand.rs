//! Hand-computed small cases for pooling, selection, every scorer, every allocator, the ladder
//! and the reference statistics. The expected numbers are worked out in the comments.

use kvslice_policy::alloc::{
    AdaKv, AdaMode, Allocator, Cake, CakeCascade, LayerScores, PyramidKv, Uniform, adjust_budgets,
};
use kvslice_policy::reference::{self, Dims};
use kvslice_policy::scorer::Scorer;
use kvslice_policy::*;

fn close(a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((f64::from(*x) - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

/// Statistics with only the given fields filled, the rest zero.
fn stats(heads: usize, kv_heads: usize, len: usize, window: usize) -> WindowStats {
    WindowStats {
        heads,
        kv_heads,
        len,
        window,
        mean: vec![0.0; heads * len],
        var: vec![0.0; heads * len],
        last: vec![0.0; heads * len],
        entropy: vec![0.0; heads],
        ..WindowStats::default()
    }
}

#[test]
fn pooling_matches_torch_semantics() {
    let x = [1.0, 2.0, 3.0, 4.0, 5.0];
    // avg: zero padding counts: (0+1+2)/3, …, (4+5+0)/3
    close(&Pooling::Avg(3).apply(&x), &[1.0, 2.0, 3.0, 4.0, 3.0], 1e-6);
    close(&Pooling::Max(3).apply(&x), &[2.0, 3.0, 4.0, 5.0, 5.0], 0.0);
    close(&Pooling::None.apply(&x), &[1.0, 2.0, 3.0, 4.0, 5.0], 0.0);
    assert!(Pooling::Avg(4).validate("t").is_err());
    assert!(Pooling::Max(0).validate("t").is_err());
}

#[test]
fn selection_rules() {
    let s = [0.5, 0.1, 0.9, 0.9, 0.2, 0.3];
    assert_eq!(select_top_k(&s, 3, Protect::NONE).unwrap(), vec![0, 2, 3]);
    // ties go to the lower position
    assert_eq!(select_top_k(&[1.0; 4], 2, Protect::NONE).unwrap(), vec![0, 1]);
    // protected 0 and 5 count in k; of 1..=4 (0.1, 0.9, 0.9, 0.2) the best is 2 (tie with 3)
    let p = Protect { sinks: 1, recent: 1 };
    assert_eq!(select_top_k(&s, 3, p).unwrap(), vec![0, 2, 5]);
    assert_eq!(select_top_k(&s, 1, p), Err(PolicyError::BudgetBelowProtected { budget: 1, protected: 2 }));
    assert_eq!(select_top_k(&s, 0, p).unwrap(), Vec::<u32>::new());
    assert_eq!(select_top_k(&s, 6, p).unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(select_top_k(&s, 99, p).unwrap().len(), 6);
    assert!(matches!(select_top_k(&[0.0, f32::NAN], 1, Protect::NONE), Err(PolicyError::NonFinite { .. })));
    // +inf is a legal "keep first"
    assert_eq!(select_top_k(&[0.0, f32::INFINITY, 1.0], 1, Protect::NONE).unwrap(), vec![1]);
}

#[test]
fn snapkv_pools_the_prefix_per_head_then_averages_the_group() {
    // 2 query heads on 1 KV head, n = 6, w = 2, prefix 4.
    let mut s = stats(2, 1, 6, 2);
    s.mean[..4].copy_from_slice(&[0.125, 0.5, 0.25, 0.375]);
    s.mean[6..10].copy_from_slice(&[0.375, 0.0, 0.25, 0.5]);
    // avg-pool 3: h0 = [.625, .875, 1.125, .625]/3, h1 = [.375, .625, .75, .75]/3
    // group mean = [1/6, 1.5/6, 1.875/6, 1.375/6]
    let snap = SnapKv::new(2, Pooling::Avg(3), GroupReduce::Mean).unwrap();
    let sc = snap.score(&ScoreInput::new(&s, 4)).unwrap();
    close(sc.row(0), &[1.0 / 6.0, 0.25, 0.3125, 1.375 / 6.0, 0.0, 0.0], 1e-6);
    assert_eq!(snap.protect(4), Protect { sinks: 0, recent: 2 });
    assert_eq!(select_top_k(sc.row(0), 4, snap.protect(4)).unwrap(), vec![1, 2, 4, 5]);
    assert_eq!(select_top_k(sc.row(0), 3, snap.protect(3)).unwrap(), vec![2, 4, 5]);
    // max-pool 3: h0 = [.5, .5, .5, .375], h1 = [.375, .375, .5, .5] → [.4375, .4375, .5, .4375]
    let snap = SnapKv::new(2, Pooling::Max(3), GroupReduce::Mean).unwrap();
    close(snap.score(&ScoreInput::new(&s, 4)).unwrap().row(0), &[0.4375, 0.4375, 0.5, 0.4375, 0.0, 0.0], 1e-7);
    // and GQA by max instead of mean, avg-pool 3: max(h0, h1) = [.625, .875, 1.125, .75]/3
    let snap = SnapKv::new(2, Pooling::Avg(3), GroupReduce::Max).unwrap();
    close(
        snap.score(&ScoreInput::new(&s, 4)).unwrap().row(0),
        &[0.625 / 3.0, 0.875 / 3.0, 0.375, 0.25, 0.0, 0.0],
        1e-6,
    );
    // statistics over another window are refused
    assert!(matches!(SnapKv::default().score(&ScoreInput::new(&s, 4)), Err(PolicyError::Window { .. })));
}

#[test]
fn cake_indicator_is_mean_plus_gamma_variance() {
    let mut s = stats(1, 1, 4, 2);
    s.mean[..2].copy_from_slice(&[0.25, 0.5]);
    s.var[..2].copy_from_slice(&[0.001, 0.0]);
    // 0.25 + 200·0.001 = 0.45, 0.5 + 0 = 0.5
    let c = CakeIndicator::new(2, 200.0, Pooling::None).unwrap();
    close(c.score(&ScoreInput::new(&s, 3)).unwrap().row(0), &[0.45, 0.5, 0.0, 0.0], 1e-6);
    assert!(CakeIndicator::new(1, 200.0, Pooling::None).is_err());
    assert!(CakeIndicator::new(32, -1.0, Pooling::None).is_err());
}

#[test]
fn cake_preference() {
    let mut s = stats(2, 1, 4, 2);
    s.entropy = vec![0.5, 1.0];
    s.var = vec![0.01, 0.03, 0.9, 0.9, 0.02, 0.04, 0.9, 0.9];
    // H = w·Σ entropy = 2·1.5 = 3; V = Σ over the prefix (2 keys) = 0.1 (window columns ignored)
    assert!((s.dispersion() - 3.0).abs() < 1e-6);
    assert!((s.column_variance_sum() - 0.1).abs() < 1e-6);
    assert!((Cake::default().preference(&s) - 0.3).abs() < 1e-6);
    // τ1 = 2, τ2 = 0.5: √3 · 0.1² = 0.0173205
    assert!((Cake::new(2.0, 0.5).unwrap().preference(&s) - 0.017_320_508).abs() < 1e-7);
    assert!(Cake::new(0.0, 1.0).is_err());
}

#[test]
fn cake_budgets_and_cascade() {
    // cakekv's adjust_budgets: [25, 5, 0] capped at 10 → excess 15 spread over the two others
    // (7 each, remainder 1 to the first) → [10, 13, 7]; it does not re-cap.
    assert_eq!(adjust_budgets(&[25.0, 5.0, 0.0], 30, 10), vec![10, 13, 7]);
    // truncation [3, 2, 4] leaves 1 for the first layer below the cap
    assert_eq!(adjust_budgets(&[3.7, 2.2, 4.1], 10, 10), vec![4, 2, 4]);
    // kvslice caps again and gives the shortfall to the layers below the cap: [10, 10, 10]
    assert_eq!(Cake::default().prefix_budgets(&[5.0, 1.0, 0.0], 30, 10), vec![10, 10, 10]);
    // preferences 1 : 3, n = 10, w = 2, 6 per layer: prefix total (6−2)·2 = 8 → [2, 6] + w
    let mut c = CakeCascade::new(Cake::default(), 2, 10, 6, 2).unwrap();
    // stage 0 alone would take all 8 prefix tokens: capped at n − w = 8 → 10 (everything)
    assert_eq!(c.push_preference(1.0), &[10]);
    assert_eq!(c.push_preference(3.0), &[4, 8]);
    assert!(c.done());
    assert!(matches!(CakeCascade::new(Cake::default(), 2, 10, 1, 2), Err(PolicyError::BudgetBelowProtected { .. })));
}

#[test]
fn tova_averages_the_last_query_over_all_heads() {
    let mut s = stats(2, 1, 3, 1);
    s.last = vec![0.5, 0.25, 0.25, 0.0, 0.5, 0.5];
    let sc = Tova.score(&ScoreInput::new(&s, 2)).unwrap();
    close(sc.row(0), &[0.25, 0.375, 0.375], 1e-7);
    assert_eq!(select_top_k(sc.row(0), 2, Tova.protect(2)).unwrap(), vec![1, 2]);
}

#[test]
fn knorm_keeps_small_keys() {
    let s = stats(1, 1, 3, 1);
    let keys = [3.0, 4.0, 1.0, 0.0, 0.0, 2.0];
    let kv = KvView { kv_heads: 1, len: 3, head_dim: 2, keys: Some(&keys), values: None };
    let input = ScoreInput { kv: Some(kv), ..ScoreInput::new(&s, 2) };
    let sc = Knorm.score(&input).unwrap();
    close(sc.row(0), &[-5.0, -1.0, -2.0], 1e-7);
    assert_eq!(select_top_k(sc.row(0), 2, Knorm.protect(2)).unwrap(), vec![1, 2]);
    assert!(matches!(Knorm.score(&ScoreInput::new(&s, 2)), Err(PolicyError::MissingInput { .. })));
}

#[test]
fn streaming_llm_keeps_sinks_and_recent() {
    let s = stats(1, 1, 10, 1);
    let st = StreamingLlm::default();
    let sc = st.score(&ScoreInput::new(&s, 6)).unwrap();
    assert_eq!(select_top_k(sc.row(0), 6, st.protect(6)).unwrap(), vec![0, 1, 2, 3, 8, 9]);
}

#[test]
fn h2o_heavy_hitters_and_recent_half() {
    let mut s = stats(1, 1, 4, 1);
    s.accumulated = Some(vec![2.0, 1.0, 0.9, 0.5]);
    // kvpress: divided by the queries that see each key (4, 3, 2, 1) → [.5, .333, .45, .5]
    let kvp = H2o::kvpress();
    let sc = kvp.score(&ScoreInput::new(&s, 2)).unwrap();
    close(sc.row(0), &[0.5, 1.0 / 3.0, 0.45, 0.5], 1e-6);
    assert_eq!(select_top_k(sc.row(0), 2, kvp.protect(2)).unwrap(), vec![0, 3]);
    // paper: ⌊0.5·3⌋ = 1 recent token, then the two heaviest of the rest
    let h = H2o::default();
    assert_eq!(h.protect(3), Protect { sinks: 0, recent: 1 });
    let sc = h.score(&ScoreInput::new(&s, 3)).unwrap();
    assert_eq!(select_top_k(sc.row(0), 3, h.protect(3)).unwrap(), vec![0, 1, 3]);
    assert!(H2o::new(1.0, false).is_err());
}

#[test]
fn expected_attention_by_hand() {
    // One head, d = 2, inverse frequency 0 (R̄ = I), no sinks.
    // μ = (1, 0), keys (1,0), (0,1), (−1,0), values of norm 1, 2, 3.
    let rope = Rope::from_inv_freq(vec![0.0]).unwrap();
    let s = stats(1, 1, 3, 1);
    let keys = [1.0, 0.0, 0.0, 1.0, -1.0, 0.0];
    let values = [1.0, 0.0, 0.0, 2.0, 3.0, 0.0];
    let kv = KvView { kv_heads: 1, len: 3, head_dim: 2, keys: Some(&keys), values: Some(&values) };
    let mut qm = QueryMoments { heads: 1, head_dim: 2, mean: vec![1.0, 0.0], cov: vec![0.0; 4] };
    let ea = ExpectedAttention::with(rope.clone(), 4, 0, true, true, 0.0).unwrap();
    let input = ScoreInput { kv: Some(kv), query_moments: Some(&qm), ..ScoreInput::new(&s, 2) };
    // logits (1/√2)·(1, 0, −1) → softmax (2.028115, 1, 0.493069)/3.521184 = (.575975, .283996, .140029)
    // times ‖v‖ = (1, 2, 3) → (.575975, .567992, .420087)
    close(ea.score(&input).unwrap().row(0), &[0.575_975, 0.567_992, 0.420_087], 2e-6);
    // covariance diag(0, 1) adds k_y²/(2d) = (0, .25, 0): exps (2.028115, 1.284025, .493069)/3.805209
    // = (.532984, .337439, .129577), times ‖v‖ → (.532984, .674878, .388731)
    qm.cov = vec![0.0, 0.0, 0.0, 1.0];
    let input = ScoreInput { kv: Some(kv), query_moments: Some(&qm), ..ScoreInput::new(&s, 2) };
    close(ea.score(&input).unwrap().row(0), &[0.532_984, 0.674_878, 0.388_731], 2e-6);
    // without covariance the quadratic term is ignored
    let ea = ExpectedAttention::with(rope, 4, 0, false, true, 0.0).unwrap();
    close(ea.score(&input).unwrap().row(0), &[0.575_975, 0.567_992, 0.420_087], 2e-6);
}

#[test]
fn rope_rotation_and_its_average() {
    let rope = Rope::llama(10_000.0, 2).unwrap();
    let mut x = [1.0f32, 0.0];
    rope.rotate(&mut x, 1);
    close(&x, &[1f64.cos(), 1f64.sin()], 1e-7);
    // mean over positions 1 and 2 of [[cos t, −sin t], [sin t, cos t]]
    let r = rope.mean_rotation(1, 2);
    let (c, s) = ((1f64.cos() + 2f64.cos()) / 2.0, (1f64.sin() + 2f64.sin()) / 2.0);
    for (a, b) in r.iter().zip([c, -s, s, c]) {
        assert!((a - b).abs() < 1e-12);
    }
    assert!(Rope::llama(10_000.0, 3).is_err());
}

#[test]
fn andpro_and_counter_causal_read_their_statistics() {
    let mut s = stats(1, 1, 3, 1);
    s.projection = Some(vec![0.2, -0.1, 0.5]);
    let a = AnDPro::new(1, Pooling::None).unwrap();
    let sc = a.score(&ScoreInput::new(&s, 2)).unwrap();
    close(sc.row(0), &[0.2, -0.1, 0.0], 1e-7);
    assert_eq!(select_top_k(sc.row(0), 2, a.protect(2)).unwrap(), vec![0, 2]);
    // counter-causal sums (0.5, 1.5, 1.0) over 1, 2, 3 seeing queries → (0.5, 0.75, 0.333)
    s.counter_causal = Some(vec![0.5, 1.5, 1.0]);
    let cc = CounterCausal::new(0, 0, false);
    close(cc.score(&ScoreInput::new(&s, 2)).unwrap().row(0), &[0.5, 0.75, 1.0 / 3.0], 1e-6);
    assert_eq!(CounterCausal::default().layers_to_run(3), vec![0, 1, 2]);
    assert_eq!(CounterCausal::new(4, 32, true).layers_to_run(3), vec![2]);
}

#[test]
fn critical_kv_two_stages() {
    // inner Knorm: norms 1..4 → scores −1..−4; ε = 0; ‖v W_o‖₁ = (1, 1, 10, 0.1); budget 2
    // stage 1 (⌊2·0.5⌋ = 1): position 0; stage 2: (−2·1, −3·10, −4·0.1) → best is 3
    let s = stats(1, 1, 4, 1);
    let keys = [1.0, 2.0, 3.0, 4.0];
    let proj = [1.0, 1.0, 10.0, 0.1];
    let kv = KvView { kv_heads: 1, len: 4, head_dim: 1, keys: Some(&keys), values: None };
    let c = CriticalKv::with(Box::new(Knorm), 0.0, 0.5).unwrap();
    let input = ScoreInput { kv: Some(kv), value_proj_l1: Some(&proj), ..ScoreInput::new(&s, 2) };
    let sc = c.score(&input).unwrap();
    close(&sc.row(0)[1..], &[-2.0, -30.0, -0.4], 1e-6);
    assert_eq!(sc.row(0)[0], f32::INFINITY);
    assert_eq!(select_top_k(sc.row(0), 2, c.protect(2)).unwrap(), vec![0, 3]);
    assert_eq!(c.first_stage_budget(1), 1);
    assert!(CriticalKv::with(Box::new(Knorm), 0.0, 1.5).is_err());
}

#[test]
fn reference_statistics_by_hand() {
    // d = 1, zero queries: uniform causal attention. n = 2, w = 2, v = (1, 3).
    // query 0: a00 = 1; query 1: a10 = a11 = 1/2. o_0 = 1, o_1 = 2 (both point along +1).
    let dims = Dims { heads: 1, kv_heads: 1, len: 2, head_dim: 1 };
    let s = reference::window_stats(dims, &[0.0, 0.0], &[1.0, -1.0], &[1.0, 3.0], 2).unwrap();
    close(&s.mean, &[0.75, 0.25], 1e-7);
    close(&s.var, &[0.125, 0.125], 1e-7); // unbiased over 2 queries
    close(&s.last, &[0.5, 0.5], 1e-7);
    close(&s.entropy, &[0.0], 1e-7); // empty prefix
    close(s.accumulated.as_ref().unwrap(), &[1.5, 0.5], 1e-7);
    close(s.value_weighted.as_ref().unwrap(), &[0.75, 0.75], 1e-7);
    // projection: j=0: (1·1·1 + ½·1·1)/2 = .75; j=1: (0 + ½·3·1)/2 = .75
    close(s.projection.as_ref().unwrap(), &[0.75, 0.75], 1e-7);
    // Jacobian weights a_qj·|v_j − o_q| averaged over the 2 queries: j=0: (1·|1−1| + ½·|1−2|)/2
    // = .25; j=1: (0 + ½·|3−2|)/2 = .25
    close(s.jacobian.as_ref().unwrap(), &[0.25, 0.25], 1e-7);
    // leverage with d = 1: G = Σ w k² = .25 + .25 = .5, λ = G/1 = .5, ℓ_j = w_j k_j²/(G + λ) =
    // .25/1 each
    close(s.leverage.as_ref().unwrap(), &[0.25, 0.25], 1e-7);
    // twins: nothing lies more than 8 positions away in 2 tokens
    close(s.twin.as_ref().unwrap(), &[-1.0, -1.0], 0.0);
    assert_eq!(s.twin_index.as_ref().unwrap(), &vec![u32::MAX; 2]);
    // counter-causal: query 0 sees keys 0,1 (½ each), query 1 sees key 1 → (½, 3/2)
    close(s.counter_causal.as_ref().unwrap(), &[0.5, 1.5], 1e-7);
    // entropy of a uniform row over 3 keys restricted to the 2 prefix keys: (2/3)·ln 3
    let dims = Dims { heads: 1, kv_heads: 1, len: 3, head_dim: 1 };
    let s = reference::window_stats(dims, &[0.0; 3], &[1.0, 2.0, 3.0], &[1.0; 3], 1).unwrap();
    close(&s.entropy, &[2.0 / 3.0 * 3f64.ln()], 1e-6);
    // Jacobian weights in d = 2 from the last query's uniform attention (w = 1): v = (0,0),
    // (3,0), (0,3), o = (1,1): a·|v − o| = √2/3, √5/3, √5/3
    let dims = Dims { heads: 1, kv_heads: 1, len: 3, head_dim: 2 };
    let v = [0.0, 0.0, 3.0, 0.0, 0.0, 3.0];
    let s = reference::window_stats(dims, &[0.0; 6], &[1.0; 6], &v, 1).unwrap();
    let (r2, r5) = (2f64.sqrt() / 3.0, 5f64.sqrt() / 3.0);
    close(s.jacobian.as_ref().unwrap(), &[r2, r5, r5], 1e-6);
    // value_proj_l1: v = 2, W_o = [[1], [−3]] (hidden 2, H·d = 1) → |2| + |−6| = 8
    let dims = Dims { heads: 1, kv_heads: 1, len: 1, head_dim: 1 };
    close(&reference::value_proj_l1(dims, &[2.0], &[1.0, -3.0], 2).unwrap(), &[8.0], 1e-7);
    // query moments of (1, 3) skipping nothing: mean 2, biased variance 1
    let qm = QueryMoments::from_queries(&[1.0, 3.0], 1, 2, 1, 0).unwrap();
    close(&qm.mean, &[2.0], 1e-7);
    close(&qm.cov, &[1.0], 1e-7);
}

fn layer_scores(rows: &[&[f32]]) -> Scores {
    let len = rows[0].len();
    Scores { kv_heads: rows.len(), len, data: rows.concat() }
}

#[test]
fn uniform_and_pyramid() {
    let s = stats(2, 2, 100, 4);
    let sc = Scores::zeros(2, 100);
    let layers: Vec<LayerScores<'_>> = (0..5).map(|_| LayerScores { stats: &s, scores: &sc }).collect();
    let budget = BudgetSpec::AveragePerLayer(20).resolve(100, 5, 4).unwrap();
    let a = Uniform.allocate(&layers, &budget, Protect { sinks: 0, recent: 4 }).unwrap();
    assert_eq!(a.budgets, vec![vec![20, 20]; 5]);
    // β = 20: min = 1 < w = 4 → every layer keeps 20 (kvpress's fallback)
    assert_eq!(PyramidKv::default().layer_budgets(5, 100, 20, 4), vec![20; 5]);
    // β = 2, 4 layers: min 10, max 30, step 20/3 → 30, 23.33, 16.67, 10 → [30, 23, 17, 10]
    assert_eq!(PyramidKv::new(2.0).unwrap().layer_budgets(4, 100, 20, 4), vec![30, 23, 17, 10]);
    // β = 20/19, 5 layers: min 19, max 21, step .5 → 21, 20.5, 20, 19.5, 19, half to even
    assert_eq!(PyramidKv::new(20.0 / 19.0).unwrap().layer_budgets(5, 100, 20, 4), vec![21, 20, 20, 20, 19]);
    // max capped at n − w: B = 40, β = 2: min 20, max 60 ≥ 50 − 4 → max 46, min 34
    assert_eq!(PyramidKv::new(2.0).unwrap().layer_budgets(2, 50, 40, 4), vec![46, 34]);
    assert!(PyramidKv::new(0.5).is_err());
}

#[test]
fn adakv_by_hand() {
    // 2 KV heads, 6 positions, 3 per head, α = 0.2. Layer-wide top 6:
    // .9 .8 .7 (head 0) .6 .5 (head 1) .1 (head 0) → counts (4, 2)
    let h0: &[f32] = &[0.9, 0.8, 0.7, 0.1, 0.05, 0.0];
    let h1: &[f32] = &[0.6, 0.5, 0.02, 0.01, 0.03, 0.04];
    let sc = layer_scores(&[h0, h1]);
    // exact: .8·4 + .2·3 = 3.8, .8·2 + .6 = 2.2 → floors (3, 2), the remainder to head 0 → (4, 2)
    let ada = AdaKv::default();
    assert_eq!(ada.head_budgets(&sc, 3, Protect::NONE), vec![4, 2]);
    // original: round(.8·4 + ⌊.6⌋) = 3, round(1.6) = 2 → (3, 2): one short of 6
    let orig = AdaKv::new(0.2, AdaMode::Original, Box::new(Uniform)).unwrap();
    assert_eq!(orig.head_budgets(&sc, 3, Protect::NONE), vec![3, 2]);
    // kvpress: each head keeps its best ⌊.6⌋ → 1, then the best 4 of the rest: .8 .7 .5 .1 → (4, 2)
    let kvp = AdaKv::new(0.2, AdaMode::Kvpress, Box::new(Uniform)).unwrap();
    assert_eq!(kvp.head_budgets(&sc, 3, Protect::NONE), vec![4, 2]);
    assert_eq!(select_heads(&sc, &[4, 2], Protect::NONE).unwrap(), vec![vec![0, 1, 2, 3], vec![0, 1]]);
    // with α = 1 every head keeps its base
    let flat = AdaKv::new(1.0, AdaMode::ExactSum, Box::new(Uniform)).unwrap();
    assert_eq!(flat.head_budgets(&sc, 3, Protect::NONE), vec![3, 3]);
    assert!(AdaKv::new(1.5, AdaMode::ExactSum, Box::new(Uniform)).is_err());
}

#[test]
fn lacache_ladder_by_hand() {
    // span 2, overlap 0, 1 sink, 4 layers: unit U = 1 + ⌈(4−2)/2⌉ = 2, A = 1;
    // layer i keeps offset i mod 2 of each unit.
    let ladder = Ladder::new(2, 0, 1).unwrap();
    assert_eq!(ladder.unit(4), (2, 1));
    // 10 tokens to 7: 3 units from the cursor 1: [1,2] [3,4] [5,6]
    let p = ladder.compact(4, 10, 7, 1);
    assert_eq!(p.kept[0], vec![0, 1, 3, 5, 7, 8, 9]);
    assert_eq!(p.kept[1], vec![0, 2, 4, 6, 7, 8, 9]);
    assert_eq!(p.kept[2], p.kept[0]);
    assert_eq!(p.cursor, 4);
    // next compaction (3 new tokens, cursor 4): units [4,5] [6,7] [8,9]
    let p = ladder.compact(4, 10, 7, 4);
    assert_eq!(p.kept[0], vec![0, 1, 2, 3, 4, 6, 8]);
    assert_eq!(p.cursor, 7);
    // cursor 7: one unit fits ([7,8]) → 9 tokens; start over at the sink: 2 units [1,2] [3,4]
    // of the compacted sequence (0 1 2 3 4 5 6 7 9 for layer 0, 0 1 2 3 4 5 6 8 9 for layer 1)
    let p = ladder.compact(4, 10, 7, 7);
    assert_eq!(p.kept[0], vec![0, 1, 3, 5, 6, 7, 9]);
    assert_eq!(p.kept[1], vec![0, 2, 4, 5, 6, 8, 9]);
    assert_eq!(p.cursor, 3);
    // span ≥ layers: no ladder, the oldest non-sink tokens go
    let p = Ladder::default().compact(4, 10, 6, 4);
    assert_eq!(p.kept[0], vec![0, 1, 2, 3, 8, 9]);
    assert!(Ladder::new(4, 4, 0).is_err());
}

#[test]
fn registry_lists_every_policy_with_its_paper() {
    let listing = listing();
    assert_eq!(listing.lines().count(), registry().len());
    for e in registry() {
        let line = listing.lines().find(|l| l.starts_with(e.name)).unwrap();
        assert!(line.contains(e.paper));
    }
    match lookup("nope") {
        Err(PolicyError::UnknownPolicy { known, .. }) => assert!(known.contains("snapkv") && known.contains("cake")),
        other => panic!("{other:?}"),
    }
}

fn kv<'a>(kv_heads: usize, len: usize, d: usize, keys: &'a [f32], values: Option<&'a [f32]>) -> KvView<'a> {
    KvView { kv_heads, len, head_dim: d, keys: Some(keys), values }
}

#[test]
fn keydiff_keeps_keys_unlike_the_mean_unit_key() {
    // head 0: unit keys (0.6, 0.8), (0, 1), (−1, 0) and a zero key (which stays zero):
    // anchor a = (−0.1, 0.45), ‖a‖ = √0.2125; cos = (0.3, 0.45, 0.1)/‖a‖, and 0 for the zero key
    // head 1: unit keys (1, 0), (1, 0), (0, 1), (0, −1): a = (0.5, 0); cos = 1, 1, 0, 0 — the
    // norm of a key does not matter, only its direction
    let s = stats(2, 2, 4, 1);
    let keys = [3.0, 4.0, 0.0, 2.0, -1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 5.0, 0.0, 0.0, 2.0, 0.0, -1.0];
    let input = ScoreInput { kv: Some(kv(2, 4, 2, &keys, None)), ..ScoreInput::new(&s, 2) };
    let sc = KeyDiff.score(&input).unwrap();
    let an = 0.2125f64.sqrt();
    close(sc.row(0), &[-0.3 / an, -0.45 / an, -0.1 / an, 0.0], 1e-6);
    close(sc.row(1), &[-1.0, -1.0, 0.0, 0.0], 1e-6);
    assert_eq!(KeyDiff.protect(2), Protect::NONE);
    assert_eq!(select_top_k(sc.row(0), 2, Protect::NONE).unwrap(), vec![2, 3]);
    assert_eq!(select_top_k(sc.row(0), 3, Protect::NONE).unwrap(), vec![0, 2, 3]);
    assert_eq!(select_top_k(sc.row(1), 2, Protect::NONE).unwrap(), vec![2, 3]);
    // all keys zero: the anchor is zero and every score 0
    let zeros = [0.0; 8];
    let s1 = stats(1, 1, 4, 1);
    let input = ScoreInput { kv: Some(kv(1, 4, 2, &zeros, None)), ..ScoreInput::new(&s1, 2) };
    close(KeyDiff.score(&input).unwrap().row(0), &[0.0; 4], 0.0);
    assert!(matches!(KeyDiff.score(&ScoreInput::new(&s, 2)), Err(PolicyError::MissingInput { .. })));
}

#[test]
fn random_draws_are_splitmix64() {
    use kvslice_policy::scorer::random::splitmix64;
    // the published first outputs of SplitMix64 seeded with 0
    assert_eq!(splitmix64(0, 0), 0xE220_A839_7B1D_CDAF);
    assert_eq!(splitmix64(0, 1), 0x6E78_9E6A_A1B9_65F4);
    assert_eq!(splitmix64(0, 2), 0x06C4_5D18_8009_454F);
    // head 0, position j takes output j: its top 24 bits over 2^24
    let r = Random::new(0, 0, 0);
    assert_eq!(r.draw(0, 0), 0xE2_20A8 as f32 / 16_777_216.0);
    assert_eq!(r.draw(0, 2), 0x06_C45D as f32 / 16_777_216.0);
    let s = stats(1, 1, 3, 1);
    let sc = r.score(&ScoreInput::new(&s, 1)).unwrap();
    assert_eq!(sc.row(0)[1], 0x6E_789E as f32 / 16_777_216.0);
    // the largest of the three (0.88) is kept at a budget of 1
    assert_eq!(select_top_k(sc.row(0), 1, r.protect(1)).unwrap(), vec![0]);
}

#[test]
fn random_keeps_a_uniform_seeded_sample() {
    let n = 20_000;
    let s = stats(2, 2, n, 1);
    let score = |seed| Random::new(seed, 0, 0).score(&ScoreInput::new(&s, n / 2)).unwrap();
    let a = score(0);
    // uniform values: 10 bins of 0.1 hold 2000 draws each (binomial sd ≈ 42; 6 sd allowed)
    let mut bins = [0usize; 10];
    for &x in a.row(0) {
        assert!((0.0..1.0).contains(&x));
        bins[(x * 10.0) as usize] += 1;
    }
    assert!(bins.iter().all(|&b| b.abs_diff(2000) <= 250), "{bins:?}");
    // keeping half: each tenth of the prompt keeps about half of its 2000 tokens (sd ≈ 22)
    let kept = select_top_k(a.row(0), n / 2, Protect::NONE).unwrap();
    let mut per = [0usize; 10];
    kept.iter().for_each(|&j| per[j as usize / 2000] += 1);
    assert!(per.iter().all(|&c| c.abs_diff(1000) <= 140), "{per:?}");
    // the same seed draws the same numbers; another seed, or another head, an independent sample:
    // two independent halves share about a quarter of the prompt (sd ≈ 61)
    assert_eq!(score(0), a);
    let other = select_top_k(score(1).row(0), n / 2, Protect::NONE).unwrap();
    let head1 = select_top_k(a.row(1), n / 2, Protect::NONE).unwrap();
    for b in [&other, &head1] {
        let common = kept.iter().filter(|j| b.binary_search(j).is_ok()).count();
        assert!(common.abs_diff(5000) <= 400, "{common}");
    }
    // a token's draw does not depend on the prompt's length
    let s100 = stats(2, 2, 100, 1);
    let short = Random::new(0, 0, 0).score(&ScoreInput::new(&s100, 50)).unwrap();
    assert_eq!(short.row(1), &a.row(1)[..100]);
}

#[test]
fn random_keeps_its_sinks_and_recent_window() {
    let model = ModelInfo { head_dim: 8, rope_theta: 10_000.0 };
    let s = stats(1, 1, 64, 1);
    let layers = [LayerInput::new(&s)];
    let p = build_spec("random:seed=7,sinks=4,recent=8", &model).unwrap();
    assert_eq!(p.protect(24), Protect { sinks: 4, recent: 8 });
    let kept = &p.plan(&layers, &"24".parse().unwrap()).unwrap().kept[0][0];
    assert_eq!(kept.len(), 24);
    assert!((0..4).chain(56..64).all(|j| kept.contains(&j)), "{kept:?}");
    // the 12 others are the 12 best draws of positions 4..56 under seed 7
    let r = Random::new(7, 0, 0);
    let mut free: Vec<u32> = (4..56).collect();
    free.sort_by(|&a, &b| r.draw(0, b as usize).total_cmp(&r.draw(0, a as usize)));
    let mut want: Vec<u32> = free[..12].iter().copied().chain((0..4).chain(56..64)).collect();
    want.sort_unstable();
    assert_eq!(kept, &want);
    // kvpress's press protects nothing: neither does the default
    assert_eq!(build("random", &model).unwrap().protect(24), Protect::NONE);
    // another seed, another sample
    let q = build_spec("random:seed=8,sinks=4,recent=8", &model).unwrap();
    assert_ne!(q.plan(&layers, &"24".parse().unwrap()).unwrap().kept[0][0], *kept);
}

/// Fixed scores, nothing protected.
#[derive(Debug)]
struct Fixed(Scores);

impl Scorer for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn needs(&self) -> Needs {
        Needs::default()
    }
    fn protect(&self, _budget: usize) -> Protect {
        Protect::NONE
    }
    fn score(&self, _input: &ScoreInput<'_>) -> Result<Scores> {
        Ok(self.0.clone())
    }
}

#[test]
fn chunkkv_keeps_whole_chunks_by_their_head_summed_mean() {
    // SnapKV without pooling, 2 KV heads of one query head each, n = 8, window 2 (6 and 7):
    // prefix means h0 = (.1 .2 .3 .1 .1 .4), h1 = (.1 .1 .1 .2 .2 .1); the window takes the
    // largest prefix score plus one, 0.4 + 1 = 1.4, on both heads (its own 0.9 is not read).
    // Summed over heads: .2 .3 .4 .3 .3 .5 2.8 2.8; chunks of 3: (0..3) 0.3, (3..6) 1.1/3,
    // (6..8) mean 2.8 — the same for both heads.
    let mut s = stats(2, 2, 8, 2);
    s.mean = vec![0.1, 0.2, 0.3, 0.1, 0.1, 0.4, 0.9, 0.9, 0.1, 0.1, 0.1, 0.2, 0.2, 0.1, 0.9, 0.9];
    let snap = SnapKv::new(2, Pooling::None, GroupReduce::Mean).unwrap();
    let c = ChunkKv::new(Box::new(snap), 3).unwrap();
    let sc = c.score(&ScoreInput::new(&s, 5)).unwrap();
    let mid = 1.1 / 3.0;
    for h in 0..2 {
        close(sc.row(h), &[0.3, 0.3, 0.3, mid, mid, mid, 2.8, 2.8], 1e-6);
    }
    assert_eq!(c.protect(5), Protect::NONE);
    assert_eq!(c.needs().window, 2);
    for (budget, kept) in [(2, vec![6, 7]), (5, vec![3, 4, 5, 6, 7]), (6, vec![0, 3, 4, 5, 6, 7])] {
        assert_eq!(select_heads(&sc, &[budget, budget], c.protect(budget)).unwrap(), vec![kept.clone(), kept]);
    }
    // a shorter last chunk competes by its mean: (2 2 2 | 0 0 0 | 2.5) → 2, 0, 2.5 (by sums it
    // would come second, 2.5 < 6)
    let fixed = Fixed(Scores { kv_heads: 1, len: 7, data: vec![2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 2.5] });
    let c = ChunkKv::new(Box::new(fixed), 3).unwrap();
    let s1 = stats(1, 1, 7, 1);
    let sc = c.score(&ScoreInput::new(&s1, 4)).unwrap();
    close(sc.row(0), &[2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 2.5], 0.0);
    assert_eq!(select_top_k(sc.row(0), 1, Protect::NONE).unwrap(), vec![6]);
    assert_eq!(select_top_k(sc.row(0), 4, Protect::NONE).unwrap(), vec![0, 1, 2, 6]);
    // a budget between whole chunks takes the first tokens of the next chunk
    assert_eq!(select_top_k(sc.row(0), 5, Protect::NONE).unwrap(), vec![0, 1, 2, 3, 6]);
    // a prompt shorter than a chunk: the inner scores, head by head
    let fixed = Fixed(Scores { kv_heads: 2, len: 2, data: vec![1.0, 2.0, 2.0, 1.0] });
    let c = ChunkKv::new(Box::new(fixed), 3).unwrap();
    let s2 = stats(2, 2, 2, 1);
    let sc = c.score(&ScoreInput::new(&s2, 1)).unwrap();
    assert_eq!(select_heads(&sc, &[1, 1], Protect::NONE).unwrap(), vec![vec![1], vec![0]]);
    assert!(ChunkKv::new(Box::new(Knorm), 0).is_err());
    assert!(ChunkKv::new(Box::new(Knorm), 4097).is_err());
}

#[test]
fn lagkv_scores_each_partition_against_the_next() {
    // sinks 1, lag 2, d 2, n 6: partition (1, 2) is scored against (3, 4); the tail 3..6 has no
    // reference and ranks first, newest first: 1, 1 + 1/3, 1 + 2/3.
    // keys: reference (0, 0), (2, 4): min (0, 0), range (2, 4); k1 = (1, 4) → (0.5, 1),
    //   unbiased std of two channels |a − b|/√2 = √0.125; k2 = (2, 0) → (1, 0), std √0.5
    // values: reference (1, 1), (3, 1): min (1, 1), range (2, 0) — the constant channel gives 0;
    //   v1 = (2, 5) → (0.5, 0), std √0.125; v2 = (1.5, 7) → (0.25, 0), std √0.03125
    // softmax over the partition: pK1 = 1/(1 + e^(√0.5 − √0.125)), pV1 = 1/(1 + e^(√0.03125 − √0.125))
    // u1 = (pK1 + pV1)/2 ≈ 0.478 < u2 = 1 − u1: in-partition ranks 0 and 1, over lag 2: 0 and 0.5
    let s = stats(1, 1, 6, 1);
    let keys = [9.0, 9.0, 1.0, 4.0, 2.0, 0.0, 0.0, 0.0, 2.0, 4.0, 7.0, 7.0];
    let values = [0.0, 0.0, 2.0, 5.0, 1.5, 7.0, 1.0, 1.0, 3.0, 1.0, 0.0, 0.0];
    let input = ScoreInput { kv: Some(kv(1, 6, 2, &keys, Some(&values))), ..ScoreInput::new(&s, 4) };
    let lag = LagKv::new(1, 2, false).unwrap();
    let sc = lag.score(&input).unwrap();
    close(sc.row(0), &[0.0, 0.0, 0.5, 1.0, 4.0 / 3.0, 5.0 / 3.0], 1e-6);
    assert_eq!(lag.protect(4), Protect { sinks: 1, recent: 0 });
    assert_eq!(select_top_k(sc.row(0), 2, lag.protect(2)).unwrap(), vec![0, 5]);
    assert_eq!(select_top_k(sc.row(0), 4, lag.protect(4)).unwrap(), vec![0, 3, 4, 5]);
    assert_eq!(select_top_k(sc.row(0), 5, lag.protect(5)).unwrap(), vec![0, 2, 3, 4, 5]);
    // cross scoring keeps u itself
    let pk1 = 1.0 / (1.0 + (0.5f64.sqrt() - 0.125f64.sqrt()).exp());
    let pv1 = 1.0 / (1.0 + (0.03125f64.sqrt() - 0.125f64.sqrt()).exp());
    let u1 = (pk1 + pv1) / 2.0;
    assert!((u1 - 0.4783).abs() < 1e-4);
    let cross = LagKv::new(1, 2, true).unwrap().score(&input).unwrap();
    close(cross.row(0), &[0.0, u1, 1.0 - u1, 1.0, 4.0 / 3.0, 5.0 / 3.0], 1e-6);
    // fewer than sinks + 2·lag tokens: positions after the sinks, (j − 1)/3, newest first
    let s4 = stats(1, 1, 4, 1);
    let input = ScoreInput { kv: Some(kv(1, 4, 2, &keys[..8], Some(&values[..8]))), ..ScoreInput::new(&s4, 2) };
    let sc = lag.score(&input).unwrap();
    close(sc.row(0), &[0.0, 0.0, 1.0 / 3.0, 2.0 / 3.0], 1e-7);
    assert_eq!(select_top_k(sc.row(0), 2, lag.protect(2)).unwrap(), vec![0, 3]);
    // keys without values is an error
    let input = ScoreInput { kv: Some(kv(1, 4, 2, &keys[..8], None)), ..ScoreInput::new(&s4, 2) };
    assert!(matches!(lag.score(&input), Err(PolicyError::MissingInput { .. })));
    assert!(LagKv::new(4, 0, false).is_err());
}

#[test]
fn cur_leverages_are_window_normalised_squared_norms() {
    // d = 1, n = 5, windows of 2: [0, 1], [2, 3], [4]
    // keys 1 1 2 3 4 → k² 1 1 4 9 16, window sums 2 13 16 → κ = .5 .5 4/13 9/13 1 (sum 3)
    // values 1 2 1 1 2 → v² 1 4 1 1 4, window sums 5 2 4 → ν = .2 .8 .5 .5 1 (sum 3)
    let s = stats(1, 1, 5, 1);
    let keys = [1.0, 1.0, 2.0, 3.0, 4.0];
    let values = [1.0, 2.0, 1.0, 1.0, 2.0];
    let input = ScoreInput { kv: Some(kv(1, 5, 1, &keys, Some(&values))), ..ScoreInput::new(&s, 3) };
    let score = |leverage, local| Cur::new(1, leverage, local).unwrap().score(&input).unwrap().row(0).to_vec();
    // κ·ν = .1 .4 2/13 4.5/13 1, sum 2
    let product = score(Leverage::KvProduct, Some(2));
    close(&product, &[0.05, 0.2, 1.0 / 13.0, 2.25 / 13.0, 0.5], 1e-7);
    close(&score(Leverage::Key, Some(2)), &[1.0 / 6.0, 1.0 / 6.0, 4.0 / 39.0, 3.0 / 13.0, 1.0 / 3.0], 1e-7);
    close(&score(Leverage::Value, Some(2)), &[1.0 / 15.0, 4.0 / 15.0, 1.0 / 6.0, 1.0 / 6.0, 1.0 / 3.0], 1e-7);
    // (κ + ν)/2 = .35 .65 (4/13 + .5)/2 (9/13 + .5)/2 1, sum 3
    let avg = [0.35, 0.65, (4.0 / 13.0 + 0.5) / 2.0, (9.0 / 13.0 + 0.5) / 2.0, 1.0].map(|x| x / 3.0);
    close(&score(Leverage::KvAvg, Some(2)), &avg, 1e-7);
    // without the local windows: k²·v² = 1 4 4 9 64 over 82
    close(&score(Leverage::KvProduct, None), &[1.0, 4.0, 4.0, 9.0, 64.0].map(|x| x / 82.0), 1e-7);
    // the sink is kept, then .5 (4) and .2 (1), then .173 (3)
    let cur = Cur::new(1, Leverage::KvProduct, Some(2)).unwrap();
    assert_eq!(cur.protect(3), Protect { sinks: 1, recent: 0 });
    assert_eq!(select_top_k(&product, 3, cur.protect(3)).unwrap(), vec![0, 1, 4]);
    assert_eq!(select_top_k(&product, 4, cur.protect(4)).unwrap(), vec![0, 1, 3, 4]);
    // the value leverage reads no keys; a window of zero keys scores 0
    let only_values = ScoreInput { kv: Some(KvView { keys: None, ..kv(1, 5, 1, &keys, Some(&values)) }), ..input };
    let value = Cur::new(1, Leverage::Value, Some(2)).unwrap();
    assert!(!value.needs().keys && value.needs().values);
    close(value.score(&only_values).unwrap().row(0), &[1.0 / 15.0, 4.0 / 15.0, 1.0 / 6.0, 1.0 / 6.0, 1.0 / 3.0], 1e-7);
    assert!(matches!(cur.score(&only_values), Err(PolicyError::MissingInput { .. })));
    let zero_start = [0.0, 0.0, 2.0, 3.0, 4.0];
    let input = ScoreInput { kv: Some(kv(1, 5, 1, &zero_start, Some(&values))), ..ScoreInput::new(&s, 3) };
    let key = Cur::new(1, Leverage::Key, Some(2)).unwrap().score(&input).unwrap();
    close(key.row(0), &[0.0, 0.0, 4.0 / 26.0, 9.0 / 26.0, 0.5], 1e-7);
    assert!(Cur::new(4, Leverage::Key, Some(0)).is_err());
}

#[test]
fn block_rescores_the_kept_tokens_with_each_block() {
    // KeyDiff, k = 2, blocks of 1; keys (1, 0), (0, 1), (1, 1), (−1, 0), (0, −1).
    // One shot: the anchor points at 45°; cosines r r 1 −r −r (r = 1/√2) → keeps 3 and 4.
    // Block by block, from {0, 1}:
    //   + 2: units (1, 0), (0, 1), (r, r), anchor at 45°, cosines r r 1 → 2 goes (score 0)
    //   + 3: units (1, 0), (0, 1), (−1, 0), anchor (0, 1/3), cosines 0 1 0 → 1 goes (score 1)
    //   + 4: units (1, 0), (−1, 0), (0, −1), anchor (0, −1/3), cosines 0 0 1 → 4 goes (score 2)
    //   kept to the end: 0 and 3 (score 3)
    let s = stats(1, 1, 5, 1);
    let keys = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.0, 0.0, -1.0];
    let input = ScoreInput { kv: Some(kv(1, 5, 2, &keys, None)), ..ScoreInput::new(&s, 2) };
    let one_shot = KeyDiff.score(&input).unwrap();
    assert_eq!(select_top_k(one_shot.row(0), 2, Protect::NONE).unwrap(), vec![3, 4]);
    let block = Block::new(Box::new(KeyDiff), 1).unwrap();
    let sc = block.score(&input).unwrap();
    close(sc.row(0), &[3.0, 1.0, 0.0, 3.0, 2.0], 0.0);
    assert_eq!(select_top_k(sc.row(0), 2, block.protect(2)).unwrap(), vec![0, 3]);
    // blocks of 3 hold the rest of the prompt at once: one round, the one-shot choice
    let sc = Block::new(Box::new(KeyDiff), 3).unwrap().score(&input).unwrap();
    assert_eq!(select_top_k(sc.row(0), 2, Protect::NONE).unwrap(), vec![3, 4]);
    // Knorm, k = 2, blocks of 2, norms 3 1 2 5 0.5 4: {0, 1, 2, 3} keeps 1, 2 (0 and 3 score 0);
    // {1, 2, 4, 5} keeps 4, 1 (2 and 5 score 1); 1 and 4 score 2
    let keys = [3.0, 1.0, 2.0, 5.0, 0.5, 4.0];
    let s6 = stats(1, 1, 6, 1);
    let input = ScoreInput { kv: Some(kv(1, 6, 1, &keys, None)), ..ScoreInput::new(&s6, 2) };
    let sc = Block::new(Box::new(Knorm), 2).unwrap().score(&input).unwrap();
    close(sc.row(0), &[0.0, 2.0, 1.0, 0.0, 2.0, 1.0], 0.0);
    // the inner scorer's sinks are kept in every round: CurDKV with 1 sink, keys only, no local
    // windows, k = 2, blocks of 2, norms 0.5 1 2 5 3 4 (squares .25 1 4 25 9 16): {0, 1, 2, 3}
    // keeps the sink 0 and 3 (25), not 2 (4): 1 and 2 score 0; {0, 3, 4, 5} keeps 0 and 3 (25 >
    // 16 > 9): 4 and 5 score 1
    let keys = [0.5, 1.0, 2.0, 5.0, 3.0, 4.0];
    let input = ScoreInput { kv: Some(kv(1, 6, 1, &keys, None)), ..ScoreInput::new(&s6, 2) };
    let cur = Cur::new(1, Leverage::Key, None).unwrap();
    let sc = Block::new(Box::new(cur), 2).unwrap().score(&input).unwrap();
    close(sc.row(0), &[2.0, 0.0, 0.0, 2.0, 1.0, 1.0], 0.0);
    let no_sink = Block::new(Box::new(Cur::new(0, Leverage::Key, None).unwrap()), 2).unwrap();
    assert_eq!(select_top_k(no_sink.score(&input).unwrap().row(0), 2, Protect::NONE).unwrap(), vec![3, 5]);
    // only scorers of keys and values can be rescored on a part of the cache
    assert!(Block::new(Box::new(SnapKv::default()), 8).is_err());
    assert!(Block::new(Box::new(Random::default()), 8).is_err());
    assert!(Block::new(Box::new(KeyDiff), 0).is_err());
    assert!(matches!(block.score(&ScoreInput::new(&s, 2)), Err(PolicyError::MissingInput { .. })));
}
