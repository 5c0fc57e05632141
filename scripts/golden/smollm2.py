"""Golden logits and greedy generations for SmolLM2-135M-Instruct (Q4_1 GGUF) from HF transformers.

Loads the GGUF the project fetches (dequantized to f32 by transformers/gguf), eager attention,
one CPU thread, and writes tests/golden/smollm2/{logits,greedy}.json.

    python scripts/golden/smollm2.py [--model PATH_TO_GGUF]
"""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import GOLDEN_DIR, sample_positions, seed_everything, top_k, versions, write_json  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

SEED = 20240611
TOP_K = 20
DEFAULT_MODEL = os.path.join(
    os.environ.get("KVSLICE_CACHE_DIR", os.path.expanduser("~/.cache/kvslice")),
    "models",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)

# Paragraphs written for this file; the long prompt is a seeded arrangement of them.
PARAGRAPHS = [
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a tin of oil "
    "and a cloth for the lens. From the gallery he could see the whole bay: the fishing boats "
    "returning with their lanterns swinging, the gulls settling on the breakwater, and the long "
    "line of cliffs that turned from gold to grey as the sun went down.",
    "In the valley below the mountains, the village held a market every Thursday. Farmers brought "
    "baskets of apples, wheels of cheese wrapped in linen, and jars of honey that glowed like amber "
    "in the morning light. Children ran between the stalls, and the baker sold warm bread from a "
    "cart painted the colour of a robin's egg.",
    "A river does not hurry, yet it carves canyons. The water finds the softest stone and returns "
    "to it again and again, season after season, until the land itself remembers the shape of the "
    "current. Patience, the old boatmen said, is simply the habit of returning.",
    "The library had been built by a merchant who never learned to read. He filled the shelves "
    "with atlases, almanacs, and books of poetry, and he paid the town's schoolteacher to read "
    "aloud to anyone who came in on a winter afternoon. By the time he died, half the town could "
    "recite the names of distant rivers and the dates of forgotten battles.",
    "Clocks in the workshop ticked at slightly different speeds, so that every hour the room filled "
    "with a soft, uneven chorus. The clockmaker claimed he could tell the time by listening alone, "
    "and he would close his eyes, tilt his head, and announce the minute with a small smile.",
    "On the third day of the voyage the wind died completely. The sails hung from the yards like "
    "washing on a line, and the sea turned as smooth as glass. The crew mended ropes, told stories "
    "about storms they had survived, and watched the horizon for the dark ripple that would mean "
    "the breeze was coming back.",
    "Every spring the orchard exploded into white blossom, and for a week the air smelled of honey "
    "and rain. Bees moved from tree to tree in a low, steady hum. The gardener walked the rows with "
    "a notebook, counting buds and writing down which branches had suffered in the frost.",
    "The astronomer kept careful records of every clear night: the temperature, the humidity, the "
    "position of each planet, and the faint smudges of distant galaxies. Over forty years the "
    "notebooks filled three cabinets, and a young student later used them to measure how slowly the "
    "old telescope's mount had drifted out of alignment.",
    "When the snow came early that year, the roads closed for eleven days. Neighbours who had "
    "barely spoken began to share firewood and soup, and the schoolhouse became a kitchen, a "
    "dormitory, and a concert hall. Long after the thaw, people still talked about the week the "
    "village learned to sing together.",
    "The bridge was made of stone quarried from the hills and laid without mortar. Each block had "
    "been shaped so precisely that the arch held itself up by its own weight. Engineers who came "
    "to study it measured the angles, drew careful diagrams, and left shaking their heads in quiet "
    "admiration.",
    "A good map leaves things out. It shows the roads but not every pebble, the coastline but not "
    "every wave. The art of the cartographer is deciding what a traveller needs and trusting the "
    "traveller to notice the rest with their own eyes.",
    "The old train left the station at seven minutes past six, rattling across the plain toward the "
    "coast. Passengers read newspapers, peeled oranges, and dozed against the windows. At the fourth "
    "stop a musician climbed aboard with a violin case and played quietly until the sea appeared.",
]

SHORT = "The quick brown fox jumps over the lazy dog."

