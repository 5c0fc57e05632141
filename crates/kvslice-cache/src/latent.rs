//! Keys stored as low-rank latents: each group of KV heads shares one latent row per slot, of
//! the group's rank, from which every head's key is rebuilt when it is read.
//!
//! With a group's basis `U` (`[g·d, r]`, orthonormal columns) and its column scales `s`, a
//! pre-RoPE key row of the group (its heads' keys side by side, `k`) is stored as
//! `c = (k ∘ s) U` and read back as `k̂ = (c Uᵀ) / s`, then rotated by RoPE at the slot's
//! position. A model whose key projection already ends in the projector `S U Uᵀ S⁻¹` makes
//! keys that this reproduces to rounding. Keys arrive rotated (as every other store takes
//! them): they are rotated back by their positions before the projection.
//!
//! The heads of a group share their slots: the same length and the same source position in
//! every slot ([`crate::LayerKv::check`]); an eviction must keep, and a decode step must write,
//! the same slots in every head of a group.

use std::sync::Arc;

use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};

use crate::{CacheError, EMPTY_SLOT, Result};

/// RoPE's cos and sin for positions `0..len`, `[len, head_dim / 2]` each, on one device: what
/// rebuilt keys are rotated by.
#[derive(Debug)]
pub struct RopeTable {
    cos: Tensor<2>,
    sin: Tensor<2>,
    len: usize,
}

impl RopeTable {
    /// From host tables `[len, half]` row-major (position `p`'s row at `p · half`).
    pub fn new(cos: Vec<f32>, sin: Vec<f32>, half: usize, device: &Device) -> Result<Self> {
        if half == 0 || cos.len() != sin.len() || !cos.len().is_multiple_of(half) || cos.is_empty() {
            return Err(CacheError::Geometry(format!(
                "rotation tables of {} and {} values for {half} pairs",
                cos.len(),
                sin.len()
            )));
        }
        let len = cos.len() / half;
        let table = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [len * half]), device).reshape([len, half]);
        Ok(RopeTable { cos: table(cos), sin: table(sin), len })
    }

    /// Positions the table covers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Refuses positions the table does not cover (checked before a write, so that every
    /// stored position can be read).
    pub fn check(&self, positions: &[u32]) -> Result<()> {
        match positions.iter().find(|&&p| p != EMPTY_SLOT && p as usize >= self.len) {
            Some(p) => Err(CacheError::Geometry(format!(
                "position {p} is past the {} positions of the latent keys' rotation table",
                self.len
            ))),
            None => Ok(()),
        }
    }

    /// `(cos, sin)`, `[1, n, half]` each, of `positions` ([`EMPTY_SLOT`] reads position 0;
    /// positions past the table, which [`RopeTable::check`] keeps out of the store, read its
    /// last row).
    fn rows(&self, positions: &[u32], device: &Device) -> (Tensor<3>, Tensor<3>) {
        let last = self.len - 1;
        let index: Vec<i32> =
            positions.iter().map(|&p| if p == EMPTY_SLOT { 0 } else { (p as usize).min(last) as i32 }).collect();
        let n = index.len();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(index, [n]), device);
        let pick = |t: &Tensor<2>| t.clone().select(0, idx.clone()).unsqueeze_dim::<3>(0);
        (pick(&self.cos), pick(&self.sin))
    }
}

/// Rotates `x` (`[heads, n, d]`) by the angles whose cos and sin are given (`[1, n, d/2]`):
/// RoPE's `rotate_half` layout; `inverse` rotates back.
fn rotate(x: Tensor<3>, cos: &Tensor<3>, sin: &Tensor<3>, inverse: bool) -> Tensor<3> {
    let [_, _, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    let sin = if inverse { sin.clone().neg() } else { sin.clone() };
    let out1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let out2 = x2 * cos.clone() + x1 * sin;
    Tensor::cat(vec![out1, out2], 2)
}

/// A group's basis as calibration writes it: its heads (ascending), rank, basis (`[g·d, rank]`
/// row-major, the rows in the order of the heads' key columns) and column scales (`[g·d]`,
/// positive).
#[derive(Debug, Clone, Copy)]
pub struct GroupBasis<'a> {
    pub heads: &'a [usize],
    pub rank: usize,
    pub basis: &'a [f32],
    pub scale: &'a [f32],
}

