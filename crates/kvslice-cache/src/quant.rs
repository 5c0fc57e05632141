//! KV quantization as KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
//! Cache", arXiv 2402.02750): keys quantized *per channel* over groups of [`KEY_GROUP`]
//! consecutive slots (key channels carry outliers that a per-token scale would spread over the
//! whole row), values *per token* over groups of up to [`VALUE_GROUP`] channels, both
//! asymmetric (a minimum and a step per group). The newest entries, those of a key group not yet
//! complete, stay at full precision in a residual of [`KEY_GROUP`] slots until the group fills.
//!
//! Storage on the device: codes packed into 32-bit words along the head dimension (4 codes of 8
//! bits or 8 of 4 bits per word), steps and minimums in f16 where the device stores f16 (f32
//! elsewhere, and wherever a value exceeds f16's range). Quantizing and dequantizing are tensor
//! operations on the cache's own device: no read-back.
//!
//! Requantizing rows that were dequantized from a group gives the same codes (the group's
//! minimum and maximum are reproduced exactly, every other row rounds back to its code), so the
//! layer operations that move rows (compaction, gathers, truncation) dequantize the layer, do
//! the f32 operation and quantize again without losing more than the first quantization did.

use burn::tensor::{Bool, DType, Device, FloatDType, Int, IntDType, Tensor, TensorData};

use crate::{CacheError, Result};

/// Slots per key group: each key channel has one step and minimum per group.
pub const KEY_GROUP: usize = 64;
/// Channels per value group (or the whole head dimension when smaller).
pub const VALUE_GROUP: usize = 64;

/// Element type of the cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    #[default]
    F32,
    F16,
    /// 8-bit codes, KIVI's layout.
    Q8,
    /// 4-bit codes, KIVI's layout.
    Q4,
}

impl KvDtype {
    /// Bits per code of a quantized type.
    pub fn bits(self) -> Option<u32> {
        match self {
            KvDtype::Q8 => Some(8),
            KvDtype::Q4 => Some(4),
            _ => None,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8 => "q8",
            KvDtype::Q4 => "q4",
        })
    }
}

impl std::str::FromStr for KvDtype {
    type Err = CacheError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "q8" | "int8" => Ok(KvDtype::Q8),
            "q4" | "int4" => Ok(KvDtype::Q4),
            other => Err(CacheError::Dtype(format!("unknown `{other}` (f32, f16, q8, q4)"))),
        }
    }
}

/// Channels per value group for a head dimension: [`VALUE_GROUP`] or the largest power of two
/// below it that divides `head_dim`.
pub fn value_group(head_dim: usize) -> usize {
    let mut g = VALUE_GROUP;
    while g > 1 && !head_dim.is_multiple_of(g) {
        g /= 2;
    }
    g
}

/// The quantized keys and values of one layer (see the module docs), and the full-precision
/// residual of the newest slots.
#[derive(Debug, Clone)]
pub(crate) struct QuantKv {
    pub bits: u32,
    /// `[kv_heads, capacity, head_dim · bits / 32]` packed codes (i32 words).
    pub k_codes: Tensor<3, Int>,
    pub v_codes: Tensor<3, Int>,
    /// `[kv_heads, ceil(capacity / KEY_GROUP), head_dim]`.
    pub k_step: Tensor<3>,
    pub k_min: Tensor<3>,
    /// `[kv_heads, capacity, head_dim / value_group]`.
    pub v_step: Tensor<3>,
    pub v_min: Tensor<3>,
    /// Per head, the slots `0..sealed[h]` held by the codes; slots `sealed[h]..len` are in the
    /// residual, at `slot - sealed[h]`.
    pub sealed: Vec<usize>,
    /// `[kv_heads, KEY_GROUP, head_dim]` f32 keys and values of the residual, allocated when a
    /// slot is first held there.
    pub residual: Option<(Tensor<3>, Tensor<3>)>,
}

/// `[1, 1, 1, per]` shifts of the codes in a word.
fn shifts(bits: u32, device: &Device) -> Tensor<4, Int> {
    let per = (32 / bits) as i64;
    Tensor::<1, Int>::arange(0..per, device).mul_scalar(bits as i64).reshape([1, 1, 1, per as usize])
}

