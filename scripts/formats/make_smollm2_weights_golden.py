"""Reference slices of SmolLM2-135M-Instruct's weights as transformers loads them from
the GGUF (dequantized, and with llama.cpp's Q/K row permutation undone by
transformers' own GGUF loader).

Output: tests/golden/gguf-quant/smollm2_slices.safetensors with, for layer 0 and the
last layer, the first 64 columns of q_proj, k_proj, v_proj (all rows), the first
4 rows of the token embedding, and the final norm weight.
"""

import argparse
import pathlib
import shutil
import tempfile

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=pathlib.Path, required=True)
    ap.add_argument("--out", default="tests/golden/gguf-quant/smollm2_slices.safetensors")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (pathlib.Path(d) / "model.gguf").symlink_to(args.gguf.resolve())
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file="model.gguf", torch_dtype=torch.float32)
    sd = model.state_dict()
    n = model.config.num_hidden_layers
    out = {}
    for layer in (0, n - 1):
        for p in ("q_proj", "k_proj", "v_proj"):
            name = f"model.layers.{layer}.self_attn.{p}.weight"
            out[name] = sd[name][:, :64].contiguous().float()
    out["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"][:4].contiguous().float()
    out["model.norm.weight"] = sd["model.norm.weight"].contiguous().float()
    save_file(out, args.out)
    print("wrote", args.out, {k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
