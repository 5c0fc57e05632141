//! Kernel 2 against its twin and hand-computed cases. Tolerances: average rtol 1e-5,
//! atol 1e-6 (relative to the array's largest magnitude); max exact.

use kvslice_kernels::{Reduce, cpu, pool1d, reduce_groups};
use proptest::prelude::*;

use crate::common::{Rng, assert_close, device, f2, read};

#[test]
fn hand_computed_pooling() {
    let dev = device();
    let x = f2(vec![1.0, 2.0, 3.0, 4.0], [1, 4], &dev);
    // average over 3 with the zero padding counted: (0+1+2)/3, (1+2+3)/3, (2+3+4)/3, (3+4+0)/3
    let avg = read(pool1d(&x, 3, Reduce::Mean).unwrap());
    assert_close("avg", &avg, &[1.0, 2.0, 3.0, 7.0 / 3.0], 1e-6, 0.0);
    let max = read(pool1d(&x, 3, Reduce::Max).unwrap());
    assert_eq!(max, [2.0, 3.0, 4.0, 4.0]);
    // a kernel wider than the row: every output sees the whole row
    let wide = read(pool1d(&f2(vec![-1.0, -5.0], [1, 2], &dev), 9, Reduce::Max).unwrap());
    assert_eq!(wide, [-1.0, -1.0]);
    let one = read(pool1d(&x, 1, Reduce::Mean).unwrap());
    assert_eq!(one, [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn hand_computed_groups() {
    let dev = device();
    // 4 query heads onto 2 KV heads, 2 positions
    let x = f2(vec![1.0, -2.0, 3.0, 0.0, 5.0, 5.0, -1.0, 7.0], [4, 2], &dev);
    assert_eq!(read(reduce_groups(&x, 2, Reduce::Mean).unwrap()), [2.0, -1.0, 2.0, 6.0]);
    assert_eq!(read(reduce_groups(&x, 2, Reduce::Max).unwrap()), [3.0, 0.0, 5.0, 7.0]);
}

proptest! {
    #![proptest_config(crate::common::gpu_config(16))]

    #[test]
    fn pooling_matches_twin(rows in 1usize..5, n in 1usize..700, half in 0usize..16, max in any::<bool>(), seed in any::<u64>()) {
        let dev = device();
        let kernel = 2 * half + 1;
        let x = Rng::new(seed).vec(rows * n, 2.0);
        let want = cpu::pool1d(&x, rows, n, kernel, max);
        let how = if max { Reduce::Max } else { Reduce::Mean };
        let got = read(pool1d(&f2(x, [rows, n], &dev), kernel, how).unwrap());
        if max {
            let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            prop_assert_eq!(got, want);
        } else {
            assert_close("avg pool", &got, &want, 1e-5, 1e-6);
        }
    }

    #[test]
    fn groups_match_twin(
        kv_heads in 1usize..4,
        group in prop::sample::select(vec![1usize, 3, 4, 8]),
        n in 1usize..600,
        max in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dev = device();
        let heads = kv_heads * group;
        let x = Rng::new(seed).vec(heads * n, 1.0);
        let want = cpu::reduce_groups(&x, heads, kv_heads, n, max);
        let how = if max { Reduce::Max } else { Reduce::Mean };
        let got = read(reduce_groups(&f2(x, [heads, n], &dev), kv_heads, how).unwrap());
        if max {
            let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            prop_assert_eq!(got, want);
        } else {
            assert_close("group mean", &got, &want, 1e-5, 1e-6);
        }
    }
}
