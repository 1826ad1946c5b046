#!/usr/bin/env bash
# What the Python SDK's suite (crates/cli/tests/python_sdk.rs) needs: a venv at target/python-sdk-venv made with
# /usr/bin/python3 holding the pinned packages of sdk/python/requirements-test.txt (httpx, pytest, pytest-asyncio and
# the SDK's build backend, so the test can `pip install ./sdk/python` without reaching a registry). Idempotent and
# quiet: pip runs only when a package is missing or a pinned version differs. The SDK itself is not installed here:
# the test builds and installs it from the source tree on every run.
#
#   scripts/setup-python-sdk.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/pinned-venv.sh
. scripts/pinned-venv.sh
pinned_venv setup-python-sdk target/python-sdk-venv sdk/python/requirements-test.txt
