//! Shared helpers of the GPU tests: the wgpu device (lavapipe in CI), deterministic random
//! data, uploads, read-backs and the tolerance check.

use std::sync::OnceLock;

use burn::tensor::{Device, DeviceKind, Int, Tensor, TensorData};

/// The wgpu device. There is no fallback to the CPU: without an adapter the tests fail. On
/// Linux Vulkan is asked first (as the runtime's `init_device` does): letting wgpu probe every
/// API also opens EGL, which prints driver noise on a machine without a display.
pub fn device() -> Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            #[cfg(target_os = "linux")]
            if let Ok(d) = Device::wgpu_options().graphics_api(burn::tensor::wgpu::WgpuBackend::Vulkan).init() {
                return d;
            }
            Device::wgpu(DeviceKind::DefaultDevice)
        })
        .clone()
}

/// SplitMix64: deterministic values from a proptest-chosen seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        (0..len).map(|_| self.unit() * amplitude).collect()
    }

    /// A sorted random subset of `0..len` with `count` elements.
    pub fn subset(&mut self, len: usize, count: usize) -> Vec<u32> {
        let mut all: Vec<u32> = (0..len as u32).collect();
        for i in 0..count {
            let j = i + self.below(len - i);
            all.swap(i, j);
        }
        let mut s = all[..count].to_vec();
        s.sort_unstable();
        s
    }
}

pub fn f3(data: Vec<f32>, shape: [usize; 3], dev: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

pub fn f2(data: Vec<f32>, shape: [usize; 2], dev: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

pub fn i2(data: Vec<i32>, shape: [usize; 2], dev: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

pub fn read<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().expect("f32 read-back")
}

pub fn read_i32<const D: usize>(t: Tensor<D, Int>) -> Vec<i32> {
    t.into_data_as::<i32>().try_to_vec::<i32>().expect("i32 read-back")
}

/// `|got − want| ≤ rtol·|want| + atol·scale` element-wise, where `scale` is the largest
/// `|want|` of the array (near-zero entries are judged against the array's magnitude).
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        let bound = rtol * w.abs() + atol * scale;
        assert!(
            err <= bound,
            "{what}[{i}]: got {g}, want {w}, |err| {err:e} > bound {bound:e} (rtol {rtol:e}, atol {atol:e} × scale {scale:e})"
        );
    }
}

/// Proptest settings for GPU cases: few cases, short shrinking (each case runs kernels).
pub fn gpu_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config { cases, max_shrink_iters: 16, failure_persistence: None, ..Default::default() }
}

pub fn f1(data: Vec<f32>, dev: &Device) -> Tensor<1> {
    let n = data.len();
    Tensor::from_data(TensorData::new(data, [n]), dev)
}

/// Checks a projection `y = x·W + b` (`[n, d_out]`) against the CPU twin:
/// `|got − want| ≤ 1e-5·(|b_j| + Σ_k |x_ik·w_kj|) + 1e-7`, relative to the magnitude of the
/// terms summed (f32 accumulation over `d_in` terms; the twin sums in f64).
pub fn check_product(tag: &str, got: &[f32], x: &[f32], w: &[f32], b: Option<&[f32]>, dims: (usize, usize, usize)) {
    let (n, d_in, d_out) = dims;
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let want = kvslice_kernels::cpu::linear(x, w, b, n, d_in, d_out);
    let b_abs = b.map(abs);
    let mag = kvslice_kernels::cpu::linear(&abs(x), &abs(w), b_abs.as_deref(), n, d_in, d_out);
    assert_eq!(got.len(), want.len(), "{tag}: length");
    for (i, ((&g, &r), &m)) in got.iter().zip(&want).zip(&mag).enumerate() {
        let err = (f64::from(g) - r).abs();
        let bound = 1e-5 * m + 1e-7;
        assert!(err <= bound, "{tag}: y[{}, {}] = {g}, want {r}, |err| {err:e} > {bound:e}", i / d_out, i % d_out);
    }
}
