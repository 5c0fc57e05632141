//! Hostile GGUF input: every corruption is a typed error, never a panic, and the reader
//! never makes an allocation much larger than the input before validating it.
#![allow(unsafe_code)] // a counting global allocator: the test measures what the parser reserves

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::*;
use kvslice_formats::FormatError;
use kvslice_formats::gguf::GgufFile;
use proptest::prelude::*;

/// Tracks the largest single allocation made by the current thread.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Parse, and read every tensor if the header is accepted; return the parse error and
/// the largest allocation made meanwhile.
fn parse_all(bytes: &[u8]) -> (Option<FormatError>, usize) {
    LARGEST.with(|m| m.set(0));
    let err = match GgufFile::parse(bytes) {
        Err(e) => Some(e),
        Ok(f) => {
            for t in f.tensors() {
                let _ = f.tensor_f32(&t.name);
            }
            None
        }
    };
    (err, LARGEST.with(|m| m.get()))
}

/// Allocation bound: a small multiple of the input (dequantized f32 output is at most
/// 8x the bytes of Q4 data; typed arrays and strings stay within 3x) plus a constant.
fn bound(len: usize) -> usize {
    16 * len + 64 * 1024
}

fn quant_bytes() -> Vec<u8> {
    std::fs::read(golden("gguf-quant/quant.gguf")).unwrap()
}

fn expect_err(bytes: &[u8]) -> FormatError {
    let (err, largest) = parse_all(bytes);
    assert!(largest <= bound(bytes.len()), "allocated {largest} bytes for a {}-byte input", bytes.len());
    err.expect("corrupt input was accepted")
}

#[test]
fn truncated_at_every_cut_point() {
    let b = quant_bytes();
    let f = GgufFile::parse(&b[..]).unwrap();
    let data_end = f.tensors().iter().map(|t| f.data_start() + t.offset + t.n_bytes).max().unwrap() as usize;
    // The tracker sees the reader's allocations: the whole file yields an f32 tensor of
    // 200 values (800 bytes).
    let (err, largest) = parse_all(&b);
    assert!(err.is_none() && largest >= 800, "{err:?} {largest}");
    for cut in 0..b.len() {
        let (err, largest) = parse_all(&b[..cut]);
        assert!(largest <= bound(b.len()), "cut {cut}: allocated {largest}");
        if cut < data_end {
            assert!(
                matches!(
                    err,
                    Some(
                        FormatError::Truncated { .. }
                            | FormatError::CountTooLarge { .. }
                            | FormatError::DataOutOfBounds { .. }
                    )
                ),
                "cut {cut}: {err:?}"
            );
        } else {
            assert!(err.is_none(), "cut {cut} keeps all tensor data: {err:?}");
        }
    }
}

#[test]
fn bad_magic() {
    let mut b = quant_bytes();
    b[0] = b'X';
    assert!(matches!(expect_err(&b), FormatError::BadMagic { found } if &found == b"XGUF"));
}

