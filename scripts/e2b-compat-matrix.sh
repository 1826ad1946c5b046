#!/usr/bin/env bash
# The E2B compatibility matrix of docs/e2b-compat.md: makes a venv per SDK release pair of tests/e2b/compat-versions.txt
# (target/e2b-compat/e2b-VERSION/venv: those two pins plus requirements.txt's pytest pins; idempotent, reused), then
# runs tests/e2b/compat_matrix.py, which starts one real `sandkasten serve` (SANDKASTEN_BIN, default
# target/debug/sandkasten), runs the whole tests/e2b suite with each venv in turn and writes the table into the doc.
# Arguments go to the driver: `--only VERSION` (repeatable) runs those columns, `--check` compares instead of writing.
# Needs root (the process tier), like the suite.
#
#   scripts/e2b-compat-matrix.sh [--only 2.63.0] [--check]
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/pinned-venv.sh
. scripts/pinned-venv.sh

only=()
args=("$@")
while [ $# -gt 0 ]; do
  if [ "$1" = --only ] && [ $# -gt 1 ]; then only+=("$2"); shift; fi
  shift
done

grep -v '^\s*#' tests/e2b/compat-versions.txt | while read -r e2b interpreter; do
  [ -n "$e2b" ] || continue
  version=${e2b#e2b==}
  if [ ${#only[@]} -gt 0 ] && ! printf '%s\n' "${only[@]}" | grep -qx "$version"; then continue; fi
  dir=target/e2b-compat/e2b-$version
  mkdir -p "$dir"
  { echo "$e2b"; echo "$interpreter"; grep -E '^pytest(-asyncio)?==' tests/e2b/requirements.txt; } >"$dir/requirements.txt.new"
  mv "$dir/requirements.txt.new" "$dir/requirements.txt"
  pinned_venv e2b-compat-matrix "$dir/venv" "$dir/requirements.txt"
done

exec /usr/bin/python3 tests/e2b/compat_matrix.py "${args[@]}"
