#!/usr/bin/env bash
# What the MCP tests (crates/cli/tests/mcp_client.rs) need: a venv at target/mcp-venv made with /usr/bin/python3
# holding the pinned official `mcp` client of tests/mcp/requirements.txt. Idempotent and quiet: pip runs only when a
# package is missing or a pinned version differs.
#
#   scripts/setup-mcp.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/pinned-venv.sh
. scripts/pinned-venv.sh
pinned_venv setup-mcp target/mcp-venv tests/mcp/requirements.txt
