//! Window statistics on the host: the CPU backend's route for what the policies read of the
//! prompt's last queries (SnapKV's and Ada-KV's window mean, CAKE's variance and entropy, the
//! value-weighted, projection and Jacobian tables, Finch's position weights).
//!
//! The definitions are those of `kvslice_policy::WindowStats`: query `i` of the window of `w`
//! sits at position `len − w + i` and sees keys `0..=len − w + i`; each table is a mean over
//! the window's queries. Per query head one `[w, len]` score matrix (2 MiB for a window of 64
//! over 8K keys) is built on `gemm`, exponentiated on the vectorised `exp` and reduced by
//! columns; the heads are shared by the workers, each head's tables written by one of them,
//! so the result does not depend on scheduling. The window is at most a few hundred queries,
//! so no tiling over queries is needed: the matrix is `1/heads` of what the tensor route
//! builds.

use crate::flash::{Mat, MatRef, Shape, exp_shifted, gemm_f32, max};

/// Adds query `i`'s weighted row of attention into the column totals.
type RowInto<'a> = dyn Fn(usize, &[f32], &mut [f32]) + 'a;

/// Which optional tables to compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Want {
    /// `mean_i a_ij · ‖v_j‖`.
    pub value_norm: bool,
    /// `mean_i a_ij · ⟨v_j, o_i/‖o_i‖⟩`.
    pub projection: bool,
    /// `mean_i a_ij · ‖v_j − o_i‖`.
    pub jacobian: bool,
    /// `mean_i p_i a_ij`, `p_i = len − w + i`.
    pub position_weighted: bool,
}

/// The statistics of one layer's window, `[heads, len]` row-major unless noted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub mean: Vec<f32>,
    /// Unbiased variance over the window's queries (0 when `w = 1`).
    pub var: Vec<f32>,
    /// The last query's weights.
    pub last: Vec<f32>,
    /// `[heads]`: mean over the window's queries of `−Σ_{j < len − w} a_ij ln a_ij`.
    pub entropy: Vec<f32>,
    pub value_norm: Option<Vec<f32>>,
    pub projection: Option<Vec<f32>>,
    pub jacobian: Option<Vec<f32>>,
    pub position_weighted: Option<Vec<f32>>,
}

/// The window statistics of queries `q` (`[heads, w, d]`, the last `w` of a prompt of `len`,
/// after RoPE) over `k`, `v` (`[kv_heads, len, d]`); `shape.n` is `w`. Scores are scaled by
/// `scale`; `threads` workers share the heads.
pub fn window_stats(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Shape,
    want: Want,
    scale: f32,
    threads: usize,
) -> Result<Stats, String> {
    let Shape { heads, kv_heads, n: w, len, head_dim: d } = shape;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) || d == 0 || w == 0 || w > len {
        return Err(format!(
            "window statistics of {w} queries over {len} keys, {heads} query heads over {kv_heads} KV heads of dimension {d}"
        ));
    }
    if q.len() != heads * w * d || k.len() != kv_heads * len * d || v.len() != k.len() {
        return Err(format!("{} query, {} key and {} value values for {shape:?}", q.len(), k.len(), v.len()));
    }
    let job = Job { q, k, v, shape, want, scale };
    let threads = threads.clamp(1, heads);
    let run = |worker: usize| {
        let mut scratch = Scratch::new(&job);
        (worker..heads).step_by(threads).map(|h| (h, job.head(h, &mut scratch))).collect::<Vec<_>>()
    };
    let parts: Vec<(usize, Head)> =
        crate::flash::on_workers((0..threads).collect(), "window-statistics", run)?.into_iter().flatten().collect();
    let table = |on: bool| on.then(|| vec![0f32; heads * len]);
    let mut out = Stats {
        mean: vec![0.0; heads * len],
        var: vec![0.0; heads * len],
        last: vec![0.0; heads * len],
        entropy: vec![0.0; heads],
        value_norm: table(want.value_norm),
        projection: table(want.projection),
        jacobian: table(want.jacobian),
        position_weighted: table(want.position_weighted),
    };
    for (h, head) in parts {
        let rows = h * len..(h + 1) * len;
        out.mean[rows.clone()].copy_from_slice(&head.mean);
        out.var[rows.clone()].copy_from_slice(&head.var);
        out.last[rows.clone()].copy_from_slice(&head.last);
        out.entropy[h] = head.entropy;
        for (dst, src) in [
            (&mut out.value_norm, &head.value_norm),
            (&mut out.projection, &head.projection),
            (&mut out.jacobian, &head.jacobian),
            (&mut out.position_weighted, &head.position_weighted),
        ] {
            if let Some(dst) = dst {
                dst[rows.clone()].copy_from_slice(src);
            }
        }
    }
    Ok(out)
}

