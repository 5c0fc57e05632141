"""The official `openai` client against `kvslice serve` on SmolLM2-135M-Instruct (CPU backend).

Expected text comes from transformers (tests/golden/smollm2/greedy.json). Run by
`scripts/serve.sh test`; exits non-zero on the first failed check.
"""

import argparse
import concurrent.futures
import json
import pathlib
import statistics
import time
import urllib.request

import openai

from server import Server, metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests/golden/smollm2/greedy.json").read_text())
CASE = next(c for c in GOLDEN["cases"] if c["name"] == "chat_capital")
QUESTION = CASE["messages"][0]["content"]
ANSWER = CASE["generated_text"].split("<|im_end|>")[0]


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok  {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvslice", required=True)
    args = ap.parse_args()
    with Server(args.kvslice, "--device", "cpu", "--session-ttl", "3", "--max-sessions", "8") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        run(client, server)


def run(client, server):
    models = client.models.list()
    model = models.data[0].id
    check(model.startswith("SmolLM2"), f"/v1/models lists the model ({model})")
    health = json.loads(urllib.request.urlopen(server.url + "/health").read())
    check(health == {"status": "ok"}, "/health")

    messages = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=32)
    check(r.choices[0].message.content == ANSWER, f"non-streaming chat gives transformers' answer {ANSWER!r}")
    check(r.choices[0].finish_reason == "stop", "it ends at the end-of-turn token")
    first_prompt = r.usage.prompt_tokens
    check(first_prompt == len(CASE["prompt_ids"]), f"usage.prompt_tokens = {first_prompt}")

    pieces = []
    usage = None
    stream = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=32, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    check("".join(pieces) == ANSWER, f"streaming gives the same text in {len(pieces)} pieces")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, "the stream's last chunk has usage")

    # a conversation: the second turn prefills only its own tokens
    conversation = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And what is the capital of Italy?"},
    ]
    r2 = client.chat.completions.create(model=model, messages=conversation, temperature=0, max_tokens=24)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    new = r2.usage.prompt_tokens - cached
    check(cached >= first_prompt, f"turn 2 reuses the first turn's cache ({cached} of {r2.usage.prompt_tokens} prompt tokens cached)")
    check(new <= 20, f"turn 2 prefills only its new tokens ({new})")
    conversation += [{"role": "assistant", "content": r2.choices[0].message.content},
                     {"role": "user", "content": "Thank you. One more: Spain?"}]
    r3 = client.chat.completions.create(model=model, messages=conversation, temperature=0, max_tokens=24)
    check(r3.usage.prompt_tokens_details.cached_tokens >= r2.usage.prompt_tokens, "turn 3 reuses turn 2's cache")

    # kvslice's extension fields: a policy and budget per request, and what the cache kept
    r = client.completions.create(
        model=model, prompt="The Eiffel Tower is located in", max_tokens=8, temperature=0,
        extra_body={"kv_policy": "streaming-llm", "kv_budget": "4"},
    )
    kv = r.usage.model_extra["kv_cache"]
    check(kv["entries"] == 30 * 3 * 4, f"streaming-llm at 4 keeps 4 entries per head ({kv['entries']} in all)")
    plain = next(c for c in GOLDEN["cases"] if c["name"] == "plain_continuation")
    r = client.completions.create(model=model, prompt=plain["prompt_text"], max_tokens=8, temperature=0)
    check(r.usage.completion_tokens == 8, "/v1/completions: 8 tokens")
    check(plain["generated_text"].startswith(r.choices[0].text), f"/v1/completions gives transformers' text {r.choices[0].text!r}")

    for extra, what in [({"kv_policy": "nosuchpolicy", "kv_budget": "10%"}, "nosuchpolicy"),
                        ({"kv_policy": "snapkv", "kv_budget": "-3%"}, "-3%")]:
        try:
            client.chat.completions.create(model=model, messages=messages, max_tokens=4, extra_body=extra)
            check(False, f"{what} refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and what in str(e), f"{what}: 400 {e.body['message'][:70]!r}")
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 9000}], max_tokens=4)
        check(False, "a prompt longer than the context is refused")
    except openai.BadRequestError as e:
        check("context" in str(e), "a prompt longer than the context: 400")

    load_test(client, server, model)


def load_test(client, server, model, clients=16, per_client=4):
    """16 concurrent clients × 4 requests: no errors, throughput and latency, memory after."""
    time.sleep(4)  # the sessions of the checks above expire (--session-ttl 3)
    idle = server.rss_mib()
    def one(i):
        latencies, tokens = [], 0
        for j in range(per_client):
            t0 = time.time()
            r = client.chat.completions.create(
                model=model, temperature=0.7, seed=i * 10 + j, max_tokens=16,
                messages=[{"role": "user", "content": f"Client {i}, request {j}: name a colour."}])
            latencies.append(time.time() - t0)
            tokens += r.usage.completion_tokens
        return latencies, tokens
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, range(clients)))
    wall = time.time() - t0
    latencies = sorted(l for ls, _ in results for l in ls)
    tokens = sum(t for _, t in results)
    peak = server.rss_mib()
    p50 = statistics.median(latencies)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    check(len(latencies) == clients * per_client, f"load: {clients}×{per_client} requests, no errors")
    print(f"    load: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s across clients; "
          f"latency p50 {p50:.2f} s, p95 {p95:.2f} s")
    deadline = time.time() + 30
    while metrics(server.url)["sessions"] > 0 and time.time() < deadline:
        time.sleep(0.5)
    m = metrics(server.url)
    after = server.rss_mib()
    print(f"    memory: idle {idle:.0f} MiB, after the load {peak:.0f} MiB, once its sessions expired {after:.0f} MiB")
    check(m["sessions"] == 0 and m["kv_bytes_held"] == 0, "every session's cache is freed after the load")
    check(after <= idle * 1.10 + 32, f"memory back to its idle level ({after:.0f} MiB against {idle:.0f} MiB)")
    check(m["requests_failed_total"] == 0, "no request failed on the server")


if __name__ == "__main__":
    main()