/// Packs `[kv, n, d]` codes in `0..2^bits` into `[kv, n, d·bits/32]` i32 words, code `i` of a
/// word at bit `i·bits`. The top code is taken as signed (`c - 2^bits` when `c ≥ 2^(bits-1)`)
/// so that every word is an in-range i32 whatever the backend's integer width: the bit pattern
/// is the same.
fn pack(codes: Tensor<3, Int>, bits: u32) -> Tensor<3, Int> {
    let [kv, n, d] = codes.dims();
    let per = (32 / bits) as usize;
    let device = codes.device();
    let codes = codes.reshape([kv, n, d / per, per]);
    let lanes = Tensor::<1, Int>::arange(0..per as i64, &device).reshape([1, 1, 1, per]);
    let top = lanes.equal_elem(per as i64 - 1).expand([kv, n, d / per, per]);
    let big = codes.clone().greater_equal_elem(1i64 << (bits - 1)).bool_and(top);
    let signed = codes - big.int().mul_scalar(1i64 << bits);
    let words = signed.bitwise_left_shift(shifts(bits, &device).expand([kv, n, d / per, per])).sum_dim(3);
    words.reshape([kv, n, d / per]).cast(IntDType::I32)
}

/// `[kv, n, w]` words → `[kv, n, w · 32/bits]` codes as f32.
fn unpack(words: Tensor<3, Int>, bits: u32) -> Tensor<3> {
    let [kv, n, w] = words.dims();
    let per = (32 / bits) as usize;
    let device = words.device();
    let codes = words
        .unsqueeze_dim::<4>(3)
        .expand([kv, n, w, per])
        .bitwise_right_shift(shifts(bits, &device).expand([kv, n, w, per]))
        .bitwise_and_scalar((1i64 << bits) - 1);
    codes.reshape([kv, n, w * per]).float()
}

/// Rounds steps and minimums to their storage type: f16 where the device has it and every
/// value fits, else f32. Returns `(stored step, stored min, step as f32, min as f32)`.
fn store_pair(step: Tensor<3>, min: Tensor<3>) -> (Tensor<3>, Tensor<3>, Tensor<3>, Tensor<3>) {
    let device = step.device();
    let fits = |t: &Tensor<3>| {
        let m: f64 = t.clone().abs().max().into_scalar::<f32>() as f64;
        m.is_finite() && m < 65_000.0
    };
    if device.supports_dtype(DType::F16) && fits(&step) && fits(&min) {
        let (s, m) = (step.cast(FloatDType::F16), min.cast(FloatDType::F16));
        let (s32, m32) = (s.clone().cast(FloatDType::F32), m.clone().cast(FloatDType::F32));
        (s, m, s32, m32)
    } else {
        (step.clone(), min.clone(), step, min)
    }
}

/// `[kv, 1, 1]`-broadcastable per-head counts as an Int tensor.
fn per_head(counts: &[usize], device: &Device) -> Tensor<3, Int> {
    let v: Vec<i32> = counts.iter().map(|&c| c as i32).collect();
    Tensor::<1, Int>::from_data(TensorData::new(v, [counts.len()]), device).reshape([counts.len(), 1, 1])
}

/// `[kv, n, 1]` true where slot `s < counts[h]`.
fn below(counts: &[usize], n: usize, device: &Device) -> Tensor<3, Bool> {
    let kv = counts.len();
    let slots = Tensor::<1, Int>::arange(0..n as i64, device).reshape([1, n, 1]).expand([kv, n, 1]);
    slots.lower(per_head(counts, device).expand([kv, n, 1]))
}

