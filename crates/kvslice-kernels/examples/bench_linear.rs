//! Times the skinny projection kernel (or, with `--gemm`, the tiled prefill kernel) against
//! Burn's matmul (plus a broadcast bias add, as a model would write it) on the projections of
//! a SmolLM2-135M decode step.
//!
//! ```text
//! cargo run -p kvslice-kernels --example bench_linear -- [--rows 1,4] [--reps 5] [--bias] [--no-head] [--gemm]
//! cargo run -p kvslice-kernels --example bench_linear -- --quant q4_1|q4_0|q8_0|f16 [--per-invocation 1|4|8] [--reps 5]
//! ```
//!
//! `--shape D_IN,D_OUT` times that one shape instead of the model's. `--chain N` queues N calls
//! back to back before each sync and reports the time per call: what a call costs inside a
//! decode step, where nothing waits between launches. `--flush-every N` hands the queue to the
//! device every N launches ([`kvslice_kernels::set_flush_interval`]).
//!
//! With `--quant`, the second column times [`qproject`] over weights in that block format
//! (seeded random blocks) for one row, beside the f32 skinny kernel.
//!
//! Prints one Markdown table: milliseconds per call (median of `reps`, after one warm-up, each
//! timed call followed by a device sync), for `x: [n, d_in]`, `W: [d_in, d_out]`, and the ratio
//! matmul / kernel. The last line of each `n` adds up a whole decode step's projections (30
//! layers plus the output head, unless `--no-head`).

use std::time::Instant;

use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use kvslice_kernels::{Fusion, QuantFormat, QuantMatrix, gemm, linear, qproject};

/// (name, d_in, d_out, uses per layer); the head is used once per step.
const SHAPES: [(&str, usize, usize, usize); 5] = [
    ("q, o: 576→576", 576, 576, 2),
    ("k, v: 576→192", 576, 192, 2),
    ("gate, up: 576→1536", 576, 1536, 2),
    ("down: 1536→576", 1536, 576, 1),
    ("head: 576→49152", 576, 49152, 0),
];
const LAYERS: usize = 30;

/// `--chain N`: time N calls queued back to back before one sync (per call).
static CHAIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn values(len: usize, seed: &mut u64) -> Vec<f32> {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Seeded random blocks of `format` for a `[rows, cols]` weight, scales in f16 near 1/64.
fn blocks(format: QuantFormat, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let nb = rows * cols / format.values();
    let mut out = Vec::with_capacity(nb * format.block_bytes());
    let scale = burn::tensor::f16::from_f32(1.0 / 64.0).to_le_bytes();
    for _ in 0..nb {
        let start = out.len();
        for _ in 0..format.block_bytes() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            out.push((*seed >> 32) as u8);
        }
        match format {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 => out[start..start + 2].copy_from_slice(&scale),
            QuantFormat::Q4_1 => {
                out[start..start + 2].copy_from_slice(&scale);
                out[start + 2..start + 4].copy_from_slice(&scale);
            }
            QuantFormat::F16 => {
                for v in out[start..].chunks_mut(2) {
                    v.copy_from_slice(&scale);
                }
            }
            other => panic!("--quant takes q8_0, q4_0, q4_1 or f16, not {other:?}"),
        }
    }
    out
}