struct Job<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    shape: Shape,
    want: Want,
    scale: f32,
}

/// One head's tables (the optional ones empty when not wanted).
struct Head {
    mean: Vec<f32>,
    var: Vec<f32>,
    last: Vec<f32>,
    entropy: f32,
    value_norm: Vec<f32>,
    projection: Vec<f32>,
    jacobian: Vec<f32>,
    position_weighted: Vec<f32>,
}

/// One worker's buffers.
struct Scratch {
    q: Vec<f32>,
    /// `[w, len]` attention.
    a: Vec<f32>,
    /// `[w, len]` products with the values (projection, Jacobian).
    m: Vec<f32>,
    /// One row of raw scores before the window.
    raw: Vec<f32>,
    /// `[w, d]` outputs.
    o: Vec<f32>,
}

impl Scratch {
    fn new(job: &Job<'_>) -> Self {
        let Shape { n: w, len, head_dim: d, .. } = job.shape;
        let products = job.want.projection || job.want.jacobian;
        Scratch {
            q: vec![0.0; w * d],
            a: vec![0.0; w * len],
            m: if products { vec![0.0; w * len] } else { Vec::new() },
            raw: vec![0.0; len - w],
            o: if products { vec![0.0; w * d] } else { Vec::new() },
        }
    }
}

