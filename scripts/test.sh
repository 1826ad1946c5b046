#!/usr/bin/env bash
# The whole test suite, as CI runs it: install what the tests need, lint, build, run every test, then check that the
# host holds nothing of a sandbox any more. Run as root (the process tier needs it; CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo nextest run --workspace --locked --no-fail-fast --profile ci
scripts/check-leaks.sh