CODE = '''def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    seq = [0, 1]
    while len(seq) < n:
        seq.append(seq[-1] + seq[-2])
    return seq[:n]


fn main() {
    let squares: Vec<u64> = (1..=10).map(|x| x * x).collect();
    println!("{:?} sum={}", squares, squares.iter().sum::<u64>());
}
'''

NON_ENGLISH = (
    "Bonjour ! Le café est à côté de la gare, près du théâtre. "
    "我们今天去公园散步，天气很好。 "
    "Ça marche très bien 🚀🎉 — naïve façade, 東京タワー, 1234567890."
)

CHAT_MESSAGES_LOGITS = [
    {"role": "user", "content": "Give me three tips for staying focused while studying."},
]

WHITESPACE_DIGITS = "  Numbers: 3.14159, 2,718 and 1e-9;\n\n\tindented\t\ttabs   and    spaces 007 42%"

GREEDY_CASES = [
    {
        "name": "chat_capital",
        "chat": True,
        "messages": [
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
        ],
    },
    {
        "name": "plain_continuation",
        "chat": False,
        "text": "The Eiffel Tower is located in",
    },
    {
        "name": "chat_long",
        "chat": True,
        "messages": [
            {
                "role": "system",
                "content": "You are a concise assistant who explains things clearly to beginners.",
            },
            {"role": "user", "content": "I am learning to cook. What does it mean to simmer a sauce?"},
            {
                "role": "assistant",
                "content": "Simmering means cooking a liquid just below boiling, so small bubbles rise gently.",
            },
            {
                "role": "user",
                "content": "Write a short explanation of how photosynthesis works, suitable for a ten-year-old.",
            },
        ],
    },
]
GREEDY_NEW_TOKENS = 32
# A greedy step whose top-1/top-2 logit gap is below this can legitimately flip under f32
# rounding differences of the stated logit tolerance (|delta| < 1e-2 on each side).
STABLE_MARGIN = 0.02


def long_text(tok, target_tokens: int = 1500) -> str:
    """A seeded arrangement of PARAGRAPHS, stopping at the paragraph that passes target_tokens."""
    rng = random.Random(SEED)
    parts = []
    while True:
        order = list(range(len(PARAGRAPHS)))
        rng.shuffle(order)
        for i in order:
            parts.append(PARAGRAPHS[i])
            text = "\n\n".join(parts)
            if len(tok(text, add_special_tokens=False).input_ids) >= target_tokens:
                return text


def render_chat(tok, messages) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode(tok, text: str) -> dict:
    ids = tok(text).input_ids  # transformers' default: add_special_tokens=True
    plain = tok(text, add_special_tokens=False).input_ids
    return {
        "token_ids": [int(i) for i in ids],
        "n_tokens": len(ids),
        "transformers_added_special_tokens": ids != plain,
        "transformers_added_bos": len(ids) > len(plain) and ids[0] == tok.bos_token_id,
    }


@torch.no_grad()
def forward_logits(model, ids: list) -> torch.Tensor:
    """Full-sequence logits [n, vocab] in f32."""
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float32)


@torch.no_grad()
def greedy(model, ids: list, n_new: int, eos_id: int) -> dict:
    """Greedy decoding by full recomputation (no cache, no penalties, no EOS stop)."""
    seq = list(ids)
    generated, margins = [], []
    for _ in range(n_new):
        last = forward_logits(model, seq)[-1]
        top2 = torch.topk(last, 2)
        nxt = int(top2.indices[0])
        margins.append(float(top2.values[0] - top2.values[1]))
        generated.append(nxt)
        seq.append(nxt)
    # Cross-check with transformers' own generate() (KV cache, EOS stop active).
    gen = model.generate(
        torch.tensor([ids], dtype=torch.long),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=n_new,
        do_sample=False,
        repetition_penalty=1.0,
        pad_token_id=eos_id,
    )[0, len(ids):].tolist()
    unstable = [i for i, m in enumerate(margins) if m < STABLE_MARGIN]
    return {
        "generated_ids": generated,
        "stable_prefix_len": unstable[0] if unstable else n_new,
        "eos_positions": [i for i, t in enumerate(generated) if t == eos_id],
        "top1_top2_margins": margins,
        "generate_api_ids": gen,
        "generate_api_agrees_until_eos": gen == generated[: len(gen)],
    }


