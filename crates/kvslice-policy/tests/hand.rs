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
