"""Tiny random Llama / Qwen2 / Mistral models as HF folders, with full golden logits.

Each model is built from a config (no download), its parameters drawn from a seeded generator,
saved with save_pretrained (safetensors), then loaded back from disk with
AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager");
the golden logits come from that reloaded model, so f16/bf16 weights are the stored values upcast
exactly to f32 and all compute is f32.

    python scripts/golden/tiny_models.py
"""

import json
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import GOLDEN_DIR, round_rows, seed_everything, versions, write_json  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

SEQUENCE_SEED = 1234
SEQUENCE_LENGTHS = (1, 10, 40)
VOCAB = 256


def token_sequences() -> list:
    """The three id sequences used by every tiny model (HF folders and GGUF files alike)."""
    rng = np.random.RandomState(SEQUENCE_SEED)
    return [[int(t) for t in rng.randint(0, VOCAB, size=n)] for n in SEQUENCE_LENGTHS]


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Draw every parameter from a seeded generator, scaled so logits have O(1) spread.

    Embeddings ~ N(0, 1); linear weights ~ N(0, 1/fan_in); biases ~ N(0, 0.3^2);
    RMSNorm weights ~ 1 + N(0, 0.2^2) (so the norm weights matter, unlike the default ones).
    Tied weights appear once in named_parameters() and are drawn once.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if "norm" in name:
            value = 1.0 + 0.2 * noise
        elif name.endswith(".bias"):
            value = 0.3 * noise
        elif "embed_tokens" in name:
            value = noise
        else:
            value = noise / math.sqrt(p.shape[-1])
        p.copy_(value.to(p.dtype))


@torch.no_grad()
def logits_of(model, ids: list) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()


def rewrite_config_legacy(folder: str, extra: dict) -> None:
    """Replace transformers 5's `rope_parameters` by the older `rope_theta`/`rope_scaling` keys
    that most published config.json files still carry, so both spellings are covered."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    cfg.update(extra)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def config_summary(cfg, model) -> dict:
    names = [n for n, _ in model.named_parameters()]
    return {
        "qkv_bias": any(n.endswith("q_proj.bias") for n in names),
        "model_type": cfg.model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": dict(cfg.rope_parameters),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": getattr(cfg, "attention_bias", None),
        "sliding_window": getattr(cfg, "sliding_window", None),
        "max_position_embeddings": cfg.max_position_embeddings,
    }


def llama_config(tied: bool) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )


MODELS = {
    "llama": dict(
        cls=LlamaForCausalLM,
        config=lambda: llama_config(tied=False),
        seed=1,
        save_dtype=torch.float32,
        shard=None,
        legacy_config=True,
    ),
    "llama-tied-f16": dict(
        cls=LlamaForCausalLM,
        config=lambda: llama_config(tied=True),
        seed=2,
        save_dtype=torch.float16,
        shard=None,
        legacy_config=False,
    ),
    "qwen2-bf16": dict(
        cls=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=512,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        seed=3,
        save_dtype=torch.bfloat16,
        shard=None,
        legacy_config=True,
    ),
    "mistral-sharded": dict(
        cls=MistralForCausalLM,
        config=lambda: MistralConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=512,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            sliding_window=128,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
        ),
        seed=4,
        save_dtype=torch.float32,
        shard="250KB",
        legacy_config=False,
    ),
}


def build(name: str, spec: dict, root: str) -> dict:
    torch.manual_seed(spec["seed"])
    config = spec["config"]()
    config._attn_implementation = "eager"
    model = spec["cls"](config).eval()
    randomize(model, spec["seed"])
    model = model.to(spec["save_dtype"])

    folder = os.path.join(root, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    kwargs = {"safe_serialization": True}
    if spec["shard"]:
        kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(folder, **kwargs)
    gen_cfg = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    if spec["legacy_config"]:
        rewrite_config_legacy(folder, {})
    files = sorted(os.listdir(folder))
    shards = [f for f in files if f.endswith(".safetensors")]
    if spec["shard"] and len(shards) != 2:
        raise SystemExit(f"{name}: expected 2 shards, got {shards}")

    # Golden logits come from the folder as transformers reads it from disk.
    loaded = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    # Independent reference: a fresh float32 model (so its RoPE buffers were never cast to a
    # 16-bit dtype) holding the in-memory weights upcast to float32.
    reference = spec["cls"](config).eval()
    reference.load_state_dict({k: v.to(torch.float32) for k, v in model.state_dict().items()})
    sequences = []
    for ids in token_sequences():
        got = logits_of(loaded, ids)
        want = logits_of(reference, ids)
        # Guards against a config spelling transformers silently ignores (e.g. rope scaling).
        if not torch.equal(got, want):
            print(name, "max |diff|", float((got - want).abs().max()), "max |logit|", float(got.abs().max()), file=sys.stderr)
        scale = float(want.abs().max())
        if not torch.allclose(got, want, atol=1e-5 * max(scale, 1.0), rtol=0.0):
            raise SystemExit(f"{name}: reloaded model disagrees with the in-memory one")
        sequences.append(
            {
                "token_ids": ids,
                "argmax": [int(i) for i in got.argmax(dim=-1)],
                "logits": round_rows(got.numpy()),
            }
        )

    return {
        "name": name,
        "architecture": type(loaded).__name__,
        "files": files,
        "weights_dtype": str(spec["save_dtype"]).replace("torch.", ""),
        "compute_dtype": "float32",
        "config_json_rope_spelling": "rope_theta + rope_scaling (legacy keys)"
        if spec["legacy_config"]
        else "rope_parameters (transformers 5)",
        "how": "AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, "
        "attn_implementation='eager'); stored "
        + str(spec["save_dtype"]).replace("torch.", "")
        + " weights are cast to float32 by transformers at load (exact), every op in float32, "
        "one CPU thread, use_cache=False, no BOS or other ids added",
        "init": f"config defaults, then randomize(seed={spec['seed']}) in scripts/golden/tiny_models.py",
        "config": config_summary(loaded.config, loaded),
        "logits_rounding": "6 significant digits",
        "versions": versions(),
        "sequences": sequences,
    }


def main() -> None:
    seed_everything(0)
    root = os.path.join(GOLDEN_DIR, "tiny")
    for name, spec in MODELS.items():
        golden = build(name, spec, root)
        write_json(os.path.join(root, name, "golden.json"), golden)


if __name__ == "__main__":
    main()
