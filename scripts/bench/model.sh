#!/usr/bin/env bash
# Model speed in one run: kvslice on wgpu and on the CPU backend, then HF transformers (fp32,
# one thread) for scale. Usage: scripts/bench/model.sh [PYTHON_WITH_TRANSFORMERS]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --locked -p kvslice-cli
KV="cargo run --locked -q -p kvslice-cli --"
MODEL=$($KV fetch)
echo "## kvslice, wgpu"
$KV bench -v --prefill 128,512 --decode-depth 16,1024 --decode-steps 16 --device wgpu
echo "## kvslice, cpu"
$KV bench -v --prefill 128,512,2048 --decode-depth 16,1024,4096 --decode-steps 16 --device cpu
if [ -n "${1:-}" ]; then
    echo "## HF transformers, cpu, fp32, 1 thread"
    HF_HUB_OFFLINE=1 "$1" scripts/bench/hf_reference.py "$MODEL" --threads 1 \
        --prefill 128,512,2048 --decode-depth 16,1024,4096
fi