impl QuantKv {
    /// Quantizes slots `0..sealed[h]` of each head of `keys`/`values` (`[kv, capacity, d]` f32);
    /// the other slots' codes are left meaningless. No residual.
    pub fn quantize(keys: &Tensor<3>, values: &Tensor<3>, sealed: &[usize], bits: u32) -> Result<Self> {
        let [kv, cap, d] = keys.dims();
        let per = (32 / bits) as usize;
        let vg = value_group(d);
        if !d.is_multiple_of(per) || vg < 4 {
            return Err(CacheError::Dtype(format!(
                "a head dimension of {d} cannot hold {bits}-bit codes ({per} per word, value groups of at least 4)"
            )));
        }
        let levels = ((1u32 << bits) - 1) as f64;
        let device = keys.device();
        let quantize = |x: Tensor<4>, lo: Tensor<4>, step: Tensor<4>| -> Tensor<4, Int> {
            let safe = step.clone().mask_fill(step.equal_elem(0.0), 1.0);
            x.sub(lo).div(safe).round().clamp(0.0, levels).int()
        };

        // keys: per channel over groups of KEY_GROUP slots, only sealed slots counted
        let groups = cap.div_ceil(KEY_GROUP);
        let padded = groups * KEY_GROUP;
        let k = if padded > cap {
            Tensor::cat(vec![keys.clone(), Tensor::zeros([kv, padded - cap, d], &device)], 1)
        } else {
            keys.clone()
        };
        let valid = below(sealed, padded, &device).expand([kv, padded, d]);
        let shape = [kv, groups, KEY_GROUP, d];
        let hi = k.clone().mask_fill(valid.clone().bool_not(), f32::NEG_INFINITY).reshape(shape).max_dim(2);
        let lo = k.clone().mask_fill(valid.bool_not(), f32::INFINITY).reshape(shape).min_dim(2);
        let empty = hi.clone().lower(lo.clone());
        let (hi, lo) = (hi.mask_fill(empty.clone(), 0.0), lo.mask_fill(empty, 0.0));
        let step = (hi - lo.clone()).div_scalar(levels);
        let (k_step, k_min, step, lo) = store_pair(step.reshape([kv, groups, d]), lo.reshape([kv, groups, d]));
        let codes = quantize(
            k.reshape(shape),
            lo.unsqueeze_dim::<4>(2).expand(shape),
            step.unsqueeze_dim::<4>(2).expand(shape),
        );
        let k_codes = pack(codes.reshape([kv, padded, d]).narrow(1, 0, cap), bits);

        // values: per token over groups of `vg` channels
        let vshape = [kv, cap, d / vg, vg];
        let v = values.clone().reshape(vshape);
        let hi = v.clone().max_dim(3);
        let lo = v.clone().min_dim(3);
        let step = (hi - lo.clone()).div_scalar(levels);
        let (v_step, v_min, step, lo) = store_pair(step.reshape([kv, cap, d / vg]), lo.reshape([kv, cap, d / vg]));
        let codes = quantize(v, lo.unsqueeze_dim::<4>(3).expand(vshape), step.unsqueeze_dim::<4>(3).expand(vshape));
        let v_codes = pack(codes.reshape([kv, cap, d]), bits);

        Ok(QuantKv { bits, k_codes, v_codes, k_step, k_min, v_step, v_min, sealed: sealed.to_vec(), residual: None })
    }

    /// Dequantized keys and values of slots `0..n`, `[kv, n, d]` f32 each (slots past a head's
    /// sealed count are meaningless).
    pub fn dequantize(&self, n: usize) -> (Tensor<3>, Tensor<3>) {
        let [kv, _, w] = self.k_codes.dims();
        let d = w * (32 / self.bits) as usize;
        let f32_of = |t: &Tensor<3>| t.clone().cast(FloatDType::F32);
        let groups = n.div_ceil(KEY_GROUP);
        let expand_groups = |t: Tensor<3>| {
            t.narrow(1, 0, groups)
                .unsqueeze_dim::<4>(2)
                .expand([kv, groups, KEY_GROUP, d])
                .reshape([kv, groups * KEY_GROUP, d])
                .narrow(1, 0, n)
        };
        let kc = unpack(self.k_codes.clone().narrow(1, 0, n), self.bits);
        let keys = kc * expand_groups(f32_of(&self.k_step)) + expand_groups(f32_of(&self.k_min));
        let vg = value_group(d);
        let vshape = [kv, n, d / vg, vg];
        let expand_channels = |t: Tensor<3>| t.narrow(1, 0, n).unsqueeze_dim::<4>(3).expand(vshape).reshape([kv, n, d]);
        let vc = unpack(self.v_codes.clone().narrow(1, 0, n), self.bits);
        let values = vc * expand_channels(f32_of(&self.v_step)) + expand_channels(f32_of(&self.v_min));
        (keys, values)
    }

