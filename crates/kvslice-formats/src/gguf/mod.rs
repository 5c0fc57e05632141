//! GGUF reader (versions 2 and 3, little endian).
//!
//! Layout: `"GGUF"`, `version: u32`, `tensor_count: u64`, `kv_count: u64`, the metadata
//! key/value pairs, the tensor infos (`name`, `n_dims: u32`, `dims: [u64; n_dims]`,
//! `type: u32`, `offset: u64`), padding to `general.alignment` (default 32), then the
//! tensor data, each tensor at `data_start + offset`.
//!
//! [`GgufFile::parse`] validates the whole header before it allocates anything whose
//! size comes from the file: every count and length is checked against the bytes that
//! remain, every shape's element count is overflow-checked, and every tensor's data
//! range must lie inside the file. Tensors are then dequantized one at a time with
//! [`GgufFile::tensor_f32`].

mod metadata;
mod types;

use std::collections::HashMap;

pub use metadata::{MetadataArray, MetadataValue};
pub use types::{GgmlType, dequantize_into};

use crate::error::{FormatError, Result};

/// Most dimensions a ggml tensor can have.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays of arrays accepted in metadata.
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor's description from the GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (contiguous) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        // Overflow-checked at parse time.
        self.dims.iter().product::<u64>() as usize
    }

    /// Row-major shape, outermost first (ggml dims reversed). For a 2-D weight this is
    /// `[out_features, in_features]`, the HF layout.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file over its bytes (`&[u8]`, `Vec<u8>`, a memory map, ...).