/// One group of KV heads and its latent basis.
#[derive(Debug, Clone)]
pub struct LatentGroup {
    heads: Vec<usize>,
    rank: usize,
    /// `[g·d, r]`: `S U`, a group key row to its latent.
    down: Tensor<2>,
    /// `[r, g·d]`: `Uᵀ S⁻¹`, a latent to its group key row.
    up: Tensor<2>,
}

impl LatentGroup {
    pub fn heads(&self) -> &[usize] {
        &self.heads
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
}

/// How one layer's keys become latents: its groups (a partition of the KV heads) and the
/// rotation table shared by every layer.
#[derive(Debug, Clone)]
pub struct LatentLayout {
    groups: Vec<LatentGroup>,
    kv_heads: usize,
    head_dim: usize,
    rope: Arc<RopeTable>,
}

impl LatentLayout {
    /// `groups` must partition `0..kv_heads`.
    pub fn new(
        kv_heads: usize,
        head_dim: usize,
        groups: &[GroupBasis<'_>],
        rope: Arc<RopeTable>,
        device: &Device,
    ) -> Result<Self> {
        let bad = |why: String| Err(CacheError::Geometry(format!("latent keys: {why}")));
        if head_dim == 0 || !head_dim.is_multiple_of(2) || rope.cos.dims()[1] != head_dim / 2 {
            return bad(format!("a head dimension of {head_dim} with a rotation table of {}", rope.cos.dims()[1]));
        }
        let mut seen = vec![false; kv_heads];
        let mut out = Vec::with_capacity(groups.len());
        for &GroupBasis { heads, rank, basis, scale } in groups {
            let w = heads.len() * head_dim;
            if heads.is_empty() || heads.windows(2).any(|p| p[0] >= p[1]) {
                return bad("a group's heads must be ascending and distinct".into());
            }
            for &h in heads {
                if h >= kv_heads || std::mem::replace(&mut seen[h], true) {
                    return bad(format!("head {h} is out of range or in two groups"));
                }
            }
            if rank == 0 || rank > w || basis.len() != w * rank || scale.len() != w {
                return bad(format!(
                    "a basis of {} values and {} scales for rank {rank} of {w}",
                    basis.len(),
                    scale.len()
                ));
            }
            if scale.iter().any(|s| !s.is_finite() || *s <= 0.0) || basis.iter().any(|x| !x.is_finite()) {
                return bad("scales must be positive and the basis finite".into());
            }
            let mut down = Vec::with_capacity(w * rank);
            let mut up = vec![0.0f32; rank * w];
            for a in 0..w {
                for j in 0..rank {
                    let u = basis[a * rank + j];
                    down.push(scale[a] * u);
                    up[j * w + a] = u / scale[a];
                }
            }
            let t = |v: Vec<f32>, shape: [usize; 2]| {
                Tensor::<1>::from_data(TensorData::new(v, [shape[0] * shape[1]]), device).reshape(shape)
            };
            out.push(LatentGroup { heads: heads.to_vec(), rank, down: t(down, [w, rank]), up: t(up, [rank, w]) });
        }
        if seen.iter().any(|s| !s) {
            return bad("the groups leave a head out".into());
        }
        Ok(LatentLayout { groups: out, kv_heads, head_dim, rope })
    }

    /// Refuses positions past the rotation table.
    pub fn check_positions(&self, positions: &[u32]) -> Result<()> {
        self.rope.check(positions)
    }

    pub fn groups(&self) -> &[LatentGroup] {
        &self.groups
    }

    /// Latent dimensions of one token over every group.
    pub fn width(&self) -> usize {
        self.groups.iter().map(|g| g.rank).sum()
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The latents of rotated `keys` (`[kv_heads, n, d]`, every head at `positions`), one
    /// `[n, rank]` tensor per group.
    fn encode(&self, keys: &Tensor<3>, positions: &[u32]) -> Result<Vec<Tensor<2>>> {
        let device = keys.device();
        let [h, n, d] = keys.dims();
        if h != self.kv_heads || d != self.head_dim || n != positions.len() {
            return Err(CacheError::ShapeMismatch {
                what: "keys to encode",
                expected: vec![self.kv_heads, positions.len(), self.head_dim],
                got: vec![h, n, d],
            });
        }
        self.rope.check(positions)?;
        let (cos, sin) = self.rope.rows(positions, &device);
        let raw = rotate(keys.clone(), &cos, &sin, true);
        Ok(self.groups.iter().map(|g| group_rows(&raw, &g.heads, &device).matmul(g.down.clone())).collect())
    }
}

/// `[g, n, d]` → `[n, g·d]` of the heads `heads` of `x` (`[kv_heads, n, d]`).
fn group_rows(x: &Tensor<3>, heads: &[usize], device: &Device) -> Tensor<2> {
    let [_, n, d] = x.dims();
    let g = heads.len();
    let picked = if g == x.dims()[0] {
        x.clone()
    } else {
        let idx: Vec<i32> = heads.iter().map(|&h| h as i32).collect();
        x.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(idx, [g]), device))
    };
    picked.swap_dims(0, 1).reshape([n, g * d])
}

/// The latent keys of one layer and its values.
#[derive(Debug, Clone)]
pub(crate) struct LatentKv {
    pub layout: LatentLayout,
    /// Per group, `[capacity, rank]`, f32 or f16 as the values.
    pub keys: Vec<Tensor<2>>,
    /// `[kv_heads, capacity, head_dim]`.
    pub values: Tensor<3>,
}

impl LatentKv {
    /// From dense rotated keys and values `[kv_heads, capacity, d]` whose group heads share
    /// lengths and positions (`positions`: `[kv_heads · capacity]`, slot order).
    pub fn encode(
        layout: &LatentLayout,
        keys: &Tensor<3>,
        values: Tensor<3>,
        positions: &[u32],
        capacity: usize,
    ) -> Result<Self> {
        let device = keys.device();
        let dtype = values.dtype();
        let f32_keys = if keys.dtype() == DType::F32 { keys.clone() } else { keys.clone().cast(FloatDType::F32) };
        let mut out = Vec::with_capacity(layout.groups.len());
        for g in &layout.groups {
            let first = g.heads[0];
            let pos = &positions[first * capacity..(first + 1) * capacity];
            layout.rope.check(pos)?;
            let (cos, sin) = layout.rope.rows(pos, &device);
            let idx: Vec<i32> = g.heads.iter().map(|&h| h as i32).collect();
            let heads = Tensor::<1, Int>::from_data(TensorData::new(idx, [g.heads.len()]), &device);
            let raw = rotate(f32_keys.clone().select(0, heads), &cos, &sin, true);
            let all: Vec<usize> = (0..g.heads.len()).collect();
            let latent = group_rows(&raw, &all, &device).matmul(g.down.clone());
            out.push(cast(latent, dtype));
        }
        Ok(LatentKv { layout: layout.clone(), keys: out, values })
    }

