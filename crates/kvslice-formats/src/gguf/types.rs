//! ggml tensor types and dequantization of the supported ones.
//!
//! Block layouts follow ggml's definitions (`ggml-common.h`), all little endian:
//!
//! | type | block | bytes | layout                                   | value                         |
//! |------|-------|-------|------------------------------------------|-------------------------------|
//! | Q8_0 | 32    | 34    | `d: f16, qs: [i8; 32]`                   | `d * qs[j]`                   |
//! | Q4_0 | 32    | 18    | `d: f16, qs: [u8; 16]`                   | `d * (nibble - 8)`            |
//! | Q4_1 | 32    | 20    | `d: f16, m: f16, qs: [u8; 16]`           | `d * nibble + m`              |
//!
//! In the 4-bit types, byte `j` holds element `j` in its low nibble and element `j + 16`
//! in its high nibble.

use half::{bf16, f16};

use crate::error::{FormatError, Result};

/// A ggml tensor type, as stored in a GGUF tensor info.
///
/// All types ggml defines are known (so that every tensor's byte size can be validated),
/// but only F32, F16, BF16, Q8_0, Q4_0 and Q4_1 can be dequantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl GgmlType {
    /// The type for a ggml type id, or `None` for ids ggml does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// (elements per block, bytes per block), as in ggml's type traits.
    pub fn block_layout(self) -> (u64, u64) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 40),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            IQ2_XXS => (256, 66),
            IQ2_XS => (256, 74),
            IQ3_XXS => (256, 98),
            IQ1_S => (256, 50),
            IQ4_NL => (32, 18),
            IQ3_S => (256, 110),
            IQ2_S => (256, 82),
            IQ4_XS => (256, 136),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            F64 => (1, 8),
            IQ1_M => (256, 56),
            BF16 => (1, 2),
            TQ1_0 => (256, 54),
            TQ2_0 => (256, 66),
            MXFP4 => (32, 17),
        }
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
        }
    }

    /// Whether [`dequantize`] accepts this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Dequantize `n_elements` values of type `ty` from `bytes` into `out` (appended).
