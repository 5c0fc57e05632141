#!/usr/bin/env bash
# `kvslice serve` with real clients.
#   scripts/serve.sh test    the official `openai` Python client against the server on the
#                            default model (CPU backend): chat, streaming, a conversation that
#                            reuses its cache, errors, and a load test (part of scripts/test.sh)
#   scripts/serve.sh bench   ten turns over a 6K-token document: time to first token of the
#                            later turns against re-prefilling (docs/BENCHMARKS.md)
# The CLI comes from the workspace build (target/debug/kvslice); the client is installed from
# PyPI into a virtual environment under the cache folder.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
KV="${CARGO_TARGET_DIR:-target}/debug/kvslice"
CACHE="${KVSLICE_CACHE_DIR:-$HOME/.cache/kvslice}"
VENV="$CACHE/venv-openai"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r tests/serve/requirements.txt
fi
[ -x "$KV" ] || { echo "build the workspace first (cargo test --workspace --no-run)" >&2; exit 1; }
"$KV" fetch --corpus >/dev/null

case "${1:-test}" in
    test) exec "$VENV/bin/python" tests/serve/test_openai.py --kvslice "$KV" ;;
    bench) exec "$VENV/bin/python" tests/serve/bench_turns.py --kvslice "$KV" "${@:2}" ;;
    *) echo "usage: $0 test|bench" >&2; exit 2 ;;
esac
