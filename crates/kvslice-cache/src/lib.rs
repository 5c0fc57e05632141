//! KV storage for one sequence: per layer, preallocated key and value tensors of shape
//! `[kv_heads, capacity, head_dim]`, with per-head lengths and per-slot source positions kept
//! beside the tensors (metadata apart from storage).
//!
//! Keys are stored *after* RoPE, so a slot's content does not depend on where it sits: eviction
//! can move rows (compaction) or overwrite a slot with a new token (slot reuse) without touching
//! the other entries. Appends write in place into the preallocated storage; no tensor is
//! concatenated per token.
//!
//! A layer may hold its keys as low-rank latents instead ([`LayerKv::with_latent_keys`],
//! [`latent`]): each group of KV heads stores one latent row per slot, and reads rebuild and
//! rotate the keys. Every read ([`LayerKv::view`], [`LayerKv::dense`]) gives the same f32 keys
//! whatever the storage.
//!
//! # Invariants (verified by [`LayerKv::check`]; metadata replacements are validated first)
//! - `lens[h] <= capacity` for every head;
//! - `positions[h * capacity + s]` is the source position of slot `s` of head `h` for
//!   `s < lens[h]`, and [`EMPTY_SLOT`] beyond;
//! - within a head, occupied slots hold distinct source positions;
//! - with latent keys, the heads of a group hold the same lengths and positions.

use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};

mod latent;
mod quant;
use latent::LatentKv;
pub use latent::{GroupBasis, LatentGroup, LatentLayout, RopeTable};
use quant::QuantKv;
pub use quant::{KEY_GROUP, KvDtype, VALUE_GROUP, quantize_group, value_group};

/// Source position stored for slots that hold nothing.
pub const EMPTY_SLOT: u32 = u32::MAX;

/// Errors of the cache, raised before any device work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    #[error("layer {layer} out of range (the cache has {layers} layers)")]
    LayerOutOfRange { layer: usize, layers: usize },
    #[error("cache full: head {head} of layer {layer} holds {len} of {capacity} slots, {requested} more requested")]
    Full { layer: usize, head: usize, len: usize, capacity: usize, requested: usize },
    #[error("shape mismatch for {what}: expected {expected:?}, got {got:?}")]
    ShapeMismatch { what: &'static str, expected: Vec<usize>, got: Vec<usize> },
    #[error("invalid cache geometry: {0}")]
    Geometry(String),
    #[error("KV dtype: {0}")]
    Dtype(String),
    #[error("keep list for head {head}: {reason}")]
    BadKeep { head: usize, reason: String },
    #[error("eviction during prefill failed: {0}")]
    Eviction(String),
    #[error("compaction kernel: {0}")]
    Kernel(String),
}

/// Prints `message` to stderr the first time `once` is passed.
fn warn_once(once: &std::sync::Once, message: &str) {
    once.call_once(|| eprintln!("kvslice: {message}"));
}

static ROW_WRITE_FALLBACK: std::sync::Once = std::sync::Once::new();

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, CacheError>;

/// Shape of a cache: every layer has the same geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheGeometry {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Slots per KV head.
    pub capacity: usize,
}

impl CacheGeometry {
    /// Bytes of K and V storage for the whole cache with elements of `element_bytes` bytes.
    pub fn bytes(&self, element_bytes: usize) -> usize {
        2 * self.layers * self.kv_heads * self.capacity * self.head_dim * element_bytes
    }

    fn validate(&self) -> Result<()> {
        if self.layers == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.capacity == 0 {
            return Err(CacheError::Geometry(format!("every dimension must be non-zero: {self:?}")));
        }
        let elems = self
            .kv_heads
            .checked_mul(self.capacity)
            .and_then(|x| x.checked_mul(self.head_dim))
            .ok_or_else(|| CacheError::Geometry(format!("size overflows: {self:?}")))?;
        if elems > (u32::MAX as usize) {
            return Err(CacheError::Geometry(format!(
                "one layer would hold {elems} elements, more than a GPU buffer can index"
            )));
        }
        Ok(())
    }
}

/// Keys and values of one layer.
#[derive(Debug, Clone)]
pub struct LayerKv {
    store: Store,
    /// Occupied slots per head (slots `0..lens[h]`).
    lens: Vec<usize>,
    /// `[kv_heads * capacity]` source position of each slot, [`EMPTY_SLOT`] when free.
    positions: Vec<u32>,
    kv_heads: usize,
    capacity: usize,
    head_dim: usize,
}

/// How a layer holds its keys and values. (One per layer: the variants' sizes do not matter.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
enum Store {
    /// `[kv_heads, capacity, head_dim]` each, f32 or f16; keys after RoPE.
    Dense { keys: Tensor<3>, values: Tensor<3> },
    /// Codes, steps and the full-precision residual ([`quant`]).
    Quant(QuantKv),
    /// Keys as their groups' low-rank latents, values dense ([`latent`]).
    Latent(LatentKv),
}

impl LayerKv {
    fn new(geometry: &CacheGeometry, device: &Device) -> Self {
        let shape = [geometry.kv_heads, geometry.capacity, geometry.head_dim];
        Self {
            store: Store::Dense { keys: Tensor::zeros(shape, device), values: Tensor::zeros(shape, device) },
            lens: vec![0; geometry.kv_heads],
            positions: vec![EMPTY_SLOT; geometry.kv_heads * geometry.capacity],
            kv_heads: geometry.kv_heads,
            capacity: geometry.capacity,
            head_dim: geometry.head_dim,
        }
    }

