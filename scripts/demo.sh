#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, fetch SmolLM2-135M-Instruct,
# answer a chat prompt, then answer a question about a long document with the whole KV cache
# and with 10% of it kept.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
# Headless (no display session): Mesa's device-select Vulkan layer has no display to pick a
# GPU by and prints an XDG_RUNTIME_DIR error for every Vulkan instance; it is turned off.
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
cargo build --locked -p kvslice-cli
KV="cargo run --locked -q -p kvslice-cli --"
$KV fetch
echo "== chat =="
$KV generate -v --chat --prompt "What is the capital of France? Answer in one sentence." --max-new-tokens 48
LONG="$(python3 scripts/long_prompt.py)"
echo "== long context (2,102 tokens; a hardware GPU through wgpu, else the CPU backend), whole KV cache =="
$KV generate -v --device auto --chat --prompt "$LONG" --max-new-tokens 24
echo "== the same with 10% of the KV cache kept (Ada-KV over span-dilated SnapKV scores) =="
$KV generate -v --device auto --chat --prompt "$LONG" --max-new-tokens 24 --policy adakv-span --budget 10%
