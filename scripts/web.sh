#!/usr/bin/env bash
# The browser demo.
#   scripts/web.sh build          builds the wasm package into web/pkg (`web` profile: the dev
#                                 profile with dependencies at opt-level 1)
#   scripts/web.sh serve [PORT]   builds it, links the default model (fetched if absent) into
#                                 web/models and serves web/ on http://127.0.0.1:PORT/ (8080)
#   scripts/web.sh test           builds it, serves web/ on a free port and runs the end-to-end
#                                 test in headless Chromium (web/tests/e2e.mjs); the screenshot
#                                 and the results land in web/artifacts/
# The wasm-bindgen step is tools/bindgen, the wasm-bindgen library at the release Cargo.lock
# pins, built with the rest of the workspace (no separate `cargo install`). No wasm-opt pass.
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir() {
    cargo metadata --locked --format-version 1 --no-deps |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])'
}

build() {
    rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
    # rustc has overflowed its default stack on awint_macro_internals (a cubecl dependency)
    # for wasm32 at opt-level 3.
    RUST_MIN_STACK="${RUST_MIN_STACK:-67108864}" cargo build --locked --profile web --target wasm32-unknown-unknown -p kvslice-web
    # Built alone: the bindgen tool shares no dependency with burn, so it cannot change the
    # features (hence the builds) of the crates the tests and the CLI use.
    cargo build --locked -p kvslice-bindgen
    local t
    t="$(target_dir)"
    rm -rf web/pkg
    "$t/debug/kvslice-bindgen" "$t/wasm32-unknown-unknown/web/kvslice_web.wasm" web/pkg
    echo "web/pkg: $(du -b web/pkg/kvslice_web_bg.wasm | cut -f1) bytes of wasm, $(gzip -9 -c web/pkg/kvslice_web_bg.wasm | wc -c) gzipped" >&2
}

# The native CLI: the end-to-end test's reference. KVSLICE_CLI names an existing binary instead.
cli() {
    if [ -n "${KVSLICE_CLI:-}" ]; then
        echo "$KVSLICE_CLI"
        return
    fi
    # The same selection as scripts/test.sh's workspace build: no second build of burn (a build
    # of `-p kvslice-cli` alone resolves features differently and compiles it again).
    cargo test --locked -q --workspace --no-run >&2
    echo "$(target_dir)/debug/kvslice"
}

link_model() {
    local model
    model="$("$(cli)" fetch)"
    mkdir -p web/models
    ln -sf "$model" "web/models/$(basename "$model")"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Serves web/ on 127.0.0.1:$1 in the background; sets SERVER_PID.
start_server() {
    python3 -m http.server "$1" --bind 127.0.0.1 --directory web >web/artifacts/server.log 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 50); do
        if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/index.html', timeout=1)" 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    echo "the static server did not start on 127.0.0.1:$1" >&2
    return 1
}

case "${1:-serve}" in
    build)
        build
        ;;
    serve)
        port="${2:-8080}"
        build
        link_model
        mkdir -p web/artifacts
        echo "serving web/ on http://127.0.0.1:$port/ (Ctrl-C stops)" >&2
        exec python3 -m http.server "$port" --bind 127.0.0.1 --directory web
        ;;
    test)
        build
        link_model
        mkdir -p web/artifacts
        (cd web && npm ci --no-audit --no-fund --loglevel=error)
        port="$(free_port)"
        start_server "$port"
        # The server's children too: a python3 shim (pyenv) may run the interpreter as one.
        trap 'pkill -P "$SERVER_PID" 2>/dev/null || true; kill "$SERVER_PID" 2>/dev/null || true' EXIT
        node web/tests/e2e.mjs --url "http://127.0.0.1:$port/" --cli "$(cli)" --artifacts web/artifacts
        ;;
    *)
        echo "usage: scripts/web.sh build | serve [PORT] | test" >&2
        exit 2
        ;;
esac