    /// Bytes of every tensor this holds.
    pub fn bytes(&self) -> usize {
        let int = |t: &Tensor<3, Int>| t.shape().num_elements() * t.dtype().size();
        let float = |t: &Tensor<3>| t.shape().num_elements() * t.dtype().size();
        int(&self.k_codes)
            + int(&self.v_codes)
            + [&self.k_step, &self.k_min, &self.v_step, &self.v_min].into_iter().map(float).sum::<usize>()
            + self.residual.as_ref().map_or(0, |(k, v)| float(k) + float(v))
    }

    /// Bytes of live data: the sealed slots' codes and value steps, the key groups in use, the
    /// residual's occupied rows at f32.
    pub fn occupied_bytes(&self, lens: &[usize], head_dim: usize) -> usize {
        let code_row = head_dim * self.bits as usize / 8;
        let v_scales = 2 * (head_dim / value_group(head_dim)) * self.v_step.dtype().size();
        let k_group = 2 * head_dim * self.k_step.dtype().size();
        self.sealed
            .iter()
            .zip(lens)
            .map(|(&s, &len)| {
                s * (2 * code_row + v_scales) + s.div_ceil(KEY_GROUP) * k_group + (len - s) * 2 * head_dim * 4
            })
            .sum()
    }
}

/// Slots `sealed[h]..lens[h]` of each head of `dense` (`[kv, capacity, d]`), at rows
/// `0..lens[h] - sealed[h]` of a `[kv, KEY_GROUP, d]` residual.
pub(crate) fn residual_of(dense: &Tensor<3>, sealed: &[usize]) -> Tensor<3> {
    let [kv, cap, d] = dense.dims();
    let device = dense.device();
    let index: Vec<i32> =
        sealed.iter().flat_map(|&s| (0..KEY_GROUP).map(move |t| (s + t).min(cap - 1) as i32)).collect();
    let index = Tensor::<1, Int>::from_data(TensorData::new(index, [kv * KEY_GROUP]), &device)
        .reshape([kv, KEY_GROUP, 1])
        .expand([kv, KEY_GROUP, d]);
    dense.clone().gather(1, index)
}

/// `dense` (`[kv, n, d]`) with slots `sealed[h]..lens[h]` (clipped to `n`) replaced by the
/// residual's rows `0..`.
pub(crate) fn overlay(dense: Tensor<3>, residual: &Tensor<3>, sealed: &[usize], lens: &[usize]) -> Tensor<3> {
    let [kv, n, d] = dense.dims();
    let device = dense.device();
    let index: Vec<i32> =
        sealed.iter().flat_map(|&s| (0..n).map(move |slot| slot.saturating_sub(s).min(KEY_GROUP - 1) as i32)).collect();
    let index =
        Tensor::<1, Int>::from_data(TensorData::new(index, [kv * n]), &device).reshape([kv, n, 1]).expand([kv, n, d]);
    let rows = residual.clone().gather(1, index);
    let inside = below(lens, n, &device).bool_and(below(sealed, n, &device).bool_not()).expand([kv, n, d]);
    dense.mask_where(inside, rows)
}

/// The reference quantizer on the host, for tests: one group of values → (codes, step, min), the
/// step and minimum rounded through f16 when `half`.
pub fn quantize_group(x: &[f32], bits: u32, half: bool) -> (Vec<u32>, f32, f32) {
    let levels = ((1u32 << bits) - 1) as f32;
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let round = |v: f32| if half { burn::tensor::f16::from_f32(v).to_f32() } else { v };
    let (step, lo) = (round((hi - lo) / levels), round(lo));
    let safe = if step == 0.0 { 1.0 } else { step };
    let codes = x.iter().map(|&v| ((v - lo) / safe).round().clamp(0.0, levels) as u32).collect();
    (codes, step, lo)
}
