#!/usr/bin/env bash
# kvslice beside llama.cpp on the same GGUF file, in one run: llama.cpp as vendored in the
# llama-cpp-python sdist on PyPI (pinned below), built twice — its CPU backend and its Vulkan
# backend (lavapipe here) — and timed with its own llama-bench; kvslice with `kvslice bench`
# on the CPU backend and on wgpu. Prints one markdown table of tok/s (prefill 512, decode of
# 128 tokens after an empty prompt for llama.cpp, decode at depth 16 for kvslice).
#
#   scripts/peers/llama_cpp.sh build   # fetch and build llama-bench (≈ 15 min on 2 cores)
#   scripts/peers/llama_cpp.sh bench   # the side-by-side table (builds first if needed)
#
# Build products live in target/peers/ (ignored by git). Not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.36
PEERS=target/peers
SRC="$PEERS/llama_cpp_python-$VERSION/vendor/llama.cpp"
THREADS="${THREADS:-$(nproc)}"

need_packages() {
    local need=()
    command -v cmake >/dev/null 2>&1 || need+=(cmake)
    command -v glslc >/dev/null 2>&1 || need+=(glslc)
    dpkg -s libvulkan-dev >/dev/null 2>&1 || need+=(libvulkan-dev)
    dpkg -s spirv-headers >/dev/null 2>&1 || need+=(spirv-headers)
    if [ ${#need[@]} -gt 0 ]; then
        local sudo=""
        [ "$(id -u)" -ne 0 ] && sudo="sudo"
        echo "installing: ${need[*]}" >&2
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
}

fetch() {
    [ -d "$SRC" ] && return
    mkdir -p "$PEERS"
    # The sdist's address and digest from PyPI's JSON API (the registry itself).
    python3 - "$VERSION" "$PEERS" <<'EOF'
import hashlib, json, sys, urllib.parse, urllib.request
version, out = sys.argv[1], sys.argv[2]
base = "https://pypi.org/pypi/llama-cpp-python/json"
meta = json.load(urllib.request.urlopen(base))
sdist = next(u for u in meta["releases"][version] if u["packagetype"] == "sdist")
data = urllib.request.urlopen(urllib.parse.urljoin(base, sdist["url"])).read()
digest = hashlib.sha256(data).hexdigest()
if digest != sdist["digests"]["sha256"]:
    sys.exit(f"{sdist['filename']}: sha256 {digest}, PyPI says {sdist['digests']['sha256']}")
open(f"{out}/{sdist['filename']}", "wb").write(data)
print(f"{sdist['filename']}: {len(data)} bytes, sha256 {digest}", file=sys.stderr)
EOF
    tar -xzf "$PEERS/llama_cpp_python-$VERSION.tar.gz" -C "$PEERS"
}

build_one() { # name, extra cmake flags
    local dir="$PEERS/llama-$1"
    [ -x "$dir/bin/llama-bench" ] && return
    echo "building llama-bench ($1) in $dir (log: $dir.log)" >&2
    if ! { cmake -S "$SRC" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON "${@:2}" &&
        cmake --build "$dir" --target llama-bench -j "$THREADS"; } >"$dir.log" 2>&1; then
        tail -20 "$dir.log" >&2
        exit 1
    fi
}

build() {
    need_packages
    fetch
    build_one cpu -DGGML_VULKAN=OFF
    # Needs Vulkan headers of 1.3.261 or later (VK_EXT_layer_settings); Debian 12 ships
    # 1.3.239, where this build fails and the table goes without the Vulkan row.
    (build_one vulkan -DGGML_VULKAN=ON) || echo "llama.cpp's Vulkan backend did not build (log: $PEERS/llama-vulkan.log)" >&2
}

# tok/s of llama-bench's JSON rows: prefill (n_prompt 512) and decode (n_gen 128)
llama_row() { # label, json
    python3 - "$1" "$2" <<'EOF'
import json, sys
label, rows = sys.argv[1], json.load(open(sys.argv[2]))
pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
print(f"| {label} | {pp:.1f} | {tg:.1f} |")
EOF
}

kvslice_row() { # label, json
    python3 - "$1" "$2" <<'EOF'
import json, sys
label, report = sys.argv[1], json.load(open(sys.argv[2]))
pp = next(r["tok_per_s"] for r in report["rows"] if r["kind"] == "prefill")
tg = next(r["tok_per_s"] for r in report["rows"] if r["kind"] == "decode")
print(f"| {label} ({report['device']}) | {pp:.1f} | {tg:.1f} |")
EOF
}

bench() {
    build
    cargo build --locked --workspace --bins >/dev/null
    local kv=target/debug/kvslice model out
    model=$($kv fetch)
    out=$(mktemp -d)
    "$PEERS/llama-cpu/bin/llama-bench" -m "$model" -p 512 -n 128 -t "$THREADS" -r 2 -o json >"$out/llama-cpu.json"
    if [ -x "$PEERS/llama-vulkan/bin/llama-bench" ]; then
        "$PEERS/llama-vulkan/bin/llama-bench" -m "$model" -p 512 -n 128 -t "$THREADS" -ngl 99 -r 2 -o json \
            >"$out/llama-vulkan.json"
    fi
    $kv bench --device cpu --prefill 512 --decode-depth 16 --decode-steps 16 --json "$out/kv-cpu.json" >/dev/null
    $kv bench --device wgpu --prefill 512 --decode-depth 16 --decode-steps 8 --json "$out/kv-wgpu.json" >/dev/null
    echo "| $(basename "$model"), $(date -u +%F), $THREADS threads | prefill 512 tok/s | decode tok/s |"
    echo "|---|---|---|"
    llama_row "llama.cpp $VERSION (llama-cpp-python sdist), CPU" "$out/llama-cpu.json"
    [ -f "$out/llama-vulkan.json" ] && llama_row "llama.cpp $VERSION, Vulkan" "$out/llama-vulkan.json"
    kvslice_row "kvslice, CPU backend" "$out/kv-cpu.json"
    kvslice_row "kvslice, wgpu" "$out/kv-wgpu.json"
}

case "${1:-bench}" in
    build) build ;;
    bench) bench ;;
    *) echo "usage: scripts/peers/llama_cpp.sh build | bench" >&2; exit 2 ;;
esac