    /// Slots per KV head.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The element type of the stored keys and values.
    pub fn dtype(&self) -> KvDtype {
        match &self.store {
            Store::Dense { keys, .. } if keys.dtype() == DType::F16 => KvDtype::F16,
            Store::Dense { .. } => KvDtype::F32,
            Store::Quant(q) if q.bits == 8 => KvDtype::Q8,
            Store::Quant(_) => KvDtype::Q4,
            Store::Latent(l) if l.values.dtype() == DType::F16 => KvDtype::F16,
            Store::Latent(_) => KvDtype::F32,
        }
    }

    /// The device the storage lives on.
    pub fn device(&self) -> Device {
        match &self.store {
            Store::Dense { keys, .. } => keys.device(),
            Store::Quant(q) => q.k_step.device(),
            Store::Latent(l) => l.values.device(),
        }
    }

    /// Bytes of one cached entry, a key and a value of `head_dim` elements: exact for f32 and
    /// f16; for quantized types the codes plus the value steps and the key steps spread over a
    /// group (what a sealed entry costs).
    pub fn entry_bytes(&self) -> usize {
        match &self.store {
            Store::Dense { keys, .. } => 2 * self.head_dim * keys.dtype().size(),
            Store::Quant(q) => {
                let d = self.head_dim;
                let scale = q.k_step.dtype().size();
                2 * d * q.bits as usize / 8 + 2 * (d / value_group(d)) * scale + (2 * d * scale).div_ceil(KEY_GROUP)
            }
            // a value and the head's share of its group's latent row
            Store::Latent(l) => l.bytes(1).div_ceil(self.kv_heads),
        }
    }

    /// Bytes of K/V storage this layer holds, occupied or not (for quantized types: codes,
    /// steps, minimums and the residual).
    pub fn storage_bytes(&self) -> usize {
        match &self.store {
            Store::Dense { keys, .. } => self.kv_heads * self.capacity * 2 * self.head_dim * keys.dtype().size(),
            Store::Quant(q) => q.bytes(),
            Store::Latent(l) => l.bytes(self.capacity),
        }
    }

    /// Bytes of the live entries' data.
    pub fn occupied_bytes(&self) -> usize {
        match &self.store {
            Store::Dense { .. } => self.lens.iter().sum::<usize>() * self.entry_bytes(),
            Store::Quant(q) => q.occupied_bytes(&self.lens, self.head_dim),
            Store::Latent(l) => l.occupied_bytes(&self.lens),
        }
    }

    /// Occupied slots per KV head.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// The largest per-head length: attention reads slots `0..max_len()`.
    pub fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    /// Source positions of head `head`'s occupied slots, in slot order.
    pub fn head_positions(&self, head: usize) -> &[u32] {
        let start = head * self.capacity;
        &self.positions[start..start + self.lens[head]]
    }

    /// Source positions of every slot, `[kv_heads * capacity]`, [`EMPTY_SLOT`] when free.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// Full f32 storage tensors `([kv_heads, capacity, head_dim], [kv_heads, capacity, head_dim])`
    /// for kernels that bind the cache's buffers; `None` when the layer stores another type
    /// (read [`LayerKv::view`] or [`LayerKv::dense`] then).
    pub fn storage(&self) -> Option<(&Tensor<3>, &Tensor<3>)> {
        match &self.store {
            Store::Dense { keys, values } if keys.dtype() == DType::F32 => Some((keys, values)),
            _ => None,
        }
    }

    /// Mutable f32 storage, for kernels that rewrite the cache in place; the caller must follow
    /// up with [`LayerKv::set_metadata`]. `None` when the layer stores another type.
    pub fn storage_mut(&mut self) -> Option<(&mut Tensor<3>, &mut Tensor<3>)> {
        match &mut self.store {
            Store::Dense { keys, values } if keys.dtype() == DType::F32 => Some((keys, values)),
            _ => None,
        }
    }

    /// Every slot's keys and values as f32, `[kv_heads, capacity, head_dim]` each (dequantized
    /// when the layer is quantized; free slots hold anything).
    pub fn dense(&self) -> (Tensor<3>, Tensor<3>) {
        self.rows(self.capacity)
    }

    /// Keys and values of slots `0..max_len()` as f32: `[kv_heads, max_len, head_dim]` each.
    pub fn view(&self) -> (Tensor<3>, Tensor<3>) {
        self.rows(self.max_len())
    }

    /// Slots `0..n` as f32.
    fn rows(&self, n: usize) -> (Tensor<3>, Tensor<3>) {
        match &self.store {
            Store::Dense { keys, values } => {
                let (k, v) = (keys.clone().narrow(1, 0, n), values.clone().narrow(1, 0, n));
                if keys.dtype() == DType::F32 { (k, v) } else { (k.cast(FloatDType::F32), v.cast(FloatDType::F32)) }
            }
            Store::Quant(q) => {
                let (k, v) = q.dequantize(n);
                match &q.residual {
                    Some((rk, rv)) => {
                        (quant::overlay(k, rk, &q.sealed, &self.lens), quant::overlay(v, rv, &q.sealed, &self.lens))
                    }
                    None => (k, v),
                }
            }
            Store::Latent(l) => {
                let v = l.values.clone().narrow(1, 0, n);
                let v = if v.dtype() == DType::F32 { v } else { v.cast(FloatDType::F32) };
                (l.keys(n, &self.positions, self.capacity), v)
            }
        }
    }

