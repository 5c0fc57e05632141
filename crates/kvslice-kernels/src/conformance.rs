//! Conformance suite: every kernel against its CPU twin (and hand-computed cases) on a given
//! wgpu device, with fixed shapes and seeds, reading results back asynchronously.
//!
//! This is the part of the kernel tests that can run anywhere a wgpu device exists, the browser
//! included (where nothing may block on the GPU): the native test suite runs it on lavapipe
//! (`tests/kernels/conformance.rs`) and the web facade runs it on the page's WebGPU adapter.
//! The tolerances are those of the native property tests (see `tests/kernels/*.rs`). A failing
//! check is reported, never a panic.

use std::cmp::Ordering;

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::{CacheTensors, QuantFormat, QuantMatrix, StatsRequest, cpu, dequantize, qproject};

/// Outcome of one case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    /// Kernel family (`window_stats`, `decode_attention`, ...).
    pub kernel: &'static str,
    /// The case: shapes and seed.
    pub case: String,
    /// `None` when every check passed, else the first failure.
    pub failure: Option<String>,
    /// Values compared against the reference.
    pub checked: usize,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }

    /// The case as the page and `kvslice conformance --json` report it.
    pub fn report(&self) -> CaseReport<'_> {
        CaseReport {
            kernel: self.kernel,
            case: &self.case,
            passed: self.passed(),
            failure: self.failure.as_deref(),
            checked: self.checked,
        }
    }
}

/// One case in the suite's JSON report: `{kernel, case, passed, failure, checked}`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CaseReport<'a> {
    pub kernel: &'a str,
    pub case: &'a str,
    pub passed: bool,
    pub failure: Option<&'a str>,
    pub checked: usize,
}

type Check = std::result::Result<usize, String>;

/// Runs every case on `device` (a wgpu device) and returns one result per case.
pub async fn run_all(device: &Device) -> Vec<CaseResult> {
    let mut out = Vec::new();
    macro_rules! case {
        ($kernel:expr, $case:expr, $run:expr) => {{
            let r: Check = $run.await;
            let (failure, checked) = match r {
                Ok(n) => (None, n),
                Err(e) => (Some(e), 0),
            };
            out.push(CaseResult { kernel: $kernel, case: $case.to_string(), failure, checked });
        }};
    }
    // 1. window statistics
    case!("window_stats", "hand-computed uniform scores", stats_hand(device));
    for &(kv, g, d, n, extra, w, amp, seed) in &[
        (1usize, 1usize, 64usize, 1usize, 0usize, 1usize, 1.0f32, 3u64),
        (2, 8, 128, 1, 2, 1, 1.0, 4),
        (2, 4, 128, 517, 3, 33, 3.0, 7),
        (1, 3, 24, 130, 0, 9, 1.0, 11),
        (2, 1, 7, 61, 4, 40, 1.0, 12),
    ] {
        case!(
            "window_stats",
            format!("kv_heads {kv} group {g} d {d} n {n} cap {} w {w} amplitude {amp} seed {seed}", n + extra),
            stats_twin(device, kv, g, d, n, extra, w, amp, seed)
        );
    }
    // 2. compaction and appends
    for &(kv, cap, d, seed) in &[(1usize, 300usize, 128usize, 42u64), (3, 97, 64, 13), (4, 33, 5, 14)] {
        case!(
            "compact_in_place",
            format!("kv_heads {kv} cap {cap} d {d} seed {seed}"),
            compact_twin(device, kv, cap, d, seed)
        );
    }
    case!("append_rows", "kv_heads 3 cap 64 d 64, two rows after compaction", append_after_compact(device));
    case!("write_rows", "kv_heads 3 cap 40 d 64, one row per head at chosen slots", write_rows_twin(device));
    // 3. ragged decode attention
    for &(kv, g, d, cap, amp, seed) in &[
        (1usize, 1usize, 64usize, 1usize, 1.0f32, 15u64),
        (2, 4, 128, 1301, 3.0, 16),
        (3, 3, 13, 200, 1.0, 17),
        (1, 8, 64, 64, 1.0, 18),
        (2, 7, 66, 700, 2.0, 19),
        (1, 5, 64, 300, 1.0, 20),
    ] {
        case!(
            "decode_attention",
            format!("kv_heads {kv} group {g} d {d} cap {cap} amplitude {amp} seed {seed}"),
            decode_twin(device, kv, g, d, cap, amp, seed)
        );
    }
    // 4. skinny projection
    case!("linear", "hand-computed", linear_hand(device));
    for &(n, d_in, d_out, bias, seed) in &[
        (1usize, 576usize, 576usize, true, 101u64),
        (4, 576, 192, false, 104),
        (7, 1536, 576, true, 107),
        (1, 64, 49152, false, 1),
        (3, 33, 37, true, 19),
    ] {
        case!(
            "linear",
            format!("n {n} d_in {d_in} d_out {d_out} bias {bias} seed {seed}"),
            linear_twin(device, n, d_in, d_out, bias, seed)
        );
    }
    // 5. fused decode-step stages
    case!("project", "hand-computed", project_hand(device));
    for &(d_in, d_out, fuse, seed) in &[
        (576usize, 960usize, Fuse { bias: true, norm: true, residual: false, swiglu: false }, 201u64),
        (576, 576, Fuse { bias: false, norm: false, residual: true, swiglu: false }, 202),
        (576, 1536, Fuse { bias: false, norm: true, residual: false, swiglu: true }, 203),
        (1536, 576, Fuse { bias: false, norm: false, residual: true, swiglu: false }, 204),
        (33, 37, Fuse { bias: true, norm: true, residual: true, swiglu: false }, 205),
        (70, 13, Fuse { bias: true, norm: true, residual: false, swiglu: true }, 206),
        (64, 24, Fuse { bias: false, norm: false, residual: true, swiglu: true }, 207),
    ] {
        case!(
            "project",
            format!("d_in {d_in} d_out {d_out} {fuse:?} seed {seed}"),
            project_twin(device, d_in, d_out, fuse, seed)
        );
    }
    case!("rope_split", "hand-computed quarter turn", rope_hand(device));
    for &(heads, kv, d, seed) in &[(9usize, 3usize, 64usize, 211u64), (4, 2, 6, 212), (32, 8, 128, 213)] {
        case!(
            "rope_split",
            format!("heads {heads} kv_heads {kv} d {d} seed {seed}"),
            rope_twin(device, heads, kv, d, seed)
        );
    }
    for &(rows, width, seed) in &[(1usize, 576usize, 221u64), (3, 37, 222)] {
        case!("rms_norm", format!("rows {rows} width {width} seed {seed}"), rms_norm_twin(device, rows, width, seed));
    }
    // 6. projections over quantized blocks
    use crate::QuantFormat::{BF16, F16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0};
    case!(
        "dequantize",
        "hand-computed Q8_0 (subnormal scales too), Q4_0, Q4_1, Q5_0, Q5_1 blocks",
        dequant_hand(device)
    );
    case!("dequantize", "hand-computed Q4_K, Q6_K super-blocks", dequant_hand_k(device));
    for &(format, rows, cols, seed) in &[
        (Q8_0, 7usize, 96usize, 231u64),
        (Q4_0, 5, 64, 232),
        (Q4_1, 3, 576, 233),
        (Q4_1, 1, 32, 234),
        (F16, 6, 64, 235),
        (BF16, 4, 96, 236),
        (Q4_K, 3, 512, 237),
        (Q5_K, 2, 768, 238),
        (Q6_K, 5, 256, 239),
        (Q5_0, 3, 96, 240),
        (Q5_1, 2, 64, 253),
    ] {
        case!(
            "dequantize",
            format!("{format:?} rows {rows} cols {cols} seed {seed}"),
            dequant_twin(device, format, rows, cols, seed)
        );
    }
    case!("qproject", "hand-computed", qproject_hand(device));
    for &(format, d_in, d_out, fuse, seed) in &[
        (Q8_0, 576usize, 960usize, Fuse { bias: true, norm: true, residual: false, swiglu: false }, 241u64),
        (Q4_0, 576, 1536, Fuse { bias: false, norm: true, residual: false, swiglu: true }, 242),
        (Q4_1, 1536, 576, Fuse { bias: false, norm: false, residual: true, swiglu: false }, 243),
        (Q4_1, 64, 13, Fuse { bias: true, norm: true, residual: true, swiglu: false }, 244),
        (Q8_0, 96, 7, Fuse { bias: true, norm: true, residual: false, swiglu: true }, 245),
        (Q4_0, 32, 1, Fuse { bias: false, norm: false, residual: false, swiglu: false }, 246),
        (F16, 576, 192, Fuse { bias: true, norm: true, residual: false, swiglu: false }, 247),
        (BF16, 96, 70, Fuse { bias: false, norm: true, residual: true, swiglu: true }, 248),
        (Q4_K, 512, 96, Fuse { bias: false, norm: true, residual: false, swiglu: true }, 249),
        (Q5_K, 768, 64, Fuse { bias: true, norm: true, residual: true, swiglu: false }, 250),
        (Q6_K, 1536, 33, Fuse { bias: false, norm: false, residual: true, swiglu: false }, 251),
        (Q6_K, 256, 130, Fuse { bias: true, norm: true, residual: false, swiglu: false }, 252),
        (Q5_0, 576, 192, Fuse { bias: false, norm: true, residual: false, swiglu: true }, 254),
        (Q5_1, 160, 70, Fuse { bias: true, norm: false, residual: true, swiglu: false }, 255),
    ] {
        case!(
            "qproject",
            format!("{format:?} d_in {d_in} d_out {d_out} {fuse:?} seed {seed}"),
            qproject_twin(device, format, d_in, d_out, fuse, seed, 1)
        );
    }
    // Several rows per invocation (CPU adapters): output counts that are not multiples of it,
    // every fusion, a K-quant (which keeps one)
    for &(format, d_in, d_out, fuse, seed, per) in &[
        (Q4_1, 64usize, 13usize, Fuse { bias: true, norm: true, residual: true, swiglu: false }, 257u64, 4u32),
        (Q8_0, 96, 7, Fuse { bias: true, norm: true, residual: false, swiglu: true }, 258, 8),
        (Q4_0, 32, 1, Fuse { bias: false, norm: false, residual: false, swiglu: false }, 259, 4),
        (Q4_1, 1536, 578, Fuse { bias: false, norm: true, residual: true, swiglu: false }, 260, 4),
        (Q5_0, 576, 190, Fuse { bias: false, norm: true, residual: false, swiglu: true }, 261, 8),
        (Q5_1, 160, 70, Fuse { bias: true, norm: false, residual: true, swiglu: false }, 262, 4),
        (F16, 576, 193, Fuse { bias: true, norm: true, residual: false, swiglu: false }, 263, 8),
        (BF16, 96, 70, Fuse { bias: false, norm: true, residual: true, swiglu: true }, 264, 4),
        (Q6_K, 256, 130, Fuse { bias: true, norm: true, residual: false, swiglu: false }, 265, 4),
    ] {
        case!(
            "qproject",
            format!("{format:?} d_in {d_in} d_out {d_out} {fuse:?} seed {seed}, {per} rows per invocation"),
            qproject_twin(device, format, d_in, d_out, fuse, seed, per)
        );
    }
    for per in [1, 4] {
        case!(
            "qproject",
            format!(
                "stacked Q4_K 40 rows | Q6_K 8 | Q8_0 8, d_in 512, bias, norm, residual; its dequantized transpose; seed 256, {per} rows per invocation"
            ),
            qproject_stacked(device, 256, per)
        );
    }
    out
}

