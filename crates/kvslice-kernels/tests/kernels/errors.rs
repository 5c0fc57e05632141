//! Bad input: typed errors before anything is dispatched.

use burn::tensor::{Device, Tensor, TensorData};
use kvslice_kernels::{CacheTensors, KernelError, MAX_HEAD_DIM, StatsRequest, decode_attention, window_stats};

use crate::common::{device, f2, f3, i2};

fn zeros3(shape: [usize; 3], dev: &Device) -> Tensor<3> {
    f3(vec![0.0; shape.iter().product()], shape, dev)
}

#[test]
fn window_stats_refuses_bad_shapes() {
    let dev = device();
    let req = StatsRequest::default();
    let q = zeros3([4, 2, 64], &dev);
    let kv = zeros3([2, 10, 64], &dev);
    // head_dim disagrees
    let k32 = zeros3([2, 10, 32], &dev);
    assert!(matches!(window_stats(&q, &k32, &kv, 10, req), Err(KernelError::Shape { tensor: "keys", .. })));
    // values disagree with keys
    let v9 = zeros3([2, 9, 64], &dev);
    assert!(matches!(window_stats(&q, &kv, &v9, 9, req), Err(KernelError::Shape { tensor: "values", .. })));
    // heads not a multiple of kv heads
    let k3 = zeros3([3, 10, 64], &dev);
    assert_eq!(window_stats(&q, &k3, &k3, 10, req).unwrap_err(), KernelError::Grouping { heads: 4, kv_heads: 3 });
    // window longer than the keys, empty window, keys past capacity
    assert_eq!(window_stats(&q, &kv, &kv, 1, req).unwrap_err(), KernelError::Window { window: 2, len: 1 });
    let q0 = zeros3([4, 0, 64], &dev);
    assert_eq!(window_stats(&q0, &kv, &kv, 5, req).unwrap_err(), KernelError::Window { window: 0, len: 5 });
    assert_eq!(
        window_stats(&q, &kv, &kv, 11, req).unwrap_err(),
        KernelError::LengthPastCapacity { head: 0, len: 11, capacity: 10 }
    );
    // unsupported head_dim
    let big = MAX_HEAD_DIM * 2;
    let (qb, kb) = (zeros3([2, 1, big], &dev), zeros3([2, 4, big], &dev));
    assert_eq!(
        window_stats(&qb, &kb, &kb, 4, req).unwrap_err(),
        KernelError::HeadDim { head_dim: big, max: MAX_HEAD_DIM }
    );
}

#[test]
fn non_wgpu_tensors_are_refused() {
    let cpu = Device::flex();
    let q: Tensor<3> = Tensor::from_data(TensorData::new(vec![0.0f32; 64], [1, 1, 64]), &cpu);
    let k: Tensor<3> = Tensor::from_data(TensorData::new(vec![0.0f32; 128], [1, 2, 64]), &cpu);
    assert!(matches!(
        window_stats(&q, &k, &k, 2, StatsRequest::default()),
        Err(KernelError::Device { tensor: "queries", .. })
    ));
    // mixed: wgpu queries, CPU keys
    let qg = zeros3([1, 1, 64], &device());
    assert!(matches!(
        window_stats(&qg, &k, &k, 2, StatsRequest::default()),
        Err(KernelError::Device { tensor: "keys", .. })
    ));
}

#[test]
fn decode_refuses_bad_arguments() {
    let dev = device();
    let q = f2(vec![0.0; 4 * 64], [4, 64], &dev);
    let kv = zeros3([2, 8, 64], &dev);
    assert_eq!(
        decode_attention(&q, &kv, &kv, &[8], None).unwrap_err(),
        KernelError::PerHead { what: "lengths", expected: 2, got: 1 }
    );
    assert_eq!(
        decode_attention(&q, &kv, &kv, &[8, 9], None).unwrap_err(),
        KernelError::LengthPastCapacity { head: 1, len: 9, capacity: 8 }
    );
    let mut bad_scores = f2(vec![0.0; 2 * 7], [2, 7], &dev);
    assert!(matches!(
        decode_attention(&q, &kv, &kv, &[8, 8], Some(&mut bad_scores)),
        Err(KernelError::Shape { tensor: "scores", .. })
    ));
    let q3 = f2(vec![0.0; 3 * 64], [3, 64], &dev);
    assert_eq!(
        decode_attention(&q3, &kv, &kv, &[8, 8], None).unwrap_err(),
        KernelError::Grouping { heads: 3, kv_heads: 2 }
    );
}