    /// This layer with its keys stored as `layout`'s latents (values as they are): a dense f32
    /// or f16 layer whose heads share, within each group, their lengths and positions.
    pub fn with_latent_keys(&self, layout: &LatentLayout) -> Result<LayerKv> {
        if layout.kv_heads() != self.kv_heads || layout.head_dim() != self.head_dim {
            return Err(CacheError::Geometry(format!(
                "latent keys for {} KV heads × {}, the layer has {} × {}",
                layout.kv_heads(),
                layout.head_dim(),
                self.kv_heads,
                self.head_dim
            )));
        }
        let Store::Dense { keys, values } = &self.store else {
            return Err(CacheError::Dtype(format!("latent keys store f32 or f16 entries, not {}", self.dtype())));
        };
        let latent = LatentKv::encode(layout, keys, values.clone(), &self.positions, self.capacity)?;
        if let Err(head) = latent.aligned(&self.lens, &self.positions, self.capacity) {
            return Err(CacheError::BadKeep {
                head,
                reason: "the heads of a latent group must share their slots".into(),
            });
        }
        Ok(LayerKv { store: Store::Latent(latent), ..self.clone_meta() })
    }

    /// The latent layout when the layer stores its keys as latents.
    pub fn latent_layout(&self) -> Option<&LatentLayout> {
        match &self.store {
            Store::Latent(l) => Some(&l.layout),
            _ => None,
        }
    }