    /// The stored element type's size in bytes.
    pub fn element_bytes(&self) -> usize {
        self.values.dtype().size()
    }

    /// The same entries stored as `dtype` (f32 or f16).
    pub fn cast(&self, dtype: FloatDType) -> Self {
        LatentKv {
            layout: self.layout.clone(),
            keys: self.keys.iter().map(|k| k.clone().cast(dtype)).collect(),
            values: self.values.clone().cast(dtype),
        }
    }

    /// Rotated keys of slots `0..n`, `[kv_heads, n, d]` f32, each group's rebuilt from its
    /// latents and rotated by the slots' positions (`[kv_heads · capacity]`).
    pub fn keys(&self, n: usize, positions: &[u32], capacity: usize) -> Tensor<3> {
        let d = self.layout.head_dim;
        let device = self.values.device();
        let mut parts = Vec::with_capacity(self.keys.len());
        let mut order = Vec::with_capacity(self.layout.kv_heads);
        for (g, latent) in self.layout.groups.iter().zip(&self.keys) {
            let first = g.heads[0];
            let (cos, sin) = self.layout.rope.rows(&positions[first * capacity..first * capacity + n], &device);
            let c = cast(latent.clone().narrow(0, 0, n), DType::F32);
            let rows = c.matmul(g.up.clone()).reshape([n, g.heads.len(), d]).swap_dims(0, 1);
            parts.push(rotate(rows, &cos, &sin, false));
            order.extend(g.heads.iter().copied());
        }
        let keys = if parts.len() == 1 { parts.pop().expect("one group") } else { Tensor::cat(parts, 0) };
        if order.iter().enumerate().all(|(i, &h)| i == h) {
            return keys;
        }
        let mut inverse = vec![0i32; order.len()];
        for (i, &h) in order.iter().enumerate() {
            inverse[h] = i as i32;
        }
        let idx = Tensor::<1, Int>::from_data(TensorData::new(inverse, [order.len()]), &device);
        keys.select(0, idx)
    }

