"""Kept-index sets of the peers' eviction methods on stored random tensors.

Writes, next to the Rust tests of kvslice-policy:
  crates/kvslice-policy/tests/data/peers.safetensors  the tensors (float16, read back exactly)
  crates/kvslice-policy/tests/data/peers.json         per case: method, parameters, kept positions

Peers:
  * NVIDIA kvpress 0.5.5 (PyPI), called directly: each press's `compress` (or `score` + the
    press's own selection) on hand-made modules and tensors; no model is loaded. The presses
    that read no attention weights (KeyDiff, LagKV, CURPress, ChunkKV, BlockPress,
    ExpectedAttention) get none.
  * cakekv (CAKE, ICLR 2025) and FFY0/AdaKV: their prefill eviction formulas, ported below
    (neither is on PyPI); each port follows the published code line by line in torch.

Shapes: L layers, H query heads, H_kv KV heads, n tokens, head dim d.
  q_pre  [L, H, n, d]     pre-RoPE queries (RoPE with theta = ROPE_THETA is applied here and in Rust)
  keys   [L, H_kv, n, d]  cached keys (already rotated, as in a cache)
  values [L, H_kv, n, d]
  w_o    [L, hidden, H*d] output projections (torch Linear weight layout)

Run: /path/to/venv/bin/python scripts/peers/gen_peers.py   (see README.md)
"""

import json
import math
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, repeat_kv

import kvpress
from kvpress import (
    AdaKVPress,
    BlockPress,
    ChunkKVPress,
    CompactorPress,
    CriticalKVPress,
    CURPress,
    ExpectedAttentionPress,
    FinchPress,
    KeyDiffPress,
    KnormPress,
    KVzipPress,
    LagKVPress,
    LeverageScorePress,
    NonCausalAttnPress,
    ObservedAttentionPress,
    PyramidKVPress,
    SimLayerKVPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

SEED = 20250
L, H, HKV, N, D = 4, 4, 2, 160, 16
HIDDEN = H * D
ROPE_THETA = 10000.0
Q_SCALE = 2.0  # sharper attention than unit-variance queries give

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "crates", "kvslice-policy", "tests", "data")


def make_tensors():
    g = torch.Generator().manual_seed(SEED)
    q = (torch.randn(L, H, N, D, generator=g) * Q_SCALE).half()
    k = torch.randn(L, HKV, N, D, generator=g).half()
    v = torch.randn(L, HKV, N, D, generator=g).half()
    w_o = (torch.randn(L, HIDDEN, H * D, generator=g) / math.sqrt(H * D)).half()
    return q, k, v, w_o


def config():
    c = LlamaConfig(
        hidden_size=HIDDEN,
        num_attention_heads=H,
        num_key_value_heads=HKV,
        head_dim=D,
        num_hidden_layers=L,
        rope_theta=ROPE_THETA,
    )
    c._attn_implementation = "sdpa"
    return c


def make_module(cfg, layer, w_o):
    """The attributes of a Llama attention layer that the presses read."""
    m = torch.nn.Module()
    m.config = cfg
    m.layer_idx = layer
    m.head_dim = D
    m.num_key_value_groups = H // HKV
    m.q_proj = torch.nn.Identity()  # hidden states below *are* the pre-RoPE queries
    m.rotary_emb = LlamaRotaryEmbedding(cfg)
    o = torch.nn.Linear(H * D, HIDDEN, bias=False)
    o.weight.data = w_o.float().clone()
    m.o_proj = o
    return m


def rope(cfg, q_pre):
    """HF's rotate-half RoPE at positions 0..n, [1, H, n, d]."""
    rot = LlamaRotaryEmbedding(cfg)
    cos, sin = rot(q_pre, torch.arange(N).unsqueeze(0))
    half = D // 2
    rotated = torch.cat((-q_pre[..., half:], q_pre[..., :half]), dim=-1)
    return q_pre * cos.unsqueeze(1) + rotated * sin.unsqueeze(1), (cos, sin)


