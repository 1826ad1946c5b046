#!/usr/bin/env bash
# What the E2B compatibility tests (crates/cli/tests/e2b_sdk.rs) need: a venv at target/e2b-venv made with
# /usr/bin/python3 holding the pinned packages of tests/e2b/requirements.txt, and the pinned `e2b` and
# `@e2b/code-interpreter` npm packages of tests/e2b-node (package.json + lock) in target/e2b-node. Idempotent and quiet:
# pip and npm run only when something is missing or a pinned version differs. (The older SDK releases of the
# compatibility matrix get their venvs from scripts/e2b-compat-matrix.sh.)
#
#   scripts/setup-e2b.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/e2b-venv
requirements=tests/e2b/requirements.txt

# shellcheck source=scripts/pinned-venv.sh
. scripts/pinned-venv.sh
pinned_venv setup-e2b "$venv" "$requirements"

node_dir=target/e2b-node
if ! cmp -s tests/e2b-node/package-lock.json "$node_dir/package-lock.json" ||
  [ ! -f "$node_dir/node_modules/e2b/package.json" ] ||
  [ ! -f "$node_dir/node_modules/@e2b/code-interpreter/package.json" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup-e2b: npm is missing (the nodejs package of scripts/setup.sh brings it)" >&2
    exit 1
  fi
  mkdir -p "$node_dir"
  cp tests/e2b-node/package.json tests/e2b-node/package-lock.json "$node_dir/"
  (cd "$node_dir" && npm ci --no-audit --no-fund --silent)
fi
