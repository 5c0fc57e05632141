#!/usr/bin/env bash
# Runs every fuzz target (crates/kvslice-fuzz, through the cargo-fuzz project in fuzz/) under
# libFuzzer for EXECS executions each (default 1000000), one job and one worker, and prints
# per target the executions reached, exec/s and crashes found. Run by hand; not part of CI
# (CI replays the saved corpus: cargo test -p kvslice-fuzz).
#
#   scripts/fuzz.sh [EXECS] [TARGET...]
#
# Environment:
#   FUZZ_MAX_TIME   stop each target after this many seconds even below EXECS (default: none)
#   FUZZ_WORK       working corpus, logs and crash artifacts (default: fuzz/work, git-ignored)
#   CARGO_TARGET_DIR  build folder (default: fuzz/target)
#   FUZZ_SANITIZER  cargo fuzz's sanitizer (default: address; "none" runs the tokenizer targets
#                   about fifteen times faster, with panics, timeouts and the memory limit still
#                   caught)
# Needs the nightly toolchain (rustup toolchain install nightly); installs cargo-fuzz if missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EXECS=${1:-1000000}
shift || true
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/fuzz/target}
WORK=${FUZZ_WORK:-$ROOT/fuzz/work}
SEEDS=$ROOT/crates/kvslice-fuzz/corpus
# The wheel target writes archives and extracted members to the temporary folder.
if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then
    export TMPDIR=/dev/shm
fi

ALL=(gguf gguf_tokenizer chat_template chat_encode hf_config safetensors hf_tokenizer budget policy_spec cases sqlite wheel lowrank distill_weights)
TARGETS=("$@")
if [[ ${#TARGETS[@]} -eq 0 ]]; then
    TARGETS=("${ALL[@]}")
fi

max_len() {
    case $1 in
        budget) echo 64 ;;
        policy_spec) echo 256 ;;
        chat_template | chat_encode | hf_config) echo 8192 ;;
        cases) echo 16384 ;;
        *) echo 65536 ;;
    esac
}

# Seeds from the repository's test data, beyond the small ones in crates/kvslice-fuzz/corpus.
golden_seeds() {
    local t=$1 dir=$2 g=$ROOT/tests/golden
    case $t in
        gguf) cp "$g/gguf-quant/quant.gguf" "$g/tokenizer/tiny.gguf" "$dir/" ;;
        gguf_tokenizer) cp "$g/tokenizer/tiny.gguf" "$dir/" ;;
        hf_config)
            for c in "$g"/tiny/*/config.json; do cp "$c" "$dir/$(basename "$(dirname "$c")").json"; done
            cp "$g/tiny/mistral-sharded/model.safetensors.index.json" "$dir/"
            ;;
        hf_tokenizer)
            python3 - "$g/tokenizer/tiny" "$dir/tiny" <<'EOF'
import struct, sys
d = sys.argv[1]
j = open(d + "/tokenizer.json", "rb").read()
c = open(d + "/tokenizer_config.json", "rb").read()
open(sys.argv[2], "wb").write(struct.pack("<H", len(j)) + j + c)
EOF
            ;;
        cases) head -c 16000 "$ROOT/tests/eval/smoke.jsonl" >"$dir/smoke.jsonl" ;;
        sqlite) head -c 65536 "$ROOT/crates/kvslice-eval/tests/data/mixed.db" >"$dir/mixed-prefix.db" ;;
    esac
}

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
(cd "$ROOT/fuzz" && cargo +nightly fuzz build -O -s "${FUZZ_SANITIZER:-address}")
BIN=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release

status=0
summary=()
for t in "${TARGETS[@]}"; do
    corpus=$WORK/corpus/$t
    artifacts=$WORK/artifacts/$t
    logs=$WORK/logs/$t
    mkdir -p "$corpus" "$artifacts" "$logs"
    golden_seeds "$t" "$corpus"
    extra=()
    if [[ -n ${FUZZ_MAX_TIME:-} ]]; then
        extra+=("-max_total_time=$FUZZ_MAX_TIME")
    fi
    echo "== $t: $EXECS executions"
    # -jobs=1 runs the fuzzer in one child process whose output goes to fuzz-0.log in the
    # current folder. No leak detection: targets keep a tokenizer (and its cache) in a static,
    # and a leak check scans the whole heap after every input that allocates more than it frees.
    (cd "$logs" && rm -f fuzz-0.log && "$BIN/$t" "$corpus" "$SEEDS/$t" -runs="$EXECS" -jobs=1 -workers=1 \
        -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len="$(max_len "$t")" -timeout=30 -detect_leaks=0 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${extra[@]}" >/dev/null 2>&1) || true
    log=$logs/fuzz-0.log
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    if [[ -z $execs ]]; then
        # A crash ends the run before the final stats: the last status line has the count.
        execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#' || true)
    fi
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    crashes=$(find "$artifacts" -type f | wc -l)
    line="$t: executions ${execs:-?}, exec/s ${rate:-?}, crash/leak/timeout/oom artifacts $crashes"
    echo "$line"
    summary+=("$line")
    if [[ $crashes -gt 0 ]]; then
        status=1
        find "$artifacts" -type f -printf '    %p\n'
        grep -E 'ERROR: libFuzzer|panicked at|SUMMARY' "$log" | head -n 5 | sed 's/^/    /' || true
    fi
done

echo
echo "== summary ($EXECS executions requested per target; logs under $WORK/logs)"
printf '%s\n' "${summary[@]}"
exit $status