#[test]
fn compaction_refuses_views_and_bad_dtypes() {
    let dev = device();
    let mut k = zeros3([2, 8, 64], &dev);
    let mut v = zeros3([2, 8, 64], &dev);
    let mut p = i2(vec![0; 16], [2, 8], &dev);
    // a transposed view cannot be compacted in place
    let mut kt = zeros3([2, 64, 8], &dev).swap_dims(1, 2);
    let err = kvslice_kernels::compact_in_place_host(
        CacheTensors { keys: &mut kt, values: &mut v, positions: &mut p },
        &[vec![], vec![]],
        &[0, 0],
    );
    assert_eq!(err.unwrap_err(), KernelError::NotContiguous { tensor: "keys" });
    // positions with the wrong shape
    let mut p3 = i2(vec![0; 18], [2, 9], &dev);
    let err = kvslice_kernels::compact_in_place_host(
        CacheTensors { keys: &mut k, values: &mut v, positions: &mut p3 },
        &[vec![], vec![]],
        &[0, 0],
    );
    assert!(matches!(err, Err(KernelError::Shape { tensor: "positions", .. })));
}

#[test]
fn fused_stages_refuse_bad_shapes() {
    use kvslice_kernels::{Fusion, project, rms_norm, rope_split};
    let dev = device();
    let f1 = |n: usize| Tensor::<1>::from_data(TensorData::new(vec![0.0f32; n], [n]), &dev);
    let x = f2(vec![0.0; 8], [1, 8], &dev);
    let w = f2(vec![0.0; 8 * 6], [8, 6], &dev);
    // two rows: the fused projection is for one decode row
    let x2 = f2(vec![0.0; 16], [2, 8], &dev);
    assert!(matches!(project(&x2, &w, None, Fusion::default()), Err(KernelError::Shape { tensor: "x", .. })));
    // weight rows disagree with x
    let w7 = f2(vec![0.0; 7 * 6], [7, 6], &dev);
    assert!(matches!(project(&x, &w7, None, Fusion::default()), Err(KernelError::Shape { tensor: "weight", .. })));
    // bias, norm weight and residual of the wrong length
    assert!(matches!(project(&x, &w, Some(&f1(5)), Fusion::default()), Err(KernelError::Shape { tensor: "bias", .. })));
    let g = f1(7);
    let fusion = Fusion { norm: Some((&g, 1e-5)), ..Default::default() };
    assert!(matches!(project(&x, &w, None, fusion), Err(KernelError::Shape { tensor: "norm weight", .. })));
    // with SwiGLU the output is half the weight's columns: a residual of 6 does not fit
    let r = f2(vec![0.0; 6], [1, 6], &dev);
    let fusion = Fusion { residual: Some(&r), swiglu: true, ..Default::default() };
    assert!(matches!(project(&x, &w, None, fusion), Err(KernelError::Shape { tensor: "residual", .. })));
    let w5 = f2(vec![0.0; 8 * 5], [8, 5], &dev);
    let fusion = Fusion { swiglu: true, ..Default::default() };
    assert!(matches!(project(&x, &w5, None, fusion), Err(KernelError::Shape { tensor: "weight", .. })));
    // a q|k|v row of the wrong width, tables of the wrong length, bad grouping
    let qkv = f2(vec![0.0; 4 * 8], [1, 32], &dev);
    assert!(rope_split(&qkv, &f1(4), &f1(4), 2, 1, 8).is_ok());
    assert!(matches!(rope_split(&qkv, &f1(4), &f1(4), 3, 1, 8), Err(KernelError::Shape { tensor: "qkv", .. })));
    assert!(matches!(rope_split(&qkv, &f1(3), &f1(4), 2, 1, 8), Err(KernelError::Shape { tensor: "cos", .. })));
    assert_eq!(rope_split(&qkv, &f1(4), &f1(4), 3, 2, 4).unwrap_err(), KernelError::Grouping { heads: 3, kv_heads: 2 });
    assert!(matches!(rms_norm(&x, &f1(7), 1e-5), Err(KernelError::Shape { tensor: "weight", .. })));
}