///
/// `bytes` must hold exactly the tensor's data: `n_elements / block * block_bytes`
/// bytes. `tensor` only names the tensor in errors.
pub fn dequantize_into(tensor: &str, ty: GgmlType, bytes: &[u8], n_elements: usize, out: &mut Vec<f32>) -> Result<()> {
    if !ty.is_supported() {
        return Err(FormatError::UnsupportedGgmlType { tensor: tensor.to_string(), type_name: ty.name() });
    }
    let (block, block_bytes) = ty.block_layout();
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    let n_blocks = n_elements / block;
    let needed = n_blocks.checked_mul(block_bytes);
    if !n_elements.is_multiple_of(block) || needed != Some(bytes.len()) {
        return Err(FormatError::DataOutOfBounds {
            tensor: tensor.to_string(),
            start: 0,
            end: needed.unwrap_or(usize::MAX) as u64,
            len: bytes.len() as u64,
        });
    }
    out.reserve(n_elements);
    match ty {
        GgmlType::F32 => out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        GgmlType::F16 => {
            out.extend(bytes.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()))
        }
        GgmlType::BF16 => {
            out.extend(bytes.chunks_exact(2).map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()))
        }
        GgmlType::Q8_0 => {
            for b in bytes.chunks_exact(34) {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| d * f32::from(q as i8)));
            }
        }
        GgmlType::Q4_0 => {
            for b in bytes.chunks_exact(18) {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| d * f32::from((q & 0x0f) as i8 - 8)));
                out.extend(qs.iter().map(|&q| d * f32::from((q >> 4) as i8 - 8)));
            }
        }
        GgmlType::Q4_1 => {
            for b in bytes.chunks_exact(20) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| d * f32::from(q & 0x0f) + m));
                out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            // {d, (m,) qh: u32, qs: [u8; 16]}: value j takes bit j of qh as its fifth bit
            let (bb, at) = if ty == GgmlType::Q5_0 { (22, 2) } else { (24, 4) };
            for b in bytes.chunks_exact(bb) {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                let qs = &b[at + 4..bb];
                let q = |j: usize| {
                    let nibble = if j < 16 { qs[j] & 0x0f } else { qs[j - 16] >> 4 };
                    nibble | (((qh >> j) & 1) as u8) << 4
                };
                if ty == GgmlType::Q5_0 {
                    out.extend((0..32).map(|j| d * f32::from(q(j) as i8 - 16)));
                } else {
                    let m = f16_at(b, 2);
                    out.extend((0..32).map(|j| d * f32::from(q(j)) + m));
                }
            }
        }
        GgmlType::Q4_K => {
            for b in bytes.chunks_exact(144) {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, m) = k_scales(&b[4..16]);
                for (sub, chunk) in b[16..144].chunks_exact(32).enumerate() {
                    for half in 0..2 {
                        let i = 2 * sub + half;
                        let (ds, dm) = (d * f32::from(sc[i]), dmin * f32::from(m[i]));
                        out.extend(chunk.iter().map(|&q| ds * f32::from((q >> (4 * half)) & 0x0f) - dm));
                    }
                }
            }
        }
        GgmlType::Q5_K => {
            for b in bytes.chunks_exact(176) {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, m) = k_scales(&b[4..16]);
                let qh = &b[16..48];
                for (sub, chunk) in b[48..176].chunks_exact(32).enumerate() {
                    for half in 0..2 {
                        let i = 2 * sub + half;
                        let (ds, dm) = (d * f32::from(sc[i]), dmin * f32::from(m[i]));
                        out.extend(chunk.iter().zip(qh).map(|(&q, &h)| {
                            let q = ((q >> (4 * half)) & 0x0f) | (((h >> i) & 1) << 4);
                            ds * f32::from(q) - dm
                        }));
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for b in bytes.chunks_exact(210) {
                let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..64 * (half + 1)], &qh[32 * half..32 * (half + 1)]);
                    // groups of 32: low nibbles of ql[0..32] and ql[32..64], then their high
                    // nibbles; bits 2g..2g+2 of qh give group g its top two bits
                    for g in 0..4 {
                        let low = &ql[32 * (g % 2)..32 * (g % 2 + 1)];
                        for (l, (&q, &h)) in low.iter().zip(qh).enumerate() {
                            let q = ((q >> (4 * (g / 2))) & 0x0f) | (((h >> (2 * g)) & 3) << 4);
                            // one signed scale per 16 values of the block
                            let scale = scales[(128 * half + 32 * g + l) / 16] as i8;
                            out.push(d * f32::from(scale) * f32::from(q as i8 - 32));
                        }
                    }
                }
            }
        }
        _ => unreachable!("is_supported() checked above"),
    }
    Ok(())
}

