//! Every registry entry, built with its defaults, planned on the stored peer tensors under
//! several budgets: kept sets are valid, match their budgets, keep the protected tokens, respect
//! the total, and are deterministic.

mod common;

use common::{Peers, jaccard_distance};
use kvslice_policy::alloc::{AdaKv, AdaMode, Uniform};
use kvslice_policy::reference::{non_causal_sums_over, reconstruction_scores};
use kvslice_policy::{
    BudgetSpec, GroupReduce, LayerInput, ModelInfo, NonCausalTable, Policy, Pooling, Protect, ScoreInput, Scorer,
    SnapKv, registry, select_heads,
};

#[test]
fn every_registered_policy_plans_valid_kept_sets() {
    let mut p = Peers::load();
    let model = ModelInfo { head_dim: p.head_dim, rope_theta: 10_000.0 };
    assert!(registry().len() >= 15);
    // DistillCache's built-in networks are SmolLM2's: these tensors get networks of their own
    // geometry (initial weights over each head's own features)
    let distill = {
        use kvslice_policy::learn::{TraceList, init};
        use kvslice_policy::scorer::distill::{DistillWeights, feature_count, head_features};
        let f = feature_count(p.head_dim);
        let heads = (0..p.layers * p.kv_heads)
            .map(|i| {
                let (l, h) = (i / p.kv_heads, i % p.kv_heads);
                let features = head_features(&p.kv(l), &p.keys[l], &p.values[l], h);
                init(&[TraceList { features, utility: vec![1.0; p.len] }], f, 4, i as u64)
            })
            .collect();
        let w = DistillWeights { layers: p.layers, kv_heads: p.kv_heads, head_dim: p.head_dim, hidden: 4, heads };
        let path = std::env::temp_dir().join(format!("kvslice-conformance-distill-{}.safetensors", std::process::id()));
        std::fs::write(&path, w.to_safetensors().unwrap()).unwrap();
        path
    };
    for entry in registry() {
        let policy = if entry.name.starts_with("distillcache") {
            kvslice_policy::build(&format!("{}:weights={}", entry.name, distill.display()), &model).unwrap()
        } else {
            entry.build(&model).unwrap()
        };
        let needs = policy.needs();
        let window = needs.window.max(1);
        let stats: Vec<_> = (0..p.layers)
            .map(|l| {
                let mut s = p.stats(l, window);
                if let Some(spec) = needs.non_causal.filter(|&spec| s.non_causal_for(spec).is_none()) {
                    let sums = non_causal_sums_over(p.dims(), &p.q_rot[l], &p.keys[l], spec).unwrap();
                    s.non_causal.push(NonCausalTable { spec, sums });
                }
                if needs.reconstruction {
                    // the last 32 positions as the reconstruction of the 128 before them
                    let (n, d, r) = (p.len, p.head_dim, 32);
                    let q: Vec<f32> =
                        (0..p.heads).flat_map(|h| p.q_rot[l][(h * n + n - r) * d..(h + 1) * n * d].to_vec()).collect();
                    let part = reconstruction_scores(p.dims(), &q, &p.keys[l], r, 4, 0..n - r).unwrap();
                    let mut table = vec![0.0; p.kv_heads * n];
                    for h in 0..p.kv_heads {
                        table[h * n..h * n + n - r].copy_from_slice(&part[h * (n - r)..(h + 1) * (n - r)]);
                    }
                    s.reconstruction = Some(table);
                }
                s
            })
            .collect();
        let moments: Vec<_> = (0..p.layers).map(|l| p.moments(l, 4)).collect();
        let proj: Vec<_> = (0..p.layers).map(|l| p.value_proj_l1(l)).collect();
        let layers: Vec<LayerInput<'_>> = (0..p.layers)
            .map(|l| LayerInput {
                stats: &stats[l],
                kv: Some(p.kv(l)),
                query_moments: Some(&moments[l]),
                value_proj_l1: Some(&proj[l]),
                layer: l,
            })
            .collect();
        for spec in ["50%", "96L", "100", "200"] {
            let spec: BudgetSpec = spec.parse().unwrap();
            let plan = policy.plan(&layers, &spec).unwrap_or_else(|e| panic!("{} @ {spec}: {e}", entry.name));
            let n = p.len;
            let protect: Protect = policy.protect(plan.budget.per_layer);
            assert_eq!(plan.kept.len(), p.layers);
            let mut total = 0;
            for (l, heads) in plan.kept.iter().enumerate() {
                assert_eq!(heads.len(), p.kv_heads, "{}", entry.name);
                for (h, kept) in heads.iter().enumerate() {
                    assert_eq!(kept.len(), plan.budgets[l][h], "{} layer {l} head {h}", entry.name);
                    assert!(kept.windows(2).all(|w| w[0] < w[1]), "{}: sorted, unique", entry.name);
                    assert!(kept.iter().all(|&j| (j as usize) < n));
                    if !matches!(policy, Policy::Ladder(_)) {
                        for j in (0..n).filter(|&j| protect.contains(j, n)) {
                            assert!(kept.contains(&(j as u32)), "{} keeps protected {j}", entry.name);
                        }
                    } else {
                        assert!((0..protect.sinks as u32).all(|j| kept.contains(&j)));
                    }
                    total += kept.len();
                }
            }
            let cap = plan.budget.total * p.kv_heads;
            // PyramidKV's rounded layer budgets may exceed the total by half a token per layer
            let slack = if entry.name == "pyramidkv" { p.layers * p.kv_heads / 2 } else { 0 };
            assert!(total <= cap + slack, "{} @ {spec}: {total} kept > {cap}", entry.name);
            if spec == BudgetSpec::AveragePerLayer(200) {
                assert_eq!(total, n * p.layers * p.kv_heads, "{}: a budget above the prompt keeps all", entry.name);
            }
            assert_eq!(policy.plan(&layers, &spec).unwrap(), plan, "{}: deterministic", entry.name);
        }
        // missing inputs are typed errors, not panics
        if needs.keys
            || needs.query_moments
            || needs.value_proj_l1
            || needs.accumulated
            || needs.projection
            || needs.counter_causal
            || needs.twins
            || needs.leverage
            || needs.non_causal.is_some()
            || needs.reconstruction
        {
            let mut bare = stats[0].clone();
            bare.accumulated = None;
            bare.projection = None;
            bare.counter_causal = None;
            bare.leverage = None;
            bare.twin = None;
            bare.twin_index = None;
            bare.non_causal.clear();
            bare.reconstruction = None;
            let only = vec![LayerInput::new(&bare); p.layers];
            assert!(policy.plan(&only, &"50%".parse().unwrap()).is_err(), "{} without its inputs", entry.name);
        }
    }
    std::fs::remove_file(&distill).unwrap();
}