/// SplitMix64, the same generator as the native tests'.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn vec(&mut self, len: usize, amplitude: f32) -> Vec<f32> {
        (0..len).map(|_| self.unit() * amplitude).collect()
    }

    fn subset(&mut self, len: usize, count: usize) -> Vec<u32> {
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

fn f1(data: Vec<f32>, dev: &Device) -> Tensor<1> {
    let n = data.len();
    Tensor::from_data(TensorData::new(data, [n]), dev)
}

fn f2(data: Vec<f32>, shape: [usize; 2], dev: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

fn f3(data: Vec<f32>, shape: [usize; 3], dev: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

fn i2(data: Vec<i32>, shape: [usize; 2], dev: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(data, shape), dev)
}

async fn read<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, String> {
    let data = t.into_data_async().await.map_err(|e| format!("read-back: {e:?}"))?;
    data.try_to_vec::<f32>().map_err(|e| format!("read-back: {e:?}"))
}

async fn read_int<const D: usize, E: burn::tensor::Element>(t: Tensor<D, Int>) -> Result<Vec<E>, String> {
    let data = t.into_data_async().await.map_err(|e| format!("read-back: {e:?}"))?;
    let data = data.try_cast_as::<E>().map_err(|e| format!("read-back: {e:?}"))?;
    data.try_to_vec::<E>().map_err(|e| format!("read-back: {e:?}"))
}

fn kernel<T>(what: &str, r: crate::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// `|got − want| ≤ rtol·|want| + atol·scale` element-wise, `scale` the largest `|want|`.
fn close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) -> Check {
    if got.len() != want.len() {
        return Err(format!("{what}: length {} != {}", got.len(), want.len()));
    }
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - w).abs();
        let bound = rtol * w.abs() + atol * scale;
        // no ordering (NaN) fails too
        if !matches!(err.partial_cmp(&bound), Some(Ordering::Less | Ordering::Equal)) {
            return Err(format!("{what}[{i}]: got {g}, want {w}, |err| {err:e} > bound {bound:e}"));
        }
    }
    Ok(got.len())
}