/// The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K block's 12 scale bytes (ggml's
/// `get_scale_min_k4`): pairs 0–3 are the low 6 bits of bytes 0–3 and 4–7; pairs 4–7 take
/// their low 4 bits from the nibbles of bytes 8–11 and their top 2 bits from bytes 0–7.
fn k_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3f;
        m[j] = s[j + 4] & 0x3f;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
    }
    (sc, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    #[test]
    fn q4_1_hand_block() {
        // d = 0.5, m = -1.0; byte j = (j as low nibble) | ((15 - j) as high nibble)
        let mut b = Vec::new();
        b.extend(f16b(0.5));
        b.extend(f16b(-1.0));
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let mut out = Vec::new();
        dequantize_into("t", GgmlType::Q4_1, &b, 32, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * j as f32 - 1.0);
            assert_eq!(out[j + 16], 0.5 * (15 - j) as f32 - 1.0);
        }
    }

    #[test]
    fn q4_k_hand_block_unpacks_its_six_bit_scales() {
        // scales 0–3 and mins 0–3 in the low 6 bits of bytes 0–7; scales and mins 4–7 from
        // the nibbles of bytes 8–11 with their top two bits from bytes 0–3 and 4–7
        let scales = [1 | (1 << 6), 2, 3, 4, 5 | (2 << 6), 6, 7, 8, 0x21, 0x43, 0x65, 0x87];
        let sc = [1.0f32, 2.0, 3.0, 4.0, 1.0 + 16.0, 3.0, 5.0, 7.0];
        let m = [5.0f32, 6.0, 7.0, 8.0, 2.0 + 32.0, 4.0, 6.0, 8.0];
        let mut b = Vec::new();
        b.extend(f16b(1.0));
        b.extend(f16b(0.5));
        b.extend(scales);
        // every byte: low nibble 1 (even sub-blocks), high nibble 3 (odd ones)
        b.extend([0x31u8; 128]);
        let mut out = Vec::new();
        dequantize_into("t", GgmlType::Q4_K, &b, 256, &mut out).unwrap();
        for i in 0..8 {
            let q = if i % 2 == 0 { 1.0 } else { 3.0 };
            let want = sc[i] * q - 0.5 * m[i];
            assert!(out[32 * i..32 * (i + 1)].iter().all(|&x| x == want), "sub-block {i}: {want}");
        }
    }

    #[test]
    fn q6_k_hand_block() {
        // ql: low nibble 5, high nibble 2; qh: groups 0..3 get top bits 0, 1, 2, 3
        // (0b11_10_01_00); scales 1..=16; d = 0.25
        let mut b = vec![0x25u8; 128];
        b.extend([0b1110_0100u8; 64]);
        b.extend(1u8..=16);
        b.extend(f16b(0.25));
        let mut out = Vec::new();
        dequantize_into("t", GgmlType::Q6_K, &b, 256, &mut out).unwrap();
        for (v, &x) in out.iter().enumerate() {
            let g = (v % 128) / 32;
            let low = if g < 2 { 5 } else { 2 };
            let q = (low | (g << 4)) as f32 - 32.0;
            assert_eq!(x, 0.25 * (v / 16 + 1) as f32 * q, "value {v}");
        }
    }

    #[test]
    fn q4_0_and_q8_0_hand_blocks() {
        let mut b = Vec::new();
        b.extend(f16b(2.0));
        for j in 0..16u8 {
            b.push(j | (j << 4));
        }
        let mut out = Vec::new();
        dequantize_into("t", GgmlType::Q4_0, &b, 32, &mut out).unwrap();
        assert_eq!(out[0], -16.0);
        assert_eq!(out[15], 14.0);
        assert_eq!(out[16], -16.0);
        assert_eq!(out[31], 14.0);

        let mut b = Vec::new();
        b.extend(f16b(0.25));
        for j in 0..32i8 {
            b.push((j * 4 - 64) as u8);
        }
        out.clear();
        dequantize_into("t", GgmlType::Q8_0, &b, 32, &mut out).unwrap();
        for (j, &x) in out.iter().enumerate() {
            assert_eq!(x, 0.25 * (j as f32 * 4.0 - 64.0));
        }
    }

    #[test]
    fn wrong_length_and_unsupported_type_are_errors() {
        let mut out = Vec::new();
        assert!(matches!(
            dequantize_into("t", GgmlType::Q8_0, &[0u8; 33], 32, &mut out),
            Err(FormatError::DataOutOfBounds { .. })
        ));
        match dequantize_into("w", GgmlType::Q3_K, &[0u8; 110], 256, &mut out) {
            Err(FormatError::UnsupportedGgmlType { tensor, type_name }) => {
                assert_eq!(tensor, "w");
                assert_eq!(type_name, "Q3_K");
            }
            other => panic!("{other:?}"),
        }
    }
}