#[derive(Debug)]
pub struct GgufFile<B: AsRef<[u8]>> {
    bytes: B,
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let available = self.remaining() as u64;
        if n > available {
            return Err(FormatError::Truncated { what, offset: self.pos as u64, needed: n, available });
        }
        let n = n as usize;
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Read a u64 count of items each at least `min_item_bytes` long, and check that
    /// that many items can fit in the remaining bytes.
    fn count(&mut self, what: &'static str, min_item_bytes: u64) -> Result<usize> {
        let offset = self.pos as u64;
        let claimed = self.u64(what)?;
        let max = self.remaining() as u64 / min_item_bytes;
        if claimed > max {
            return Err(FormatError::CountTooLarge { what, claimed, max, offset });
        }
        Ok(claimed as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u64(what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::InvalidUtf8 { what, offset })
    }
}

/// Capacity to reserve for `count` entries of `T` read from `remaining` bytes: at most as
/// many as take `remaining` bytes in memory, so that a header claiming many entries in a
/// file that holds few never makes the parser reserve much more than the input.
fn prealloc<T>(count: usize, remaining: usize) -> usize {
    count.min(remaining / size_of::<T>().max(1))
}

/// As [`prealloc`] for a `HashMap<K, V>`, whose table rounds the capacity up to a power of
/// two of buckets at 7/8 load and keeps a control byte per bucket (at most about 2.3 times
/// `capacity * (size_of::<(K, V)>() + 1)` bytes).
fn prealloc_map<K, V>(count: usize, remaining: usize) -> usize {
    count.min(remaining / (4 * (size_of::<(K, V)>() + 1)))
}

// Metadata value type ids.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Smallest encoding of one value of a type (a string is at least its u64 length, an
/// array at least its type and count).
fn min_value_bytes(type_id: u32) -> Option<u64> {
    Some(match type_id {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 | T_STRING => 8,
        T_ARRAY => 12,
        _ => return None,
    })
}

fn read_bool(c: &mut Cursor<'_>, key: &str) -> Result<bool> {
    match c.array::<1>("bool value")?[0] {
        0 => Ok(false),
        1 => Ok(true),
        v => {
            Err(FormatError::BadMetadata { key: key.to_string(), reason: format!("bool byte {v} is neither 0 nor 1") })
        }
    }
}

fn read_value(c: &mut Cursor<'_>, key: &str, type_id: u32, depth: usize) -> Result<MetadataValue> {
    Ok(match type_id {
        T_U8 => MetadataValue::U8(c.array::<1>("u8 value")?[0]),
        T_I8 => MetadataValue::I8(c.array::<1>("i8 value")?[0] as i8),
        T_U16 => MetadataValue::U16(u16::from_le_bytes(c.array("u16 value")?)),
        T_I16 => MetadataValue::I16(i16::from_le_bytes(c.array("i16 value")?)),
        T_U32 => MetadataValue::U32(c.u32("u32 value")?),
        T_I32 => MetadataValue::I32(i32::from_le_bytes(c.array("i32 value")?)),
        T_F32 => MetadataValue::F32(f32::from_le_bytes(c.array("f32 value")?)),
        T_BOOL => MetadataValue::Bool(read_bool(c, key)?),
        T_STRING => MetadataValue::String(c.string("string value")?),
        T_ARRAY => MetadataValue::Array(read_array(c, key, depth + 1)?),
        T_U64 => MetadataValue::U64(c.u64("u64 value")?),
        T_I64 => MetadataValue::I64(i64::from_le_bytes(c.array("i64 value")?)),
        T_F64 => MetadataValue::F64(f64::from_le_bytes(c.array("f64 value")?)),
        _ => {
            return Err(FormatError::UnknownValueType { key: key.to_string(), type_id });
        }
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetadataArray> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(FormatError::NestingTooDeep { key: key.to_string(), max_depth: MAX_ARRAY_DEPTH });
    }
    let elem = c.u32("array element type")?;
    let min =
        min_value_bytes(elem).ok_or_else(|| FormatError::UnknownValueType { key: key.to_string(), type_id: elem })?;
    // The count is bounded by the remaining bytes, so the vectors below are at most a
    // small multiple of the file size.
    let n = c.count("metadata array", min)?;
    macro_rules! fixed {
        ($variant:ident, $t:ty, $w:literal, $what:literal) => {{
            let raw = c.take(n as u64 * $w, $what)?;
            MetadataArray::$variant(raw.chunks_exact($w).map(|b| <$t>::from_le_bytes(b.try_into().unwrap())).collect())
        }};
    }
    Ok(match elem {
        T_U8 => MetadataArray::U8(c.take(n as u64, "u8 array")?.to_vec()),
        T_I8 => MetadataArray::I8(c.take(n as u64, "i8 array")?.iter().map(|&b| b as i8).collect()),
        T_U16 => fixed!(U16, u16, 2, "u16 array"),
        T_I16 => fixed!(I16, i16, 2, "i16 array"),
        T_U32 => fixed!(U32, u32, 4, "u32 array"),
        T_I32 => fixed!(I32, i32, 4, "i32 array"),
        T_F32 => fixed!(F32, f32, 4, "f32 array"),
        T_U64 => fixed!(U64, u64, 8, "u64 array"),
        T_I64 => fixed!(I64, i64, 8, "i64 array"),
        T_F64 => fixed!(F64, f64, 8, "f64 array"),
        T_BOOL => MetadataArray::Bool((0..n).map(|_| read_bool(c, key)).collect::<Result<_>>()?),
        T_STRING => MetadataArray::String((0..n).map(|_| c.string("string array element")).collect::<Result<_>>()?),
        T_ARRAY => MetadataArray::Array((0..n).map(|_| read_array(c, key, depth + 1)).collect::<Result<_>>()?),
        _ => unreachable!("min_value_bytes accepted the type"),
    })
}

impl<B: AsRef<[u8]>> GgufFile<B> {
    /// Parse and validate the header of a GGUF file held in `bytes`. No tensor data is
    /// read or copied.
    pub fn parse(bytes: B) -> Result<Self> {
        let data = bytes.as_ref();
        let mut c = Cursor { data, pos: 0 };
        let magic: [u8; 4] = c.array("magic")?;
        if &magic != b"GGUF" {
            return Err(FormatError::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(FormatError::UnsupportedVersion { version });
        }
        // A tensor info is at least: name length (8), n_dims (4), one dim (8), type (4),
        // offset (8). A metadata pair: key length (8), type (4), value (>= 1).
        let tensor_count = {
            let offset = c.pos as u64;
            let claimed = c.u64("tensor count")?;
            let max = c.remaining().saturating_sub(8) as u64 / 32;
            if claimed > max {
                return Err(FormatError::CountTooLarge { what: "tensor count", claimed, max, offset });
            }
            claimed as usize
        };
        let kv_count = c.count("metadata count", 13)?;

        // The counts are bounded by the remaining bytes over the smallest encoding of one
        // entry, but one parsed entry takes several times its smallest encoding in memory:
        // reserve no more than the input's size and let the collections grow as entries
        // are actually read.
        let mut metadata: Vec<(String, MetadataValue)> =
            Vec::with_capacity(prealloc::<(String, MetadataValue)>(kv_count, c.remaining()));
        let mut metadata_index: HashMap<String, usize> =
            HashMap::with_capacity(prealloc_map::<String, usize>(kv_count, c.remaining()));
        for _ in 0..kv_count {
            let key = c.string("metadata key")?;
            let type_id = c.u32("metadata value type")?;
            let value = read_value(&mut c, &key, type_id, 0)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(FormatError::DuplicateKey { key });
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let v = &metadata[i].1;
                let a = v.as_u64().ok_or_else(|| FormatError::BadMetadata {
                    key: "general.alignment".into(),
                    reason: format!("expected an unsigned integer, got {v:?}"),
                })?;
                if a == 0 || !a.is_power_of_two() {
                    return Err(FormatError::BadAlignment { alignment: a });
                }
                a
            }
        };

        if tensor_count as u64 > c.remaining() as u64 / 32 {
            return Err(FormatError::CountTooLarge {
                what: "tensor count",
                claimed: tensor_count as u64,
                max: c.remaining() as u64 / 32,
                offset: c.pos as u64,
            });
        }
        let mut tensors = Vec::with_capacity(prealloc::<GgufTensorInfo>(tensor_count, c.remaining()));
        let mut tensor_index = HashMap::with_capacity(prealloc_map::<String, usize>(tensor_count, c.remaining()));
        for _ in 0..tensor_count {
            let name = c.string("tensor name")?;
            let n_dims = c.u32("tensor dimension count")?;
            if n_dims == 0 || n_dims as usize > MAX_DIMS {
                return Err(FormatError::BadDimCount { tensor: name, n_dims, max: MAX_DIMS });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dimension")?);
            }
            let type_id = c.u32("tensor type")?;
            let offset = c.u64("tensor offset")?;
            let ggml_type = GgmlType::from_id(type_id)
                .ok_or_else(|| FormatError::UnknownGgmlType { tensor: name.clone(), type_id })?;
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| if d == 0 { None } else { acc.checked_mul(d) })
                .filter(|&n| usize::try_from(n).is_ok());
            let Some(n_elements) = n_elements else {
                return Err(FormatError::BadShape { tensor: name, dims });
            };
            let (block, block_bytes) = ggml_type.block_layout();
            if dims[0] % block != 0 {
                return Err(FormatError::BadRowLength {
                    tensor: name,
                    type_name: ggml_type.name(),
                    row: dims[0],
                    block,
                });
            }
            let Some(n_bytes) = (n_elements / block).checked_mul(block_bytes) else {
                return Err(FormatError::BadShape { tensor: name, dims });
            };
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(FormatError::DuplicateTensor { tensor: name });
            }
            tensors.push(GgufTensorInfo { name, dims, ggml_type, offset, n_bytes });
        }

        let pos = c.pos as u64;
        let data_start = pos.div_ceil(alignment).saturating_mul(alignment);
        let file_len = data.len() as u64;
        let data_len = file_len.saturating_sub(data_start);
        for t in &tensors {
            let end = t.offset.checked_add(t.n_bytes);
            let ok = data_start <= file_len && t.offset % alignment == 0 && end.is_some_and(|e| e <= data_len);
            if !ok {
                return Err(FormatError::DataOutOfBounds {
                    tensor: t.name.clone(),
                    start: t.offset,
                    end: end.unwrap_or(u64::MAX),
                    len: data_len,
                });
            }
        }
        // Each tensor's bytes are its own (llama.cpp requires them laid out one after the
        // other): a small file cannot stand for many tensors dequantized from the same bytes.
        let mut ranges: Vec<(u64, u64, usize)> = tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.n_bytes > 0)
            .map(|(i, t)| (t.offset, t.offset + t.n_bytes, i))
            .collect();
        ranges.sort_unstable();
        if let Some(w) = ranges.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(FormatError::TensorsOverlap {
                first: tensors[w[0].2].name.clone(),
                second: tensors[w[1].2].name.clone(),
                at: w[1].0,
            });
        }

        Ok(GgufFile { bytes, version, metadata, metadata_index, tensors, tensor_index, alignment, data_start })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.get(key).ok_or_else(|| FormatError::MissingKey { key: key.to_string() })?;
        v.as_str().ok_or_else(|| FormatError::BadMetadata {
            key: key.to_string(),
            reason: format!("expected a string, got {v:?}"),
        })
    }

    /// An optional unsigned integer value (any integer type).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| FormatError::BadMetadata {
                key: key.to_string(),
                reason: format!("expected a non-negative integer, got {v:?}"),
            }),
        }
    }

    /// An optional float value (any numeric type).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| FormatError::BadMetadata {
                key: key.to_string(),
                reason: format!("expected a number, got {v:?}"),
            }),
        }
    }

    /// An optional bool value.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| FormatError::BadMetadata {
                key: key.to_string(),
                reason: format!("expected a bool, got {v:?}"),
            }),
        }
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// One tensor's info by its GGUF name.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw (still quantized) bytes of a tensor.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        // In bounds: checked in `parse` for every tensor of this file.
        let start = (self.data_start + info.offset) as usize;
        &self.bytes.as_ref()[start..start + info.n_bytes as usize]
    }

    /// Dequantize one tensor to f32, in row-major order of [`GgufTensorInfo::shape`].
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name).ok_or_else(|| FormatError::MissingTensor { tensor: name.to_string() })?;
        let mut out = Vec::new();
        dequantize_into(&info.name, info.ggml_type, self.tensor_bytes(info), info.n_elements(), &mut out)?;
        Ok(out)
    }

    /// The underlying bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