fn equal<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Check {
    if got.len() != want.len() {
        return Err(format!("{what}: length {} != {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(got.len()),
        Some(i) => Err(format!("{what}[{i}]: got {:?}, want {:?}", got[i], want[i])),
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[allow(clippy::too_many_arguments)]
async fn stats_twin(
    dev: &Device,
    kv_heads: usize,
    group: usize,
    d: usize,
    n: usize,
    extra_cap: usize,
    w: usize,
    amplitude: f32,
    seed: u64,
) -> Check {
    let heads = kv_heads * group;
    let cap = n + extra_cap;
    let mut rng = Rng::new(seed);
    let q = rng.vec(heads * w * d, amplitude);
    let k = rng.vec(kv_heads * cap * d, amplitude);
    let v = rng.vec(kv_heads * cap * d, 1.0);
    let want = cpu::window_stats(&q, &k, &v, heads, kv_heads, w, cap, n, d);
    let request = StatsRequest { value_norm: true, projection: true, jacobian: true };
    let got = kernel(
        "window_stats",
        crate::window_stats(
            &f3(q, [heads, w, d], dev),
            &f3(k, [kv_heads, cap, d], dev),
            &f3(v, [kv_heads, cap, d], dev),
            n,
            request,
        ),
    )?;
    let value_norm = got.value_norm.ok_or("value_norm missing")?;
    let projection = got.projection.ok_or("projection missing")?;
    let jacobian = got.jacobian.ok_or("jacobian missing")?;
    let mut c = close("mean", &read(got.mean).await?, &want.mean, 1e-4, 1e-5)?;
    c += close("variance", &read(got.variance).await?, &want.variance, 1e-3, 1e-5)?;
    c += close("last", &read(got.last).await?, &want.last, 1e-4, 1e-5)?;
    c += close("value_norm", &read(value_norm).await?, &want.value_norm, 1e-4, 1e-5)?;
    c += close("projection", &read(projection).await?, &want.projection, 1e-4, 1e-5)?;
    // ‖v_j − o_i‖ is 0 when a query sees one key: then judged against the value norms' scale
    let mut jac_want = want.jacobian.clone();
    let floor = want.value_norm.iter().fold(0f64, |m, x| m.max(x.abs()));
    jac_want.push(floor);
    let mut jac_got = read(jacobian).await?;
    jac_got.push(floor as f32);
    c += close("jacobian", &jac_got, &jac_want, 1e-3, 1e-5)?;
    c += close("entropy", &read(got.entropy).await?, &want.entropy, 1e-4, 1e-5)?;
    c += close("column_variance", &read(got.column_variance).await?, &want.column_variance, 1e-4, 1e-5)?;
    Ok(c)
}

async fn stats_hand(dev: &Device) -> Check {
    // q = 0 makes every visible weight uniform. n = 3, w = 2: query 0 (position 1) sees keys
    // 0, 1 with 1/2 each; query 1 (position 2) sees keys 0, 1, 2 with 1/3 each.
    let q = f3(vec![0.0, 0.0], [1, 2, 1], dev);
    let k = f3(vec![0.3, -0.7, 0.1], [1, 3, 1], dev);
    let v = f3(vec![1.0, 2.0, 3.0], [1, 3, 1], dev);
    let s = kernel(
        "window_stats",
        crate::window_stats(&q, &k, &v, 3, StatsRequest { value_norm: true, projection: true, jacobian: true }),
    )?;
    let third = 1.0 / 3.0;
    let mean = [(0.5 + third) / 2.0, (0.5 + third) / 2.0, third / 2.0];
    let var = [(0.5 - third) * (0.5 - third) / 2.0, (0.5 - third) * (0.5 - third) / 2.0, third * third / 2.0];
    let h = |a: f64| -a * (a + 1e-10).ln();
    let weighted = [mean[0], 2.0 * mean[1], 3.0 * mean[2]];
    let value_norm = s.value_norm.ok_or("value_norm missing")?;
    let projection = s.projection.ok_or("projection missing")?;
    let mut c = close("mean", &read(s.mean).await?, &mean, 1e-5, 1e-6)?;
    c += close("variance", &read(s.variance).await?, &var, 1e-4, 1e-6)?;
    c += close("last", &read(s.last).await?, &[third, third, third], 1e-5, 1e-6)?;
    c += close("value_norm", &read(value_norm).await?, &weighted, 1e-5, 1e-6)?;
    c += close("projection", &read(projection).await?, &weighted, 1e-5, 1e-6)?;
    c += close("entropy", &read(s.entropy).await?, &[(h(0.5) + h(third)) / 2.0], 1e-5, 1e-6)?;
    c += close("column_variance", &read(s.column_variance).await?, &[var[0]], 1e-4, 1e-6)?;
    Ok(c)
}

struct Host {
    kv_heads: usize,
    cap: usize,
    d: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    p: Vec<i32>,
}

impl Host {
    fn random(kv_heads: usize, cap: usize, d: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let k = rng.vec(kv_heads * cap * d, 1.0);
        let v = rng.vec(kv_heads * cap * d, 1.0);
        let p = (0..kv_heads * cap).map(|i| (i % cap) as i32 + 1000 * (i / cap) as i32).collect();
        Host { kv_heads, cap, d, k, v, p }
    }

    fn upload(&self, dev: &Device) -> (Tensor<3>, Tensor<3>, Tensor<2, Int>) {
        (
            f3(self.k.clone(), [self.kv_heads, self.cap, self.d], dev),
            f3(self.v.clone(), [self.kv_heads, self.cap, self.d], dev),
            i2(self.p.clone(), [self.kv_heads, self.cap], dev),
        )
    }

    /// The twin: each head gathered in place.
    fn compacted(&self, kept: &[Vec<u32>]) -> Host {
        let (cap, d) = (self.cap, self.d);
        let mut out = Host { k: vec![], v: vec![], p: vec![], ..*self };
        for (h, list) in kept.iter().enumerate() {
            out.k.extend(cpu::compact(&self.k[h * cap * d..(h + 1) * cap * d], d, list));
            out.v.extend(cpu::compact(&self.v[h * cap * d..(h + 1) * cap * d], d, list));
            out.p.extend(cpu::compact(&self.p[h * cap..(h + 1) * cap], 1, list));
        }
        out
    }
}

async fn compact_twin(dev: &Device, kv_heads: usize, cap: usize, d: usize, seed: u64) -> Check {
    let host = Host::random(kv_heads, cap, d, seed);
    let mut rng = Rng::new(seed ^ 1);
    let mut lens = Vec::new();
    let mut kept = Vec::new();
    for h in 0..kv_heads {
        // head 0 keeps every fourth slot from 1 (sources cross chunk boundaries both ways)
        let (len, list) = if h == 0 {
            (cap, (1..cap).step_by(4).map(|x| x as u32).collect())
        } else {
            let len = rng.below(cap + 1);
            let count = match rng.below(4) {
                0 => 0,
                1 => len,
                _ => rng.below(len + 1),
            };
            (len, rng.subset(len, count))
        };
        lens.push(len as u32);
        kept.push(list);
    }
    let (mut k, mut v, mut p) = host.upload(dev);
    let new_lens = kernel(
        "compact_in_place_host",
        crate::compact_in_place_host(CacheTensors { keys: &mut k, values: &mut v, positions: &mut p }, &kept, &lens),
    )?;
    let want = host.compacted(&kept);
    let mut c = equal("lengths", &new_lens, &kept.iter().map(|l| l.len() as u32).collect::<Vec<_>>())?;
    c += equal("keys (bits)", &bits(&read(k).await?), &bits(&want.k))?;
    c += equal("values (bits)", &bits(&read(v).await?), &bits(&want.v))?;
    c += equal("positions", &read_int::<2, i32>(p).await?, &want.p)?;
    Ok(c)
}

async fn append_after_compact(dev: &Device) -> Check {
    let (kv_heads, cap, d) = (3usize, 64usize, 64usize);
    let host = Host::random(kv_heads, cap, d, 5);
    let (mut k, mut v, mut p) = host.upload(dev);
    let lens = vec![cap as u32, 50, 20];
    let mut rng = Rng::new(8);
    let kept_host: Vec<Vec<u32>> =
        [(64usize, 10usize), (50, 33), (20, 20)].iter().map(|&(len, count)| rng.subset(len, count)).collect();
    let lens = kernel(
        "compact_in_place_host",
        crate::compact_in_place_host(
            CacheTensors { keys: &mut k, values: &mut v, positions: &mut p },
            &kept_host,
            &lens,
        ),
    )?;
    let mut c = equal("lengths after compaction", &lens, &[10, 33, 20])?;
    let mut want = host.compacted(&kept_host);
    let t = 2;
    let nk = rng.vec(kv_heads * t * d, 1.0);
    let nv = rng.vec(kv_heads * t * d, 1.0);
    let np: Vec<i32> = (0..kv_heads * t).map(|i| 5000 + i as i32).collect();
    let lens = kernel(
        "append_rows",
        crate::append_rows(
            CacheTensors { keys: &mut k, values: &mut v, positions: &mut p },
            &f3(nk.clone(), [kv_heads, t, d], dev),
            &f3(nv.clone(), [kv_heads, t, d], dev),
            &i2(np.clone(), [kv_heads, t], dev),
            &lens,
        ),
    )?;
    c += equal("lengths after append", &lens, &[12, 35, 22])?;
    for h in 0..kv_heads {
        for r in 0..t {
            let slot = [10, 33, 20][h] + r;
            let dst = (h * cap + slot) * d;
            let src = (h * t + r) * d;
            want.k[dst..dst + d].copy_from_slice(&nk[src..src + d]);
            want.v[dst..dst + d].copy_from_slice(&nv[src..src + d]);
            want.p[h * cap + slot] = np[h * t + r];
        }
    }
    c += equal("keys (bits)", &bits(&read(k.clone()).await?), &bits(&want.k))?;
    c += equal("values (bits)", &bits(&read(v.clone()).await?), &bits(&want.v))?;
    c += equal("positions", &read_int::<2, i32>(p).await?, &want.p)?;
    // decode over the compacted, refilled cache sees exactly the twin's cache
    let q = rng.vec(kv_heads * d, 1.0);
    let out =
        kernel("decode_attention", crate::decode_attention(&f2(q.clone(), [kv_heads, d], dev), &k, &v, &lens, None))?;
    let (want_out, _) = cpu::decode_attention(&q, &want.k, &want.v, kv_heads, kv_heads, cap, d, &lens);
    c += close("decode after compaction", &read(out).await?, &want_out, 1e-4, 1e-5)?;
    Ok(c)
}

async fn decode_twin(
    dev: &Device,
    kv_heads: usize,
    group: usize,
    d: usize,
    cap: usize,
    amplitude: f32,
    seed: u64,
) -> Check {
    let heads = kv_heads * group;
    let mut lens_rng = Rng::new(seed ^ 2);
    let lens: Vec<u32> = (0..kv_heads)
        .map(|h| match (h, lens_rng.below(4)) {
            (0, _) | (_, 0) => cap as u32,
            (_, 1) => 0,
            _ => lens_rng.below(cap + 1) as u32,
        })
        .collect();
    let mut rng = Rng::new(seed);
    let q = rng.vec(heads * d, amplitude);
    let k = rng.vec(kv_heads * cap * d, amplitude);
    let v = rng.vec(kv_heads * cap * d, 1.0);
    let base: Vec<f32> = (0..kv_heads * cap).map(|_| rng.unit().abs()).collect();
    let (want_out, want_w) = cpu::decode_attention(&q, &k, &v, heads, kv_heads, cap, d, &lens);
    let (qt, kt, vt) = (f2(q, [heads, d], dev), f3(k, [kv_heads, cap, d], dev), f3(v, [kv_heads, cap, d], dev));
    let mut scores = f2(base.clone(), [kv_heads, cap], dev);
    let out = kernel("decode_attention", crate::decode_attention(&qt, &kt, &vt, &lens, Some(&mut scores)))?;
    let mut c = close("output", &read(out).await?, &want_out, 1e-4, 1e-5)?;
    // a second step adds the same weights again
    let out2 = kernel("decode_attention", crate::decode_attention(&qt, &kt, &vt, &lens, Some(&mut scores)))?;
    c += close("output, step 2", &read(out2).await?, &want_out, 1e-4, 1e-5)?;
    let got_scores = read(scores).await?;
    let want_scores: Vec<f64> = base.iter().zip(&want_w).map(|(&b, &w)| f64::from(b) + 2.0 * w).collect();
    let got_added: Vec<f32> = got_scores.iter().zip(&base).map(|(g, b)| g - b).collect();
    let want_added: Vec<f64> = want_w.iter().map(|w| 2.0 * w).collect();
    c += close("added weights", &got_added, &want_added, 1e-4, 1e-6)?;
    c += close("scores", &got_scores, &want_scores, 1e-5, 1e-6)?;
    Ok(c)
}

async fn linear_hand(dev: &Device) -> Check {
    // [[1, 2], [3, -1]] · [[1, 2, 3], [4, 5, 6]] + [0.5, 0, -1]
    let out = kernel(
        "linear",
        crate::linear(
            f2(vec![1.0, 2.0, 3.0, -1.0], [2, 2], dev),
            f2(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], dev),
            Some(f1(vec![0.5, 0.0, -1.0], dev)),
        ),
    )?;
    let mut c = equal("with bias", &read(out).await?, &[9.5, 12.0, 14.0, -0.5, 1.0, 2.0])?;
    let out =
        kernel("linear", crate::linear(f2(vec![2.0], [1, 1], dev), f2(vec![1.0, 2.0, 3.0, 4.0], [1, 4], dev), None))?;
    c += equal("vec4 path", &read(out).await?, &[2.0, 4.0, 6.0, 8.0])?;
    Ok(c)
}

/// Tolerance `|got − want| ≤ 1e-5·(|b_j| + Σ_k |x_ik·w_kj|) + 1e-7`, as natively.
async fn linear_twin(dev: &Device, n: usize, d_in: usize, d_out: usize, with_bias: bool, seed: u64) -> Check {
    let mut rng = Rng::new(seed);
    let x = rng.vec(n * d_in, 1.0);
    let w = rng.vec(d_in * d_out, 0.5);
    let b = with_bias.then(|| rng.vec(d_out, 2.0));
    let out = kernel(
        "linear",
        crate::linear(f2(x.clone(), [n, d_in], dev), f2(w.clone(), [d_in, d_out], dev), b.clone().map(|b| f1(b, dev))),
    )?;
    if out.dims() != [n, d_out] {
        return Err(format!("shape {:?}, want [{n}, {d_out}]", out.dims()));
    }
    let got = read(out).await?;
    let want = cpu::linear(&x, &w, b.as_deref(), n, d_in, d_out);
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let b_abs = b.as_deref().map(abs);
    let mag = cpu::linear(&abs(&x), &abs(&w), b_abs.as_deref(), n, d_in, d_out);
    if got.len() != want.len() {
        return Err(format!("length {} != {}", got.len(), want.len()));
    }
    for (i, ((&g, &r), &m)) in got.iter().zip(&want).zip(&mag).enumerate() {
        let err = (f64::from(g) - r).abs();
        let bound = 1e-5 * m + 1e-7;
        if !matches!(err.partial_cmp(&bound), Some(Ordering::Less | Ordering::Equal)) {
            return Err(format!("y[{}, {}] = {g}, want {r}, |err| {err:e} > {bound:e}", i / d_out, i % d_out));
        }
    }
    Ok(got.len())
}

/// Which of [`crate::Fusion`]'s stages a [`project_twin`] case turns on.
#[derive(Debug, Clone, Copy)]
struct Fuse {
    bias: bool,
    norm: bool,
    residual: bool,
    swiglu: bool,
}

async fn project_hand(dev: &Device) -> Check {
    // x = [1, 1, 1, 1]: mean(x²) = 1, so with ε = 0 the norm is x·g = [1, 2, 3, 4]; W = 1s.
    let g = f1(vec![1.0, 2.0, 3.0, 4.0], dev);
    let r = f2(vec![1.0], [1, 1], dev);
    let fusion = crate::Fusion { norm: Some((&g, 0.0)), residual: Some(&r), swiglu: false };
    let out = kernel(
        "project",
        crate::project(
            &f2(vec![1.0; 4], [1, 4], dev),
            &f2(vec![1.0; 4], [4, 1], dev),
            Some(&f1(vec![0.5], dev)),
            fusion,
        ),
    )?;
    let mut c = equal("norm, bias, residual", &read(out).await?, &[11.5])?;
    // silu(2)·3 = 6 / (1 + e⁻²)
    let fusion = crate::Fusion { swiglu: true, ..Default::default() };
    let out =
        kernel("project", crate::project(&f2(vec![1.0], [1, 1], dev), &f2(vec![2.0, 3.0], [1, 2], dev), None, fusion))?;
    c += close("swiglu", &read(out).await?, &[6.0 / (1.0 + (-2.0f64).exp())], 1e-6, 0.0)?;
    Ok(c)
}

/// Tolerance: `1e-5` of each column's magnitude `Σ_k |x̂_k·w_kj| + |b_j|` (`x̂` the normed
/// input), through SwiGLU's derivative (`|silu'| < 1.1`), plus `1e-5·|y|` for `exp` and the
/// residual's rounding.
async fn project_twin(dev: &Device, d_in: usize, d_out: usize, fuse: Fuse, seed: u64) -> Check {
    let mut rng = Rng::new(seed);
    let cols = if fuse.swiglu { 2 * d_out } else { d_out };
    let x = rng.vec(d_in, 1.5);
    let w = rng.vec(d_in * cols, 0.1);
    let b = fuse.bias.then(|| rng.vec(cols, 0.5));
    let g: Option<Vec<f32>> = fuse.norm.then(|| (0..d_in).map(|_| 1.0 + 0.5 * rng.unit()).collect());
    let r = fuse.residual.then(|| rng.vec(d_out, 3.0));
    let eps = 1e-5f32;
    let (gt, rt) = (g.clone().map(|g| f1(g, dev)), r.clone().map(|r| f2(r, [1, d_out], dev)));
    let fusion = crate::Fusion { norm: gt.as_ref().map(|g| (g, eps)), residual: rt.as_ref(), swiglu: fuse.swiglu };
    let out = kernel(
        "project",
        crate::project(
            &f2(x.clone(), [1, d_in], dev),
            &f2(w.clone(), [d_in, cols], dev),
            b.clone().map(|b| f1(b, dev)).as_ref(),
            fusion,
        ),
    )?;
    if out.dims() != [1, d_out] {
        return Err(format!("shape {:?}, want [1, {d_out}]", out.dims()));
    }
    let got = read(out).await?;
    let w_abs: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    let inputs = ProjectInputs { x: &x, w: &w, w_abs: &w_abs, b: b.as_deref(), g: g.as_deref(), eps, r: r.as_deref() };
    project_check(&got, &inputs, fuse.swiglu, d_out)
}

/// What a fused projection case ran: `w` is `[d_in, cols]`, `w_abs` the magnitude of each of
/// its entries' terms as the kernel sums them (`|w|` for an f32 weight).
struct ProjectInputs<'a> {
    x: &'a [f32],
    w: &'a [f32],
    w_abs: &'a [f32],
    b: Option<&'a [f32]>,
    g: Option<&'a [f32]>,
    eps: f32,
    r: Option<&'a [f32]>,
}

/// A fused projection's output `got` against [`cpu::project`], to [`project_twin`]'s tolerance.
fn project_check(got: &[f32], p: &ProjectInputs<'_>, swiglu: bool, d_out: usize) -> Check {
    let cols = if swiglu { 2 * d_out } else { d_out };
    let norm = p.g.map(|g| (g, p.eps));
    let want = cpu::project(p.x, p.w, p.b, norm, p.r, swiglu, d_out);
    // the pre-activation columns, and their magnitudes
    let z = cpu::project(p.x, p.w, p.b, norm, None, false, cols);
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    let (b_abs, g_abs) = (p.b.map(abs), p.g.map(abs));
    let mag =
        cpu::project(&abs(p.x), p.w_abs, b_abs.as_deref(), g_abs.as_deref().map(|g| (g, p.eps)), None, false, cols);
    if got.len() != want.len() {
        return Err(format!("length {} != {}", got.len(), want.len()));
    }
    for (j, (&gv, &wv)) in got.iter().zip(&want).enumerate() {
        let spread = if swiglu {
            let silu = z[j] / (1.0 + (-z[j]).exp());
            1.1 * z[j + d_out].abs() * mag[j] + silu.abs() * mag[j + d_out]
        } else {
            mag[j]
        };
        let res = p.r.map_or(0.0, |r| f64::from(r[j].abs()));
        let bound = 1e-5 * (spread + wv.abs() + res) + 1e-7;
        let err = (f64::from(gv) - wv).abs();
        if !matches!(err.partial_cmp(&bound), Some(Ordering::Less | Ordering::Equal)) {
            return Err(format!("y[{j}] = {gv}, want {wv}, |err| {err:e} > {bound:e}"));
        }
    }
    Ok(got.len())
}

/// `rows · cols / 32` random blocks of `format` in the file's layout: f16 headers of random
/// sign, exponent (subnormals included; below 2 in magnitude) and mantissa, random values.
fn random_blocks(rng: &mut Rng, format: QuantFormat, rows: usize, cols: usize) -> Vec<u8> {
    let half = |rng: &mut Rng| {
        let r = rng.next_u64();
        (((r & 1) << 15) | (((r >> 1) % 16) << 10) | ((r >> 8) & 0x3ff)) as u16
    };
    let mut out = Vec::with_capacity(rows * cols / format.values() * format.block_bytes());
    if matches!(format, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K) {
        // random bytes, then finite f16 scales (d and dmin at the front; Q6_K's d at the end)
        for _ in 0..rows * cols / 256 {
            let mut block: Vec<u8> = (0..format.block_bytes()).map(|_| rng.next_u64() as u8).collect();
            let at: &[usize] = if format == QuantFormat::Q6_K { &[208] } else { &[0, 2] };
            for &a in at {
                // below 2⁻⁴ in magnitude: a 6-bit scale and a 6-bit value keep the values small
                let h = half(rng) & 0x83ff | ((u16::from(rng.next_u64() as u8) % 12) << 10);
                block[a..a + 2].copy_from_slice(&h.to_le_bytes());
            }
            out.extend(block);
        }
        return out;
    }
    if format == QuantFormat::F16 {
        out.extend((0..rows * cols).flat_map(|_| half(rng).to_le_bytes()));
        return out;
    }
    if format == QuantFormat::BF16 {
        // random sign and 7-bit mantissa, exponent 2⁻¹⁵..2⁰ (magnitudes below 2)
        let bf = |r: u64| ((r & 1) << 15 | (112 + (r >> 1) % 16) << 7 | (r >> 8) & 0x7f) as u16;
        out.extend((0..rows * cols).flat_map(|_| bf(rng.next_u64()).to_le_bytes()));
        return out;
    }
    for _ in 0..rows * cols / 32 {
        out.extend(half(rng).to_le_bytes());
        if matches!(format, QuantFormat::Q4_1 | QuantFormat::Q5_1) {
            out.extend(half(rng).to_le_bytes());
        }
        let n = match format {
            QuantFormat::Q8_0 => 32,
            QuantFormat::Q5_0 | QuantFormat::Q5_1 => 20,
            _ => 16,
        };
        out.extend((0..n).map(|_| rng.next_u64() as u8));
    }
    out
}

/// The magnitude of each value's terms as `qproject.wgsl` sums them (`|d|·|q|` for Q8_0,
/// `|d|·q + 8·|d|` for Q4_0, `|d|·q + |m|` for Q4_1, the value's for F16/BF16), `[rows, cols]`.
fn block_magnitudes(format: QuantFormat, bytes: &[u8]) -> Vec<f64> {
    if matches!(format, QuantFormat::F16 | QuantFormat::BF16) {
        return cpu::dequantize(format, 1, bytes.len() / 2, bytes).iter().map(|v| v.abs()).collect();
    }
    if matches!(format, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K) {
        return cpu::k_terms(format, bytes).into_iter().map(|(a, m)| a.abs() + m.abs()).collect();
    }
    if matches!(format, QuantFormat::Q5_0 | QuantFormat::Q5_1) {
        // |d|·q + |m| with m = −16·d for Q5_0: the magnitudes of d·(value + 16) and of m
        let n = bytes.len() / format.block_bytes() * 32;
        let values = cpu::dequantize(format, 1, n, bytes);
        return bytes
            .chunks_exact(format.block_bytes())
            .zip(values.chunks_exact(32))
            .flat_map(|(block, v)| {
                let d = cpu::f16_to_f64(u16::from_le_bytes([block[0], block[1]]));
                let m = if format == QuantFormat::Q5_1 {
                    cpu::f16_to_f64(u16::from_le_bytes([block[2], block[3]]))
                } else {
                    -16.0 * d
                };
                v.iter().map(move |x| (x - m).abs() + m.abs()).collect::<Vec<_>>()
            })
            .collect();
    }
    let mut out = Vec::new();
    for block in bytes.chunks_exact(format.block_bytes()) {
        let d = cpu::f16_to_f64(u16::from_le_bytes([block[0], block[1]])).abs();
        match format {
            QuantFormat::Q8_0 => out.extend(block[2..].iter().map(|&q| d * f64::from((q as i8).unsigned_abs()))),
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                let (m, qs) = match format {
                    QuantFormat::Q4_1 => (cpu::f16_to_f64(u16::from_le_bytes([block[2], block[3]])).abs(), &block[4..]),
                    _ => (8.0 * d, &block[2..]),
                };
                out.extend(qs.iter().map(|&q| d * f64::from(q & 15) + m));
                out.extend(qs.iter().map(|&q| d * f64::from(q >> 4) + m));
            }
            _ => unreachable!("returned above"),
        }
    }
    out
}

fn upload(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8], dev: &Device) -> Result<QuantMatrix, String> {
    kernel("upload", QuantMatrix::upload(format, rows, cols, bytes, dev))
}

