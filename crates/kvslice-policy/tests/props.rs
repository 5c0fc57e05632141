//! Properties: selection invariants, exact budget sums, protected tokens kept, determinism,
//! CAKE's monotone cascade and its Theorem 1 (cascading keeps the same sets as one-shot).

use kvslice_policy::alloc::{AdaKv, Cake, CakeCascade};
use kvslice_policy::{BudgetSpec, Protect, Scores, select_top_k};
use proptest::prelude::*;

fn scores_strategy(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    // a small value set makes ties frequent
    prop::collection::vec(prop_oneof![(0u8..8).prop_map(|v| f32::from(v) / 8.0), -10.0f32..10.0], 1..max_len)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn selection_invariants(s in scores_strategy(64), k in 0usize..80, sinks in 0usize..5, recent in 0usize..5) {
        let n = s.len();
        let p = Protect { sinks, recent };
        match select_top_k(&s, k, p) {
            Err(_) => prop_assert!(k > 0 && k < n && k < p.count(n)),
            Ok(kept) => {
                prop_assert_eq!(kept.len(), k.min(n));
                prop_assert!(kept.windows(2).all(|w| w[0] < w[1]));
                if k > 0 {
                    for j in 0..n {
                        if p.contains(j, n) { prop_assert!(kept.contains(&(j as u32))); }
                    }
                }
                // every kept free position beats (or ties at a lower position) every dropped one
                for &a in &kept {
                    let a = a as usize;
                    if p.contains(a, n) { continue; }
                    for b in 0..n {
                        if kept.contains(&(b as u32)) || p.contains(b, n) { continue; }
                        prop_assert!(s[a] > s[b] || (s[a] == s[b] && a < b));
                    }
                }
                prop_assert_eq!(select_top_k(&s, k, p).unwrap(), kept);
            }
        }
    }

    #[test]
    fn cake_budgets_sum_exactly(prefs in prop::collection::vec(0.0f64..10.0, 1..12), per in 1usize..200, cap in 1usize..300) {
        let total = per * prefs.len();
        let b = Cake::default().prefix_budgets(&prefs, total, cap);
        prop_assert_eq!(b.iter().sum::<usize>(), total.min(cap * prefs.len()));
        prop_assert!(b.iter().all(|&x| x <= cap));
        prop_assert_eq!(Cake::default().prefix_budgets(&prefs, total, cap), b);
    }

    #[test]
    fn adakv_budgets_sum_exactly_and_keep_the_protected(
        rows in prop::collection::vec(prop::collection::vec(-5.0f32..5.0, 40), 1..6),
        per in 0usize..45, sinks in 0usize..4, recent in 0usize..8, alpha in 0.0f64..=1.0,
    ) {
        let heads = rows.len();
        let sc = Scores { kv_heads: heads, len: 40, data: rows.concat() };
        let p = Protect { sinks, recent };
        prop_assume!(per >= p.count(40));
        let ada = AdaKv::new(alpha, Default::default(), Box::new(kvslice_policy::Uniform)).unwrap();
        let b = ada.head_budgets(&sc, per, p);
        prop_assert_eq!(b.iter().sum::<usize>(), heads * per.min(40));
        prop_assert!(b.iter().all(|&x| x >= p.count(40) && x <= 40));
        prop_assert_eq!(ada.head_budgets(&sc, per, p), b);
    }

    #[test]
    fn cascade_budgets_shrink_and_spend_the_total(
        prefs in prop::collection::vec(0.01f64..10.0, 1..10), len in 40usize..200, per in 8usize..40, window in 0usize..8,
    ) {
        let layers = prefs.len();
        let mut c = CakeCascade::new(Cake::default(), layers, len, per, window).unwrap();
        let mut last: Vec<usize> = Vec::new();
        for (m, &p) in prefs.iter().enumerate() {
            let staged = c.push_preference(p).to_vec();
            for (l, &b) in last.iter().enumerate() {
                prop_assert!(staged[l] <= b);
            }
            // each stage spends the whole prefix total, or keeps everything it can
            let spent: usize = staged.iter().map(|b| b - window).sum();
            prop_assert_eq!(spent, ((per - window) * layers).min((len - window) * (m + 1)));
            last = staged;
        }
        // and ends within rounding of the one-shot budgets
        let one_shot: Vec<usize> = Cake::default()
            .prefix_budgets(&prefs, (per - window) * layers, len - window)
            .into_iter()
            .map(|b| b + window)
            .collect();
        for (a, b) in last.iter().zip(&one_shot) {
            prop_assert!(a.abs_diff(*b) <= layers, "{last:?} vs one-shot {one_shot:?}");
        }
    }

    /// Theorem 1 of CAKE: trimming each layer's top-k set stage by stage keeps the same set as
    /// one eviction with the final budgets.
    #[test]
    fn cascading_equals_one_shot(
        prefs in prop::collection::vec(0.01f64..10.0, 2..6), seed in 0u64..1000, len in 40usize..90, per in 10usize..30,
    ) {
        let window = 4;
        let layers = prefs.len();
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let scores: Vec<Vec<f32>> = (0..layers).map(|_| (0..len).map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) % 64) as f32 / 64.0 // ties on purpose
        }).collect()).collect();
        let protect = Protect { sinks: 0, recent: window };
        let mut c = CakeCascade::new(Cake::default(), layers, len, per, window).unwrap();
        let mut kept: Vec<Vec<u32>> = Vec::new();
        for (m, &p) in prefs.iter().enumerate() {
            let b = c.push_preference(p).to_vec();
            kept.push((0..len as u32).collect());
            for l in 0..=m {
                let sub: Vec<f32> = kept[l].iter().map(|&j| scores[l][j as usize]).collect();
                let keep = select_top_k(&sub, b[l], Protect { sinks: 0, recent: window.min(kept[l].len()) }).unwrap();
                kept[l] = keep.iter().map(|&i| kept[l][i as usize]).collect();
            }
        }
        let finals: Vec<usize> = kept.iter().map(Vec::len).collect();
        for l in 0..layers {
            prop_assert_eq!(&kept[l], &select_top_k(&scores[l], finals[l], protect).unwrap());
        }
    }

    #[test]
    fn budget_specs_round_trip(n in 1usize..100_000, ppm in 1u32..=1_000_000) {
        for spec in [BudgetSpec::AveragePerLayer(n), BudgetSpec::Flat(n), BudgetSpec::Fraction { ppm: ppm - ppm % 100 + 100 * u32::from(ppm % 100 == 0 && ppm < 100) }] {
            if let BudgetSpec::Fraction { ppm: 0 } = spec { continue; }
            let text = spec.to_string();
            prop_assert_eq!(text.parse::<BudgetSpec>().unwrap(), spec);
        }
    }
}