    /// This layer with its entries stored as `dtype`: f32 and f16 as they are, q8 and q4 as KIVI
    /// (every occupied slot quantized; new slots wait in the full-precision residual until
    /// their key group fills). From a quantized layer the entries are dequantized first.
    pub fn converted(&self, dtype: KvDtype) -> Result<LayerKv> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        if let Store::Latent(l) = &self.store {
            let latent = match dtype {
                KvDtype::F32 => l.cast(FloatDType::F32),
                KvDtype::F16 if self.device().supports_dtype(DType::F16) => l.cast(FloatDType::F16),
                other => {
                    return Err(CacheError::Dtype(format!(
                        "latent keys store f32 or f16 entries (on a device with f16), not {other}"
                    )));
                }
            };
            return Ok(LayerKv { store: Store::Latent(latent), ..self.clone_meta() });
        }
        let (keys, values) = self.dense();
        let store = match dtype {
            KvDtype::F32 => Store::Dense { keys, values },
            KvDtype::F16 => {
                if !self.device().supports_dtype(DType::F16) {
                    return Err(CacheError::Dtype("this device does not store f16 tensors (use q8 or q4)".into()));
                }
                Store::Dense { keys: keys.cast(FloatDType::F16), values: values.cast(FloatDType::F16) }
            }
            KvDtype::Q8 | KvDtype::Q4 => {
                let bits = dtype.bits().unwrap_or(8);
                Store::Quant(QuantKv::quantize(&keys, &values, &self.lens, bits)?)
            }
        };
        Ok(LayerKv { store, ..self.clone_meta() })
    }

    /// The metadata with an empty dense store in place (replaced by the caller).
    fn clone_meta(&self) -> LayerKv {
        let device = self.device();
        let empty = Tensor::<3>::zeros([1, 1, 1], &device);
        LayerKv {
            store: Store::Dense { keys: empty.clone(), values: empty },
            lens: self.lens.clone(),
            positions: self.positions.clone(),
            kv_heads: self.kv_heads,
            capacity: self.capacity,
            head_dim: self.head_dim,
        }
    }

    /// A quantized layer as a dense f32 one (same metadata).
    fn to_f32(&self) -> LayerKv {
        let (keys, values) = self.dense();
        LayerKv { store: Store::Dense { keys, values }, ..self.clone_meta() }
    }

    /// `dense` (f32) quantized to `bits` with slots `0..sealed[h]` in codes and the rest of the
    /// occupied slots in the residual.
    fn requantized(dense: LayerKv, sealed: Vec<usize>, bits: u32) -> Result<LayerKv> {
        let Store::Dense { keys, values } = &dense.store else {
            return Err(CacheError::Geometry("requantizing a layer that is not dense".into()));
        };
        let mut q = QuantKv::quantize(keys, values, &sealed, bits)?;
        if sealed.iter().zip(&dense.lens).any(|(s, l)| s < l) {
            q.residual = Some((quant::residual_of(keys, &sealed), quant::residual_of(values, &sealed)));
        }
        Ok(LayerKv { store: Store::Quant(q), ..dense.clone_meta() })
    }

    /// Runs `op` on this layer as f32 and stores the result back in this layer's type, with
    /// each head's slots sealed up to its last complete key group (or `sealed` when given).
    fn through_f32<T>(&mut self, sealed: Option<Vec<usize>>, op: impl FnOnce(&mut LayerKv) -> Result<T>) -> Result<T> {
        let dtype = self.dtype();
        let mut dense = self.to_f32();
        let out = op(&mut dense)?;
        if let Some(layout) = self.latent_layout().cloned() {
            *self = dense.converted(dtype)?.with_latent_keys(&layout)?;
            return Ok(out);
        }
        *self = match dtype.bits() {
            Some(bits) => {
                let sealed = sealed.unwrap_or_else(|| dense.lens.iter().map(|&l| l / KEY_GROUP * KEY_GROUP).collect());
                Self::requantized(dense, sealed, bits)?
            }
            None => dense.converted(dtype)?,
        };
        Ok(out)
    }

    /// Appends `n` tokens to every head. `keys`/`values`: `[kv_heads, n, head_dim]`;
    /// `positions`: the `n` source positions. Heads of different lengths each append at their
    /// own end. Writes in place into the preallocated storage.
    pub fn append(&mut self, layer: usize, keys: Tensor<3>, values: Tensor<3>, positions: &[u32]) -> Result<()> {
        let n = positions.len();
        let expected = vec![self.kv_heads, n, self.head_dim];
        for (what, t) in [("keys", &keys), ("values", &values)] {
            let got = t.dims().to_vec();
            if got != expected {
                return Err(CacheError::ShapeMismatch { what, expected: expected.clone(), got });
            }
        }
        for (head, &len) in self.lens.iter().enumerate() {
            if len + n > self.capacity {
                return Err(CacheError::Full { layer, head, len, capacity: self.capacity, requested: n });
            }
        }
        if n == 0 {
            return Ok(());
        }
        if let Store::Quant(q) = &self.store {
            // Into the residual unless a head completes a key group: then through f32, sealing
            // every complete group.
            let crosses = self.lens.iter().any(|&l| (l + n) / KEY_GROUP > l / KEY_GROUP);
            if crosses {
                return self.through_f32(None, |d| d.append(layer, keys, values, positions));
            }
            let starts: Vec<usize> = self.lens.iter().zip(&q.sealed).map(|(l, s)| l - s).collect();
            self.write_residual(&starts, keys, values)?;
        } else if let Store::Latent(l) = &mut self.store {
            l.write(&self.lens, &keys, values, positions)?;
        } else {
            let starts: Vec<usize> = self.lens.clone();
            self.write_rows(&starts, keys, values)?;
        }
        for h in 0..self.kv_heads {
            let at = h * self.capacity + self.lens[h];
            self.positions[at..at + n].copy_from_slice(positions);
            self.lens[h] += n;
        }
        Ok(())
    }

    /// Writes rows into the residual of a quantized layer at `starts[h]` (allocating it).
    fn write_residual(&mut self, starts: &[usize], keys: Tensor<3>, values: Tensor<3>) -> Result<()> {
        let Store::Quant(q) = &mut self.store else {
            return Err(CacheError::Geometry("the layer has no residual".into()));
        };
        let (mut rk, mut rv) = q.residual.take().unwrap_or_else(|| {
            let zeros = Tensor::<3>::zeros([self.kv_heads, KEY_GROUP, self.head_dim], &keys.device());
            (zeros.clone(), zeros)
        });
        let done = write_rows_into(&mut rk, &mut rv, starts, keys, values);
        q.residual = Some((rk, rv));
        done
    }

    /// A new layer of `capacity` slots per head holding, for each head `h`, the slots
    /// `slots[h]` of this one (in that order) at slots `0..slots[h].len()`: the kept entries of
    /// an eviction, gathered into smaller storage. This layer is left as it is, so one prefill
    /// can be compressed many ways. The new layer stores the same type as this one.
    pub fn gather(&self, slots: &[Vec<u32>], capacity: usize) -> Result<LayerKv> {
        if slots.len() != self.kv_heads {
            return Err(CacheError::ShapeMismatch {
                what: "kept slots per head",
                expected: vec![self.kv_heads],
                got: vec![slots.len()],
            });
        }
        if capacity == 0 {
            return Err(CacheError::Geometry("a layer needs at least one slot".into()));
        }
        if let Store::Quant(q) = &self.store {
            let out = self.to_f32().gather(slots, capacity)?;
            let sealed = out.lens.iter().map(|&l| l / KEY_GROUP * KEY_GROUP).collect();
            return Self::requantized(out, sealed, q.bits);
        }
        let mut lens = Vec::with_capacity(self.kv_heads);
        let mut head_positions = Vec::with_capacity(self.kv_heads);
        let mut index = Vec::with_capacity(self.kv_heads * capacity);
        for (h, kept) in slots.iter().enumerate() {
            if kept.len() > capacity {
                return Err(CacheError::BadKeep {
                    head: h,
                    reason: format!("{} slots kept, capacity {capacity}", kept.len()),
                });
            }
            let mut pos = Vec::with_capacity(kept.len());
            for &s in kept {
                if s as usize >= self.lens[h] {
                    return Err(CacheError::BadKeep {
                        head: h,
                        reason: format!("slot {s} is not occupied (length {})", self.lens[h]),
                    });
                }
                pos.push(self.positions[h * self.capacity + s as usize]);
                index.push(s as i32);
            }
            index.extend(std::iter::repeat_n(0, capacity - kept.len()));
            lens.push(kept.len());
            head_positions.push(pos);
        }
        if let Store::Latent(l) = &self.store {
            let index: Vec<Vec<i32>> = index.chunks(capacity).map(<[i32]>::to_vec).collect();
            for g in l.layout.groups() {
                if let Some(&h) = g.heads().iter().find(|&&h| index[h] != index[g.heads()[0]]) {
                    return Err(CacheError::BadKeep {
                        head: h,
                        reason: "the heads of a latent group must keep the same slots".into(),
                    });
                }
            }
            let mut out = LayerKv {
                store: Store::Latent(l.gather(&index, capacity)),
                lens: vec![0; self.kv_heads],
                positions: vec![EMPTY_SLOT; self.kv_heads * capacity],
                kv_heads: self.kv_heads,
                capacity,
                head_dim: self.head_dim,
            };
            out.set_metadata(lens, head_positions)?;
            return Ok(out);
        }
        let Store::Dense { keys, values } = &self.store else { unreachable!("other layers returned above") };
        let device = keys.device();
        let d = self.head_dim;
        let idx = Tensor::<1, Int>::from_data(TensorData::new(index, [self.kv_heads * capacity]), &device)
            .reshape([self.kv_heads, capacity, 1])
            .expand([self.kv_heads, capacity, d]);
        let mut out = LayerKv {
            store: Store::Dense { keys: keys.clone().gather(1, idx.clone()), values: values.clone().gather(1, idx) },
            lens: vec![0; self.kv_heads],
            positions: vec![EMPTY_SLOT; self.kv_heads * capacity],
            kv_heads: self.kv_heads,
            capacity,
            head_dim: d,
        };
        out.set_metadata(lens, head_positions)?;
        Ok(out)
    }

    /// Keeps, for each head `h`, the slots `slots[h]` (strictly ascending) and moves them to the
    /// head's first slots in order, without changing the capacity. On wgpu (f32 storage) this is
    /// the in-place compaction kernel (no new storage); elsewhere a gather into storage of the
    /// same size.
    pub fn compact(&mut self, slots: &[Vec<u32>]) -> Result<()> {
        for (h, list) in slots.iter().enumerate() {
            if list.windows(2).any(|w| w[0] >= w[1]) {
                return Err(CacheError::BadKeep { head: h, reason: "kept slots must be strictly ascending".into() });
            }
        }
        let in_place = self.storage().is_some_and(|(k, _)| kvslice_kernels::buffer_id(k).is_some());
        if !in_place {
            *self = self.gather(slots, self.capacity)?;
            return Ok(());
        }
        if slots.len() != self.kv_heads {
            return Err(CacheError::ShapeMismatch {
                what: "kept slots per head",
                expected: vec![self.kv_heads],
                got: vec![slots.len()],
            });
        }
        let device = self.device();
        let pos: Vec<i32> = self.positions.iter().map(|&p| if p == EMPTY_SLOT { -1 } else { p as i32 }).collect();
        let mut positions = Tensor::<1, Int>::from_data(TensorData::new(pos, [self.kv_heads * self.capacity]), &device)
            .reshape([self.kv_heads, self.capacity]);
        let lens: Vec<u32> = self.lens.iter().map(|&l| l as u32).collect();
        let new_positions: Vec<Vec<u32>> = slots
            .iter()
            .enumerate()
            .map(|(h, list)| {
                list.iter()
                    .map(|&s| {
                        self.head_positions(h).get(s as usize).copied().ok_or_else(|| CacheError::BadKeep {
                            head: h,
                            reason: format!("slot {s} is not occupied (length {})", self.lens[h]),
                        })
                    })
                    .collect()
            })
            .collect::<Result<_>>()?;
        let Store::Dense { keys, values } = &mut self.store else { unreachable!("f32 storage checked above") };
        let cache = kvslice_kernels::CacheTensors { keys, values, positions: &mut positions };
        let counts = kvslice_kernels::compact_in_place_host(cache, slots, &lens)
            .map_err(|e| CacheError::Kernel(e.to_string()))?;
        self.set_metadata(counts.iter().map(|&c| c as usize).collect(), new_positions)
    }

    /// Writes one token into slot `slots[h]` of every head `h` (slot reuse: the slot is either
    /// the head's first free one or an occupied one whose entry is evicted). `keys`/`values`:
    /// `[kv_heads, 1, head_dim]`.
    pub fn write_slots(&mut self, slots: &[usize], keys: Tensor<3>, values: Tensor<3>, position: u32) -> Result<()> {
        let expected = vec![self.kv_heads, 1, self.head_dim];
        for (what, t) in [("keys", &keys), ("values", &values)] {
            let got = t.dims().to_vec();
            if got != expected {
                return Err(CacheError::ShapeMismatch { what, expected: expected.clone(), got });
            }
        }
        if slots.len() != self.kv_heads {
            return Err(CacheError::ShapeMismatch {
                what: "slots per head",
                expected: vec![self.kv_heads],
                got: vec![slots.len()],
            });
        }
        for (h, &s) in slots.iter().enumerate() {
            if s > self.lens[h] || s >= self.capacity {
                return Err(CacheError::BadKeep {
                    head: h,
                    reason: format!("slot {s} is neither occupied nor the next free one (length {})", self.lens[h]),
                });
            }
            let occupied = &self.positions[h * self.capacity..h * self.capacity + self.lens[h]];
            if occupied.iter().enumerate().any(|(i, &p)| p == position && i != s) {
                return Err(CacheError::BadKeep { head: h, reason: format!("position {position} already cached") });
            }
        }
        if let Store::Quant(q) = &self.store {
            let in_residual = slots.iter().zip(&q.sealed).all(|(&s, &sealed)| s >= sealed);
            let completes = slots.iter().zip(&self.lens).any(|(&s, &l)| s == l && (l + 1).is_multiple_of(KEY_GROUP));
            if !in_residual || completes {
                // An evicted entry in a sealed group (its group is requantized with the new
                // row), or a group completed (sealed).
                let mut sealed = q.sealed.clone();
                for (h, (&s, &l)) in slots.iter().zip(&self.lens).enumerate() {
                    if s == l && (l + 1).is_multiple_of(KEY_GROUP) {
                        sealed[h] = l + 1;
                    }
                }
                return self.through_f32(Some(sealed), |d| d.write_slots(slots, keys, values, position));
            }
            let starts: Vec<usize> = slots.iter().zip(&q.sealed).map(|(s, sealed)| s - sealed).collect();
            self.write_residual(&starts, keys, values)?;
        } else if let Store::Latent(l) = &mut self.store {
            l.write(slots, &keys, values, &[position])?;
        } else {
            self.write_rows(slots, keys, values)?;
        }
        for (h, &s) in slots.iter().enumerate() {
            self.positions[h * self.capacity + s] = position;
            if s == self.lens[h] {
                self.lens[h] += 1;
            }
        }
        Ok(())
    }

    /// Writes `[kv_heads, n, head_dim]` rows into slots `starts[h] .. starts[h] + n` of every
    /// head of a dense layer (bounds checked by the callers); the metadata is the callers'.
    fn write_rows(&mut self, starts: &[usize], keys: Tensor<3>, values: Tensor<3>) -> Result<()> {
        match &mut self.store {
            Store::Dense { keys: k, values: v } => write_rows_into(k, v, starts, keys, values),
            Store::Quant(_) | Store::Latent(_) => Err(CacheError::Geometry("row writes into encoded storage".into())),
        }
    }

    /// Replaces the metadata after a kernel rewrote the storage: `lens[h]` and, per head, the
    /// source positions of slots `0..lens[h]`.
    pub fn set_metadata(&mut self, lens: Vec<usize>, head_positions: Vec<Vec<u32>>) -> Result<()> {
        if lens.len() != self.kv_heads || head_positions.len() != self.kv_heads {
            return Err(CacheError::ShapeMismatch {
                what: "per-head metadata",
                expected: vec![self.kv_heads],
                got: vec![lens.len(), head_positions.len()],
            });
        }
        for (h, (len, pos)) in lens.iter().zip(&head_positions).enumerate() {
            if *len > self.capacity || pos.len() != *len {
                return Err(CacheError::BadKeep {
                    head: h,
                    reason: format!("length {len}, {} positions, capacity {}", pos.len(), self.capacity),
                });
            }
        }
        for (h, pos) in head_positions.iter().enumerate() {
            let mut sorted = pos.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) || sorted.last() == Some(&EMPTY_SLOT) {
                return Err(CacheError::BadKeep { head: h, reason: "duplicate or empty source position".into() });
            }
        }
        if let Store::Latent(l) = &self.store {
            let mut positions = vec![EMPTY_SLOT; self.kv_heads * self.capacity];
            for (h, pos) in head_positions.iter().enumerate() {
                positions[h * self.capacity..h * self.capacity + pos.len()].copy_from_slice(pos);
            }
            if let Err(head) = l.aligned(&lens, &positions, self.capacity) {
                return Err(CacheError::BadKeep {
                    head,
                    reason: "the heads of a latent group must share their slots".into(),
                });
            }
            l.layout.check_positions(&positions)?;
        }
        self.positions.fill(EMPTY_SLOT);
        for (h, pos) in head_positions.iter().enumerate() {
            let at = h * self.capacity;
            self.positions[at..at + pos.len()].copy_from_slice(pos);
        }
        self.lens = lens;
        debug_assert!(self.check().is_ok());
        Ok(())
    }

    /// Verifies the invariants listed in the crate docs.
    pub fn check(&self) -> Result<()> {
        for h in 0..self.kv_heads {
            let len = self.lens[h];
            if len > self.capacity {
                return Err(CacheError::BadKeep { head: h, reason: format!("length {len} past capacity") });
            }
            let slots = &self.positions[h * self.capacity..(h + 1) * self.capacity];
            if slots[..len].contains(&EMPTY_SLOT) || slots[len..].iter().any(|&p| p != EMPTY_SLOT) {
                return Err(CacheError::BadKeep { head: h, reason: "occupancy disagrees with length".into() });
            }
            let mut seen: Vec<u32> = slots[..len].to_vec();
            seen.sort_unstable();
            if seen.windows(2).any(|w| w[0] == w[1]) {
                return Err(CacheError::BadKeep { head: h, reason: "duplicate source position".into() });
            }
        }
        if let Store::Latent(l) = &self.store
            && let Err(head) = l.aligned(&self.lens, &self.positions, self.capacity)
        {
            return Err(CacheError::BadKeep {
                head,
                reason: "the heads of a latent group must share their slots".into(),
            });
        }
        Ok(())
    }
}