async fn dequant_hand(dev: &Device) -> Check {
    // Q8_0, two blocks: d = 0.5 with q = −16..=15, then d = −2⁻²⁴ (the smallest subnormal)
    // with q = 1..=32
    let mut bytes = vec![0x00, 0x38];
    bytes.extend((-16i8..16).map(|q| q as u8));
    bytes.extend([0x01, 0x80]);
    bytes.extend(1u8..=32);
    let mut want: Vec<f32> = (-16..16).map(|q| q as f32 * 0.5).collect();
    want.extend((1..=32).map(|q| -(q as f32) * 2f32.powi(-24)));
    let m = upload(QuantFormat::Q8_0, 1, 64, &bytes, dev)?;
    let mut c = equal("Q8_0", &bits(&read(kernel("dequantize", dequantize(&m, None, false))?).await?), &bits(&want))?;
    // Q4_0 and Q4_1: byte j holds j in its low nibble and 15 − j in its high one
    let qs: Vec<u8> = (0u8..16).map(|j| j | ((15 - j) << 4)).collect();
    let nibbles: Vec<f32> = (0..16).chain((0..16).rev()).map(|q| q as f32).collect();
    // d = 1: x = q − 8
    let m = upload(QuantFormat::Q4_0, 1, 32, &[&[0x00, 0x3c][..], &qs].concat(), dev)?;
    let want: Vec<f32> = nibbles.iter().map(|q| q - 8.0).collect();
    c += equal("Q4_0", &read(kernel("dequantize", dequantize(&m, None, false))?).await?, &want)?;
    // d = 0.25, m = −1: x = q/4 − 1
    let m = upload(QuantFormat::Q4_1, 1, 32, &[&[0x00, 0x34, 0x00, 0xbc][..], &qs].concat(), dev)?;
    let want: Vec<f32> = nibbles.iter().map(|q| q * 0.25 - 1.0).collect();
    c += equal("Q4_1", &read(kernel("dequantize", dequantize(&m, None, false))?).await?, &want)?;
    // Q5_0, d = 1, fifth bits set for values 16..31 only: x = q − 16, so j − 16 below 16 and
    // (15 − (j − 16)) + 16 − 16 above; Q5_1 with d = 0.5, m = 1 and every fifth bit set
    let m = upload(QuantFormat::Q5_0, 1, 32, &[&[0x00, 0x3c, 0x00, 0x00, 0xff, 0xff][..], &qs].concat(), dev)?;
    let want: Vec<f32> = (0..32).map(|j| if j < 16 { j as f32 - 16.0 } else { 31.0 - j as f32 }).collect();
    c += equal("Q5_0", &read(kernel("dequantize", dequantize(&m, None, false))?).await?, &want)?;
    let m =
        upload(QuantFormat::Q5_1, 1, 32, &[&[0x00, 0x38, 0x00, 0x3c, 0xff, 0xff, 0xff, 0xff][..], &qs].concat(), dev)?;
    let want: Vec<f32> = nibbles.iter().map(|q| 0.5 * (q + 16.0) + 1.0).collect();
    c += equal("Q5_1", &read(kernel("dequantize", dequantize(&m, None, false))?).await?, &want)?;
    Ok(c)
}