#[test]
fn quantized_weights_refuse_bad_blocks_and_shapes() {
    use kvslice_kernels::{Fusion, QuantFormat, QuantMatrix, dequantize, qproject};
    let dev = device();
    // one Q8_0 block: f16 scale 1.0, zero values
    let block = |d: [u8; 2]| [&d[..], &[0u8; 32]].concat();
    let two = [block([0x00, 0x3c]), block([0x00, 0x7c])].concat();
    // an infinite scale in the second block (row 1 of a [2, 32] matrix)
    assert_eq!(
        QuantMatrix::upload(QuantFormat::Q8_0, 2, 32, &two, &dev).unwrap_err(),
        KernelError::NonFiniteBlock { block: 1, row: 1 }
    );
    // a NaN offset in a Q4_1 block
    let nan_m = [&[0x00, 0x3c, 0x01, 0x7e][..], &[0u8; 16]].concat();
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::Q4_1, 1, 32, &nan_m, &dev),
        Err(KernelError::NonFiniteBlock { block: 0, row: 0 })
    ));
    // a NaN among F16 values (value 5 of block 0), an infinite BF16 one (row 1)
    let mut f16 = vec![0u8; 64];
    f16[10..12].copy_from_slice(&0x7e00u16.to_le_bytes());
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::F16, 1, 32, &f16, &dev),
        Err(KernelError::NonFiniteBlock { block: 0, row: 0 })
    ));
    let mut bf16 = vec![0u8; 128];
    bf16[64..66].copy_from_slice(&0x7f80u16.to_le_bytes());
    assert_eq!(
        QuantMatrix::upload(QuantFormat::BF16, 2, 32, &bf16, &dev).unwrap_err(),
        KernelError::NonFiniteBlock { block: 1, row: 1 }
    );
    let f16 = QuantMatrix::upload(QuantFormat::F16, 1, 32, &[0u8; 64], &dev).unwrap();
    assert_eq!(f16.device_bytes(), 64, "no header for 16-bit floats");
    // K-quants: an infinite dmin (Q4_K, bytes 2..4), a NaN d at the end of a Q6_K block; rows
    // of 256-value super-blocks only; Q6_K's 210 bytes padded to 212 on the device
    let mut q4k = vec![0u8; 144 * 2];
    q4k[144 + 2..144 + 4].copy_from_slice(&0xfc00u16.to_le_bytes());
    assert_eq!(
        QuantMatrix::upload(QuantFormat::Q4_K, 2, 256, &q4k, &dev).unwrap_err(),
        KernelError::NonFiniteBlock { block: 1, row: 1 }
    );
    let mut q6k = vec![0u8; 210];
    q6k[208..210].copy_from_slice(&0x7e00u16.to_le_bytes());
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::Q6_K, 1, 256, &q6k, &dev),
        Err(KernelError::NonFiniteBlock { block: 0, row: 0 })
    ));
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::Q5_K, 1, 128, &[0u8; 88], &dev),
        Err(KernelError::Shape { tensor: "blocks", .. })
    ));
    let q6k = QuantMatrix::upload(QuantFormat::Q6_K, 3, 512, &vec![0u8; 210 * 6], &dev).unwrap();
    // 210 bytes a super-block, in 14 quads of words (the last padded): 224 bytes
    assert_eq!(q6k.device_bytes(), 224 * 6);
    // columns that are not whole blocks, bytes that are not the blocks' length, no rows
    let one = block([0x00, 0x3c]);
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::Q8_0, 1, 31, &one, &dev),
        Err(KernelError::Shape { tensor: "blocks", .. })
    ));
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::Q8_0, 1, 32, &one[..33], &dev),
        Err(KernelError::Shape { tensor: "block bytes", .. })
    ));
    assert!(matches!(
        QuantMatrix::upload(QuantFormat::Q4_0, 1, 32, &one, &dev),
        Err(KernelError::Shape { tensor: "block bytes", .. })
    ));
    assert!(matches!(QuantMatrix::upload(QuantFormat::Q8_0, 0, 32, &[], &dev), Err(KernelError::Empty { .. })));

    let mut m = QuantMatrix::upload(QuantFormat::Q8_0, 1, 32, &one, &dev).unwrap();
    // 8 value words and a header word, padded to whole quads of words
    assert_eq!(m.device_bytes(), 48);
    assert_eq!(
        m.set_rows_per_invocation(3).unwrap_err(),
        KernelError::RowsPerInvocation { rows: 3, allowed: &kvslice_kernels::shader::QPROJECT_ROWS }
    );
    assert_eq!(
        dequantize(&m, Some(&[0, 1]), false).unwrap_err(),
        KernelError::RowOutOfRange { what: "row id", index: 1, rows: 1 }
    );
    assert!(matches!(dequantize(&m, Some(&[]), false), Err(KernelError::Empty { .. })));
    // x of the wrong width or with two rows; bias and residual of the wrong length
    let x = f2(vec![0.0; 32], [1, 32], &dev);
    assert!(matches!(
        qproject(&f2(vec![0.0; 31], [1, 31], &dev), &m, None, Fusion::default()),
        Err(KernelError::Shape { tensor: "x", .. })
    ));
    assert!(matches!(
        qproject(&f2(vec![0.0; 64], [2, 32], &dev), &m, None, Fusion::default()),
        Err(KernelError::Shape { tensor: "x", .. })
    ));
    let b2 = Tensor::<1>::from_data(TensorData::new(vec![0.0f32; 2], [2]), &dev);
    assert!(matches!(qproject(&x, &m, Some(&b2), Fusion::default()), Err(KernelError::Shape { tensor: "bias", .. })));
    let r2 = f2(vec![0.0; 2], [1, 2], &dev);
    let fusion = Fusion { residual: Some(&r2), ..Default::default() };
    assert!(matches!(qproject(&x, &m, None, fusion), Err(KernelError::Shape { tensor: "residual", .. })));
    // SwiGLU needs gate and up rows: one row is neither
    let fusion = Fusion { swiglu: true, ..Default::default() };
    assert!(matches!(qproject(&x, &m, None, fusion), Err(KernelError::Shape { tensor: "weight", .. })));
}
