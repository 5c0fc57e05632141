"""kvpress on kvslice's retrieval cases: full cache against each press x budget.

Each line of the cases file is one of two forms, as for `kvslice eval`:
  prompt    {"id", "prompt", "answer"}: the whole prompt (context, question and answer prefix) is
            the text whose KV cache gets compressed (query-aware); greedy decoding then continues
            from the compressed cache with positions counted from the original prompt length, as
            kvpress's own pipeline does.
  document  {"id", "context", "questions": [{"question", "answer"}, ...]}: question i is read as
            the text context + "\n" + question_i, tokenized as a whole; the longest token prefix
            shared by the context alone and every question's text (each question keeping at least
            one token after it) is prefilled once and compressed alone (query-agnostic), then a
            copy of the compressed cache is fed each question's remaining tokens, positions
            continuing, and decoded greedily. Report ids "{id}/q{n}", n from 1.
A case (a question) passes when its `answer` occurs in the decoded output.

Usage (see kvpress_eval.md):
  python scripts/peers/kvpress_eval.py --cases CASES.jsonl --model MODEL.gguf \
      --presses tova,snapkv,adakv-snapkv,pyramidkv,knorm,streaming-llm,expected-attention \
      --budgets 50%,25%,10%,5% --max-new-tokens 16 --json OUT.json [--threads N] [--limit N] [--resume]

Three ways to apply a press (--mode):
  replay (default)  prefill each case once with the full cache, recording every attention layer's
                    inputs (hidden states, position embeddings, cache position); then, for each
                    press x budget, rebuild the cache layer by layer exactly as kvpress's forward
                    hook does (full keys/values of the layer in the cache, `press.compress(...)`,
                    result written back) and decode. Valid because a prefill-time press only
                    rewrites the cache after each layer's attention output has been computed: the
                    prefill's hidden states, and so every layer's inputs, do not depend on it.
  hooks             kvpress's own way: `with press(model):` around a fresh prefill for every run
                    (for a document: of the shared prefix only; the questions are fed outside the
                    press context). Slower (one prefill per run); kept to check that replay gives
                    the same outputs.
  pipeline          documents only: kvpress's KVPressTextGenerationPipeline, called with the
                    context, the questions and the press. It tokenizes context and questions
                    separately and wraps them in the model's chat template (--pipeline-template
                    plain: its no-template branch), so it does not read the same tokens as kvslice
                    (see kvpress_eval.md).
"""

import argparse
import copy
import importlib.metadata
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's progress bar

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