/// One Q4_K super-block whose sub-block j has scale sc_j = j + 1 and minimum m_j = j for
/// j < 4, sc_j = 20 + j and m_j = 40 + j above (the high two bits packed into bytes 0..7),
/// d = 1, dmin = 0.5, every nibble byte 0x21: the values are sc − m/2 (low nibbles, 1) and
/// 2·sc − m/2 (high, 2). One Q6_K super-block with d = 0.5, scales j − 8, low-nibble bytes
/// 0x31 and high-bit bytes 0xE4 (part p of each byte holds p): q = 1 − 32, 17 − 32, 3, 19 for
/// parts 0..3, values d·sc·q.
async fn dequant_hand_k(dev: &Device) -> Check {
    let (sc, m) = (|j: usize| if j < 4 { j + 1 } else { 20 + j }, |j: usize| if j < 4 { j } else { 40 + j });
    let mut scales = [0u8; 12];
    for j in 0..4 {
        scales[j] = (sc(j) | (sc(j + 4) >> 4) << 6) as u8;
        scales[j + 4] = (m(j) | (m(j + 4) >> 4) << 6) as u8;
        scales[j + 8] = ((sc(j + 4) & 15) | (m(j + 4) & 15) << 4) as u8;
    }
    let bytes = [&[0x00, 0x3c, 0x00, 0x38][..], &scales, &[0x21; 128]].concat();
    let want: Vec<f32> = (0..256)
        .map(|v| {
            let j = v / 32;
            let q = if j % 2 == 0 { 1.0 } else { 2.0 };
            sc(j) as f32 * q - 0.5 * m(j) as f32
        })
        .collect();
    let mat = upload(QuantFormat::Q4_K, 1, 256, &bytes, dev)?;
    let mut c = equal("Q4_K", &read(kernel("dequantize", dequantize(&mat, None, false))?).await?, &want)?;
    let scales: Vec<u8> = (0..16).map(|j| (j as i8 - 8) as u8).collect();
    let bytes = [&[0x31; 128][..], &[0xE4; 64], &scales, &[0x00, 0x38]].concat();
    let q = [-31.0f32, -15.0, 3.0, 19.0];
    let want: Vec<f32> = (0..256)
        .map(|v| {
            let (n, p, l) = (v / 128, (v % 128) / 32, v % 32);
            0.5 * ((8 * n + l / 16 + 2 * p) as f32 - 8.0) * q[p]
        })
        .collect();
    let mat = upload(QuantFormat::Q6_K, 1, 256, &bytes, dev)?;
    c += equal("Q6_K", &read(kernel("dequantize", dequantize(&mat, None, false))?).await?, &want)?;
    Ok(c)
}

