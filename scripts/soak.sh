#!/usr/bin/env bash
# Soak runs (outside CI; results in docs/RELIABILITY.md):
#  1. every decode-time eviction rule for 20,000 tokens on the CPU backend and 2,000 on wgpu,
#     on the tiny seeded model with a 32K context (tests/tests/soak.rs: cache size, storage,
#     determinism across two runs, resident-memory slope);
#  2. SmolLM2-135M-Instruct through `kvslice generate --ignore-eos` at a 256-token budget up to
#     the end of its 8,192-token context, its resident memory sampled every 2 s (slope fitted
#     after the first fifth of the run).
# Usage: scripts/soak.sh [CPU_TOKENS] [WGPU_TOKENS] [SMOLLM2_TOKENS] [POLICIES...]
set -euo pipefail
cd "$(dirname "$0")/.."
cpu_tokens=${1:-20000}
wgpu_tokens=${2:-2000}
smol_tokens=${3:-7900}
shift $(( $# < 3 ? $# : 3 ))
policies=("$@")
[ ${#policies[@]} -gt 0 ] || policies=(streaming-llm h2o knorm:every=64)

KVSLICE_SOAK_TOKENS=$cpu_tokens KVSLICE_SOAK_DEVICE=cpu \
    cargo test --locked --workspace -q --test soak -- --nocapture 2>&1 | grep '^soak'
KVSLICE_SOAK_TOKENS=$wgpu_tokens KVSLICE_SOAK_DEVICE=wgpu \
    cargo test --locked --workspace -q --test soak -- --nocapture 2>&1 | grep '^soak'

cargo build --locked -q --bin kvslice
for policy in "${policies[@]}"; do
    log=$(mktemp)
    start=$(date +%s.%N)
    ./target/debug/kvslice generate --device cpu --chat --prompt "Tell me a very long story about a lighthouse keeper." \
        --max-new-tokens "$smol_tokens" --ignore-eos --temperature 0.8 --top-p 0.95 --seed 1 \
        --policy "$policy" --budget 256 >/dev/null 2>"$log.err" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        [ -n "$rss" ] && echo "$(date +%s.%N) $rss" >>"$log"
        sleep 2
    done
    wait "$pid" || { echo "smollm2 $policy: FAILED"; cat "$log.err"; exit 1; }
    end=$(date +%s.%N)
    python3 - "$policy" "$smol_tokens" "$start" "$end" "$log" "$log.err" <<'PY'
import sys
policy, tokens, start, end, log, err = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
pts = [tuple(map(float, l.split())) for l in open(log) if l.strip()]
t0 = pts[0][0]
pts = [(t - t0, kib / 1024) for t, kib in pts]
warm = [p for p in pts if p[0] >= (pts[-1][0]) / 5]
n = len(warm)
mx, my = sum(p[0] for p in warm) / n, sum(p[1] for p in warm) / n
sxx = sum((p[0] - mx) ** 2 for p in warm) or 1.0
slope = sum((p[0] - mx) * (p[1] - my) for p in warm) / sxx  # MiB per second
wall = end - start
per_1k = slope * wall / tokens * 1000  # MiB per 1000 tokens, the run's average rate
stats = [l.strip() for l in open(err) if "tok/s" in l or "kept" in l]
print(f"smollm2 {policy}: {tokens} tokens in {wall:.0f} s; RSS {min(p[1] for p in warm):.1f}..{max(p[1] for p in warm):.1f} MiB "
      f"after warm-up ({n} samples), slope {per_1k * 1024:+.1f} KiB per 1000 tokens; {' | '.join(stats)}")
PY
    rm -f "$log" "$log.err"
done