/// Undo the row permutation that llama.cpp's converter (`convert_hf_to_gguf.py`,
/// `LlamaModel.permute`) applies to the Q and K projections of llama-architecture
/// models, so that RoPE can rotate interleaved pairs.
///
/// The converter views the `[n_head * head_dim, cols]` HF weight as
/// `[n_head, 2, head_dim / 2, cols]` and swaps the two middle axes, so the GGUF row
/// `h * head_dim + 2 * j + t` holds the HF row `h * head_dim + t * head_dim / 2 + j`
/// (`t` in {0, 1}, `j < head_dim / 2`). This function maps GGUF rows back to the HF
/// order. For K, `n_head` is the number of KV heads. A bias is the case `cols == 1`.
///
/// # Shapes
/// `data`: `[n_head * head_dim, cols]` row-major → same shape, HF row order.
pub fn unpermute_rope_rows(data: &[f32], n_head: usize, cols: usize) -> Result<Vec<f32>> {
    let bad = |reason: String| FormatError::BadMetadata { key: "attention.head_count".into(), reason };
    if n_head == 0 || cols == 0 || !data.len().is_multiple_of(cols) {
        return Err(bad(format!(
            "cannot unpermute {} values as {n_head} heads of rows with {cols} columns",
            data.len()
        )));
    }
    let rows = data.len() / cols;
    if !rows.is_multiple_of(2 * n_head) {
        return Err(bad(format!("{rows} rows do not split into {n_head} heads of even size")));
    }
    let head_dim = rows / n_head;
    let half = head_dim / 2;
    let mut out = vec![0.0f32; data.len()];
    for h in 0..n_head {
        for t in 0..2 {
            for j in 0..half {
                let hf_row = h * head_dim + t * half + j;
                let gguf_row = h * head_dim + 2 * j + t;
                out[hf_row * cols..(hf_row + 1) * cols].copy_from_slice(&data[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    Ok(out)
}