import kvpress  # noqa: E402  (importing it patches the attention functions for AdaKV's masking)
from kvpress import (  # noqa: E402
    AdaKVPress,
    BlockPress,
    ChunkKVPress,
    CompactorPress,
    CriticalKVPress,
    CURPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    LagKVPress,
    LeverageScorePress,
    NonCausalAttnPress,
    PyramidKVPress,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

# Press name -> constructor taking the compression ratio (fraction removed).
PRESSES = {
    "tova": lambda r: TOVAPress(compression_ratio=r),
    "snapkv": lambda r: SnapKVPress(compression_ratio=r),
    "adakv-snapkv": lambda r: AdaKVPress(SnapKVPress(compression_ratio=r)),
    "pyramidkv": lambda r: PyramidKVPress(compression_ratio=r),
    "knorm": lambda r: KnormPress(compression_ratio=r),
    "streaming-llm": lambda r: StreamingLLMPress(compression_ratio=r),
    "expected-attention": lambda r: ExpectedAttentionPress(compression_ratio=r),
    "criticalkv-snapkv": lambda r: CriticalKVPress(SnapKVPress(compression_ratio=r)),
    "random": lambda r: RandomPress(compression_ratio=r),
    # Attention-free presses and wrappers, at the settings kvslice's policies of the same names
    # default to (checked on stored tensors by scripts/peers/gen_peers.py).
    "keydiff": lambda r: KeyDiffPress(compression_ratio=r),
    "block-keydiff": lambda r: BlockPress(KeyDiffPress(compression_ratio=r), block_size=128),
    "lagkv": lambda r: LagKVPress(compression_ratio=r, n_sink=4, lag_size=128),
    "chunkkv-snapkv": lambda r: ChunkKVPress(SnapKVPress(compression_ratio=r), chunk_length=20),
    "cur": lambda r: CURPress(compression_ratio=r, num_sinks=4),
    "non-causal-attn": lambda r: NonCausalAttnPress(compression_ratio=r, chunk_size=256),
    # Gaussian sketches from torch's global generator, seeded once at start (--seed)
    "leverage": lambda r: LeverageScorePress(compression_ratio=r, sketch_dimension=48),
    "compactor": lambda r: CompactorPress(compression_ratio=r),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--cases",
        required=True,
        help="JSON Lines: prompts {id, prompt, answer} and documents {id, context, questions: [{question, answer}]}",
    )
    p.add_argument("--model", required=True, help="path to the GGUF file")
    p.add_argument("--presses", default="tova,snapkv,adakv-snapkv,pyramidkv,knorm,streaming-llm,expected-attention")
    p.add_argument(
        "--budgets",
        default="50%,25%,10%,5%",
        help="kept share per run: 'P%%' keeps P%% (compression_ratio 1-P/100); a plain integer N keeps "
        "N tokens per layer (compression_ratio 1-N/n, per case, n the prompt's tokens or a document's "
        "compressed prefix)",
    )
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--json", required=True, help="output file, rewritten after every case")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="torch's generator seed (the presses that draw: leverage, compactor, random)")
    p.add_argument("--limit", type=int, default=None, help="only the first N cases")
    p.add_argument("--resume", action="store_true", help="keep the (run, case) pairs already in --json")
    p.add_argument("--mode", choices=["replay", "hooks", "pipeline"], default="replay")
    p.add_argument(
        "--bos",
        choices=["tokenizer", "yes", "no"],
        default="tokenizer",
        help="BOS handling: the GGUF tokenizer's default as transformers builds it (it prepends BOS), "
        "always, or never (what the GGUF's tokenizer.ggml.add_bos_token=false asks for)",
    )
    p.add_argument(
        "--pipeline-sep",
        default="\n",
        help="pipeline mode: text put before each question, so that context + sep + question is the "
        "text kvslice reads (default a newline; '' passes the questions unchanged)",
    )
    p.add_argument(
        "--pipeline-template",
        choices=["chat", "plain"],
        default="chat",
        help="pipeline mode: 'chat' leaves the tokenizer's chat template, which the pipeline then "
        "applies; 'plain' removes it, so the pipeline takes its no-template branch (BOS text before "
        "the context, a newline after each question)",
    )
    p.add_argument("--verbose", action="store_true", help="per run: cache lengths after compression, timings")
    return p.parse_args()


def load_cases(path, limit):
    """Prompts and documents, in file order; each gets "qids", its report ids."""
    cases = []
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                c = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{no}: not JSON: {e}")
            if isinstance(c, dict) and "context" in c:
                qs = c.get("questions")
                if (
                    "prompt" in c
                    or "answer" in c
                    or not isinstance(c["context"], str)
                    or not c["context"].strip()
                    or not isinstance(qs, list)
                    or not qs
                    or not all(
                        isinstance(q, dict)
                        and all(isinstance(q.get(k), str) and q[k].strip() for k in ("question", "answer"))
                        for q in qs
                    )
                ):
                    sys.exit(
                        f"{path}:{no}: a document is an object with a non-empty string context and a non-empty "
                        "list of questions, each with non-empty string fields question and answer"
                    )
            elif not isinstance(c, dict) or not all(isinstance(c.get(k), str) for k in ("prompt", "answer")):
                sys.exit(f"{path}:{no}: expected an object with string fields prompt and answer")
            if "id" not in c:
                sys.exit(f"{path}:{no}: missing id")
            c["id"] = str(c["id"])
            c["qids"] = [f"{c['id']}/q{i + 1}" for i in range(len(c["questions"]))] if "context" in c else [c["id"]]
            cases.append(c)
    ids = [c["id"] for c in cases]
    if len(set(ids)) != len(ids):
        sys.exit(f"{path}: duplicate case ids")
    qids = [q for c in cases for q in c["qids"]]
    if len(set(qids)) != len(qids):
        sys.exit(f"{path}: a prompt's id equals a document question's report id")
    return cases[:limit] if limit is not None else cases


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def split_document(tok, doc, bos):
    """kvslice's split of a document: the prefix every question's text shares with the context
    alone (each question keeps at least one token after it), and each question's whole ids."""
    alone = tokenize(tok, doc["context"], bos)[0].tolist()
    prompts = [tokenize(tok, doc["context"] + "\n" + q["question"], bos)[0].tolist() for q in doc["questions"]]
    shared = min(min(common_prefix(alone, p), len(p) - 1) for p in prompts)
    if shared <= 0:
        sys.exit(f"case {doc['id']}: the context and its questions share no leading tokens")
    return torch.tensor([alone[:shared]]), prompts


def parse_budget(spec):
    """'10%' -> ('pct', 10.0); '256' -> ('tokens', 256)."""
    s = spec.strip()
    if s.endswith("%"):
        v = float(s[:-1])
        if not 0 < v <= 100:
            sys.exit(f"budget {spec}: the kept share must be in (0, 100]%")
        return ("pct", v)
    try:
        n = int(s)
    except ValueError:
        sys.exit(f"budget {spec}: expected P% or a token count")
    if n <= 0:
        sys.exit(f"budget {spec}: must be positive")
    return ("tokens", n)


def compression_ratio(budget, n_tokens):
    kind, v = budget
    keep = v / 100.0 if kind == "pct" else min(1.0, v / n_tokens)
    # kvpress: fraction removed, in [0, 1); keeps int(n * (1 - ratio)) tokens (ScorerPress).
    return min(max(0.0, 1.0 - keep), 0.999999)


def check_attention_patch(model):
    """AdaKV only masks keys through kvpress's patched attention functions; without the patch its
    runs would silently keep the whole cache."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    fn = ALL_ATTENTION_FUNCTIONS[model.config._attn_implementation]
    if getattr(fn, "__name__", "") != "wrapper" or "attention_patch" not in getattr(fn, "__qualname__", ""):
        sys.exit(f"kvpress's attention patch is not active for {model.config._attn_implementation}")


def load_model(path, threads):
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    # What a press's context manager does on entry (BasePress.__call__), done once for replay mode.
    for layer in model.model.layers:
        layer.self_attn.rotary_emb = model.model.rotary_emb
    return tok, model


def tokenize(tok, prompt, bos):
    ids = tok(prompt, add_special_tokens=(bos == "tokenizer"), return_tensors="pt").input_ids
    if bos == "yes" and (ids.shape[1] == 0 or ids[0, 0].item() != tok.bos_token_id):
        ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
    return ids


def eos_ids(model):
    e = model.generation_config.eos_token_id
    return set(e if isinstance(e, list) else [e])


def clear_masks(model):
    """AdaKV leaves `masked_key_indices` on the attention modules; a stale one would mask another run."""
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None


@torch.inference_mode()
def decode(model, cache, first_logits, n_prompt, max_new, stop):
    """Greedy decoding as kvpress's pipeline does it: explicit position_ids from the original prompt
    length (the cache may be shorter), cache_position left to the model (compressed length)."""
    generated = [int(first_logits.argmax())]
    for i in range(max_new - 1):
        if generated[-1] in stop:
            break
        out = model(
            input_ids=torch.tensor([[generated[-1]]]),
            past_key_values=cache,
            position_ids=torch.tensor([[n_prompt + i]]),
        )
        generated.append(int(out.logits[0, -1].argmax()))
    return generated


@torch.inference_mode()
def answer_question(model, cache, ids, n_prefix, max_new, stop):
    """A copy of the (compressed) prefix cache is fed the question's tokens after the prefix,
    positions continuing from the prefix length, then decoded greedily."""
    qcache = copy.deepcopy(cache)
    if len({layer.keys.shape[-2] for layer in qcache.layers}) == 1:
        out = model(
            input_ids=torch.tensor([ids[n_prefix:]]),
            past_key_values=qcache,
            position_ids=torch.arange(n_prefix, len(ids)).unsqueeze(0),
            logits_to_keep=1,
        )
    else:
        # Layers of different lengths (PyramidKV): transformers sizes a multi-token causal mask
        # from the first layer's cache, so the question goes in one token at a time (the same
        # causal attention; a single query needs no mask).
        for i in range(n_prefix, len(ids)):
            out = model(
                input_ids=torch.tensor([[ids[i]]]),
                past_key_values=qcache,
                position_ids=torch.tensor([[i]]),
                logits_to_keep=1,
            )
    gen = decode(model, qcache, out.logits[0, -1], len(ids), max_new, stop)
    del qcache
    return gen


class Recorder:
    """Forward hooks recording each attention layer's inputs during the full prefill."""

    def __init__(self, model):
        self.layers = {}
        self.hooks = [
            layer.self_attn.register_forward_hook(self.hook, with_kwargs=True) for layer in model.model.layers
        ]

    def hook(self, module, args, kwargs, output):
        kw = {k: v for k, v in kwargs.items() if k != "past_key_values"}
        self.layers[module.layer_idx] = kw

    def remove(self):
        for h in self.hooks:
            h.remove()


@torch.inference_mode()
def full_prefill(model, ids):
    cache = DynamicCache()
    rec = Recorder(model)
    try:
        out = model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
    finally:
        rec.remove()
    kv = [(cache.layers[l].keys, cache.layers[l].values) for l in range(len(cache.layers))]
    return out.logits[0, -1], cache, kv, rec.layers


@torch.inference_mode()
def replay_compress(model, press, kv, inputs):
    """kvpress's BasePress.forward_hook, layer by layer, on the recorded prefill."""
    press.post_init_from_model(model)
    cache = DynamicCache()
    for l, layer in enumerate(model.model.layers):
        module = layer.self_attn
        cache.update(kv[l][0], kv[l][1], l)  # copies: the recorded tensors stay untouched
        kw = dict(inputs[l])
        kw["past_key_values"] = cache
        keys, values = press.compress(
            module, kw["hidden_states"], cache.layers[l].keys, cache.layers[l].values, None, kw
        )
        cache.layers[l].keys, cache.layers[l].values = keys, values
    return cache


@torch.inference_mode()
def hooked_prefill(model, press, ids):
    cache = DynamicCache()
    with press(model):
        out = model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
    return out.logits[0, -1], cache


def cache_summary(model, cache, n_prompt):
    lens = [cache.layers[l].keys.shape[2] for l in range(len(cache.layers))]
    s = f"cache {min(lens)}..{max(lens)} (mean {sum(lens) / len(lens):.1f}) of {n_prompt} per layer"
    masked = []
    for l, layer in enumerate(model.model.layers):
        m = getattr(layer.self_attn, "masked_key_indices", None)
        if m is not None:
            heads = cache.layers[l].keys.shape[1]
            masked.append(len(m[0]) / heads)
    if masked:
        kept = [n_prompt - m for m in masked]
        s += (
            f"; AdaKV masks keys instead: kept per layer (mean over heads) "
            f"{min(kept):.1f}..{max(kept):.1f} (mean {sum(kept) / len(kept):.1f})"
        )
    return s


def write_json(path, runs, order):
    out = {"runs": {}}
    for key in order:
        if key not in runs:
            continue
        cases = runs[key]
        out["runs"][key] = {
            "passed": sum(1 for c in cases.values() if c["pass"]),
            "total": len(cases),
            "cases": cases,
        }
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def print_table(runs, presses, budgets, ids):
    """Counts over this invocation's cases only (a resumed file may hold more)."""

    def cell(key):
        r = [runs[key][i] for i in ids if i in runs.get(key, {})]
        return f"{sum(1 for c in r if c['pass'])}/{len(r)}" if r else "-"

    names = ["full"] + presses
    w0 = max(len(n) for n in names)
    w = max([len(b) for b in budgets] + [7])
    print(f"{'':<{w0}}  " + "  ".join(f"{b:>{w}}" for b in budgets))
    for name in names:
        cells = [cell("full") if name == "full" else cell(f"{name}@{b}") for b in budgets]
        print(f"{name:<{w0}}  " + "  ".join(f"{c:>{w}}" for c in cells))


def run_document(args, tok, model, stop, case, todo, budgets, runs, timings, label):
    """One document in replay or hooks mode: the shared prefix prefilled (and compressed) once per
    run, then every question on its own copy of that cache."""
    prefix, prompts = split_document(tok, case, args.bos)
    n = prefix.shape[1]
    lens = [len(p) for p in prompts]
    log(
        f"{label} {case['id']}: {n} prefix tokens, then {len(prompts)} questions "
        f"({min(lens)}..{max(lens)} tokens each in all), {len(todo)} run(s)"
    )

    def ask(cache):
        return [answer_question(model, cache, ids, n, args.max_new_tokens, stop) for ids in prompts]

    def record(key, gens, secs, extra=""):
        record_questions(args, tok, case, runs, key, gens, lens, secs, extra)

    if args.mode == "replay":
        t = time.time()
        _, cache, kv, inputs = full_prefill(model, prefix)
        timings["prefill"].append(time.time() - t)
        if args.verbose:
            log(f"  prefill {timings['prefill'][-1]:.2f} s")
        if "full" in todo:
            clear_masks(model)
            t = time.time()
            gens = ask(cache)
            timings["full"].append(time.time() - t)
            record("full", gens, timings["full"][-1])
        del cache
        for key in todo:
            if key == "full":
                continue
            name, b = key.split("@", 1)
            press = PRESSES[name](compression_ratio(budgets[b], n))
            clear_masks(model)
            t = time.time()
            pcache = replay_compress(model, press, kv, inputs)
            extra = "; " + cache_summary(model, pcache, n) if args.verbose else ""
            gens = ask(pcache)
            timings["press"].append(time.time() - t)
            record(key, gens, timings["press"][-1], extra)
            del pcache
        del kv, inputs
    else:
        for key in todo:
            clear_masks(model)
            t = time.time()
            if key == "full":
                with torch.inference_mode():
                    cache = DynamicCache()
                    model(input_ids=prefix, past_key_values=cache, logits_to_keep=1)
                extra = ""
            else:
                name, b = key.split("@", 1)
                press = PRESSES[name](compression_ratio(budgets[b], n))
                _, cache = hooked_prefill(model, press, prefix)
                extra = "; " + cache_summary(model, cache, n) if args.verbose else ""
            gens = ask(cache)  # outside the press context: the questions are not compressed
            kind = "full" if key == "full" else "press"
            timings[kind].append(time.time() - t)
            record(key, gens, timings[kind][-1], extra)
            del cache


def record_questions(args, tok, case, runs, key, outputs, lens, secs, extra=""):
    """outputs: generated ids per question, or (pipeline mode) decoded strings."""
    for qid, q, out, n in zip(case["qids"], case["questions"], outputs, lens):
        text = out if isinstance(out, str) else tok.decode(out, skip_special_tokens=True)
        ok = q["answer"] in text
        runs[key][qid] = {"pass": ok, "output": text, "prompt_tokens": n}
        if args.verbose:
            log(f"  {key:<28} {qid:<24} {'PASS' if ok else 'fail'} {text!r}")
    if args.verbose:
        log(f"  {key:<28} {len(outputs)} question(s) in {secs:.2f} s{extra}")


def make_pipeline(model, tok, template):
    if template == "plain":
        tok.chat_template = None  # the pipeline's branch for tokenizers without a template
    return transformers.pipeline("kv-press-text-generation", model=model, tokenizer=tok)


def run_pipeline_document(args, tok, model, pipe, case, todo, budgets, runs, timings, label):
    """One document through kvpress's KVPressTextGenerationPipeline, once per run."""
    questions = [args.pipeline_sep + q["question"] for q in case["questions"]]
    # What the pipeline will feed: its own preprocess, with the arguments its __call__ passes.
    fed = pipe.preprocess(
        case["context"],
        questions=questions,
        answer_prefix="",
        max_context_length=min(tok.model_max_length, int(1e10)),
    )
    n = fed["context_ids"].shape[1]
    qlens = [q.shape[1] for q in fed["questions_ids"]]
    lens = [n + m for m in qlens]
    log(
        f"{label} {case['id']}: {n} context tokens (the pipeline's), then {len(questions)} questions "
        f"of {min(qlens)}..{max(qlens)} tokens, {len(todo)} run(s)"
    )
    if args.verbose:
        ctx = fed["context_ids"][0].tolist()
        q0 = fed["questions_ids"][0][0].tolist()
        log(f"  context starts {tok.decode(ctx[:40])!r}, ends {tok.decode(ctx[-8:])!r}")
        log(f"  question 1: {tok.decode(q0)!r}")
    for key in todo:
        press = None
        if key != "full":
            name, b = key.split("@", 1)
            press = PRESSES[name](compression_ratio(budgets[b], n))
        clear_masks(model)
        cache = DynamicCache()
        t = time.time()
        out = pipe(case["context"], questions=questions, press=press, max_new_tokens=args.max_new_tokens, cache=cache)
        kind = "full" if key == "full" else "press"
        timings[kind].append(time.time() - t)
        extra = "; " + cache_summary(model, cache, n) if args.verbose and press is not None else ""
        record_questions(args, tok, case, runs, key, out["answers"], lens, timings[kind][-1], extra)
        del cache


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    presses = [p.strip() for p in args.presses.split(",") if p.strip()]
    unknown = [p for p in presses if p not in PRESSES]
    if unknown:
        sys.exit(f"unknown press {', '.join(unknown)}; known: {', '.join(PRESSES)}")
    budget_specs = [b.strip() for b in args.budgets.split(",") if b.strip()]
    budgets = {b: parse_budget(b) for b in budget_specs}
    cases = load_cases(args.cases, args.limit)
    if args.mode == "pipeline":
        prompts = [c["id"] for c in cases if "context" not in c]
        if prompts:
            sys.exit(
                f"--mode pipeline evaluates documents only; {len(prompts)} prompt case(s), first {prompts[0]!r}"
            )
    order = ["full"] + [f"{p}@{b}" for p in presses for b in budget_specs]

    runs = {}
    if args.resume and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as f:
            runs = {k: v["cases"] for k, v in json.load(f)["runs"].items()}
    # Runs not asked for this time are kept in the file but not reported in the table.
    for key in order:
        runs.setdefault(key, {})
    all_keys = order + [k for k in runs if k not in order]

    t0 = time.time()
    tok, model = load_model(args.model, args.threads)
    stop = eos_ids(model)
    check_attention_patch(model)
    log(
        f"model {os.path.basename(args.model)}: {model.config.num_hidden_layers} layers, "
        f"attention {model.config._attn_implementation}, float32, {args.threads} thread(s), "
        f"loaded in {time.time() - t0:.1f} s; kvpress {importlib.metadata.version('kvpress')} "
        f"torch {torch.__version__} transformers {transformers.__version__}; "
        f"BOS {args.bos} (id {tok.bos_token_id}), stop ids {sorted(stop)}, mode {args.mode}"
        + (
            f" (template {args.pipeline_template}, separator {args.pipeline_sep!r}; --bos does not apply)"
            if args.mode == "pipeline"
            else ""
        )
    )
    pipe = make_pipeline(model, tok, args.pipeline_template) if args.mode == "pipeline" else None

    timings = {"prefill": [], "full": [], "press": []}
    for ci, case in enumerate(cases):
        cid = case["id"]
        todo = [k for k in order if any(q not in runs[k] for q in case["qids"])]
        if not todo:
            continue
        if "context" in case:
            label = f"[{ci + 1}/{len(cases)}]"
            if args.mode == "pipeline":
                run_pipeline_document(args, tok, model, pipe, case, todo, budgets, runs, timings, label)
            else:
                run_document(args, tok, model, stop, case, todo, budgets, runs, timings, label)
            clear_masks(model)
            write_json(args.json, runs, all_keys)
            continue
        ids = tokenize(tok, case["prompt"], args.bos)
        n = ids.shape[1]
        log(f"[{ci + 1}/{len(cases)}] {cid}: {n} prompt tokens, {len(todo)} run(s)")

        def record(key, generated, secs, extra=""):
            text = tok.decode(generated, skip_special_tokens=True)
            ok = case["answer"] in text
            runs[key][cid] = {"pass": ok, "output": text, "prompt_tokens": n}
            if args.verbose:
                log(f"  {key:<28} {'PASS' if ok else 'fail'} {secs:6.2f} s  {text!r}{extra}")

        if args.mode == "replay":
            t = time.time()
            first, cache, kv, inputs = full_prefill(model, ids)
            timings["prefill"].append(time.time() - t)
            if args.verbose:
                log(f"  prefill {timings['prefill'][-1]:.2f} s")
            if "full" in todo:
                clear_masks(model)
                t = time.time()
                gen = decode(model, cache, first, n, args.max_new_tokens, stop)
                timings["full"].append(time.time() - t)
                record("full", gen, timings["full"][-1])
            del cache
            for key in todo:
                if key == "full":
                    continue
                name, b = key.split("@", 1)
                press = PRESSES[name](compression_ratio(budgets[b], n))
                clear_masks(model)
                t = time.time()
                pcache = replay_compress(model, press, kv, inputs)
                extra = "; " + cache_summary(model, pcache, n) if args.verbose else ""
                gen = decode(model, pcache, first, n, args.max_new_tokens, stop)
                timings["press"].append(time.time() - t)
                record(key, gen, timings["press"][-1], extra)
                del pcache
            del kv, inputs
        else:
            for key in todo:
                clear_masks(model)
                t = time.time()
                if key == "full":
                    with torch.inference_mode():
                        cache = DynamicCache()
                        first = model(input_ids=ids, past_key_values=cache, logits_to_keep=1).logits[0, -1]
                    extra = ""
                else:
                    name, b = key.split("@", 1)
                    press = PRESSES[name](compression_ratio(budgets[b], n))
                    first, cache = hooked_prefill(model, press, ids)
                    extra = "; " + cache_summary(model, cache, n) if args.verbose else ""
                gen = decode(model, cache, first, n, args.max_new_tokens, stop)
                timings["full" if key == "full" else "press"].append(time.time() - t)
                record(key, gen, timings["full" if key == "full" else "press"][-1], extra)
                del cache
        clear_masks(model)
        write_json(args.json, runs, all_keys)

    write_json(args.json, runs, all_keys)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    what = {"replay": "compress + decode", "hooks": "prefill + decode", "pipeline": "pipeline call"}[args.mode]
    if any("context" in c for c in cases):
        what += ", a document's questions included"
    log(
        f"seconds: prefill {mean(timings['prefill']):.2f} per case ({len(timings['prefill'])}), "
        f"full run {mean(timings['full']):.2f}, press run {mean(timings['press']):.2f} "
        f"({what}, {len(timings['press'])} runs); "
        f"total {time.time() - t0:.1f} s"
    )
    print_table(runs, presses, budget_specs, [q for c in cases for q in c["qids"]])


if __name__ == "__main__":
    main()
