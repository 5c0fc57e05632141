//! GGUF metadata values.

/// One metadata value. Arrays are typed so that a hostile file cannot make the reader
/// allocate much more than the file's own size.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous metadata array.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetadataArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetadataValue {
    /// The value as a non-negative integer, for any integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetadataValue::U8(v) => Some(v.into()),
            MetadataValue::U16(v) => Some(v.into()),
            MetadataValue::U32(v) => Some(v.into()),
            MetadataValue::U64(v) => Some(v),
            MetadataValue::I8(v) => u64::try_from(v).ok(),
            MetadataValue::I16(v) => u64::try_from(v).ok(),
            MetadataValue::I32(v) => u64::try_from(v).ok(),
            MetadataValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, for any numeric type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            MetadataValue::I8(v) => Some(v.into()),
            MetadataValue::I16(v) => Some(v.into()),
            MetadataValue::I32(v) => Some(v.into()),
            MetadataValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl MetadataArray {
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            MetadataArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The elements as `i64`, for any integer element type (u64 values above
    /// `i64::MAX` give `None`).
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            MetadataArray::U8(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I8(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::U16(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I16(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::U32(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I32(v) => v.iter().map(|&x| x.into()).collect(),
            MetadataArray::I64(v) => v.clone(),
            MetadataArray::U64(v) => v.iter().map(|&x| i64::try_from(x).ok()).collect::<Option<_>>()?,
            _ => return None,
        })
    }
}