/// Ada-KV's exact-sum rounding (the default) against the reference code's rounding: a
/// deliberate variant. Both run on the stored tensors; the kept sets stay close.
#[test]
fn adakv_exact_sum_variant_stays_close_to_the_reference_rounding() {
    let mut p = Peers::load();
    let scorer = SnapKv::new(32, Pooling::Max(7), GroupReduce::Mean).unwrap();
    let exact = AdaKv::default();
    let orig = AdaKv::new(0.2, AdaMode::Original, Box::new(Uniform)).unwrap();
    let (mut worst, mut sets, mut same) = (0f64, 0, 0);
    for cap in [48usize, 64, 96] {
        for l in 0..p.layers {
            let stats = p.stats(l, 32);
            let sc = scorer.score(&ScoreInput::new(&stats, cap)).unwrap();
            let protect = scorer.protect(cap);
            let be = exact.head_budgets(&sc, cap, protect);
            let bo = orig.head_budgets(&sc, cap, protect);
            assert_eq!(be.iter().sum::<usize>(), cap * p.kv_heads);
            for (a, b) in be.iter().zip(&bo) {
                assert!(a.abs_diff(*b) <= 1, "{be:?} vs {bo:?}");
            }
            let ke = select_heads(&sc, &be, protect).unwrap();
            let ko = select_heads(&sc, &bo, protect).unwrap();
            for (a, b) in ke.iter().zip(&ko) {
                sets += 1;
                same += usize::from(a == b);
                worst = worst.max(jaccard_distance(a, b));
            }
        }
    }
    println!("adakv exact-sum vs reference rounding: {same}/{sets} identical, worst Jaccard distance {worst:.4}");
    assert!(worst <= 0.05, "worst Jaccard distance {worst}");
}
