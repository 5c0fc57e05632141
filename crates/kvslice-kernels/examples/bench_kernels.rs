//! Times each kernel against n beside the naive route built from Burn tensor ops (materialised
//! attention, then reductions; gather into fresh tensors).
//!
//! ```text
//! cargo run -p kvslice-kernels --example bench_kernels -- [--sizes 1024,2048,...] [--reps 3]
//! ```
//!
//! Shapes follow SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64, window 32. Prints one
//! Markdown table per kernel: milliseconds per call (median of `reps`, after one warm-up) and
//! the ratio naive / kernel.

use std::time::Instant;

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, DeviceKind, Int, Tensor, TensorData};
use kvslice_kernels::{CacheTensors, StatsRequest, compact_in_place_host, decode_attention, window_stats};

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const D: usize = 64;
const W: usize = 32;

struct Rng(u64);

impl Rng {
    fn vec(&mut self, len: usize) -> Vec<f32> {
        (0..len)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}

fn median_ms(dev: &Device, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    dev.sync().expect("device sync");
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

fn naive_stats(q: &Tensor<3>, k: &Tensor<3>, v: &Tensor<3>, n: usize, dev: &Device) -> Vec<Tensor<2>> {
    let g = HEADS / KV_HEADS;
    let expand = |t: &Tensor<3>| t.clone().reshape([KV_HEADS, 1, n, D]).repeat_dim(1, g).reshape([HEADS, n, D]);
    let (k, v) = (expand(k), expand(v));
    let scores = q.clone().matmul(k.swap_dims(1, 2)) * (1.0 / (D as f64).sqrt());
    let mask = Tensor::<2, Bool>::tril_mask([W, n], (n - W) as i64, dev).reshape([1, W, n]).repeat_dim(0, HEADS);
    let a = softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 2);
    let mean = a.clone().mean_dim(1).reshape([HEADS, n]);
    let var = a.clone().var(1).reshape([HEADS, n]);
    let last = a.clone().slice([0..HEADS, W - 1..W, 0..n]).reshape([HEADS, n]);
    let vnorm = v.clone().powf_scalar(2.0).sum_dim(2).sqrt().reshape([HEADS, n]);
    let o = a.clone().matmul(v.clone());
    let dir = o.clone() / o.powf_scalar(2.0).sum_dim(2).sqrt();
    let proj = (a * dir.matmul(v.swap_dims(1, 2))).mean_dim(1).reshape([HEADS, n]);
    vec![mean.clone(), var, last, mean * vnorm, proj]
}

fn main() {
    let mut sizes = vec![1024usize, 2048, 4096, 8192, 16384, 32768];
    let mut reps = 3usize;
    let mut only: Option<String> = None;
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--sizes" => {
                sizes = args[i + 1].split(',').map(|s| s.parse().expect("size")).collect();
                i += 1;
            }
            "--only" => {
                only = Some(args[i + 1].clone());
                i += 1;
            }
            "--reps" => {
                reps = args[i + 1].parse().expect("reps");
                i += 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 1;
    }
    let dev = Device::wgpu(DeviceKind::DefaultDevice);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut rows: Vec<(&str, usize, f64, f64)> = Vec::new();
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);

    for &n in &sizes {
        let q = Tensor::<3>::from_data(TensorData::new(rng.vec(HEADS * W * D), [HEADS, W, D]), &dev);
        let k = Tensor::<3>::from_data(TensorData::new(rng.vec(KV_HEADS * n * D), [KV_HEADS, n, D]), &dev);
        let v = Tensor::<3>::from_data(TensorData::new(rng.vec(KV_HEADS * n * D), [KV_HEADS, n, D]), &dev);
        let request = StatsRequest { value_norm: true, projection: true, jacobian: true };

        let lens = vec![n as u32; KV_HEADS];

        // 1. window statistics (the naive route always computes every term)
        if want("stats") {
            let kernel = median_ms(&dev, reps, || {
                drop(window_stats(&q, &k, &v, n, request).unwrap());
            });
            let base = median_ms(&dev, reps, || {
                drop(window_stats(&q, &k, &v, n, StatsRequest::default()).unwrap());
            });
            let naive = median_ms(&dev, reps, || drop(naive_stats(&q, &k, &v, n, &dev)));
            rows.push(("window statistics", n, kernel, naive));
            rows.push(("window statistics without value terms", n, base, naive));
        }

        if want("compact") {
            // 2. compaction of K, V and positions to the kept slots (a quarter of each head)
            let kept_host: Vec<Vec<u32>> = (0..KV_HEADS).map(|_| (0..n as u32).step_by(4).collect()).collect();
            let width = kept_host[0].len();
            let kept_flat: Vec<i32> = kept_host.iter().flatten().map(|&s| s as i32).collect();
            let kept = Tensor::<2, Int>::from_data(TensorData::new(kept_flat, [KV_HEADS, width]), &dev);
            let mut kc = k.clone().add_scalar(0.0);
            let mut vc = v.clone().add_scalar(0.0);
            let pos: Vec<i32> = (0..KV_HEADS * n).map(|i| (i % n) as i32).collect();
            let mut pc = Tensor::<2, Int>::from_data(TensorData::new(pos, [KV_HEADS, n]), &dev);
            let kernel = median_ms(&dev, reps, || {
                compact_in_place_host(
                    CacheTensors { keys: &mut kc, values: &mut vc, positions: &mut pc },
                    &kept_host,
                    &lens,
                )
                .unwrap();
            });
            let naive = median_ms(&dev, reps, || {
                for h in 0..KV_HEADS {
                    let idx = kept.clone().slice([h..h + 1, 0..width]).reshape([width]);
                    drop(k.clone().slice([h..h + 1, 0..n, 0..D]).select(1, idx.clone()));
                    drop(v.clone().slice([h..h + 1, 0..n, 0..D]).select(1, idx.clone()));
                    drop(pc.clone().slice([h..h + 1, 0..n]).select(1, idx));
                }
            });
            rows.push(("compaction", n, kernel, naive));
        }

        if want("decode") {
            // 3. decode attention with per-slot weights accumulated
            let qd = Tensor::<2>::from_data(TensorData::new(rng.vec(HEADS * D), [HEADS, D]), &dev);
            let mut acc = Tensor::<2>::zeros([KV_HEADS, n], &dev);
            let kernel = median_ms(&dev, reps, || drop(decode_attention(&qd, &k, &v, &lens, Some(&mut acc)).unwrap()));
            let naive = median_ms(&dev, reps, || {
                let g = HEADS / KV_HEADS;
                let kx = k.clone().reshape([KV_HEADS, 1, n, D]).repeat_dim(1, g).reshape([HEADS, n, D]);
                let vx = v.clone().reshape([KV_HEADS, 1, n, D]).repeat_dim(1, g).reshape([HEADS, n, D]);
                let s = qd.clone().reshape([HEADS, 1, D]).matmul(kx.swap_dims(1, 2)) * (1.0 / (D as f64).sqrt());
                let a = softmax(s, 2);
                let out = a.clone().matmul(vx);
                let w = a.reshape([KV_HEADS, g, n]).mean_dim(1).reshape([KV_HEADS, n]);
                drop(out);
                drop(acc.clone() + w);
            });
            rows.push(("decode attention", n, kernel, naive));
        }
        eprintln!("n = {n} done");
    }

    for kernel_name in ["window statistics", "window statistics without value terms", "compaction", "decode attention"]
    {
        if rows.iter().all(|r| r.0 != kernel_name) {
            continue;
        }
        println!("\n### {kernel_name}\n\n| n | kernel ms | naive ms | naive / kernel |\n|---:|---:|---:|---:|");
        for &(_, n, ms, naive) in rows.iter().filter(|r| r.0 == kernel_name) {
            println!("| {n} | {ms:.2} | {naive:.2} | {:.2} |", naive / ms);
        }
    }
}
