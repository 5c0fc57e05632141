#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, fetch SmolLM2-135M-Instruct,
# answer a chat prompt, then answer a question about a long document.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
cargo build --locked -p kvslice-cli
KV="cargo run --locked -q -p kvslice-cli --"
$KV fetch
echo "== chat =="
$KV generate -v --chat --prompt "What is the capital of France? Answer in one sentence." --max-new-tokens 48
echo "== long context (~2,300 tokens; a hardware GPU through wgpu, else the CPU backend) =="
$KV generate -v --device auto --chat --prompt "$(python3 scripts/long_prompt.py)" --max-new-tokens 24