def eager_attention(q_rot, k):
    """Causal softmax attention in float32, [1, H, n, n] (what eager mode hands the presses)."""
    kk = repeat_kv(k, H // HKV)
    logits = q_rot @ kk.transpose(2, 3) / math.sqrt(D)
    mask = torch.triu(torch.full((N, N), float("-inf")), diagonal=1)
    return torch.softmax(logits + mask, dim=-1, dtype=torch.float32)


def kept_from_keys(orig, pruned):
    """Positions of the rows of `pruned` [1, H_kv, m, d] inside `orig` [1, H_kv, n, d]."""
    kept = []
    for h in range(orig.shape[1]):
        eq = (pruned[0, h][:, None, :] == orig[0, h][None, :, :]).all(-1)  # [m, n]
        assert (eq.sum(1) == 1).all(), "key rows must be unique to recover positions"
        kept.append(sorted(eq.float().argmax(1).tolist()))
    return kept


class Layer:
    def __init__(self, cfg, l, q, k, v, w_o):
        self.l = l
        self.q_pre = q[l : l + 1].float()
        self.k = k[l : l + 1].float()
        self.v = v[l : l + 1].float()
        self.q_rot, self.pos_emb = rope(cfg, self.q_pre)
        self.att = eager_attention(self.q_rot, self.k)
        self.hidden = self.q_pre.transpose(1, 2).reshape(1, N, H * D)
        self.module = make_module(cfg, l, w_o[l])

    def kwargs(self):
        return {"position_embeddings": self.pos_emb}


def run_press(press, layer, attentions=True):
    keys, values = press.compress(
        layer.module,
        layer.hidden,
        layer.k.clone(),
        layer.v.clone(),
        layer.att if attentions else None,
        layer.kwargs(),
    )
    return kept_from_keys(layer.k, keys)


def run_adakv(press, layer):
    press.compress(layer.module, layer.hidden, layer.k.clone(), layer.v.clone(), layer.att, layer.kwargs())
    _, heads, seqs = layer.module.masked_key_indices
    pruned = [set() for _ in range(HKV)]
    for h, j in zip(heads.tolist(), seqs.tolist()):
        pruned[h].add(j)
    del layer.module.masked_key_indices
    return [sorted(set(range(N)) - p) for p in pruned]


# ---------------------------------------------------------------------------------------------
# Port of cakekv (antgroup/cakekv, cake/utils.py, cake/cake_cache.py, cake/model/modify_llama.py)
# ---------------------------------------------------------------------------------------------


def cake_adjust_budgets(budget_list, total_budget, seq_len, layer_nums):
    budget_list = np.array(budget_list, dtype=int)
    excess = np.maximum(budget_list - seq_len, 0)
    budget_list = np.minimum(budget_list, seq_len)
    total_excess = np.sum(excess)
    if total_excess > 0:
        valid = budget_list < seq_len
        nv = np.sum(valid)
        if nv > 0:
            budget_list[valid] += total_excess // nv
            budget_list[np.where(valid)[0][: total_excess % nv]] += 1
    diff = total_budget - np.sum(budget_list)
    if diff != 0:
        valid = budget_list < seq_len if diff > 0 else budget_list > 1
        nv = np.sum(valid)
        if nv > 0:
            per, rem = abs(diff) // nv, abs(diff) % nv
            if diff > 0:
                budget_list[valid] += per
                budget_list[np.where(valid)[0][:rem]] += 1
            else:
                budget_list[valid] -= per
                budget_list[np.where(valid)[0][:rem]] -= 1
    return budget_list.tolist()


def cake_layer_scores(layer, window, gamma, tau1, tau2):
    """Preference score and eviction indicator of one layer, as modify_llama.py computes them."""
    kk = repeat_kv(layer.k, H // HKV)
    w = window
    att = layer.q_rot[..., -w:, :] @ kk.transpose(2, 3) / math.sqrt(D)
    mask = torch.full((w, w), torch.finfo(att.dtype).min)
    cond = torch.arange(w)
    mask.masked_fill_(cond < (cond + 1).view(w, 1), 0)
    att[:, :, -w:, -w:] += mask[None, None]
    att = torch.softmax(att, dim=-1, dtype=torch.float32)
    pre = att[:, :, -w:, :-w]
    disp = -torch.sum(pre * torch.log(pre + 1e-10))
    var = torch.var(pre, dim=-2).sum(0).sum(0).sum(0)
    pref = (disp ** (1 / tau1) * var ** (1 / tau2)).numpy()
    score = att.mean(dim=-2) + gamma * att.var(dim=-2)
    score = score[:, :, :-w]
    score = F.avg_pool1d(score, kernel_size=5, padding=2, stride=1)
    score = score.reshape(1, HKV, H // HKV, -1).mean(dim=-2)
    return float(pref), score


def cake_run(layers, cache_size, window, gamma, tau1, tau2, cascading):
    """CakeprefillKVCache over all layers; returns kept positions [L][H_kv] and layer budgets."""
    total_size = (cache_size - window) * L
    prefs, scores, kept_idx = [], [], []
    budgets_out = None
    for layer in layers:
        pref, score = cake_layer_scores(layer, window, gamma, tau1, tau2)
        prefs.append(pref)
        scores.append(score)
        kept_idx.append(torch.arange(N - window).view(1, 1, -1).expand(1, HKV, -1))
        if not cascading and len(prefs) < L:
            continue
        budgets = [p / sum(prefs) * total_size for p in prefs]
        budgets = cake_adjust_budgets(budgets, total_size, N - window, L)
        for i, b in enumerate(budgets):
            b = min(b, N - window, scores[i].shape[-1])
            idx = scores[i].topk(b, dim=-1).indices
            scores[i] = scores[i].gather(2, idx)
            kept_idx[i] = kept_idx[i].gather(2, idx)
        budgets_out = budgets
    kept = []
    for i in range(L):
        kept.append([sorted(kept_idx[i][0, h].tolist() + list(range(N - window, N))) for h in range(HKV)])
    return kept, [int(b) + window for b in budgets_out]


# ---------------------------------------------------------------------------------------------
# Port of FFY0/AdaKV (adaptive_snapkv/monkeypatch/snapkv_utils.py: SnapKVCluster,
# AdaptiveSnapKVCluster), GQA groups averaged after pooling as in its GQA support
# ---------------------------------------------------------------------------------------------


def adakv_window_scores(layer, window, kernel, pooling):
    kk = repeat_kv(layer.k, H // HKV)
    w = window
    att = layer.q_rot[..., -w:, :] @ kk.transpose(2, 3) / math.sqrt(D)
    mask = torch.full((w, w), torch.finfo(att.dtype).min)
    cond = torch.arange(w)
    mask.masked_fill_(cond < (cond + 1).view(w, 1), 0)
    att[:, :, -w:, -w:] += mask[None, None]
    att = torch.softmax(att, dim=-1, dtype=torch.float32)
    mean = att[:, :, -w:, :-w].mean(dim=-2)
    if pooling == "maxpool":
        pooled = F.max_pool1d(mean, kernel_size=kernel, padding=kernel // 2, stride=1)
    else:
        pooled = F.avg_pool1d(mean, kernel_size=kernel, padding=kernel // 2, stride=1)
    return pooled.reshape(1, HKV, H // HKV, -1).mean(dim=-2)


def snapkv_cluster(layer, window, kernel, pooling, max_capacity_prompt):
    score = adakv_window_scores(layer, window, kernel, pooling)
    idx = score.topk(max_capacity_prompt - window, dim=-1).indices
    return [sorted(idx[0, h].tolist() + list(range(N - window, N))) for h in range(HKV)]


def adaptive_snapkv_cluster(layer, window, kernel, pooling, base_capacity, floor_alpha):
    score = adakv_window_scores(layer, window, kernel, pooling)
    base = base_capacity - window
    floor = int(base * floor_alpha)
    sorted_score, sorted_idx = score.sort(dim=-1, descending=True)
    length = sorted_score.size(-1)
    flat = sorted_score.reshape(1, length * HKV)
    top = torch.topk(flat, k=HKV * base, dim=-1).indices // length
    cap = torch.zeros((1, HKV), dtype=top.dtype)
    cap.scatter_add_(-1, top, torch.ones_like(top))
    cap = torch.round(cap * (1 - floor_alpha) + floor).int()
    kept = [sorted(sorted_idx[0, h, : cap[0, h]].tolist() + list(range(N - window, N))) for h in range(HKV)]
    return kept, [int(c) + window for c in cap[0]]


def main():
    torch.manual_seed(0)
    q, k, v, w_o = make_tensors()
    cfg = config()
    layers = [Layer(cfg, l, q, k, v, w_o) for l in range(L)]
    cases = []

    def per_layer(name, method, params, fn):
        kept = [fn(layer) for layer in layers]
        cases.append({"name": name, "method": method, "params": params, "kept": kept})

    for cr in (0.25, 0.5):
        per_layer(f"snapkv_w64_cr{cr}", "snapkv", {"window": 64, "kernel": 5, "compression_ratio": cr},
                  lambda ly: run_press(SnapKVPress(compression_ratio=cr, window_size=64, kernel_size=5), ly))
    for cr in (0.5, 0.75):
        per_layer(f"snapkv_w16_cr{cr}", "snapkv", {"window": 16, "kernel": 5, "compression_ratio": cr},
                  lambda ly: run_press(SnapKVPress(compression_ratio=cr, window_size=16, kernel_size=5), ly))
        per_layer(f"tova_cr{cr}", "tova", {"compression_ratio": cr},
                  lambda ly: run_press(TOVAPress(compression_ratio=cr), ly))
        per_layer(f"knorm_cr{cr}", "knorm", {"compression_ratio": cr},
                  lambda ly: run_press(KnormPress(compression_ratio=cr), ly))
        per_layer(f"observed_cr{cr}", "h2o-kvpress", {"compression_ratio": cr},
                  lambda ly: run_press(ObservedAttentionPress(compression_ratio=cr), ly))
        per_layer(f"streaming_cr{cr}", "streaming-llm", {"n_sink": 4, "compression_ratio": cr},
                  lambda ly: run_press(StreamingLLMPress(compression_ratio=cr, n_sink=4), ly))
        per_layer(f"expected_cr{cr}", "expected-attention",
                  {"n_future_positions": 512, "n_sink": 4, "compression_ratio": cr},
                  lambda ly: run_press(ExpectedAttentionPress(compression_ratio=cr), ly, attentions=False))
        per_layer(f"expected_nocov_cr{cr}", "expected-attention-nocov",
                  {"n_future_positions": 512, "n_sink": 4, "compression_ratio": cr},
                  lambda ly: run_press(ExpectedAttentionPress(compression_ratio=cr, use_covariance=False), ly,
                                       attentions=False))
        per_layer(f"critical_snapkv_w16_cr{cr}", "critical-snapkv", {"window": 16, "kernel": 5, "compression_ratio": cr},
                  lambda ly: run_press(CriticalKVPress(SnapKVPress(compression_ratio=cr, window_size=16, kernel_size=5)), ly))
        per_layer(f"adakv_kvpress_w16_cr{cr}", "adakv-kvpress", {"window": 16, "kernel": 5, "compression_ratio": cr, "alpha": 0.2},
                  lambda ly: run_adakv(AdaKVPress(SnapKVPress(compression_ratio=cr, window_size=16, kernel_size=5)), ly))
    for cr in (0.4, 0.5):
        press = PyramidKVPress(compression_ratio=cr, window_size=32, kernel_size=5, beta=20)
        budgets = [press.get_layer_budget(ly.module, N) for ly in layers]
        per_layer(f"pyramidkv_w32_cr{cr}", "pyramidkv", {"window": 32, "kernel": 5, "beta": 20, "compression_ratio": cr},
                  lambda ly: run_press(PyramidKVPress(compression_ratio=cr, window_size=32, kernel_size=5, beta=20), ly))
        cases[-1]["layer_budgets"] = budgets

    # attention-free presses on the cached keys (and values)
    for cr in (0.25, 0.5, 0.75):
        per_layer(f"keydiff_cr{cr}", "keydiff", {"compression_ratio": cr},
                  lambda ly: run_press(KeyDiffPress(compression_ratio=cr), ly, attentions=False))
    # LagKV: partitions of 16 (8 scored, a tail of 28) and 24 (5 scored, a tail of 36); the budgets
    # keep whole ranks of every partition, so no tie between equal ranks is cut
    for lag, cr in ((16, 0.5), (16, 0.75), (24, 0.25), (24, 0.5)):
        per_layer(f"lagkv_lag{lag}_cr{cr}", "lagkv", {"n_sink": 4, "lag_size": lag, "cross_scoring": False,
                                                      "compression_ratio": cr},
                  lambda ly: run_press(LagKVPress(compression_ratio=cr, n_sink=4, lag_size=lag), ly, attentions=False))
    for lag, cr in ((16, 0.5), (16, 0.6)):
        per_layer(f"lagkv_cross_lag{lag}_cr{cr}", "lagkv", {"n_sink": 4, "lag_size": lag, "cross_scoring": True,
                                                            "compression_ratio": cr},
                  lambda ly: run_press(LagKVPress(compression_ratio=cr, n_sink=4, lag_size=lag, cross_scoring=True), ly,
                                       attentions=False))
    # the default lag of 128 leaves nothing to score in 160 tokens: kvpress's positional fallback
    per_layer("lagkv_lag128_cr0.5", "lagkv", {"n_sink": 4, "lag_size": 128, "cross_scoring": False,
                                              "compression_ratio": 0.5},
              lambda ly: run_press(LagKVPress(compression_ratio=0.5, n_sink=4, lag_size=128), ly, attentions=False))
    # CurDKV (CURPress, without its random projection): 4 sinks, local windows of 16 (24 leaves a
    # last window of 16 tokens), every leverage combination
    for lev, local, w, cr in (("kv_product", True, 16, 0.5), ("kv_product", True, 16, 0.75), ("kv_avg", True, 16, 0.5),
                              ("key", True, 16, 0.5), ("value", True, 16, 0.5), ("kv_product", False, 16, 0.5),
                              ("kv_product", True, 24, 0.5)):
        per_layer(f"cur_{lev}_{'local' + str(w) if local else 'global'}_cr{cr}", "cur",
                  {"num_sinks": 4, "leverage_type": lev, "use_local_approximation": local, "local_window_size": w,
                   "compression_ratio": cr},
                  lambda ly: run_press(CURPress(compression_ratio=cr, num_sinks=4, leverage_type=lev,
                                                use_local_approximation=local, local_window_size=w), ly,
                                       attentions=False))
    # BlockPress: KeyDiff's block-wise prefill, blocks of 32 and 48 after the first n_kept tokens
    # (KeyDiff does not depend on the order of the cache, which BlockPress leaves in score order)
    for block, cr in ((32, 0.5), (32, 0.75), (48, 0.5)):
        per_layer(f"block_keydiff_b{block}_cr{cr}", "block-keydiff", {"block_size": block, "compression_ratio": cr},
                  lambda ly: run_press(BlockPress(KeyDiffPress(compression_ratio=cr), block_size=block), ly,
                                       attentions=False))
    # ChunkKV over SnapKV (window attention computed by the press: ChunkKVPress takes no
    # attentions) and over KeyDiff; chunks of 24 leave a last chunk of 16 tokens
    for chunk, cr in ((20, 0.5), (20, 0.75), (24, 0.5)):
        per_layer(f"chunkkv_snapkv_w16_c{chunk}_cr{cr}", "chunkkv-snapkv",
                  {"window": 16, "kernel": 5, "chunk_length": chunk, "compression_ratio": cr},
                  lambda ly: run_press(ChunkKVPress(SnapKVPress(compression_ratio=cr, window_size=16, kernel_size=5),
                                                    chunk_length=chunk), ly, attentions=False))
    for chunk, cr in ((20, 0.5), (24, 0.25)):
        per_layer(f"chunkkv_keydiff_c{chunk}_cr{cr}", "chunkkv-keydiff", {"chunk_length": chunk, "compression_ratio": cr},
                  lambda ly: run_press(ChunkKVPress(KeyDiffPress(compression_ratio=cr), chunk_length=chunk), ly,
                                       attentions=False))

    # NonCausalAttnPress (Compactor's attention score): 160 tokens in one padded chunk of 256, in
    # chunks of 64 (the last padded with 32 zero rows) and of 32 (no padding)
    for chunk, cr in ((256, 0.5), (64, 0.5), (64, 0.75), (32, 0.25)):
        per_layer(f"non_causal_c{chunk}_cr{cr}", "non-causal-attn", {"chunk_size": chunk, "compression_ratio": cr},
                  lambda ly: run_press(NonCausalAttnPress(compression_ratio=cr, chunk_size=chunk), ly,
                                       attentions=False))

    # LeverageScorePress on the pre-RoPE keys (the stored keys rotated back by their positions,
    # handed to the press in place of its k_proj), with a Gaussian sketch per layer drawn here
    # from a seeded generator and stored, in place of the press's unseeded torch.randn
    sketches = []
    for ly in layers:
        g = torch.Generator().manual_seed(SEED + 100 + ly.l)
        sketches.append(torch.randn(1, HKV, D, 48, generator=g))  # N(0, 1); the press scales it
    leverage_module = sys.modules[LeverageScorePress.__module__]

    def run_leverage(press, ly, offset=0):
        cos, sin = ly.pos_emb
        half = D // 2
        rotated = torch.cat((-ly.k[..., half:], ly.k[..., :half]), dim=-1)
        k_pre = ly.k * cos.unsqueeze(1) - rotated * sin.unsqueeze(1)
        phi = sketches[ly.l]
        saved = (leverage_module.get_prerope_key_states, torch.randn)
        # the press may see a slice of the prompt (Compactor's, from `offset`)
        leverage_module.get_prerope_key_states = lambda module, hidden: k_pre[..., offset : offset + hidden.shape[-2], :]
        torch.randn = lambda *a, **kw: phi.clone()
        try:
            return run_press(press, ly, attentions=False)
        finally:
            leverage_module.get_prerope_key_states, torch.randn = saved

    for cr in (0.25, 0.5, 0.75):
        per_layer(f"leverage_k48_cr{cr}", "leverage", {"sketch_dimension": 48, "compression_ratio": cr},
                  lambda ly: run_leverage(LeverageScorePress(compression_ratio=cr, sketch_dimension=48), ly))

    # CompactorPress: the blend of the two above over the prompt without its sinks and recent
    # tokens (the leverage sketch injected as above), blending = the compression ratio by default
    for sinks, recent, chunk, cr, blending in ((8, 4, 256, 0.5, None), (8, 4, 64, 0.25, None), (8, 4, 64, 0.75, None),
                                                (4, 2, 32, 0.5, 1.5)):
        per_layer(f"compactor_s{sinks}_r{recent}_c{chunk}_cr{cr}_b{blending}", "compactor",
                  {"sink_size_start": sinks, "sink_size_end": recent, "chunk_size": chunk, "sketch_dimension": 48,
                   "compression_ratio": cr, "blending": blending},
                  lambda ly: run_leverage(CompactorPress(compression_ratio=cr, sink_size_start=sinks, sink_size_end=recent,
                                                         chunk_size=chunk, sketch_dimension=48, blending=blending),
                                          ly, offset=sinks))

    # SimLayerKVPress: the last query's attention on 4 initial + 32 (or 48) recent keys is
    # 0.27 / 0.22 / 0.30 / 0.20 (0.39 / 0.39 / 0.39 / 0.26) in the four layers, so these
    # thresholds make two, three, three and no layers lazy
    for threshold, recent in ((0.25, 32), (0.21, 32), (0.35, 48), (1.0, 32)):
        per_layer(f"simlayerkv_t{threshold}_r{recent}", "simlayerkv",
                  {"lazy_threshold": threshold, "n_last": 1, "n_recent": recent, "n_initial": 4},
                  lambda ly: run_press(SimLayerKVPress(lazy_threshold=threshold, n_last=1, n_recent=recent,
                                                       n_initial=4), ly, attentions=False))

    # KVzipPress: its reconstruction scoring (`score_kvzip`) and its selection (`compress_post`)
    # on the stored tensors. The first 128 tokens are the context and the last 32 stand for the
    # reconstruction tokens (their queries and keys, as if appended to the context's cache);
    # positions 4..128 are repeated in one chunk or two (4..64, 64..128), the first 4 playing the
    # chat template's prefix, which is not repeated, and the sinks
    ctx = 128

    def run_kvzip(cr, layerwise, chunks):
        press = KVzipPress(compression_ratio=cr, layerwise=layerwise, n_sink=4)
        press.context_length = ctx
        press.score_val = torch.zeros(L, 1, HKV, ctx)
        for ly in layers:
            cos, sin = ly.pos_emb
            kwargs = {"position_embeddings": (cos[:, ctx:], sin[:, ctx:])}
            for start, end in chunks:
                press.start_idx, press.end_idx = start, end
                press.score_kvzip(ly.module, ly.hidden[:, ctx:], ly.k.clone(), ly.v.clone(), None, kwargs)
        model = types.SimpleNamespace(
            model=types.SimpleNamespace(layers=[types.SimpleNamespace(self_attn=ly.module) for ly in layers]))
        press.compress_post(model)
        kept = []
        for ly in layers:
            _, heads, seqs = ly.module.masked_key_indices
            pruned = [set() for _ in range(HKV)]
            for h, j in zip(heads.tolist(), seqs.tolist()):
                pruned[h].add(j)
            del ly.module.masked_key_indices
            kept.append([sorted(set(range(ctx)) - p) for p in pruned])
        return kept

    for cr, layerwise, chunks in ((0.5, False, ((4, 128),)), (0.75, False, ((4, 64), (64, 128))),
                                  (0.5, True, ((4, 64), (64, 128)))):
        cases.append({"name": f"kvzip_cr{cr}_{'layerwise' if layerwise else 'global'}_chunks{len(chunks)}",
                      "method": "kvzip",
                      "params": {"compression_ratio": cr, "layerwise": layerwise, "n_sink": 4, "context": ctx,
                                 "chunks": [list(c) for c in chunks]},
                      "kept": run_kvzip(cr, layerwise, chunks)})

    # snapkv, the paper's code: window 32, max-pool 7
    for cap in (64, 96):
        per_layer(f"snapkv_original_cap{cap}", "snapkv-original", {"window": 32, "kernel": 7, "max_capacity_prompt": cap},
                  lambda ly: snapkv_cluster(ly, 32, 7, "maxpool", cap))

    # Ada-KV, the paper's code
    for cap in (48, 64, 96):
        kept, budgets = [], []
        for ly in layers:
            kk, bb = adaptive_snapkv_cluster(ly, 32, 7, "maxpool", cap, 0.2)
            kept.append(kk)
            budgets.append(bb)
        cases.append({"name": f"adakv_original_cap{cap}", "method": "adakv-original",
                      "params": {"window": 32, "kernel": 7, "base_capacity": cap, "alpha": 0.2},
                      "kept": kept, "head_budgets": budgets})

    # CAKE, one-shot and cascading
    for cache_size, tau1, tau2 in ((64, 1.0, 1.0), (48, 1.6, 0.4), (96, 1.0, 1.0)):
        for cascading in (False, True):
            kept, budgets = cake_run(layers, cache_size, 32, 200.0, tau1, tau2, cascading)
            cases.append({"name": f"cake_cs{cache_size}_t{tau1}_{tau2}_{'cascade' if cascading else 'oneshot'}",
                          "method": "cake", "params": {"window": 32, "gamma": 200.0, "cache_size": cache_size,
                                                        "tau1": tau1, "tau2": tau2, "cascading": cascading},
                          "kept": kept, "layer_budgets": budgets})

    # Finch: the question is the window (FinchPress finds it from a delimiter token; set directly
    # here). Key rerotation changes the kept keys' rows, not which rows are kept: it is off so that
    # the kept positions can be read back from the keys
    def run_finch(cr, window, normalize):
        press = FinchPress(compression_ratio=cr, normalize_scores=normalize, rerotate_keys=False)
        press.window_size = window
        return lambda ly: run_press(press, ly)

    for cr, window, normalize in ((0.5, 16, True), (0.75, 16, True), (0.75, 24, True), (0.5, 16, False)):
        per_layer(f"finch_w{window}_cr{cr}{'' if normalize else '_raw'}", "finch",
                  {"window": window, "normalize": normalize, "compression_ratio": cr},
                  run_finch(cr, window, normalize))

    os.makedirs(OUT, exist_ok=True)
    save_file({"q_pre": q.contiguous(), "keys": k.contiguous(), "values": v.contiguous(), "w_o": w_o.contiguous(),
               "leverage_sketch": torch.cat(sketches).contiguous()},
              os.path.join(OUT, "peers.safetensors"))
    meta = {
        "layers": L, "heads": H, "kv_heads": HKV, "len": N, "head_dim": D, "hidden": HIDDEN,
        "rope_theta": ROPE_THETA, "seed": SEED,
        "versions": {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
                     "torch": torch.__version__, "numpy": np.__version__},
    }
    with open(os.path.join(OUT, "peers.json"), "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(cases)} cases written to {OUT}")


if __name__ == "__main__":
    main()
