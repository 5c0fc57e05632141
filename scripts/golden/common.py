"""Shared helpers for the golden-data generators (offline, deterministic)."""

import json
import os
import platform
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN_DIR = os.path.join(REPO_ROOT, "tests", "golden")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    # One thread: the reduction order (and so the last bits of every logit) does not
    # depend on the machine's core count.
    torch.set_num_threads(1)


def versions() -> dict:
    import gguf  # noqa: F401
    import importlib.metadata as md
    import safetensors
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": md.version("gguf"),
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def sig6(x: float) -> float:
    """Round a float to 6 significant digits (kept as a JSON number)."""
    return float(f"{float(x):.6g}")


def round_rows(arr) -> list:
    a = np.asarray(arr, dtype=np.float32)
    return [[sig6(v) for v in row] for row in a.tolist()]


def top_k(logits_row: torch.Tensor, k: int) -> list:
    """Top-k (token id, logit) pairs of one f32 row, highest first; ties by lower id."""
    row = logits_row.detach().to(torch.float32).cpu().numpy()
    order = np.lexsort((np.arange(row.shape[0]), -row.astype(np.float64)))[:k]
    return [[int(i), float(row[i])] for i in order]


def _is_flat(obj) -> bool:
    """A list whose items are scalars or lists of scalars (e.g. ids, a logits row, top-k pairs)."""
    scalar = (int, float, str, bool, type(None))
    return isinstance(obj, list) and all(
        isinstance(x, scalar) or (isinstance(x, list) and all(isinstance(y, scalar) for y in x))
        for x in obj
    )


def _dumps(obj, indent: int) -> str:
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and not _is_flat(obj):
        items = [inner + _dumps(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(obj, list) and obj and isinstance(obj[0], list):
        # one row per line keeps matrices readable and diffs small
        rows = [inner + json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in obj]
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_json(path: str, obj) -> None:
    """Write JSON with nested objects indented and flat arrays on one line."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = _dumps(obj, 0)
    assert json.loads(text) == json.loads(json.dumps(obj))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.relpath(path, REPO_ROOT)} ({os.path.getsize(path)} bytes)", file=sys.stderr)


def sample_positions(n: int) -> list:
    """Positions 0, n/4, n/2, 3n/4 and n-1, deduplicated and sorted."""
    return sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1})
