//! Every block format kvslice keeps on the device, from a GGUF file written by gguf-py, against
//! gguf-py's own dequantization of the same file (tests/golden/gguf-quant, made by
//! scripts/formats/make_gguf_quant.py with random blocks): the values `qproject.wgsl`
//! dequantizes, and its projection of a row through them.

use burn::tensor::{Tensor, TensorData};
use kvslice_formats::gguf::{GgmlType, GgufFile};
use kvslice_kernels::{Fusion, QuantFormat, QuantMatrix, dequantize, qproject};
use kvslice_tests::{golden_dir, wgpu};

/// gguf-py's f32 values by tensor name.
fn expected() -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(golden_dir().join("gguf-quant/expected.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            (name, view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        })
        .collect()
}

#[test]
fn device_blocks_dequantize_and_project_as_gguf_py() {
    let file = GgufFile::parse(std::fs::read(golden_dir().join("gguf-quant/quant.gguf")).unwrap()).unwrap();
    let device = wgpu();
    let mut checked = Vec::new();
    for (name, want) in expected() {
        let info = file.tensor_info(&name).unwrap();
        let format = match info.ggml_type {
            GgmlType::Q8_0 => QuantFormat::Q8_0,
            GgmlType::Q4_0 => QuantFormat::Q4_0,
            GgmlType::Q4_1 => QuantFormat::Q4_1,
            GgmlType::Q5_0 => QuantFormat::Q5_0,
            GgmlType::Q5_1 => QuantFormat::Q5_1,
            GgmlType::F16 => QuantFormat::F16,
            GgmlType::BF16 => QuantFormat::BF16,
            GgmlType::Q4_K => QuantFormat::Q4_K,
            GgmlType::Q5_K => QuantFormat::Q5_K,
            GgmlType::Q6_K => QuantFormat::Q6_K,
            _ => continue,
        };
        let shape = info.shape();
        let [rows, cols] = shape[..] else { continue };
        if !cols.is_multiple_of(format.values()) {
            continue;
        }
        let m = QuantMatrix::upload(format, rows, cols, file.tensor_bytes(info), &device).unwrap();
        // Values: equal (a zero's sign aside: the kernel adds Q4_0's −8·d as an offset), both
        // sides rounding the same exact product and sum to f32 once at most.
        let got = dequantize(&m, None, false).unwrap().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "{name}[{i}]: {g} vs gguf-py {w}");
        }
        // A projection of x = (1, −1/2, 1/3, ...) through the rows, against f64 sums of
        // gguf-py's values; f32 accumulation over `cols` terms of at most Σ|x·w|.
        let x: Vec<f32> = (0..cols).map(|k| if k % 2 == 0 { 1.0 } else { -1.0 } / (1 + k % 7) as f32).collect();
        let xt = Tensor::<2>::from_data(TensorData::new(x.clone(), [1, cols]), &device);
        let y = qproject(&xt, &m, None, Fusion::default()).unwrap().into_data().try_to_vec::<f32>().unwrap();
        for r in 0..rows {
            let row = &want[r * cols..(r + 1) * cols];
            let exact: f64 = row.iter().zip(&x).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
            let scale: f64 = row.iter().zip(&x).map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs()).sum();
            let tol = 4.0 * cols as f64 * f64::from(f32::EPSILON) * scale + 1e-30;
            assert!((f64::from(y[r]) - exact).abs() <= tol, "{name} row {r}: {} vs {exact} (tolerance {tol:e})", y[r]);
        }
        checked.push(format);
    }
    for f in [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ] {
        assert!(checked.contains(&f), "no {f:?} tensor checked: {checked:?}");
    }
}
