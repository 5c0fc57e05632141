#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system packages (lavapipe, Chromium), the default
# model, native tests on lavapipe and the CPU backend, then the browser demo built for wasm32 and
# tested end to end in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
# Headless (no display session): Mesa's device-select Vulkan layer has no display to pick a
# GPU by and prints an XDG_RUNTIME_DIR error for every Vulkan instance; it is turned off.
[ -n "${XDG_RUNTIME_DIR:-}" ] || export NODEVICE_SELECT=1
rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

# Formatting first: it takes a second and fails the fastest; then the lints (a check build,
# about 7 minutes cold on 2 cores).
cargo fmt --all --check
cargo clippy --locked --workspace --all-targets -- -D warnings
# One build of the whole workspace (tests, the CLI binary) in the dev profile.
cargo test --locked --workspace --no-run
# The default model and the case generators' corpus, through the CLI that build produced (tests
# compare against committed golden data and regenerate the committed retrieval suites). Not
# `cargo run -p kvslice-cli`: that selection resolves features without the workspace's
# dev-dependencies (indexmap's `serde`, through the wasm bindgen) and compiles burn a second time.
"${CARGO_TARGET_DIR:-target}/debug/kvslice" fetch --corpus

cargo test --locked --workspace --no-fail-fast

# `kvslice serve` with the official `openai` Python client (from PyPI): chat against
# transformers' answer, streaming, a conversation that reuses its cache, errors, a load test.
scripts/serve.sh test

# Portability and the browser demo: the web facade's wasm32 build compiles every library crate
# below the CLI (policy, formats, kernels, cache, model, runtime) for the browser; the page then
# generates in headless Chromium (WebGPU on SwiftShader) and must match the native CLI's text,
# and the kernel conformance suite must pass there.
scripts/web.sh test
echo "all tests passed"