    /// Writes `n` tokens (`keys`/`values`: `[kv_heads, n, d]`, rotated keys, every head at
    /// `positions`) into slots `starts[h] .. starts[h] + n` (the same start in every head of a
    /// group; bounds checked by the callers).
    pub fn write(&mut self, starts: &[usize], keys: &Tensor<3>, values: Tensor<3>, positions: &[u32]) -> Result<()> {
        let n = positions.len();
        if let Some(g) = self.layout.groups.iter().find(|g| g.heads.iter().any(|&h| starts[h] != starts[g.heads[0]])) {
            return Err(CacheError::BadKeep {
                head: g.heads[0],
                reason: "the heads of a latent group must write the same slots".into(),
            });
        }
        let latents = self.layout.encode(keys, positions)?;
        let dtype = self.values.dtype();
        for ((g, stored), latent) in self.layout.groups.iter().zip(&mut self.keys).zip(latents) {
            let at = starts[g.heads[0]];
            let mut s = std::mem::replace(stored, latent.clone());
            s = s.slice_assign([at..at + n, 0..g.rank], cast(latent, dtype));
            *stored = s;
        }
        let values = cast3(values, dtype);
        let [h, _, d] = values.dims();
        let mut v = std::mem::replace(&mut self.values, values.clone());
        if starts.iter().all(|&s| s == starts[0]) {
            v = v.slice_assign([0..h, starts[0]..starts[0] + n, 0..d], values);
        } else {
            for (head, &at) in starts.iter().enumerate() {
                v = v.slice_assign([head..head + 1, at..at + n, 0..d], values.clone().narrow(0, head, 1));
            }
        }
        self.values = v;
        Ok(())
    }

    /// A new store of `capacity` slots holding the slots `index[h]` of each head (each
    /// `capacity` long, padded; the same in every head of a group).
    pub fn gather(&self, index: &[Vec<i32>], capacity: usize) -> Self {
        let device = self.values.device();
        let d = self.layout.head_dim;
        let h = index.len();
        let keys = self
            .layout
            .groups
            .iter()
            .zip(&self.keys)
            .map(|(g, k)| {
                let idx = Tensor::<1, Int>::from_data(TensorData::new(index[g.heads[0]].clone(), [capacity]), &device);
                k.clone().select(0, idx)
            })
            .collect();
        let flat: Vec<i32> = index.iter().flatten().copied().collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(flat, [h * capacity]), &device)
            .reshape([h, capacity, 1])
            .expand([h, capacity, d]);
        LatentKv { layout: self.layout.clone(), keys, values: self.values.clone().gather(1, idx) }
    }

    /// Bytes of storage for `capacity` slots.
    pub fn bytes(&self, capacity: usize) -> usize {
        capacity * (self.layout.width() + self.layout.kv_heads * self.layout.head_dim) * self.element_bytes()
    }

    /// Bytes of the live entries: each group's latent rows and each head's values.
    pub fn occupied_bytes(&self, lens: &[usize]) -> usize {
        let keys: usize = self.layout.groups.iter().map(|g| lens[g.heads[0]] * g.rank).sum();
        let values: usize = lens.iter().sum::<usize>() * self.layout.head_dim;
        (keys + values) * self.element_bytes()
    }

    /// Whether every group's heads hold the same lengths and positions.
    pub fn aligned(&self, lens: &[usize], positions: &[u32], capacity: usize) -> std::result::Result<(), usize> {
        for g in &self.layout.groups {
            let first = g.heads[0];
            let reference = &positions[first * capacity..(first + 1) * capacity];
            for &h in &g.heads[1..] {
                if lens[h] != lens[first] || &positions[h * capacity..(h + 1) * capacity] != reference {
                    return Err(h);
                }
            }
        }
        Ok(())
    }
}

fn cast(t: Tensor<2>, dtype: DType) -> Tensor<2> {
    if t.dtype() == dtype { t } else { t.cast(FloatDType::from(dtype)) }
}

fn cast3(t: Tensor<3>, dtype: DType) -> Tensor<3> {
    if t.dtype() == dtype { t } else { t.cast(FloatDType::from(dtype)) }
}