/// Every row, the transpose and a gather with repeats, against [`cpu::dequantize`]: each value
/// is `d·q + m` with one rounding to f32 at most, so the tolerance is half an f32 ulp.
async fn dequant_twin(dev: &Device, format: QuantFormat, rows: usize, cols: usize, seed: u64) -> Check {
    let mut rng = Rng::new(seed);
    let bytes = random_blocks(&mut rng, format, rows, cols);
    let want = cpu::dequantize(format, rows, cols, &bytes);
    let m = upload(format, rows, cols, &bytes, dev)?;
    let rtol = f64::from(f32::EPSILON) / 2.0;
    let all = kernel("dequantize", dequantize(&m, None, false))?;
    if all.dims() != [rows, cols] {
        return Err(format!("shape {:?}, want [{rows}, {cols}]", all.dims()));
    }
    let mut c = close("every row", &read(all).await?, &want, rtol, 0.0)?;
    let t = kernel("dequantize", dequantize(&m, None, true))?;
    if t.dims() != [cols, rows] {
        return Err(format!("transposed shape {:?}, want [{cols}, {rows}]", t.dims()));
    }
    let want_t: Vec<f64> = (0..cols * rows).map(|e| want[(e % rows) * cols + e / rows]).collect();
    c += close("transposed", &read(t).await?, &want_t, rtol, 0.0)?;
    let ids = [rows as u32 - 1, 0, rows as u32 - 1, (rows / 2) as u32];
    let got = read(kernel("dequantize", dequantize(&m, Some(&ids), false))?).await?;
    let want_ids: Vec<f64> =
        ids.iter().flat_map(|&r| want[r as usize * cols..(r as usize + 1) * cols].to_vec()).collect();
    c += close("rows by id", &got, &want_ids, rtol, 0.0)?;
    Ok(c)
}

