//! Kernel 6 against its twin and hand-computed products.
//!
//! Tolerance: `|got − want| ≤ 1e-5·(|b_j| + Σ_k |x_ik·w_kj|) + 1e-7`, i.e. relative to the
//! magnitude of the terms summed (f32 accumulation over `d_in` terms; the twin sums in f64).
//! Dropping or repeating one term of the sum breaks the bound by orders of magnitude.

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_kernels::{KernelError, linear};
use proptest::prelude::*;

use crate::common::{Rng, check_product as check, device, f1, f2, read};

fn run_case(n: usize, d_in: usize, d_out: usize, with_bias: bool, seed: u64) {
    let dev = device();
    let mut rng = Rng::new(seed);
    let x = rng.vec(n * d_in, 1.0);
    let w = rng.vec(d_in * d_out, 0.5);
    let b = with_bias.then(|| rng.vec(d_out, 2.0));
    let out =
        linear(f2(x.clone(), [n, d_in], &dev), f2(w.clone(), [d_in, d_out], &dev), b.clone().map(|b| f1(b, &dev)))
            .expect("valid shapes");
    assert_eq!(out.dims(), [n, d_out]);
    let tag = format!("n {n} d_in {d_in} d_out {d_out} bias {with_bias}");
    check(&tag, &read(out), &x, &w, b.as_deref(), (n, d_in, d_out));
}

proptest! {
    #![proptest_config(crate::common::gpu_config(32))]

    #[test]
    fn matches_twin_on_random_shapes(
        n in prop::sample::select(vec![1usize, 2, 3, 4, 5, 7, 8, 13]),
        d_in in prop::sample::select(vec![1usize, 3, 64, 100, 576, 1536]),
        // scalar and vec4 paths; multiples of neither 4 nor the workgroup included
        d_out in prop_oneof![1usize..300, (1usize..200).prop_map(|c| 4 * c)],
        with_bias in any::<bool>(),
        seed in any::<u64>(),
    ) {
        run_case(n, d_in, d_out, with_bias, seed);
    }
}

#[test]
fn smollm2_shapes() {
    for (i, &(d_in, d_out)) in [(576, 576), (576, 192), (576, 1536), (1536, 576)].iter().enumerate() {
        for n in [1, 2, 4, 7] {
            run_case(n, d_in, d_out, i % 2 == 0, 100 + n as u64);
        }
    }
}

#[test]
fn widest_and_deepest() {
    // the output head's width (768 workgroups of vec4 columns, 3072 scalar ones)
    run_case(1, 64, 49152, false, 1);
    run_case(2, 8, 49151, true, 2);
    // a long reduction
    run_case(3, 8192, 37, true, 3);
}

#[test]
fn hand_computed() {
    let dev = device();
    // [[1, 2], [3, -1]] · [[1, 2, 3], [4, 5, 6]] + [0.5, 0, -1]
    let out = linear(
        f2(vec![1.0, 2.0, 3.0, -1.0], [2, 2], &dev),
        f2(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], &dev),
        Some(f1(vec![0.5, 0.0, -1.0], &dev)),
    )
    .unwrap();
    assert_eq!(read(out), vec![9.5, 12.0, 14.0, -0.5, 1.0, 2.0]);
    // vec4 path, no bias: x = [2], W = [[1, 2, 3, 4]]
    let out = linear(f2(vec![2.0], [1, 1], &dev), f2(vec![1.0, 2.0, 3.0, 4.0], [1, 4], &dev), None).unwrap();
    assert_eq!(read(out), vec![2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn views_are_read_as_their_logical_layout() {
    let dev = device();
    let mut rng = Rng::new(9);
    let (n, d_in, d_out) = (3, 70, 36);
    let x = rng.vec(n * d_in, 1.0);
    let w = rng.vec(d_in * d_out, 1.0);
    let b = rng.vec(d_out + 2, 1.0);
    // W handed over as the transpose of its [d_out, d_in] transpose
    let mut wt = vec![0.0; d_in * d_out];
    for k in 0..d_in {
        for j in 0..d_out {
            wt[j * d_in + k] = w[k * d_out + j];
        }
    }
    let w_view = f2(wt, [d_out, d_in], &dev).transpose();
    // x as rows 1..=3 of a larger tensor, bias as a slice
    let x_big = f2([rng.vec(d_in, 1.0), x.clone(), rng.vec(d_in, 1.0)].concat(), [n + 2, d_in], &dev);
    let x_view = x_big.slice([1..n + 1, 0..d_in]);
    let b_view = f1(b.clone(), &dev).narrow(0, 1, d_out);
    let out = linear(x_view, w_view, Some(b_view)).unwrap();
    check("views", &read(out), &x, &w, Some(&b[1..d_out + 1]), (n, d_in, d_out));
}

#[test]
fn bad_arguments_are_refused() {
    let dev = device();
    let x = f2(vec![0.0; 8], [2, 4], &dev);
    let w = f2(vec![0.0; 12], [4, 3], &dev);
    assert!(matches!(
        linear(x.clone(), f2(vec![0.0; 15], [5, 3], &dev), None),
        Err(KernelError::Shape { tensor: "weight", .. })
    ));
    assert_eq!(
        linear(x.clone(), w.clone(), Some(f1(vec![0.0; 4], &dev))).unwrap_err(),
        KernelError::Shape { tensor: "bias", expected: vec![3], got: vec![4] }
    );
    assert_eq!(
        linear(f2(vec![], [0, 4], &dev), w.clone(), None).unwrap_err(),
        KernelError::Empty { what: "rows of x" }
    );
    assert_eq!(linear(x.clone(), f2(vec![], [4, 0], &dev), None).unwrap_err(), KernelError::Empty { what: "d_out" });
    // more vec4 column workgroups than one dispatch dimension takes
    let cols = 65_536 * 64 * 4;
    let too_wide: Tensor<2> = Tensor::empty([1, cols], &dev);
    assert_eq!(
        linear(f2(vec![0.0], [1, 1], &dev), too_wide, None).unwrap_err(),
        KernelError::TooLarge { what: "output column workgroups", value: 65_536 }
    );
    let cpu = Device::flex();
    let w_cpu: Tensor<2> = Tensor::from_data(TensorData::new(vec![0.0f32; 12], [4, 3]), &cpu);
    assert!(matches!(linear(x.clone(), w_cpu, None), Err(KernelError::Device { tensor: "weight", .. })));
    let x_cpu: Tensor<2> = Tensor::from_data(TensorData::new(vec![0.0f32; 8], [2, 4]), &cpu);
    assert!(matches!(linear(x_cpu, w, None), Err(KernelError::Device { tensor: "x", .. })));
}