/// Writes `[kv_heads, n, head_dim]` rows into slots `starts[h] .. starts[h] + n` of every head
/// of `k`/`v` (bounds checked by the callers). On wgpu with f32 storage one dispatch of the
/// row-write kernel for the whole layer; elsewhere Burn's `slice_assign` (rows cast to the
/// storage's type), one per head unless every head starts at the same slot. Either way the
/// storage is updated in place when its owner holds the only reference (a clone of a layer
/// keeps its contents).
fn write_rows_into(
    k: &mut Tensor<3>,
    v: &mut Tensor<3>,
    starts: &[usize],
    keys: Tensor<3>,
    values: Tensor<3>,
) -> Result<()> {
    let [kv_heads, n, d] = keys.dims();
    if n == 0 {
        return Ok(());
    }
    if k.dtype() == DType::F32 && kvslice_kernels::buffer_id(k).is_some() {
        let at: Vec<u32> = starts.iter().map(|&s| s as u32).collect();
        match kvslice_kernels::write_rows(k, v, &keys, &values, &at) {
            Ok(()) => return Ok(()),
            // The kernel validates before dispatching: the storage is untouched.
            Err(e) => warn_once(&ROW_WRITE_FALLBACK, &format!("row-write kernel: {e}; using slice_assign")),
        }
    }
    let (keys, values) = if k.dtype() == keys.dtype() {
        (keys, values)
    } else {
        let dtype = FloatDType::from(k.dtype());
        (keys.cast(dtype), values.cast(dtype))
    };
    // Taken out of the owner so that `slice_assign` finds the storage unshared and writes in
    // place instead of copying the layer.
    let mut kk = std::mem::replace(k, keys.clone());
    let mut vv = std::mem::replace(v, values.clone());
    if starts.iter().all(|&s| s == starts[0]) {
        let range = [0..kv_heads, starts[0]..starts[0] + n, 0..d];
        kk = kk.slice_assign(range.clone(), keys);
        vv = vv.slice_assign(range, values);
    } else {
        for (h, &at) in starts.iter().enumerate() {
            let range = [h..h + 1, at..at + n, 0..d];
            kk = kk.slice_assign(range.clone(), keys.clone().narrow(0, h, 1));
            vv = vv.slice_assign(range, values.clone().narrow(0, h, 1));
        }
    }
    *k = kk;
    *v = vv;
    Ok(())
}

