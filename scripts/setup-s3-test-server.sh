#!/usr/bin/env bash
# What the snapshot store's S3 test (crates/snapshot-store/tests/s3.rs) needs: moto's S3-compatible `moto_server` in a
# venv at target/s3-test-venv made with /usr/bin/python3, holding exactly the pinned packages of
# crates/snapshot-store/tests/s3-server/requirements.txt. Idempotent and quiet: pip runs only when a package is missing
# or a pinned version differs (about 20 s the first time, nothing after).
#
#   scripts/setup-s3-test-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/s3-test-venv
requirements=crates/snapshot-store/tests/s3-server/requirements.txt

# Debian's python3 has no ensurepip (so no `-m venv`) without python3-venv.
if ! /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup-s3-test-server: python3-venv is missing (run as root to install it)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi

# Every `name==version` of the requirements file installed at exactly that version, and the server's entry point there?
pinned_present() {
  [ -x "$venv/bin/python" ] && [ -x "$venv/bin/moto_server" ] || return 1
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
  pinned_present || { echo "setup-s3-test-server: $venv does not hold the versions of $requirements after pip" >&2; exit 1; }
fi
