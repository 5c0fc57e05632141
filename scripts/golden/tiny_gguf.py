"""The tiny `llama` model written as GGUF files (F32, F16, Q8_0, Q4_0, Q4_1) the way llama.cpp's
convert_hf_to_gguf.py lays them out, each loaded back with transformers for golden logits.

Weights: tests/golden/tiny/llama/model.safetensors (run tiny_models.py first). The GGUF files
carry no RoPE scaling: llama.cpp stores llama3 scaling as a `rope_freqs` tensor that transformers'
GGUF loader does not read, so these files describe plain RoPE (theta 10000) and their golden
logits differ from tests/golden/tiny/llama/golden.json by exactly that.

    python scripts/golden/tiny_gguf.py
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
from byte_level import bytes_to_unicode  # noqa: E402
from common import GOLDEN_DIR, round_rows, seed_everything, versions, write_json  # noqa: E402
from tiny_models import logits_of, token_sequences  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

Q = gguf.GGMLQuantizationType
F = gguf.LlamaFileType
TYPES = {
    "F32": (Q.F32, F.ALL_F32),
    "F16": (Q.F16, F.MOSTLY_F16),
    "Q8_0": (Q.Q8_0, F.MOSTLY_Q8_0),
    "Q4_0": (Q.Q4_0, F.MOSTLY_Q4_0),
    "Q4_1": (Q.Q4_1, F.MOSTLY_Q4_1),
}
TOKENIZER_TEST_STRINGS = ["Hello, world!", "héllo 🚀", "  two  spaces\n"]


def permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's row order for attn_q / attn_k: within each head, the rotary pairs (i, i+d/2)
    of HF's rotate-half layout become adjacent rows (2i, 2i+1)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tensor_map(cfg: dict, n_layers: int) -> list:
    """(gguf name, hf name, needs q/k permutation as (n_head, n_head_kv) or None), in the order
    convert_hf_to_gguf.py writes them."""
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("token_embd.weight", "model.embed_tokens.weight", None)]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        out += [
            (f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", None),
            (f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", None),
            (f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", None),
            (f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", None),
            (f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", None),
            (f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", (nh, nkv)),
            (f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", None),
            (f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", (nh, nh)),
            (f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", None),
        ]
    out += [("output_norm.weight", "model.norm.weight", None), ("output.weight", "lm_head.weight", None)]
    return out


def write_gguf(path: str, cfg: dict, weights: dict, type_name: str) -> dict:
    qtype, ftype = TYPES[type_name]
    w = gguf.GGUFWriter(path, "llama")
    w.add_type("model")
    w.add_name("kvslice tiny llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(int(ftype))
    if qtype not in (Q.F32, Q.F16):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # Minimal byte-level BPE tokenizer: the 256 GPT-2 byte symbols, no merges.
    table = bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([table[b] for b in range(256)])
    w.add_token_types([gguf.TokenType.NORMAL] * 256)
    # The writer leaves an empty array out, so the file has no tokenizer.ggml.merges key at all;
    # transformers then derives merges from the scores, and all-zero scores give it none.
    w.add_token_scores([0.0] * 256)
    w.add_token_merges([])
    w.add_add_bos_token(False)

    written = {}
    for gname, hname, perm in tensor_map(cfg, cfg["num_hidden_layers"]):
        data = weights[hname].astype(np.float32)
        if perm is not None:
            data = permute(data, *perm)
        if data.ndim == 1 or qtype == Q.F32:
            # norms stay F32, as llama.cpp keeps 1-D tensors
            w.add_tensor(gname, data)
            written[gname] = "F32"
        elif qtype == Q.F16:
            w.add_tensor(gname, data.astype(np.float16))
            written[gname] = "F16"
        else:
            w.add_tensor(gname, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            written[gname] = qtype.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def main() -> None:
    seed_everything(0)
    src = os.path.join(GOLDEN_DIR, "tiny", "llama")
    with open(os.path.join(src, "config.json")) as f:
        hf_cfg = json.load(f)
    cfg = {
        "hidden_size": hf_cfg["hidden_size"],
        "intermediate_size": hf_cfg["intermediate_size"],
        "num_hidden_layers": hf_cfg["num_hidden_layers"],
        "num_attention_heads": hf_cfg["num_attention_heads"],
        "num_key_value_heads": hf_cfg["num_key_value_heads"],
        "head_dim": hf_cfg["head_dim"],
        "vocab_size": hf_cfg["vocab_size"],
        "rms_norm_eps": hf_cfg["rms_norm_eps"],
        "rope_theta": hf_cfg["rope_theta"],
        "max_position_embeddings": hf_cfg["max_position_embeddings"],
    }
    weights = load_file(os.path.join(src, "model.safetensors"))

    out_dir = os.path.join(GOLDEN_DIR, "tiny-gguf")
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)

    # Cross-check for the F32 file: the HF model with the same weights and plain RoPE must give
    # the same logits, which shows the q/k permutation written here is the one transformers undoes.
    plain = {k: v for k, v in hf_cfg.items() if k not in ("rope_scaling", "rope_parameters")}
    plain_cfg = LlamaConfig(**plain)
    plain_cfg._attn_implementation = "eager"
    hf_plain = LlamaForCausalLM(plain_cfg).eval()
    hf_plain.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})

    files = {}
    for type_name in TYPES:
        name = f"tiny-llama-{type_name}.gguf"
        path = os.path.join(out_dir, name)
        tensor_types = write_gguf(path, cfg, weights, type_name)

        model = AutoModelForCausalLM.from_pretrained(
            out_dir, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        rope = dict(model.config.rope_parameters)
        if rope.get("rope_type", "default") != "default" or model.config.tie_word_embeddings:
            raise SystemExit(f"{name}: transformers read unexpected rope {rope} / tying")
        # How far transformers' dequantized weights are from the source f32 weights.
        state = model.state_dict()
        max_err = max(
            float(np.abs(state[h].numpy() - weights[h]).max())
            for _, h, _ in tensor_map(cfg, cfg["num_hidden_layers"])
        )
        try:
            tok = AutoTokenizer.from_pretrained(out_dir, gguf_file=name)
            tokenizer_check = {
                "class": type(tok).__name__,
                "ids": {s: tok(s, add_special_tokens=False).input_ids for s in TOKENIZER_TEST_STRINGS},
            }
        except Exception as e:  # recorded, not fatal: the logits do not need it
            tokenizer_check = {"error": f"{type(e).__name__}: {e}"}

        sequences = []
        for ids in token_sequences():
            got = logits_of(model, ids)
            if type_name == "F32":
                want = logits_of(hf_plain, ids)
                if not torch.allclose(got, want, atol=1e-5 * max(float(want.abs().max()), 1.0), rtol=0.0):
                    raise SystemExit("F32 GGUF logits differ from the HF model with the same weights")
            sequences.append(
                {
                    "token_ids": ids,
                    "argmax": [int(i) for i in got.argmax(dim=-1)],
                    "logits": round_rows(got.numpy()),
                }
            )
        files[name] = {
            "type": type_name,
            "tensor_types": tensor_types,
            "size_bytes": os.path.getsize(path),
            "max_abs_weight_error_vs_f32_source": max_err,
            "transformers_tokenizer": tokenizer_check,
            "sequences": sequences,
        }
        print(f"{name}: {os.path.getsize(path)} bytes, max weight error {max_err:.3g}", file=sys.stderr)

    write_json(
        os.path.join(out_dir, "golden.json"),
        {
            "description": "The weights of tests/golden/tiny/llama (untied, float32) as GGUF, laid out "
            "like llama.cpp's convert_hf_to_gguf.py: llama.* metadata, token_embd/blk.N.*/output_norm/"
            "output names, attn_q/attn_k rows permuted for llama.cpp's RoPE, 1-D norms in F32 and "
            "every 2-D weight (token_embd and output included) in the file's type, quantized with "
            "gguf.quants.quantize. No RoPE scaling (plain theta 10000). Golden logits: transformers "
            "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=float32, eager), which "
            "dequantizes with gguf.dequantize and undoes the q/k permutation; every op in float32.",
            "source_weights": "tests/golden/tiny/llama/model.safetensors",
            "config": cfg,
            "rope_scaling": None,
            "tokenizer": "gpt2 byte-level: 256 tokens (GPT-2 byte symbols, id = byte value), all scores "
            "0.0, no tokenizer.ggml.merges key (no merges), no special tokens, add_bos_token false",
            "compute_dtype": "float32",
            "logits_rounding": "6 significant digits",
            "versions": versions(),
            "files": files,
        },
    )


if __name__ == "__main__":
    main()
