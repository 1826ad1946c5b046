#!/usr/bin/env bash
# What the E2B compatibility tests (crates/cli/tests/e2b_sdk.rs) need: a venv at target/e2b-venv made with
# /usr/bin/python3 holding the pinned packages of tests/e2b/requirements.txt, and the pinned `e2b` npm package of
# tests/e2b-node (package.json + lock) in target/e2b-node. Idempotent and quiet: pip and npm run only when something is
# missing or a pinned version differs.
#
#   scripts/setup-e2b.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/e2b-venv
requirements=tests/e2b/requirements.txt

# Debian's python3 has no ensurepip (so no `-m venv`) without python3-venv.
if ! /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup-e2b: python3-venv is missing (run as root to install it)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi

# Every `name==version` of the requirements file installed at exactly that version?
pinned_present() {
  [ -x "$venv/bin/python" ] || return 1
  "$venv/bin/python" - "$requirements" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
}

if ! pinned_present; then
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  pinned_present || { echo "setup-e2b: $venv does not hold the versions of $requirements after pip" >&2; exit 1; }
fi

node_dir=target/e2b-node
if ! cmp -s tests/e2b-node/package-lock.json "$node_dir/package-lock.json" ||
  [ ! -f "$node_dir/node_modules/e2b/package.json" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup-e2b: npm is missing (the nodejs package of scripts/setup.sh brings it)" >&2
    exit 1
  fi
  mkdir -p "$node_dir"
  cp tests/e2b-node/package.json tests/e2b-node/package-lock.json "$node_dir/"
  (cd "$node_dir" && npm ci --no-audit --no-fund --silent)
fi
