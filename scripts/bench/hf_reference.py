"""HF transformers on this CPU, for scale beside `kvslice bench`: prefill tok/s at 512 and 2,048
tokens and decode ms/token at short and 4K context, fp32, eager attention, one thread.

Usage: python scripts/bench/hf_reference.py MODEL.gguf [--threads 1]
(the environment of scripts/golden/requirements.txt)
"""
import argparse
import os
import time

import torch
from transformers import AutoModelForCausalLM


def tokens(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(256, vocab, (1, n), generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode-depth", default="16,4096")
    ap.add_argument("--decode-steps", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d, f = os.path.split(os.path.abspath(a.gguf))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    vocab = model.config.vocab_size
    print("| measurement | tokens | seconds | tok/s |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        model(tokens(32, vocab, 1))
        for n in [int(x) for x in a.prefill.split(",")]:
            ids = tokens(n, vocab, 10)
            t = time.perf_counter()
            model(ids, use_cache=True, logits_to_keep=1)
            s = time.perf_counter() - t
            print(f"| prefill | {n} | {s:.3f} | {n / s:.1f} |")
        for depth in [int(x) for x in a.decode_depth.split(",")]:
            out = model(tokens(depth, vocab, 20), use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            steps = tokens(a.decode_steps, vocab, 30)
            t = time.perf_counter()
            for i in range(a.decode_steps):
                out = model(steps[:, i : i + 1], past_key_values=past, use_cache=True)
                past = out.past_key_values
            s = time.perf_counter() - t
            per = s / a.decode_steps
            print(f"| decode at depth {depth} | {a.decode_steps} | {s:.3f} | {1 / per:.1f} ({per * 1e3:.1f} ms/token) |")


if __name__ == "__main__":
    main()