async fn qproject_hand(dev: &Device) -> Check {
    // Q8_0 d = 0.5, q = −16..=15, x = 1s: Σ = −8, plus bias 0.25 and residual 1
    let mut bytes = vec![0x00, 0x38];
    bytes.extend((-16i8..16).map(|q| q as u8));
    let m = upload(QuantFormat::Q8_0, 1, 32, &bytes, dev)?;
    let r = f2(vec![1.0], [1, 1], dev);
    let fusion = crate::Fusion { residual: Some(&r), ..Default::default() };
    let out = kernel("qproject", qproject(&f2(vec![1.0; 32], [1, 32], dev), &m, Some(&f1(vec![0.25], dev)), fusion))?;
    let mut c = equal("bias, residual", &read(out).await?, &[-6.75])?;
    // SwiGLU over Q4_1 rows, x = 1/16: the gate row (d = 0.25, m = −1, nibbles j and 15 − j)
    // sums to (0.25·240 − 32)/16 = 1.75, the up row (d = 0.5, m = 0, every nibble 1) to 1
    let mut bytes = vec![0x00, 0x34, 0x00, 0xbc];
    bytes.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
    bytes.extend([0x00, 0x38, 0x00, 0x00]);
    bytes.extend([0x11; 16]);
    let m = upload(QuantFormat::Q4_1, 2, 32, &bytes, dev)?;
    let fusion = crate::Fusion { swiglu: true, ..Default::default() };
    let out = kernel("qproject", qproject(&f2(vec![1.0 / 16.0; 32], [1, 32], dev), &m, None, fusion))?;
    c += close("swiglu", &read(out).await?, &[1.75 / (1.0 + (-1.75f64).exp())], 1e-6, 0.0)?;
    Ok(c)
}

/// [`project_twin`] with the weight in random blocks: the reference is [`cpu::project`] over
/// the [`cpu::dequantize`]d matrix, the tolerance [`project_twin`]'s over the magnitudes of
/// the terms the kernel sums ([`block_magnitudes`]).
async fn qproject_twin(
    dev: &Device,
    format: QuantFormat,
    d_in: usize,
    d_out: usize,
    fuse: Fuse,
    seed: u64,
    per_invocation: u32,
) -> Check {
    let mut rng = Rng::new(seed);
    let rows = if fuse.swiglu { 2 * d_out } else { d_out };
    let bytes = random_blocks(&mut rng, format, rows, d_in);
    let x = rng.vec(d_in, 1.5);
    let b = fuse.bias.then(|| rng.vec(rows, 0.5));
    let g: Option<Vec<f32>> = fuse.norm.then(|| (0..d_in).map(|_| 1.0 + 0.5 * rng.unit()).collect());
    let r = fuse.residual.then(|| rng.vec(d_out, 3.0));
    let eps = 1e-5f32;
    let mut m = upload(format, rows, d_in, &bytes, dev)?;
    kernel("rows per invocation", m.set_rows_per_invocation(per_invocation))?;
    let (gt, rt) = (g.clone().map(|g| f1(g, dev)), r.clone().map(|r| f2(r, [1, d_out], dev)));
    let fusion = crate::Fusion { norm: gt.as_ref().map(|g| (g, eps)), residual: rt.as_ref(), swiglu: fuse.swiglu };
    let out = kernel(
        "qproject",
        qproject(&f2(x.clone(), [1, d_in], dev), &m, b.clone().map(|b| f1(b, dev)).as_ref(), fusion),
    )?;
    if out.dims() != [1, d_out] {
        return Err(format!("shape {:?}, want [1, {d_out}]", out.dims()));
    }
    let got = read(out).await?;
    // [rows, d_in] as the [d_in, rows] weight cpu::project takes
    let transpose =
        |v: &[f64]| -> Vec<f32> { (0..d_in * rows).map(|e| v[(e % rows) * d_in + e / rows] as f32).collect() };
    let w = transpose(&cpu::dequantize(format, rows, d_in, &bytes));
    let w_abs = transpose(&block_magnitudes(format, &bytes));
    let inputs = ProjectInputs { x: &x, w: &w, w_abs: &w_abs, b: b.as_deref(), g: g.as_deref(), eps, r: r.as_deref() };
    project_check(&got, &inputs, fuse.swiglu, d_out)
}