fn median_ms(dev: &Device, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    dev.sync().expect("device sync");
    if let Some(chain) = CHAIN.get().copied().filter(|&c| c > 1) {
        // `chain` calls queued back to back, one sync: the cost of a call inside a decode step
        let mut times: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..chain {
                    f();
                }
                dev.sync().expect("device sync");
                t.elapsed().as_secs_f64() * 1e3 / chain as f64
            })
            .collect();
        times.sort_by(f64::total_cmp);
        return times[times.len() / 2];
    }
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            dev.sync().expect("device sync");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let mut rows = vec![1usize, 4];
    let mut reps = 5usize;
    let mut with_bias = false;
    let mut head = true;
    let mut tiled = false;
    let mut quant = None;
    let mut per_invocation = 1;
    let mut shapes: Vec<(String, usize, usize, usize)> =
        SHAPES.iter().map(|&(name, d_in, d_out, uses)| (name.to_string(), d_in, d_out, uses)).collect();
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--rows" => {
                rows = args[i + 1].split(',').map(|s| s.parse().expect("row count")).collect();
                i += 1;
            }
            "--reps" => {
                reps = args[i + 1].parse().expect("reps");
                i += 1;
            }
            "--bias" => with_bias = true,
            "--flush-every" => {
                kvslice_kernels::set_flush_interval(args[i + 1].parse().expect("launches per flush"));
                i += 1;
            }
            "--shape" => {
                // one shape instead of the model's: D_IN,D_OUT (counted once per layer)
                let dims: Vec<usize> = args[i + 1].split(',').map(|s| s.parse().expect("a dimension")).collect();
                let [d_in, d_out] = dims[..] else { panic!("--shape takes D_IN,D_OUT") };
                shapes = vec![(format!("{d_in}→{d_out}"), d_in, d_out, 1)];
                i += 1;
            }
            "--chain" => {
                CHAIN.set(args[i + 1].parse().expect("calls per sync")).expect("one --chain");
                i += 1;
            }
            "--no-head" => head = false,
            "--gemm" => tiled = true,
            "--per-invocation" => {
                per_invocation = args[i + 1].parse().expect("rows per invocation");
                i += 1;
            }
            "--quant" => {
                quant = Some(match args[i + 1].as_str() {
                    "q8_0" => QuantFormat::Q8_0,
                    "q4_0" => QuantFormat::Q4_0,
                    "q4_1" => QuantFormat::Q4_1,
                    "f16" => QuantFormat::F16,
                    other => panic!("unknown format {other}"),
                });
                rows = vec![1];
                i += 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 1;
    }
    let dev = Device::wgpu(DeviceKind::DefaultDevice);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    println!("bias: {with_bias}, reps: {reps}\n");
    let kernel_name = match (quant, tiled) {
        (Some(_), _) => "qproject",
        (None, true) => "gemm",
        (None, false) => "linear",
    };
    println!("| shape | n | matmul ms | {kernel_name} ms | matmul / {kernel_name} |");
    println!("|---|---:|---:|---:|---:|");
    for &n in &rows {
        let (mut step_matmul, mut step_linear) = (0.0, 0.0);
        for (name, d_in, d_out, per_layer) in shapes.iter().cloned() {
            if per_layer == 0 && !head {
                continue;
            }
            let x = Tensor::<2>::from_data(TensorData::new(values(n * d_in, &mut seed), [n, d_in]), &dev);
            let w = Tensor::<2>::from_data(TensorData::new(values(d_in * d_out, &mut seed), [d_in, d_out]), &dev);
            let b = with_bias.then(|| Tensor::<1>::from_data(TensorData::new(values(d_out, &mut seed), [d_out]), &dev));
            if let Some(format) = quant {
                let mut q = QuantMatrix::upload(format, d_out, d_in, &blocks(format, d_out, d_in, &mut seed), &dev)
                    .expect("valid blocks");
                q.set_rows_per_invocation(per_invocation).expect("a supported row count");
                let f32_ms = median_ms(&dev, reps, || drop(linear(x.clone(), w.clone(), None).expect("valid shapes")));
                let q_ms = median_ms(&dev, reps, || {
                    drop(qproject(&x, &q, None, Fusion::default()).expect("valid shapes"));
                });
                let uses = if per_layer == 0 { 1 } else { per_layer * LAYERS };
                step_matmul += f32_ms * uses as f64;
                step_linear += q_ms * uses as f64;
                println!("| {name} | {n} | {f32_ms:.3} | {q_ms:.3} | {:.2} |", f32_ms / q_ms);
                continue;
            }
            let matmul = median_ms(&dev, reps, || {
                let y = x.clone().matmul(w.clone());
                let y = match &b {
                    Some(b) => y + b.clone().unsqueeze::<2>(),
                    None => y,
                };
                drop(y);
            });
            let kernel = median_ms(&dev, reps, || {
                let y =
                    if tiled { gemm(x.clone(), w.clone(), b.clone()) } else { linear(x.clone(), w.clone(), b.clone()) };
                drop(y.expect("valid shapes"));
            });
            let uses = if per_layer == 0 { 1 } else { per_layer * LAYERS };
            step_matmul += matmul * uses as f64;
            step_linear += kernel * uses as f64;
            println!("| {name} | {n} | {matmul:.3} | {kernel:.3} | {:.1} |", matmul / kernel);
        }
        println!("| decode step | {n} | {step_matmul:.1} | {step_linear:.1} | {:.1} |", step_matmul / step_linear);
    }
}