/// What the model needs from a cache: append a layer's new keys/values, then read the layer
/// back for attention. The model never knows about eviction.
pub trait KvStore {
    /// Appends `[kv_heads, n, head_dim]` keys and values at the given source positions.
    fn append(&mut self, layer: usize, keys: Tensor<3>, values: Tensor<3>, positions: &[u32]) -> Result<()>;
    /// The layer's contents.
    fn layer(&self, layer: usize) -> Result<&LayerKv>;
    /// Offered, once the layer's attention is queued, the queries that attended: after RoPE
    /// and before it, `[heads, n, head_dim]` each. Stores that gather statistics for eviction
    /// read them; the default ignores them.
    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, raw: &Tensor<3>) -> Result<()> {
        let _ = (layer, rotated, raw);
        Ok(())
    }

    /// Whether the store wants, with each attention of `layer`, the attention each slot
    /// received from the queries, summed over them ([`KvStore::offer_attention_sums`]): H2O's
    /// accumulated attention, which the attention computes in its own pass. False by default.
    fn wants_attention_sums(&self, layer: usize) -> bool {
        let _ = layer;
        false
    }

    /// Offered, when [`KvStore::wants_attention_sums`], right after `layer`'s attention: `[heads,
    /// slots]`, the attention of the queries just run summed over them, per slot of the layer
    /// (slots past a query's visible prefix get nothing from it).
    fn offer_attention_sums(&mut self, layer: usize, sums: Tensor<2>) -> Result<()> {
        let _ = (layer, sums);
        Ok(())
    }

    /// Whether a forward may feed its tokens in several passes (chunked prefill). The passes
    /// come layer by layer: every chunk of layer `l`, in order, each appended and then offered
    /// through [`KvStore::observe_queries`], before the first chunk of layer `l + 1`. False
    /// (the default) for a store that expects each layer's tokens in one call.
    fn takes_chunks(&self) -> bool {
        false
    }
}