/// Header with given counts and raw body.
fn header(tensors: u64, kvs: u64, body: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(tensors.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    b.extend(body);
    b
}

#[test]
fn absurd_counts() {
    let body = vec![0u8; 256];
    for t in [u64::MAX, 1 << 40, 9] {
        assert!(
            matches!(expect_err(&header(t, 0, &body)), FormatError::CountTooLarge { what: "tensor count", .. }),
            "{t}"
        );
    }
    for k in [u64::MAX, 1 << 40, 20] {
        assert!(
            matches!(expect_err(&header(0, k, &body)), FormatError::CountTooLarge { what: "metadata count", .. }),
            "{k}"
        );
    }
}

/// Counts as large as the remaining bytes allow, over a body that holds one entry: the
/// parser fails on the second entry, and must not have reserved memory for every claimed
/// entry first (a parsed entry takes several times its smallest encoding in memory).
#[test]
fn claimed_counts_reserve_no_more_than_the_input() {
    // Zeros read as metadata pairs of 13 bytes (empty key, type u8, value 0), so the second
    // pair repeats the first key; as tensor infos, the first has an empty name and 0 dims.
    let body = vec![0u8; 1 << 20];
    let b = header(0, (body.len() / 13) as u64, &body);
    let (err, largest) = parse_all(&b);
    assert!(matches!(&err, Some(FormatError::DuplicateKey { key }) if key.is_empty()), "{err:?}");
    assert!(
        largest <= b.len(),
        "allocated {largest} bytes for a {}-byte input claiming {} pairs",
        b.len(),
        body.len() / 13
    );
    let b = header((body.len() / 32) as u64, 0, &body);
    let (err, largest) = parse_all(&b);
    assert!(matches!(&err, Some(FormatError::BadDimCount { n_dims: 0, .. })), "{err:?}");
    assert!(
        largest <= b.len(),
        "allocated {largest} bytes for a {}-byte input claiming {} tensors",
        b.len(),
        body.len() / 32
    );
}

#[test]
fn string_lengths_past_the_end() {
    // A key whose length exceeds the file.
    let mut body = Vec::new();
    body.extend(u64::MAX.to_le_bytes());
    body.extend([0u8; 40]);
    assert!(matches!(expect_err(&header(0, 1, &body)), FormatError::Truncated { what: "metadata key", .. }));
    // A string value whose length exceeds the file.
    let mut body = Vec::new();
    put_str(&mut body, "k");
    body.extend(8u32.to_le_bytes());
    body.extend((1u64 << 50).to_le_bytes());
    body.extend([b'a'; 40]);
    assert!(matches!(expect_err(&header(0, 1, &body)), FormatError::Truncated { what: "string value", .. }));
    // An array count that cannot fit.
    for elem in [0u32, 6, 8, 9] {
        let b =
            build_gguf(&[("k", V::Raw(9, [elem.to_le_bytes().as_slice(), &(1u64 << 40).to_le_bytes()].concat()))], &[]);
        assert!(matches!(expect_err(&b), FormatError::CountTooLarge { what: "metadata array", .. }), "elem {elem}");
    }
}

#[test]
fn bad_metadata_values() {
    let b = build_gguf(&[("k", V::Raw(13, vec![0; 8]))], &[]);
    assert!(matches!(expect_err(&b), FormatError::UnknownValueType { type_id: 13, .. }));
    let b = build_gguf(&[("k", V::Raw(7, vec![2]))], &[]);
    assert!(matches!(expect_err(&b), FormatError::BadMetadata { .. }));
    let mut bad_utf8 = Vec::new();
    bad_utf8.extend(2u64.to_le_bytes());
    bad_utf8.extend([0xff, 0xfe]);
    let b = build_gguf(&[("k", V::Raw(8, bad_utf8))], &[]);
    assert!(matches!(expect_err(&b), FormatError::InvalidUtf8 { .. }));
    // Arrays nested 10 deep.
    let mut nested = Vec::new();
    for _ in 0..10 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(0u32.to_le_bytes());
    nested.extend(0u64.to_le_bytes());
    let b = build_gguf(&[("k", V::Raw(9, nested))], &[]);
    assert!(matches!(expect_err(&b), FormatError::NestingTooDeep { .. }));
    let b = build_gguf(&[("k", V::U32(1)), ("k", V::U32(2))], &[]);
    assert!(matches!(expect_err(&b), FormatError::DuplicateKey { .. }));
    for a in [0u32, 3, 48] {
        let b = build_gguf(&[("general.alignment", V::U32(a))], &[]);
        assert!(matches!(expect_err(&b), FormatError::BadAlignment { .. }), "{a}");
    }
}

fn one_tensor(dims: Vec<u64>, ggml_type: u32, data: usize) -> Vec<u8> {
    build_gguf(&[], &[TensorSpec { name: "w".into(), dims, ggml_type, data: vec![0; data] }])
}

#[test]
fn bad_tensor_infos() {
    // Sanity: the well-formed version is accepted.
    assert!(parse_all(&one_tensor(vec![32, 2], 8, 68)).0.is_none());
    let overflow = one_tensor(vec![1 << 32, 1 << 32, 2], 0, 8);
    assert!(matches!(expect_err(&overflow), FormatError::BadShape { .. }));
    let zero = one_tensor(vec![32, 0], 0, 8);
    assert!(matches!(expect_err(&zero), FormatError::BadShape { .. }));
    for n in [0u32, 5] {
        let mut b = one_tensor(vec![4], 0, 16);
        // n_dims follows the tensor name "w" in the info section.
        let pos = b.windows(9).position(|w| w == [1, 0, 0, 0, 0, 0, 0, 0, b'w']).unwrap() + 9;
        b[pos..pos + 4].copy_from_slice(&n.to_le_bytes());
        assert!(matches!(expect_err(&b), FormatError::BadDimCount { .. }), "{n}");
    }
    for ty in [4u32, 31, 99, u32::MAX] {
        match expect_err(&one_tensor(vec![32], ty, 64)) {
            FormatError::UnknownGgmlType { tensor, type_id } => {
                assert_eq!((tensor.as_str(), type_id), ("w", ty))
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(expect_err(&one_tensor(vec![33], 8, 64)), FormatError::BadRowLength { .. }));
    // Data shorter than the shape needs (Q8_0: 2 rows of 34 bytes).
    assert!(matches!(expect_err(&one_tensor(vec![32, 2], 8, 60)), FormatError::DataOutOfBounds { .. }));
    // A data offset past the end, and a misaligned one.
    for off in [u64::MAX - 3, 1 << 40, 4] {
        let mut b = one_tensor(vec![4], 0, 16);
        let pos = b.windows(8).position(|w| w == [4, 0, 0, 0, 0, 0, 0, 0]).unwrap() + 8 + 4;
        b[pos..pos + 8].copy_from_slice(&off.to_le_bytes());
        assert!(matches!(expect_err(&b), FormatError::DataOutOfBounds { .. }), "{off}");
    }
    let dup = build_gguf(
        &[],
        &[
            TensorSpec { name: "w".into(), dims: vec![4], ggml_type: 0, data: vec![0; 16] },
            TensorSpec { name: "w".into(), dims: vec![4], ggml_type: 0, data: vec![0; 16] },
        ],
    );
    assert!(matches!(expect_err(&dup), FormatError::DuplicateTensor { .. }));
}

/// Two tensors pointing at the same bytes: one small file must not stand for many tensors.
#[test]
fn tensors_sharing_data_are_refused() {
    let two = || {
        build_gguf(
            &[],
            &[
                TensorSpec { name: "a".into(), dims: vec![8], ggml_type: 0, data: vec![0; 32] },
                TensorSpec { name: "b".into(), dims: vec![8], ggml_type: 0, data: vec![0; 32] },
            ],
        )
    };
    assert!(parse_all(&two()).0.is_none());
    // b's offset (32, after its type 0) moved onto a's data.
    let mut b = two();
    let at = b.windows(9).position(|w| w == [1, 0, 0, 0, 0, 0, 0, 0, b'b']).unwrap() + 9 + 4 + 8 + 4;
    assert_eq!(b[at..at + 8], 32u64.to_le_bytes());
    b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    match expect_err(&b) {
        FormatError::TensorsOverlap { first, second, at: 0 } => {
            assert_eq!((first.as_str(), second.as_str()), ("a", "b"))
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// Random byte mutations of a valid file: never a panic, never a huge allocation.
    #[test]
    fn random_mutations(edits in prop::collection::vec((0usize..2976, any::<u8>()), 1..8),
                        cut in prop::option::of(0usize..2976)) {
        let mut b = quant_bytes();
        for (pos, val) in edits {
            let p = pos % b.len();
            b[p] = val;
        }
        if let Some(c) = cut {
            b.truncate(c);
        }
        let (_, largest) = parse_all(&b);
        prop_assert!(largest <= bound(2976), "allocated {}", largest);
    }

    /// Mutations aimed at the header's integer fields (counts, lengths, dims, offsets).
    #[test]
    fn header_word_mutations(word in 0usize..(928 / 8), val in prop_oneof![any::<u64>(), 0u64..64, Just(u64::MAX)]) {
        let mut b = quant_bytes();
        b[word * 8..word * 8 + 8].copy_from_slice(&val.to_le_bytes());
        let (_, largest) = parse_all(&b);
        prop_assert!(largest <= bound(2976), "allocated {}", largest);
    }
}
