#!/usr/bin/env bash
# Regenerates every golden file under tests/golden owned by these scripts (offline, CPU only).
#
#   python3 -m venv /path/to/venv && /path/to/venv/bin/pip install -r scripts/golden/requirements.txt
#   GOLDEN_PYTHON=/path/to/venv/bin/python scripts/golden/make_all.sh
#
# The SmolLM2 step needs the default model (`kvslice fetch`) at
# ${KVSLICE_CACHE_DIR:-~/.cache/kvslice}/models/SmolLM2-135M-Instruct.Q4_1.gguf.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${GOLDEN_PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

"$PY" scripts/golden/tiny_models.py
"$PY" scripts/golden/tiny_gguf.py      # reads tests/golden/tiny/llama
"$PY" scripts/golden/smollm2.py
"$PY" scripts/golden/versions.py