impl<S: KvStore + ?Sized> KvStore for &mut S {
    fn append(&mut self, layer: usize, keys: Tensor<3>, values: Tensor<3>, positions: &[u32]) -> Result<()> {
        (**self).append(layer, keys, values, positions)
    }

    fn layer(&self, layer: usize) -> Result<&LayerKv> {
        (**self).layer(layer)
    }

    fn observe_queries(&mut self, layer: usize, rotated: &Tensor<3>, raw: &Tensor<3>) -> Result<()> {
        (**self).observe_queries(layer, rotated, raw)
    }

    fn takes_chunks(&self) -> bool {
        (**self).takes_chunks()
    }

    fn wants_attention_sums(&self, layer: usize) -> bool {
        (**self).wants_attention_sums(layer)
    }

    fn offer_attention_sums(&mut self, layer: usize, sums: Tensor<2>) -> Result<()> {
        (**self).offer_attention_sums(layer, sums)
    }
}

/// The KV cache of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    geometry: CacheGeometry,
    layers: Vec<LayerKv>,
}

impl KvCache {
    /// Preallocates `capacity` slots per KV head in every layer.
    pub fn new(geometry: CacheGeometry, device: &Device) -> Result<Self> {
        geometry.validate()?;
        let layers = (0..geometry.layers).map(|_| LayerKv::new(&geometry, device)).collect();
        Ok(Self { geometry, layers })
    }

    pub fn geometry(&self) -> CacheGeometry {
        self.geometry
    }