/// A q|k|v-like matrix whose parts keep different formats ([`QuantMatrix::stack`]): one launch
/// per part into the shared output, against [`cpu::project`] over the parts' rows stacked,
/// and the whole matrix dequantized as a matmul's `[d_in, rows]` weight.
async fn qproject_stacked(dev: &Device, seed: u64, per_invocation: u32) -> Check {
    let mut rng = Rng::new(seed);
    let d_in = 512;
    let parts = [(QuantFormat::Q4_K, 40usize), (QuantFormat::Q6_K, 8), (QuantFormat::Q8_0, 8)];
    let rows: usize = parts.iter().map(|p| p.1).sum();
    let (mut matrices, mut values, mut magnitudes) = (Vec::new(), Vec::new(), Vec::new());
    for &(format, r) in &parts {
        let bytes = random_blocks(&mut rng, format, r, d_in);
        matrices.push(upload(format, r, d_in, &bytes, dev)?);
        values.extend(cpu::dequantize(format, r, d_in, &bytes));
        magnitudes.extend(block_magnitudes(format, &bytes));
    }
    let mut m = kernel("stack", QuantMatrix::stack(matrices))?;
    kernel("rows per invocation", m.set_rows_per_invocation(per_invocation))?;
    if m.formats() != parts.iter().map(|p| p.0).collect::<Vec<_>>() {
        return Err(format!("formats {:?}", m.formats()));
    }
    let x = rng.vec(d_in, 1.5);
    let b = rng.vec(rows, 0.5);
    let g: Vec<f32> = (0..d_in).map(|_| 1.0 + 0.5 * rng.unit()).collect();
    let r = rng.vec(rows, 3.0);
    let eps = 1e-5f32;
    let (gt, rt) = (f1(g.clone(), dev), f2(r.clone(), [1, rows], dev));
    let fusion = crate::Fusion { norm: Some((&gt, eps)), residual: Some(&rt), swiglu: false };
    let out = kernel("qproject", qproject(&f2(x.clone(), [1, d_in], dev), &m, Some(&f1(b.clone(), dev)), fusion))?;
    if out.dims() != [1, rows] {
        return Err(format!("shape {:?}, want [1, {rows}]", out.dims()));
    }
    let got = read(out).await?;
    let transpose =
        |v: &[f64]| -> Vec<f32> { (0..d_in * rows).map(|e| v[(e % rows) * d_in + e / rows] as f32).collect() };
    let (w, w_abs) = (transpose(&values), transpose(&magnitudes));
    let inputs = ProjectInputs { x: &x, w: &w, w_abs: &w_abs, b: Some(&b), g: Some(&g), eps, r: Some(&r) };
    let mut c = project_check(&got, &inputs, false, rows)?;
    let t = kernel("dequantize", dequantize(&m, None, true))?;
    if t.dims() != [d_in, rows] {
        return Err(format!("transposed shape {:?}, want [{d_in}, {rows}]", t.dims()));
    }
    let want_t: Vec<f64> = (0..d_in * rows).map(|e| values[(e % rows) * d_in + e / rows]).collect();
    c += close("transposed", &read(t).await?, &want_t, f64::from(f32::EPSILON) / 2.0, 0.0)?;
    // SwiGLU reads gate and up rows together: it needs one format
    let fusion = crate::Fusion { swiglu: true, ..Default::default() };
    if qproject(&f2(x, [1, d_in], dev), &m, None, fusion).is_ok() {
        return Err("SwiGLU over a stacked matrix was accepted".into());
    }
    Ok(c)
}

async fn rope_hand(dev: &Device) -> Check {
    // a quarter turn (cos 0, sin 1) of q = (1, 0) and k = (0, 1)
    let row = kernel(
        "rope_split",
        crate::rope_split(
            &f2(vec![1.0, 0.0, 0.0, 1.0, 5.0, 6.0], [1, 6], dev),
            &f1(vec![0.0], dev),
            &f1(vec![1.0], dev),
            1,
            1,
            2,
        ),
    )?;
    let mut c = equal("q", &read(row.q).await?, &[0.0, 1.0])?;
    c += equal("q before RoPE", &read(row.q_raw).await?, &[1.0, 0.0])?;
    c += equal("k", &read(row.k).await?, &[-1.0, 0.0])?;
    c += equal("v", &read(row.v).await?, &[5.0, 6.0])?;
    Ok(c)
}

async fn rope_twin(dev: &Device, heads: usize, kv_heads: usize, d: usize, seed: u64) -> Check {
    let mut rng = Rng::new(seed);
    let width = (heads + 2 * kv_heads) * d;
    let qkv = rng.vec(width, 2.0);
    let angles: Vec<f32> = (0..d / 2).map(|_| rng.unit() * 40.0).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let want = cpu::rope_split(&qkv, &cos, &sin, heads, kv_heads, d);
    let row = kernel(
        "rope_split",
        crate::rope_split(&f2(qkv, [1, width], dev), &f1(cos, dev), &f1(sin, dev), heads, kv_heads, d),
    )?;
    let mut c = close("q", &read(row.q).await?, &want.q, 1e-6, 1e-6)?;
    c += close("q before RoPE", &read(row.q_raw).await?, &want.q_raw, 0.0, 0.0)?;
    c += close("k", &read(row.k).await?, &want.k, 1e-6, 1e-6)?;
    c += close("v", &read(row.v).await?, &want.v, 0.0, 0.0)?;
    Ok(c)
}

async fn rms_norm_twin(dev: &Device, rows: usize, width: usize, seed: u64) -> Check {
    let mut rng = Rng::new(seed);
    let x = rng.vec(rows * width, 4.0);
    let g: Vec<f32> = (0..width).map(|_| 1.0 + 0.5 * rng.unit()).collect();
    let want = cpu::rms_norm(&x, &g, 1e-5);
    let out = kernel("rms_norm", crate::rms_norm(&f2(x, [rows, width], dev), &f1(g, dev), 1e-5))?;
    close("y", &read(out).await?, &want, 1e-5, 1e-6)
}

/// [`crate::write_rows`] against the same writes done on the host: one row per head at a
/// chosen slot (overwrites and first free slots), then a two-row append at ragged lengths.
async fn write_rows_twin(dev: &Device) -> Check {
    let (kv_heads, cap, d) = (3usize, 40usize, 64usize);
    let host = Host::random(kv_heads, cap, d, 21);
    let (mut k, mut v, _) = host.upload(dev);
    let (mut want_k, mut want_v) = (host.k.clone(), host.v.clone());
    let mut rng = Rng::new(22);
    let mut c = 0;
    for (t, starts) in [(1usize, vec![0u32, 17, 39]), (2, vec![5, 30, 38])] {
        let nk = rng.vec(kv_heads * t * d, 1.0);
        let nv = rng.vec(kv_heads * t * d, 1.0);
        kernel(
            "write_rows",
            crate::write_rows(
                &mut k,
                &mut v,
                &f3(nk.clone(), [kv_heads, t, d], dev),
                &f3(nv.clone(), [kv_heads, t, d], dev),
                &starts,
            ),
        )?;
        for (h, &start) in starts.iter().enumerate() {
            for r in 0..t {
                let dst = (h * cap + start as usize + r) * d;
                let src = (h * t + r) * d;
                want_k[dst..dst + d].copy_from_slice(&nk[src..src + d]);
                want_v[dst..dst + d].copy_from_slice(&nv[src..src + d]);
            }
        }
        c += equal("keys (bits)", &bits(&read(k.clone()).await?), &bits(&want_k))?;
        c += equal("values (bits)", &bits(&read(v.clone()).await?), &bits(&want_v))?;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::{close, equal};

    #[test]
    fn checks_reject_what_they_should() {
        assert_eq!(close("x", &[1.0, 2.0], &[1.0, 2.0], 1e-6, 0.0), Ok(2));
        assert!(close("x", &[1.0, 2.001], &[1.0, 2.0], 1e-4, 0.0).is_err());
        assert!(close("x", &[f32::NAN], &[1.0], 1.0, 1.0).is_err());
        assert!(close("x", &[1.0], &[1.0, 2.0], 1.0, 1.0).is_err());
        assert_eq!(equal("x", &[1u32, 2], &[1, 2]), Ok(2));
        assert_eq!(equal("x", &[1u32, 3], &[1, 2]), Err("x[1]: got 3, want 2".into()));
    }
}
