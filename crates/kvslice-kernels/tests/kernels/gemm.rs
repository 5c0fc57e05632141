//! Kernel 7 (the tiled projection) against the CPU twin and hand-computed products.
//!
//! Tolerance: `|got − want| ≤ 1e-5·(|b_j| + Σ_k |x_ik·w_kj|) + 1e-7`, relative to the magnitude
//! of the terms summed (f32 accumulation over `d_in` terms; the twin sums in f64). A dropped
//! or repeated step of the tiling (16 terms) breaks the bound by orders of magnitude.

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_kernels::{KernelError, gemm};
use proptest::prelude::*;

use crate::common::{Rng, check_product, device, f1, f2, read};

fn run_case(n: usize, d_in: usize, d_out: usize, with_bias: bool, seed: u64) {
    let dev = device();
    let mut rng = Rng::new(seed);
    let x = rng.vec(n * d_in, 1.0);
    let w = rng.vec(d_in * d_out, 0.5);
    let b = with_bias.then(|| rng.vec(d_out, 2.0));
    let out = gemm(f2(x.clone(), [n, d_in], &dev), f2(w.clone(), [d_in, d_out], &dev), b.clone().map(|b| f1(b, &dev)))
        .expect("valid shapes");
    assert_eq!(out.dims(), [n, d_out]);
    check_product(&format!("n {n} d_in {d_in} d_out {d_out}"), &read(out), &x, &w, b.as_deref(), (n, d_in, d_out));
}

proptest! {
    #![proptest_config(crate::common::gpu_config(24))]

    #[test]
    fn matches_twin_on_random_shapes(
        // inside one row tile, at its edge, past it
        n in prop::sample::select(vec![1usize, 2, 5, 63, 64, 65, 130]),
        // inside one step along d_in, at its edge, past it, SmolLM2's widths
        d_in in prop::sample::select(vec![1usize, 3, 16, 17, 100, 576]),
        d_out in (1usize..100).prop_map(|c| 4 * c),
        with_bias in any::<bool>(),
        seed in any::<u64>(),
    ) {
        run_case(n, d_in, d_out, with_bias, seed);
    }
}

#[test]
fn smollm2_prefill_shapes() {
    // q|k|v, o, gate|up, down over a chunk of 512 rows and a short last chunk
    for (i, &(d_in, d_out)) in [(576, 960), (576, 576), (576, 3072), (1536, 576)].iter().enumerate() {
        for n in [512, 37] {
            run_case(n, d_in, d_out, i % 2 == 1, 200 + n as u64);
        }
    }
}

#[test]
fn hand_computed() {
    let dev = device();
    // [[1, 2], [3, -1]] · [[1, 2, 3, 0], [4, 5, 6, -1]] + [0.5, 0, -1, 2]
    let out = gemm(
        f2(vec![1.0, 2.0, 3.0, -1.0], [2, 2], &dev),
        f2(vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, -1.0], [2, 4], &dev),
        Some(f1(vec![0.5, 0.0, -1.0, 2.0], &dev)),
    )
    .unwrap();
    assert_eq!(read(out), vec![9.5, 12.0, 14.0, 0.0, -0.5, 1.0, 2.0, 3.0]);
}

#[test]
fn views_are_read_as_their_logical_layout() {
    let dev = device();
    let mut rng = Rng::new(11);
    let (n, d_in, d_out) = (70, 33, 68);
    let x = rng.vec(n * d_in, 1.0);
    let w = rng.vec(d_in * d_out, 1.0);
    let mut wt = vec![0.0; d_in * d_out];
    for k in 0..d_in {
        for j in 0..d_out {
            wt[j * d_in + k] = w[k * d_out + j];
        }
    }
    let w_view = f2(wt, [d_out, d_in], &dev).transpose();
    let x_big = f2([rng.vec(d_in, 1.0), x.clone()].concat(), [n + 1, d_in], &dev);
    let out = gemm(x_big.slice([1..n + 1, 0..d_in]), w_view, None).unwrap();
    check_product("views", &read(out), &x, &w, None, (n, d_in, d_out));
}

#[test]
fn bad_arguments_are_refused() {
    let dev = device();
    let x = f2(vec![0.0; 8], [2, 4], &dev);
    assert_eq!(
        gemm(x.clone(), f2(vec![0.0; 12], [4, 3], &dev), None).unwrap_err(),
        KernelError::Shape { tensor: "weight", expected: vec![4, 4], got: vec![4, 3] }
    );
    assert!(matches!(
        gemm(x.clone(), f2(vec![0.0; 20], [5, 4], &dev), None),
        Err(KernelError::Shape { tensor: "weight", .. })
    ));
    assert_eq!(
        gemm(x.clone(), f2(vec![0.0; 16], [4, 4], &dev), Some(f1(vec![0.0; 8], &dev))).unwrap_err(),
        KernelError::Shape { tensor: "bias", expected: vec![4], got: vec![8] }
    );
    assert_eq!(
        gemm(f2(vec![], [0, 4], &dev), f2(vec![0.0; 16], [4, 4], &dev), None).unwrap_err(),
        KernelError::Empty { what: "rows of x" }
    );
    let cpu = Device::flex();
    let w_cpu: Tensor<2> = Tensor::from_data(TensorData::new(vec![0.0f32; 16], [4, 4]), &cpu);
    assert!(matches!(gemm(x, w_cpu, None), Err(KernelError::Device { tensor: "weight", .. })));
}
