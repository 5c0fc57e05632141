"""Ten turns of questions over one 6K-token document through `kvslice serve` (CPU backend):
time to first token of each turn with the conversation's cache kept, against a server that
keeps nothing and prefills the whole conversation again. Run by `scripts/serve.sh bench`.
"""

import argparse
import random
import time

import openai

from server import Server


def document():
    random.seed(11)
    subjects = ["The river", "A merchant", "The old mill", "Her brother", "The council", "A traveller", "The keeper"]
    verbs = ["watched", "remembered", "carried", "repaired", "described", "followed", "counted"]
    objects = ["the grain barges", "the winter storms", "a ledger of debts", "the northern road",
               "the bells of the chapel", "a crate of lamps", "the tide tables"]
    tails = ["before the frost came.", "while the town slept.", "for many quiet years.",
             "without a word of complaint.", "as the harbour filled.", "long after the fair had ended."]
    sentences = [f"{random.choice(subjects)} {random.choice(verbs)} {random.choice(objects)} {random.choice(tails)}"
                 for _ in range(520)]
    facts = {}
    for i, thing in enumerate(["harbour gate", "north tower", "grain store", "chapel door", "mill wheel",
                               "old bridge", "lamp room", "council hall", "east wall", "fish market"]):
        code = str(1000 + (i * 7919) % 9000)
        facts[thing] = code
        sentences.insert(40 + i * 45, f"The secret code for the {thing} is {code}.")
    return " ".join(sentences), facts


def turn(client, model, messages):
    t0 = time.time()
    first = None
    text = []
    usage = None
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12,
                                                stream=True, stream_options={"include_usage": True}):
        if first is None:
            first = time.time() - t0
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    return first, "".join(text), usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvslice", required=True)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    doc, facts = document()
    questions = [f"What is the secret code for the {thing}? Answer with the number." for thing in facts][: args.turns]
    rows = []
    with Server(args.kvslice, "--device", args.device) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=3600)
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": doc + "\n\n" + questions[0]}]
        for i in range(args.turns):
            if i > 0:
                messages.append({"role": "user", "content": questions[i]})
            ttft, text, usage = turn(client, model, messages)
            messages.append({"role": "assistant", "content": text})
            rows.append((i + 1, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, ttft, text))
            print(f"turn {i + 1}: {usage.prompt_tokens} prompt tokens, {usage.prompt_tokens_details.cached_tokens} "
                  f"cached, first token after {ttft:.2f} s: {text!r}", flush=True)
    # the second turn again on a server that keeps no conversation: the whole prompt prefilled
    with Server(args.kvslice, "--device", args.device, "--max-sessions", "0") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=3600)
        again, _, usage = turn(client, model, messages[:3])
        print(f"turn 2 re-prefilled: {usage.prompt_tokens} prompt tokens, first token after {again:.2f} s", flush=True)
    later = [r[3] for r in rows[1:]]
    mean = sum(later) / len(later)
    print()
    print("| turn | prompt tokens | cached | time to first token (s) |")
    print("|---:|---:|---:|---:|")
    for n, p, c, t, _ in rows:
        print(f"| {n} | {p} | {c} | {t:.2f} |")
    print(f"| 2, re-prefilled | {usage.prompt_tokens} | 0 | {again:.2f} |")
    print(f"\nturns 2-{args.turns}: mean time to first token {mean:.2f} s, {again / mean:.0f}x shorter than re-prefilling")


if __name__ == "__main__":
    main()