    /// A cache made of layers built elsewhere (e.g. by [`LayerKv::gather`]); the geometry's
    /// capacity is the largest layer's.
    pub fn from_layers(layers: Vec<LayerKv>) -> Result<Self> {
        let first = layers.first().ok_or_else(|| CacheError::Geometry("no layers".into()))?;
        let (kv_heads, head_dim) = (first.kv_heads, first.head_dim);
        if layers.iter().any(|l| l.kv_heads != kv_heads || l.head_dim != head_dim) {
            return Err(CacheError::Geometry("layers differ in KV heads or head dimension".into()));
        }
        let capacity = layers.iter().map(|l| l.capacity).max().unwrap_or(0);
        let geometry = CacheGeometry { layers: layers.len(), kv_heads, head_dim, capacity };
        Ok(Self { geometry, layers })
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[LayerKv] {
        &self.layers
    }

    /// Replaces layer `layer` (same KV heads and head dimension; any capacity).
    pub fn replace_layer(&mut self, layer: usize, kv: LayerKv) -> Result<()> {
        let g = self.geometry;
        if kv.kv_heads != g.kv_heads || kv.head_dim != g.head_dim {
            return Err(CacheError::Geometry("replacement layer differs in KV heads or head dimension".into()));
        }
        *self.layer_mut(layer)? = kv;
        self.geometry.capacity = self.layers.iter().map(|l| l.capacity).max().unwrap_or(0);
        Ok(())
    }

    /// Bytes of K/V storage held by every layer, occupied or not.
    pub fn storage_bytes(&self) -> usize {
        self.layers.iter().map(LayerKv::storage_bytes).sum()
    }

    /// Whether every head of every layer has room for `n` more tokens.
    pub fn has_room(&self, n: usize) -> bool {
        self.layers.iter().all(|l| l.lens.iter().all(|&len| len + n <= l.capacity))
    }

    /// Tokens held by the fullest head of any layer.
    pub fn max_len(&self) -> usize {
        self.layers.iter().map(LayerKv::max_len).max().unwrap_or(0)
    }

    /// Occupied slots summed over layers and heads.
    pub fn occupied_slots(&self) -> usize {
        self.layers.iter().map(|l| l.lens.iter().sum::<usize>()).sum()
    }

    /// Bytes of one cached entry (a key and a value), from the storage's element type.
    pub fn entry_bytes(&self) -> usize {
        self.layers.first().map_or(0, LayerKv::entry_bytes)
    }

    /// Bytes of K/V storage occupied by live entries.
    pub fn occupied_bytes(&self) -> usize {
        self.layers.iter().map(LayerKv::occupied_bytes).sum()
    }

    /// The element type of the stored entries (the first layer's; every layer converts together).
    pub fn dtype(&self) -> KvDtype {
        self.layers.first().map_or(KvDtype::F32, LayerKv::dtype)
    }

    /// Every layer's entries stored as `dtype` ([`LayerKv::converted`]), one layer at a time so
    /// that the old and new storage of only one layer exist at once.
    pub fn convert(&mut self, dtype: KvDtype) -> Result<()> {
        for layer in &mut self.layers {
            *layer = layer.converted(dtype)?;
        }
        Ok(())
    }

    /// Every layer's keys stored as its latents ([`LayerKv::with_latent_keys`]; `layouts`:
    /// one per layer), one layer at a time.
    pub fn with_latent_keys(&mut self, layouts: &[LatentLayout]) -> Result<()> {
        if layouts.len() != self.layers.len() {
            return Err(CacheError::Geometry(format!(
                "latent keys for {} layers, the cache has {}",
                layouts.len(),
                self.layers.len()
            )));
        }
        for (layer, layout) in self.layers.iter_mut().zip(layouts) {
            *layer = layer.with_latent_keys(layout)?;
        }
        Ok(())
    }

    pub fn layer_mut(&mut self, layer: usize) -> Result<&mut LayerKv> {
        let layers = self.layers.len();
        self.layers.get_mut(layer).ok_or(CacheError::LayerOutOfRange { layer, layers })
    }

    /// Per layer, each head's length: a mark to cut the cache back to ([`KvCache::truncate`]).
    pub fn lens_by_layer(&self) -> Vec<Vec<usize>> {
        self.layers.iter().map(|l| l.lens.clone()).collect()
    }

    /// Cuts every head back to the length `lens` gives it (from [`KvCache::lens_by_layer`]),
    /// forgetting the slots appended since: undoes appends, never evictions. Refuses a mark
    /// of another shape or one longer than a head is now.
    pub fn truncate(&mut self, lens: &[Vec<usize>]) -> Result<()> {
        let fits = lens.len() == self.layers.len()
            && self
                .layers
                .iter()
                .zip(lens)
                .all(|(l, to)| to.len() == l.kv_heads && l.lens.iter().zip(to).all(|(&now, &to)| to <= now));
        let splits_group = self.layers.iter().zip(lens).any(|(l, to)| {
            l.latent_layout().is_some_and(|layout| {
                layout.groups().iter().any(|g| g.heads().iter().any(|&h| to[h] != to[g.heads()[0]]))
            })
        });
        if !fits || splits_group {
            return Err(CacheError::BadKeep { head: 0, reason: "truncation mark does not fit the cache".into() });
        }
        for (l, to) in self.layers.iter_mut().zip(lens) {
            if let Store::Quant(q) = &l.store
                && q.sealed.iter().zip(to).any(|(&sealed, &len)| len < sealed)
            {
                // a sealed slot is forgotten: back through f32, sealing complete groups
                l.through_f32(None, |d| {
                    truncate_layer(d, to);
                    Ok(())
                })?;
                continue;
            }
            truncate_layer(l, to);
        }
        Ok(())
    }

    /// Empties every head of every layer (storage is kept for reuse).
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            l.lens.fill(0);
            l.positions.fill(EMPTY_SLOT);
            if let Store::Quant(q) = &mut l.store {
                q.sealed.fill(0);
            }
        }
    }
}

/// Cuts each head of `l` back to `to[h]` slots.
fn truncate_layer(l: &mut LayerKv, to: &[usize]) {
    for (h, &len) in to.iter().enumerate() {
        let at = h * l.capacity;
        l.positions[at + len..at + l.lens[h]].fill(EMPTY_SLOT);
        l.lens[h] = len;
    }
}

impl KvStore for KvCache {
    fn append(&mut self, layer: usize, keys: Tensor<3>, values: Tensor<3>, positions: &[u32]) -> Result<()> {
        self.layer_mut(layer)?.append(layer, keys, values, positions)
    }

    fn layer(&self, layer: usize) -> Result<&LayerKv> {
        let layers = self.layers.len();
        self.layers.get(layer).ok_or(CacheError::LayerOutOfRange { layer, layers })
    }

    fn takes_chunks(&self) -> bool {
        true
    }
}
