//! Kernel 3 against its twin (exact index sets) and hand-computed cases.

use kvslice_kernels::{KernelError, Protect, cpu, kept_count, top_k};
use proptest::prelude::*;

use crate::common::{Rng, device, f2, read_u32};

fn kept_rows(positions: Vec<u32>, width: usize, counts: &[u32]) -> Vec<Vec<u32>> {
    counts
        .iter()
        .enumerate()
        .map(|(h, &c)| {
            let row = &positions[h * width..(h + 1) * width];
            assert!(row[c as usize..].iter().all(|&p| p == u32::MAX), "head {h}: padding after the count");
            row[..c as usize].to_vec()
        })
        .collect()
}

fn run(scores: &[f32], kv_heads: usize, cap: usize, lens: &[u32], k: &[u32], protect: Protect) -> Vec<Vec<u32>> {
    let dev = device();
    let kept = top_k(&f2(scores.to_vec(), [kv_heads, cap], &dev), lens, k, protect).expect("valid budgets");
    let width = kept.positions.dims()[1];
    kept_rows(read_u32(kept.positions), width, &kept.counts)
}

#[test]
fn hand_computed_selection() {
    let scores = [0.5, 0.9, 0.1, 0.9, 0.3];
    // sink 0 is kept and counts; the two best others tie at 0.9
    assert_eq!(run(&scores, 1, 5, &[5], &[3], Protect { sinks: 1, recent: 0 }), [vec![0, 1, 3]]);
    // a tie at the threshold goes to the lower position
    assert_eq!(run(&scores, 1, 5, &[5], &[1], Protect::default()), [vec![1]]);
    // recent window of 2 (positions 3, 4) plus the best other (1)
    assert_eq!(run(&scores, 1, 5, &[5], &[3], Protect { sinks: 0, recent: 2 }), [vec![1, 3, 4]]);
    // all equal: the lowest positions
    assert_eq!(run(&[2.0; 6], 1, 6, &[6], &[2], Protect::default()), [vec![0, 1]]);
    // total order: +0 ranks above −0, −inf last
    assert_eq!(run(&[-0.0, 0.0, f32::NEG_INFINITY], 1, 3, &[3], &[1], Protect::default()), [vec![1]]);
    // k = 0 keeps nothing even with protection; k ≥ len keeps everything
    assert_eq!(run(&scores, 1, 5, &[5], &[0], Protect { sinks: 2, recent: 2 }), [Vec::<u32>::new()]);
    assert_eq!(run(&scores, 1, 5, &[4], &[4], Protect::default()), [vec![0, 1, 2, 3]]);
    // per-head k and length; head 1 only scores its first 3 slots
    let two = [0.1, 0.2, 0.3, 0.4, 9.0, 8.0, 0.0, 7.0];
    assert_eq!(run(&two, 2, 4, &[4, 3], &[2, 1], Protect::default()), [vec![2, 3], vec![0]]);
}

#[test]
fn negative_scores_and_large_magnitudes() {
    let scores = [-3.0, -1e30, 5e-39, -2.5, 1e30, -0.0];
    assert_eq!(run(&scores, 1, 6, &[6], &[3], Protect::default()), [vec![2, 4, 5]]);
}

proptest! {
    #![proptest_config(crate::common::gpu_config(24))]

    #[test]
    fn matches_twin_with_ties(
        kv_heads in 1usize..5,
        cap in 1usize..1500,
        distinct in prop::sample::select(vec![2usize, 7, 1000, 1 << 20]),
        sinks in 0usize..6,
        recent in 0usize..40,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        // few distinct values force ties at the threshold
        let scores: Vec<f32> = (0..kv_heads * cap).map(|_| (rng.below(distinct) as f32 - distinct as f32 / 2.0) * 0.37).collect();
        let protect = Protect { sinks, recent };
        let mut lens = Vec::new();
        let mut ks = Vec::new();
        for _ in 0..kv_heads {
            let len = match rng.below(4) { 0 => cap, 1 => 1 + rng.below(cap), _ => rng.below(cap + 1) };
            let protected = protect.count(len);
            let k = match rng.below(5) {
                0 => 0,
                1 => len,
                2 => cap,
                _ => protected + rng.below(len.saturating_sub(protected) + 1),
            };
            let k = if k > 0 && k < protected { protected } else { k };
            lens.push(len as u32);
            ks.push(k as u32);
        }
        let got = run(&scores, kv_heads, cap, &lens, &ks, protect);
        for h in 0..kv_heads {
            let row = &scores[h * cap..h * cap + lens[h] as usize];
            let want = cpu::top_k(row, ks[h] as usize, sinks, recent);
            prop_assert_eq!(&got[h], &want, "head {} len {} k {}", h, lens[h], ks[h]);
            prop_assert_eq!(got[h].len(), kept_count(h, lens[h] as usize, ks[h] as usize, protect).unwrap());
        }
    }
}

#[test]
fn long_rows() {
    let mut rng = Rng::new(99);
    let cap = 40_000;
    let scores: Vec<f32> = (0..2 * cap).map(|_| rng.unit()).collect();
    let lens = [cap as u32, 33_333];
    let ks = [4_097, 10];
    let protect = Protect { sinks: 4, recent: 6 };
    let got = run(&scores, 2, cap, &lens, &ks, protect);
    for h in 0..2 {
        let want = cpu::top_k(&scores[h * cap..h * cap + lens[h] as usize], ks[h] as usize, 4, 6);
        assert_eq!(got[h], want, "head {h}");
    }
}

#[test]
fn budget_rules_are_typed_errors() {
    let dev = device();
    let s = f2(vec![0.0; 8], [2, 4], &dev);
    let p = Protect { sinks: 1, recent: 1 };
    assert_eq!(
        top_k(&s, &[4, 4], &[1, 2], p).unwrap_err(),
        KernelError::BudgetBelowProtected { head: 0, k: 1, protected: 2 }
    );
    assert_eq!(top_k(&s, &[4, 4], &[2, 5], p).unwrap_err(), KernelError::KPastCapacity { head: 1, k: 5, capacity: 4 });
    assert_eq!(
        top_k(&s, &[5, 4], &[2, 2], p).unwrap_err(),
        KernelError::LengthPastCapacity { head: 0, len: 5, capacity: 4 }
    );
    assert_eq!(top_k(&s, &[4], &[2, 2], p).unwrap_err(), KernelError::PerHead { what: "lengths", expected: 2, got: 1 });
}
