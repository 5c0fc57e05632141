#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system packages (lavapipe), the default model,
# native tests on lavapipe and the CPU backend, and the wasm32 build check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-system.sh
rustup target list --installed | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

# One build of the whole workspace (tests, the CLI binary) in the dev profile.
cargo test --locked --workspace --no-run
# The default model and the case generators' corpus, through the CLI (tests compare against
# committed golden data and regenerate the committed retrieval suites).
cargo run --locked -q -p kvslice-cli -- fetch --corpus

cargo test --locked --workspace --no-fail-fast

# Portability: the library crates below the CLI build for the browser.
cargo check --locked --target wasm32-unknown-unknown -p kvslice-policy -p kvslice-formats -p kvslice-kernels -p kvslice-cache -p kvslice-model -p kvslice-runtime
echo "all tests passed"