def model_config(cfg) -> dict:
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    return {
        "model_type": cfg.model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
        "rope_parameters": rope,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
    }


def gguf_flags(path: str) -> dict:
    import gguf

    r = gguf.GGUFReader(path)
    out = {}
    for key in (
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
    ):
        out[key] = r.fields[key].contents() if key in r.fields else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(GOLDEN_DIR, "smollm2"))
    args = ap.parse_args()
    seed_everything(SEED)

    model_dir, model_file = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=model_file, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    common = {
        "model_file": model_file,
        "loader": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=...), dtype=float32, "
        "attn_implementation=eager; weights dequantized to f32 at load; one CPU thread",
        "gguf_metadata": gguf_flags(args.model),
        "tokenizer": {
            "class": type(tok).__name__,
            "bos_token": tok.bos_token,
            "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token,
            "eos_token_id": tok.eos_token_id,
            "add_bos_token": getattr(tok, "add_bos_token", None),
        },
        "config": model_config(model.config),
        "versions": versions(),
    }

    prompts = [
        ("short", SHORT, False),
        ("long_english", long_text(tok), False),
        ("code", CODE, False),
        ("non_english", NON_ENGLISH, False),
        ("chat", render_chat(tok, CHAT_MESSAGES_LOGITS), True),
        ("whitespace_digits", WHITESPACE_DIGITS, False),
    ]
    cases = []
    for name, text, templated in prompts:
        enc = encode(tok, text)
        logits = forward_logits(model, enc["token_ids"])
        positions = sample_positions(enc["n_tokens"])
        case = {"name": name, "chat_template_applied": templated, "text": text, **enc}
        if templated:
            case["messages"] = CHAT_MESSAGES_LOGITS
        case["positions"] = [
            {"position": p, "top": top_k(logits[p], TOP_K)} for p in positions
        ]
        cases.append(case)
        print(f"{name}: {enc['n_tokens']} tokens, last top1 {case['positions'][-1]['top'][0]}", file=sys.stderr)

    write_json(
        os.path.join(args.out, "logits.json"),
        {
            **common,
            "description": "Top-20 (token id, f32 logit) pairs at positions [0, n//4, n//2, 3n//4, n-1] "
            "for each prompt. Token ids are exactly those fed to the model (tokenizer default "
            "add_special_tokens=True, which for this GGUF adds no BOS).",
            "top_k": TOP_K,
            "cases": cases,
        },
    )

    eos = tok.eos_token_id
    greedy_cases = []
    for case in GREEDY_CASES:
        text = render_chat(tok, case["messages"]) if case["chat"] else case["text"]
        enc = encode(tok, text)
        res = greedy(model, enc["token_ids"], GREEDY_NEW_TOKENS, eos)
        out = {
            "name": case["name"],
            "chat_template_applied": case["chat"],
            **({"messages": case["messages"]} if case["chat"] else {}),
            "prompt_text": text,
            "prompt_ids": enc["token_ids"],
            "transformers_added_bos": enc["transformers_added_bos"],
            "max_new_tokens": GREEDY_NEW_TOKENS,
            **res,
            "generated_text": tok.decode(res["generated_ids"], skip_special_tokens=False),
        }
        greedy_cases.append(out)
        print(f"{case['name']}: {out['generated_text']!r} eos at {res['eos_positions']}", file=sys.stderr)

    write_json(
        os.path.join(args.out, "greedy.json"),
        {
            **common,
            "description": "Greedy decoding (argmax of f32 logits, full recomputation each step, "
            "no repetition penalty, no EOS stop) for max_new_tokens tokens. eos_positions lists "
            "indices into generated_ids equal to eos_token_id; top1_top2_margins[i] is the logit gap "
            "behind generated_ids[i]; stable_prefix_len counts the tokens before the first step whose "
            "gap is under stable_margin (a comparison may stop there); generate_api_ids is "
            "transformers' generate(do_sample=False) which stops at EOS.",
            "eos_token_id": eos,
            "stable_margin": STABLE_MARGIN,
            "cases": greedy_cases,
        },
    )


if __name__ == "__main__":
    main()
