"""Write a small GGUF with one tensor per supported ggml type (F32, F16, BF16, Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), one of an unsupported type (Q2_K), and the f32 values
gguf-py dequantizes the supported ones to.

Outputs (tests/golden/gguf-quant/):
  quant.gguf      written by gguf.GGUFWriter (GGUF v3, alignment 32)
  expected.safetensors
                  for every tensor in quant.gguf, `gguf.quants.dequantize` of its raw
                  bytes, as f32 in the GGUF's logical shape (numpy order: [ne1, ne0])

Values are seeded normal numbers with both signs; every quantized tensor has one
32-value block of exact zeros and one block of a constant, and the widths are
multiples of 32.
"""

import argparse
import pathlib

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType as T
from safetensors.numpy import save_file


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/gguf-quant")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240601)

    def values(shape):
        x = (rng.standard_normal(shape) * 1.5).astype(np.float32)
        flat = x.reshape(-1)
        if flat.size >= 96:
            flat[32:64] = 0.0          # one block of zeros
            flat[64:96] = -0.75        # one constant negative block
        return x

    tensors = [
        ("t_f32", T.F32, (3, 7)),
        ("t_f16", T.F16, (4, 33)),
        ("t_bf16", T.BF16, (5, 40)),
        ("t_q8_0", T.Q8_0, (6, 64)),
        ("t_q4_0", T.Q4_0, (4, 96)),
        ("t_q4_1", T.Q4_1, (5, 64)),
        ("t_q4_1_1d", T.Q4_1, (128,)),
        ("t_q8_0_3d", T.Q8_0, (2, 3, 32)),
        ("t_q5_0", T.Q5_0, (2, 32)),
    ]
    # after the K-quants (so that the tensors above keep their bytes and offsets)
    late_tensors = [("t_q5_1", T.Q5_1, (3, 64)), ("t_q5_0_b", T.Q5_0, (4, 96))]

    # K-quants: gguf-py dequantizes them but does not quantize, so their blocks are random
    # bytes with finite f16 scales (d, dmin for Q4_K/Q5_K at bytes 0..4; d for Q6_K at its end)
    k_tensors = [
        ("t_q4_k", T.Q4_K, (2, 512), 144, [0, 2]),
        ("t_q5_k", T.Q5_K, (3, 256), 176, [0, 2]),
        ("t_q6_k", T.Q6_K, (2, 256), 210, [208]),
    ]

    w = gguf.GGUFWriter(str(out / "quant.gguf"), arch="llama")
    w.add_string("test.string", "héllo ✓")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_bool("test.bool", True)
    w.add_uint64("test.u64", 2**63 + 7)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -2.25)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_str", ["a", "bc", ""])
    expected = {}

    def add_quantized(name, qtype, shape):
        raw = gguf.quants.quantize(values(shape), qtype)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        deq = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert deq.shape == shape, (name, deq.shape, shape)
        expected[name] = np.ascontiguousarray(deq)

    for name, qtype, shape in tensors:
        add_quantized(name, qtype, shape)
    for name, qtype, shape, block_bytes, halves in k_tensors:
        rows, cols = shape
        raw = rng.integers(0, 256, size=(rows, cols // 256 * block_bytes), dtype=np.uint8)
        blocks = raw.reshape(-1, block_bytes)
        for at in halves:
            h = (rng.standard_normal(blocks.shape[0]) * 0.05).astype(np.float16)
            blocks[:, at:at + 2] = h.view(np.uint8).reshape(-1, 2)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        deq = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert deq.shape == shape, (name, deq.shape, shape)
        assert np.isfinite(deq).all(), name
        expected[name] = np.ascontiguousarray(deq)
    for name, qtype, shape in late_tensors:
        add_quantized(name, qtype, shape)
    # an unsupported type, for the error path: one random Q2_K super-block
    raw = rng.integers(0, 256, size=(1, 84), dtype=np.uint8)
    w.add_tensor("t_q2_k", raw, raw_shape=raw.shape, raw_dtype=T.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Read back with gguf-py's reader: the file is what we think it is.
    r = gguf.GGUFReader(str(out / "quant.gguf"))
    for t in r.tensors:
        if t.name in expected:
            got = gguf.quants.dequantize(t.data, t.tensor_type)
            np.testing.assert_array_equal(got.reshape(expected[t.name].shape), expected[t.name])
    save_file(expected, str(out / "expected.safetensors"))
    print("wrote", out / "quant.gguf", out / "expected.safetensors")


if __name__ == "__main__":
    main()