impl Job<'_> {
    fn head(&self, h: usize, s: &mut Scratch) -> Head {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: each target-feature function is called only where the CPU reports its
            // features; their bodies are safe code.
            #[allow(unsafe_code)]
            if std::arch::is_x86_feature_detected!("avx512f") {
                return unsafe { self.head_avx512(h, s) };
            } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return unsafe { self.head_avx2(h, s) };
            }
        }
        self.head_any(h, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn head_avx512(&self, h: usize, s: &mut Scratch) -> Head {
        self.head_any(h, s)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn head_avx2(&self, h: usize, s: &mut Scratch) -> Head {
        self.head_any(h, s)
    }

    #[inline(always)]
    fn head_any(&self, h: usize, s: &mut Scratch) -> Head {
        let Shape { heads, kv_heads, n: w, len, head_dim: d } = self.shape;
        let kh = h / (heads / kv_heads);
        let keys = &self.k[kh * len * d..(kh + 1) * len * d];
        let values = &self.v[kh * len * d..(kh + 1) * len * d];
        let first = len - w;
        for (o, &x) in s.q.iter_mut().zip(&self.q[h * w * d..(h + 1) * w * d]) {
            *o = x * self.scale;
        }
        // a[w, len] = q[w, d] · keysᵀ
        gemm_f32(
            Mat { data: &mut s.a, rows: w, cols: len, row_stride: len, col_stride: 1 },
            false,
            MatRef { data: &s.q, row_stride: d, col_stride: 1 },
            MatRef { data: keys, row_stride: 1, col_stride: d },
            d,
        );
        let mut entropy = 0f64;
        for i in 0..w {
            let row = &mut s.a[i * len..(i + 1) * len];
            let cut = first + i + 1;
            row[cut..].fill(0.0);
            let row = &mut row[..cut];
            let m = max(row);
            s.raw.copy_from_slice(&row[..first]);
            let z = exp_shifted(row, m);
            let inv = 1.0 / z;
            row.iter_mut().for_each(|x| *x *= inv);
            if first > 0 {
                // ln a_ij = (s_ij − m) − ln z, so −Σ a ln a = ln z · Σ a − Σ a (s − m)
                let (mut mass, mut dot) = (0f64, 0f64);
                for (&p, &raw) in row[..first].iter().zip(&s.raw) {
                    mass += f64::from(p);
                    dot += f64::from(p) * f64::from(raw - m);
                }
                entropy += f64::from(z).ln() * mass - dot;
            }
        }
        let a = &s.a[..w * len];
        let rows = || a.chunks_exact(len);
        let inv_w = 1.0 / w as f32;
        let column_mean = |weight: &RowInto<'_>| {
            let mut out = vec![0f32; len];
            for (i, row) in rows().enumerate() {
                weight(i, row, &mut out);
            }
            out.iter_mut().for_each(|x| *x *= inv_w);
            out
        };
        let mean = column_mean(&|_, row, out| out.iter_mut().zip(row).for_each(|(o, &x)| *o += x));
        let var = if w > 1 {
            let mut var = vec![0f32; len];
            for row in rows() {
                for ((v, &x), &mu) in var.iter_mut().zip(row).zip(&mean) {
                    *v += (x - mu) * (x - mu);
                }
            }
            let inv = 1.0 / (w - 1) as f32;
            var.iter_mut().for_each(|x| *x *= inv);
            var
        } else {
            vec![0f32; len]
        };
        let last = a[(w - 1) * len..].to_vec();
        let want = self.want;
        let position_weighted = if want.position_weighted {
            column_mean(&|i, row, out| {
                let p = (first + i) as f32;
                out.iter_mut().zip(row).for_each(|(o, &x)| *o += p * x)
            })
        } else {
            Vec::new()
        };
        let norms2: Vec<f32> = values.chunks_exact(d).map(|v| v.iter().map(|x| x * x).sum()).collect();
        let value_norm = if want.value_norm {
            mean.iter().zip(&norms2).map(|(&m, &n2)| m * n2.sqrt()).collect()
        } else {
            Vec::new()
        };
        let (mut projection, mut jacobian) = (Vec::new(), Vec::new());
        if want.projection || want.jacobian {
            // o[w, d] = a[w, len] · values
            gemm_f32(
                Mat { data: &mut s.o, rows: w, cols: d, row_stride: d, col_stride: 1 },
                false,
                MatRef { data: a, row_stride: len, col_stride: 1 },
                MatRef { data: values, row_stride: d, col_stride: 1 },
                len,
            );
            let o_norms2: Vec<f32> = s.o.chunks_exact(d).map(|o| o.iter().map(|x| x * x).sum()).collect();
            let products = |lhs: &[f32], m: &mut [f32]| {
                // m[w, len] = lhs[w, d] · valuesᵀ
                gemm_f32(
                    Mat { data: m, rows: w, cols: len, row_stride: len, col_stride: 1 },
                    false,
                    MatRef { data: lhs, row_stride: d, col_stride: 1 },
                    MatRef { data: values, row_stride: 1, col_stride: d },
                    d,
                );
            };
            if want.jacobian {
                // ‖v_j − o_i‖² = ‖v_j‖² − 2⟨v_j, o_i⟩ + ‖o_i‖²
                products(&s.o, &mut s.m);
                let m = &s.m;
                jacobian = column_mean(&|i, row, out| {
                    let on = o_norms2[i];
                    for (((o, &x), &vo), &vn) in out.iter_mut().zip(row).zip(&m[i * len..(i + 1) * len]).zip(&norms2) {
                        *o += x * (vn - 2.0 * vo + on).max(0.0).sqrt();
                    }
                });
            }
            if want.projection {
                let dir: Vec<f32> =
                    s.o.chunks_exact(d)
                        .zip(&o_norms2)
                        .flat_map(|(o, &n2)| {
                            let inv = 1.0 / n2.sqrt().max(1e-30);
                            o.iter().map(move |&x| x * inv)
                        })
                        .collect();
                products(&dir, &mut s.m);
                let m = &s.m;
                projection = column_mean(&|i, row, out| {
                    for ((o, &x), &vd) in out.iter_mut().zip(row).zip(&m[i * len..(i + 1) * len]) {
                        *o += x * vd;
                    }
                });
            }
        }
        Head {
            mean,
            var,
            last,
            entropy: if first > 0 { (entropy / w as f64) as f32 } else { 0.0 },
            value_norm,
            projection,
            jacobian,
            position_weighted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash::tests::noise;

    fn seeded(seed: u64, n: usize, amplitude: f32) -> Vec<f32> {
        (0..n).map(|i| amplitude * noise(seed, i)).collect()
    }

    /// The definitions, in f64, written out per element: the attention of each window query,
    /// then each table as a mean over the queries.
    fn reference(q: &[f32], k: &[f32], v: &[f32], s: Shape, scale: f64) -> [Vec<f64>; 8] {
        let Shape { heads, kv_heads, n: w, len, head_dim: d } = s;
        let group = heads / kv_heads;
        let first = len - w;
        let mut t: [Vec<f64>; 8] = std::array::from_fn(|_| vec![0f64; heads * len]);
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        for h in 0..heads {
            let kh = h / group;
            let key = |j: usize| -> Vec<f64> { k[(kh * len + j) * d..][..d].iter().map(|&x| x as f64).collect() };
            let val = |j: usize| -> Vec<f64> { v[(kh * len + j) * d..][..d].iter().map(|&x| x as f64).collect() };
            let mut a = vec![vec![0f64; len]; w];
            let mut entropy = 0.0;
            for i in 0..w {
                let qi: Vec<f64> = q[(h * w + i) * d..][..d].iter().map(|&x| x as f64).collect();
                let seen = first + i + 1;
                let s: Vec<f64> = (0..seen).map(|j| dot(&qi, &key(j)) * scale).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for j in 0..seen {
                    a[i][j] = (s[j] - m).exp() / z;
                }
                entropy -= (0..first).map(|j| a[i][j] * (a[i][j] + 1e-10).ln()).sum::<f64>();
            }
            t[3][h] = if first > 0 { entropy / w as f64 } else { 0.0 };
            for j in 0..len {
                let col: Vec<f64> = (0..w).map(|i| a[i][j]).collect();
                let mean = col.iter().sum::<f64>() / w as f64;
                t[0][h * len + j] = mean;
                t[1][h * len + j] =
                    if w > 1 { col.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (w - 1) as f64 } else { 0.0 };
                t[2][h * len + j] = col[w - 1];
                let vj = val(j);
                t[4][h * len + j] = mean * dot(&vj, &vj).sqrt();
                t[7][h * len + j] = (0..w).map(|i| (first + i) as f64 * a[i][j]).sum::<f64>() / w as f64;
                let (mut proj, mut jac) = (0.0, 0.0);
                for ai in &a {
                    let o: Vec<f64> = (0..d).map(|c| (0..len).map(|l| ai[l] * val(l)[c]).sum()).collect();
                    let on = dot(&o, &o).sqrt().max(1e-30);
                    proj += ai[j] * dot(&vj, &o) / on;
                    jac += ai[j] * vj.iter().zip(&o).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
                }
                t[5][h * len + j] = proj / w as f64;
                t[6][h * len + j] = jac / w as f64;
            }
        }
        t
    }

    fn check(shape: Shape, threads: usize) {
        let Shape { heads, kv_heads, n: w, len, head_dim: d } = shape;
        // larger queries make the attention peaked, as in real models
        let q = seeded(1, heads * w * d, 3.0);
        let k = seeded(2, kv_heads * len * d, 1.0);
        let v = seeded(3, kv_heads * len * d, 1.0);
        let scale = 1.0 / (d as f64).sqrt();
        let all = Want { value_norm: true, projection: true, jacobian: true, position_weighted: true };
        let got = window_stats(&q, &k, &v, shape, all, scale as f32, threads).unwrap();
        let want = reference(&q, &k, &v, shape, scale);
        let tables: [(&str, &[f32]); 8] = [
            ("mean", &got.mean),
            ("var", &got.var),
            ("last", &got.last),
            ("entropy", &got.entropy),
            ("value_norm", got.value_norm.as_deref().unwrap()),
            ("projection", got.projection.as_deref().unwrap()),
            ("jacobian", got.jacobian.as_deref().unwrap()),
            ("position_weighted", got.position_weighted.as_deref().unwrap()),
        ];
        for ((name, got), want) in tables.into_iter().zip(&want) {
            let want = if name == "entropy" { &want[..heads] } else { &want[..] };
            assert_eq!(got.len(), want.len(), "{name}");
            let scale = want.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
            for (i, (&g, &e)) in got.iter().zip(want).enumerate() {
                assert!((g as f64 - e).abs() <= 2e-5 * scale, "{name}[{i}]: {g} vs {e} ({shape:?}, {threads} threads)");
            }
        }
        // the optional tables only when asked for, the others unchanged
        let plain = window_stats(&q, &k, &v, shape, Want::default(), scale as f32, threads).unwrap();
        assert!(plain.value_norm.is_none() && plain.projection.is_none() && plain.jacobian.is_none());
        assert_eq!((plain.mean, plain.var, plain.entropy), (got.mean, got.var, got.entropy));
    }

    #[test]
    fn window_statistics_match_the_definition() {
        // GQA (3 query heads per KV head), a window of 8 over 37 keys, on 1 and 2 workers
        check(Shape { heads: 6, kv_heads: 2, n: 8, len: 37, head_dim: 16 }, 1);
        check(Shape { heads: 6, kv_heads: 2, n: 8, len: 37, head_dim: 16 }, 2);
        // one query; a window that is the whole prompt (no entropy); odd sizes
        check(Shape { heads: 2, kv_heads: 1, n: 1, len: 19, head_dim: 8 }, 2);
        check(Shape { heads: 3, kv_heads: 3, n: 13, len: 13, head_dim: 12 }, 3);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let s = Shape { heads: 4, kv_heads: 2, n: 4, len: 8, head_dim: 4 };
        let (q, kv) = (vec![0f32; 4 * 4 * 4], vec![0f32; 2 * 8 * 4]);
        assert!(window_stats(&q, &kv, &kv, s, Want::default(), 1.0, 1).is_ok());
        assert!(window_stats(&q[1..], &kv, &kv, s, Want::default(), 1.0, 1).is_err());
        assert!(window_stats(&q, &kv, &kv[1..], s, Want::default(), 1.0, 1).is_err());
        assert!(window_stats(&q, &kv, &kv, Shape { kv_heads: 3, ..s }, Want::default(), 1.0, 1).is_err());
        assert!(window_stats(&q, &kv, &kv, Shape { n: 9, ..s }, Want::default(), 1.0, 1).is_err());
        assert!(window_stats(&[], &kv, &kv, Shape { n: 0, ..s }, Want::default(), 1.0, 1).is_err());
    }
}
