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

# shellcheck source=scripts/pinned-venv.sh
. scripts/pinned-venv.sh
pinned_venv setup-s3-test-server "$venv" "$requirements" moto_server
